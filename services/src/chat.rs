//! The chat service: named players in rooms, on any number of gates and workers.
//!
//! Routes (messages in `proto/proto/chat.proto`):
//!
//! | route | does | errors |
//! |---|---|---|
//! | `chat.login{name}` | binds uid `name` (one session per name: the gate kicks the older session, or answers 409 in refuse mode), sets session data `nick`, and `display` and `color` from the player's profile (a call to `profile.get`; the name and no colour when the profile service does not answer); answers `{name, display, color}`; a player signed in by token (JWT) may only use the token's name (`name` may then be empty) | 400 bad name or already logged in as another name; 403 a name not the token's |
//! | `chat.join{room}` | enters `room`; answers its members; pushes `chat.joined` to the room while it is small (below) | 401 not logged in, 400 bad room or too many rooms |
//! | `chat.leave{room}` | leaves `room` (no-op when not in it); pushes `chat.left` (reason `left`) while the room is small | 400 bad room |
//! | `chat.say{room, text}` | pushes `chat.message` `ChatMessage{room, from, text, display, color}` to the room | 401, 400 bad room or text, 403 not in the room |
//! | `chat.whisper{to, text}` | pushes `chat.whisper` `ChatMessage{from, text, display, color}` to player `to`, on whichever gate | 401, 400 |
//! | `chat.members{room}` | the names in `room`, sorted | 400 |
//!
//! When a session in rooms closes, each of its rooms gets `chat.left` (reason
//! `disconnected`): the gates' `evt.session.closed` event goes to one chat worker
//! (the service's queue group).
//!
//! Joins and leaves are announced only while the room, counting the player, holds at
//! most `--chat-room-announce-max` sessions: announcing every join to every member
//! costs n²/2 pushes to fill a room of n (50 million for 10,000), so a big room's
//! members ask `chat.members` instead (docs/chat.md, "Big rooms").
//!
//! A room `r` is the gate group `chat-r`, so chat rooms never share a group with
//! another service's groups.
//!
//! # Workers share no secrets
//!
//! Any worker answers any request: every worker holds a replica of the membership
//! ([`Rooms`]). The worker that handles a join, a leave or a close publishes the change
//! on `<prefix>.chat.state` before it answers; every worker (itself included, when the
//! change comes back from the bus) applies it in its loop. A starting worker gets a
//! snapshot from a running one on `<prefix>.chat.sync` before it takes requests, and a
//! worker back from a lost bus connection gets one again. What
//! this guarantees, and the window where replicas differ, is in `docs/chat.md`.

mod rooms;
mod session_key;
mod tombstones;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto::Message as _;
use proto::chat::{
    ChatMessage, JoinRequest, JoinResponse, LeaveRequest, LeaveResponse, LoginRequest,
    LoginResponse, MemberEvent, MembersRequest, MembersResponse, SayRequest, SayResponse, Snapshot,
    StateChange, WhisperRequest, WhisperResponse,
};
use proto::code;
use proto::profile::{GetRequest, Profile};
use proto::rpc::SessionClosed;

pub use rooms::Rooms;
pub use session_key::SessionKey;
pub use tombstones::{MAX_TOMBSTONES, TOMBSTONE_TTL};

use crate::config::ConfigError;
use crate::context::{CallOptions, Context};
use crate::handler_error::HandlerError;
use crate::names::is_valid_token;
use crate::profile;
use crate::service::{Delivery, Service};

/// The service's name: its routes' first token and its queue group.
pub const NAME: &str = "chat";
/// Where workers publish membership changes; every worker subscribes (under the prefix).
pub const STATE_SUBJECT: &str = "chat.state";
/// Where a starting worker asks a running one for a snapshot (under the prefix).
pub const SYNC_SUBJECT: &str = "chat.sync";
/// Where gates announce closed sessions (under the prefix).
pub const SESSION_CLOSED_SUBJECT: &str = "evt.session.closed";
/// A room's gate group is this followed by the room's name.
pub const GROUP_PREFIX: &str = "chat-";

/// Session data a login keeps the player's display name in (from its profile).
pub const DATA_DISPLAY: &str = "display";
/// Session data a login keeps the player's colour in (`#rrggbb`, from its profile).
pub const DATA_COLOR: &str = "color";

