//! Deferred answers and calls to other services, as a handler asks for them
//! (docs/workers.md, "Calling other services").
//!
//! Handlers stay synchronous (see "Why handlers are synchronous" on [`Service`]): a
//! handler that needs another service's answer before it can answer its own request
//! *defers* it ([`Context::defer`]), *calls* the other service ([`Context::call`]) with
//! a continuation, and returns. The continuation runs later in the same frame loop,
//! one more turn among the service's requests, events and ticks, and answers the
//! deferred request ([`Context::answer`]) or calls again.
//!
//! The context only records what was asked; the frame loop acts on it once the handler
//! has returned (`frame_loop::pending`): a failed or panicking handler's deferral,
//! answers and calls are dropped with its effects, so a request either succeeds with
//! everything it asked for or changes nothing.
//!
//! A call carries what it stems from ([`Stem`]): its trace, the routes of the requests
//! it was made for (at most [`MAX_CALL_DEPTH`]), and their `timing` flag; a request that
//! asked for timing and was deferred gets its calls' spans (at most [`MAX_CALL_SPANS`]).
//!
//! [`Service`]: crate::Service

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use proto::Message;
use proto::code;
use proto::rpc::{CallSpan, Effect, Session};
use tokio::time::Instant;

use super::Context;
use crate::handler_error::HandlerError;

/// The most routes a call's trace may hold: a call that would carry more is refused at
/// once (500), which ends a cycle of calls (a → b → a → ...).
pub const MAX_CALL_DEPTH: usize = 8;

/// The most call spans one response carries (`RpcResponse.calls`): those past it are
/// dropped. They are only timing: the calls themselves are made and answered as ever.
pub const MAX_CALL_SPANS: usize = 32;

/// A request whose answer its handler deferred ([`Context::defer`]): what
/// [`Context::answer`] takes to answer it later. Unique within the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deferred(u64);

/// The ids of deferred requests: one counter for the process, so that a handle taken
/// to another service's loop names nothing there.
static NEXT_DEFERRED: AtomicU64 = AtomicU64::new(1);

/// What a call to another service came back with: the callee's answer, or the
/// worker's own when there was none (see docs/workers.md for every code).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallResult {
    /// The callee's status code (200 when handled), or 503 (no worker of the service,
    /// too many calls in flight), 408 (the call timed out), 400 (a malformed route) or
    /// 500 (calls nested deeper than [`MAX_CALL_DEPTH`]).
    pub code: u32,
    pub body: Bytes,
    pub message: String,
    /// The calls the callee made for the call, when it was timed (its `RpcResponse.calls`).
    pub(crate) calls: Vec<CallSpan>,
}

impl CallResult {
    /// A result the worker makes itself, with no answer from the callee.
    pub(crate) fn error(code: u32, message: impl Into<String>) -> CallResult {
        CallResult {
            code,
            body: Bytes::new(),
            message: message.into(),
            calls: Vec::new(),
        }
    }

    /// The result of a call the bus would not take.
    pub(crate) fn bus_unavailable() -> CallResult {
        CallResult::error(code::UNAVAILABLE, "bus unavailable")
    }

    /// Whether the callee handled the call (200).
    pub fn is_ok(&self) -> bool {
        self.code == code::OK
    }

    /// The body of a 200; anything else as an error with the same code and message, so
    /// a continuation can answer a deferred request with the callee's failure as it is.
    pub fn into_result(self) -> Result<Bytes, HandlerError> {
        if self.is_ok() {
            Ok(self.body)
        } else {
            Err(HandlerError::with_code(self.code, self.message))
        }
    }

    /// The body of a 200 decoded as `T`; a failure as in [`CallResult::into_result`], a
    /// body that does not decode as a 500.
    pub fn decode<T: Message + Default>(self) -> Result<T, HandlerError> {
        let body = self.into_result()?;
        T::decode(body).map_err(|e| HandlerError::new(format!("bad answer from a call: {e}")))
    }
}

