//! Starting a worker in one call: connect, subscribe, serve on a task. The `shaddock`
//! binary and every test start workers this way.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{HeldPartitions, Worker, WorkerError};
use crate::bus;
use crate::config::WorkerConfig;
use crate::service::Service;

impl Worker {
    /// Connects to `config.nats` as `name` (with `config.security`'s credentials and
    /// TLS), subscribes `service`, returning once the server has the subscriptions (so
    /// requests sent next reach it), and serves it on a task until `shutdown` fires or
    /// the returned [`Running`] is stopped or dropped.
    pub async fn start(
        service: Service,
        config: WorkerConfig,
        name: &str,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Running> {
        let client = bus::connect(&config.nats, name, &config.security).await?;
        Worker::start_on(client, service, config, shutdown).await
    }

    /// [`Worker::start`] on a connection made already (e.g. an embedded broker's, from
    /// [`crate::connect_in_process`]).
    pub async fn start_on(
        client: bus::Client,
        service: Service,
        config: WorkerConfig,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Running> {
        let worker = Worker::subscribe(client, service, config).await?;
        tracing::info!("Worker subscribed on {}", worker.subject());
        let held = worker.held();
        // A child: stopping this worker leaves the rest of the process running.
        let shutdown = shutdown.child_token();
        let task = tokio::spawn(worker.run(shutdown.clone()));
        Ok(Running {
            shutdown,
            task,
            held,
        })
    }
}

/// A worker serving on a task, from [`Worker::start`]. Dropping it fires its shutdown:
/// it then drains on its own.
#[derive(Debug)]
pub struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), WorkerError>>,
    held: Option<HeldPartitions>,
}

impl Running {
    /// For a keyed service, how many of its partitions this worker holds.
    pub fn held(&self) -> Option<HeldPartitions> {
        self.held.clone()
    }

    /// Fires the worker's shutdown: it drains while [`Running::join`] waits.
    pub fn shut_down(&self) {
        self.shutdown.cancel();
    }

    /// Fires the worker's shutdown and waits for it to drain and return.
    pub async fn stop(mut self) -> Result<(), WorkerError> {
        self.shut_down();
        self.join().await
    }

    /// Waits for the worker to return: after its shutdown fired, once it has drained.
    pub async fn join(&mut self) -> Result<(), WorkerError> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(panicked) => Err(WorkerError::Panicked(panicked.to_string())),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shut_down();
    }
}
