//! A session's start: the HTTP upgrade, the first frame (which picks the codec), the
//! token check and, for a signed player token, the bind of its player before the
//! acknowledgement; and the token's later life (expiry, `Refresh`).

use std::cell::Cell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use proto::client::{self, Packet, packet::Kind};
use proto::code;
use rustc_hash::FxHashMap;
use tokio::time::{Instant, timeout};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::outbox::Outbox;
use super::replay::Replay;
use super::resume::{self, Resume};
use super::{Cache, Closing, Context, Ending, Io, Session, Ws, close, frame_error, unknown_field};
use crate::admission::Ticket;
use crate::codec::{Codec, Decoded};
use crate::forward::SessionWire;
use crate::handover::Token;
use crate::inbox;
use crate::limits::TokenBucket;
use crate::presence::BindError;
use crate::upgrade;

/// Serves one connection from WebSocket upgrade to close; `_ticket` holds its place
/// among the gate's connections until then.
pub(crate) async fn run<S: Io>(gate: Arc<Context>, stream: S, addr: SocketAddr, _ticket: Ticket) {
    // The opening and the rare steps are boxed: their state would otherwise sit in
    // every session's task for its whole life (a task is as large as the largest state
    // its future can be in).
    let Some((mut session, mut inbox, arrival)) = Box::pin(open(&gate, stream, addr)).await else {
        return;
    };
    let adopted = match arrival {
        Some(arrived) => Box::pin(session.adopt(arrived)).await,
        None => None,
    };
    let mut closing = match adopted {
        Some(closing) => closing,
        None => session.serve(&mut inbox).await,
    };
    while closing.ending == Ending::LinkLost && Box::pin(session.detach(&closing)).await {
        closing = session.serve(&mut inbox).await;
    }
    // Everything it holds is given back before the client is told.
    gate.sessions.remove(session.sid);
    if closing.ending == Ending::HandedOver {
        session.leave_quietly();
        session.relay_leftovers(&mut inbox);
    } else {
        session.leave_everything().await;
    }
    metrics::gauge!("gate_sessions").decrement(1.0);
    gate.in_flight.give_back(session.pending.len());
    for held in session.pending.values().filter(|p| !p.sent) {
        gate.held.give_back(held.body_len());
    }
    tracing::debug!(sid = session.sid, reason = closing.reason, "session closed");
    metrics::counter!("gate_sessions_closed_total", "reason" => closing.reason).increment(1);
    if session.attached() {
        session.finish(&closing, &mut inbox).await;
    } else {
        metrics::gauge!("gate_sessions_detached").decrement(1.0);
    }
}

