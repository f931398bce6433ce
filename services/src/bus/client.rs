//! The worker's handle on the bus: an async-nats client (TCP or TLS to any NATS server,
//! a cluster, reconnects and lame duck), or a connection in process to an embedded broker
//! ([`super::connect_in_process`], what `shaddock up` gives its own workers: no socket and
//! no kernel between them and the broker). Both speak NATS to the same broker, so workers
//! of either kind share subjects and queue groups.
//!
//! The methods are async-nats' own, with its messages and errors, so the worker's code
//! reads the same for both; only unsubscribing, draining and reconnecting report their
//! failures as [`Unsent`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_nats::client::{FlushError, PublishError, RequestError, Statistics};
use async_nats::subject::ToSubject;
use async_nats::{Message, ServerInfo, SubscribeError};
use bytes::Bytes;
use futures::Stream;

use super::local::{Local, LocalSubscription};

/// A connection to the bus. Cheap to clone: clones share the connection.
#[derive(Clone, Debug)]
pub struct Client(Inner);

#[derive(Clone, Debug)]
enum Inner {
    Nats(async_nats::Client),
    Local(Arc<Local>),
}

/// An unsubscribe, drain or reconnect that could not be sent: the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsent(String);

impl Unsent {
    fn of(error: impl std::fmt::Display) -> Unsent {
        Unsent(error.to_string())
    }
}

impl From<async_nats::Client> for Client {
    fn from(client: async_nats::Client) -> Client {
        Client(Inner::Nats(client))
    }
}

impl Client {
    pub(super) fn local(local: Local) -> Client {
        Client(Inner::Local(Arc::new(local)))
    }

    /// The async-nats client under a network connection (for its JetStream API, which
    /// the in-process connection to an embedded broker does not have).
    pub(crate) fn nats(&self) -> Option<&async_nats::Client> {
        match &self.0 {
            Inner::Nats(client) => Some(client),
            Inner::Local(_) => None,
        }
    }

    /// Publishes `payload` on `subject`.
    pub async fn publish<S: ToSubject>(
        &self,
        subject: S,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        match &self.0 {
            Inner::Nats(client) => client.publish(subject, payload).await,
            Inner::Local(local) => local.publish(&subject.to_subject(), None, payload).await,
        }
    }

    /// Publishes `payload` on `subject`, answers to go to `reply`.
    pub async fn publish_with_reply<S: ToSubject, R: ToSubject>(
        &self,
        subject: S,
        reply: R,
        payload: Bytes,
    ) -> Result<(), PublishError> {
        match &self.0 {
            Inner::Nats(client) => client.publish_with_reply(subject, reply, payload).await,
            Inner::Local(local) => {
                let reply = reply.to_subject();
                (local.publish(&subject.to_subject(), Some(&reply), payload)).await
            }
        }
    }

    /// Sends a request and waits for its first answer (async-nats' default timeout,
    /// 10 s); a "no responders" status is [`RequestErrorKind::NoResponders`](async_nats::client::RequestErrorKind).
    pub async fn request<S: ToSubject>(
        &self,
        subject: S,
        payload: Bytes,
    ) -> Result<Message, RequestError> {
        match &self.0 {
            Inner::Nats(client) => client.request(subject, payload).await,
            Inner::Local(local) => local.request(&subject.to_subject(), payload).await,
        }
    }

    /// Subscribes `subject`.
    pub async fn subscribe<S: ToSubject>(&self, subject: S) -> Result<Subscriber, SubscribeError> {
        match &self.0 {
            Inner::Nats(client) => client.subscribe(subject).await.map(Subscriber::nats),
            Inner::Local(local) => Ok(Subscriber::local(
                local.subscribe(&subject.to_subject(), None),
            )),
        }
    }

    /// Subscribes `subject` in queue group `queue_group`.
    pub async fn queue_subscribe<S: ToSubject>(
        &self,
        subject: S,
        queue_group: String,
    ) -> Result<Subscriber, SubscribeError> {
        match &self.0 {
            Inner::Nats(client) => {
                (client.queue_subscribe(subject, queue_group).await).map(Subscriber::nats)
            }
            Inner::Local(local) => Ok(Subscriber::local(
                local.subscribe(&subject.to_subject(), Some(queue_group)),
            )),
        }
    }

    /// Writes what is queued. In process, also waits for the broker's answer to a ping
    /// sent after it: the broker has read everything before it.
    pub async fn flush(&self) -> Result<(), FlushError> {
        match &self.0 {
            Inner::Nats(client) => client.flush().await,
            Inner::Local(local) => local.flush().await,
        }
    }

