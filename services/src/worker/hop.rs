//! Moving a worker's inputs off a server in lame duck mode, make before break: a
//! connection to another server (of `--nats`, or one the connection learnt of) is made
//! and the queue subscriptions made on it, then the old server is shown to know them (a
//! probe published through it reaches the new connection, and interest crosses a route
//! in order), and only then do the old subscriptions leave by count, as at shutdown; once
//! they have ended, the old connection is let go. `All` events and the snapshot subject
//! move too, without a lossless hand-over. Answers keep leaving through the worker's own
//! connection, made again elsewhere when it is on the server going away. The steps, and
//! what an operator sees, are in docs/workers.md ("Reconnecting and lame duck").

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::subscribe::Subjects;
use crate::bus::{self, BusSecurity};
use crate::bus::{Client, Subscriber};

/// How often the probe is published through the old server until the new connection
/// gets it.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// Where a move may go, and how long it may take.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// The worker's `--nats` URLs; the servers a connection learnt of are added.
    pub urls: Vec<String>,
    pub name: String,
    pub security: BusSecurity,
    /// `--move-timeout`.
    pub timeout: Duration,
}

/// A connection to another server with the queue subscriptions made on it.
pub(super) struct Arrival {
    pub client: Client,
    /// The client's count of connections made before the subscriptions were.
    pub connects: u64,
    pub requests: Subscriber,
    /// Queue events as the service registered them, and their subscriptions.
    pub queue: Vec<(String, Subscriber)>,
}

