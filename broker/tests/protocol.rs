//! Raw-TCP tests pinning each client-visible behaviour of the NATS protocol that
//! `shared/NATS.md` lists. Every check is a function over a [`Bus`] and runs twice:
//! `embedded::<check>` against our broker in-process, and `nats_server::<check>`
//! against the real nats-server, which proves the expectation itself is right.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use broker::testing::Bus;
use broker::{Auth, Config};
use common::{Conn, Read};
use testkit::DEADLINE;
use tokio::net::TcpSocket;

/// Server settings a check needs, expressed once and rendered both as our `Config` and as
/// a nats-server config file.
#[derive(Clone, Default)]
struct Setup {
    auth: Auth,
    auth_timeout: Option<Duration>,
    max_payload: Option<usize>,
    max_connections: Option<usize>,
    max_subscriptions: Option<usize>,
    ping_interval: Option<Duration>,
    max_pending: Option<usize>,
}

const TOKEN: &str = "s3cret";
const USER: &str = "alice";
const PASS: &str = "wonderland";

impl Setup {
    fn token() -> Setup {
        Setup {
            auth: Auth::Token(TOKEN.into()),
            ..Setup::default()
        }
    }

    fn user_pass() -> Setup {
        Setup {
            auth: Auth::UserPass {
                user: USER.into(),
                pass: PASS.into(),
            },
            ..Setup::default()
        }
    }

    fn config(&self) -> Config {
        let mut config = Config {
            auth: self.auth.clone(),
            ..Config::default()
        };
        if let Some(v) = self.auth_timeout {
            config.auth_timeout = v;
        }
        if let Some(v) = self.max_payload {
            config.max_payload = v;
        }
        if let Some(v) = self.max_connections {
            config.max_connections = v;
        }
        if let Some(v) = self.max_subscriptions {
            config.max_subscriptions = v;
        }
        if let Some(v) = self.ping_interval {
            config.ping_interval = v;
        }
        if let Some(v) = self.max_pending {
            config.max_pending = v;
        }
        config
    }

    fn nats_server_conf(&self) -> String {
        let mut conf = String::new();
        let timeout = self
            .auth_timeout
            .map(|t| format!("\n  timeout: {}", t.as_secs_f64()))
            .unwrap_or_default();
        match &self.auth {
            Auth::None => {}
            Auth::Token(token) => {
                conf += &format!("authorization {{\n  token: \"{token}\"{timeout}\n}}\n");
            }
            Auth::UserPass { user, pass } => {
                conf += &format!(
                    "authorization {{\n  user: \"{user}\"\n  password: \"{pass}\"{timeout}\n}}\n"
                );
            }
        }
        if let Some(v) = self.max_payload {
            conf += &format!("max_payload: {v}\n");
        }
        if let Some(v) = self.max_connections {
            conf += &format!("max_connections: {v}\n");
        }
        if let Some(v) = self.max_subscriptions {
            conf += &format!("max_subscriptions: {v}\n");
        }
        if let Some(v) = self.ping_interval {
            conf += &format!("ping_interval: \"{}ms\"\nping_max: 2\n", v.as_millis());
        }
        if let Some(v) = self.max_pending {
            conf += &format!("max_pending: {v}\n");
        }
        conf
    }
}

