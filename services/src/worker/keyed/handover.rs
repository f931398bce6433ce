//! Handing a partition over, and taking one (docs/workers.md, "Hand-over"): the two
//! requests on the new owner's hand-over subject (a prepare, then the state with `seen`,
//! sent again until answered while the new owner lives), and the old owner's side
//! between them (the overlap, leaving).

use std::collections::HashMap;
use std::time::Duration;

use async_nats::Subject;
use bytes::Bytes;
use futures::StreamExt;
use proto::Message as _;
use proto::keyed::handover_subject;
use proto::rpc::{HandOver, RequestOrder};

use super::{Coordinator, Handed, Out, Preparing, REFUSED, Sent, To};
use crate::bus::{Client, Subscriber};
use crate::frame_loop::{Incoming, InputKind};
use crate::metrics::{PARTITION_CONFLICTS_TOTAL, PARTITIONS_HANDED_TOTAL};

impl Coordinator {
    /// `partition`'s subscription `sub` has ended: everything it took is queued for the
    /// loop. When it is being handed over, its state and `seen` follow.
    pub(super) async fn ended(&mut self, partition: u32, sub: u64) {
        let Some(held) = self.held.get_mut(&partition) else {
            return;
        };
        if held.subscription.sub != sub {
            return;
        }
        let handing =
            (held.out.as_mut()).map(|out| (out.to.clone(), out.id, std::mem::take(&mut out.seen)));
        let (to, id, seen) = match handing {
            Some((To::Peer(to), id, seen)) => (to, id, seen),
            Some((To::Myself, _, seen)) => return self.moved(partition, &seen).await,
            Some((To::Nobody, ..)) | None => {
                // Left (nobody to hand it to), or the connection closed under it.
                self.held.remove(&partition);
                self.moving.remove(&partition);
                self.say();
                return;
            }
        };
        // The loop answers the state here, after the partition's last request, through
        // the worker's own connection: subscribed on that one, the subscription is
        // known to its server before the answer arrives there (on the connection of the
        // moment, after a move, it might not be yet, and the state would be lost).
        let inbox = self.output.new_inbox();
        let state = match self.output.subscribe(inbox.clone()).await {
            Ok(subscriber) => subscriber,
            Err(error) => {
                tracing::error!(partition, %error, "cannot subscribe for a partition's state");
                return;
            }
        };
        let marker = Incoming::partition(
            InputKind::HandOver,
            partition,
            Bytes::new(),
            Some(Subject::from(inbox)),
        );
        if self.out.send(marker).await.is_err() {
            return;
        }
        let ask = self.ask(&to);
        let handed = self.handed_tx.clone();
        tokio::spawn(async move {
            let sent = ask.state(partition, id, state, seen).await;
            let _ = handed.send(Handed::Done { partition, sent }).await;
        });
    }

    /// Starts handing `partition` over to `to`: asks it to prepare and, once the overlap
    /// is over, leaves ([`Coordinator::prepared`]); with nobody to hand it to, leaves at
    /// once.
    pub(super) fn hand_over(&mut self, partition: u32, to: Option<String>) {
        let Some(held) = self.held.get_mut(&partition) else {
            return;
        };
        tracing::debug!(partition, ?to, "handing over");
        self.moving.insert(partition);
        self.last_handover += 1;
        let id = self.last_handover;
        held.out = Some(Out {
            to: to.clone().map_or(To::Nobody, To::Peer),
            id,
            seen: HashMap::new(),
        });
        let Some(to) = to else {
            held.subscription.leave.cancel();
            return;
        };
        let ask = self.ask(&to);
        let overlap = self.config.handover_overlap;
        let handed = self.handed_tx.clone();
        let prepare = HandOver {
            partition,
            prepare: true,
            id,
            ..HandOver::default()
        };
        tokio::spawn(async move {
            let ok = ask.run(prepare).await == Answer::Taken;
            if ok {
                tokio::time::sleep(overlap).await;
            }
            let _ = handed.send(Handed::Prepared { partition, ok }).await;
        });
    }

    /// Asking worker `to` about a hand-over.
    fn ask(&self, to: &str) -> Ask {
        Ask {
            client: self.client(),
            subject: handover_subject(&self.prefix, &self.service, to),
            from: self.me.clone(),
            timeout: self.config.handover_timeout,
        }
    }

