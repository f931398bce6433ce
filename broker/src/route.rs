//! Routing one published message: to every plain subscription it matches and to one
//! member of each queue group, or back to the publisher as "no responders". Shared by
//! the connections that read the protocol (`client`) and those that call it (`direct`).
//!
//! A subscriber reached over bytes gets the message appended to its outbound buffer and
//! its writer is woken once per batch ([`Fanout::end`]), not once per message; a direct
//! subscriber's sink is called at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use net::LogLimiter;
use rustc_hash::FxHashSet;

use crate::peer::{ClientShared, Delivery, Subscription};
use crate::state::{Shared, Stats};
use crate::sublist::{MATCH_CACHE_CAPACITY, Match, MatchCache, SubjectIndex};

/// Slow consumers, one line a second at most: a peer that stops reading (or a thousand
/// of them) must not flood the log.
static SLOW_CONSUMER_LOG: LogLimiter = LogLimiter::per_second();

/// A connection's match cache, whose hits, misses and size count in the server's
/// totals (for `/varz`).
pub(crate) struct Cache {
    matches: MatchCache<Subscription>,
    /// Entries last added to the server's total.
    reported: u64,
}

impl Cache {
    pub fn new() -> Cache {
        Cache {
            matches: MatchCache::new(MATCH_CACHE_CAPACITY),
            reported: 0,
        }
    }

    /// What `subject` matches in `index` now.
    pub fn get(
        &mut self,
        index: &SubjectIndex<Subscription>,
        subject: &[u8],
    ) -> Arc<Match<Subscription>> {
        self.matches.get(index, subject)
    }

    /// Adds what the cache did since the last report to the server's totals.
    pub fn report(&mut self, stats: &Stats) {
        stats.add(&stats.cache_hits, std::mem::take(&mut self.matches.hits));
        stats.add(
            &stats.cache_misses,
            std::mem::take(&mut self.matches.misses),
        );
        let cached = self.matches.len() as u64;
        if cached != self.reported {
            (stats.cache_entries).fetch_add(cached.wrapping_sub(self.reported), Ordering::Relaxed);
            self.reported = cached;
        }
    }

    /// Takes this cache's entries out of the server's total: its connection ended.
    pub fn forget(&self, stats: &Stats) {
        (stats.cache_entries).fetch_sub(self.reported, Ordering::Relaxed);
    }
}

/// Who publishes, as routing needs to know it.
pub(crate) struct Publisher<'a> {
    pub server: &'a Shared,
    pub me: &'a Arc<ClientShared>,
    /// Whether the publisher's own subscriptions get its messages (CONNECT's `echo`).
    pub echo: bool,
    /// Whether a request nobody received is answered "no responders" at once.
    pub no_responders: bool,
}

/// Counters a batch adds to the server's totals in one go.
#[derive(Default)]
pub(crate) struct BatchStats {
    pub in_msgs: u64,
    pub in_bytes: u64,
    pub out_msgs: u64,
    pub out_bytes: u64,
}

/// What routing a batch of messages left to do at its end.
#[derive(Default)]
pub(crate) struct Fanout {
    /// Writers touched by this batch, woken once at its end.
    dirty: Vec<Arc<ClientShared>>,
    dirty_ids: FxHashSet<u64>,
    /// Subscribers this batch pushed past the flow-control mark.
    pressed: Vec<Arc<ClientShared>>,
    pub batch: BatchStats,
}

impl Fanout {
    /// Delivers one message to every plain subscription and one member per queue
    /// group; `lookup` says what a subject matches.
    pub fn route(
        &mut self,
        from: &Publisher<'_>,
        lookup: &mut dyn FnMut(&[u8]) -> Arc<Match<Subscription>>,
        subject: &[u8],
        reply: Option<&[u8]>,
        headers: Option<&[u8]>,
        payload: &[u8],
    ) {
        let found = lookup(subject);
        let mut delivered = false;
        for sub in &found.psubs {
            delivered |= self.deliver_to(from, sub, subject, reply, headers, payload);
        }
        for (_, members) in &found.qsubs {
            let n = members.len();
            let start = fastrand::usize(..n);
            // Random member first; skip members that cannot take it.
            for i in 0..n {
                let member = &members[(start + i) % n];
                if self.deliver_to(from, member, subject, reply, headers, payload) {
                    delivered = true;
                    break;
                }
            }
        }
        if !delivered
            && let Some(reply) = reply
            && from.no_responders
        {
            no_responders(from, lookup, subject, reply);
        }
    }

