//! What `/proc` says about a process, read with the `procfs` crate: resident memory, and
//! CPU time over a window for chosen processes (or some of their threads, by name), the
//! whole machine and the hypervisor's steal. A process that cannot be read is left out.

use std::time::{Duration, Instant};

use procfs::CurrentSI as _;
use procfs::process::Process;
use serde::Serialize;

/// The load tester's own process, in every run's CPU.
pub const LOADTEST: &str = "loadtest";
/// The pseudo-process names of the machine-wide figures.
pub const MACHINE: &str = "machine";
pub const OTHERS: &str = "others";
pub const STEAL: &str = "steal";

/// Resident set size of `pid` in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = Process::new(i32::try_from(pid).ok()?).ok()?.status().ok()?;
    status.vmrss?.checked_mul(1024)
}

fn ticks(t: u64) -> Duration {
    Duration::from_secs_f64(t as f64 / procfs::ticks_per_second() as f64)
}

/// A process (or some of its threads) whose CPU use a run reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub name: String,
    pub pid: u32,
    pub threads: Threads,
}

/// Which threads count, by name: the bare echo server runs on named threads of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    All,
    /// Those whose name starts with this.
    Named(&'static str),
    /// Those whose name does not start with this.
    Others(&'static str),
}

impl Watched {
    pub fn new(name: impl Into<String>, pid: u32, threads: Threads) -> Self {
        let name = name.into();
        Watched { name, pid, threads }
    }

    /// CPU time (user + system) used so far. A thread that ended took its time with it:
    /// only threads that live through a run are measured right (the echo's and ours do).
    fn cpu_time(&self) -> Option<Duration> {
        let process = Process::new(i32::try_from(self.pid).ok()?).ok()?;
        let used = |s: procfs::process::Stat| s.utime + s.stime;
        let (prefix, named) = match self.threads {
            Threads::All => return Some(ticks(used(process.stat().ok()?))),
            Threads::Named(prefix) => (prefix, true),
            Threads::Others(prefix) => (prefix, false),
        };
        let tasks = process.tasks().ok()?.flatten();
        let stats = tasks.filter_map(|task| task.stat().ok());
        let chosen = stats.filter(|s| s.comm.starts_with(prefix) == named);
        Some(ticks(chosen.map(used).sum()))
    }
}

/// CPU used by one process over a measured window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuUse {
    pub name: String,
    pub pid: u32,
    pub cpu_seconds: f64,
    /// Of one core: 200 % is both cores of a 2-core machine.
    pub percent: f64,
}

/// CPU times of some processes and of the machine at one instant.
#[derive(Debug, Clone)]
pub struct CpuSample {
    at: Instant,
    times: Vec<(Watched, Option<Duration>)>,
    machine: Option<MachineTimes>,
}

/// The machine's CPU counters, from `/proc/stat`.
///
/// Busy time is what the CPUs did *not* spend idle or stolen, not the sum of the user
/// and system columns: those are sampled at the scheduler tick (250 Hz here), and a load
/// that wakes on a 1 ms timer beats against the tick, so over a whole run they read
/// anywhere from nothing to three times the truth. Idle time is measured at each entry
/// to and exit from idle (tickless kernels), and steal from the hypervisor's clock, so
/// both are exact over a window.
#[derive(Debug, Clone, Copy)]
struct MachineTimes {
    cpus: u32,
    /// Idle and waiting on I/O, summed over the CPUs.
    idle: Duration,
    /// Time the hypervisor gave this VM's CPUs to someone else.
    steal: Duration,
}

impl MachineTimes {
    fn read() -> Option<Self> {
        let stats = procfs::KernelStats::current().ok()?;
        let t = stats.total;
        Some(MachineTimes {
            cpus: u32::try_from(stats.cpu_time.len()).ok()?,
            idle: ticks(t.idle + t.iowait.unwrap_or(0)),
            steal: ticks(t.steal.unwrap_or(0)),
        })
    }

