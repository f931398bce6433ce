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
//! Joining and binding subscribe on the gate's [bus connection](crate::bus), whose
//! reader calls [`Presence::deliver_to_group`] and [`Presence::deliver_to_user`] for
//! what arrives; leaving and unbinding unsubscribe. A subscription is queued towards the
//! server before the join or bind is answered, on the connection the client's later
//! requests go out on: the server has it before anything those requests cause.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use proto::Message as _;
use proto::rpc::{Claim, Probe, ServerPush, UserCommand, user_command};
use rustc_hash::{FxHashMap, FxHashSet};
use tokio::sync::oneshot;

use crate::bus::{Bus, Reply, Target};
use crate::codec::PushFrame;
use crate::config::{GateConfig, UidConflict};
use crate::inbox::{Refused, ToSession};
use crate::sessions::{GATE_SID, Sessions};

/// The groups and players of one gate's sessions, and the subscriptions that hold them.
pub(crate) struct Presence {
    bus: Arc<Bus>,
    sessions: Arc<Sessions>,
    prefix: String,
    gate: String,
    uid_conflict: UidConflict,
    probe_timeout: Duration,
    /// Groups with members on this gate, by name.
    groups: DashMap<String, Group>,
    /// Players bound on this gate, by uid.
    users: DashMap<String, Binding>,
    /// Bind probes awaiting an answer, by the id in their reply subject (sid 0).
    probes: Mutex<FxHashMap<u64, oneshot::Sender<bool>>>,
    next_probe: AtomicU64,
}

/// A group with members on this gate.
struct Group {
    members: FxHashSet<u64>,
    /// The bus subscription of the group's subject.
    bus_sid: u64,
}

/// A player bound on this gate.
struct Binding {
    sid: u64,
    /// The bus subscription of the player's subject.
    bus_sid: u64,
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

impl Presence {
    /// The presence of gate `config.gate_id`'s sessions on `bus`.
    pub(crate) fn new(config: &GateConfig, bus: Arc<Bus>, sessions: Arc<Sessions>) -> Self {
        Presence {
            bus,
            sessions,
            prefix: config.prefix.clone(),
            gate: config.gate_id.clone(),
            uid_conflict: config.uid_conflict,
            probe_timeout: config.bind_probe_timeout,
            groups: DashMap::new(),
            users: DashMap::new(),
            probes: Mutex::default(),
            next_probe: AtomicU64::new(1),
        }
    }

    fn group_subject(&self, group: &str) -> String {
        format!("{}.grp.{group}", self.prefix)
    }

    fn user_subject(&self, uid: &str) -> String {
        format!("{}.user.{uid}", self.prefix)
    }

    /// Adds a session to a group, subscribing the group's subject if it is new here.
    pub(crate) fn join(&self, group: &str, sid: u64) {
        match self.groups.entry(group.to_owned()) {
            Entry::Occupied(mut e) => {
                e.get_mut().members.insert(sid);
            }
            Entry::Vacant(v) => {
                let target = Target::Group(group.into());
                let bus_sid = self.bus.subscribe(self.group_subject(group), target);
                let mut members = FxHashSet::default();
                members.insert(sid);
                v.insert(Group { members, bus_sid });
            }
        }
    }

    /// Removes a session from a group, unsubscribing when it was the last one here.
    pub(crate) fn leave(&self, group: &str, sid: u64) {
        let emptied = self.groups.remove_if_mut(group, |_, g| {
            g.members.remove(&sid);
            g.members.is_empty()
        });
        if let Some((_, g)) = emptied {
            self.bus.unsubscribe(g.bus_sid);
        }
    }

    /// Groups with local members now.
    pub(crate) fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Players bound on this gate now.
    pub(crate) fn user_count(&self) -> usize {
        self.users.len()
    }

