//! The connection task: the one owner of the sockets' writing halves. It writes queued
//! frames in batches with one flush each, sends heartbeats, reconnects with backoff when
//! the connection drops, and moves to another gate when its gate drains.
//!
//! **Moving.** On a drain the task dials the other URLs in turn, starting after the
//! draining gate's, while the old connection keeps serving. Once one handshakes, new
//! requests go to it; the old connection stays open, retiring, until every request sent
//! on it is answered there (or it ends), then is closed. If no other gate answers, the
//! client stays on the draining gate; when that gate closes, a kick included, the
//! client reconnects as after any drop (when [`super::ClientOptions::reconnect`] is set).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use proto::client::Push;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::connection::{self, Dialed, connect_in_turn};
use super::error::ErrorKind;
use super::link::{Event, Exit, Link, Routes};
use super::shared::{FIRST_EPOCH, Shared};
use super::{Backoff, ClientOptions, frame};

/// Most frames written before one flush, so a busy queue cannot delay the flush of
/// what is already buffered indefinitely.
const MAX_BATCH: usize = 256;
/// Floor for the reconnect delay, so a zero `Backoff::initial` cannot spin.
const MIN_BACKOFF: Duration = Duration::from_millis(1);

/// The reason given to requests after [`super::Client::close`].
pub(crate) const CLOSED_BY_CLIENT: &str = "closed by client";

/// A frame for the writer, tagged with the epoch its request registered under.
pub(crate) struct Outgoing {
    pub(crate) epoch: u64,
    pub(crate) frame: bytes::Bytes,
}

/// A move under way: dialing the other gates.
type Moving = Pin<Box<dyn Future<Output = Option<Dialed>> + Send>>;

pub(crate) struct Task {
    pub(crate) urls: Arc<[String]>,
    pub(crate) options: Arc<ClientOptions>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) outgoing: mpsc::Receiver<Outgoing>,
    pub(crate) pushes: mpsc::Sender<Push>,
    pub(crate) cancel: CancellationToken,
}

/// Closes the shared state however the task ends, panics included, so no request
/// waits for a task that is gone.
struct FinishOnDrop(Arc<Shared>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.finish("connection task ended");
    }
}

/// The links of one unbroken run of connections: the current one and those retiring
/// after a move.
struct Links {
    current: Link,
    retiring: Vec<Link>,
}

impl Links {
    fn get(&mut self, epoch: u64) -> Option<&mut Link> {
        if self.current.epoch == epoch {
            return Some(&mut self.current);
        }
        self.retiring.iter_mut().find(|l| l.epoch == epoch)
    }

    fn all(&mut self) -> impl Iterator<Item = &mut Link> {
        std::iter::once(&mut self.current).chain(self.retiring.iter_mut())
    }

    /// Half the shortest heartbeat interval any open gate asked for: each gate closes
    /// after two missed intervals, so this leaves room for a busy scheduler.
    fn heartbeat(&self) -> Option<Interval> {
        let ms = std::iter::once(&self.current)
            .chain(&self.retiring)
            .map(|l| l.heartbeat_ms)
            .filter(|&ms| ms > 0)
            .min()?;
        let period = Duration::from_millis(u64::from(ms)) / 2;
        let mut interval = tokio::time::interval_at(Instant::now() + period, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Some(interval)
    }

    /// Removes retiring link `epoch` and fails what still waits on it.
    fn retire(&mut self, shared: &Shared, epoch: u64, reason: &str) -> Option<Link> {
        let at = self.retiring.iter().position(|l| l.epoch == epoch)?;
        shared.retire(epoch, reason);
        Some(self.retiring.swap_remove(at))
    }
}

impl Task {
    pub(crate) async fn run(mut self, dialed: Dialed) {
        let _finish = FinishOnDrop(self.shared.clone());
        let reason = self.serve_all(dialed).await;
        debug!(%reason, "connection closed");
        self.shared.finish(&reason);
    }

