//! The gate (connector): terminates game clients' WebSockets and forwards their
//! requests over the bus to worker pools, one subject per route, answering every
//! request — with the worker's response or the gate's own error code.
//!
//! Also the Rust client SDK ([`sdk`]) that tests and the load test drive it with.

mod admission;
pub mod auth;
pub mod bus;
mod codec;
pub mod config;
mod forward;
pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
mod gate;
mod inbox;
mod labels;
mod limits;
mod presence;
pub mod route;
mod schema;
pub mod sdk;
mod session;
mod sessions;
pub mod tls;
mod upgrade;
mod web;
mod wire;

pub use auth::{AnyToken, AuthError, Identity, JwtCheck, StaticToken, TokenCheck};
pub use codec::pomelo;
pub use config::{GateConfig, UidConflict};
pub use gate::{Gate, Listener};