    /// Busy (every process, including those this one cannot see) and steal from `self`
    /// to `later`, `wall` apart.
    fn until(&self, later: &MachineTimes, wall: Duration) -> (Duration, Duration) {
        let steal = later.steal.saturating_sub(self.steal);
        let idle = later.idle.saturating_sub(self.idle);
        let capacity = wall * self.cpus.min(later.cpus);
        (capacity.saturating_sub(idle + steal), steal)
    }
}

impl CpuSample {
    pub fn take(watched: &[Watched]) -> Self {
        let times = watched.iter().map(|w| (w.clone(), w.cpu_time())).collect();
        CpuSample {
            at: Instant::now(),
            machine: MachineTimes::read(),
            times,
        }
    }

    /// CPU use from `self` to `later`: each process, then the machine, what the watched
    /// processes do not account for ("others": a noisy neighbour in this VM) and steal
    /// (a noisy neighbour outside it).
    pub fn until(&self, later: &CpuSample) -> Vec<CpuUse> {
        let elapsed = later.at.saturating_duration_since(self.at);
        let wall = elapsed.as_secs_f64();
        let entry = |name: &str, pid, used: Duration| {
            let share = (wall > 0.0).then(|| used.as_secs_f64() / wall);
            CpuUse {
                name: name.to_owned(),
                pid,
                cpu_seconds: used.as_secs_f64(),
                percent: share.map_or(0.0, |s| (s * 1000.0).round() / 10.0),
            }
        };
        let times = self.times.iter().zip(&later.times);
        let used = |((w, before), (_, after)): (&(Watched, _), &(_, Option<Duration>))| {
            let spent = after.as_ref()?.saturating_sub((*before)?);
            Some(entry(&w.name, w.pid, spent))
        };
        let mut uses: Vec<CpuUse> = times.filter_map(used).collect();
        if let (Some(before), Some(after)) = (self.machine, later.machine) {
            let (machine, steal) = before.until(&after, elapsed);
            let ours = Duration::from_secs_f64(uses.iter().map(|u| u.cpu_seconds).sum());
            uses.push(entry(MACHINE, 0, machine));
            uses.push(entry(OTHERS, 0, machine.saturating_sub(ours)));
            uses.push(entry(STEAL, 0, steal));
        }
        uses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_readable_and_its_threads_split_by_name() {
        let me = std::process::id();
        assert!(rss_bytes(me).is_some_and(|b| b > 0));
        let watch = |threads| Watched::new("self", me, threads);
        let time = |threads| watch(threads).cpu_time().expect("readable");
        assert_eq!(time(Threads::Named("no-such-thread")), Duration::ZERO);
        let a = CpuSample::take(&[watch(Threads::All)]);
        let used = a.until(&CpuSample::take(&[watch(Threads::All)]));
        let names: Vec<&str> = used.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["self", MACHINE, OTHERS, STEAL]);
        // Ticks are read at once, so the parts never exceed the whole.
        assert!(time(Threads::Others("no-such-thread")) <= time(Threads::All));
    }

    /// The load runs wake every millisecond and work briefly. Counted at the tick, such
    /// a load read from nothing to three times its CPU (the machine below this process's
    /// own use, or "others" of 100 % on an idle machine); counted from idle time, the
    /// machine's busy time covers it.
    #[test]
    fn the_machine_counts_a_load_that_wakes_every_millisecond() {
        let me = Watched::new("self", std::process::id(), Threads::All);
        let before = CpuSample::take(std::slice::from_ref(&me));
        // On a fixed 1 ms grid, as a load run's clients send: the grid keeps one phase
        // against the tick for the whole window.
        let start = Instant::now();
        for k in 1..=1000 {
            let due = start + Duration::from_millis(k);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            let spin = Instant::now() + Duration::from_micros(300);
            while Instant::now() < spin {
                std::hint::spin_loop();
            }
        }
        let used = before.until(&CpuSample::take(&[me]));
        let seconds = |name| {
            (used.iter())
                .find(|u| u.name == name)
                .expect(name)
                .cpu_seconds
        };
        let (own, machine) = (seconds("self"), seconds(MACHINE));
        assert!(own >= 0.2, "the load used {own} s");
        // Both are counted in 10 ms units, read twice.
        assert!(
            machine >= own - 0.04,
            "machine {machine} s, this process {own} s"
        );
    }
}
