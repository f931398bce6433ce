//! The phases of `loadtest faults`, what each may cost the clients, and the report:
//! every request counts in the phase in which it was SENT, however late it ended.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde::Serialize;

use super::FaultsArgs;
use super::load::{Answer, ClientRecord, ROUTE};
use crate::hist::Hist;
use crate::proc::{CpuUse, MACHINE, STEAL};
use crate::report::{Doc, Section, Table, XAxis};
use crate::topology::Bus;

/// Width of one point of the answers-over-time chart.
const TIMELINE_BUCKET: Duration = Duration::from_millis(100);
const OK: u32 = proto::code::OK;

/// What a phase does to the fleet at its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Nothing: the load alone.
    #[default]
    Baseline,
    /// Every client's link cut at once (the clients reach the gates through TCP hops of
    /// the load tester's): each resumes its session (docs/protocol.md, "Resume").
    FlapClients,
    AddWorker,
    /// SIGTERM to an echo worker; waited for until it exits.
    DrainWorker,
    /// SIGKILL to an echo worker.
    KillWorker,
    /// SIGTERM to a gate, waited for; then a new gate on its port.
    DrainGate,
    /// A bus node stopped (the broker killed, a cluster node in lame duck mode), then
    /// started again on its ports.
    RestartBus,
}

/// How the restart phase stops a node of a nats-server cluster (`--node-stop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum NodeStop {
    /// SIGUSR2: lame duck mode; the node's clients move before it closes them.
    #[default]
    LameDuck,
    /// SIGTERM: nats-server shuts down at once, closing its clients.
    Term,
    /// SIGKILL.
    Kill,
}

impl NodeStop {
    pub fn signal(self) -> Signal {
        match self {
            NodeStop::LameDuck => Signal::SIGUSR2,
            NodeStop::Term => Signal::SIGTERM,
            NodeStop::Kill => Signal::SIGKILL,
        }
    }
}

/// The phases, in order.
pub const PHASES: [Fault; 7] = [
    Fault::Baseline,
    Fault::FlapClients,
    Fault::AddWorker,
    Fault::DrainWorker,
    Fault::KillWorker,
    Fault::DrainGate,
    Fault::RestartBus,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Baseline => "baseline",
            Fault::FlapClients => "flap clients",
            Fault::AddWorker => "add worker",
            Fault::DrainWorker => "drain worker",
            Fault::KillWorker => "kill worker",
            Fault::DrainGate => "drain gate",
            Fault::RestartBus => "restart bus node",
        }
    }

    /// The codes besides 200 issue #15 lets this phase answer on `bus` (a cluster node
    /// stopped as `stop` says), and only for requests in flight when the fault struck
    /// (sent before it, or within `--held-slack` after), no more than those: 408 for
    /// those a killed worker held; 503 for those on a gate's bus connection when the
    /// broker, or a cluster node stopped at once, died, and whose answer did not come
    /// through the next connection (they may have reached a worker, so they are never
    /// sent again; requests sent while it is away wait for it, docs/gateway.md "Bus
    /// blips"); a cluster node stopped at once also takes the requests on its way to
    /// or held by the workers connected to it: 408. A node in lame duck mode costs
    /// nothing. In every phase nothing is cut, lost or timed out.
    fn allowed(self, bus: Bus, stop: NodeStop) -> Vec<u32> {
        use proto::code::{TIMEOUT, UNAVAILABLE};
        let at_once = stop != NodeStop::LameDuck;
        match (self, bus) {
            (Fault::KillWorker, _) => vec![TIMEOUT],
            (Fault::RestartBus, Bus::Shaddock) => vec![UNAVAILABLE],
            (Fault::RestartBus, Bus::NatsCluster) if at_once => vec![UNAVAILABLE, TIMEOUT],
            _ => Vec::new(),
        }
    }
}

