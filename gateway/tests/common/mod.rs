//! Harness for the gate's end-to-end tests, on top of the workspace's shared one
//! (`broker::testing`: the bus, our embedded broker or the real nats-server): a gate
//! served in-process on port 0, workers started the way `main` starts them, services
//! whose handlers the test holds and releases, and a bystander session that must notice
//! nothing of what other sessions do.
//!
//! [`raw`] is a WebSocket client without the SDK's manners, for bad input and exact
//! frame order; [`proxy`] puts a worker's bus connection behind a TCP hop the test can
//! cut, which is how a worker dies abruptly. [`jwt`] makes NATS operator/account/user
//! JWTs and `.creds` files; [`logs`] lets a test wait for a line the gate logs;
//! [`resumable`] is a client of resumable sessions, as docs/protocol.md has one.

#![allow(dead_code)] // not every test uses every helper

pub mod jwt;
pub mod logs;
pub mod proxy;
pub mod raw;
pub mod resumable;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;

pub use broker::testing::Bus;
use bus::BusOptions;
use gateway::{AnyToken, Gate, GateConfig, TokenCheck};
use proto::code;
use sdk::{Client, ClientOptions};
use services::{FrameConfig, Service, Worker, WorkerConfig};
pub use testkit::{DEADLINE, within};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use raw::RawClient;

/// How a gate reaches `bus`: over TCP, or on [`Bus::InProcess`] by a direct link to the
/// broker in this process, as `shaddock up`'s gate does.
pub fn bus_options(bus: &Bus) -> BusOptions {
    match bus {
        Bus::InProcess(server) => BusOptions::direct(server.server.attacher()),
        Bus::Embedded(_) | Bus::NatsServer(_) => BusOptions::new([bus.url()]),
    }
}

