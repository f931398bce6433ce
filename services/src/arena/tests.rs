//! The arena without a bus: handlers, ticks and hand-overs called directly.

use proto::Message;
use proto::rpc::effect;
use tokio::time::Instant;

use super::*;
use crate::push::Outbound;
use crate::service::keyed_request as request;
use crate::service::{Handled, Tick};

fn join(service: &mut Service, uid: &str, name: &str) -> Handled {
    let body = JoinRequest {
        r#match: name.into(),
    };
    service.call("join", request(uid, name, &[], body))
}

fn input(service: &mut Service, uid: &str, name: &str, dx: i32, dy: i32) -> Handled {
    let session = [(SESSION_KEY, name)];
    service.call(
        "input",
        request(uid, name, &session, InputRequest { dx, dy }),
    )
}

fn tick(service: &mut Service, seq: u64) -> Vec<State> {
    let tick = Tick {
        seq,
        now: Instant::now(),
        since_last: std::time::Duration::from_millis(50),
    };
    service
        .tick(&tick)
        .into_iter()
        .map(|o| match o {
            Outbound::Group { group, push } => {
                assert_eq!(push.route, STATE_ROUTE);
                let state = State::decode(push.body).unwrap();
                assert_eq!(group, format!("arena-{}", state.r#match));
                state
            }
            other => panic!("not a state push: {other:?}"),
        })
        .collect()
}

#[test]
fn a_join_needs_a_uid_a_valid_match_and_the_match_as_its_key() {
    let mut arena = service();
    let refused = |h: Handled| (h.response.code, h.response.message);
    assert_eq!(refused(join(&mut arena, "", "m1")).0, code::UNAUTHORIZED);
    assert_eq!(refused(join(&mut arena, "ann", "M!")).0, code::BAD_REQUEST);
    let long = "m".repeat(MAX_MATCH_LEN + 1);
    assert_eq!(refused(join(&mut arena, "ann", &long)).0, code::BAD_REQUEST);
    let wrong_key = JoinRequest {
        r#match: "m1".into(),
    };
    let handled = arena.call("join", request("ann", "m2", &[], wrong_key));
    assert_eq!(
        refused(handled),
        (
            code::BAD_REQUEST,
            "send arena.join with its match as the request's key".into()
        )
    );
    let joined = join(&mut arena, "ann", "m1");
    assert_eq!(joined.response.code, code::OK);
    let kinds: Vec<_> = joined
        .response
        .effects
        .iter()
        .map(|e| e.kind.clone().unwrap())
        .collect();
    assert!(kinds.contains(&effect::Kind::Join("arena-m1".into())));
    assert!(
        kinds.iter().any(
            |k| matches!(k, effect::Kind::SetData(d) if d.key == SESSION_KEY && d.value == "m1")
        )
    );
}

#[test]
fn inputs_move_players_and_every_tick_pushes_the_match_s_state() {
    let mut arena = service();
    join(&mut arena, "ann", "m1");
    join(&mut arena, "bob", "m1");
    for _ in 0..3 {
        assert_eq!(
            input(&mut arena, "ann", "m1", 2, -1).response.code,
            code::OK
        );
    }
    let moved = input(&mut arena, "bob", "m1", i32::MAX, 0);
    let at = InputResponse::decode(moved.response.body).unwrap();
    assert_eq!((at.x, at.y), (i64::from(i32::MAX), 0));
    let states = tick(&mut arena, 1);
    let [state] = &states[..] else {
        panic!("one match: {states:?}")
    };
    assert_eq!(state.tick, 1);
    let positions: Vec<_> = state
        .players
        .iter()
        .map(|p| (p.uid.as_str(), p.x, p.y))
        .collect();
    assert_eq!(positions, [("ann", 6, -3), ("bob", i64::from(i32::MAX), 0)]);
    assert_eq!(tick(&mut arena, 2)[0].tick, 2);
    // An input for a match this worker does not hold.
    let lost = input(&mut arena, "ann", "m9", 1, 1);
    assert_eq!(lost.response.code, code::NOT_FOUND);
}

#[test]
fn a_match_moves_with_its_tick_and_players_and_is_gone_from_the_old_owner() {
    let mut old = service();
    join(&mut old, "ann", "m1");
    input(&mut old, "ann", "m1", 5, 5);
    tick(&mut old, 1);
    tick(&mut old, 2);
    let partition = partition_of(b"m1", PARTITIONS);
    let handed = old.hand_over(partition).reply.unwrap();
    assert!(
        tick(&mut old, 3).is_empty(),
        "the old owner steps it no more"
    );
    let mut new = service();
    assert!(new.take_over(partition, Some(handed)).ok);
    let states = tick(&mut new, 1);
    assert_eq!(states[0].tick, 3, "the tick goes on");
    assert_eq!((states[0].players[0].x, states[0].players[0].y), (5, 5));
    // Another partition's hand-over carries none of it.
    let other = old.hand_over((partition + 1) % PARTITIONS).reply.unwrap();
    assert!(Matches::decode(other).unwrap().matches.is_empty());
}

#[test]
fn leaving_or_a_closed_session_removes_the_player_and_an_empty_match_ends() {
    let mut arena = service();
    join(&mut arena, "ann", "m1");
    join(&mut arena, "bob", "m1");
    let session = [(SESSION_KEY, "m1")];
    let left = arena.call("leave", request("ann", "m1", &session, LeaveRequest {}));
    assert_eq!(left.response.code, code::OK);
    assert_eq!(tick(&mut arena, 1)[0].players.len(), 1);
    let closed = SessionClosed {
        uid: "bob".into(),
        groups: vec!["arena-m1".into(), "lobby".into()],
        ..SessionClosed::default()
    };
    assert!(
        arena
            .event(SESSION_CLOSED, closed.encode_to_vec().into())
            .ok
    );
    assert!(tick(&mut arena, 2).is_empty(), "the match ended");
}

/// What a standby gets of a match: each tick says the partition of every match it
/// stepped changed, and the snapshot gives the match without forgetting it here; a
/// take-over from that snapshot goes on from the tick it holds.
#[test]
fn each_tick_marks_its_matches_partitions_and_a_snapshot_keeps_them() {
    let mut arena = service();
    join(&mut arena, "ann", "m1");
    input(&mut arena, "ann", "m1", 2, 3);
    let partition = partition_of(b"m1", PARTITIONS);
    let step = Tick {
        seq: 1,
        now: Instant::now(),
        since_last: std::time::Duration::from_millis(50),
    };
    assert_eq!(arena.run_tick(&step).later.changed, [partition]);
    let copy = arena.snapshot(partition).unwrap();
    assert_eq!(tick(&mut arena, 2)[0].tick, 2, "kept by its owner");
    let mut standby = service();
    assert!(standby.take_over(partition, Some(copy)).ok);
    let states = tick(&mut standby, 1);
    assert_eq!(states[0].tick, 2, "from the tick the snapshot held");
    assert_eq!((states[0].players[0].x, states[0].players[0].y), (2, 3));
}