/// From the WebSocket upgrade to the handshake's acknowledgement: the session, its
/// queue and, for a resume, what its old gate handed over; `None` when it was refused
/// (the client was told why). Its own function so that what only the opening needs (the
/// first frame, the handshake, the identity) is gone once the session runs: a task
/// keeps every local of its future alive to the end of its scope, and the first
/// frame's payload would pin the whole read buffer it was read into.
async fn open<S: Io>(
    gate: &Arc<Context>,
    stream: S,
    addr: SocketAddr,
) -> Option<(Session<S>, inbox::Inbox, Option<resume::Arrival>)> {
    let mut ws = match upgrade::accept(stream, &gate.upgrade, gate.ws_config).await {
        Ok(ws) => ws,
        Err(e) => {
            metrics::counter!("gate_upgrade_failed_total", "reason" => e.label()).increment(1);
            tracing::debug!(%addr, error = %e, "no websocket upgrade");
            return None;
        }
    };
    // Every refusal from here on is a close frame saying why, sent within the write
    // deadline.
    let wait = gate.config.write_timeout;
    let hello = match timeout(gate.config.handshake_timeout, ws.next()).await {
        Ok(Some(Ok(frame))) => frame,
        Ok(Some(Err(e))) => {
            close(&mut ws, &frame_error(&e), wait).await;
            return None;
        }
        Ok(None) => return None,
        Err(_) => {
            close(
                &mut ws,
                &Closing::new(CloseCode::Policy, "handshake timeout"),
                wait,
            )
            .await;
            return None;
        }
    };
    let mut codec = Codec::of(&hello);
    let handshake = match codec.decode(&hello, &gate.schemas) {
        Decoded::Packet(Packet {
            kind: Some(Kind::Handshake(h)),
        }) => h,
        // A handshake with a misspelt field says which, rather than "handshake required".
        Decoded::UnknownField(name) => {
            close(&mut ws, &unknown_field(&name), wait).await;
            return None;
        }
        _ => {
            close(
                &mut ws,
                &Closing::new(CloseCode::Policy, "handshake required"),
                wait,
            )
            .await;
            return None;
        }
    };
    let sid = gate.sessions.next_sid();
    let ack = |code: u32, message: &str| client::HandshakeAck {
        code,
        session_id: sid,
        heartbeat_ms: gate
            .config
            .heartbeat
            .as_millis()
            .try_into()
            .unwrap_or(u32::MAX),
        message: message.into(),
        ..Default::default()
    };
    let identity = match gate.token_check.check(&handshake.token) {
        Ok(identity) => identity,
        Err(e) => {
            metrics::counter!("gate_auth_failures_total", "reason" => e.reason()).increment(1);
            let answer = codec.encode(Kind::HandshakeAck(ack(code::UNAUTHORIZED, &e.to_string())));
            refuse(&mut ws, answer, "unauthorized", wait).await;
            return None;
        }
    };
    // Room for every in-flight answer plus pushes: the router never blocks, and a queue
    // that fills anyway closes the session as too slow.
    let (tx, mut inbox) = inbox::channel(gate.config.max_in_flight + gate.config.outbound_queue);
    gate.sessions.insert(sid, tx);
    let json = matches!(codec, Codec::Json);
    let resumable = handshake.resumable
        && !gate.config.resume_window.is_zero()
        && !matches!(codec, Codec::Pomelo(_));
    let token = resumable
        .then(|| Token::new(&gate.config.gate_id, sid))
        .flatten();
    let mut resume_code = 0;
    let mut arrival = None;
    if token.is_some() && !handshake.resume_token.is_empty() {
        let player = identity.as_ref().map_or("", |i| i.uid.as_str());
        match resume::arrive(gate, sid, &handshake, player, json, &mut inbox).await {
            Ok(arrived) => {
                resume_code = code::OK;
                arrival = Some(arrived);
            }
            Err(refused) => resume_code = refused,
        }
        metrics::counter!("gate_resumes_total", "code" => resume_code.to_string()).increment(1);
    }
    let mut wire = SessionWire::new(&gate.config.gate_id, sid);
    let mut expires = None;
    if let Some(arrived) = &arrival {
        let old = arrived.held.session.clone().unwrap_or_default();
        // The same session: services know it by the identity it started with.
        wire.update(|s| {
            s.gate = old.gate;
            s.sid = old.sid;
            s.uid = old.uid;
            s.data = old.data;
            s.claims = old.claims;
            s.authenticated = old.authenticated;
        });
        let left = Duration::from_millis(arrived.held.expires_in_ms);
        expires = (!left.is_zero()).then(|| Instant::now() + left);
    }
    if let Some(identity) = identity {
        if arrival.is_none() {
            // Bound before the ack: the first request already carries the player, and
            // a push to the player published after the ack reaches it.
            match gate.presence.bind(&identity.uid, sid).await {
                Ok(true) => gate.presence.subscriptions_in_place().await,
                Ok(false) => {}
                Err(e) => {
                    gate.sessions.remove(sid);
                    let answer =
                        codec.encode(Kind::HandshakeAck(ack(bind_refusal(&e), &e.to_string())));
                    refuse(&mut ws, answer, "uid refused", wait).await;
                    return None;
                }
            }
        }
        // A resumed session takes the fresh token's expiry and claims: its player was
        // checked to be the same.
        expires = identity.expires.and_then(instant_of);
        wire.update(|s| {
            s.uid = identity.uid;
            s.claims = identity.claims;
            s.authenticated = true;
        });
    }
    let groups = arrival
        .as_ref()
        .map(|a| a.held.groups.clone())
        .unwrap_or_default();
    let accepted = client::HandshakeAck {
        resume_token: token.as_ref().map(Token::to_string).unwrap_or_default(),
        resume_code,
        last_seq: arrival.as_ref().map_or(0, |a| a.handed.seq),
        ..ack(code::OK, "")
    };
    if !matches!(
        timeout(wait, ws.send(codec.encode(Kind::HandshakeAck(accepted)))).await,
        Ok(Ok(()))
    ) {
        gate.sessions.remove(sid);
        gate.presence.depart(&groups, &wire.get().uid, sid);
        return None;
    }
    metrics::gauge!("gate_sessions").increment(1.0);
    tracing::debug!(sid, %addr, resume_code, "session open");
    // A resumed session's seq goes on from its old gate's: the frames handed over are
    // numbered again, in order, up to it.
    let first_seq = arrival.as_ref().map_or(0, |a| {
        a.handed.seq.saturating_sub(a.handed.frames.len() as u64)
    });
    let resume = token.map(|token| {
        let config = &gate.config;
        let replay = Replay::new(first_seq, config.resume_buffer, config.resume_buffer_bytes);
        Box::new(Resume::new(token, replay))
    });
    let session = Session {
        bucket: TokenBucket::new(gate.config.rate, gate.config.burst),
        gate: gate.clone(),
        sid,
        codec,
        timing: handshake.server_timing,
        serial: handshake.serial,
        serial_pending: None,
        serial_queue: VecDeque::new(),
        wire,
        expires,
        reply_prefix: format!("{}.gw.{}.{sid}.", gate.config.prefix, gate.config.gate_id),
        keyed_seq: Cell::new(0),
        routes: Cache::default(),
        drain: None,
        groups,
        ws: Some(Box::new(ws)),
        outbox: Outbox::new(gate.config.outbound_queue, gate.config.outbound_bytes),
        overflow: false,
        pending: FxHashMap::default(),
        deadlines: VecDeque::new(),
        held: VecDeque::new(),
        lost: VecDeque::new(),
        resends: Vec::new(),
        last_seen: Instant::now(),
        durations: Cache::default(),
        resume,
    };
    Some((session, inbox, arrival))
}

