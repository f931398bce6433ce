//! What a handler sees of the request beyond its body: the session that asked, and the
//! effects the handler wants applied to that session.
//!
//! Workers keep no session state: the gate sends the session with every request, and a
//! handler changes it only by asking, through effects that travel back in
//! `RpcResponse.effects`. The gate applies them, in order, before it answers the client,
//! so the client never sees an answer whose side effects are not yet in place.
//!
//! The setters also update the context's own copy of the session, so a handler that binds
//! a uid and then reads [`Context::uid`] sees the new value, as it will on its next request.

use proto::rpc::{Effect, SetData, effect};
use proto::rpc::{RpcRequest, Session};

/// The session of one request and the effects its handler asks for.
///
/// Built by the framework for each call; handlers get `&mut Context`. Tests of a handler
/// can build one with [`Context::new`].
#[derive(Debug, Clone, Default)]
pub struct Context {
    session: Session,
    has_session: bool,
    effects: Vec<Effect>,
}

impl Context {
    /// A context for a request from `session`; `None` for a caller without a session (a
    /// worker or tool calling a service directly).
    pub fn new(session: Option<Session>) -> Context {
        Context {
            has_session: session.is_some(),
            session: session.unwrap_or_default(),
            effects: Vec::new(),
        }
    }

    /// The context of `request` (its session), leaving the body to the handler.
    pub fn for_request(request: &mut RpcRequest) -> Context {
        Context::new(request.session.take())
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

    /// The effects asked for so far, in order.
    pub fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// Consumes the context, yielding its effects for the response.
    pub fn into_effects(self) -> Vec<Effect> {
        self.effects
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
}
