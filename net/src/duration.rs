//! The one way durations are written on every command line, environment variable and
//! config file of Shaddock: a number and a unit, Go-style and compound where it helps:
//! `250us`, `500ms`, `5s`, `1.5s`, `2m`, `1m30s`, `1h`. Units: `ns`, `us` (`µs`), `ms`,
//! `s`, `m` (`min`), `h`. A bare number is refused, but for `0`: `--heartbeat 10` could
//! mean seconds or milliseconds, and the gate's flags used to take milliseconds.
//!
//! nats-server writes its own durations as bare seconds too (`ping_interval: 120`), so
//! the broker, which takes nats-server's flags and config files, reads them with
//! [`parse_nats`]: this grammar, plus bare seconds.
//!
//! The gate's flags once took bare milliseconds under `-ms` names
//! (`--request-timeout-ms 5000`); [`MsFlags`] keeps those names working as deprecated
//! aliases of the new ones (`--request-timeout 5s`), environment variables included.

use std::ffi::OsString;
use std::time::Duration;

/// Parses a duration in Shaddock's grammar (see the module docs). A clap value parser.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.parse::<f64>().is_ok() {
        return Err(format!(
            "{text:?} has no unit: write e.g. {text}ms or {text}s"
        ));
    }
    units(text)
}

/// [`parse`], refusing zero: a zero timeout or interval would leave nothing to work with.
pub fn parse_positive(text: &str) -> Result<Duration, String> {
    let duration = parse(text)?;
    if duration.is_zero() {
        return Err(format!("{text:?} must be greater than zero"));
    }
    Ok(duration)
}

/// nats-server's durations: [`parse`]'s grammar, or bare (fractional) seconds.
pub fn parse_nats(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    match text.parse::<f64>() {
        Ok(seconds) => Duration::try_from_secs_f64(seconds)
            .map_err(|_| format!("{text:?} is not a duration in seconds")),
        Err(_) => units(text),
    }
}

/// One or more `<number><unit>` pairs, summed.
fn units(text: &str) -> Result<Duration, String> {
    let invalid = || format!("{text:?} is not a duration: write e.g. 500ms, 5s, 2m or 1m30s");
    if text.is_empty() {
        return Err(invalid());
    }
    let mut rest = text;
    let mut seconds = 0.0_f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        rest = &rest[unit_len..];
        seconds += number * unit;
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| invalid())
}

/// Flags renamed from `--<name>-ms <milliseconds>` to `--<name> <duration>`, with
/// their environment variables (`<PREFIX><NAME>_MS` to `<PREFIX><NAME>`).
pub struct MsFlags<'a> {
    /// The new names, without dashes: `request-timeout`.
    pub names: &'a [&'a str],
    /// The environment variables' prefix: `SHADDOCK_`.
    pub env_prefix: &'a str,
}

impl MsFlags<'_> {
    /// Rewrites the old forms in `args` (the program's arguments, program name first)
    /// to the new ones: `--x-ms 5000` and `--x-ms=5000` become `--x=5000ms`, and an old
    /// environment variable set where the new one is not becomes the flag (unless the
    /// command line gives it). Returns the arguments and one notice per old name used,
    /// for the caller to log once logging is up.
    pub fn rewrite(
        &self,
        args: impl IntoIterator<Item = OsString>,
        env: impl Fn(&str) -> Option<String>,
    ) -> (Vec<OsString>, Vec<String>) {
        let mut out = Vec::new();
        let mut notices = Vec::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let Some(text) = arg.to_str() else {
                out.push(arg);
                continue;
            };
            let renamed = self.names.iter().find_map(|name| {
                let old = format!("--{name}-ms");
                if text == old {
                    Some((name, None))
                } else {
                    text.strip_prefix(&format!("{old}="))
                        .map(|v| (name, Some(v.to_owned())))
                }
            });
            let Some((name, value)) = renamed else {
                out.push(arg);
                continue;
            };
            let value = value.or_else(|| args.next().and_then(|v| v.into_string().ok()));
            notices.push(format!(
                "--{name}-ms is deprecated: use --{name} (e.g. 500ms, 5s)"
            ));
            match value {
                Some(millis) => out.push(format!("--{name}={}", with_ms(&millis)).into()),
                // Left for the parser to refuse: the flag needs a value.
                None => out.push(format!("--{name}").into()),
            }
        }
        for name in self.names {
            let var = env_name(self.env_prefix, name);
            let given = out.iter().any(|a| {
                a.to_str().is_some_and(|a| {
                    a == format!("--{name}") || a.starts_with(&format!("--{name}="))
                })
            });
            if given || env(&var).is_some() {
                continue;
            }
            if let Some(millis) = env(&format!("{var}_MS")) {
                notices.push(format!(
                    "{var}_MS is deprecated: use {var} (e.g. 500ms, 5s)"
                ));
                out.push(format!("--{name}={}", with_ms(&millis)).into());
            }
        }
        (out, notices)
    }
}