/// A gate serving WebSockets on 127.0.0.1:0 on the test's runtime; shut down when
/// dropped.
pub struct TestGate {
    pub gate: Gate,
    /// `ws://127.0.0.1:PORT`
    pub url: String,
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    run: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestGate {
    /// A gate accepting any token.
    pub async fn start(bus: &Bus, config: GateConfig) -> TestGate {
        TestGate::start_with_tokens(bus, config, Arc::new(AnyToken)).await
    }

    /// A gate whose handshakes `tokens` decides.
    pub async fn start_with_tokens(
        bus: &Bus,
        config: GateConfig,
        tokens: Arc<dyn TokenCheck>,
    ) -> TestGate {
        TestGate::start_on(bus_options(bus), config, tokens).await
    }

    /// A gate on bus settings the test made (with credentials, over TLS...).
    pub async fn start_on(
        bus: BusOptions,
        config: GateConfig,
        tokens: Arc<dyn TokenCheck>,
    ) -> TestGate {
        let gate = within(Gate::new(bus, config, tokens)).await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let (serving, token) = (gate.clone(), shutdown.clone());
        let run = tokio::spawn(async move { serving.run(listener, token).await });
        TestGate {
            gate,
            url: format!("ws://{addr}"),
            addr,
            shutdown,
            run: Some(run),
        }
    }

    /// An SDK client with default options.
    pub async fn client(&self) -> Client {
        self.client_with(ClientOptions::default()).await
    }

    pub async fn client_with(&self, options: ClientOptions) -> Client {
        within(Client::connect(&self.url, options)).await.unwrap()
    }

    /// A raw client that has completed a binary handshake.
    pub async fn raw(&self) -> RawClient {
        RawClient::handshaken(&self.url).await
    }

    /// Starts shutting the gate down, as SIGTERM would in `main`.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Waits for [`Gate::run`] to return, and checks it returned `Ok`.
    pub async fn stopped(&mut self) {
        let run = self.run.take().expect("the gate is already stopped");
        within(run).await.unwrap().unwrap();
    }
}

impl Drop for TestGate {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A gate configuration with `f` applied to the defaults.
/// Waits until `done` holds, looking every few milliseconds, within the deadline.
#[allow(dead_code)]
pub async fn eventually(what: &str, done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(DEADLINE, async {
        while !done() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: not within {DEADLINE:?}");
}

pub fn gate_config(f: impl FnOnce(&mut GateConfig)) -> GateConfig {
    let mut config = GateConfig::default();
    f(&mut config);
    config
}

/// A worker serving on a task; stopped (gracefully) when dropped.
pub struct TestWorker(services::Running);

impl TestWorker {
    /// Stops the worker and waits until it has drained and left its queue group.
    pub async fn stop(self) {
        within(self.0.stop()).await.unwrap();
    }
}

/// Connects to the bus at `url`, subscribes `service` (returning once the broker has
/// the subscription, so requests sent next reach it) and runs it on a task.
pub async fn start_worker(url: &str, service: Service, frames: FrameConfig) -> TestWorker {
    let config = WorkerConfig {
        nats: vec![url.to_owned()],
        frames,
        ..WorkerConfig::default()
    };
    start_worker_with(service, config).await
}

/// [`start_worker`] connecting as `config` says (its URLs, credentials and TLS).
pub async fn start_worker_with(service: Service, config: WorkerConfig) -> TestWorker {
    let name = format!("test-worker-{}", service.name());
    let shutdown = CancellationToken::new();
    let running = Worker::start(service, config, &name, &shutdown);
    TestWorker(within(running).await.unwrap())
}

/// The built-in echo service as one worker on `bus`.
pub async fn echo_worker(bus: &Bus) -> TestWorker {
    echo_worker_on(bus.url()).await
}

/// The echo service's worker on the bus at `url`.
pub async fn echo_worker_on(url: &str) -> TestWorker {
    start_worker(url, services::echo::service(), FrameConfig::default()).await
}

/// Frame limits with a queue of `queue_capacity`.
pub fn queue_of(queue_capacity: usize) -> FrameConfig {
    FrameConfig {
        queue_capacity,
        ..FrameConfig::default()
    }
}

/// An echo service (`echo.raw`) that counts what it handled in `handled`, so a test
/// can tell which worker of a group served how much.
pub fn counting_echo(handled: Arc<AtomicUsize>) -> Service {
    Service::new("echo").raw_method("raw", move |_ctx, body| {
        handled.fetch_add(1, Ordering::Relaxed);
        Ok(body)
    })
}

/// Services whose `hold` method tells the test it started, then holds its worker's
/// frame loop until the test releases it; `who` answers at once with the worker's tag.
/// Lets a test park a request inside a handler, and queue others behind it, without
/// timing anything. Dropping the `Holds` releases every held handler.
pub struct Holds {
    started_tx: mpsc::Sender<String>,
    started: mpsc::Receiver<String>,
    releases: HashMap<String, std_mpsc::Sender<()>>,
}

impl Default for Holds {
    fn default() -> Holds {
        let (started_tx, started) = mpsc::channel(64);
        Holds {
            started_tx,
            started,
            releases: HashMap::new(),
        }
    }
}

impl Holds {
    /// Service `name` for the worker tagged `tag` (unique per worker).
    pub fn service(&mut self, name: &str, tag: &str) -> Service {
        let (release, release_rx) = std_mpsc::channel::<()>();
        self.releases.insert(tag.to_owned(), release);
        let started = self.started_tx.clone();
        let (hold_tag, who_tag) = (tag.to_owned(), tag.to_owned());
        Service::new(name)
            .raw_method("hold", move |_ctx, body| {
                let _ = started.try_send(hold_tag.clone());
                // Released by the test, or by its end (the sender is dropped).
                let _ = release_rx.recv_timeout(DEADLINE);
                Ok(body)
            })
            .raw_method("who", move |_ctx, _body| Ok(who_tag.clone().into()))
    }

    /// Waits until a `hold` request is inside its handler; returns that worker's tag.
    pub async fn started(&mut self) -> String {
        within(self.started.recv()).await.unwrap()
    }

    /// The tag of a `hold` request that started since the last look, if any.
    pub fn started_now(&mut self) -> Option<String> {
        self.started.try_recv().ok()
    }

    /// Lets one held request of worker `tag` finish.
    pub fn release(&self, tag: &str) {
        self.releases[tag].send(()).unwrap();
    }
}

/// A gate whose whole in-flight budget, one request, is taken: request 1 of `raw`
/// (`park.hold`) is inside a parked worker's handler, so every further request to the
/// gate is refused 503 until [`FullGate::release`], whose answer then follows.
pub struct FullGate {
    pub gate: TestGate,
    pub raw: RawClient,
    holds: Holds,
    _park: TestWorker,
}

impl FullGate {
    pub async fn start(bus: &Bus) -> FullGate {
        let mut holds = Holds::default();
        let park = start_worker(bus.url(), holds.service("park", "p"), queue_of(8)).await;
        let gate = TestGate::start(bus, gate_config(|c| c.max_gate_in_flight = 1)).await;
        let mut raw = gate.raw().await;
        raw.request(1, "park.hold", "").await;
        holds.started().await;
        FullGate {
            gate,
            raw,
            holds,
            _park: park,
        }
    }

    /// Lets request 1 finish.
    pub fn release(&self) {
        self.holds.release("p");
    }
}

/// A second session that must notice nothing of what another session does: each
/// check is one `echo.raw` round trip that must come back 200 with its own body.
pub struct Bystander {
    client: Client,
    checks: u32,
}

impl Bystander {
    /// Connects to `gate`; needs an echo worker on the gate's bus.
    pub async fn join(gate: &TestGate) -> Bystander {
        let mut bystander = Bystander {
            client: gate.client().await,
            checks: 0,
        };
        bystander.still_served().await;
        bystander
    }

    pub async fn still_served(&mut self) {
        self.checks += 1;
        let body = format!("bystander check {}", self.checks);
        let response = within(self.client.request("echo.raw", &body))
            .await
            .unwrap_or_else(|e| panic!("bystander check {}: {e}", self.checks));
        assert_eq!(response.code, code::OK, "bystander: {response:?}");
        assert_eq!(response.body, body.as_bytes(), "bystander got another body");
        assert!(!self.client.is_closed(), "the bystander was closed");
    }
}