    /// `partition`'s new owner prepared and the overlap is over: leave it (the rest
    /// follows its end, [`Coordinator::ended`]). Not prepared: keep it, as if nothing
    /// happened, and try again later.
    pub(super) fn prepared(&mut self, partition: u32, ok: bool) {
        let Some(held) = self.held.get_mut(&partition) else {
            return;
        };
        if ok {
            held.subscription.leave.cancel();
        } else {
            tracing::debug!(partition, "the new owner did not prepare: kept here");
            held.out = None;
            self.moving.remove(&partition);
            metrics::counter!(PARTITIONS_HANDED_TOTAL, "service" => self.service.clone(), "outcome" => "kept")
                .increment(1);
        }
    }

    /// What became of `partition`'s state: the partition is the new owner's, or it stays
    /// here; unanswered, it is sent again while the new owner lives, since that one may
    /// have taken it (taking it back then would leave two owners, their states parting).
    pub(super) async fn handed(&mut self, partition: u32, sent: Sent) {
        let state = match sent {
            Sent::Taken => None,
            Sent::Kept(state) => Some(state),
            Sent::Unanswered(handover) => match self.send_again(partition, handover) {
                Ok(()) => return,
                Err(state) => Some(state),
            },
        };
        self.moving.remove(&partition);
        self.held.remove(&partition);
        let outcome = match state {
            None => {
                self.say();
                "ok"
            }
            Some(state) => {
                tracing::warn!(
                    partition,
                    "the new owner did not take the partition: kept here"
                );
                let how = (InputKind::TakeOver, "handed");
                self.take(partition, how, state, None).await;
                "kept"
            }
        };
        metrics::counter!(PARTITIONS_HANDED_TOTAL, "service" => self.service.clone(), "outcome" => outcome)
            .increment(1);
    }

    /// Sends `partition`'s state again, unanswered so far, while its new owner lives;
    /// gives it back once that one is counted dead.
    fn send_again(&self, partition: u32, handover: HandOver) -> Result<(), Bytes> {
        let to = (self.held.get(&partition))
            .and_then(|held| held.out.as_ref())
            .and_then(|out| match &out.to {
                To::Peer(to) => Some(to.clone()),
                To::Nobody | To::Myself => None,
            });
        let Some(to) = to.filter(|to| self.view.lives(to)) else {
            return Err(handover.state);
        };
        tracing::warn!(partition, %to, "the new owner did not answer the state in time: sent again");
        let ask = self.ask(&to);
        let handed = self.handed_tx.clone();
        tokio::spawn(async move {
            let sent = ask.send(handover).await;
            let _ = handed.send(Handed::Done { partition, sent }).await;
        });
        Ok(())
    }

    /// A peer hands a partition over to this worker: a prepare, or the state.
    pub(super) async fn take_handed(&mut self, message: async_nats::Message) {
        let Some(reply) = message.reply else {
            return;
        };
        let Ok(handover) = HandOver::decode(message.payload) else {
            tracing::warn!("a hand-over that does not decode: refused");
            return answer(self.client(), reply, REFUSED).await;
        };
        let partition = handover.partition;
        let taken = if handover.prepare {
            self.prepare(partition).await
        } else {
            self.take_state(handover).await
        };
        answer(self.client(), reply, if taken { b"" } else { REFUSED }).await;
    }

    /// A prepare: subscribes `partition` and holds what comes, unless this worker is
    /// leaving or has the partition coming or going already; one it holds (a conflict)
    /// is accepted as it is.
    async fn prepare(&mut self, partition: u32) -> bool {
        if self.leaving
            || self.moving.contains(&partition)
            || self.preparing.contains_key(&partition)
        {
            return false;
        }
        if self.held.contains_key(&partition) {
            // Two views disagreed for a moment and both took it: this worker is
            // subscribed already, and the state handed over replaces its own
            // ([`Coordinator::take_state`]), which settles it.
            return true;
        }
        let Some(subscription) = self.subscribe(partition).await else {
            return false;
        };
        // Answered once the server has the subscription.
        if let Err(error) = self.client().flush().await {
            tracing::debug!(partition, %error, "cannot flush a prepared partition's subscription");
            subscription.leave.cancel();
            return false;
        }
        self.preparing
            .insert(partition, Preparing::new(subscription));
        true
    }

