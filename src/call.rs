//! `shaddock call`: a person's (or a script's) way into any route of a running gate, as a
//! JSON client on the Rust SDK. One request and its answer as one JSON line; with
//! `--listen` the session stays open and prints its pushes; with `--repl` it reads one
//! request a line from stdin, all on one session.
//!
//! Lines on stdout, one JSON value each:
//!
//! - an answer: `{"code":200,"body":BODY}`, with `"message":"…"` when the code is not 200;
//! - a push: `{"push":"chat.message","body":BODY}`.
//!
//! `BODY` is a typed body's JSON value (an object, as the gate transcoded it) or a string
//! (a raw route's bytes as text). The SDK hands both over as bytes, so a body is printed
//! as JSON when it is a JSON object or array (what every typed message is in the proto3
//! JSON mapping), and as a string otherwise, or when the request's own body was a string
//! (a raw route answers raw bytes). Everything else (refusals, lost sessions, bad input
//! lines) goes to stderr.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use broker::cli::ShutdownSignals;
use sdk::{Client, ClientOptions, ErrorKind, Pushes};
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const EXAMPLES: &str = "\
Examples:
  shaddock call ws://127.0.0.1:3250 echo.echo '{\"body\":\"aGk=\"}'
  shaddock call ws://127.0.0.1:3250 echo.raw '\"hello\"'
  shaddock call --listen ws://127.0.0.1:3250 chat.login '{\"name\":\"ann\"}'
  shaddock call --key m1 ws://127.0.0.1:3250 arena.join '{\"match\":\"m1\"}'
  printf '%s\\n' 'chat.login {\"name\":\"ann\"}' 'chat.join {\"room\":\"lobby\"}' \\
    | shaddock call --repl ws://127.0.0.1:3250

Output: one JSON line per answer, {\"code\":200,\"body\":...} (with \"message\" when the
code is not 200), and per push, {\"push\":ROUTE,\"body\":...}. Typed bodies print as
JSON objects, raw ones as strings. The exit status is non-zero when an answer is not
200, when there is none (timeout, closed session), or when the gate refuses the token.";

/// `shaddock call`: one request to a gate, or a session of them.
#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct CallArgs {
    /// The gate's WebSocket URL: ws://HOST:PORT (what `shaddock up` prints), or wss://
    /// with --ca.
    #[arg(value_name = "URL")]
    pub url: String,
    /// The route, SERVICE.METHOD (echo.echo, chat.login, ...). Optional with --repl: then
    /// it is the session's first request.
    #[arg(value_name = "ROUTE", required_unless_present = "repl")]
    pub route: Option<String>,
    /// The request body, as JSON: the route's message as an object for a typed route
    /// ('{"name":"ann"}'), a JSON string for a raw one ('"hello"'). Absent: an empty
    /// message. A body that is not JSON is refused before anything is sent.
    #[arg(value_name = "BODY", requires = "route")]
    pub body: Option<String>,
    /// Route the request by this key: a keyed service's key (arena.join's match). With
    /// --repl, every line's unless the line names its own (ROUTE@KEY).
    #[arg(
        long,
        value_name = "KEY",
        default_value = "",
        hide_default_value = true
    )]
    pub key: String,
    /// Keep the session open after the answer (with --repl: after stdin ends) and print
    /// its pushes as JSON lines as they come, until Ctrl-C or SIGTERM, the gate closes
    /// the session, or --for has passed.
    #[arg(long)]
    pub listen: bool,
    /// Listen this long, then end (e.g. 500ms, 10s, 2m); implies --listen.
    #[arg(long = "for", value_name = "DURATION", value_parser = net::duration::parse_positive)]
    pub listen_for: Option<Duration>,
    /// Read requests from stdin, one a line, `ROUTE [BODY]` (`ROUTE@KEY [BODY]` for a
    /// keyed route; blank lines and lines starting with # are skipped), all on one
    /// session, printing each answer, and every push as it comes. Ends at the end of
    /// stdin (then listens, with --listen), on Ctrl-C or SIGTERM.
    #[arg(long)]
    pub repl: bool,
    /// The token the gate's handshake checks (its --token, or a signed JWT).
    #[arg(long, value_name = "TOKEN", conflicts_with = "token_file")]
    pub token: Option<String>,
    /// Read the token from this file (trailing whitespace is not part of it).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// How long to wait for each answer.
    #[arg(long, value_name = "DURATION", value_parser = net::duration::parse_positive, default_value = "10s")]
    pub timeout: Duration,
    /// PEM file of the CA certificates to trust for a wss:// URL.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

