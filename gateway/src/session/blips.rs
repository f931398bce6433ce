//! Bus blips are a delay, not an error: what a session does with a request the bus could
//! not take, or that reached no worker.
//!
//! - **Held**: a request that arrives while the gate's bus connection is down waits for
//!   it (`--bus-hold`, never past the request's own timeout, within the gate's
//!   `--max-held` and `--max-held-bytes`) and goes out, in order, once the connection is
//!   back; past the window or the bounds it is answered 503 `bus unavailable`, as
//!   before.
//! - **Sent again**: a request the bus answered "no responders" (no worker of a service
//!   that has workers was subscribed at that instant: one restarting, re-subscribing
//!   after a reconnect, or moving) is sent again after `--resend-backoff`, doubling up
//!   to [`MAX_RESEND_BACKOFF`], while its timeout leaves room for an answer; then 503
//!   `no worker available now`, as before.
//!
//! - **Answered through the next connection**: a request written to a connection that
//!   was then lost may have reached a worker that lives on (on another server of a
//!   cluster, or reconnecting itself); its answer goes to the gate's reply subject,
//!   which the next connection subscribes again. It waits for it `--bus-lost-wait`,
//!   then is answered 503 `bus connection lost` (its 408 if its timeout comes first).
//!
//! Only what provably reached no worker is ever sent again, so a request is executed at
//! most once: one written to a connection that was then lost never is.

use bus::{BusError, Reply};
use tokio::time::Instant;

use super::{Io, Pending, Session};
use crate::config::MAX_RESEND_BACKOFF;
use crate::forward::Request;

/// The answer to a request the gate could not send.
pub(super) const BUS_UNAVAILABLE: &str = "bus unavailable";
/// The answer to a request written to a bus connection that was then lost, and whose
/// answer did not come through the next one in time.
const BUS_CONNECTION_LOST: &str = "bus connection lost";

impl<S: Io> Session<S> {
    /// Publishes request `id` as `pending` describes it; id 0 is a notify, with no
    /// reply subject. The request says how long the gate still waits for its answer.
    pub(super) fn publish(&self, id: u64, pending: &Pending) -> Result<(), BusError> {
        let timeout_ms = if id == 0 {
            0
        } else {
            let deadline = pending.received + self.gate.config.request_timeout;
            let left = deadline.saturating_duration_since(Instant::now());
            // At least 1: 0 would say "unknown".
            u32::try_from(left.as_millis()).unwrap_or(u32::MAX).max(1)
        };
        let request = Request {
            route: &pending.route,
            body: pending.body.as_deref().unwrap_or_default(),
            session: &self.wire,
            timing: self.timing,
            key: &pending.key,
            timeout_ms,
            origin: "",
            seq: 0,
        };
        let request = if pending.key.is_empty() {
            request
        } else {
            // A keyed request's place among the session's (docs/workers.md, "Hand-over"):
            // the session publishes one at a time, so the numbers rise in publish order.
            let seq = self.keyed_seq.get() + 1;
            self.keyed_seq.set(seq);
            Request {
                origin: self.reply_prefix.trim_end_matches('.'),
                seq,
                ..request
            }
        };
        let reply = if id == 0 {
            Reply::None
        } else {
            Reply::Request {
                prefix: &self.reply_prefix,
                id,
            }
        };
        self.gate
            .bus
            .publish(&pending.subject, reply, request.len(), |buf| {
                request.put(buf)
            })
    }

    /// The refusal counter for a publish the bus refused.
    pub(super) fn bus_refused(&self, e: BusError) -> &metrics::Counter {
        match e {
            BusError::Disconnected => &self.gate.rejected.bus,
            BusError::Backlogged => &self.gate.rejected.bus_backlog,
        }
    }

    /// Holds request `id` (a body of `bytes`) until the bus is back, if holding is on and
    /// the gate has room.
    pub(super) fn hold(&mut self, id: u64, bytes: usize) -> bool {
        let window = self.gate.config.bus_hold;
        if window.is_zero() || !self.gate.held.take(bytes) {
            return false;
        }
        metrics::counter!("gate_requests_held_total").increment(1);
        self.held.push_back((Instant::now() + window, id));
        true
    }

    /// The bus is back: held requests go out, in the order they came.
    pub(super) fn send_held(&mut self) {
        while let Some((until, id)) = self.held.pop_front() {
            let Some(pending) = self.pending.get(&id) else {
                continue; // answered meanwhile (its timeout)
            };
            match self.publish(id, pending) {
                Ok(()) => {
                    self.gate.held.give_back(pending.body_len());
                    if let Some(pending) = self.pending.get_mut(&id) {
                        pending.mark_sent();
                    }
                }
                Err(BusError::Disconnected) => {
                    // Lost again already: it keeps its place and its window.
                    self.held.push_front((until, id));
                    return;
                }
                Err(e @ BusError::Backlogged) => {
                    self.bus_refused(e).increment(1);
                    if let Some(pending) = self.pending.remove(&id) {
                        self.answer_unavailable(id, &pending, "gate overloaded");
                    }
                }
            }
        }
    }

    /// Answers 503 the held requests whose window has passed.
    pub(super) fn end_holds(&mut self) {
        let now = Instant::now();
        while let Some(&(until, id)) = self.held.front() {
            if until > now {
                break;
            }
            self.held.pop_front();
            if let Some(pending) = self.pending.remove(&id) {
                self.gate.rejected.bus.increment(1);
                self.answer_unavailable(id, &pending, BUS_UNAVAILABLE);
            }
        }
    }