/// Refuses a handshake: its answer, then a close saying why, each within `wait`.
async fn refuse<S: Io>(ws: &mut Ws<S>, answer: Message, reason: &'static str, wait: Duration) {
    let _ = timeout(wait, ws.send(answer)).await;
    close(ws, &Closing::new(CloseCode::Policy, reason), wait).await;
}

/// The kick reason, and close reason, of a session whose signed token expired.
pub(super) const TOKEN_EXPIRED: &str = "token expired";

/// The handshake's answer when the token's player cannot be bound.
fn bind_refusal(e: &BindError) -> u32 {
    match e {
        BindError::Taken => code::CONFLICT,
        BindError::Invalid => code::UNAUTHORIZED,
        BindError::Bus(_) => code::UNAVAILABLE,
    }
}

/// A wall-clock instant (a token's `exp`) on the monotonic clock; one in the past is now,
/// one beyond what the clock can hold is never (`None`).
fn instant_of(at: std::time::SystemTime) -> Option<Instant> {
    let left = at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    Instant::now().checked_add(left)
}

impl<S: Io> Session<S> {
    /// Takes a fresh token for the session's player: its expiry and claims replace the
    /// old ones. A refused token changes nothing; the old one still expires when due.
    pub(super) fn refresh(&mut self, token: &str) -> Result<(), String> {
        let identity = match self.gate.token_check.check(token) {
            Ok(Some(identity)) => identity,
            Ok(None) => return Err("this gate takes no signed player tokens".into()),
            Err(e) => {
                metrics::counter!("gate_auth_failures_total", "reason" => e.reason()).increment(1);
                return Err(e.to_string());
            }
        };
        let session = self.wire.get();
        if !session.authenticated || identity.uid != session.uid {
            return Err(format!(
                "token names {:?}, not this session's player",
                identity.uid
            ));
        }
        self.expires = identity.expires.and_then(instant_of);
        self.wire.update(|s| s.claims = identity.claims);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn expiries_map_onto_the_monotonic_clock_without_overflow() {
        let now = Instant::now();
        let past = instant_of(SystemTime::now() - Duration::from_secs(60)).unwrap();
        assert!(past >= now && past <= Instant::now());
        let soon = instant_of(SystemTime::now() + Duration::from_secs(60)).unwrap();
        assert!(soon > Instant::now() + Duration::from_secs(59));
        // The latest time the wall clock can hold: no panic, and never sooner than soon.
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(i64::MAX as u64);
        assert!(instant_of(far).is_none_or(|at| at > soon));
    }
}
