//! A session's deadlines behind one timer: the heartbeat, the write deadline, request
//! timeouts, held and lost requests, resends, the token's expiry, the drain's end and
//! the resume window. Each is an instant the session already keeps; the one timer is
//! set to the earliest. A tokio `Sleep` is over a hundred bytes in the session's task
//! and an entry in the runtime's wheel, and a session had nine, armed or not.

use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::closing::{Closing, too_slow};
use super::opening::TOKEN_EXPIRED;
use super::{Io, Session};
use proto::client::{self, packet::Kind};

/// The deadlines checked lazily: moving them would reset the timer on every frame, so
/// they move only when checked.
pub(super) struct Checks {
    /// When the client's silence is next checked (a frame only moves `last_seen`).
    pub silence: Instant,
    /// When the token's expiry is next checked (a `Refresh` only moves `expires`).
    pub token: Instant,
    /// When the write deadline is next checked, while output waits for the socket.
    pub write: Option<Instant>,
}

impl<S: Io> Session<S> {
    /// The checks of a session about to be served.
    pub(super) fn checks(&self) -> Checks {
        Checks {
            silence: self.last_seen + 2 * self.heartbeat(),
            token: self.expires.unwrap_or_else(Instant::now),
            write: None,
        }
    }

    /// The client's heartbeat interval, as its codec has it.
    pub(super) fn heartbeat(&self) -> std::time::Duration {
        self.codec.heartbeat(self.gate.config.heartbeat)
    }

    /// While detached: when the resume window (or a hand-over) ends.
    fn detached_end(&self) -> Option<Instant> {
        let r = self.resume.as_ref()?;
        let until = r.detached_until?;
        Some(r.handing.as_ref().map_or(until, |h| h.until))
    }

    /// Arms the write deadline when output starts waiting, and disarms it once all is
    /// written.
    pub(super) fn arm_write(&self, checks: &mut Checks) {
        match self.outbox.waiting_since() {
            Some(since) if checks.write.is_none() => {
                checks.write = Some(since + self.gate.config.write_timeout);
            }
            None => checks.write = None,
            Some(_) => {}
        }
    }

    /// The earliest deadline armed now, if any.
    pub(super) fn next_due(&self, checks: &Checks) -> Option<Instant> {
        let attached = self.attached();
        let front = |q: &std::collections::VecDeque<(Instant, u64)>| q.front().map(|&(at, _)| at);
        [
            attached.then_some(checks.silence),
            checks.write.filter(|_| attached),
            self.expires.map(|_| checks.token),
            self.drain.map(|d| d.ends),
            self.detached_end().filter(|_| !attached),
            front(&self.deadlines),
            front(&self.held),
            front(&self.lost),
            self.resends.iter().map(|&(at, _)| at).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Does what is due at `now`; `Some` when the session must close.
    pub(super) fn on_due(&mut self, checks: &mut Checks, now: Instant) -> Option<Closing> {
        let attached = self.attached();
        if !attached && self.detached_end().is_some_and(|end| end <= now) {
            if self.resume.as_ref().is_some_and(|r| r.handing.is_some()) {
                return Some(self.hand_over());
            }
            return Some(Closing::new(CloseCode::Away, "resume window passed"));
        }
        if attached && checks.write.is_some_and(|at| at <= now) {
            let write_timeout = self.gate.config.write_timeout;
            match self.outbox.waiting_since() {
                Some(since) if since + write_timeout <= now => return Some(too_slow()),
                since => checks.write = since.map(|since| since + write_timeout),
            }
        }
        let due = |q: &std::collections::VecDeque<(Instant, u64)>| {
            q.front().is_some_and(|&(at, _)| at <= now)
        };
        if due(&self.deadlines) {
            self.expire();
        }
        if due(&self.held) {
            self.end_holds();
        }
        if due(&self.lost) {
            self.end_lost_waits();
        }
        if self.resends.iter().any(|&(at, _)| at <= now) {
            self.resend_due();
        }
        if attached && checks.silence <= now {
            let due = self.last_seen + 2 * self.heartbeat();
            if due <= now {
                return Some(Closing::lost(CloseCode::Policy, "heartbeat missed"));
            }
            checks.silence = due;
        }
        if self.drain.is_some_and(|d| d.ends <= now) {
            return Some(self.end_drain());
        }
        if self.expires.is_some() && checks.token <= now {
            match self.expires {
                Some(due) if due > now => checks.token = due,
                _ => {
                    self.send(Kind::Kick(client::Kick {
                        reason: TOKEN_EXPIRED.into(),
                    }));
                    return Some(Closing::new(CloseCode::Policy, TOKEN_EXPIRED));
                }
            }
        }
        None
    }
}
