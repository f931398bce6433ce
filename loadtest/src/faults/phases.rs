//! The phases of `loadtest faults`, what each is expected to cost the clients, and the
//! accounting: every request counts in the phase in which it was SENT, however late it
//! ended.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::load::{Answer, ClientRecord, Gap, Outcome};
use crate::hist::Hist;

/// The bus the topology runs on (`--bus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bus {
    /// One `shaddock broker`.
    Shaddock,
    /// Three `nats-server` nodes routed into one cluster.
    NatsCluster,
}

/// What a phase does to the fleet at its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Nothing: the load alone.
    Baseline,
    /// One more echo worker.
    AddWorker,
    /// SIGTERM to an echo worker; waited for until it exits.
    DrainWorker,
    /// SIGKILL to an echo worker.
    KillWorker,
    /// SIGTERM to a gate, waited for; then a new gate on its port.
    DrainGate,
    /// SIGKILL to a bus node (the broker, or one cluster node with the rest up), then
    /// the same node started again on its ports.
    RestartBus,
}

/// The phases, in order.
pub const PHASES: [Fault; 6] = [
    Fault::Baseline,
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
            Fault::AddWorker => "add worker",
            Fault::DrainWorker => "drain worker",
            Fault::KillWorker => "kill worker",
            Fault::DrainGate => "drain gate",
            Fault::RestartBus => "restart bus node",
        }
    }

    /// What issue #15 expects of this phase on `bus`.
    pub fn expectation(self, bus: Bus) -> Expectation {
        match (self, bus) {
            (Fault::KillWorker, _) => Expectation::HeldOnly408,
            (Fault::RestartBus, Bus::Shaddock) => Expectation::Fast503,
            _ => Expectation::Clean,
        }
    }
}

/// What a phase may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expectation {
    /// Every request answered 200: no other code, no timeout, nothing cut or lost.
    Clean,
    /// Nothing cut, lost or timed out; the only other answers are 408s, for requests the
    /// killed worker held: sent before the kill, no more than were in flight then.
    HeldOnly408,
    /// Nothing cut, lost or timed out; the only other answers are fast 503s; no stretch
    /// without a 200 longer than the allowed bus gap.
    Fast503,
}

/// The limits the expectations are checked against (`--fast-503`, `--max-bus-gap`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A 503 slower than this is not a "fast" one.
    pub fast_503: Duration,
    /// Longest time without any 200 a restarted broker may cost.
    pub max_bus_gap: Duration,
    /// After a kill, how long requests may still reach the killed process ([`Struck`]).
    pub held_slack: Duration,
}

impl Expectation {
    pub fn describe(self, limits: &Limits) -> String {
        match self {
            Expectation::Clean => "all 200: 0 errors, 0 cut, 0 lost".to_owned(),
            Expectation::HeldOnly408 => format!(
                "0 cut, 0 lost, no timeout; besides 200 only 408s, at most the requests in \
                 flight at the kill, all sent before it (or within {} ms after)",
                limits.held_slack.as_millis()
            ),
            Expectation::Fast503 => format!(
                "0 cut, 0 lost, no timeout; besides 200 only 503s, each within {} ms; \
                 no 200 for at most {} ms",
                limits.fast_503.as_millis(),
                limits.max_bus_gap.as_millis()
            ),
        }
    }
}

/// When a phase ran, and when its fault struck (a kill, a bus node going down).
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start: Instant,
    pub end: Instant,
    pub fault: Option<Struck>,
}

/// The moment a process was killed, and until when a request sent may still have
/// reached it: the bus sees the dead process's connection close a moment after the
/// signal, and routes to it until then (`--held-slack`).
#[derive(Debug, Clone, Copy)]
pub struct Struck {
    pub at: Instant,
    pub held_until: Instant,
}

/// One phase's figures, from every client's record.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub sent: u64,
    pub codes: BTreeMap<u32, u64>,
    /// Non-200 answers by "code message".
    pub reasons: BTreeMap<String, u64>,
    pub cut: u64,
    pub timeouts: u64,
    pub failed: BTreeMap<String, u64>,
    /// Sent, and neither answered nor failed by the end of the run.
    pub lost: u64,
    /// From send to answer, answered requests only.
    pub latency: Hist,
    pub slowest_503: Option<Duration>,
    /// 408s for requests sent after the fault struck, and the latest such send.
    pub late_408: u64,
    pub latest_408_after_fault: Duration,
    /// Requests (of every phase) sent before the fault struck and ended after it.
    pub in_flight_at_fault: Option<u64>,
    pub gaps: Hist,
    /// Clients closed for good (and replaced), by the SDK's reason.
    pub closings: BTreeMap<String, u64>,
    /// Longest stretch of this phase's wall time in which no request got a 200.
    pub no_200: Duration,
}

impl Tally {
    pub fn answered(&self) -> u64 {
        self.codes.values().sum()
    }

    pub fn errors(&self) -> u64 {
        self.answered() - self.codes.get(&proto::code::OK).copied().unwrap_or(0)
            + self.timeouts
            + self.failed.values().sum::<u64>()
    }