pub(super) type Waiting<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Watches the inputs' connection and the worker's own (the pusher's, which answers)
/// for lame duck notices, and makes the moves.
pub(super) struct Mover {
    target: Arc<Target>,
    /// The pusher's connection: answers and pushes leave through it.
    output: Client,
    /// A lame duck notice on the inputs' connection.
    input_notice: Option<Waiting<()>>,
    /// A lame duck notice on the output connection, while the inputs are elsewhere.
    output_notice: Option<Waiting<()>>,
    /// A move under way.
    pending: Option<Waiting<Option<Arrival>>>,
}

impl Mover {
    /// A mover for inputs read from `output`, the worker's own connection.
    pub(super) fn new(target: Target, output: Client) -> Self {
        let input_notice = notice(&output);
        Mover {
            target: Arc::new(target),
            output,
            input_notice,
            output_notice: None,
            pending: None,
        }
    }

    /// True while a move is under way.
    pub(super) fn moving(&self) -> bool {
        self.pending.is_some()
    }

    /// The next move made, the inputs (`subjects`) being read from `inbound`. Notices are acted on
    /// only while not `stopping` (at shutdown the subscriptions drain where they are);
    /// a move under way is finished either way, so no subscription it made is left
    /// unread. Cancel safe: everything under way is kept in `self`.
    pub(super) async fn next(
        &mut self,
        inbound: &Client,
        subjects: &Subjects,
        stopping: bool,
    ) -> Arrival {
        loop {
            let idle = self.pending.is_none();
            let Mover {
                target,
                output,
                input_notice,
                output_notice,
                pending,
            } = self;
            tokio::select! {
                arrival = until(pending) => {
                    *pending = None;
                    match arrival {
                        Some(arrival) => return arrival,
                        // It failed (and said why): a later notice tries again.
                        None => *input_notice = notice(inbound),
                    }
                }
                () = until(input_notice), if idle && !stopping => {
                    *input_notice = None;
                    tracing::warn!("the NATS server is going away: moving to another server");
                    *pending = Some(
                        arrive(target.clone(), subjects.clone(), inbound.clone()).boxed(),
                    );
                }
                () = until(output_notice) => *output_notice = reconnect_output(output),
            }
        }
    }

    /// The inputs moved from `old` to `new`: once `gone` says the old subscriptions have
    /// all ended, `old` is closed, or, when it is the output connection, made again
    /// elsewhere (the answers it holds are written first).
    pub(super) fn moved(&mut self, old: Client, mut gone: mpsc::Receiver<()>, new: &Client) {
        self.input_notice = notice(new);
        let old_is_output = same(&old, &self.output);
        self.output_notice = (!same(new, &self.output))
            .then(|| notice(&self.output))
            .flatten();
        tokio::spawn(async move {
            while gone.recv().await.is_some() {}
            let_go(old, old_is_output).await;
        });
    }
}

/// Lets `old` go, a connection whose subscriptions have all moved: made again elsewhere
/// when it is the worker's output ([`reconnect`]), else drained (what it holds written)
/// and closed.
pub(super) async fn let_go(old: Client, is_output: bool) {
    if is_output {
        reconnect(old).await;
    } else if let Err(error) = old.drain().await {
        tracing::debug!(%error, "closing the connection left");
    }
}

/// Whether `a` and `b` are one connection.
pub(super) fn same(a: &Client, b: &Client) -> bool {
    Arc::ptr_eq(&a.statistics(), &b.statistics())
}

/// `client`'s next lame duck notice, when [`bus::connect`] made it.
pub(super) fn notice(client: &Client) -> Option<Waiting<()>> {
    let signals = bus::signals(client)?;
    Some(async move { signals.lame_duck().await }.boxed())
}

/// The output of the future in `slot`, or never when there is none.
pub(super) async fn until<T>(slot: &mut Option<Waiting<T>>) -> T {
    match slot {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// The server of `output`, the connection the worker's answers leave through, is going
/// away while the inputs are elsewhere: makes it again elsewhere ([`reconnect`], in a
/// task of its own) and returns its next notice.
pub(super) fn reconnect_output(output: &Client) -> Option<Waiting<()>> {
    tracing::warn!("the NATS server of the worker's answers is going away: reconnecting");
    tokio::spawn(reconnect(output.clone()));
    notice(output)
}

/// Makes `client`'s connection again elsewhere at once: what it holds is written first,
/// and the reconnect skips the backoff's delay (the answers it carries wait meanwhile).
async fn reconnect(client: Client) {
    if let Err(error) = client.flush().await {
        tracing::debug!(%error, "flushing before reconnecting");
    }
    if let Some(signals) = bus::signals(&client) {
        signals.hurry();
    }
    if let Err(error) = client.force_reconnect().await {
        tracing::warn!(%error, "cannot reconnect");
    }
}

/// Connects elsewhere than `old`'s server, makes the queue subscriptions there and waits
/// until `old`'s server knows of them, within the target's timeout; `None` (having said
/// why) when that cannot be done.
async fn arrive(target: Arc<Target>, subjects: Subjects, old: Client) -> Option<Arrival> {
    let deadline = Instant::now() + target.timeout;
    let client = connect_elsewhere(&target, &old, deadline).await?;
    let (from, to) = (old.server_info(), client.server_info());
    let connects = client.statistics().connects.load(Ordering::Relaxed);
    let requests = queue_subscribe(&client, &subjects.requests, &subjects.group).await?;
    let mut queue = Vec::with_capacity(subjects.queue_events.len());
    for subject in &subjects.queue_events {
        let full = format!("{}.{subject}", subjects.prefix);
        queue.push((
            subject.clone(),
            queue_subscribe(&client, &full, &subjects.group).await?,
        ));
    }
    let seen = tokio::time::timeout_at(deadline, interest_seen(&old, &client)).await;
    if seen != Ok(true) {
        // Servers that are not one cluster never see each other's interest; the old
        // one goes away regardless.
        tracing::warn!(
            "the old NATS server did not show the new subscriptions in time: moving anyway"
        );
    }
    tracing::info!(from = %from.port, to = %to.port, "moved to another NATS server");
    Some(Arrival {
        client,
        connects,
        requests,
        queue,
    })
}

/// Connects to another server than `old`'s by `deadline`; `None` (having said why) when
/// none accepts in time.
pub(super) async fn connect_elsewhere(
    target: &Target,
    old: &Client,
    deadline: Instant,
) -> Option<Client> {
    let from = old.server_info();
    let urls = candidates(&target.urls, &from.connect_urls);
    if urls.len() < 2 {
        tracing::warn!(
            "no other NATS server known: serving until this one closes the connection, then reconnecting"
        );
        return None;
    }
    let connected = tokio::time::timeout_at(
        deadline,
        bus::connect_now(&urls, &target.name, &target.security),
    )
    .await;
    let client = match connected {
        Ok(Ok(client)) => client,
        Ok(Err(error)) => {
            tracing::warn!(error = %format!("{error:#}"), "cannot move: no other NATS server accepted");
            return None;
        }
        Err(_) => {
            tracing::warn!(timeout = ?target.timeout, "cannot move: no other NATS server accepted in time");
            return None;
        }
    };
    if client.server_info().server_id == from.server_id {
        tracing::warn!("cannot move: connected to the same NATS server again");
        return None;
    }
    Some(client)
}

async fn queue_subscribe(client: &Client, subject: &str, group: &str) -> Option<Subscriber> {
    match client
        .queue_subscribe(subject.to_owned(), group.to_owned())
        .await
    {
        Ok(subscriber) => Some(subscriber),
        Err(error) => {
            tracing::warn!(%subject, %error, "cannot move: cannot subscribe");
            None
        }
    }
}

/// True once a probe published through `old` reaches `new`: `old`'s server then knows
/// every subscription `new` made before the probe's (one account's interest crosses a
/// route in order). False when either connection is closed. Bounded by the caller.
pub(super) async fn interest_seen(old: &Client, new: &Client) -> bool {
    let subject = new.new_inbox();
    let Ok(mut probe) = new.subscribe(subject.clone()).await else {
        return false;
    };
    loop {
        if old.publish(subject.clone(), Bytes::new()).await.is_err() {
            return false;
        }
        match tokio::time::timeout(PROBE_INTERVAL, probe.next()).await {
            Ok(Some(_)) => return true,
            Ok(None) => return false,
            Err(_) => {}
        }
    }
}

/// The URLs a move may try: the configured ones, then the servers the old connection
/// learnt of (`host:port`, given the configured URLs' scheme), each once.
fn candidates(configured: &[String], discovered: &[String]) -> Vec<String> {
    let scheme = configured
        .first()
        .and_then(|url| url.split_once("://"))
        .map_or("nats", |(scheme, _)| scheme);
    let mut urls: Vec<String> = Vec::with_capacity(configured.len() + discovered.len());
    for url in configured.iter().cloned().chain(
        discovered
            .iter()
            .map(|address| format!("{scheme}://{address}")),
    ) {
        if !urls.iter().any(|known| address(known) == address(&url)) {
            urls.push(url);
        }
    }
    urls
}

/// What follows the scheme (and any credentials) of `url`.
fn address(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.rsplit_once('@').map_or(rest, |(_, host)| host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn candidates_add_the_learnt_servers_once_with_the_configured_scheme() {
        let configured = strings(&["tls://u:p@a:4222"]);
        let discovered = strings(&["a:4222", "b:4222", "b:4222"]);
        assert_eq!(
            candidates(&configured, &discovered),
            strings(&["tls://u:p@a:4222", "tls://b:4222"])
        );
        assert_eq!(
            candidates(&[], &strings(&["c:1"])),
            strings(&["nats://c:1"])
        );
        assert!(candidates(&[], &[]).is_empty());
    }
}