/// Push route of a message to a room.
pub const ROUTE_MESSAGE: &str = "chat.message";
/// Push route of a message to one player.
pub const ROUTE_WHISPER: &str = "chat.whisper";
/// Push route announcing a player entered a room.
pub const ROUTE_JOINED: &str = "chat.joined";
/// Push route announcing a player left a room.
pub const ROUTE_LEFT: &str = "chat.left";
/// `MemberEvent.reason` of a `chat.joined`.
pub const REASON_JOINED: &str = "joined";
/// `MemberEvent.reason` of a `chat.left` after `chat.leave`.
pub const REASON_LEFT: &str = "left";
/// `MemberEvent.reason` of a `chat.left` after the session closed (any cause: the
/// client went away, a kick, a second login, a gate shutting down).
pub const REASON_DISCONNECTED: &str = "disconnected";

/// Longest player name: names are shown to players, so short.
pub const MAX_PLAYER_NAME: usize = 32;
/// Longest room name (the group name adds [`GROUP_PREFIX`]).
pub const MAX_ROOM_NAME: usize = 48;
/// Longest message text, in bytes: a chat line, not a file transfer.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Rooms one session may be in at once: bounds what one player adds to every replica.
pub const MAX_ROOMS_PER_SESSION: usize = 32;

/// How long `chat.login` waits for the player's profile before it answers with the name
/// as display name: well within a gate's request timeout (5 s by default), so a slow or
/// missing profile service costs a login at most this long, never the login itself.
pub const DEFAULT_PROFILE_CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The largest room (in sessions, counting the one joining or leaving) whose joins and
/// leaves are pushed to every member. At 1,000 a join costs the gates 1,000 pushes and
/// filling the room 500,000; a list longer than that is more than a chat panel shows,
/// and a line per arrival would scroll the conversation away. 0: never announce.
pub const DEFAULT_ROOM_ANNOUNCE_MAX: usize = 1000;

/// The chat service's own settings (flags of `shaddock worker` and `shaddock up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct ChatConfig {
    /// How long chat.login waits for the player's profile (its call to profile.get)
    /// before it answers with the name as display name and no colour; keep it well
    /// within the gates' request timeout (e.g. 1s). Used by the chat service only.
    #[arg(long, env = "SHADDOCK_CHAT_PROFILE_CALL_TIMEOUT", default_value = "1s", value_parser = net::duration::parse)]
    pub chat_profile_call_timeout: Duration,
    /// The largest room, in sessions (counting the one joining or leaving), whose joins
    /// and leaves are pushed to every member (chat.joined, chat.left); in a bigger room
    /// members ask chat.members instead. 0: never announce. Used by the chat service only.
    #[arg(long, env = "SHADDOCK_CHAT_ROOM_ANNOUNCE_MAX", default_value_t = DEFAULT_ROOM_ANNOUNCE_MAX)]
    pub chat_room_announce_max: usize,
}

impl Default for ChatConfig {
    fn default() -> Self {
        ChatConfig {
            chat_profile_call_timeout: DEFAULT_PROFILE_CALL_TIMEOUT,
            chat_room_announce_max: DEFAULT_ROOM_ANNOUNCE_MAX,
        }
    }
}

impl ChatConfig {
    /// A login that never waits for its profile would never show one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.chat_profile_call_timeout.is_zero() {
            return Err(ConfigError::Zero("chat profile call timeout"));
        }
        Ok(())
    }
}

type Shared = Arc<Mutex<Rooms>>;

/// The chat service with the default [`ChatConfig`]; each call makes an independent
/// replica (one per worker).
pub fn service() -> Service {
    service_with(ChatConfig::default())
}

