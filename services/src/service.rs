//! A service: a name, handlers by method, each with a cost, an optional tick callback,
//! and handlers for events (messages on subjects of the service's choosing).
//!
//! [`Service`] is plain data plus closures, with no I/O: [`Service::call`] turns an
//! `RpcRequest` for a method into an `RpcResponse`. The frame loop decides *when* calls
//! happen; the worker decides where requests come from. So a service can be unit-tested
//! by calling it, and the same service runs behind the bus or in-process.

use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use bytes::Bytes;
use proto::code;
use proto::rpc::{MethodSchema, PushSchema, RpcRequest, RpcResponse, ServiceSchema, Session};
use proto::{Message, Name};
use tokio::time::{Duration, Instant};

use crate::context::{CallResult, Context, Later, Parts, Stem, Then};
use crate::handler_error::HandlerError;
use crate::names::{MAX_NAME_LEN, is_valid_subject, is_valid_token};
use crate::push::Outbound;

/// Cost of a method that declares none.
pub const DEFAULT_COST: u32 = 1;

/// One firing of a service's tick callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tick {
    /// 1 for the first tick, then one more each time.
    pub seq: u64,
    /// When this tick fired (the loop's clock).
    pub now: Instant,
    /// Time since the previous tick (since the loop started, for the first): a game
    /// step's `dt`. Equals the tick interval unless ticks were skipped under load.
    pub since_last: Duration,
}

type RawHandler = Box<dyn FnMut(&mut Context, Bytes) -> Result<Bytes, HandlerError> + Send>;
type TickHandler = Box<dyn FnMut(&mut Context, &Tick) + Send>;
type EventHandler = Box<dyn FnMut(&mut Context, Bytes) -> Result<(), HandlerError> + Send>;

struct Method {
    handler: RawHandler,
    /// Set by [`Service::cost`]; [`DEFAULT_COST`] when `None`.
    cost: Option<u32>,
    /// Full protobuf names of a typed method's request and response: announced to the
    /// gates, which transcode JSON clients' bodies with them.
    types: Option<(String, String)>,
}

/// Who handles an event: see [`Service::on_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Delivery {
    /// One worker of the service, whichever the bus picks (the service's queue group).
    Queue,
    /// Every worker of the service.
    All,
}

struct Event {
    subject: String,
    delivery: Delivery,
    handler: EventHandler,
}

struct StartSync {
    subject: String,
    restore: EventHandler,
}

/// What a request's handling produced: the answer, and what to publish before it.
#[derive(Debug, Default)]
pub struct Handled {
    /// The answer; not sent when the handler deferred it (see [`Handled::deferred`]).
    pub response: RpcResponse,
    /// Pushes and messages the handler asked for, in order; empty when it failed.
    pub outbound: Vec<Outbound>,
    /// Deferral, answers to deferred requests and calls; empty when it failed.
    pub(crate) later: Later,
}

impl Handled {
    /// Whether the handler deferred its answer ([`Context::defer`]): `response` then
    /// holds only the effects it asked for, which go with the answer when it comes.
    pub fn deferred(&self) -> bool {
        self.later.deferred.is_some()
    }

    /// The routes of the calls the handler made, in order.
    pub fn calls(&self) -> impl Iterator<Item = &str> {
        self.later.calls.iter().map(|c| c.route.as_str())
    }
}

/// What an event's (or a tick's) handling produced.
#[derive(Debug, Default)]
pub struct EventHandled {
    /// Whether the handler succeeded (no error, no panic).
    pub ok: bool,
    /// Pushes and messages to publish, in order; empty when it failed.
    pub outbound: Vec<Outbound>,
    /// The answer, for an event whose sender asked for one.
    pub reply: Option<Bytes>,
    /// Answers to deferred requests and calls; empty when it failed.
    pub(crate) later: Later,
}

