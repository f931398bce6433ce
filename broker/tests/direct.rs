//! Direct connections (`Server::attach`): the protocol's operations as calls, next to
//! TCP clients (async-nats) on the same server: one subject space, one set of queue
//! groups, "no responders", auto-unsubscribe, the limits, and lame duck mode.

mod common;

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use broker::testing::{EmbeddedServer, round_trip};
use broker::{Config, DirectClient};
use bytes::Bytes;
use common::{Conn, Read, get_json};
use futures::StreamExt;
use nats_wire::direct::{Link, Sink};
use testkit::within;
use tokio::sync::Notify;

/// One message as a sink got it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Got {
    sid: u64,
    subject: String,
    reply: Option<String>,
    headers: Option<String>,
    payload: String,
}

/// Keeps what it is handed; with `answer` set, also answers every message that has a
/// reply subject on that link, from inside the delivery (a sink that publishes).
#[derive(Default)]
struct Kept {
    got: Mutex<Vec<Got>>,
    more: Notify,
    answer: OnceLock<Weak<DirectClient>>,
}

impl Sink for Kept {
    fn deliver(
        &self,
        sid: u64,
        subject: &[u8],
        reply: Option<&[u8]>,
        headers: Option<&[u8]>,
        payload: &[u8],
    ) {
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        self.got.lock().unwrap().push(Got {
            sid,
            subject: text(subject),
            reply: reply.map(text),
            headers: headers.map(text),
            payload: text(payload),
        });
        self.more.notify_one();
        if let (Some(reply), Some(link)) = (reply, self.answer.get().and_then(Weak::upgrade)) {
            link.publish(reply, None, payload);
        }
    }
}

impl Kept {
    /// Waits until `n` messages were handed over in all; returns them.
    async fn wait_for(&self, n: usize) -> Vec<Got> {
        within(async {
            loop {
                let more = self.more.notified();
                let got = self.got.lock().unwrap().clone();
                if got.len() >= n {
                    return got;
                }
                more.await;
            }
        })
        .await
    }

    fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }
}

fn attached(bus: &EmbeddedServer, name: &str) -> (Arc<DirectClient>, Arc<Kept>) {
    let kept = Arc::new(Kept::default());
    let client = bus.server.attach(name, kept.clone()).expect("attached");
    (Arc::new(client), kept)
}

#[tokio::test]
async fn a_direct_member_of_a_queue_group_answers_tcp_requests_from_inside_its_sink() {
    let bus = EmbeddedServer::start(Config::default()).await;
    let (direct, kept) = attached(&bus, "worker");
    kept.answer.set(Arc::downgrade(&direct)).unwrap();
    direct.subscribe(7, b"svc.echo", Some(b"echo")).unwrap();
    let tcp = async_nats::connect(&bus.url).await.unwrap();
    let answer = within(tcp.request("svc.echo", Bytes::from_static(b"hi")))
        .await
        .unwrap();
    assert_eq!(&answer.payload[..], b"hi");
    let got = kept.wait_for(1).await;
    assert_eq!(got[0].sid, 7);
    assert_eq!(got[0].subject, "svc.echo");
    assert!(
        got[0].reply.is_some(),
        "a request carries its reply subject"
    );
}

#[tokio::test]
async fn a_direct_publish_reaches_tcp_and_direct_subscribers_and_itself() {
    let bus = EmbeddedServer::start(Config::default()).await;
    let tcp = async_nats::connect(&bus.url).await.unwrap();
    let mut sub = tcp.subscribe("news.>").await.unwrap();
    round_trip(&tcp).await;
    let (publisher, own) = attached(&bus, "publisher");
    let (other, kept) = attached(&bus, "other");
    other.subscribe(1, b"news.*", None).unwrap();
    publisher.subscribe(2, b"news.today", None).unwrap();
    publisher.publish(b"news.today", Some(b"back.here"), b"rain");
    let seen = within(sub.next()).await.unwrap();
    assert_eq!(&seen.payload[..], b"rain");
    assert_eq!(seen.reply.as_deref(), Some("back.here"));
    assert_eq!(kept.wait_for(1).await[0].payload, "rain");
    // Echo is on: the publisher's own subscription gets it too.
    assert_eq!(own.wait_for(1).await[0].sid, 2);
}

