//! `churn`: what each closed session leaves behind, in each process (issue #34;
//! docs/benchmarks.md "Session churn"). Every RSS reading is taken with no session open,
//! so it counts what closed sessions left: a server that keeps nothing per closed
//! session levels off after the warm-up, one that leaks grows by the same bytes for
//! every session (`bytes_per_session`).

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use sdk::{Client, ClientOptions};
use serde::Serialize;
use tokio::task::JoinSet;

use super::broadcast::{expect_ok, login_and_join};
use super::target::{Gates, ServiceKind, TargetArgs, with_topology};
use crate::proc::rss_bytes;
use crate::report::{Doc, OutputArgs, Report, Section, Table};

/// Flags of `shaddock loadtest churn`.
#[derive(Debug, clap::Args)]
pub struct ChurnArgs {
    /// Sessions to open and close in all.
    #[arg(long, default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub sessions: u64,
    /// Sessions in progress at once.
    #[arg(long, default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub concurrency: u64,
    /// Sessions started per second at most; 0: as fast as --concurrency allows.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// What each session does, comma-separated, in order: `echo` (one `echo.raw`), `chat`
    /// (`chat.login`, `chat.join`); a launched topology runs a worker of each (not --service).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "echo")]
    pub mix: Vec<ServiceKind>,
    /// Rooms the chat sessions spread over (session i joins room i mod N).
    #[arg(long, default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rooms: u64,
    /// Sessions before the after-warm-up reading, from which growth is counted.
    #[arg(long, default_value_t = 10_000)]
    pub warmup: u64,
    /// Idle time, no session open, before the after-warm-up reading and the last: the
    /// allocator gives back what the last sessions freed within a second or two, so growth
    /// counts what sessions left behind. `0`: read at once, as the readings between do.
    #[arg(long, default_value = "3s", value_parser = net::duration::parse)]
    pub settle: Duration,
    /// Readings between the warm-up and the end, evenly spaced by sessions.
    #[arg(long, default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub samples: u64,
    /// How long a session's handshake and each of its requests may take.
    #[arg(long, default_value = "5s", value_parser = net::duration::parse)]
    pub timeout: Duration,
    /// A process to read besides the launched ones, `NAME=PID`, repeatable (with --url,
    /// the gate and workers given by pid).
    #[arg(long, value_name = "NAME=PID", value_parser = parse_named_pid)]
    pub pid: Vec<(String, u32)>,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn parse_named_pid(text: &str) -> Result<(String, u32), String> {
    let split = text.split_once('=');
    let (name, pid) = split.ok_or_else(|| format!("{text:?} is not NAME=PID"))?;
    let pid = pid.parse().map_err(|e| format!("pid {pid:?}: {e}"))?;
    Ok((name.to_owned(), pid))
}

/// One process's resident memory over a run.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessRss {
    pub name: String,
    pub pid: u32,
    /// Before the first session.
    pub first: u64,
    /// After the warm-up's sessions closed, and the settle time.
    pub after_warmup: u64,
    /// After the last session closed, and the settle time.
    pub last: u64,
    /// `last - after_warmup` (negative when memory went back to the system).
    pub growth_after_warmup: i64,
    /// The growth after the warm-up over the sessions after it.
    pub bytes_per_session: f64,
}

/// One reading: every process's RSS once `sessions` had closed.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub sessions: u64,
    pub elapsed_s: f64,
    /// In the order of [`ChurnReport::processes`].
    pub rss: Vec<u64>,
}

impl Sample {
    fn new(sessions: u64, elapsed_s: f64, rss: Vec<u64>) -> Self {
        Sample {
            sessions,
            elapsed_s,
            rss,
        }
    }
}

/// What one churn run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChurnReport {
    pub mix: Vec<&'static str>,
    pub sessions: u64,
    pub concurrency: u64,
    pub rate: u64,
    pub warmup: u64,
    pub settle_s: f64,
    /// Sessions that did all their steps.
    pub ok: u64,
    pub failed: u64,
    pub first_error: Option<String>,
    pub elapsed_s: f64,
    pub sessions_per_s: f64,
    pub processes: Vec<ProcessRss>,
    pub samples: Vec<Sample>,
}

