//! A keyed worker's partitions moving off a server in lame duck mode: a hand-over to
//! itself on a new connection (docs/workers.md, "Reconnecting and lame duck").

use std::collections::HashMap;
use std::sync::Arc;

use proto::keyed::{handover_subject, members_subject, replica_subject};
use tokio::time::Instant;

use super::super::hop::{self, Target, Waiting};
use super::{Coordinator, Handed, Out, Preparing, TakenBefore, To, covered};
use crate::bus::Client;

/// Moving off a server in lame duck mode.
pub(super) struct Hop {
    pub(super) target: Arc<Target>,
    /// The connection's next lame duck notice.
    pub(super) notice: Option<Waiting<()>>,
    /// The next lame duck notice of the worker's own connection (the answers'), once the
    /// partitions have left it.
    pub(super) output_notice: Option<Waiting<()>>,
    /// A connection to another server being made.
    pub(super) connecting: Option<Waiting<Option<Client>>>,
    /// The connection left, kept until every partition has left it.
    pub(super) left: Option<Client>,
}

impl Coordinator {
    /// Connected to another server (its server in lame duck mode): hears the peers and
    /// hand-overs there, and subscribes there every partition held and not on its way
    /// out, holding what comes; once the old server knows the new subscriptions
    /// ([`Coordinator::leave_old`]), the old ones end, and each partition goes on with
    /// what it held that the old subscription did not take ([`Coordinator::moved`]): a
    /// hand-over to itself, without the state, which stays in the loop.
    pub(super) async fn arrive(&mut self, new: Client) {
        let subscribe = async |subject: String| new.subscribe(subject).await;
        let members = subscribe(members_subject(&self.prefix, &self.service)).await;
        let handovers = subscribe(handover_subject(&self.prefix, &self.service, &self.me)).await;
        let replicas = match self.replicas_sub {
            Some(_) => {
                Some(subscribe(replica_subject(&self.prefix, &self.service, &self.me)).await)
            }
            None => None,
        };
        let replicas = replicas.transpose();
        let (Ok(members), Ok(handovers), Ok(replicas)) = (members, handovers, replicas) else {
            tracing::warn!("cannot move: cannot subscribe on the new connection");
            self.hop.notice = hop::notice(&self.client());
            return;
        };
        // Hand-overs and replicas in flight to the old subscriptions are asked again
        // by their senders (a replica missed is sent again whole).
        (self.members, self.handovers, self.replicas_sub) = (members, handovers, replicas);
        let old = self.clients.send_replace(new.clone());
        let staying: Vec<u32> = (self.held.iter())
            .filter(|(_, held)| held.out.is_none())
            .map(|(partition, _)| *partition)
            .collect();
        for partition in staying {
            let Some(subscription) = self.subscribe(partition).await else {
                continue;
            };
            self.preparing
                .insert(partition, Preparing::new(subscription));
            self.moving.insert(partition);
            if let Some(held) = self.held.get_mut(&partition) {
                held.out = Some(Out {
                    to: To::Myself,
                    id: 0, // no request names a move to itself
                    seen: HashMap::new(),
                });
            }
        }
        let deadline = Instant::now() + self.hop.target.timeout;
        let proven = self.handed_tx.clone();
        let left = old.clone();
        tokio::spawn(async move {
            let seen = tokio::time::timeout_at(deadline, hop::interest_seen(&left, &new)).await;
            if seen != Ok(true) {
                tracing::warn!(
                    "the old NATS server did not show the new subscriptions in time: moving anyway"
                );
            }
            let _ = proven.send(Handed::Proven).await;
        });
        self.hop.left = Some(old);
    }

    /// The old server knows the new subscriptions: the old ones end.
    pub(super) fn leave_old(&mut self) {
        for held in self.held.values() {
            if held.out.as_ref().is_some_and(|out| out.to == To::Myself) {
                held.subscription.leave.cancel();
            }
        }
        self.settle_hop();
    }

    /// `partition`'s old subscription has ended, on the connection left: it goes on on
    /// the new one, with what that held and `seen` does not cover.
    pub(super) async fn moved(&mut self, partition: u32, seen: &HashMap<String, u64>) {
        let subscription = match self.preparing.remove(&partition) {
            Some(preparing) => {
                for request in preparing.held {
                    if !covered(seen, &request.payload) {
                        let _ = self.out.send(request).await;
                    }
                }
                Some(preparing.subscription)
            }
            None => self.subscribe(partition).await,
        };
        self.moving.remove(&partition);
        match (self.held.get_mut(&partition), subscription) {
            (Some(held), Some(subscription)) => {
                held.subscription = subscription;
                held.out = None;
                held.taken_before =
                    TakenBefore::new(seen.clone(), self.config.keyed_member_timeout);
            }
            _ => {
                self.held.remove(&partition);
                self.say();
            }
        }
        self.settle_hop();
    }

    /// Once no partition is on the connection left, lets it go ([`hop::let_go`]: an
    /// earlier move's connection is drained and closed) and listens for the new one's
    /// notice. When that was the worker's own connection, which the answers leave
    /// through, it is made again elsewhere, as a moved worker's is (`hop.rs`): left on the
    /// server going away, it would lose the answers on the wire when that server closes
    /// it.
    fn settle_hop(&mut self) {
        let on_old = (self.held.values())
            .any(|held| held.out.as_ref().is_some_and(|out| out.to == To::Myself));
        if on_old {
            return;
        }
        let Some(left) = self.hop.left.take() else {
            return;
        };
        self.hop.notice = hop::notice(&self.client());
        tracing::info!("the partitions moved to another NATS server");
        let is_output = hop::same(&left, &self.output);
        if is_output {
            tracing::info!("making the connection of the worker's answers again elsewhere");
            self.hop.output_notice = hop::notice(&self.output);
        }
        tokio::spawn(hop::let_go(left, is_output));
    }
}