    /// Serves connections until one ends for good; returns why.
    async fn serve_all(&mut self, mut dialed: Dialed) -> String {
        let mut epoch = FIRST_EPOCH;
        loop {
            match self.serve(dialed, epoch).await {
                (Exit::Closed, _) => return CLOSED_BY_CLIENT.to_owned(),
                (Exit::Kicked(reason), _) => return reason,
                (Exit::Lost(reason), url_index) => {
                    let Some(backoff) = self.options.reconnect else {
                        return reason;
                    };
                    debug!(%reason, "connection lost; reconnecting");
                    epoch = self.shared.lose(&reason);
                    dialed = match self.reconnect(backoff, url_index).await {
                        Ok(dialed) => dialed,
                        Err(reason) => return reason,
                    };
                    debug!(session_id = dialed.ack.session_id, "reconnected");
                    self.shared.up(epoch, dialed.ack.session_id);
                }
            }
        }
    }

    /// Runs one connection, and those it moves to, until the current one ends. Returns
    /// how, and the index of the URL it was on.
    async fn serve(&mut self, dialed: Dialed, epoch: u64) -> (Exit, usize) {
        // Unbounded, yet bounded by construction: each link sends at most two events
        // (see `link::read_loop`), and links are the current one and those retiring.
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let routes = Routes {
            shared: self.shared.clone(),
            pushes: self.pushes.clone(),
            events: events_tx,
        };
        let mut links = Links {
            current: Link::start(dialed, epoch, routes.clone()),
            retiring: Vec::new(),
        };
        let mut heartbeat = links.heartbeat();
        let mut moving: Option<Moving> = None;
        let json = self.options.json;
        let exit = loop {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => break Exit::Closed,
                Some((epoch, event)) = events.recv() => {
                    if let Some(exit) = self.on_event(&mut links, &mut moving, epoch, event) {
                        break exit;
                    }
                }
                dialed = poll_moving(&mut moving) => {
                    moving = None;
                    let Some(dialed) = dialed else {
                        debug!("no other gate answered; staying on the draining one");
                        continue;
                    };
                    let epoch = self.shared.moved(dialed.ack.session_id);
                    debug!(session_id = dialed.ack.session_id, url = self.urls[dialed.url_index], "moved");
                    let old = std::mem::replace(&mut links.current, Link::start(dialed, epoch, routes.clone()));
                    links.retiring.push(old);
                    heartbeat = links.heartbeat();
                }
                () = self.shared.retired(), if !links.retiring.is_empty() => {
                    let done: Vec<u64> = links.retiring.iter().map(|l| l.epoch).filter(|&e| self.shared.retiring_done(e)).collect();
                    for epoch in done {
                        if let Some(link) = links.retire(&self.shared, epoch, "") {
                            tokio::spawn(link.close());
                        }
                    }
                    heartbeat = links.heartbeat();
                }
                out = self.outgoing.recv() => match out {
                    Some(out) => {
                        if let Some(exit) = self.write_batch(&mut links, out).await {
                            break exit;
                        }
                    }
                    // Every handle is gone.
                    None => break Exit::Closed,
                },
                () = tick(&mut heartbeat) => {
                    let mut failed = None;
                    for link in links.all() {
                        let written = match link.feed(json, frame::heartbeat(json)).await {
                            Ok(()) => link.flush().await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = written {
                            failed = Some((link.epoch, e));
                            break;
                        }
                    }
                    if let Some((epoch, reason)) = failed
                        && let Some(exit) = self.write_failed(&mut links, epoch, reason) {
                        break exit;
                    }
                }
            }
        };
        let url_index = links.current.url_index;
        // Retiring links end with the current one: a lost connection fails everything
        // pending (the reconnection starts afresh), and so does the client's end.
        for link in links.retiring.drain(..) {
            tokio::spawn(link.close());
        }
        if !matches!(exit, Exit::Lost(_)) {
            links.current.close().await;
        }
        (exit, url_index)
    }

