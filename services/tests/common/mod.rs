//! Harness for the worker's integration tests: a bus (our embedded broker in-process on
//! port 0, or the real nats-server as a child process on a random port), workers started
//! the way `main` starts them, and calls with a deadline on every wait.

#![allow(dead_code)] // each test file uses a different part of the harness

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use proto::Message;
use proto::rpc::{RpcRequest, RpcResponse};
use services::{Service, Worker, WorkerConfig};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any single wait in a test may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A running broker; stopped when dropped.
pub enum Bus {
    Embedded {
        url: String,
        shutdown: CancellationToken,
    },
    NatsServer {
        url: String,
        child: Child,
    },
}

impl Bus {
    /// Our broker, on the test's runtime, on 127.0.0.1:0.
    pub async fn embedded() -> Bus {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = broker::Server::new(broker::Config::default());
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        tokio::spawn(async move { server.run(listener, token).await });
        Bus::Embedded {
            url: format!("nats://{addr}"),
            shutdown,
        }
    }

    /// The real nats-server, started as client test suites do: `-a 127.0.0.1 -p -1`, then
    /// read the port from its log and wait for `Server is ready`, within [`DEADLINE`].
    pub fn nats_server() -> Bus {
        let path = nats_server_path();
        let mut child = Command::new(&path)
            .args(["-a", "127.0.0.1", "-p", "-1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std_mpsc::channel::<String>();
        std::thread::spawn(move || {
            // Keep draining after startup so the server never blocks on a full pipe.
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + DEADLINE;
        let mut log = Vec::new();
        let mut addr = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let _ = child.kill();
                panic!("nats-server did not become ready:\n{}", log.join("\n"));
            };
            if let Some((_, rest)) = line.split_once("Listening for client connections on ") {
                addr = Some(rest.trim().to_owned());
            }
            let ready = line.contains("Server is ready");
            log.push(line);
            if ready {
                break;
            }
        }
        let addr = addr.unwrap_or_else(|| panic!("no client port in:\n{}", log.join("\n")));
        Bus::NatsServer {
            url: format!("nats://{addr}"),
            child,
        }
    }

    pub fn url(&self) -> &str {
        match self {
            Bus::Embedded { url, .. } | Bus::NatsServer { url, .. } => url,
        }
    }

    /// A plain client, as a gate would hold.
    pub async fn client(&self) -> Client {
        within(async_nats::connect(self.url())).await.unwrap()
    }

    /// Subscribes `service` as a worker (returning once the broker has the subscription)
    /// and runs it on a task.
    pub async fn worker(&self, service: Service, config: WorkerConfig) -> RunningWorker {
        let name = format!("test-worker-{}", service.name());
        let client = services::connect(&[self.url().to_owned()], &name)
            .await
            .unwrap();
        let worker = within(Worker::subscribe(client, service, config))
            .await
            .unwrap();
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(worker.run(shutdown.clone()));
        RunningWorker { shutdown, handle }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        match self {
            Bus::Embedded { shutdown, .. } => shutdown.cancel(),
            Bus::NatsServer { child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The real nats-server: on PATH, else in `$(go env GOPATH)/bin`.
fn nats_server_path() -> PathBuf {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("nats-server");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    let gopath = Command::new("go")
        .args(["env", "GOPATH"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default();
    let first = std::env::split_paths(&gopath).next().unwrap_or_default();
    let candidate = first.join("bin").join("nats-server");
    assert!(
        candidate.is_file(),
        "nats-server not found on PATH or in $(go env GOPATH)/bin; install it with \
         `go install github.com/nats-io/nats-server/v2@latest`"
    );
    candidate
}

/// A worker serving on a task.
pub struct RunningWorker {
    pub shutdown: CancellationToken,
    pub handle: JoinHandle<Result<(), services::WorkerError>>,
}

impl RunningWorker {
    /// Fires shutdown and waits for the worker to return.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.join().await;
    }

    /// Waits for the worker to return and checks it returned `Ok`.
    pub async fn join(mut self) {
        within(&mut self.handle).await.unwrap().unwrap();
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Awaits `future`, failing the test after [`DEADLINE`].
pub async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("timed out waiting")
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
