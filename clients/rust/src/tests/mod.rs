//! The SDK against a fake gate ([`fake_gate`]).

mod drain;
mod fake_gate;
mod resume;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::join_all;
use tokio::net::TcpListener;

use testkit::{DEADLINE, within};

use super::*;
use fake_gate::{Control, Event, REVERSE_BATCH, fake_gate};

fn options() -> ClientOptions {
    ClientOptions {
        request_timeout: DEADLINE,
        ..ClientOptions::default()
    }
}

fn reconnecting() -> ClientOptions {
    ClientOptions {
        reconnect: Some(Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
        }),
        ..options()
    }
}

fn closed_reason(e: &SdkError) -> &str {
    match e.kind() {
        ErrorKind::Closed { reason } => reason,
        other => panic!("expected Closed, got {other:?} ({e})"),
    }
}

#[tokio::test]
async fn connect_handshakes_and_reports_the_session() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    assert_eq!(client.session_id(), 1);
    let r = client.request("echo.echo", b"hi").await.unwrap();
    assert_eq!((r.id, r.code, &r.body[..]), (1, 200, &b"hi"[..]));
}

#[tokio::test]
async fn refused_handshake_returns_its_code_and_message() {
    let gate = fake_gate(0).await;
    let options = ClientOptions {
        token: "bad".into(),
        ..options()
    };
    let e = Client::connect(&gate.url, options).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Handshake { code: 401 });
    assert_eq!(e.detail(), "bad token");
}

#[tokio::test]
async fn connect_to_nothing_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    drop(listener);
    let e = Client::connect(&url, options()).await.unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Connect);
}

/// A client given a source address connects from it; one the host does not have fails
/// the connect, naming it.
#[tokio::test]
async fn a_source_address_is_where_the_socket_comes_from() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    let from = |ip: &str| ClientOptions {
        source_addr: Some(ip.parse().unwrap()),
        connect_timeout: DEADLINE,
        ..options()
    };
    let dialing = tokio::spawn({
        let url = url.clone();
        async move { Client::connect(&url, from("127.0.0.3")).await }
    });
    let (stream, peer) = within(listener.accept()).await.unwrap();
    assert_eq!(peer.ip().to_string(), "127.0.0.3");
    drop(stream);
    let refused = within(dialing).await.unwrap().unwrap_err();
    assert_eq!(refused.kind(), &ErrorKind::Connect);
    let e = Client::connect(&url, from("192.0.2.1")).await.unwrap_err();
    assert!(e.to_string().contains("source address 192.0.2.1"), "{e}");
}

#[tokio::test]
async fn concurrent_requests_get_their_own_responses() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    // Reversed answers prove matching is by id, not by order.
    let reversed = (0..REVERSE_BATCH * 4).map(|i| {
        let client = client.clone();
        async move {
            let body = format!("rev-{i}");
            let r = client.request("echo.reverse", &body).await.unwrap();
            assert_eq!((r.code, &r.body[..]), (200, body.as_bytes()));
        }
    });
    let echoed = (0..200).map(|i| {
        let client = client.clone();
        async move {
            let body = format!("echo-{i}");
            let r = client.request("echo.echo", &body).await.unwrap();
            assert_eq!(&r.body[..], body.as_bytes());
        }
    });
    let tasks = reversed.map(tokio::spawn).chain(echoed.map(tokio::spawn));
    for task in within(join_all(tasks)).await {
        task.unwrap();
    }
    assert_eq!(client.pending(), 0);
}

#[tokio::test]
async fn non_200_responses_are_responses_not_errors() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let r = client.request("echo.fail", b"").await.unwrap();
    assert_eq!((r.code, r.message.as_str()), (500, "boom"));
}

#[tokio::test]
async fn text_frame_responses_are_decoded_as_json() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let r = client.request("echo.json", b"json body").await.unwrap();
    assert_eq!((r.code, &r.body[..]), (200, &b"json body"[..]));
}