    /// The bus connection was lost. What was written on it may have reached a worker: it
    /// is never sent again (at most once), but its worker may live on (on another server
    /// of a cluster, or reconnecting itself) and answer the gate's reply subject, which
    /// the next connection subscribes again: it waits for that answer `--bus-lost-wait`,
    /// then is answered 503 (its 408 if its timeout comes first). What waits to be sent
    /// again after "no responders" reached no worker: it stays to be sent (held if the
    /// bus is still away). Held requests were never written: they wait for the bus.
    pub(super) fn bus_lost(&mut self) {
        let mut ids: Vec<(Instant, u64)> = (self.pending.iter())
            .filter(|&(&id, p)| {
                p.sent
                    && !self.resends.iter().any(|&(_, r)| r == id)
                    && !self.lost.iter().any(|&(_, l)| l == id)
            })
            .map(|(&id, p)| (p.received, id))
            .collect();
        // In the order they came, so the 503s too.
        ids.sort_unstable();
        let until = Instant::now() + self.gate.config.bus_lost_wait;
        self.lost.extend(ids.into_iter().map(|(_, id)| (until, id)));
        // With no wait, at once.
        self.end_lost_waits();
    }

    /// Answers 503 the requests of a lost connection whose wait for an answer through
    /// the next one has passed.
    pub(super) fn end_lost_waits(&mut self) {
        let now = Instant::now();
        while let Some(&(until, id)) = self.lost.front() {
            if until > now {
                break;
            }
            self.lost.pop_front();
            // Only the request that was in flight at the loss: once it is answered, a
            // request sent later under the same id is a new one.
            let lost_at = until - self.gate.config.bus_lost_wait;
            if self.pending.get(&id).is_some_and(|p| p.received <= lost_at)
                && let Some(pending) = self.pending.remove(&id)
            {
                self.answer_unavailable(id, &pending, BUS_CONNECTION_LOST);
            }
        }
    }

    /// The bus found no worker for request `id`: schedules it to be sent again, if
    /// re-sending is on, its service has workers (one never served is a 404 at once) and
    /// its timeout leaves room for the wait and an answer after it. False when it is to
    /// be answered now.
    pub(super) fn resend_later(&mut self, id: u64) -> bool {
        let first = self.gate.config.resend_backoff;
        let timeout = self.gate.config.request_timeout;
        let Some(pending) = self.pending.get_mut(&id) else {
            return false;
        };
        if first.is_zero()
            || pending.body.is_none()
            || !self.gate.schemas.knows_service_of(&pending.route)
        {
            return false;
        }
        let wait = first
            .saturating_mul(1 << pending.resends.min(16))
            .min(MAX_RESEND_BACKOFF);
        let mut at = Instant::now() + wait;
        // Room for the wait, and as long again for the worker to answer.
        if at + wait > pending.received + timeout {
            return false;
        }
        pending.resends += 1;
        if !pending.key.is_empty() {
            // Not before one of its partition's sent earlier (see `wait_behind`).
            let subject = pending.subject.clone();
            at = at.max(self.last_resend_of(&subject).unwrap_or(at));
        }
        self.resends.push((at, id));
        true
    }

    /// When the last request waiting to be sent again on `subject` is due.
    fn last_resend_of(&self, subject: &str) -> Option<Instant> {
        self.resends
            .iter()
            .rev()
            .find(|(_, id)| self.pending.get(id).is_some_and(|p| &*p.subject == subject))
            .map(|&(at, _)| at)
    }

    /// A keyed request whose partition has requests of this session waiting to be sent
    /// again (it had no worker a moment ago: a hand-over) waits behind them, unsent, and
    /// goes with them in the order they came: a partition's requests from one session
    /// keep their order across a hand-over. Returns whether it waits. (One already sent
    /// when the first came back "no responders" may still reach the new owner first:
    /// the window is one round trip to the bus.)
    pub(super) fn wait_behind(&mut self, id: u64, subject: &str) -> bool {
        let Some(at) = self.last_resend_of(subject) else {
            return false;
        };
        self.resends.push((at, id));
        true
    }

    /// Sends again the requests whose wait after "no responders" is over.
    pub(super) fn resend_due(&mut self) {
        let now = Instant::now();
        let due: Vec<u64> = self
            .resends
            .iter()
            .filter(|&&(at, _)| at <= now)
            .map(|&(_, id)| id)
            .collect();
        self.resends.retain(|&(at, _)| at > now);
        for id in due {
            let Some(pending) = self.pending.get(&id) else {
                continue;
            };
            match self.publish(id, pending) {
                Ok(()) => metrics::counter!("gate_requests_resent_total").increment(1),
                // The bus went away meanwhile: not sent this time either, so it may wait
                // for the bus like a new request.
                Err(BusError::Disconnected) if self.hold_again(id) => {}
                Err(e) => {
                    self.bus_refused(e).increment(1);
                    if let Some(pending) = self.pending.remove(&id) {
                        self.answer_unavailable(id, &pending, BUS_UNAVAILABLE);
                    }
                }
            }
        }
    }

    /// Holds request `id`, which reached no worker before, until the bus is back.
    fn hold_again(&mut self, id: u64) -> bool {
        let Some(bytes) = self.pending.get(&id).map(Pending::body_len) else {
            return false;
        };
        if !self.hold(id, bytes) {
            return false;
        }
        if let Some(pending) = self.pending.get_mut(&id) {
            pending.sent = false;
        }
        true
    }
}
