//! Starting a worker in one call: connect, subscribe, serve, all on the worker's loop
//! thread (its connection's tasks live on that thread's runtime). The `shaddock` binary
//! and every test start workers this way.

use std::future::Future;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{HeldPartitions, Worker, WorkerError, loop_thread};
use crate::bus;
use crate::config::WorkerConfig;
use crate::service::Service;

impl Worker {
    /// Connects to `config.nats` as `name` (with `config.security`'s credentials and
    /// TLS), subscribes `service`, returning once the server has the subscriptions (so
    /// requests sent next reach it), and serves it on its loop thread until `shutdown`
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
        let connect = async move { bus::connect(&urls, &name, &security).await };
        Worker::start_with(connect, service, config, shutdown).await
    }

    /// [`Worker::start`] on the in-process connection of the embedded broker `dial`
    /// reaches (see [`crate::connect_in_process`]), made on the worker's loop thread.
    pub async fn start_in_process(
        dial: ::bus::Dialer,
        service: Service,
        config: WorkerConfig,
        name: &str,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Running> {
        let name = name.to_owned();
        let connect = async move { bus::connect_in_process(dial, &name).await };
        Worker::start_with(connect, service, config, shutdown).await
    }

    async fn start_with(
        connect: impl Future<Output = anyhow::Result<bus::Client>> + Send + 'static,
        service: Service,
        config: WorkerConfig,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Running> {
        // A child: stopping this worker leaves the rest of the process running.
        let shutdown = shutdown.child_token();
        let name = service.name().to_owned();
        let (started_tx, started) = oneshot::channel();
        let (done_tx, done) = oneshot::channel();
        let stop = shutdown.clone();
        loop_thread::spawn(&name, move |rt| {
            let subscribed = rt.block_on(async move {
                let client = connect.await?;
                anyhow::Ok(Worker::subscribe(client, service, config).await?)
            });
            let worker = match subscribed {
                Ok(worker) => worker,
                Err(error) => {
                    let _ = started_tx.send(Err(error));
                    return;
                }
            };
            tracing::info!("Worker subscribed on {}", worker.subject());
            // The caller gone, nobody would stop the worker: it does not serve.
            if started_tx.send(Ok(worker.held())).is_ok() {
                let _ = done_tx.send(worker.serve_on(rt, stop));
            }
        })?;
        let held = started.await.map_err(|_| loop_thread::vanished(&name))??;
        Ok(Running {
            shutdown,
            done,
            held,
            name,
        })
    }
}

/// A worker serving on its loop thread, from [`Worker::start`]. Dropping it fires its
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
            Err(_) => Err(loop_thread::vanished(&self.name)),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shut_down();
    }
}
