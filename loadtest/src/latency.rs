//! Latency recording: one HDR histogram per worker task (no shared lock on the hot path),
//! merged at the end into a [`Summary`] of the percentiles BENCHMARKS.md asks for.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Highest latency the histogram resolves; anything slower is clamped to it. A minute is
/// far beyond any request timeout the tools use, so clamping never hides a real value.
const MAX_TRACKABLE: Duration = Duration::from_secs(60);

/// Three significant digits: 0.1% error, which is below the run-to-run noise here.
const SIGNIFICANT_DIGITS: u8 = 3;

/// A latency histogram in nanoseconds.
#[derive(Debug, Clone)]
pub struct Recorder {
    histogram: Histogram<u64>,
}

impl Recorder {
    /// An empty recorder covering 1 ns ..= [`MAX_TRACKABLE`].
    pub fn new() -> Self {
        let high = u64::try_from(MAX_TRACKABLE.as_nanos()).unwrap_or(u64::MAX);
        let histogram = Histogram::new_with_bounds(1, high, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        Self { histogram }
    }

    /// Records one observation, clamped into the trackable range.
    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(nanos.max(1));
    }

    /// Folds another recorder's observations into this one.
    pub fn merge(&mut self, other: &Recorder) {
        // Both sides come from `new()` with identical bounds, so addition cannot overflow
        // the range; saturate defensively rather than fail a finished run.
        if self.histogram.add(&other.histogram).is_err() {
            for value in other.histogram.iter_recorded() {
                self.histogram
                    .saturating_record_n(value.value_iterated_to(), value.count_at_value());
            }
        }
    }

    /// Number of observations.
    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// Percentile summary; all zero when nothing was recorded.
    pub fn summary(&self) -> Summary {
        let h = &self.histogram;
        let at = |q: f64| Duration::from_nanos(h.value_at_quantile(q));
        Summary {
            count: h.len(),
            mean: Duration::from_nanos(h.mean().round() as u64),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p999: at(0.999),
            max: Duration::from_nanos(h.max()),
        }
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

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
        let mut r = Recorder::new();
        for us in 1..=1000 {
            r.record(Duration::from_micros(us));
        }
        let s = r.summary();
        assert_eq!(s.count, 1000);
        // 3 significant digits: within 0.1% of the exact value.
        let close = |got: Duration, want_us: u64| {
            let want = want_us as f64 * 1e3;
            (got.as_nanos() as f64 - want).abs() <= want * 0.001
        };
        assert!(close(s.p50, 500), "{s:?}");
        assert!(close(s.p99, 990), "{s:?}");
        assert!(close(s.max, 1000), "{s:?}");
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = Recorder::new();
        let mut b = Recorder::new();
        a.record(Duration::from_micros(10));
        b.record(Duration::from_micros(20));
        b.record(Duration::from_micros(30));
        a.merge(&b);
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn out_of_range_is_clamped_not_lost() {
        let mut r = Recorder::new();
        r.record(Duration::ZERO);
        r.record(Duration::from_secs(3600));
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn empty_summary_is_zero() {
        let s = Recorder::new().summary();
        assert_eq!(s.count, 0);
        assert_eq!(s.p99, Duration::ZERO);
    }

    #[test]
    fn micros_rounds_to_a_tenth() {
        assert_eq!(micros(Duration::from_nanos(840_449)), 840.4);
        assert_eq!(micros(Duration::from_nanos(840_450)), 840.5);
    }
}
