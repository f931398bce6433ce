//! A service: a name, handlers by method, each with a cost, and an optional tick callback.
//!
//! [`Service`] is plain data plus closures, with no I/O: [`Service::call`] turns an
//! `RpcRequest` for a method into an `RpcResponse`. The frame loop decides *when* calls
//! happen; the worker decides where requests come from. So a service can be unit-tested
//! by calling it, and the same service runs behind the bus or in-process.
//!
//! # Why handlers are synchronous
//!
//! A handler is `FnMut(&mut Context, Req) -> Result<Resp, HandlerError>`, not an `async fn`:
//!
//! - **The frame budget means something.** A frame runs handlers until it has spent
//!   `max_cost` units; that bounds how long the loop goes without looking at its tick and
//!   its queue only if each handler runs to completion when called. An `await` inside a
//!   handler would either hold the frame open for as long as the I/O takes (everything
//!   queued behind it waits) or, if handlers were spawned, escape the budget and the queue
//!   bound altogether.
//! - **Game state without locks or races.** All handlers and the tick of a service run on
//!   one thread, one at a time, in arrival order, like a game's main loop. A handler may
//!   own its state (`FnMut`); state shared between methods and the tick lives behind an
//!   `Arc<Mutex<_>>` that is never contended and never held across an `await`.
//! - **Determinism.** Handlers see requests in order and never interleave, so the same
//!   inputs give the same state: what replays and tests of game logic need.
//!
//! The cost is that a handler must not block on I/O. Work that needs the network or a
//! database belongs in a task the handler starts (answering when it can) or in another
//! service; the frame loop runs on its own thread (see [`crate::worker`]), so even a slow
//! handler never stalls the process's network I/O, only its own service.
//!
//! # Cost units
//!
//! Each method declares a cost, 1 unit by default (see [`Service::cost`]). A unit is "one
//! typical small request", about 10 µs of handler CPU; a method that does ten times the
//! work declares 10. The frame loop's budget `max_cost` is in the same units, so it bounds
//! a frame's length without measuring time, which keeps the loop deterministic (and its
//! tests exact).

use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use bytes::Bytes;
use proto::Message;
use proto::code;
use proto::rpc::{RpcRequest, RpcResponse};
use tokio::time::{Duration, Instant};

use crate::context::Context;

/// Cost of a method that declares none.
pub const DEFAULT_COST: u32 = 1;

/// Longest service or method name. Names become NATS subject tokens and metric labels;
/// the gate bounds routes the same way.
pub const MAX_NAME_LEN: usize = 64;

/// A handler's failure: answered with [`HandlerError::code`] (500 unless the handler
/// chose otherwise) and the message, which the client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (code {code})")]
pub struct HandlerError {
    code: u32,
    message: String,
}

impl HandlerError {
    /// A handler error: answered 500 with `message`.
    pub fn new(message: impl Into<String>) -> HandlerError {
        HandlerError::with_code(code::HANDLER_ERROR, message)
    }

    /// An error answered with `code` (a 4xx or 5xx from [`proto::code`]).
    pub fn with_code(code: u32, message: impl Into<String>) -> HandlerError {
        HandlerError {
            code,
            message: message.into(),
        }
    }

    /// 400: the request is wrong, and retrying it unchanged will not help.
    pub fn bad_request(message: impl Into<String>) -> HandlerError {
        HandlerError::with_code(code::BAD_REQUEST, message)
    }

    /// 401: the session must log in (bind a uid) first.
    pub fn unauthorized(message: impl Into<String>) -> HandlerError {
        HandlerError::with_code(code::UNAUTHORIZED, message)
    }