    /// Whether the connection is up now (in process, always): what is published while
    /// it is not waits in the client until it is back.
    pub fn is_connected(&self) -> bool {
        match &self.0 {
            Inner::Nats(client) => {
                client.connection_state() == async_nats::connection::State::Connected
            }
            Inner::Local(_) => true,
        }
    }

    /// What the server said of itself when the connection was made.
    pub fn server_info(&self) -> ServerInfo {
        match &self.0 {
            Inner::Nats(client) => client.server_info(),
            Inner::Local(local) => local.server_info(),
        }
    }

    /// Counts of the connection; `connects` is how many times it was made.
    pub fn statistics(&self) -> Arc<Statistics> {
        match &self.0 {
            Inner::Nats(client) => client.statistics(),
            Inner::Local(local) => local.statistics(),
        }
    }

    /// A subject nobody else uses, for answers.
    pub fn new_inbox(&self) -> String {
        match &self.0 {
            Inner::Nats(client) => client.new_inbox(),
            Inner::Local(local) => local.new_inbox(),
        }
    }

    /// Drops the connection and makes a new one (to another server of the list, when
    /// it has one). In process there is nothing to move to: refused.
    pub async fn force_reconnect(&self) -> Result<(), Unsent> {
        match &self.0 {
            Inner::Nats(client) => client.force_reconnect().await.map_err(Unsent::of),
            Inner::Local(_) => Err(Unsent(
                "an in-process connection has no other server".into(),
            )),
        }
    }

    /// The async-nats client underneath, for what only it has (its connection state,
    /// say); `None` in process.
    pub fn as_nats(&self) -> Option<&async_nats::Client> {
        match &self.0 {
            Inner::Nats(client) => Some(client),
            Inner::Local(_) => None,
        }
    }

    /// Unsubscribes everything, lets what was already delivered be read, writes what is
    /// queued, and closes.
    pub async fn drain(&self) -> Result<(), Unsent> {
        match &self.0 {
            Inner::Nats(client) => client.drain().await.map_err(Unsent::of),
            Inner::Local(local) => local.drain().await.map_err(Unsent::of),
        }
    }
}

/// A subscription: a stream of its messages, ending when it is unsubscribed (after what
/// was delivered before) or has delivered the count it was limited to.
#[derive(Debug)]
pub struct Subscriber(SubInner);

#[derive(Debug)]
enum SubInner {
    Nats(async_nats::Subscriber),
    Local(LocalSubscription),
}

impl Subscriber {
    fn nats(subscriber: async_nats::Subscriber) -> Subscriber {
        Subscriber(SubInner::Nats(subscriber))
    }

    fn local(subscription: LocalSubscription) -> Subscriber {
        Subscriber(SubInner::Local(subscription))
    }

    /// Unsubscribes: the server sends no more; what was delivered is still read.
    pub async fn unsubscribe(&mut self) -> Result<(), Unsent> {
        match &mut self.0 {
            SubInner::Nats(subscriber) => subscriber.unsubscribe().await.map_err(Unsent::of),
            SubInner::Local(subscription) => {
                subscription.unsubscribe();
                Ok(())
            }
        }
    }

    /// Unsubscribes once `max` messages were delivered in all (NATS' auto-unsubscribe);
    /// the stream ends after the last.
    pub async fn unsubscribe_after(&mut self, max: u64) -> Result<(), Unsent> {
        match &mut self.0 {
            SubInner::Nats(subscriber) => {
                (subscriber.unsubscribe_after(max).await).map_err(Unsent::of)
            }
            SubInner::Local(subscription) => {
                subscription.unsubscribe_after(max);
                Ok(())
            }
        }
    }

    /// Unsubscribes and ends the stream after what was delivered.
    pub async fn drain(&mut self) -> Result<(), Unsent> {
        match &mut self.0 {
            SubInner::Nats(subscriber) => subscriber.drain().await.map_err(Unsent::of),
            SubInner::Local(subscription) => {
                subscription.unsubscribe();
                Ok(())
            }
        }
    }
}

impl Stream for Subscriber {
    type Item = Message;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        match &mut self.0 {
            SubInner::Nats(subscriber) => Pin::new(subscriber).poll_next(cx),
            SubInner::Local(subscription) => subscription.poll_next(cx),
        }
    }
}

/// [`broker::testing::round_trip`] through a client over the network.
#[cfg(test)]
pub(crate) async fn round_trip(client: &Client) {
    let client = client
        .as_nats()
        .expect("the crate's unit tests connect over the network");
    broker::testing::round_trip(client).await;
}
