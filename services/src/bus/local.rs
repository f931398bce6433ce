//! A worker's connection to an embedded broker in the same process
//! ([`super::connect_in_process`]): the bus connection the gate uses ([`::bus`]), over
//! a direct link (no bytes: a publish is routed by the call, and each message for this
//! connection is handed over on the publisher's thread). Each message goes to its
//! subscription's queue; a request's answer goes to the request waiting for it.
//!
//! A subscription's queue holds at most [`SUBSCRIPTION_CAPACITY`] messages, as
//! async-nats' does by default: past that what arrives is dropped (the publisher must
//! never wait on one subscriber), counted and logged, as async-nats reports a slow
//! consumer.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use ::bus::{Attach, Bus, BusOptions, Dispatch, Incoming, Reply};
use anyhow::Context as _;
use async_nats::client::{
    FlushError, FlushErrorKind, PublishError, PublishErrorKind, RequestError, RequestErrorKind,
    Statistics,
};
use async_nats::{Message, ServerInfo, StatusCode, Subject};
use bytes::Bytes;
use net::LogLimiter;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::metrics::SLOW_CONSUMER_DROPS_TOTAL;

/// The most messages a subscription's queue holds before the reader drops what
/// arrives for it (async-nats' default capacity).
pub const SUBSCRIPTION_CAPACITY: usize = 65_536;
/// How long a request waits for its answer (async-nats' default).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a subscription's messages go.
#[derive(Clone)]
pub(crate) enum Route {
    /// `<inbox>.*`: answers to this connection's requests.
    Answers,
    Subscription(mpsc::Sender<Message>),
}

/// Requests waiting for their answers, by token.
#[derive(Default)]
struct Waiting {
    next: AtomicU64,
    by_token: Mutex<HashMap<u64, oneshot::Sender<Message>>>,
}

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Message>>> {
        self.by_token.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the connection's reader hands messages to.
struct Deliver {
    waiting: Arc<Waiting>,
    stats: Arc<Statistics>,
    up: Notify,
}

/// One log line a second at most for what the reader drops.
static DROP_LOG: LogLimiter = LogLimiter::per_second();

impl Dispatch<Route> for Deliver {
    fn deliver(&self, route: &Route, msg: Incoming<'_>) {
        self.stats.in_messages.fetch_add(1, Ordering::Relaxed);
        let len = msg.payload.len();
        self.stats.in_bytes.fetch_add(len as u64, Ordering::Relaxed);
        let Some(message) = message(&msg) else {
            if let Some(tally) = DROP_LOG.check() {
                let subject = String::from_utf8_lossy(msg.subject);
                tracing::warn!(%subject, "a message whose subject or reply is not UTF-8 dropped{tally}");
            }
            return;
        };
        match route {
            Route::Answers => {
                let token = msg.subject.rsplit(|&b| b == b'.').next();
                let token = token.and_then(|t| std::str::from_utf8(t).ok()?.parse().ok());
                let waiter = token.and_then(|token| self.waiting.lock().remove(&token));
                if let Some(waiter) = waiter {
                    let _ = waiter.send(message);
                }
            }
            Route::Subscription(queue) => {
                if let Err(mpsc::error::TrySendError::Full(message)) = queue.try_send(message) {
                    metrics::counter!(SLOW_CONSUMER_DROPS_TOTAL).increment(1);
                    if let Some(tally) = DROP_LOG.check() {
                        tracing::warn!(subject = %message.subject, "slow consumer: a subscription's queue is full, a message dropped{tally}");
                    }
                }
            }
        }
    }

    fn connected(&self) {
        self.stats.connects.fetch_add(1, Ordering::Relaxed);
        self.up.notify_one();
    }

    fn lost(&self) {
        tracing::warn!("the in-process bus connection was lost");
    }
}

/// `msg` as async-nats' message; `None` for a subject or reply that is not UTF-8
/// (async-nats' messages hold `str` subjects).
fn message(msg: &Incoming<'_>) -> Option<Message> {
    let subject = |bytes: &[u8]| Subject::from_utf8(Bytes::copy_from_slice(bytes)).ok();
    Some(Message {
        subject: subject(msg.subject)?,
        reply: match msg.reply {
            Some(reply) => Some(subject(reply)?),
            None => None,
        },
        payload: msg.payload.clone(),
        headers: None,
        status: msg.status.and_then(|s| StatusCode::from_u16(s).ok()),
        description: None,
        length: msg.payload.len(),
    })
}

/// One in-process connection, shared by its [`Client`]s.
pub(crate) struct Local {
    bus: Arc<Bus<Route>>,
    waiting: Arc<Waiting>,
    stats: Arc<Statistics>,
    /// This connection's inbox: requests are answered on `<inbox>.<token>`.
    inbox: String,
    /// The broker's largest payload, as it said when the connection was made.
    max_payload: usize,
}

impl fmt::Debug for Local {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Local")
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // What is queued is still written (the bus's stop flushes it).
        self.bus.stop();
    }
}

