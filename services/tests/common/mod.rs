//! Harness for the worker's integration tests, on top of the workspace's shared one
//! (`broker::testing`: the bus, our embedded broker or the real nats-server): workers
//! started the way `main` starts them, gate-like requesters, a handler the test can hold,
//! and calls with a deadline on every wait.

#![allow(dead_code)] // each test file uses a different part of the harness

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::sync::mpsc as std_mpsc;

use async_nats::Client;
pub use broker::testing::Bus;
use bytes::Bytes;
use futures::StreamExt;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use proto::Message;
use proto::rpc::{RpcRequest, RpcResponse};
use services::{Service, Worker, WorkerConfig};
pub use testkit::{DEADLINE, within};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What these tests need of a [`Bus`] beyond its URL.
pub trait BusExt {
    /// A plain client, as a gate would hold.
    async fn client(&self) -> Client;

    /// Subscribes `service` as a worker (returning once the broker has the subscription)
    /// and runs it on a task: over TCP, or in process on a [`Bus::InProcess`].
    async fn worker(&self, service: Service, config: WorkerConfig) -> RunningWorker;
}

impl BusExt for Bus {
    async fn client(&self) -> Client {
        within(async_nats::connect(self.url())).await.unwrap()
    }

    async fn worker(&self, service: Service, config: WorkerConfig) -> RunningWorker {
        let name = format!("test-worker-{}", service.name());
        let config = WorkerConfig {
            nats: vec![self.url().to_owned()],
            ..config
        };
        let shutdown = CancellationToken::new();
        let running = async {
            match self {
                Bus::InProcess(embedded) => {
                    let attach = embedded.server.attacher();
                    Worker::start_in_process(attach, None, service, config, &name, &shutdown).await
                }
                Bus::Embedded(_) | Bus::NatsServer(_) => {
                    Worker::start(service, config, &name, &shutdown).await
                }
            }
        };
        RunningWorker(within(running).await.unwrap())
    }
}

/// A worker serving on a task; dropping it fires its shutdown.
pub struct RunningWorker(pub services::Running);

impl RunningWorker {
    /// Fires shutdown and waits for the worker to return.
    pub async fn stop(self) {
        self.0.shut_down();
        self.join().await;
    }

    /// Waits for the worker to return and checks it returned `Ok`.
    pub async fn join(mut self) {
        within(self.0.join()).await.unwrap();
    }
}

/// A request with `body`, from a made-up session.
pub fn rpc(route: &str, body: impl Into<Bytes>) -> Bytes {
    RpcRequest {
        route: route.to_owned(),
        body: body.into(),
        session: Some(proto::rpc::Session {
            gate: "test-gate".into(),
            sid: 1,
            ..Default::default()
        }),
        timing: true,
        ..RpcRequest::default()
    }
    .encode_to_vec()
    .into()
}

/// Sends `payload` to `subject` as a request and decodes the answer.
pub async fn call(client: &Client, subject: &str, payload: Bytes) -> RpcResponse {
    let message = within(client.request(subject.to_owned(), payload))
        .await
        .unwrap();
    RpcResponse::decode(message.payload).unwrap()
}

/// Requests published one by one, in order, each with its own reply subject
/// `<inbox>.<n>`, answers collected as they come: lets a test control exactly which
/// request the worker sees when.
pub struct Requester {
    client: Client,
    inbox: String,
    replies: async_nats::Subscriber,
}

impl Requester {
    pub async fn new(client: Client) -> Requester {
        let inbox = client.new_inbox();
        let replies = client.subscribe(format!("{inbox}.*")).await.unwrap();
        within(client.flush()).await.unwrap();
        Requester {
            client,
            inbox,
            replies,
        }
    }

    /// Publishes request `n` and flushes, so it is at the broker when this returns.
    pub async fn send(&self, subject: &str, n: u32, payload: Bytes) {
        let reply = format!("{}.{n}", self.inbox);
        self.client
            .publish_with_reply(subject.to_owned(), reply, payload)
            .await
            .unwrap();
        within(self.client.flush()).await.unwrap();
    }

    /// The next answer: which request it answers and the response.
    pub async fn next(&mut self) -> (u32, RpcResponse) {
        let message = within(self.replies.next()).await.unwrap();
        let n = message.subject.rsplit('.').next().unwrap().parse().unwrap();
        (n, RpcResponse::decode(message.payload).unwrap())
    }

    /// The next `count` answers as `(request, code)`, sorted by request.
    pub async fn codes(&mut self, count: usize) -> Vec<(u32, u32)> {
        let mut codes = Vec::new();
        for _ in 0..count {
            let (n, response) = self.next().await;
            codes.push((n, response.code));
        }
        codes.sort();
        codes
    }
}

/// A service whose method `block` signals `started` and then holds the frame loop until
/// the test releases it (or [`DEADLINE`] passes); `fast` answers at once. Lets a test
/// fill the queue behind a busy loop without timing anything.
pub fn blocking_service(name: &str) -> (Service, Blocker) {
    let (started_tx, started) = mpsc::channel(8);
    let (release, release_rx) = std_mpsc::channel::<()>();
    let service = Service::new(name)
        .raw_method("block", move |_ctx, body| {
            let _ = started_tx.try_send(());
            let _ = release_rx.recv_timeout(DEADLINE);
            Ok(body)
        })
        .raw_method("fast", |_ctx, body| Ok(body));
    (service, Blocker { started, release })
}

/// The test's side of [`blocking_service`].
pub struct Blocker {
    started: mpsc::Receiver<()>,
    release: std_mpsc::Sender<()>,
}

impl Blocker {
    /// Waits until a `block` request is inside its handler.
    pub async fn started(&mut self) {
        within(self.started.recv()).await.unwrap();
    }

    /// Lets one `block` request finish.
    pub fn release(&self) {
        self.release.send(()).unwrap();
    }
}

/// The one recorder of a test binary (the worker counts on its own threads), installed
/// on first use.
static COUNTERS: LazyLock<Snapshotter> = LazyLock::new(|| {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");
    snapshotter
});

/// Counter `name` so far, over its labels, or gauge `name`'s last values summed: each
/// snapshot takes the counts since the last one, so they add up here, for every name.
/// Workers of tests running at once count into the same recorder: a test reading it
/// runs alone.
pub fn metric(name: &str) -> f64 {
    static SEEN: std::sync::Mutex<BTreeMap<String, f64>> = std::sync::Mutex::new(BTreeMap::new());
    let mut seen = SEEN.lock().unwrap();
    let mut gauges = BTreeMap::new();
    for (key, _, _, value) in COUNTERS.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        match value {
            DebugValue::Counter(n) => *seen.entry(name).or_default() += n as f64,
            DebugValue::Gauge(g) => *gauges.entry(name).or_default() += g.into_inner(),
            DebugValue::Histogram(_) => {}
        }
    }
    seen.extend(gauges);
    seen.get(name).copied().unwrap_or_default()
}
