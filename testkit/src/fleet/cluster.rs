//! The bus a topology runs: one `shaddock broker`, one `nats-server`, or a cluster of
//! `nats-server` nodes routed to each other; and starting one of them again on the ports
//! it had (a restarted bus node, as a fleet restarts one).
//!
//! Cluster nodes bind port 0 for clients and routes alike. Node 0 starts first; each
//! later node is given the route addresses of the nodes before it (`--routes`), and the
//! cluster's gossip completes the mesh. The cluster is ready when every node's
//! monitoring `/routez` lists a route to each other node. A node started again takes
//! its old client and route ports, and routes to the others' route ports.
//!
//! Every nats-server node runs from a config file of its own, for what nats-server has
//! no flags for: its lame duck settings ([`TopologySpec::lame_duck_grace`]).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

#[cfg(doc)]
use super::TopologySpec;
use super::{BrokerSpec, Proc, READY_TIMEOUT, ROUTE_LINE, Role, Topology};

/// The cluster name every node is given (`--cluster_name`).
const CLUSTER_NAME: &str = "shaddock-fleet";
/// How often readiness of the routes is polled.
const ROUTES_POLL: Duration = Duration::from_millis(20);
/// Largest `/routez` answer read (a few routes' JSON is a few KiB).
const MAX_MONITOR_BYTES: u64 = 1 << 20;
/// What every nats-server node is configured with for lame duck mode: the spec's grace
/// period, and the shortest duration nats-server accepts (30 s; it closes clients at
/// most 1 s apart, so a node with a few clients is gone a few seconds after the grace).
fn node_conf(grace: Duration) -> String {
    format!(
        "lame_duck_grace_period: \"{}ms\"\nlame_duck_duration: \"30s\"\n",
        grace.as_millis()
    )
}

/// A port free on 127.0.0.1 now (the kernel's pick, its listener closed again): a
/// JetStream cluster's route port, which every node must know before any starts.
fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).context("picking a route port")?;
    Ok(listener.local_addr()?)
}

/// One bus process: what runs it and the ports it took.
#[derive(Debug, Clone)]
pub(super) struct BusNode {
    role: Role,
    program: PathBuf,
    /// `shaddock broker` (which takes the `broker` subcommand first).
    shaddock: bool,
    client: SocketAddr,
    /// A cluster node's route address.
    route: Option<SocketAddr>,
}

impl Topology {
    /// Starts the bus the spec asks for (not [`BrokerSpec::Urls`]) and sets the URLs
    /// gates and workers get.
    pub(super) async fn start_bus(&mut self, deadline: Instant) -> anyhow::Result<()> {
        let (shaddock, nodes) = match self.spec.broker {
            BrokerSpec::Embedded => (true, 1),
            BrokerSpec::NatsServer => (false, 1),
            BrokerSpec::NatsCluster(n) if n >= 2 => (false, n),
            BrokerSpec::NatsCluster(n) => {
                bail!("a nats-server cluster needs 2 nodes or more, not {n}")
            }
            BrokerSpec::Urls(_) => bail!("BrokerSpec::Urls starts no bus"),
        };
        let program = if shaddock {
            self.spec.shaddock_bin.clone()
        } else {
            crate::go_binary("nats-server").context(
                "nats-server not found on PATH nor in $(go env GOPATH)/bin \
                 (go install github.com/nats-io/nats-server/v2@latest)",
            )?
        };
        let cluster = nodes > 1;
        // A JetStream cluster starts only with its routes configured: each node is
        // given every other's route port, picked free beforehand (and so planned in
        // `bus` before any starts).
        let planned = cluster && self.spec.jetstream;
        let count = nodes;
        let mut nodes: Vec<BusNode> = Vec::with_capacity(count);
        for n in 0..count {
            let role = if cluster { Role::Node(n) } else { Role::Broker };
            let route = match planned {
                true => Some(free_port()?),
                false => cluster.then(|| SocketAddr::from(([127, 0, 0, 1], 0))),
            };
            nodes.push(BusNode {
                role,
                program: program.clone(),
                shaddock,
                client: SocketAddr::from(([127, 0, 0, 1], 0)),
                route,
            });
        }
        if planned {
            self.bus.clone_from(&nodes);
        }
        for (n, node) in nodes.into_iter().enumerate() {
            let started = self.start_node(node, deadline).await?;
            match planned {
                true => self.bus[n] = started,
                false => self.bus.push(started),
            }
        }
        if cluster {
            for n in 0..count {
                self.await_routes(n, deadline).await?;
            }
        }
        self.nats = self
            .bus
            .iter()
            .map(|b| format!("nats://{}", b.client))
            .collect();
        Ok(())
    }

