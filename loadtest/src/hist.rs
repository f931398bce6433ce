//! The load tester's one latency histogram: HDR, nanoseconds, 3 significant digits, and
//! the figures every report prints ([`Summary`], in microseconds).

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest value resolved; slower is clamped. Far above any request timeout allowed.
const MAX_TRACKABLE_NS: u64 = 120_000_000_000;
/// 0.1 % error: below the run-to-run noise of any figure reported.
const SIGNIFICANT_DIGITS: u8 = 3;
/// Points on the percentile curve: tenths of a "nine", up to 5 nines (99.999 %).
const CURVE_STEPS_PER_NINE: u32 = 10;
const CURVE_NINES: u32 = 5;

#[derive(Debug, Clone)]
pub struct Hist(Histogram<u64>);

impl Default for Hist {
    fn default() -> Self {
        Self::new()
    }
}

impl Hist {
    pub fn new() -> Self {
        // The counts array is touched only where values land: mostly lazily committed.
        let histogram = Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, SIGNIFICANT_DIGITS);
        Hist(histogram.expect("valid bounds"))
    }

    /// 2 significant digits from 1 µs (~22 KB instead of ~220 KB): for the per-second
    /// timeline, where a client allocates one a second.
    pub fn coarse() -> Self {
        Hist(Histogram::new_with_bounds(1_000, MAX_TRACKABLE_NS, 2).expect("valid bounds"))
    }

    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.0.saturating_record(ns.max(1));
    }

    pub fn record_us(&mut self, us: u64) {
        self.0.saturating_record(us.saturating_mul(1_000).max(1));
    }

    pub fn merge(&mut self, other: &Hist) {
        // Same bounds on both sides, so `add` cannot fail; saturate rather than lose a run.
        if self.0.add(&other.0).is_err() {
            self.record_counts(&other.counts());
        }
    }

    /// Each value recorded and its count: a histogram as a load process sends it.
    pub fn counts(&self) -> Vec<(u64, u64)> {
        let recorded = self.0.iter_recorded();
        recorded
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect()
    }

    /// Records what [`Hist::counts`] gave.
    pub fn record_counts(&mut self, counts: &[(u64, u64)]) {
        for (value, count) in counts {
            self.0.saturating_record_n(*value, *count);
        }
    }

    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value at quantile `q` (0..=1); zero when empty.
    pub fn at(&self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.0.value_at_quantile(q))
    }

    pub fn summary(&self) -> Summary {
        if self.0.is_empty() {
            return Summary::default();
        }
        Summary {
            count: self.0.len(),
            mean_us: micros(Duration::from_nanos(self.0.mean().round() as u64)),
            p50_us: micros(self.at(0.50)),
            p90_us: micros(self.at(0.90)),
            p99_us: micros(self.at(0.99)),
            p999_us: micros(self.at(0.999)),
            max_us: micros(Duration::from_nanos(self.0.max())),
        }
    }

    /// The percentile curve as `(nines, µs)` points, nines = -log10(1 - q): 2 is p99.
    /// It stops where the samples run out (1/len) and ends at the maximum.
    pub fn curve(&self) -> Vec<(f64, f64)> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let len = self.0.len() as f64;
        let resolved = len.log10().clamp(1.0, f64::from(CURVE_NINES));
        let mut points: Vec<(f64, f64)> = (0..=CURVE_NINES * CURVE_STEPS_PER_NINE)
            .map(|i| f64::from(i) / f64::from(CURVE_STEPS_PER_NINE))
            .take_while(|nines| *nines <= resolved)
            .map(|nines| (nines, micros(self.at(1.0 - 10f64.powf(-nines)))))
            .collect();
        points.push((resolved, micros(Duration::from_nanos(self.0.max()))));
        points
    }
}

/// A histogram in a report is its summary.
impl Serialize for Hist {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.summary().serialize(serializer)
    }
}

/// The figures every latency line of a report shows, in microseconds (0.1 µs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// Microseconds with 0.1 µs resolution, the unit of every `*_us` JSON field.
pub fn micros(d: Duration) -> f64 {
    (d.as_nanos() as f64 / 100.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() <= want * 0.001 + 0.1
    }

    fn uniform() -> Hist {
        let mut h = Hist::new();
        for us in 1..=1000 {
            h.record(Duration::from_micros(us));
        }
        h
    }

    #[test]
    fn summary_of_a_uniform_run() {
        let s = uniform().summary();
        assert_eq!(s.count, 1000);
        let (mean, p50, p99, max) = (s.mean_us, s.p50_us, s.p99_us, s.max_us);
        for (got, want) in [(mean, 500.5), (p50, 500.0), (p99, 990.0), (max, 1000.0)] {
            assert!(close(got, want), "{s:?}");
        }
        assert_eq!(Hist::new().summary(), Summary::default());
    }

    #[test]
    fn merged_parts_equal_one_histogram_and_units_agree() {
        let (mut all, mut a, mut b) = (Hist::new(), Hist::new(), Hist::new());
        for i in 0..3000u64 {
            let d = Duration::from_micros(1 + (i * 7919) % 5000);
            all.record(d);
            if i % 2 == 0 {
                a.record(d)
            } else {
                b.record_us(d.as_micros() as u64)
            }
        }
        a.merge(&b);
        assert_eq!(a.summary(), all.summary());
        assert_eq!(micros(Duration::from_nanos(840_450)), 840.5);
    }
}