/// A named set of handlers, one per method, plus an optional tick callback and event
/// handlers. Plain data plus closures, with no I/O: a service is unit-tested by
/// [calling](Service::call) it.
///
/// ```
/// use proto::echo::{EchoRequest, EchoResponse};
/// use services::{Context, HandlerError, Service};
///
/// let service = Service::new("echo")
///     .method("echo", |_ctx: &mut Context, req: EchoRequest| {
///         Ok::<_, HandlerError>(EchoResponse { body: req.body })
///     })
///     .raw_method("raw", |_ctx, body| Ok(body))
///     .cost("raw", 2);
/// assert_eq!(service.cost_of("raw"), 2);
/// assert_eq!(service.cost_of("echo"), 1);
/// ```
///
/// Registration is setup code: the builder panics on a programming error (an invalid or
/// duplicate name, a cost for a method not registered, a zero cost), as a router does,
/// never on anything a peer sends.
///
/// # Why handlers are synchronous
///
/// A handler is `FnMut(&mut Context, Req) -> Result<Resp, HandlerError>`, not an
/// `async fn`:
///
/// - **The frame budget means something.** A frame runs handlers until it has spent
///   `max_cost` units; that bounds how long the loop goes without looking at its tick and
///   its queue only if each handler runs to completion when called.
/// - **Game state without locks or races.** All handlers and the tick of a service run on
///   one thread, one at a time, in arrival order, like a game's main loop. A handler may
///   own its state (`FnMut`); state shared between methods and the tick lives behind an
///   `Arc<Mutex<_>>` that is never contended and never held across an `await`.
/// - **Determinism.** Handlers see requests in order and never interleave, so the same
///   inputs give the same state: what replays and tests of game logic need.
///
/// So a handler must not block on I/O: work that needs the network or a database belongs
/// in a task the handler starts or in another service. The loop runs on a thread of its
/// own, so a slow handler delays only its own service, never the process's network I/O.
/// A handler that needs another service's answer defers its own and calls it with a
/// continuation that runs later on the same loop ([`Context::defer`], [`Context::call`],
/// [`Context::answer`]; docs/workers.md, "Calling other services").
///
/// # Costs
///
/// Each method costs 1 unit unless [`Service::cost`] names it with another. A unit is
/// "one typical small request", about 10 µs of handler CPU; a method that does ten times
/// the work declares 10. The frame budget is in the same units, so it bounds a frame's
/// length without measuring time, which keeps the loop deterministic.
///
/// # Events
///
/// [`Service::on_event`] subscribes a subject under the prefix, in the service's queue
/// group ([`Delivery::Queue`]: one worker handles each message, e.g. the gates'
/// `evt.session.closed`) or plainly ([`Delivery::All`]: every worker sees every message,
/// e.g. state its workers replicate). Events share the queue and the loop with requests,
/// so a handler's state needs no lock against them. Messages of one subject are handled
/// in the order the bus delivered them, and an event that reached the worker before a
/// request is handled first (`All` events before `Queue` events before requests).
/// [`Service::on_start_sync`] lets a starting worker ask a running peer for the state
/// they share before it takes requests, and again after a reconnect.
pub struct Service {
    name: String,
    methods: HashMap<String, Method>,
    tick: Option<TickHandler>,
    events: Vec<Event>,
    start_sync: Option<StartSync>,
    pushes: Vec<PushSchema>,
    descriptors: &'static [u8],
    keyed: Option<keyed::Keyed>,
}

impl Service {
    /// A service without methods yet.
    ///
    /// # Panics
    ///
    /// If `name` is not one subject token: 1 to 64 bytes of `[a-z0-9_-]`.
    pub fn new(name: impl Into<String>) -> Service {
        let name = name.into();
        assert!(
            is_valid_token(&name),
            "invalid service name {name:?}: use 1..={MAX_NAME_LEN} of [a-z0-9_-]"
        );
        Service {
            name,
            methods: HashMap::new(),
            tick: None,
            events: Vec::new(),
            start_sync: None,
            pushes: Vec::new(),
            descriptors: &[],
            keyed: None,
        }
    }

