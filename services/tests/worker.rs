//! Workers on a real bus, with async-nats as the gate's stand-in. What the bus decides
//! (queue groups, leases, unsubscribing) runs against our embedded broker and against
//! the real nats-server; the worker's own answers (codec, errors, effects), once.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use common::{Bus, BusExt, Requester, blocking_service, call, rpc, within};
use futures::StreamExt;
use proto::Message;
use proto::code;
use proto::echo::{EchoRequest, EchoResponse};
use proto::rpc::RpcResponse;
use proto::rpc::effect;
use services::{Context, FrameConfig, HandlerError, Service, WorkerConfig, echo};
use tokio::sync::mpsc;

broker::on_every_bus!(
    three_workers_in_the_group_all_get_a_share,
    full_queue_gives_fast_503s,
    shutdown_answers_what_was_taken_then_unsubscribes,
    bursts_of_ten_leases_keep_the_only_worker_in_its_group,
);

fn config(queue_capacity: usize) -> WorkerConfig {
    WorkerConfig {
        frames: FrameConfig {
            queue_capacity,
            ..FrameConfig::default()
        },
        ..WorkerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_answers_with_the_same_body() {
    let bus = Bus::embedded().await;
    let worker = bus.worker(echo::service(), config(16)).await;
    let client = bus.client().await;
    let body = EchoRequest {
        body: Bytes::from_static(b"hello, shaddock"),
    };
    let response = call(
        &client,
        "shaddock.svc.echo.echo",
        rpc("echo.echo", body.encode_to_vec()),
    )
    .await;
    assert_eq!(response.code, code::OK, "{response:?}");
    let echoed = EchoResponse::decode(response.body).unwrap();
    assert_eq!(echoed.body, body.body);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_echo_returns_the_bytes_unchanged() {
    let bus = Bus::embedded().await;
    let worker = bus.worker(echo::service(), config(16)).await;
    let client = bus.client().await;
    let body = Bytes::from_static(&[0, 1, 2, 0xfe, 0xff]);
    let response = call(
        &client,
        "shaddock.svc.echo.raw",
        rpc("echo.raw", body.clone()),
    )
    .await;
    assert_eq!((response.code, response.body), (code::OK, body));
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_method_is_404() {
    let bus = Bus::embedded().await;
    let worker = bus.worker(echo::service(), config(16)).await;
    let client = bus.client().await;
    let response = call(&client, "shaddock.svc.echo.nope", rpc("echo.nope", "")).await;
    assert_eq!(response.code, code::NOT_FOUND, "{response:?}");
    assert!(response.message.contains("nope"), "{response:?}");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_handler_is_500_with_its_message() {
    let bus = Bus::embedded().await;
    let service = Service::new("spells").raw_method("cast", |_ctx, _body| {
        Err(HandlerError::new("not enough mana"))
    });
    let worker = bus.worker(service, config(16)).await;
    let client = bus.client().await;
    let response = call(&client, "shaddock.svc.spells.cast", rpc("spells.cast", "")).await;
    assert_eq!(
        (response.code, response.message.as_str()),
        (code::HANDLER_ERROR, "not enough mana")
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_is_400() {
    let bus = Bus::embedded().await;
    let worker = bus.worker(echo::service(), config(16)).await;
    let client = bus.client().await;
    // A length-delimited field longer than the payload: not an RpcRequest.
    let garbage = Bytes::from_static(&[0x12, 0x7f, 0x01]);
    let response = call(&client, "shaddock.svc.echo.echo", garbage).await;
    assert_eq!(response.code, code::BAD_REQUEST, "{response:?}");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effects_reach_the_caller() {
    let bus = Bus::embedded().await;
    let service = Service::new("auth").raw_method("login", |ctx: &mut Context, body| {
        ctx.bind_uid(String::from_utf8_lossy(&body).into_owned());
        ctx.join("lobby");
        Ok(Bytes::new())
    });
    let worker = bus.worker(service, config(16)).await;
    let client = bus.client().await;
    let response = call(
        &client,
        "shaddock.svc.auth.login",
        rpc("auth.login", "alice"),
    )
    .await;
    let kinds: Vec<_> = response.effects.into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            Some(effect::Kind::BindUid("alice".into())),
            Some(effect::Kind::Join("lobby".into())),
        ]
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifies_are_handled_but_not_answered() {
    let bus = Bus::embedded().await;
    let (seen_tx, mut seen) = mpsc::channel(4);
    let service = Service::new("notes").raw_method("note", move |_ctx, body| {
        let _ = seen_tx.try_send(body);
        Ok(Bytes::new())
    });
    let worker = bus.worker(service, config(16)).await;
    let client = bus.client().await;
    client
        .publish("shaddock.svc.notes.note", rpc("notes.note", "psst"))
        .await
        .unwrap();
    let body = within(seen.recv()).await.unwrap();
    assert_eq!(body, Bytes::from_static(b"psst"));
    worker.stop().await;
}

/// A `shard` service whose one method answers `id`: which worker took a request.
fn who(id: u8) -> Service {
    Service::new("shard").raw_method("who", move |_ctx, _body| Ok(Bytes::from(vec![id])))
}

/// Sends `calls` requests to `shard.who` at once; how many each worker answered.
async fn shares(client: &async_nats::Client, calls: usize) -> BTreeMap<u8, usize> {
    let calls = (0..calls).map(|_| call(client, "shaddock.svc.shard.who", rpc("shard.who", "")));
    let mut share = BTreeMap::new();
    for response in futures::future::join_all(calls).await {
        assert_eq!(response.code, code::OK);
        *share.entry(response.body[0]).or_insert(0) += 1;
    }
    share
}

async fn three_workers_in_the_group_all_get_a_share(bus: Bus) {
    let mut workers = Vec::new();
    for id in 0..3u8 {
        workers.push(bus.worker(who(id), config(64)).await);
    }
    // All three are subscribed; the bus picks one per request. 150 requests leave a
    // worker without any with probability 3 * (2/3)^150, about 1e-26.
    let share = shares(&bus.client().await, 150).await;
    assert_eq!(
        share.keys().copied().collect::<Vec<_>>(),
        [0, 1, 2],
        "{share:?}"
    );
    assert_eq!(share.values().sum::<usize>(), 150);
    for worker in workers {
        worker.stop().await;
    }
}

/// A worker attached in process (`shaddock up`'s) and one over TCP (a worker added on
/// another machine) are one queue group: each takes a share of the requests, and every
/// request is handled once (either one outside the group would handle them all again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_in_process_and_one_over_tcp_share_their_group() {
    let handled = Arc::new(AtomicUsize::new(0));
    let counted = |id: u8| {
        let handled = handled.clone();
        Service::new("shard").raw_method("who", move |_ctx, _body| {
            handled.fetch_add(1, Ordering::Relaxed);
            Ok(Bytes::from(vec![id]))
        })
    };
    let bus = Bus::in_process().await;
    let inside = bus.worker(counted(0), config(64)).await;
    let tcp_config = WorkerConfig {
        nats: vec![bus.url().to_owned()],
        ..config(64)
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let outside = services::Worker::start(counted(1), tcp_config, "tcp-worker", &shutdown);
    let outside = common::RunningWorker(within(outside).await.unwrap());
    // 100 requests leave one of two without any with probability 2 * (1/2)^100.
    let share = shares(&bus.client().await, 100).await;
    assert_eq!(
        share.keys().copied().collect::<Vec<_>>(),
        [0, 1],
        "{share:?}"
    );
    // Stopped, each has handled all it took.
    inside.stop().await;
    outside.stop().await;
    assert_eq!(handled.load(Ordering::Relaxed), 100);
}

async fn full_queue_gives_fast_503s(bus: Bus) {
    let (service, mut blocker) = blocking_service("busy");
    let worker = bus.worker(service, config(2)).await;
    let mut requester = Requester::new(bus.client().await).await;
    // Request 0 occupies the loop; 1 and 2 fill the queue; 3, 4 and 5 find it full.
    requester
        .send("shaddock.svc.busy.block", 0, rpc("busy.block", ""))
        .await;
    blocker.started().await;
    for n in 1..=5 {
        requester
            .send("shaddock.svc.busy.fast", n, rpc("busy.fast", ""))
            .await;
    }
    // Answered while the loop is still held: the 503s do not wait for it.
    let overloaded = requester.codes(3).await;
    assert_eq!(
        overloaded,
        [
            (3, code::UNAVAILABLE),
            (4, code::UNAVAILABLE),
            (5, code::UNAVAILABLE)
        ]
    );
    blocker.release();
    let served = requester.codes(3).await;
    assert_eq!(served, [(0, code::OK), (1, code::OK), (2, code::OK)]);
    worker.stop().await;
}

async fn shutdown_answers_what_was_taken_then_unsubscribes(bus: Bus) {
    let (service, mut blocker) = blocking_service("drain");
    let worker = bus.worker(service, config(4)).await;
    let client = bus.client().await;
    let mut requester = Requester::new(client.clone()).await;
    requester
        .send("shaddock.svc.drain.block", 0, rpc("drain.block", ""))
        .await;
    blocker.started().await;
    for n in 1..=5 {
        requester
            .send("shaddock.svc.drain.fast", n, rpc("drain.fast", ""))
            .await;
    }
    // Request 5's 503 proves 1 to 4 are in the worker's queue (the intake is in order).
    assert_eq!(requester.next().await.0, 5);

    worker.0.shut_down();
    blocker.release();
    assert_eq!(
        requester.codes(5).await,
        (0..5).map(|n| (n, code::OK)).collect::<Vec<_>>()
    );
    worker.join().await;

    // Gone from the group: the bus has nobody to give a request to, once the server has
    // read the worker's last UNSUB (a flush does not wait for that, so a request right
    // after the worker returned may still be routed to it, and go unanswered).
    within(async {
        loop {
            let request = async_nats::Request::new()
                .payload(rpc("drain.fast", ""))
                .timeout(Some(std::time::Duration::from_millis(100)));
            let error = client
                .send_request("shaddock.svc.drain.fast", request)
                .await
                .expect_err("answered by a worker that has stopped");
            match error.kind() {
                async_nats::RequestErrorKind::NoResponders => return,
                async_nats::RequestErrorKind::TimedOut => continue,
                _ => panic!("{error}"),
            }
        }
    })
    .await;
}

/// Games send on the tick: bursts of ten times the configured lease (the fewest a queue
/// subscription is granted), all published at once, at the only worker of the service.
/// Each burst fits the worker's queue, so every request is answered 200: the worker
/// never drops out of its own group (which the bus would answer "no responders"). The
/// burst is held below `queue_capacity`, as the worker's lease covers what it can queue.
async fn bursts_of_ten_leases_keep_the_only_worker_in_its_group(bus: Bus) {
    const LEASE: u64 = services::config::MIN_QUEUE_LEASE;
    const BURST: usize = 10 * LEASE as usize;
    const BURSTS: usize = 10;
    let mut config = config(BURST);
    config.frames.drain.queue_lease = LEASE;
    let worker = bus.worker(echo::service(), config).await;
    let client = bus.client().await;
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(format!("{inbox}.*")).await.unwrap();
    within(client.flush()).await.unwrap();
    let payload = rpc("echo.raw", "tick");
    for burst in 0..BURSTS {
        for n in 0..BURST {
            client
                .publish_with_reply(
                    "shaddock.svc.echo.raw",
                    format!("{inbox}.{n}"),
                    payload.clone(),
                )
                .await
                .unwrap();
        }
        within(client.flush()).await.unwrap();
        let mut answered = vec![false; BURST];
        let mut no_responders = 0;
        for _ in 0..BURST {
            let message = within(replies.next()).await.unwrap();
            let n: usize = message.subject.rsplit('.').next().unwrap().parse().unwrap();
            if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                no_responders += 1;
                continue;
            }
            assert_eq!(RpcResponse::decode(message.payload).unwrap().code, code::OK);
            answered[n] = true;
        }
        assert_eq!(
            no_responders,
            0,
            "{}: burst {burst}: the worker left its group for a moment",
            bus.name()
        );
        assert!(answered.iter().all(|a| *a));
    }
    worker.stop().await;
}