    /// The bus nodes' roles, in node order: `[Broker]`, or `[Node(0), Node(1), ...]`.
    pub fn bus_roles(&self) -> Vec<Role> {
        self.bus.iter().map(|b| b.role.clone()).collect()
    }

    /// Starts bus node `index` again on the ports it had, after it was stopped
    /// ([`Topology::stop_one`]), and waits until it is ready (for a cluster node: routed
    /// to every other node again).
    pub async fn restart_bus_node(&mut self, index: usize) -> anyhow::Result<()> {
        let node = self
            .bus
            .get(index)
            .cloned()
            .with_context(|| format!("no bus node {index}"))?;
        if self.procs.iter().any(|p| p.role == node.role) {
            bail!("{} is still running: stop it first", node.role);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        self.start_node(node, deadline).await?;
        if self.bus.len() > 1 {
            self.await_routes(index, deadline).await?;
        }
        Ok(())
    }

    /// Starts one bus process with `node`'s ports (port 0: any) and waits for it to
    /// listen; returns `node` with the ports it took.
    async fn start_node(
        &mut self,
        mut node: BusNode,
        deadline: Instant,
    ) -> anyhow::Result<BusNode> {
        let port = |a: SocketAddr| match a.port() {
            0 => "-1".to_owned(),
            p => p.to_string(),
        };
        let mut args: Vec<String> = Vec::new();
        if node.shaddock {
            args.push("broker".to_owned());
        }
        args.extend([
            "-a".to_owned(),
            "127.0.0.1".to_owned(),
            "-p".to_owned(),
            port(node.client),
        ]);
        // A cluster needs the monitoring port for its readiness (`/routez`).
        if self.spec.metrics || node.route.is_some() {
            args.extend(["-m".to_owned(), "-1".to_owned()]);
        }
        // Each nats-server node's own config file, removed when the node is gone.
        let conf = (!node.shaddock)
            .then(|| crate::temp_file("nats-node.conf", &node_conf(self.spec.lame_duck_grace)));
        if let Some(conf) = &conf {
            args.extend(["-c".to_owned(), conf.display().to_string()]);
        }
        if let Some(route) = node.route {
            let others: Vec<String> = self
                .bus
                .iter()
                .filter(|b| b.role != node.role)
                .filter_map(|b| b.route.map(|r| format!("nats://{r}")))
                .collect();
            args.extend([
                "--cluster_name".to_owned(),
                CLUSTER_NAME.to_owned(),
                "--cluster".to_owned(),
                format!("nats://127.0.0.1:{}", port(route)),
            ]);
            if !others.is_empty() {
                args.extend(["--routes".to_owned(), others.join(",")]);
            }
        }
        // JetStream's files: a directory per node start, removed with the process.
        let store_dir = (self.spec.jetstream && !node.shaddock).then(|| {
            static STARTS: AtomicUsize = AtomicUsize::new(0);
            let start = STARTS.fetch_add(1, Ordering::Relaxed);
            std::env::temp_dir().join(format!("shaddock-js-{}-{start}", std::process::id()))
        });
        if let Some(dir) = &store_dir {
            args.extend(["--jetstream".to_owned(), "--store_dir".to_owned()]);
            args.push(dir.display().to_string());
            // A JetStream cluster's nodes are named (its RAFT groups know them by name).
            args.extend(["--server_name".to_owned(), node.role.to_string()]);
        }
        let log_dir = self.spec.log_dir.as_deref();
        let mut proc = match Proc::spawn(node.role.clone(), &node.program, &args, log_dir) {
            Ok(proc) => proc,
            Err(e) => {
                conf.map(std::fs::remove_file);
                return Err(e);
            }
        };
        if let Some(conf) = conf {
            proc.process.remove_on_drop(conf);
        }
        if let Some(dir) = store_dir {
            proc.process.remove_on_drop(dir);
        }
        let waited = if node.route.is_some() {
            // Logged after "Server is ready": the route port is known only then.
            proc.wait_line(ROUTE_LINE, deadline).await
        } else {
            proc.wait_line("Server is ready", deadline).await
        };
        let pushed = self.procs.len();
        self.procs.push(proc);
        waited?;
        let proc = &mut self.procs[pushed];
        node.client = proc
            .listen
            .with_context(|| format!("{} never logged its client address", proc.describe()))?;
        if node.route.is_some() {
            node.route =
                Some(proc.route.with_context(|| {
                    format!("{} never logged its route address", proc.describe())
                })?);
        }
        // Only our broker serves Prometheus text on its monitoring port.
        if node.shaddock {
            proc.metrics = proc.monitor.map(|a| format!("http://{a}/metrics"));
        }
        Ok(node)
    }

    /// Waits until cluster node `index` has a route to every other node.
    async fn await_routes(&self, index: usize, deadline: Instant) -> anyhow::Result<()> {
        let role = &self.bus[index].role;
        let proc = self
            .procs
            .iter()
            .find(|p| &p.role == role)
            .with_context(|| format!("{role} is not running"))?;
        let monitor = proc
            .monitor
            .with_context(|| format!("{} never logged its monitoring address", proc.describe()))?;
        let want = self.bus.len() - 1;
        loop {
            let seen = match http_get(monitor, "/routez").await {
                Ok(body) => distinct_routes(&body),
                Err(_) => 0,
            };
            if seen >= want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} has routes to {seen} of the {want} other cluster nodes after the ready timeout",
                    proc.describe()
                );
            }
            tokio::time::sleep(ROUTES_POLL).await;
        }
    }

    /// The names of the client connections bus node `index` has now, from its
    /// monitoring `/connz`: which processes are connected to it.
    pub async fn node_connection_names(&self, index: usize) -> anyhow::Result<Vec<String>> {
        let role = &self.bus.get(index).context("no such bus node")?.role;
        let monitor = (self.procs.iter())
            .find(|p| &p.role == role)
            .and_then(|p| p.monitor)
            .with_context(|| format!("{role} is not running, or has no monitoring address"))?;
        let connz = http_get(monitor, "/connz?limit=1024").await?;
        Ok(connection_names(&connz))
    }
}

