//! Hostile-load harness: a server process started with a low open-file limit
//! (`prlimit --nofile=N:N`), its CPU time read from `/proc/<pid>/stat` and its log
//! lines counted over a window, and a flood of TCP connections to exhaust it. Shared by
//! the broker's tests and the root crate's (which start `shaddock up`).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::{Process, within};
use tokio::net::TcpStream;

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

/// What a process did over a window.
#[derive(Debug, Clone, Copy)]
struct Load {
    /// CPU time used ÷ the window: 1.0 is one core busy throughout.
    cpu_share: f64,
    /// Log lines containing the needle asked about, in the window.
    lines: usize,
}

/// Starts `program args`, logging at info, with at most `nofile` open files, soft and
/// hard (so the server cannot raise it).
pub fn spawn_limited(nofile: u64, program: &Path, args: &[&str]) -> Process {
    let mut command = Command::new(PRLIMIT);
    command
        .arg(format!("--nofile={nofile}:{nofile}"))
        .arg("--")
        .arg(program)
        .args(args)
        .env("RUST_LOG", "info");
    let name = program.file_name().unwrap_or_default().to_string_lossy();
    Process::spawn(&name, command)
}

/// Waits until `process` runs out of descriptors, watches it for [`WINDOW`], and
/// asserts it stayed quiet: at least one accept failure logged (it was exhausted) but
/// at most [`MAX_LINES`], and under [`MAX_CPU_SHARE`] of a core.
pub async fn assert_backs_off(process: &mut Process) {
    process.line("Too many open files").await;
    let load = watch(process, WINDOW, "accept failed").await;
    assert!(
        (1..=MAX_LINES).contains(&load.lines),
        "{} accept-failure lines in {WINDOW:?}:\n{}",
        load.lines,
        process.log()
    );
    assert!(
        load.cpu_share < MAX_CPU_SHARE,
        "{:.0} % of a core while exhausted",
        load.cpu_share * 100.0
    );
}

/// Watches `process` for `window`: its CPU share and its lines with `needle`.
async fn watch(process: &Process, window: Duration, needle: &str) -> Load {
    let (started, cpu) = (Instant::now(), cpu_time(process.pid()));
    // A measuring window, not a wait for a condition.
    tokio::time::sleep(window).await;
    let (elapsed, used) = (started.elapsed(), cpu_time(process.pid()) - cpu);
    Load {
        cpu_share: used.as_secs_f64() / elapsed.as_secs_f64(),
        lines: process.count_since(started, needle),
    }
}

/// CPU time (user + system) process `pid` has used.
fn cpu_time(pid: u32) -> Duration {
    let stat = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .expect("the process's /proc stat");
    Duration::from_secs_f64((stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64)
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
