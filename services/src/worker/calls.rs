//! The worker's side of calls between services (docs/workers.md, "Calling other
//! services"): where they go and how their results come back into the frame loop.
//!
//! A call for route `service.method` is an `RpcRequest` published on
//! `<prefix>.svc.<service>.<method>`, the subject a gate's request for that route takes,
//! with reply subject `<prefix>.call.<worker id>.<call id>`. The worker subscribes
//! `<prefix>.call.<worker id>.*` plainly (its id is random per start, so no other
//! worker shares it) and hands each answer to its loop as the result of the call its
//! last token names; the bus's "no responders" (no worker of that service) is a 503.
//!
//! A call to a **keyed** service goes where a gate would send a client's request of
//! that route: `<prefix>.part.<service>.<partition>.<method>`, by the call's key, else
//! the session value the service names, else the session's uid (`proto::keyed::key_of`;
//! none is a 400 at once). The worker learns which services are keyed as the gates do,
//! from their schema announcements: it listens on `<prefix>.schema.svc.*` and asks once
//! on `<prefix>.schema.ask` when it starts. A service it has not heard announce is
//! called on its plain subject (a keyed one answers that 503).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use bytes::Bytes;
use futures::StreamExt;
use proto::Message as _;
use proto::code;
use proto::keyed::{MAX_PARTITIONS, key_of, partition_of, partition_subject};
use proto::rpc::{RpcRequest, RpcResponse, ServiceSchema};
use tokio::sync::mpsc;

use super::error::WorkerError;
use crate::bus::{Client, Subscriber};
use crate::context::CallResult;
use crate::frame_loop::Returned;
use crate::names::is_valid_token;

/// Where a worker's calls' answers come back, and what it hears of keyed services.
pub(super) struct CallReplies {
    /// `<prefix>.call.<worker id>.`: a call's reply subject is this and its id.
    pub reply_prefix: String,
    pub subscriber: Subscriber,
    /// Every service's schema announcements, for [`Callees`].
    announcements: Subscriber,
    pub callees: Callees,
}

impl CallReplies {
    /// Subscribes the reply subjects of a new worker id, and the schema announcements,
    /// then asks every worker to announce (the subscriptions are in place first: the
    /// caller flushes).
    pub async fn subscribe(client: &Client, prefix: &str) -> Result<CallReplies, WorkerError> {
        let reply_prefix = format!("{prefix}.call.{:016x}.", fastrand::u64(..));
        let subscribe = async |subject: String| {
            client
                .subscribe(subject.clone())
                .await
                .map_err(|source| WorkerError::Subscribe { subject, source })
        };
        let subscriber = subscribe(format!("{reply_prefix}*")).await?;
        let announcements = subscribe(proto::schema::announcements(prefix)).await?;
        // A lost ask costs only the services that started before this worker, until
        // their next announcement; the bus being away is the connection's to report.
        let ask = proto::schema::ask_subject(prefix);
        if let Err(error) = client.publish(ask, Bytes::new()).await {
            tracing::debug!(%error, "cannot ask the services to announce");
        }
        Ok(CallReplies {
            reply_prefix,
            subscriber,
            announcements,
            callees: Callees::default(),
        })
    }
}

/// How one keyed service routes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Keyed {
    partitions: u32,
    session_key: String,
}

/// The keyed services this worker has heard announce, by name: shared by the task
/// that hears them and the output that routes calls.
#[derive(Debug, Clone, Default)]
pub(super) struct Callees(Arc<RwLock<HashMap<String, Keyed>>>);

impl Callees {
    /// Takes one announcement: a keyed service is remembered, one announcing itself
    /// not keyed is forgotten; one that does not decode, or is keyed in a way no gate
    /// routes by, changes nothing.
    fn learn(&self, payload: Bytes) {
        let schema = match ServiceSchema::decode(payload) {
            Ok(schema) => schema,
            Err(error) => {
                tracing::debug!(%error, "a schema announcement does not decode");
                return;
            }
        };
        let mut known = self.0.write().unwrap_or_else(PoisonError::into_inner);
        match schema.keyed {
            None => {
                known.remove(&schema.service);
            }
            Some(k)
                if (1..=MAX_PARTITIONS).contains(&k.partitions)
                    && (k.session_key.is_empty() || is_valid_token(&k.session_key)) =>
            {
                let keyed = Keyed {
                    partitions: k.partitions,
                    session_key: k.session_key,
                };
                known.insert(schema.service, keyed);
            }
            Some(_) => tracing::debug!(
                service = schema.service,
                "a keyed announcement no gate routes by"
            ),
        }
    }

