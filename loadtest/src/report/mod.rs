//! One report model for every scenario: a [`Doc`] of headings, lines, tables and charts,
//! rendered as terminal text ([`text`], tables in markdown to paste into
//! docs/benchmarks.md) and as a self-contained HTML page ([`html`], charts in inline
//! SVG). The JSON (`--json`) is the scenario's own data, serialised as it is.

mod html;
mod text;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::hist::Summary;
use crate::proc::{CpuUse, STEAL};

/// A report, whatever the scenario.
#[derive(Debug, Clone)]
pub struct Doc {
    pub title: String,
    pub meta: Meta,
    pub blocks: Vec<Block>,
}

#[derive(Debug, Clone)]
pub enum Block {
    Heading(String),
    /// One line each (a paragraph in HTML).
    Lines(Vec<String>),
    Table(Table),
    /// Drawn in HTML only.
    Chart(Chart),
}

#[derive(Debug, Clone, Default)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[&str]) -> Self {
        let columns = columns.iter().map(|c| (*c).to_owned()).collect();
        Table {
            columns,
            rows: Vec::new(),
        }
    }

    /// One row per item, each column's header written beside how an item fills it, so
    /// the two cannot drift apart.
    pub fn of<T>(items: impl IntoIterator<Item = T>, columns: &[Column<'_, T>]) -> Self {
        let rows = items.into_iter().map(|item| {
            let cells = columns.iter().map(|(_, cell)| cell(&item));
            cells.collect()
        });
        Table {
            columns: columns.iter().map(|(name, _)| (*name).to_owned()).collect(),
            rows: rows.collect(),
        }
    }

    /// One row per named latency summary, in milliseconds.
    pub fn latency<'a>(rows: impl IntoIterator<Item = (&'a str, &'a Summary)>) -> Self {
        let mut table = Table::new(&["latency (ms)", "avg", "p50", "p90", "p99", "p99.9", "max"]);
        let row = |(name, s): (&str, &Summary)| {
            let figures = [s.mean_us, s.p50_us, s.p90_us, s.p99_us, s.p999_us, s.max_us];
            let cells = std::iter::once(name.to_owned()).chain(figures.map(ms));
            cells.collect()
        };
        table.rows = rows.into_iter().map(row).collect();
        table
    }
}

/// A column of [`Table::of`]: its header, and its cell for an item.
pub type Column<'a, T> = (&'a str, &'a dyn Fn(&T) -> String);

/// Lines over a shared x axis.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x: XAxis,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    Seconds,
    /// Nines of a percentile curve: 2 is p99.
    Nines,
}

impl Doc {
    pub fn new(title: String, meta: Meta) -> Self {
        Doc {
            title,
            meta,
            blocks: Vec::new(),
        }
    }

    pub fn heading(&mut self, text: impl Into<String>) {
        self.blocks.push(Block::Heading(text.into()));
    }

    pub fn lines(&mut self, lines: Vec<String>) {
        if !lines.is_empty() {
            self.blocks.push(Block::Lines(lines));
        }
    }

    /// The scalar fields of `data` as serialised, one `name  value` line each; an object
    /// of scalars (a latency summary, counts by code) or a list of scalars on one line.
    /// Lists of objects are left to tables.
    pub fn fields(&mut self, data: &impl Serialize) {
        let json = serde_json::to_string(data).unwrap_or_default();
        let Ok(fields) = serde_json::from_str::<HashMap<String, &RawValue>>(&json) else {
            return;
        };
        // In the order they were written: each raw value is a slice of `json`.
        let mut fields: Vec<_> = fields.into_iter().collect();
        fields.sort_by_key(|(_, raw)| raw.get().as_ptr());
        let value = |raw: &RawValue| inline(&serde_json::from_str(raw.get()).ok()?);
        let shown: Vec<(&String, String)> = (fields.iter())
            .filter_map(|(name, raw)| Some((name, value(raw)?)))
            .collect();
        let width = shown.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
        let lines = shown.iter().map(|(name, v)| format!("{name:width$}  {v}"));
        self.lines(lines.collect());
    }

    pub fn table(&mut self, table: Table) {
        self.blocks.push(Block::Table(table));
    }

    pub fn chart(&mut self, title: &str, x: XAxis, series: Vec<(&str, Vec<(f64, f64)>)>) {
        let series = series.into_iter().map(|(n, p)| (n.to_owned(), p)).collect();
        self.blocks.push(Block::Chart(Chart {
            title: title.to_owned(),
            x,
            series,
        }));
    }

    pub fn text(&self) -> String {
        text::render(self)
    }

