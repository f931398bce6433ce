//! Resumable sessions (docs/protocol.md and docs/gateway.md, "Resume").
//!
//! - **Numbered and kept.** A resumable session numbers every push and answer it sends
//!   and keeps each in its [`Replay`] until the client acknowledges it.
//! - **Detached.** When its link drops without a close, the session goes on without a
//!   socket for `--resume-window`: requests in flight are answered, pushes arrive, all
//!   into the replay (bounded; overflowing ends the session).
//! - **Handed over.** A client resumes by handshaking with its token on any gate; that
//!   gate sends this one a `TakeOver` on `<prefix>.resume.<gate>`. The session checks
//!   the token's secret, the player and the client's last seq, answers what it is
//!   (`Held`), and stops sending to its socket. The new gate subscribes the session's
//!   groups and player subject, then publishes a mark on each: what reaches the old
//!   session before a mark is the old session's to hand over, what comes after is the
//!   new one's. Once every mark is back (or `--resume-handover-timeout` passed) the old
//!   session sends everything after the client's last seq, its requests still in
//!   flight (those waiting to be sent again after "no responders" as never sent), its
//!   queued serial requests and the answers that came meanwhile (`Handed`), and ends
//!   without a word to services: the session lives on. Replies to its requests still
//!   in flight are relayed to the new gate.
//! - **Refused** attempts (a wrong secret, player, encoding or `last_seq`) change
//!   nothing of the session they name.
//!
//! The same steps serve a resume on the same gate (the bus carries them there too).

use std::sync::Arc;
use std::time::Duration;

use bus::{BusError, Reply};
use proto::Message as _;
use proto::client;
use proto::code;
use proto::resume::{self as wire, Handed, Held, TakeOver};
use proto::rpc::RpcResponse;
use rustc_hash::FxHashSet;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use super::effects::announce_closed;
use super::replay::{Missing, Replay};
use super::{Closing, Context, Io, Pending, Session, close};
use crate::codec::Codec;
use crate::config::MAX_HANDED_BYTES;
use crate::handover::{self, NO_SUCH_SESSION, Token};
use crate::inbox::{Inbox, ToSession, WorkerReply};

/// What a resumable session holds for its resume.
pub(super) struct Resume {
    /// The token its client was last given.
    pub token: Token,
    pub replay: Replay,
    /// While its link is down: when the session ends unless its client resumes.
    pub detached_until: Option<Instant>,
    /// While it is handed over to another gate.
    pub handing: Option<Handing>,
    /// Frames were let go of while detached: it cannot be resumed whole any more.
    pub broken: bool,
    /// Handed over: the reply subject prefix of its new place.
    moved_to: Option<String>,
}

/// A hand-over under way.
pub(super) struct Handing {
    gate: String,
    sid: u64,
    /// The client's last seq: everything after it goes.
    last_seq: u64,
    /// Marks still to come back.
    marks_left: usize,
    pub until: Instant,
    /// Answers that came meanwhile, for the new gate to apply and send.
    answers: Vec<wire::Answer>,
}

impl Resume {
    pub(super) fn new(token: Token, replay: Replay) -> Self {
        Resume {
            token,
            replay,
            detached_until: None,
            handing: None,
            broken: false,
            moved_to: None,
        }
    }
}

/// A session's client is taking it up here: what its old gate handed over.
pub(crate) struct Arrival {
    pub held: Held,
    pub handed: Handed,
    /// What reached the new session while it waited for `handed`, in order.
    pub early: Vec<ToSession>,
}