broker::on_both_buses! {
    info_comes_first_with_required_fields => Setup::default();
    info_announces_auth_required => Setup::token();
    verbs_are_case_insensitive => Setup::default();
    arguments_split_on_runs_of_spaces_and_tabs => Setup::default();
    bare_newline_ends_a_control_line => Setup::default();
    ping_with_trailing_text_gets_pong => Setup::default();
    connect_then_ping_gets_pong => Setup::default();
    verbose_connect_gets_ok_then_pong => Setup::default();
    ops_before_connect_are_verbose => Setup::default();
    ping_is_a_barrier_for_subscriptions => Setup::default();
    ping_is_a_barrier_for_published_messages => Setup::default();
    msg_format_without_and_with_reply => Setup::default();
    empty_payload_is_delivered => Setup::default();
    hmsg_format_is_exact => Setup::default();
    hmsg_to_subscriber_without_headers_becomes_msg => Setup::default();
    control_line_too_long_is_rejected => Setup::default();
    control_line_too_long_split_over_writes_is_rejected => Setup::default();
    control_line_too_long_without_newline_is_rejected => Setup::default();
    unknown_verb_is_rejected => Setup::default();
    verb_without_arguments_is_rejected => Setup::default();
    payload_not_followed_by_crlf_is_rejected => Setup::default();
    non_numeric_size_closes_silently => Setup::default();
    pub_with_too_many_arguments_closes_silently => Setup::default();
    sub_with_too_few_arguments_closes_silently => Setup::default();
    hpub_without_headers_closes_silently => Setup::default();
    hpub_header_larger_than_total_closes_silently => Setup::default();
    connect_not_json_closes_silently => Setup::default();
    bad_client_protocol_is_rejected => Setup::default();
    payload_over_max_is_rejected => Setup { max_payload: Some(1024), ..Setup::default() };
    invalid_sub_subject_keeps_connection_open => Setup::default();
    pedantic_pub_to_wildcard_is_rejected_and_stays_open => Setup::default();
    pedantic_invalid_publish_is_still_delivered => Setup::default();
    non_pedantic_pub_to_wildcard_is_accepted => Setup::default();
    duplicate_sid_keeps_first_subscription => Setup::default();
    unsub_unknown_sid_is_ignored => Setup::default();
    unsub_with_max_ends_after_max_messages => Setup::default();
    unsub_with_max_already_reached_ends_at_once => Setup::default();
    unsub_with_max_zero_ends_at_once => Setup::default();
    a_queue_member_at_its_max_leaves_the_rest_to_the_others => Setup::default();
    echo_false_skips_own_messages => Setup::default();
    no_responders_sends_exact_503 => Setup::default();
    no_responders_needs_the_client_to_ask => Setup::default();
    token_accepted => Setup::token();
    token_refused => Setup::token();
    user_pass_accepted => Setup::user_pass();
    user_pass_refused => Setup::user_pass();
    op_before_connect_with_auth_is_refused => Setup::token();
    silent_client_gets_auth_timeout => Setup { auth_timeout: Some(Duration::from_secs(1)), ..Setup::token() };
    max_connections_refuses_extra_client => Setup { max_connections: Some(1), ..Setup::default() };
    max_subscriptions_refuses_extra_sub => Setup { max_subscriptions: Some(2), ..Setup::default() };
    client_answering_pings_stays_connected => Setup { ping_interval: Some(Duration::from_millis(200)), ..Setup::default() };
    client_ignoring_pings_is_closed_as_stale => Setup { ping_interval: Some(Duration::from_millis(200)), ..Setup::default() };
    slow_consumer_is_closed_without_blocking_others => Setup {
        max_pending: Some(SLOW_MAX_PENDING),
        max_payload: Some(SLOW_MAX_PENDING),
        ..Setup::default()
    };
}

// ---- INFO ----

async fn info_comes_first_with_required_fields(bus: Bus) {
    let addr = bus.addr();
    let (_conn, info) = Conn::connect_info(addr).await;
    let text = |key: &str| -> String {
        info[key]
            .as_str()
            .unwrap_or_else(|| panic!("INFO {key} missing or not a string: {info}"))
            .to_string()
    };
    assert!(!text("server_id").is_empty());
    assert!(!text("server_name").is_empty());
    let version = text("version");
    let core = version.split(['-', '+']).next().unwrap();
    let parts: Vec<&str> = core.split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u64>().is_ok()),
        "version {version:?} is not semver"
    );
    assert_eq!(info["proto"], 1);
    assert!(!text("go").is_empty());
    assert_eq!(text("host"), "127.0.0.1");
    assert_eq!(info["port"], addr.port());
    assert_eq!(info["headers"], true);
    assert_eq!(info["max_payload"], 1024 * 1024);
    assert!(info["client_id"].as_u64().is_some(), "client_id: {info}");
    assert_eq!(text("client_ip"), "127.0.0.1");
    assert_ne!(info["auth_required"], true);
}

