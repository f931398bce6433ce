//! `broadcast`: room fan-out. One chat room, `--members` members spread round-robin over
//! the gates (held by `--procs` load processes, [`crate::spread`]), one sender keeping
//! `--window` `chat.say` requests pipelined on a serial session (`--unordered`: the gate
//! forwards them at once, so a gate writes several to a member in one flush), paced by
//! `--rate`. Warm-up messages first make sure every member receives. Each text starts
//! with its send time (Unix ns, 20 digits), so each member records its push's latency;
//! members decode every push, so their cost is in the CPU per delivered push too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::stream::{self, StreamExt as _, TryStreamExt as _};
use proto::Message as _;
use proto::chat::{ChatMessage, JoinRequest, LoginRequest, SayRequest};
use sdk::{Client, ClientOptions, Response};
use serde::{Deserialize, Serialize};
use testkit::copies::AsCopy;
use tokio::sync::Notify;

use super::generator::Target;
use super::target::{LimitServer, ServiceKind, TargetArgs, with_topology};
use crate::hist::Hist;
use crate::proc::{CpuSample, CpuUse};
use crate::report::{Doc, OutputArgs, Report, Section, Table, cpu_line};
use crate::spread::{Children, SpreadArgs, unix_nanos};

/// How long the warm-up may take to reach every member (after every join's announcement:
/// 50 million pushes in a 10,000-member room), and the last deliveries to come.
const PATIENCE: Duration = Duration::from_secs(120);
/// Members connecting at once: enough to be quick, few enough not to trip timeouts.
pub(crate) const CONNECT_BATCH: usize = 100;
/// The route chat pushes room messages on.
const MESSAGE_ROUTE: &str = "chat.message";
/// The room every member joins.
const ROOM: &str = "bench";
/// Digits of the send time a message's text starts with.
const STAMP: usize = 20;
/// How often the sender says a warm-up message until every member has one.
const WARM_UP_EVERY: Duration = Duration::from_secs(1);

