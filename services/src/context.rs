//! What a handler sees of the request beyond its body: the session that asked, and the
//! effects and pushes the handler asks for (see [`Context`]); deferred answers and calls
//! to other services are in [`calls`].

mod calls;

use bytes::Bytes;
use proto::rpc::{Effect, SetData, effect};
use proto::rpc::{RpcRequest, Session};
use tokio::time::{Duration, Instant};

pub(crate) use calls::{Answer, Call, Later, Stem, Then};
pub use calls::{CallOptions, CallResult, Deferred, MAX_CALL_DEPTH, MAX_CALL_SPANS};

use crate::push::{Outbound, PushError};

/// The session of one request, and the effects and pushes its handler asks for.
///
/// Built by the framework for each call; handlers get `&mut Context`. Tests of a handler
/// can build one with [`Context::new`].
///
/// Workers keep no session state: the gate sends the session with every request, and a
/// handler changes it only by asking, through effects that travel back in
/// `RpcResponse.effects`. The gate applies them, in order, before it answers the client,
/// so the client never sees an answer whose side effects are not yet in place. The
/// setters also update the context's own copy of the session, so a handler that binds a
/// uid and then reads [`Context::uid`] sees the new value.
///
/// A handler reaches players beyond its own session with [`Context::broadcast`],
/// [`Context::push_to_user`], [`Context::kick_user`] and [`Context::publish`]. These are
/// published, in order, right after the handler returns and before its answer, so a
/// sender's own broadcast reaches its gate before the answer does. A handler that fails
/// publishes nothing.
///
/// Ticks and events get a context without a session: their pushes are published the
/// same way, while session effects have no session to act on and are dropped with a
/// warning.
///
/// A handler may also defer its answer and call other services ([`Context::defer`],
/// [`Context::call`], [`Context::answer`]; docs/workers.md, "Calling other services").
#[derive(Debug, Default)]
pub struct Context {
    session: Session,
    has_session: bool,
    effects: Vec<Effect>,
    outbound: Vec<Outbound>,
    reply: Option<Bytes>,
    /// A keyed service's request: the key it was routed by.
    key: String,
    /// Deferral, answers and calls (see [`calls`]).
    later: Later,
}

/// What a handler asked for, taken apart: see [`Context::into_parts`].
#[derive(Debug, Default)]
pub(crate) struct Parts {
    /// Effects on the session, for the response.
    pub effects: Vec<Effect>,
    /// Messages to publish before the response, in order.
    pub outbound: Vec<Outbound>,
    /// The answer to an event that asked for one.
    pub reply: Option<Bytes>,
    /// What acts after the handler's return.
    pub later: Later,
}

impl Context {
    /// A context for a request from `session`; `None` for a caller without a session (a
    /// worker or tool calling a service directly).
    pub fn new(session: Option<Session>) -> Context {
        Context {
            has_session: session.is_some(),
            session: session.unwrap_or_default(),
            effects: Vec::new(),
            outbound: Vec::new(),
            reply: None,
            key: String::new(),
            later: Later::default(),
        }
    }

    /// The context of `request` (its session and deadline: `received` plus the
    /// caller's timeout, if it gave one; its route, trace and timing flag, for its
    /// calls), leaving the body to the handler.
    pub(crate) fn for_request(request: &mut RpcRequest, received: Instant) -> Context {
        let mut ctx = Context::new(request.session.take());
        ctx.key = std::mem::take(&mut request.key);
        ctx.later.deadline = (request.timeout_ms > 0)
            .then(|| received + Duration::from_millis(u64::from(request.timeout_ms)));
        ctx.later.route = std::mem::take(&mut request.route);
        ctx.later.stem = Stem {
            trace: std::mem::take(&mut request.trace),
            timing: request.timing,
            origin: None,
        };
        ctx
    }

    /// The context of a call's continuation: the caller's session and deadline, and
    /// what the call stems from, which its own calls carry too.
    pub(crate) fn resumed(
        session: Option<Session>,
        deadline: Option<Instant>,
        stem: Stem,
    ) -> Context {
        let mut ctx = Context::new(session);
        ctx.later.deadline = deadline;
        ctx.later.stem = stem;
        ctx
    }

    /// The key a keyed service's request was routed by (the client's explicit key, the
    /// session value the service names, or the uid); `None` for other services' requests
    /// and outside a request.
    pub fn key(&self) -> Option<&str> {
        Some(self.key.as_str()).filter(|key| !key.is_empty())
    }

