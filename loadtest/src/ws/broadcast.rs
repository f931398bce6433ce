//! `broadcast`: room fan-out. One chat room, `--members` members spread round-robin over
//! the gates, one sender; measures pushes delivered to members per second.
//!
//! Members and the sender use serial sessions, as chat clients should; the sender keeps
//! `--window` `chat.say` requests pipelined (`--unordered` lets the gate forward them all
//! at once, so several messages fan out together and a gate writes them to a member in
//! one flush). A warm-up message first makes sure every member receives; the clock then
//! runs from the first measured send to the last delivery. Every member decodes every
//! push, so the clients' cost is in the figure too (they share the machine's cores).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::stream::{self, StreamExt as _, TryStreamExt as _};
use proto::Message as _;
use proto::chat::{JoinRequest, LoginRequest, SayRequest};
use sdk::{Client, ClientOptions, Response};
use tokio::sync::Notify;

use super::target::{ServiceKind, TargetArgs, with_topology};
use crate::report::{Doc, OutputArgs, Report, Section};

/// How long to wait for the last deliveries before reporting what arrived.
const PATIENCE: Duration = Duration::from_secs(60);
/// Members connecting at once: enough to be quick, few enough not to trip timeouts.
const CONNECT_BATCH: usize = 100;
/// The route chat pushes room messages on.
const MESSAGE_ROUTE: &str = "chat.message";
/// The room every member joins.
const ROOM: &str = "bench";

/// `broadcast`: room fan-out deliveries per second.
#[derive(Debug, clap::Args)]
pub struct BroadcastArgs {
    /// Members of the room (besides the sender), spread round-robin over the gates.
    #[arg(long, default_value_t = 1000)]
    pub members: usize,
    /// Messages the sender sends (after one warm-up message).
    #[arg(long, default_value_t = 200)]
    pub messages: usize,
    /// `chat.say` requests the sender keeps in flight.
    #[arg(long, default_value_t = 32)]
    pub window: usize,
    /// Bytes of text per message.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// The sender's session is not serial: its window is handled in parallel, in no
    /// particular order, so pushes to a member coalesce.
    #[arg(long)]
    pub unordered: bool,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What one broadcast run measured.
#[derive(Debug, serde::Serialize)]
pub struct BroadcastReport {
    pub members: usize,
    pub gates: usize,
    pub messages: usize,
    pub unordered: bool,
    pub deliveries: u64,
    pub expected: u64,
    pub dropped: u64,
    pub elapsed_s: f64,
    pub deliveries_per_s: f64,
    pub messages_per_s: f64,
}

/// Runs the scenario: 2 gates and 1 chat worker unless the flags say otherwise.
pub async fn broadcast(mut args: BroadcastArgs) -> anyhow::Result<()> {
    ensure!(
        args.members > 0 && args.window > 0,
        "--members and --window must be positive"
    );
    args.target.service = ServiceKind::Chat;
    let (gates, topology) = args.target.gates(2, 1).await?;
    let report = with_topology(topology, measure(&args, &gates.urls)).await?;
    let report = Report::new("broadcast", gates.setup.clone(), report);
    report.write(&args.output)?;
    let report = report.data;
    if report.deliveries < report.expected {
        bail!("{} deliveries missing", report.expected - report.deliveries);
    }
    Ok(())
}

async fn measure(args: &BroadcastArgs, urls: &[String]) -> anyhow::Result<BroadcastReport> {
    let expected_per_member = args.messages as u64 + 1;
    let counts = Arc::new(Counts::default());
    let members: Vec<Client> = stream::iter(0..args.members)
        .map(|i| member(&urls[i % urls.len()], format!("m{i}"), true))
        .buffer_unordered(CONNECT_BATCH)
        .try_collect()
        .await?;
    for client in &members {
        let mut pushes = client.pushes().context("push stream taken")?;
        let counts = counts.clone();
        tokio::spawn(async move {
            let mut got = 0;
            while let Some(push) = pushes.recv().await {
                if push.route != MESSAGE_ROUTE {
                    continue;
                }
                got += 1;
                // The first is the warm-up message: not counted.
                let count = match got {
                    1 => &counts.warmed,
                    _ => &counts.received,
                };
                count.fetch_add(1, Ordering::Relaxed);
                let last = got == expected_per_member;
                if last {
                    counts.finished.fetch_add(1, Ordering::Relaxed);
                }
                if got == 1 || last {
                    counts.done.notify_one();
                }
                if last {
                    break;
                }
            }
        });
    }
    let total = args.members as u64;
    let all = |count: &AtomicU64| count.load(Ordering::Relaxed) == total;
    let sender = member(&urls[0], "sender".into(), !args.unordered).await?;
    let text = "x".repeat(args.size);
    say(&sender, &text).await?;
    wait_for(&counts.done, || all(&counts.warmed))
        .await
        .context("the warm-up message did not reach every member")?;

    let started = Instant::now();
    stream::iter(0..args.messages)
        .map(|_| say(&sender, &text))
        .buffer_unordered(args.window)
        .try_collect::<()>()
        .await?;
    // Missing deliveries are reported, not an error here: the caller decides.
    let _ = wait_for(&counts.done, || all(&counts.finished)).await;
    let elapsed = started.elapsed().as_secs_f64();
    let deliveries = counts.received.load(Ordering::Relaxed);
    Ok(BroadcastReport {
        members: args.members,
        gates: urls.len(),
        messages: args.messages,
        unordered: args.unordered,
        deliveries,
        expected: args.messages as u64 * total,
        dropped: members.iter().map(Client::pushes_dropped).sum(),
        elapsed_s: elapsed,
        deliveries_per_s: deliveries as f64 / elapsed,
        messages_per_s: args.messages as f64 / elapsed,
    })
}

impl Section for BroadcastReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
    }
}

