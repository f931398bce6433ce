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
use std::sync::{Arc, Mutex};

use nats_wire::direct::{Link, Sink};

use crate::peer::{ClientMeta, ClientShared, IN_PROCESS_ADDR, Subscription, lock};
use crate::route::{Cache, Fanout, Publisher};
use crate::state::Shared;
use crate::sublist::Match;

/// A direct connection's client side: what [`Server::attach`] hands out. Dropping it
/// closes the connection and ends its subscriptions.
pub struct DirectClient {
    server: Arc<Shared>,
    me: Arc<ClientShared>,
    cache: Mutex<Cache>,
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
            cache: Mutex::new(Cache::new()),
        })
    }

    /// What `subject` matches now, through this connection's cache (counted at once:
    /// a direct connection has no read batches).
    fn lookup(&self, subject: &[u8]) -> Arc<Match<Subscription>> {
        let mut cache = lock(&self.cache);
        let found = cache.get(&self.server.index, subject);
        cache.report(&self.server.stats);
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
        let mut digits = itoa::Buffer::new();
        let sid = digits.format(sid).as_bytes();
        self.server.subscribe(&self.me, subject, queue, sid)
    }

    fn unsubscribe(&self, sid: u64, max: Option<u64>) {
        let mut digits = itoa::Buffer::new();
        self.server
            .unsubscribe(&self.me, digits.format(sid).as_bytes(), max);
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
        lock(&self.cache).forget(&self.server.stats);
        tracing::debug!(cid = self.me.cid, "direct client detached");
    }
}
