//! `idle`: resident memory a gate spends per idle session.
//!
//! Reads the gate's `VmRSS`, opens N sessions with the SDK (WebSocket + handshake, so
//! the gate has fully set each one up when its ack arrives), reads `VmRSS` again while
//! they are all open, and divides the difference by the sessions opened. The sessions
//! send nothing but the SDK's heartbeats.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail};
use sdk::{Client, ClientOptions};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::report::{IdleReport, ScenarioReport};
use super::target::{Gates, TargetArgs, with_topology};
use crate::proc::rss_bytes;
use crate::report::OutputArgs;

/// Most sessions one run opens: each is a file descriptor here and in the gate.
pub const MAX_SESSIONS: usize = 50_000;

/// Flags of `shaddock loadtest idle`.
#[derive(Debug, clap::Args)]
pub struct IdleArgs {
    /// Sessions to open (on the first gate).
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_SESSIONS as u64))]
    pub sessions: u64,
    /// Pid of the gate given by --url, whose RSS is read from /proc (a launched gate's
    /// pid is known).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Handshakes in progress at once.
    #[arg(long, default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub concurrency: u64,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn idle(args: IdleArgs) -> anyhow::Result<()> {
    let (gates, topology) = args.target.gates(1, 1).await?;
    let (report, first_error) = with_topology(topology, measure(&args, &gates)).await?;
    report.finish(&args.output)?;
    let Some(idle) = &report.idle else {
        bail!("no idle report");
    };
    if idle.opened == 0 {
        bail!(
            "no session could be opened: {}",
            first_error.unwrap_or_default()
        );
    }
    if let Some(e) = first_error {
        tracing::warn!("{} session(s) failed to open, first: {e}", idle.failed);
    }
    Ok(())
}

/// Opens the sessions and reads the gate's RSS around it; also returns the first
/// error a session failed with.
async fn measure(
    args: &IdleArgs,
    gates: &Gates,
) -> anyhow::Result<(ScenarioReport, Option<String>)> {
    let url = gates.urls.first().context("no gate URL")?.clone();
    let Some(pid) = args.pid.or_else(|| gates.gate_pids.first().copied()) else {
        bail!("--pid is required with --url: the gate's RSS is read from /proc/<pid>");
    };
    let sessions = usize::try_from(args.sessions)?;
    let rss_before = rss_bytes(pid).with_context(|| format!("reading VmRSS of pid {pid}"))?;

    let began = Instant::now();
    let permits = Arc::new(Semaphore::new(usize::try_from(args.concurrency)?));
    let mut set = JoinSet::new();
    for _ in 0..sessions {
        let permits = permits.clone();
        let url = url.clone();
        set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            Client::connect(&url, ClientOptions::default()).await
        });
    }
    let mut clients = Vec::with_capacity(sessions);
    let mut first_error = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(client)) => clients.push(client),
            Ok(Err(e)) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
            Err(e) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let open_seconds = began.elapsed().as_secs_f64();
    let rss_after = rss_bytes(pid).with_context(|| format!("reading VmRSS of pid {pid}"))?;
    let alive_after = clients.iter().filter(|c| !c.is_closed()).count();
    let opened = clients.len();

    let mut closing = JoinSet::new();
    for client in clients {
        closing.spawn(async move { client.close().await });
    }
    while closing.join_next().await.is_some() {}

    let delta = rss_after as f64 - rss_before as f64;
    let mut report = ScenarioReport::new("idle", gates.setup.clone());
    report.idle = Some(IdleReport {
        url,
        pid,
        sessions,
        opened,
        failed: sessions - opened,
        open_seconds,
        rss_before,
        rss_after,
        bytes_per_session: if opened == 0 {
            0.0
        } else {
            delta / opened as f64
        },
        alive_after,
    });
    Ok((report, first_error))
}