/// `broadcast`: room fan-out deliveries per second.
#[derive(Debug, clap::Args)]
pub struct BroadcastArgs {
    /// Members of the room (besides the sender), spread round-robin over the gates.
    #[arg(long, default_value_t = 1000)]
    pub members: usize,
    /// Messages the sender sends (after warm-up messages until every member has one).
    #[arg(long, default_value_t = 200)]
    pub messages: usize,
    /// Messages the sender sends per second; 0: as fast as --window allows.
    #[arg(long, default_value_t = 0)]
    pub rate: u32,
    /// `chat.say` requests the sender keeps in flight.
    #[arg(long, default_value_t = 32)]
    pub window: usize,
    /// Bytes of text per message (the first 20 are its send time).
    #[arg(long, default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(STAMP as u64..=1024))]
    pub size: u64,
    /// The sender's session is not serial: its window is handled in parallel, in no
    /// particular order, so pushes to a member coalesce.
    #[arg(long)]
    pub unordered: bool,
    /// Also run the same room on the bare WebSocket server first (its room pushes every
    /// `chat.say` to every session, with nothing behind it), in the same run: the
    /// fan-out this machine allows at all, beside the gateway's.
    #[arg(long)]
    pub with_limit: bool,
    #[command(flatten)]
    pub spread: SpreadArgs,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What one broadcast run measured.
#[derive(Debug, Serialize)]
pub struct BroadcastReport {
    pub members: usize,
    pub gates: usize,
    pub procs: u32,
    pub messages: usize,
    pub rate: u32,
    pub unordered: bool,
    pub deliveries: u64,
    pub expected: u64,
    pub dropped: u64,
    pub elapsed_s: f64,
    pub deliveries_per_s: f64,
    pub messages_per_s: f64,
    /// From the send time in the text to the member's receipt of the push.
    pub latency: Hist,
    /// Over the sending, from the first measured message to the last one's answer.
    pub cpu: Vec<CpuUse>,
    /// The same room on the bare WebSocket server (`--with-limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<Box<BroadcastReport>>,
}

/// Runs the scenario: 2 gates and 1 chat worker unless the flags say otherwise.
pub async fn broadcast(mut args: BroadcastArgs) -> anyhow::Result<()> {
    let positive = args.members > 0 && args.window > 0;
    ensure!(positive, "--members and --window must be positive");
    if args.spread.child {
        return child(&args).await;
    }
    // The server lives to the end of the statement: through the run.
    let limit = match args.with_limit {
        true => Some(measure(&args, &LimitServer::start()?.target("limit")).await?),
        false => None,
    };
    args.target.service = ServiceKind::Chat;
    let (gates, topology) = args.target.gates(2, 1).await?;
    let mut report = with_topology(topology, measure(&args, &gates.target("gateway"))).await?;
    report.limit = limit.map(Box::new);
    let report = Report::new("broadcast", gates.setup.clone(), report).written(&args.output)?;
    for run in std::iter::once(&report).chain(report.limit.as_deref()) {
        if run.deliveries < run.expected {
            bail!("{} deliveries missing", run.expected - run.deliveries);
        }
    }
    Ok(())
}

/// One room on `target`'s gates (or the bare server).
async fn measure(args: &BroadcastArgs, target: &Target) -> anyhow::Result<BroadcastReport> {
    let urls = &target.urls;
    let procs = args.spread.procs as usize;
    ensure!(args.members >= procs, "fewer --members than --procs");
    let share = ("--members", args.members as u64);
    let flags = vec!["--messages".into(), args.messages.to_string()];
    let mut children = Children::start(&args.spread, "broadcast", urls, share, flags)?;
    let _joined: Vec<u64> = children.0.ready().await?;
    let sender = member(&urls[0], "sender".into(), !args.unordered, None).await?;
    // A warm-up message a second until every member has one: a member's push queue may
    // drop one under the joins' announcements; once all have one, none is on its way.
    let warm = async {
        loop {
            if let Err(e) = say(&sender, args.size, true).await {
                return e;
            }
            tokio::time::sleep(WARM_UP_EVERY).await;
        }
    };
    let _warmed: Vec<u64> = tokio::select! {
        warmed = children.0.ready() => warmed?,
        failed = warm => return Err(failed),
    };
    let watched = [target.watched.clone(), children.watched()].concat();
    let before = CpuSample::take(&watched);
    let started = Instant::now();
    let period = (args.rate > 0).then(|| Duration::from_secs(1) / args.rate);
    stream::iter(0..args.messages as u32)
        .then(|n| async move {
            if let Some(period) = period {
                tokio::time::sleep_until((started + period * n).into()).await;
            }
        })
        .map(|()| say(&sender, args.size, false))
        .buffer_unordered(args.window)
        .try_collect::<()>()
        .await?;
    let cpu = before.until(&CpuSample::take(&watched));
    // Missing deliveries are reported, not an error here: the caller decides.
    let tallies: Vec<Tally> = children.0.finish(PATIENCE).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let mut latency = Hist::new();
    tallies
        .iter()
        .for_each(|t| latency.record_counts(&t.latency));
    let deliveries = tallies.iter().map(|t| t.received).sum();
    Ok(BroadcastReport {
        members: args.members,
        gates: urls.len(),
        procs: args.spread.procs,
        messages: args.messages,
        rate: args.rate,
        unordered: args.unordered,
        deliveries,
        expected: (args.messages * args.members) as u64,
        dropped: tallies.iter().map(|t| t.dropped).sum(),
        elapsed_s: elapsed,
        deliveries_per_s: deliveries as f64 / elapsed,
        messages_per_s: args.messages as f64 / elapsed,
        latency,
        cpu,
        limit: None,
    })
}

/// A load process: its share of the members, `m{pid}-{i}` on `--url` gate `i mod N`, a
/// task each counting pushes; READY once joined, again once warmed up, then its RESULT
/// once each has every message (or on SIGTERM).
async fn child(args: &BroadcastArgs) -> anyhow::Result<()> {
    let mut stop = AsCopy::install()?;
    let (urls, prefix) = (&args.target.url, format!("m{}-", std::process::id()));
    let counts = Arc::new(Counts::default());
    let join = |i: usize| {
        let name = format!("{prefix}{i}");
        member(&urls[i % urls.len()], name, true, args.spread.source(i))
    };
    let joins = stream::iter(0..args.members).map(join);
    let clients: Vec<Client> = joins.buffer_unordered(CONNECT_BATCH).try_collect().await?;
    for client in &clients {
        let pushes = client.pushes().context("push stream taken")?;
        tokio::spawn(counts.clone().count(pushes, args.messages as u64));
    }
    let members = clients.len() as u64;
    stop.ready(&members)?;
    let all = |count: &AtomicU64| count.load(Ordering::Relaxed) == members;
    let warmed = wait_for(&counts.done, || all(&counts.warmed)).await;
    warmed.context("the warm-up message did not reach every member")?;
    stop.ready(&members)?;
    // What the joins' announcements had dropped is not the messages'.
    let dropped: u64 = clients.iter().map(Client::pushes_dropped).sum();
    tokio::select! {
        () = stop.stopped() => {}
        _ = wait_for(&counts.done, || all(&counts.finished)) => {}
    }
    let latency = counts.latency.lock();
    let latency = latency.unwrap_or_else(PoisonError::into_inner).counts();
    stop.result(&Tally {
        received: counts.received.load(Ordering::Relaxed),
        dropped: clients.iter().map(Client::pushes_dropped).sum::<u64>() - dropped,
        latency,
    })?;
    futures::future::join_all(clients.iter().map(Client::close)).await;
    Ok(())
}

/// What a process's members received.
#[derive(Debug, Serialize, Deserialize)]
struct Tally {
    received: u64,
    dropped: u64,
    /// [`Hist::counts`] of the deliveries' latency.
    latency: Vec<(u64, u64)>,
}

impl Section for BroadcastReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
        doc.table(Table::latency([("push", &self.latency.summary())]));
        doc.lines(vec![cpu_line(&self.cpu, self.deliveries, "delivered push")]);
        if let Some(limit) = &self.limit {
            doc.heading("the same room on the bare WebSocket server (the limit)");
            limit.add_to(doc);
        }
    }
}

