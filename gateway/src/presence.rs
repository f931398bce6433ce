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
//! Joining and binding subscribe on the gate's [bus connection](bus), whose
//! reader calls [`Presence::deliver_to_group`] and [`Presence::deliver_to_user`] for
//! what arrives; leaving and unbinding unsubscribe. A subscription is queued towards the
//! server before the join or bind is answered, on the connection the client's later
//! requests go out on: the server has it before anything those requests cause.

use std::sync::Arc;
use std::time::Duration;

use bus::{Bus, Reply};
use bytes::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use proto::Message as _;
use proto::resume::Mark;
use proto::rpc::{Claim, Probe, ServerPush, UserCommand, user_command};
use rustc_hash::FxHashSet;

use crate::asks::Asks;
use crate::bus_target::Target;
use crate::codec::PushFrame;
use crate::config::{GateConfig, UidConflict};
use crate::handover::{self, MARK_ROUTE};
use crate::inbox::{Refused, ToSession};
use crate::sessions::{GATE_SID, Sessions};

/// The groups and players of one gate's sessions, and the subscriptions that hold them.
pub(crate) struct Presence {
    bus: Arc<Bus<Target>>,
    sessions: Arc<Sessions>,
    prefix: String,
    gate: String,
    uid_conflict: UidConflict,
    probe_timeout: Duration,
    /// Groups with members on this gate, by name.
    groups: DashMap<String, Group>,
    /// Players bound on this gate, by uid.
    users: DashMap<String, Binding>,
    /// The gate's own requests: bind probes.
    asks: Arc<Asks>,
}

/// A group with members on this gate.
struct Group {
    members: FxHashSet<u64>,
    /// Resumed sessions that become members when their hand-over mark arrives here.
    arriving: FxHashSet<u64>,
    /// The bus subscription of the group's subject.
    bus_sid: u64,
}

/// A player bound on this gate.
struct Binding {
    /// The session holding the player; [`GATE_SID`] while only `arriving` does.
    sid: u64,
    /// A resumed session that holds the player once its hand-over mark arrives here.
    arriving: Option<u64>,
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
    pub(crate) fn new(
        config: &GateConfig,
        bus: Arc<Bus<Target>>,
        sessions: Arc<Sessions>,
        asks: Arc<Asks>,
    ) -> Self {
        Presence {
            bus,
            sessions,
            prefix: config.prefix.clone(),
            gate: config.gate_id.clone(),
            uid_conflict: config.uid_conflict,
            probe_timeout: config.bind_probe_timeout,
            groups: DashMap::new(),
            users: DashMap::new(),
            asks,
        }
    }

    fn group_subject(&self, group: &str) -> String {
        format!("{}.grp.{group}", self.prefix)
    }

    fn user_subject(&self, uid: &str) -> String {
        format!("{}.user.{uid}", self.prefix)
    }

    /// Adds a session to a group, subscribing the group's subject if it is new here;
    /// whether it did (the subscription is in place once the bus is flushed).
    pub(crate) fn join(&self, group: &str, sid: u64) -> bool {
        self.group_entry(group, |g| g.members.insert(sid))
    }

    /// Adds a resumed session to a group from its hand-over mark on: what the group's
    /// subject brings before the mark is the old gate's to hand over.
    fn arrive(&self, group: &str, sid: u64) {
        self.group_entry(group, |g| g.arriving.insert(sid));
    }

    /// Whether it subscribed the group's subject.
    fn group_entry(&self, group: &str, add: impl FnOnce(&mut Group) -> bool) -> bool {
        match self.groups.entry(group.to_owned()) {
            Entry::Occupied(mut e) => {
                add(e.get_mut());
                false
            }
            Entry::Vacant(v) => {
                let target = Target::Group(group.into());
                let bus_sid = self.bus.subscribe(self.group_subject(group), None, target);
                let mut g = Group {
                    members: FxHashSet::default(),
                    arriving: FxHashSet::default(),
                    bus_sid,
                };
                add(&mut g);
                v.insert(g);
                true
            }
        }
    }

    /// Removes a session from a group, unsubscribing when it was the last one here.
    pub(crate) fn leave(&self, group: &str, sid: u64) {
        let emptied = self.groups.remove_if_mut(group, |_, g| {
            g.members.remove(&sid);
            g.arriving.remove(&sid);
            g.members.is_empty() && g.arriving.is_empty()
        });
        if let Some((_, g)) = emptied {
            self.bus.unsubscribe(g.bus_sid);
        }
    }

