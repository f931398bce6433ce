//! `matches`: a keyed service under a game's load. M arena matches × P players, each
//! player sending `arena.input{dx: 1}` at `--rate` per second (without waiting for the
//! answers) and receiving its match's `arena.state` at the workers' tick rate, on a fleet
//! it launches (a broker or a nats-server cluster, gates, one chat worker for the
//! logins, `--arena-workers` arena workers). Halfway through, `--fault` changes the fleet.
//!
//! A state push shows how many of a player's inputs were applied (each moves it by one),
//! so it measures the input-to-state latency, and the player's final position against
//! its inputs answered 200 shows moves lost or applied twice; a match's ticks show pushes
//! skipped or repeated.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::stream::{self, StreamExt as _, TryStreamExt as _};
use nix::sys::signal::Signal;
use proto::Message as _;
use proto::arena::{InputRequest, InputResponse, JoinRequest, State};
use proto::chat::LoginRequest;
use sdk::{Backoff, Client, ClientOptions};
use testkit::Cut;
use testkit::fleet::{Role, Topology, TopologySpec, or_interrupted};

use super::broadcast::{expect_ok, request_ok};
use super::target::watched;
use crate::hist::{Hist, Summary};
use crate::proc::{CpuSample, CpuUse};
use crate::report::{Doc, OutputArgs, Report, Section, Table, cpu_line};
use crate::topology::{Bus, LaunchArgs};

/// Players connecting at once.
const CONNECT_BATCH: usize = 100;
/// How long the last inputs may take to be answered after sending stops.
const SETTLE: Duration = Duration::from_secs(10);

/// `loadtest matches` flags.
#[derive(Debug, clap::Args)]
pub struct MatchesArgs {
    /// Matches.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub matches: u32,
    /// Players per match.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub players: u32,
    /// Inputs per second of each player.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rate: u32,
    /// How long the players send.
    #[arg(long, default_value = "10s", value_parser = net::duration::parse_positive)]
    pub duration: Duration,
    /// Arena worker processes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub arena_workers: u32,
    /// What happens to the fleet halfway through. drain-owner and kill-owner need
    /// --arena-workers 2 or more, lame-duck --bus nats-cluster.
    #[arg(long, value_enum, default_value_t = Fault::None)]
    pub fault: Fault,
    /// Fail unless every input is answered 200 and counted exactly once, and every
    /// match's ticks go on one by one (none skipped or repeated); after kill-owner, only
    /// the players of lost matches may miss inputs, each answered 404 `match lost` or
    /// 408 (taken by the killed worker); after flap, every reconnection must have
    /// resumed, and on a nats-server cluster a tick may come twice (never go missing).
    #[arg(long)]
    pub check: bool,
    /// Gates and extra flags of the launched fleet (--workers does not apply: one chat
    /// worker, --arena-workers arena workers).
    #[command(flatten)]
    pub launch: LaunchArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What `--fault` does halfway through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    #[default]
    None,
    /// Start one more arena worker: it takes a share of the matches with their state.
    AddWorker,
    /// SIGTERM the first arena worker: its matches move to the others with their state.
    DrainOwner,
    /// SIGKILL the first arena worker: its matches are lost, their players' inputs
    /// answered 404 `match lost`; the rest play on.
    KillOwner,
    /// Cut every player's link at once (each reaches the gates through a TCP hop of
    /// ours): the SDK resumes each session on the next gate (docs/protocol.md "Resume").
    Flap,
    /// Put the first nats-server node, where every arena worker runs, in lame duck mode:
    /// each worker moves its partitions to another node (docs/workers.md).
    LameDuck,
}

/// What one `matches` run measured.
#[derive(Debug, Default, serde::Serialize)]
pub struct MatchesReport {
    pub matches: u32,
    pub players: u32,
    pub rate: u32,
    pub arena_workers: u32,
    pub fault: Fault,
    pub seconds: f64,
    /// What happened during the run (the drain), with when.
    pub events: Vec<String>,
    pub inputs_sent: u64,
    pub inputs_ok: u64,
    /// Inputs answered otherwise, as `code message` lines with their count.
    pub inputs_failed: Vec<(String, u64)>,
    /// Players whose final position differs from their inputs answered 200.
    pub positions_wrong: u64,
    /// Players whose match was lost (an input answered 404 `match lost`).
    pub players_lost: u64,
    /// Moves missing (or, negative, applied twice) over all players.
    pub moves_lost: i64,
    pub state_pushes: u64,
    pub pushes_per_s: f64,
    /// Over the matches (as each one's first player saw them): ticks skipped, ticks
    /// repeated, the longest time between two pushes.
    pub ticks_skipped: u64,
    pub ticks_repeated: u64,
    pub longest_gap_ms: f64,
    /// Players' reconnections, and how many of them resumed the session.
    pub reconnects: u64,
    pub resumes: u64,
    /// Input sent to a state push showing it.
    pub latency: Summary,
    pub cpu: Vec<CpuUse>,
}

