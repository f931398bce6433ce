//! Shaddock's worker framework and built-in services.
//!
//! A game team writes a [`Service`]: typed handlers by method, each with a cost, and
//! optionally a tick callback. [`worker::run`] serves it on the bus: it subscribes the
//! service's subjects in the service's queue group (so every worker process of a service
//! shares its load), feeds a bounded queue, and runs the handlers in a frame-limited loop
//! ([`frame_loop`]) that answers 503 when the queue is full. Handlers see the session
//! through a [`Context`] and change it through effects the gate applies; they reach other
//! players through pushes ([`push`]: to a group, to a player, kicks), from a handler via
//! the context or from anywhere via a [`Pusher`]. A service may also handle events,
//! messages on subjects of its choosing, in the same loop ([`Service::on_event`]).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use services::{WorkerConfig, echo, worker};
//! use tokio_util::sync::CancellationToken;
//!
//! let config = WorkerConfig::default();
//! let client = services::connect(&config.nats, "shaddock-worker-echo", &config.security).await?;
//! worker::run(client, echo::service(), config, CancellationToken::new()).await
//! # }
//! ```
//!
//! Modules: [`service`] (registration, dispatch, why handlers are synchronous, cost
//! units), [`context`] (session and effects), [`frame_loop`] (frames, budget, pause,
//! tick, overload), [`worker`] (the bus side, threads, order, shutdown, lame duck),
//! [`drain`] (leaving a queue group without losing messages), [`bus`] (subjects,
//! connecting, reconnect backoff), [`push`] (pushes and kicks on the bus), [`config`]
//! (limits and flags), [`metrics`] (metric names), and the services [`echo`] and
//! [`chat`].

mod announce;
pub mod bus;
pub mod chat;
pub mod config;
pub mod context;
pub mod drain;
pub mod echo;
pub mod frame_loop;
pub mod metrics;
pub mod push;
pub mod service;
pub mod worker;

pub use bus::{BusSecurity, connect};
pub use config::{DrainConfig, FrameConfig, WorkerConfig};
pub use context::Context;
pub use push::{Outbound, PushError, Pusher};
pub use service::{Delivery, HandlerError, Service, Tick};
pub use worker::{Worker, WorkerError};