    pub fn html(&self) -> String {
        html::render(self)
    }
}

/// A JSON value on one line: a scalar, or a list or object of scalars.
fn inline(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    let scalar = |v: &Value| match v {
        Value::Null => Some("—".to_owned()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) if n.is_f64() => n.as_f64().map(|x| format!("{x:.1}")),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        Value::Array(_) | Value::Object(_) => None,
    };
    match value {
        Value::Array(items) => {
            let items: Option<Vec<String>> = items.iter().map(scalar).collect();
            Some(items?.join(", "))
        }
        Value::Object(fields) => {
            let field = |(k, v): (&String, &Value)| Some(format!("{k} {}", scalar(v)?));
            let fields = fields.iter().map(field);
            Some(fields.collect::<Option<Vec<_>>>()?.join(", "))
        }
        scalar_value => scalar(scalar_value),
    }
}

/// The CPU each process used: % of one core and (not for steal) µs per `what` of `count`.
pub fn cpu_line(cpu: &[CpuUse], count: u64, what: &str) -> String {
    let cpu: Vec<String> = (cpu.iter())
        .map(|c| match count > 0 && c.name != STEAL {
            true => {
                let us = c.cpu_seconds * 1e6 / count as f64;
                format!("{} {:.0}% {us:.1} µs", c.name, c.percent)
            }
            false => format!("{} {:.0}%", c.name, c.percent),
        })
        .collect();
    let cpu = cpu.join(", ");
    format!("cpu       {cpu} (100% = one core; µs of CPU per {what})")
}

/// Every scenario's report: name, when, where, setup, and its data in the same object.
#[derive(Debug, Clone, Serialize)]
pub struct Report<T> {
    pub scenario: &'static str,
    #[serde(flatten)]
    pub meta: Meta,
    /// What the load went to: "1 gate + 2 echo workers (launched)" or the URLs.
    pub setup: String,
    #[serde(flatten)]
    pub data: T,
}

/// A scenario's data as the headings, lines, tables and charts of a report.
pub trait Section {
    fn add_to(&self, doc: &mut Doc);
}

impl<T: Serialize + Section> Report<T> {
    pub fn new(scenario: &'static str, setup: String, data: T) -> Self {
        let meta = Meta::now();
        Report {
            scenario,
            meta,
            setup,
            data,
        }
    }

    /// Prints the report and writes the files `output` asks for.
    pub fn write(&self, output: &OutputArgs) -> anyhow::Result<()> {
        let title = format!("{} — {}", self.scenario, self.setup);
        let mut doc = Doc::new(title, self.meta.clone());
        self.data.add_to(&mut doc);
        output.write(self, &doc)
    }

    /// [`Report::write`], then the scenario's data, for its verdict.
    pub fn written(self, output: &OutputArgs) -> anyhow::Result<T> {
        self.write(output)?;
        Ok(self.data)
    }
}

/// When, where and how a report was made.
#[derive(Debug, Clone, Serialize)]
pub struct Meta {
    /// UTC.
    pub date: String,
    pub machine: Machine,
    /// The command line.
    pub command: String,
}

