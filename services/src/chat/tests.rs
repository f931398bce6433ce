//! The chat service without a bus: handlers called directly, and a loopback that feeds
//! each published state change back as the bus would.

use bytes::Bytes;
use proto::Message;
use proto::chat::*;
use proto::code;
use proto::rpc::{
    RpcRequest, RpcResponse, ServerPush, Session, SessionClosed, effect, user_command,
};

use proto::profile::Profile;

use super::*;
use crate::context::CallResult;

mod big_rooms;
use crate::push::Outbound;
use crate::service::Handled;

/// A player's session on gate `gate`.
struct Player {
    gate: &'static str,
    sid: u64,
    uid: String,
    /// Session data, as a login left it.
    data: Vec<(&'static str, &'static str)>,
}

impl Player {
    fn new(gate: &'static str, sid: u64, uid: &str) -> Player {
        Player {
            gate,
            sid,
            uid: uid.into(),
            data: Vec::new(),
        }
    }

    fn request(&self, route: &str, body: impl Message) -> RpcRequest {
        RpcRequest {
            route: route.into(),
            body: body.encode_to_vec().into(),
            session: Some(Session {
                gate: self.gate.into(),
                sid: self.sid,
                uid: self.uid.clone(),
                data: self
                    .data
                    .iter()
                    .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                ..Session::default()
            }),
            timing: false,
            ..RpcRequest::default()
        }
    }
}

/// Calls `method` and, like the bus, hands every state change it published to the
/// service's state event (the worker gets its own changes back).
fn call(service: &mut Service, player: &Player, method: &str, body: impl Message) -> Handled {
    let handled = service.call(method, player.request(&format!("chat.{method}"), body));
    loop_back(service, &handled.outbound);
    handled
}

fn loop_back(service: &mut Service, outbound: &[Outbound]) {
    for o in outbound {
        if let Outbound::Publish { subject, payload } = o {
            assert_eq!(subject, STATE_SUBJECT);
            assert!(service.event(STATE_SUBJECT, payload.clone()).ok);
        }
    }
}

fn pushes(outbound: &[Outbound]) -> Vec<(String, ServerPush)> {
    outbound
        .iter()
        .filter_map(|o| match o {
            Outbound::Group { group, push } => Some((group.clone(), push.clone())),
            _ => None,
        })
        .collect()
}

fn members(service: &mut Service, room: &str) -> Vec<String> {
    let anyone = Player::new("g", 99, "");
    let handled = call(
        service,
        &anyone,
        "members",
        MembersRequest { room: room.into() },
    );
    assert_eq!(handled.response.code, code::OK, "{:?}", handled.response);
    MembersResponse::decode(handled.response.body)
        .unwrap()
        .members
}

fn join(service: &mut Service, player: &Player, room: &str) -> RpcResponse {
    call(service, player, "join", JoinRequest { room: room.into() }).response
}

/// Logs `player` in as `name`, the profile service's answer being `profile`: the effects
/// the login's answer carries (the handler's, then its continuation's) and the answer.
fn login(
    service: &mut Service,
    player: &Player,
    name: &str,
    profile: CallResult,
) -> (Vec<effect::Kind>, LoginResponse) {
    let request = LoginRequest { name: name.into() };
    let mut handled = call(service, player, "login", request);
    assert!(handled.deferred(), "{:?}", handled.response);
    let call = handled
        .later
        .calls
        .pop()
        .expect("a call to the profile service");
    assert_eq!(
        (call.route.as_str(), call.options.key.as_str()),
        (profile::ROUTE_GET, name)
    );
    let resumed = crate::service::resume(NAME, call.then, call.session, None, call.stem, profile);
    let [answer] = <[_; 1]>::try_from(resumed.later.answers).expect("one answer");
    assert_eq!(Some(answer.deferred), handled.later.deferred);
    let effects = handled.response.effects.into_iter().chain(answer.effects);
    let kinds = effects.filter_map(|e| e.kind).collect();
    (
        kinds,
        LoginResponse::decode(answer.result.unwrap()).unwrap(),
    )
}

fn set_data(key: &str, value: &str) -> effect::Kind {
    effect::Kind::SetData(proto::rpc::SetData {
        key: key.into(),
        value: value.into(),
    })
}