/// Takes up, as session `sid` of this gate, the session `resume_token` names: asks its
/// gate for it, subscribes its subjects and marks them, and waits for what it holds.
/// `Err` is the handshake's `resume_code`: the client gets a fresh session.
pub(crate) async fn arrive(
    gate: &Context,
    sid: u64,
    handshake: &client::Handshake,
    uid: &str,
    json: bool,
    inbox: &mut Inbox,
) -> Result<Arrival, u32> {
    let token = Token::parse(&handshake.resume_token).ok_or(code::BAD_REQUEST)?;
    let config = &gate.config;
    let request = TakeOver {
        sid: token.sid,
        secret: token.secret.to_vec().into(),
        last_seq: handshake.last_seq,
        gate: config.gate_id.clone(),
        new_sid: sid,
        uid: uid.to_owned(),
        json,
    };
    let subject = handover::subject(&config.prefix, &token.gate);
    let timeout = config.resume_handover_timeout;
    let answer = (gate.asks)
        .ask(&subject, &request.encode_to_vec(), timeout)
        .await
        .ok_or(code::UNAVAILABLE)?;
    let held = Held::decode(answer).map_err(|_| code::UNAVAILABLE)?;
    if held.code != code::OK {
        return Err(held.code);
    }
    let player = held
        .session
        .as_ref()
        .map_or("", |s| s.uid.as_str())
        .to_owned();
    let mark = wire::Mark {
        old_gate: token.gate,
        old_sid: token.sid,
        new_gate: config.gate_id.clone(),
        new_sid: sid,
    };
    gate.presence
        .arrive_marked(&held.groups, &player, sid, &mark);
    // The old gate hands over once every mark is back, or at its own timeout.
    let deadline = Instant::now() + 2 * timeout;
    let mut early = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, inbox.rx.recv()).await {
            Ok(Some(ToSession::Handed(handed))) => {
                return Ok(Arrival {
                    held,
                    handed: *handed,
                    early,
                });
            }
            Ok(Some(msg)) if early.len() < config.outbound_queue => early.push(msg),
            _ => {
                gate.presence.depart(&held.groups, &player, sid);
                // Nothing came: the old gate handed over to nobody, or not at all, and
                // the session is over either way. Services are told, as for any end.
                if let Some(session) = &held.session {
                    announce_closed(gate, session, held.groups.clone());
                }
                return Err(code::UNAVAILABLE);
            }
        }
    }
}

impl<S: Io> Session<S> {
    /// Whether the session has its socket (a session that is not resumable always has).
    pub(super) fn attached(&self) -> bool {
        self.resume
            .as_ref()
            .is_none_or(|r| r.detached_until.is_none())
    }

    /// The seq of the push or answer about to be sent: the next of a resumable
    /// session, 0 for others.
    pub(super) fn next_seq(&mut self) -> u64 {
        self.resume.as_mut().map_or(0, |r| r.replay.next())
    }

    /// Keeps a numbered frame until the client acknowledges it.
    pub(super) fn keep(&mut self, frame: &Message, answers: u64) {
        if let Some(r) = &mut self.resume
            && !r.replay.keep(frame.clone(), answers)
            && r.detached_until.is_some()
        {
            r.broken = true;
        }
    }

    /// The client acknowledged every frame up to `seq`.
    pub(super) fn acked(&mut self, seq: u64) {
        if let Some(r) = &mut self.resume {
            r.replay.ack(seq);
        }
    }

    /// The link was lost (`closing` says how): a resumable session lets the socket go
    /// and waits for its client for the resume window. `false` when the session ends.
    pub(super) async fn detach(&mut self, closing: &Closing) -> bool {
        let window = self.gate.config.resume_window;
        let Some(r) = &mut self.resume else {
            return false;
        };
        if r.detached_until.is_some() {
            return false;
        }
        r.detached_until = Some(Instant::now() + window);
        // Told if it still listens (a slow or silent client); never waited for.
        if let Some(mut ws) = self.ws.take() {
            close(&mut ws, closing, Duration::ZERO).await;
        }
        metrics::counter!("gate_sessions_detached_total").increment(1);
        metrics::gauge!("gate_sessions_detached").increment(1.0);
        true
    }

    /// A request whose id this resumable session has seen: still in flight (or queued
    /// behind a serial one), it is answered once when its answer comes; answered
    /// already, it gets the same frame again. `false` for an id the session does not
    /// know.
    pub(super) fn resent(&mut self, id: u64) -> bool {
        let Some(r) = &self.resume else {
            return false;
        };
        if self.pending.contains_key(&id) || self.serial_queue.iter().any(|q| q.id == id) {
            return true;
        }
        let Some(frame) = r.replay.answer(id).cloned() else {
            return false;
        };
        self.put(frame, false);
        true
    }

