//! Latency figures of the bus tools: the percentiles BENCHMARKS.md asks for, as
//! durations, from the load test's one HDR histogram type ([`Hist`]), and the units
//! their reports print.

use std::time::Duration;

use crate::ws::hist::Hist;

/// The latency figures a report prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub count: u64,
    pub mean: Duration,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
}

impl Summary {
    /// The figures of `h`; all zero when nothing was recorded.
    pub fn of(h: &Hist) -> Summary {
        Summary {
            count: h.len(),
            mean: h.mean(),
            p50: h.at(0.50),
            p90: h.at(0.90),
            p99: h.at(0.99),
            p999: h.at(0.999),
            max: h.at(1.0),
        }
    }
}

/// Microseconds with 0.1 µs resolution, the unit of every `*_us` JSON field.
pub fn micros(d: Duration) -> f64 {
    (d.as_nanos() as f64 / 100.0).round() / 10.0
}

/// Milliseconds to three decimals for human-readable reports.
pub fn millis_text(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_uniform_run() {
        let mut h = Hist::new();
        for us in 1..=1000 {
            h.record(Duration::from_micros(us));
        }
        let s = Summary::of(&h);
        assert_eq!(s.count, 1000);
        // 3 significant digits: within 0.1% of the exact value.
        let close = |got: Duration, want_us: f64| {
            let want = want_us * 1e3;
            (got.as_nanos() as f64 - want).abs() <= want * 0.001
        };
        assert!(close(s.mean, 500.5), "{s:?}");
        assert!(close(s.p50, 500.0), "{s:?}");
        assert!(close(s.p99, 990.0), "{s:?}");
        assert!(close(s.max, 1000.0), "{s:?}");
    }

    #[test]
    fn empty_summary_is_zero() {
        let s = Summary::of(&Hist::new());
        assert_eq!(s.count, 0);
        assert_eq!(
            (s.mean, s.p99, s.max),
            (Duration::ZERO, Duration::ZERO, Duration::ZERO)
        );
    }

    #[test]
    fn micros_rounds_to_a_tenth() {
        assert_eq!(micros(Duration::from_nanos(840_449)), 840.4);
        assert_eq!(micros(Duration::from_nanos(840_450)), 840.5);
    }
}
