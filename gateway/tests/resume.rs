//! Resumable sessions end to end (docs/protocol.md, "Resume"): a raw client speaking
//! the protocol as any language would, its link cut by a TCP hop with no close from
//! either side, resuming on the same gate and on another gate of the same bus, with
//! every push it missed, in order, none twice; requests sent again after a resume
//! answered once; tokens that must not resume anything refused with their codes. Runs
//! on both brokers.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::raw::RawClient;
use common::{Bus, Holds, TestGate, gate_config, start_worker, within};
use gateway::{AuthError, GateConfig, Identity, TokenCheck};
use proto::client::{Ack, Handshake, HandshakeAck, packet::Kind};
use proto::code;
use services::{FrameConfig, HandlerError, Service};
use testkit::Cut;

broker::on_both_buses!(
    a_member_cut_mid_flood_resumes_on_the_same_gate_with_every_message,
    a_member_cut_mid_flood_resumes_on_the_other_gate_with_every_message,
    a_request_sent_again_after_a_resume_is_answered_once,
    spent_stale_and_garbled_tokens_get_a_fresh_session,
    another_players_token_resumes_nothing,
    a_session_detached_on_a_draining_gate_resumes_on_another,
    more_missed_than_a_hand_over_carries_is_refused_409,
);

/// The room everyone enters.
const HALL: &str = "hall";
/// Messages said into the hall by the sender in each flood.
const FLOOD: usize = 400;
/// The victim's link is cut once it has read this many of them.
const CUT_AFTER: usize = 100;

/// `room.enter` binds the player named in the body and joins the hall; `room.say`
/// broadcasts its body to the hall; `room.who` answers the session as services see it.
fn room_service() -> Service {
    Service::new("room")
        .raw_method("enter", |ctx, body| {
            let name = std::str::from_utf8(&body)
                .map_err(|_| HandlerError::bad_request("name is not UTF-8"))?
                .to_owned();
            ctx.bind_uid(name);
            ctx.join(HALL);
            Ok(body)
        })
        .raw_method("say", |ctx, body| {
            ctx.broadcast(HALL, "room.said", body.clone())?;
            Ok(body)
        })
        .raw_method("who", |ctx, _body| {
            Ok(format!("{} {} {}", ctx.gate(), ctx.sid(), ctx.uid().unwrap_or("")).into())
        })
}

/// Handshake tokens `player:<name>` name the player, as a signed token would.
struct PlayerTokens;

impl TokenCheck for PlayerTokens {
    fn check(&self, token: &str) -> Result<Option<Identity>, AuthError> {
        let uid = token.strip_prefix("player:").ok_or(AuthError::Refused)?;
        Ok(Some(Identity {
            uid: uid.to_owned(),
            claims: HashMap::new(),
            expires: None,
        }))
    }
}

/// A client of a resumable session, as docs/protocol.md describes one: it keeps the
/// latest resume token and the highest seq it handled, drops repeats, acks.
struct Player {
    raw: RawClient,
    token: String,
    last_seq: u64,
    next_id: u64,
}

/// What a player handled: a push's body or a response's (id, code, body).
#[derive(Debug, PartialEq, Eq)]
enum Got {
    Push(String),
    Response(u64, u32, String),
}

impl Player {
    /// Opens a resumable session at `url` with `token`.
    async fn open(url: &str, token: &str) -> Player {
        let mut raw = RawClient::connect(url).await;
        let ack = raw
            .handshake(Handshake {
                token: token.into(),
                resumable: true,
                ..Handshake::default()
            })
            .await;
        assert_eq!((ack.code, ack.resume_code), (code::OK, 0), "{ack:?}");
        assert!(!ack.resume_token.is_empty(), "{ack:?}");
        Player {
            raw,
            token: ack.resume_token,
            last_seq: 0,
            next_id: 1,
        }
    }

    /// Opens a session and enters the hall as `name`.
    async fn enter(url: &str, name: &str) -> Player {
        let mut player = Player::open(url, "").await;
        let id = player.send("room.enter", name).await;
        assert_eq!(
            player.next().await,
            Got::Response(id, code::OK, name.into())
        );
        player
    }

