//! The reports of the WebSocket scenarios: one serialisable [`ScenarioReport`] per
//! command (the `--json` file), rendered as a terminal report on stdout
//! ([`super::text`]) and, with `--html`, as a page ([`super::html`]).

use std::collections::BTreeMap;

use serde::Serialize;

use super::generator::{Length, RunResult};
use super::hist::Summary;
use super::procfs::{CpuUse, STEAL};

/// Everything one `shaddock loadtest <scenario>` command measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: String,
    /// UTC, when the report was made.
    pub date: String,
    pub machine: Machine,
    /// The command line that produced it.
    pub command: String,
    /// What the load went to: "1 gate + 2 echo workers (launched)" or the URLs.
    pub setup: String,
    pub runs: Vec<RunReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saturate: Option<SaturateReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleReport>,
    /// Runs that failed outright (the others are still reported).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

impl ScenarioReport {
    pub fn new(scenario: &str, setup: String) -> Self {
        ScenarioReport {
            scenario: scenario.to_owned(),
            date: utc_now(),
            machine: Machine::this(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            setup,
            runs: Vec::new(),
            saturate: None,
            idle: None,
            errors: Vec::new(),
        }
    }

    /// Runs with no successful answer at all: the smoke test fails on these.
    pub fn failed_runs(&self) -> Vec<&str> {
        self.runs
            .iter()
            .filter(|r| r.ok == 0)
            .map(|r| r.label.as_str())
            .collect()
    }
}

/// The machine a report was measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
}

impl Machine {
    pub fn this() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_owned())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model,
            memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
        }
    }
}