/// The chat service with `config`; each call makes an independent replica.
pub fn service_with(config: ChatConfig) -> Service {
    // Every handler and event of one worker runs on its loop's thread, one at a time:
    // the mutex is never contended, it only makes the state shareable between closures.
    let state: Shared = Arc::default();
    let (join, leave, say, members) = (state.clone(), state.clone(), state.clone(), state.clone());
    let (changes, closed, sync, restore) = (state.clone(), state.clone(), state.clone(), state);
    let announce_max = config.chat_room_announce_max;
    Service::new(NAME)
        .descriptors(proto::DESCRIPTORS)
        .push::<ChatMessage>(ROUTE_MESSAGE)
        .push::<ChatMessage>(ROUTE_WHISPER)
        .push::<MemberEvent>(ROUTE_JOINED)
        .push::<MemberEvent>(ROUTE_LEFT)
        .method("login", move |ctx: &mut Context, req: LoginRequest| {
            on_login(ctx, req, config.chat_profile_call_timeout)
        })
        .method("join", move |ctx: &mut Context, req: JoinRequest| {
            on_join(&lock(&join), ctx, req, announce_max)
        })
        .method("leave", move |ctx: &mut Context, req: LeaveRequest| {
            on_leave(&lock(&leave), ctx, req, announce_max)
        })
        .method("say", move |ctx: &mut Context, req: SayRequest| {
            on_say(&lock(&say), ctx, req)
        })
        .method("whisper", on_whisper)
        .method("members", move |_ctx: &mut Context, req: MembersRequest| {
            check_room(&req.room)?;
            let members = lock(&members).members(&req.room);
            Ok::<_, HandlerError>(MembersResponse {
                room: req.room,
                members,
            })
        })
        .on_event(STATE_SUBJECT, Delivery::All, move |_ctx, payload| {
            let change = StateChange::decode(payload)
                .map_err(|e| HandlerError::bad_request(format!("bad state change: {e}")))?;
            lock(&changes).apply(change, Instant::now());
            Ok(())
        })
        .on_event(
            SESSION_CLOSED_SUBJECT,
            Delivery::Queue,
            move |ctx, payload| on_session_closed(&lock(&closed), ctx, payload, announce_max),
        )
        .on_event(SYNC_SUBJECT, Delivery::Queue, move |ctx, _| {
            ctx.reply(lock(&sync).snapshot(Instant::now()).encode_to_vec());
            Ok(())
        })
        .on_start_sync(SYNC_SUBJECT, move |_ctx, payload| {
            let snapshot = Snapshot::decode(payload)
                .map_err(|e| HandlerError::bad_request(format!("bad snapshot: {e}")))?;
            lock(&restore).restore(snapshot, Instant::now());
            Ok(())
        })
}

/// The state, even after a handler panicked while holding it: a panic is caught (and
/// answered 500), and handlers only read the state; changes are applied by
/// [`Rooms::apply`] and [`Rooms::restore`], which do not panic.
fn lock(state: &Shared) -> MutexGuard<'_, Rooms> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The gate group of `room`.
pub fn group_of(room: &str) -> String {
    format!("{GROUP_PREFIX}{room}")
}

fn check_name(name: &str) -> Result<(), HandlerError> {
    if is_valid_token(name) && name.len() <= MAX_PLAYER_NAME {
        Ok(())
    } else {
        Err(HandlerError::bad_request(format!(
            "invalid name {name:?}: use 1..={MAX_PLAYER_NAME} of [a-z0-9_-]"
        )))
    }
}

fn check_room(room: &str) -> Result<(), HandlerError> {
    if is_valid_token(room) && room.len() <= MAX_ROOM_NAME {
        Ok(())
    } else {
        Err(HandlerError::bad_request(format!(
            "invalid room {room:?}: use 1..={MAX_ROOM_NAME} of [a-z0-9_-]"
        )))
    }
}

fn check_text(text: &str) -> Result<(), HandlerError> {
    if text.is_empty() || text.len() > MAX_TEXT_BYTES {
        return Err(HandlerError::bad_request(format!(
            "text must be 1..={MAX_TEXT_BYTES} bytes"
        )));
    }
    Ok(())
}

/// The player's name: its uid.
fn logged_in(ctx: &Context) -> Result<String, HandlerError> {
    ctx.uid()
        .map(str::to_owned)
        .ok_or_else(|| HandlerError::unauthorized("log in first (chat.login)"))
}

