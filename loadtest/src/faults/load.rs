//! The steady load of `loadtest faults`: N SDK clients, one request per interval each on
//! an absolute schedule, stamped with the phase current when sent and kept with its
//! outcome. Clients reconnect by themselves; one closed for good (kicked) is replaced on
//! the next gate, as a game would, its requests due meanwhile coming back cut.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use futures::future::OptionFuture;
use futures::stream::FuturesUnordered;
use sdk::{Backoff, Client, ClientOptions};
use tokio::task::JoinSet;

use super::FaultsArgs;
use crate::ws::clock::Pacer;
use crate::ws::generator::LEAD;
use crate::ws::schedule::Schedule;

pub const ROUTE: &str = "echo.raw";
/// The request body: small, as a game's request is.
const BODY: &[u8] = b"Hello World, faults";
/// Between two attempts to replace a client closed for good.
const RECONNECT_RETRY: Duration = Duration::from_millis(100);

/// Connects client `index` with every gate, its own first (`index` round-robin, moved on
/// by `attempt`): the SDK moves along them when its gate drains or its link is lost.
async fn connect_client(
    gates: &[String],
    index: usize,
    attempt: usize,
    timeout: Duration,
) -> anyhow::Result<Client> {
    anyhow::ensure!(!gates.is_empty(), "no gate to connect to");
    let first = (index + attempt) % gates.len();
    let urls: Vec<String> = [&gates[first..], &gates[..first]].concat();
    let options = ClientOptions {
        request_timeout: timeout,
        reconnect: Some(Backoff::default()),
        client: format!("loadtest-faults-{index}"),
        ..ClientOptions::default()
    };
    let client = Client::connect_any(&urls, options).await;
    client.with_context(|| format!("client {index} connecting to {}", urls[0]))
}

/// The current phase, stamped on requests as sent (past the last, sending stops), and
/// each phase's requests awaiting their outcome: the next fault waits for them.
#[derive(Debug)]
pub struct PhaseClock {
    current: AtomicUsize,
    pending: Vec<AtomicUsize>,
}

impl PhaseClock {
    pub fn new(phases: usize) -> Self {
        let pending = (0..phases).map(|_| AtomicUsize::new(0)).collect();
        PhaseClock {
            current: AtomicUsize::new(0),
            pending,
        }
    }

    pub fn set(&self, phase: usize) {
        self.current.store(phase, Ordering::Release);
    }

    /// The current phase, `None` past the last.
    fn current(&self) -> Option<usize> {
        Some(self.current.load(Ordering::Acquire)).filter(|p| *p < self.pending.len())
    }

    /// Whether every request sent in `phase` has its outcome.
    pub fn settled(&self, phase: usize) -> bool {
        self.pending[phase].load(Ordering::Acquire) == 0
    }
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The gate answered with this code (and, when not 200, its message).
    Code(u32, Option<Arc<str>>),
    /// The connection closed under it (the SDK's `Closed` error).
    Cut,
    /// No answer within the client's request timeout.
    Timeout,
    /// Any other SDK error, by kind.
    Failed(String),
}

/// One request: when it was sent, in which phase, how and when it ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub phase: usize,
    pub sent: Instant,
    pub done: Instant,
    pub answer: Answer,
}

impl Outcome {
    pub fn new(phase: usize, sent: Instant, done: Instant, answer: Answer) -> Self {
        Outcome {
            phase,
            sent,
            done,
            answer,
        }
    }
}

/// Everything one client did.
#[derive(Debug, Default)]
pub struct ClientRecord {
    /// Requests sent, per phase.
    pub sent: Vec<u64>,
    /// Every request that ended, in the order they ended.
    pub outcomes: Vec<Outcome>,
    /// Reconnection gaps as `(phase answered again in, length)`.
    pub gaps: Vec<(usize, Duration)>,
    /// Clients closed for good (and replaced): the phase, and the SDK's reason.
    pub closings: Vec<(usize, String)>,
}

/// Connects every client (or fails), then loads until `clock` passes its last phase.
pub async fn start(
    args: &FaultsArgs,
    gates: &[String],
    clock: Arc<PhaseClock>,
) -> anyhow::Result<JoinSet<ClientRecord>> {
    let clients = args.clients as usize;
    let connects = (0..clients).map(|i| connect_client(gates, i, 0, args.timeout));
    let connected = futures::future::try_join_all(connects).await?;
    let gates: Arc<[String]> = Arc::from(gates);
    let interval = Duration::from_secs(1) / args.rate;
    let start = Instant::now() + LEAD;
    let mut tasks = JoinSet::new();
    for (index, client) in connected.into_iter().enumerate() {
        // Clients spread evenly over one interval, so they do not all send at once.
        let offset = interval.mul_f64(index as f64 / clients as f64);
        let driver = Driver {
            client,
            index,
            gates: gates.clone(),
            schedule: Schedule::new(start + offset, interval),
            clock: clock.clone(),
            timeout: args.timeout,
            drain_timeout: args.drain_timeout,
        };
        tasks.spawn(driver.drive());
    }
    Ok(tasks)
}

struct Driver {
    client: Client,
    /// Which client of the run this is, and the gates: to replace it when closed.
    index: usize,
    gates: Arc<[String]>,
    schedule: Schedule,
    clock: Arc<PhaseClock>,
    /// The request timeout; past it and the drain timeout after sending stopped, what
    /// is still outstanding counts as lost.
    timeout: Duration,
    drain_timeout: Duration,
}