/// One request: a route, its key and its body (checked to be JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    route: String,
    key: String,
    /// The body's JSON text; empty for none.
    body: String,
    /// The body is a JSON string: a raw route, whose answer is raw bytes too.
    raw: bool,
}

impl Call {
    fn new(route: &str, key: &str, body: Option<&str>) -> anyhow::Result<Call> {
        let route = route.trim();
        anyhow::ensure!(!route.is_empty(), "no route given");
        let body = body.map(str::trim).unwrap_or_default();
        let raw = if body.is_empty() {
            false
        } else {
            let value: &RawValue = serde_json::from_str(body).map_err(|e| {
                anyhow!(
                    "the body of {route} is not JSON ({e}): give a typed route's message as \
                     an object, e.g. '{{\"name\":\"ann\"}}', and a raw route's body as a \
                     JSON string, e.g. '\"hello\"'"
                )
            })?;
            value.get().starts_with('"')
        };
        Ok(Call {
            route: route.to_owned(),
            key: key.to_owned(),
            body: body.to_owned(),
            raw,
        })
    }

    /// A `--repl` line, `ROUTE[@KEY] [BODY]`; `None` for a blank line or a comment.
    fn parse_line(line: &str, default_key: &str) -> Option<anyhow::Result<Call>> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (target, body) = match line.split_once(char::is_whitespace) {
            Some((target, body)) => (target, Some(body)),
            None => (line, None),
        };
        let (route, key) = target.split_once('@').unwrap_or((target, default_key));
        Some(Call::new(route, key, body))
    }
}

/// Runs `shaddock call`: the exit status says whether every answer was 200.
pub async fn run(args: CallArgs) -> anyhow::Result<ExitCode> {
    // Everything the command line says is checked before the gate is dialled.
    let first = match &args.route {
        Some(route) => Some(Call::new(route, &args.key, args.body.as_deref())?),
        None => None,
    };
    let token = match &args.token_file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the token file {}", path.display()))?
            .trim_end()
            .to_owned(),
        None => args.token.clone().unwrap_or_default(),
    };
    let tls = match &args.ca {
        Some(ca) => {
            Some(sdk::tls_client_config(ca).with_context(|| format!("--ca {}", ca.display()))?)
        }
        None => None,
    };
    let listen = args.listen || args.listen_for.is_some();
    // Ctrl-C and SIGTERM end a session that lasts (--listen, --repl) as asked, even while
    // a request waits; registered before the session opens, so a SIGTERM right after an
    // answer is ours. A one-shot call keeps the signals' default: they end it at once.
    let stop = CancellationToken::new();
    if listen || args.repl {
        let mut signals = ShutdownSignals::install()?;
        let stop = stop.clone();
        tokio::spawn(async move {
            signals.wait(&stop).await;
            stop.cancel();
        });
    }
    let options = ClientOptions {
        token,
        client: concat!("shaddock-call/", env!("CARGO_PKG_VERSION")).to_owned(),
        request_timeout: args.timeout,
        // Requests go one after another anyway; serial also keeps a say behind its join.
        serial: true,
        json: true,
        tls,
        ..ClientOptions::default()
    };
    let client = match Client::connect(&args.url, options).await {
        Ok(client) => client,
        Err(error) => {
            if let ErrorKind::Handshake { code } = error.kind() {
                eprintln!(
                    "shaddock: {} refused the session: {code} {}",
                    args.url,
                    error.detail()
                );
                return Ok(ExitCode::FAILURE);
            }
            // The SDK's error names the URL and the cause.
            return Err(anyhow!(error));
        }
    };
    let pushes = client.pushes().context("the session's pushes")?;
    let mut session = Session {
        client: &client,
        pushes,
        out: Out::default(),
        print_pushes: listen || args.repl,
        stop,
        failed: false,
    };
    let end = session.drive(first, &args).await;
    if let End::Closed(reason) = &end {
        eprintln!("shaddock: the gate closed the session: {reason}");
    }
    client.close().await;
    let ok = !session.failed && !matches!(end, End::Closed(_));
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// How a session ended.
#[derive(Debug)]
enum End {
    /// As asked: the answer printed, stdin ended, a signal, --for passed, stdout closed.
    Done,
    /// The gate closed the session (a kick, a lost connection), for this reason.
    Closed(String),
}