    /// Registers a typed handler: the request body is decoded as `Req` (a body that does
    /// not decode is answered 400 without calling the handler) and the returned `Resp` is
    /// encoded as the response body.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid token or is already registered.
    pub fn method<Req, Resp, F>(self, name: &str, mut handler: F) -> Service
    where
        Req: Message + Name + Default,
        Resp: Message + Name,
        F: FnMut(&mut Context, Req) -> Result<Resp, HandlerError> + Send + 'static,
    {
        let mut service = self.raw_method(name, move |ctx, body| {
            let request = Req::decode(body)
                .map_err(|e| HandlerError::bad_request(format!("bad request body: {e}")))?;
            let response = handler(ctx, request)?;
            Ok(Bytes::from(response.encode_to_vec()))
        });
        if let Some(method) = service.methods.get_mut(name) {
            method.types = Some((Req::full_name(), Resp::full_name()));
        }
        service
    }

    /// Declares that pushes on `route` (`<service>.<name>`) carry a `T`, so gates can
    /// hand them to JSON clients as JSON.
    pub fn push<T: Name>(mut self, route: &str) -> Service {
        self.pushes.push(PushSchema {
            route: route.to_owned(),
            message_type: T::full_name(),
        });
        self
    }

    /// The encoded `FileDescriptorSet` holding the types of the typed methods and of the
    /// pushes (with prost-build, the set protox or protoc produced). With it, workers
    /// announce the service's schema and gates speak JSON bodies for its routes;
    /// without it, JSON clients' bodies pass through as they are.
    pub fn descriptors(mut self, descriptors: &'static [u8]) -> Service {
        self.descriptors = descriptors;
        self
    }

    /// What workers announce to the gates: the typed methods, the pushes, the
    /// descriptors and how a keyed service routes. Every service announces, typed or
    /// not, so that the gates know it exists: a request that finds no worker of it is
    /// then an outage (waited for and sent again), not a route nothing serves (404).
    /// Without descriptors the types are left out: the gates could not load them.
    pub(crate) fn schema(&self) -> ServiceSchema {
        let typed = !self.descriptors.is_empty();
        let mut methods: Vec<MethodSchema> = self
            .methods
            .iter()
            .filter_map(|(name, m)| {
                let (request_type, response_type) = m.types.clone()?;
                Some(MethodSchema {
                    method: name.clone(),
                    request_type,
                    response_type,
                })
            })
            .collect();
        methods.sort_by(|a, b| a.method.cmp(&b.method));
        if !typed {
            methods.clear();
        }
        ServiceSchema {
            service: self.name.clone(),
            methods,
            pushes: if typed {
                self.pushes.clone()
            } else {
                Vec::new()
            },
            descriptors: Bytes::from_static(self.descriptors),
            keyed: self.keyed_schema(),
        }
    }

    /// Registers a handler of raw body bytes, for services with their own encoding (or
    /// none, like the echo service's `raw`).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid token or is already registered.
    pub fn raw_method<F>(mut self, name: &str, handler: F) -> Service
    where
        F: FnMut(&mut Context, Bytes) -> Result<Bytes, HandlerError> + Send + 'static,
    {
        assert!(
            is_valid_token(name),
            "invalid method name {name:?} in service {}: use 1..={MAX_NAME_LEN} of [a-z0-9_-]",
            self.name
        );
        let method = Method {
            handler: Box::new(handler),
            cost: None,
            types: None,
        };
        let previous = self.methods.insert(name.to_owned(), method);
        assert!(
            previous.is_none(),
            "method {name:?} registered twice in service {}",
            self.name
        );
        self
    }