impl Driver {
    async fn drive(mut self) -> ClientRecord {
        let phases = self.clock.pending.len();
        let mut record = ClientRecord {
            sent: vec![0; phases],
            ..ClientRecord::default()
        };
        let mut pacer = Pacer::tokio();
        let mut next = 0;
        let mut in_flight = FuturesUnordered::new();
        let mut gaps = GapTracker {
            reconnects: self.client.reconnects(),
            ..GapTracker::default()
        };
        // Set when sending stopped: outstanding requests are given up on then.
        let mut give_up: Option<Instant> = None;
        // A replacement for a client closed for good, under way.
        let mut replacing = std::pin::pin!(OptionFuture::from(None));
        let mut is_replacing = false;
        loop {
            let wait = give_up.unwrap_or_else(Instant::now);
            tokio::select! {
                due = pacer.wait_due(&self.schedule, next), if give_up.is_none() => {
                    for _ in next..due {
                        let Some(phase) = self.clock.current() else {
                            give_up = Some(Instant::now() + self.timeout + self.drain_timeout);
                            break;
                        };
                        record.sent[phase] += 1;
                        self.clock.pending[phase].fetch_add(1, Ordering::AcqRel);
                        in_flight.push(request(self.client.clone(), phase));
                    }
                    next = due;
                }
                Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                    self.clock.pending[outcome.phase].fetch_sub(1, Ordering::AcqRel);
                    let now = self.clock.current().unwrap_or(phases - 1);
                    gaps.see(&outcome, self.client.reconnects(), now);
                    let cut = outcome.answer == Answer::Cut;
                    record.outcomes.push(outcome);
                    if cut && !is_replacing && self.client.is_closed() && give_up.is_none() {
                        record.closings.push((now, self.client.closed().await));
                        let gates = self.gates.clone();
                        replacing.set(Some(replace(gates, self.index, self.timeout)).into());
                        is_replacing = true;
                    }
                }
                Some(client) = &mut replacing, if is_replacing => {
                    replacing.set(None.into());
                    is_replacing = false;
                    self.client = client;
                    // The next answer ends a gap.
                    gaps.cut = true;
                    gaps.reconnects = self.client.reconnects();
                }
                () = tokio::time::sleep_until(wait.into()), if give_up.is_some() => break,
            }
            if give_up.is_some() && in_flight.is_empty() {
                break;
            }
        }
        // What is still in flight is lost: its phase's sent count has it, no outcome does.
        drop(in_flight);
        self.client.close().await;
        record.gaps = gaps.found;
        record
    }
}

/// A new client in place of one closed for good: on each next gate until one connects.
async fn replace(gates: Arc<[String]>, index: usize, timeout: Duration) -> Client {
    for attempt in 1.. {
        match connect_client(&gates, index, attempt, timeout).await {
            Ok(client) => return client,
            Err(e) => tracing::debug!("replacing client {index}: {e:#}"),
        }
        tokio::time::sleep(RECONNECT_RETRY).await;
    }
    unreachable!("attempts never run out")
}

async fn request(client: Client, phase: usize) -> Outcome {
    let sent = Instant::now();
    let result = client.request(ROUTE, BODY).await;
    let answer = match result {
        Ok(r) if r.code == proto::code::OK => Answer::Code(r.code, None),
        Ok(r) => Answer::Code(r.code, Some(Arc::from(r.message.as_str()))),
        Err(e) if e.is_closed() => Answer::Cut,
        Err(e) if e.is_timeout() => Answer::Timeout,
        Err(e) => Answer::Failed(e.kind().to_string()),
    };
    Outcome::new(phase, sent, Instant::now(), answer)
}

/// One client's reconnection gaps: from its last answer before a connection loss (a
/// request cut, or the SDK's reconnection count grown) to its first answer after.
#[derive(Debug, Default)]
struct GapTracker {
    last_answer: Option<Instant>,
    /// A request was cut since the last answer: the connection was lost.
    cut: bool,
    /// The SDK's reconnection count at the last answer.
    reconnects: u64,
    found: Vec<(usize, Duration)>,
}

impl GapTracker {
    /// `outcome` has just ended; `reconnects` is the SDK's count now, `phase` the
    /// current phase.
    fn see(&mut self, outcome: &Outcome, reconnects: u64, phase: usize) {
        match outcome.answer {
            Answer::Code(..) => {
                if self.cut || reconnects != self.reconnects {
                    if let Some(last) = self.last_answer {
                        let gap = outcome.done.saturating_duration_since(last);
                        self.found.push((phase, gap));
                    }
                    self.cut = false;
                    self.reconnects = reconnects;
                }
                let last = self.last_answer.get_or_insert(outcome.done);
                *last = (*last).max(outcome.done);
            }
            Answer::Cut => self.cut = true,
            Answer::Timeout | Answer::Failed(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_spans_from_the_last_answer_before_a_loss_to_the_first_after() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let see = |gaps: &mut GapTracker, ms, answer, reconnects, phase| {
            gaps.see(&Outcome::new(0, at(ms), at(ms), answer), reconnects, phase);
        };
        let ok = || Answer::Code(200, None);
        let mut gaps = GapTracker::default();
        see(&mut gaps, 0, ok(), 0, 0);
        see(&mut gaps, 10, ok(), 0, 0);
        assert!(gaps.found.is_empty(), "no loss, no gap");
        // A cut, then the next answer on the new connection.
        see(&mut gaps, 15, Answer::Cut, 0, 1);
        see(&mut gaps, 400, ok(), 1, 1);
        // No request was in flight at the loss: only the reconnection count shows it.
        see(&mut gaps, 410, ok(), 1, 2);
        see(&mut gaps, 900, ok(), 2, 3);
        // A timeout is not a connection loss.
        see(&mut gaps, 950, Answer::Timeout, 2, 3);
        see(&mut gaps, 960, ok(), 2, 3);
        let ms = Duration::from_millis;
        assert_eq!(gaps.found, [(1, ms(390)), (3, ms(490))]);
    }
}
