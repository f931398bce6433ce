//! The gate's load-shedding metrics, read through a recorder installed for this test
//! binary alone (a global recorder can be set once per process, hence a file of its
//! own): a refusal counts once under its reason, and `gate_in_flight`, sampled rather
//! than moved per request, shows a request awaiting its worker.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Bus, FullGate, within};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use proto::code;

/// Counters and gauges by `name{label=value,...}`. Reading a snapshot zeroes what it
/// read, so counters are added up across reads and gauges hold their last reading.
#[derive(Default)]
struct Seen(HashMap<String, f64>);

impl Seen {
    fn read(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let name = broker::testing::series(key.key());
            match value {
                DebugValue::Counter(n) => *self.0.entry(name).or_default() += n as f64,
                DebugValue::Gauge(v) => {
                    self.0.insert(name, v.into_inner());
                }
                DebugValue::Histogram(_) => {}
            }
        }
    }

    fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or_default()
    }

    /// Reads until `name` is `want` (the gauge is sampled every 500 ms). A gauge reads 0
    /// once read, so only a non-zero `want` proves a sample.
    async fn until(&mut self, snapshotter: &Snapshotter, name: &str, want: f64) {
        within(async {
            loop {
                self.read(snapshotter);
                if self.get(name) == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_by_reason_and_in_flight_is_sampled() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let mut seen = Seen::default();

    let bus = Bus::embedded().await;
    let mut full = FullGate::start(&bus).await;
    let raw = &mut full.raw;
    seen.until(&snapshotter, "gate_in_flight{}", 1.0).await;

    for id in 2..=4 {
        raw.request(id, "park.who", "").await;
        assert_eq!(raw.response().await.code, code::UNAVAILABLE);
    }
    raw.request(5, "no route here", "").await;
    assert_eq!(raw.response().await.code, code::BAD_REQUEST);
    seen.read(&snapshotter);
    assert_eq!(seen.get("gate_rejected_total{reason=gate_in_flight}"), 3.0);
    assert_eq!(seen.get("gate_rejected_total{reason=route}"), 1.0);
    assert_eq!(seen.get("gate_rejected_total{reason=rate}"), 0.0);

    full.release();
    assert_eq!(full.raw.response().await.code, code::OK);
}
