//! Joins and leaves are announced only while a room is small: at most
//! `--chat-room-announce-max` sessions, counting the one joining or leaving.

use super::*;

fn with_max(max: usize) -> Service {
    service_with(ChatConfig {
        chat_room_announce_max: max,
        ..ChatConfig::default()
    })
}

fn players(n: u64) -> Vec<Player> {
    (1..=n)
        .map(|sid| Player::new("g1", sid, &format!("p{sid}")))
        .collect()
}

/// The routes pushed by `method` of `player` on `room`, after checking it answered 200.
fn announced(chat: &mut Service, player: &Player, method: &str, room: &str) -> Vec<String> {
    let handled = match method {
        "join" => call(chat, player, method, JoinRequest { room: room.into() }),
        _ => call(chat, player, method, LeaveRequest { room: room.into() }),
    };
    assert_eq!(handled.response.code, code::OK, "{:?}", handled.response);
    pushes(&handled.outbound)
        .into_iter()
        .map(|(_, push)| push.route)
        .collect()
}

fn closed(chat: &mut Service, player: &Player) -> Vec<String> {
    let event = SessionClosed {
        gate: player.gate.into(),
        sid: player.sid,
        uid: player.uid.clone(),
        groups: vec!["chat-hall".into()],
    };
    let handled = chat.event(SESSION_CLOSED_SUBJECT, event.encode_to_vec().into());
    assert!(handled.ok);
    loop_back(chat, &handled.outbound);
    pushes(&handled.outbound)
        .into_iter()
        .map(|(_, push)| push.route)
        .collect()
}

#[test]
fn a_room_of_exactly_the_limit_announces_and_one_more_does_not() {
    let mut chat = with_max(3);
    let p = players(5);
    for player in &p[..3] {
        assert_eq!(announced(&mut chat, player, "join", "hall"), [ROUTE_JOINED]);
    }
    // The fourth would make the room 4: joined, answered with every member, not pushed.
    let handled = call(
        &mut chat,
        &p[3],
        "join",
        JoinRequest {
            room: "hall".into(),
        },
    );
    assert!(pushes(&handled.outbound).is_empty());
    let answer = JoinResponse::decode(handled.response.body).unwrap();
    assert_eq!(answer.members, ["p1", "p2", "p3", "p4"]);
    assert_eq!(
        handled.response.effects[0].kind,
        Some(effect::Kind::Join("chat-hall".into()))
    );
    assert!(announced(&mut chat, &p[4], "join", "hall").is_empty());
    assert_eq!(members(&mut chat, "hall"), ["p1", "p2", "p3", "p4", "p5"]);

    // Leaving a room of 5, then of 4: silent; of 3: announced.
    assert!(announced(&mut chat, &p[4], "leave", "hall").is_empty());
    assert!(closed(&mut chat, &p[3]).is_empty());
    assert_eq!(members(&mut chat, "hall"), ["p1", "p2", "p3"]);
    assert_eq!(closed(&mut chat, &p[2]), [ROUTE_LEFT]);
    assert_eq!(announced(&mut chat, &p[1], "leave", "hall"), [ROUTE_LEFT]);
}

#[test]
fn the_limit_counts_each_room_apart() {
    let mut chat = with_max(1);
    let p = players(2);
    assert_eq!(announced(&mut chat, &p[0], "join", "hall"), [ROUTE_JOINED]);
    assert!(announced(&mut chat, &p[1], "join", "hall").is_empty());
    assert_eq!(announced(&mut chat, &p[1], "join", "den"), [ROUTE_JOINED]);
}

#[test]
fn a_limit_of_zero_never_announces() {
    let mut chat = with_max(0);
    let p = players(1);
    assert!(announced(&mut chat, &p[0], "join", "hall").is_empty());
    assert!(announced(&mut chat, &p[0], "leave", "hall").is_empty());
    assert!(announced(&mut chat, &p[0], "join", "hall").is_empty());
    assert!(closed(&mut chat, &p[0]).is_empty());
}

#[test]
fn the_announce_limit_is_a_flag() {
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        chat: ChatConfig,
    }
    let parsed = |args: &[&str]| Cli::try_parse_from(args).unwrap().chat;
    assert_eq!(
        parsed(&["worker"]).chat_room_announce_max,
        DEFAULT_ROOM_ANNOUNCE_MAX
    );
    let flag = parsed(&["worker", "--chat-room-announce-max", "250"]);
    assert_eq!(flag.chat_room_announce_max, 250);
}
