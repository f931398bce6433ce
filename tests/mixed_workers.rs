//! Workers in three languages in one queue group (docs/workers.md): a Rust echo worker
//! (in-process, `services::Worker`), the TypeScript one (`workers/ts`, written with
//! `@shaddock/worker`) and the Go one (`workers/go`), behind one gate, on our broker and
//! on nats-server.
//!
//! - Each language's schema announcement works on its own: a gate that has heard from
//!   no other echo worker serves JSON clients typed `echo.echo` bodies through a TS-only
//!   (then a Go-only) group, whether the gate started before the worker (the worker's
//!   announcement at start) or after it (the gate's ask).
//! - The three together share the route: 3,000 requests from protobuf and JSON clients
//!   are all answered 200 with their own bodies, and each worker served a share (the TS
//!   and Go workers print their counts when they drain on SIGTERM; the Rust one counts
//!   in the test).
//!
//! Prerequisites: Node 20 with `npm ci` run in `workers/ts` (the test runs `npm run
//! build` there itself), Go (it runs `go build` in `workers/go`), and nats-server on
//! PATH or in `$(go env GOPATH)/bin`.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[path = "common/builds.rs"]
mod builds;
#[path = "common/worker.rs"]
mod worker;
use worker::RustWorker;
#[path = "common/gate.rs"]
mod gate;

use broker::testing::Bus;
use futures::{StreamExt as _, stream};
use gate::TestGate;
use nix::sys::signal::Signal;
use proto::Message as _;
use proto::code;
use proto::echo::{EchoRequest, EchoResponse};
use sdk::Client;
use services::{Context, HandlerError, Service, WorkerConfig};
use testkit::{Process, within};

/// Requests through the gate while all three workers serve.
const REQUESTS: usize = 3_000;
/// Clients sending them, half protobuf, half JSON.
const CLIENTS: usize = 6;
/// Requests each client keeps in flight (the gate allows 256 per session).
const IN_FLIGHT: usize = 16;

broker::on_both_buses!(rust_ts_and_go_workers_share_echo);

async fn rust_ts_and_go_workers_share_echo(bus: Bus) {
    let url = bus.url();
    let built = builds::ts();
    for language in [Language::TypeScript, Language::Go] {
        announcement_alone(url, built, language).await;
    }

    let prefix = "shaddock";
    let gate = TestGate::start(url, prefix).await;
    let rust_served = Arc::new(AtomicUsize::new(0));
    let rust = start_rust_worker(url, prefix, rust_served.clone()).await;
    let ts = WorkerProcess::start(built, Language::TypeScript, url, prefix).await;
    let go = WorkerProcess::start(built, Language::Go, url, prefix).await;
    typed_echo_learnt(&gate).await;
    let gate = &gate;
    let clients: Vec<(Client, bool)> = stream::iter(0..CLIENTS)
        .then(|i| {
            let json = i % 2 == 1;
            async move { (gate.client(json).await, json) }
        })
        .collect()
        .await;
    let per_client = REQUESTS / CLIENTS;
    let answered: usize = futures::future::join_all(clients.iter().enumerate().map(
        |(c, (client, json))| async move {
            stream::iter(0..per_client)
                .map(|i| echo_once(client, *json, i % 2 == 0, format!("c{c}-r{i}")))
                .buffer_unordered(IN_FLIGHT)
                .count()
                .await
        },
    ))
    .await
    .into_iter()
    .sum();
    assert_eq!(answered, REQUESTS);

    let ts_served = ts.stop().await;
    let go_served = go.stop().await;
    rust.stop().await;
    let rust_served = rust_served.load(Ordering::Relaxed);
    let shares = [("rust", rust_served), ("ts", ts_served), ("go", go_served)];
    eprintln!("shares of {REQUESTS} requests (and 1 warm-up): {shares:?}");
    assert_eq!(
        rust_served + ts_served + go_served,
        REQUESTS + 1,
        "every request was served exactly once: {shares:?}"
    );
    for (who, served) in shares {
        // The bus picks a member of the group at random for each request: about a third each.
        assert!(served >= REQUESTS / 10, "{who} served {served}: {shares:?}");
    }
}

/// A gate that has heard from no echo worker but one of `language`'s serves JSON
/// clients typed bodies through it: the gate started before the worker learns from the
/// worker's announcement at start, the gate started after it from its ask.
async fn announcement_alone(url: &str, built: &builds::Ts, language: Language) {
    let prefix = format!("alone-{}", language.name());
    let before = TestGate::start(url, &prefix).await;
    let worker = WorkerProcess::start(built, language, url, &prefix).await;
    let after = TestGate::start(url, &prefix).await;
    let mut sent = 0;
    for gate in [&before, &after] {
        typed_echo_learnt(gate).await;
        sent += 1;
        for json in [false, true] {
            let client = gate.client(json).await;
            for typed in [true, false] {
                echo_once(&client, json, typed, format!("{}-alone", language.name())).await;
                sent += 1;
            }
        }
    }
    assert_eq!(
        worker.stop().await,
        sent,
        "{language:?} served what was sent"
    );
}

