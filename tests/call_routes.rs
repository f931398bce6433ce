//! The terminal tools against a real `shaddock up` on free ports: `shaddock call` (one
//! request, `--listen`, `--repl`, tokens, keys), `shaddock routes` (tables and JSON), and
//! the URLs `up` prints once ready, each dialled. Every process is waited on by its
//! output lines (never a sleep) and stopped by its own pid when its handle drops.

use std::path::Path;
use std::process::{Command, ExitStatus};

use nix::sys::signal::Signal;
use testkit::fleet::UP_FREE_PORTS;
use testkit::{Process, temp_file, within, word_after};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_shaddock");

/// A running `shaddock up` and the URLs it printed.
struct Up {
    /// Kept for its pid: the process stops when this drops.
    _process: Process,
    ws: String,
    demo: String,
    nats: String,
    monitor: String,
    metrics: String,
}

/// Starts `shaddock up` with every port free-picked and `extra` flags, and reads the
/// URLs it prints after `Server is ready`.
async fn up(extra: &[&str]) -> Up {
    let mut command = Command::new(BIN);
    command
        .arg("up")
        .args(UP_FREE_PORTS)
        // Tests run side by side: no two share the default data directory.
        .arg("--store=memory")
        .args(extra)
        .env("RUST_LOG", "info");
    let mut process = Process::spawn("shaddock up", command);
    process.line("Server is ready").await;
    let mut url = async |label: &str| word_after(&process.line(label).await, label).to_owned();
    let ws = url("WebSocket clients:").await;
    let demo = url("Demo page:").await;
    let nats = url("NATS:").await;
    let monitor = url("NATS monitoring:").await;
    let metrics = url("Metrics:").await;
    Up {
        _process: process,
        ws,
        demo,
        nats,
        monitor,
        metrics,
    }
}

/// `shaddock ARGS`, its output read into its log.
fn shaddock(name: &str, args: &[&str]) -> Process {
    let mut command = Command::new(BIN);
    command.args(args).env("RUST_LOG", "warn");
    Process::spawn(name, command)
}