/// One load against one target.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub label: String,
    /// `gateway` or `limit` (the bare WebSocket echo server).
    pub target: String,
    pub urls: Vec<String>,
    pub route: String,
    pub clients: usize,
    pub connected: usize,
    pub connect_errors: BTreeMap<String, u64>,
    pub interval_us: f64,
    /// Requests per client in the window, when the run was given a count.
    pub count: Option<u64>,
    pub clock: String,
    pub phases: u32,
    /// What spoke to the server: `lean` or `sdk` ([`super::generator::DriverKind`]).
    pub driver: String,
    pub warmup_s: f64,
    pub window_s: f64,
    /// Window start until the later of its end and the last answer.
    pub elapsed_s: f64,
    pub offered_rps: f64,
    pub sent: u64,
    pub ok: u64,
    pub achieved_rps: f64,
    pub per_conn: PerConn,
    pub timeouts: u64,
    pub unanswered: u64,
    /// Answers other than 200, by code.
    pub errors_by_code: BTreeMap<u32, u64>,
    pub error_messages: BTreeMap<u32, String>,
    /// SDK errors other than timeouts (closed, protocol), by kind.
    pub failures: BTreeMap<String, u64>,
    pub latency: Latencies,
    /// Present when the server sent timing.
    pub server: Option<ServerReport>,
    /// The bare echo server under the same load, when measured in the same command.
    pub limit: Option<LimitComparison>,
    /// CPU over the measured window, per process (100% = one core).
    pub cpu: Vec<CpuUse>,
    pub timeline: Vec<SecondReport>,
    pub curves: Curves,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PerConn {
    pub min: f64,
    pub avg: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Latencies {
    pub from_schedule: Summary,
    pub from_send: Summary,
    pub lag: Summary,
}

/// Where the time went (server timing): the parts add up to the latency from send.
#[derive(Debug, Clone, Serialize)]
pub struct ServerReport {
    /// Client SDK + WebSocket both ways: from-send latency minus the gate's total.
    pub client_ws: Summary,
    /// Gate + bus both ways: total - queue - handler.
    pub gate_bus: Summary,
    pub queue: Summary,
    pub handler: Summary,
    /// Gate receive to gate answer.
    pub total: Summary,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LimitComparison {
    pub limit_rps: f64,
    /// Achieved ÷ the limit's achieved.
    pub fraction: f64,
    pub limit_p99_from_schedule_us: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SecondReport {
    pub second: usize,
    /// Answers that arrived in this second.
    pub answers: u64,
    /// Latency from the schedule of the requests scheduled in this second.
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Percentile curves as `[nines, µs]` points.
#[derive(Debug, Clone, Serialize)]
pub struct Curves {
    pub from_schedule: Vec<[f64; 2]>,
    pub from_send: Vec<[f64; 2]>,
    pub lag: Vec<[f64; 2]>,
}

/// `saturate`: the steps tried and the best one.
#[derive(Debug, Clone, Serialize)]
pub struct SaturateReport {
    pub p99_target_us: f64,
    pub clients: usize,
    pub steps: Vec<SaturateStep>,
    /// The highest total req/s whose step met the target, per target (`gateway`,
    /// `limit`).
    pub best: BTreeMap<String, SaturateStep>,
    /// Best gateway ÷ best limit, when both ran.
    pub fraction_of_limit: Option<Fraction>,
    /// Targets that passed every rate up to their maximum (`--max-rate`, or
    /// `--limit-max-rate` for the limit): their best is a lower bound.
    pub at_max_rate: Vec<String>,
    /// With `--scale-workers`: the best rate per worker count, in the order searched.
    pub scaling: Vec<WorkerScaling>,
}

/// The gateway's saturation point as a fraction of the bare echo's, and how far to trust
/// it: a search that passed every rate up to its maximum found only a lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fraction {
    pub value: f64,
    pub relation: Relation,
}

/// How the true fraction relates to [`Fraction::value`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// Both searches found the rate where the target was missed.
    Exact,
    /// The limit's figure is a lower bound, so the true fraction is lower.
    AtMost,
    /// The gateway's figure is a lower bound, so the true fraction is higher.
    AtLeast,
    /// Both figures are lower bounds: the ratio says nothing.
    Unknown,
}

impl Fraction {
    /// `gateway ÷ limit`, from each best's rate and whether it is a lower bound.
    pub fn of(gateway: f64, gateway_bound: bool, limit: f64, limit_bound: bool) -> Fraction {
        let relation = match (gateway_bound, limit_bound) {
            (false, false) => Relation::Exact,
            (false, true) => Relation::AtMost,
            (true, false) => Relation::AtLeast,
            (true, true) => Relation::Unknown,
        };
        Fraction {
            value: gateway / limit,
            relation,
        }
    }

    /// One sentence for the text and HTML reports, e.g. "gateway saturation = 18.1% of
    /// the bare-echo limit".
    pub fn sentence(&self) -> String {
        let percent = self.value * 100.0;
        match self.relation {
            Relation::Exact => format!("gateway saturation = {percent:.1}% of the bare-echo limit"),
            Relation::AtMost => format!(
                "gateway saturation ≤ {percent:.1}% of the bare-echo limit: the limit passed \
                 every rate up to --limit-max-rate, so it is higher than measured"
            ),
            Relation::AtLeast => format!(
                "gateway saturation ≥ {percent:.1}% of the bare-echo limit: the gateway passed \
                 every rate up to --max-rate, so it is higher than measured"
            ),
            Relation::Unknown => format!(
                "gateway saturation: both searches passed every rate they tried, so the \
                 {percent:.1}% between their figures says nothing"
            ),
        }
    }
}

/// One worker count of a `saturate --scale-workers` search: its steps, best step and
/// bound are those of `target` in the report.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerScaling {
    pub workers: u32,
    pub target: String,
}

/// Columns of the worker-scaling table, text and HTML alike.
pub const SCALING_COLUMNS: [&str; 4] = [
    "workers",
    "saturation req/s",
    "change from the row above",
    "change from the first",
];

impl SaturateReport {
    /// The worker-scaling table's rows, in [`SCALING_COLUMNS`] order: how far each
    /// worker count moved the saturation point.
    pub fn scaling_rows(&self) -> Vec<[String; SCALING_COLUMNS.len()]> {
        let best_rps = |s: &WorkerScaling| self.best.get(&s.target).map(|b| b.achieved_rps);
        let first = self.scaling.first().and_then(best_rps);
        let mut previous = None;
        let mut rows = Vec::with_capacity(self.scaling.len());
        for s in &self.scaling {
            let rps = best_rps(s);
            let best = match rps {
                Some(rps) if self.at_max_rate.contains(&s.target) => {
                    format!("≥ {}", thousands(rps))
                }
                Some(rps) => thousands(rps),
                None => "none met the target".to_owned(),
            };
            rows.push([
                s.workers.to_string(),
                best,
                change(previous, rps),
                change(first, rps),
            ]);
            previous = rps;
        }
        rows
    }
}

/// `+12.3 %` from `from` to `to`; `—` when either is missing.
fn change(from: Option<f64>, to: Option<f64>) -> String {
    match (from, to) {
        (Some(from), Some(to)) if from > 0.0 => format!("{:+.1} %", (to / from - 1.0) * 100.0),
        _ => "—".to_owned(),
    }
}

#[derive(Debug, Clone, Serialize)]
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

/// `idle`: resident memory per idle session.
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
}

