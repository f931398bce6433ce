//! What the frame loop keeps between a handler's return and what comes of it later:
//! requests whose answer was deferred, and calls to other services in flight
//! (docs/workers.md, "Calling other services"; the handler's side is
//! `crate::context::calls`).
//!
//! - A **deferred request** waits with its reply address, the effects its handler asked
//!   for, and its deadline: when it was received plus the caller's `timeout_ms`, or
//!   `--answer-timeout` when the caller did not say. The first answer is sent; at the
//!   deadline the worker answers 408 itself, exactly once; anything later is dropped and
//!   counted.
//! - A **call** waits with its continuation, the caller's session and its deadline.
//!   Its result comes back into the loop ([`Returned`]), or its deadline passes (408),
//!   and its continuation becomes ready to run: a turn in a frame like a request,
//!   costing [`DEFAULT_COST`](crate::service::DEFAULT_COST). So continuations run in the
//!   order their results arrive, a timeout's when its deadline passes. At most
//!   `--max-calls` are in flight; past it, for a route that names no method, and for a
//!   call nested deeper than [`MAX_CALL_DEPTH`], the continuation is ready at once with
//!   the refusal. Nothing is retried.
//! - A call made for a deferred request that asked for timing (its [`Stem`]'s `origin`)
//!   adds its span to that request's response when its result reaches the loop (a
//!   refusal's takes 0 µs), followed by its callee's spans one hop deeper, while the
//!   request waits: at most [`MAX_CALL_SPANS`], the rest dropped.
//!
//! When the queue ends (a drain), the loop goes on until what is pending then is
//! settled: every deferred request answered (at the latest its 408 at its deadline),
//! every call's continuation run (at the latest with its 408). What is still in flight at
//! the latest of those deadlines (calls made during the wait, by a tick or an event) is
//! dropped with its continuation.

use std::collections::{BTreeSet, HashMap, VecDeque};

use proto::code;
use proto::rpc::{CallSpan, RpcRequest, RpcResponse, Session};
use tokio::time::{Duration, Instant};

use super::micros;
use crate::config::FrameConfig;
use crate::context::{
    Answer, Call, CallResult, Deferred, MAX_CALL_DEPTH, MAX_CALL_SPANS, Stem, Then,
};
use crate::handler_error::HandlerError;
use crate::metrics::CallMetrics;
use crate::names::is_valid_token;

/// A call's result, as it came back to the worker.
#[derive(Debug, Clone)]
pub struct Returned {
    /// The call's id: the last token of its reply subject.
    pub id: u64,
    pub result: CallResult,
}

/// A continuation ready to run: the call's, with its result.
pub(crate) struct Ready {
    pub then: Then,
    pub session: Option<Session>,
    pub deadline: Option<Instant>,
    pub stem: Stem,
    pub result: CallResult,
}

/// A call ready to go out: its id (for the reply subject), and what to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub id: u64,
    pub request: RpcRequest,
}

/// A deferred request, waiting for its answer.
struct Waiting<R> {
    to: R,
    /// What its handler asked for, and its timings.
    response: RpcResponse,
    received: Instant,
    deadline: Instant,
}

/// A call in flight.
struct InFlight {
    route: String,
    then: Then,
    session: Option<Session>,
    /// The caller's deadline, for the continuation.
    caller_deadline: Option<Instant>,
    stem: Stem,
    /// When the call times out.
    deadline: Instant,
    sent: Instant,
}

/// What a deadline is for. Calls sort first: a call made for a deferred request times
/// out at that request's deadline, and its continuation runs before the request's 408,
/// so it may still answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Call(u64),
    Answer(Deferred),
}

/// The loop's deferred requests and calls (see the module docs).
pub(crate) struct Pending<R> {
    deferred: HashMap<Deferred, Waiting<R>>,
    calls: HashMap<u64, InFlight>,
    /// Every deferred request's and call's deadline, earliest first.
    deadlines: BTreeSet<(Instant, Due)>,
    ready: VecDeque<Ready>,
    next_call: u64,
    answer_timeout: Duration,
    call_timeout: Duration,
    call_margin: Duration,
    max_calls: usize,
    metrics: CallMetrics,
}

impl<R> Pending<R> {
    pub fn new(service: &str, config: &FrameConfig) -> Pending<R> {
        Pending {
            deferred: HashMap::new(),
            calls: HashMap::new(),
            deadlines: BTreeSet::new(),
            ready: VecDeque::new(),
            next_call: 1,
            answer_timeout: config.answer_timeout,
            call_timeout: config.call_timeout,
            call_margin: config.call_margin,
            max_calls: config.max_calls.max(1),
            metrics: CallMetrics::new(service),
        }
    }

