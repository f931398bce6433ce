//! A [`Doc`] as one self-contained page: tables, and charts as inline SVG polylines on a
//! grid, so the page needs no script, no library and no network.

use std::fmt::Write as _;

use super::{Block, Chart, Doc, XAxis, thousands};

const WIDTH: f64 = 540.0;
const HEIGHT: f64 = 260.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 40.0;
const COLORS: [&str; 4] = ["#d62728", "#1f77b4", "#2ca02c", "#7f7f7f"];
const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}\
table{border-collapse:collapse;margin:1em 0;font-size:12px}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}\
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}td{white-space:nowrap}.meta{color:#555}\
svg{display:inline-block;margin:0.5em 0.5em 0.5em 0}";

pub fn render(doc: &Doc) -> String {
    let title = esc(&doc.title);
    let (meta, command) = (esc(&doc.meta.line()), esc(&doc.meta.command));
    let mut out = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n\
         <style>{STYLE}</style></head><body>\n<h1>{title}</h1>\n<p class=\"meta\">{meta}<br><code>{command}</code></p>\n"
    );
    for block in &doc.blocks {
        match block {
            Block::Heading(h) => _ = writeln!(out, "<h2>{}</h2>", esc(h)),
            Block::Lines(lines) => {
                let lines: Vec<String> = lines.iter().map(|l| esc(l)).collect();
                let _ = writeln!(out, "<p>{}</p>", lines.join("<br>"));
            }
            Block::Table(t) => {
                let row = |tag: &str, cells: &[String]| {
                    let cells = cells.iter().map(|c| format!("<{tag}>{}</{tag}>", esc(c)));
                    format!("<tr>{}</tr>\n", cells.collect::<String>())
                };
                out.push_str("<table>");
                out.push_str(&row("th", &t.columns));
                t.rows.iter().for_each(|r| out.push_str(&row("td", r)));
                out.push_str("</table>\n");
            }
            Block::Chart(chart) => out.push_str(&svg(chart)),
        }
    }
    out.push_str("</body></html>\n");
    out
}

/// A line chart; one without points says "no data".
fn svg(chart: &Chart) -> String {
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-size=\"11\">\
         <text x=\"{LEFT}\" y=\"16\" font-size=\"13\" font-weight=\"bold\">{}</text>",
        esc(&chart.title)
    );
    let all = || chart.series.iter().flat_map(|s| s.1.iter());
    if all().next().is_none() {
        let (x, y) = (WIDTH / 2.0, HEIGHT / 2.0);
        let _ = writeln!(svg, "<text x=\"{x}\" y=\"{y}\">no data</text></svg>");
        return svg;
    }
    let x_max = all().map(|p| p.0).fold(0.0, f64::max).max(1.0);
    let y_top = all().map(|p| p.1).fold(0.0, f64::max);
    let y_step = nice_step(y_top / 5.0);
    let y_max = (y_top / y_step).ceil().max(1.0) * y_step;
    let (w, h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let sx = |x: f64| LEFT + x / x_max * w;
    let sy = |y: f64| TOP + h - y / y_max * h;
    let mut y = 0.0;
    while y <= y_max + y_step / 2.0 {
        let (right, at, label) = (WIDTH - RIGHT, sy(y), axis_number(y));
        let (tx, ty) = (LEFT - 6.0, at + 4.0);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{right:.1}\" y1=\"{at:.1}\" y2=\"{at:.1}\" stroke=\"#e5e5e5\"/>\
             <text x=\"{tx:.1}\" y=\"{ty:.1}\" text-anchor=\"end\">{label}</text>"
        );
        y += y_step;
    }
    let ticks: Vec<(f64, String)> = match chart.x {
        XAxis::Seconds => {
            let step = nice_step(x_max / 8.0).max(1.0);
            (0..=(x_max / step) as u32)
                .map(|i| f64::from(i) * step)
                .map(|x| (x, format!("{}s", axis_number(x))))
                .collect()
        }
        XAxis::Nines => (0..=x_max as u32)
            .map(|n| (f64::from(n), nines_label(n)))
            .collect(),
    };
    for (x, label) in ticks {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            sx(x),
            TOP + h + 16.0
        );
    }
    let _ = write!(
        svg,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#999\"/>"
    );
    for (i, (name, points)) in chart.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let point = |&(x, y): &(f64, f64)| format!("{:.1},{:.1}", sx(x), sy(y));
        let points: Vec<String> = points.iter().map(point).collect();
        let ly = TOP + 14.0 + 14.0 * i as f64;
        let (points, name, ty) = (points.join(" "), esc(name), ly + 4.0);
        let (x1, x2, tx) = (LEFT + 10.0, LEFT + 28.0, LEFT + 32.0);
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\" points=\"{points}\"/>\
             <line x1=\"{x1:.1}\" x2=\"{x2:.1}\" y1=\"{ly:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"2\"/>\
             <text x=\"{tx:.1}\" y=\"{ty:.1}\">{name}</text>"
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
    let nice = [1.0, 2.0, 5.0].into_iter().find(|n| raw / magnitude <= *n);
    nice.unwrap_or(10.0) * magnitude
}

fn axis_number(x: f64) -> String {
    if x == 0.0 || x.abs() >= 10.0 {
        return thousands(x);
    }
    let x = format!("{x:.3}");
    x.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn nines_label(n: u32) -> String {
    match n {
        0 => "0%".to_owned(),
        1 => "90%".to_owned(),
        2 => "99%".to_owned(),
        n => format!("99.{}%", "9".repeat(n as usize - 2)),
    }
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
