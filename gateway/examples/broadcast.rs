//! Broadcast fan-out benchmark: one chat room, many members spread over several gates,
//! one sender; measures pushes delivered to clients per second.
//!
//! ```text
//! cargo run --release -p shaddock-gateway --example broadcast -- [--members 1000] [--gates 2] [--messages 200]
//!     [--window 32] [--size 64] [--workers 1] [--unordered] [--nats nats://HOST:PORT]
//! ```
//!
//! Everything runs in this process unless `--nats` names a broker: the embedded broker,
//! the gates, the chat workers, and the members' SDK clients, which decode every push,
//! so the clients' cost is in the figure too (and they share the same cores). Members
//! and the sender use serial sessions, as chat clients should; the sender keeps
//! `--window` `chat.say` requests pipelined (`--unordered` lets the gate forward them
//! all at once instead, so several messages fan out together and a gate writes them to
//! a member in one flush). A warm-up message first makes sure every
//! member is receiving; the clock then runs from the first measured send to the last
//! delivery. Each member is a WebSocket on each side, so the process needs about two
//! file descriptors per member (`ulimit -n`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use gateway::sdk::{Client, ClientOptions};
use gateway::{AnyToken, Gate, GateConfig};
use proto::Message as _;
use proto::chat::{JoinRequest, LoginRequest, SayRequest};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(about = "Broadcast fan-out: one room, many members, one sender")]
struct Args {
    /// Members of the room (besides the sender), spread evenly over the gates.
    #[arg(long, default_value_t = 1000)]
    members: usize,
    /// Gates, each with its own bus connection.
    #[arg(long, default_value_t = 2)]
    gates: usize,
    /// Messages the sender sends (after one warm-up message).
    #[arg(long, default_value_t = 200)]
    messages: usize,
    /// `chat.say` requests the sender keeps in flight.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Bytes of text per message.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Chat workers.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// The sender's session is not serial: its window of messages is handled in
    /// parallel (by several workers, in no particular order), so pushes coalesce.
    #[arg(long)]
    unordered: bool,
    /// Use this broker instead of starting the embedded one.
    #[arg(long)]
    nats: Option<String>,
}

