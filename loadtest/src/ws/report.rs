//! What the WebSocket load scenarios measured ([`Runs`], the `--json` data), and the
//! [`Doc`] its text and page are rendered from.

use std::collections::BTreeMap;

use serde::Serialize;

use super::generator::{self, LimitComparison, LoadSpec, PerConn, RunReport, SecondReport, Target};
use crate::hist::Summary;
use crate::report::{Doc, OutputArgs, Report, Section, Table, XAxis, cpu_line, ms, thousands};

/// What a WebSocket load scenario measured: its runs, and its search for `saturate`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Runs {
    pub runs: Vec<RunReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saturate: Option<SaturateReport>,
    /// Runs that failed outright (the others are still reported).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

pub type ScenarioReport = Report<Runs>;

impl Runs {
    /// Runs one load and files its report, or its error: one failed run (say, an
    /// overload nothing answers) must not lose the others.
    pub async fn run(&mut self, spec: &LoadSpec, target: &Target) -> Option<&mut RunReport> {
        match generator::run(spec, target).await {
            Ok(run) => {
                self.runs.push(run);
                self.runs.last_mut()
            }
            Err(e) => {
                self.errors.push(format!("{}: {e:#}", target.label));
                None
            }
        }
    }
}

/// `saturate`: the steps tried and the best one per target.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SaturateReport {
    pub p99_target_us: f64,
    pub clients: usize,
    pub steps: Vec<SaturateStep>,
    pub best: BTreeMap<String, SaturateStep>,
    /// Best gateway ÷ best limit, when both ran.
    pub fraction_of_limit: Option<Fraction>,
    /// Targets that passed every rate up to their maximum: their best is a lower bound.
    pub at_max_rate: Vec<String>,
    /// With `--scale-workers`: the target searched per worker count, in order.
    pub scaling: Vec<WorkerScaling>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SaturateStep {
    pub target: String,
    pub per_client_rps: f64,
    pub offered_rps: f64,
    pub achieved_rps: f64,
    pub p99_from_schedule_us: f64,
    pub lost: u64,
    pub errors: u64,
    pub passed: bool,
}

#[cfg(test)]
impl SaturateStep {
    /// A step at `rps` that did or did not meet its target, nothing lost.
    pub fn fake(target: &str, rps: f64, passed: bool) -> Self {
        SaturateStep {
            target: target.to_owned(),
            per_client_rps: rps,
            offered_rps: rps,
            achieved_rps: rps,
            p99_from_schedule_us: 0.0,
            lost: 0,
            errors: 0,
            passed,
        }
    }
}

/// The gateway's saturation point ÷ the bare echo's, and how far to trust it (a search
/// that passed every rate up to its maximum found only a lower bound).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fraction {
    pub value: f64,
    /// `exact`; `at_most` (the limit's figure is a lower bound), `at_least` (the
    /// gateway's is), `unknown` (both are: the ratio says nothing).
    pub relation: &'static str,
    #[serde(skip)]
    sentence: String,
}