#[tokio::test]
async fn notify_is_sent_with_id_zero_and_gets_no_response() {
    let mut gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    client.notify("chat.say", b"hello").await.unwrap();
    let event = within(gate.events.recv()).await.unwrap();
    assert_eq!(
        event,
        Event::Notify {
            route: "chat.say".into(),
            body: Bytes::from_static(b"hello")
        }
    );
    // The fake answered the notify with a stray id-0 response; the next request still
    // gets its own.
    let r = client.request("echo.echo", b"after").await.unwrap();
    assert_eq!((r.id, &r.body[..]), (1, &b"after"[..]));
}

#[tokio::test]
async fn unanswered_request_times_out_and_is_forgotten() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let e = client
        .request_with_timeout("echo.slow", b"", Duration::from_millis(20))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Timeout);
    assert_eq!(client.pending(), 0);
    let r = client.request("echo.echo", b"still up").await.unwrap();
    assert_eq!(&r.body[..], b"still up");
}

#[tokio::test]
async fn pushes_are_delivered() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let mut pushes = client.pushes().unwrap();
    assert!(client.pushes().is_none(), "the push stream is taken once");
    client.request("push.me", b"news").await.unwrap();
    let push = within(pushes.recv()).await.unwrap();
    assert_eq!(
        (push.route.as_str(), &push.body[..]),
        ("chat.msg", &b"news"[..])
    );
}

#[tokio::test]
async fn full_push_queue_drops_and_counts_instead_of_stalling() {
    let gate = fake_gate(0).await;
    let options = ClientOptions {
        push_capacity: 1,
        ..options()
    };
    let client = Client::connect(&gate.url, options).await.unwrap();
    for _ in 0..3 {
        // Each response follows its push, so the pushes have been routed by now.
        client.request("push.me", b"x").await.unwrap();
    }
    assert_eq!(client.pushes_dropped(), 2);
    let mut pushes = client.pushes().unwrap();
    assert!(pushes.try_recv().is_some());
    assert!(pushes.try_recv().is_none());
}

#[tokio::test]
async fn kick_closes_with_its_reason_and_does_not_reconnect() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, reconnecting()).await.unwrap();
    let mut pushes = client.pushes().unwrap();
    let e = client.request("kick.me", b"bye").await.unwrap_err();
    assert_eq!(closed_reason(&e), "bye");
    assert_eq!(within(client.closed()).await, "bye");
    assert!(client.is_closed());
    let e = client.request("echo.echo", b"").await.unwrap_err();
    assert_eq!(closed_reason(&e), "bye");
    assert!(within(pushes.recv()).await.is_none(), "pushes end at close");
    assert_eq!(gate.connections.load(Ordering::SeqCst), 1);
}

/// docs/protocol.md, "Kicks and closes": `1001 resumed elsewhere` means someone else
/// took the session up; the client ends as after a kick, while another close is a drop
/// it reconnects after.
#[tokio::test]
async fn resumed_elsewhere_closes_and_does_not_reconnect() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, reconnecting()).await.unwrap();
    // Failed, as the gate resumes nothing: what matters is the reconnect.
    client.request("close.me", b"too slow").await.unwrap_err();
    within(async {
        while client.reconnects() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let e = client
        .request("close.me", b"resumed elsewhere")
        .await
        .unwrap_err();
    assert_eq!(closed_reason(&e), "resumed elsewhere");
    assert_eq!(within(client.closed()).await, "resumed elsewhere");
    assert_eq!(gate.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn close_fails_later_requests() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    within(client.close()).await;
    let e = client.notify("echo.echo", b"").await.unwrap_err();
    assert_eq!(closed_reason(&e), "closed by client");
    let e = client.request("echo.echo", b"").await.unwrap_err();
    assert_eq!(closed_reason(&e), "closed by client");
}

#[tokio::test]
async fn dropped_connection_without_reconnect_closes() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let e = client.request("drop.me", b"").await.unwrap_err();
    assert!(e.is_closed(), "{e}");
    within(client.closed()).await;
    assert!(
        client
            .request("echo.echo", b"")
            .await
            .unwrap_err()
            .is_closed()
    );
}

#[tokio::test]
async fn reconnects_after_the_gate_drops_the_connection() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, reconnecting()).await.unwrap();
    assert_eq!(client.session_id(), 1);
    // In flight at the drop: fails with Closed.
    let e = client.request("drop.me", b"").await.unwrap_err();
    assert!(e.is_closed(), "{e}");
    // Made during or after the reconnection: waits for it and succeeds.
    let r = client.request("echo.echo", b"again").await.unwrap();
    assert_eq!(&r.body[..], b"again");
    assert_eq!(client.session_id(), 2);
    assert_eq!(client.reconnects(), 1);
    assert!(!client.is_closed());
    // And again: the backoff restarts from `initial` after a success.
    client.request("drop.me", b"").await.unwrap_err();
    client
        .notify("chat.say", b"queued while down")
        .await
        .unwrap();
    let r = client.request("echo.echo", b"third").await.unwrap();
    assert_eq!(&r.body[..], b"third");
    assert_eq!(client.session_id(), 3);
}