impl Local {
    /// Connects to the broker `attach` reaches in process, as connection `name`;
    /// returns once the broker has taken the connection.
    pub(super) async fn connect(attach: Attach, name: &str) -> anyhow::Result<Local> {
        let mut options = BusOptions::direct(attach);
        options.name = name.to_owned();
        let timeout = options.connect_timeout;
        let inbox = fresh_inbox();
        let stats = Arc::new(Statistics::default());
        let waiting = Arc::new(Waiting::default());
        // A direct link buffers nothing: a publish is routed by the call.
        let bus = Bus::new(options, format!("{inbox}.*"), Route::Answers, 0);
        let deliver = Arc::new(Deliver {
            waiting: waiting.clone(),
            stats: stats.clone(),
            up: Notify::new(),
        });
        tokio::spawn(::bus::run(bus.clone(), deliver.clone()));
        tokio::time::timeout(timeout, deliver.up.notified())
            .await
            .with_context(|| {
                format!("the embedded broker did not take connection {name} within {timeout:?}")
            })?;
        let max_payload = bus.server_info().map_or(0, |info| info.max_payload);
        Ok(Local {
            bus,
            waiting,
            stats,
            inbox,
            max_payload,
        })
    }
}

fn fresh_inbox() -> String {
    format!(
        "_INBOX.{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    )
}

impl Local {
    pub(super) async fn publish(
        &self,
        subject: &Subject,
        reply: Option<&Subject>,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        if payload.len() > self.max_payload {
            return Err(PublishError::new(PublishErrorKind::MaxPayloadExceeded));
        }
        let reply = reply.map_or(Reply::None, |reply| Reply::Subject(reply.as_str()));
        (self.bus.publish_bytes(subject.as_str(), reply, &payload))
            .map_err(|error| PublishError::with_source(PublishErrorKind::Send, error))?;
        self.stats.out_messages.fetch_add(1, Ordering::Relaxed);
        let len = payload.len() as u64;
        self.stats.out_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    pub(super) async fn request(
        &self,
        subject: &Subject,
        payload: Bytes,
    ) -> Result<Message, RequestError> {
        let token = self.waiting.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().insert(token, tx);
        let reply = Subject::from(format!("{}.{token}", self.inbox));
        let forget = || self.waiting.lock().remove(&token);
        if let Err(error) = self.publish(subject, Some(&reply), payload).await {
            forget();
            return Err(RequestError::with_source(RequestErrorKind::Other, error));
        }
        match tokio::time::timeout(REQUEST_TIMEOUT, rx).await {
            Ok(Ok(answer)) if answer.status == Some(StatusCode::NO_RESPONDERS) => {
                Err(RequestError::new(RequestErrorKind::NoResponders))
            }
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(RequestError::new(RequestErrorKind::Other)),
            Err(_) => {
                forget();
                Err(RequestError::new(RequestErrorKind::TimedOut))
            }
        }
    }

    pub(super) fn subscribe(&self, subject: &Subject, queue: Option<String>) -> LocalSubscription {
        let (tx, rx) = mpsc::channel(SUBSCRIPTION_CAPACITY);
        let sid = (self.bus).subscribe(subject.to_string(), queue, Route::Subscription(tx));
        LocalSubscription {
            sid,
            rx,
            bus: self.bus.clone(),
        }
    }

    pub(super) async fn flush(&self) -> Result<(), FlushError> {
        (self.bus.flush().await)
            .map_err(|error| FlushError::with_source(FlushErrorKind::FlushError, error))
    }

    pub(super) fn server_info(&self) -> ServerInfo {
        let server_id = self.bus.server_info().map(|info| info.server_id);
        ServerInfo {
            server_id: server_id.unwrap_or_default(),
            max_payload: self.max_payload,
            ..ServerInfo::default()
        }
    }

    pub(super) fn statistics(&self) -> Arc<Statistics> {
        self.stats.clone()
    }

    pub(super) fn new_inbox(&self) -> String {
        fresh_inbox()
    }

    /// Writes what is queued, and closes the connection.
    pub(super) async fn drain(&self) -> Result<(), ::bus::BusError> {
        let flushed = self.bus.flush().await;
        self.bus.stop();
        flushed
    }
}

/// A subscription on an in-process connection: its queue, filled by the reader.
pub(crate) struct LocalSubscription {
    sid: u64,
    rx: mpsc::Receiver<Message>,
    bus: Arc<Bus<Route>>,
}

impl fmt::Debug for LocalSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalSubscription")
            .field("sid", &self.sid)
            .finish_non_exhaustive()
    }
}

