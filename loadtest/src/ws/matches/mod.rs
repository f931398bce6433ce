//! `matches`: a keyed service under a game's load. M arena matches × P players, each
//! sending `arena.input{dx: 1}` at `--rate` per second without waiting, receiving its
//! match's `arena.state` at the workers' tick, on a fleet it launches (a bus, gates, a
//! chat worker for the logins, `--arena-workers` arena workers); halfway, `--fault`
//! changes the fleet. A push shows how many of a player's inputs were applied (each moves
//! it by one): the input-to-state latency; its final position against its inputs
//! answered 200, moves lost or applied twice; a match's ticks, pushes skipped or repeated.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::stream::{self, StreamExt as _, TryStreamExt as _};
use nix::sys::signal::Signal;
use testkit::Cut;
use testkit::fleet::{Role, Topology, TopologySpec, or_interrupted};

use super::broadcast::CONNECT_BATCH;
use super::target::watched;
use crate::hist::{Hist, Summary};
use crate::proc::{CpuSample, CpuUse};
use crate::report::{Doc, OutputArgs, Report, Section, Table, cpu_line};
use crate::topology::{Bus, LaunchArgs};
use players::{Outcomes, Player, join, position, send_inputs};

mod players;

/// How long the last inputs may take to be answered after sending stops.
const SETTLE: Duration = Duration::from_secs(10);
/// Most SIGKILLs one kill-owner run strikes (`--kills`).
const MAX_KILLS: u32 = 100;
/// How long the players go on after the last kill, at least: the keyed member timeout's
/// default, so the last kill's matches have moved before they stop.
const AFTER_LAST_KILL: Duration = Duration::from_secs(2);
/// How an input with no answer at all is filed among those not answered 200.
const NO_ANSWER: &str = "no answer:";

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
    /// Fail unless every input is answered 200 and counted exactly once, no match is
    /// lost, and every match's ticks go on one by one (none skipped or repeated); after
    /// flap, every reconnection must have resumed, and on a nats-server cluster a tick
    /// may come twice. After kill-owner an input may also be answered 408 or not at all
    /// (the killed worker may have applied it): a player's final x must lie between its
    /// inputs answered 200 and those plus these ambiguous ones; and no push gap may
    /// exceed --max-gap.
    #[arg(long)]
    pub check: bool,
    /// With kill-owner: SIGKILLs in a row, --kill-every apart from half the duration on,
    /// each to the arena worker that has run longest, each followed by a replacement.
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_KILLS)))]
    pub kills: u32,
    /// Time between two kills: longer than the keyed member timeout (2 s by default), so
    /// each kill's matches have moved before the next.
    #[arg(long, default_value = "4s", value_parser = net::duration::parse_positive)]
    pub kill_every: Duration,
    /// With kill-owner and --check, the longest push gap allowed: by default the keyed
    /// member timeout's default (2 s), one 20 Hz tick, and 50 ms for the take-over's own
    /// work (the standby's wake-up, its new standby's round trip, the gate).
    #[arg(long, default_value = "2100ms", value_parser = net::duration::parse_positive)]
    pub max_gap: Duration,
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
    /// SIGKILL the arena worker that has run longest (`--kills` times), each replaced at
    /// once: its matches go on at their standbys with their state.
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
    /// Inputs answered 408 or not at all: the killed worker may have applied them.
    pub inputs_ambiguous: u64,
    /// Players whose final position differs from their inputs answered 200 (after
    /// kill-owner: lies outside them plus their ambiguous ones).
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
    /// Input sent to its answer of 200.
    pub answered: Summary,
    pub cpu: Vec<CpuUse>,
}

