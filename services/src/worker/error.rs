//! Why a worker could not start or did not stop cleanly.

use std::fmt;

use crate::config::ConfigError;

/// Why a worker could not start or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot subscribe to {subject}: {source}")]
    Subscribe {
        subject: String,
        source: async_nats::SubscribeError,
    },
    #[error("cannot flush to the bus: {0}")]
    Flush(#[from] async_nats::client::FlushError),
    #[error("no peer answered a snapshot request on {0} (see Service::on_start_sync)")]
    Sync(String),
    #[error("cannot start the frame loop thread: {0}")]
    Thread(#[from] std::io::Error),
    #[error("the frame loop of service {0:?} stopped unexpectedly")]
    LoopStopped(String),
    #[error("the worker's task panicked: {0}")]
    Panicked(String),
    #[error(
        "the drain did not end within its grace of {grace:?} (is the bus down?): {undelivered}"
    )]
    DrainGrace {
        grace: std::time::Duration,
        undelivered: Undelivered,
    },
}

/// What a worker could not deliver: answers and pushes it handed its connection while
/// the connection was down, since it was last made (they leave only if it comes back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Undelivered {
    pub answers: u64,
    pub pushes: u64,
}

impl fmt::Display for Undelivered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Undelivered { answers, pushes } = self;
        write!(f, "{answers} answers and {pushes} pushes not delivered")
    }
}