    /// Keeps a request whose handler deferred its answer: `response` holds what the
    /// handler asked for (its effects) and the request's timings; `deadline` is the
    /// caller's, if it gave one.
    pub fn defer(
        &mut self,
        deferred: Deferred,
        to: R,
        response: RpcResponse,
        received: Instant,
        deadline: Option<Instant>,
    ) {
        let deadline = deadline.unwrap_or(received + self.answer_timeout);
        self.deadlines.insert((deadline, Due::Answer(deferred)));
        let waiting = Waiting {
            to,
            response,
            received,
            deadline,
        };
        self.deferred.insert(deferred, waiting);
    }

    /// The response to send for `answer`, and where; `None` (counted) when its request
    /// is not waiting (answered already, or never deferred).
    pub fn answer(&mut self, answer: Answer) -> Option<(R, RpcResponse)> {
        let Answer {
            deferred,
            result,
            effects,
        } = answer;
        let Some(waiting) = self.deferred.remove(&deferred) else {
            self.metrics.deferred().late.increment(1);
            tracing::debug!(
                ?deferred,
                "an answer to a request no longer waiting is dropped"
            );
            return None;
        };
        self.deadlines
            .remove(&(waiting.deadline, Due::Answer(deferred)));
        let mut response = waiting.response;
        match result {
            Ok(body) => {
                response.body = body;
                response.effects.extend(effects);
            }
            Err(error) => {
                response.code = error.code();
                response.message = error.message().to_owned();
                response.body = Default::default();
                response.effects = Vec::new();
            }
        }
        self.metrics
            .deferred()
            .wait
            .record(waiting.received.elapsed());
        Some((waiting.to, response))
    }

    /// Takes call `call` on: the request to send, or `None` when it is refused at once
    /// (its continuation is then ready with the refusal).
    pub fn start(&mut self, call: Call) -> Option<Outgoing> {
        let Call {
            route,
            options,
            body,
            session,
            deadline: caller_deadline,
            stem,
            then,
            // The loop took it out: it starts the job when the call is taken on.
            job: _,
        } = call;
        let valid = route
            .split_once('.')
            .is_some_and(|(service, method)| is_valid_token(service) && is_valid_token(method));
        let now = Instant::now();
        let deadline = self.call_deadline(now, caller_deadline, options.timeout);
        let left = deadline.saturating_duration_since(now);
        let refused = if !valid {
            Some((
                code::BAD_REQUEST,
                "a call's route is service.method".to_owned(),
            ))
        } else if stem.trace.len() > MAX_CALL_DEPTH {
            let message = format!("calls nested deeper than {MAX_CALL_DEPTH}: a cycle of calls?");
            Some((code::HANDLER_ERROR, message))
        } else if self.calls.len() >= self.max_calls {
            Some((code::UNAVAILABLE, "too many calls in flight".to_owned()))
        } else if left.is_zero() {
            Some((code::TIMEOUT, "call timed out".to_owned()))
        } else {
            None
        };
        if let Some((code, message)) = refused {
            self.metrics.count_call(&route, code);
            let mut result = CallResult::error(code, message);
            self.report(&stem, &route, &mut result, Duration::ZERO);
            self.ready.push_back(Ready {
                then,
                session,
                deadline: caller_deadline,
                stem,
                result,
            });
            return None;
        }
        let id = self.next_call;
        self.next_call += 1;
        let request = RpcRequest {
            route: route.clone(),
            body,
            session: session.clone(),
            key: options.key,
            // Whole milliseconds, rounded up: at least 1, since 0 says "unknown".
            timeout_ms: u32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(u32::MAX),
            timing: stem.timing,
            trace: stem.trace.clone(),
            // Set with the key, where the call is routed (`worker::calls`).
            ..RpcRequest::default()
        };
        self.deadlines.insert((deadline, Due::Call(id)));
        self.calls.insert(
            id,
            InFlight {
                route,
                then,
                session,
                caller_deadline,
                stem,
                deadline,
                sent: now,
            },
        );
        Some(Outgoing { id, request })
    }

    /// When a call made at `now` times out: at `timeout` (`--call-timeout` if none is
    /// asked and the caller has no deadline), and never later than the caller's deadline
    /// less `--call-margin`. A call's result at the caller's deadline itself would come
    /// too late: the caller's caller (a gate) answers 408 then, so the continuation's
    /// answer, its fallback, would reach nobody.
    fn call_deadline(
        &self,
        now: Instant,
        caller_deadline: Option<Instant>,
        timeout: Option<Duration>,
    ) -> Instant {
        let own = timeout.map(|timeout| now + timeout);
        match caller_deadline {
            Some(caller) => {
                let cap = caller.checked_sub(self.call_margin).unwrap_or(now).max(now);
                own.map_or(cap, |own| own.min(cap))
            }
            None => own.unwrap_or(now + self.call_timeout),
        }
    }

