//! The order in which the gate hands a session what the bus sent it: a handler's pushes
//! — to rooms on several subjects and to the player, many of them, so that they queue up
//! at the gate — reach the client before the handler's answer, while other sessions do
//! the same in the same rooms. Runs on both brokers.

mod common;

use std::collections::HashMap;

use common::{Bus, TestGate, gate_config, start_worker, within};
use sdk::{Client, ClientOptions};
use services::{FrameConfig, HandlerError, Service};

broker::on_every_bus!(a_handlers_pushes_on_several_subjects_arrive_before_its_answer);

/// The rooms every player joins.
const ROOMS: [&str; 3] = ["o-a", "o-b", "o-c"];
/// Each `order.burst` pushes this many times to each room and to the player.
const PUSHES_PER_SUBJECT: usize = 8;
const PLAYERS: usize = 3;
const BURSTS: usize = 100;

/// `order.enter` binds the player named in the body and joins [`ROOMS`];
/// `order.burst` pushes its body to every room and to the player, then answers.
fn order_service() -> Service {
    Service::new("order")
        .raw_method("enter", |ctx, body| {
            let name = std::str::from_utf8(&body)
                .map_err(|_| HandlerError::bad_request("name is not UTF-8"))?
                .to_owned();
            ctx.bind_uid(name);
            for room in ROOMS {
                ctx.join(room);
            }
            Ok(body)
        })
        .raw_method("burst", |ctx, body| {
            let uid = ctx
                .uid()
                .ok_or_else(|| HandlerError::bad_request("enter first"))?
                .to_owned();
            for _ in 0..PUSHES_PER_SUBJECT {
                for room in ROOMS {
                    ctx.broadcast(room, "order.room", body.clone())?;
                }
                ctx.push_to_user(&uid, "order.player", body.clone())?;
            }
            Ok(body)
        })
}

async fn a_handlers_pushes_on_several_subjects_arrive_before_its_answer(bus: Bus) {
    let _worker = start_worker(bus.url(), order_service(), FrameConfig::default()).await;
    // Room in the session queues for every burst of every player at once: a push
    // dropped for want of room would look like one that came late.
    let gate = TestGate::start(&bus, gate_config(|c| c.outbound_queue = 8192)).await;
    let options = ClientOptions {
        push_capacity: 8192,
        ..ClientOptions::default()
    };
    let mut players = Vec::new();
    for p in 0..PLAYERS {
        let client = within(Client::connect(&gate.url, options.clone()))
            .await
            .unwrap();
        let name = format!("p{p}");
        let entered = client.request("order.enter", &name).await.unwrap();
        assert_eq!(entered.code, proto::code::OK, "{entered:?}");
        players.push((name, client));
    }

    let bursts = players.into_iter().map(|(name, client)| async move {
        let mut pushes = client.pushes().unwrap();
        for round in 0..BURSTS {
            let tag = format!("{name}:{round}");
            let answer = client.request("order.burst", &tag).await.unwrap();
            assert_eq!(answer.code, proto::code::OK, "{answer:?}");
            // Everything this burst pushed to us is queued ahead of its answer.
            let mut mine: HashMap<String, usize> = HashMap::new();
            while let Some(push) = pushes.try_recv() {
                if push.body == tag.as_bytes() {
                    *mine.entry(push.route).or_default() += 1;
                }
            }
            let expected = HashMap::from([
                ("order.room".to_owned(), ROOMS.len() * PUSHES_PER_SUBJECT),
                ("order.player".to_owned(), PUSHES_PER_SUBJECT),
            ]);
            assert_eq!(mine, expected, "{tag}: pushes before its answer");
        }
        assert_eq!(client.pushes_dropped(), 0);
        client.close().await;
    });
    within(futures::future::join_all(bursts)).await;
}