/// Runs the scenario on a fleet it launches.
pub async fn matches(args: MatchesArgs) -> anyhow::Result<()> {
    let owner = matches!(args.fault, Fault::DrainOwner | Fault::KillOwner);
    let why = "--fault drain-owner and kill-owner need --arena-workers 2 or more: someone \
               must take the matches";
    ensure!(!owner || args.arena_workers >= 2, why);
    // For lame-duck the arena workers start on the first node alone, below.
    let on_first_node = args.fault == Fault::LameDuck;
    let why = "--fault lame-duck needs --bus nats-cluster: another node to move to";
    ensure!(!on_first_node || args.launch.bus == Bus::NatsCluster, why);
    strike_times(&args)?;
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
    let (arena, bus) = (args.arena_workers, args.launch.bus.describe());
    let setup = format!(
        "{gates} gate(s) + 1 chat worker + {arena} arena worker(s), {bus}, launched on loopback"
    );
    let report = Report::new("matches", setup, report).written(&args.output)?;
    ensure!(report.inputs_ok > 0, "no input was answered 200");
    if args.check {
        check(&args, &report)?;
    }
    Ok(())
}

/// `--check`: fails unless `report` shows what `args.fault` may cost and no more.
fn check(args: &MatchesArgs, report: &MatchesReport) -> anyhow::Result<()> {
    let (lost, off) = (report.moves_lost, report.positions_wrong);
    let why = format!("inputs not counted exactly once: {lost} moves lost ({off} players off)");
    ensure!(lost == 0 && off == 0, why);
    let players_lost = report.players_lost;
    ensure!(players_lost == 0, "{players_lost} players lost their match");
    let killed = args.fault == Fault::KillOwner;
    let ambiguous = |why: &str| killed && (why.starts_with("408") || why.starts_with(NO_ANSWER));
    let failed = report.inputs_failed.iter();
    let failed: Vec<_> = failed.filter(|(why, _)| !ambiguous(why)).collect();
    ensure!(failed.is_empty(), "inputs not answered 200: {failed:?}");
    // A hand-over's mark cuts a subject exactly on one server; across a nats-server
    // cluster a push published as the mark travels can reach both gates (docs/gateway.md,
    // "Resume"): repeated, never lost.
    let repeats_allowed = args.fault == Fault::Flap && args.launch.bus == Bus::NatsCluster;
    let (skipped, repeated) = (report.ticks_skipped, report.ticks_repeated);
    let why = format!("ticks skipped {skipped}, repeated {repeated}");
    ensure!(skipped == 0 && (repeated == 0 || repeats_allowed), why);
    let (gap, max) = (report.longest_gap_ms, args.max_gap.as_secs_f64() * 1e3);
    let why = format!("a push gap of {gap:.0} ms, longer than --max-gap {max:.0} ms");
    ensure!(!killed || gap <= max, why);
    let (reconnects, resumes) = (report.reconnects, report.resumes);
    let unresumed = reconnects - resumes;
    let why = format!("{unresumed} of {reconnects} reconnections did not resume");
    ensure!(resumes == reconnects, why);
    Ok(())
}