/// One open session and what it has printed.
struct Session<'a> {
    client: &'a Client,
    pushes: Pushes,
    out: Out,
    /// Pushes are printed (--listen, --repl); a one-shot call prints its answer only.
    print_pushes: bool,
    /// Cancelled by Ctrl-C or SIGTERM.
    stop: CancellationToken,
    /// Some answer was not 200, or never came, or a line was refused (stdin unreadable
    /// included).
    failed: bool,
}

impl Session<'_> {
    async fn drive(&mut self, first: Option<Call>, args: &CallArgs) -> End {
        let listen = args.listen || args.listen_for.is_some();
        if let Some(call) = first {
            let ok = self.exchange(&call).await;
            if !ok && !args.repl {
                // Nothing to listen for on a session whose request failed (said why).
                return End::Done;
            }
        }
        if args.repl {
            if let Some(end) = self.repl(&args.key).await {
                return end;
            }
        }
        if listen {
            return self.listen(args.listen_for).await;
        }
        End::Done
    }

    /// Whether to go on: not stopped, stdout open.
    fn going(&self) -> bool {
        !self.stop.is_cancelled() && self.out.open
    }

    /// Sends `call`, prints the pushes that come before its answer (when printing
    /// them), then the answer; whether it was 200 (not when stopped before it).
    async fn exchange(&mut self, call: &Call) -> bool {
        let request = self
            .client
            .request_keyed(&call.route, &call.key, call.body.as_bytes());
        tokio::pin!(request);
        let answer = loop {
            tokio::select! {
                answer = &mut request => break answer,
                Some(push) = self.pushes.recv(), if self.print_pushes => self.out.push(&push),
                () = self.stop.cancelled() => {
                    // No answer: stopped before it came.
                    self.failed = true;
                    return false;
                }
            }
        };
        // The gate writes what reached it before the answer first: the SDK has queued
        // those pushes by the time the answer is in.
        if self.print_pushes {
            while let Some(push) = self.pushes.try_recv() {
                self.out.push(&push);
            }
        }
        match answer {
            Ok(response) => {
                self.out.answer(&response, call.raw);
                let ok = response.code == proto::code::OK;
                self.failed |= !ok;
                ok
            }
            Err(error) => {
                eprintln!("shaddock: no answer to {}: {error}", call.route);
                self.failed = true;
                false
            }
        }
    }

    /// Reads requests from stdin until it ends (`None`: go on listening, if asked), a
    /// signal, or the session's end.
    async fn repl(&mut self, default_key: &str) -> Option<End> {
        let mut lines = stdin_lines();
        while self.going() {
            if self.client.is_closed() {
                return Some(End::Closed(self.client.closed().await));
            }
            tokio::select! {
                line = lines.recv() => match line {
                    None => return None,
                    Some(Err(error)) => {
                        eprintln!("shaddock: reading stdin: {error}");
                        self.failed = true;
                        return None;
                    }
                    Some(Ok(line)) => match Call::parse_line(&line, default_key) {
                        None => {}
                        Some(Err(error)) => {
                            eprintln!("shaddock: {error:#}");
                            self.failed = true;
                        }
                        Some(Ok(call)) => {
                            self.exchange(&call).await;
                        }
                    },
                },
                push = self.pushes.recv() => match push {
                    Some(push) => self.out.push(&push),
                    None => return Some(End::Closed(self.client.closed().await)),
                },
                () = self.stop.cancelled() => {}
            }
        }
        Some(End::Done)
    }

    /// Prints pushes until a signal, `limit` or the session's end.
    async fn listen(&mut self, limit: Option<Duration>) -> End {
        let deadline = async {
            match limit {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline);
        while self.going() {
            tokio::select! {
                push = self.pushes.recv() => match push {
                    Some(push) => self.out.push(&push),
                    None => return End::Closed(self.client.closed().await),
                },
                () = self.stop.cancelled() => {}
                () = &mut deadline => break,
            }
        }
        End::Done
    }
}

