//! `idle`: resident memory a gate spends per idle session.
//!
//! Reads the gate's `VmRSS`, opens N sessions with the SDK (WebSocket + handshake, so
//! the gate has fully set each one up when its ack arrives), reads `VmRSS` again while
//! they are all open, and divides the difference by the sessions opened. The sessions
//! send nothing but the SDK's heartbeats.
//!
//! With `--detached` (a gate it launches) the sessions are resumable and reach the gate
//! through a TCP hop ([`testkit::Cut`]); once open, the hop cuts every link and refuses
//! the clients' redials, so each session waits on the gate, detached, for a client that
//! does not come (docs/protocol.md, "Resume"). When the gate counts them all detached
//! (`gate_sessions_detached`), `VmRSS` is read a third time. It hardly moves: what a
//! detached session lets go (its socket's buffers) stays with the allocator. So as many
//! sessions again are opened, live, and `VmRSS` read a last time: they are built mostly
//! from what the detached ones let go, and what they add on top, per session, is an
//! estimate of what each detached session still holds. Each detached session costs the
//! load tester three descriptors (its client and the hop's two sockets).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail};
use sdk::{Backoff, Client, ClientOptions};
use serde::Serialize;
use testkit::Cut;
use testkit::fleet::{Role, scrape};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::target::{Gates, TargetArgs, with_topology};
use crate::proc::rss_bytes;
use crate::report::{Doc, OutputArgs, Report, Section};
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
    /// Also measure the sessions detached (see the module docs); needs a launched gate.
    #[arg(long)]
    pub detached: bool,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// How long the gate may take to see every cut link once the hop cut them.
const DETACH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Resident memory per idle session.
#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub url: String,
    pub pid: u32,
    pub sessions: usize,
    pub opened: usize,
    pub failed: usize,
    pub open_seconds: f64,
    pub rss_before: u64,
    pub rss_after: u64,
    pub bytes_per_session: f64,
    /// Sessions still open when the second RSS reading was taken.
    pub alive_after: usize,
    /// With `--detached`: the RSS once every session was detached, then with as many
    /// live sessions again, and the estimate of what a detached session holds (see the
    /// module docs).
    pub rss_detached: Option<u64>,
    pub rss_refilled: Option<u64>,
    pub bytes_per_detached: Option<f64>,
    #[serde(skip)]
    first_error: Option<String>,
}

pub async fn idle(args: IdleArgs) -> anyhow::Result<()> {
    let (gates, topology) = args.target.gates(1, 1).await?;
    let metrics = (topology.iter())
        .flat_map(|t| t.metrics_urls())
        .find_map(|(role, url)| matches!(role, Role::Gate(_)).then_some(url));
    anyhow::ensure!(
        !args.detached || metrics.is_some(),
        "--detached needs a gate this command launches (it reads the gate's metrics)"
    );
    let idle = with_topology(topology, measure(&args, &gates, metrics)).await?;
    Report::new("idle", gates.setup.clone(), idle.clone()).write(&args.output)?;
    let error = idle.first_error.unwrap_or_default();
    if idle.opened == 0 {
        bail!("no session could be opened: {error}");
    }
    if idle.failed > 0 {
        tracing::warn!("{} session(s) failed to open, first: {error}", idle.failed);
    }
    Ok(())
}

/// Opens the sessions and reads the gate's RSS around it (and, `--detached`, once they
/// are detached: `metrics` is the gate's metrics URL).
async fn measure(
    args: &IdleArgs,
    gates: &Gates,
    metrics: Option<String>,
) -> anyhow::Result<IdleReport> {
    let url = gates.urls.first().context("no gate URL")?.clone();
    let hop = match args.detached {
        true => {
            let addr = url.trim_start_matches("ws://").parse()?;
            Some(Cut::start(addr).await.context("starting a TCP hop")?)
        }
        false => None,
    };
    let dial = hop.as_ref().map_or_else(|| url.clone(), Cut::ws_url);
    let options = ClientOptions {
        // Resumable sessions ask to be, and a resume needs a client that redials.
        reconnect: hop.is_some().then(Backoff::default),
        ..ClientOptions::default()
    };
    let Some(pid) = args.pid.or_else(|| gates.gate_pids.first().copied()) else {
        bail!("--pid is required with --url: the gate's RSS is read from /proc/<pid>");
    };
    let rss = || rss_bytes(pid).with_context(|| format!("reading VmRSS of pid {pid}"));
    let sessions = usize::try_from(args.sessions)?;
    let rss_before = rss()?;
    let began = Instant::now();
    let permits = Arc::new(Semaphore::new(usize::try_from(args.concurrency)?));
    let mut set = JoinSet::new();
    for _ in 0..sessions {
        let (permits, dial, options) = (permits.clone(), dial.clone(), options.clone());
        set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            Client::connect(&dial, options).await
        });
    }
    let mut clients = Vec::with_capacity(sessions);
    let mut first_error = None;
    while let Some(joined) = set.join_next().await {
        match joined.map_err(anyhow::Error::from) {
            Ok(Ok(client)) => clients.push(client),
            Ok(Err(e)) => drop(first_error.get_or_insert(e.to_string())),
            Err(e) => drop(first_error.get_or_insert(e.to_string())),
        }
    }
    let open_seconds = began.elapsed().as_secs_f64();
    let rss_after = rss()?;
    let alive_after = clients.iter().filter(|c| !c.is_closed()).count();
    let opened = clients.len();
    let mut rss_detached = None;
    let mut rss_refilled = None;
    let mut refill = Vec::new();
    if let (Some(hop), Some(metrics)) = (hop, metrics) {
        // Every link cut, and no redial gets through: the hop is gone.
        hop.cut();
        drop(hop);
        let detached = async {
            loop {
                let counted = scrape(&metrics, &["gate_sessions_detached"]).await;
                if counted.is_some_and(|c| c[0] >= opened as f64) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(DETACH_TIMEOUT, detached)
            .await
            .context("the gate did not count every session detached")?;
        rss_detached = Some(rss()?);
        for _ in 0..opened {
            refill.push(Client::connect(&url, ClientOptions::default()).await?);
        }
        rss_refilled = Some(rss()?);
    }
    futures::future::join_all(refill.iter().map(Client::close)).await;
    futures::future::join_all(clients.iter().map(Client::close)).await;
    Ok(IdleReport {
        url,
        pid,
        sessions,
        opened,
        failed: sessions - opened,
        open_seconds,
        rss_before,
        rss_after,
        bytes_per_session: (rss_after as f64 - rss_before as f64) / opened.max(1) as f64,
        alive_after,
        rss_detached,
        rss_refilled,
        bytes_per_detached: rss_detached
            .zip(rss_refilled)
            .map(|(detached, refilled)| (refilled as f64 - detached as f64) / opened.max(1) as f64),
        first_error,
    })
}

impl Section for IdleReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
    }
}