/// What a phase allowed to answer `allowed` besides 200 is expected to show.
fn expected(allowed: &[u32], held_slack_ms: u128) -> String {
    if allowed.is_empty() {
        return "all 200: 0 errors, 0 cut, 0 lost".to_owned();
    }
    let codes: Vec<String> = allowed.iter().map(|c| format!("{c}s")).collect();
    let codes = codes.join(" and ");
    format!(
        "0 cut, 0 lost, no timeout; besides 200 only {codes}, at most the requests in flight \
         at the kill, all sent before it (or within {held_slack_ms} ms after)"
    )
}

/// One phase as it ran.
#[derive(Debug, Clone)]
pub struct PhaseRun {
    pub fault: Fault,
    pub start: Instant,
    pub end: Instant,
    /// What the fault did, with timings.
    pub events: Vec<String>,
    /// When the fault killed a process, for the requests it may have held.
    pub struck: Option<Instant>,
    pub cpu: Vec<CpuUse>,
    /// Requests the gates held for the bus, and sent again after "no responders".
    pub blips: [u64; 2],
}

/// One phase's figures from every client's record: times in ms, histograms in µs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseReport {
    pub fault: Fault,
    pub started_s: f64,
    pub seconds: f64,
    pub events: Vec<String>,
    pub sent: u64,
    /// Answers by code, and those other than 200 by "code message".
    pub answered: BTreeMap<u32, u64>,
    pub reasons: BTreeMap<String, u64>,
    pub cut: u64,
    pub timed_out: u64,
    pub failed: BTreeMap<String, u64>,
    /// Sent, and neither answered nor failed by the end of the run.
    pub lost: u64,
    /// Answers other than 200, timeouts and other failures: the "errors".
    pub errors: u64,
    /// From send to answer, answered requests only.
    pub latency: Hist,
    /// The clients' reconnection gaps, one per reconnection.
    pub gaps: Hist,
    /// Clients the gate closed for good (and replaced), by the SDK's reason.
    pub clients_closed: BTreeMap<String, u64>,
    /// Longest stretch of the phase without any 200 (the bus gap, in the restart phase).
    pub no_200_ms: f64,
    /// The gates' counters over the phase: requests held while their bus connection was
    /// down, and sent again after "no responders".
    pub held: u64,
    pub resent: u64,
    /// Requests (of every phase) sent before the fault struck and ended after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight_at_fault: Option<u64>,
    /// The machine over the phase: busy and hypervisor steal, % of one core.
    pub machine_percent: f64,
    pub steal_percent: f64,
    /// The codes besides 200 the phase may answer (`Fault::allowed`); none: all 200.
    pub allowed: Vec<u32>,
    /// Why it missed its expectation; empty when it met it.
    pub misses: Vec<String>,
    /// By code, answers to requests sent after the fault struck, and the latest such send.
    #[serde(skip)]
    late: BTreeMap<u32, (u64, Duration)>,
}

impl PhaseReport {
    pub fn passed(&self) -> bool {
        self.misses.is_empty()
    }