/// A session, logged in as `name`, in the room.
async fn member(
    url: &str,
    name: String,
    serial: bool,
    source_addr: Option<std::net::IpAddr>,
) -> anyhow::Result<Client> {
    let options = ClientOptions {
        serial,
        source_addr,
        ..ClientOptions::default()
    };
    let client = Client::connect(url, options).await;
    let client = client.with_context(|| format!("connecting {url}"))?;
    login_and_join(&client, name, ROOM).await?;
    Ok(client)
}

/// Logs `client` in to chat as `name` and joins `room`; fails unless both answer 200.
pub(crate) async fn login_and_join(
    client: &Client,
    name: String,
    room: &str,
) -> anyhow::Result<()> {
    request_ok(client, "chat.login", LoginRequest { name }).await?;
    request_ok(client, "chat.join", JoinRequest { room: room.into() }).await
}

/// Says a message of `size` bytes, its send time first (0 for a warm-up message).
async fn say(sender: &Client, size: u64, warm_up: bool) -> anyhow::Result<()> {
    let sent = if warm_up { 0 } else { unix_nanos() };
    // The stamp is always STAMP digits (u64::MAX has 20).
    let pad = "x".repeat((size as usize).saturating_sub(STAMP));
    let text = format!("{sent:0STAMP$}{pad}");
    let room = ROOM.into();
    request_ok(sender, "chat.say", SayRequest { room, text }).await
}

/// Sends `body` on `route`; fails unless it is answered 200.
pub(crate) async fn request_ok(
    client: &Client,
    route: &str,
    body: impl proto::Message,
) -> anyhow::Result<()> {
    expect_ok(client.request(route, body.encode_to_vec()).await?)
}

pub(crate) fn expect_ok(response: Response) -> anyhow::Result<()> {
    if response.code != proto::code::OK {
        bail!("answered {}: {}", response.code, response.message);
    }
    Ok(())
}

/// Members warmed up, deliveries, members done; `done` wakes the waiter on each change.
#[derive(Debug, Default)]
struct Counts {
    warmed: AtomicU64,
    received: AtomicU64,
    finished: AtomicU64,
    done: Notify,
    latency: Mutex<Hist>,
}

impl Counts {
    /// Counts one member's pushes of [`MESSAGE_ROUTE`]: the first warm-up message, then
    /// (later warm-ups skipped) each message and its latency until it has `expected`.
    async fn count(self: Arc<Self>, mut pushes: sdk::Pushes, expected: u64) {
        let (mut warmed, mut got) = (false, 0);
        while let Some(push) = pushes.recv().await {
            if push.route != MESSAGE_ROUTE {
                continue;
            }
            let text = ChatMessage::decode(push.body).map(|m| m.text);
            let text = text.unwrap_or_default();
            let Some(sent) = text.get(..STAMP).and_then(|t| t.parse::<u64>().ok()) else {
                continue;
            };
            if sent == 0 {
                if !warmed {
                    warmed = true;
                    self.warmed.fetch_add(1, Ordering::Relaxed);
                    self.done.notify_one();
                }
                continue;
            }
            got += 1;
            self.received.fetch_add(1, Ordering::Relaxed);
            let took = Duration::from_nanos(unix_nanos().saturating_sub(sent));
            let mut latency = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
            latency.record(took);
            drop(latency);
            if got == expected {
                self.finished.fetch_add(1, Ordering::Relaxed);
                self.done.notify_one();
                break;
            }
        }
    }
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
