//! The broker driven by a real NATS client (async-nats), plus its monitoring endpoints
//! read over plain HTTP. Everything runs in-process on port 0.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use async_nats::{ConnectErrorKind, ConnectOptions, HeaderMap, Subscriber};
use broker::testing::{EmbeddedServer, round_trip};
use broker::{Auth, Config};
use common::{get_json, http_get};
use futures::{FutureExt, StreamExt};
use testkit::DEADLINE;

async fn start() -> EmbeddedServer {
    EmbeddedServer::start(Config::default()).await
}

async fn client(server: &EmbeddedServer) -> async_nats::Client {
    async_nats::connect(&server.url).await.unwrap()
}

/// The next message, failing the test if none arrives within [`DEADLINE`].
async fn next(sub: &mut Subscriber) -> async_nats::Message {
    tokio::time::timeout(DEADLINE, sub.next())
        .await
        .expect("timed out waiting for a message")
        .expect("subscription ended")
}

async fn next_text(sub: &mut Subscriber) -> (String, String) {
    let msg = next(sub).await;
    let payload = String::from_utf8(msg.payload.to_vec()).unwrap();
    (msg.subject.to_string(), payload)
}

/// Messages already delivered to `sub`, without waiting. Call after [`round_trip`] on the
/// subscriber's client.
/// `unconstrained` keeps tokio's cooperative budget from faking an empty channel.
fn drain_ready(sub: &mut Subscriber) -> Vec<async_nats::Message> {
    let mut out = Vec::new();
    while let Some(Some(msg)) = tokio::task::unconstrained(sub.next()).now_or_never() {
        out.push(msg);
    }
    out
}

#[tokio::test]
async fn publish_reaches_subscriber() {
    let server = start().await;
    let client = client(&server).await;
    let mut sub = client.subscribe("greet").await.unwrap();
    client.publish("greet", "hello".into()).await.unwrap();
    assert_eq!(next_text(&mut sub).await, ("greet".into(), "hello".into()));
}

#[tokio::test]
async fn star_matches_exactly_one_token() {
    let server = start().await;
    let client = client(&server).await;
    let mut sub = client.subscribe("a.*").await.unwrap();
    for subject in ["a", "a.b.c", "b.c", "a.one"] {
        client.publish(subject, subject.into()).await.unwrap();
    }
    // Messages from one publisher arrive in order, so the non-matches were dropped.
    assert_eq!(next_text(&mut sub).await.0, "a.one");
}

#[tokio::test]
async fn gt_matches_one_or_more_trailing_tokens() {
    let server = start().await;
    let client = client(&server).await;
    let mut sub = client.subscribe("a.>").await.unwrap();
    for subject in ["a", "a.b", "b.c", "a.b.c"] {
        client.publish(subject, subject.into()).await.unwrap();
    }
    assert_eq!(next_text(&mut sub).await.0, "a.b");
    assert_eq!(next_text(&mut sub).await.0, "a.b.c");
}

#[tokio::test]
async fn queue_group_members_split_every_message() {
    const COUNT: usize = 300;
    let server = start().await;
    let mut members = Vec::new();
    for _ in 0..3 {
        let client = client(&server).await;
        let sub = client
            .queue_subscribe("work", "workers".into())
            .await
            .unwrap();
        round_trip(&client).await;
        members.push((client, sub));
    }
    let watcher = client(&server).await;
    let mut all = watcher.subscribe("work").await.unwrap();
    round_trip(&watcher).await;

    let publisher = client(&server).await;
    for i in 0..COUNT {
        publisher
            .publish("work", i.to_string().into())
            .await
            .unwrap();
    }
    round_trip(&publisher).await;

    let mut seen = BTreeSet::new();
    for (client, sub) in &mut members {
        round_trip(client).await;
        let got = drain_ready(sub);
        assert!(
            got.len() > COUNT / 6,
            "one member got only {} of {COUNT}",
            got.len()
        );
        for msg in got {
            let n: usize = std::str::from_utf8(&msg.payload).unwrap().parse().unwrap();
            assert!(seen.insert(n), "message {n} delivered to two members");
        }
    }
    assert_eq!(seen.len(), COUNT, "some messages reached no member");
    // A plain subscription on the same subject still gets its own copy of each.
    round_trip(&watcher).await;
    assert_eq!(drain_ready(&mut all).len(), COUNT);
}

