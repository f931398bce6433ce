//! A worker whose bus is down when it is told to stop ends its drain at `--drain-grace`
//! and reports what it could not deliver (docs/workers.md, "Draining on shutdown"): here
//! one answer, made after the connection was lost.

mod common;

use std::time::{Duration, Instant};

use common::{blocking_service, rpc, within};
use services::{FrameConfig, Undelivered, Worker, WorkerConfig, WorkerError};
use testkit::NatsServer;
use tokio_util::sync::CancellationToken;

const GRACE: Duration = Duration::from_secs(2);

#[tokio::test]
async fn a_drain_cut_short_by_its_grace_counts_the_answers_it_could_not_deliver() {
    let broker = NatsServer::start().await;
    let urls = [broker.url.clone()];
    let config = WorkerConfig {
        nats: urls.to_vec(),
        frames: FrameConfig {
            answer_timeout: Duration::from_secs(1),
            call_timeout: Duration::from_secs(1),
            drain_grace: GRACE,
            ..FrameConfig::default()
        },
        ..WorkerConfig::default()
    };
    let (service, mut blocker) = blocking_service("held");
    // The worker's own connection, to see when it has noticed the bus is gone.
    let connection = services::connect(&urls, "test-worker-held", &Default::default())
        .await
        .unwrap();
    let worker = within(Worker::subscribe(connection.clone(), service, config))
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    // A request taken while the bus is up, answered once it is down.
    let gate = within(async_nats::connect(&broker.url)).await.unwrap();
    let request = rpc("held.block", "x");
    gate.publish_with_reply("shaddock.svc.held.block", "nobody.listens", request)
        .await
        .unwrap();
    gate.flush().await.unwrap();
    blocker.started().await;
    drop(broker);
    within(async {
        while connection.is_connected() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    blocker.release();

    let stopping = Instant::now();
    shutdown.cancel();
    let ended = within(running).await.unwrap();
    let took = stopping.elapsed();
    let Err(WorkerError::DrainGrace { grace, undelivered }) = ended else {
        panic!("not cut short by the grace: {ended:?}");
    };
    assert_eq!(grace, GRACE);
    assert_eq!(
        undelivered,
        Undelivered {
            answers: 1,
            pushes: 0
        }
    );
    assert!(
        took >= GRACE && took < GRACE + Duration::from_secs(2),
        "{took:?}"
    );
}
