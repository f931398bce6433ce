//! Smoke tests with the Go NATS example tools (nats-pub, nats-sub, nats-qsub, nats-req,
//! nats-rply, nats-bench) on both buses: our broker, and the real nats-server, which
//! pins what the tools print. Over TLS, our `broker` binary is started with
//! nats-server's TLS flags, the way client test suites start nats-server.

use std::process::{Command, ExitStatus};

use broker::testing::Bus;
use broker::testing::pki::Pki;
use testkit::{NatsServer, Process, find_go_binary, nats_server_path};

/// Starts the Go tool `name` with `args`; it logs to stderr and prints to stdout, both
/// in its log.
fn tool(name: &str, args: &[&str]) -> Process {
    let mut command = Command::new(find_go_binary(name));
    command.args(args);
    Process::spawn(name, command)
}

/// Runs the Go tool `name` to its end; its status and everything it printed.
async fn run(name: &str, args: &[&str]) -> (ExitStatus, String) {
    let mut tool = tool(name, args);
    let status = tool.exit().await;
    (status, tool.log())
}

broker::on_both_buses!(
    sub_prints_published_message,
    qsub_prints_published_message,
    req_gets_rply_answer,
    req_without_responder_reports_no_responders,
    bench_completes,
);

async fn sub_prints_published_message(bus: Bus) {
    let url = bus.url();
    let mut sub = tool("nats-sub", &["-s", url, "greet"]);
    sub.line("Listening on [greet]").await;
    let (status, out) = run("nats-pub", &["-s", url, "greet", "hello there"]).await;
    assert!(status.success(), "nats-pub failed:\n{out}");
    assert!(out.contains("Published [greet] : 'hello there'"), "{out}");
    sub.line("[#1] Received on [greet]: 'hello there'").await;
}

async fn qsub_prints_published_message(bus: Bus) {
    let url = bus.url();
    let mut qsub = tool("nats-qsub", &["-s", url, "jobs", "workers"]);
    qsub.line("Listening on [jobs], queue group [workers]")
        .await;
    let (status, out) = run("nats-pub", &["-s", url, "jobs", "do it"]).await;
    assert!(status.success(), "nats-pub failed:\n{out}");
    let received = qsub
        .line("[#1] Received on [jobs] Queue[workers] Pid[")
        .await;
    assert!(received.ends_with("]: 'do it'"), "{received}");
}

async fn req_gets_rply_answer(bus: Bus) {
    let url = bus.url();
    let mut rply = tool("nats-rply", &["-s", url, "help", "the answer"]);
    rply.line("Listening on [help]").await;
    let (status, out) = run("nats-req", &["-s", url, "help", "question"]).await;
    assert!(status.success(), "nats-req failed:\n{out}");
    assert!(out.contains("Published [help] : 'question'"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("Received  [_INBOX.") && l.ends_with("] : 'the answer'")),
        "{out}"
    );
    rply.line("[#1] Received on [help]: 'question'").await;
}

async fn req_without_responder_reports_no_responders(bus: Bus) {
    let url = bus.url();
    let (status, out) = run("nats-req", &["-s", url, "nobody.home", "hello?"]).await;
    assert!(!status.success(), "{out}");
    assert!(out.contains("no responders available"), "{out}");
}

async fn bench_completes(bus: Bus) {
    let url = bus.url();
    let args = [
        "-s", url, "-np", "1", "-ns", "1", "-n", "10000", "-ms", "16",
    ];
    let (status, out) = run("nats-bench", &[&args[..], &["bench.subject"]].concat()).await;
    assert!(status.success(), "nats-bench failed:\n{out}");
    assert!(out.contains("NATS Pub/Sub stats"), "{out}");
    assert!(out.contains(" Pub stats"), "{out}");
    assert!(out.contains(" Sub stats"), "{out}");
}

/// nats-sub and nats-pub over TLS, trusting the test CA with `-tlscacert`, against a
/// server started with nats-server's TLS flags; `verify` adds client certificates.
async fn tls_sub_prints_published_message(binary: &std::path::Path, verify: bool) {
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
    let server = NatsServer::start_binary(binary, &flags).await;
    let url = server.url.as_str();
    let mut client = vec!["-s", url, "-tlscacert", ca];
    if verify {
        let (cert, key) = (&pki.client.cert, &pki.client.key);
        client.extend(["-tlscert", cert.to_str().unwrap()]);
        client.extend(["-tlskey", key.to_str().unwrap()]);
    }
    let mut sub = tool("nats-sub", &[&client[..], &["secure"]].concat());
    sub.line("Listening on [secure]").await;
    let (status, out) = run("nats-pub", &[&client[..], &["secure", "sealed"]].concat()).await;
    assert!(status.success(), "nats-pub failed:\n{out}");
    sub.line("[#1] Received on [secure]: 'sealed'").await;
    if verify {
        // Without a client certificate the handshake is refused.
        let bare = ["-s", url, "-tlscacert", ca, "secure", "x"];
        let (status, out) = run("nats-pub", &bare).await;
        assert!(!status.success(), "published without a certificate:\n{out}");
    }
}

mod tls {
    use super::*;

    #[tokio::test]
    async fn ours() {
        tls_sub_prints_published_message(env!("CARGO_BIN_EXE_broker").as_ref(), false).await;
    }

    #[tokio::test]
    async fn nats_server() {
        tls_sub_prints_published_message(&nats_server_path(), false).await;
    }

    #[tokio::test]
    async fn ours_verifying_clients() {
        tls_sub_prints_published_message(env!("CARGO_BIN_EXE_broker").as_ref(), true).await;
    }

    #[tokio::test]
    async fn nats_server_verifying_clients() {
        tls_sub_prints_published_message(&nats_server_path(), true).await;
    }
}