    /// Why the phase misses its expectation.
    fn check(&self) -> Vec<String> {
        let counts = [
            ("cut", self.cut),
            ("lost", self.lost),
            ("timed out", self.timed_out),
        ];
        let counts = counts.into_iter().filter(|(_, n)| *n > 0);
        let mut why: Vec<String> = counts.map(|(what, n)| format!("{n} {what}")).collect();
        why.extend(self.failed.iter().map(|(k, n)| format!("{n} failed ({k})")));
        let allowed = &self.allowed;
        let others = (self.answered.iter()).filter(|(c, _)| **c != OK && !allowed.contains(c));
        why.extend(others.map(|(code, n)| format!("{n} answered {code}")));
        if !allowed.is_empty() {
            let held = self.in_flight_at_fault.unwrap_or(0);
            let n: u64 = allowed.iter().filter_map(|c| self.answered.get(c)).sum();
            if n > held {
                let codes: Vec<String> = allowed.iter().map(u32::to_string).collect();
                let codes = codes.join(" or ");
                why.push(format!(
                    "{n} answered {codes}, more than the {held} in flight at the kill"
                ));
            }
            for code in allowed {
                if let Some((n, latest)) = self.late.get(code) {
                    let ms = latest.as_millis();
                    why.push(format!(
                        "{n} {code}s for requests sent after the kill (the latest {ms} ms after)"
                    ));
                }
            }
        }
        why
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// Every client's record, one report per phase; times from `origin`.
fn tally(
    records: &[ClientRecord],
    runs: &[PhaseRun],
    (bus, stop): (Bus, NodeStop),
    origin: Instant,
    held_slack: Duration,
) -> Vec<PhaseReport> {
    let mut phases = vec![PhaseReport::default(); runs.len()];
    let mut oks = Vec::new();
    for record in records {
        for (p, sent) in phases.iter_mut().zip(&record.sent) {
            p.sent += sent;
        }
        for o in &record.outcomes {
            let Some(p) = phases.get_mut(o.phase) else {
                continue;
            };
            match &o.answer {
                Answer::Cut => p.cut += 1,
                Answer::Timeout => p.timed_out += 1,
                Answer::Failed(kind) => *p.failed.entry(kind.clone()).or_default() += 1,
                Answer::Code(OK, _) => {
                    *p.answered.entry(OK).or_default() += 1;
                    p.latency.record(o.done.saturating_duration_since(o.sent));
                    oks.push(o.done);
                }
                Answer::Code(code, message) => {
                    *p.answered.entry(*code).or_default() += 1;
                    p.latency.record(o.done.saturating_duration_since(o.sent));
                    let reason = format!("{code} {}", message.as_deref().unwrap_or_default());
                    *p.reasons.entry(reason.trim_end().to_owned()).or_default() += 1;
                    let struck = runs[o.phase].struck;
                    if let Some(at) = struck.filter(|at| o.sent > *at + held_slack) {
                        let (n, latest) = p.late.entry(*code).or_default();
                        *n += 1;
                        *latest = (*latest).max(o.sent - at);
                    }
                }
            }
        }
        for &(phase, length) in &record.gaps {
            if let Some(p) = phases.get_mut(phase) {
                p.gaps.record(length);
            }
        }
        for (phase, reason) in &record.closings {
            if let Some(p) = phases.get_mut(*phase) {
                *p.clients_closed.entry(reason.clone()).or_default() += 1;
            }
        }
    }
    oks.sort_unstable();
    for (p, run) in phases.iter_mut().zip(runs) {
        let cpu = |name| (run.cpu.iter().find(|c| c.name == name)).map_or(0.0, |c| c.percent);
        let answered: u64 = p.answered.values().sum();
        let failed: u64 = p.failed.values().sum();
        p.lost = (p.sent).saturating_sub(answered + p.cut + p.timed_out + failed);
        p.errors = answered - p.answered.get(&OK).unwrap_or(&0) + p.timed_out + failed;
        p.no_200_ms = ms(longest_without(&oks, run.start, run.end));
        p.in_flight_at_fault = run.struck.map(|at| {
            let outcomes = records.iter().flat_map(|r| &r.outcomes);
            let held = outcomes.filter(|o| o.sent <= at + held_slack && o.done > at);
            held.count() as u64
        });
        p.fault = run.fault;
        p.started_s = run.start.saturating_duration_since(origin).as_secs_f64();
        p.seconds = run.end.saturating_duration_since(run.start).as_secs_f64();
        p.events.clone_from(&run.events);
        [p.held, p.resent] = run.blips;
        (p.machine_percent, p.steal_percent) = (cpu(MACHINE), cpu(STEAL));
        p.allowed = run.fault.allowed(bus, stop);
        p.misses = p.check();
    }
    phases
}

/// The longest stretch of `[start, end]` holding none of `times` (sorted).
fn longest_without(times: &[Instant], start: Instant, end: Instant) -> Duration {
    let from = times.partition_point(|t| *t < start);
    let to = times.partition_point(|t| *t <= end);
    let mut last = start;
    let mut longest = Duration::ZERO;
    for &t in times[from..to].iter().chain(std::iter::once(&end)) {
        longest = longest.max(t.saturating_duration_since(last));
        last = t;
    }
    longest
}

/// Answers per [`TIMELINE_BUCKET`] by when they ended: [s, 200s, others, cut/timeout/failed].
fn timeline(records: &[ClientRecord], origin: Instant) -> Vec<[f64; 4]> {
    let bucket = TIMELINE_BUCKET.as_secs_f64();
    let buckets = (origin.elapsed().as_secs_f64() / bucket) as usize + 1;
    let mut rows: Vec<[f64; 4]> = (0..buckets)
        .map(|i| [i as f64 * bucket, 0.0, 0.0, 0.0])
        .collect();
    for o in records.iter().flat_map(|r| &r.outcomes) {
        let column = match o.answer {
            Answer::Code(OK, _) => 1,
            Answer::Code(..) => 2,
            Answer::Cut | Answer::Timeout | Answer::Failed(_) => 3,
        };
        let at = o.done.saturating_duration_since(origin).as_secs_f64() / bucket;
        if let Some(row) = rows.get_mut(at as usize) {
            row[column] += 1.0 / bucket;
        }
    }
    rows
}

/// Everything one `loadtest faults` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct FaultsReport {
    pub bus: Bus,
    pub node_stop: NodeStop,
    pub clients: u32,
    pub rps_per_client: f64,
    pub route: &'static str,
    pub client_timeout_ms: u128,
    /// `--held-slack`.
    pub held_slack_ms: u128,
    pub phases: Vec<PhaseReport>,
    /// Answers per 100 ms over the run, as rates: [seconds from the start, 200s, other
    /// codes, cut + timed out + failed], by the time they ended.
    pub timeline: Vec<[f64; 4]>,
    /// What stopped the run early, if anything did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Every phase met its expectation (and nothing stopped the run).
    pub passed: bool,
}

impl FaultsReport {
    /// Works out each phase's figures and the timeline from the clients' records.
    pub fn new(
        args: &FaultsArgs,
        runs: &[PhaseRun],
        records: &[ClientRecord],
        origin: Instant,
        errors: Vec<String>,
    ) -> Self {
        let stop = (args.launch.bus, args.node_stop);
        let phases = tally(records, runs, stop, origin, args.held_slack);
        FaultsReport {
            bus: args.launch.bus,
            node_stop: args.node_stop,
            clients: args.clients,
            rps_per_client: f64::from(args.rate),
            route: ROUTE,
            client_timeout_ms: args.timeout.as_millis(),
            held_slack_ms: args.held_slack.as_millis(),
            passed: errors.is_empty() && phases.iter().all(PhaseReport::passed),
            phases,
            timeline: timeline(records, origin),
            errors,
        }
    }