    /// Why the phase misses `expectation`; empty when it meets it.
    pub fn misses(&self, expectation: Expectation, limits: &Limits) -> Vec<String> {
        let mut why = Vec::new();
        for (what, n) in [
            ("cut", self.cut),
            ("lost", self.lost),
            ("timed out", self.timeouts),
        ] {
            if n > 0 {
                why.push(format!("{n} {what}"));
            }
        }
        for (kind, n) in &self.failed {
            why.push(format!("{n} failed ({kind})"));
        }
        let allowed = match expectation {
            Expectation::Clean => None,
            Expectation::HeldOnly408 => Some(proto::code::TIMEOUT),
            Expectation::Fast503 => Some(proto::code::OVERLOADED),
        };
        for (code, n) in &self.codes {
            if *code != proto::code::OK && Some(*code) != allowed {
                why.push(format!("{n} answered {code}"));
            }
        }
        match expectation {
            Expectation::Clean => {}
            Expectation::HeldOnly408 => {
                let n408 = self.codes.get(&proto::code::TIMEOUT).copied();
                let held = self.in_flight_at_fault.unwrap_or(0);
                if let Some(n) = n408.filter(|n| *n > held) {
                    why.push(format!(
                        "{n} answered 408, more than the {held} in flight at the kill"
                    ));
                }
                if self.late_408 > 0 {
                    why.push(format!(
                        "{} 408s for requests sent after the kill (the latest {} ms after)",
                        self.late_408,
                        self.latest_408_after_fault.as_millis()
                    ));
                }
            }
            Expectation::Fast503 => {
                if let Some(slow) = self.slowest_503.filter(|s| *s > limits.fast_503) {
                    why.push(format!("a 503 took {} ms", slow.as_millis()));
                }
                if self.no_200 > limits.max_bus_gap {
                    why.push(format!("no 200 for {} ms", self.no_200.as_millis()));
                }
            }
        }
        why
    }
}

