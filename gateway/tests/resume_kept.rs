//! What a resume keeps (docs/protocol.md, "Resume"), end to end over real WebSockets, a
//! cuttable TCP hop and two gates on one bus: a request that was waiting for a worker
//! keeps waiting, and is answered when one comes; serial requests queued behind one in
//! flight are forwarded in turn; and a resume refused, whatever its code, changes
//! nothing of the session it named, whose client then resumes it. Runs on both brokers.

mod common;

use std::sync::Arc;

use common::raw::RawClient;
use common::resumable::{Got, Player, PlayerTokens, room_service};
use common::{Bus, DEADLINE, Holds, TestGate, start_worker, within};
use gateway::GateConfig;
use proto::client::{Handshake, HandshakeAck};
use proto::code;
use serde_json::{Value, json};
use services::FrameConfig;
use testkit::Cut;
use tokio_tungstenite::tungstenite::Message;

broker::on_both_buses!(
    a_request_waiting_for_a_worker_is_answered_when_one_comes_after_a_resume_here,
    a_request_waiting_for_a_worker_is_answered_when_one_comes_after_a_resume_elsewhere,
    queued_serial_requests_are_forwarded_after_a_resume_here,
    queued_serial_requests_are_forwarded_after_a_resume_elsewhere,
    refused_resumes_leave_the_session_to_its_client,
    another_players_refused_resume_leaves_the_session_to_its_client,
    a_json_client_resumes_with_proto3_json_spellings,
);

/// Two gates on `bus` (taking player tokens, or any token), and a hop to the first
/// that the test cuts.
async fn two_gates(bus: &Bus, tokens: Option<Arc<PlayerTokens>>) -> (TestGate, TestGate, Cut) {
    let first = gate(bus, tokens.clone()).await;
    let second = gate(bus, tokens).await;
    let hop = Cut::start(first.addr).await.unwrap();
    (first, second, hop)
}

async fn gate(bus: &Bus, tokens: Option<Arc<PlayerTokens>>) -> TestGate {
    match tokens {
        Some(tokens) => TestGate::start_with_tokens(bus, GateConfig::default(), tokens).await,
        None => TestGate::start(bus, GateConfig::default()).await,
    }
}

/// Where a cut session resumes: the other gate, or the same one through its cut link.
fn resume_at(elsewhere: bool, second: &TestGate, hop: &Cut) -> String {
    if elsewhere {
        second.url.clone()
    } else {
        hop.ws_url()
    }
}

/// `echo.raw` is sent while its service, known to both gates, has no worker; the link
/// is cut, the client resumes (on the first gate again, or on the second) and sends it
/// again as step 6 says; a worker starts: the one answer is the worker's, not a 408.
async fn waiting_for_a_worker(bus: Bus, elsewhere: bool) {
    let (first, second, hop) = two_gates(&bus, None).await;
    let echo = common::echo_worker(&bus).await;
    for gate in [&first, &second] {
        assert!(gate.gate.wait_for_schemas(&["echo"], DEADLINE).await);
    }
    echo.stop().await;
    let mut player = within(Player::open(&hop.ws_url(), "")).await;
    let id = player.send("echo.raw", "late").await;
    common::eventually("the request waits", || first.gate.in_flight() == 1).await;
    hop.cut();
    within(player.resume(&resume_at(elsewhere, &second, &hop))).await;
    player.send_as(id, "echo.raw", "late").await;
    let _echo = common::echo_worker(&bus).await;
    assert_eq!(
        within(player.next()).await,
        Got::Response(id, code::OK, "late".into())
    );
    // Answered once: what comes next is the next request's answer.
    let next = player.send("echo.raw", "next").await;
    assert_eq!(
        within(player.next()).await,
        Got::Response(next, code::OK, "next".into())
    );
}

async fn a_request_waiting_for_a_worker_is_answered_when_one_comes_after_a_resume_here(bus: Bus) {
    waiting_for_a_worker(bus, false).await;
}

async fn a_request_waiting_for_a_worker_is_answered_when_one_comes_after_a_resume_elsewhere(
    bus: Bus,
) {
    waiting_for_a_worker(bus, true).await;
}