/// A session, logged in as `name`, in the room.
async fn member(url: &str, name: String, serial: bool) -> anyhow::Result<Client> {
    let options = ClientOptions {
        serial,
        ..ClientOptions::default()
    };
    let client = Client::connect(url, options)
        .await
        .with_context(|| format!("connecting {url}"))?;
    login_and_join(&client, name, ROOM).await?;
    Ok(client)
}

/// Logs `client` in to chat as `name` and joins `room`; fails unless both answer 200.
pub(crate) async fn login_and_join(
    client: &Client,
    name: String,
    room: &str,
) -> anyhow::Result<()> {
    expect_ok(
        client
            .request("chat.login", LoginRequest { name }.encode_to_vec())
            .await?,
    )?;
    let join = JoinRequest { room: room.into() };
    expect_ok(client.request("chat.join", join.encode_to_vec()).await?)
}

async fn say(sender: &Client, text: &str) -> anyhow::Result<()> {
    let say = SayRequest {
        room: ROOM.into(),
        text: text.into(),
    };
    expect_ok(sender.request("chat.say", say.encode_to_vec()).await?)
}

pub(crate) fn expect_ok(response: Response) -> anyhow::Result<()> {
    if response.code != proto::code::OK {
        bail!("answered {}: {}", response.code, response.message);
    }
    Ok(())
}

/// What the members' tasks count: members that got the warm-up message, deliveries
/// after it, members that got every message; `done` wakes the waiter on each change.
#[derive(Debug, Default)]
struct Counts {
    warmed: AtomicU64,
    received: AtomicU64,
    finished: AtomicU64,
    done: Notify,
}

/// Waits until `condition` holds (re-checked whenever `notify` fires), up to [`PATIENCE`].
async fn wait_for(notify: &Notify, condition: impl Fn() -> bool) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {PATIENCE:?}");
        }
        // Re-checked at least every 100 ms: a notification can land between check and wait.
        let _ = tokio::time::timeout(Duration::from_millis(100), notify.notified()).await;
    }
    Ok(())
}