    /// Takes up a resumed session's groups and player (`uid`, when bound) from the
    /// hand-over `mark` on: subscribes each subject, then publishes the mark on it.
    pub(crate) fn arrive_marked(&self, groups: &[String], uid: &str, sid: u64, mark: &Mark) {
        let (on_group, on_user) = handover::mark_pushes(mark);
        for group in groups {
            self.arrive(group, sid);
            let _ = self
                .bus
                .publish_bytes(&self.group_subject(group), Reply::None, &on_group);
        }
        if !uid.is_empty() {
            self.arrive_user(uid, sid);
            let _ = self
                .bus
                .publish_bytes(&self.user_subject(uid), Reply::None, &on_user);
        }
    }

    /// Gives up what [`Presence::arrive_marked`] took for `sid`.
    pub(crate) fn depart(&self, groups: &[String], uid: &str, sid: u64) {
        for group in groups {
            self.leave(group, sid);
        }
        if !uid.is_empty() {
            self.unbind(uid, sid);
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

    /// Binds `uid` to session `sid` on this gate, enforcing one session per uid;
    /// whether it subscribed the player's subject (in place once the bus is flushed).
    pub(crate) async fn bind(&self, uid: &str, sid: u64) -> Result<bool, BindError> {
        crate::route::check_token(uid).map_err(|_| BindError::Invalid)?;
        let subject = self.user_subject(uid);
        let holder = self.users.get(uid).map(|b| b.sid);
        if holder == Some(sid) {
            return Ok(false);
        }
        if self.uid_conflict == UidConflict::Refuse {
            if holder.is_some() {
                return Err(BindError::Taken);
            }
            let probe = UserCommand {
                kind: Some(user_command::Kind::Probe(Probe {})),
            };
            // An answer means a holder; no responders or silence means the uid is free.
            let answer = (self.asks)
                .ask(&subject, &probe.encode_to_vec(), self.probe_timeout)
                .await;
            if answer.is_some() {
                return Err(BindError::Taken);
            }
        }
        if let Some(old) = holder {
            self.kick_local(old, "logged in elsewhere");
        }
        let subscribed = self.user_entry(uid, |b| b.sid = sid);
        let claim = UserCommand {
            kind: Some(user_command::Kind::Claim(Claim {
                gate: self.gate.clone(),
                sid,
            })),
        };
        self.bus
            .publish_bytes(&subject, Reply::None, &claim.encode_to_vec())
            .map_err(|e| BindError::Bus(e.to_string()))?;
        Ok(subscribed)
    }

    /// Waits until the bus server has taken every subscription made before (a PING's
    /// answer), so a push published after an answer that joined or bound reaches the
    /// session; at once when the bus is down (its subscriptions go with the next
    /// connection), and no longer than `--bind-probe-timeout` on a bus that does not
    /// answer: the session's other work waits meanwhile.
    pub(crate) async fn subscriptions_in_place(&self) {
        let _ = tokio::time::timeout(self.probe_timeout, self.bus.flush()).await;
    }

    /// Binds `uid` to a resumed session from its hand-over mark on (no claim: the
    /// session holding it is this one, on its old gate).
    fn arrive_user(&self, uid: &str, sid: u64) {
        self.user_entry(uid, |b| b.arriving = Some(sid));
    }

    /// Whether it subscribed the player's subject.
    fn user_entry(&self, uid: &str, change: impl FnOnce(&mut Binding)) -> bool {
        match self.users.entry(uid.to_owned()) {
            // Already subscribed for this uid: the binding just changes hands.
            Entry::Occupied(mut e) => {
                change(e.get_mut());
                false
            }
            Entry::Vacant(v) => {
                let subject = self.user_subject(uid);
                let bus_sid = self.bus.subscribe(subject, None, Target::User(uid.into()));
                let mut b = Binding {
                    sid: GATE_SID,
                    arriving: None,
                    bus_sid,
                };
                change(&mut b);
                v.insert(b);
                true
            }
        }
    }

    /// Drops `uid`'s binding by `sid` (holding or arriving), unsubscribing once nobody
    /// holds it: a stale session closing never removes a newer session's binding.
    pub(crate) fn unbind(&self, uid: &str, sid: u64) {
        let removed = self.users.remove_if_mut(uid, |_, b| {
            if b.arriving == Some(sid) {
                b.arriving = None;
            }
            if b.sid == sid {
                b.sid = GATE_SID;
            }
            b.sid == GATE_SID && b.arriving.is_none()
        });
        if let Some((_, b)) = removed {
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
        if push.route == MARK_ROUTE {
            self.group_mark(group, &push.body);
            return;
        }
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

    /// A hand-over mark on `group`'s subject: the session arriving here becomes a
    /// member, the session leaving here stops being one and is told.
    fn group_mark(&self, group: &str, body: &[u8]) {
        let Some(mark) = handover::decode_mark(body) else {
            metrics::counter!("gate_invalid_pushes_total").increment(1);
            return;
        };
        if mark.new_gate == self.gate
            && let Some(mut g) = self.groups.get_mut(group)
            && g.arriving.remove(&mark.new_sid)
        {
            g.members.insert(mark.new_sid);
        }
        if mark.old_gate == self.gate {
            self.leave(group, mark.old_sid);
            self.marked(mark.old_sid);
        }
    }

    /// A hand-over mark on `uid`'s subject, as for a group's.
    fn user_mark(&self, uid: &str, body: &[u8]) {
        let Some(mark) = handover::decode_mark(body) else {
            metrics::counter!("gate_invalid_pushes_total").increment(1);
            return;
        };
        if mark.new_gate == self.gate
            && let Some(mut b) = self.users.get_mut(uid)
            && b.arriving == Some(mark.new_sid)
        {
            b.sid = mark.new_sid;
            b.arriving = None;
        }
        if mark.old_gate == self.gate {
            self.unbind(uid, mark.old_sid);
            self.marked(mark.old_sid);
        }
    }

    fn marked(&self, sid: u64) {
        if let Err(Refused::Full) = self.sessions.offer(sid, ToSession::Marked) {
            metrics::counter!("gate_kicks_dropped_total").increment(1);
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
            user_command::Kind::Push(push) if push.route == MARK_ROUTE => {
                self.user_mark(uid, &push.body);
            }
            // Only a resumed session arriving holds it yet: what comes before its mark
            // is the old gate's to hand over.
            _ if holder == GATE_SID => {}
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::{self, Inbox};

    fn presence(
        change: impl FnOnce(&mut GateConfig),
    ) -> (Presence, Arc<Bus<Target>>, Arc<Sessions>, Arc<Asks>) {
        let mut config = GateConfig {
            gate_id: "g1".into(),
            ..GateConfig::default()
        };
        change(&mut config);
        let bus = Bus::detached(Target::Replies, 1 << 20);
        let sessions = Arc::new(Sessions::default());
        let asks = Arc::new(Asks::new(&config, bus.clone()));
        let presence = Presence::new(&config, bus.clone(), sessions.clone(), asks.clone());
        (presence, bus, sessions, asks)
    }

    fn session(sessions: &Sessions, capacity: usize) -> (u64, Inbox) {
        let sid = sessions.next_sid();
        let (tx, inbox) = inbox::channel(capacity);
        sessions.insert(sid, tx);
        (sid, inbox)
    }

    fn push(route: &str) -> Bytes {
        ServerPush {
            route: route.into(),
            body: Default::default(),
        }
        .encode_to_vec()
        .into()
    }

    fn pushes(inbox: &mut Inbox) -> Vec<String> {
        let mut routes = vec![];
        while let Ok(msg) = inbox.rx.try_recv() {
            if let ToSession::Push(frame) = msg {
                let packet = proto::client::Packet::decode(frame.binary.clone()).unwrap();
                if let Some(proto::client::packet::Kind::Push(p)) = packet.kind {
                    routes.push(p.route);
                }
            }
        }
        routes
    }

    #[test]
    fn a_group_is_subscribed_by_its_first_local_member_and_unsubscribed_by_its_last() {
        let (presence, bus, sessions, _asks) = presence(|_| {});
        let (a, mut inbox_a) = session(&sessions, 8);
        let (b, mut inbox_b) = session(&sessions, 8);
        presence.join("room", a);
        presence.join("room", b);
        let subs = bus.written_now();
        assert_eq!(subs.matches("SUB shaddock.grp.room ").count(), 1, "{subs}");
        presence.deliver_to_group("room", push("chat.message"));
        assert_eq!(pushes(&mut inbox_a), ["chat.message"]);
        assert_eq!(pushes(&mut inbox_b), ["chat.message"]);
        presence.leave("room", a);
        assert_eq!(bus.written_now(), "", "a member is left");
        presence.deliver_to_group("room", push("chat.message"));
        assert!(pushes(&mut inbox_a).is_empty());
        assert_eq!(pushes(&mut inbox_b), ["chat.message"]);
        presence.leave("room", b);
        assert!(bus.written_now().starts_with("UNSUB "));
        assert_eq!(presence.group_count(), 0);
    }

    #[test]
    fn a_member_whose_queue_is_full_misses_the_push_and_is_told_to_close_others_get_it() {
        let (presence, _bus, sessions, _asks) = presence(|_| {});
        let (slow, mut slow_inbox) = session(&sessions, 1);
        let (fine, mut fine_inbox) = session(&sessions, 8);
        presence.join("room", slow);
        presence.join("room", fine);
        presence.deliver_to_group("room", push("one"));
        presence.deliver_to_group("room", push("two"));
        assert_eq!(pushes(&mut fine_inbox), ["one", "two"]);
        assert!(matches!(
            slow_inbox.rx.try_recv(),
            Ok(ToSession::Overflowed)
        ));
        assert_eq!(pushes(&mut slow_inbox), ["one"]);
    }

    #[test]
    fn a_hand_over_mark_cuts_a_group_and_a_player_between_two_sessions_of_one_gate() {
        let (presence, bus, sessions, _asks) = presence(|_| {});
        let (old, mut old_inbox) = session(&sessions, 8);
        let (new, mut new_inbox) = session(&sessions, 8);
        presence.join("room", old);
        presence.user_entry("ada", |b| b.sid = old);
        let mark = Mark {
            old_gate: "g1".into(),
            old_sid: old,
            new_gate: "g1".into(),
            new_sid: new,
        };
        bus.written_now();
        presence.arrive_marked(&["room".into()], "ada", new, &mark);
        let written = bus.written_now();
        assert!(!written.contains("SUB "), "subscribed already: {written}");
        assert_eq!(
            written.matches("PUB ").count(),
            2,
            "a mark on each: {written}"
        );
        // Before the mark: the old session's.
        presence.deliver_to_group("room", push("before"));
        let (on_group, on_user) = handover::mark_pushes(&mark);
        presence.deliver_to_group("room", on_group.into());
        presence.deliver_to_user("ada", on_user.into(), None);
        presence.deliver_to_group("room", push("after"));
        assert_eq!(pushes(&mut new_inbox), ["after"]);
        // The old session got what came before the mark, and was told twice (the
        // room, the player).
        let mut old_got = Vec::new();
        while let Ok(msg) = old_inbox.rx.try_recv() {
            old_got.push(match msg {
                ToSession::Marked => "marked",
                ToSession::Push(_) => "push",
                _ => "other",
            });
        }
        assert_eq!(old_got, ["push", "marked", "marked"]);
        presence.unbind("ada", old);
        assert_eq!(presence.user_count(), 1, "the new session holds the player");
        presence.depart(&["room".into()], "ada", new);
        assert_eq!((presence.group_count(), presence.user_count()), (0, 0));
    }

    #[tokio::test]
    async fn binding_a_held_uid_kicks_the_holder_and_a_stale_unbind_keeps_the_new_one() {
        let (presence, bus, sessions, _asks) = presence(|_| {});
        let (first, mut first_inbox) = session(&sessions, 8);
        let (second, _second_inbox) = session(&sessions, 8);
        presence.bind("ada", first).await.unwrap();
        let written = bus.written_now();
        assert_eq!(written.matches("SUB shaddock.user.ada ").count(), 1);
        // The claim tells other gates' holders to go.
        assert!(written.contains("PUB shaddock.user.ada "), "{written}");
        presence.bind("ada", second).await.unwrap();
        assert!(matches!(
            first_inbox.rx.try_recv(),
            Ok(ToSession::Kick(reason)) if reason == "logged in elsewhere"
        ));
        assert!(
            !bus.written_now().contains("SUB "),
            "one subscription per uid"
        );
        presence.unbind("ada", first);
        assert_eq!(presence.user_count(), 1);
        presence.unbind("ada", second);
        assert_eq!(presence.user_count(), 0);
        assert!(bus.written_now().starts_with("UNSUB "));
        assert_eq!(
            presence.bind("not a token", first).await,
            Err(BindError::Invalid)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn in_refuse_mode_a_held_uid_is_refused_and_a_silent_probe_means_free() {
        let (presence, bus, sessions, asks) = presence(|c| c.uid_conflict = UidConflict::Refuse);
        let (first, _a) = session(&sessions, 8);
        let (second, _b) = session(&sessions, 8);
        // Nobody answers the probe: after its timeout the uid is free.
        presence.bind("ada", first).await.unwrap();
        assert!(
            bus.written_now()
                .contains("PUB shaddock.user.ada shaddock.gw.g1.0.1 ")
        );
        assert_eq!(
            presence.bind("ada", second).await,
            Err(BindError::Taken),
            "held here"
        );
        // A holder elsewhere answers the probe.
        let (third, _c) = session(&sessions, 8);
        let probe = presence.bind("bob", third);
        tokio::pin!(probe);
        assert!(futures::FutureExt::now_or_never(probe.as_mut()).is_none());
        asks.answer(2, Some(Bytes::from_static(b"bound")));
        assert_eq!(probe.await, Err(BindError::Taken));
    }
}
