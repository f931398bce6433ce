//! A keyed service (docs/workers.md, "Keyed services"): its requests are routed by key
//! to partitions, each owned by one worker, and a partition's state moves with it.
//!
//! The service declares how many partitions its keys spread over and, if it wants, the
//! session value its keys come from; the worker framework agrees with the other workers
//! which of them owns each partition (`crate::ownership`) and moves partitions between
//! them. When one moves, the old owner's [`Service::on_hand_over`] gives the partition's
//! state and its [`Service::on_take_over`] on the new owner restores it; a partition
//! whose owner died (or that nobody ever held) is taken over with no state.

use bytes::Bytes;
use proto::keyed::MAX_PARTITIONS;

use super::{EventHandled, Service, run_sessionless};
use crate::context::Context;
use crate::names::is_valid_token;

type HandOverHandler = Box<dyn FnMut(&mut Context, u32) -> Bytes + Send>;
type TakeOverHandler = Box<dyn FnMut(&mut Context, u32, Option<Bytes>) + Send>;
type SnapshotHandler = Box<dyn FnMut(u32) -> Bytes + Send>;

/// What makes a service keyed.
pub(crate) struct Keyed {
    pub partitions: u32,
    /// The session data key a request's key comes from when the client gives none; empty
    /// for none (then the uid).
    pub session_key: String,
    hand_over: Option<HandOverHandler>,
    take_over: Option<TakeOverHandler>,
    snapshot: Option<SnapshotHandler>,
}

impl Service {
    /// Makes the service keyed over `partitions` partitions (see the module docs): a
    /// request reaches the worker that owns its key's partition, in the order its gate
    /// sent it. More partitions spread keys more evenly over more workers; each costs a
    /// subscription and is a unit of hand-over. 64 suits a handful of workers.
    ///
    /// # Panics
    ///
    /// If `partitions` is 0 or over [`MAX_PARTITIONS`], or the service is keyed already.
    pub fn keyed(mut self, partitions: u32) -> Service {
        assert!(
            (1..=MAX_PARTITIONS).contains(&partitions),
            "a keyed service has 1..={MAX_PARTITIONS} partitions, not {partitions}"
        );
        assert!(self.keyed.is_none(), "service {} keyed twice", self.name);
        self.keyed = Some(Keyed {
            partitions,
            session_key: String::new(),
            hand_over: None,
            take_over: None,
            snapshot: None,
        });
        self
    }

    fn keyed_mut(&mut self, what: &str) -> &mut Keyed {
        let name = self.name.clone();
        self.keyed.as_mut().unwrap_or_else(|| {
            panic!("{what} on service {name}, which is not keyed: call keyed first")
        })
    }

    /// Routes a request whose client gave no key by the session value under `data_key`
    /// (which a handler sets with [`Context::set_data`], e.g. the match a player joined),
    /// when the session has one; else by the player's uid.
    ///
    /// # Panics
    ///
    /// If the service is not keyed, or `data_key` is not a valid token.
    pub fn key_from_session(mut self, data_key: &str) -> Service {
        assert!(
            is_valid_token(data_key),
            "invalid session key name {data_key:?}"
        );
        self.keyed_mut("key_from_session").session_key = data_key.to_owned();
        self
    }

    /// Registers what gives a partition's state when it moves to another worker: the
    /// worker calls it after the partition's last request here, then drops nothing
    /// itself; the callback should forget the partition's state as it hands it over.
    ///
    /// # Panics
    ///
    /// If the service is not keyed.
    pub fn on_hand_over<F>(mut self, hand_over: F) -> Service
    where
        F: FnMut(&mut Context, u32) -> Bytes + Send + 'static,
    {
        self.keyed_mut("on_hand_over").hand_over = Some(Box::new(hand_over));
        self
    }

    /// Registers what takes a partition on: with the state its old owner handed over,
    /// or `None` when it starts fresh (its owner died, or nobody held it before), so the
    /// service can answer "match lost" or rebuild from its own store. Called before the
    /// partition's first request here.
    ///
    /// # Panics
    ///
    /// If the service is not keyed.
    pub fn on_take_over<F>(mut self, take_over: F) -> Service
    where
        F: FnMut(&mut Context, u32, Option<Bytes>) + Send + 'static,
    {
        self.keyed_mut("on_take_over").take_over = Some(Box::new(take_over));
        self
    }