    /// Sets the cost of `method`, in units (see "Costs" above): what one call of it
    /// spends of a frame's budget. A method whose cost is not set costs [`DEFAULT_COST`].
    ///
    /// # Panics
    ///
    /// If `method` is not registered (register it first), its cost is already set, or
    /// `units` is 0 (a free handler would let a frame run without bound).
    pub fn cost(mut self, method: &str, units: u32) -> Service {
        assert!(units > 0, "a method's cost must be at least 1 unit");
        let Some(entry) = self.methods.get_mut(method) else {
            panic!(
                "cost for method {method:?}, not registered in service {}: register it first",
                self.name
            );
        };
        assert!(
            entry.cost.replace(units).is_none(),
            "cost of method {method:?} in service {} set twice",
            self.name
        );
        self
    }

    /// Registers the callback the frame loop calls at the worker's tick interval (the
    /// game loop). It runs on the loop's thread, between frames, never inside one. Its
    /// context has no session; what it pushes is published when it returns.
    pub fn on_tick<F>(mut self, tick: F) -> Service
    where
        F: FnMut(&mut Context, &Tick) + Send + 'static,
    {
        self.tick = Some(Box::new(tick));
        self
    }

    /// Registers `handler` for the messages on `<prefix>.<subject>` (dot-separated
    /// tokens, e.g. `evt.session.closed`), delivered to one worker of the service or to
    /// all of them (see [`Delivery`] and "Events" above). The handler gets the payload
    /// and a context without a session; what it pushes is published when it returns,
    /// and [`Context::reply`] answers a sender that asked for an answer. An error is
    /// logged and counted: there is nobody to answer it to. Each event costs
    /// [`DEFAULT_COST`].
    ///
    /// # Panics
    ///
    /// If `subject` is not dot-separated tokens, or is already registered.
    pub fn on_event<F>(mut self, subject: &str, delivery: Delivery, handler: F) -> Service
    where
        F: FnMut(&mut Context, Bytes) -> Result<(), HandlerError> + Send + 'static,
    {
        assert!(
            is_valid_subject(subject),
            "invalid event subject {subject:?} in service {}: use dot-separated [a-z0-9_-] tokens",
            self.name
        );
        assert!(
            self.events.iter().all(|e| e.subject != subject),
            "event subject {subject:?} registered twice in service {}",
            self.name
        );
        self.events.push(Event {
            subject: subject.to_owned(),
            delivery,
            handler: Box::new(handler),
        });
        self
    }

    /// Makes a starting worker ask a running peer for the service's shared state before
    /// it takes requests: it sends an empty request on `<prefix>.<subject>` and hands the
    /// answer to `restore`, the first thing its loop runs (no answer because no peer
    /// runs: it starts empty). Peers answer through an event handler registered for the
    /// same subject with [`Delivery::Queue`] that calls [`Context::reply`]. The worker
    /// subscribes its other events before asking and that subject after, so it never
    /// asks itself, and no change published after the snapshot is missed: applying
    /// changes must be idempotent, since some may be in the snapshot too.
    ///
    /// A worker back from a lost bus connection asks again, before its next request, and
    /// hands that snapshot to `restore` too: `restore` must *replace* the state, so that
    /// what the worker missed while away (a member who left) goes with it.
    ///
    /// # Panics
    ///
    /// If `subject` is not dot-separated tokens, or no `Queue` event handler is
    /// registered for it (register that first).
    pub fn on_start_sync<F>(mut self, subject: &str, restore: F) -> Service
    where
        F: FnMut(&mut Context, Bytes) -> Result<(), HandlerError> + Send + 'static,
    {
        assert!(
            self.events
                .iter()
                .any(|e| e.subject == subject && e.delivery == Delivery::Queue),
            "on_start_sync({subject:?}) needs an on_event({subject:?}, Delivery::Queue, ..) \
             to answer it, registered first"
        );
        self.start_sync = Some(StartSync {
            subject: subject.to_owned(),
            restore: Box::new(restore),
        });
        self
    }

    /// The service's name: its subject token, queue group and metric label.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The registered methods, in no particular order.
    pub fn methods(&self) -> impl Iterator<Item = &str> {
        self.methods.keys().map(String::as_str)
    }