impl RunReport {
    pub fn from_result(r: &RunResult) -> Self {
        let t = &r.totals;
        let per_conn = if r.per_conn.is_empty() {
            PerConn::default()
        } else {
            let n = r.per_conn.len() as f64;
            PerConn {
                min: r.per_conn.iter().copied().fold(f64::INFINITY, f64::min),
                avg: r.per_conn.iter().sum::<f64>() / n,
                max: r.per_conn.iter().copied().fold(0.0, f64::max),
            }
        };
        let server = (!t.server.total.is_empty()).then(|| ServerReport {
            client_ws: t.server.client_ws.summary(),
            gate_bus: t.server.gate_bus.summary(),
            queue: t.server.queue.summary(),
            handler: t.server.handler.summary(),
            total: t.server.total.summary(),
        });
        let timeline = r
            .timeline
            .iter()
            .map(|(second, s)| SecondReport {
                second: *second,
                answers: t.answers_per_second.get(*second).copied().unwrap_or(0),
                p50_us: s.p50_us,
                p99_us: s.p99_us,
                max_us: s.max_us,
            })
            .collect();
        RunReport {
            label: r.target.label.clone(),
            target: r.target.kind.to_owned(),
            urls: r.target.urls.clone(),
            route: r.spec.route.clone(),
            clients: r.spec.clients,
            connected: r.connected,
            connect_errors: r.connect_errors.clone(),
            interval_us: r.spec.interval.as_secs_f64() * 1e6,
            count: match r.spec.length {
                Length::Count(n) => Some(n),
                Length::Duration(_) => None,
            },
            clock: format!("{:?}", r.spec.clock).to_lowercase(),
            phases: r.phases,
            driver: format!("{:?}", r.spec.driver).to_lowercase(),
            warmup_s: r.spec.warmup.as_secs_f64(),
            window_s: r.spec.window().as_secs_f64(),
            elapsed_s: r.elapsed.as_secs_f64(),
            offered_rps: r.spec.offered_rps(),
            sent: t.sent,
            ok: t.ok,
            achieved_rps: r.achieved_rps,
            per_conn,
            timeouts: t.timeouts,
            unanswered: t.unanswered,
            errors_by_code: t.codes.clone(),
            error_messages: t.messages.clone(),
            failures: t
                .failures
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect(),
            latency: Latencies {
                from_schedule: t.latency.from_schedule.summary(),
                from_send: t.latency.from_send.summary(),
                lag: t.latency.lag.summary(),
            },
            server,
            limit: None,
            cpu: r.cpu.clone(),
            timeline,
            curves: Curves {
                from_schedule: t.latency.from_schedule.curve(),
                from_send: t.latency.from_send.curve(),
                lag: t.latency.lag.curve(),
            },
        }
    }