    /// The session as the gate sent it, with this handler's own changes applied.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Whether the request came from a client session (false for direct callers, whose
    /// effects nobody applies).
    pub fn has_session(&self) -> bool {
        self.has_session
    }

    /// The gate holding the session.
    pub fn gate(&self) -> &str {
        &self.session.gate
    }

    /// The session's id, unique within its gate.
    pub fn sid(&self) -> u64 {
        self.session.sid
    }

    /// The bound user id, if a handler has bound one.
    pub fn uid(&self) -> Option<&str> {
        Some(self.session.uid.as_str()).filter(|uid| !uid.is_empty())
    }

    /// Whether the uid was named by the player's signed token (JWT) at the handshake.
    /// Such a uid is who the player is: a service must not bind another (the gate
    /// refuses it with 403 anyway).
    pub fn authenticated(&self) -> bool {
        self.session.authenticated
    }

    /// One claim of the player's signed token, other than `sub` (which is the uid):
    /// strings as they are, other values as their JSON text (`"7"`, `"[\"a\"]"`).
    pub fn claim(&self, name: &str) -> Option<&str> {
        self.session.claims.get(name).map(String::as_str)
    }

    /// One value of the session's data.
    pub fn data(&self, key: &str) -> Option<&str> {
        self.session.data.get(key).map(String::as_str)
    }

    /// Binds the session to user `uid` (login). The gate then routes pushes for the user
    /// to this session and enforces one session per uid.
    pub fn bind_uid(&mut self, uid: impl Into<String>) {
        let uid = uid.into();
        self.session.uid.clone_from(&uid);
        self.push(effect::Kind::BindUid(uid));
    }

    /// Stores `key = value` in the session; sent with every later request.
    pub fn set_data(&mut self, key: impl Into<String>, value: impl Into<String>) {
        let (key, value) = (key.into(), value.into());
        self.session.data.insert(key.clone(), value.clone());
        self.push(effect::Kind::SetData(SetData { key, value }));
    }

    /// Removes `key` from the session's data.
    pub fn clear_data(&mut self, key: impl Into<String>) {
        let key = key.into();
        self.session.data.remove(&key);
        self.push(effect::Kind::ClearData(key));
    }

    /// Adds the session to group `group` (a room, a channel): it then receives what is
    /// published to the group.
    pub fn join(&mut self, group: impl Into<String>) {
        self.push(effect::Kind::Join(group.into()));
    }

    /// Removes the session from group `group`.
    pub fn leave(&mut self, group: impl Into<String>) {
        self.push(effect::Kind::Leave(group.into()));
    }

    /// Closes the session after this answer, telling the client `reason`.
    pub fn kick(&mut self, reason: impl Into<String>) {
        self.push(effect::Kind::Kick(reason.into()));
    }