/// `shaddock call ARGS` with `input` on its stdin (a file: the test kit gives children
/// no stdin of their own). `exec` keeps the pid the call's own.
fn call_with_input(input: &str, args: &[&str]) -> Process {
    let path = temp_file("call-input.txt", input);
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(r#"input="$1"; shift; exec "$@" < "$input""#)
        .arg("sh")
        .arg(&path)
        .arg(BIN)
        .arg("call")
        .args(args)
        .env("RUST_LOG", "warn");
    let mut process = Process::spawn("shaddock call (stdin)", command);
    process.remove_on_drop(path);
    process
}

/// Waits for `process` to end; returns how, its JSON lines (stdout's) and its whole
/// log (stderr's lines too).
async fn finished(mut process: Process) -> (ExitStatus, Vec<String>, String) {
    let status = process.exit().await;
    let log = process.log();
    let json = log
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(str::to_owned)
        .collect();
    (status, json, log)
}

/// `shaddock call ARGS` to its end.
async fn call(args: &[&str]) -> (ExitStatus, Vec<String>, String) {
    let mut argv = vec!["call"];
    argv.extend_from_slice(args);
    finished(shaddock("shaddock call", &argv)).await
}

/// The status line and headers of a plain HTTP GET of `url` (`http://HOST:PORT/PATH`).
async fn http_head(url: &str) -> String {
    let response = http_get(url).await;
    let head = response.split("\r\n\r\n").next().unwrap_or_default();
    head.to_owned()
}

/// What `shaddock call` prints for `chat.login` as `name`: the name, and the display
/// name and colour of its default profile (`up` runs the profile service).
fn logged_in(name: &str) -> String {
    let color = services::profile::default_profile(name).color;
    format!(r#"{{"code":200,"body":{{"name":"{name}","display":"{name}","color":"{color}"}}}}"#)
}

/// The whole response to a plain HTTP GET of `url`.
async fn http_get(url: &str) -> String {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream = within(TcpStream::connect(host)).await.unwrap();
    let request = format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    within(stream.read_to_end(&mut response)).await.unwrap();
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn up_prints_the_urls_it_is_reached_on() {
    let up = up(&[]).await;
    for url in [&up.ws, &up.demo, &up.nats, &up.monitor, &up.metrics] {
        assert!(
            !url.contains("0.0.0.0") && !url.ends_with(":0") && !url.contains(":0/"),
            "{url} is not a URL to dial"
        );
    }
    assert!(up.ws.starts_with("ws://127.0.0.1:"), "{}", up.ws);
    assert_eq!(up.demo, format!("http://{}/", &up.ws["ws://".len()..]));
    // The gate: a request through the printed URL.
    let (status, json, log) = call(&[&up.ws, "echo.echo", r#"{"body":"aGk="}"#]).await;
    assert!(status.success(), "{log}");
    assert_eq!(json, [r#"{"code":200,"body":{"body":"aGk="}}"#], "{log}");
    // The demo page, on the gate's port.
    let page = http_head(&up.demo).await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.to_lowercase().contains("text/html"), "{page}");
    // The metrics and the broker's monitoring.
    let metrics = http_head(&up.metrics).await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let varz = http_head(&format!("{}varz", up.monitor)).await;
    assert!(varz.starts_with("HTTP/1.1 200"), "{varz}");
    // The bus: the workers' announcements heard through the printed NATS URL.
    let routes = shaddock("shaddock routes", &["routes", "--nats", &up.nats]);
    let (status, _, log) = finished(routes).await;
    assert!(status.success(), "{log}");
    assert!(log.contains("echo.echo"), "{log}");
}

#[tokio::test]
async fn call_prints_one_answer_as_one_json_line() {
    let up = up(&[]).await;
    let ws = up.ws.as_str();
    let (status, json, log) = call(&[ws, "echo.echo", r#"{"body":"aGk="}"#]).await;
    assert!(status.success(), "{log}");
    assert_eq!(json, [r#"{"code":200,"body":{"body":"aGk="}}"#], "{log}");
    // chat.login calls the profile service (keyed by uid) for the display name and
    // colour, and the chat worker's metrics count the call.
    let (status, json, log) = call(&[ws, "chat.login", r#"{"name":"ann"}"#]).await;
    assert!(status.success(), "{log}");
    assert_eq!(json, [logged_in("ann")], "{log}");
    let metrics = http_get(&up.metrics).await;
    let counted = metrics.lines().any(|line| {
        line.starts_with("worker_calls_total{")
            && line.contains(r#"route="profile.get""#)
            && line.contains(r#"code="200""#)
            && line.ends_with(" 1")
    });
    assert!(counted, "no profile.get call counted:\n{metrics}");
    // A raw route: a JSON string in, a string out.
    let (status, json, log) = call(&[ws, "echo.raw", r#""hello""#]).await;
    assert!(status.success(), "{log}");
    assert_eq!(json, [r#"{"code":200,"body":"hello"}"#], "{log}");
    // Not 200: the answer, its message, and a failing exit status.
    let (status, json, log) = call(&[ws, "chat.say", r#"{"room":"r","text":"hi"}"#]).await;
    assert!(!status.success(), "{log}");
    let answer: serde_json::Value = serde_json::from_str(&json[0]).unwrap();
    assert_eq!(answer["code"], 401, "{log}");
    assert!(
        answer["message"].as_str().unwrap().contains("log in"),
        "{log}"
    );
    // A body that is not JSON is refused before anything is dialled (nothing listens
    // on port 1: a dial would fail otherwise).
    let (status, json, log) = call(&["ws://127.0.0.1:1", "chat.login", "{name: ann}"]).await;
    assert!(!status.success(), "{log}");
    assert!(json.is_empty(), "{log}");
    assert!(log.contains("not JSON"), "{log}");
    assert!(!log.contains("connect"), "{log}");
    // No gate: no answer, a failing status.
    let (status, _, log) = call(&["ws://127.0.0.1:1", "echo.echo"]).await;
    assert!(!status.success(), "{log}");
    assert!(log.contains("connect failed"), "{log}");
}

#[tokio::test]
async fn call_routes_a_keyed_request_by_its_key() {
    let up = up(&[]).await;
    let join = ["arena.join", r#"{"match":"m1"}"#];
    let (status, json, log) = call(&[&up.ws, join[0], join[1]]).await;
    assert!(!status.success(), "{log}");
    assert!(
        json[0].contains(r#""code":400"#) && json[0].contains("give a key"),
        "{log}"
    );
    // With the key the gate routes it, and arena itself answers: who is this?
    let (status, json, log) = call(&["--key", "m1", &up.ws, join[0], join[1]]).await;
    assert!(!status.success(), "{log}");
    assert_eq!(
        json,
        [r#"{"code":401,"body":"","message":"log in first"}"#],
        "{log}"
    );
}

#[tokio::test]
async fn up_runs_only_the_services_named_so_a_worker_of_ones_own_serves_the_others() {
    let up = up(&["--services", "echo,arena"]).await;
    // Echo and arena are served in process; chat and profile by nothing: no worker of
    // theirs announces itself on the bus, and the gate knows no chat route.
    let (status, json, log) = call(&[&up.ws, "echo.echo", r#"{"body":"aGk="}"#]).await;
    assert!(status.success(), "{log}");
    assert_eq!(json, [r#"{"code":200,"body":{"body":"aGk="}}"#], "{log}");
    let announced = async || {
        let routes = shaddock(
            "shaddock routes --json",
            &["routes", "--json", "--nats", &up.nats],
        );
        let (status, json, log) = finished(routes).await;
        assert!(status.success(), "{log}");
        let doc: serde_json::Value = serde_json::from_str(&json[0]).unwrap();
        let services = doc["services"].as_array().unwrap().iter();
        let mut names: Vec<String> = services.map(|s| s["service"].to_string()).collect();
        names.sort();
        names
    };
    assert_eq!(announced().await, [r#""arena""#, r#""echo""#]);
    let (status, json, log) = call(&[&up.ws, "chat.login", r#"{"name":"ann"}"#]).await;
    assert!(!status.success(), "{log}");
    assert!(json[0].contains("no announced message types"), "{log}");
    // A chat worker of one's own, a separate process on the printed NATS URL (as one in
    // any language would be), serves it beside `up`. With no profile worker either,
    // the login falls back to the name alone (docs/chat.md, "Profiles").
    let mut command = Command::new(BIN);
    command
        .args(["worker", "--service", "chat", "--nats", &up.nats])
        .env("RUST_LOG", "info");
    let mut own = Process::spawn("own chat worker", command);
    own.line("Worker is ready").await;
    // The gate learns chat's types from the worker's announcement, a moment later.
    let (json, log) = within(async {
        loop {
            let (status, json, log) = call(&[&up.ws, "chat.login", r#"{"name":"ann"}"#]).await;
            if status.success() {
                break (json, log);
            }
            assert!(json[0].contains("no announced message types"), "{log}");
        }
    })
    .await;
    let answer: serde_json::Value = serde_json::from_str(&json[0]).unwrap();
    assert_eq!(answer["code"], 200, "{log}");
    assert_eq!(answer["body"]["name"], "ann", "{log}");
    // No profile: the name is the display name, and no colour.
    assert_eq!(answer["body"]["display"], "ann", "{log}");
    assert!(answer["body"].get("color").is_none_or(|c| c == ""), "{log}");
    assert_eq!(announced().await, [r#""arena""#, r#""chat""#, r#""echo""#]);
}

#[tokio::test]
async fn call_listen_prints_pushes_until_stopped() {
    let up = up(&[]).await;
    let mut ann = shaddock(
        "shaddock call --listen",
        &[
            "call",
            "--listen",
            &up.ws,
            "chat.login",
            r#"{"name":"ann"}"#,
        ],
    );
    ann.line(&logged_in("ann")).await;
    // Two requests on one session, from stdin.
    let bob = call_with_input(
        "chat.login {\"name\":\"bob\"}\nchat.whisper {\"to\":\"ann\",\"text\":\"psst\"}\n",
        &["--repl", &up.ws],
    );
    let (status, json, log) = finished(bob).await;
    assert!(status.success(), "{log}");
    assert_eq!(
        json,
        [logged_in("bob"), r#"{"code":200,"body":{}}"#.to_owned()],
        "{log}"
    );
    let color = services::profile::default_profile("bob").color;
    let whisper = format!(
        r#"{{"push":"chat.whisper","body":{{"from":"bob","text":"psst","display":"bob","color":"{color}"}}}}"#
    );
    ann.line(&whisper).await;
    ann.signal(Signal::SIGTERM);
    let status = ann.exit().await;
    assert!(status.success(), "{status}: {}", ann.log());
    // --for: listens that long, then ends on its own.
    let (status, json, log) = call(&["--for", "300ms", &up.ws, "echo.echo"]).await;
    assert!(status.success(), "{log}");
    assert_eq!(json, [r#"{"code":200,"body":{}}"#], "{log}");
}

#[tokio::test]
async fn call_repl_runs_one_session() {
    let up = up(&[]).await;
    let input = "\
# a comment, then a blank line

chat.login {\"name\":\"cat\"}
chat.join {\"room\":\"lobby\"}
chat.say {\"room\":\"lobby\",\"text\":\"hi\"}
chat.say not json
arena.join@m1 {\"match\":\"m1\"}
";
    let (status, json, log) = finished(call_with_input(input, &["--repl", &up.ws])).await;
    // The line that is not JSON is reported and fails the run; the others go on.
    assert!(!status.success(), "{log}");
    assert!(log.contains("not JSON"), "{log}");
    let pushes = |route: &str| {
        let prefix = format!(r#"{{"push":"{route}""#);
        json.iter().filter(|l| l.starts_with(&prefix)).count()
    };
    // Arena pushes its state every tick once joined; the rest is in order, a say's
    // message before its answer.
    let lines: Vec<&String> = json
        .iter()
        .filter(|l| !l.starts_with(r#"{"push":"arena.state""#))
        .collect();
    assert_eq!(lines.len(), 5, "{log}");
    assert_eq!(*lines[0], logged_in("cat"));
    assert_eq!(
        lines[1],
        r#"{"code":200,"body":{"room":"lobby","members":["cat"]}}"#
    );
    let color = services::profile::default_profile("cat").color;
    assert_eq!(
        *lines[2],
        format!(
            r#"{{"push":"chat.message","body":{{"room":"lobby","from":"cat","text":"hi","display":"cat","color":"{color}"}}}}"#
        )
    );
    assert_eq!(lines[3], r#"{"code":200,"body":{}}"#);
    assert!(
        lines[4].starts_with(r#"{"code":200,"body":{"match":"m1""#),
        "{log}"
    );
    assert_eq!(pushes("chat.message"), 1, "{log}");
}

#[tokio::test]
async fn call_with_a_token() {
    let up = up(&["--token", "s3cret"]).await;
    let ws = up.ws.as_str();
    for refused in [
        vec![ws, "echo.echo"],
        vec!["--token", "wrong", ws, "echo.echo"],
    ] {
        let (status, json, log) = call(&refused).await;
        assert!(!status.success(), "{log}");
        assert!(json.is_empty(), "{log}");
        assert!(
            log.contains("refused the session: 401 token refused"),
            "{log}"
        );
    }
    let (status, json, log) = call(&["--token", "s3cret", ws, "echo.echo"]).await;
    assert!(status.success(), "{log}");
    assert_eq!(json, [r#"{"code":200,"body":{}}"#], "{log}");
    let file = temp_file("token", "s3cret\n");
    let (status, json, log) = call(&["--token-file", path(&file), ws, "echo.echo"]).await;
    let _ = std::fs::remove_file(&file);
    assert!(status.success(), "{log}");
    assert_eq!(json, [r#"{"code":200,"body":{}}"#], "{log}");
}

fn path(file: &Path) -> &str {
    file.to_str().unwrap()
}

#[tokio::test]
async fn routes_lists_methods_pushes_and_keyed_services() {
    let up = up(&[]).await;
    let (status, _, log) =
        finished(shaddock("shaddock routes", &["routes", "--nats", &up.nats])).await;
    assert!(status.success(), "{log}");
    let rows: Vec<Vec<&str>> = log
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    let has = |row: &[&str]| rows.iter().any(|r| r == row);
    assert!(
        has(&[
            "echo.echo",
            "shaddock.echo.EchoRequest",
            "shaddock.echo.EchoResponse"
        ]),
        "{log}"
    );
    assert!(has(&["chat.message", "shaddock.chat.ChatMessage"]), "{log}");
    assert!(has(&["chat.whisper", "shaddock.chat.ChatMessage"]), "{log}");
    assert!(has(&["arena", "64", "arena_match"]), "{log}");
    // Raw methods are not announced.
    assert!(!log.contains("echo.raw"), "{log}");

    let (status, json, log) = finished(shaddock(
        "shaddock routes --json",
        &["routes", "--json", "--nats", &up.nats],
    ))
    .await;
    assert!(status.success(), "{log}");
    let doc: serde_json::Value = serde_json::from_str(&json[0]).unwrap();
    let service = |name: &str| {
        doc["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["service"] == name)
            .unwrap_or_else(|| panic!("no {name} in {doc}"))
            .clone()
    };
    let echo = service("echo");
    assert_eq!(echo["methods"][0]["route"], "echo.echo");
    assert_eq!(
        echo["methods"][0]["request_type"],
        "shaddock.echo.EchoRequest"
    );
    assert_eq!(
        echo["methods"][0]["response_type"],
        "shaddock.echo.EchoResponse"
    );
    assert!(echo["keyed"].is_null());
    let pushes = service("chat")["pushes"].clone();
    assert!(
        pushes
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["route"] == "chat.message"
                && p["message_type"] == "shaddock.chat.ChatMessage"),
        "{doc}"
    );
    let arena = service("arena");
    assert_eq!(arena["keyed"]["partitions"], 64);
    assert_eq!(arena["keyed"]["session_key"], "arena_match");

    // Another prefix: nobody there, said so, and a failing status.
    let (status, _, log) = finished(shaddock(
        "shaddock routes --prefix",
        &[
            "routes", "--nats", &up.nats, "--prefix", "nobody", "--wait", "200ms",
        ],
    ))
    .await;
    assert!(!status.success(), "{log}");
    assert!(log.contains("no service announced itself"), "{log}");
}
