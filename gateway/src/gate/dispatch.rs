//! The bus reader's side of the gate: each message that arrives goes to the sessions it
//! is for (a reply by the `<sid>.<id>` at the end of its subject, a broadcast to a
//! group's members, a command to a bound player, another gate's request for a session
//! its client resumed there), and each connection change to every session. Replies for
//! a session that moved to another gate are relayed there.

use std::sync::Arc;

use bus::{Bus, Dispatch, Incoming, Reply};
use bytes::Bytes;
use proto::Message as _;
use proto::code;
use proto::resume::{Handed, Held, TakeOver};
use proto::rpc::RpcResponse;
use tokio::sync::watch;

use crate::asks::Asks;
use crate::bus_target::Target;
use crate::handover::{self, NO_SUCH_SESSION};
use crate::inbox::{Refused, ToSession, WorkerReply};
use crate::presence::Presence;
use crate::schema::{self, Schemas};
use crate::session::Context;
use crate::sessions::{GATE_SID, Sessions};

/// The status of a "no responders" answer.
const NO_RESPONDERS: u16 = 503;

pub(super) struct Router {
    prefix: String,
    /// The length of `<prefix>.gw.<gate>.`, the head of every reply subject.
    reply_head: usize,
    bus: Arc<Bus<Target>>,
    sessions: Arc<Sessions>,
    presence: Arc<Presence>,
    asks: Arc<Asks>,
    schemas: Arc<Schemas>,
    /// Whether the bus connection is up; [`Gate::new`](super::Gate::new) waits for the
    /// first.
    bus_up: watch::Sender<bool>,
}

impl Router {
    pub(super) fn new(cx: &Context) -> Self {
        let config = &cx.config;
        Router {
            prefix: config.prefix.clone(),
            reply_head: config.prefix.len() + ".gw.".len() + config.gate_id.len() + 1,
            bus: cx.bus.clone(),
            sessions: cx.sessions.clone(),
            presence: cx.presence.clone(),
            asks: cx.asks.clone(),
            schemas: cx.schemas.clone(),
            bus_up: watch::Sender::new(false),
        }
    }

    /// Whether the bus connection is up, from now on.
    pub(super) fn watch_bus(&self) -> watch::Receiver<bool> {
        self.bus_up.subscribe()
    }

    /// Hands a reply to its session by the `<sid>.<id>` at the end of its subject.
    fn route_reply(&self, subject: &[u8], status: Option<u16>, payload: Bytes) {
        let Some((sid, id)) = subject
            .get(self.reply_head..)
            .and_then(|tail| std::str::from_utf8(tail).ok())
            .and_then(parse_sid_id)
        else {
            return;
        };
        let no_responders = status == Some(NO_RESPONDERS);
        if sid == GATE_SID {
            self.asks.answer(id, (!no_responders).then_some(payload));
            return;
        }
        if id == 0 {
            // Id 0 is never a request's (a notify has no reply): a hand-over.
            match Handed::decode(payload) {
                Ok(handed) => self.offer(sid, ToSession::Handed(Box::new(handed))),
                Err(_) => metrics::counter!("gate_invalid_pushes_total").increment(1),
            }
            return;
        }
        let reply = if no_responders {
            WorkerReply::NoResponders
        } else {
            // A shared handle, not a copy: kept only to relay it if the session moved.
            RpcResponse::decode(payload.clone())
                .map_or(WorkerReply::Invalid, |r| WorkerReply::Response(Box::new(r)))
        };
        // The queue has room for max_in_flight answers plus outbound_queue pushes; it is
        // full only when pushes flood a session that does not keep up. The reader must
        // not wait on one session: the reply is dropped and counted, and the session
        // closes as too slow. A session gone meanwhile needs no answer, unless it moved
        // to another gate.
        match self.sessions.offer(sid, ToSession::Reply { id, reply }) {
            Ok(()) => {}
            Err(Refused::Full) => metrics::counter!("gate_replies_dropped_total").increment(1),
            Err(Refused::Gone) => {
                if let Some(moved) = self.sessions.moved_to(sid) {
                    let answer = (!no_responders).then_some(&payload[..]);
                    handover::relay(&self.bus, &moved, id, answer);
                }
            }
        }
    }

    fn offer(&self, sid: u64, msg: ToSession) {
        if let Err(Refused::Full) = self.sessions.offer(sid, msg) {
            metrics::counter!("gate_replies_dropped_total").increment(1);
        }
    }

    /// Another gate asks for session `request.sid`, its client having resumed there:
    /// the session answers itself; a sid that is not here is answered 404 at once.
    fn take_over(&self, payload: Bytes, reply: Option<&[u8]>) {
        let Some(reply) = reply.and_then(|r| std::str::from_utf8(r).ok()) else {
            return;
        };
        let Ok(request) = TakeOver::decode(payload) else {
            return self.refuse(reply, code::BAD_REQUEST, "invalid hand-over request");
        };
        let sid = request.sid;
        let msg = ToSession::TakeOver {
            request: Box::new(request),
            reply: reply.into(),
        };
        // A flood of bogus requests must not close the session they name.
        match self.sessions.offer_if_room(sid, msg) {
            Ok(()) => {}
            Err(Refused::Gone) => self.refuse(reply, code::NOT_FOUND, NO_SUCH_SESSION),
            Err(Refused::Full) => self.refuse(reply, code::UNAVAILABLE, "session too busy"),
        }
    }

    fn refuse(&self, reply: &str, code: u32, message: &str) {
        let held = Held {
            code,
            message: message.into(),
            ..Default::default()
        };
        let _ = self
            .bus
            .publish_bytes(reply, Reply::None, &held.encode_to_vec());
    }
}

impl Dispatch<Target> for Router {
    fn deliver(&self, target: &Target, msg: Incoming<'_>) {
        match target {
            Target::Replies => self.route_reply(msg.subject, msg.status, msg.payload),
            Target::Group(group) => self.presence.deliver_to_group(group, msg.payload),
            Target::User(uid) => self.presence.deliver_to_user(uid, msg.payload, msg.reply),
            Target::Schemas => schema::on_announcement(&self.schemas, msg.payload),
            Target::Resume => self.take_over(msg.payload, msg.reply),
        }
    }

    fn connected(&self) {
        // Workers that started before this gate, or announced while it was away,
        // announce again.
        let ask = proto::schema::ask_subject(&self.prefix);
        let _ = self.bus.publish_bytes(&ask, Reply::None, &[]);
        self.bus_up.send_replace(true);
        self.sessions.offer_all(|| ToSession::BusBack);
    }

    fn lost(&self) {
        self.bus_up.send_replace(false);
        self.sessions.offer_all(|| ToSession::BusLost);
    }
}

fn parse_sid_id(tail: &str) -> Option<(u64, u64)> {
    let (sid, id) = tail.split_once('.')?;
    Some((sid.parse().ok()?, id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_subject_tail_parses() {
        assert_eq!(parse_sid_id("12.7"), Some((12, 7)));
        assert_eq!(parse_sid_id("12"), None);
        assert_eq!(parse_sid_id("x.7"), None);
        assert_eq!(parse_sid_id("1.2.3"), None);
    }
}