/// Runs the scenario: 1 gate and one worker per service of the mix unless told otherwise.
pub async fn churn(args: ChurnArgs) -> anyhow::Result<()> {
    // A launched topology runs one worker of each service the mix uses.
    let mut services = args.mix.clone();
    services.sort();
    services.dedup();
    ensure!(!services.is_empty(), "--mix needs at least one step");
    let (warmup, sessions) = (args.warmup, args.sessions);
    let why = format!("--warmup ({warmup}) must be below --sessions ({sessions})");
    ensure!(warmup < sessions, why);
    let (gates, topology) = args.target.launch(1, 1, &services, false).await?;
    let report = with_topology(topology, run(&args, &gates)).await?;
    let report = Report::new("churn", gates.setup.clone(), report).written(&args.output)?;
    let why = report.first_error.unwrap_or_default();
    ensure!(report.ok > 0, "no session did its steps: {why}");
    Ok(())
}

/// Where the readings fall: after the warm-up, `samples` between, and the end.
fn reading_points(sessions: u64, warmup: u64, samples: u64) -> Vec<u64> {
    let span = sessions - warmup;
    let between = (1..=samples).map(|k| warmup + span * k / (samples + 1));
    let mut points: Vec<u64> = std::iter::once(warmup).chain(between).collect();
    points.push(sessions);
    points.dedup();
    points
}