async fn info_announces_auth_required(bus: Bus) {
    let addr = bus.addr();
    let (_conn, info) = Conn::connect_info(addr).await;
    assert_eq!(info["auth_required"], true);
}

// ---- Framing ----

async fn verbs_are_case_insensitive(bus: Bus) {
    let addr = bus.addr();
    let (mut conn, _) = Conn::connect_info(addr).await;
    conn.send("connect {\"verbose\":false}\r\nPiNg\r\n").await;
    conn.expect_line("PONG").await;
    conn.send("sub foo 1\r\npUb foo 2\r\nhi\r\nping\r\n").await;
    conn.expect_msg("MSG foo 1 2", b"hi").await;
    conn.expect_line("PONG").await;
    conn.send("unsub 1\r\nPub foo 2\r\nhi\r\nPING\r\n").await;
    conn.expect_line("PONG").await;
}

async fn arguments_split_on_runs_of_spaces_and_tabs(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB  foo \t q  1\r\nPUB\tfoo \t bar  2\r\nhi\r\nPING\r\n")
        .await;
    conn.expect_msg("MSG foo 1 bar 2", b"hi").await;
    conn.expect_line("PONG").await;
}

async fn bare_newline_ends_a_control_line(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB foo 1\nPUB foo 2\nhi\r\nPING\n").await;
    conn.expect_msg("MSG foo 1 2", b"hi").await;
    conn.expect_line("PONG").await;
}

async fn ping_with_trailing_text_gets_pong(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("PING foo\r\n").await;
    conn.expect_line("PONG").await;
}

// ---- CONNECT ----

async fn connect_then_ping_gets_pong(bus: Bus) {
    let addr = bus.addr();
    let (mut conn, _) = Conn::connect_info(addr).await;
    conn.send("CONNECT {\"verbose\":false,\"lang\":\"rust\",\"version\":\"1.0\"}\r\nPING\r\n")
        .await;
    conn.expect_line("PONG").await;
}

async fn verbose_connect_gets_ok_then_pong(bus: Bus) {
    let addr = bus.addr();
    let (mut conn, _) = Conn::connect_info(addr).await;
    conn.send("CONNECT {\"verbose\":true}\r\nPING\r\n").await;
    conn.expect_line("+OK").await;
    conn.expect_line("PONG").await;
}

async fn ops_before_connect_are_verbose(bus: Bus) {
    let addr = bus.addr();
    let (mut conn, _) = Conn::connect_info(addr).await;
    conn.send("SUB foo 1\r\n").await;
    conn.expect_line("+OK").await;
    conn.send("PUB foo 2\r\nhi\r\n").await;
    conn.expect_line("+OK").await;
    conn.expect_msg("MSG foo 1 2", b"hi").await;
    conn.ping_pong().await;
}

// ---- Ordering ----

async fn ping_is_a_barrier_for_subscriptions(bus: Bus) {
    let addr = bus.addr();
    let mut sub = Conn::quiet(addr).await;
    sub.send("SUB foo 1\r\nPING\r\n").await;
    sub.expect_line("PONG").await;
    // Once the PONG is back the subscription must be live for every other client.
    let mut publisher = Conn::quiet(addr).await;
    publisher.send("PUB foo 5\r\nhello\r\n").await;
    sub.expect_msg("MSG foo 1 5", b"hello").await;
}

