//! Shaddock's worker framework and built-in services.
//!
//! A game team writes a [`Service`]: typed handlers by method, each with a cost, and
//! optionally a tick callback and event handlers. A [`Worker`] serves it on the bus: it
//! subscribes the service's subjects in the service's queue group (so every worker
//! process of a service shares its load), feeds a bounded queue, and runs the handlers in
//! a frame-limited loop that answers 503 when the queue is full. Handlers see the session
//! through a [`Context`] and change it through effects the gate applies; they reach other
//! players through pushes, from a handler via the context or from anywhere via a
//! [`Pusher`]. A handler fails with a [`HandlerError`], answered with its status code.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use services::{Worker, WorkerConfig, echo};
//! use tokio_util::sync::CancellationToken;
//!
//! // Connects to `config.nats`, subscribes, and serves on a task until shutdown.
//! let shutdown = CancellationToken::new();
//! let worker = Worker::start(echo::service(), WorkerConfig::default(), "my-echo", &shutdown).await?;
//! // ... and when the process is told to stop: drain, answer what was taken, return.
//! worker.stop().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The modules read bottom-up: leaves (`names`, [`config`], `metrics`, `handler_error`),
//! parts (`bus`, `push`, `context`, `drain`, [`store`]), the service registry (`service`), the
//! frame loop (`frame_loop`), and `worker`, which assembles them; [`echo`], [`chat`],
//! [`arena`] and [`profile`] are services written with it. docs/workers.md is the protocol and
//! the operator's guide.

pub mod arena;
mod bus;
pub mod chat;
pub mod config;
mod context;
mod drain;
pub mod echo;
mod frame_loop;
mod handler_error;
mod metrics;
mod names;
mod ownership;
pub mod profile;
mod push;
mod service;
pub mod store;
pub mod tally;
mod worker;

pub use bus::{
    BusSecurity, Client, SUBSCRIPTION_CAPACITY, Subscriber, Unsent, connect, connect_in_process,
    worker_connection_name,
};
pub use config::{ConfigError, DrainConfig, FrameConfig, KeyedConfig, WorkerConfig};
pub use context::{CallOptions, CallResult, Context, Deferred, MAX_CALL_DEPTH, MAX_CALL_SPANS};
pub use handler_error::HandlerError;
pub use metrics::describe as describe_metrics;
pub use push::{Outbound, PushError, Pusher};
pub use service::{DEFAULT_COST, Delivery, EventHandled, Handled, Service, Tick};
pub use worker::{HeldPartitions, Host, Running, Undelivered, Worker, WorkerError};