    fn deliver_to(
        &mut self,
        from: &Publisher<'_>,
        sub: &Arc<Subscription>,
        subject: &[u8],
        reply: Option<&[u8]>,
        headers: Option<&[u8]>,
        payload: &[u8],
    ) -> bool {
        let client = &sub.client;
        if !from.echo && client.cid == from.me.cid {
            return false;
        }
        let (allowed, last) = sub.take_one();
        if !allowed {
            // Its max was reached: removed already, or now (see `take_one`).
            from.server.remove_sub(sub);
            return false;
        }
        if last {
            from.server.remove_sub(sub);
        }
        let delivery = client.deliver(&sub.sid, subject, reply, headers, payload);
        if delivery == Delivery::Pressed && !self.pressed.iter().any(|c| c.cid == client.cid) {
            self.pressed.push(client.clone());
        }
        match delivery {
            Delivery::Queued | Delivery::Pressed | Delivery::Handed => {
                self.batch.out_msgs += 1;
                self.batch.out_bytes += (payload.len() + headers.map_or(0, <[u8]>::len)) as u64;
                // A direct subscriber has it already; consecutive messages mostly go to
                // the same subscriber: skip the set.
                let last = self.dirty.last().map(|c| c.cid);
                if delivery != Delivery::Handed
                    && last != Some(client.cid)
                    && self.dirty_ids.insert(client.cid)
                {
                    self.dirty.push(client.clone());
                }
                true
            }
            Delivery::SlowConsumer => {
                (from.server.stats.slow_consumers).fetch_add(1, Ordering::Relaxed);
                if let Some(tally) = SLOW_CONSUMER_LOG.check() {
                    tracing::warn!(cid = client.cid, "slow consumer: closed{tally}");
                }
                false
            }
            Delivery::Closed => false,
        }
    }

    /// The subscribers this batch pushed past the flow-control mark, for the publisher
    /// to wait on before it reads more.
    pub fn take_pressed(&mut self) -> Vec<Arc<ClientShared>> {
        std::mem::take(&mut self.pressed)
    }

    /// Wakes every writer this batch fed, and adds the batch's counts to the totals.
    pub fn end(&mut self, server: &Shared, me: &ClientShared) {
        for client in self.dirty.drain(..) {
            client.wake();
        }
        self.dirty_ids.clear();
        let b = std::mem::take(&mut self.batch);
        if b.in_msgs > 0 {
            me.in_msgs.fetch_add(b.in_msgs, Ordering::Relaxed);
            me.in_bytes.fetch_add(b.in_bytes, Ordering::Relaxed);
        }
        let stats = &server.stats;
        stats.add(&stats.in_msgs, b.in_msgs);
        stats.add(&stats.in_bytes, b.in_bytes);
        stats.add(&stats.out_msgs, b.out_msgs);
        stats.add(&stats.out_bytes, b.out_bytes);
    }
}

/// Tells a requester at once that nobody received its request: an empty `HMSG` with
/// status 503 on its own subscription matching the reply subject.
fn no_responders(
    from: &Publisher<'_>,
    lookup: &mut dyn FnMut(&[u8]) -> Arc<Match<Subscription>>,
    subject: &[u8],
    reply: &[u8],
) {
    let found = lookup(reply);
    let mine = found
        .psubs
        .iter()
        .chain(found.qsubs.iter().flat_map(|(_, m)| m.iter()))
        .find(|s| s.client.cid == from.me.cid);
    let Some(sub) = mine else {
        return;
    };
    let mut headers = Vec::with_capacity(40 + subject.len());
    headers.extend_from_slice(b"NATS/1.0 503\r\nNats-Subject: ");
    headers.extend_from_slice(subject);
    headers.extend_from_slice(b"\r\n\r\n");
    if from.me.deliver(&sub.sid, reply, None, Some(&headers), b"") == Delivery::Queued {
        from.me.wake();
    }
}