/// How a call is made, beyond its route and body ([`Context::call_with_options`]); the
/// TypeScript library's `CallOptions` has the same two.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// The key to route a call to a keyed service by, first of all (else the session
    /// value the service names, else the uid); empty: none. Ignored for other services.
    pub key: String,
    /// The most the call waits for its answer (then 408 `call timed out`), for a handler
    /// that must still answer its own request with a fallback. Never past the caller's
    /// deadline less the worker's `--call-margin`, whatever is asked; `None`: until then
    /// (`--call-timeout` for a call made without a deadline).
    pub timeout: Option<Duration>,
}

impl CallOptions {
    /// Routes the call to a keyed service by `key`.
    pub fn key(mut self, key: impl Into<String>) -> CallOptions {
        self.key = key.into();
        self
    }

    /// Waits at most `timeout` for the answer.
    pub fn timeout(mut self, timeout: Duration) -> CallOptions {
        self.timeout = Some(timeout);
        self
    }
}

/// A call's continuation.
pub(crate) type Then = Box<dyn FnOnce(&mut Context, CallResult) + Send>;

/// Work done off the frame loop in place of a call on the bus (a store's write or
/// load, [`Context::wait_on`]): started when the call is taken on, in the order
/// handlers asked, so a store sees its writes in that order.
pub(crate) type Job = Box<dyn FnOnce() -> BoxFuture<'static, CallResult> + Send>;

/// An answer to a deferred request, with the effects that travel with it.
#[derive(Debug)]
pub(crate) struct Answer {
    pub deferred: Deferred,
    pub result: Result<Bytes, HandlerError>,
    pub effects: Vec<Effect>,
}

/// What a call carries of the request it was made for, to its callee and on to its
/// continuation, whose own calls carry the same (docs/workers.md, "Trace and timing").
#[derive(Debug, Clone, Default)]
pub(crate) struct Stem {
    /// The call's trace: the routes of the requests it was made for, outermost first
    /// (empty for a call made from a tick or an event).
    pub trace: Vec<String>,
    /// Whether the request asked for timing.
    pub timing: bool,
    /// The deferred request whose response gets the call's span: set when it asked for
    /// timing and its handler deferred it.
    pub origin: Option<Deferred>,
}

/// A call to make once the handler has returned.
pub(crate) struct Call {
    /// `service.method`, as the handler gave it (checked when it goes out).
    pub route: String,
    /// The key to route a keyed service's call by, and the call's own timeout.
    pub options: CallOptions,
    pub body: Bytes,
    /// The caller's session, for the callee and for the continuation.
    pub session: Option<Session>,
    /// The caller's deadline, if it has one.
    pub deadline: Option<Instant>,
    pub stem: Stem,
    pub then: Then,
    /// Set for work done in process ([`Context::wait_on`]): the call is not sent on
    /// the bus, the job's result comes back as its answer.
    pub job: Option<Job>,
}

/// Everything a handler asked for that acts beyond its own return: see the module docs.
#[derive(Default)]
pub(crate) struct Later {
    /// Set when the handler deferred its answer.
    pub deferred: Option<Deferred>,
    /// The deadline of the request being handled, when its caller gave one.
    pub deadline: Option<Instant>,
    /// The route of the request being handled; empty outside a request.
    pub route: String,
    /// What calls made here carry: the request's, with its trace and without its own
    /// route (see [`Later::call_stem`]); in a continuation, its call's.
    pub stem: Stem,
    /// Answers to deferred requests, in the order given.
    pub answers: Vec<Answer>,
    /// Calls to make, in the order asked.
    pub calls: Vec<Call>,
    /// A keyed service's partitions this handler changed, for their standbys.
    pub changed: Vec<u32>,
}

impl fmt::Debug for Later {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes: Vec<&str> = self.calls.iter().map(|c| c.route.as_str()).collect();
        f.debug_struct("Later")
            .field("deferred", &self.deferred)
            .field("deadline", &self.deadline)
            .field("route", &self.route)
            .field("stem", &self.stem)
            .field("answers", &self.answers)
            .field("calls", &routes)
            .field("changed", &self.changed)
            .finish()
    }
}