    /// The state: taken, on the subscription a prepare made if there was one (never
    /// refused then), else on a new one unless this worker is leaving or handing the
    /// partition away. One taken already (sent again, its answer lost or late) is
    /// answered taken, and changes nothing, wherever the partition is now.
    async fn take_state(&mut self, handover: HandOver) -> bool {
        let partition = handover.partition;
        let named = (handover.id != 0).then(|| (handover.from.clone(), handover.id));
        if named.is_some() && self.taken.get(&partition) == named.as_ref() {
            tracing::debug!(partition, from = %handover.from, "a state taken already, sent again");
            return true;
        }
        let prepared = self.preparing.contains_key(&partition);
        if !prepared && (self.leaving || self.moving.contains(&partition)) {
            return false;
        }
        if let Some(named) = named {
            self.taken.insert(partition, named);
        }
        if !prepared && self.held.contains_key(&partition) {
            // Two views disagreed for a moment: the state handed over replaces this one.
            tracing::warn!(partition, from = %handover.from, "handed a partition held here already");
            metrics::counter!(PARTITION_CONFLICTS_TOTAL, "service" => self.service.clone())
                .increment(1);
            let _ = (self.out)
                .send(Incoming::partition(
                    InputKind::TakeOver,
                    partition,
                    handover.state,
                    None,
                ))
                .await;
            return true;
        }
        tracing::debug!(partition, from = %handover.from, prepared, "taking a partition handed over");
        let seen: HashMap<String, u64> = handover.seen.into_iter().collect();
        let how = (InputKind::TakeOver, "handed");
        (self.take(partition, how, handover.state, Some(&seen))).await;
        true
    }
}

/// Notes request `payload`'s origin and seq in `seen`.
pub(super) fn note(seen: &mut HashMap<String, u64>, payload: &[u8]) {
    let Ok(order) = RequestOrder::decode(payload) else {
        return;
    };
    if order.origin.is_empty() {
        return;
    }
    let highest = seen.entry(order.origin).or_default();
    *highest = (*highest).max(order.seq);
}

/// Whether `seen` covers request `payload`: the old owner took it (or a later one of
/// its origin).
pub(super) fn covered(seen: &HashMap<String, u64>, payload: &[u8]) -> bool {
    RequestOrder::decode(payload).is_ok_and(|order| {
        seen.get(&order.origin)
            .is_some_and(|&highest| order.seq <= highest)
    })
}

/// Answers a hand-over: empty when taken.
async fn answer(client: Client, reply: Subject, body: &'static [u8]) {
    if let Err(error) = client.publish(reply, Bytes::from_static(body)).await {
        tracing::debug!(%error, "cannot answer a hand-over");
    }
}

/// Asking a partition's new owner.
struct Ask {
    client: Client,
    subject: String,
    from: String,
    timeout: Duration,
}

/// How a hand-over request was answered.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Empty: done.
    Taken,
    /// Non-empty: refused, nothing done.
    Refused,
    /// Not in time, or nobody to ask: done or not, nobody can tell here.
    Unanswered,
}

impl Ask {
    /// Sends `handover` (with `from`), and waits for its answer at most the timeout.
    async fn run(&self, handover: HandOver) -> Answer {
        let handover = HandOver {
            from: self.from.clone(),
            ..handover
        };
        let partition = handover.partition;
        let asked = tokio::time::timeout(
            self.timeout,
            (self.client).request(self.subject.clone(), handover.encode_to_vec().into()),
        )
        .await;
        match asked {
            Ok(Ok(answer)) if answer.payload.is_empty() => Answer::Taken,
            Ok(Ok(_)) => Answer::Refused,
            Ok(Err(error)) => {
                tracing::debug!(partition, %error, "hand-over not answered");
                Answer::Unanswered
            }
            Err(_) => Answer::Unanswered,
        }
    }

    /// Waits for the state from the loop, and sends it with `seen` as hand-over `id`.
    async fn state(
        self,
        partition: u32,
        id: u64,
        mut state: Subscriber,
        seen: HashMap<String, u64>,
    ) -> Sent {
        // The loop answers after the partition's last request; a stuck loop would leave
        // the partition nowhere, so this waits as long as a request may.
        let Some(state) = state.next().await else {
            return Sent::Kept(Bytes::new());
        };
        let handover = HandOver {
            partition,
            state: state.payload,
            seen: seen.into_iter().collect(),
            from: self.from.clone(),
            id,
            ..HandOver::default()
        };
        // One message carries it (docs/workers.md, "Limits"): the bus would refuse a
        // larger one, so it is not sent, and said plainly.
        let (size, max) = (
            handover.encoded_len(),
            self.client.server_info().max_payload,
        );
        if size > max {
            tracing::error!(
                partition,
                size,
                max,
                "a partition's state and seen exceed the bus's max payload: it cannot move"
            );
            return Sent::Kept(handover.state);
        }
        self.send(handover).await
    }

