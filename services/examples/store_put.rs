//! The store alone (docs/benchmarks.md, "Stores"): WRITERS tasks each put one key of
//! their own, one put after another, for SECONDS, through one [`Store`] (so its group
//! commit gathers them); prints puts per second and the p50 and p99 latency.
//!
//!     cargo run -p shaddock-services --release --example store_put -- embedded DATA_DIR [WRITERS] [SECONDS]
//!     cargo run -p shaddock-services --release --example store_put -- nats-kv NATS_URLS REPLICAS [WRITERS] [SECONDS]

use std::time::{Duration, Instant};

use bytes::Bytes;
use services::BusSecurity;
use services::store::{Store, StoreConfig, StoreKind};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |i: usize| args.get(i).cloned().unwrap_or_default();
    let num = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (config, nats, rest) = match get(0).as_str() {
        "embedded" => {
            let config = StoreConfig {
                data_dir: get(1).into(),
                ..StoreConfig::default()
            };
            (config, Vec::new(), 2)
        }
        "nats-kv" => {
            let config = StoreConfig {
                kind: StoreKind::NatsKv,
                store_replicas: num(2, 1) as usize,
                store_bucket: "bench".into(),
                ..StoreConfig::default()
            };
            (config, get(1).split(',').map(str::to_owned).collect(), 3)
        }
        other => anyhow::bail!("embedded or nats-kv, not {other:?}"),
    };
    let (writers, seconds) = (num(rest, 256), num(rest + 1, 10));
    let store = Store::open(&config, &nats, &BusSecurity::default()).await?;
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut took = Vec::new();
                let value = Bytes::from(vec![b'x'; 48]);
                while Instant::now() < until {
                    let sent = Instant::now();
                    store.put(format!("bench.p0.w{w}"), value.clone()).await?;
                    took.push(sent.elapsed());
                }
                anyhow::Ok(took)
            })
        })
        .collect();
    let mut took = Vec::new();
    for task in tasks {
        took.extend(task.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    took.sort();
    let ms =
        |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)].as_secs_f64() * 1e3;
    println!(
        "{} puts in {elapsed:.1} s: {:.0} puts/s; p50 {:.2} ms, p99 {:.2} ms ({writers} writers)",
        took.len(),
        took.len() as f64 / elapsed,
        ms(0.5),
        ms(0.99)
    );
    Ok(())
}