/// Lines of stdin, read on a thread of its own: a blocking read cannot be cancelled,
/// and a runtime would wait for it at exit (a person at a terminal would have to press
/// Enter to quit). The thread goes with the process.
fn stdin_lines() -> mpsc::Receiver<std::io::Result<String>> {
    let (tx, rx) = mpsc::channel(1);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let failed = line.is_err();
            if tx.blocking_send(line).is_err() || failed {
                return;
            }
        }
    });
    rx
}

/// Stdout, one JSON line at a time, flushed at once (a pipe sees each line as it
/// comes). A closed stdout (`| head -1`) ends the session quietly.
struct Out {
    open: bool,
}

impl Default for Out {
    fn default() -> Self {
        Out { open: true }
    }
}

impl Out {
    fn answer(&mut self, response: &sdk::Response, raw: bool) {
        let mut line = format!(
            "{{\"code\":{},\"body\":{}",
            response.code,
            body_json(&response.body, raw)
        );
        if response.code != proto::code::OK || !response.message.is_empty() {
            line.push_str(",\"message\":");
            line.push_str(&json_string(&response.message));
        }
        line.push('}');
        self.line(&line);
    }

    fn push(&mut self, push: &sdk::Push) {
        let line = format!(
            "{{\"push\":{},\"body\":{}}}",
            json_string(&push.route),
            body_json(&push.body, false)
        );
        self.line(&line);
    }

    fn line(&mut self, line: &str) {
        if !self.open {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "{line}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            self.open = false;
        }
    }
}

/// A body as JSON text: as the gate wrote it when it is a JSON object or array (a
/// typed body), else, or when `raw`, as a string of its bytes.
fn body_json(body: &[u8], raw: bool) -> String {
    if !raw {
        let text = String::from_utf8_lossy(body);
        let typed = text.trim_start().starts_with(['{', '[']);
        if typed && serde_json::from_str::<&RawValue>(&text).is_ok() {
            return text.trim().to_owned();
        }
    }
    json_string(&String::from_utf8_lossy(body))
}

fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_must_be_json_and_a_string_body_means_a_raw_route() {
        let typed = Call::new("chat.login", "", Some(r#"{"name":"ann"}"#)).unwrap();
        assert!(!typed.raw);
        assert!(Call::new("echo.raw", "", Some(r#""hi""#)).unwrap().raw);
        assert_eq!(Call::new("echo.echo", "", None).unwrap().body, "");
        let error = Call::new("chat.login", "", Some("{name: ann}")).unwrap_err();
        assert!(error.to_string().contains("not JSON"), "{error}");
        assert!(Call::new("echo.raw", "", Some("hello")).is_err());
    }

    #[test]
    fn a_repl_line_is_a_route_an_optional_key_and_a_body() {
        let call = Call::parse_line(r#"  arena.join@m1 {"match": "m1"} "#, "k")
            .unwrap()
            .unwrap();
        assert_eq!(
            (call.route.as_str(), call.key.as_str(), call.body.as_str()),
            ("arena.join", "m1", r#"{"match": "m1"}"#)
        );
        let call = Call::parse_line("arena.leave", "k").unwrap().unwrap();
        assert_eq!((call.key.as_str(), call.body.as_str()), ("k", ""));
        assert!(Call::parse_line("   ", "").is_none());
        assert!(Call::parse_line("# a comment", "").is_none());
        assert!(Call::parse_line("echo.raw hello", "").unwrap().is_err());
    }

    #[test]
    fn typed_bodies_print_as_json_and_others_as_strings() {
        assert_eq!(body_json(br#"{"name":"ann"}"#, false), r#"{"name":"ann"}"#);
        assert_eq!(
            body_json(br#"{"name":"ann"}"#, true),
            r#""{\"name\":\"ann\"}""#
        );
        assert_eq!(body_json(b"hello", false), r#""hello""#);
        assert_eq!(body_json(b"42", false), r#""42""#);
        assert_eq!(body_json(b"{not json", false), r#""{not json""#);
        assert_eq!(body_json(b"", false), r#""""#);
    }
}