async fn ping_is_a_barrier_for_published_messages(bus: Bus) {
    let addr = bus.addr();
    let mut sub = Conn::quiet(addr).await;
    sub.send("SUB foo 1\r\n").await;
    sub.ping_pong().await;
    let mut publisher = Conn::quiet(addr).await;
    let mut batch = String::new();
    for i in 0..100 {
        let payload = i.to_string();
        batch += &format!("PUB foo {}\r\n{payload}\r\n", payload.len());
    }
    batch += "PING\r\n";
    publisher.send(&batch).await;
    publisher.expect_line("PONG").await;
    // The publisher's PONG means all 100 are queued to the subscriber, so they must all
    // come before the subscriber's own PONG.
    sub.send("PING\r\n").await;
    for i in 0..100 {
        let payload = i.to_string();
        sub.expect_msg(&format!("MSG foo 1 {}", payload.len()), payload.as_bytes())
            .await;
    }
    sub.expect_line("PONG").await;
}

// ---- MSG / HMSG ----

async fn msg_format_without_and_with_reply(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB foo.bar 7\r\nPUB foo.bar 5\r\nhello\r\nPUB foo.bar _INBOX.r 2\r\nhi\r\n")
        .await;
    conn.expect_msg("MSG foo.bar 7 5", b"hello").await;
    conn.expect_msg("MSG foo.bar 7 _INBOX.r 2", b"hi").await;
    conn.ping_pong().await;
}

async fn empty_payload_is_delivered(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB foo 1\r\nPUB foo 0\r\n\r\n").await;
    conn.expect_msg("MSG foo 1 0", b"").await;
    conn.ping_pong().await;
}

const HEADERS: &str = "NATS/1.0\r\nA: b\r\n\r\n";

fn hpub(subject: &str, reply: &str, payload: &str) -> String {
    let (h, t) = (HEADERS.len(), HEADERS.len() + payload.len());
    format!("HPUB {subject} {reply} {h} {t}\r\n{HEADERS}{payload}\r\n")
}

