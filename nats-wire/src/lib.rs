//! The NATS core protocol v1 as bytes, without I/O: no sockets, no runtime, no clock.
//!
//! Two programs here speak it from opposite ends: the broker reads what clients send
//! ([`parse`] into a [`ClientOp`]) and the gate's bus connection reads what a server
//! sends ([`parse_server`] into a [`ServerOp`]). Both parsers are pure and cancel-safe,
//! borrow the caller's buffer, and share one grammar, one set of [`Limits`] and one
//! error type named after nats-server's; keeping them apart from either program keeps
//! the grammar testable byte by byte and fuzzable on its own (`fuzz/`).
//!
//! [`direct`] is the same protocol without the bytes: its operations as calls, for a
//! client and a server in one process.
//!
//! [`subject`] holds the subject rules: NATS's own, and the stricter token Shaddock
//! builds its subjects from.

pub mod direct;
mod parser;
pub mod subject;

pub use parser::{
    ClientOp, DEFAULT_MAX_CONTROL_LINE, DEFAULT_MAX_PAYLOAD, Limits, ParseError, ServerOp, parse,
    parse_server,
};