    /// The cost of calling `method`; [`DEFAULT_COST`] for an unknown method, whose 404
    /// still takes a turn.
    pub fn cost_of(&self, method: &str) -> u32 {
        self.methods
            .get(method)
            .and_then(|m| m.cost)
            .unwrap_or(DEFAULT_COST)
    }

    /// Whether a tick callback is registered.
    pub(crate) fn has_tick(&self) -> bool {
        self.tick.is_some()
    }

    /// The registered event subjects (under the prefix) and who gets them.
    pub(crate) fn events(&self) -> impl Iterator<Item = (&str, Delivery)> {
        self.events.iter().map(|e| (e.subject.as_str(), e.delivery))
    }

    /// The subject a starting worker asks for a snapshot on, if any.
    pub(crate) fn start_sync_subject(&self) -> Option<&str> {
        self.start_sync.as_ref().map(|s| s.subject.as_str())
    }

    /// Answers `request` with `method`'s handler: 200 with the body and effects, the
    /// handler's error code and message, 404 for an unknown method, or 500 if the handler
    /// panicked (the panic is caught: a request can never take the worker down). A failed
    /// handler's effects and pushes are dropped: a request either succeeds with its
    /// effects or changes nothing.
    pub fn call(&mut self, method: &str, request: RpcRequest) -> Handled {
        self.call_at(method, request, Instant::now())
    }

    /// [`Service::call`] for a request received at `received`: its deadline counts from
    /// then.
    fn call_at(&mut self, method: &str, mut request: RpcRequest, received: Instant) -> Handled {
        let Some(entry) = self.methods.get_mut(method) else {
            return error_response(
                code::NOT_FOUND,
                format!("unknown method {method:?} of service {:?}", self.name),
            )
            .into();
        };
        if self.keyed.is_some() && request.key.is_empty() {
            // Sent by a gate that has not learnt yet that the service is keyed: it asks
            // for the schema when it starts, so a retry is routed by key.
            return error_response(
                code::UNAVAILABLE,
                format!(
                    "service {:?} is keyed and the request has no key: retry",
                    self.name
                ),
            )
            .into();
        }
        let mut ctx = Context::for_request(&mut request, received);
        let body = std::mem::take(&mut request.body);
        match catch_unwind(AssertUnwindSafe(|| (entry.handler)(&mut ctx, body))) {
            Ok(Ok(body)) => {
                let Parts {
                    effects,
                    outbound,
                    later,
                    ..
                } = ctx.into_parts();
                Handled {
                    response: RpcResponse {
                        code: code::OK,
                        body,
                        effects,
                        ..RpcResponse::default()
                    },
                    outbound,
                    later,
                }
            }
            Ok(Err(error)) => error_response(error.code(), error.message()).into(),
            Err(panic) => {
                tracing::error!(
                    service = %self.name,
                    method,
                    panic = panic_message(&*panic),
                    "handler panicked"
                );
                error_response(code::HANDLER_ERROR, "internal error: handler panicked").into()
            }
        }
    }

    /// Decodes an `RpcRequest` from `payload` (as it came off the bus at `received`)
    /// and calls `method`; a payload that is not an `RpcRequest` is answered 400.
    pub(crate) fn call_encoded(
        &mut self,
        method: &str,
        payload: Bytes,
        received: Instant,
    ) -> Handled {
        match RpcRequest::decode(payload) {
            Ok(request) => self.call_at(method, request, received),
            Err(e) => {
                error_response(code::BAD_REQUEST, format!("malformed RpcRequest: {e}")).into()
            }
        }
    }

    /// Runs the handler of event `subject` (as registered) on `payload`. An unknown
    /// subject, an error or a panic is logged, and publishes nothing.
    pub fn event(&mut self, subject: &str, payload: Bytes) -> EventHandled {
        let name = &self.name;
        let Some(event) = self.events.iter_mut().find(|e| e.subject == subject) else {
            tracing::warn!(service = %name, subject, "no handler for event");
            return EventHandled::default();
        };
        run_sessionless(name, subject, |ctx| (event.handler)(ctx, payload))
    }

