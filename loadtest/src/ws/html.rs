//! `--html`: the report as one self-contained page. Charts are inline SVG drawn here
//! (polylines on a grid), so the page needs no script, no library and no network:
//! per run, latency from the schedule over time (p50 and p99 of each second), answers per
//! second, and the latency distribution as a percentile curve.

use std::fmt::Write as _;

use super::report::{RunReport, SCALING_COLUMNS, SUMMARY_COLUMNS, ScenarioReport, ms, thousands};

const WIDTH: f64 = 540.0;
const HEIGHT: f64 = 260.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 40.0;

/// One line on a chart.
pub(crate) struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// How the x axis is labelled.
pub(crate) enum XAxis {
    /// Plain numbers ("s" after them).
    Seconds,
    /// Nines of a percentile curve: 0 → 0%, 2 → 99%, 3 → 99.9%.
    Nines,
}

/// The whole page.
pub fn render_html(report: &ScenarioReport) -> String {
    let mut out = String::new();
    let title = format!("{} — {}", report.scenario, report.setup);
    let m = &report.machine;
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{}</title>\n<style>{}</style></head><body>\n<h1>{}</h1>\n\
         <p class=\"meta\">{} · {} CPUs ({}), {} GiB, Linux {}<br><code>{}</code></p>\n",
        esc(&title),
        STYLE,
        esc(&title),
        esc(&report.date),
        m.cpus,
        esc(&m.cpu_model),
        m.memory_gib,
        esc(&m.kernel),
        esc(&report.command)
    );
    if !report.runs.is_empty() {
        summary_table(&mut out, &report.runs);
    }
    if let Some(s) = &report.saturate {
        out.push_str("<h2>Saturation search</h2>\n<table><tr><th>target</th><th>per client req/s</th><th>offered</th><th>achieved</th><th>p99 (ms)</th><th>lost</th><th>errors</th><th>within target</th></tr>\n");
        for step in &s.steps {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&step.target),
                thousands(step.per_client_rps),
                thousands(step.offered_rps),
                thousands(step.achieved_rps),
                ms(step.p99_from_schedule_us),
                step.lost,
                step.errors,
                if step.passed { "yes" } else { "no" }
            );
        }
        out.push_str("</table>\n");
        if let Some(f) = &s.fraction_of_limit {
            let _ = writeln!(out, "<p><b>{}</b>.</p>", esc(&f.sentence()));
        }
        if !s.scaling.is_empty() {
            out.push_str("<h3>Adding workers</h3>\n");
            table(&mut out, &SCALING_COLUMNS, s.scaling_rows().into_iter());
        }
    }
    if let Some(i) = &report.idle {
        let _ = writeln!(
            out,
            "<h2>Idle sessions</h2><p>{} of {} sessions opened on {} in {:.2} s; gate RSS {} KiB → {} KiB: <b>{} bytes per session</b>.</p>",
            i.opened,
            i.sessions,
            esc(&i.url),
            i.open_seconds,
            i.rss_before / 1024,
            i.rss_after / 1024,
            thousands(i.bytes_per_session)
        );
    }
    for e in &report.errors {
        let _ = writeln!(out, "<p><b>Failed:</b> {}</p>", esc(e));
    }
    for run in &report.runs {
        run_section(&mut out, run);
    }
    out.push_str("</body></html>\n");
    out
}

