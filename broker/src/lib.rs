//! The embedded NATS broker: NATS client protocol v1 (core, no JetStream) that real
//! NATS clients use unchanged. The protocol's parser is the `nats_wire` crate's, shared
//! with the gate's bus connection.
//!
//! The reader task of each connection parses and routes inline (no channel hop per
//! message); publishers append to each subscriber's outbound buffer, and each
//! connection's writer flushes once per batch. Subject matching goes through a trie
//! with a per-connection match cache invalidated by a generation counter.
//!
//! # In-process connections
//!
//! A program that runs the broker and its own NATS client in one process can connect
//! without TCP: [`Server::connect_in_process`] returns an [`InProcessStream`]
//! (AsyncRead + AsyncWrite) that the server serves exactly like an accepted socket. The
//! client speaks the NATS protocol over it: it reads INFO, sends CONNECT, then PUB, HPUB,
//! SUB, UNSUB and PING as usual, in the same subject space and queue groups as TCP
//! clients.
//!
//! ```no_run
//! # async fn demo(server: broker::Server) -> std::io::Result<()> {
//! use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
//!
//! let mut conn = BufReader::new(server.connect_in_process());
//! let mut info = String::new();
//! conn.read_line(&mut info).await?; // INFO {...}
//! conn.write_all(b"CONNECT {\"verbose\":false,\"protocol\":1}\r\nPING\r\n").await?;
//! let mut pong = String::new();
//! conn.read_line(&mut pong).await?; // PONG
//! # Ok(())
//! # }
//! ```
//!
//! Authentication applies as on TCP (CONNECT carries the credentials when
//! [`Config::auth`] asks for them); TLS does not, since the bytes never leave the
//! process. Each direction buffers [`Config::in_process_buffer`] bytes
//! ([`config::DEFAULT_IN_PROCESS_BUFFER`] by default), and lets a burst's room go once
//! drained ([`pipe`]); a client that stops reading is cut as a slow consumer like any
//! other.
//!
//! A program that needs no bytes at all attaches a direct connection instead
//! ([`Server::attach`], [`direct`]): publishes and deliveries are calls, routed on the
//! publisher's thread.
//!
//! # Lame duck mode
//!
//! [`Server::lame_duck`] (SIGUSR2 in the `broker` binary, see [`cli`]) stops accepting,
//! sends each client its INFO again with `"ldm":true`, waits
//! [`Config::lame_duck_grace_period`], closes the clients spread over the rest of
//! [`Config::lame_duck_duration`], and then [`Server::run`] returns.

pub mod cli;
mod client;
pub mod conf_file;
pub mod config;
pub mod direct;
mod lame_duck;
pub mod monitor;
mod peer;
pub mod pipe;
mod route;
mod server;
mod state;
pub mod sublist;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;

pub use config::{Auth, Config};
pub use direct::DirectClient;
pub use pipe::InProcessStream;
pub use server::{Attacher, Server};
pub use tls::{Tls, TlsError};
