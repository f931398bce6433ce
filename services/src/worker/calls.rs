//! The worker's side of calls between services (docs/workers.md, "Calling other
//! services"): where they go and how their results come back into the frame loop.
//!
//! A call for route `service.method` is an `RpcRequest` published on
//! `<prefix>.svc.<service>.<method>`, the subject a gate's request for that route takes,
//! with reply subject `<prefix>.call.<worker id>.<call id>`. The worker subscribes
//! `<prefix>.call.<worker id>.*` plainly (its id is random per start, so no other
//! worker shares it) and hands each answer to its loop as the result of the call its
//! last token names; the bus's "no responders" (no worker of that service) is a 503.

use async_nats::{Client, Subscriber};
use futures::StreamExt;
use proto::Message as _;
use proto::code;
use proto::rpc::{RpcRequest, RpcResponse};
use tokio::sync::mpsc;

use super::error::WorkerError;
use crate::context::CallResult;
use crate::frame_loop::Returned;

/// Where a worker's calls' answers come back.
pub(super) struct CallReplies {
    /// `<prefix>.call.<worker id>.`: a call's reply subject is this and its id.
    pub reply_prefix: String,
    pub subscriber: Subscriber,
}

impl CallReplies {
    /// Subscribes the reply subjects of a new worker id.
    pub async fn subscribe(client: &Client, prefix: &str) -> Result<CallReplies, WorkerError> {
        let reply_prefix = format!("{prefix}.call.{:016x}.", fastrand::u64(..));
        let subject = format!("{reply_prefix}*");
        let subscriber = client
            .subscribe(subject.clone())
            .await
            .map_err(|source| WorkerError::Subscribe { subject, source })?;
        Ok(CallReplies {
            reply_prefix,
            subscriber,
        })
    }
}

/// The subject and reply subject of a call for `request.route` with id `id`.
pub(super) fn subjects(
    prefix: &str,
    reply_prefix: &str,
    id: u64,
    request: &RpcRequest,
) -> (String, String) {
    (
        format!("{prefix}.svc.{}", request.route),
        format!("{reply_prefix}{id}"),
    )
}

/// Hands the answers on `replies` to the loop through `returns`, until the loop stops.
pub(super) async fn forward(mut replies: CallReplies, returns: mpsc::Sender<Returned>) {
    loop {
        let message = tokio::select! {
            message = replies.subscriber.next() => match message {
                Some(message) => message,
                None => return,
            },
            () = returns.closed() => return,
        };
        let Some(id) = message
            .subject
            .strip_prefix(replies.reply_prefix.as_str())
            .and_then(|id| id.parse().ok())
        else {
            continue;
        };
        let result = if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            CallResult::error(code::UNAVAILABLE, "no worker available now")
        } else {
            match RpcResponse::decode(message.payload) {
                Ok(response) => CallResult {
                    code: response.code,
                    body: response.body,
                    message: response.message,
                    calls: response.calls,
                },
                Err(e) => CallResult::error(
                    code::HANDLER_ERROR,
                    format!("malformed answer to a call: {e}"),
                ),
            }
        };
        if returns.send(Returned { id, result }).await.is_err() {
            return;
        }
    }
}