#[test]
fn login_binds_the_name_and_takes_the_profile() {
    let mut chat = service();
    let anon = Player::new("g1", 1, "");
    let profile = Profile {
        uid: "alice".into(),
        display: "Alice".into(),
        color: "#4363d8".into(),
    };
    let answered = CallResult {
        body: profile.encode_to_vec().into(),
        ..CallResult::error(code::OK, "")
    };
    let (effects, answer) = login(&mut chat, &anon, "alice", answered);
    assert_eq!(
        effects,
        [
            effect::Kind::BindUid("alice".into()),
            set_data("nick", "alice"),
            set_data(DATA_DISPLAY, "Alice"),
            set_data(DATA_COLOR, "#4363d8"),
        ]
    );
    assert_eq!(
        (
            answer.name.as_str(),
            answer.display.as_str(),
            answer.color.as_str()
        ),
        ("alice", "Alice", "#4363d8")
    );
}

#[test]
fn login_waits_for_the_profile_its_configured_time_at_most() {
    let wait = |mut chat: Service| {
        let anon = Player::new("g1", 1, "");
        let mut handled = call(
            &mut chat,
            &anon,
            "login",
            LoginRequest { name: "ann".into() },
        );
        let call = handled
            .later
            .calls
            .pop()
            .expect("a call to the profile service");
        call.options.timeout
    };
    assert_eq!(wait(service()), Some(DEFAULT_PROFILE_CALL_TIMEOUT));
    let config = ChatConfig {
        chat_profile_call_timeout: Duration::from_millis(300),
        ..ChatConfig::default()
    };
    assert_eq!(wait(service_with(config)), Some(Duration::from_millis(300)));
}

#[test]
fn the_profile_call_timeout_is_a_flag() {
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        chat: ChatConfig,
    }
    let parsed = |args: &[&str]| Cli::try_parse_from(args).unwrap().chat;
    assert_eq!(parsed(&["worker"]), ChatConfig::default());
    let flag = parsed(&["worker", "--chat-profile-call-timeout", "250ms"]);
    assert_eq!(flag.chat_profile_call_timeout, Duration::from_millis(250));
}

#[test]
fn the_profile_call_timeout_must_not_be_zero() {
    let mut config = ChatConfig {
        chat_profile_call_timeout: Duration::from_millis(1),
        ..ChatConfig::default()
    };
    assert_eq!(config.validate(), Ok(()));
    config.chat_profile_call_timeout = Duration::ZERO;
    assert!(config.validate().is_err());
}

#[test]
fn login_without_a_profile_service_goes_by_the_name() {
    let mut chat = service();
    let anon = Player::new("g1", 1, "");
    let silent = CallResult::error(code::UNAVAILABLE, "no worker available now");
    let (effects, answer) = login(&mut chat, &anon, "alice", silent);
    assert_eq!(
        effects[2..],
        [set_data(DATA_DISPLAY, "alice"), set_data(DATA_COLOR, "")]
    );
    assert_eq!(
        (answer.display.as_str(), answer.color.as_str()),
        ("alice", "")
    );
}

#[test]
fn login_checks_the_name() {
    let mut chat = service();
    let anon = Player::new("g1", 1, "");
    for bad in [
        "",
        "Alice",
        "a.b",
        "a b",
        "*",
        &"x".repeat(MAX_PLAYER_NAME + 1),
    ] {
        let r = call(&mut chat, &anon, "login", LoginRequest { name: bad.into() }).response;
        assert_eq!(r.code, code::BAD_REQUEST, "{bad:?}");
    }
    let alice = Player::new("g1", 1, "alice");
    let again = login(&mut chat, &alice, "alice", CallResult::bus_unavailable());
    assert_eq!(again.1.name, "alice");
    let rename = call(
        &mut chat,
        &alice,
        "login",
        LoginRequest { name: "bob".into() },
    )
    .response;
    assert_eq!(rename.code, code::BAD_REQUEST);
}

#[test]
fn a_message_carries_the_sender_s_display_name_and_colour() {
    let mut chat = service();
    let mut alice = Player::new("g1", 1, "alice");
    alice.data = vec![(DATA_DISPLAY, "Alice"), (DATA_COLOR, "#4363d8")];
    assert_eq!(join(&mut chat, &alice, "lobby").code, code::OK);
    let said = call(
        &mut chat,
        &alice,
        "say",
        SayRequest {
            room: "lobby".into(),
            text: "hi".into(),
        },
    );
    let [(_, push)] = <[_; 1]>::try_from(pushes(&said.outbound)).unwrap();
    let message = ChatMessage::decode(push.body).unwrap();
    assert_eq!(
        (
            message.from.as_str(),
            message.display.as_str(),
            message.color.as_str()
        ),
        ("alice", "Alice", "#4363d8")
    );
}