    /// Adds an effect built by hand: the way in for effect kinds added to the protocol
    /// before this type grows a helper for them.
    pub fn push_effect(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    /// Pushes `route` and `body` to every member of `group` on every gate. Fails (400)
    /// when `group` is not one `[a-z0-9_-]` token.
    pub fn broadcast(
        &mut self,
        group: &str,
        route: &str,
        body: impl Into<Bytes>,
    ) -> Result<(), PushError> {
        self.outbound.push(Outbound::broadcast(group, route, body)?);
        Ok(())
    }

    /// Pushes `route` and `body` to player `uid` on whichever gate it is bound (dropped
    /// when it is not connected). Fails (400) when `uid` is not one `[a-z0-9_-]` token.
    pub fn push_to_user(
        &mut self,
        uid: &str,
        route: &str,
        body: impl Into<Bytes>,
    ) -> Result<(), PushError> {
        self.outbound
            .push(Outbound::push_to_user(uid, route, body)?);
        Ok(())
    }

    /// Closes player `uid`'s session, wherever it is, telling the client `reason`. (To
    /// close the session that sent this request, [`Context::kick`] does it after the
    /// answer.) Fails (400) when `uid` is not one `[a-z0-9_-]` token.
    pub fn kick_user(&mut self, uid: &str, reason: &str) -> Result<(), PushError> {
        self.outbound.push(Outbound::kick_user(uid, reason)?);
        Ok(())
    }

    /// Publishes `payload` on `<prefix>.<subject>`, a subject of the service's own (its
    /// workers' replication, say). Fails (400) unless `subject` is dot-separated tokens.
    pub fn publish(&mut self, subject: &str, payload: impl Into<Bytes>) -> Result<(), PushError> {
        self.outbound.push(Outbound::publish(subject, payload)?);
        Ok(())
    }

    /// Says this handler changed keyed `partition`'s state, so its standby gets the
    /// partition's snapshot before this frame's answers leave (docs/workers.md,
    /// "Standbys"). A keyed request's own partition is marked by itself; ticks, events
    /// and continuations that change a partition say so here.
    pub fn changed(&mut self, partition: u32) {
        self.later.changed.push(partition);
    }

    /// Answers the event being handled, when its sender asked for an answer (a NATS
    /// request); otherwise ignored. The last call wins.
    pub fn reply(&mut self, body: impl Into<Bytes>) {
        self.reply = Some(body.into());
    }

    /// The effects asked for so far, in order.
    pub fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// The messages to publish asked for so far, in order.
    pub fn outbound(&self) -> &[Outbound] {
        &self.outbound
    }

    /// Consumes the context, yielding its effects for the response.
    pub fn into_effects(self) -> Vec<Effect> {
        self.effects
    }

    /// Consumes the context, yielding everything the handler asked for.
    pub(crate) fn into_parts(self) -> Parts {
        Parts {
            effects: self.effects,
            outbound: self.outbound,
            reply: self.reply,
            later: self.later,
        }
    }

    fn push(&mut self, kind: effect::Kind) {
        self.effects.push(Effect { kind: Some(kind) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        Session {
            gate: "g1".into(),
            sid: 7,
            uid: String::new(),
            data: [("lang".to_string(), "en".to_string())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn exposes_the_session() {
        let ctx = Context::new(Some(session()));
        assert!(ctx.has_session());
        assert_eq!(ctx.gate(), "g1");
        assert_eq!(ctx.sid(), 7);
        assert_eq!(ctx.uid(), None);
        assert_eq!(ctx.data("lang"), Some("en"));
        assert_eq!(ctx.data("missing"), None);
    }

    #[test]
    fn without_a_session_reads_empty() {
        let ctx = Context::new(None);
        assert!(!ctx.has_session());
        assert_eq!(ctx.gate(), "");
        assert_eq!(ctx.uid(), None);
    }

    #[test]
    fn effects_are_recorded_in_order_and_visible_to_the_handler() {
        let mut ctx = Context::new(Some(session()));
        ctx.bind_uid("alice");
        ctx.set_data("room", "r1");
        ctx.clear_data("lang");
        ctx.join("r1");
        ctx.leave("lobby");
        ctx.kick("bye");
        assert_eq!(ctx.uid(), Some("alice"));
        assert_eq!(ctx.data("room"), Some("r1"));
        assert_eq!(ctx.data("lang"), None);
        let kinds: Vec<_> = ctx.into_effects().into_iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![
                Some(effect::Kind::BindUid("alice".into())),
                Some(effect::Kind::SetData(SetData {
                    key: "room".into(),
                    value: "r1".into()
                })),
                Some(effect::Kind::ClearData("lang".into())),
                Some(effect::Kind::Join("r1".into())),
                Some(effect::Kind::Leave("lobby".into())),
                Some(effect::Kind::Kick("bye".into())),
            ]
        );
    }

    #[test]
    fn pushes_are_collected_in_order_and_bad_names_refused() {
        let mut ctx = Context::new(Some(session()));
        ctx.broadcast("lobby", "chat.message", "hi").unwrap();
        ctx.push_to_user("bob", "chat.whisper", "psst").unwrap();
        ctx.kick_user("mallory", "banned").unwrap();
        ctx.publish("chat.state", "x").unwrap();
        assert!(ctx.broadcast("a.>", "r", "").is_err());
        assert!(ctx.push_to_user("", "r", "").is_err());
        assert!(ctx.kick_user("Bob", "r").is_err());
        let parts = ctx.into_parts();
        let subjects: Vec<String> = parts.outbound.iter().map(|o| o.subject("s")).collect();
        assert_eq!(
            subjects,
            [
                "s.grp.lobby",
                "s.user.bob",
                "s.user.mallory",
                "s.chat.state"
            ]
        );
        assert!(parts.effects.is_empty());
        assert_eq!(parts.reply, None);
    }
}