#[tokio::test]
async fn a_request_nobody_serves_is_answered_no_responders_on_the_requesters_inbox() {
    let bus = EmbeddedServer::start(Config::default()).await;
    let (direct, kept) = attached(&bus, "asker");
    direct.subscribe(1, b"_INBOX.me.*", None).unwrap();
    direct.publish(b"svc.nobody", Some(b"_INBOX.me.1"), b"?");
    let got = kept.wait_for(1).await;
    assert_eq!(got[0].subject, "_INBOX.me.1");
    let headers = got[0].headers.as_deref().expect("a status message");
    assert!(headers.starts_with("NATS/1.0 503"), "{headers:?}");
    assert_eq!(got[0].payload, "");
}

#[tokio::test]
async fn a_subscription_with_a_max_ends_after_it_and_an_unsubscribed_one_at_once() {
    let bus = EmbeddedServer::start(Config::default()).await;
    let (direct, kept) = attached(&bus, "counted");
    direct.subscribe(1, b"t.counted", None).unwrap();
    direct.unsubscribe(1, Some(2));
    direct.subscribe(2, b"t.gone", None).unwrap();
    direct.unsubscribe(2, None);
    for _ in 0..3 {
        direct.publish(b"t.counted", None, b"x");
        direct.publish(b"t.gone", None, b"x");
    }
    // Deliveries are calls: every publish above was routed before it returned.
    assert_eq!(kept.count(), 2);
    assert!(kept.got.lock().unwrap().iter().all(|g| g.sid == 1));
}

#[tokio::test]
async fn subscriptions_are_refused_past_the_limit_and_for_invalid_subjects() {
    let config = Config {
        max_subscriptions: 2,
        ..Config::default()
    };
    let bus = EmbeddedServer::start(config).await;
    let (direct, kept) = attached(&bus, "limited");
    assert_eq!(direct.subscribe(1, b"a..b", None), Err("Invalid Subject"));
    direct.subscribe(1, b"t.one", None).unwrap();
    direct.subscribe(2, b"t.two", None).unwrap();
    assert_eq!(
        direct.subscribe(3, b"t.three", None),
        Err("maximum subscriptions exceeded")
    );
    // A sid in use keeps its first subscription, as over bytes.
    direct.subscribe(2, b"t.other", None).unwrap();
    direct.publish(b"t.other", None, b"no");
    direct.publish(b"t.two", None, b"yes");
    let got = kept.wait_for(1).await;
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].sid, got[0].payload.as_str()), (2, "yes"));
}

#[tokio::test]
async fn a_tcp_subscriber_that_stops_reading_is_cut_and_never_holds_a_direct_publisher_up() {
    let config = Config {
        max_pending: 256 * 1024,
        ..Config::default()
    };
    let bus = EmbeddedServer::start(config).await;
    let monitor = bus.start_monitor().await;
    let mut reader = Conn::quiet(bus.addr).await;
    reader.send("SUB flood 1\r\n").await;
    reader.ping_pong().await;
    let (direct, _) = attached(&bus, "flooder");
    // 8 MiB, far past what the subscriber's backlog may hold and the sockets buffer:
    // every publish returns (a direct publisher has nothing to wait on).
    let payload = vec![b'x'; 4096];
    for _ in 0..2048 {
        direct.publish(b"flood", None, &payload);
    }
    // The subscriber, read at last, gets what the sockets held, then the close.
    within(async { while reader.read().await != Read::Closed {} }).await;
    let varz = get_json(monitor, "/varz").await;
    assert!(varz["slow_consumers"].as_u64() >= Some(1), "{varz}");
}

#[tokio::test]
async fn attaching_counts_against_max_connections_and_detaching_gives_the_place_back() {
    let config = Config {
        max_connections: 2,
        ..Config::default()
    };
    let bus = EmbeddedServer::start(config).await;
    let (first, _) = attached(&bus, "one");
    let (_second, _) = attached(&bus, "two");
    assert!(
        bus.server
            .attach("three", Arc::new(Kept::default()))
            .is_none()
    );
    drop(first);
    assert!(
        bus.server
            .attach("three", Arc::new(Kept::default()))
            .is_some()
    );
}

#[tokio::test]
async fn lame_duck_closes_a_direct_link_and_refuses_new_ones() {
    let config = Config {
        lame_duck_grace_period: Duration::ZERO,
        lame_duck_duration: Duration::from_millis(100),
        ..Config::default()
    };
    let bus = EmbeddedServer::start(config).await;
    let (direct, kept) = attached(&bus, "leaving");
    direct.subscribe(1, b"t.x", None).unwrap();
    bus.server.lame_duck();
    within(direct.closed()).await;
    assert!(
        bus.server
            .attach("late", Arc::new(Kept::default()))
            .is_none()
    );
    // A closed link delivers nothing, and publishing on it routes nothing.
    direct.publish(b"t.x", None, b"after");
    assert_eq!(kept.count(), 0);
}
