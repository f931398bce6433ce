//! Messages for players, and for other workers, that a service publishes on the bus.
//!
//! - A broadcast to group `g` is a `ServerPush{route, body}` on `<prefix>.grp.<g>`: every
//!   gate with a member of `g` holds that subject and hands the push to its members.
//! - A push to, or a kick of, player `u` is a `UserCommand` on `<prefix>.user.<u>`: the
//!   gate where `u` is bound acts on it, wherever that is.
//! - A service may also publish on subjects of its own under the prefix (the chat
//!   service's replication, `<prefix>.chat.state`).
//!
//! Inside a handler these are asked for through the [`Context`](crate::Context) and
//! published by the worker right after the handler returns, before its answer; anywhere
//! else (a task of the service's own, a timer, a tool) a [`Pusher`] publishes them.
//!
//! Group and user names become subject tokens: anything but one valid token (see
//! [`crate::names`]) is refused with [`PushError::InvalidName`] before it reaches the bus.
//!
//! Delivery is at most once, like everything on core NATS: a push to a player who is
//! not connected, or to a group without members, is dropped by the bus without a word.

use std::sync::Arc;

use bytes::Bytes;
use proto::Message as _;
use proto::rpc::{ServerPush, UserCommand, user_command};

use crate::bus::Client;
use crate::config::ConfigError;
use crate::handler_error::HandlerError;
use crate::names::{MAX_NAME_LEN, is_valid_subject, is_valid_token};

/// Why a push was not published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// A group, uid or subject token is not one subject token: 1 to 64 bytes of
    /// `[a-z0-9_-]`.
    #[error("invalid {what} {name:?}: use 1..={MAX_NAME_LEN} of [a-z0-9_-]")]
    InvalidName { what: &'static str, name: String },
    /// The bus client would not take the message (it is closed).
    #[error("cannot publish: {0}")]
    Bus(String),
}

impl From<PushError> for HandlerError {
    /// A bad name usually comes from the player's input: 400. A closed bus: 503.
    fn from(error: PushError) -> Self {
        match error {
            PushError::InvalidName { .. } => HandlerError::bad_request(error.to_string()),
            PushError::Bus(_) => {
                HandlerError::with_code(proto::code::UNAVAILABLE, error.to_string())
            }
        }
    }
}

fn check(what: &'static str, name: &str) -> Result<(), PushError> {
    if is_valid_token(name) {
        Ok(())
    } else {
        Err(PushError::InvalidName {
            what,
            name: name.to_owned(),
        })
    }
}

/// One message a service publishes: what it is for and, with the prefix, where it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    /// A push to every member of `group`, on every gate.
    Group { group: String, push: ServerPush },
    /// A command (push or kick) to player `uid`, wherever it is bound.
    User { uid: String, command: UserCommand },
    /// Raw bytes on `<prefix>.<subject>`: a service's own subjects.
    Publish { subject: String, payload: Bytes },
}

impl Outbound {
    /// A push of `route` and `body` to every member of `group`.
    pub fn broadcast(
        group: &str,
        route: &str,
        body: impl Into<Bytes>,
    ) -> Result<Outbound, PushError> {
        check("group", group)?;
        Ok(Outbound::Group {
            group: group.to_owned(),
            push: ServerPush {
                route: route.to_owned(),
                body: body.into(),
            },
        })
    }

    /// A push of `route` and `body` to player `uid`.
    pub fn push_to_user(
        uid: &str,
        route: &str,
        body: impl Into<Bytes>,
    ) -> Result<Outbound, PushError> {
        check("uid", uid)?;
        Ok(Outbound::User {
            uid: uid.to_owned(),
            command: UserCommand {
                kind: Some(user_command::Kind::Push(ServerPush {
                    route: route.to_owned(),
                    body: body.into(),
                })),
            },
        })
    }

    /// Closes player `uid`'s session, telling the client `reason`.
    pub fn kick_user(uid: &str, reason: &str) -> Result<Outbound, PushError> {
        check("uid", uid)?;
        Ok(Outbound::User {
            uid: uid.to_owned(),
            command: UserCommand {
                kind: Some(user_command::Kind::Kick(reason.to_owned())),
            },
        })
    }

    /// `payload` on `<prefix>.<subject>`, where `subject` is one or more dot-separated
    /// tokens (`chat.state`).
    pub fn publish(subject: &str, payload: impl Into<Bytes>) -> Result<Outbound, PushError> {
        if !is_valid_subject(subject) {
            return Err(PushError::InvalidName {
                what: "subject",
                name: subject.to_owned(),
            });
        }
        Ok(Outbound::Publish {
            subject: subject.to_owned(),
            payload: payload.into(),
        })
    }

    /// The subject this goes to under `prefix`.
    pub fn subject(&self, prefix: &str) -> String {
        match self {
            Outbound::Group { group, .. } => format!("{prefix}.grp.{group}"),
            Outbound::User { uid, .. } => format!("{prefix}.user.{uid}"),
            Outbound::Publish { subject, .. } => format!("{prefix}.{subject}"),
        }
    }