/// Sends one `echo.echo` (`typed`) or `echo.raw` carrying `text` and checks the answer.
async fn echo_once(client: &Client, json: bool, typed: bool, text: String) {
    let (route, body, want) = match (typed, json) {
        (true, false) => {
            let request = EchoRequest {
                body: text.clone().into(),
            };
            ("echo.echo", request.encode_to_vec(), None)
        }
        (true, true) => {
            let body = format!(r#"{{"body":"{}"}}"#, base64(text.as_bytes()));
            ("echo.echo", body.clone().into_bytes(), Some(body))
        }
        (false, false) => ("echo.raw", text.clone().into_bytes(), Some(text.clone())),
        (false, true) => (
            "echo.raw",
            format!("{text:?}").into_bytes(),
            Some(text.clone()),
        ),
    };
    let response = client.request(route, body).await.unwrap();
    assert_eq!(response.code, code::OK, "{route} {text}: {response:?}");
    match want {
        Some(want) => assert_eq!(
            String::from_utf8_lossy(&response.body),
            want,
            "{route} json={json}"
        ),
        None => {
            let echoed = EchoResponse::decode(response.body).unwrap();
            assert_eq!(&echoed.body[..], text.as_bytes());
        }
    }
}

/// Sends JSON `echo.echo` requests until one is answered 200: the gate has learnt
/// the types. Only that one reaches a worker: until then the gate itself answers a
/// typed body for a route without types 400.
async fn typed_echo_learnt(gate: &TestGate) {
    let client = gate.client(true).await;
    within(async {
        loop {
            let response = client
                .request("echo.echo", br#"{"body":"aGk="}"#)
                .await
                .unwrap();
            if response.code == code::OK {
                assert_eq!(&response.body[..], br#"{"body":"aGk="}"#);
                return;
            }
            assert_eq!(response.code, code::BAD_REQUEST, "{response:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

async fn start_rust_worker(url: &str, prefix: &str, served: Arc<AtomicUsize>) -> RustWorker {
    let raw_served = served.clone();
    let service = Service::new("echo")
        .descriptors(proto::DESCRIPTORS)
        .method("echo", move |_ctx: &mut Context, request: EchoRequest| {
            served.fetch_add(1, Ordering::Relaxed);
            Ok::<_, HandlerError>(EchoResponse { body: request.body })
        })
        .raw_method("raw", move |_ctx, body| {
            raw_served.fetch_add(1, Ordering::Relaxed);
            Ok(body)
        });
    let config = WorkerConfig {
        prefix: prefix.to_owned(),
        ..WorkerConfig::default()
    };
    RustWorker::start(url, "mixed-workers-rust", service, config).await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Language {
    TypeScript,
    Go,
}

impl Language {
    fn name(self) -> &'static str {
        match self {
            Language::TypeScript => "ts",
            Language::Go => "go",
        }
    }
}

/// A TS or Go echo worker process: killed when dropped, unless stopped.
struct WorkerProcess {
    language: Language,
    process: Process,
}

impl WorkerProcess {
    /// Starts the worker and waits for its `Worker is ready` line.
    async fn start(
        built: &builds::Ts,
        language: Language,
        url: &str,
        prefix: &str,
    ) -> WorkerProcess {
        let mut command = match language {
            Language::TypeScript => {
                let mut c = Command::new(&built.node);
                c.arg(built.script("echo"));
                c
            }
            Language::Go => Command::new(builds::go_echo()),
        };
        command.args(["--nats", url, "--prefix", prefix]);
        let mut process = Process::spawn(&format!("the {language:?} echo worker"), command);
        process.line("Worker is ready").await;
        WorkerProcess { language, process }
    }

    /// SIGTERM: the worker drains and reports; returns how many requests it served.
    async fn stop(mut self) -> usize {
        self.process.signal(Signal::SIGTERM);
        let stopped = self.process.line("Worker stopped: served=").await;
        let status = self.process.exit().await;
        assert!(status.success(), "{:?} worker: {status}", self.language);
        let served = stopped.split("served=").nth(1).unwrap();
        served
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unreadable count in {stopped:?}"))
    }
}

/// Standard base64 with padding: how the proto3 JSON mapping writes `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn base64_matches_the_standard_alphabet_with_padding() {
    assert_eq!(base64(b"hi"), "aGk=");
    assert_eq!(base64(b"c0-r1"), "YzAtcjE=");
    assert_eq!(base64(b"abc"), "YWJj");
    assert_eq!(base64(b"a"), "YQ==");
}