/// Runs the scenario on a fleet it launches.
pub async fn matches(args: MatchesArgs) -> anyhow::Result<()> {
    ensure!(
        matches!(args.fault, Fault::None | Fault::AddWorker | Fault::Flap)
            || args.arena_workers >= 2,
        "--fault drain-owner and kill-owner need --arena-workers 2 or more: someone must take the matches"
    );
    ensure!(
        args.fault != Fault::LameDuck || args.launch.bus == Bus::NatsCluster,
        "--fault lame-duck needs --bus nats-cluster: another node to move to"
    );
    // For lame-duck the arena workers start on the first node alone, below.
    let on_first_node = args.fault == Fault::LameDuck;
    let arena = if on_first_node { 0 } else { args.arena_workers };
    let spec = TopologySpec {
        workers: vec![
            ("chat".to_owned(), 1),
            (super::target::PROFILE.to_owned(), 1),
            ("arena".to_owned(), arena as usize),
        ],
        ..args.launch.spec(1, 1, &[])
    };
    let gates = spec.gates;
    let mut fleet = Topology::start(spec).await.context("launching the fleet")?;
    let work = async {
        let first_node = fleet.nats_urls()[..1].to_vec();
        for _ in arena..args.arena_workers {
            fleet.add_worker_on("arena", &first_node).await?;
        }
        run(&args, &mut fleet).await
    };
    let outcome = or_interrupted(work).await;
    let stopped = fleet.shutdown().await;
    let report = outcome?;
    stopped.context("stopping the fleet")?;
    let setup = format!(
        "{gates} gate(s) + 1 chat worker + {} arena worker(s), {}, launched on loopback",
        args.arena_workers,
        args.launch.bus.describe()
    );
    let report = Report::new("matches", setup, report).written(&args.output)?;
    if report.inputs_ok == 0 {
        bail!("no input was answered 200");
    }
    if args.check {
        ensure!(
            report.moves_lost == 0 && report.positions_wrong == 0,
            "inputs not counted exactly once: {} moves lost ({} players off)",
            report.moves_lost,
            report.positions_wrong
        );
        let allowed = |why: &str| {
            args.fault == Fault::KillOwner
                && (why.starts_with("404 match lost") || why.starts_with("408"))
        };
        let failed: Vec<_> = (report.inputs_failed.iter())
            .filter(|(why, _)| !allowed(why))
            .collect();
        ensure!(failed.is_empty(), "inputs not answered 200: {failed:?}");
        // A hand-over's mark cuts a subject exactly on one server; across a
        // nats-server cluster a push published as the mark travels can reach both
        // gates (docs/gateway.md, "Resume"): repeated, never lost.
        let repeats_allowed = args.fault == Fault::Flap && args.launch.bus == Bus::NatsCluster;
        ensure!(
            report.ticks_skipped == 0 && (report.ticks_repeated == 0 || repeats_allowed),
            "ticks skipped {}, repeated {}",
            report.ticks_skipped,
            report.ticks_repeated
        );
        ensure!(
            report.resumes == report.reconnects,
            "{} of {} reconnections did not resume their session",
            report.reconnects - report.resumes,
            report.reconnects
        );
    }
    Ok(())
}

/// One player: its session, and what it saw.
struct Player {
    client: Client,
    seen: Arc<Mutex<Seen>>,
}

/// What one player saw.
#[derive(Default)]
struct Seen {
    /// Inputs sent and not yet shown by a state push: (count after it, when sent).
    unshown: VecDeque<(i64, Instant)>,
    sent: i64,
    /// Inputs answered 200.
    ok: i64,
    latency: Hist,
    pushes: u64,
    last_tick: Option<u64>,
    last_push: Option<Instant>,
    skipped: u64,
    repeated: u64,
    longest_gap: Duration,
}

impl Seen {
    fn on_state(&mut self, uid: &str, state: &State, watches: bool) {
        let now = Instant::now();
        self.pushes += 1;
        if watches {
            if let Some(last) = self.last_tick {
                match state.tick.checked_sub(last) {
                    Some(1) => {}
                    Some(0) | None => self.repeated += 1,
                    Some(n) => self.skipped += n - 1,
                }
            }
            if let Some(last) = self.last_push {
                self.longest_gap = self.longest_gap.max(now - last);
            }
            self.last_tick = Some(state.tick);
            self.last_push = Some(now);
        }
        let Some(me) = state.players.iter().find(|p| p.uid == uid) else {
            return;
        };
        while let Some(&(count, sent)) = self.unshown.front() {
            if count > me.x {
                break;
            }
            self.latency.record(now - sent);
            self.unshown.pop_front();
        }
    }
}