    /// Handles what a reader reported; `Some` when the current connection is over.
    fn on_event(
        &self,
        links: &mut Links,
        moving: &mut Option<Moving>,
        epoch: u64,
        event: Event,
    ) -> Option<Exit> {
        let current = links.current.epoch == epoch;
        match event {
            Event::Drain { reason } if current => {
                debug!(%reason, "the gate is draining");
                links.current.drained = true;
                let others = self.urls.len() - 1;
                if moving.is_none() && others > 0 {
                    let (urls, options) = (self.urls.clone(), self.options.clone());
                    let first = links.current.url_index + 1;
                    *moving = Some(Box::pin(async move {
                        connect_in_turn(&urls, first, others, &options).await.ok()
                    }));
                }
                None
            }
            // A retiring gate repeating itself, or a link already gone.
            Event::Drain { .. } => None,
            // A drained gate's kick (at the end of its grace) is a drop, not a verdict.
            Event::End(Exit::Kicked(reason)) if current && links.current.drained => {
                Some(Exit::Lost(reason))
            }
            Event::End(exit) if current => Some(exit),
            Event::End(Exit::Kicked(reason) | Exit::Lost(reason)) => {
                links.retire(&self.shared, epoch, &reason);
                None
            }
            Event::End(Exit::Closed) => None,
        }
    }

    /// Writes `first` and whatever else is queued (up to [`MAX_BATCH`]), each on the
    /// link of its epoch, then flushes. Frames of an epoch with no link are dropped:
    /// their callers were already failed when that connection ended. `Some` when the
    /// current connection failed.
    async fn write_batch(&mut self, links: &mut Links, first: Outgoing) -> Option<Exit> {
        let json = self.options.json;
        let mut next = Some(first);
        let mut written = 0;
        let mut failed = None;
        while let Some(out) = next {
            if let Some(link) = links.get(out.epoch) {
                if let Err(e) = link.feed(json, out.frame).await {
                    failed = Some((out.epoch, e));
                    break;
                }
                written += 1;
            }
            next = if written < MAX_BATCH {
                self.outgoing.try_recv().ok()
            } else {
                None
            };
        }
        if failed.is_none() {
            for link in links.all() {
                if let Err(e) = link.flush().await {
                    failed = Some((link.epoch, e));
                    break;
                }
            }
        }
        let (epoch, reason) = failed?;
        self.write_failed(links, epoch, reason)
    }

    /// A write on link `epoch` failed: the current connection is lost, a retiring one
    /// is retired.
    fn write_failed(&self, links: &mut Links, epoch: u64, reason: String) -> Option<Exit> {
        if links.current.epoch == epoch {
            return Some(Exit::Lost(reason));
        }
        links.retire(&self.shared, epoch, &reason);
        None
    }

    /// Reconnects with exponential backoff and equal jitter, each attempt to the next
    /// URL after `url_index` in turn, until one succeeds, the client closes, or a gate
    /// refuses the handshake with a 4xx (a refused token will not be accepted on the
    /// next try).
    async fn reconnect(&self, backoff: Backoff, mut url_index: usize) -> Result<Dialed, String> {
        let max = backoff.max.max(MIN_BACKOFF);
        let mut delay = backoff.initial.clamp(MIN_BACKOFF, max);
        loop {
            // Equal jitter: half fixed, half random, so a fleet of clients dropped at
            // once does not come back in lockstep.
            let half = delay / 2;
            let pause = half + half.mul_f64(fastrand::f64());
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(CLOSED_BY_CLIENT.to_owned()),
                () = tokio::time::sleep(pause) => {}
            }
            url_index = (url_index + 1) % self.urls.len();
            let url = &self.urls[url_index];
            let attempt = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(CLOSED_BY_CLIENT.to_owned()),
                attempt = connection::connect(url, &self.options) => attempt,
            };
            match attempt {
                Ok((ws, ack)) => return Ok(Dialed { url_index, ws, ack }),
                Err(e) => {
                    if let ErrorKind::Handshake { code: 400..=499 } = e.kind() {
                        return Err(e.to_string());
                    }
                    debug!(url, error = %e, "reconnect failed");
                }
            }
            delay = delay.saturating_mul(2).min(max);
        }
    }
}

async fn poll_moving(moving: &mut Option<Moving>) -> Option<Dialed> {
    match moving {
        Some(dialing) => dialing.await,
        None => std::future::pending().await,
    }
}

async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}
