//! The worker's output is its [`Pusher`]: answers, event answers, pushes and calls to
//! other services all leave through one connection, so they reach each gate in the
//! order the loop produced them (a handler's pushes before its answer).

use async_nats::Subject;
use bytes::Bytes;
use proto::Message as _;
use proto::rpc::RpcResponse;

use super::calls;
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
}

/// Answers go out as protobuf `RpcResponse`s on the request's reply subject, pushes on
/// their subjects. A failure means the client is closing: counted, and logged below info.
impl ReplySink for Output {
    type To = Subject;

    async fn send(&self, to: Subject, response: RpcResponse) {
        let payload = response.encode_to_vec().into();
        if let Err(error) = self.pusher.client().publish(to, payload).await {
            metrics::counter!(REPLY_ERRORS_TOTAL).increment(1);
            tracing::debug!(%error, "cannot publish a reply");
        }
    }

    async fn answer(&self, to: Subject, body: Bytes) {
        if let Err(error) = self.pusher.client().publish(to, body).await {
            metrics::counter!(REPLY_ERRORS_TOTAL).increment(1);
            tracing::debug!(%error, "cannot publish an event's answer");
        }
    }

    async fn publish(&self, outbound: Outbound) {
        if let Err(error) = self.pusher.send(outbound).await {
            metrics::counter!(PUBLISH_ERRORS_TOTAL).increment(1);
            tracing::debug!(%error, "cannot publish a push");
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
}