#[tokio::test]
async fn request_gets_reply() {
    let server = start().await;
    let responder = client(&server).await;
    let mut service = responder.subscribe("svc.echo").await.unwrap();
    round_trip(&responder).await;
    tokio::spawn(async move {
        while let Some(msg) = service.next().await {
            let reply = msg.reply.unwrap();
            let mut answer = b"re: ".to_vec();
            answer.extend_from_slice(&msg.payload);
            responder.publish(reply, answer.into()).await.unwrap();
        }
    });
    let requester = client(&server).await;
    let response = requester.request("svc.echo", "ping".into()).await.unwrap();
    assert_eq!(&response.payload[..], b"re: ping");
}

#[tokio::test]
async fn request_without_responders_fails_at_once() {
    let server = start().await;
    let client = client(&server).await;
    let started = Instant::now();
    let err = client
        .request("nobody.home", "anyone?".into())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), async_nats::RequestErrorKind::NoResponders);
    // The client's own request timeout is 10 s; no-responders must beat it by far.
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn headers_round_trip() {
    let server = start().await;
    let client = client(&server).await;
    let mut sub = client.subscribe("h").await.unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("X-Trace", "abc-123");
    headers.append("X-Multi", "one");
    headers.append("X-Multi", "two");
    client
        .publish_with_headers("h", headers, "body".into())
        .await
        .unwrap();
    let msg = next(&mut sub).await;
    let got = msg.headers.expect("headers were dropped");
    assert_eq!(got.get("X-Trace").unwrap().as_str(), "abc-123");
    let multi: Vec<&str> = got
        .get_all("X-Multi")
        .map(|v: &async_nats::HeaderValue| v.as_str())
        .collect();
    assert_eq!(multi, ["one", "two"]);
    assert_eq!(&msg.payload[..], b"body");
}

#[tokio::test]
async fn unsubscribe_after_ends_subscription() {
    let server = start().await;
    let client = client(&server).await;
    let mut sub = client.subscribe("few").await.unwrap();
    sub.unsubscribe_after(2).await.unwrap();
    for i in 0..3 {
        client.publish("few", i.to_string().into()).await.unwrap();
    }
    assert_eq!(next_text(&mut sub).await.1, "0");
    assert_eq!(next_text(&mut sub).await.1, "1");
    let end = tokio::time::timeout(DEADLINE, sub.next()).await.unwrap();
    assert!(end.is_none(), "got a message past the max: {end:?}");
}

#[tokio::test]
async fn no_echo_skips_own_messages() {
    let server = start().await;
    let quiet = ConnectOptions::new()
        .no_echo()
        .connect(&server.url)
        .await
        .unwrap();
    let mut sub = quiet.subscribe("chat").await.unwrap();
    quiet.publish("chat", "mine".into()).await.unwrap();
    // Without echo the usual round trip cannot come back; a no-responders reply can.
    let err = quiet.request("nobody.home", "".into()).await.unwrap_err();
    assert_eq!(err.kind(), async_nats::RequestErrorKind::NoResponders);
    let other = client(&server).await;
    other.publish("chat", "theirs".into()).await.unwrap();
    assert_eq!(next_text(&mut sub).await.1, "theirs");
}

async fn start_with_auth(auth: Auth) -> EmbeddedServer {
    EmbeddedServer::start(Config {
        auth,
        ..Config::default()
    })
    .await
}