    /// Resumes this player's session at `url` with `token`: the handshake's answer.
    async fn try_resume(&mut self, url: &str, token: &str) -> HandshakeAck {
        self.raw = RawClient::connect(url).await;
        let ack = self
            .raw
            .handshake(Handshake {
                token: token.into(),
                resumable: true,
                resume_token: self.token.clone(),
                last_seq: self.last_seq,
                ..Handshake::default()
            })
            .await;
        self.token.clone_from(&ack.resume_token);
        if ack.resume_code != code::OK {
            // A fresh session counts from 1 again.
            self.last_seq = 0;
        }
        ack
    }

    /// Resumes, which must succeed.
    async fn resume(&mut self, url: &str) {
        let ack = self.try_resume(url, "").await;
        assert_eq!((ack.code, ack.resume_code), (code::OK, code::OK), "{ack:?}");
        assert!(ack.last_seq >= self.last_seq, "{ack:?}");
    }

    /// Sends request `route` with `body` under the next id; returns the id.
    async fn send(&mut self, route: &str, body: &str) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_as(id, route, body).await;
        id
    }

    async fn send_as(&mut self, id: u64, route: &str, body: &str) {
        self.raw.request(id, route, body).await;
    }

    /// The next push or response not handled before; acks every 64.
    async fn next(&mut self) -> Got {
        loop {
            let packet = self.raw.next_packet().await;
            let (seq, got) = match packet.kind {
                Some(Kind::Push(p)) => (p.seq, Got::Push(text(&p.body))),
                Some(Kind::Response(r)) => (r.seq, Got::Response(r.id, r.code, text(&r.body))),
                Some(Kind::Heartbeat(_)) => continue,
                other => panic!("unexpected {other:?}"),
            };
            assert_ne!(seq, 0, "a resumable session numbers {got:?}");
            if seq <= self.last_seq {
                continue;
            }
            assert_eq!(seq, self.last_seq + 1, "no gap before {got:?}");
            self.last_seq = seq;
            if seq % 64 == 0 {
                self.raw.send_packet(Kind::Ack(Ack { seq })).await;
            }
            return got;
        }
    }
}