    /// The bytes published.
    pub fn payload(&self) -> Bytes {
        match self {
            Outbound::Group { push, .. } => push.encode_to_vec().into(),
            Outbound::User { command, .. } => command.encode_to_vec().into(),
            Outbound::Publish { payload, .. } => payload.clone(),
        }
    }
}

/// Publishes pushes, kicks and a service's own messages from outside a handler. Cheap to
/// clone: a bus [`Client`] (an async-nats client converts into one) and the subject
/// prefix.
///
/// ```no_run
/// # async fn demo(client: async_nats::Client) -> anyhow::Result<()> {
/// let pusher = services::Pusher::new(client, "shaddock")?;
/// pusher.broadcast("lobby", "game.news", "server restarts in 5 minutes").await?;
/// pusher.kick_user("mallory", "banned").await?;
/// pusher.flush().await?;
/// # Ok(()) }
/// ```
///
/// It is also the worker's output: answers, event answers and what handlers asked for.
#[derive(Clone)]
pub struct Pusher {
    client: Client,
    prefix: Arc<str>,
}

impl std::fmt::Debug for Pusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pusher")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Pusher {
    /// A pusher publishing with `client` under `prefix` (the gates' `--prefix`).
    pub fn new(
        client: impl Into<Client>,
        prefix: impl Into<String>,
    ) -> Result<Pusher, ConfigError> {
        let client = client.into();
        let prefix = prefix.into();
        if !is_valid_subject(&prefix) {
            return Err(ConfigError::Prefix(prefix));
        }
        Ok(Pusher {
            client,
            prefix: prefix.into(),
        })
    }

    /// The subject prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The bus client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Pushes `route` and `body` to every member of `group`, on every gate.
    pub async fn broadcast(
        &self,
        group: &str,
        route: &str,
        body: impl Into<Bytes>,
    ) -> Result<(), PushError> {
        self.send(Outbound::broadcast(group, route, body)?).await
    }

    /// Pushes `route` and `body` to player `uid`, on whichever gate it is bound.
    pub async fn push_to_user(
        &self,
        uid: &str,
        route: &str,
        body: impl Into<Bytes>,
    ) -> Result<(), PushError> {
        self.send(Outbound::push_to_user(uid, route, body)?).await
    }

    /// Closes player `uid`'s session with `reason`, on whichever gate it is bound.
    pub async fn kick_user(&self, uid: &str, reason: &str) -> Result<(), PushError> {
        self.send(Outbound::kick_user(uid, reason)?).await
    }

    /// Waits until everything published so far has reached the broker. Publishing only
    /// queues a message on the connection: a program that drops its last clone of the
    /// client right after publishing (a one-shot tool) must flush first, or the message
    /// may never leave.
    pub async fn flush(&self) -> Result<(), PushError> {
        self.client
            .flush()
            .await
            .map_err(|e| PushError::Bus(e.to_string()))
    }

    /// Publishes `outbound`: queues it on the connection and returns (see
    /// [`Pusher::flush`]). Messages published by one pusher (and its clones) reach each
    /// gate in the order they were published.
    pub async fn send(&self, outbound: Outbound) -> Result<(), PushError> {
        let subject = outbound.subject(&self.prefix);
        self.client
            .publish(subject, outbound.payload())
            .await
            .map_err(|e| PushError::Bus(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_gate_protocol() {
        let group = Outbound::broadcast("room-1", "chat.message", "hi").unwrap();
        assert_eq!(group.subject("shaddock"), "shaddock.grp.room-1");
        let push = ServerPush::decode(group.payload()).unwrap();
        assert_eq!(
            (push.route.as_str(), &push.body[..]),
            ("chat.message", &b"hi"[..])
        );

        let user = Outbound::push_to_user("alice", "chat.whisper", "psst").unwrap();
        assert_eq!(user.subject("p.q"), "p.q.user.alice");
        let command = UserCommand::decode(user.payload()).unwrap();
        assert!(
            matches!(command.kind, Some(user_command::Kind::Push(p)) if p.route == "chat.whisper")
        );

        let kick = Outbound::kick_user("alice", "banned").unwrap();
        let command = UserCommand::decode(kick.payload()).unwrap();
        assert_eq!(
            command.kind,
            Some(user_command::Kind::Kick("banned".into()))
        );

        let own = Outbound::publish("chat.state", "x").unwrap();
        assert_eq!(own.subject("shaddock"), "shaddock.chat.state");
    }

    #[test]
    fn names_that_would_change_the_subject_are_refused() {
        for bad in [
            "",
            "a.b",
            "*",
            ">",
            "a b",
            "Alice",
            "é",
            &"x".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(Outbound::broadcast(bad, "r", "").is_err(), "{bad:?}");
            assert!(Outbound::push_to_user(bad, "r", "").is_err(), "{bad:?}");
            assert!(Outbound::kick_user(bad, "r").is_err(), "{bad:?}");
        }
        for bad in ["", "a..b", "a.>", "a.*", ".a", "a."] {
            assert!(Outbound::publish(bad, "").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_invalid_name_is_a_400() {
        let error: HandlerError = Outbound::broadcast("a.b", "r", "").unwrap_err().into();
        assert_eq!(error.code(), proto::code::BAD_REQUEST);
    }
}