/// A serial session has `park.hold` inside its handler and `park.who` queued behind it
/// when its link is cut; it resumes and sends both again, same ids: each is answered
/// once, in order, by the worker (none `503 ... send it again`).
async fn queued_serial(bus: Bus, elsewhere: bool) {
    let mut holds = Holds::default();
    let _worker = start_worker(
        bus.url(),
        holds.service("park", "w"),
        FrameConfig::default(),
    )
    .await;
    let (_first, second, hop) = two_gates(&bus, None).await;
    let serial = Handshake {
        serial: true,
        ..Handshake::default()
    };
    let mut player = within(Player::open_with(&hop.ws_url(), serial)).await;
    let held = player.send("park.hold", "first").await;
    assert_eq!(holds.started().await, "w");
    let queued = player.send("park.who", "").await;
    within(player.sync()).await;
    hop.cut();
    within(player.resume(&resume_at(elsewhere, &second, &hop))).await;
    player.send_as(held, "park.hold", "first").await;
    player.send_as(queued, "park.who", "").await;
    holds.release("w");
    assert_eq!(
        within(player.next()).await,
        Got::Response(held, code::OK, "first".into())
    );
    assert_eq!(
        within(player.next()).await,
        Got::Response(queued, code::OK, "w".into())
    );
    let last = player.send("park.who", "").await;
    assert_eq!(
        within(player.next()).await,
        Got::Response(last, code::OK, "w".into())
    );
    assert_eq!(holds.started_now(), None, "the held handler ran once");
}

async fn queued_serial_requests_are_forwarded_after_a_resume_here(bus: Bus) {
    queued_serial(bus, false).await;
}

async fn queued_serial_requests_are_forwarded_after_a_resume_elsewhere(bus: Bus) {
    queued_serial(bus, true).await;
}

/// A binary resume attempt at `url` with `token` (the handshake's) for the session
/// `resume_token` names, from `last_seq`: a fresh session, whose code says why.
async fn attempt(url: &str, token: &str, resume_token: &str, last_seq: u64) -> HandshakeAck {
    let mut raw = RawClient::connect(url).await;
    let ack = raw
        .handshake(Handshake {
            token: token.into(),
            resumable: true,
            resume_token: resume_token.into(),
            last_seq,
            ..Handshake::default()
        })
        .await;
    assert_eq!(ack.code, code::OK, "{ack:?}");
    ack
}

/// The same attempt by a JSON client: the ack's `resume_code`.
async fn json_attempt(url: &str, resume_token: &str, last_seq: u64) -> Value {
    let mut raw = RawClient::connect(url).await;
    let hello = json!({"handshake": {
        "resumable": true, "resume_token": resume_token, "last_seq": last_seq,
    }});
    raw.send(Message::text(hello.to_string())).await;
    let ack: Value = serde_json::from_str(&raw.next_text().await).unwrap();
    ack["handshake_ack"]["resume_code"].clone()
}

/// `token` with its secret's last digit changed.
fn forged(token: &str) -> String {
    let (head, last) = token.split_at(token.len() - 1);
    format!("{head}{}", if last == "0" { "1" } else { "0" })
}

/// `token` naming a gate that is not there.
fn elsewhere(token: &str) -> String {
    let (_, rest) = token.split_once('.').unwrap();
    format!("nowhere.{rest}")
}

/// Every refusal a holder of the token can provoke without the player's own token, on
/// both gates: 400 (a `last_seq` past what was sent; the other encoding), 404 (a forged
/// secret), 409 (a `last_seq` below what the client acknowledged), 503 (a gate that is
/// not there). None may end or change the session.
async fn refuse_everything(player: &Player, gates: [&str; 2]) {
    let (token, seq) = (player.token.as_str(), player.last_seq);
    for url in gates {
        let refusals = [
            (code::BAD_REQUEST, token.to_owned(), seq + 100),
            (code::NOT_FOUND, forged(token), seq),
            (code::CONFLICT, token.to_owned(), 0),
            (code::UNAVAILABLE, elsewhere(token), seq),
        ];
        for (expected, resume_token, last_seq) in refusals {
            let ack = within(attempt(url, "", &resume_token, last_seq)).await;
            assert_eq!(
                ack.resume_code, expected,
                "{resume_token} {last_seq}: {ack:?}"
            );
        }
        let json = within(json_attempt(url, token, seq)).await;
        assert_eq!(json, code::BAD_REQUEST, "the other encoding");
    }
}