    /// Sets the comparison with a bare-echo run under the same load.
    pub fn compare_with_limit(&mut self, limit: &RunReport) {
        self.limit = Some(LimitComparison {
            limit_rps: limit.achieved_rps,
            fraction: if limit.achieved_rps > 0.0 {
                self.achieved_rps / limit.achieved_rps
            } else {
                0.0
            },
            limit_p99_from_schedule_us: limit.latency.from_schedule.p99_us,
        });
    }

    /// Answers other than 200 plus requests that got no answer.
    pub fn errors(&self) -> u64 {
        self.errors_by_code.values().sum::<u64>()
            + self.failures.values().sum::<u64>()
            + self.timeouts
            + self.unanswered
    }
}

/// The columns of the summary table, one row per run: the markdown report's last table
/// (pasteable into docs/benchmarks.md) and the HTML report's first.
pub const SUMMARY_COLUMNS: [&str; 16] = [
    "run",
    "target",
    "clients",
    "offered req/s",
    "achieved req/s",
    "per conn min / avg / max",
    "p50",
    "p90",
    "p99",
    "p99.9",
    "max (ms, from schedule)",
    "p99 from send",
    "lag p99",
    "timeouts",
    "errors",
    "% of limit",
];

impl RunReport {
    /// Microseconds of `c`'s CPU per request sent in the measured window (answered,
    /// refused or lost alike): what one request costs that process, so runs at
    /// different rates, and the full path against the bare echo, compare directly.
    /// `None` for the steal, which no request spent.
    pub fn cpu_us_per_request(&self, c: &CpuUse) -> Option<f64> {
        (self.sent > 0 && c.name != STEAL).then(|| c.cpu_seconds * 1e6 / self.sent as f64)
    }

    /// This run's cells of the summary table, in [`SUMMARY_COLUMNS`] order.
    pub fn summary_cells(&self) -> [String; SUMMARY_COLUMNS.len()] {
        let s = &self.latency.from_schedule;
        [
            self.label.clone(),
            self.target.clone(),
            self.clients.to_string(),
            thousands(self.offered_rps),
            thousands(self.achieved_rps),
            format!(
                "{:.1} / {:.1} / {:.1}",
                self.per_conn.min, self.per_conn.avg, self.per_conn.max
            ),
            ms(s.p50_us),
            ms(s.p90_us),
            ms(s.p99_us),
            ms(s.p999_us),
            ms(s.max_us),
            ms(self.latency.from_send.p99_us),
            ms(self.latency.lag.p99_us),
            self.timeouts.to_string(),
            (self.errors() - self.timeouts).to_string(),
            self.limit
                .map_or_else(|| "—".to_owned(), |c| format!("{:.1}%", c.fraction * 100.0)),
        ]
    }
}

/// Milliseconds with three decimals from microseconds.
pub fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

/// A rounded number with thin thousands separators: 99,990.
pub fn thousands(x: f64) -> String {
    let negative = x < 0.0;
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if negative { format!("-{out}") } else { out }
}

/// Now as `YYYY-MM-DD HH:MM:SS UTC`, without a date crate: days since the epoch to a
/// civil date (Howard Hinnant's algorithm).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_text(secs)
}

