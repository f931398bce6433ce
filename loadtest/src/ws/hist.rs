//! Latency histograms for the WebSocket load test: HDR, nanoseconds, 3 significant
//! digits, with the figures a report prints ([`Summary`]) and the percentile curve an
//! HTML chart draws.
//!
//! The one histogram type of the load tools: the WebSocket scenarios summarise it in
//! microseconds ([`Summary`], serialisable for `--json`) and as a percentile curve; the
//! bus tools as durations ([`crate::latency::Summary::of`]).

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::latency::micros;

/// Highest value resolved; slower is clamped. Far above any request timeout the load
/// test allows, so clamping never hides a real value.
const MAX_TRACKABLE_NS: u64 = 120_000_000_000;

/// 0.1% error: below the run-to-run noise of any figure reported.
const SIGNIFICANT_DIGITS: u8 = 3;

/// Precision of [`Hist::coarse`].
const COARSE_DIGITS: u8 = 2;

/// Points on the percentile curve: 0, 0.1, ... 5 "nines" (0% to 99.999%).
const CURVE_STEPS_PER_NINE: u32 = 10;
const CURVE_NINES: u32 = 5;

/// One latency distribution.
#[derive(Debug, Clone)]
pub struct Hist {
    h: Histogram<u64>,
}

impl Default for Hist {
    fn default() -> Self {
        Self::new()
    }
}

impl Hist {
    pub fn new() -> Self {
        // Pages of the counts array are only touched where values land, so the
        // ~220 KB per histogram is mostly untouched (lazily committed) memory.
        let h = Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        Hist { h }
    }

    /// A small histogram for the per-second timeline: 2 significant digits (1%) from
    /// 1 µs, ~22 KB instead of ~220 KB, so a client can keep a few seconds open and
    /// allocate one per second without touching the allocator's mmap path.
    pub fn coarse() -> Self {
        let h = Histogram::new_with_bounds(1_000, MAX_TRACKABLE_NS, COARSE_DIGITS)
            .expect("constant histogram bounds are valid");
        Hist { h }
    }

    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.h.saturating_record(ns.max(1));
    }

    pub fn record_us(&mut self, us: u64) {
        self.h.saturating_record(us.saturating_mul(1_000).max(1));
    }

    pub fn merge(&mut self, other: &Hist) {
        // Identical bounds on both sides: `add` cannot fail; saturate rather than lose a
        // finished run if it ever does.
        if self.h.add(&other.h).is_err() {
            for v in other.h.iter_recorded() {
                self.h
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
    }

    pub fn len(&self) -> u64 {
        self.h.len()
    }

    pub fn is_empty(&self) -> bool {
        self.h.is_empty()
    }

    /// The value at quantile `q` (0..=1); zero when empty.
    pub fn at(&self, q: f64) -> Duration {
        if self.h.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.h.value_at_quantile(q))
    }

    /// The mean; zero when empty.
    pub fn mean(&self) -> Duration {
        Duration::from_nanos(self.h.mean().round() as u64)
    }

    pub fn summary(&self) -> Summary {
        if self.h.is_empty() {
            return Summary::default();
        }
        let us = |d: Duration| micros(d);
        Summary {
            count: self.h.len(),
            mean_us: us(self.mean()),
            p50_us: us(self.at(0.50)),
            p90_us: us(self.at(0.90)),
            p99_us: us(self.at(0.99)),
            p999_us: us(self.at(0.999)),
            max_us: us(Duration::from_nanos(self.h.max())),
        }
    }

    /// The percentile curve as `[nines, microseconds]` points, nines = -log10(1 - q):
    /// 0 is the minimum, 2 is p99, 3 is p99.9. Ends at the maximum.
    pub fn curve(&self) -> Vec<[f64; 2]> {
        if self.h.is_empty() {
            return Vec::new();
        }
        let mut points: Vec<[f64; 2]> = (0..=CURVE_NINES * CURVE_STEPS_PER_NINE)
            .map(|i| {
                let nines = f64::from(i) / f64::from(CURVE_STEPS_PER_NINE);
                let q = 1.0 - 10f64.powf(-nines);
                [nines, micros(self.at(q))]
            })
            .collect();
        // Past the last sample the curve is flat at the maximum: stop where the samples
        // run out (1/len) so a short run does not draw a long invented plateau.
        let resolved = (self.h.len() as f64).log10();
        points.retain(|p| p[0] <= resolved.max(1.0));
        points.push([
            resolved.max(1.0).min(f64::from(CURVE_NINES)),
            micros(Duration::from_nanos(self.h.max())),
        ]);
        points
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

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() <= want * 0.001 + 0.1
    }

    #[test]
    fn summary_of_a_uniform_run() {
        let mut h = Hist::new();
        for us in 1..=1000 {
            h.record(Duration::from_micros(us));
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!(close(s.mean_us, 500.5), "{s:?}");
        assert!(close(s.p50_us, 500.0), "{s:?}");
        assert!(close(s.p90_us, 900.0), "{s:?}");
        assert!(close(s.p99_us, 990.0), "{s:?}");
        assert!(close(s.p999_us, 999.0), "{s:?}");
        assert!(close(s.max_us, 1000.0), "{s:?}");
    }

    #[test]
    fn merging_per_client_histograms_equals_recording_into_one() {
        let mut all = Hist::new();
        let mut parts = vec![Hist::new(), Hist::new(), Hist::new()];
        for i in 0..3000u64 {
            let d = Duration::from_micros(1 + (i * 7919) % 5000);
            all.record(d);
            parts[(i % 3) as usize].record(d);
        }
        let mut merged = Hist::new();
        for p in &parts {
            merged.merge(p);
        }
        assert_eq!(merged.summary(), all.summary());
    }

    #[test]
    fn microseconds_and_durations_land_in_the_same_place() {
        let mut a = Hist::new();
        let mut b = Hist::new();
        a.record_us(250);
        b.record(Duration::from_micros(250));
        assert_eq!(a.summary(), b.summary());
    }

    #[test]
    fn coarse_histograms_merge_and_are_within_one_percent() {
        let mut a = Hist::coarse();
        let mut b = Hist::coarse();
        a.record(Duration::from_micros(3_000));
        b.record(Duration::from_micros(40));
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.count, 2);
        assert!((s.max_us - 3_000.0).abs() <= 30.0, "{s:?}");
    }

    #[test]
    fn empty_is_all_zero() {
        let h = Hist::new();
        assert_eq!(h.summary(), Summary::default());
        assert!(h.curve().is_empty());
        assert_eq!(h.at(0.99), Duration::ZERO);
    }

    #[test]
    fn curve_rises_to_the_maximum_within_the_resolved_nines() {
        let mut h = Hist::new();
        for us in 1..=1000 {
            h.record(Duration::from_micros(us));
        }
        let curve = h.curve();
        assert!(curve.windows(2).all(|w| w[0][1] <= w[1][1]), "{curve:?}");
        // 1,000 samples resolve 3 nines (p99.9), not 5.
        assert!(curve.iter().all(|p| p[0] <= 3.0), "{curve:?}");
        assert!(close(curve[curve.len() - 1][1], 1000.0));
        assert!(close(curve[0][1], 1.0));
    }
}