    /// Sends the state `handover`, the first time or again. Unanswered, it is told no
    /// sooner than the timeout (nobody to ask fails at once), so that sending it again
    /// goes at that pace.
    async fn send(self, handover: HandOver) -> Sent {
        let deadline = tokio::time::Instant::now() + self.timeout;
        match self.run(handover.clone()).await {
            Answer::Taken => Sent::Taken,
            Answer::Refused => Sent::Kept(handover.state),
            Answer::Unanswered => {
                tokio::time::sleep_until(deadline).await;
                Sent::Unanswered(handover)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::rpc::RpcRequest;

    fn request(origin: &str, seq: u64) -> Vec<u8> {
        RpcRequest {
            route: "arena.input".into(),
            key: "m1".into(),
            origin: origin.into(),
            seq,
            ..RpcRequest::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn seen_covers_what_the_old_owner_took_and_nothing_after() {
        let mut seen = HashMap::new();
        for (origin, seq) in [("g.1", 3), ("g.1", 5), ("g.2", 9), ("", 4)] {
            note(&mut seen, &request(origin, seq));
        }
        assert_eq!(seen.len(), 2, "a request without an origin is not noted");
        assert_eq!(seen["g.1"], 5);
        assert!(covered(&seen, &request("g.1", 5)));
        assert!(covered(&seen, &request("g.1", 1)));
        assert!(!covered(&seen, &request("g.1", 6)));
        assert!(covered(&seen, &request("g.2", 9)));
        assert!(
            !covered(&seen, &request("g.3", 1)),
            "an origin the old owner never saw"
        );
        assert!(
            !covered(&seen, &request("", 1)),
            "a request without an origin is kept"
        );
        assert!(
            !covered(&seen, b"\xff\xff"),
            "nor is one that does not decode"
        );
    }

    /// The old owner's last step at the bus's max payload: a state and `seen` that fill
    /// it exactly move; one byte more stays here, and nothing is sent.
    #[tokio::test]
    async fn a_state_past_the_max_payload_stays_here() {
        const MAX: usize = 2048;
        let config = broker::Config {
            max_payload: MAX,
            ..broker::Config::default()
        };
        let bus = broker::testing::Bus::embedded_with(config).await;
        let client = Client::from(async_nats::connect(bus.url()).await.expect("connects"));
        let mut new_owner = client.subscribe("new-owner").await.expect("subscribes");
        let answering = client.clone();
        let taken = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sizes = taken.clone();
        let new_owner = tokio::spawn(async move {
            while let Some(message) = new_owner.next().await {
                sizes
                    .lock()
                    .expect("not poisoned")
                    .push(message.payload.len());
                let reply = message.reply.expect("a request");
                answering
                    .publish(reply, Bytes::new())
                    .await
                    .expect("answers");
            }
        });
        let seen = HashMap::from([("gate.7f3a".to_owned(), 12)]);
        let hand_over = |state: usize| {
            let (client, seen) = (client.clone(), seen.clone());
            async move {
                let inbox = client.new_inbox();
                let from_loop = client.subscribe(inbox.clone()).await.expect("subscribes");
                let ask = Ask {
                    client: client.clone(),
                    subject: "new-owner".into(),
                    from: "old-owner".into(),
                    timeout: Duration::from_secs(5),
                };
                let loop_state = Bytes::from(vec![7; state]);
                client
                    .publish(inbox, loop_state)
                    .await
                    .expect("the loop answers");
                ask.state(3, 1, from_loop, seen).await
            }
        };
        let size = |state: usize| {
            HandOver {
                partition: 3,
                from: "old-owner".into(),
                state: vec![7; state].into(),
                seen: seen.clone().into_iter().collect(),
                id: 1,
                ..HandOver::default()
            }
            .encoded_len()
        };
        let fits = (0..MAX)
            .rev()
            .find(|&n| size(n) <= MAX)
            .expect("a state fits");
        assert_eq!(size(fits), MAX, "the edge is reachable");
        testkit::within(async {
            assert!(
                matches!(hand_over(fits).await, Sent::Taken),
                "exactly the max payload moves"
            );
            let Sent::Kept(kept) = hand_over(fits + 1).await else {
                panic!("one byte more stays");
            };
            assert_eq!(kept.len(), fits + 1, "the state is given back whole");
            client.flush().await.expect("flushes");
        })
        .await;
        new_owner.abort();
        assert_eq!(
            *taken.lock().expect("not poisoned"),
            [MAX],
            "what the new owner got"
        );
    }
}
