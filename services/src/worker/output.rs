//! The worker's output is its [`Pusher`]: answers, event answers, pushes and calls to
//! other services all leave through one connection, so they reach each gate in the
//! order the loop produced them (a handler's pushes before its answer).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use async_nats::Subject;
use bytes::Bytes;
use proto::Message as _;
use proto::rpc::RpcResponse;

use super::calls;
use super::error::Undelivered;
use super::keyed::Replicator;
use crate::bus::Client;
use crate::context::CallResult;
use crate::frame_loop::{Outgoing, ReplySink};
use crate::metrics::{PUBLISH_ERRORS_TOTAL, REPLY_ERRORS_TOTAL};
use crate::push::{Outbound, Pusher};

/// The frame loop's output on the bus: the pusher, and where calls' answers come back
/// (see [`calls`]).
#[derive(Debug, Clone)]
pub(super) struct Output {
    pub pusher: Pusher,
    /// `<prefix>.call.<worker id>.`
    pub reply_prefix: String,
    /// The keyed services heard of, to route calls by key.
    pub callees: calls::Callees,
    /// What was handed to the connection while it was down.
    pub held: Held,
    /// Where a keyed service's partitions' snapshots go, with standbys.
    pub replicator: Option<Arc<Replicator>>,
}

/// Counts what the worker publishes while its connection is down (see
/// [`Undelivered`]); a connection made since forgets them: async-nats writes what it
/// held first thing on reconnecting.
#[derive(Debug, Clone, Default)]
pub(super) struct Held(Arc<Mutex<(u64, Undelivered)>>);

impl Held {
    /// Counts one answer (or push) just published, if the connection is down.
    fn count(&self, client: &Client, push: bool) {
        if client.is_connected() {
            return;
        }
        let connects = client.statistics().connects.load(Ordering::Relaxed);
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if held.0 != connects {
            *held = (connects, Undelivered::default());
        }
        let counter = if push {
            &mut held.1.pushes
        } else {
            &mut held.1.answers
        };
        *counter += 1;
    }

    /// What is still held: nothing once a connection was made since.
    pub fn undelivered(&self, client: &Client) -> Undelivered {
        let connects = client.statistics().connects.load(Ordering::Relaxed);
        let held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if held.0 == connects && !client.is_connected() {
            held.1
        } else {
            Undelivered::default()
        }
    }
}

impl Output {
    /// Publishes `what` (an answer) on `to`, counted as held while the connection is down.
    async fn reply(&self, to: Subject, payload: Bytes, what: &str) {
        let client = self.pusher.client();
        match client.publish(to, payload).await {
            Ok(()) => self.held.count(client, false),
            Err(error) => {
                metrics::counter!(REPLY_ERRORS_TOTAL).increment(1);
                tracing::debug!(%error, "cannot publish {what}");
            }
        }
    }
}

/// Answers go out as protobuf `RpcResponse`s on the request's reply subject, pushes on
/// their subjects. A failure means the client is closing: counted, and logged below info.
impl ReplySink for Output {
    type To = Subject;

    async fn send(&self, to: Subject, response: RpcResponse) {
        self.reply(to, response.encode_to_vec().into(), "a reply")
            .await;
    }

    async fn answer(&self, to: Subject, body: Bytes) {
        self.reply(to, body, "an event's answer").await;
    }

    async fn publish(&self, outbound: Outbound) {
        match self.pusher.send(outbound).await {
            Ok(()) => self.held.count(self.pusher.client(), true),
            Err(error) => {
                metrics::counter!(PUBLISH_ERRORS_TOTAL).increment(1);
                tracing::debug!(%error, "cannot publish a push");
            }
        }
    }

    async fn call(&self, mut call: Outgoing) -> Result<(), CallResult> {
        let (subject, reply) = calls::subjects(
            self.pusher.prefix(),
            &self.reply_prefix,
            &self.callees,
            call.id,
            &mut call.request,
        )?;
        let payload = call.request.encode_to_vec().into();
        let sent = self
            .pusher
            .client()
            .publish_with_reply(subject, reply, payload)
            .await;
        sent.map_err(|error| {
            metrics::counter!(PUBLISH_ERRORS_TOTAL).increment(1);
            tracing::debug!(%error, "cannot publish a call");
            CallResult::bus_unavailable()
        })
    }

    async fn replicate(&self, states: Vec<(u32, Bytes)>) {
        if let Some(replicator) = &self.replicator {
            replicator.send(states).await;
        }
    }

    fn stands_by(&self, partition: u32) -> bool {
        (self.replicator.as_ref()).is_some_and(|r| r.stands_by(partition))
    }
}
