//! The report of `loadtest faults`: per phase, what was sent, how it ended, the clients'
//! reconnection gaps, and what was expected against what was seen.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::load::{Answer, ClientRecord};
use super::phases::{Bus, Expectation, Fault, Limits, Tally};
use crate::proc::{CpuUse, MACHINE, STEAL};
use crate::report::{Doc, Meta, Table, XAxis};

/// Width of one point of the answers-over-time chart.
const TIMELINE_BUCKET: Duration = Duration::from_millis(100);

/// Everything one `loadtest faults` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct FaultsReport {
    pub scenario: &'static str,
    #[serde(flatten)]
    pub meta: Meta,
    pub bus: Bus,
    /// The processes at the start, by name and pid.
    pub setup: String,
    pub clients: usize,
    pub rps_per_client: f64,
    pub route: String,
    pub client_timeout_ms: u128,
    pub phases: Vec<PhaseReport>,
    /// Answers per 100 ms over the run: [seconds from the start, 200s, other codes,
    /// cut + timed out + failed], by the time they ended.
    pub timeline: Vec<[f64; 4]>,
    /// What stopped the run early, if anything did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Every phase met its expectation (and nothing stopped the run).
    pub passed: bool,
}

/// One phase.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    pub name: &'static str,
    pub fault: Fault,
    pub started_s: f64,
    pub seconds: f64,
    /// What the fault did, with timings.
    pub events: Vec<String>,
    pub sent: u64,
    /// Answers by code.
    pub answered: BTreeMap<u32, u64>,
    /// Non-200 answers by code and message.
    pub reasons: BTreeMap<String, u64>,
    pub cut: u64,
    pub timed_out: u64,
    pub failed: BTreeMap<String, u64>,
    pub lost: u64,
    /// Answers other than 200, timeouts and other failures: the "errors".
    pub errors: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_max_ms: f64,
    /// Client reconnections seen (gaps), their longest and p99, ms.
    pub reconnects: u64,
    pub gap_max_ms: f64,
    pub gap_p99_ms: f64,
    /// Clients the gate closed for good (the SDK does not reconnect after a kick), by
    /// reason; each was replaced by a new client.
    pub clients_closed: BTreeMap<String, u64>,
    /// Longest stretch of the phase without any 200 (the bus gap, in the restart
    /// phase), ms.
    pub no_200_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slowest_503_ms: Option<f64>,
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
}

/// One phase as it ran, for the report.
pub struct PhaseRun {
    pub fault: Fault,
    pub start: Instant,
    pub end: Instant,
    pub events: Vec<String>,
    pub cpu: Vec<CpuUse>,
}

impl PhaseReport {
    pub fn new(run: &PhaseRun, t: &Tally, bus: Bus, limits: &Limits, origin: Instant) -> Self {
        let expectation = run.fault.expectation(bus);
        let cpu = |name: &str| {
            run.cpu
                .iter()
                .find(|c| c.name == name)
                .map_or(0.0, |c| c.percent)
        };
        let ms = |d: Duration| (d.as_secs_f64() * 10_000.0).round() / 10.0;
        let misses = t.misses(expectation, limits);
        PhaseReport {
            name: run.fault.name(),
            fault: run.fault,
            started_s: run.start.saturating_duration_since(origin).as_secs_f64(),
            seconds: run.end.saturating_duration_since(run.start).as_secs_f64(),
            events: run.events.clone(),
            sent: t.sent,
            answered: t.codes.clone(),
            reasons: t.reasons.clone(),
            cut: t.cut,
            timed_out: t.timeouts,
            failed: t.failed.clone(),
            lost: t.lost,
            errors: t.errors(),
            latency_p50_ms: ms(t.latency.at(0.5)),
            latency_p99_ms: ms(t.latency.at(0.99)),
            latency_max_ms: ms(t.latency.at(1.0)),
            reconnects: t.gaps.len(),
            gap_max_ms: ms(t.gaps.at(1.0)),
            gap_p99_ms: ms(t.gaps.at(0.99)),
            clients_closed: t.closings.clone(),
            no_200_ms: ms(t.no_200),
            slowest_503_ms: t.slowest_503.map(ms),
            in_flight_at_fault: t.in_flight_at_fault,
            machine_percent: cpu(MACHINE),
            steal_percent: cpu(STEAL),
            expectation,
            expected: expectation.describe(limits),
            seen: seen(t),
            misses,
        }
    }

    pub fn passed(&self) -> bool {
        self.misses.is_empty()
    }
}

/// A phase's outcome in one line: "19,980 × 200, 20 × 408; 0 cut, 0 lost".
fn seen(t: &Tally) -> String {
    let mut parts: Vec<String> = t.codes.iter().map(|(c, n)| format!("{n} × {c}")).collect();
    if parts.is_empty() {
        parts.push("no answer".to_owned());
    }
    let mut line = parts.join(", ");
    let _ = write!(
        line,
        "; {} cut, {} timed out, {} lost",
        t.cut, t.timeouts, t.lost
    );
    for (kind, n) in &t.failed {
        let _ = write!(line, ", {n} failed ({kind})");
    }
    for (reason, n) in &t.closings {
        let _ = write!(line, "; {n} clients closed for good ({reason})");
    }
    if let Some(held) = t.in_flight_at_fault {
        let _ = write!(line, "; {held} in flight at the fault");
    }
    line
}

