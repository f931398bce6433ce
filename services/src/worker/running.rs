//! Starting a worker in one call: connect, subscribe, serve, all on the worker's host
//! (its connection's tasks live on that thread's runtime). The `shaddock` binary
//! and every test start workers this way.

use std::future::Future;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{HeldPartitions, Host, Worker, WorkerError, host};
use crate::bus;
use crate::config::WorkerConfig;
use crate::service::Service;

impl Worker {
    /// Connects to `config.nats` as `name` (with `config.security`'s credentials and
    /// TLS), subscribes `service`, returning once the server has the subscriptions (so
    /// requests sent next reach it), and serves it on a host of its own until `shutdown`
    /// fires or the returned [`Running`] is stopped or dropped.
    pub async fn start(
        service: Service,
        config: WorkerConfig,
        name: &str,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Running> {
        let (urls, security, name) = (
            config.nats.clone(),
            config.security.clone(),
            name.to_owned(),
        );
        let host = Host::spawn(service.name(), config.frames.handler_stall)?;
        let connect = async move { bus::connect(&urls, &name, &security).await };
        Worker::start_on(&host, connect, service, config, shutdown).await
    }

    /// [`Worker::start`] on the in-process connection of the embedded broker `attach`
    /// reaches (see [`crate::connect_in_process`]), made on `host`'s thread: a host of
    /// the worker's own when `None`, else the one given, which may serve other workers
    /// and tasks (`shaddock up` serves its gate there too).
    pub async fn start_in_process(
        attach: ::bus::Attach,
        host: Option<&Host>,
        service: Service,
        config: WorkerConfig,
        name: &str,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Running> {
        let own;
        let host = match host {
            Some(host) => host,
            None => {
                own = Host::spawn(service.name(), config.frames.handler_stall)?;
                &own
            }
        };
        let name = name.to_owned();
        let connect = async move { bus::connect_in_process(attach, &name).await };
        Worker::start_on(host, connect, service, config, shutdown).await
    }

    /// Connects with `connect` and subscribes, both on `host`'s thread, then serves
    /// there.
    async fn start_on(
        host: &Host,
        connect: impl Future<Output = anyhow::Result<bus::Client>> + Send + 'static,
        service: Service,
        config: WorkerConfig,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Running> {
        // A child: stopping this worker leaves the rest of the process running.
        let shutdown = shutdown.child_token();
        let name = service.name().to_owned();
        let subscribed = host.runtime().spawn(async move {
            let client = connect.await?;
            anyhow::Ok(Worker::subscribe(client, service, config).await?)
        });
        let worker = subscribed.await.map_err(|_| host::vanished(&name))??;
        tracing::info!("Worker subscribed on {}", worker.subject());
        let held = worker.held();
        let done = host.serve(worker, shutdown.clone());
        Ok(Running {
            shutdown,
            done,
            held,
            name,
        })
    }
}

/// A worker serving on its host, from [`Worker::start`]. Dropping it fires its
/// shutdown: it then drains on its own.
#[derive(Debug)]
pub struct Running {
    shutdown: CancellationToken,
    /// The worker's result, when its thread is done.
    done: oneshot::Receiver<Result<(), WorkerError>>,
    held: Option<HeldPartitions>,
    name: String,
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
        match (&mut self.done).await {
            Ok(result) => result,
            Err(_) => Err(host::vanished(&self.name)),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shut_down();
    }
}
