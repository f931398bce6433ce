//! Real processes for fleet tests, on the test kit's launcher (`testkit::Process`): a
//! nats-server cluster with routes on free ports, and `shaddock gate` and `shaddock
//! worker` processes, each waited on by its log lines and killed when its handle drops.

#![allow(dead_code)] // each test file uses a different part of the harness

use std::process::Command;
use std::time::Duration;

use testkit::{DEADLINE, NatsServer, Process};
use tokio::time::timeout;

/// One nats-server of a [`NatsCluster`].
pub struct NatsNode {
    pub server: NatsServer,
    /// `nats://127.0.0.1:PORT`, its route URL.
    pub route_url: String,
}

/// Lame duck settings every node gets: nats-server's minimum duration (30 s), and a
/// grace period before it starts closing clients.
pub struct LameDuck {
    pub grace: Duration,
}

/// nats-servers joined by routes: each route to the first node, which tells the others
/// about each other.
pub struct NatsCluster {
    pub nodes: Vec<NatsNode>,
}

impl NatsCluster {
    /// Starts `size` nodes on free ports and waits until a message published on any of
    /// them reaches a subscriber on any other.
    pub async fn start(size: usize, lame_duck: &LameDuck) -> NatsCluster {
        let mut nodes: Vec<NatsNode> = Vec::new();
        for i in 0..size {
            let routes = nodes
                .first()
                .map(|first| format!("routes: [\"{}\"]", first.route_url))
                .unwrap_or_default();
            let conf = format!(
                "server_name: \"n{i}\"\nlisten: \"127.0.0.1:-1\"\n\
                 lame_duck_duration: \"30s\"\nlame_duck_grace_period: \"{}ms\"\n\
                 cluster {{ name: \"drain\", listen: \"127.0.0.1:-1\", {routes} }}\n",
                lame_duck.grace.as_millis()
            );
            let mut server = NatsServer::with_config(&conf).await;
            let route = server
                .process
                .addr_after("Listening for route connections on ")
                .await;
            nodes.push(NatsNode {
                server,
                route_url: format!("nats://{route}"),
            });
        }
        let cluster = NatsCluster { nodes };
        cluster.wait_meshed().await;
        cluster
    }

    /// Every node's client URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.server.url.clone()).collect()
    }

    /// Waits until a request published on each node is answered by a subscriber on
    /// each other node: then every route is up.
    async fn wait_meshed(&self) {
        let mut clients = Vec::new();
        for node in &self.nodes {
            clients.push(
                services::connect(
                    std::slice::from_ref(&node.server.url),
                    "mesh-probe",
                    &Default::default(),
                )
                .await
                .unwrap(),
            );
        }
        for (i, client) in clients.iter().enumerate() {
            let mut probe = client.subscribe(format!("mesh.{i}")).await.unwrap();
            let answering = client.clone();
            tokio::spawn(async move {
                use futures::StreamExt as _;
                while let Some(message) = probe.next().await {
                    if let Some(reply) = message.reply {
                        let _ = answering.publish(reply, bytes::Bytes::new()).await;
                    }
                }
            });
            client.flush().await.unwrap();
        }
        timeout(DEADLINE, async {
            for i in 0..clients.len() {
                for (j, asking) in clients.iter().enumerate() {
                    if i == j {
                        continue;
                    }
                    // No responders until the subscription has crossed the routes.
                    while asking
                        .request(format!("mesh.{i}"), bytes::Bytes::new())
                        .await
                        .is_err()
                    {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        })
        .await
        .expect("the cluster's routes did not come up");
    }
}

/// `shaddock ARGS EXTRA`, logging at info.
pub fn shaddock(name: &str, args: &[&str], extra: &[&str]) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shaddock"));
    command.args(args).args(extra).env("RUST_LOG", "info");
    Process::spawn(name, command)
}

/// `shaddock worker --service echo --nats URLS` with `extra` flags, ready (its
/// subscriptions are at its server).
pub async fn echo_worker(name: &str, urls: &[String], extra: &[&str]) -> Process {
    worker(name, "echo", urls, extra).await
}

/// `shaddock worker --service SERVICE --nats URLS` with `extra` flags, ready.
pub async fn worker(name: &str, service: &str, urls: &[String], extra: &[&str]) -> Process {
    let nats = urls.join(",");
    let mut process = shaddock(
        name,
        &["worker", "--service", service, "--nats", &nats],
        extra,
    );
    process.line("Worker is ready").await;
    process
}

/// `shaddock gate --listen 127.0.0.1:0 --nats URL` with `extra` flags, ready; returns it
/// and its `ws://` URL.
pub async fn gate(name: &str, url: &str, extra: &[&str]) -> (Process, String) {
    let mut process = shaddock(
        name,
        &["gate", "--listen", "127.0.0.1:0", "--nats", url],
        extra,
    );
    let addr = process
        .addr_after("Gate listening for WebSocket clients on ")
        .await;
    process.line("Gate is ready").await;
    (process, format!("ws://{addr}"))
}