impl Later {
    /// What a call made here carries: the stem, with the route being served (if any)
    /// added to its trace.
    fn call_stem(&self) -> Stem {
        let own = (!self.route.is_empty()).then_some(&self.route);
        Stem {
            trace: self.stem.trace.iter().chain(own).cloned().collect(),
            timing: self.stem.timing,
            origin: self.stem.origin,
        }
    }

    /// The calls made for `deferred`, a request that asked for timing, report their
    /// spans to its response.
    pub fn time_calls_for(&mut self, deferred: Deferred) {
        for call in &mut self.calls {
            if call.stem.timing {
                call.stem.origin = Some(deferred);
            }
        }
    }
}

impl Context {
    /// Defers the answer to the request being handled: what the handler returns is then
    /// not sent (an error still is, and cancels the deferral), and the request is
    /// answered by a later [`Context::answer`] from any handler, event, tick or call
    /// continuation of the same service. One not answered by its deadline (the caller's,
    /// or the worker's `--answer-timeout`) is answered 408 by the worker. Calling it
    /// again returns the same handle. Outside a request (an event, a tick, a
    /// continuation) it defers nothing: answering the handle does nothing either.
    pub fn defer(&mut self) -> Deferred {
        *self
            .later
            .deferred
            .get_or_insert_with(|| Deferred(NEXT_DEFERRED.fetch_add(1, Ordering::Relaxed)))
    }

    /// Answers the deferred request `deferred`: `Ok` with a body (200), or an error with
    /// its code. The effects asked for so far in *this* context go with the answer (after
    /// the deferred request's own) and no longer with anything else; an error answer
    /// drops them all. The answer is sent when the handler returns, after what it
    /// pushed. An answer after the request's deadline, or a second one, is dropped (and
    /// counted).
    pub fn answer(&mut self, deferred: Deferred, result: Result<Bytes, HandlerError>) {
        let effects = std::mem::take(&mut self.effects);
        self.later.answers.push(Answer {
            deferred,
            result,
            effects,
        });
    }

    /// [`Context::answer`] with a message, encoded.
    pub fn answer_with(&mut self, deferred: Deferred, message: &impl Message) {
        self.answer(deferred, Ok(Bytes::from(message.encode_to_vec())));
    }

    /// Calls `route` (`service.method`) of another service with `body`; `then` runs
    /// with the result in this service's frame loop, with a context carrying this
    /// context's session and deadline, so it may answer a deferred request and call
    /// again. The call goes out when the handler returns; it waits at most what is
    /// left of this request's deadline less the worker's `--call-margin`, so that the
    /// continuation can still answer before the caller gives up (the worker's
    /// `--call-timeout` without a deadline; [`Context::call_with_options`] sets a
    /// shorter wait). There are no retries. Continuations of several calls run in the order their
    /// results arrive (a timeout's when its deadline passes).
    ///
    /// A call to a keyed service is routed as a gate routes a client's request: by the
    /// session value the service names, else the session's uid
    /// ([`Context::call_keyed`] names the key itself).
    ///
    /// The call carries the request's trace with its route added, and its `timing`
    /// flag; so do calls made from the continuation. One whose trace would hold more
    /// than [`MAX_CALL_DEPTH`] routes is refused at once (500).
    pub fn call<F>(&mut self, route: &str, body: impl Into<Bytes>, then: F)
    where
        F: FnOnce(&mut Context, CallResult) + Send + 'static,
    {
        self.call_keyed(route, "", body, then);
    }

    /// [`Context::call`] to a keyed service's route, routed by `key` (a match, a
    /// player's uid) rather than by the session. A call to a service that is not keyed
    /// ignores the key.
    pub fn call_keyed<F>(&mut self, route: &str, key: &str, body: impl Into<Bytes>, then: F)
    where
        F: FnOnce(&mut Context, CallResult) + Send + 'static,
    {
        self.call_with_options(route, body, CallOptions::default().key(key), then);
    }

