//! `profile.set` throughput and latency through a gate (docs/benchmarks.md, "Stores"):
//! CLIENTS players log in to chat under their own names, then each keeps IN_FLIGHT
//! sets of its own profile going for SECONDS; prints sets per second and the p50, p99
//! and max latency of the sets answered 200, and how many were not.
//!
//!     cargo run -p shaddock-sdk --release --example profile_set -- ws://127.0.0.1:3250 [CLIENTS] [IN_FLIGHT] [SECONDS]

use std::time::{Duration, Instant};

use sdk::{Client, ClientOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args
        .first()
        .cloned()
        .unwrap_or("ws://127.0.0.1:3250".into());
    let arg = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (clients, in_flight, seconds) = (arg(1, 32), arg(2, 4), arg(3, 10));
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut players = Vec::new();
    for n in 0..clients {
        let options = ClientOptions {
            json: true,
            ..ClientOptions::default()
        };
        let client = Client::connect(&url, options).await?;
        let login = client
            .request("chat.login", format!(r#"{{"name":"bench-{n}"}}"#))
            .await?;
        anyhow::ensure!(login.code == 200, "login: {login:?}");
        players.push(client);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (n, client) in players.iter().enumerate() {
        for lane in 0..in_flight {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let (mut took, mut failed, mut i) = (Vec::new(), 0u64, 0u64);
                while Instant::now() < until {
                    i += 1;
                    let body = format!(r#"{{"display":"p{n} {lane} {i}"}}"#);
                    let sent = Instant::now();
                    match client.request("profile.set", body).await {
                        Ok(response) if response.code == 200 => took.push(sent.elapsed()),
                        _ => failed += 1,
                    }
                }
                (took, failed)
            }));
        }
    }
    let (mut took, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (t, f) = task.await?;
        took.extend(t);
        failed += f;
    }
    let elapsed = started.elapsed().as_secs_f64();
    took.sort();
    let at =
        |q: f64| took.get(((took.len() as f64 * q) as usize).min(took.len().saturating_sub(1)));
    let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e3);
    println!(
        "{} sets in {elapsed:.1} s: {:.0} sets/s; p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {failed} not 200 ({clients} clients x {in_flight} in flight)",
        took.len(),
        took.len() as f64 / elapsed,
        ms(at(0.5)),
        ms(at(0.99)),
        ms(took.last()),
    );
    Ok(())
}
