//! A Rust worker on a task, beside workers in other languages: started on a bus URL
//! with the caller's configuration, stopped gracefully.

#![allow(dead_code)] // each test file uses a different part of the harness

use services::{Service, Worker, WorkerConfig, WorkerError};
use testkit::within;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub struct RustWorker {
    shutdown: CancellationToken,
    run: JoinHandle<Result<(), WorkerError>>,
}

impl RustWorker {
    /// Connects to `url` as `name`, subscribes `service` (returning once the server has
    /// the subscription) and serves it on a task.
    pub async fn start(
        url: &str,
        name: &str,
        service: Service,
        config: WorkerConfig,
    ) -> RustWorker {
        let client = services::connect(&[url.to_owned()], name, &Default::default())
            .await
            .unwrap();
        let worker = within(Worker::subscribe(client, service, config))
            .await
            .unwrap();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(worker.run(shutdown.clone()));
        RustWorker { shutdown, run }
    }

    /// Stops it and waits until it has drained.
    pub async fn stop(self) {
        self.shutdown.cancel();
        within(self.run).await.unwrap().unwrap();
    }
}
