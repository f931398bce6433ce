//! The buses the workspace's integration tests run on (cargo feature `testing`, enabled
//! only by dev-dependencies): our broker in-process on port 0, or the real `nats-server`
//! as a child process on a random port (`testkit::NatsServer`), and
//! [`on_both_buses!`](crate::on_both_buses) to run a check on each.
//!
//! Each check whose expectation depends on what the bus does is written once over a
//! [`Bus`] and run on both brokers: agreeing with nats-server is what proves the
//! expectation itself right. Processes, the deadline and `within` are the test kit's
//! (`testkit`), which this builds on.
//!
//! Everything here panics on failure: it is test code, and a panic is how a test fails.

use std::net::SocketAddr;

use futures::StreamExt;
use testkit::{NatsServer, within};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{Config, Server};

pub mod damage;
pub mod hostile;
pub mod pki;

/// A round trip through the server: once `client`'s own message comes back, the server
/// has processed everything the client sent before it (its subscriptions included), and
/// every message queued to the client before it has reached its subscriptions.
/// (async-nats' `flush()` only flushes the socket; it sends no PING.)
pub async fn round_trip(client: &async_nats::Client) {
    let inbox = client.new_inbox();
    let mut echo = within(client.subscribe(inbox.clone())).await.unwrap();
    within(client.publish(inbox, bytes::Bytes::new()))
        .await
        .unwrap();
    within(echo.next()).await.expect("subscription ended");
}

/// A metric series as tests name it, `name{label=value,...}`, from the key a
/// debugging recorder's snapshot gives.
pub fn series(key: &metrics::Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

/// A broker to test against; stopped when dropped.
pub enum Bus {
    /// Our broker, on the test's runtime.
    Embedded(EmbeddedServer),
    /// The real nats-server, as a child process.
    NatsServer(NatsServer),
    /// Our broker, as [`Bus::Embedded`], for tests that attach their workers to it in
    /// process (as `shaddock up` does); other clients use its TCP port.
    InProcess(EmbeddedServer),
}

impl Bus {
    /// Our broker with its default configuration, on 127.0.0.1:0.
    pub async fn embedded() -> Bus {
        Bus::embedded_with(Config::default()).await
    }

    /// Our broker with `config`, on 127.0.0.1:0.
    pub async fn embedded_with(config: Config) -> Bus {
        Bus::Embedded(EmbeddedServer::start(config).await)
    }

    /// Our broker with its default configuration, on 127.0.0.1:0, its workers to be
    /// attached in process.
    pub async fn in_process() -> Bus {
        Bus::InProcess(EmbeddedServer::start(Config::default()).await)
    }

    /// The real nats-server with its default configuration, on a random port.
    pub async fn nats_server() -> Bus {
        Bus::NatsServer(NatsServer::start().await)
    }

    /// The real nats-server with a config file holding `config`, on a random port.
    pub async fn nats_server_with(config: &str) -> Bus {
        Bus::NatsServer(NatsServer::with_config(config).await)
    }

    /// `nats://HOST:PORT`, for any NATS client.
    pub fn url(&self) -> &str {
        match self {
            Bus::Embedded(server) | Bus::InProcess(server) => &server.url,
            Bus::NatsServer(server) => &server.url,
        }
    }

    /// The client port's address, for raw TCP.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Bus::Embedded(server) | Bus::InProcess(server) => server.addr,
            Bus::NatsServer(server) => server.addr,
        }
    }

    /// Which broker this is, for failure messages.
    pub fn name(&self) -> &'static str {
        match self {
            Bus::Embedded(_) => "embedded broker",
            Bus::NatsServer(_) => "nats-server",
            Bus::InProcess(_) => "embedded broker, workers in process",
        }
    }
}

/// Runs each named `async fn(Bus)` once more, as `in_process::<name>`, on
/// [`Bus::in_process`]: our broker with the test's workers attached in process (the
/// harness that starts them reads the variant), the way `shaddock up` attaches its own.
#[macro_export]
macro_rules! in_process {
    ($($test:ident),* $(,)?) => {
        mod in_process {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::testing::Bus::in_process().await).await;
                }
            )*
        }
    };
}

/// Runs each named `async fn(Bus)` on all three buses: [`on_both_buses!`] and
/// [`in_process!`] in one list. The names after `tcp_only:` run on the two buses reached
/// over TCP only: checks that need what a direct link has not (a connection to cut or
/// lose, a worker of its own process, a nats-server feature).
///
/// ```ignore
/// broker::on_every_bus!(answers_ping, refuses_garbage; tcp_only: comes_back_after_a_cut);
/// ```
#[macro_export]
macro_rules! on_every_bus {
    ($($test:ident),* $(,)? ; tcp_only: $($tcp:ident),* $(,)?) => {
        $crate::on_both_buses!($($test,)* $($tcp,)*);
        $crate::in_process!($($test),*);
    };
    ($($test:ident),* $(,)?) => {
        $crate::on_every_bus!($($test),* ; tcp_only:);
    };
}

/// Runs each named `async fn(Bus)` as two tests, `embedded::<name>` on our broker and
/// `nats_server::<name>` on the real nats-server, on a two-thread runtime. Use it only
/// where the check's expectation depends on what the bus does (docs/testing.md); a
/// check of the gate's WebSocket side runs once, on `Bus::embedded()`.
///
/// Each name may carry a setup, `name => setup;`: a value with `config()`, our
/// broker's [`Config`], and `nats_server_conf()`, the same settings as a nats-server
/// config file (names in `setup` resolve in the calling module).
///
/// ```ignore
/// broker::on_both_buses!(answers_ping, refuses_garbage);
/// broker::on_both_buses! {
///     token_accepted => Setup::token();
/// }
/// async fn answers_ping(bus: broker::testing::Bus) { /* ... */ }
/// ```
#[macro_export]
macro_rules! on_both_buses {
    ($($test:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::testing::Bus::embedded().await).await;
                }
            )*
        }
        mod nats_server {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($crate::testing::Bus::nats_server().await).await;
                }
            )*
        }
    };
    ($($test:ident => $setup:expr;)*) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    use super::*;
                    let bus = $crate::testing::Bus::embedded_with($setup.config()).await;
                    super::$test(bus).await;
                }
            )*
        }
        mod nats_server {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    use super::*;
                    let conf = $setup.nats_server_conf();
                    super::$test($crate::testing::Bus::nats_server_with(&conf).await).await;
                }
            )*
        }
    };
}

/// Our broker running on the test's runtime; stopped when dropped.
pub struct EmbeddedServer {
    pub addr: SocketAddr,
    pub url: String,
    pub server: Server,
    shutdown: CancellationToken,
}

impl EmbeddedServer {
    /// Binds 127.0.0.1:0 and runs a [`Server`] with `config` on the current runtime.
    pub async fn start(config: Config) -> EmbeddedServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Server::new(config);
        let shutdown = CancellationToken::new();
        let (run_server, run_shutdown) = (server.clone(), shutdown.clone());
        tokio::spawn(async move { run_server.run(listener, run_shutdown).await });
        EmbeddedServer {
            addr,
            url: format!("nats://{addr}"),
            server,
            shutdown,
        }
    }

    /// Serves the monitoring endpoints for this server on a fresh port 0 listener,
    /// stopped together with the server.
    pub async fn start_monitor(&self) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = self.server.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move { crate::monitor::serve(listener, server, shutdown).await });
        addr
    }
}

impl Drop for EmbeddedServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
