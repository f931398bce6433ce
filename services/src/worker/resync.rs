//! The snapshot subject after the start: served from the loop, left and asked again
//! after the worker's inputs were cut off (a reconnect) or moved (lame duck).
//!
//! A worker whose connection dropped missed what was published while it was away (core
//! NATS is at most once), and async-nats resubscribes without a word. So before it queues
//! the first request after a reconnect, a worker of a service with a snapshot leaves its
//! own subscription of the snapshot subject (so the request, sent after the UNSUB on the
//! same connection, goes to a peer, never to its own waiting loop), asks, queues the
//! snapshot, and subscribes again. The snapshot *replaces* the state, which is safe:
//! every change the worker took before asking reached the broker before the request, so
//! the peer's snapshot holds it, and every change after is taken after the snapshot. No
//! peer keeps the worker's own state; a peer that does not answer in time keeps it too,
//! with a warning, until the next reconnect.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_nats::{Statistics, Subject};
use bytes::Bytes;
use futures::{Stream, StreamExt, stream};
use tokio_util::sync::CancellationToken;

use super::subscribe::{
    Boxed, SYNC_TIMEOUT, SyncSubscription, fetch_snapshot, subscribe_event, to_events,
};
use crate::bus::{Client, Subscriber};
use crate::frame_loop::Incoming;
use crate::service::Delivery;

/// The snapshot subject's subscription, and what asking again after a reconnect takes.
pub(super) struct Resync {
    client: Client,
    stats: Arc<Statistics>,
    /// The client's count of connections made (the first one included) when the worker
    /// last asked for a snapshot: a higher count means it reconnected since.
    connects: u64,
    /// As the service registered it, the prefix, and the two together.
    subject: String,
    prefix: String,
    prefixed: String,
    /// The service's queue group.
    group: String,
    /// The subscription's messages; `None` after it could not be made again. `stop` drains
    /// it, at shutdown (a child of `shutdown`) or to leave the subject.
    stream: Option<Boxed<Incoming<Subject>>>,
    stop: CancellationToken,
    shutdown: CancellationToken,
}

impl Resync {
    pub(super) fn new(
        client: &Client,
        group: &str,
        prefix: &str,
        sync: SyncSubscription,
        shutdown: &CancellationToken,
    ) -> Self {
        let mut resync = Resync {
            client: client.clone(),
            stats: client.statistics(),
            connects: sync.connects,
            subject: sync.events.subject,
            prefix: prefix.to_owned(),
            prefixed: sync.prefixed,
            group: group.to_owned(),
            stream: None,
            stop: shutdown.child_token(),
            shutdown: shutdown.clone(),
        };
        resync.listen(sync.events.subscriber);
        resync
    }

    fn listen(&mut self, subscriber: Subscriber) {
        self.stop = self.shutdown.child_token();
        self.stream = Some(to_events(
            until_left(subscriber, self.stop.clone()),
            self.subject.clone(),
        ));
    }

    /// The next sync request, or `None` when there is no subscription (or none any more:
    /// a drained one is dropped, never polled again).
    pub(super) async fn next(resync: &mut Option<Resync>) -> Option<Incoming<Subject>> {
        let resync = resync.as_mut()?;
        let request = resync.stream.as_mut()?.next().await;
        if request.is_none() {
            resync.stream = None;
        }
        request
    }

    /// When the connection was made again since the worker last asked, asks again (see
    /// [`Resync::ask_again`]); `None` when it was not.
    pub(super) async fn after_reconnect(
        &mut self,
    ) -> Option<(Vec<Incoming<Subject>>, Option<Bytes>)> {
        let connects = self.stats.connects.load(Ordering::Relaxed);
        if connects == self.connects {
            return None;
        }
        self.connects = connects;
        tracing::info!(subject = %self.prefixed, "reconnected to the bus: asking a peer for the state");
        Some(self.ask_again().await)
    }

    /// The worker's inputs moved to `client` (see [`super::hop`]): the events
    /// taken on the old connection and those on the new one may overlap or miss some, as
    /// across a reconnect, so the subject moves too and a peer is asked again through it.
    pub(super) async fn moved_to(
        &mut self,
        client: &Client,
    ) -> (Vec<Incoming<Subject>>, Option<Bytes>) {
        self.client = client.clone();
        self.stats = client.statistics();
        self.connects = self.stats.connects.load(Ordering::Relaxed);
        tracing::info!(subject = %self.prefixed, "moved to another server: asking a peer for the state");
        self.ask_again().await
    }

    /// Leaves the subject (returning the requests that had already arrived), asks a peer,
    /// and subscribes again.
    async fn ask_again(&mut self) -> (Vec<Incoming<Subject>>, Option<Bytes>) {
        let mut left = Vec::new();
        if let Some(mut stream) = self.stream.take() {
            self.stop.cancel();
            let drained = async {
                while let Some(request) = stream.next().await {
                    left.push(request);
                }
            };
            if tokio::time::timeout(SYNC_TIMEOUT, drained).await.is_err() {
                tracing::warn!(subject = %self.prefixed, "the old subscription did not drain in time; dropping it");
            }
        }
        let snapshot = match fetch_snapshot(&self.client, &self.prefixed).await {
            Ok(snapshot) => snapshot,
            Err(error) => {
                tracing::warn!(%error, "keeping this worker's state, which may miss changes made while it was away");
                None
            }
        };
        let subscribed = subscribe_event(
            &self.client,
            &self.prefix,
            &self.group,
            &self.subject,
            Delivery::Queue,
        )
        .await;
        match subscribed {
            Ok(events) => self.listen(events.subscriber),
            Err(error) => {
                tracing::warn!(subject = %self.prefixed, %error, "cannot subscribe again: peers starting later ask the others");
            }
        }
        (left, snapshot)
    }
}

/// The snapshot subject's messages until `stop`; then it leaves the subject outright
/// (`Subscriber::drain`: async-nats forgets it one I/O turn after the UNSUB), yields
/// what had already arrived, and ends. Used to step aside while asking a peer for a
/// snapshot, so the request, sent after the UNSUB on the same connection, never comes
/// back to this worker; a sync request lost in that instant is asked again by its peer.
fn until_left(
    subscriber: Subscriber,
    stop: CancellationToken,
) -> impl Stream<Item = async_nats::Message> {
    // Kept across messages, so it registers with the token once instead of per message;
    // `None` once draining.
    let stop = Some(Box::pin(stop.cancelled_owned()));
    stream::unfold(
        (subscriber, stop),
        move |(mut subscriber, stop)| async move {
            if let Some(mut stop) = stop {
                tokio::select! {
                    message = subscriber.next() => return Some((message?, (subscriber, Some(stop)))),
                    () = &mut stop => {
                        if let Err(error) = subscriber.drain().await {
                            // The client is closed: nothing more will arrive, nor leave.
                            tracing::warn!(%error, "cannot drain a subscription");
                            return None;
                        }
                    }
                }
            }
            let message = subscriber.next().await?;
            Some((message, (subscriber, None)))
        },
    )
}