    /// The status code the client gets.
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The message the client gets.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<String> for HandlerError {
    fn from(message: String) -> Self {
        HandlerError::new(message)
    }
}

impl From<&str> for HandlerError {
    fn from(message: &str) -> Self {
        HandlerError::new(message)
    }
}

impl From<anyhow::Error> for HandlerError {
    /// `?` on an `anyhow::Result` answers 500 with the error and its causes.
    fn from(error: anyhow::Error) -> Self {
        HandlerError::new(format!("{error:#}"))
    }
}

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
type TickHandler = Box<dyn FnMut(&Tick) + Send>;

struct Method {
    handler: RawHandler,
    cost: u32,
}

/// A named set of handlers, one per method, plus an optional tick callback.
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
///     .cost(2);
/// assert_eq!(service.cost_of("raw"), 2);
/// ```
///
/// Registration is setup code: the builder panics on a programming error (an invalid or
/// duplicate name, a zero cost), as a router does, never on anything a peer sends.
pub struct Service {
    name: String,
    methods: HashMap<String, Method>,
    last_method: Option<String>,
    tick: Option<TickHandler>,
}

impl Service {
    /// A service without methods yet.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid token (see [`is_valid_name`]).
    pub fn new(name: impl Into<String>) -> Service {
        let name = name.into();
        assert!(
            is_valid_name(&name),
            "invalid service name {name:?}: use 1..={MAX_NAME_LEN} of [a-z0-9_-]"
        );
        Service {
            name,
            methods: HashMap::new(),
            last_method: None,
            tick: None,
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
        Req: Message + Default,
        Resp: Message,
        F: FnMut(&mut Context, Req) -> Result<Resp, HandlerError> + Send + 'static,
    {
        self.raw_method(name, move |ctx, body| {
            let request = Req::decode(body)
                .map_err(|e| HandlerError::bad_request(format!("bad request body: {e}")))?;
            let response = handler(ctx, request)?;
            Ok(Bytes::from(response.encode_to_vec()))
        })
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
            is_valid_name(name),
            "invalid method name {name:?} in service {}: use 1..={MAX_NAME_LEN} of [a-z0-9_-]",
            self.name
        );
        let method = Method {
            handler: Box::new(handler),
            cost: DEFAULT_COST,
        };
        let previous = self.methods.insert(name.to_owned(), method);
        assert!(
            previous.is_none(),
            "method {name:?} registered twice in service {}",
            self.name
        );
        self.last_method = Some(name.to_owned());
        self
    }

    /// Sets the cost, in units, of the method registered last (see the module docs).
    ///
    /// # Panics
    ///
    /// If no method is registered yet, or `cost` is 0 (a free handler would let a frame
    /// run without bound).
    pub fn cost(mut self, cost: u32) -> Service {
        assert!(cost > 0, "a method's cost must be at least 1 unit");
        let method = self
            .last_method
            .as_ref()
            .and_then(|name| self.methods.get_mut(name))
            .expect("Service::cost follows the method it applies to");
        method.cost = cost;
        self
    }

    /// Registers the callback the frame loop calls at the worker's tick interval (the
    /// game loop). It runs on the loop's thread, between frames, never inside one.
    pub fn on_tick<F>(mut self, tick: F) -> Service
    where
        F: FnMut(&Tick) + Send + 'static,
    {
        self.tick = Some(Box::new(tick));
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
        self.methods.get(method).map_or(DEFAULT_COST, |m| m.cost)
    }

    /// Whether a tick callback is registered.
    pub fn has_tick(&self) -> bool {
        self.tick.is_some()
    }

    /// Answers `request` with `method`'s handler: 200 with the body and effects, the
    /// handler's error code and message, 404 for an unknown method, or 500 if the handler
    /// panicked (the panic is caught: a request can never take the worker down). A failed
    /// handler's effects are dropped: a request either succeeds with its effects or
    /// changes nothing.
    pub fn call(&mut self, method: &str, mut request: RpcRequest) -> RpcResponse {
        let Some(entry) = self.methods.get_mut(method) else {
            return error_response(
                code::NOT_FOUND,
                format!("unknown method {method:?} of service {:?}", self.name),
            );
        };
        let mut ctx = Context::for_request(&mut request);
        let body = std::mem::take(&mut request.body);
        match catch_unwind(AssertUnwindSafe(|| (entry.handler)(&mut ctx, body))) {
            Ok(Ok(body)) => RpcResponse {
                code: code::OK,
                body,
                effects: ctx.into_effects(),
                ..RpcResponse::default()
            },
            Ok(Err(error)) => error_response(error.code, error.message),
            Err(panic) => {
                tracing::error!(
                    service = %self.name,
                    method,
                    panic = panic_message(&*panic),
                    "handler panicked"
                );
                error_response(code::HANDLER_ERROR, "internal error: handler panicked")
            }
        }
    }

    /// Decodes an `RpcRequest` from `payload` (as it came off the bus) and calls `method`;
    /// a payload that is not an `RpcRequest` is answered 400.
    pub fn call_encoded(&mut self, method: &str, payload: Bytes) -> RpcResponse {
        match RpcRequest::decode(payload) {
            Ok(request) => self.call(method, request),
            Err(e) => error_response(code::BAD_REQUEST, format!("malformed RpcRequest: {e}")),
        }
    }

    /// Runs the tick callback, if any. A panicking tick is logged and survived, like a
    /// panicking handler.
    pub fn tick(&mut self, tick: &Tick) {
        let Some(callback) = self.tick.as_mut() else {
            return;
        };
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| callback(tick))) {
            tracing::error!(
                service = %self.name,
                seq = tick.seq,
                panic = panic_message(&*panic),
                "tick callback panicked"
            );
        }
    }
}