fn text(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

/// Says `count` numbered messages into the hall from a session of its own at `url`,
/// each answered before the next: `tag:0`, `tag:1`, ...
async fn flood(url: String, tag: &'static str, count: usize) {
    let mut sender = Player::enter(&url, "sender").await;
    for i in 0..count {
        let said = format!("{tag}:{i}");
        let id = sender.send("room.say", &said).await;
        // Its own messages come back as pushes before the answer.
        loop {
            match sender.next().await {
                Got::Response(got, code, _) if got == id => {
                    assert_eq!(code, code::OK);
                    break;
                }
                Got::Response(..) => panic!("answers come in order"),
                Got::Push(_) => {}
            }
        }
    }
}

/// Reads pushes until `last` arrives; returns every push body read.
async fn pushes_until(player: &mut Player, last: &str) -> Vec<String> {
    let mut said = Vec::new();
    loop {
        match player.next().await {
            Got::Push(body) => {
                let done = body == last;
                said.push(body);
                if done {
                    return said;
                }
            }
            other => panic!("only pushes expected, got {other:?}"),
        }
    }
}

/// The victim enters through a cuttable hop to the first gate and reads part of a
/// flood; its link is cut; it resumes at `resume_url(gates)` while the flood goes on,
/// and must have every message, in order, none twice.
async fn cut_mid_flood(bus: Bus, other_gate: bool) {
    let _worker = start_worker(bus.url(), room_service(), FrameConfig::default()).await;
    let first = TestGate::start(&bus, GateConfig::default()).await;
    let second = TestGate::start(&bus, GateConfig::default()).await;
    let hop = Cut::start(first.addr).await.unwrap();
    let mut victim = within(Player::enter(&hop.ws_url(), "victim")).await;
    let before = victim.send("room.who", "").await;
    let Got::Response(_, code::OK, identity) = victim.next().await else {
        panic!("room.who {before} failed");
    };
    let flooding = tokio::spawn(flood(first.url.clone(), "m", FLOOD));

    let mut said = within(pushes_until(&mut victim, &format!("m:{}", CUT_AFTER - 1))).await;
    hop.cut();
    let target = if other_gate {
        &second.url
    } else {
        &hop.ws_url()
    };
    within(victim.resume(target)).await;
    said.extend(within(pushes_until(&mut victim, &format!("m:{}", FLOOD - 1))).await);
    within(flooding).await.unwrap();

    let expected: Vec<String> = (0..FLOOD).map(|i| format!("m:{i}")).collect();
    assert_eq!(said, expected, "every message, in order, none twice");
    // The session is the same one: still in the hall, the same player, and services
    // know it by the same identity, wherever it is now.
    let id = victim.send("room.say", "back").await;
    assert_eq!(victim.next().await, Got::Push("back".into()));
    assert_eq!(
        victim.next().await,
        Got::Response(id, code::OK, "back".into())
    );
    let id = victim.send("room.who", "").await;
    assert_eq!(victim.next().await, Got::Response(id, code::OK, identity));
    // The old gate let go of it; exactly one session per player is left.
    let sessions = || first.gate.session_count() + second.gate.session_count();
    common::eventually("the old session ended", || sessions() == 2).await;
}

async fn a_member_cut_mid_flood_resumes_on_the_same_gate_with_every_message(bus: Bus) {
    cut_mid_flood(bus, false).await;
}

async fn a_member_cut_mid_flood_resumes_on_the_other_gate_with_every_message(bus: Bus) {
    cut_mid_flood(bus, true).await;
}

/// A request in flight when the link drops is sent again, same id, after the resume:
/// its handler ran once, and its one answer comes.
async fn a_request_sent_again_after_a_resume_is_answered_once(bus: Bus) {
    let mut holds = Holds::default();
    let _worker = start_worker(
        bus.url(),
        holds.service("park", "w"),
        FrameConfig::default(),
    )
    .await;
    let first = TestGate::start(&bus, GateConfig::default()).await;
    let second = TestGate::start(&bus, GateConfig::default()).await;
    let hop = Cut::start(first.addr).await.unwrap();
    let mut player = within(Player::open(&hop.ws_url(), "")).await;
    let held = player.send("park.hold", "once").await;
    assert_eq!(holds.started().await, "w");
    hop.cut();
    within(player.resume(&second.url)).await;
    player.send_as(held, "park.hold", "once").await;
    holds.release("w");
    assert_eq!(
        within(player.next()).await,
        Got::Response(held, code::OK, "once".into())
    );
    // Answered already: sent again, the same answer (a repeat the client drops) and
    // no second run.
    player.send_as(held, "park.hold", "once").await;
    let who = player.send("park.who", "").await;
    assert_eq!(
        within(player.next()).await,
        Got::Response(who, code::OK, "w".into())
    );
    assert_eq!(holds.started_now(), None, "the handler ran once");
}

/// A token used once, one whose window passed, and one that is not a token each get a
/// fresh session with their code.
async fn spent_stale_and_garbled_tokens_get_a_fresh_session(bus: Bus) {
    let _worker = start_worker(bus.url(), room_service(), FrameConfig::default()).await;
    let window = Duration::from_millis(300);
    let gate = TestGate::start(&bus, gate_config(|c| c.resume_window = window)).await;
    let hop = Cut::start(gate.addr).await.unwrap();

    let mut player = within(Player::enter(&hop.ws_url(), "ada")).await;
    let spent = player.token.clone();
    hop.cut();
    within(player.resume(&gate.url)).await;
    player.token = spent;
    let ack = within(player.try_resume(&gate.url, "")).await;
    assert_eq!(
        (ack.code, ack.resume_code),
        (code::OK, code::NOT_FOUND),
        "{ack:?}"
    );
    assert!(ack.message.is_empty() && ack.last_seq == 0, "{ack:?}");

    let mut stale = within(Player::enter(&hop.ws_url(), "bea")).await;
    hop.cut();
    // Past their window the detached sessions end (bea's, and ada's resumed one, whose
    // socket the spent attempt's client dropped): ada's fresh one is left.
    common::eventually("the detached sessions ended", || {
        gate.gate.session_count() == 1
    })
    .await;
    let ack = within(stale.try_resume(&gate.url, "")).await;
    assert_eq!(
        (ack.code, ack.resume_code),
        (code::OK, code::NOT_FOUND),
        "{ack:?}"
    );

    stale.token = "not a token".into();
    let ack = within(stale.try_resume(&gate.url, "")).await;
    assert_eq!(
        (ack.code, ack.resume_code),
        (code::OK, code::BAD_REQUEST),
        "{ack:?}"
    );
    // A fresh session: it is in no room until it enters.
    let id = stale.send("room.enter", "bea").await;
    assert_eq!(
        stale.next().await,
        Got::Response(id, code::OK, "bea".into())
    );
}

/// With player tokens, a resume token taken from another player resumes nothing, and
/// the session it names goes on undisturbed.
async fn another_players_token_resumes_nothing(bus: Bus) {
    let _worker = start_worker(bus.url(), room_service(), FrameConfig::default()).await;
    let gate =
        TestGate::start_with_tokens(&bus, GateConfig::default(), Arc::new(PlayerTokens)).await;
    let mut ada = within(Player::open(&gate.url, "player:ada")).await;
    let mut eve = within(Player::open(&gate.url, "player:eve")).await;
    eve.token.clone_from(&ada.token);
    let ack = within(eve.try_resume(&gate.url, "player:eve")).await;
    assert_eq!(
        (ack.code, ack.resume_code),
        (code::OK, code::FORBIDDEN),
        "{ack:?}"
    );
    // Ada's session was not touched: it answers, numbered on from where it was.
    let id = ada.send("room.say", "still here").await;
    assert_eq!(
        within(ada.next()).await,
        Got::Response(id, code::OK, "still here".into())
    );
    // Ada herself resumes with her own player token.
    let ack = within(ada.try_resume(&gate.url, "player:ada")).await;
    assert_eq!((ack.code, ack.resume_code), (code::OK, code::OK), "{ack:?}");
}

/// A gate that starts draining while a session is detached still hands it over to the
/// gate its client reaches, with what was said meanwhile.
async fn a_session_detached_on_a_draining_gate_resumes_on_another(bus: Bus) {
    let _worker = start_worker(bus.url(), room_service(), FrameConfig::default()).await;
    let draining = TestGate::start(&bus, GateConfig::default()).await;
    let staying = TestGate::start(&bus, GateConfig::default()).await;
    let hop = Cut::start(draining.addr).await.unwrap();
    let mut victim = within(Player::enter(&hop.ws_url(), "victim")).await;
    hop.cut();
    draining.begin_shutdown();
    within(flood(staying.url.clone(), "d", 50)).await;
    within(victim.resume(&staying.url)).await;
    let said = within(pushes_until(&mut victim, "d:49")).await;
    let expected: Vec<String> = (0..50).map(|i| format!("d:{i}")).collect();
    assert_eq!(said, expected);
}

/// A session that kept more for its client than one hand-over message may carry (its
/// buffer raised past `MAX_HANDED_BYTES`) is refused 409, and the bus connection stays.
async fn more_missed_than_a_hand_over_carries_is_refused_409(bus: Bus) {
    let _worker = start_worker(bus.url(), room_service(), FrameConfig::default()).await;
    let config = gate_config(|c| {
        c.resume_buffer_bytes = 4 << 20;
        c.outbound_bytes = 4 << 20;
    });
    let gate = TestGate::start(&bus, config).await;
    let hop = Cut::start(gate.addr).await.unwrap();
    let mut victim = within(Player::enter(&hop.ws_url(), "victim")).await;
    hop.cut();
    let mut sender = within(Player::enter(&gate.url, "sender")).await;
    let big = "x".repeat(10 * 1024);
    for _ in 0..100 {
        let id = sender.send("room.say", &big).await;
        while !matches!(within(sender.next()).await, Got::Response(got, ..) if got == id) {}
    }
    let ack = within(victim.try_resume(&gate.url, "")).await;
    assert_eq!(
        (ack.code, ack.resume_code),
        (code::OK, code::CONFLICT),
        "{ack:?}"
    );
    // The gate's bus connection is whole: the fresh session is served.
    let id = victim.send("room.enter", "victim").await;
    assert_eq!(
        within(victim.next()).await,
        Got::Response(id, code::OK, "victim".into())
    );
}