async fn run(args: &ChurnArgs, gates: &Gates) -> anyhow::Result<ChurnReport> {
    // The launched processes (not this one) and those given by --pid.
    let own = std::process::id();
    let processes: Vec<(String, u32)> = (gates.watched.iter())
        .filter(|w| w.pid != own)
        .map(|w| (w.name.clone(), w.pid))
        .chain(args.pid.iter().cloned())
        .collect();
    let why = "no process to read: launch a topology (no --url) or name them with --pid NAME=PID";
    ensure!(!processes.is_empty(), why);
    let read =
        |(name, pid): &(String, u32)| rss_bytes(*pid).context(format!("reading VmRSS of {name}"));
    let read_all = || -> anyhow::Result<Vec<u64>> { processes.iter().map(read).collect() };
    let urls = &gates.urls;
    ensure!(!urls.is_empty(), "no gate URL");
    let options = ClientOptions {
        request_timeout: args.timeout,
        connect_timeout: args.timeout,
        tls: gates.tls.clone(),
        ..ClientOptions::default()
    };
    // Names of this run's players: another run on the same gates must not take them.
    let run_tag = format!("{own:x}");
    let began = Instant::now();
    let mut samples = vec![Sample::new(0, 0.0, read_all()?)];
    let mut pace = (args.rate > 0).then(|| {
        let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate as f64));
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        pace
    });
    let concurrency = usize::try_from(args.concurrency)?;
    let (mut ok, mut failed, mut first_error) = (0u64, 0u64, None);
    let mut running = JoinSet::new();
    let mut started = 0u64;
    let mut idle = Duration::ZERO;
    for point in reading_points(args.sessions, args.warmup, args.samples) {
        while started < point || !running.is_empty() {
            if started < point && running.len() < concurrency {
                if let Some(pace) = pace.as_mut() {
                    pace.tick().await;
                }
                let url = urls[(started % urls.len() as u64) as usize].clone();
                let name = format!("churn-{run_tag}-{started}");
                let room = format!("churn-{}", started % args.rooms);
                let (options, mix) = (options.clone(), args.mix.clone());
                running.spawn(session(url, options, mix, name, room));
                started += 1;
                continue;
            }
            let Some(joined) = running.join_next().await else {
                continue;
            };
            match joined.map_err(anyhow::Error::from).and_then(|done| done) {
                Ok(()) => ok += 1,
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
        if point == args.warmup || point == args.sessions {
            tokio::time::sleep(args.settle).await;
            idle += args.settle;
        }
        let elapsed = began.elapsed().as_secs_f64();
        samples.push(Sample::new(point, elapsed, read_all()?));
        tracing::info!("churn: {point} of {} sessions closed", args.sessions);
    }
    let elapsed_s = began.elapsed().as_secs_f64();
    let at_warmup = (samples.iter().position(|s| s.sessions == args.warmup)).unwrap_or(0);
    let last = samples.len() - 1;
    let after = (args.sessions - args.warmup) as f64;
    let processes = (processes.iter().enumerate())
        .map(|(i, (name, pid))| {
            let (after_warmup, end) = (samples[at_warmup].rss[i], samples[last].rss[i]);
            let growth = end as i64 - after_warmup as i64;
            ProcessRss {
                name: name.clone(),
                pid: *pid,
                first: samples[0].rss[i],
                after_warmup,
                last: end,
                growth_after_warmup: growth,
                bytes_per_session: growth as f64 / after,
            }
        })
        .collect();
    Ok(ChurnReport {
        mix: args.mix.iter().map(|s| s.name()).collect(),
        sessions: args.sessions,
        concurrency: args.concurrency,
        rate: args.rate,
        warmup: args.warmup,
        settle_s: args.settle.as_secs_f64(),
        ok,
        failed,
        first_error,
        elapsed_s,
        sessions_per_s: args.sessions as f64 / (elapsed_s - idle.as_secs_f64()),
        processes,
        samples,
    })
}

/// One session of the churn, from handshake to close, doing the steps of `mix`.
async fn session(
    url: String,
    options: ClientOptions,
    mix: Vec<ServiceKind>,
    name: String,
    room: String,
) -> anyhow::Result<()> {
    let client = Client::connect(&url, options).await;
    let client = client.with_context(|| format!("connecting {url}"))?;
    let mut done = Ok(());
    for step in &mix {
        done = match step {
            ServiceKind::Echo => (client.request("echo.raw", b"churn").await)
                .map_err(Into::into)
                .and_then(expect_ok),
            ServiceKind::Chat => login_and_join(&client, name.clone(), &room).await,
        };
        if done.is_err() {
            break;
        }
    }
    client.close().await;
    done
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

impl Section for ChurnReport {
    fn add_to(&self, doc: &mut Doc) {
        doc.fields(self);
        let after = format!("after {} sessions", self.warmup);
        let in_mib = |bytes: u64| format!("{:.1} MiB", mib(bytes));
        doc.table(Table::of(
            &self.processes,
            &[
                ("process", &|p| p.name.clone()),
                ("RSS first", &|p| in_mib(p.first)),
                (&after, &|p| in_mib(p.after_warmup)),
                ("last", &|p| in_mib(p.last)),
                ("growth after warm-up", &|p| {
                    format!("{:+.0} KiB", p.growth_after_warmup as f64 / 1024.0)
                }),
                ("bytes/session", &|p| format!("{:.1}", p.bytes_per_session)),
            ],
        ));
        doc.heading("RSS (MiB) by sessions closed");
        let mut columns = vec!["sessions closed".to_owned(), "s".to_owned()];
        columns.extend(self.processes.iter().map(|p| p.name.clone()));
        let rows = self.samples.iter().map(|s| {
            let mut row = vec![s.sessions.to_string(), format!("{:.1}", s.elapsed_s)];
            row.extend(s.rss.iter().map(|&b| format!("{:.1}", mib(b))));
            row
        });
        doc.table(Table {
            columns,
            rows: rows.collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_start_at_the_warmup_and_end_at_the_last_session() {
        assert_eq!(reading_points(100, 20, 3), vec![20, 40, 60, 80, 100]);
        assert_eq!(reading_points(10, 9, 4), vec![9, 10]);
        assert_eq!(reading_points(10, 0, 0), vec![0, 10]);
    }

    #[test]
    fn the_text_report_gives_each_process_s_rss_in_mib_and_its_growth() {
        let mib = 1024 * 1024;
        let report = ChurnReport {
            warmup: 10,
            processes: vec![ProcessRss {
                name: "up".into(),
                pid: 1,
                first: 20 * mib,
                after_warmup: 23 * mib,
                last: 23 * mib + 512 * 1024,
                growth_after_warmup: 512 * 1024,
                bytes_per_session: 52428.8,
            }],
            samples: vec![Sample::new(10, 0.5, vec![23 * mib])],
            ..ChurnReport::default()
        };
        let mut doc = Doc::new("churn".into(), crate::report::Meta::now());
        report.add_to(&mut doc);
        let text = doc.text();
        let row = "| up | 20.0 MiB | 23.0 MiB | 23.5 MiB | +512 KiB | 52428.8 |";
        assert!(text.contains(row), "{text}");
        assert!(text.contains("| 10 | 0.5 | 23.0 |"), "{text}");
    }
}
