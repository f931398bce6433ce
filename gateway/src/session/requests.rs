//! A session's requests: the checks that refuse one at once (route, duplicate id,
//! in-flight limits, drain, rate, the gate-wide budget), forwarding the rest to the bus,
//! serial routes one at a time, and answering each exactly once: with the worker's reply,
//! a 408 at its deadline, or a 503 when no reply can come.

use std::sync::Arc;
use std::time::Duration;

use proto::client::{self, packet::Kind};
use proto::code;
use proto::rpc::CallSpan;
use tokio::time::Instant;

use bus::BusError;
use proto::keyed::{key_of, partition_of, partition_subject};

use super::blips::BUS_UNAVAILABLE;
use super::{Closing, Io, Pending, Session};
use crate::route;

fn micros(d: Duration) -> u32 {
    d.as_micros().try_into().unwrap_or(u32::MAX)
}

/// A call the worker made for a request, as the client's timing shows it.
pub(super) fn call_timing(span: CallSpan) -> client::CallTiming {
    client::CallTiming {
        route: span.route,
        code: span.code,
        us: span.us,
        hop: span.hop,
    }
}

impl<S: Io> Session<S> {
    pub(super) fn is_serial(&self, req: &client::Request) -> bool {
        self.serial || self.gate.config.serial_routes.contains(&req.route)
    }

    /// Holds a serial request until the one before it is answered.
    pub(super) fn queue_serial(&mut self, req: client::Request) -> Result<(), Closing> {
        if self.pending.len() + self.serial_queue.len() >= self.gate.config.max_in_flight {
            self.gate.rejected.in_flight.increment(1);
            let resp = client::Response {
                id: req.id,
                code: code::TOO_MANY_REQUESTS,
                message: "too many requests in flight".into(),
                ..Default::default()
            };
            self.send(Kind::Response(resp));
        } else {
            self.serial_queue.push_back(req);
        }
        Ok(())
    }

    /// Forwards a request, or answers it at once when the gate refuses it.
    pub(super) fn forward(&mut self, req: client::Request, received: Instant) {
        let id = req.id;
        if let Some(resp) = self.on_request(req, received) {
            self.send(Kind::Response(resp));
            self.answered(id);
        }
    }

    /// Called once request `id` has its answer: lets the next serial request go.
    pub(super) fn answered(&mut self, id: u64) {
        if self.serial_pending != Some(id) {
            return;
        }
        self.serial_pending = None;
        self.next_serial();
    }

    /// Forwards the next queued serial request, none being in flight.
    pub(super) fn next_serial(&mut self) {
        // A queued request the gate refuses at once is answered here, and the next goes.
        while self.serial_pending.is_none() {
            let Some(next) = self.serial_queue.pop_front() else {
                break;
            };
            let next_id = next.id;
            self.serial_pending = Some(next_id);
            if let Some(resp) = self.on_request(next, Instant::now()) {
                self.send(Kind::Response(resp));
                self.serial_pending = None;
            }
        }
    }

    /// Forwards a request; returns the answer when the gate answers it itself.
    fn on_request(&mut self, req: client::Request, received: Instant) -> Option<client::Response> {
        let notify = req.id == 0;
        let reject = |code: u32, message: &str, reason: &metrics::Counter| {
            reason.increment(1);
            (!notify).then(|| client::Response {
                id: req.id,
                code,
                message: message.into(),
                ..Default::default()
            })
        };
        let (service, method) = match route::parse(&req.route) {
            Ok(parsed) => parsed,
            Err(e) => {
                return reject(code::BAD_REQUEST, &e.to_string(), &self.gate.rejected.route);
            }
        };
        let keyed = match self.gate.schemas.keyed(service) {
            None => None,
            Some(keyed) => match key_of(&req.key, &keyed.session_key, Some(self.wire.get())) {
                Ok(key) => {
                    let partition = partition_of(key.as_bytes(), keyed.partitions);
                    let prefix = &self.gate.config.prefix;
                    let subject = partition_subject(prefix, service, partition) + "." + method;
                    Some((Arc::<str>::from(subject), key.to_owned()))
                }
                Err(error) => {
                    let message = error.to_string();
                    return reject(code::BAD_REQUEST, &message, &self.gate.rejected.route);
                }
            },
        };
        if !notify && self.pending.contains_key(&req.id) {
            return reject(
                code::BAD_REQUEST,
                "request id already in flight",
                &self.gate.rejected.duplicate_id,
            );
        }
        if !notify && self.pending.len() >= self.gate.config.max_in_flight {
            return reject(
                code::TOO_MANY_REQUESTS,
                "too many requests in flight",
                &self.gate.rejected.in_flight,
            );
        }
        if self.drain.is_some_and(|d| received >= d.forward_until) {
            return reject(
                code::UNAVAILABLE,
                code::GATE_DRAINING,
                &self.gate.rejected.draining,
            );
        }
        if !self.bucket.take(received) {
            return reject(
                code::TOO_MANY_REQUESTS,
                "rate limited",
                &self.gate.rejected.rate,
            );
        }
        if !notify && !self.gate.in_flight.take(self.pending.len()) {
            return reject(
                code::UNAVAILABLE,
                "gate overloaded",
                &self.gate.rejected.gate_in_flight,
            );
        }
        let prefix = &self.gate.config.prefix;
        let (route, subject) = self.routes.get(
            |r| **r == *req.route,
            || {
                let route: Arc<str> = req.route.as_str().into();
                let subject: Arc<str> = format!("{prefix}.svc.{route}").into();
                (route.clone(), (route, subject))
            },
        );
        let (subject, key) = match keyed {
            Some((subject, key)) => (subject, key),
            None => (subject, String::new()),
        };
        let mut pending = Pending {
            received,
            route,
            subject,
            body: Some(req.body),
            key,
            sent: false,
            resends: 0,
        };
        if notify {
            // Nothing answers a notify: a refusal is only counted.
            if let Err(e) = self.publish(req.id, &pending) {
                self.bus_refused(e).increment(1);
            }
            return None;
        }
        let waits = !pending.key.is_empty() && {
            let subject = pending.subject.clone();
            self.wait_behind(req.id, &subject)
        };
        match self.publish_unless(waits, req.id, &pending) {
            // Waiting counts as sent: it is never held for the bus, and a timeout
            // answers 408.
            Ok(()) if waits => pending.sent = true,
            Ok(()) => pending.mark_sent(),
            Err(BusError::Disconnected) if self.hold(req.id, pending.body_len()) => {}
            Err(e) => {
                self.gate.in_flight.give_back(1);
                let message = match e {
                    BusError::Disconnected => BUS_UNAVAILABLE,
                    BusError::Backlogged => "gate overloaded",
                };
                return reject(code::UNAVAILABLE, message, self.bus_refused(e));
            }
        }
        self.pending.insert(req.id, pending);
        self.deadlines
            .push_back((received + self.gate.config.request_timeout, req.id));
        None
    }