impl Fraction {
    pub fn of(gateway: f64, gateway_bound: bool, limit: f64, limit_bound: bool) -> Fraction {
        let value = gateway / limit;
        let (p, g) = (value * 100.0, "gateway saturation");
        let of = format!("{p:.1}% of the bare-echo limit");
        let higher = |who, max| format!("the {who} passed every rate up to {max}, so it is");
        let limit_higher = higher("limit", "--limit-max-rate");
        let gateway_higher = higher("gateway", "--max-rate");
        let nothing = format!(
            "{g}: both searches passed every rate they tried, so the {p:.1}% between their \
             figures says nothing"
        );
        let (relation, sentence) = match (gateway_bound, limit_bound) {
            (false, false) => ("exact", format!("{g} = {of}")),
            (false, true) => (
                "at_most",
                format!("{g} ≤ {of}: {limit_higher} higher than measured"),
            ),
            (true, false) => (
                "at_least",
                format!("{g} ≥ {of}: {gateway_higher} higher than measured"),
            ),
            (true, true) => ("unknown", nothing),
        };
        Fraction {
            value,
            relation,
            sentence,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerScaling {
    pub workers: u32,
    pub target: String,
}

impl RunReport {
    fn section(&self, doc: &mut Doc) {
        doc.heading(format!("{} [{}]", self.label, self.target));
        let length = match self.count {
            Some(n) => format!("{} requests per client", thousands(n as f64)),
            None => format!("{:.1} s window", self.window_s),
        };
        let message = |code| self.error_messages.get(code).filter(|m| !m.is_empty());
        let by_code = self.errors_by_code.iter();
        let by_code = by_code.map(|(code, n)| match message(code) {
            Some(m) => format!("{code} × {n} ({m})"),
            None => format!("{code} × {n}"),
        });
        let failures = self.failures.iter().map(|(k, n)| format!("{k} × {n}"));
        let mut errors: Vec<String> = by_code.chain(failures).collect();
        if errors.is_empty() {
            errors.push("no error answers".to_owned());
        }
        let (clients, connected, route) = (self.clients, self.connected, &self.route);
        let (every, warmup, clock) = (self.interval_us, self.warmup_s, &self.clock);
        let (offered, achieved) = (thousands(self.offered_rps), thousands(self.achieved_rps));
        let (ok, sent) = (thousands(self.ok as f64), thousands(self.sent as f64));
        let took = self.elapsed_s;
        let PerConn { min, avg, max } = self.per_conn;
        let (timeouts, unanswered, errors) = (self.timeouts, self.unanswered, errors.join(", "));
        let mut lines = vec![
            format!(
                "load      {clients} clients ({connected} connected) × 1 {route} per {every:.0} µs = \
                 {offered} req/s offered; {length}, warm-up {warmup:.1} s; clock {clock}"
            ),
            format!(
                "achieved  {achieved} req/s ({ok} ok of {sent} sent in {took:.2} s); per connection \
                 min {min:.1} / avg {avg:.1} / max {max:.1}"
            ),
            format!("errors    timeouts {timeouts}, unanswered {unanswered}, {errors}"),
        ];
        let connects = self.connect_errors.iter();
        lines.extend(connects.map(|(e, n)| format!("connect   {n} × {e}")));
        if let Some(c) = &self.limit {
            let (rps, p99) = (thousands(c.limit_rps), ms(c.limit_p99_from_schedule_us));
            let fraction = c.fraction * 100.0;
            lines.push(format!(
                "limit     bare echo, same load: {rps} req/s, p99 {p99} ms from schedule → this run \
                 reaches {fraction:.1}%"
            ));
            lines.extend(cost_line(c));
        }
        if !self.cpu.is_empty() {
            lines.push(cpu_line(&self.cpu, self.sent, "request sent"));
        }
        doc.lines(lines);
        let l = &self.latency;
        let mut rows = vec![
            ("from schedule", &l.from_schedule),
            ("from send", &l.from_send),
            ("schedule lag", &l.lag),
        ];
        if let Some(s) = &self.server {
            rows.extend([
                ("client + ws", &s.client_ws),
                ("gate + bus", &s.gate_bus),
                ("queue", &s.queue),
                ("handler", &s.handler),
            ]);
            if s.calls.count > 0 {
                rows.push(("calls (waiting on other services)", &s.calls));
            }
            rows.push(("server total", &s.total));
        }
        doc.table(Table::latency(rows));
        let timeline = self.timeline.iter();
        let per_second = |f: fn(&SecondReport) -> f64| {
            timeline.clone().map(|s| (s.second as f64, f(s))).collect()
        };
        doc.chart(
            "Latency from schedule, per second (ms)",
            XAxis::Seconds,
            vec![
                ("p50", per_second(|s| s.from_schedule.p50_us / 1e3)),
                ("p99", per_second(|s| s.from_schedule.p99_us / 1e3)),
            ],
        );
        doc.chart(
            "Answers per second",
            XAxis::Seconds,
            vec![("answers/s", per_second(|s| s.answers as f64))],
        );
        let to_ms = |c: &[(f64, f64)]| c.iter().map(|p| (p.0, p.1 / 1e3)).collect();
        let c = &self.curves;
        doc.chart(
            "Latency distribution (ms by percentile)",
            XAxis::Nines,
            vec![
                ("from schedule", to_ms(&c.from_schedule)),
                ("from send", to_ms(&c.from_send)),
                ("schedule lag", to_ms(&c.lag)),
            ],
        );
    }
}

impl Section for Runs {
    fn add_to(&self, doc: &mut Doc) {
        for run in &self.runs {
            run.section(doc);
        }
        if !self.runs.is_empty() {
            doc.heading("summary (latency in ms, from the schedule unless marked)");
            doc.table(summary(&self.runs));
        }
        if let Some(s) = &self.saturate {
            s.section(doc);
        }
        doc.lines(self.errors.iter().map(|e| format!("FAILED: {e}")).collect());
    }
}

/// The summary table: a row per run, latency in ms from the schedule unless marked.
fn summary(runs: &[RunReport]) -> Table {
    fn s(r: &RunReport) -> &Summary {
        &r.latency.from_schedule
    }
    Table::of(
        runs,
        &[
            ("run", &|r| r.label.clone()),
            ("target", &|r| r.target.clone()),
            ("clients", &|r| r.clients.to_string()),
            ("offered req/s", &|r| thousands(r.offered_rps)),
            ("achieved req/s", &|r| thousands(r.achieved_rps)),
            ("per conn min / avg / max", &|r| {
                let c = &r.per_conn;
                format!("{:.1} / {:.1} / {:.1}", c.min, c.avg, c.max)
            }),
            ("p50", &|r| ms(s(r).p50_us)),
            ("p90", &|r| ms(s(r).p90_us)),
            ("p99", &|r| ms(s(r).p99_us)),
            ("p99.9", &|r| ms(s(r).p999_us)),
            ("max (ms, from schedule)", &|r| ms(s(r).max_us)),
            ("p99 from send", &|r| ms(r.latency.from_send.p99_us)),
            ("lag p99", &|r| ms(r.latency.lag.p99_us)),
            ("timeouts", &|r| r.timeouts.to_string()),
            ("errors", &|r| {
                let errors = r.errors_by_code.values().sum::<u64>() + r.lost() - r.timeouts;
                errors.to_string()
            }),
            ("% of limit", &|r| {
                let limit = r.limit.map(|c| format!("{:.1}%", c.fraction * 100.0));
                limit.unwrap_or_else(|| "—".to_owned())
            }),
        ],
    )
}

impl ScenarioReport {
    /// Prints and writes the report, then fails if a run failed or had no success.
    pub fn finish(&self, output: &OutputArgs) -> anyhow::Result<()> {
        self.write(output)?;
        let (n, errors) = (self.data.errors.len(), self.data.errors.join("; "));
        anyhow::ensure!(n == 0, "{n} run(s) failed: {errors}");
        let failed = self.data.runs.iter().filter(|r| r.ok == 0);
        let failed: Vec<&str> = failed.map(|r| r.label.as_str()).collect();
        let list = failed.join(", ");
        anyhow::ensure!(failed.is_empty(), "no successful answer in: {list}");
        Ok(())
    }
}

impl SaturateReport {
    fn section(&self, doc: &mut Doc) {
        let (clients, p99) = (self.clients, ms(self.p99_target_us));
        let what = format!("{clients} clients, p99 from schedule ≤ {p99} ms, no lost requests");
        doc.heading(format!("saturation search: {what}"));
        doc.table(Table::of(
            &self.steps,
            &[
                ("target", &|s| s.target.clone()),
                ("per client req/s", &|s| thousands(s.per_client_rps)),
                ("offered req/s", &|s| thousands(s.offered_rps)),
                ("achieved req/s", &|s| thousands(s.achieved_rps)),
                ("p99 (ms)", &|s| ms(s.p99_from_schedule_us)),
                ("lost", &|s| s.lost.to_string()),
                ("errors", &|s| s.errors.to_string()),
                ("within target", &|s| {
                    (if s.passed { "yes" } else { "no" }).into()
                }),
            ],
        ));
        let best_line = |(target, best): (&String, &SaturateStep)| {
            let bound = match self.at_max_rate.contains(target) {
                true => " — every rate it tried passed: a lower bound",
                false => "",
            };
            let (rps, each) = (thousands(best.achieved_rps), thousands(best.per_client_rps));
            let p99 = ms(best.p99_from_schedule_us);
            format!("best {target}: {rps} req/s ({each} per client, p99 {p99} ms){bound}")
        };
        let mut lines: Vec<String> = self.best.iter().map(best_line).collect();
        lines.extend(self.fraction_of_limit.as_ref().map(|f| f.sentence.clone()));
        doc.lines(lines);
        if self.scaling.is_empty() {
            return;
        }
        doc.heading("adding workers");
        let mut table = Table::new(&[
            "workers",
            "saturation req/s",
            "change from the row above",
            "change from the first",
        ]);
        let best = |s: &WorkerScaling| self.best.get(&s.target).map(|b| b.achieved_rps);
        let change = |from: Option<f64>, to: Option<f64>| match (from, to) {
            (Some(from), Some(to)) if from > 0.0 => format!("{:+.1} %", (to / from - 1.0) * 100.0),
            _ => "—".to_owned(),
        };
        let first = self.scaling.first().and_then(best);
        let mut previous = None;
        for s in &self.scaling {
            let rps = best(s);
            let capped = self.at_max_rate.contains(&s.target);
            let bound = if capped { "≥ " } else { "" };
            let shown = rps.map(|r| format!("{bound}{}", thousands(r)));
            let shown = shown.unwrap_or_else(|| "none met the target".to_owned());
            table.rows.push(vec![
                s.workers.to_string(),
                shown,
                change(previous, rps),
                change(first, rps),
            ]);
            previous = rps;
        }
        doc.table(table);
    }
}

/// What a request cost the servers against the bare echo server, when both were measured.
fn cost_line(c: &LimitComparison) -> Option<String> {
    let (ours, bare, ratio) = (c.server_cpu_us?, c.limit_server_cpu_us?, c.cpu_ratio?);
    Some(format!(
        "cost      servers {ours:.1} µs of CPU per request = {ratio:.2}× the bare echo server's {bare:.1} µs"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_line_gives_both_costs_and_their_ratio_or_nothing() {
        let measured = LimitComparison {
            limit_rps: 10_000.0,
            fraction: 1.0,
            limit_p99_from_schedule_us: 900.0,
            server_cpu_us: Some(41.15),
            limit_server_cpu_us: Some(7.0),
            cpu_ratio: Some(41.15 / 7.0),
        };
        let line =
            "cost      servers 41.1 µs of CPU per request = 5.88× the bare echo server's 7.0 µs";
        assert_eq!(cost_line(&measured).as_deref(), Some(line));
        let unmeasured = LimitComparison {
            limit_server_cpu_us: None,
            cpu_ratio: None,
            ..measured
        };
        assert_eq!(cost_line(&unmeasured), None);
    }

    #[test]
    fn a_fraction_says_which_side_a_lower_bound_leaves_it() {
        let relation = |g, l| Fraction::of(1.0, g, 4.0, l).relation;
        let all = [(false, false), (false, true), (true, false), (true, true)];
        let relations = all.map(|(g, l)| relation(g, l));
        assert_eq!(relations, ["exact", "at_most", "at_least", "unknown"]);
        let exact = "gateway saturation = 25.0% of the bare-echo limit";
        assert_eq!(Fraction::of(1.0, false, 4.0, false).sentence, exact);
    }

    #[test]
    fn worker_scaling_rows_show_the_change_and_lower_bounds() {
        let step = |target, rps| SaturateStep::fake(target, rps, true);
        let report = SaturateReport {
            best: BTreeMap::from([
                ("w1".into(), step("w1", 10_000.0)),
                ("w2".into(), step("w2", 15_000.0)),
            ]),
            at_max_rate: vec!["w2".into()],
            scaling: [(1, "w1"), (2, "w2")]
                .map(|(workers, t)| WorkerScaling {
                    workers,
                    target: t.into(),
                })
                .into(),
            ..SaturateReport::default()
        };
        let mut doc = Doc::new(String::new(), crate::report::Meta::now());
        report.section(&mut doc);
        let text = doc.text();
        let row = "| 2 | ≥ 15,000 | +50.0 % | +50.0 % |";
        assert!(text.contains(row), "{text}");
        assert!(text.contains("| 1 | 10,000 | — | +0.0 % |"), "{text}");
    }
}
