//! Real processes for fleet tests: a nats-server cluster with routes on free ports, and
//! `shaddock gate` and `shaddock worker` processes. Every child is waited on by its log
//! lines (never by sleeping), signalled and reaped by its own pid, and killed when its
//! handle drops, so a failing test leaves nothing behind.

#![allow(dead_code)] // each test file uses a different part of the harness

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker::testing::{nats_server_path, temp_file};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tokio::time::timeout;

/// Any single wait: generous for a loaded two-core machine running debug builds.
pub const WAIT: Duration = Duration::from_secs(20);

/// A child process whose stderr is read line by line for as long as it runs.
pub struct Process {
    pub name: String,
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    log: Arc<Mutex<Vec<String>>>,
    /// Files removed once the process is gone (a config file).
    temp_files: Vec<PathBuf>,
}

impl Process {
    /// Starts `program args` with `env`, no inherited `SHADDOCK_*` variables, and its
    /// stderr piped to [`Process::line`].
    pub fn spawn(
        name: &str,
        program: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(|k| k.starts_with("SHADDOCK_")) {
                command.env_remove(key);
            }
        }
        command.envs(env.iter().copied());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                kept.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Process {
            name: name.to_owned(),
            child,
            lines,
            log,
            temp_files: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line containing `text`, within [`WAIT`]; panics with the log otherwise.
    pub async fn line(&mut self, text: &str) -> String {
        self.line_within(text, WAIT).await
    }

    /// The next line containing `text`, within `wait`; panics with the log otherwise.
    pub async fn line_within(&mut self, text: &str, wait: Duration) -> String {
        let found = timeout(wait, async {
            while let Some(line) = self.lines.recv().await {
                if line.contains(text) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            Ok(None) => panic!(
                "{} ended without logging {text:?}:\n{}",
                self.name,
                self.log()
            ),
            Err(_) => panic!(
                "{} did not log {text:?} in time:\n{}",
                self.name,
                self.log()
            ),
        }
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Sends `signal` to this process (only while it is ours: not yet reaped).
    pub fn signal(&mut self, signal: Signal) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill(Pid::from_raw(self.pid() as i32), signal).unwrap();
        }
    }

    /// Waits for it to exit (its stderr closes first), within [`WAIT`].
    pub async fn exit(&mut self) -> ExitStatus {
        let closed = timeout(WAIT, async { while self.lines.recv().await.is_some() {} }).await;
        assert!(
            closed.is_ok(),
            "{} did not exit in time:\n{}",
            self.name,
            self.log()
        );
        self.child.wait().unwrap()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for path in &self.temp_files {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The first whitespace-separated word after `phrase` in `line`.
pub fn word_after<'a>(line: &'a str, phrase: &str) -> &'a str {
    let (_, rest) = line
        .split_once(phrase)
        .unwrap_or_else(|| panic!("no {phrase:?} in {line:?}"));
    rest.split_whitespace().next().unwrap_or_default()
}

/// One nats-server of a [`NatsCluster`].
pub struct NatsNode {
    pub process: Process,
    /// `nats://127.0.0.1:PORT`, its client URL.
    pub url: String,
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
            let path = temp_file("cluster-node.conf", &conf);
            let mut process = Process::spawn(
                &format!("nats-server n{i}"),
                &nats_server_path(),
                &["-c", path.to_str().unwrap()],
                &[],
            );
            process.temp_files.push(path);
            let client = process.line("Listening for client connections on ").await;
            let url = format!("nats://{}", word_after(&client, "client connections on "));
            let route = process.line("Listening for route connections on ").await;
            let route_url = format!("nats://{}", word_after(&route, "route connections on "));
            nodes.push(NatsNode {
                process,
                url,
                route_url,
            });
        }
        let cluster = NatsCluster { nodes };
        cluster.wait_meshed().await;
        cluster
    }

    /// Every node's client URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url.clone()).collect()
    }

    /// Waits until a request published on each node is answered by a subscriber on
    /// each other node: then every route is up.
    async fn wait_meshed(&self) {
        let mut clients = Vec::new();
        for node in &self.nodes {
            clients.push(
                services::connect(
                    std::slice::from_ref(&node.url),
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
        timeout(WAIT, async {
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
    let args: Vec<&str> = args.iter().chain(extra).copied().collect();
    Process::spawn(
        name,
        env!("CARGO_BIN_EXE_shaddock").as_ref(),
        &args,
        &[("RUST_LOG", "info")],
    )
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
    let listening = process
        .line("Gate listening for WebSocket clients on ")
        .await;
    let addr = word_after(&listening, "WebSocket clients on ").to_owned();
    process.line("Gate is ready").await;
    (process, format!("ws://{addr}"))
}
