//! Resumable sessions end to end (docs/protocol.md, "Resume"): a raw client speaking
//! the protocol as any language would, its link cut by a TCP hop with no close from
//! either side, resuming on the same gate and on another gate of the same bus, with
//! every push it missed, in order, none twice; requests sent again after a resume
//! answered once; tokens that must not resume anything refused with their codes. Runs
//! on both brokers.

mod common;

use std::time::Duration;

use common::resumable::{Got, Player, room_service};
use common::{Bus, Holds, TestGate, gate_config, start_worker, within};
use gateway::GateConfig;
use proto::code;
use services::FrameConfig;
use testkit::Cut;

broker::on_every_bus!(
    a_member_cut_mid_flood_resumes_on_the_same_gate_with_every_message,
    a_member_cut_mid_flood_resumes_on_the_other_gate_with_every_message,
    a_request_sent_again_after_a_resume_is_answered_once,
    a_session_detached_on_a_draining_gate_resumes_on_another,
    more_missed_than_a_hand_over_carries_is_refused_409;
    tcp_only:
    spent_stale_and_garbled_tokens_get_a_fresh_session,
);

/// Messages said into the hall by the sender in each flood.
const FLOOD: usize = 400;
/// The victim's link is cut once it has read this many of them.
const CUT_AFTER: usize = 100;

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