async fn hmsg_format_is_exact(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::connect_with(addr, r#"{"verbose":false,"headers":true}"#).await;
    conn.send("SUB foo 1\r\n").await;
    conn.send(&hpub("foo", "rep", "hi")).await;
    let (h, t) = (HEADERS.len(), HEADERS.len() + 2);
    conn.expect_msg(
        &format!("HMSG foo 1 rep {h} {t}"),
        format!("{HEADERS}hi").as_bytes(),
    )
    .await;
    conn.ping_pong().await;
}

async fn hmsg_to_subscriber_without_headers_becomes_msg(bus: Bus) {
    let addr = bus.addr();
    let mut sub = Conn::connect_with(addr, r#"{"verbose":false,"headers":false}"#).await;
    sub.send("SUB foo 1\r\n").await;
    sub.ping_pong().await;
    let mut publisher = Conn::connect_with(addr, r#"{"verbose":false,"headers":true}"#).await;
    publisher.send(&hpub("foo", "rep", "hi")).await;
    publisher.ping_pong().await;
    sub.expect_msg("MSG foo 1 rep 2", b"hi").await;
    sub.ping_pong().await;
}

// ---- Protocol errors ----

async fn control_line_too_long_is_rejected(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    let subject = "a".repeat(5000);
    conn.send(&format!("PUB {subject} 2\r\nhi\r\n")).await;
    conn.expect_err_and_close("maximum control line exceeded")
        .await;
}

async fn control_line_too_long_split_over_writes_is_rejected(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("PUB ").await;
    for _ in 0..10 {
        conn.send(&"a".repeat(512)).await;
        tokio::task::yield_now().await;
    }
    conn.send(" 2\r\nhi\r\n").await;
    conn.expect_err_and_close("maximum control line exceeded")
        .await;
}

async fn control_line_too_long_without_newline_is_rejected(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    // No line end ever comes: the server must not buffer without bound waiting for one.
    conn.send(&format!("SUB {}", "a".repeat(5000))).await;
    conn.expect_err_and_close("maximum control line exceeded")
        .await;
}

async fn unknown_verb_is_rejected(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("FOO bar\r\n").await;
    conn.expect_err_and_close("Unknown Protocol Operation")
        .await;
}

async fn verb_without_arguments_is_rejected(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("PUB\r\n").await;
    conn.expect_err_and_close("Unknown Protocol Operation")
        .await;
}

async fn payload_not_followed_by_crlf_is_rejected(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("PUB foo 2\r\nhiXX\r\n").await;
    conn.expect_err_and_close("Unknown Protocol Operation")
        .await;
}

async fn non_numeric_size_closes_silently(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("PUB foo 2x\r\nhi\r\n").await;
    conn.expect_closed().await;
}

async fn pub_with_too_many_arguments_closes_silently(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("PUB foo bar baz 2\r\nhi\r\n").await;
    conn.expect_closed().await;
}

async fn sub_with_too_few_arguments_closes_silently(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB foo\r\n").await;
    conn.expect_closed().await;
}

async fn hpub_without_headers_closes_silently(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::connect_with(addr, r#"{"verbose":false,"headers":false}"#).await;
    conn.send(&hpub("foo", "rep", "hi")).await;
    conn.expect_closed().await;
}

async fn hpub_header_larger_than_total_closes_silently(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::connect_with(addr, r#"{"verbose":false,"headers":true}"#).await;
    conn.send("HPUB foo 12 2\r\nNATS/1.0\r\n\r\n\r\n").await;
    conn.expect_closed().await;
}

async fn connect_not_json_closes_silently(bus: Bus) {
    let addr = bus.addr();
    let (mut conn, _) = Conn::connect_info(addr).await;
    conn.send("CONNECT verbose\r\nPING\r\n").await;
    conn.expect_closed().await;
}

async fn bad_client_protocol_is_rejected(bus: Bus) {
    let addr = bus.addr();
    let (mut conn, _) = Conn::connect_info(addr).await;
    conn.send("CONNECT {\"verbose\":false,\"protocol\":2}\r\nPING\r\n")
        .await;
    conn.expect_err_and_close("invalid client protocol").await;
}

async fn payload_over_max_is_rejected(bus: Bus) {
    let addr = bus.addr();
    let (mut conn, info) = Conn::connect_info(addr).await;
    assert_eq!(info["max_payload"], 1024);
    conn.send("CONNECT {\"verbose\":false}\r\nPING\r\n").await;
    conn.expect_line("PONG").await;
    conn.send("PUB foo 1024\r\n").await;
    conn.send(&"x".repeat(1024)).await;
    conn.send("\r\nPUB foo 1025\r\n").await;
    conn.expect_err_and_close("Maximum Payload Violation").await;
}

// ---- Subjects ----

async fn invalid_sub_subject_keeps_connection_open(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    for subject in ["foo..bar", ".foo", "foo.", "foo.>.bar"] {
        conn.send(&format!("SUB {subject} 1\r\n")).await;
        conn.expect_line("-ERR 'Invalid Subject'").await;
    }
    conn.ping_pong().await;
    // `foo*` is a literal token, so this is valid and gets no error.
    conn.send("SUB foo* 2\r\nPUB foo* 2\r\nhi\r\n").await;
    conn.expect_msg("MSG foo* 2 2", b"hi").await;
    conn.ping_pong().await;
}

async fn pedantic_pub_to_wildcard_is_rejected_and_stays_open(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::connect_with(addr, r#"{"verbose":false,"pedantic":true}"#).await;
    conn.send("PUB foo.* 2\r\nhi\r\n").await;
    conn.expect_line("-ERR 'Invalid Publish Subject'").await;
    conn.ping_pong().await;
    conn.send("SUB foo.x 1\r\nPUB foo.x 2\r\nhi\r\n").await;
    conn.expect_msg("MSG foo.x 1 2", b"hi").await;
    conn.ping_pong().await;
}

/// nats-server's pedantic check only warns: the message is still routed afterwards.
async fn pedantic_invalid_publish_is_still_delivered(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::connect_with(addr, r#"{"verbose":false,"pedantic":true}"#).await;
    conn.send("SUB foo.* 1\r\nPUB foo.* 2\r\nhi\r\n").await;
    conn.expect_line("-ERR 'Invalid Publish Subject'").await;
    conn.expect_msg("MSG foo.* 1 2", b"hi").await;
    conn.ping_pong().await;
}

async fn non_pedantic_pub_to_wildcard_is_accepted(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("PUB foo.* 2\r\nhi\r\n").await;
    conn.ping_pong().await;
}

// ---- SUB / UNSUB ----

async fn duplicate_sid_keeps_first_subscription(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB foo 1\r\nSUB bar 1\r\nPUB bar 2\r\nhi\r\nPUB foo 2\r\nho\r\n")
        .await;
    conn.expect_msg("MSG foo 1 2", b"ho").await;
    conn.ping_pong().await;
}

async fn unsub_unknown_sid_is_ignored(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("UNSUB 99\r\nUNSUB 98 5\r\n").await;
    conn.ping_pong().await;
}

fn pubs(subject: &str, count: usize) -> String {
    (0..count)
        .map(|i| format!("PUB {subject} 1\r\n{}\r\n", i % 10))
        .collect()
}

async fn unsub_with_max_ends_after_max_messages(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB foo 1\r\nUNSUB 1 2\r\n").await;
    conn.send(&pubs("foo", 3)).await;
    conn.expect_msg("MSG foo 1 1", b"0").await;
    conn.expect_msg("MSG foo 1 1", b"1").await;
    conn.ping_pong().await;
    // The subscription is gone: resubscribing the same sid works afresh.
    conn.send("SUB foo 1\r\n").await;
    conn.send(&pubs("foo", 1)).await;
    conn.expect_msg("MSG foo 1 1", b"0").await;
    conn.ping_pong().await;
}

async fn unsub_with_max_already_reached_ends_at_once(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB foo 1\r\n").await;
    conn.send(&pubs("foo", 2)).await;
    conn.expect_msg("MSG foo 1 1", b"0").await;
    conn.expect_msg("MSG foo 1 1", b"1").await;
    conn.send("UNSUB 1 2\r\n").await;
    conn.send(&pubs("foo", 1)).await;
    conn.ping_pong().await;
}

async fn unsub_with_max_zero_ends_at_once(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB foo 1\r\nUNSUB 1 0\r\n").await;
    conn.send(&pubs("foo", 1)).await;
    conn.ping_pong().await;
}

/// The `MSG` lines that arrive before the answer to a PING.
async fn msgs_before_pong(conn: &mut Conn) -> usize {
    conn.send("PING\r\n").await;
    let mut msgs = 0;
    loop {
        let line = conn.line().await;
        if line == "PONG" {
            return msgs;
        }
        if line.starts_with("MSG ") {
            msgs += 1;
        }
    }
}

/// A queue member whose max is reached takes no more: the group's other member gets
/// the rest, and nothing is delivered twice or dropped.
async fn a_queue_member_at_its_max_leaves_the_rest_to_the_others(bus: Bus) {
    let addr = bus.addr();
    const MAX: usize = 3;
    const SENT: usize = 40;
    let mut capped = Conn::quiet(addr).await;
    let mut other = Conn::quiet(addr).await;
    capped
        .send(&format!("SUB foo q 1\r\nUNSUB 1 {MAX}\r\n"))
        .await;
    capped.ping_pong().await;
    other.send("SUB foo q 1\r\n").await;
    other.ping_pong().await;
    let mut publisher = Conn::quiet(addr).await;
    publisher.send(&pubs("foo", SENT)).await;
    publisher.ping_pong().await;
    let to_capped = msgs_before_pong(&mut capped).await;
    let to_other = msgs_before_pong(&mut other).await;
    // Members are picked at random: fewer than 3 of 40 for the capped one has a chance
    // under one in a billion.
    assert_eq!(to_capped, MAX);
    assert_eq!(to_other, SENT - MAX);
}

// ---- Echo and no-responders ----

async fn echo_false_skips_own_messages(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::connect_with(addr, r#"{"verbose":false,"echo":false}"#).await;
    conn.send("SUB foo 1\r\nPUB foo 2\r\nhi\r\n").await;
    conn.ping_pong().await;
    let mut other = Conn::quiet(addr).await;
    other.send("PUB foo 2\r\nho\r\n").await;
    conn.expect_msg("MSG foo 1 2", b"ho").await;
}

async fn no_responders_sends_exact_503(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::connect_with(
        addr,
        r#"{"verbose":false,"headers":true,"no_responders":true}"#,
    )
    .await;
    conn.send("SUB _INBOX.x.* 3\r\nPUB nobody.home _INBOX.x.1 2\r\nhi\r\n")
        .await;
    let block = "NATS/1.0 503\r\nNats-Subject: nobody.home\r\n\r\n";
    let n = block.len();
    conn.expect_msg(&format!("HMSG _INBOX.x.1 3 {n} {n}"), block.as_bytes())
        .await;
    conn.ping_pong().await;
}

async fn no_responders_needs_the_client_to_ask(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::connect_with(addr, r#"{"verbose":false,"headers":true}"#).await;
    conn.send("SUB _INBOX.x.* 3\r\nPUB nobody.home _INBOX.x.1 2\r\nhi\r\n")
        .await;
    conn.ping_pong().await;
}

// ---- Auth ----

async fn connect_expect(addr: SocketAddr, connect_json: &str) -> Conn {
    let (mut conn, info) = Conn::connect_info(addr).await;
    assert_eq!(info["auth_required"], true);
    conn.send(&format!("CONNECT {connect_json}\r\nPING\r\n"))
        .await;
    conn
}

async fn token_accepted(bus: Bus) {
    let addr = bus.addr();
    let json = format!(r#"{{"verbose":false,"auth_token":"{TOKEN}"}}"#);
    let mut conn = connect_expect(addr, &json).await;
    conn.expect_line("PONG").await;
    conn.send("SUB foo 1\r\nPUB foo 2\r\nhi\r\n").await;
    conn.expect_msg("MSG foo 1 2", b"hi").await;
}

async fn token_refused(bus: Bus) {
    let addr = bus.addr();
    let json = r#"{"verbose":false,"auth_token":"wrong"}"#;
    let mut conn = connect_expect(addr, json).await;
    conn.expect_err_and_close("Authorization Violation").await;
    let mut conn = connect_expect(addr, r#"{"verbose":false}"#).await;
    conn.expect_err_and_close("Authorization Violation").await;
}

async fn user_pass_accepted(bus: Bus) {
    let addr = bus.addr();
    let json = format!(r#"{{"verbose":false,"user":"{USER}","pass":"{PASS}"}}"#);
    let mut conn = connect_expect(addr, &json).await;
    conn.expect_line("PONG").await;
}

async fn user_pass_refused(bus: Bus) {
    let addr = bus.addr();
    let json = format!(r#"{{"verbose":false,"user":"{USER}","pass":"nope"}}"#);
    let mut conn = connect_expect(addr, &json).await;
    conn.expect_err_and_close("Authorization Violation").await;
    let json = format!(r#"{{"verbose":false,"user":"bob","pass":"{PASS}"}}"#);
    let mut conn = connect_expect(addr, &json).await;
    conn.expect_err_and_close("Authorization Violation").await;
}

async fn op_before_connect_with_auth_is_refused(bus: Bus) {
    let addr = bus.addr();
    let (mut conn, _) = Conn::connect_info(addr).await;
    conn.send("SUB foo 1\r\n").await;
    conn.expect_err_and_close("Authorization Violation").await;
    let (mut conn, _) = Conn::connect_info(addr).await;
    conn.send("PING\r\n").await;
    conn.expect_err_and_close("Authorization Violation").await;
}

async fn silent_client_gets_auth_timeout(bus: Bus) {
    let addr = bus.addr();
    let (mut conn, _) = Conn::connect_info(addr).await;
    conn.expect_err_and_close("Authentication Timeout").await;
}

// ---- Limits ----

async fn max_connections_refuses_extra_client(bus: Bus) {
    let addr = bus.addr();
    let mut first = Conn::quiet(addr).await;
    // nats-server still sends INFO, then the error, then closes.
    let (mut second, _) = Conn::connect_info(addr).await;
    second
        .expect_err_and_close("maximum connections exceeded")
        .await;
    first.ping_pong().await;
}

async fn max_subscriptions_refuses_extra_sub(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.send("SUB a 1\r\nSUB b 2\r\nSUB c 3\r\n").await;
    conn.expect_line("-ERR 'maximum subscriptions exceeded'")
        .await;
    // The refused SUB is not live, the others are.
    conn.send("PUB c 1\r\nx\r\nPUB b 1\r\ny\r\n").await;
    conn.expect_msg("MSG b 2 1", b"y").await;
    conn.ping_pong().await;
}

// ---- Liveness ----

async fn client_answering_pings_stays_connected(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.auto_pong = false;
    for _ in 0..4 {
        conn.expect_line("PING").await;
        conn.send("PONG\r\n").await;
    }
    conn.ping_pong().await;
}

async fn client_ignoring_pings_is_closed_as_stale(bus: Bus) {
    let addr = bus.addr();
    let mut conn = Conn::quiet(addr).await;
    conn.auto_pong = false;
    conn.expect_line("PING").await;
    conn.expect_line("PING").await;
    conn.expect_err_and_close("Stale Connection").await;
}

// ---- Slow consumer ----

const SLOW_MAX_PENDING: usize = 64 * 1024;

async fn slow_consumer_is_closed_without_blocking_others(bus: Bus) {
    let addr = bus.addr();
    const SIZE: usize = 1000;
    // The publisher waits for the fast subscriber after each batch, so the fast one's
    // backlog stays under max_pending however slowly this debug-built reader runs.
    const BATCH: usize = 32;
    const COUNT: usize = BATCH * 320;

    // The slow subscriber never reads; a tiny receive window makes the server's pending
    // bytes for it grow almost at once.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut slow = Conn::from_stream(socket.connect(addr).await.unwrap());
    slow.read_info().await;
    slow.send("CONNECT {\"verbose\":false}\r\nSUB foo 1\r\nPING\r\n")
        .await;
    slow.expect_line("PONG").await;

    let mut fast = Conn::quiet(addr).await;
    fast.send("SUB foo 1\r\n").await;
    fast.ping_pong().await;
    let (progress, mut received) = tokio::sync::watch::channel(0);
    let fast_reader = tokio::spawn(async move {
        let payload = vec![b'x'; SIZE];
        for n in 1..=COUNT {
            fast.expect_msg(&format!("MSG foo 1 {SIZE}"), &payload)
                .await;
            progress.send_replace(n);
        }
        fast.ping_pong().await;
    });

    let mut publisher = Conn::quiet(addr).await;
    let batch = format!("PUB foo {SIZE}\r\n{}\r\n", "x".repeat(SIZE)).repeat(BATCH);
    let publish = async {
        for sent in (BATCH..=COUNT).step_by(BATCH) {
            publisher.send(&batch).await;
            received
                .wait_for(|&n| n >= sent)
                .await
                .expect("the fast subscriber was cut off");
        }
        publisher.ping_pong().await;
    };
    tokio::time::timeout(DEADLINE, publish)
        .await
        .expect("the publisher or the fast subscriber was held up by the slow consumer");
    fast_reader.await.unwrap();

    // The slow consumer was cut off: it sees EOF before all messages, and no -ERR.
    let mut delivered = 0;
    while let Read::Line(line) = slow.read().await {
        assert!(!line.starts_with("-ERR"), "slow consumer got {line}");
        if line.starts_with("MSG ") {
            delivered += 1;
        }
    }
    assert!(delivered < COUNT, "slow consumer was never closed");
}