/// An old `-ms` value in the new grammar: a whole number gets its unit; anything else is
/// passed on for the parser to refuse with its own message.
fn with_ms(millis: &str) -> String {
    let millis = millis.trim();
    if millis.parse::<u64>().is_ok() {
        format!("{millis}ms")
    } else {
        millis.to_owned()
    }
}

fn env_name(prefix: &str, name: &str) -> String {
    format!("{prefix}{}", name.replace('-', "_").to_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn units_are_required_fractions_and_compounds_are_fine() {
        assert_eq!(parse("500ms"), Ok(ms(500)));
        assert_eq!(parse("1.5s"), Ok(ms(1500)));
        assert_eq!(parse("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse("3min"), Ok(Duration::from_secs(180)));
        assert_eq!(parse(" 5s "), Ok(ms(5000)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "1.5", "5 s", "5sec", "ms", "s5", "-1s", "1e3ms"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse("5").unwrap_err().contains("no unit"));
    }

    #[test]
    fn positive_refuses_zero_in_any_unit() {
        assert!(parse_positive("0").is_err());
        assert!(parse_positive("0ms").is_err());
        assert_eq!(parse_positive("1ns"), Ok(Duration::from_nanos(1)));
    }

    #[test]
    fn nats_durations_are_bare_seconds_or_the_same_grammar() {
        assert_eq!(parse_nats("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_nats("0.5"), Ok(ms(500)));
        assert_eq!(parse_nats("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_nats("1m30s"), Ok(ms(90_000)));
        for bad in ["", "s", "10x", "-1", "1.2.3s", "m5", "soon"] {
            assert!(parse_nats(bad).is_err(), "{bad:?} accepted");
        }
    }

    fn rewrite(args: &[&str], env: &[(&str, &str)]) -> (Vec<String>, usize) {
        let flags = MsFlags {
            names: &["request-timeout", "heartbeat"],
            env_prefix: "SHADDOCK_",
        };
        let env = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let (out, notices) = flags.rewrite(args.iter().map(OsString::from), env);
        let out = out.into_iter().map(|a| a.into_string().unwrap()).collect();
        (out, notices.len())
    }

    #[test]
    fn old_ms_flags_become_the_new_ones_with_a_notice_each() {
        let (out, notices) = rewrite(
            &[
                "gate",
                "--request-timeout-ms",
                "5000",
                "--heartbeat-ms=250",
                "--x",
                "1",
            ],
            &[],
        );
        assert_eq!(
            out,
            [
                "gate",
                "--request-timeout=5000ms",
                "--heartbeat=250ms",
                "--x",
                "1"
            ]
        );
        assert_eq!(notices, 2);
        // New forms pass untouched; a bad old value is left for the parser to refuse.
        let (out, notices) = rewrite(
            &["gate", "--heartbeat", "2s", "--request-timeout-ms=x"],
            &[],
        );
        assert_eq!(out, ["gate", "--heartbeat", "2s", "--request-timeout=x"]);
        assert_eq!(notices, 1);
        let (out, _) = rewrite(&["gate", "--heartbeat-ms"], &[]);
        assert_eq!(out, ["gate", "--heartbeat"]);
    }

    #[test]
    fn old_environment_variables_apply_only_where_nothing_newer_says_otherwise() {
        let old = [
            ("SHADDOCK_REQUEST_TIMEOUT_MS", "700"),
            ("SHADDOCK_HEARTBEAT_MS", "9"),
        ];
        let (out, notices) = rewrite(&["gate"], &old);
        assert_eq!(out, ["gate", "--request-timeout=700ms", "--heartbeat=9ms"]);
        assert_eq!(notices, 2);
        // The command line, or the new variable, wins over the old variable.
        let newer = [
            ("SHADDOCK_REQUEST_TIMEOUT_MS", "700"),
            ("SHADDOCK_REQUEST_TIMEOUT", "1s"),
            ("SHADDOCK_HEARTBEAT_MS", "9"),
        ];
        let (out, notices) = rewrite(&["gate", "--heartbeat", "1s"], &newer);
        assert_eq!(out, ["gate", "--heartbeat", "1s"]);
        assert_eq!(notices, 0);
    }
}