#[tokio::test]
async fn requests_wait_for_the_reconnection_then_time_out() {
    let mut gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, reconnecting()).await.unwrap();
    gate.stop_accepting().await;
    client.request("drop.me", b"").await.unwrap_err();
    let e = client
        .request_with_timeout("echo.echo", b"", Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Timeout);
    assert_eq!(client.pending(), 0);
    assert!(!client.is_closed(), "still trying to reconnect");
    // Closing stops the reconnection; waiting requests learn why.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.request("echo.echo", b"").await })
    };
    within(client.close()).await;
    let e = within(waiting).await.unwrap().unwrap_err();
    assert_eq!(closed_reason(&e), "closed by client");
}

/// Waits for `n` heartbeats of session 1 at `gate`.
async fn heartbeats(gate: &mut fake_gate::FakeGate, n: usize) {
    for _ in 0..n {
        let event = within(gate.events.recv()).await.unwrap();
        assert_eq!(event, Event::Heartbeat { session: 1 });
    }
}

#[tokio::test]
async fn sends_heartbeats_at_the_interval_the_gate_asked() {
    let mut gate = fake_gate(20).await;
    let _client = Client::connect(&gate.url, options()).await.unwrap();
    heartbeats(&mut gate, 3).await;
}

#[tokio::test]
async fn the_first_heartbeat_waits_a_whole_interval() {
    // One beat an interval, not two: the gate closes only after two silent intervals.
    let interval = Duration::from_millis(300);
    let mut gate = fake_gate(300).await;
    let start = Instant::now();
    let _client = Client::connect(&gate.url, options()).await.unwrap();
    heartbeats(&mut gate, 1).await;
    // Timers never fire early; the interval starts after the handshake, after `start`.
    assert!(start.elapsed() >= interval, "after {:?}", start.elapsed());
}

/// A gate that goes silent with its socket open (the link lost without a reset) is
/// counted gone after two of its heartbeat intervals: what waits on it fails, naming
/// the silence. While it answers, the link outlives many intervals.
#[tokio::test]
async fn a_silent_gate_is_dropped_after_two_heartbeat_intervals() {
    let mut gate = fake_gate(50).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    heartbeats(&mut gate, 6).await;
    let r = within(client.request("echo.echo", b"alive")).await.unwrap();
    assert_eq!(r.code, 200);
    gate.control(Control::Silence);
    let start = Instant::now();
    let e = within(client.request("echo.echo", b"lost"))
        .await
        .unwrap_err();
    assert_eq!(closed_reason(&e), "no frame from the gate in 100 ms");
    assert!(
        start.elapsed() >= Duration::from_millis(50),
        "{:?}",
        start.elapsed()
    );
}

/// With reconnect set, the client leaves a silent gate for a new connection.
#[tokio::test]
async fn a_silent_gate_is_left_for_a_new_connection() {
    let gate = fake_gate(50).await;
    let client = Client::connect(&gate.url, reconnecting()).await.unwrap();
    gate.control(Control::Silence);
    within(async {
        while client.reconnects() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let r = within(client.request("echo.echo", b"again")).await.unwrap();
    assert_eq!((r.code, &r.body[..]), (200, &b"again"[..]));
}

#[tokio::test]
async fn dropping_every_handle_closes_the_connection() {
    let gate = fake_gate(0).await;
    let client = Client::connect(&gate.url, options()).await.unwrap();
    let mut pushes = client.pushes().unwrap();
    drop(client);
    assert!(within(pushes.recv()).await.is_none());
}
