//! A Rust worker on a task, beside workers in other languages: started on a bus URL
//! with the caller's configuration, stopped gracefully.

#![allow(dead_code)] // each test file uses a different part of the harness

use services::{Service, Worker, WorkerConfig};
use testkit::within;
use tokio_util::sync::CancellationToken;

pub struct RustWorker(services::Running);

impl RustWorker {
    /// Connects to `url` as `name`, subscribes `service` (returning once the server has
    /// the subscription) and serves it on a task.
    pub async fn start(
        url: &str,
        name: &str,
        service: Service,
        config: WorkerConfig,
    ) -> RustWorker {
        let config = WorkerConfig {
            nats: vec![url.to_owned()],
            ..config
        };
        let shutdown = CancellationToken::new();
        let running = Worker::start(service, config, name, &shutdown);
        RustWorker(within(running).await.unwrap())
    }

    /// Stops it and waits until it has drained.
    pub async fn stop(self) {
        within(self.0.stop()).await.unwrap();
    }
}
