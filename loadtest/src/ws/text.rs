//! The terminal report: per run the load, what it achieved, errors, the three latency
//! lines and the server-side split; then one markdown row per run (pasteable into
//! docs/benchmarks.md), and the saturation or idle-memory findings.

use std::fmt::Write as _;

use super::hist::Summary;
use super::report::{
    IdleReport, RunReport, SCALING_COLUMNS, SUMMARY_COLUMNS, SaturateReport, ScenarioReport, ms,
    thousands,
};

/// The terminal report.
pub fn render_text(report: &ScenarioReport) -> String {
    let mut out = String::new();
    let m = &report.machine;
    let _ = writeln!(
        out,
        "# {} — {}\n{} | {} CPUs ({}), {} GiB, Linux {}\n{}\n",
        report.scenario,
        report.setup,
        report.date,
        m.cpus,
        m.cpu_model,
        m.memory_gib,
        m.kernel,
        report.command
    );
    for run in &report.runs {
        render_run(&mut out, run);
    }
    if !report.runs.is_empty() {
        out.push_str(&summary_table(&report.runs));
    }
    if let Some(s) = &report.saturate {
        render_saturate(&mut out, s);
    }
    if let Some(i) = &report.idle {
        render_idle(&mut out, i);
    }
    for e in &report.errors {
        let _ = writeln!(out, "FAILED: {e}");
    }
    out
}

fn render_run(out: &mut String, r: &RunReport) {
    let length = match r.count {
        Some(n) => format!("{} requests per client", thousands(n as f64)),
        None => format!("{:.1} s window", r.window_s),
    };
    let _ = writeln!(
        out,
        "## {} [{}]\n\
         load      {} clients ({} connected) × 1 {} per {:.0} µs = {} req/s offered; {}, \
         warm-up {:.1} s; clock {} ({} phases); driver {}",
        r.label,
        r.target,
        r.clients,
        r.connected,
        r.route,
        r.interval_us,
        thousands(r.offered_rps),
        length,
        r.warmup_s,
        r.clock,
        r.phases,
        r.driver,
    );
    let _ = writeln!(
        out,
        "achieved  {} req/s ({} ok of {} sent in {:.2} s); per connection min {} / avg {} / max {}",
        thousands(r.achieved_rps),
        thousands(r.ok as f64),
        thousands(r.sent as f64),
        r.elapsed_s,
        one_decimal(r.per_conn.min),
        one_decimal(r.per_conn.avg),
        one_decimal(r.per_conn.max),
    );
    let _ = writeln!(
        out,
        "errors    timeouts {}, unanswered {}, {}",
        r.timeouts,
        r.unanswered,
        errors_text(r)
    );
    for (error, n) in &r.connect_errors {
        let _ = writeln!(out, "connect   {n} × {error}");
    }
    let _ = writeln!(
        out,
        "latency (ms)     {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "avg", "p50", "p90", "p99", "p99.9", "max"
    );
    let l = &r.latency;
    for (name, s) in [
        ("from schedule", &l.from_schedule),
        ("from send", &l.from_send),
        ("schedule lag", &l.lag),
    ] {
        latency_row(out, name, s);
    }
    if let Some(s) = &r.server {
        let _ = writeln!(
            out,
            "server split (ms, {} answers with timing)",
            s.total.count
        );
        for (name, x) in [
            ("client + ws", &s.client_ws),
            ("gate + bus", &s.gate_bus),
            ("queue", &s.queue),
            ("handler", &s.handler),
            ("server total", &s.total),
        ] {
            latency_row(out, name, x);
        }
    }
    if let Some(c) = &r.limit {
        let _ = writeln!(
            out,
            "limit     bare echo, same load: {} req/s, p99 {} ms from schedule → this run reaches {:.1}%",
            thousands(c.limit_rps),
            ms(c.limit_p99_from_schedule_us),
            c.fraction * 100.0
        );
    }
    if !r.cpu.is_empty() {
        let cpu: Vec<String> = r
            .cpu
            .iter()
            .map(|c| match r.cpu_us_per_request(c) {
                Some(us) => format!("{} {:.0}% {:.1} µs", c.name, c.percent, us),
                None => format!("{} {:.0}%", c.name, c.percent),
            })
            .collect();
        let _ = writeln!(
            out,
            "cpu       {} (100% = one core; µs of CPU per request sent)",
            cpu.join(", ")
        );
    }
    out.push('\n');
}