impl Meta {
    pub fn now() -> Self {
        let t = time::OffsetDateTime::now_utc();
        Meta {
            date: utc_text(t),
            machine: Machine::this(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
        }
    }

    pub fn line(&self) -> String {
        let (date, m) = (&self.date, &self.machine);
        let (cpus, model, gib, kernel) = (m.cpus, &m.cpu_model, m.memory_gib, &m.kernel);
        format!("{date} | {cpus} CPUs ({model}), {gib} GiB, Linux {kernel}")
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
}

impl Machine {
    fn this() -> Self {
        use procfs::Current as _;
        let memory = procfs::Meminfo::current().map_or(0, |m| m.mem_total);
        let cpu_info = procfs::CpuInfo::current().ok();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease");
        let model = cpu_info.as_ref().and_then(|c| c.model_name(0));
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model: model.unwrap_or_default().to_owned(),
            memory_gib: (memory as f64 / f64::from(1 << 30) * 10.0).round() / 10.0,
            kernel: release.unwrap_or_default().trim().to_owned(),
        }
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC`.
fn utc_text(t: time::OffsetDateTime) -> String {
    let (y, mo, d) = (t.year(), u8::from(t.month()), t.day());
    let (h, mi, s) = (t.hour(), t.minute(), t.second());
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} UTC")
}

/// Where a report goes, for every scenario.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Also write the report as JSON to this file (`-`: JSON on stdout instead of the
    /// text report).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write the report as a self-contained HTML page with charts.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// No progress bar on stderr.
    #[arg(long)]
    pub quiet: bool,
}

impl OutputArgs {
    /// Prints the report (text, or JSON with `--json -`) on stdout, the report being the
    /// tool's output and not a log line, and writes the files asked for.
    pub fn write(&self, data: &impl Serialize, doc: &Doc) -> anyhow::Result<()> {
        let stdout_json = self.json.as_deref() == Some(Path::new("-"));
        let out = if stdout_json {
            serde_json::to_string(data)? + "\n"
        } else {
            doc.text()
        };
        print_stdout(&out)?;
        if let Some(path) = self.json.as_ref().filter(|_| !stdout_json) {
            write_file(path, &serde_json::to_string_pretty(data)?)?;
        }
        if let Some(path) = &self.html {
            write_file(path, &doc.html())?;
        }
        Ok(())
    }
}

pub fn print_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .context("writing the report")
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A rounded number with thousands separators: 99,990.
pub fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < -0.5 { format!("-{out}") } else { out }
}

/// Milliseconds with three decimals, from microseconds.
pub fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Doc {
        let mut doc = Doc::new("concurrency <a&b>".into(), Meta::now());
        doc.heading("50 clients [gateway]");
        doc.lines(vec!["achieved 49,990 req/s".into()]);
        let mut table = Table::new(&["run", "p99"]);
        table.rows.push(vec!["50 clients".into(), "2.500".into()]);
        doc.table(table);
        let curve = vec![(0.0, 0.1), (1.0, 0.9), (2.0, 2.5)];
        doc.chart("Latency (ms)", XAxis::Nines, vec![("from schedule", curve)]);
        doc.chart("Empty", XAxis::Seconds, vec![]);
        doc
    }

    #[test]
    fn text_has_the_lines_and_a_markdown_table_but_no_chart() {
        let text = sample().text();
        assert!(text.starts_with("# concurrency <a&b>\n"), "{text}");
        assert!(text.contains("## 50 clients [gateway]\nachieved 49,990 req/s\n"));
        assert!(text.contains("| run | p99 |\n|---|---|\n| 50 clients | 2.500 |\n"));
        assert!(!text.contains("Latency (ms)"));
    }

    #[test]
    fn html_is_self_contained_and_escaped() {
        let page = sample().html();
        assert!(page.contains("<h1>concurrency &lt;a&amp;b&gt;</h1>"));
        assert_eq!(page.matches("<svg").count(), 2);
        assert!(page.contains("<polyline") && page.contains("99%") && page.contains("no data"));
        assert!(!page.contains("<script"), "no script");
        // Grid lines and legend marks are horizontal.
        let attr = |line: &str, name: &str| {
            let value = line.split_once(name)?.1;
            value.split('"').nth(1).map(str::to_owned)
        };
        for line in page.split("<line ").skip(1) {
            assert_eq!(attr(line, " y1="), attr(line, " y2="), "{line}");
        }
    }

    #[test]
    fn fields_keep_their_order_inline_flat_values_and_leave_lists_of_objects_out() {
        #[derive(Serialize)]
        struct Data {
            opened: u32,
            rate: f64,
            codes: std::collections::BTreeMap<u32, u64>,
            events: Vec<&'static str>,
            rows: Vec<Meta>,
            pid: Option<u32>,
        }
        let mut doc = Doc::new(String::new(), Meta::now());
        doc.fields(&Data {
            opened: 50,
            rate: 1.25,
            codes: [(200, 3), (503, 1)].into(),
            events: vec!["a", "b"],
            rows: vec![Meta::now()],
            pid: None,
        });
        let text = doc.text();
        let lines = "opened  50\nrate    1.2\ncodes   200 3, 503 1\nevents  a, b\npid     —\n";
        assert!(text.ends_with(lines), "{text}");
    }

    #[test]
    fn a_table_of_items_has_a_row_each_in_column_order() {
        let table = Table::of(
            [(1, "a"), (2, "b")],
            &[
                ("n", &|(n, _)| n.to_string()),
                ("name", &|(_, name)| (*name).to_owned()),
            ],
        );
        assert_eq!(table.columns, ["n", "name"]);
        assert_eq!(table.rows, [["1", "a"], ["2", "b"]]);
    }

    #[test]
    fn numbers_dates() {
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(thousands(-1_500.0), "-1,500");
        assert_eq!(ms(2_500.0), "2.500");
        let at = |secs| utc_text(time::OffsetDateTime::from_unix_timestamp(secs).unwrap());
        assert_eq!(at(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(at(1_795_000_000), "2026-11-18 11:06:40 UTC");
    }
}
