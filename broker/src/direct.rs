//! Direct connections: a client in the broker's own process that publishes and receives
//! by calls, not bytes ([`nats_wire::direct`]). `shaddock up`'s gate and workers reach
//! their embedded broker this way: a publish is routed on the publisher's thread, and
//! each direct subscriber's sink is called there at once; a subscriber reached over bytes
//! (a worker over TCP) gets the message in its outbound buffer as from any client.
//!
//! Such a connection is a client like the others: it counts against
//! `max_connections`, shows in `/connz` (address `0.0.0.0:0`), and lame duck mode and
//! shutdown close it ([`Link::closed`] resolves). It differs in three ways, each because
//! there are no bytes: it is trusted (whoever holds the `Server` handle has the broker
//! already: no CONNECT, no credentials), it is told nothing by protocol lines (no INFO,
//! PING or `-ERR`: a refused subscription is the call's `Err`), and its publishes never
//! pause for a slow subscriber's flow control (they cannot wait: a subscriber that stops
//! reading is still cut at `max_pending`, as a slow consumer).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use nats_wire::direct::{Link, Sink};

use crate::peer::{ClientMeta, ClientShared, IN_PROCESS_ADDR, Subscription, lock};
use crate::route::{Fanout, Publisher};
use crate::state::Shared;
use crate::sublist::{MATCH_CACHE_CAPACITY, Match, MatchCache};

/// A direct connection's client side: what [`Server::attach`] hands out. Dropping it
/// closes the connection and ends its subscriptions.
pub struct DirectClient {
    server: Arc<Shared>,
    me: Arc<ClientShared>,
    cache: Mutex<Cache>,
}

/// The match cache, and how many of its entries the server's total counts.
struct Cache {
    matches: MatchCache<Subscription>,
    reported: u64,
}

impl std::fmt::Debug for DirectClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectClient")
            .field("cid", &self.me.cid)
            .finish_non_exhaustive()
    }
}

impl DirectClient {
    /// See [`Server::attach`](crate::Server::attach).
    pub(crate) fn attach(
        shared: &Arc<Shared>,
        name: &str,
        sink: Arc<dyn Sink>,
    ) -> Option<DirectClient> {
        let me = match shared.admit(IN_PROCESS_ADDR, true, Some(sink)) {
            Ok(me) => me,
            Err(full) => {
                if full.is_some() {
                    tracing::warn!(
                        name,
                        "direct connection refused: maximum connections exceeded"
                    );
                }
                return None;
            }
        };
        *lock(&me.meta) = ClientMeta {
            name: name.to_owned(),
            lang: "direct".into(),
            version: crate::state::VERSION.into(),
        };
        tracing::debug!(cid = me.cid, name, "direct client attached");
        Some(DirectClient {
            server: shared.clone(),
            me,
            cache: Mutex::new(Cache {
                matches: MatchCache::new(MATCH_CACHE_CAPACITY),
                reported: 0,
            }),
        })
    }

    /// What `subject` matches now, through this connection's cache.
    fn lookup(&self, subject: &[u8]) -> Arc<Match<Subscription>> {
        let mut cache = lock(&self.cache);
        let found = cache.matches.get(&self.server.index, subject);
        let stats = &self.server.stats;
        stats.add(&stats.cache_hits, std::mem::take(&mut cache.matches.hits));
        stats.add(
            &stats.cache_misses,
            std::mem::take(&mut cache.matches.misses),
        );
        let cached = cache.matches.len() as u64;
        if cached != cache.reported {
            (stats.cache_entries).fetch_add(cached.wrapping_sub(cache.reported), Ordering::Relaxed);
            cache.reported = cached;
        }
        found
    }
}

impl Link for DirectClient {
    fn publish(&self, subject: &[u8], reply: Option<&[u8]>, payload: &[u8]) {
        if self.me.close.is_cancelled() {
            return;
        }
        let from = Publisher {
            server: &self.server,
            me: &self.me,
            echo: true,
            no_responders: true,
        };
        let mut fanout = Fanout::default();
        fanout.batch.in_msgs = 1;
        fanout.batch.in_bytes = payload.len() as u64;
        // The cache's lock is held for each lookup only: a sink called while routing
        // may publish on this connection again.
        let mut lookup = |subject: &[u8]| self.lookup(subject);
        fanout.route(&from, &mut lookup, subject, reply, None, payload);
        fanout.end(&self.server, &self.me);
    }

    fn subscribe(
        &self,
        sid: u64,
        subject: &[u8],
        queue: Option<&[u8]>,
    ) -> Result<(), &'static str> {
        let sid = itoa::Buffer::new().format(sid).as_bytes().to_vec();
        self.server.subscribe(&self.me, subject, queue, &sid)
    }

    fn unsubscribe(&self, sid: u64, max: Option<u64>) {
        let sid = itoa::Buffer::new().format(sid).as_bytes().to_vec();
        self.server.unsubscribe(&self.me, &sid, max);
    }

    fn closed(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.me.close.cancelled())
    }

    fn server_id(&self) -> String {
        self.server.id.clone()
    }

    fn max_payload(&self) -> usize {
        self.server.config.max_payload
    }
}

impl Drop for DirectClient {
    fn drop(&mut self) {
        self.me.close.cancel();
        self.server.remove_client(&self.me);
        let reported = lock(&self.cache).reported;
        (self.server.stats.cache_entries).fetch_sub(reported, Ordering::Relaxed);
        tracing::debug!(cid = self.me.cid, "direct client detached");
    }
}