fn latency_row(out: &mut String, name: &str, s: &Summary) {
    let _ = writeln!(
        out,
        "  {:<14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        name,
        ms(s.mean_us),
        ms(s.p50_us),
        ms(s.p90_us),
        ms(s.p99_us),
        ms(s.p999_us),
        ms(s.max_us)
    );
}

fn errors_text(r: &RunReport) -> String {
    let mut parts: Vec<String> = r
        .errors_by_code
        .iter()
        .map(|(code, n)| match r.error_messages.get(code) {
            Some(m) if !m.is_empty() => format!("{code} × {n} ({m})"),
            _ => format!("{code} × {n}"),
        })
        .collect();
    parts.extend(r.failures.iter().map(|(k, n)| format!("{k} × {n}")));
    if parts.is_empty() {
        "no error answers".to_owned()
    } else {
        parts.join(", ")
    }
}

/// A markdown table: a header row of `columns` and one row per item of `rows` (the
/// HTML report's `table` in markdown).
pub(crate) fn markdown_table<const N: usize>(
    columns: &[&str; N],
    rows: impl Iterator<Item = [String; N]>,
) -> String {
    let row = |cells: &[&str]| format!("| {} |\n", cells.join(" | "));
    let mut out = row(columns);
    out.push_str(&row(&["---"; N]));
    for cells in rows {
        out.push_str(&row(&cells.each_ref().map(String::as_str)));
    }
    out
}

/// One markdown row per run: pasteable into docs/benchmarks.md.
pub fn summary_table(runs: &[RunReport]) -> String {
    let mut out = markdown_table(&SUMMARY_COLUMNS, runs.iter().map(RunReport::summary_cells));
    out.push('\n');
    out
}

fn render_saturate(out: &mut String, s: &SaturateReport) {
    let _ = writeln!(
        out,
        "## saturation search: {} clients, p99 from schedule ≤ {} ms, no lost requests",
        s.clients,
        ms(s.p99_target_us)
    );
    let _ = writeln!(
        out,
        "| target | per client req/s | offered req/s | achieved req/s | p99 (ms) | lost | errors | within target |\n|---|---|---|---|---|---|---|---|"
    );
    for step in &s.steps {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            step.target,
            thousands(step.per_client_rps),
            thousands(step.offered_rps),
            thousands(step.achieved_rps),
            ms(step.p99_from_schedule_us),
            step.lost,
            step.errors,
            if step.passed { "yes" } else { "no" }
        );
    }
    for (target, best) in &s.best {
        let bound = if s.at_max_rate.contains(target) {
            " — every rate it tried passed: a lower bound"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "best {target}: {} req/s ({} per client, p99 {} ms){bound}",
            thousands(best.achieved_rps),
            thousands(best.per_client_rps),
            ms(best.p99_from_schedule_us)
        );
    }
    if let Some(f) = &s.fraction_of_limit {
        let _ = writeln!(out, "{}", f.sentence());
    }
    if !s.scaling.is_empty() {
        let _ = writeln!(out, "\nadding workers:");
        out.push_str(&markdown_table(
            &SCALING_COLUMNS,
            s.scaling_rows().into_iter(),
        ));
    }
    out.push('\n');
}

fn render_idle(out: &mut String, i: &IdleReport) {
    let _ = writeln!(
        out,
        "## idle sessions on {} (pid {})\nopened {} of {} in {:.2} s ({} failed), {} still open at the second reading\n\
         RSS {} KiB → {} KiB: {} bytes per session",
        i.url,
        i.pid,
        i.opened,
        i.sessions,
        i.open_seconds,
        i.failed,
        i.alive_after,
        i.rss_before / 1024,
        i.rss_after / 1024,
        thousands(i.bytes_per_session)
    );
}