#[test]
fn join_announces_and_replicates_before_answering() {
    let mut chat = service();
    let bob = Player::new("g2", 5, "bob");
    assert_eq!(join(&mut chat, &bob, "lobby").code, code::OK);
    let alice = Player::new("g1", 1, "alice");
    let handled = call(
        &mut chat,
        &alice,
        "join",
        JoinRequest {
            room: "lobby".into(),
        },
    );
    assert_eq!(handled.response.code, code::OK);
    let answer = JoinResponse::decode(handled.response.body.clone()).unwrap();
    assert_eq!(answer.members, ["alice", "bob"]);
    assert_eq!(
        handled.response.effects[0].kind,
        Some(effect::Kind::Join("chat-lobby".into()))
    );
    // The state change goes out first, then the announcement.
    assert!(
        matches!(&handled.outbound[0], Outbound::Publish { subject, .. } if subject == STATE_SUBJECT)
    );
    let pushed = pushes(&handled.outbound);
    assert_eq!(pushed.len(), 1);
    assert_eq!(
        (pushed[0].0.as_str(), pushed[0].1.route.as_str()),
        ("chat-lobby", ROUTE_JOINED)
    );
    let event = MemberEvent::decode(pushed[0].1.body.clone()).unwrap();
    assert_eq!(
        (event.name.as_str(), event.reason.as_str()),
        ("alice", REASON_JOINED)
    );
    assert_eq!(members(&mut chat, "lobby"), ["alice", "bob"]);

    // Joining again changes nothing and announces nothing.
    let again = call(
        &mut chat,
        &alice,
        "join",
        JoinRequest {
            room: "lobby".into(),
        },
    );
    assert_eq!(again.response.code, code::OK);
    assert!(again.outbound.is_empty());
}

#[test]
fn join_needs_a_login_and_a_valid_room() {
    let mut chat = service();
    assert_eq!(
        join(&mut chat, &Player::new("g", 1, ""), "lobby").code,
        code::UNAUTHORIZED
    );
    let alice = Player::new("g", 1, "alice");
    for bad in ["", "Lobby", "a.b", ">", &"r".repeat(MAX_ROOM_NAME + 1)] {
        assert_eq!(
            join(&mut chat, &alice, bad).code,
            code::BAD_REQUEST,
            "{bad:?}"
        );
    }
    for i in 0..MAX_ROOMS_PER_SESSION {
        assert_eq!(join(&mut chat, &alice, &format!("r{i}")).code, code::OK);
    }
    assert_eq!(
        join(&mut chat, &alice, "one-too-many").code,
        code::BAD_REQUEST
    );
}

#[test]
fn say_reaches_the_room_only_from_a_member() {
    let mut chat = service();
    let alice = Player::new("g1", 1, "alice");
    let say = |text: &str| SayRequest {
        room: "lobby".into(),
        text: text.into(),
    };
    let outsider = call(&mut chat, &alice, "say", say("hi")).response;
    assert_eq!(outsider.code, code::FORBIDDEN);
    let anon = call(&mut chat, &Player::new("g1", 2, ""), "say", say("hi")).response;
    assert_eq!(anon.code, code::UNAUTHORIZED);

    join(&mut chat, &alice, "lobby");
    let handled = call(&mut chat, &alice, "say", say("hello"));
    assert_eq!(handled.response.code, code::OK);
    let pushed = pushes(&handled.outbound);
    assert_eq!(
        (pushed[0].0.as_str(), pushed[0].1.route.as_str()),
        ("chat-lobby", ROUTE_MESSAGE)
    );
    let message = ChatMessage::decode(pushed[0].1.body.clone()).unwrap();
    assert_eq!(
        (
            message.room.as_str(),
            message.from.as_str(),
            message.text.as_str()
        ),
        ("lobby", "alice", "hello")
    );
    // The same name on another session is not a member.
    let other = call(&mut chat, &Player::new("g2", 1, "alice"), "say", say("hi")).response;
    assert_eq!(other.code, code::FORBIDDEN);
    for bad in ["", &"x".repeat(MAX_TEXT_BYTES + 1)] {
        assert_eq!(
            call(&mut chat, &alice, "say", say(bad)).response.code,
            code::BAD_REQUEST
        );
    }
}