async fn run(args: &MatchesArgs, fleet: &mut Topology) -> anyhow::Result<MatchesReport> {
    // Flapping players reach each gate through a hop that cuts their links.
    let (hops, urls) = match args.fault {
        Fault::Flap => fleet.gate_hops().await?,
        _ => (Vec::new(), fleet.gate_urls()),
    };
    let total = (args.matches * args.players) as usize;
    let joins = stream::iter(0..total).map(|i| join(&urls, i, args.players as usize));
    let players: Vec<Player> = joins.buffer_unordered(CONNECT_BATCH).try_collect().await?;
    let watched = watched(fleet);
    let results = Arc::new(Mutex::new(Outcomes::default()));
    let started = Instant::now();
    let before = CpuSample::take(&watched);
    let spread = |(i, p)| send_inputs(p, i as f64 / players.len() as f64, args, &results);
    let senders: Vec<_> = players.iter().enumerate().map(spread).collect();
    let mut events = Vec::new();
    for at in strike_times(args)? {
        tokio::time::sleep_until((started + at).into()).await;
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
    let (mut latency, mut answered) = (Hist::new(), Hist::new());
    let outcomes = std::mem::take(&mut *results.lock().unwrap());
    let killed = args.fault == Fault::KillOwner;
    for player in &players {
        let at = position(&player.client).await?;
        let seen = player.seen.lock().unwrap();
        let ambiguous = seen.sent - seen.ok - seen.refused;
        report.inputs_ambiguous += ambiguous as u64;
        // After a kill, x may hold inputs the killed worker applied but did not answer.
        let most = seen.ok + if killed { ambiguous } else { 0 };
        match at {
            Some(at) if at < seen.ok || at > most => {
                report.positions_wrong += 1;
                // Missing below ok, applied twice above most.
                report.moves_lost += (seen.ok - at).max(0) + (most - at).min(0);
            }
            Some(_) => {}
            // Its match went with a killed worker and nothing took it over.
            None => report.players_lost += 1,
        }
        report.inputs_ok += seen.ok as u64;
        latency.merge(&seen.latency);
        answered.merge(&seen.answered);
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
    (report.latency, report.answered) = (latency.summary(), answered.summary());
    Ok(report)
}

/// When `--fault` strikes: halfway, then (kill-owner) every `--kill-every`, `--kills` in
/// all; refused when the players stop under [`AFTER_LAST_KILL`] after the last.
fn strike_times(args: &MatchesArgs) -> anyhow::Result<Vec<Duration>> {
    let (killing, n) = (args.fault == Fault::KillOwner, args.kills);
    let kills = if killing { n } else { 1 };
    ensure!(kills == n, "--kills {n} needs --fault kill-owner");
    let (first, every) = (args.duration / 2, args.kill_every);
    let last = first + every * (kills - 1);
    ensure!(
        !killing || last + AFTER_LAST_KILL <= args.duration,
        "--duration {:?} is too short for {kills} kill(s) {every:?} apart from {first:?}: \
         the players must go on {AFTER_LAST_KILL:?} after the last, at {last:?}",
        args.duration
    );
    let kills = if args.fault == Fault::None { 0 } else { kills };
    Ok((0..kills).map(|k| first + every * k).collect())
}

fn is_arena(role: &Role) -> bool {
    matches!(role, Role::Worker { service, .. } if service == "arena")
}

/// Does `fault` to the fleet; says what was done, and when.
async fn strike(
    fault: Fault,
    fleet: &mut Topology,
    hops: &[Cut],
    started: Instant,
) -> anyhow::Result<String> {
    let at = started.elapsed().as_secs_f64();
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
    // The arena worker that has run longest: round-robin, as replacements start last.
    let owner = fleet.running(is_arena).into_iter().next();
    let owner = owner.context("no arena worker left")?;
    let stopped = fleet.stop_one(&owner, signal).await?;
    if fault == Fault::DrainOwner {
        return Ok(format!("{at:.2} s: {stopped}"));
    }
    let role = fleet.add_worker("arena").await?;
    let ready = started.elapsed().as_secs_f64() - at;
    let done = format!("{at:.2} s: {stopped}; {role} started in its place, ready in {ready:.2} s");
    Ok(done)
}

/// How long an arena worker may take to move off a node in lame duck mode (the fleet's
/// nodes close their clients from a second after the notice on).
const MOVE_WITHIN: Duration = Duration::from_secs(5);

/// Puts the first node in lame duck mode; says when each arena worker (all on it) moved.
async fn lame_duck(fleet: &mut Topology, started: Instant) -> anyhow::Result<String> {
    let at = started.elapsed().as_secs_f64();
    let node = fleet.process(&Role::Node(0)).context("no first node")?;
    node.signal(Signal::SIGUSR2);
    let mut moved = Vec::new();
    for role in fleet.running(is_arena) {
        let worker = fleet.process(&role).context("an arena worker is gone")?;
        let line = worker.wait_line("the partitions moved to another NATS server", MOVE_WITHIN);
        line.await.map_err(anyhow::Error::msg)?;
        let after = started.elapsed().as_secs_f64() - at;
        moved.push(format!("{role} {after:.2} s"));
    }
    let moved = moved.join(", ");
    let done = format!("{at:.2} s: nats-0 in lame duck mode; moved: {moved}");
    Ok(done)
}

impl Section for MatchesReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
        let failed = |(why, n): &(String, u64)| format!("failed    {n} × {why}");
        let mut lines: Vec<String> = self.inputs_failed.iter().map(failed).collect();
        lines.push(cpu_line(&self.cpu, self.inputs_sent, "input"));
        doc.lines(lines);
        let rows = [
            ("input to state", &self.latency),
            ("input answered", &self.answered),
        ];
        doc.table(Table::latency(rows));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &str) -> Result<MatchesArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: MatchesArgs,
        }
        let argv = std::iter::once("matches").chain(flags.split_whitespace());
        Ok(<Cli as clap::Parser>::try_parse_from(argv)?.args)
    }

    fn strikes(flags: &str) -> anyhow::Result<Vec<Duration>> {
        strike_times(&args(flags)?)
    }

    #[test]
    fn one_strike_halfway_by_default_and_kills_kill_every_apart() {
        let s = Duration::from_secs;
        let defaults = args("").unwrap();
        assert_eq!((defaults.kills, defaults.kill_every), (1, s(4)));
        assert_eq!(defaults.max_gap, Duration::from_millis(2_100));
        assert!(strikes("").unwrap().is_empty());
        assert_eq!(strikes("--fault drain-owner").unwrap(), [s(5)]);
        let short = strikes("--fault drain-owner --duration 2s").unwrap();
        assert_eq!(short, [s(1)], "only kills need time after them");
        assert_eq!(strikes("--fault kill-owner").unwrap(), [s(5)]);
        let three = strikes("--fault kill-owner --kills 3 --duration 20s").unwrap();
        assert_eq!(three, [s(10), s(14), s(18)]);
        let every = strikes("--fault kill-owner --kills 2 --kill-every 5s --duration 20s");
        assert_eq!(every.unwrap(), [s(10), s(15)]);
    }

    #[test]
    fn a_duration_too_short_for_the_kills_or_kills_out_of_range_are_refused() {
        let refused = |flags| strikes(flags).unwrap_err().to_string();
        // The last of 3 kills at 18 s needs the players on until 20 s.
        let short = refused("--fault kill-owner --kills 3 --duration 19s");
        assert!(short.contains("too short for 3 kill(s)"), "{short}");
        assert!(refused("--fault kill-owner --duration 3s").contains("too short"));
        assert!(refused("--fault drain-owner --kills 2").contains("needs --fault kill-owner"));
        assert!(refused("--fault kill-owner --kills 0").contains("0 is not in 1..=100"));
        assert!(refused("--fault kill-owner --kills 101").contains("101 is not in 1..=100"));
        let most = strikes("--fault kill-owner --kills 100 --kill-every 1s --duration 300s");
        assert_eq!(most.unwrap().len(), 100);
    }

    #[test]
    fn after_a_kill_only_ambiguous_inputs_and_gaps_within_max_gap_pass_the_check() {
        let kill = args("--fault kill-owner --check").unwrap();
        let why = |report: &MatchesReport| check(&kill, report).unwrap_err().to_string();
        let mut report = MatchesReport {
            longest_gap_ms: 2_100.0,
            ..MatchesReport::default()
        };
        report.inputs_failed = vec![("408 timeout".into(), 3), (format!("{NO_ANSWER} x"), 1)];
        assert!(check(&kill, &report).is_ok());
        let plain = args("--check").unwrap();
        assert!(check(&plain, &report).is_err(), "only after a kill");
        report.longest_gap_ms = 2_101.0;
        assert!(why(&report).contains("--max-gap 2100 ms"));
        report.longest_gap_ms = 0.0;
        report.players_lost = 1;
        assert!(why(&report).contains("lost their match"));
        report.players_lost = 0;
        let lost = ("404 match lost: join again".to_owned(), 1);
        report.inputs_failed.push(lost);
        assert!(why(&report).contains("404 match lost"));
    }
}
