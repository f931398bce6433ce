//! The embedded NATS broker: NATS client protocol v1 (core, no JetStream) that real
//! NATS clients use unchanged.
//!
//! The reader task of each connection parses and routes inline (no channel hop per
//! message); publishers append to each subscriber's outbound buffer, and each
//! connection's writer flushes once per batch. Subject matching goes through a trie
//! with a per-connection match cache invalidated by a generation counter.

pub mod cli;
mod client;
pub mod conf_file;
pub mod config;
mod lame_duck;
pub mod monitor;
pub mod parser;
mod server;
pub mod subject;
pub mod sublist;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;

pub use config::{Auth, Config};
pub use server::Server;
pub use tls::{Tls, TlsError};
