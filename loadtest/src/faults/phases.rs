//! The phases of `loadtest faults`, what each is expected to cost the clients, and the
//! report: every request counts in the phase in which it was SENT, however late it ended.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

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
    /// One more echo worker.
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

    /// What issue #15 expects of this phase on `bus`.
    fn expectation(self, bus: Bus) -> Expectation {
        match (self, bus) {
            (Fault::KillWorker, _) => Expectation::HeldOnly408,
            (Fault::RestartBus, Bus::Shaddock) => Expectation::InFlightOnly503,
            _ => Expectation::Clean,
        }
    }
}

/// What a phase may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expectation {
    /// Every request answered 200: no other code, no timeout, nothing cut or lost.
    #[default]
    Clean,
    /// Nothing cut, lost or timed out; the only other answers are 408s, for requests the
    /// killed worker held: sent before the kill, no more than were in flight then.
    HeldOnly408,
    /// Nothing cut, lost or timed out; the only other answers are 503s for requests in
    /// flight on the gate's connection when the broker died (`bus connection lost`: they
    /// may have reached a worker, so they are never sent again): no more than were in
    /// flight then, all sent before it. Requests sent while it is away wait for it
    /// (docs/gateway.md, "Bus blips").
    InFlightOnly503,
}

impl Expectation {
    /// The one code besides 200 the phase may answer.
    fn allowed(self) -> u32 {
        match self {
            Expectation::Clean => OK,
            Expectation::HeldOnly408 => proto::code::TIMEOUT,
            Expectation::InFlightOnly503 => proto::code::UNAVAILABLE,
        }
    }

    /// `held_slack`: `--held-slack`.
    fn describe(self, held_slack: Duration) -> String {
        match self {
            Expectation::Clean => "all 200: 0 errors, 0 cut, 0 lost".to_owned(),
            _ => format!(
                "0 cut, 0 lost, no timeout; besides 200 only {}s, at most the requests in \
                 flight at the kill, all sent before it (or within {} ms after)",
                self.allowed(),
                held_slack.as_millis()
            ),
        }
    }
}

/// The moment a process was killed, and until when a request sent may still have
/// reached it: the bus sees the dead process's connection close a moment after the
/// signal, and routes to it until then (`--held-slack`).
#[derive(Debug, Clone, Copy)]
pub struct Struck {
    pub at: Instant,
    pub held_until: Instant,
}

/// One phase as it ran.
#[derive(Debug, Clone)]
pub struct PhaseRun {
    pub fault: Fault,
    pub start: Instant,
    pub end: Instant,
    /// What the fault did, with timings.
    pub events: Vec<String>,
    pub struck: Option<Struck>,
    pub cpu: Vec<CpuUse>,
    /// Requests the gates held for the bus, and sent again after "no responders".
    pub blips: [u64; 2],
}

/// One phase's figures (times in ms), from every client's record.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseReport {
    pub name: &'static str,
    pub fault: Fault,
    pub started_s: f64,
    pub seconds: f64,
    pub events: Vec<String>,
    pub sent: u64,
    /// Answers by code.
    pub answered: BTreeMap<u32, u64>,
    /// Non-200 answers by "code message".
    pub reasons: BTreeMap<String, u64>,
    pub cut: u64,
    pub timed_out: u64,
    pub failed: BTreeMap<String, u64>,
    /// Sent, and neither answered nor failed by the end of the run.
    pub lost: u64,
    /// Answers other than 200, timeouts and other failures: the "errors".
    pub errors: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_max_ms: f64,
    /// Client reconnections seen (gaps), their longest and p99.
    pub reconnects: u64,
    pub gap_max_ms: f64,
    pub gap_p99_ms: f64,
    /// Clients the gate closed for good (and replaced), by the SDK's reason.
    pub clients_closed: BTreeMap<String, u64>,
    /// Longest stretch of the phase without any 200 (the bus gap, in the restart phase).
    pub no_200_ms: f64,
    /// Requests the gates held while their bus connection was down, and sent again
    /// after "no responders" (their counters over the phase).
    pub held: u64,
    pub resent: u64,
    /// Requests (of every phase) sent before the fault struck and ended after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight_at_fault: Option<u64>,
    /// The machine over the phase: busy and hypervisor steal, % of one core.
    pub machine_percent: f64,
    pub steal_percent: f64,
    pub expectation: Expectation,
    pub expected: String,
    pub seen: String,
    /// Why it missed the expectation; empty when it met it.
    pub misses: Vec<String>,
    /// From send to answer, answered requests only; and the reconnection gaps.
    #[serde(skip)]
    latency: Hist,
    #[serde(skip)]
    gaps: Hist,
    /// By code, 408s and 503s for requests sent after the fault struck, and the latest
    /// such send.
    #[serde(skip)]
    late: BTreeMap<u32, (u64, Duration)>,
}

