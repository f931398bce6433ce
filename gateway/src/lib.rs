//! The gate (connector): terminates game clients' WebSockets and forwards their
//! requests over the bus to worker pools, one subject per route, answering every
//! request — with the worker's response or the gate's own error code.
//!
//! The client protocol's encoding is `proto::frame`, shared with the Rust client SDK
//! (`clients/rust`, its own crate); the NATS protocol is `nats_wire`, shared with the
//! broker.

mod admission;
mod asks;
pub mod auth;
mod bus_target;
mod codec;
pub mod config;
mod forward;
#[doc(hidden)]
pub mod fuzzing;
mod gate;
mod handover;
mod inbox;
mod labels;
mod lean_io;
mod limits;
mod presence;
pub mod route;
mod schema;
mod session;
mod sessions;
pub mod tls;
mod upgrade;
mod web;

pub use auth::{AnyToken, AuthError, Identity, JwtCheck, StaticToken, TokenCheck};
pub use codec::pomelo;
pub use config::{GateConfig, ShardsArg, UidConflict};
pub use gate::{Gate, Listener, ShardListeners, Shards};