    /// Another gate asks for this session: its client resumed there.
    pub(super) async fn on_take_over(&mut self, request: TakeOver, reply: &str) -> Option<Closing> {
        if let Err((code, message)) = self.may_take_over(&request) {
            metrics::counter!("gate_resumes_refused_total", "code" => code.to_string())
                .increment(1);
            self.answer_take_over(
                reply,
                &Held {
                    code,
                    message: message.into(),
                    ..Default::default()
                },
            );
            // Never disturbed by a refused attempt: whoever holds a copy of the token
            // (with a stale `last_seq`, say) must not end a session its client can
            // still resume. One that let go of frames ends on its own (`broken`).
            return None;
        }
        let now = Instant::now();
        let marks = self.groups.len() + usize::from(!self.wire.get().uid.is_empty());
        let config = &self.gate.config;
        let held = Held {
            code: code::OK,
            message: String::new(),
            session: Some(self.wire.get().clone()),
            groups: self.groups.clone(),
            expires_in_ms: self.expires.map_or(0, |at| {
                u64::try_from(at.saturating_duration_since(now).as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1)
            }),
            server_timing: self.timing,
            serial: self.serial,
        };
        let until = now + config.resume_handover_timeout;
        self.answer_take_over(reply, &held);
        let Some(r) = &mut self.resume else {
            return None;
        };
        let was_attached = r.detached_until.is_none();
        r.detached_until.get_or_insert(until);
        r.handing = Some(Handing {
            gate: request.gate,
            sid: request.new_sid,
            last_seq: request.last_seq,
            marks_left: marks,
            until,
            answers: Vec::new(),
        });
        if was_attached {
            // The client is elsewhere now: this socket is stale, and is let go.
            if let Some(mut ws) = self.ws.take() {
                close(&mut ws, &Closing::handed_over(), Duration::ZERO).await;
            }
            metrics::gauge!("gate_sessions_detached").increment(1.0);
        }
        (marks == 0).then(|| self.hand_over())
    }

    /// Why this session cannot be handed over as `request` asks: the handshake's
    /// `resume_code` and a message.
    fn may_take_over(&self, request: &TakeOver) -> Result<(), (u32, &'static str)> {
        let Some(r) = &self.resume else {
            return Err((code::NOT_FOUND, NO_SUCH_SESSION));
        };
        // A wrong secret learns nothing about whether the session exists.
        if r.handing.is_some() || !r.token.proves(&request.secret) {
            return Err((code::NOT_FOUND, NO_SUCH_SESSION));
        }
        let session = self.wire.get();
        let player = if session.authenticated {
            session.uid.as_str()
        } else {
            ""
        };
        if request.uid != player {
            return Err((code::FORBIDDEN, "the session is another player's"));
        }
        if request.json != matches!(self.codec, Codec::Json) {
            return Err((
                code::BAD_REQUEST,
                "the session was opened with the other encoding",
            ));
        }
        if r.broken {
            return Err((code::CONFLICT, GAP));
        }
        match r.replay.since(request.last_seq) {
            Ok(missed) => {
                let bytes: usize = missed.map(|k| k.frame.len()).sum();
                if bytes > MAX_HANDED_BYTES {
                    return Err((code::CONFLICT, TOO_MUCH));
                }
                Ok(())
            }
            Err(Missing::Gone) => Err((code::CONFLICT, GAP)),
            Err(Missing::Ahead) => Err((
                code::BAD_REQUEST,
                "last_seq is past what the session has sent",
            )),
        }
    }

    fn answer_take_over(&self, reply: &str, held: &Held) {
        let _ = self
            .gate
            .bus
            .publish_bytes(reply, Reply::None, &held.encode_to_vec());
    }