/// Answers per [`TIMELINE_BUCKET`], as rates per second, by when they ended.
pub fn timeline(records: &[ClientRecord], origin: Instant, end: Instant) -> Vec<[f64; 4]> {
    let buckets =
        end.saturating_duration_since(origin).as_millis() / TIMELINE_BUCKET.as_millis() + 1;
    let buckets = usize::try_from(buckets).unwrap_or(0);
    let mut counts = vec![[0u64; 3]; buckets];
    for o in records.iter().flat_map(|r| &r.outcomes) {
        let at = o.done.saturating_duration_since(origin).as_millis() / TIMELINE_BUCKET.as_millis();
        let Some(bucket) = usize::try_from(at).ok().and_then(|b| counts.get_mut(b)) else {
            continue;
        };
        let kind = match o.answer {
            Answer::Code(code, _) if code == proto::code::OK => 0,
            Answer::Code(..) => 1,
            Answer::Cut | Answer::Timeout | Answer::Failed(_) => 2,
        };
        bucket[kind] += 1;
    }
    let per_second = 1.0 / TIMELINE_BUCKET.as_secs_f64();
    counts
        .iter()
        .enumerate()
        .map(|(i, c)| {
            [
                i as f64 * TIMELINE_BUCKET.as_secs_f64(),
                c[0] as f64 * per_second,
                c[1] as f64 * per_second,
                c[2] as f64 * per_second,
            ]
        })
        .collect()
}

impl FaultsReport {
    pub fn now(bus: Bus, setup: String) -> Self {
        FaultsReport {
            scenario: "faults",
            meta: Meta::now(),
            bus,
            setup,
            clients: 0,
            rps_per_client: 0.0,
            route: String::new(),
            client_timeout_ms: 0,
            phases: Vec::new(),
            timeline: Vec::new(),
            errors: Vec::new(),
            passed: false,
        }
    }

    pub fn doc(&self) -> Doc {
        let bus = match self.bus {
            Bus::Shaddock => "shaddock broker",
            Bus::NatsCluster => "3-node nats-server cluster",
        };
        let mut doc = Doc::new(format!("faults on the {bus}"), self.meta.clone());
        doc.lines(vec![
            format!(
                "{} clients × {} req/s of {}, client timeout {} ms",
                self.clients, self.rps_per_client, self.route, self.client_timeout_ms
            ),
            format!("processes: {}", self.setup),
            "each request counts in the phase it was sent in; times in ms; a gap is a client's \
             time from its last answer before a lost connection to its first after"
                .to_owned(),
        ]);
        let mut table = Table::new(&[
            "phase",
            "sent",
            "answered by code",
            "cut",
            "timed out",
            "lost",
            "reconnects",
            "gap max",
            "gap p99",
            "no 200 for",
            "p99",
            "steal %",
            "expectation",
        ]);
        table.rows = self.phases.iter().map(row).collect();
        doc.table(table);
        for p in &self.phases {
            doc.heading(format!(
                "{} [{}]",
                p.name,
                if p.passed() { "met" } else { "MISSED" }
            ));
            let mut lines: Vec<String> =
                p.events.iter().map(|e| format!("did:      {e}")).collect();
            lines.push(format!("expected: {}", p.expected));
            lines.push(format!("seen:     {}", p.seen));
            lines.extend(
                p.reasons
                    .iter()
                    .map(|(reason, n)| format!("          {n} × {reason}")),
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
        let missed: Vec<&str> = self
            .phases
            .iter()
            .filter(|p| !p.passed())
            .map(|p| p.name)
            .collect();
        end.push(if missed.is_empty() && self.errors.is_empty() {
            "every phase met its expectation".to_owned()
        } else {
            format!(
                "phases that missed their expectation: {}",
                missed.join(", ")
            )
        });
        doc.lines(end);
        doc
    }
}

fn row(p: &PhaseReport) -> Vec<String> {
    let codes: Vec<String> = p.answered.iter().map(|(c, n)| format!("{c}:{n}")).collect();
    let failed: u64 = p.failed.values().sum();
    vec![
        p.name.to_owned(),
        p.sent.to_string(),
        codes.join(" "),
        p.cut.to_string(),
        (p.timed_out + failed).to_string(),
        p.lost.to_string(),
        p.reconnects.to_string(),
        format!("{:.0}", p.gap_max_ms),
        format!("{:.0}", p.gap_p99_ms),
        format!("{:.0}", p.no_200_ms),
        format!("{:.1}", p.latency_p99_ms),
        format!("{:.1}", p.steal_percent),
        if p.passed() { "met" } else { "MISSED" }.to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::load::Outcome;

    #[test]
    fn the_timeline_sorts_answers_into_buckets_as_rates() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let o = |ms, answer| Outcome {
            phase: 0,
            sent: at(ms),
            done: at(ms),
            answer,
        };
        let record = ClientRecord {
            sent: vec![4],
            outcomes: vec![
                o(10, Answer::Code(200, None)),
                o(20, Answer::Code(200, None)),
                o(150, Answer::Code(503, None)),
                o(160, Answer::Cut),
            ],
            gaps: Vec::new(),
            closings: Vec::new(),
        };
        let line = timeline(&[record], t0, at(199));
        assert_eq!(line, vec![[0.0, 20.0, 0.0, 0.0], [0.1, 0.0, 10.0, 10.0]]);
    }
}