/// Refused attempts while the client is connected and while its link is down leave
/// the session as it was: served, then resumed by its client on the other gate with
/// what was said while it was away.
async fn refused_resumes_leave_the_session_to_its_client(bus: Bus) {
    let _worker = start_worker(bus.url(), room_service(), FrameConfig::default()).await;
    let (first, second, hop) = two_gates(&bus, None).await;
    let gates = [first.url.as_str(), second.url.as_str()];
    let mut ada = within(Player::enter(&hop.ws_url(), "ada")).await;
    // Acknowledged: a resume from before this is one the session cannot serve (409).
    ada.ack().await;
    within(ada.sync()).await;
    refuse_everything(&ada, gates).await;
    let id = ada.send("room.say", "still here").await;
    assert_eq!(within(ada.next()).await, Got::Push("still here".into()));
    assert_eq!(
        within(ada.next()).await,
        Got::Response(id, code::OK, "still here".into())
    );
    ada.ack().await;
    within(ada.sync()).await;
    hop.cut();
    refuse_everything(&ada, gates).await;
    let mut bea = within(Player::enter(&second.url, "bea")).await;
    let id = bea.send("room.say", "missed").await;
    assert_eq!(within(bea.next()).await, Got::Push("missed".into()));
    assert_eq!(
        within(bea.next()).await,
        Got::Response(id, code::OK, "missed".into())
    );
    within(ada.resume(&second.url)).await;
    assert_eq!(within(ada.next()).await, Got::Push("missed".into()));
}

/// With player tokens, another player's attempt (403), with the session connected and
/// then detached, leaves it to its player, who resumes it.
async fn another_players_refused_resume_leaves_the_session_to_its_client(bus: Bus) {
    let _worker = start_worker(bus.url(), room_service(), FrameConfig::default()).await;
    let (_first, second, hop) = two_gates(&bus, Some(Arc::new(PlayerTokens))).await;
    let mut ada = within(Player::open(&hop.ws_url(), "player:ada")).await;
    let id = ada.send("room.enter", "ada").await;
    assert_eq!(
        within(ada.next()).await,
        Got::Response(id, code::OK, "ada".into())
    );
    for cut in [false, true] {
        if cut {
            hop.cut();
        }
        for url in [hop.ws_url(), second.url.clone()] {
            let ack = within(attempt(&url, "player:eve", &ada.token, ada.last_seq)).await;
            assert_eq!(ack.resume_code, code::FORBIDDEN, "{ack:?}");
        }
        if !cut {
            let id = ada.send("room.say", "still here").await;
            assert_eq!(within(ada.next()).await, Got::Push("still here".into()));
            assert_eq!(
                within(ada.next()).await,
                Got::Response(id, code::OK, "still here".into())
            );
        }
    }
    let ack = within(ada.try_resume(&second.url, "player:ada")).await;
    assert_eq!((ack.code, ack.resume_code), (code::OK, code::OK), "{ack:?}");
}

/// A JSON client may spell the handshake's fields as the proto3 JSON mapping does
/// (`resumeToken`, `lastSeq` as a string), as its bodies are spelt: it resumes.
async fn a_json_client_resumes_with_proto3_json_spellings(bus: Bus) {
    let _worker = start_worker(bus.url(), room_service(), FrameConfig::default()).await;
    let (_first, second, hop) = two_gates(&bus, None).await;
    let mut raw = RawClient::connect(&hop.ws_url()).await;
    raw.send(Message::text(r#"{"handshake":{"resumable":true}}"#))
        .await;
    let ack: Value = serde_json::from_str(&raw.next_text().await).unwrap();
    let token = ack["handshake_ack"]["resume_token"]
        .as_str()
        .unwrap()
        .to_owned();
    raw.send(Message::text(
        r#"{"request":{"id":1,"route":"room.enter","body":"ann"}}"#,
    ))
    .await;
    let entered: Value = serde_json::from_str(&raw.next_text().await).unwrap();
    assert_eq!(entered["response"]["seq"], 1, "{entered}");
    hop.cut();
    let mut raw = RawClient::connect(&second.url).await;
    let hello = json!({"handshake": {"resumable": true, "resumeToken": token, "lastSeq": "1"}});
    raw.send(Message::text(hello.to_string())).await;
    let ack: Value = serde_json::from_str(&raw.next_text().await).unwrap();
    assert_eq!(ack["handshake_ack"]["resume_code"], 200, "{ack}");
    assert_eq!(ack["handshake_ack"]["last_seq"], 1, "{ack}");
}