fn one_decimal(x: f64) -> String {
    format!("{x:.1}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ws::report::tests::sample_run;
    use crate::ws::report::{Fraction, SaturateStep, WorkerScaling};

    #[test]
    fn text_report_shows_every_figure_asked_for() {
        let mut report = ScenarioReport::new("concurrency", "1 gate + 1 echo".into());
        let limit = sample_run("50 clients", "limit", 50_000.0);
        let mut run = sample_run("50 clients", "gateway", 49_990.0);
        run.compare_with_limit(&limit);
        report.runs = vec![limit, run];
        let text = render_text(&report);
        for needle in [
            "50,000 req/s offered",
            "achieved  49,990 req/s",
            "min 998.5 / avg 999.9 / max 1000.0",
            "timeouts 0",
            "503 × 10 (queue full)",
            "from schedule",
            "schedule lag",
            "gate + bus",
            "handler",
            "reaches 100.0%",
            "gate 90% 18.0 µs",
            "| 50 clients | gateway | 50 | 50,000 | 49,990 |",
            "2.500",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }

    #[test]
    fn saturation_report_names_its_best_steps_and_bounds() {
        let step = |target: &str, rate: f64, passed: bool| SaturateStep {
            target: target.into(),
            per_client_rps: rate,
            offered_rps: rate * 50.0,
            achieved_rps: rate * 50.0,
            p99_from_schedule_us: if passed { 3_000.0 } else { 9_000.0 },
            lost: 0,
            errors: 0,
            passed,
        };
        let mut report = ScenarioReport::new("saturate", String::new());
        report.saturate = Some(SaturateReport {
            p99_target_us: 5_000.0,
            clients: 50,
            steps: vec![step("gateway", 500.0, true), step("gateway", 750.0, false)],
            best: BTreeMap::from([
                ("gateway".to_owned(), step("gateway", 500.0, true)),
                ("limit".to_owned(), step("limit", 5_000.0, true)),
            ]),
            fraction_of_limit: Some(Fraction::of(25_000.0, false, 250_000.0, true)),
            at_max_rate: vec!["limit".into()],
            scaling: Vec::new(),
        });
        let text = render_text(&report);
        assert!(
            text.contains("best gateway: 25,000 req/s (500 per client, p99 3.000 ms)\n"),
            "{text}"
        );
        assert!(
            text.contains("best limit: 250,000 req/s") && text.contains("a lower bound"),
            "{text}"
        );
        assert!(
            text.contains("| gateway | 750 | 37,500 | 37,500 | 9.000 | 0 | 0 | no |"),
            "{text}"
        );
        assert!(
            text.contains("gateway saturation ≤ 10.0% of the bare-echo limit: the limit passed"),
            "{text}"
        );
        assert!(!text.contains("adding workers"), "{text}");
    }

    #[test]
    fn worker_scaling_shows_each_count_and_its_change() {
        let best = |target: &str, achieved_rps: f64| SaturateStep {
            target: target.into(),
            per_client_rps: achieved_rps / 50.0,
            offered_rps: achieved_rps,
            achieved_rps,
            p99_from_schedule_us: 3_000.0,
            lost: 0,
            errors: 0,
            passed: true,
        };
        let scaling = |workers: u32| WorkerScaling {
            workers,
            target: format!("gateway, {workers} workers"),
        };
        let mut report = ScenarioReport::new("saturate", String::new());
        report.saturate = Some(SaturateReport {
            p99_target_us: 20_000.0,
            clients: 50,
            steps: Vec::new(),
            best: BTreeMap::from([
                (
                    "gateway, 1 workers".to_owned(),
                    best("gateway, 1 workers", 10_000.0),
                ),
                (
                    "gateway, 2 workers".to_owned(),
                    best("gateway, 2 workers", 14_000.0),
                ),
                (
                    "gateway, 3 workers".to_owned(),
                    best("gateway, 3 workers", 15_400.0),
                ),
            ]),
            fraction_of_limit: None,
            at_max_rate: vec!["gateway, 3 workers".into()],
            scaling: (1..=4).map(scaling).collect(),
        });
        let text = render_text(&report);
        for needle in [
            "| workers | saturation req/s | change from the row above | change from the first |",
            "| 1 | 10,000 | — | +0.0 % |",
            "| 2 | 14,000 | +40.0 % | +40.0 % |",
            "| 3 | ≥ 15,400 | +10.0 % | +54.0 % |",
            "| 4 | none met the target | — | — |",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        let html = crate::ws::html::render_html(&report);
        assert!(html.contains("<td>+40.0 %</td>"), "{html}");
    }
}