    /// Where call `request` goes: its service's subject, or for a keyed service its
    /// key's partition subject (the key then set in the request); a keyed call without
    /// a usable key is refused with the 400 its caller gets.
    fn subject(&self, prefix: &str, request: &mut RpcRequest) -> Result<String, CallResult> {
        let known = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let keyed = (request.route.split_once('.'))
            .and_then(|(service, method)| Some((service, method, known.get(service)?)));
        let Some((service, method, keyed)) = keyed else {
            // Not keyed, as far as this worker knows: a key would mean nothing there.
            request.key.clear();
            return Ok(format!("{prefix}.svc.{}", request.route));
        };
        let key = key_of(&request.key, &keyed.session_key, request.session.as_ref())
            .map_err(|error| CallResult::error(code::BAD_REQUEST, error.to_string()))?
            .to_owned();
        let partition = partition_of(key.as_bytes(), keyed.partitions);
        let subject = format!("{}.{method}", partition_subject(prefix, service, partition));
        request.key = key;
        Ok(subject)
    }
}

/// The subject and reply subject of a call with id `id`, routed as [`Callees`] says.
pub(super) fn subjects(
    prefix: &str,
    reply_prefix: &str,
    callees: &Callees,
    id: u64,
    request: &mut RpcRequest,
) -> Result<(String, String), CallResult> {
    let subject = callees.subject(prefix, request)?;
    if !request.key.is_empty() {
        // A keyed call's place among this worker's (docs/workers.md, "Hand-over"): calls
        // leave in the order of their ids, through one connection.
        request.origin = reply_prefix.trim_end_matches('.').to_owned();
        request.seq = id;
    }
    Ok((subject, format!("{reply_prefix}{id}")))
}

/// Hands the answers on `replies` to the loop through `returns`, and learns keyed
/// services from the announcements, until the loop stops.
pub(super) async fn forward(mut replies: CallReplies, returns: mpsc::Sender<Returned>) {
    loop {
        let message = tokio::select! {
            message = replies.subscriber.next() => match message {
                Some(message) => message,
                None => return,
            },
            Some(announcement) = replies.announcements.next() => {
                replies.callees.learn(announcement.payload);
                continue;
            }
            () = returns.closed() => return,
        };
        let Some(id) = message
            .subject
            .strip_prefix(replies.reply_prefix.as_str())
            .and_then(|id| id.parse().ok())
        else {
            continue;
        };
        let no_responders = message.status == Some(async_nats::StatusCode::NO_RESPONDERS);
        let result = result_of(no_responders, message.payload);
        if returns.send(Returned { id, result }).await.is_err() {
            return;
        }
    }
}

