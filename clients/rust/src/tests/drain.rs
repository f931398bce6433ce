//! Draining gates: the client moves to another gate of its list and loses nothing.

use std::sync::atomic::Ordering;

use tokio::net::TcpListener;

use super::fake_gate::{Control, Event, FakeGate, fake_gate, fake_gate_from};
use super::{closed_reason, options, reconnecting, within};
use crate::{Client, ClientOptions, ErrorKind};

/// A URL where nothing listens.
async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    format!("ws://{}/", listener.local_addr().unwrap())
}

/// Gates A (sessions from 1) and B (from 100), and a client given both, on A.
async fn two_gates(options: ClientOptions) -> (FakeGate, FakeGate, Client) {
    let a = fake_gate(0).await;
    let b = fake_gate_from(0, 100).await;
    let client = Client::connect_any(&[&a.url, &b.url], options)
        .await
        .unwrap();
    (a, b, client)
}

/// A request that `a` holds unanswered (as if forwarded), once `a` has it.
async fn hold_on(
    a: &mut FakeGate,
    client: &Client,
) -> tokio::task::JoinHandle<Result<crate::Response, crate::SdkError>> {
    let held = {
        let client = client.clone();
        tokio::spawn(async move { client.request("hold.me", b"old").await })
    };
    assert_eq!(
        within(a.events.recv()).await,
        Some(Event::Held { session: 1 })
    );
    held
}

fn refused(session: u64, route: &str) -> Option<Event> {
    Some(Event::Refused {
        session,
        route: route.into(),
    })
}

#[tokio::test]
async fn connect_any_takes_the_first_gate_that_answers() {
    let gate = fake_gate(0).await;
    let dead = dead_url().await;
    let client = Client::connect_any(&[&dead, &gate.url], options())
        .await
        .unwrap();
    assert_eq!(client.session_id(), 1);
    // A refused token is not tried on the other gates: they would refuse it too.
    let bad = ClientOptions {
        token: "bad".into(),
        ..options()
    };
    let e = Client::connect_any(&[&gate.url, &dead], bad)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Handshake { code: 401 });
    let none: [&str; 0] = [];
    let e = Client::connect_any(&none, options()).await.unwrap_err();
    assert_eq!(e.detail(), "no gate URL given");
}

#[tokio::test]
async fn a_drain_moves_the_client_to_the_next_gate_and_loses_nothing() {
    let (mut a, b, client) = two_gates(options()).await;
    assert_eq!(client.session_id(), 1);
    let mut pushes = client.pushes().unwrap();
    // Sent before the drain and held by A as if forwarded: it must finish on A.
    let held = hold_on(&mut a, &client).await;
    // B accepts but does not acknowledge yet, so the move cannot finish: the next
    // request still goes to A, which refuses it without forwarding.
    b.admit(false);
    let r = client.request("drain.me", b"going").await.unwrap();
    assert_eq!(r.code, 200);
    let again = {
        let client = client.clone();
        tokio::spawn(async move { client.request("echo.echo", b"again").await })
    };
    assert_eq!(within(a.events.recv()).await, refused(1, "echo.echo"));
    assert_eq!(client.moves(), 0);
    // B answers: the client moves and sends the refused request again, there.
    b.admit(true);
    let r = within(again).await.unwrap().unwrap();
    assert_eq!((r.code, &r.body[..]), (200, &b"again"[..]));
    assert_eq!(client.session_id(), 100);
    assert_eq!((client.moves(), client.reconnects()), (1, 0));
    // New requests go to B; its pushes arrive on the client's one stream.
    client.request("push.me", b"from b").await.unwrap();
    assert_eq!(&within(pushes.recv()).await.unwrap().body[..], b"from b");
    // The held request is still pending on A, so A's connection is still open.
    assert!(a.events.try_recv().is_err(), "A's session must not end yet");
    a.control(Control::Release);
    let r = within(held).await.unwrap().unwrap();
    assert_eq!((r.code, &r.body[..]), (200, &b"old"[..]));
    assert_eq!(&within(pushes.recv()).await.unwrap().body[..], b"released");
    // Nothing pending on A any more: the client closes it.
    assert_eq!(
        within(a.events.recv()).await,
        Some(Event::Ended { session: 1 })
    );
    assert!(!client.is_closed());
    let r = client.request("echo.echo", b"still on b").await.unwrap();
    assert_eq!(&r.body[..], b"still on b");
    assert_eq!(a.connections.load(Ordering::SeqCst), 1);
    assert_eq!(b.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn requests_left_on_a_retiring_gate_fail_when_it_closes() {
    let (mut a, _b, client) = two_gates(options()).await;
    let held = hold_on(&mut a, &client).await;
    client.request("drain.me", b"going").await.unwrap();
    // A request after the drain lands on B (at once, or after A refused it).
    client.request("echo.echo", b"new").await.unwrap();
    assert_eq!(client.session_id(), 100);
    // A's grace ends with the held request unanswered: it fails; the client stays up.
    a.control(Control::Kick("gate shutting down".into()));
    let e = within(held).await.unwrap().unwrap_err();
    assert_eq!(closed_reason(&e), "gate shutting down");
    assert!(!client.is_closed());
    assert_eq!(
        &client.request("echo.echo", b"b").await.unwrap().body[..],
        b"b"
    );
}

#[tokio::test]
async fn with_no_other_gate_the_client_stays_then_reconnects_after_the_kick() {
    let mut a = fake_gate(0).await;
    let dead = dead_url().await;
    let client = Client::connect_any(&[&a.url, &dead], reconnecting())
        .await
        .unwrap();
    client.request("drain.me", b"going").await.unwrap();
    let later = {
        let client = client.clone();
        tokio::spawn(async move { client.request("echo.echo", b"later").await })
    };
    assert_eq!(within(a.events.recv()).await, refused(1, "echo.echo"));
    // The draining gate's kick at the end of its grace is a drop, not a verdict: the
    // client reconnects (the dead URL, then A again) and the refused request goes out.
    a.control(Control::Kick("gate shutting down".into()));
    let r = within(later).await.unwrap().unwrap();
    assert_eq!((r.code, &r.body[..]), (200, &b"later"[..]));
    assert_eq!(client.session_id(), 2);
    assert_eq!((client.moves(), client.reconnects()), (0, 1));
}

#[tokio::test]
async fn a_reconnection_goes_to_the_next_gate() {
    let (mut a, _b, client) = two_gates(reconnecting()).await;
    a.stop_accepting().await;
    client.request("drop.me", b"").await.unwrap_err();
    let r = client.request("echo.echo", b"on b").await.unwrap();
    assert_eq!(&r.body[..], b"on b");
    assert_eq!(client.session_id(), 100);
    assert_eq!((client.moves(), client.reconnects()), (0, 1));
}