async fn assert_round_trip(client: &async_nats::Client) {
    let mut sub = client.subscribe("auth.ok").await.unwrap();
    client.publish("auth.ok", "in".into()).await.unwrap();
    assert_eq!(next_text(&mut sub).await.1, "in");
}

#[tokio::test]
async fn token_auth_accepts_right_token() {
    let server = start_with_auth(Auth::Token("t0ken".into())).await;
    let client = ConnectOptions::with_token("t0ken".into())
        .connect(&server.url)
        .await
        .unwrap();
    assert!(client.server_info().auth_required);
    assert_round_trip(&client).await;
}

#[tokio::test]
async fn token_auth_refuses_wrong_token() {
    let server = start_with_auth(Auth::Token("t0ken".into())).await;
    let err = ConnectOptions::with_token("guess".into())
        .connect(&server.url)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ConnectErrorKind::AuthorizationViolation);
}

fn user_pass() -> Auth {
    Auth::UserPass {
        user: "alice".into(),
        pass: "wonderland".into(),
    }
}

#[tokio::test]
async fn user_pass_auth_accepts_right_credentials() {
    let server = start_with_auth(user_pass()).await;
    let client = ConnectOptions::with_user_and_password("alice".into(), "wonderland".into())
        .connect(&server.url)
        .await
        .unwrap();
    assert_round_trip(&client).await;
}

#[tokio::test]
async fn user_pass_auth_refuses_wrong_password() {
    let server = start_with_auth(user_pass()).await;
    let err = ConnectOptions::with_user_and_password("alice".into(), "looking-glass".into())
        .connect(&server.url)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ConnectErrorKind::AuthorizationViolation);
}

#[tokio::test]
async fn payload_over_max_is_refused() {
    let server = EmbeddedServer::start(Config {
        max_payload: 1024,
        ..Config::default()
    })
    .await;
    let client = client(&server).await;
    assert_eq!(client.server_info().max_payload, 1024);
    let err = client
        .publish("big", vec![0u8; 2000].into())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), async_nats::PublishErrorKind::MaxPayloadExceeded);
    // A payload at the limit still goes through.
    let mut sub = client.subscribe("big").await.unwrap();
    client.publish("big", vec![7u8; 1024].into()).await.unwrap();
    assert_eq!(next(&mut sub).await.payload.len(), 1024);
}

// ---- Monitoring ----

