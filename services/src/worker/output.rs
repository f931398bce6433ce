//! The worker's output is its [`Pusher`]: answers, event answers and pushes all leave
//! through one connection, so they reach each gate in the order the loop produced them
//! (a handler's pushes before its answer).

use async_nats::Subject;
use bytes::Bytes;
use proto::Message as _;
use proto::rpc::RpcResponse;

use crate::frame_loop::ReplySink;
use crate::metrics::{PUBLISH_ERRORS_TOTAL, REPLY_ERRORS_TOTAL};
use crate::push::{Outbound, Pusher};

/// Answers go out as protobuf `RpcResponse`s on the request's reply subject, pushes on
/// their subjects. A failure means the client is closing: counted, and logged below info.
impl ReplySink for Pusher {
    type To = Subject;

    async fn send(&self, to: Subject, response: RpcResponse) {
        let payload = response.encode_to_vec().into();
        if let Err(error) = self.client().publish(to, payload).await {
            metrics::counter!(REPLY_ERRORS_TOTAL).increment(1);
            tracing::debug!(%error, "cannot publish a reply");
        }
    }

    async fn answer(&self, to: Subject, body: Bytes) {
        if let Err(error) = self.client().publish(to, body).await {
            metrics::counter!(REPLY_ERRORS_TOTAL).increment(1);
            tracing::debug!(%error, "cannot publish an event's answer");
        }
    }

    async fn publish(&self, outbound: Outbound) {
        if let Err(error) = Pusher::send(self, outbound).await {
            metrics::counter!(PUBLISH_ERRORS_TOTAL).increment(1);
            tracing::debug!(%error, "cannot publish a push");
        }
    }
}