/// Adds up every client's record into one tally per phase.
pub fn tally(records: &[ClientRecord], windows: &[Window]) -> Vec<Tally> {
    let mut tallies = vec![Tally::default(); windows.len()];
    let mut oks = Vec::new();
    for record in records {
        for (tally, sent) in tallies.iter_mut().zip(&record.sent) {
            tally.sent += sent;
        }
        for o in &record.outcomes {
            let Some(t) = tallies.get_mut(o.phase) else {
                continue;
            };
            let took = o.done.saturating_duration_since(o.sent);
            match &o.answer {
                Answer::Code(code, message) => {
                    *t.codes.entry(*code).or_default() += 1;
                    t.latency.record(took);
                    if *code == proto::code::OK {
                        oks.push(o.done);
                    } else {
                        let reason = format!("{code} {}", message.as_deref().unwrap_or_default());
                        *t.reasons.entry(reason.trim_end().to_owned()).or_default() += 1;
                    }
                    if *code == proto::code::OVERLOADED {
                        t.slowest_503 = t.slowest_503.max(Some(took));
                    }
                    let fault = windows[o.phase].fault;
                    let late = |f: &Struck| o.sent > f.held_until;
                    if let Some(f) = fault.filter(|f| *code == proto::code::TIMEOUT && late(f)) {
                        t.late_408 += 1;
                        t.latest_408_after_fault = t.latest_408_after_fault.max(o.sent - f.at);
                    }
                }
                Answer::Cut => t.cut += 1,
                Answer::Timeout => t.timeouts += 1,
                Answer::Failed(kind) => *t.failed.entry(kind.clone()).or_default() += 1,
            }
        }
        for &Gap { phase, length } in &record.gaps {
            if let Some(t) = tallies.get_mut(phase) {
                t.gaps.record(length);
            }
        }
        for c in &record.closings {
            if let Some(t) = tallies.get_mut(c.phase) {
                *t.closings.entry(c.reason.clone()).or_default() += 1;
            }
        }
    }
    oks.sort_unstable();
    for (t, w) in tallies.iter_mut().zip(windows) {
        let ended: u64 = t.answered() + t.cut + t.timeouts + t.failed.values().sum::<u64>();
        t.lost = t.sent.saturating_sub(ended);
        t.no_200 = longest_without(&oks, w.start, w.end);
        t.in_flight_at_fault = w.fault.map(|f| {
            let outcomes = records.iter().flat_map(|r| &r.outcomes);
            let held = |o: &&Outcome| o.sent <= f.held_until && o.done > f.at;
            outcomes.filter(held).count() as u64
        });
    }
    tallies
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::load::Closing;

    const LIMITS: Limits = Limits {
        fast_503: Duration::from_millis(500),
        max_bus_gap: Duration::from_secs(2),
        held_slack: Duration::from_millis(10),
    };

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    fn outcome(phase: usize, sent: Instant, done: Instant, answer: Answer) -> Outcome {
        Outcome {
            phase,
            sent,
            done,
            answer,
        }
    }

    #[test]
    fn requests_count_in_the_phase_they_were_sent_in() {
        let t0 = Instant::now();
        let windows = [
            Window {
                start: t0,
                end: ms(t0, 1000),
                fault: None,
            },
            Window {
                start: ms(t0, 1000),
                end: ms(t0, 2000),
                fault: Some(Struck {
                    at: ms(t0, 1000),
                    held_until: ms(t0, 1000),
                }),
            },
        ];
        let record = ClientRecord {
            sent: vec![3, 3],
            outcomes: vec![
                outcome(0, ms(t0, 0), ms(t0, 1), Answer::Code(200, None)),
                // Sent in phase 0, answered in phase 1: it is phase 0's, and in flight
                // at phase 1's fault.
                outcome(0, ms(t0, 990), ms(t0, 1500), Answer::Code(408, None)),
                outcome(0, ms(t0, 995), ms(t0, 996), Answer::Cut),
                outcome(1, ms(t0, 1001), ms(t0, 1002), Answer::Code(408, None)),
                outcome(1, ms(t0, 1100), ms(t0, 1900), Answer::Code(200, None)),
            ],
            gaps: vec![Gap {
                phase: 1,
                length: Duration::from_millis(300),
            }],
            closings: vec![Closing {
                phase: 0,
                reason: "kicked".to_owned(),
            }],
        };
        let t = tally(std::slice::from_ref(&record), &windows);
        assert_eq!(t[0].sent, 3);
        assert_eq!(t[0].codes, BTreeMap::from([(200, 1), (408, 1)]));
        assert_eq!((t[0].cut, t[0].lost), (1, 0));
        assert_eq!(t[1].lost, 1, "3 sent, 2 ended");
        assert_eq!(t[1].late_408, 1);
        assert_eq!(t[1].in_flight_at_fault, Some(1));
        assert_eq!(t[1].gaps.len(), 1);
        assert_eq!(t[0].closings, BTreeMap::from([("kicked".to_owned(), 1)]));
        assert_eq!(t[0].no_200, Duration::from_millis(999));
        assert_eq!(t[1].no_200, Duration::from_millis(900));
        let misses = t[1].misses(Expectation::HeldOnly408, &LIMITS);
        assert_eq!(
            misses,
            [
                "1 lost",
                "1 408s for requests sent after the kill (the latest 1 ms after)"
            ]
        );
        // With the slack reaching the 408's send, it was held: in flight, not late.
        let mut slack = windows;
        slack[1].fault = slack[1].fault.map(|f| Struck {
            held_until: ms(t0, 1001),
            ..f
        });
        let t = tally(&[record], &slack);
        assert_eq!((t[1].late_408, t[1].in_flight_at_fault), (0, Some(2)));
    }

    #[test]
    fn expectations_allow_only_their_codes_within_their_limits() {
        let mut clean = Tally {
            sent: 10,
            codes: BTreeMap::from([(200, 10)]),
            ..Tally::default()
        };
        assert!(clean.misses(Expectation::Clean, &LIMITS).is_empty());
        clean.codes.insert(503, 1);
        assert_eq!(
            clean.misses(Expectation::Clean, &LIMITS),
            ["1 answered 503"]
        );
        assert_eq!(clean.errors(), 1);

        let mut restart = clean.clone();
        restart.slowest_503 = Some(LIMITS.fast_503);
        restart.no_200 = LIMITS.max_bus_gap;
        assert!(
            restart.misses(Expectation::Fast503, &LIMITS).is_empty(),
            "limits are inclusive"
        );
        restart.slowest_503 = Some(LIMITS.fast_503 + Duration::from_millis(1));
        restart.no_200 = LIMITS.max_bus_gap + Duration::from_millis(1);
        assert_eq!(
            restart.misses(Expectation::Fast503, &LIMITS),
            ["a 503 took 501 ms", "no 200 for 2001 ms"]
        );

        let mut kill = Tally {
            codes: BTreeMap::from([(200, 10), (408, 2)]),
            in_flight_at_fault: Some(2),
            ..Tally::default()
        };
        assert!(kill.misses(Expectation::HeldOnly408, &LIMITS).is_empty());
        kill.in_flight_at_fault = Some(1);
        assert_eq!(
            kill.misses(Expectation::HeldOnly408, &LIMITS),
            ["2 answered 408, more than the 1 in flight at the kill"]
        );
        kill.timeouts = 1;
        assert_eq!(
            kill.misses(Expectation::HeldOnly408, &LIMITS)[0],
            "1 timed out"
        );
    }

    #[test]
    fn the_longest_stretch_without_a_200_counts_the_window_edges() {
        let t0 = Instant::now();
        let oks = [ms(t0, 100), ms(t0, 200), ms(t0, 1200), ms(t0, 5000)];
        assert_eq!(
            longest_without(&oks, t0, ms(t0, 1500)),
            Duration::from_millis(1000)
        );
        assert_eq!(
            longest_without(&oks, ms(t0, 1300), ms(t0, 1400)),
            Duration::from_millis(100),
            "none inside: the whole window"
        );
    }
}