fn number(value: &serde_json::Value, key: &str) -> f64 {
    value[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing or not a number in {value}"))
}

/// A server with its monitor, one named client holding two subscriptions (one in a queue
/// group) and one message already routed to both.
struct Monitored {
    monitor: SocketAddr,
    client: async_nats::Client,
    _subs: Vec<Subscriber>,
    _server: EmbeddedServer,
}

async fn monitored() -> Monitored {
    let server = start().await;
    let monitor = server.start_monitor().await;
    let client = ConnectOptions::new()
        .name("monitored")
        .connect(&server.url)
        .await
        .unwrap();
    let mut wild = client.subscribe("foo.*").await.unwrap();
    let mut queue = client.queue_subscribe("foo.bar", "q".into()).await.unwrap();
    client.publish("foo.bar", "hi".into()).await.unwrap();
    next(&mut wild).await;
    next(&mut queue).await;
    Monitored {
        monitor,
        client,
        _subs: vec![wild, queue],
        _server: server,
    }
}

#[tokio::test]
async fn healthz_reports_ok() {
    let server = start().await;
    let monitor = server.start_monitor().await;
    let health = get_json(monitor, "/healthz").await;
    assert_eq!(health, serde_json::json!({"status": "ok"}));
}

#[tokio::test]
async fn varz_reports_server_and_traffic() {
    let setup = monitored().await;
    let monitor = setup.monitor;
    let varz = get_json(monitor, "/varz").await;
    assert!(varz["server_id"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(varz["version"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(number(&varz, "connections"), 1.0);
    assert!(number(&varz, "total_connections") >= 1.0);
    assert!(number(&varz, "in_msgs") >= 1.0);
    assert!(number(&varz, "out_msgs") >= 2.0);
    assert!(number(&varz, "in_bytes") >= 2.0);
    assert!(number(&varz, "out_bytes") >= 4.0);
    assert_eq!(number(&varz, "slow_consumers"), 0.0);
    assert!(number(&varz, "subscriptions") >= 2.0);
    assert!(varz["uptime"].as_str().is_some(), "uptime: {varz}");
    number(&varz, "mem");
    number(&varz, "cpu");
}

#[tokio::test]
async fn connz_lists_connection_details() {
    let setup = monitored().await;
    let monitor = setup.monitor;
    let connz = get_json(monitor, "/connz?subs=1").await;
    let conns = connz["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 1, "{connz}");
    let conn = &conns[0];
    number(conn, "cid");
    assert_eq!(conn["ip"], "127.0.0.1");
    number(conn, "port");
    assert_eq!(conn["name"], "monitored");
    assert_eq!(conn["lang"], "rust");
    assert!(conn["version"].as_str().is_some(), "{conn}");
    assert_eq!(number(conn, "pending_bytes"), 0.0);
    assert_eq!(number(conn, "in_msgs"), 1.0);
    assert_eq!(number(conn, "out_msgs"), 2.0);
    assert_eq!(number(conn, "in_bytes"), 2.0);
    assert_eq!(number(conn, "out_bytes"), 4.0);
    assert_eq!(number(conn, "subscriptions"), 2.0);
    let subjects: BTreeSet<&str> = conn["subscriptions_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(subjects, BTreeSet::from(["foo.*", "foo.bar"]));
}

#[tokio::test]
async fn connz_pages_and_sorts_by_cid() {
    let server = start().await;
    let monitor = server.start_monitor().await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&server).await);
    }
    let first = get_json(monitor, "/connz?limit=2&offset=0&sort=cid").await;
    assert_eq!(number(&first, "total"), 3.0, "{first}");
    let page = first["connections"].as_array().unwrap();
    assert_eq!(page.len(), 2);
    let (a, b) = (number(&page[0], "cid"), number(&page[1], "cid"));
    assert!(a < b, "not sorted by cid: {first}");
    let rest = get_json(monitor, "/connz?limit=2&offset=2&sort=cid").await;
    let page = rest["connections"].as_array().unwrap();
    assert_eq!(page.len(), 1, "{rest}");
    assert!(number(&page[0], "cid") > b);
}

#[tokio::test]
async fn subsz_reports_counts_and_matches_test_subject() {
    let setup = monitored().await;
    let monitor = setup.monitor;
    let mut other = setup.client.subscribe("bar.baz").await.unwrap();
    // Its own message coming back proves the server has the subscription.
    setup.client.publish("bar.baz", "".into()).await.unwrap();
    next(&mut other).await;
    let subsz = get_json(monitor, "/subsz").await;
    assert_eq!(number(&subsz, "num_subscriptions"), 3.0);
    for key in [
        "num_cache",
        "num_inserts",
        "num_removes",
        "num_matches",
        "cache_hit_rate",
        "max_fanout",
        "avg_fanout",
    ] {
        number(&subsz, key);
    }
    let tested = get_json(monitor, "/subsz?subs=1&test=foo.bar").await;
    let subjects: BTreeSet<&str> = tested["subscriptions_list"]
        .as_array()
        .unwrap_or_else(|| panic!("no subscriptions_list: {tested}"))
        .iter()
        .map(|s| s["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, BTreeSet::from(["foo.*", "foo.bar"]));
    drop(other);
}

#[tokio::test]
async fn metrics_serves_prometheus_text() {
    let setup = monitored().await;
    let monitor = setup.monitor;
    let (status, body) = http_get(monitor, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    for line in body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let value = line.rsplit(' ').next().unwrap();
        assert!(
            value.parse::<f64>().is_ok(),
            "not a Prometheus sample line: {line:?}"
        );
    }
}