    /// Binds `uid` to session `sid` on this gate, enforcing one session per uid.
    pub(crate) async fn bind(&self, uid: &str, sid: u64) -> Result<(), BindError> {
        crate::route::check_token(uid).map_err(|_| BindError::Invalid)?;
        let subject = self.user_subject(uid);
        let holder = self.users.get(uid).map(|b| b.sid);
        if holder == Some(sid) {
            return Ok(());
        }
        if self.uid_conflict == UidConflict::Refuse {
            if holder.is_some() {
                return Err(BindError::Taken);
            }
            let probe = UserCommand {
                kind: Some(user_command::Kind::Probe(Probe {})),
            };
            // An answer means a holder; no responders or silence means the uid is free.
            if self.probe(&subject, &probe.encode_to_vec()).await {
                return Err(BindError::Taken);
            }
        }
        if let Some(old) = holder {
            self.kick_local(old, "logged in elsewhere");
        }
        match self.users.entry(uid.to_owned()) {
            // Already subscribed for this uid: the binding just changes hands.
            Entry::Occupied(mut e) => e.get_mut().sid = sid,
            Entry::Vacant(v) => {
                let bus_sid = self
                    .bus
                    .subscribe(subject.clone(), Target::User(uid.into()));
                v.insert(Binding { sid, bus_sid });
            }
        }
        let claim = UserCommand {
            kind: Some(user_command::Kind::Claim(Claim {
                gate: self.gate.clone(),
                sid,
            })),
        };
        self.bus
            .publish_bytes(&subject, Reply::None, &claim.encode_to_vec())
            .map_err(|e| BindError::Bus(e.to_string()))
    }

    /// Drops `uid`'s binding if `sid` still holds it: a stale session closing never
    /// removes a newer session's binding.
    pub(crate) fn unbind(&self, uid: &str, sid: u64) {
        if let Some((_, b)) = self.users.remove_if(uid, |_, b| b.sid == sid) {
            self.bus.unsubscribe(b.bus_sid);
        }
    }

    fn kick_local(&self, sid: u64, reason: &str) {
        if let Err(Refused::Full) = self.sessions.offer(sid, ToSession::Kick(reason.into())) {
            // A session whose queue is full of pushes misses the kick, and closes as too
            // slow instead; counted so it shows.
            metrics::counter!("gate_kicks_dropped_total").increment(1);
        }
    }

    fn push_local(&self, sid: u64, frame: &Arc<PushFrame>) -> bool {
        self.sessions
            .offer(sid, ToSession::Push(frame.clone()))
            .is_ok()
    }

    /// Delivers a broadcast on `group`'s subject to the group's local members as they are
    /// now, all sharing one encoded frame.
    pub(crate) fn deliver_to_group(&self, group: &str, payload: Bytes) {
        let Ok(push) = ServerPush::decode(payload) else {
            metrics::counter!("gate_invalid_pushes_total").increment(1);
            return;
        };
        let frame = PushFrame::new(push);
        // Under the group's read guard: handing over never waits (`try_send`).
        let Some(g) = self.groups.get(group) else {
            return;
        };
        let dropped = g
            .members
            .iter()
            .filter(|&&sid| !self.push_local(sid, &frame))
            .count();
        drop(g);
        if dropped > 0 {
            metrics::counter!("gate_push_dropped_total").increment(dropped as u64);
        }
    }

    /// Acts on a command on `uid`'s subject for the session bound to it here.
    pub(crate) fn deliver_to_user(&self, uid: &str, payload: Bytes, reply: Option<&[u8]>) {
        let Some(holder) = self.users.get(uid).map(|b| b.sid) else {
            // Unbound just now.
            return;
        };
        let Ok(UserCommand { kind: Some(kind) }) = UserCommand::decode(payload) else {
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
                if claim.gate != self.gate || claim.sid != holder {
                    self.kick_local(holder, "logged in elsewhere");
                    self.unbind(uid, holder);
                }
            }
            user_command::Kind::Probe(_) => {
                if let Some(reply) = reply.and_then(|r| std::str::from_utf8(r).ok()) {
                    let _ = self.bus.publish_bytes(reply, Reply::None, b"bound");
                }
            }
        }
    }

    /// Asks `subject` whether anyone holds it: `true` when an answer comes within the
    /// probe timeout; no responders, silence or no bus mean no.
    async fn probe(&self, subject: &str, payload: &[u8]) -> bool {
        let id = self.next_probe.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.probes_lock().insert(id, tx);
        let prefix = format!("{}.gw.{}.{GATE_SID}.", self.prefix, self.gate);
        let sent = self.bus.publish_bytes(
            subject,
            Reply::Request {
                prefix: &prefix,
                id,
            },
            payload,
        );
        let timeout = self.probe_timeout;
        let held = sent.is_ok() && matches!(tokio::time::timeout(timeout, rx).await, Ok(Ok(true)));
        self.probes_lock().remove(&id);
        held
    }

    /// The answer to bind probe `id` came back: `held` unless it was "no responders".
    pub(crate) fn answer_probe(&self, id: u64, held: bool) {
        if let Some(waiter) = self.probes_lock().remove(&id) {
            let _ = waiter.send(held);
        }
    }

    fn probes_lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<u64, oneshot::Sender<bool>>> {
        self.probes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
