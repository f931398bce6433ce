//! What `/proc` says about a process: resident memory (`VmRSS` in `/proc/<pid>/status`)
//! and CPU time used (`utime + stime` in `/proc/<pid>/stat`, or summed over the chosen
//! threads in `/proc/<pid>/task/*/stat`). Linux only; a process that cannot be read
//! yields `None` and its figures are left out of the report.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Kernel clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`): fixed at 100 by the
/// Linux ABI on every architecture the load test runs on.
const USER_HZ: u64 = 100;

/// Resident set size of `pid` in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(value * 1024),
        _ => None,
    }
}

/// CPU time (user + system) `pid` has used so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat).map(|ticks| Duration::from_millis(ticks * 1000 / USER_HZ))
}

/// CPU time (user + system) the threads of `pid` chosen by `threads` have used so far.
/// A thread that ended takes its time with it: only threads that live through a run
/// are measured right this way (the bare echo's and the generator's do).
fn threads_cpu_time(pid: u32, threads: &Threads) -> Option<Duration> {
    let mut ticks = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        // A thread may end while the folder is read: it is then left out.
        let Ok(task) = task else { continue };
        let Ok(name) = std::fs::read_to_string(task.path().join("comm")) else {
            continue;
        };
        if !threads.counts(name.trim_end()) {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) {
            ticks += parse_cpu_ticks(&stat)?;
        }
    }
    Some(Duration::from_millis(ticks * 1000 / USER_HZ))
}

fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses: fields after it
    // start behind the last ')'. utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// A process (or some of its threads) whose CPU use a run reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub name: String,
    pub pid: u32,
    pub threads: Threads,
}

/// Which threads of a process count, by name (`/proc/<pid>/task/<tid>/comm`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Threads {
    #[default]
    All,
    /// Those whose name starts with this.
    Named(&'static str),
    /// Those whose name does not start with this.
    Others(&'static str),
}

impl Threads {
    fn counts(&self, name: &str) -> bool {
        match self {
            Threads::All => true,
            Threads::Named(prefix) => name.starts_with(prefix),
            Threads::Others(prefix) => !name.starts_with(prefix),
        }
    }
}

impl Watched {
    /// CPU time used so far by what this watches.
    fn cpu_time(&self) -> Option<Duration> {
        match self.threads {
            Threads::All => cpu_time(self.pid),
            ref some => threads_cpu_time(self.pid, some),
        }
    }
}

/// CPU used by one process over a measured window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuUse {
    pub name: String,
    pub pid: u32,
    pub cpu_seconds: f64,
    /// Of one core: 200% is both cores of a 2-core machine.
    pub percent: f64,
}

/// The machine's CPU time so far (`/proc/stat`), in two parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MachineTime {
    /// What every process on the machine used (user, nice, system, irq, softirq),
    /// including processes this one cannot see (other containers on the VM).
    busy: Duration,
    /// Time the hypervisor gave this VM's CPUs to someone else while they had work: CPU
    /// a run wanted and did not get. On a shared VM this is what makes the same run
    /// slower at one hour than at another.
    steal: Duration,
}

fn machine_time() -> Option<MachineTime> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (busy, steal) = parse_machine_ticks(&stat)?;
    let time = |ticks: u64| Duration::from_millis(ticks * 1000 / USER_HZ);
    Some(MachineTime {
        busy: time(busy),
        steal: time(steal),
    })
}

/// (busy, steal) ticks from the `cpu` line.
fn parse_machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal; guest time is counted in user.
    let busy = [0, 1, 2, 5, 6]
        .iter()
        .map(|&i| ticks.get(i).copied())
        .sum::<Option<u64>>()?;
    Some((busy, ticks.get(7).copied().unwrap_or(0)))
}

/// The pseudo-process names of the machine-wide figures.
pub const MACHINE: &str = "machine";
pub const OTHERS: &str = "others";
pub const STEAL: &str = "steal";

/// CPU times of a set of processes, and of the whole machine, at one instant.
#[derive(Debug, Clone)]
pub struct CpuSample {
    at: Instant,
    times: Vec<(Watched, Option<Duration>)>,
    machine: Option<MachineTime>,
}

impl CpuSample {
    pub fn take(watched: &[Watched]) -> Self {
        CpuSample {
            at: Instant::now(),
            times: watched.iter().map(|w| (w.clone(), w.cpu_time())).collect(),
            machine: machine_time(),
        }
    }

