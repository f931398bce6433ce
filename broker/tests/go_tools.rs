//! Smoke tests with the Go NATS example tools (nats-pub, nats-sub, nats-qsub, nats-req,
//! nats-rply, nats-bench) against our `broker` binary, started the way client test suites
//! start nats-server. Each test also runs against the real nats-server, which pins what
//! the tools print.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use broker::testing::pki::Pki;
use broker::testing::{
    DEADLINE, ExternalServer, find_go_binary, nats_server_path, spawn_server_binary,
};

/// A running Go tool whose stdout and stderr lines (it logs to stderr) arrive on one
/// channel; killed by its own pid and reaped on drop.
struct Tool {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Tool {
    fn spawn(name: &str, args: &[&str]) -> Tool {
        let mut child = Command::new(find_go_binary(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        forward_lines(child.stdout.take().unwrap(), tx.clone());
        forward_lines(child.stderr.take().unwrap(), tx);
        Tool {
            name: name.to_string(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits up to [`DEADLINE`] for a line satisfying `matches` and returns it.
    fn wait_for(&mut self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if matches(&line) => return line,
                Ok(line) => self.seen.push(line),
                Err(e) => panic!(
                    "{} never printed {what} ({e:?}); it printed:\n{}",
                    self.name,
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits up to [`DEADLINE`] for the tool to exit; returns its status and every line.
    fn finish(mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                // Both pipes closed: the tool has exited (or closed them on its way out).
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "{} did not finish in time; it printed:\n{}",
                    self.name,
                    self.seen.join("\n")
                ),
            }
        }
        let status = self.child.wait().unwrap();
        (status, self.seen.join("\n"))
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn forward_lines(pipe: impl Read + Send + 'static, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
}

fn run(name: &str, args: &[&str]) -> (ExitStatus, String) {
    Tool::spawn(name, args).finish()
}

fn start_ours() -> ExternalServer {
    spawn_server_binary(env!("CARGO_BIN_EXE_broker").as_ref(), &[])
}

fn start_nats_server() -> ExternalServer {
    spawn_server_binary(&nats_server_path(), &[])
}

/// For each check, a module with tests `ours` (our broker binary) and `nats_server`.
macro_rules! against_both {
    ($($check:ident),* $(,)?) => {$(
        mod $check {
            #[test]
            fn ours() {
                let server = super::start_ours();
                super::$check(&server.url);
            }

            #[test]
            fn nats_server() {
                let server = super::start_nats_server();
                super::$check(&server.url);
            }
        }
    )*};
}

against_both!(
    sub_prints_published_message,
    qsub_prints_published_message,
    req_gets_rply_answer,
    req_without_responder_reports_no_responders,
    bench_completes,
);

fn sub_prints_published_message(url: &str) {
    let mut sub = Tool::spawn("nats-sub", &["-s", url, "greet"]);
    sub.wait_for("its ready line", |l| l == "Listening on [greet]");
    let (status, out) = run("nats-pub", &["-s", url, "greet", "hello there"]);
    assert!(status.success(), "nats-pub failed:\n{out}");
    assert!(out.contains("Published [greet] : 'hello there'"), "{out}");
    sub.wait_for("the message", |l| {
        l == "[#1] Received on [greet]: 'hello there'"
    });
}

fn qsub_prints_published_message(url: &str) {
    let mut qsub = Tool::spawn("nats-qsub", &["-s", url, "jobs", "workers"]);
    qsub.wait_for("its ready line", |l| {
        l == "Listening on [jobs], queue group [workers]"
    });
    let (status, out) = run("nats-pub", &["-s", url, "jobs", "do it"]);
    assert!(status.success(), "nats-pub failed:\n{out}");
    qsub.wait_for("the message", |l| {
        l.starts_with("[#1] Received on [jobs] Queue[workers] Pid[") && l.ends_with("]: 'do it'")
    });
}

fn req_gets_rply_answer(url: &str) {
    let mut rply = Tool::spawn("nats-rply", &["-s", url, "help", "the answer"]);
    rply.wait_for("its ready line", |l| l == "Listening on [help]");
    let (status, out) = run("nats-req", &["-s", url, "help", "question"]);
    assert!(status.success(), "nats-req failed:\n{out}");
    assert!(out.contains("Published [help] : 'question'"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("Received  [_INBOX.") && l.ends_with("] : 'the answer'")),
        "{out}"
    );
    rply.wait_for("the request", |l| {
        l == "[#1] Received on [help]: 'question'"
    });
}

fn req_without_responder_reports_no_responders(url: &str) {
    let (status, out) = run("nats-req", &["-s", url, "nobody.home", "hello?"]);
    assert!(!status.success(), "{out}");
    assert!(out.contains("no responders available"), "{out}");
}

fn bench_completes(url: &str) {
    let args = [
        "-s", url, "-np", "1", "-ns", "1", "-n", "10000", "-ms", "16",
    ];
    let (status, out) = run("nats-bench", &[&args[..], &["bench.subject"]].concat());
    assert!(status.success(), "nats-bench failed:\n{out}");
    assert!(out.contains("NATS Pub/Sub stats"), "{out}");
    assert!(out.contains(" Pub stats"), "{out}");
    assert!(out.contains(" Sub stats"), "{out}");
}

/// nats-sub and nats-pub over TLS, trusting the test CA with `-tlscacert`, against a
/// server started with nats-server's TLS flags; `verify` adds client certificates.
fn tls_sub_prints_published_message(binary: &std::path::Path, verify: bool) {
    let pki = Pki::new();
    let (cert, key, ca) = (
        pki.server.cert.to_str().unwrap(),
        pki.server.key.to_str().unwrap(),
        pki.ca.to_str().unwrap(),
    );
    let mut flags = vec!["--tls", "--tlscert", cert, "--tlskey", key];
    if verify {
        flags.extend(["--tlsverify", "--tlscacert", ca]);
    }
    let server = spawn_server_binary(binary, &flags);
    let url = server.url.as_str();
    let mut client = vec!["-s", url, "-tlscacert", ca];
    if verify {
        let (cert, key) = (&pki.client.cert, &pki.client.key);
        client.extend(["-tlscert", cert.to_str().unwrap()]);
        client.extend(["-tlskey", key.to_str().unwrap()]);
    }
    let mut sub = Tool::spawn("nats-sub", &[&client[..], &["secure"]].concat());
    sub.wait_for("its ready line", |l| l == "Listening on [secure]");
    let (status, out) = run("nats-pub", &[&client[..], &["secure", "sealed"]].concat());
    assert!(status.success(), "nats-pub failed:\n{out}");
    sub.wait_for("the message", |l| {
        l == "[#1] Received on [secure]: 'sealed'"
    });
    if verify {
        // Without a client certificate the handshake is refused.
        let bare = ["-s", url, "-tlscacert", ca, "secure", "x"];
        let (status, out) = run("nats-pub", &bare);
        assert!(!status.success(), "published without a certificate:\n{out}");
    }
}

mod tls {
    use super::*;

    #[test]
    fn ours() {
        tls_sub_prints_published_message(env!("CARGO_BIN_EXE_broker").as_ref(), false);
    }

    #[test]
    fn nats_server() {
        tls_sub_prints_published_message(&nats_server_path(), false);
    }

    #[test]
    fn ours_verifying_clients() {
        tls_sub_prints_published_message(env!("CARGO_BIN_EXE_broker").as_ref(), true);
    }

    #[test]
    fn nats_server_verifying_clients() {
        tls_sub_prints_published_message(&nats_server_path(), true);
    }
}