    /// [`Context::call`] with [`CallOptions`]: a keyed callee's key, and how long the
    /// call may wait at most. A handler that answers with a fallback when the call fails
    /// gives it a timeout well within its own request's (`chat.login`'s call to
    /// `profile.get`), so the fallback is an answer and not the gate's 408.
    pub fn call_with_options<F>(
        &mut self,
        route: &str,
        body: impl Into<Bytes>,
        options: CallOptions,
        then: F,
    ) where
        F: FnOnce(&mut Context, CallResult) + Send + 'static,
    {
        self.later.calls.push(Call {
            route: route.to_owned(),
            options,
            body: body.into(),
            session: self.has_session.then(|| self.session.clone()),
            deadline: self.later.deadline,
            stem: self.later.call_stem(),
            then: Box::new(then),
            job: None,
        });
    }

    /// Runs `job` off the frame loop (a store's write, whose disk or network wait must
    /// not stall the loop) and `then` with its result in this service's frame loop, as
    /// a call's continuation: the same deadline (408 past it), the same bound on calls
    /// in flight (`--max-calls`, 503 past it), counted under route `what`. `job` is
    /// started when the handler has returned, after the jobs asked before it, so work
    /// it queues (a store's writes) is queued in the order handlers asked.
    pub(crate) fn wait_on<J, F>(&mut self, what: &str, job: J, then: F)
    where
        J: FnOnce() -> BoxFuture<'static, CallResult> + Send + 'static,
        F: FnOnce(&mut Context, CallResult) + Send + 'static,
    {
        self.later.calls.push(Call {
            route: what.to_owned(),
            options: CallOptions::default(),
            body: Bytes::new(),
            session: self.has_session.then(|| self.session.clone()),
            deadline: self.later.deadline,
            stem: self.later.call_stem(),
            then: Box::new(then),
            job: Some(Box::new(job)),
        });
    }

    /// [`Context::call`] with a message, encoded; [`CallResult::decode`] reads the answer.
    pub fn call_with<F>(&mut self, route: &str, request: &impl Message, then: F)
    where
        F: FnOnce(&mut Context, CallResult) + Send + 'static,
    {
        self.call(route, request.encode_to_vec(), then);
    }

    /// When the caller stops waiting for the answer to the request being handled (or,
    /// in a continuation, to the request whose handler made the call); `None` when the
    /// caller did not say, and outside requests.
    pub fn deadline(&self) -> Option<Instant> {
        self.later.deadline
    }
}

#[cfg(test)]
mod tests {
    use proto::echo::EchoResponse;
    use proto::rpc::effect;

    use super::*;

    #[test]
    fn defer_gives_one_handle_per_request_and_answers_take_the_effects() {
        let mut ctx = Context::new(None);
        let first = ctx.defer();
        assert_eq!(ctx.defer(), first);
        assert_ne!(Context::new(None).defer(), first, "unique in the process");
        ctx.join("room");
        ctx.answer(first, Ok(Bytes::from_static(b"done")));
        ctx.leave("room");
        let parts = ctx.into_parts();
        assert_eq!(parts.later.deferred, Some(first));
        let [answer] = &parts.later.answers[..] else {
            panic!("one answer: {:?}", parts.later.answers);
        };
        assert_eq!(
            answer.effects,
            [Effect {
                kind: Some(effect::Kind::Join("room".into()))
            }]
        );
        assert_eq!(parts.effects.len(), 1, "the leave stays with the context");
    }

    #[test]
    fn results_read_as_results() {
        let ok = CallResult {
            body: EchoResponse { body: "x".into() }.encode_to_vec().into(),
            ..CallResult::error(code::OK, "")
        };
        assert_eq!(
            ok.clone().decode::<EchoResponse>().unwrap().body,
            Bytes::from("x")
        );
        assert!(ok.is_ok());
        let failed = CallResult::error(code::UNAVAILABLE, "no worker available now");
        let error = failed.into_result().unwrap_err();
        assert_eq!(
            (error.code(), error.message()),
            (code::UNAVAILABLE, "no worker available now")
        );
        let garbage = CallResult {
            body: Bytes::from_static(&[0xff]),
            ..CallResult::error(code::OK, "")
        };
        assert_eq!(
            garbage.decode::<EchoResponse>().unwrap_err().code(),
            code::HANDLER_ERROR
        );
    }
}