impl fmt::Debug for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut methods: Vec<_> = self.methods.iter().map(|(n, m)| (n, m.cost)).collect();
        methods.sort();
        f.debug_struct("Service")
            .field("name", &self.name)
            .field("methods", &methods)
            .field("tick", &self.tick.is_some())
            .finish()
    }
}

/// Whether `name` may name a service or method: 1 to [`MAX_NAME_LEN`] bytes of
/// `[a-z0-9_-]`, the same rule the gate applies to each token of a route, since a name
/// becomes a NATS subject token (no `.`, `*`, `>` or spaces).
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A response carrying only a status and a message.
pub fn error_response(code: u32, message: impl Into<String>) -> RpcResponse {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proto::echo::{EchoRequest, EchoResponse};
    use proto::rpc::{Session, effect};

    fn request(body: impl Into<Bytes>) -> RpcRequest {
        RpcRequest {
            route: "test.m".into(),
            body: body.into(),
            session: Some(Session {
                gate: "g".into(),
                sid: 1,
                ..Session::default()
            }),
            timing: false,
        }
    }

    fn echo_body(text: &str) -> Bytes {
        EchoRequest {
            body: Bytes::copy_from_slice(text.as_bytes()),
        }
        .encode_to_vec()
        .into()
    }

    fn typed() -> Service {
        Service::new("test")
            .method("echo", |_ctx: &mut Context, req: EchoRequest| {
                Ok(EchoResponse { body: req.body })
            })
            .method("login", |ctx: &mut Context, req: EchoRequest| {
                let uid = String::from_utf8_lossy(&req.body).into_owned();
                ctx.bind_uid(uid);
                ctx.join("lobby");
                Ok(EchoResponse::default())
            })
            .method("fail", |ctx: &mut Context, _req: EchoRequest| {
                ctx.join("never");
                Err::<EchoResponse, _>(HandlerError::new("the dragon ate it"))
            })
            .method("deny", |_ctx: &mut Context, _req: EchoRequest| {
                Err::<EchoResponse, _>(HandlerError::unauthorized("log in first"))
            })
            .raw_method("panic", |_ctx, _body| panic!("boom"))
    }

    #[test]
    fn typed_method_decodes_and_encodes() {
        let response = typed().call("echo", request(echo_body("hi")));
        assert_eq!(response.code, code::OK);
        let echoed = EchoResponse::decode(response.body).unwrap();
        assert_eq!(echoed.body, Bytes::from_static(b"hi"));
    }

    #[test]
    fn undecodable_body_is_400_with_a_message() {
        let response = typed().call("echo", request(Bytes::from_static(&[0xff, 0xff])));
        assert_eq!(response.code, code::BAD_REQUEST);
        assert!(
            response.message.starts_with("bad request body"),
            "{response:?}"
        );
    }

    #[test]
    fn unknown_method_is_404() {
        let response = typed().call("nope", request(Bytes::new()));
        assert_eq!(response.code, code::NOT_FOUND);
        assert!(response.message.contains("nope"), "{response:?}");
    }

    #[test]
    fn handler_error_is_500_with_its_message_and_no_effects() {
        let response = typed().call("fail", request(echo_body("")));
        assert_eq!(response.code, code::HANDLER_ERROR);
        assert_eq!(response.message, "the dragon ate it");
        assert!(response.effects.is_empty());
    }

    #[test]
    fn handler_error_may_choose_its_code() {
        let response = typed().call("deny", request(echo_body("")));
        assert_eq!(response.code, code::UNAUTHORIZED);
        assert_eq!(response.message, "log in first");
    }

    #[test]
    fn panicking_handler_is_500_and_the_service_survives() {
        let mut service = typed();
        let response = service.call("panic", request(Bytes::new()));
        assert_eq!(response.code, code::HANDLER_ERROR);
        assert_eq!(service.call("echo", request(echo_body("x"))).code, code::OK);
    }

    #[test]
    fn effects_travel_in_the_response() {
        let response = typed().call("login", request(echo_body("alice")));
        assert_eq!(response.code, code::OK);
        let kinds: Vec<_> = response.effects.into_iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![
                Some(effect::Kind::BindUid("alice".into())),
                Some(effect::Kind::Join("lobby".into())),
            ]
        );
    }

    #[test]
    fn raw_method_gets_the_bytes() {
        let mut service = Service::new("raw").raw_method("rev", |_ctx, body| {
            Ok(body.iter().rev().copied().collect::<Vec<u8>>().into())
        });
        let response = service.call("rev", request(Bytes::from_static(b"abc")));
        assert_eq!(response.body, Bytes::from_static(b"cba"));
    }

    #[test]
    fn malformed_rpc_request_is_400() {
        let response = typed().call_encoded("echo", Bytes::from_static(&[0x0a, 0x05, b'x']));
        assert_eq!(response.code, code::BAD_REQUEST);
        assert!(
            response.message.starts_with("malformed RpcRequest"),
            "{response:?}"
        );
    }

    #[test]
    fn encoded_call_round_trips() {
        let payload = Bytes::from(request(echo_body("yo")).encode_to_vec());
        let response = typed().call_encoded("echo", payload);
        assert_eq!(response.code, code::OK);
    }

    #[test]
    fn cost_applies_to_the_last_method_and_defaults_to_one() {
        let service = Service::new("s")
            .raw_method("cheap", |_, b| Ok(b))
            .raw_method("dear", |_, b| Ok(b))
            .cost(5);
        assert_eq!(service.cost_of("cheap"), 1);
        assert_eq!(service.cost_of("dear"), 5);
        assert_eq!(service.cost_of("unknown"), DEFAULT_COST);
    }

    #[test]
    fn handlers_may_keep_state() {
        let mut count = 0u32;
        let mut service = Service::new("s").raw_method("count", move |_, _| {
            count += 1;
            Ok(Bytes::from(count.to_string()))
        });
        service.call("count", request(Bytes::new()));
        let response = service.call("count", request(Bytes::new()));
        assert_eq!(response.body, Bytes::from_static(b"2"));
    }

    #[test]
    fn names_are_subject_tokens() {
        assert!(is_valid_name("chat"));
        assert!(is_valid_name("get_room-2"));
        for bad in [
            "",
            "Chat",
            "a.b",
            "*",
            ">",
            "a b",
            &"x".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(!is_valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn duplicate_method_panics() {
        let _ = Service::new("s")
            .raw_method("m", |_, b| Ok(b))
            .raw_method("m", |_, b| Ok(b));
    }

    #[test]
    #[should_panic(expected = "invalid method name")]
    fn dotted_method_panics() {
        let _ = Service::new("s").raw_method("a.b", |_, b| Ok(b));
    }

    #[test]
    #[should_panic(expected = "at least 1")]
    fn zero_cost_panics() {
        let _ = Service::new("s").raw_method("m", |_, b| Ok(b)).cost(0);
    }
}
