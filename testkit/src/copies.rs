//! Copies of this program, each doing a share of one job (the load tester past one
//! process's open-file limit, `loadtest --procs`), on [`Process`]: each started with
//! its own arguments and tied to this process, read line by line, stopped by its pid.
//!
//! A copy prints one [`READY`] line (JSON after the marker) on stdout when set up,
//! again at each step the job has, and one [`RESULT`] line when its share is done or on
//! SIGTERM, whichever comes first; then it exits. A copy that fails (it exits, or says
//! nothing in time) fails the job, with its log's last lines.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, anyhow, ensure};
use nix::sys::signal::Signal;
use serde::{Serialize, de::DeserializeOwned};
use tokio::signal::unix::{Signal as Listener, SignalKind, signal};

use crate::Process;

/// What a copy's READY and RESULT lines start with.
pub const READY: &str = "testkit-copy-ready ";
pub const RESULT: &str = "testkit-copy-result ";
/// How long a copy may take to say a line it owes (after thousands of handshakes on a
/// loaded machine) or to exit after SIGTERM; one that fails says so at once.
pub const COPY_TIMEOUT: Duration = Duration::from_secs(300);

/// Copies of this program started by this one.
pub struct Copies(Vec<Process>);

impl Copies {
    /// Starts `n` copies of this program, copy `i` with the arguments `args(i)`.
    pub fn start(n: usize, args: impl Fn(usize) -> Vec<String>) -> anyhow::Result<Copies> {
        let exe = std::env::current_exe().context("finding this program to start copies")?;
        let copies = (0..n).map(|i| {
            let mut command = Command::new(&exe);
            command.args(args(i));
            Process::try_spawn(&format!("copy {i}"), command)
                .with_context(|| format!("starting copy {i} of {}", exe.display()))
        });
        Ok(Copies(copies.collect::<anyhow::Result<_>>()?))
    }

    /// Their pids, in order.
    pub fn pids(&self) -> Vec<u32> {
        self.0.iter().map(Process::pid).collect()
    }

    /// Every copy's next READY line, in order.
    pub async fn ready<T: DeserializeOwned>(&mut self) -> anyhow::Result<Vec<T>> {
        let lines = self.0.iter_mut().map(|p| said(p, READY, COPY_TIMEOUT));
        futures::future::join_all(lines).await.into_iter().collect()
    }

    /// Every copy's RESULT line, waiting up to `wait` for each to say it by itself, then
    /// asking those that have not (SIGTERM); every copy has exited when this returns.
    pub async fn finish<T: DeserializeOwned>(self, wait: Duration) -> anyhow::Result<Vec<T>> {
        let results = self.0.into_iter().map(|mut p| async move {
            let result = match said(&mut p, RESULT, wait).await {
                Ok(result) => result,
                Err(_) => {
                    p.signal(Signal::SIGTERM);
                    said(&mut p, RESULT, COPY_TIMEOUT).await?
                }
            };
            let status = (p.stop(Signal::SIGTERM, COPY_TIMEOUT).await).map_err(|e| anyhow!(e))?;
            ensure!(status.success(), p.failure(&format!("exited ({status})")));
            Ok(result)
        });
        futures::future::join_all(results)
            .await
            .into_iter()
            .collect()
    }
}

/// The JSON after `marker` on the copy's next line that has it, within `wait`.
async fn said<T: DeserializeOwned>(
    p: &mut Process,
    marker: &str,
    wait: Duration,
) -> anyhow::Result<T> {
    let line = p.wait_line(marker, wait).await.map_err(|e| anyhow!(e))?;
    let json = line.split_once(marker).map_or("", |(_, json)| json);
    serde_json::from_str(json).with_context(|| p.failure(&format!("said {line:?}")))
}

/// A copy's side: SIGTERM (or SIGINT) caught from the start, so that one arriving early
/// still lets the copy say its RESULT; and its lines.
pub struct AsCopy(Listener, Listener);

impl AsCopy {
    pub fn install() -> anyhow::Result<AsCopy> {
        let listen = |kind| signal(kind).context("listening for SIGTERM and SIGINT");
        Ok(AsCopy(
            listen(SignalKind::terminate())?,
            listen(SignalKind::interrupt())?,
        ))
    }

    /// Resolves on SIGTERM or SIGINT.
    pub async fn stopped(&mut self) {
        tokio::select! {
            _ = self.0.recv() => {}
            _ = self.1.recv() => {}
        }
    }

    /// Says a READY line with `value`.
    pub fn ready(&self, value: &impl Serialize) -> anyhow::Result<()> {
        say(READY, value)
    }

    /// Says the RESULT line.
    pub fn result(&self, value: &impl Serialize) -> anyhow::Result<()> {
        say(RESULT, value)
    }
}

fn say(marker: &str, value: &impl Serialize) -> anyhow::Result<()> {
    use std::io::Write as _;
    let line = format!("{marker}{}\n", serde_json::to_string(value)?);
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())?;
    Ok(out.flush()?)
}