    /// Call `id` was not sent: its continuation gets `result` (why).
    pub fn unsent(&mut self, id: u64, result: CallResult) {
        self.finish(id, result);
    }

    /// A call's result came back: its continuation is ready, unless it timed out
    /// already (then the result is dropped).
    pub fn returned(&mut self, returned: Returned) {
        if !self.finish(returned.id, returned.result) {
            tracing::debug!(id = returned.id, "a call's late result is dropped");
        }
    }

    /// Makes call `id`'s continuation ready with `result`; false if it is not in flight.
    fn finish(&mut self, id: u64, mut result: CallResult) -> bool {
        let Some(call) = self.calls.remove(&id) else {
            return false;
        };
        self.deadlines.remove(&(call.deadline, Due::Call(id)));
        let took = call.sent.elapsed();
        self.metrics.count_call(&call.route, result.code);
        self.metrics.call_took(&call.route, took);
        self.report(&call.stem, &call.route, &mut result, took);
        self.ready.push_back(Ready {
            then: call.then,
            session: call.session,
            deadline: call.caller_deadline,
            stem: call.stem,
            result,
        });
        true
    }

    /// Adds a call's span (to `route`, with `result`'s code, after `took`) and then its
    /// callee's spans, taken from `result`, one hop deeper, to the response of the
    /// deferred request the call was made for (`stem.origin`) while it waits; past
    /// [`MAX_CALL_SPANS`] they are dropped.
    fn report(&mut self, stem: &Stem, route: &str, result: &mut CallResult, took: Duration) {
        let Some(waiting) = stem
            .origin
            .and_then(|origin| self.deferred.get_mut(&origin))
        else {
            return;
        };
        let spans = &mut waiting.response.calls;
        let room = MAX_CALL_SPANS.saturating_sub(spans.len());
        if room == 0 {
            return;
        }
        let own = CallSpan {
            route: route.to_owned(),
            code: result.code,
            us: micros(took),
            hop: 1,
        };
        let theirs = std::mem::take(&mut result.calls)
            .into_iter()
            .map(|span| CallSpan {
                hop: span.hop.saturating_add(1),
                ..span
            });
        spans.extend(std::iter::once(own).chain(theirs).take(room));
    }

    /// The next continuation ready to run.
    pub fn next_ready(&mut self) -> Option<Ready> {
        self.ready.pop_front()
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The earliest deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(at, _)| at)
    }

    /// Everything whose deadline has passed: calls' continuations made ready with 408,
    /// and deferred requests' 408s to send (counted), but none while a continuation is
    /// ready: it may answer them yet (the loop comes back once it has run).
    pub fn expire(&mut self) -> Vec<(R, RpcResponse)> {
        let now = Instant::now();
        let mut answers = Vec::new();
        while let Some(&(at, due)) = self.deadlines.first() {
            if at > now {
                break;
            }
            match due {
                Due::Answer(_) if !self.ready.is_empty() => break,
                Due::Answer(deferred) => {
                    self.metrics.deferred().expired.increment(1);
                    let answer = Answer {
                        deferred,
                        result: Err(HandlerError::with_code(code::TIMEOUT, "no answer in time")),
                        effects: Vec::new(),
                    };
                    answers.extend(self.answer(answer));
                }
                Due::Call(id) => {
                    self.finish(id, CallResult::error(code::TIMEOUT, "call timed out"));
                }
            }
            // Both remove the deadline; this is for one whose entry went already.
            self.deadlines.remove(&(at, due));
        }
        answers
    }

    /// Nothing waits: no deferred request, no call in flight, no continuation ready.
    pub fn is_idle(&self) -> bool {
        self.deferred.is_empty() && self.calls.is_empty() && self.ready.is_empty()
    }

    /// The queue has ended: until when the loop waits for what is pending now (the
    /// latest deadline; now, when nothing is).
    pub fn drained_by(&self) -> Instant {
        if !self.is_idle() {
            tracing::info!(
                deferred = self.deferred.len(),
                calls = self.calls.len() + self.ready.len(),
                "the queue is done: waiting for deferred requests and calls, each until its deadline at most"
            );
        }
        self.deadlines
            .last()
            .map_or_else(Instant::now, |&(at, _)| at)
    }

    /// The loop stops, at the end of a drain: calls still in flight (made during the
    /// drain's wait, by a tick or an event) are dropped with their continuations. No
    /// deferred request is left: each was answered by its deadline, which the drain
    /// waited for.
    pub fn shut(&mut self) {
        debug_assert!(
            self.deferred.is_empty(),
            "a drain outlived a deferred request"
        );
        if !self.calls.is_empty() || !self.ready.is_empty() {
            tracing::info!(
                calls = self.calls.len() + self.ready.len(),
                "the loop stops: continuations of calls made during the drain are dropped"
            );
        }
        self.calls.clear();
        self.ready.clear();
        self.deadlines.clear();
    }
}