    /// A reply that came while the session is handed over: kept for the new gate.
    /// `false` when the session is not being handed over.
    pub(super) fn hold_reply(&mut self, id: u64, reply: WorkerReply) -> Result<(), WorkerReply> {
        if self.resume.as_ref().is_none_or(|r| r.handing.is_none()) {
            return Err(reply);
        }
        // Reached no worker: it waits to be sent again, and is handed over unsent if it
        // still waits then (the new gate sends it), as it would wait here.
        if matches!(reply, WorkerReply::NoResponders) && self.resend_later(id) {
            return Ok(());
        }
        let Some(handing) = self.resume.as_mut().and_then(|r| r.handing.as_mut()) else {
            return Err(reply);
        };
        let response = match reply {
            WorkerReply::Response(r) => *r,
            WorkerReply::NoResponders => RpcResponse {
                code: code::UNAVAILABLE,
                message: "no worker available now".into(),
                ..Default::default()
            },
            WorkerReply::Invalid => RpcResponse {
                code: code::HANDLER_ERROR,
                message: "worker sent an invalid response".into(),
                ..Default::default()
            },
        };
        handing.answers.push(wire::Answer {
            id,
            response: Some(response),
        });
        Ok(())
    }

    /// One of the session's subjects brought the new gate's mark.
    pub(super) fn on_marked(&mut self) -> Option<Closing> {
        let handing = self.resume.as_mut()?.handing.as_mut()?;
        handing.marks_left = handing.marks_left.saturating_sub(1);
        (handing.marks_left == 0).then(|| self.hand_over())
    }

    /// Sends the new gate everything the client missed, the requests in flight, the
    /// serial requests queued and the answers that came meanwhile; the session then
    /// ends here.
    pub(super) fn hand_over(&mut self) -> Closing {
        let now = Instant::now();
        for held in self.pending.values().filter(|p| !p.sent) {
            self.gate.held.give_back(held.body_len());
        }
        // Waiting to be sent again reached no worker: the new gate sends them at once,
        // and they go on waiting for a worker there, within their timeout.
        let resending: FxHashSet<u64> = self.resends.iter().map(|&(_, id)| id).collect();
        let pending: Vec<wire::Pending> = self
            .pending
            .drain()
            .map(|(id, p)| wire::Pending {
                id,
                route: p.route.to_string(),
                subject: p.subject.to_string(),
                has_body: p.body.is_some(),
                body: p.body.clone().unwrap_or_default(),
                key: p.key.clone(),
                sent: p.sent && !resending.contains(&id),
                age_ms: u32::try_from(now.duration_since(p.received).as_millis())
                    .unwrap_or(u32::MAX),
            })
            .collect();
        self.gate.in_flight.give_back(pending.len());
        // Serial requests queued here were never forwarded: the new gate forwards them.
        let queued = std::mem::take(&mut self.serial_queue).into();
        let serial_pending = self.serial_pending.take().unwrap_or(0);
        self.deadlines.clear();
        self.held.clear();
        self.resends.clear();
        let Some(r) = &mut self.resume else {
            return Closing::handed_over();
        };
        let Some(handing) = r.handing.take() else {
            return Closing::handed_over();
        };
        let frames = r
            .replay
            .since(handing.last_seq)
            .map(|kept| {
                kept.map(|k| wire::Frame {
                    data: k.frame.clone().into_data(),
                    answers: k.answers,
                })
                .collect()
            })
            .unwrap_or_default();
        let handed = Handed {
            frames,
            seq: r.replay.seq(),
            pending,
            answers: handing.answers,
            queued,
            serial_pending,
        };
        let config = &self.gate.config;
        let to = format!("{}.gw.{}.{}.", config.prefix, handing.gate, handing.sid);
        let subject = format!("{to}0");
        let encoded = handed.encode_to_vec();
        // Grown past what one bus message may carry while the marks came back: not
        // sent (the server would drop the gate's connection); the new gate gives up
        // and tells services the session ended.
        let sent = encoded.len() <= MAX_HANDED_BYTES
            && self
                .gate
                .bus
                .publish_bytes(&subject, Reply::None, &encoded)
                .is_ok();
        if !sent {
            metrics::counter!("gate_resumes_failed_total").increment(1);
        }
        self.gate
            .sessions
            .moved(self.sid, to.clone(), now + config.request_timeout);
        if let Some(r) = &mut self.resume {
            r.moved_to = Some(to);
        }
        metrics::counter!("gate_sessions_handed_over_total").increment(1);
        Closing::handed_over()
    }