    /// Registers what gives a partition's whole state as it is now, without forgetting
    /// it (the same bytes [`Service::on_hand_over`] would give): the worker calls it
    /// after each frame for every partition the frame changed (a keyed request of it,
    /// or [`Context::changed`]) and sends the result to the partition's standby before
    /// the frame's answers and pushes leave. When the owner dies, the standby takes the
    /// partition with the last snapshot it holds, through [`Service::on_take_over`]
    /// (docs/workers.md, "Standbys"). Without it, a crash loses the partition's state.
    ///
    /// # Panics
    ///
    /// If the service is not keyed.
    pub fn on_snapshot<F>(mut self, snapshot: F) -> Service
    where
        F: FnMut(u32) -> Bytes + Send + 'static,
    {
        self.keyed_mut("on_snapshot").snapshot = Some(Box::new(snapshot));
        self
    }

    /// Whether the service gives snapshots of its partitions for standbys.
    pub(crate) fn replicates(&self) -> bool {
        self.keyed.as_ref().is_some_and(|k| k.snapshot.is_some())
    }

    /// `partition`'s snapshot; `None` without a snapshot callback, or when it panicked
    /// (logged: the standby keeps the last one it had).
    pub(crate) fn snapshot(&mut self, partition: u32) -> Option<Bytes> {
        let callback = self.keyed.as_mut()?.snapshot.as_mut()?;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(partition))) {
            Ok(state) => Some(state),
            Err(_) => {
                tracing::error!(service = %self.name, partition, "the snapshot callback panicked");
                None
            }
        }
    }

    /// The number of partitions of a keyed service; `None` for another.
    pub fn partitions(&self) -> Option<u32> {
        self.keyed.as_ref().map(|k| k.partitions)
    }

    /// What the schema announces of a keyed service.
    pub(crate) fn keyed_schema(&self) -> Option<proto::rpc::Keyed> {
        self.keyed.as_ref().map(|k| proto::rpc::Keyed {
            partitions: k.partitions,
            session_key: k.session_key.clone(),
        })
    }

    /// Runs the hand-over callback for `partition`; its `reply` is the state (empty
    /// without a callback).
    pub(crate) fn hand_over(&mut self, partition: u32) -> EventHandled {
        let name = &self.name;
        let callback = self.keyed.as_mut().and_then(|k| k.hand_over.as_mut());
        let mut handled = run_sessionless(name, "hand over", |ctx| {
            if let Some(callback) = callback {
                let state = callback(ctx, partition);
                ctx.reply(state);
            }
            Ok(())
        });
        handled.reply.get_or_insert_with(Bytes::new);
        handled
    }

    /// Runs the take-over callback for `partition` with `state` (`None`: fresh).
    pub(crate) fn take_over(&mut self, partition: u32, state: Option<Bytes>) -> EventHandled {
        let name = &self.name;
        let callback = self.keyed.as_mut().and_then(|k| k.take_over.as_mut());
        run_sessionless(name, "take over", |ctx| {
            if let Some(callback) = callback {
                callback(ctx, partition, state);
            }
            Ok(())
        })
    }
}

/// A keyed service's request as a gate sends it, for unit tests of keyed services: from
/// a session of gate `g` with `uid` and `data`, routed by `key`.
#[cfg(test)]
pub(crate) fn request(
    uid: &str,
    key: &str,
    data: &[(&str, &str)],
    body: impl proto::Message,
) -> proto::rpc::RpcRequest {
    use proto::rpc::{RpcRequest, Session};
    RpcRequest {
        body: body.encode_to_vec().into(),
        session: Some(Session {
            gate: "g".into(),
            sid: 1,
            uid: uid.into(),
            data: data
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Session::default()
        }),
        key: key.into(),
        ..RpcRequest::default()
    }
}
