//! Resuming: a dropped link takes its session up again, nothing lost, nothing twice.

use std::sync::atomic::Ordering;

use super::fake_gate::{Control, Event, FakeGate, resuming_gate};
use super::{closed_reason, reconnecting, within};
use crate::resume::ACK_EVERY;
use crate::{Client, ClientOptions, Pushes};

/// A resuming gate and a client of it, asking for resume (the default) and reconnect.
async fn resumable(heartbeat_ms: u32) -> (FakeGate, Client) {
    let gate = resuming_gate(heartbeat_ms).await;
    let client = Client::connect(&gate.url, reconnecting()).await.unwrap();
    (gate, client)
}

/// The next `n` push bodies, as text.
async fn bodies(pushes: &mut Pushes, n: usize) -> Vec<String> {
    let mut bodies = Vec::with_capacity(n);
    for _ in 0..n {
        let push = within(pushes.recv()).await.unwrap();
        bodies.push(String::from_utf8(push.body.to_vec()).unwrap());
    }
    bodies
}

fn one_to(n: u64) -> Vec<String> {
    (1..=n).map(|i| i.to_string()).collect()
}

#[tokio::test]
async fn a_cut_mid_stream_resumes_with_every_push_in_order_once() {
    let (mut gate, client) = resumable(0).await;
    let mut pushes = client.pushes().unwrap();
    // Pushes 1 to 10 (seq 1 to 10) and the answer (seq 11): the link is cut after 5.
    let r = client.request("cut.me", b"10").await.unwrap();
    assert_eq!((r.code, &r.body[..]), (200, &b"10"[..]));
    assert_eq!(bodies(&mut pushes, 10).await, one_to(10));
    // The replay began with push 5, which the client had: a repeat, dropped.
    assert_eq!(
        within(gate.events.recv()).await,
        Some(Event::Replayed {
            session: 1,
            first: 5,
            last: 11
        })
    );
    // The request was sent again and answered again (seq 11): dropped too.
    assert_eq!(
        within(gate.events.recv()).await,
        Some(Event::Resent { session: 1, id: 1 })
    );
    // The same session goes on; this answer follows everything before it.
    client.request("push.me", b"after").await.unwrap();
    assert_eq!(bodies(&mut pushes, 1).await, ["after"]);
    assert!(pushes.try_recv().is_none(), "no push arrives twice");
    assert_eq!((client.reconnects(), client.resumes()), (1, 1));
    assert_eq!(client.resume_code(), 200);
    assert_eq!(client.session_id(), 1);
    assert_eq!(gate.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_request_in_flight_at_the_cut_is_sent_again_with_its_id_and_answered_once() {
    let (mut gate, client) = resumable(0).await;
    let mut pushes = client.pushes().unwrap();
    let held = {
        let client = client.clone();
        tokio::spawn(async move { client.request("hold.me", b"old").await })
    };
    assert_eq!(
        within(gate.events.recv()).await,
        Some(Event::Held { session: 1 })
    );
    // Request 2 cuts the link; its answer comes with the replay.
    client.request("cut.me", b"").await.unwrap();
    assert_eq!(
        within(gate.events.recv()).await,
        Some(Event::Replayed {
            session: 1,
            first: 1,
            last: 1
        })
    );
    // Both were sent again, in order, with their ids: the held one is still held (not
    // held twice), the answered one is answered again with its seq, and dropped.
    for id in [1, 2] {
        assert_eq!(
            within(gate.events.recv()).await,
            Some(Event::Resent { session: 1, id })
        );
    }
    gate.control(Control::Release);
    let r = within(held).await.unwrap().unwrap();
    assert_eq!((r.id, r.code, &r.body[..]), (1, 200, &b"old"[..]));
    assert_eq!(bodies(&mut pushes, 1).await, ["released"]);
    // Ids go on counting across the resume.
    let r = client.request("echo.echo", b"next").await.unwrap();
    assert_eq!((r.id, &r.body[..]), (3, &b"next"[..]));
    assert_eq!(client.pending(), 0);
    assert_eq!((client.reconnects(), client.resumes()), (1, 1));
}

#[tokio::test]
async fn a_refused_resume_is_a_fresh_session_and_fails_what_was_in_flight() {
    let (mut gate, client) = resumable(0).await;
    let held = {
        let client = client.clone();
        tokio::spawn(async move { client.request("hold.me", b"old").await })
    };
    assert_eq!(
        within(gate.events.recv()).await,
        Some(Event::Held { session: 1 })
    );
    // The gate ends the session as it drops the link: the resume finds nothing (404).
    let e = client.request("drop.me", b"").await.unwrap_err();
    assert!(
        closed_reason(&e).contains("the session was not resumed: 404"),
        "{e}"
    );
    let e = within(held).await.unwrap().unwrap_err();
    assert!(e.is_closed(), "{e}");
    assert_eq!(client.resume_code(), 404);
    assert_eq!((client.reconnects(), client.resumes()), (1, 0));
    assert_eq!(client.session_id(), 2);
    assert_eq!(client.pending(), 0);
    // The fresh session works, and is resumable in its turn.
    let r = client.request("cut.me", b"2").await.unwrap();
    assert_eq!(r.code, 200);
    assert_eq!((client.reconnects(), client.resumes()), (2, 1));
    assert_eq!(client.resume_code(), 200);
}

#[tokio::test]
async fn without_resume_a_cut_is_a_plain_reconnection() {
    let gate = resuming_gate(0).await;
    let options = ClientOptions {
        resume: false,
        ..reconnecting()
    };
    let client = Client::connect(&gate.url, options).await.unwrap();
    let e = client.request("cut.me", b"").await.unwrap_err();
    assert!(e.is_closed(), "{e}");
    let r = client.request("echo.echo", b"fresh").await.unwrap();
    assert_eq!(&r.body[..], b"fresh");
    assert_eq!((client.reconnects(), client.resumes()), (1, 0));
    assert_eq!(client.resume_code(), 0);
    assert_eq!(client.session_id(), 2);
}

#[tokio::test]
async fn acks_are_sent_every_64_frames() {
    let (mut gate, client) = resumable(0).await;
    let batch = (ACK_EVERY - 1).to_string();
    for acked in [64, 128] {
        // 63 pushes and the answer: the 64th frame since the last ack.
        client.request("push.many", &batch).await.unwrap();
        assert_eq!(
            within(gate.events.recv()).await,
            Some(Event::Ack {
                session: 1,
                seq: acked
            })
        );
    }
}

#[tokio::test]
async fn an_ack_goes_with_every_heartbeat() {
    let (mut gate, client) = resumable(20).await;
    client.request("echo.echo", b"").await.unwrap();
    // Heartbeats before the answer acknowledge nothing yet; the next ones its seq.
    let mut heartbeats = async || loop {
        let heartbeat = gate.events.recv().await;
        assert_eq!(heartbeat, Some(Event::Heartbeat { session: 1 }));
        match gate.events.recv().await {
            Some(Event::Ack { session: 1, seq: 1 }) => return,
            Some(Event::Ack { session: 1, seq: 0 }) => {}
            other => panic!("expected an ack after the heartbeat, got {other:?}"),
        }
    };
    within(heartbeats()).await;
}

#[tokio::test]
async fn a_drained_gate_s_kick_is_not_resumed() {
    let (mut gate, client) = resumable(0).await;
    client.request("drain.me", b"going").await.unwrap();
    let later = {
        let client = client.clone();
        tokio::spawn(async move { client.request("echo.echo", b"later").await })
    };
    assert_eq!(
        within(gate.events.recv()).await,
        Some(Event::Refused {
            session: 1,
            route: "echo.echo".into()
        })
    );
    // The kick ended the session: the reconnection is a fresh session, asked as one,
    // where the refused request goes.
    gate.control(Control::Kick("gate shutting down".into()));
    let r = within(later).await.unwrap().unwrap();
    assert_eq!(&r.body[..], b"later");
    assert_eq!(client.session_id(), 2);
    assert_eq!((client.reconnects(), client.resumes()), (1, 0));
    // Not 404: no resume was asked.
    assert_eq!(client.resume_code(), 0);
}

#[tokio::test]
async fn a_garbled_frame_fails_the_connection_and_is_not_resumed() {
    let (_gate, client) = resumable(0).await;
    // The replay would bring the same frame again: a fresh session instead.
    let e = client.request("garble.me", b"").await.unwrap_err();
    assert!(closed_reason(&e).starts_with("protocol error"), "{e}");
    let r = client.request("echo.echo", b"fresh").await.unwrap();
    assert_eq!(&r.body[..], b"fresh");
    assert_eq!((client.reconnects(), client.resumes()), (1, 0));
    assert_eq!(client.resume_code(), 0);
    assert_eq!(client.session_id(), 2);
}
