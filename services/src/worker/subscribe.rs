//! What a worker subscribes, and a peer's snapshot.
//!
//! A starting worker subscribes the service's events first, then, if the service asks
//! for it ([`Service::on_start_sync`](crate::Service::on_start_sync)), requests a
//! snapshot from a running peer, and only then subscribes the snapshot subject and the
//! requests: so it never asks itself, every change published after its event
//! subscriptions reached the broker is delivered to it, and the snapshot (the first
//! thing its loop runs) covers the changes before. No responders means no peer runs:
//! the worker starts empty. A peer that does not answer within [`SYNC_TIMEOUT`],
//! [`SYNC_ATTEMPTS`] times, fails the start: serving without the state would answer
//! wrongly.

use std::pin::Pin;
use std::time::Duration;

use async_nats::Subject;
use async_nats::client::RequestErrorKind;
use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::error::WorkerError;
use crate::bus::{Client, Subscriber};
use crate::frame_loop::Incoming;
use crate::service::Delivery;

/// How long a starting worker waits for a peer's snapshot, per attempt. A peer answers
/// from its loop, behind whatever it has queued, so this allows for a busy one.
pub(super) const SYNC_TIMEOUT: Duration = Duration::from_secs(3);
/// Attempts at a snapshot before the start fails.
const SYNC_ATTEMPTS: u32 = 3;

pub(super) type Boxed<T> = Pin<Box<dyn Stream<Item = T> + Send>>;

/// What the worker subscribes, to subscribe it again on another connection.
#[derive(Debug, Clone)]
pub(super) struct Subjects {
    /// `<prefix>.svc.<service>.>`.
    pub requests: String,
    /// The service's queue group.
    pub group: String,
    pub prefix: String,
    /// Event subjects as the service registered them (without the prefix).
    pub queue_events: Vec<String>,
    pub all_events: Vec<String>,
}

/// One of the service's event subjects, subscribed.
pub(super) struct EventSubscription {
    /// As the service registered it (without the prefix).
    pub subject: String,
    pub delivery: Delivery,
    pub subscriber: Subscriber,
}

/// A service's snapshot subject, subscribed after the start's snapshot was fetched.
pub(super) struct SyncSubscription {
    pub events: EventSubscription,
    /// Under the prefix: where to ask again after a reconnect.
    pub prefixed: String,
    /// The client's count of connections made when the start asked for the snapshot.
    pub connects: u64,
}

/// Subscribes `<prefix>.<subject>`, in the service's queue group for
/// [`Delivery::Queue`].
pub(super) async fn subscribe_event(
    client: &Client,
    prefix: &str,
    service: &str,
    subject: &str,
    delivery: Delivery,
) -> Result<EventSubscription, WorkerError> {
    let full = format!("{prefix}.{subject}");
    let subscribed = match delivery {
        Delivery::Queue => {
            client
                .queue_subscribe(full.clone(), service.to_owned())
                .await
        }
        Delivery::All => client.subscribe(full.clone()).await,
    };
    let subscriber = subscribed.map_err(|source| WorkerError::Subscribe {
        subject: full,
        source,
    })?;
    Ok(EventSubscription {
        subject: subject.to_owned(),
        delivery,
        subscriber,
    })
}

/// Asks a running peer for the service's state (see the module docs); `None` when no
/// peer runs.
pub(super) async fn fetch_snapshot(
    client: &Client,
    subject: &str,
) -> Result<Option<Bytes>, WorkerError> {
    for attempt in 1..=SYNC_ATTEMPTS {
        let asked = tokio::time::timeout(
            SYNC_TIMEOUT,
            client.request(subject.to_owned(), Bytes::new()),
        )
        .await;
        match asked {
            Ok(Ok(message)) => {
                tracing::info!(%subject, bytes = message.payload.len(), "snapshot from a peer");
                return Ok(Some(message.payload));
            }
            Ok(Err(e)) if e.kind() == RequestErrorKind::NoResponders => {
                tracing::info!(%subject, "no peer runs to ask: this worker's state stands");
                return Ok(None);
            }
            Ok(Err(error)) => tracing::warn!(%subject, attempt, %error, "snapshot request failed"),
            Err(_) => tracing::warn!(%subject, attempt, "no snapshot in time"),
        }
    }
    Err(WorkerError::Sync(subject.to_owned()))
}

/// Messages on an event subject as the loop's input.
pub(super) fn to_events(
    messages: impl Stream<Item = async_nats::Message> + Send + 'static,
    subject: String,
) -> Boxed<Incoming<Subject>> {
    messages
        .map(move |m| Incoming::event(subject.clone(), m.payload, m.reply))
        .boxed()
}
