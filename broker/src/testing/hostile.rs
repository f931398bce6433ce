//! Hostile-load harness: a server process started with a low open-file limit
//! (`prlimit --nofile=N:N`), its log lines kept with the time they came, its CPU time
//! read from `/proc/<pid>/stat`, and a flood of TCP connections to exhaust it. Shared by
//! the broker's tests and the root crate's (which start `shaddock up`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::{DEADLINE, within};

/// Where `prlimit` lives (util-linux): it sets the limit and execs the server, so the
/// child's pid is the server's.
const PRLIMIT: &str = "/usr/bin/prlimit";

/// How long an exhausted process is watched.
pub const WINDOW: Duration = Duration::from_secs(2);
/// "A few lines a second": one per listener and kind per second is what our servers
/// write, with room for a window edge. A spinning accept loop writes ~100,000 a second.
pub const MAX_LINES: usize = 6;
/// A generous "few percent of a core" for a shared 2-core machine; a spinning accept
/// loop uses all of one.
pub const MAX_CPU_SHARE: f64 = 0.25;

/// Kernel clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`): 100 by the Linux ABI.
const USER_HZ: u64 = 100;

/// A server process under a low open-file limit; killed by its pid and reaped on drop.
pub struct Limited {
    child: Child,
    /// Every stderr line with the time it was read.
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

/// What a process did over a window.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// CPU time used ÷ the window: 1.0 is one core busy throughout.
    pub cpu_share: f64,
    /// Log lines containing the needle asked about, in the window.
    pub lines: usize,
}

impl Limited {
    /// Starts `program args` with at most `nofile` open files, soft and hard (so the
    /// server cannot raise it).
    pub fn spawn(nofile: u64, program: &Path, args: &[&str]) -> Limited {
        let mut child = Command::new(PRLIMIT)
            .arg(format!("--nofile={nofile}:{nofile}"))
            .arg("--")
            .arg(program)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                kept.lock().unwrap().push((Instant::now(), line));
            }
        });
        Limited { child, lines }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The first line containing `needle`, waited for up to [`DEADLINE`].
    pub async fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + DEADLINE;
        let mut poll = tokio::time::interval(Duration::from_millis(20));
        loop {
            if let Some(line) = self.find(needle) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no line with {needle:?}; the log:\n{}",
                self.log()
            );
            poll.tick().await;
        }
    }

    /// The address in the first line containing `needle` (the word right after it),
    /// with a wildcard host made loopback.
    pub async fn addr_after(&self, needle: &str) -> SocketAddr {
        let line = self.wait_for(needle).await;
        let word = line.split(needle).nth(1).unwrap().split_whitespace().next();
        let addr: SocketAddr = word.unwrap().parse().unwrap();
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    }

    fn find(&self, needle: &str) -> Option<String> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .find(|(_, l)| l.contains(needle))
            .map(|(_, l)| l.clone())
    }

    /// The last lines logged so far (a flooded log would drown a failure message).
    pub fn log(&self) -> String {
        const SHOWN: usize = 30;
        let lines = self.lines.lock().unwrap();
        let skip = lines.len().saturating_sub(SHOWN);
        let tail: Vec<_> = lines[skip..].iter().map(|(_, l)| l.as_str()).collect();
        format!("({skip} earlier lines)\n{}", tail.join("\n"))
    }

    /// CPU time (user + system) the process has used.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // Fields after the command name (which may hold spaces) start behind the last
        // ')'; utime and stime are fields 14 and 15.
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        let ticks: u64 = rest
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|f| f.parse::<u64>().unwrap())
            .sum();
        Duration::from_millis(ticks * 1000 / USER_HZ)
    }

    /// Waits until the process runs out of descriptors, watches it for [`WINDOW`], and
    /// asserts it stayed quiet: at least one accept failure logged (it was exhausted)
    /// but at most [`MAX_LINES`], and under [`MAX_CPU_SHARE`] of a core.
    pub async fn assert_backs_off(&self) {
        self.wait_for("Too many open files").await;
        let load = self.watch(WINDOW, "accept failed").await;
        assert!(
            (1..=MAX_LINES).contains(&load.lines),
            "{} accept-failure lines in {WINDOW:?}:\n{}",
            load.lines,
            self.log()
        );
        assert!(
            load.cpu_share < MAX_CPU_SHARE,
            "{:.0} % of a core while exhausted",
            load.cpu_share * 100.0
        );
    }

    /// Watches the process for `window`: its CPU share and its lines with `needle`.
    pub async fn watch(&self, window: Duration, needle: &str) -> Load {
        let (started, cpu) = (Instant::now(), self.cpu_time());
        // A measuring window, not a wait for a condition.
        tokio::time::sleep(window).await;
        let (elapsed, used) = (started.elapsed(), self.cpu_time() - cpu);
        let lines = self.lines.lock().unwrap();
        let lines = lines
            .iter()
            .filter(|(at, l)| *at >= started && l.contains(needle))
            .count();
        Load {
            cpu_share: used.as_secs_f64() / elapsed.as_secs_f64(),
            lines,
        }
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Opens `n` TCP connections to `addr` and holds them. They connect even once the
/// server cannot accept any more: the kernel completes them into the listen backlog
/// (128 for listeners bound through std), which is what keeps the server's accept
/// failing; past the backlog a connect waits, so `n` is at most the server's
/// descriptors plus the backlog.
pub async fn flood(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(within(TcpStream::connect(addr)).await.unwrap());
    }
    held
}