pub(crate) const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}\
table{border-collapse:collapse;margin:1em 0;font-size:12px}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}\
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}td{white-space:nowrap}.meta{color:#555}\
svg{display:block;margin:0.5em 0}.charts{display:flex;flex-wrap:wrap;gap:1em}";

fn summary_table(out: &mut String, runs: &[RunReport]) {
    table(
        out,
        &SUMMARY_COLUMNS,
        runs.iter().map(RunReport::summary_cells),
    );
    out.push_str("<p>Latencies in ms, from the scheduled send time unless marked.</p>\n");
}

/// A table with a header row of `columns` and one row per item of `rows`.
pub(crate) fn table<const N: usize>(
    out: &mut String,
    columns: &[&str; N],
    rows: impl Iterator<Item = [String; N]>,
) {
    out.push_str("<table><tr>");
    for column in columns {
        let _ = write!(out, "<th>{}</th>", esc(column));
    }
    out.push_str("</tr>\n");
    for cells in rows {
        out.push_str("<tr>");
        for cell in &cells {
            let _ = write!(out, "<td>{}</td>", esc(cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
}

fn run_section(out: &mut String, r: &RunReport) {
    let _ = writeln!(
        out,
        "<h2>{} <small>[{}]</small></h2>\n<p>{} clients × one request per {:.0} µs; \
         {} req/s achieved of {} offered; timeouts {}, unanswered {}.</p>",
        esc(&r.label),
        esc(&r.target),
        r.clients,
        r.interval_us,
        thousands(r.achieved_rps),
        thousands(r.offered_rps),
        r.timeouts,
        r.unanswered
    );
    if let Some(s) = &r.server {
        let _ = writeln!(
            out,
            "<p>Server split (avg / p99 ms): client+ws {} / {}, gate+bus {} / {}, queue {} / {}, handler {} / {}.</p>",
            ms(s.client_ws.mean_us),
            ms(s.client_ws.p99_us),
            ms(s.gate_bus.mean_us),
            ms(s.gate_bus.p99_us),
            ms(s.queue.mean_us),
            ms(s.queue.p99_us),
            ms(s.handler.mean_us),
            ms(s.handler.p99_us)
        );
    }
    out.push_str("<div class=\"charts\">\n");
    let over_time = [
        Series {
            name: "p50",
            color: "#1f77b4",
            points: r
                .timeline
                .iter()
                .map(|s| (s.second as f64, s.p50_us / 1000.0))
                .collect(),
        },
        Series {
            name: "p99",
            color: "#d62728",
            points: r
                .timeline
                .iter()
                .map(|s| (s.second as f64, s.p99_us / 1000.0))
                .collect(),
        },
    ];
    out.push_str(&line_chart(
        "Latency from schedule, per second (ms)",
        &over_time,
        &XAxis::Seconds,
    ));
    let answers = [Series {
        name: "answers/s",
        color: "#2ca02c",
        points: r
            .timeline
            .iter()
            .map(|s| (s.second as f64, s.answers as f64))
            .collect(),
    }];
    out.push_str(&line_chart("Answers per second", &answers, &XAxis::Seconds));
    let to_ms = |c: &[[f64; 2]]| c.iter().map(|p| (p[0], p[1] / 1000.0)).collect();
    let curves = [
        Series {
            name: "from schedule",
            color: "#d62728",
            points: to_ms(&r.curves.from_schedule),
        },
        Series {
            name: "from send",
            color: "#1f77b4",
            points: to_ms(&r.curves.from_send),
        },
        Series {
            name: "schedule lag",
            color: "#7f7f7f",
            points: to_ms(&r.curves.lag),
        },
    ];
    out.push_str(&line_chart(
        "Latency distribution (ms by percentile)",
        &curves,
        &XAxis::Nines,
    ));
    out.push_str("</div>\n");
}

/// An SVG line chart; an empty chart says "no data".
pub(crate) fn line_chart(title: &str, series: &[Series], x_axis: &XAxis) -> String {
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-size=\"11\"><title>{}</title>\
         <text x=\"{LEFT}\" y=\"16\" font-size=\"13\" font-weight=\"bold\">{}</text>",
        esc(title),
        esc(title)
    );
    let all = || series.iter().flat_map(|s| s.points.iter());
    if all().next().is_none() {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\">no data</text></svg>",
            WIDTH / 2.0,
            HEIGHT / 2.0
        );
        return svg;
    }
    let x_max = all().map(|p| p.0).fold(0.0, f64::max).max(1.0);
    let y_step = nice_step(all().map(|p| p.1).fold(0.0, f64::max) / 5.0);
    let y_max = (all().map(|p| p.1).fold(0.0, f64::max) / y_step)
        .ceil()
        .max(1.0)
        * y_step;
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let sx = |x: f64| LEFT + x / x_max * plot_w;
    let sy = |y: f64| TOP + plot_h - y / y_max * plot_h;

    // Horizontal grid and y labels.
    let mut y = 0.0;
    while y <= y_max + y_step / 2.0 {
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#e5e5e5\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            sy(y),
            sy(y),
            LEFT - 6.0,
            sy(y) + 4.0,
            axis_number(y)
        );
        y += y_step;
    }
    // Vertical ticks and x labels.
    let x_ticks: Vec<(f64, String)> = match x_axis {
        XAxis::Seconds => {
            let step = nice_step(x_max / 8.0).max(1.0);
            let mut ticks = Vec::new();
            let mut x = 0.0;
            while x <= x_max + step / 2.0 {
                ticks.push((x, format!("{}s", axis_number(x))));
                x += step;
            }
            ticks
        }
        XAxis::Nines => (0..=x_max.ceil() as u32)
            .map(|n| (f64::from(n), nines_label(n)))
            .collect(),
    };
    for (x, label) in &x_ticks {
        if *x > x_max + 1e-9 {
            continue;
        }
        let _ = write!(
            svg,
            "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#f0f0f0\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            sx(*x),
            sx(*x),
            TOP + plot_h,
            sx(*x),
            TOP + plot_h + 16.0,
            esc(label)
        );
    }
    let _ = write!(
        svg,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w}\" height=\"{plot_h}\" fill=\"none\" stroke=\"#999\"/>"
    );
    for (i, s) in series.iter().enumerate() {
        let points: Vec<String> = s
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" points=\"{}\"/>",
            s.color,
            points.join(" ")
        );
        // Legend in the top left corner, where latency curves start low.
        let ly = TOP + 14.0 + 14.0 * i as f64;
        let _ = write!(
            svg,
            "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{ly:.1}\" y2=\"{ly:.1}\" stroke=\"{}\" stroke-width=\"2\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            LEFT + 10.0,
            LEFT + 28.0,
            s.color,
            LEFT + 32.0,
            ly + 4.0,
            esc(s.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

fn axis_number(x: f64) -> String {
    if x == 0.0 || x.abs() >= 10.0 {
        thousands(x)
    } else {
        // Trim a step like 0.2 or 0.05 to what it needs.
        let text = format!("{x:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

fn nines_label(n: u32) -> String {
    match n {
        0 => "0%".to_owned(),
        1 => "90%".to_owned(),
        n => format!("99.{}%", "9".repeat(n as usize - 2)).replace("99.%", "99%"),
    }
}

/// Escapes text for HTML and SVG.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::report::tests::sample_run;

    #[test]
    fn page_is_self_contained_with_three_charts_per_run() {
        let mut report = ScenarioReport::new("concurrency", "1 gate + 1 echo <launched>".into());
        report
            .runs
            .push(sample_run("50 clients", "gateway", 49_990.0));
        let html = render_html(&report);
        assert!(html.starts_with("<!doctype html>"));
        assert_eq!(html.matches("<svg").count(), 3);
        assert_eq!(html.matches("</svg>").count(), 3);
        assert!(!html.contains("<script"), "no JS");
        assert!(
            !html.contains("http://") || html.matches("http://").count() == 3,
            "only the SVG namespace"
        );
        assert!(html.contains("&lt;launched&gt;"), "text is escaped");
        assert!(html.contains("99.9%"));
        assert!(html.contains("<polyline"));
    }

    #[test]
    fn empty_series_draw_no_data() {
        let chart = line_chart("t", &[], &XAxis::Seconds);
        assert!(chart.contains("no data"));
        assert!(chart.ends_with("</svg>\n"));
    }

    #[test]
    fn steps_and_labels() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nines_label(0), "0%");
        assert_eq!(nines_label(1), "90%");
        assert_eq!(nines_label(2), "99%");
        assert_eq!(nines_label(4), "99.99%");
        assert_eq!(axis_number(0.2), "0.2");
        assert_eq!(axis_number(2500.0), "2,500");
    }
}