fn utc_text(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn summary(p50: f64, p99: f64) -> Summary {
        Summary {
            count: 1000,
            mean_us: p50,
            p50_us: p50,
            p90_us: p50,
            p99_us: p99,
            p999_us: p99,
            max_us: p99 * 2.0,
        }
    }

    /// A made-up run for rendering tests.
    pub(crate) fn sample_run(label: &str, target: &str, achieved: f64) -> RunReport {
        RunReport {
            label: label.into(),
            target: target.into(),
            urls: vec!["ws://127.0.0.1:1/".into()],
            route: "echo.raw".into(),
            clients: 50,
            connected: 50,
            connect_errors: BTreeMap::new(),
            interval_us: 1000.0,
            count: None,
            clock: "thread".into(),
            phases: 4,
            driver: "lean".into(),
            warmup_s: 1.0,
            window_s: 10.0,
            elapsed_s: 10.002,
            offered_rps: 50_000.0,
            sent: 500_000,
            ok: 499_990,
            achieved_rps: achieved,
            per_conn: PerConn {
                min: 998.5,
                avg: 999.9,
                max: 1000.0,
            },
            timeouts: 0,
            unanswered: 0,
            errors_by_code: BTreeMap::from([(503, 10)]),
            error_messages: BTreeMap::from([(503, "queue full".to_owned())]),
            failures: BTreeMap::new(),
            latency: Latencies {
                from_schedule: summary(800.0, 2_500.0),
                from_send: summary(700.0, 2_000.0),
                lag: summary(60.0, 400.0),
            },
            server: Some(ServerReport {
                client_ws: summary(300.0, 900.0),
                gate_bus: summary(200.0, 500.0),
                queue: summary(50.0, 300.0),
                handler: summary(2.0, 5.0),
                total: summary(260.0, 800.0),
            }),
            limit: None,
            cpu: vec![CpuUse {
                name: "gate".into(),
                pid: 7,
                cpu_seconds: 9.0,
                percent: 90.0,
            }],
            timeline: (0..10)
                .map(|s| SecondReport {
                    second: s,
                    answers: 50_000,
                    p50_us: 800.0,
                    p99_us: 2_000.0 + s as f64 * 100.0,
                    max_us: 3_000.0,
                })
                .collect(),
            curves: Curves {
                from_schedule: vec![[0.0, 100.0], [1.0, 900.0], [2.0, 2_500.0], [3.0, 4_000.0]],
                from_send: vec![[0.0, 90.0], [2.0, 2_000.0]],
                lag: vec![[0.0, 1.0], [2.0, 400.0]],
            },
        }
    }

    #[test]
    fn json_report_round_trips_the_key_figures() {
        let mut report = ScenarioReport::new("pomelo-a", "1 gate + 1 echo".into());
        report.runs.push(sample_run("pomelo A", "gateway", 1_999.0));
        let json = serde_json::to_value(&report).expect("serialisable");
        assert_eq!(json["runs"][0]["achieved_rps"], 1_999.0);
        assert_eq!(
            json["runs"][0]["latency"]["from_schedule"]["p99_us"],
            2_500.0
        );
        assert_eq!(json["runs"][0]["errors_by_code"]["503"], 10);
        assert_eq!(json["runs"][0]["server"]["gate_bus"]["p50_us"], 200.0);
        assert!(json.get("saturate").is_none());
    }

    #[test]
    fn a_run_without_successes_is_a_failure() {
        let mut report = ScenarioReport::new("x", String::new());
        let mut run = sample_run("dead", "gateway", 0.0);
        run.ok = 0;
        report.runs.push(sample_run("fine", "gateway", 1.0));
        report.runs.push(run);
        assert_eq!(report.failed_runs(), vec!["dead"]);
    }

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(99_990.0), "99,990");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(thousands(-1_500.0), "-1,500");
        assert_eq!(ms(2_500.0), "2.500");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_text(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_text(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_text(1_795_000_000), "2026-11-18 11:06:40 UTC");
    }

    #[test]
    fn a_fraction_says_which_side_a_lower_bound_leaves_it() {
        let relation = |g, l| Fraction::of(1.0, g, 4.0, l).relation;
        assert_eq!(relation(false, false), Relation::Exact);
        assert_eq!(relation(false, true), Relation::AtMost);
        assert_eq!(relation(true, false), Relation::AtLeast);
        assert_eq!(relation(true, true), Relation::Unknown);
        assert_eq!(Fraction::of(1.0, false, 4.0, false).value, 0.25);
        assert_eq!(
            Fraction::of(1.0, false, 4.0, false).sentence(),
            "gateway saturation = 25.0% of the bare-echo limit"
        );
        assert!(
            Fraction::of(1.0, true, 4.0, false)
                .sentence()
                .starts_with("gateway saturation ≥ 25.0%")
        );
        assert!(!Fraction::of(1.0, true, 4.0, true).sentence().contains('='));
    }
}