    /// Hands a peer's snapshot to the [`Service::on_start_sync`] callback.
    pub fn restore(&mut self, snapshot: Bytes) -> EventHandled {
        let name = &self.name;
        let Some(sync) = self.start_sync.as_mut() else {
            return EventHandled::default();
        };
        run_sessionless(name, "restore", |ctx| (sync.restore)(ctx, snapshot))
    }

    /// Runs the tick callback, if any, returning what it asked to publish. A panicking
    /// tick is logged and survived, like a panicking handler.
    pub fn tick(&mut self, tick: &Tick) -> Vec<Outbound> {
        self.run_tick(tick).outbound
    }

    /// [`Service::tick`], with the answers and calls the tick asked for too.
    pub(crate) fn run_tick(&mut self, tick: &Tick) -> EventHandled {
        let name = &self.name;
        let Some(callback) = self.tick.as_mut() else {
            return EventHandled::default();
        };
        run_sessionless(name, "tick", |ctx| {
            callback(ctx, tick);
            Ok(())
        })
    }
}

/// Runs a call's continuation `then` with `result`, in a context carrying the caller's
/// `session` and `deadline` and the call's `stem`; a panic is logged and survived.
pub(crate) fn resume(
    service: &str,
    then: Then,
    session: Option<Session>,
    deadline: Option<Instant>,
    stem: Stem,
    result: CallResult,
) -> EventHandled {
    run_in(
        Context::resumed(session, deadline, stem),
        service,
        "call",
        |ctx| {
            then(ctx, result);
            Ok(())
        },
    )
}

/// Runs a tick, event or restore callback with a sessionless context, catching errors
/// and panics (logged: nobody else hears of them).
fn run_sessionless(
    service: &str,
    what: &str,
    f: impl FnOnce(&mut Context) -> Result<(), HandlerError>,
) -> EventHandled {
    run_in(Context::new(None), service, what, f)
}

/// Runs a callback that answers no request of its own with `ctx`, catching errors and
/// panics (logged). Session effects not taken by an answer to a deferred request have
/// no response to travel in, and are dropped with a warning.
fn run_in(
    mut ctx: Context,
    service: &str,
    what: &str,
    f: impl FnOnce(&mut Context) -> Result<(), HandlerError>,
) -> EventHandled {
    match catch_unwind(AssertUnwindSafe(|| f(&mut ctx))) {
        Ok(Ok(())) => {
            let parts = ctx.into_parts();
            if !parts.effects.is_empty() {
                tracing::warn!(
                    service,
                    what,
                    "session effects that no answer carries are dropped"
                );
            }
            EventHandled {
                ok: true,
                outbound: parts.outbound,
                reply: parts.reply,
                later: parts.later,
            }
        }
        Ok(Err(error)) => {
            tracing::debug!(service, what, %error, "event handler failed");
            EventHandled::default()
        }
        Err(panic) => {
            tracing::error!(
                service,
                what,
                panic = panic_message(&*panic),
                "callback panicked"
            );
            EventHandled::default()
        }
    }
}

impl From<RpcResponse> for Handled {
    fn from(response: RpcResponse) -> Self {
        Handled {
            response,
            ..Handled::default()
        }
    }
}

impl fmt::Debug for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut methods: Vec<_> = self.methods.keys().map(|n| (n, self.cost_of(n))).collect();
        methods.sort();
        f.debug_struct("Service")
            .field("name", &self.name)
            .field("methods", &methods)
            .field("tick", &self.tick.is_some())
            .field("events", &self.events().collect::<Vec<_>>())
            .field("start_sync", &self.start_sync_subject())
            .finish()
    }
}

/// A response carrying only a status and a message.
pub(crate) fn error_response(code: u32, message: impl Into<String>) -> RpcResponse {
    RpcResponse {
        code,
        message: message.into(),
        ..RpcResponse::default()
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

mod keyed;
#[cfg(test)]
pub(crate) use keyed::request as keyed_request;
#[cfg(test)]
mod tests;