#[test]
fn leave_announces_once_and_always_leaves_the_group() {
    let mut chat = service();
    let alice = Player::new("g1", 1, "alice");
    join(&mut chat, &alice, "lobby");
    let handled = call(
        &mut chat,
        &alice,
        "leave",
        LeaveRequest {
            room: "lobby".into(),
        },
    );
    assert_eq!(handled.response.code, code::OK);
    let pushed = pushes(&handled.outbound);
    assert_eq!(pushed[0].1.route, ROUTE_LEFT);
    let event = MemberEvent::decode(pushed[0].1.body.clone()).unwrap();
    assert_eq!(
        (event.name.as_str(), event.reason.as_str()),
        ("alice", REASON_LEFT)
    );
    assert!(members(&mut chat, "lobby").is_empty());

    let again = call(
        &mut chat,
        &alice,
        "leave",
        LeaveRequest {
            room: "lobby".into(),
        },
    );
    assert!(again.outbound.is_empty());
    assert_eq!(
        again.response.effects[0].kind,
        Some(effect::Kind::Leave("chat-lobby".into()))
    );
}

#[test]
fn a_closed_session_leaves_every_room_with_an_announcement() {
    let mut chat = service();
    let alice = Player::new("g1", 1, "alice");
    let bob = Player::new("g2", 1, "bob");
    join(&mut chat, &alice, "lobby");
    join(&mut chat, &alice, "den");
    join(&mut chat, &bob, "lobby");
    let closed = SessionClosed {
        gate: "g1".into(),
        sid: 1,
        uid: "alice".into(),
        // The gate also lists another service's group, and a room this replica missed.
        groups: vec![
            "chat-lobby".into(),
            "chat-den".into(),
            "chat-attic".into(),
            "guild-7".into(),
        ],
    };
    let handled = chat.event(SESSION_CLOSED_SUBJECT, closed.encode_to_vec().into());
    assert!(handled.ok);
    loop_back(&mut chat, &handled.outbound);
    let mut rooms: Vec<String> = pushes(&handled.outbound)
        .into_iter()
        .map(|(group, push)| {
            assert_eq!(push.route, ROUTE_LEFT);
            let event = MemberEvent::decode(push.body).unwrap();
            assert_eq!(
                (event.name.as_str(), event.reason.as_str()),
                ("alice", REASON_DISCONNECTED)
            );
            group
        })
        .collect();
    rooms.sort();
    assert_eq!(rooms, ["chat-attic", "chat-den", "chat-lobby"]);
    assert_eq!(members(&mut chat, "lobby"), ["bob"]);
    assert!(members(&mut chat, "den").is_empty());

    // A join of the closed session still in some queue is ignored when it lands.
    assert_eq!(join(&mut chat, &alice, "lobby").code, code::OK);
    assert_eq!(members(&mut chat, "lobby"), ["bob"]);

    // A session that never logged in was in no room: nothing to say.
    let anon = SessionClosed {
        gate: "g1".into(),
        sid: 2,
        ..SessionClosed::default()
    };
    assert!(
        chat.event(SESSION_CLOSED_SUBJECT, anon.encode_to_vec().into())
            .outbound
            .is_empty()
    );
    assert!(
        !chat
            .event(SESSION_CLOSED_SUBJECT, Bytes::from_static(b"\xff"))
            .ok
    );
}

#[test]
fn a_starting_worker_restores_a_peers_snapshot() {
    let mut running = service();
    join(&mut running, &Player::new("g1", 1, "alice"), "lobby");
    join(&mut running, &Player::new("g2", 1, "bob"), "lobby");
    let asked = running.event(SYNC_SUBJECT, Bytes::new());
    let snapshot = asked.reply.expect("the peer answers");
    let mut started = service();
    assert!(started.restore(snapshot).ok);
    assert_eq!(members(&mut started, "lobby"), ["alice", "bob"]);
    assert!(!started.restore(Bytes::from_static(b"\xff")).ok);
}

#[test]
fn whisper_pushes_to_the_player() {
    let mut chat = service();
    let alice = Player::new("g1", 1, "alice");
    let handled = call(
        &mut chat,
        &alice,
        "whisper",
        WhisperRequest {
            to: "bob".into(),
            text: "psst".into(),
        },
    );
    assert_eq!(handled.response.code, code::OK);
    let Outbound::User { uid, command } = &handled.outbound[0] else {
        panic!("{:?}", handled.outbound);
    };
    assert_eq!(uid, "bob");
    let Some(user_command::Kind::Push(push)) = &command.kind else {
        panic!("{command:?}");
    };
    assert_eq!(push.route, ROUTE_WHISPER);
    let bad = WhisperRequest {
        to: "B.B".into(),
        text: "x".into(),
    };
    assert_eq!(
        call(&mut chat, &alice, "whisper", bad).response.code,
        code::BAD_REQUEST
    );
}