    /// Handed over and unregistered: replies that reached the session's queue after
    /// its last turn go on to its new gate, as later ones do (`Sessions::moved`).
    pub(super) fn relay_leftovers(&mut self, inbox: &mut Inbox) {
        let Some(to) = self.resume.as_ref().and_then(|r| r.moved_to.clone()) else {
            return;
        };
        while let Ok(msg) = inbox.rx.try_recv() {
            let ToSession::Reply { id, reply } = msg else {
                continue;
            };
            let encoded = match reply {
                WorkerReply::Response(r) => Some(r.encode_to_vec()),
                WorkerReply::NoResponders | WorkerReply::Invalid => None,
            };
            handover::relay(&self.gate.bus, &to, id, encoded.as_deref());
        }
    }

    /// Takes up what the old gate handed over: the frames the client missed go out
    /// first (after the ack), then the answers that came meanwhile, then what reached
    /// this session while it waited; requests still in flight wait here for their
    /// relayed replies.
    pub(super) async fn adopt(&mut self, arrival: Arrival) -> Option<Closing> {
        let Arrival { handed, early, .. } = arrival;
        let json = matches!(self.codec, Codec::Json);
        for frame in handed.frames {
            let answers = frame.answers;
            let frame = if json {
                match tokio_tungstenite::tungstenite::Utf8Bytes::try_from(frame.data) {
                    Ok(text) => Message::Text(text),
                    Err(_) => continue,
                }
            } else {
                Message::Binary(frame.data)
            };
            // Numbered already, by the old gate: the count goes on from it.
            self.next_seq();
            self.keep(&frame, answers);
            self.put(frame, false);
        }
        let now = Instant::now();
        let mut pending: Vec<wire::Pending> = handed.pending;
        pending.sort_by_key(|p| std::cmp::Reverse(p.age_ms));
        self.gate.in_flight.take_anyway(pending.len());
        for p in pending {
            let received = now
                .checked_sub(Duration::from_millis(u64::from(p.age_ms)))
                .unwrap_or(now);
            let mut entry = Pending {
                received,
                route: Arc::from(p.route.as_str()),
                subject: Arc::from(p.subject.as_str()),
                body: p.has_body.then_some(p.body),
                key: p.key,
                sent: p.sent,
                resends: 0,
            };
            if !entry.sent {
                // Never sent by the old gate, or it reached no worker there: this one
                // sends it now, or holds it for the bus as it would a new request.
                match self.publish(p.id, &entry) {
                    Ok(()) => entry.mark_sent(),
                    Err(BusError::Disconnected) if self.hold(p.id, entry.body_len()) => {}
                    Err(e) => {
                        self.bus_refused(e).increment(1);
                        // Nothing of the gate's held budget is its: none to give back.
                        entry.sent = true;
                        self.answer_unavailable(p.id, &entry, super::blips::BUS_UNAVAILABLE);
                        continue;
                    }
                }
            }
            self.pending.insert(p.id, entry);
            self.deadlines
                .push_back((received + self.gate.config.request_timeout, p.id));
        }
        // Serial requests the old gate had queued go on in turn from here.
        self.serial_queue = handed.queued.into();
        match handed.serial_pending {
            id if self.pending.contains_key(&id) => self.serial_pending = Some(id),
            _ => self.next_serial(),
        }
        for answer in handed.answers {
            let reply = WorkerReply::Response(Box::new(answer.response.unwrap_or_default()));
            let msg = ToSession::Reply {
                id: answer.id,
                reply,
            };
            if let Some(closing) = self.on_message(msg).await {
                return Some(closing);
            }
        }
        for msg in early {
            if let Some(closing) = self.on_message(msg).await {
                return Some(closing);
            }
        }
        None
    }
}

/// The refusal of a resume whose missed frames are more than one hand-over carries.
const TOO_MUCH: &str = "the client missed more than a hand-over carries";

/// The refusal of a resume whose session let go of frames its client missed.
const GAP: &str = "the session let go of frames the client missed";