impl LocalSubscription {
    /// The bus forgets the subscription, and with it the queue's sender: the stream
    /// ends after what was delivered.
    pub(super) fn unsubscribe(&mut self) {
        self.bus.unsubscribe(self.sid);
    }

    /// The bus forgets the subscription once `max` messages were delivered in all.
    pub(super) fn unsubscribe_after(&mut self, max: u64) {
        self.bus.unsubscribe_after(self.sid, max);
    }

    pub(super) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for LocalSubscription {
    fn drop(&mut self) {
        self.bus.unsubscribe(self.sid);
    }
}

#[cfg(test)]
mod tests {
    use async_nats::client::RequestErrorKind;
    use futures::{FutureExt as _, StreamExt as _};

    use super::*;
    use crate::bus::{Client, connect_in_process};

    async fn connected(server: &broker::Server) -> Client {
        connect_in_process(server.attacher(), "test")
            .await
            .expect("connects")
    }

    /// A subscription nobody reads holds [`SUBSCRIPTION_CAPACITY`] messages; the next
    /// is dropped (and counted), the connection and its other subscriptions unharmed.
    #[tokio::test]
    async fn a_queue_holds_its_capacity_and_what_comes_past_it_is_dropped() {
        let server = broker::Server::new(broker::Config::default());
        let client = connected(&server).await;
        let mut full = client.subscribe("t.full").await.unwrap();
        let mut other = client.subscribe("t.other").await.unwrap();
        for _ in 0..=SUBSCRIPTION_CAPACITY {
            client.publish("t.full", Bytes::new()).await.unwrap();
        }
        client.publish("t.other", Bytes::new()).await.unwrap();
        // Each was routed by its publish: a flush has nothing left to wait for.
        client.flush().await.unwrap();
        // Unconstrained: tokio's budget would otherwise stop the reads after 128.
        let queued = tokio::task::unconstrained(async {
            let mut queued = 0;
            while let Some(Some(_)) = full.next().now_or_never() {
                queued += 1;
            }
            queued
        })
        .await;
        assert_eq!(queued, SUBSCRIPTION_CAPACITY);
        assert!(other.next().now_or_never().flatten().is_some());
    }

    #[tokio::test]
    async fn a_request_nobody_serves_is_told_no_responders() {
        let server = broker::Server::new(broker::Config::default());
        let client = connected(&server).await;
        let asked = client.request("t.nobody", Bytes::new()).await;
        assert_eq!(asked.unwrap_err().kind(), RequestErrorKind::NoResponders);
        let mut served = client.subscribe("t.echo").await.unwrap();
        let answering = client.clone();
        tokio::spawn(async move {
            let asked = served.next().await.expect("a request");
            let reply = asked.reply.expect("a reply subject");
            answering.publish(reply, asked.payload).await.unwrap();
        });
        client.flush().await.unwrap();
        let answer = client
            .request("t.echo", Bytes::from_static(b"hi"))
            .await
            .unwrap();
        assert_eq!(&answer.payload[..], b"hi");
    }
}