impl PhaseReport {
    pub fn passed(&self) -> bool {
        self.misses.is_empty()
    }

    fn ok(&self) -> u64 {
        self.answered.get(&OK).copied().unwrap_or(0)
    }

    /// Why the phase misses `expectation`.
    fn check(&self, expectation: Expectation) -> Vec<String> {
        let mut why: Vec<String> = [
            ("cut", self.cut),
            ("lost", self.lost),
            ("timed out", self.timed_out),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{n} {what}"))
        .collect();
        why.extend(self.failed.iter().map(|(k, n)| format!("{n} failed ({k})")));
        let allowed = expectation.allowed();
        for (code, n) in &self.answered {
            if ![OK, allowed].contains(code) {
                why.push(format!("{n} answered {code}"));
            }
        }
        if expectation != Expectation::Clean {
            let held = self.in_flight_at_fault.unwrap_or(0);
            if let Some(n) = (self.answered.get(&allowed)).filter(|n| **n > held) {
                why.push(format!(
                    "{n} answered {allowed}, more than the {held} in flight at the kill"
                ));
            }
            if let Some((n, latest)) = self.late.get(&allowed) {
                why.push(format!(
                    "{n} {allowed}s for requests sent after the kill (the latest {} ms after)",
                    latest.as_millis()
                ));
            }
        }
        why
    }

    /// The outcome in one line: "19,980 × 200, 20 × 408; 0 cut, 0 lost".
    fn seen(&self) -> String {
        let codes: Vec<String> = (self.answered.iter())
            .map(|(c, n)| format!("{n} × {c}"))
            .collect();
        let mut line = if codes.is_empty() {
            "no answer".to_owned()
        } else {
            codes.join(", ")
        };
        let (cut, timed_out, lost) = (self.cut, self.timed_out, self.lost);
        let _ = write!(line, "; {cut} cut, {timed_out} timed out, {lost} lost");
        for (kind, n) in &self.failed {
            let _ = write!(line, ", {n} failed ({kind})");
        }
        for (reason, n) in &self.clients_closed {
            let _ = write!(line, "; {n} clients closed for good ({reason})");
        }
        if let Some(held) = self.in_flight_at_fault {
            let _ = write!(line, "; {held} in flight at the fault");
        }
        line
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// Every client's record, one report per phase.
fn tally(records: &[ClientRecord], runs: &[PhaseRun]) -> Vec<PhaseReport> {
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
            let took = o.done.saturating_duration_since(o.sent);
            let code = match &o.answer {
                Answer::Code(code, message) => {
                    *p.answered.entry(*code).or_default() += 1;
                    p.latency.record(took);
                    if *code != OK {
                        let reason = format!("{code} {}", message.as_deref().unwrap_or_default());
                        *p.reasons.entry(reason.trim_end().to_owned()).or_default() += 1;
                    }
                    *code
                }
                Answer::Cut => {
                    p.cut += 1;
                    continue;
                }
                Answer::Timeout => {
                    p.timed_out += 1;
                    continue;
                }
                Answer::Failed(kind) => {
                    *p.failed.entry(kind.clone()).or_default() += 1;
                    continue;
                }
            };
            match code {
                OK => oks.push(o.done),
                proto::code::UNAVAILABLE | proto::code::TIMEOUT => {
                    if let Some(f) = runs[o.phase].struck.filter(|f| o.sent > f.held_until) {
                        let (n, latest) = p.late.entry(code).or_default();
                        *n += 1;
                        *latest = (*latest).max(o.sent - f.at);
                    }
                }
                _ => {}
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
        let answered: u64 = p.answered.values().sum();
        let failed: u64 = p.failed.values().sum();
        p.lost = p
            .sent
            .saturating_sub(answered + p.cut + p.timed_out + failed);
        p.errors = answered - p.ok() + p.timed_out + failed;
        p.no_200_ms = ms(longest_without(&oks, run.start, run.end));
        p.in_flight_at_fault = run.struck.map(|f| {
            let outcomes = records.iter().flat_map(|r| &r.outcomes);
            outcomes
                .filter(|o| o.sent <= f.held_until && o.done > f.at)
                .count() as u64
        });
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

/// Everything one `loadtest faults` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct FaultsReport {
    pub bus: Bus,
    pub clients: u32,
    pub rps_per_client: f64,
    pub route: &'static str,
    pub client_timeout_ms: u128,
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
    pub fn new(args: &FaultsArgs) -> Self {
        FaultsReport {
            bus: args.bus,
            clients: args.clients,
            rps_per_client: f64::from(args.rate),
            route: ROUTE,
            client_timeout_ms: args.timeout.as_millis(),
            phases: Vec::new(),
            timeline: Vec::new(),
            errors: Vec::new(),
            passed: false,
        }
    }

    /// Works out each phase's figures and the timeline from the clients' records.
    pub fn add_phases(
        &mut self,
        runs: &[PhaseRun],
        records: &[ClientRecord],
        held_slack: Duration,
        origin: Instant,
    ) {
        self.phases = tally(records, runs);
        for (p, run) in self.phases.iter_mut().zip(runs) {
            let cpu = |name| (run.cpu.iter().find(|c| c.name == name)).map_or(0.0, |c| c.percent);
            let expectation = run.fault.expectation(self.bus);
            p.name = run.fault.name();
            p.fault = run.fault;
            p.started_s = run.start.saturating_duration_since(origin).as_secs_f64();
            p.seconds = run.end.saturating_duration_since(run.start).as_secs_f64();
            p.events.clone_from(&run.events);
            [p.held, p.resent] = run.blips;
            (p.latency_p50_ms, p.latency_p99_ms) = (ms(p.latency.at(0.5)), ms(p.latency.at(0.99)));
            p.latency_max_ms = ms(p.latency.at(1.0));
            p.reconnects = p.gaps.len();
            (p.gap_max_ms, p.gap_p99_ms) = (ms(p.gaps.at(1.0)), ms(p.gaps.at(0.99)));
            (p.machine_percent, p.steal_percent) = (cpu(MACHINE), cpu(STEAL));
            p.expectation = expectation;
            p.expected = expectation.describe(held_slack);
            p.seen = p.seen();
            p.misses = p.check(expectation);
        }
        let end = Instant::now();
        let bucket = TIMELINE_BUCKET.as_secs_f64();
        let buckets = (end.saturating_duration_since(origin).as_secs_f64() / bucket) as usize + 1;
        let mut counts = vec![[0u64; 3]; buckets];
        for o in records.iter().flat_map(|r| &r.outcomes) {
            let at = o.done.saturating_duration_since(origin).as_secs_f64() / bucket;
            let kind = match o.answer {
                Answer::Code(OK, _) => 0,
                Answer::Code(..) => 1,
                Answer::Cut | Answer::Timeout | Answer::Failed(_) => 2,
            };
            if let Some(c) = counts.get_mut(at as usize) {
                c[kind] += 1;
            }
        }
        let rate = |n: u64| n as f64 / bucket;
        self.timeline = (counts.iter().enumerate())
            .map(|(i, c)| [i as f64 * bucket, rate(c[0]), rate(c[1]), rate(c[2])])
            .collect();
        self.passed = self.errors.is_empty() && self.phases.iter().all(PhaseReport::passed);
    }

    pub fn missed(&self) -> String {
        let missed: Vec<&str> = (self.phases.iter())
            .filter(|p| !p.passed())
            .map(|p| p.name)
            .collect();
        missed.join(", ")
    }
}

impl Section for FaultsReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.lines(vec![
            format!(
                "{} clients × {} req/s of {}, client timeout {} ms",
                self.clients, self.rps_per_client, self.route, self.client_timeout_ms
            ),
            "each request counts in the phase it was sent in; times in ms; a gap is a client's \
             time from its last answer before a lost connection to its first after"
                .to_owned(),
        ]);
        let verdict = |p: &PhaseReport| if p.passed() { "met" } else { "MISSED" };
        doc.table(Table::of(
            &self.phases,
            &[
                ("phase", &|p| p.name.to_owned()),
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
                ("reconnects", &|p| p.reconnects.to_string()),
                ("gap max", &|p| format!("{:.0}", p.gap_max_ms)),
                ("gap p99", &|p| format!("{:.0}", p.gap_p99_ms)),
                ("no 200 for", &|p| format!("{:.0}", p.no_200_ms)),
                ("held", &|p| p.held.to_string()),
                ("resent", &|p| p.resent.to_string()),
                ("p99", &|p| format!("{:.1}", p.latency_p99_ms)),
                ("steal %", &|p| format!("{:.1}", p.steal_percent)),
                ("expectation", &|p| verdict(p).to_owned()),
            ],
        ));
        for p in &self.phases {
            doc.heading(format!("{} [{}]", p.name, verdict(p)));
            let mut lines: Vec<String> =
                p.events.iter().map(|e| format!("did:      {e}")).collect();
            lines.push(format!("expected: {}", p.expected));
            lines.push(format!("seen:     {}", p.seen));
            lines.extend(
                p.reasons
                    .iter()
                    .map(|(r, n)| format!("          {n} × {r}")),
            );
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

    #[test]
    fn requests_count_in_the_phase_they_were_sent_in() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let run = |start, end, struck: Option<u64>| PhaseRun {
            fault: Fault::Baseline,
            start: at(start),
            end: at(end),
            events: Vec::new(),
            struck: struck.map(|s| Struck {
                at: at(1000),
                held_until: at(s),
            }),
            cpu: Vec::new(),
            blips: [0, 0],
        };
        let o = |phase, sent, done, answer| Outcome {
            phase,
            sent: at(sent),
            done: at(done),
            answer,
        };
        let record = ClientRecord {
            sent: vec![3, 3],
            outcomes: vec![
                o(0, 0, 1, Answer::Code(200, None)),
                // Sent in phase 0, answered in phase 1: it is phase 0's, and in flight
                // at phase 1's fault.
                o(0, 990, 1500, Answer::Code(408, None)),
                o(0, 995, 996, Answer::Cut),
                o(1, 1001, 1002, Answer::Code(408, None)),
                o(1, 1100, 1900, Answer::Code(200, None)),
            ],
            gaps: vec![(1, Duration::from_millis(300))],
            closings: vec![(0, "kicked".to_owned())],
        };
        let runs = [run(0, 1000, None), run(1000, 2000, Some(1000))];
        let t = tally(std::slice::from_ref(&record), &runs);
        assert_eq!(t[0].sent, 3);
        assert_eq!(t[0].answered, BTreeMap::from([(200, 1), (408, 1)]));
        assert_eq!((t[0].cut, t[0].lost, t[1].lost), (1, 0, 1));
        assert_eq!(t[1].late.get(&408).map(|l| l.0), Some(1));
        assert_eq!(t[1].in_flight_at_fault, Some(1));
        assert_eq!(t[1].gaps.len(), 1);
        assert_eq!(
            t[0].clients_closed,
            BTreeMap::from([("kicked".to_owned(), 1)])
        );
        assert_eq!((t[0].no_200_ms, t[1].no_200_ms), (999.0, 900.0));
        assert_eq!(
            t[1].check(Expectation::HeldOnly408),
            [
                "1 lost",
                "1 408s for requests sent after the kill (the latest 1 ms after)"
            ]
        );
        // With the slack reaching the 408's send, it was held: in flight, not late.
        let t = tally(
            &[record],
            &[run(0, 1000, None), run(1000, 2000, Some(1001))],
        );
        assert!(t[1].late.is_empty());
        assert_eq!(t[1].in_flight_at_fault, Some(2));
    }

    #[test]
    fn expectations_allow_only_their_codes_within_their_limits() {
        let mut clean = PhaseReport {
            sent: 10,
            answered: BTreeMap::from([(200, 10)]),
            ..PhaseReport::default()
        };
        assert!(clean.check(Expectation::Clean).is_empty());
        clean.answered.insert(503, 1);
        assert_eq!(clean.check(Expectation::Clean), ["1 answered 503"]);

        let mut kill = PhaseReport {
            answered: BTreeMap::from([(200, 10), (408, 2)]),
            in_flight_at_fault: Some(1),
            timed_out: 1,
            ..PhaseReport::default()
        };
        assert_eq!(
            kill.check(Expectation::HeldOnly408),
            [
                "1 timed out",
                "2 answered 408, more than the 1 in flight at the kill"
            ]
        );
        kill.in_flight_at_fault = Some(2);
        kill.timed_out = 0;
        assert!(kill.check(Expectation::HeldOnly408).is_empty());

        // A broker killed: 503s only for what was in flight on the lost connection.
        let mut restart = PhaseReport {
            answered: BTreeMap::from([(200, 10), (503, 2)]),
            in_flight_at_fault: Some(1),
            ..PhaseReport::default()
        };
        let in_flight = |p: &PhaseReport| p.check(Expectation::InFlightOnly503);
        assert_eq!(
            in_flight(&restart),
            ["2 answered 503, more than the 1 in flight at the kill"]
        );
        restart.in_flight_at_fault = Some(2);
        assert!(in_flight(&restart).is_empty());
        restart.late.insert(503, (1, Duration::from_millis(40)));
        assert_eq!(
            in_flight(&restart),
            ["1 503s for requests sent after the kill (the latest 40 ms after)"]
        );
    }
}