/// What a call's reply means (docs/workers.md, "Results"): the bus's no-responders
/// status (a message with a 503 header and no payload) is 503 `no worker available
/// now`; an `RpcResponse` is the callee's answer; anything else (a payload that does not
/// decode, or one without a status code, as an empty payload decodes) is a 500.
fn result_of(no_responders: bool, payload: Bytes) -> CallResult {
    if no_responders {
        return CallResult::error(code::UNAVAILABLE, "no worker available now");
    }
    match RpcResponse::decode(payload) {
        Ok(response) if response.code == 0 => CallResult::error(
            code::HANDLER_ERROR,
            "malformed answer to a call: no status code",
        ),
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
}

#[cfg(test)]
mod tests {
    use proto::rpc::{Keyed as Announced, Session};

    use super::*;

    fn announce(callees: &Callees, service: &str, keyed: Option<(u32, &str)>) {
        let schema = ServiceSchema {
            service: service.into(),
            keyed: keyed.map(|(partitions, session_key)| Announced {
                partitions,
                session_key: session_key.into(),
            }),
            ..ServiceSchema::default()
        };
        callees.learn(schema.encode_to_vec().into());
    }

    fn call(route: &str, key: &str, session: Option<Session>) -> RpcRequest {
        RpcRequest {
            route: route.into(),
            key: key.into(),
            session,
            ..RpcRequest::default()
        }
    }

    fn ann() -> Option<Session> {
        Some(Session {
            uid: "ann".into(),
            data: [("room".to_owned(), "r7".to_owned())].into(),
            ..Session::default()
        })
    }

    #[test]
    fn calls_to_keyed_services_go_to_their_keys_partition() {
        let callees = Callees::default();
        announce(&callees, "echo", None);
        announce(&callees, "profile", Some((16, "")));
        announce(&callees, "rooms", Some((8, "room")));
        let mut plain = call("echo.raw", "ignored", ann());
        assert_eq!(callees.subject("p", &mut plain).unwrap(), "p.svc.echo.raw");
        assert_eq!(plain.key, "", "a plain service's call goes without a key");

        let by_uid = |route| {
            let mut request = call(route, "", ann());
            (callees.subject("p", &mut request).unwrap(), request.key)
        };
        let profile = partition_of(b"ann", 16);
        assert_eq!(
            by_uid("profile.get"),
            (format!("p.part.profile.{profile}.get"), "ann".to_owned())
        );
        let room = partition_of(b"r7", 8);
        assert_eq!(
            by_uid("rooms.say"),
            (format!("p.part.rooms.{room}.say"), "r7".to_owned()),
            "the session value the service names comes before the uid"
        );
        let mut explicit = call("profile.get", "bob", ann());
        let bob = partition_of(b"bob", 16);
        assert_eq!(
            callees.subject("p", &mut explicit).unwrap(),
            format!("p.part.profile.{bob}.get")
        );
        assert_eq!(explicit.key, "bob");
    }

    #[test]
    fn keyed_calls_are_numbered_by_their_ids_and_others_not() {
        let callees = Callees::default();
        announce(&callees, "profile", Some((16, "")));
        let mut keyed = call("profile.get", "ann", None);
        let (_, reply) = subjects("p", "p.call.w1.", &callees, 41, &mut keyed).unwrap();
        assert_eq!(reply, "p.call.w1.41");
        assert_eq!((keyed.origin.as_str(), keyed.seq), ("p.call.w1", 41));
        let mut plain = call("echo.raw", "", ann());
        subjects("p", "p.call.w1.", &callees, 42, &mut plain).unwrap();
        assert_eq!((plain.origin.as_str(), plain.seq), ("", 0));
    }

    #[test]
    fn a_keyed_call_without_a_usable_key_is_refused_400() {
        let callees = Callees::default();
        announce(&callees, "profile", Some((16, "")));
        let refused = |mut request: RpcRequest| {
            let result = callees.subject("p", &mut request).unwrap_err();
            assert_eq!(result.code, code::BAD_REQUEST);
            result.message
        };
        assert_eq!(
            refused(call("profile.get", "", None)),
            "keyed route: give a key, or log in first"
        );
        let long = "k".repeat(proto::keyed::MAX_KEY_LEN + 1);
        assert_eq!(refused(call("profile.get", &long, None)), "key too long");
    }

    #[test]
    fn announcements_teach_and_unteach_and_bad_ones_change_nothing() {
        let callees = Callees::default();
        let subject = |callees: &Callees| {
            let mut request = call("profile.get", "ann", None);
            callees.subject("p", &mut request).unwrap()
        };
        announce(&callees, "profile", Some((4, "")));
        let keyed = subject(&callees);
        assert_ne!(keyed, "p.svc.profile.get");
        for bad in [(0, ""), (MAX_PARTITIONS + 1, ""), (4, "a.b")] {
            announce(&callees, "profile", Some(bad));
            assert_eq!(subject(&callees), keyed, "{bad:?} is ignored");
        }
        callees.learn(Bytes::from_static(b"\xff\xff"));
        assert_eq!(subject(&callees), keyed);
        announce(&callees, "profile", None);
        assert_eq!(subject(&callees), "p.svc.profile.get");
    }
    #[test]
    fn a_reply_is_the_callees_answer_or_no_responders_else_a_500() {
        let answer = RpcResponse {
            code: code::CONFLICT,
            body: Bytes::from_static(b"b"),
            message: "taken".into(),
            ..RpcResponse::default()
        };
        let result = result_of(false, answer.encode_to_vec().into());
        assert_eq!(
            (result.code, &result.body[..], result.message.as_str()),
            (code::CONFLICT, &b"b"[..], "taken")
        );
        let none = result_of(true, Bytes::new());
        assert_eq!(
            (none.code, none.message.as_str()),
            (code::UNAVAILABLE, "no worker available now")
        );
        // An empty payload without the no-responders status decodes as code 0.
        let empty = result_of(false, Bytes::new());
        assert_eq!(
            (empty.code, empty.message.as_str()),
            (
                code::HANDLER_ERROR,
                "malformed answer to a call: no status code"
            )
        );
        let garbage = result_of(false, Bytes::from_static(&[0xff, 0xff]));
        assert_eq!(garbage.code, code::HANDLER_ERROR);
        assert!(garbage.message.starts_with("malformed answer to a call: "));
    }
}