    /// CPU use between `self` and a later sample of the same processes, followed by
    /// the whole machine's, what the watched processes do not account for ("others": a
    /// noisy neighbour in this VM shows up here) and the hypervisor's steal (a noisy
    /// neighbour outside it).
    pub fn until(&self, later: &CpuSample) -> Vec<CpuUse> {
        let wall = later.at.saturating_duration_since(self.at).as_secs_f64();
        let entry = |name: &str, pid: u32, used: Duration| CpuUse {
            name: name.to_owned(),
            pid,
            cpu_seconds: used.as_secs_f64(),
            percent: if wall > 0.0 {
                (used.as_secs_f64() / wall * 1000.0).round() / 10.0
            } else {
                0.0
            },
        };
        let mut uses: Vec<CpuUse> = self
            .times
            .iter()
            .zip(&later.times)
            .filter_map(|((w, before), (_, after))| {
                let used = after.as_ref()?.saturating_sub(*before.as_ref()?);
                Some(entry(&w.name, w.pid, used))
            })
            .collect();
        if let (Some(before), Some(after)) = (self.machine, later.machine) {
            let machine = after.busy.saturating_sub(before.busy);
            let ours: f64 = uses.iter().map(|u| u.cpu_seconds).sum();
            let others = machine.saturating_sub(Duration::from_secs_f64(ours));
            uses.push(entry(MACHINE, 0, machine));
            uses.push(entry(OTHERS, 0, others));
            uses.push(entry(STEAL, 0, after.steal.saturating_sub(before.steal)));
        }
        uses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_in_bytes() {
        let status = "Name:\tshaddock\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nThreads: 3\n";
        assert_eq!(parse_vm_rss(status), Some(1234 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert_eq!(parse_vm_rss("VmRSS: 12 MB\n"), None);
    }

    #[test]
    fn cpu_ticks_skip_a_name_with_spaces_and_parens() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 50 0 0 20 0 3 0 100 1000 10";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn this_process_is_readable() {
        let me = std::process::id();
        assert!(rss_bytes(me).is_some_and(|b| b > 0));
        assert!(cpu_time(me).is_some());
        let watched = [Watched {
            name: "self".into(),
            pid: me,
            threads: Threads::All,
        }];
        let a = CpuSample::take(&watched);
        let b = CpuSample::take(&watched);
        let used = a.until(&b);
        assert_eq!(used.len(), 4, "self, machine, others, steal");
        assert!(used[0].cpu_seconds >= 0.0);
        assert_eq!(used[1].name, MACHINE);
    }

    #[test]
    fn threads_count_by_name() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        // A thread that spins until told to stop, then stays (a thread that ended takes
        // its time with it).
        let stop = Arc::new(AtomicBool::new(false));
        let spinning = stop.clone();
        let spinner = std::thread::Builder::new()
            .name("procfs-spin".into())
            .spawn(move || {
                while !spinning.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
                std::thread::park();
            })
            .expect("thread");
        let watch = |threads| Watched {
            name: "self".into(),
            pid: std::process::id(),
            threads,
        };
        let time = |threads| watch(threads).cpu_time().expect("readable");
        // 100 ms of its CPU (ten ticks of /proc's clock), however busy the machine is.
        let deadline = Instant::now() + Duration::from_secs(60);
        while time(Threads::Named("procfs-spin")) < Duration::from_millis(100) {
            assert!(
                Instant::now() < deadline,
                "the spinner's time was never seen"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        let spin = time(Threads::Named("procfs-spin"));
        let rest = time(Threads::Others("procfs-spin"));
        let all = time(Threads::All);
        assert!(spin >= Duration::from_millis(100));
        assert_eq!(time(Threads::Named("no-such-thread")), Duration::ZERO);
        // The two parts do not overlap: together at most the whole process.
        assert!(spin + rest <= all, "{spin:?} + {rest:?} > {all:?}");
        spinner.thread().unpark();
    }

    #[test]
    fn machine_busy_leaves_out_idle_iowait_and_steal_which_is_apart() {
        let stat = "cpu  100 5 50 1000 20 3 7 2 0 0\ncpu0 50 2 25 500 10 1 3 1 0 0\n";
        assert_eq!(parse_machine_ticks(stat), Some((100 + 5 + 50 + 3 + 7, 2)));
        // Kernels before 2.6.11 had no steal column.
        assert_eq!(
            parse_machine_ticks("cpu  100 5 50 1000 20 3 7\n"),
            Some((165, 0))
        );
        assert_eq!(parse_machine_ticks("cpu  100 5\n"), None);
        assert_eq!(parse_machine_ticks("intr 1 2 3\n"), None);
    }
}