/// The connection names a `/connz` answer lists (an unnamed connection: "").
fn connection_names(connz: &str) -> Vec<String> {
    let Ok(json) = serde_json::from_str::<serde_json::Value>(connz) else {
        return Vec::new();
    };
    let connections = json["connections"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    (connections.iter())
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Other nodes a `/routez` answer lists (nats-server opens a pool of routes to each).
fn distinct_routes(routez: &str) -> usize {
    let Ok(json) = serde_json::from_str::<serde_json::Value>(routez) else {
        return 0;
    };
    let routes = json["routes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    routes
        .iter()
        .filter_map(|r| r["remote_id"].as_str())
        .collect::<HashSet<_>>()
        .len()
}

/// The body of `GET path` from an HTTP server on loopback (HTTP/1.0: the server closes
/// after the answer, so the body is the rest of the stream).
pub(super) async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut answer = Vec::new();
    stream
        .take(MAX_MONITOR_BYTES)
        .read_to_end(&mut answer)
        .await?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("an HTTP answer without a body")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_count_each_other_node_once() {
        let routez = r#"{"num_routes":4,"routes":[{"rid":1,"remote_id":"A"},{"rid":2,"remote_id":"A"},
            {"rid":3,"remote_id":"B"},{"rid":4,"remote_id":"B"}]}"#;
        assert_eq!(distinct_routes(routez), 2);
        assert_eq!(distinct_routes(r#"{"num_routes":0,"routes":null}"#), 0);
        assert_eq!(distinct_routes("not json"), 0);
    }

    #[test]
    fn connections_are_listed_by_name() {
        let connz = r#"{"num_connections":2,"connections":[{"cid":5,"name":"shaddock-worker-arena"},{"cid":6}]}"#;
        assert_eq!(connection_names(connz), ["shaddock-worker-arena", ""]);
        assert!(connection_names(r#"{"connections":null}"#).is_empty());
        assert!(connection_names("not json").is_empty());
    }
}
