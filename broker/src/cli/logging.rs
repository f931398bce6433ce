//! Log output in nats-server's line format, `[PID] YYYY/MM/DD HH:MM:SS.micros [INF] text`.
//!
//! Harnesses written for nats-server read its log: they find the port in
//! `Listening for client connections on HOST:PORT`, wait for `Server is ready`, and some
//! treat lines without `[INF]` as errors. Writing the same shape lets them start this
//! broker unchanged. Timestamps are UTC (nats-server's `logtime_utc`), which needs no
//! time-zone database.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, anyhow};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Installs the global tracing subscriber: to `log_file` (appended to) if given, else
/// to stderr, where nats-server logs too.
///
/// `level` is what `-D`/`-V` asked for; without them `RUST_LOG` applies, else `info`.
pub fn init_logging(log_file: Option<&Path>, level: Option<Level>) -> anyhow::Result<()> {
    let filter = match (level, std::env::var("RUST_LOG")) {
        (Some(level), _) => EnvFilter::new(level.as_str()),
        (None, Ok(directives)) => {
            EnvFilter::try_new(&directives).with_context(|| format!("RUST_LOG={directives}"))?
        }
        (None, Err(_)) => EnvFilter::new("info"),
    };
    let writer = match log_file {
        Some(path) => {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening log file {}", path.display()))?;
            BoxMakeWriter::new(Mutex::new(file))
        }
        None => BoxMakeWriter::new(std::io::stderr),
    };
    tracing_subscriber::fmt()
        // Colour codes only for a person at a terminal, never in files or harness pipes.
        .with_ansi(log_file.is_none() && std::io::stderr().is_terminal())
        .event_format(NatsFormat::new())
        .with_writer(writer)
        .with_env_filter(filter)
        .try_init()
        .map_err(|error| anyhow!("installing the log subscriber: {error}"))
}

/// The event formatter: nats-server's prefix, then span context and fields.
struct NatsFormat {
    pid: u32,
}

impl NatsFormat {
    fn new() -> Self {
        NatsFormat {
            pid: std::process::id(),
        }
    }
}

impl<S, N> FormatEvent<S, N> for NatsFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut prefix = String::with_capacity(48);
        write_timestamp(&mut prefix, SystemTime::now())?;
        let tag = level_tag(*event.metadata().level());
        write!(writer, "[{}] {prefix} [{tag}] ", self.pid)?;
        // Span context (e.g. a connection's cid) says which peer a line is about.
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                write!(writer, "{}", span.name())?;
                let extensions = span.extensions();
                match extensions.get::<FormattedFields<N>>() {
                    Some(fields) if !fields.is_empty() => write!(writer, "{{{fields}}}")?,
                    _ => {}
                }
                write!(writer, ": ")?;
            }
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// nats-server's three-letter level tags.
fn level_tag(level: Level) -> &'static str {
    match level {
        Level::ERROR => "ERR",
        Level::WARN => "WRN",
        Level::INFO => "INF",
        Level::DEBUG => "DBG",
        Level::TRACE => "TRC",
    }
}

fn write_timestamp(out: &mut String, now: SystemTime) -> std::fmt::Result {
    // A clock before 1970 is a broken clock; printing the epoch beats failing to log.
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since_epoch.as_secs();
    let (year, month, day) = civil_from_days(secs / 86_400);
    let of_day = secs % 86_400;
    write!(
        out,
        "{year:04}/{month:02}/{day:02} {:02}:{:02}:{:02}.{:06}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        since_epoch.subsec_micros()
    )
}

/// Days since 1970-01-01 to a (year, month, day) date, proleptic Gregorian; Howard
/// Hinnant's `civil_from_days`, restricted to dates after the epoch.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_convert_across_leap_days_and_year_ends() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_088), (2024, 12, 31));
        assert_eq!(civil_from_days(20_089), (2025, 1, 1));
    }

    #[test]
    fn timestamps_look_like_nats_servers() {
        let at = UNIX_EPOCH + Duration::from_micros(1_732_084_467_901_380);
        let mut out = String::new();
        assert!(write_timestamp(&mut out, at).is_ok());
        assert_eq!(out, "2024/11/20 06:34:27.901380");
    }
}
