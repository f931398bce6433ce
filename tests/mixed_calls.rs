//! Calls between a Rust worker and a TypeScript worker, both ways (docs/workers.md,
//! "Calling other services"), behind a gate, on our broker and on nats-server.
//!
//! The services are the shop and the bank: `shop.login` binds the uid in its body,
//! `shop.buy` calls `bank.pay` with its body and answers with the bank's answer (or `no
//! sale: <code> <message>`), and `bank.pay` answers `<uid> paid <body>`, the uid of the
//! session the call carried. The Rust ones are here (in-process, `services::Worker`),
//! the TypeScript ones in `workers/ts/src/services/shop.ts` (run by `src/shop.ts`). So
//! a client's answer went client → gate → shop → bank → shop → gate → client, across
//! the two languages:
//!
//! - a Rust shop (its handler defers, calls, answers from the continuation) calls a
//!   TypeScript bank;
//! - a TypeScript shop (its async handler awaits the call) calls a Rust bank.
//!
//! Each time the bank sees the client's session (its uid), and once the bank is gone
//! the shop's call gets the calling worker's 503 `no worker available now`.
//!
//! Prerequisites: Node 20 with `npm ci` run in `workers/ts` (the test runs `npm run
//! build` there itself), and nats-server on PATH or in `$(go env GOPATH)/bin`.

use std::process::Command;

#[path = "common/builds.rs"]
mod builds;
#[path = "common/worker.rs"]
mod worker;
use worker::RustWorker;
#[path = "common/gate.rs"]
mod gate;

use broker::testing::Bus;
use bytes::Bytes;
use gate::TestGate;
use nix::sys::signal::Signal;
use proto::code;
use sdk::Client;
use services::{CallResult, HandlerError, Service, WorkerConfig};
use testkit::{Process, within, word_after};

broker::on_both_buses!(calls_go_from_rust_to_typescript_and_back);

async fn calls_go_from_rust_to_typescript_and_back(bus: Bus) {
    let url = bus.url();
    let built = builds::ts();

    // A Rust shop calls a TypeScript bank.
    let prefix = "rs-shop";
    let bank = TsWorker::start(built, url, prefix, "bank").await;
    let shop = RustWorker::start(url, "mixed-calls-rust", rust_shop(), config(prefix)).await;
    let gate = TestGate::start(url, prefix).await;
    let client = logged_in(&gate).await;
    buy(&client, "3 coins", "ann paid 3 coins").await;
    assert_eq!(bank.stop().await, 1, "the TypeScript bank served the call");
    buy(&client, "4 coins", "no sale: 503 no worker available now").await;
    shop.stop().await;

    // A TypeScript shop calls a Rust bank.
    let prefix = "ts-shop";
    let bank = RustWorker::start(url, "mixed-calls-rust", rust_bank(), config(prefix)).await;
    let shop = TsWorker::start(built, url, prefix, "shop").await;
    let gate = TestGate::start(url, prefix).await;
    let client = logged_in(&gate).await;
    buy(&client, "5 coins", "ann paid 5 coins").await;
    bank.stop().await;
    buy(&client, "6 coins", "no sale: 503 no worker available now").await;
    assert_eq!(
        shop.stop().await,
        3,
        "the TypeScript shop served a login and two buys"
    );
}

/// A client of `gate` whose session is bound to `ann` (by `shop.login`).
async fn logged_in(gate: &TestGate) -> Client {
    let client = gate.client(false).await;
    let login = within(client.request("shop.login", "ann")).await.unwrap();
    assert_eq!(login.code, code::OK, "{login:?}");
    client
}

/// Sends `shop.buy` with `body` and checks that the answer is 200 with `want`.
async fn buy(client: &Client, body: &str, want: &str) {
    let bought = within(client.request("shop.buy", body.to_owned()))
        .await
        .unwrap();
    assert_eq!(bought.code, code::OK, "{bought:?}");
    assert_eq!(String::from_utf8_lossy(&bought.body), want);
}

/// The Rust shop: `buy` defers, calls `bank.pay`, and answers from the continuation.
fn rust_shop() -> Service {
    Service::new("shop")
        .raw_method("login", |ctx, body| {
            ctx.bind_uid(String::from_utf8_lossy(&body));
            Ok(Bytes::new())
        })
        .raw_method("buy", |ctx, body| {
            let deferred = ctx.defer();
            ctx.call("bank.pay", body, move |ctx, result: CallResult| {
                let answer = if result.is_ok() {
                    result.body
                } else {
                    Bytes::from(format!("no sale: {} {}", result.code, result.message))
                };
                ctx.answer(deferred, Ok(answer));
            });
            Ok::<_, HandlerError>(Bytes::new())
        })
}

/// The Rust bank: `pay` answers who paid (the caller's session's uid) and what.
fn rust_bank() -> Service {
    Service::new("bank").raw_method("pay", |ctx, body| {
        let uid = ctx.uid().unwrap_or("nobody").to_owned();
        Ok(Bytes::from(format!(
            "{uid} paid {}",
            String::from_utf8_lossy(&body)
        )))
    })
}

/// The TypeScript shop or bank (`src/shop.ts`) as a process: killed when dropped, unless
/// stopped.
struct TsWorker {
    process: Process,
}

impl TsWorker {
    /// Starts it serving `service` and waits for its `Worker is ready` line.
    async fn start(built: &builds::Ts, url: &str, prefix: &str, service: &str) -> TsWorker {
        let mut command = Command::new(&built.node);
        command.arg(built.script("shop")).args([
            "--service",
            service,
            "--nats",
            url,
            "--prefix",
            prefix,
        ]);
        let mut process = Process::spawn(&format!("the TypeScript {service} worker"), command);
        process.line("Worker is ready").await;
        TsWorker { process }
    }

    /// SIGTERM: the worker drains and reports; returns how many requests it served.
    async fn stop(mut self) -> usize {
        self.process.signal(Signal::SIGTERM);
        let stopped = self.process.line("Worker stopped: served=").await;
        let status = self.process.exit().await;
        assert!(status.success(), "{}: {status}", self.process.name());
        word_after(&stopped, "served=")
            .parse()
            .unwrap_or_else(|e| panic!("unreadable count in {stopped:?}: {e}"))
    }
}

fn config(prefix: &str) -> WorkerConfig {
    WorkerConfig {
        prefix: prefix.to_owned(),
        ..WorkerConfig::default()
    }
}
