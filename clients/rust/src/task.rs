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
//!
//! **Resuming.** A current connection that drops (not a kick, not the client's close)
//! while its gate keeps the session for resuming is redialed the same way, with the
//! session's token and `last_seq` in the handshake. If the gate resumes it, the task
//! sends the requests still unanswered again, same ids, before anything queued since, and
//! the session's frames carry on where they stopped (see [`super::resume`]); if not, the
//! new connection is a fresh session, as after any reconnection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto::client::{HandshakeAck, Push};
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::connection::{self, Dialed, connect_in_turn};
use super::error::ErrorKind;
use super::link::{Event, Exit, Link, LinkEvent, Routes};
use super::resume::{Resume, Sequence};
use super::shared::{FIRST_EPOCH, Shared};
use super::{Backoff, ClientOptions};

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
    pub(crate) frame: Bytes,
}

/// A move under way: dialing the other gates.
type Moving = Pin<Box<dyn Future<Output = Option<Dialed>> + Send>>;

/// How a run of connections ended: how, the index of the URL it was on, and, when the
/// current connection dropped, what resuming its session takes (if it can be resumed).
struct Ended {
    exit: Exit,
    url_index: usize,
    resume: Option<Resume>,
}

/// A session to serve on a new connection: the session's sequence, and the requests to
/// send again first (a resumed session's unanswered ones).
struct Continue {
    sequence: Arc<Sequence>,
    resend: Vec<Bytes>,
}

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

    /// The shortest heartbeat interval any open gate asked for: each gate closes after
    /// two silent intervals, so one beat an interval leaves a whole interval for a busy
    /// scheduler, and each beat costs the gate a wake-up, a read and an answer
    /// (docs/capacity.md: at half the interval the heartbeats of 72,000 idle players
    /// were twice what the gates can spare).
    fn heartbeat(&self) -> Option<Interval> {
        let ms = std::iter::once(&self.current)
            .chain(&self.retiring)
            .map(|l| l.heartbeat_ms)
            .filter(|&ms| ms > 0)
            .min()?;
        let period = Duration::from_millis(u64::from(ms));
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
        let mut session = Continue {
            sequence: Arc::default(),
            resend: Vec::new(),
        };
        loop {
            let ended = self.serve(dialed, epoch, session).await;
            let reason = match ended.exit {
                Exit::Closed => return CLOSED_BY_CLIENT.to_owned(),
                Exit::Kicked(reason) => return reason,
                Exit::Lost(reason) | Exit::Broken(reason) => reason,
            };
            let Some(backoff) = self.options.reconnect else {
                return reason;
            };
            let resume = ended.resume;
            debug!(%reason, resuming = resume.is_some(), "connection lost; reconnecting");
            epoch = self.shared.lose(&reason, resume.is_some());
            dialed = match self
                .reconnect(backoff, ended.url_index, resume.as_ref())
                .await
            {
                Ok(dialed) => dialed,
                Err(reason) => return reason,
            };
            session = self.take_up(epoch, &dialed.ack, resume, &reason);
        }
    }

    /// Takes up a reconnection at `epoch`: the session of `resume` goes on if the gate
    /// resumed it, else a fresh one starts, and what waited on the old one fails (the
    /// connection was lost for `reason`).
    fn take_up(
        &self,
        epoch: u64,
        ack: &HandshakeAck,
        resume: Option<Resume>,
        reason: &str,
    ) -> Continue {
        // What became of the resume asked for; 0 when none was.
        let code = if resume.is_some() { ack.resume_code } else { 0 };
        debug!(
            session_id = ack.session_id,
            resume_code = code,
            "reconnected"
        );
        let not_resumed = format!("{reason} (the session was not resumed: {code})");
        let resend = self.shared.up(epoch, ack.session_id, code, &not_resumed);
        let sequence = match resume {
            Some(resume) if code == proto::code::OK => resume.sequence,
            _ => Arc::default(),
        };
        Continue { sequence, resend }
    }

    /// Runs one connection, and those it moves to, until the current one ends.
    async fn serve(&mut self, dialed: Dialed, epoch: u64, session: Continue) -> Ended {
        // Unbounded, yet bounded by construction: each link sends at most two events
        // (see `link::read_loop`), and links are the current one and those retiring.
        let (events_tx, events) = mpsc::unbounded_channel();
        let routes = Routes {
            shared: self.shared.clone(),
            pushes: self.pushes.clone(),
            events: events_tx,
            acks: Arc::default(),
        };
        let mut links = Links {
            current: Link::start(dialed, epoch, routes.clone(), session.sequence),
            retiring: Vec::new(),
        };
        let exit = match links
            .current
            .write_all(self.options.json, session.resend)
            .await
        {
            Ok(()) => self.serve_links(&mut links, routes, events).await,
            Err(reason) => Exit::Lost(reason),
        };
        let url_index = links.current.url_index;
        // Retiring links end with the current one, and what waits on them fails (see
        // `Shared::lose`): their sessions are not resumed.
        for link in links.retiring.drain(..) {
            tokio::spawn(link.close());
        }
        let resume = match exit {
            Exit::Lost(_) => links.current.resume(),
            Exit::Closed | Exit::Kicked(_) | Exit::Broken(_) => None,
        };
        // A broken connection is closed too: the gate ends a session it is told to.
        if !matches!(exit, Exit::Lost(_)) {
            links.current.close().await;
        }
        Ended {
            exit,
            url_index,
            resume,
        }
    }

    /// Serves the links of one run until the current one ends; returns how.
    async fn serve_links(
        &mut self,
        links: &mut Links,
        routes: Routes,
        mut events: mpsc::UnboundedReceiver<LinkEvent>,
    ) -> Exit {
        let mut heartbeat = links.heartbeat();
        let mut moving: Option<Moving> = None;
        loop {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Exit::Closed,
                Some((epoch, event)) = events.recv() => {
                    if let Some(exit) = self.on_event(links, &mut moving, epoch, event) {
                        return exit;
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
                    // A new gate's session: its frames are numbered afresh.
                    let link = Link::start(dialed, epoch, routes.clone(), Arc::default());
                    let old = std::mem::replace(&mut links.current, link);
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
                        if let Some(exit) = self.write_batch(links, out).await {
                            return exit;
                        }
                    }
                    // Every handle is gone.
                    None => return Exit::Closed,
                },
                () = tick(&mut heartbeat) => {
                    if let Some(exit) = self.write_control(links, true).await {
                        return exit;
                    }
                }
                () = routes.acks.notified() => {
                    if let Some(exit) = self.write_control(links, false).await {
                        return exit;
                    }
                }
            }
        }
    }

    /// Writes each link's heartbeat (when `heartbeat`) and the acks due (see
    /// [`Link::write_control`]). `Some` when the current connection failed.
    async fn write_control(&self, links: &mut Links, heartbeat: bool) -> Option<Exit> {
        let json = self.options.json;
        let mut failed = None;
        for link in links.all() {
            if let Err(e) = link.write_control(json, heartbeat).await {
                failed = Some((link.epoch, e));
                break;
            }
        }
        let (epoch, reason) = failed?;
        self.write_failed(links, epoch, reason)
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
            // A drained gate's kick (at the end of its grace) is a drop, not a verdict;
            // but it ended the session, so there is nothing to resume.
            Event::End(Exit::Kicked(reason)) if current && links.current.drained => {
                links.current.resume_token.clear();
                Some(Exit::Lost(reason))
            }
            Event::End(exit) if current => Some(exit),
            Event::End(Exit::Kicked(reason) | Exit::Lost(reason) | Exit::Broken(reason)) => {
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
    /// next try). Each attempt asks to resume the session of `resume`, if given.
    async fn reconnect(
        &self,
        backoff: Backoff,
        mut url_index: usize,
        resume: Option<&Resume>,
    ) -> Result<Dialed, String> {
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
                attempt = connection::connect(url, &self.options, resume) => attempt,
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
