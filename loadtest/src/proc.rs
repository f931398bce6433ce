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
    /// CPUs, idle (and I/O wait) and stolen time, timed exactly; busy is the rest, as the
    /// tick-counted user and system columns alias a 1 ms load (docs/benchmarks.md).
    machine: Option<(u32, Duration, Duration)>,
}

impl CpuSample {
    pub fn take(watched: &[Watched]) -> Self {
        let times = watched.iter().map(|w| (w.clone(), w.cpu_time())).collect();
        let machine = procfs::KernelStats::current().ok().and_then(|k| {
            let (t, cpus) = (k.total, u32::try_from(k.cpu_time.len()).ok()?);
            let idle = ticks(t.idle + t.iowait.unwrap_or(0));
            Some((cpus, idle, ticks(t.steal.unwrap_or(0))))
        });
        let at = Instant::now();
        CpuSample { at, times, machine }
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
        if let (Some((cpus, idle0, steal0)), Some((_, idle1, steal1))) =
            (self.machine, later.machine)
        {
            let steal = steal1.saturating_sub(steal0);
            let machine = (elapsed * cpus).saturating_sub(idle1.saturating_sub(idle0) + steal);
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

    /// A load on a 1 ms grid, which the tick-counted machine read as nothing 4 times in 6.
    #[test]
    fn this_process_and_the_machine_are_readable_and_threads_split_by_name() {
        let me = std::process::id();
        assert!(rss_bytes(me).is_some_and(|b| b > 0));
        let watch = |threads| Watched::new("self", me, threads);
        let time = |threads| watch(threads).cpu_time().expect("readable");
        assert_eq!(time(Threads::Named("no-such-thread")), Duration::ZERO);
        let (a, start) = (CpuSample::take(&[watch(Threads::All)]), Instant::now());
        for k in 1..=1000 {
            std::thread::sleep((start + k * Duration::from_millis(1)) - Instant::now());
            let spin = Instant::now() + Duration::from_micros(300);
            while Instant::now() < spin {}
        }
        let used = a.until(&CpuSample::take(&[watch(Threads::All)]));
        let names: Vec<&str> = used.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["self", MACHINE, OTHERS, STEAL]);
        // Both are counted in 10 ms units, read twice; a loaded machine may preempt the spin.
        let (own, machine) = (used[0].cpu_seconds, used[1].cpu_seconds);
        assert!(
            own >= 0.1 && machine >= own - 0.04,
            "machine {machine} s, self {own} s"
        );
        // Ticks are read at once, so the parts never exceed the whole.
        assert!(time(Threads::Others("no-such-thread")) <= time(Threads::All));
    }
}
