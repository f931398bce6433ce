//! Groups and players on the bus: which subjects this gate holds for its sessions.
//!
//! - A group `g` is the subject `<prefix>.grp.<g>`. The gate subscribes when its first
//!   local session joins and unsubscribes when the last one leaves. A broadcast arrives
//!   once per gate; the gate encodes the client frame once and every local member gets
//!   the same bytes.
//! - A player `u` is the subject `<prefix>.user.<u>`, subscribed while a local session
//!   has bound `u`: pushes and kicks addressed to the player reach it on whichever gate
//!   it is. Binding publishes a claim there, so a session holding `u` on another gate is
//!   kicked (or, in refuse mode, the bind is refused when a holder answers a probe).
//!
//! Joining and binding subscribe here, then hand the subscription to the gate's
//! [`router`](crate::router), which owns it from then on and calls
//! [`GateShared::deliver_to_group`] and [`GateShared::deliver_to_user`] for what
//! arrives; leaving and unbinding cancel its token, and the router drops it.

use std::sync::Arc;

use bytes::Bytes;
use dashmap::mapref::entry::Entry;
use proto::Message as _;
use proto::rpc::{Claim, Probe, ServerPush, UserCommand, user_command};
use rustc_hash::FxHashSet;
use tokio_util::sync::CancellationToken;

use crate::codec::PushFrame;
use crate::gate::{GateShared, ToSession};
use crate::router::Target;

/// A group with members on this gate.
pub(crate) struct Group {
    members: FxHashSet<u64>,
    /// Cancelling makes the router drop (unsubscribe) the subject.
    stop: CancellationToken,
}

/// A player bound on this gate.
pub(crate) struct Binding {
    pub sid: u64,
    stop: CancellationToken,
}

/// How a bind of a uid that another session holds is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum UidConflict {
    /// The new session wins; the old one is kicked wherever it is.
    #[default]
    Kick,
    /// The new bind is refused (409) while another session holds the uid.
    Refuse,
}

/// Why a bind failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BindError {
    #[error("uid is bound by another session")]
    Taken,
    #[error("uid is not a valid subject token")]
    Invalid,
    #[error("bus unavailable: {0}")]
    Bus(String),
}

impl GateShared {
    fn group_subject(&self, group: &str) -> String {
        format!("{}.grp.{group}", self.config.prefix)
    }

    pub fn user_subject(&self, uid: &str) -> String {
        format!("{}.user.{uid}", self.config.prefix)
    }

    /// Adds a session to a group, subscribing the group's subject if it is new here.
    pub async fn join(self: &Arc<Self>, group: &str, sid: u64) -> anyhow::Result<()> {
        if let Some(mut g) = self.groups.get_mut(group) {
            g.members.insert(sid);
            return Ok(());
        }
        // Subscribe before taking the entry: no map lock is held across an await.
        let sub = self.nats.subscribe(self.group_subject(group)).await?;
        // Out on the wire before the join is answered: a push sent after the answer finds it.
        self.nats.flush().await?;
        let stop = match self.groups.entry(group.to_owned()) {
            // Another session joined meanwhile; its subscription serves both (ours is
            // dropped, which unsubscribes it).
            Entry::Occupied(mut e) => {
                e.get_mut().members.insert(sid);
                return Ok(());
            }
            Entry::Vacant(v) => {
                let stop = CancellationToken::new();
                let mut members = FxHashSet::default();
                members.insert(sid);
                v.insert(Group {
                    members,
                    stop: stop.clone(),
                });
                stop
            }
        };
        // Awaited before the join is answered, so the router has the subscription before
        // any reply to a later request (see `hand_over`); outside the entry, as no map
        // lock is ever held across an await.
        if let Err(e) = self.hand_over(Target::Group(group.into()), sub, stop).await {
            self.leave(group, sid);
            return Err(e.into());
        }
        Ok(())
    }

    /// Removes a session from a group, unsubscribing when it was the last one here.
    pub fn leave(&self, group: &str, sid: u64) {
        let emptied = self.groups.remove_if_mut(group, |_, g| {
            g.members.remove(&sid);
            g.members.is_empty()
        });
        if let Some((_, g)) = emptied {
            g.stop.cancel();
        }
    }

    /// Groups with local members now.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Players bound on this gate now.
    pub fn user_count(&self) -> usize {
        self.users.len()
    }