    pub fn missed(&self) -> String {
        let missed = self.phases.iter().filter(|p| !p.passed());
        let missed: Vec<&str> = missed.map(|p| p.fault.name()).collect();
        missed.join(", ")
    }
}

impl Section for FaultsReport {
    fn add_to(&self, doc: &mut Doc) {
        let (clients, rate, route) = (self.clients, self.rps_per_client, self.route);
        let timeout = self.client_timeout_ms;
        doc.lines(vec![
            format!("{clients} clients × {rate} req/s of {route}, client timeout {timeout} ms"),
            "each request counts in the phase it was sent in; times in ms; a gap is a client's \
             time from its last answer before a lost connection to its first after"
                .to_owned(),
        ]);
        let verdict = |p: &PhaseReport| if p.passed() { "met" } else { "MISSED" };
        let millis = |h: &Hist, q| format!("{:.0}", ms(h.at(q)));
        doc.table(Table::of(
            &self.phases,
            &[
                ("phase", &|p| p.fault.name().to_owned()),
                ("sent", &|p| p.sent.to_string()),
                ("answered by code", &|p| {
                    let codes = p.answered.iter().map(|(c, n)| format!("{c}:{n}"));
                    codes.collect::<Vec<_>>().join(" ")
                }),
                ("cut", &|p| p.cut.to_string()),
                ("timed out", &|p| {
                    (p.timed_out + p.failed.values().sum::<u64>()).to_string()
                }),
                ("lost", &|p| p.lost.to_string()),
                ("reconnects", &|p| p.gaps.len().to_string()),
                ("gap max", &|p| millis(&p.gaps, 1.0)),
                ("gap p99", &|p| millis(&p.gaps, 0.99)),
                ("no 200 for", &|p| format!("{:.0}", p.no_200_ms)),
                ("held", &|p| p.held.to_string()),
                ("resent", &|p| p.resent.to_string()),
                ("p99", &|p| format!("{:.1}", ms(p.latency.at(0.99)))),
                ("steal %", &|p| format!("{:.1}", p.steal_percent)),
                ("expectation", &|p| verdict(p).to_owned()),
            ],
        ));
        for p in &self.phases {
            doc.heading(format!("{} [{}]", p.fault.name(), verdict(p)));
            let mut lines: Vec<String> =
                p.events.iter().map(|e| format!("did:      {e}")).collect();
            let expected = expected(&p.allowed, self.held_slack_ms);
            lines.push(format!("expected: {expected}"));
            if let Some(n) = p.in_flight_at_fault {
                lines.push(format!("in flight at the fault: {n}"));
            }
            let reasons = p.reasons.iter();
            lines.extend(reasons.map(|(r, n)| format!("answered: {n} × {r}")));
            let closed = p.clients_closed.iter();
            lines.extend(closed.map(|(r, n)| format!("closed:   {n} clients for good ({r})")));
            lines.extend(p.misses.iter().map(|m| format!("missed:   {m}")));
            doc.lines(lines);
        }
        let series = |i: usize| self.timeline.iter().map(|p| (p[0], p[i])).collect();
        doc.chart(
            "Answers per second, by when they ended",
            XAxis::Seconds,
            vec![
                ("200/s", series(1)),
                ("other codes/s", series(2)),
                ("cut, timed out, failed/s", series(3)),
            ],
        );
        let mut end: Vec<String> = self.errors.iter().map(|e| format!("error: {e}")).collect();
        end.push(if self.passed {
            "every phase met its expectation".to_owned()
        } else {
            format!("phases that missed their expectation: {}", self.missed())
        });
        doc.lines(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::load::Outcome;

    /// `--held-slack` as it defaults.
    const SLACK: Duration = Duration::from_millis(10);

    #[test]
    fn requests_count_in_the_phase_they_were_sent_in() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let run = |start, end, struck: Option<u64>| PhaseRun {
            fault: Fault::Baseline,
            start: at(start),
            end: at(end),
            events: Vec::new(),
            struck: struck.map(at),
            cpu: Vec::new(),
            blips: [0, 0],
        };
        let o = |phase, sent, done, answer| Outcome::new(phase, at(sent), at(done), answer);
        let record = ClientRecord {
            sent: vec![3, 3],
            outcomes: vec![
                o(0, 0, 1, Answer::Code(200, None)),
                // Sent in phase 0, answered in phase 1: it is phase 0's, and in flight
                // at phase 1's fault.
                o(0, 990, 1500, Answer::Code(408, None)),
                o(0, 985, 986, Answer::Cut),
                o(1, 1001, 1002, Answer::Code(408, None)),
                o(1, 1100, 1900, Answer::Code(200, None)),
            ],
            gaps: vec![(1, Duration::from_millis(300))],
            closings: vec![(0, "kicked".to_owned())],
        };
        // Struck at 990: held until 1000.
        let runs = [run(0, 1000, None), run(1000, 2000, Some(990))];
        let stop = (Bus::Shaddock, NodeStop::LameDuck);
        let t = tally(std::slice::from_ref(&record), &runs, stop, t0, SLACK);
        assert_eq!(t[0].sent, 3);
        assert_eq!(t[0].answered, BTreeMap::from([(200, 1), (408, 1)]));
        assert_eq!((t[0].cut, t[0].lost, t[1].lost), (1, 0, 1));
        assert_eq!(t[1].late.get(&408).map(|l| l.0), Some(1));
        assert_eq!(t[1].in_flight_at_fault, Some(1));
        assert_eq!(t[1].gaps.len(), 1);
        assert_eq!(t[0].clients_closed, [("kicked".to_owned(), 1)].into());
        assert_eq!((t[0].no_200_ms, t[1].no_200_ms), (999.0, 900.0));
        let late = "1 408s for requests sent after the kill (the latest 11 ms after)";
        assert_eq!(phase(&[408], &[], None, &t[1]).check(), ["1 lost", late]);
        // Struck a millisecond later, the slack reaches the 408's send: it was held, in
        // flight, not late.
        let runs = [run(0, 1000, None), run(1000, 2000, Some(991))];
        let t = tally(&[record], &runs, stop, t0, SLACK);
        assert!(t[1].late.is_empty());
        assert_eq!(t[1].in_flight_at_fault, Some(2));
    }

    /// `base` allowed `allowed`, with `answered` besides its answers and `in_flight`.
    fn phase(
        allowed: &[u32],
        answered: &[(u32, u64)],
        in_flight: Option<u64>,
        base: &PhaseReport,
    ) -> PhaseReport {
        let mut p = PhaseReport {
            allowed: allowed.to_vec(),
            ..base.clone()
        };
        p.answered.extend(answered.iter().copied());
        p.in_flight_at_fault = in_flight.or(p.in_flight_at_fault);
        p
    }

    #[test]
    fn expectations_allow_only_their_codes_within_their_limits() {
        let base = PhaseReport {
            sent: 10,
            answered: [(200, 10)].into(),
            ..PhaseReport::default()
        };
        let mut clean = phase(&[], &[], None, &base);
        assert!(clean.check().is_empty());
        clean.answered.insert(503, 1);
        assert_eq!(clean.check(), ["1 answered 503"]);

        let mut kill = phase(&[408], &[(408, 2)], Some(1), &base);
        kill.timed_out = 1;
        let more = "2 answered 408, more than the 1 in flight at the kill";
        assert_eq!(kill.check(), ["1 timed out", more]);
        kill.in_flight_at_fault = Some(2);
        kill.timed_out = 0;
        assert!(kill.check().is_empty());

        // A cluster node in lame duck mode costs nothing; one stopped at once, like the
        // broker killed, 503s for what was in flight on the gates' connections to it,
        // and 408s for what was on its way to its workers, in all no more than was in
        // flight.
        let restart = |bus, stop| Fault::RestartBus.allowed(bus, stop);
        assert!(restart(Bus::NatsCluster, NodeStop::LameDuck).is_empty());
        assert_eq!(restart(Bus::NatsCluster, NodeStop::Term), [503, 408]);
        assert_eq!(restart(Bus::NatsCluster, NodeStop::Kill), [503, 408]);
        assert_eq!(restart(Bus::Shaddock, NodeStop::LameDuck), [503]);
        let allowed = restart(Bus::NatsCluster, NodeStop::Kill);
        let mut node = phase(&allowed, &[(503, 2), (408, 1)], Some(2), &base);
        let more = "3 answered 503 or 408, more than the 2 in flight at the kill";
        assert_eq!(node.check(), [more]);
        node.in_flight_at_fault = Some(3);
        assert!(node.check().is_empty());

        // A broker killed: 503s only for what was in flight on the lost connection.
        let mut restart = phase(&[503], &[(503, 2)], Some(1), &base);
        let more = "2 answered 503, more than the 1 in flight at the kill";
        assert_eq!(restart.check(), [more]);
        restart.in_flight_at_fault = Some(2);
        assert!(restart.check().is_empty());
        restart.late.insert(503, (1, Duration::from_millis(40)));
        let late = "1 503s for requests sent after the kill (the latest 40 ms after)";
        assert_eq!(restart.check(), [late]);
    }
}