    /// Publishes request `id` unless it `waits` behind others (see `wait_behind`).
    fn publish_unless(&self, waits: bool, id: u64, pending: &Pending) -> Result<(), BusError> {
        if waits {
            return Ok(());
        }
        self.publish(id, pending)
    }

    /// Answers a forwarded request and records its round trip. `worker` is the worker's
    /// part of the timing (its `queue_us`, `handler_us` and calls): the client gets it,
    /// with the gate's `total_us`, when it asked for timing.
    pub(super) fn answer(
        &mut self,
        mut resp: client::Response,
        pending: &Pending,
        worker: client::Timing,
    ) {
        let elapsed = pending.received.elapsed();
        self.gate.in_flight.give_back(1);
        if !pending.sent {
            self.gate.held.give_back(pending.body_len());
        }
        // A client cannot mint series: a route nobody serves is `unknown`, and past
        // MAX_ROUTE_LABELS distinct routes the rest are `other` (see `labels`).
        let route: &str = if resp.code == code::NOT_FOUND {
            "unknown"
        } else {
            &pending.route
        };
        let code = resp.code;
        let labels = &self.gate.route_labels;
        self.durations
            .get(
                |(r, c)| **r == *route && *c == code,
                || {
                    let label = labels.label(route);
                    let h = metrics::histogram!("gate_request_duration_seconds", "route" => label, "code" => code.to_string());
                    ((route.into(), code), h)
                },
            )
            .record(elapsed.as_secs_f64());
        if self.timing {
            resp.timing = Some(client::Timing {
                total_us: micros(elapsed),
                ..worker
            });
        }
        resp.seq = self.next_seq();
        let id = resp.id;
        let frame = self
            .codec
            .encode_response(resp, &pending.route, &self.gate.schemas);
        if self.resume.is_some() {
            self.keep(&frame, id);
        }
        self.put(frame, false);
    }

    /// Answers 408 for every request whose deadline passed.
    pub(super) fn expire(&mut self) {
        let now = Instant::now();
        while let Some(&(deadline, id)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            if let Some(pending) = self.pending.remove(&id) {
                if !pending.sent {
                    // Never sent: the client may send it again, anywhere.
                    self.gate.rejected.bus.increment(1);
                    self.answer_unavailable(id, &pending, BUS_UNAVAILABLE);
                    continue;
                }
                metrics::counter!("gate_timeouts_total").increment(1);
                let resp = client::Response {
                    id,
                    code: code::TIMEOUT,
                    message: code::GATE_TIMEOUT.into(),
                    ..Default::default()
                };
                self.answer(resp, &pending, client::Timing::default());
                self.answered(id);
            }
        }
    }

    /// Answers 503 with `message` every request still awaiting its worker that `which`
    /// picks: no reply will come for it (the bus connection is gone, or the gate is).
    pub(super) fn answer_pending(&mut self, message: &str, which: impl Fn(&Pending) -> bool) {
        let ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| which(p))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            if let Some(pending) = self.pending.remove(&id) {
                self.answer_unavailable(id, &pending, message);
            }
        }
    }

    /// Answers request `id` 503 with `message`.
    pub(super) fn answer_unavailable(&mut self, id: u64, pending: &Pending, message: &str) {
        let resp = client::Response {
            id,
            code: code::UNAVAILABLE,
            message: message.into(),
            ..Default::default()
        };
        self.answer(resp, pending, client::Timing::default());
        self.answered(id);
    }
}