/// A message from the session's player, with the display name and colour its login
/// kept in the session (see `on_login`).
fn from_sender(ctx: &Context, name: String) -> ChatMessage {
    ChatMessage {
        display: ctx.data(DATA_DISPLAY).unwrap_or(&name).to_owned(),
        color: ctx.data(DATA_COLOR).unwrap_or_default().to_owned(),
        from: name,
        ..ChatMessage::default()
    }
}

fn session_key(ctx: &Context) -> SessionKey {
    SessionKey {
        gate: ctx.gate().to_owned(),
        sid: ctx.sid(),
    }
}

fn member_event(room: &str, name: &str, reason: &str) -> MemberEvent {
    MemberEvent {
        room: room.to_owned(),
        name: name.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Pushes `event` (a join or leave of session `key`) on `route` to its room, if the
/// room is small enough: at most `max` sessions counting `key`'s (see
/// [`DEFAULT_ROOM_ANNOUNCE_MAX`]). Joins and leaves count the same room, so a player
/// announced joining is announced leaving unless the room grew past the limit meanwhile.
fn announce(
    ctx: &mut Context,
    rooms: &Rooms,
    max: usize,
    key: &SessionKey,
    route: &str,
    event: &MemberEvent,
) -> Result<(), HandlerError> {
    if rooms.size_with(&event.room, key) > max {
        return Ok(());
    }
    ctx.broadcast(&group_of(&event.room), route, event.encode_to_vec())?;
    Ok(())
}

fn on_login(
    ctx: &mut Context,
    mut req: LoginRequest,
    profile_timeout: Duration,
) -> Result<LoginResponse, HandlerError> {
    if ctx.authenticated() {
        // The player's signed token named them: that is the only name they may use.
        let uid = ctx.uid().unwrap_or_default();
        if req.name.is_empty() {
            req.name = uid.to_owned();
        } else if req.name != uid {
            return Err(HandlerError::with_code(
                code::FORBIDDEN,
                format!("signed in as {uid:?}: cannot log in as {:?}", req.name),
            ));
        }
    }
    check_name(&req.name)?;
    if let Some(uid) = ctx.uid().filter(|uid| *uid != req.name) {
        // Memberships carry the name: renaming a session in rooms would leave them stale.
        return Err(HandlerError::bad_request(format!(
            "already logged in as {uid:?}; reconnect to change names"
        )));
    }
    ctx.bind_uid(req.name.clone());
    ctx.set_data("nick", req.name.clone());
    // The answer waits for the player's profile (its display name and colour, kept in
    // the session for this player's messages); a login does not fail for want of one,
    // and waits for it at most its own timeout: the fallback must beat the gate's 408.
    let deferred = ctx.defer();
    let options = CallOptions::default()
        .key(req.name.clone())
        .timeout(profile_timeout);
    ctx.call_with_options(
        profile::ROUTE_GET,
        GetRequest {}.encode_to_vec(),
        options,
        move |ctx, result| {
            let (display, color) = match result.decode::<Profile>() {
                Ok(profile) => (profile.display, profile.color),
                Err(error) => {
                    tracing::debug!(%error, "no profile for a login: the name stands for it");
                    (req.name.clone(), String::new())
                }
            };
            ctx.set_data(DATA_DISPLAY, display.clone());
            ctx.set_data(DATA_COLOR, color.clone());
            let answer = LoginResponse {
                name: req.name,
                display,
                color,
            };
            ctx.answer_with(deferred, &answer);
        },
    );
    // Not sent: the answer is the continuation's.
    Ok(LoginResponse::default())
}

fn on_join(
    rooms: &Rooms,
    ctx: &mut Context,
    req: JoinRequest,
    announce_max: usize,
) -> Result<JoinResponse, HandlerError> {
    let name = logged_in(ctx)?;
    check_room(&req.room)?;
    let key = session_key(ctx);
    let group = group_of(&req.room);
    let mut members = rooms.members(&req.room);
    if !rooms.is_member(&req.room, &key) {
        if rooms.room_count(&key) >= MAX_ROOMS_PER_SESSION {
            return Err(HandlerError::bad_request(format!(
                "in {MAX_ROOMS_PER_SESSION} rooms already: leave one first"
            )));
        }
        // The change first: a player reacting to the announcement finds it applied.
        let change = rooms::join_change(&req.room, &name, &key);
        ctx.publish(STATE_SUBJECT, change.encode_to_vec())?;
        let event = member_event(&req.room, &name, REASON_JOINED);
        announce(ctx, rooms, announce_max, &key, ROUTE_JOINED, &event)?;
        if let Err(at) = members.binary_search(&name) {
            members.insert(at, name);
        }
    }
    // Sent again on a repeated join: the gate ignores a group the session is in.
    ctx.join(group);
    Ok(JoinResponse {
        room: req.room,
        members,
    })
}

fn on_leave(
    rooms: &Rooms,
    ctx: &mut Context,
    req: LeaveRequest,
    announce_max: usize,
) -> Result<LeaveResponse, HandlerError> {
    check_room(&req.room)?;
    let key = session_key(ctx);
    let group = group_of(&req.room);
    let name = rooms
        .rooms_of(&key)
        .into_iter()
        .find_map(|(room, name)| (room == req.room).then_some(name));
    if let Some(name) = name {
        let change = rooms::leave_change(&req.room, &name, &key);
        ctx.publish(STATE_SUBJECT, change.encode_to_vec())?;
        let event = member_event(&req.room, &name, REASON_LEFT);
        announce(ctx, rooms, announce_max, &key, ROUTE_LEFT, &event)?;
    }
    // Always: should the gate hold the session in the group while the state does not,
    // this still takes it out.
    ctx.leave(group);
    Ok(LeaveResponse {})
}

fn on_say(rooms: &Rooms, ctx: &mut Context, req: SayRequest) -> Result<SayResponse, HandlerError> {
    let name = logged_in(ctx)?;
    check_room(&req.room)?;
    check_text(&req.text)?;
    if !rooms.is_member(&req.room, &session_key(ctx)) {
        return Err(HandlerError::with_code(
            code::FORBIDDEN,
            format!("join room {:?} before saying something there", req.room),
        ));
    }
    let message = ChatMessage {
        room: req.room,
        text: req.text,
        ..from_sender(ctx, name)
    };
    ctx.broadcast(
        &group_of(&message.room),
        ROUTE_MESSAGE,
        message.encode_to_vec(),
    )?;
    Ok(SayResponse {})
}

fn on_whisper(ctx: &mut Context, req: WhisperRequest) -> Result<WhisperResponse, HandlerError> {
    let name = logged_in(ctx)?;
    check_name(&req.to)?;
    check_text(&req.text)?;
    let message = ChatMessage {
        text: req.text,
        ..from_sender(ctx, name)
    };
    ctx.push_to_user(&req.to, ROUTE_WHISPER, message.encode_to_vec())?;
    Ok(WhisperResponse {})
}

/// A session closed: tell every replica, and announce it in each room it was in, as
/// this replica knows them or the gate listed them (whichever knows more: the gate's
/// list is final, this replica may not have applied a very recent join yet).
fn on_session_closed(
    rooms: &Rooms,
    ctx: &mut Context,
    payload: Bytes,
    announce_max: usize,
) -> Result<(), HandlerError> {
    let closed = SessionClosed::decode(payload)
        .map_err(|e| HandlerError::bad_request(format!("bad SessionClosed: {e}")))?;
    if closed.uid.is_empty() {
        // Never logged in, so never in a room: chat.join needs a uid.
        return Ok(());
    }
    let key = SessionKey {
        gate: closed.gate,
        sid: closed.sid,
    };
    let mut left: Vec<(String, String)> = rooms.rooms_of(&key);
    for group in &closed.groups {
        if let Some(room) = group.strip_prefix(GROUP_PREFIX)
            && check_room(room).is_ok()
            && !left.iter().any(|(r, _)| r == room)
        {
            left.push((room.to_owned(), closed.uid.clone()));
        }
    }
    ctx.publish(STATE_SUBJECT, rooms::closed_change(&key).encode_to_vec())?;
    for (room, name) in left {
        let event = member_event(&room, &name, REASON_DISCONNECTED);
        announce(ctx, rooms, announce_max, &key, ROUTE_LEFT, &event)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
