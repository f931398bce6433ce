//! The gate (connector): terminates game clients' WebSockets and forwards their
//! requests over the bus to worker pools, one subject per route, answering every
//! request — with the worker's response or the gate's own error code.
//!
//! Also the Rust client SDK ([`sdk`]) that tests and the load test drive it with.

mod codec;
pub mod config;
mod forward;
pub mod frame;
mod gate;
mod limits;
pub mod pomelo;
mod presence;
pub mod route;
mod router;
mod schema;
pub mod sdk;
mod session;
mod wire;

pub use config::GateConfig;
pub use gate::{AnyToken, Gate, StaticToken, TokenCheck};
pub use presence::UidConflict;