    /// Binds `uid` to session `sid` on this gate, enforcing one session per uid.
    pub async fn bind(self: &Arc<Self>, uid: &str, sid: u64) -> Result<(), BindError> {
        crate::route::check_token(uid).map_err(|_| BindError::Invalid)?;
        let subject = self.user_subject(uid);
        let holder = self.users.get(uid).map(|b| b.sid);
        if holder == Some(sid) {
            return Ok(());
        }
        if self.config.uid_conflict == UidConflict::Refuse {
            if holder.is_some() {
                return Err(BindError::Taken);
            }
            let probe = UserCommand {
                kind: Some(user_command::Kind::Probe(Probe {})),
            };
            let asked = tokio::time::timeout(
                self.config.bind_probe_timeout,
                self.nats
                    .request(subject.clone(), probe.encode_to_vec().into()),
            )
            .await;
            // An answer means a holder; no responders or silence means the uid is free.
            if let Ok(Ok(_)) = asked {
                return Err(BindError::Taken);
            }
        }
        if let Some(old) = holder {
            self.kick_local(old, "logged in elsewhere");
        }
        // Subscribed even when this gate holds the uid already: the holder may unbind
        // (it is being kicked) before the entry below is taken, and the new binding
        // must not be left without a subscription. A spare one is dropped at once.
        let sub = self
            .nats
            .subscribe(subject.clone())
            .await
            .map_err(|e| BindError::Bus(e.to_string()))?;
        // Out on the wire before the bind is answered: a push sent after the answer finds it.
        self.nats
            .flush()
            .await
            .map_err(|e| BindError::Bus(e.to_string()))?;
        let stop = match self.users.entry(uid.to_owned()) {
            // Already subscribed for this uid: the binding just changes hands.
            Entry::Occupied(mut e) => {
                e.get_mut().sid = sid;
                None
            }
            Entry::Vacant(v) => {
                let stop = CancellationToken::new();
                v.insert(Binding {
                    sid,
                    stop: stop.clone(),
                });
                Some(stop)
            }
        };
        if let Some(stop) = stop {
            // Before the claim and the answer, as for a join.
            if let Err(e) = self.hand_over(Target::User(uid.into()), sub, stop).await {
                self.unbind(uid, sid);
                return Err(BindError::Bus(e.to_string()));
            }
        }
        let claim = UserCommand {
            kind: Some(user_command::Kind::Claim(Claim {
                gate: self.id.clone(),
                sid,
            })),
        };
        self.nats
            .publish(subject, claim.encode_to_vec().into())
            .await
            .map_err(|e| BindError::Bus(e.to_string()))
    }

    /// Drops `uid`'s binding if `sid` still holds it: a stale session closing never
    /// removes a newer session's binding.
    pub fn unbind(&self, uid: &str, sid: u64) {
        if let Some((_, b)) = self.users.remove_if(uid, |_, b| b.sid == sid) {
            b.stop.cancel();
        }
    }

    fn kick_local(&self, sid: u64, reason: &str) {
        if let Some(tx) = self.sessions.get(&sid) {
            if tx.try_send(ToSession::Kick(reason.into())).is_err() && !tx.is_closed() {
                // A session whose queue is full of pushes misses the kick; counted so it
                // shows, rather than blocking the router on one session.
                metrics::counter!("gate_kicks_dropped_total").increment(1);
            }
        }
    }

    fn push_local(&self, sid: u64, frame: &Arc<PushFrame>) -> bool {
        match self.sessions.get(&sid) {
            Some(tx) => tx.try_send(ToSession::Push(frame.clone())).is_ok(),
            None => false,
        }
    }

    /// Delivers a broadcast on `group`'s subject to the group's local members as they are
    /// now, all sharing one encoded frame. `members` is the caller's scratch space.
    pub(crate) fn deliver_to_group(
        &self,
        group: &str,
        msg: async_nats::Message,
        members: &mut Vec<u64>,
    ) {
        let Ok(push) = ServerPush::decode(msg.payload) else {
            metrics::counter!("gate_invalid_pushes_total").increment(1);
            return;
        };
        let frame = PushFrame::new(push);
        members.clear();
        if let Some(g) = self.groups.get(group) {
            members.extend(g.members.iter().copied());
        }
        let dropped = members
            .iter()
            .filter(|&&sid| !self.push_local(sid, &frame))
            .count();
        if dropped > 0 {
            metrics::counter!("gate_push_dropped_total").increment(dropped as u64);
        }
    }

    /// Acts on a command on `uid`'s subject for the session bound to it here.
    pub(crate) fn deliver_to_user(&self, uid: &str, msg: async_nats::Message) {
        let Some(holder) = self.users.get(uid).map(|b| b.sid) else {
            // Unbound just now: the router drops the subscription when it sees the stop.
            return;
        };
        let Ok(UserCommand { kind: Some(kind) }) = UserCommand::decode(msg.payload) else {
            metrics::counter!("gate_invalid_pushes_total").increment(1);
            return;
        };
        match kind {
            user_command::Kind::Push(push) => {
                if !self.push_local(holder, &PushFrame::new(push)) {
                    metrics::counter!("gate_push_dropped_total").increment(1);
                }
            }
            user_command::Kind::Kick(reason) => self.kick_local(holder, &reason),
            user_command::Kind::Claim(claim) => {
                if claim.gate != self.id || claim.sid != holder {
                    self.kick_local(holder, "logged in elsewhere");
                    self.unbind(uid, holder);
                }
            }
            user_command::Kind::Probe(_) => {
                if let Some(reply) = msg.reply {
                    // On a task of its own: the router never waits for the bus.
                    let nats = self.nats.clone();
                    tokio::spawn(async move {
                        let _ = nats.publish(reply, Bytes::from_static(b"bound")).await;
                    });
                }
            }
        }
    }
}