/// How long to wait for the last deliveries before reporting what arrived.
const PATIENCE: Duration = Duration::from_secs(60);
/// Members connecting at once: enough to be quick, few enough not to trip timeouts.
const CONNECT_BATCH: usize = 100;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(
        args.gates > 0 && args.workers > 0 && args.window > 0,
        "counts must be positive"
    );
    let shutdown = CancellationToken::new();
    let nats_url = match &args.nats {
        Some(url) => url.clone(),
        None => {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let url = format!("nats://{}", listener.local_addr()?);
            let server = broker::Server::new(broker::Config::default());
            let stop = shutdown.clone();
            tokio::spawn(async move { server.run(listener, stop).await });
            url
        }
    };

    let mut gate_urls = Vec::new();
    for i in 0..args.gates {
        let nats = async_nats::connect(&nats_url)
            .await
            .context("connecting a gate")?;
        let config = GateConfig {
            gate_id: format!("bench-{i}"),
            // The sender is one session sending as fast as it is answered.
            rate: 1_000_000,
            burst: 1_000_000,
            ..GateConfig::default()
        };
        let gate = Gate::new(nats, config, Arc::new(AnyToken)).await?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        gate_urls.push(format!("ws://{}", listener.local_addr()?));
        let stop = shutdown.clone();
        tokio::spawn(async move { gate.run(listener, stop).await });
    }
    for _ in 0..args.workers {
        let nats = services::connect(std::slice::from_ref(&nats_url), "bench-chat").await?;
        let config = services::WorkerConfig {
            nats: vec![nats_url.clone()],
            ..services::WorkerConfig::default()
        };
        let worker = services::Worker::subscribe(nats, services::chat::service(), config).await?;
        tokio::spawn(worker.run(shutdown.clone()));
    }

    // Members: connect, log in, join, then count what arrives.
    let expected = args.messages as u64 + 1;
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());
    let finished = Arc::new(AtomicU64::new(0));
    let mut members = Vec::with_capacity(args.members);
    let connecting = Instant::now();
    for batch in (0..args.members).collect::<Vec<_>>().chunks(CONNECT_BATCH) {
        let joined: FuturesUnordered<_> = batch
            .iter()
            .map(|&i| member(&gate_urls[i % args.gates], format!("m{i}"), true))
            .collect();
        for client in joined.collect::<Vec<_>>().await {
            members.push(client?);
        }
    }
    println!(
        "{} members on {} gates ready in {:.1?}",
        args.members,
        args.gates,
        connecting.elapsed()
    );
    let warmed = Arc::new(AtomicU64::new(0));
    for client in &members {
        let mut pushes = client.pushes().context("push stream taken")?;
        let (received, warmed, finished, done) = (
            received.clone(),
            warmed.clone(),
            finished.clone(),
            done.clone(),
        );
        let total = args.members as u64;
        tokio::spawn(async move {
            let mut got = 0;
            while let Some(push) = pushes.recv().await {
                if push.route != services::chat::ROUTE_MESSAGE {
                    continue;
                }
                got += 1;
                if got == 1 {
                    warmed.fetch_add(1, Ordering::Relaxed);
                    done.notify_one();
                    continue;
                }
                received.fetch_add(1, Ordering::Relaxed);
                if got == expected {
                    if finished.fetch_add(1, Ordering::Relaxed) + 1 == total {
                        done.notify_one();
                    }
                    break;
                }
            }
        });
    }

    let sender = member(&gate_urls[0], "sender".into(), !args.unordered).await?;
    let text = "x".repeat(args.size);
    say(&sender, &text).await?;
    wait_for(
        &done,
        || warmed.load(Ordering::Relaxed) == args.members as u64,
        PATIENCE,
    )
    .await
    .context("warm-up message did not reach every member")?;

    let started = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    for _ in 0..args.messages {
        if in_flight.len() >= args.window
            && let Some(result) = in_flight.next().await
        {
            result?;
        }
        in_flight.push(say(&sender, &text));
    }
    while let Some(result) = in_flight.next().await {
        result?;
    }
    let sent = started.elapsed();
    let all = wait_for(
        &done,
        || finished.load(Ordering::Relaxed) == args.members as u64,
        PATIENCE,
    )
    .await
    .is_ok();
    let elapsed = started.elapsed();

    let deliveries = received.load(Ordering::Relaxed);
    let want = (args.messages * args.members) as u64;
    let dropped: u64 = members.iter().map(Client::pushes_dropped).sum();
    println!(
        "{} messages x {} members: {deliveries} of {want} deliveries in {elapsed:.2?} (sends took {sent:.2?})",
        args.messages, args.members
    );
    println!(
        "{:.0} deliveries/s, {:.0} messages/s; {dropped} dropped by full client queues",
        deliveries as f64 / elapsed.as_secs_f64(),
        args.messages as f64 / elapsed.as_secs_f64()
    );
    shutdown.cancel();
    if !all {
        bail!("{} deliveries missing", want - deliveries);
    }
    Ok(())
}

/// A session, logged in as `name`, in the room.
async fn member(url: &str, name: String, serial: bool) -> anyhow::Result<Client> {
    let options = ClientOptions {
        serial,
        ..ClientOptions::default()
    };
    let client = Client::connect(url, options).await?;
    let login = LoginRequest { name };
    expect_ok(client.request("chat.login", login.encode_to_vec()).await?)?;
    let join = JoinRequest {
        room: "bench".into(),
    };
    expect_ok(client.request("chat.join", join.encode_to_vec()).await?)?;
    Ok(client)
}

async fn say(sender: &Client, text: &str) -> anyhow::Result<()> {
    let say = SayRequest {
        room: "bench".into(),
        text: text.into(),
    };
    expect_ok(sender.request("chat.say", say.encode_to_vec()).await?)
}

fn expect_ok(response: gateway::sdk::Response) -> anyhow::Result<()> {
    if response.code != proto::code::OK {
        bail!("answered {}: {}", response.code, response.message);
    }
    Ok(())
}

/// Waits until `condition` holds (re-checked whenever `notify` fires), up to `limit`.
async fn wait_for(
    notify: &Notify,
    condition: impl Fn() -> bool,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    while !condition() {
        // Re-check at least every 100 ms: a notification can land between check and wait.
        let wake = tokio::time::timeout(Duration::from_millis(100), notify.notified());
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out");
        }
        let _ = wake.await;
    }
    Ok(())
}
