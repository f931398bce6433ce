//! The bus on a direct link to the real broker in process ([`crate::BusOptions::direct`]):
//! publishes are routed before they return, deliveries come on the publisher's thread
//! (a dispatch that publishes while delivered to included), subscriptions recorded
//! before a link go on it, and a link the broker closes is lost and made again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use nats_wire::direct::{Link, Sink};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Event, Heard, heard_now, next, publish};
use crate::{Attach, Bus, BusError, BusOptions, Dispatch, Incoming, Reply, run};

/// A bus linked to `server`, its first subscription `first.>` (target 1), with
/// `before` subscribed (target 2) before the link is made.
async fn linked(attach: Attach, before: &str) -> (Arc<Bus<u32>>, mpsc::UnboundedReceiver<Event>) {
    let bus = Bus::new(BusOptions::direct(attach), "first.>".into(), 1, 1 << 20);
    bus.subscribe(before.into(), None, 2);
    let (tx, mut heard) = mpsc::unbounded_channel();
    tokio::spawn(run(bus.clone(), Arc::new(Heard(tx))));
    assert_eq!(next(&mut heard).await, Event::Up);
    (bus, heard)
}

#[tokio::test]
async fn a_publish_is_delivered_before_it_returns_and_earlier_subscriptions_are_on_the_link() {
    let server = broker::Server::new(broker::Config::default());
    let (bus, mut heard) = linked(server.attacher(), "before.x").await;
    publish(&bus, "first.a", [1]);
    publish(&bus, "before.x", [2]);
    // No task in between: both were handed over by the calls above.
    assert_eq!(heard_now(&mut heard), [(1, "1".into()), (2, "2".into())]);
    let info = bus.server_info().expect("linked");
    assert_eq!(info.server_id, server.id());
    // A flush has nothing to wait for.
    bus.flush().await.unwrap();
}

#[tokio::test]
async fn publishing_before_a_link_is_up_is_refused_at_once() {
    let server = broker::Server::new(broker::Config::default());
    let bus = Bus::new(
        BusOptions::direct(server.attacher()),
        "first.>".into(),
        1u32,
        1 << 20,
    );
    let refused = bus.publish_bytes("first.a", Reply::None, b"x");
    assert_eq!(refused, Err(BusError::Disconnected));
    assert_eq!(bus.flush().await, Err(BusError::Disconnected));
}

#[tokio::test]
async fn unsubscribe_after_ends_a_direct_subscription_at_its_count() {
    let server = broker::Server::new(broker::Config::default());
    let (bus, mut heard) = linked(server.attacher(), "unused").await;
    let sid = bus.subscribe("counted".into(), None, 3);
    publish(&bus, "counted", [1]);
    bus.unsubscribe_after(sid, 3);
    publish(&bus, "counted", [2, 3, 4, 5]);
    assert_eq!(
        heard_now(&mut heard),
        [(3, "1".into()), (3, "2".into()), (3, "3".into())]
    );
}

/// Answers each request it is handed, from inside the delivery, on its own bus.
struct Answering {
    bus: OnceLock<Weak<Bus<u32>>>,
}

impl Dispatch<u32> for Answering {
    fn deliver(&self, _: &u32, msg: Incoming<'_>) {
        let (Some(reply), Some(bus)) = (msg.reply, self.bus.get().and_then(Weak::upgrade)) else {
            return;
        };
        let reply = std::str::from_utf8(reply).unwrap();
        bus.publish_bytes(reply, Reply::None, &msg.payload).unwrap();
    }
    fn connected(&self) {}
    fn lost(&self) {}
}

#[tokio::test]
async fn a_dispatch_that_publishes_while_delivered_to_answers_at_once() {
    let server = broker::Server::new(broker::Config::default());
    let answering = Arc::new(Answering {
        bus: OnceLock::new(),
    });
    let worker = Bus::new(
        BusOptions::direct(server.attacher()),
        "svc.echo".into(),
        9u32,
        1 << 20,
    );
    answering.bus.set(Arc::downgrade(&worker)).unwrap();
    tokio::spawn(run(worker.clone(), answering));
    let (asker, mut heard) = linked(server.attacher(), "unused").await;
    tokio::time::timeout(Duration::from_secs(10), async {
        while !worker.is_connected() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    let reply = Reply::Request {
        prefix: "first.reply.",
        id: 7,
    };
    asker.publish_bytes("svc.echo", reply, b"hi").unwrap();
    assert_eq!(heard_now(&mut heard), [(1, "hi".into())]);
}

/// Attaches to the servers in turn: the first link to `servers[0]`, then `servers[1]`.
fn in_turn(servers: [broker::Server; 2]) -> Attach {
    let made = AtomicUsize::new(0);
    Arc::new(
        move |name: &str, sink: Arc<dyn Sink>| -> Option<Box<dyn Link>> {
            let server = &servers[made.fetch_add(1, Ordering::Relaxed).min(1)];
            Some(Box::new(server.attach(name, sink)?))
        },
    )
}

#[tokio::test]
async fn a_link_the_broker_closes_is_lost_and_made_again_with_every_subscription() {
    let config = broker::Config {
        lame_duck_grace_period: Duration::ZERO,
        lame_duck_duration: Duration::from_millis(50),
        ..broker::Config::default()
    };
    let (first, second) = (
        broker::Server::new(config),
        broker::Server::new(broker::Config::default()),
    );
    let shutdown = CancellationToken::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = first.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move { running.run(listener, stop).await });
    let (bus, mut heard) = linked(in_turn([first.clone(), second.clone()]), "kept").await;
    first.lame_duck();
    assert_eq!(next(&mut heard).await, Event::Lost);
    assert_eq!(next(&mut heard).await, Event::Up);
    assert_eq!(bus.server_info().unwrap().server_id, second.id());
    // The subscriptions are on the new link: another client of the second server
    // reaches them.
    let other = second.attach("other", Arc::new(Nobody)).unwrap();
    other.publish(b"kept", None, b"1");
    other.publish(b"first.x", None, b"2");
    assert_eq!(heard_now(&mut heard), [(2, "1".into()), (1, "2".into())]);
    shutdown.cancel();
}

/// A sink that wants nothing.
struct Nobody;

impl Sink for Nobody {
    fn deliver(&self, _: u64, _: &[u8], _: Option<&[u8]>, _: Option<&[u8]>, _: &[u8]) {}
}
