//! What a handler's answer asks of the session (bind a uid, session data, groups, a
//! kick), applied in order before the answer goes out; and leaving everything when the
//! session ends.

use bus::Reply;
use proto::Message as _;
use proto::client;
use proto::code;
use proto::rpc::{Effect, Session, SessionClosed, effect};

use super::{Context, Io, Session as Live};
use crate::presence::BindError;
use crate::route;

impl<S: Io> Live<S> {
    /// Applies a handler's effects, in order, before its answer goes out. A bind the
    /// gate cannot make turns the answer into an error and skips the effects after it.
    /// Returns a kick's reason, acted on after the answer is sent.
    pub(super) async fn apply(
        &mut self,
        effects: Vec<Effect>,
        resp: &mut client::Response,
    ) -> Option<String> {
        let mut kick = None;
        // A subscription made here (a group new on this gate, a player bound) is in
        // place at the bus server before the answer goes out: a push published after
        // the client saw the answer must reach it.
        let mut subscribed = false;
        for kind in effects.into_iter().filter_map(|e| e.kind) {
            match kind {
                effect::Kind::BindUid(uid) => {
                    let session = self.wire.get();
                    if session.authenticated && session.uid != uid {
                        resp.code = code::FORBIDDEN;
                        resp.message =
                            format!("the player is {:?}, named by its signed token", session.uid);
                        resp.body = Default::default();
                        break;
                    }
                    match self.gate.presence.bind(&uid, self.sid).await {
                        Ok(new) => subscribed |= new,
                        Err(e) => {
                            resp.code = match e {
                                BindError::Taken => code::CONFLICT,
                                BindError::Invalid => code::BAD_REQUEST,
                                BindError::Bus(_) => code::UNAVAILABLE,
                            };
                            resp.message = e.to_string();
                            resp.body = Default::default();
                            break;
                        }
                    }
                    let mut old = uid;
                    self.wire.update(|s| std::mem::swap(&mut s.uid, &mut old));
                    if !old.is_empty() && old != self.wire.get().uid {
                        self.gate.presence.unbind(&old, self.sid);
                    }
                }
                effect::Kind::SetData(d) => {
                    self.wire.update(|s| {
                        s.data.insert(d.key, d.value);
                    });
                }
                effect::Kind::ClearData(key) => {
                    self.wire.update(|s| {
                        s.data.remove(&key);
                    });
                }
                effect::Kind::Join(group) => {
                    if route::check_token(&group).is_err() || self.groups.contains(&group) {
                        continue;
                    }
                    subscribed |= self.gate.presence.join(&group, self.sid);
                    self.groups.push(group);
                }
                effect::Kind::Leave(group) => {
                    if let Some(i) = self.groups.iter().position(|g| *g == group) {
                        self.groups.swap_remove(i);
                        self.gate.presence.leave(&group, self.sid);
                    }
                }
                effect::Kind::Kick(reason) => kick = Some(reason),
            }
        }
        if subscribed {
            self.gate.presence.subscriptions_in_place().await;
        }
        kick
    }

    /// Handed over: lets go of what the session still holds here (the new gate's marks
    /// took the rest), without telling services: the session lives on.
    pub(super) fn leave_quietly(&mut self) {
        let uid = self.wire.get().uid.clone();
        self.gate.presence.depart(&self.groups, &uid, self.sid);
    }

    /// On close: leaves every group, releases the uid, and tells services.
    pub(super) async fn leave_everything(&mut self) {
        for group in &self.groups {
            self.gate.presence.leave(group, self.sid);
        }
        let uid = &self.wire.get().uid;
        if !uid.is_empty() {
            self.gate.presence.unbind(uid, self.sid);
        }
        let groups = std::mem::take(&mut self.groups);
        announce_closed(&self.gate, self.wire.get(), groups);
    }
}

/// Tells services that `session` ended, by the identity they know it by (a resumed
/// session keeps the one it started with), with the groups it was in.
pub(super) fn announce_closed(gate: &Context, session: &Session, groups: Vec<String>) {
    let event = SessionClosed {
        gate: session.gate.clone(),
        sid: session.sid,
        uid: session.uid.clone(),
        groups,
    };
    let subject = format!("{}.evt.session.closed", gate.config.prefix);
    let _ = gate
        .bus
        .publish_bytes(&subject, Reply::None, &event.encode_to_vec());
}