async fn run(args: &MatchesArgs, fleet: &mut Topology) -> anyhow::Result<MatchesReport> {
    // Flapping players reach each gate through a hop that cuts their links.
    let (hops, urls) = match args.fault {
        Fault::Flap => fleet.gate_hops().await?,
        _ => (Vec::new(), fleet.gate_urls()),
    };
    let total = (args.matches * args.players) as usize;
    let players: Vec<Player> = stream::iter(0..total)
        .map(|i| join(&urls, i, args.players as usize))
        .buffer_unordered(CONNECT_BATCH)
        .try_collect()
        .await?;
    let watched = watched(fleet);
    let results = Arc::new(Mutex::new(Outcomes::default()));
    let started = Instant::now();
    let before = CpuSample::take(&watched);
    let senders: Vec<_> = (players.iter())
        .map(|p| send_inputs(p, args, results.clone()))
        .collect();
    let mut events = Vec::new();
    if args.fault != Fault::None {
        tokio::time::sleep(args.duration / 2).await;
        events.push(strike(args.fault, fleet, &hops, started).await?);
    }
    for sender in senders {
        sender.await.context("an input sender failed")?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = before.until(&CpuSample::take(&watched));
    // The last answers, then each player's position against its inputs answered 200.
    let deadline = Instant::now() + SETTLE;
    while results.lock().unwrap().pending > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut report = MatchesReport {
        matches: args.matches,
        players: args.players,
        rate: args.rate,
        arena_workers: args.arena_workers,
        fault: args.fault,
        seconds,
        events,
        cpu,
        ..MatchesReport::default()
    };
    let mut latency = Hist::new();
    let outcomes = std::mem::take(&mut *results.lock().unwrap());
    for player in &players {
        let at = position(&player.client).await?;
        let seen = player.seen.lock().unwrap();
        match at {
            Some(at) if at != seen.ok => {
                report.positions_wrong += 1;
                report.moves_lost += seen.ok - at;
            }
            Some(_) => {}
            // Its match went with a killed worker: nothing to count against.
            None => report.players_lost += 1,
        }
        report.inputs_ok += seen.ok as u64;
        latency.merge(&seen.latency);
        report.state_pushes += seen.pushes;
        report.ticks_skipped += seen.skipped;
        report.ticks_repeated += seen.repeated;
        let gap_ms = seen.longest_gap.as_secs_f64() * 1e3;
        report.longest_gap_ms = report.longest_gap_ms.max(gap_ms);
        report.inputs_sent += seen.sent as u64;
        report.reconnects += player.client.reconnects();
        report.resumes += player.client.resumes();
    }
    report.inputs_failed = outcomes.failed.into_iter().collect();
    report.pushes_per_s = report.state_pushes as f64 / seconds;
    report.latency = latency.summary();
    Ok(report)
}

/// Does `fault` to the fleet; says what was done, and when.
async fn strike(
    fault: Fault,
    fleet: &mut Topology,
    hops: &[Cut],
    started: Instant,
) -> anyhow::Result<String> {
    let at = started.elapsed().as_secs_f64();
    let owner = Role::Worker {
        service: "arena".into(),
        index: 0,
    };
    let signal = match fault {
        Fault::None => return Ok(String::new()),
        Fault::Flap => {
            hops.iter().for_each(Cut::cut);
            return Ok(format!("{at:.2} s: cut every player's link"));
        }
        Fault::AddWorker => {
            let role = fleet.add_worker("arena").await?;
            let ready = started.elapsed().as_secs_f64() - at;
            return Ok(format!("{at:.2} s: started {role}, ready in {ready:.2} s"));
        }
        Fault::LameDuck => return lame_duck(fleet, started).await,
        Fault::DrainOwner => Signal::SIGTERM,
        Fault::KillOwner => Signal::SIGKILL,
    };
    let stopped = fleet.stop_one(&owner, signal).await?;
    Ok(format!("{at:.2} s: {stopped}"))
}

/// How long each arena worker may take to move its partitions off the node in lame duck
/// mode (the fleet's nodes close their clients from a second after the notice on).
const MOVE_WITHIN: Duration = Duration::from_secs(5);

/// Puts the first node in lame duck mode and waits until every arena worker (all on it)
/// has moved its partitions to another node; says when each did.
async fn lame_duck(fleet: &mut Topology, started: Instant) -> anyhow::Result<String> {
    let at = started.elapsed().as_secs_f64();
    let node = fleet.process(&Role::Node(0)).context("no first node")?;
    node.signal(Signal::SIGUSR2);
    let arena: Vec<Role> = (fleet.pids().into_iter())
        .map(|(role, _)| role)
        .filter(|role| matches!(role, Role::Worker { service, .. } if service == "arena"))
        .collect();
    let mut moved = Vec::new();
    for role in arena {
        let worker = fleet.process(&role).context("an arena worker is gone")?;
        (worker.wait_line("the partitions moved to another NATS server", MOVE_WITHIN))
            .await
            .map_err(anyhow::Error::msg)?;
        let after = started.elapsed().as_secs_f64() - at;
        moved.push(format!("{role} {after:.2} s"));
    }
    let moved = moved.join(", ");
    Ok(format!(
        "{at:.2} s: nats-0 in lame duck mode; moved: {moved}"
    ))
}

/// Inputs not answered 200, by `code message`, and inputs not answered yet.
#[derive(Default)]
struct Outcomes {
    failed: std::collections::BTreeMap<String, u64>,
    pending: u64,
}

/// Connects player `i` (to gate `i % gates`, the others its fallbacks, reconnecting and
/// resuming by itself), logs it in and joins its match (`i / players`).
async fn join(urls: &[String], i: usize, players: usize) -> anyhow::Result<Player> {
    let first = i % urls.len();
    let urls = [&urls[first..], &urls[..first]].concat();
    let options = ClientOptions {
        reconnect: Some(Backoff::default()),
        ..ClientOptions::default()
    };
    let client = Client::connect_any(&urls, options)
        .await
        .with_context(|| format!("connecting {}", urls[0]))?;
    let uid = format!("p{i}");
    request_ok(&client, "chat.login", LoginRequest { name: uid.clone() }).await?;
    let name = format!("m{}", i / players);
    let join = JoinRequest {
        r#match: name.clone(),
    };
    expect_ok(
        (client.request_keyed("arena.join", &name, join.encode_to_vec()))
            .await
            .with_context(|| format!("{uid} joining {name}"))?,
    )?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut pushes = client.pushes().context("push stream taken")?;
    let watching = seen.clone();
    let watches = i % players == 0;
    tokio::spawn(async move {
        while let Some(push) = pushes.recv().await {
            if let Ok(state) = State::decode(push.body) {
                watching.lock().unwrap().on_state(&uid, &state, watches);
            }
        }
    });
    Ok(Player { client, seen })
}

/// Sends `--rate` inputs a second for `--duration`, each without waiting for the one
/// before; counts the answers in `results`.
fn send_inputs(
    player: &Player,
    args: &MatchesArgs,
    results: Arc<Mutex<Outcomes>>,
) -> tokio::task::JoinHandle<()> {
    let (client, seen) = (player.client.clone(), player.seen.clone());
    let interval = Duration::from_secs(1) / args.rate;
    let count = (args.duration.as_secs_f64() * f64::from(args.rate)) as u64;
    tokio::spawn(async move {
        let body = InputRequest { dx: 1, dy: 0 }.encode_to_vec();
        let mut ticks = tokio::time::interval(interval);
        for _ in 0..count {
            ticks.tick().await;
            {
                let mut seen = seen.lock().unwrap();
                seen.sent += 1;
                let count = seen.sent;
                seen.unshown.push_back((count, Instant::now()));
            }
            results.lock().unwrap().pending += 1;
            let (client, body, results) = (client.clone(), body.clone(), results.clone());
            let seen = seen.clone();
            tokio::spawn(async move {
                let answer = client.request("arena.input", body).await;
                let mut r = results.lock().unwrap();
                r.pending -= 1;
                let failed = match answer {
                    Ok(a) if a.code == proto::code::OK => return seen.lock().unwrap().ok += 1,
                    Ok(a) => format!("{} {}", a.code, a.message),
                    Err(e) => e.to_string(),
                };
                *r.failed.entry(failed).or_default() += 1;
            });
        }
    })
}

/// A player's position now (an input of (0, 0) answers it); `None` when its match is
/// lost (404: its worker was killed since the player's last input).
async fn position(client: &Client) -> anyhow::Result<Option<i64>> {
    let body = InputRequest { dx: 0, dy: 0 }.encode_to_vec();
    let answer = client.request("arena.input", body).await?;
    if answer.code == proto::code::NOT_FOUND {
        return Ok(None);
    }
    expect_ok(answer.clone())?;
    Ok(Some(InputResponse::decode(answer.body)?.x))
}

impl Section for MatchesReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
        let failed = self.inputs_failed.iter();
        let mut lines: Vec<String> = failed
            .map(|(why, n)| format!("failed    {n} × {why}"))
            .collect();
        lines.push(cpu_line(&self.cpu, self.inputs_sent, "input"));
        doc.lines(lines);
        doc.table(Table::latency([("input to state", &self.latency)]));
    }
}
