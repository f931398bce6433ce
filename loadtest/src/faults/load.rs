//! The steady load of `loadtest faults`: N SDK clients, each sending one request per
//! interval on an absolute schedule (open loop: a slow or missing answer never delays
//! the next request), from before the first phase until after the last. Each request is
//! stamped with the phase current when it was sent and kept with its outcome; the
//! phases' figures are worked out from those afterwards ([`super::phases`]).
//!
//! Clients reconnect by themselves ([`ClientOptions::reconnect`]); what a client saw of
//! a reconnection is its gap: from its last answer before the connection was lost to
//! its first answer after (a connection loss shows as a request cut by the close, or as
//! the SDK's count of reconnections having grown). The gap is measured between answers,
//! so it is at most one send interval longer than the outage the client really had.
//!
//! A client the gate closed for good (a kick: the SDK does not reconnect after one) is
//! replaced by a new one, as a game would reconnect, made by [`connect_client`] for the
//! next gate of the list (and the next, every [`RECONNECT_RETRY`], until one connects);
//! its requests due meanwhile go to the closed client and come back cut. The report
//! counts such closings and why.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use sdk::{Backoff, Client, ClientOptions};
use tokio::task::JoinSet;

use crate::ws::clock::Pacer;
use crate::ws::schedule::{Schedule, phase_offset};

/// Time between deciding the start and the first request, so every client is ready.
const LEAD: Duration = Duration::from_millis(20);
/// Between two attempts to replace a client closed for good.
pub const RECONNECT_RETRY: Duration = Duration::from_millis(100);

/// The load every phase runs under.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub clients: usize,
    /// Between two requests of one client.
    pub interval: Duration,
    pub route: String,
    pub body: bytes::Bytes,
    /// The client's request timeout ([`ClientOptions::request_timeout`]).
    pub timeout: Duration,
    /// After the last request's timeout, how long a request may still be outstanding
    /// before it counts as lost.
    pub drain_timeout: Duration,
}

/// Connects client `index` of the run, reconnecting by itself with the SDK's default
/// backoff, to one of `gates`: round-robin by `index`, and its `attempt`-th connection
/// (from 0) to the gate after that many more.
///
/// The one place the load's clients are made: to move to the SDK's gate list (a client
/// given every gate, moving to another on `Drain`), change only this function.
pub async fn connect_client(
    gates: &[String],
    index: usize,
    attempt: usize,
    timeout: Duration,
) -> anyhow::Result<Client> {
    anyhow::ensure!(!gates.is_empty(), "no gate to connect to");
    // Every gate, starting from this client's: the SDK moves along the list when its
    // gate drains, and reconnects along it when its gate is lost.
    let first = (index + attempt) % gates.len();
    let urls: Vec<String> = gates[first..]
        .iter()
        .chain(&gates[..first])
        .cloned()
        .collect();
    let options = ClientOptions {
        request_timeout: timeout,
        reconnect: Some(Backoff::default()),
        client: format!("loadtest-faults-{index}"),
        ..ClientOptions::default()
    };
    Client::connect_any(&urls, options)
        .await
        .with_context(|| format!("client {index} connecting to {}", urls[0]))
}

/// Which phase is current: requests are stamped with it when sent. Past the last phase,
/// clients stop sending and wait for their outstanding answers. It also counts each
/// phase's requests still awaiting their outcome, so that the next fault waits for
/// them ([`PhaseClock::settled`]) instead of striking requests of the phase before.
#[derive(Debug, Default)]
pub struct PhaseClock {
    current: AtomicUsize,
    /// By phase; grown on first use of a phase.
    pending: std::sync::Mutex<Vec<usize>>,
}

impl PhaseClock {
    pub fn set(&self, phase: usize) {
        self.current.store(phase, Ordering::Release);
    }

    pub fn current(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn sent(&self, phase: usize) {
        let mut pending = self.pending();
        if pending.len() <= phase {
            pending.resize(phase + 1, 0);
        }
        pending[phase] += 1;
    }

    fn ended(&self, phase: usize) {
        if let Some(n) = self.pending().get_mut(phase) {
            *n = n.saturating_sub(1);
        }
    }

    /// Whether every request sent in `phase` has its outcome.
    pub fn settled(&self, phase: usize) -> bool {
        self.pending().get(phase).is_none_or(|n| *n == 0)
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

/// One client's reconnection as it saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gap {
    /// The phase current when the client was answered again.
    pub phase: usize,
    pub length: Duration,
}

/// A client closed for good (and replaced).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closing {
    /// The phase current when it was seen closed.
    pub phase: usize,
    /// The SDK's reason: a kick's reason, or why the connection was lost.
    pub reason: String,
}

/// Everything one client did.
#[derive(Debug, Default)]
pub struct ClientRecord {
    /// Requests sent, per phase.
    pub sent: Vec<u64>,
    /// Every request that ended, in the order they ended.
    pub outcomes: Vec<Outcome>,
    pub gaps: Vec<Gap>,
    pub closings: Vec<Closing>,
}

/// Connects every client, then starts their load; sending stops once `clock` passes
/// `phases - 1`. Fails when a client cannot connect (after closing the others).
pub async fn start(
    config: Arc<LoadConfig>,
    gates: &[String],
    clock: Arc<PhaseClock>,
    phases: usize,
) -> anyhow::Result<JoinSet<ClientRecord>> {
    let connects = (0..config.clients).map(|i| connect_client(gates, i, 0, config.timeout));
    let clients = futures::future::try_join_all(connects).await?;
    let gates: Arc<[String]> = Arc::from(gates);
    let start = Instant::now() + LEAD;
    let mut tasks = JoinSet::new();
    for (index, client) in clients.into_iter().enumerate() {
        let offset = phase_offset(
            config.interval,
            u32::try_from(index).unwrap_or(0),
            u32::try_from(config.clients).unwrap_or(1),
        );
        let schedule = Schedule::new(start + offset, config.interval);
        let driver = Driver {
            client,
            index,
            gates: gates.clone(),
            schedule,
            config: config.clone(),
            clock: clock.clone(),
            phases,
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
    config: Arc<LoadConfig>,
    clock: Arc<PhaseClock>,
    phases: usize,
}

impl Driver {
    async fn drive(mut self) -> ClientRecord {
        let mut record = ClientRecord {
            sent: vec![0; self.phases],
            ..ClientRecord::default()
        };
        let mut pacer = Pacer::tokio();
        let mut next = 0;
        let mut in_flight = FuturesUnordered::new();
        let mut gaps = GapTracker::new(self.client.reconnects());
        let route: Arc<str> = Arc::from(self.config.route.as_str());
        // Set when sending stopped: outstanding requests are given up on then.
        let mut give_up: Option<Instant> = None;
        // A replacement for a client closed for good, under way.
        let mut replacing = std::pin::pin!(futures::future::OptionFuture::from(None));
        let mut is_replacing = false;
        loop {
            let wait = give_up.unwrap_or_else(Instant::now);
            tokio::select! {
                due = pacer.wait_due(&self.schedule, next), if give_up.is_none() => {
                    for _ in next..due {
                        let phase = self.clock.current();
                        let Some(sent) = record.sent.get_mut(phase) else {
                            give_up = Some(
                                Instant::now() + self.config.timeout + self.config.drain_timeout,
                            );
                            break;
                        };
                        *sent += 1;
                        self.clock.sent(phase);
                        in_flight.push(request(
                            self.client.clone(),
                            route.clone(),
                            self.config.body.clone(),
                            phase,
                        ));
                    }
                    next = due;
                }
                Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                    self.clock.ended(outcome.phase);
                    let now = self.clock.current().min(self.phases - 1);
                    gaps.see(&outcome, self.client.reconnects(), now);
                    let cut = outcome.answer == Answer::Cut;
                    record.outcomes.push(outcome);
                    if cut && !is_replacing && self.client.is_closed() && give_up.is_none() {
                        let reason = self.client.closed().await;
                        record.closings.push(Closing { phase: now, reason });
                        replacing.set(Some(replace(self.gates.clone(), self.index, self.config.timeout)).into());
                        is_replacing = true;
                    }
                }
                Some(client) = &mut replacing, if is_replacing => {
                    replacing.set(None.into());
                    is_replacing = false;
                    self.client = client;
                    gaps.replaced(self.client.reconnects());
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

/// A new client in place of one closed for good: on the next gate, then the one after,
/// until one connects.
async fn replace(gates: Arc<[String]>, index: usize, timeout: Duration) -> Client {
    let mut attempt = 1;
    loop {
        match connect_client(&gates, index, attempt, timeout).await {
            Ok(client) => return client,
            Err(e) => {
                tracing::debug!("replacing client {index}: {e:#}");
                attempt += 1;
                tokio::time::sleep(RECONNECT_RETRY).await;
            }
        }
    }
}

async fn request(client: Client, route: Arc<str>, body: bytes::Bytes, phase: usize) -> Outcome {
    let sent = Instant::now();
    let result = client.request(&route, &body).await;
    let done = Instant::now();
    let answer = match result {
        Ok(r) if r.code == proto::code::OK => Answer::Code(r.code, None),
        Ok(r) => Answer::Code(r.code, Some(Arc::from(r.message.as_str()))),
        Err(e) if e.is_closed() => Answer::Cut,
        Err(e) if e.is_timeout() => Answer::Timeout,
        Err(e) => Answer::Failed(e.kind().to_string()),
    };
    Outcome {
        phase,
        sent,
        done,
        answer,
    }
}

/// Finds one client's reconnection gaps from its outcomes as they end.
#[derive(Debug)]
struct GapTracker {
    last_answer: Option<Instant>,
    /// A request was cut since the last answer: the connection was lost.
    cut: bool,
    /// The SDK's reconnection count at the last answer.
    reconnects: u64,
    found: Vec<Gap>,
}

impl GapTracker {
    fn new(reconnects: u64) -> Self {
        GapTracker {
            last_answer: None,
            cut: false,
            reconnects,
            found: Vec::new(),
        }
    }

    /// The client was replaced by a new one with `reconnects` reconnections: the next
    /// answer ends a gap.
    fn replaced(&mut self, reconnects: u64) {
        self.cut = true;
        self.reconnects = reconnects;
    }

    /// `outcome` has just ended; `reconnects` is the SDK's count now, `phase` the
    /// current phase.
    fn see(&mut self, outcome: &Outcome, reconnects: u64, phase: usize) {
        match outcome.answer {
            Answer::Code(..) => {
                if self.cut || reconnects != self.reconnects {
                    if let Some(last) = self.last_answer {
                        self.found.push(Gap {
                            phase,
                            length: outcome.done.saturating_duration_since(last),
                        });
                    }
                    self.cut = false;
                    self.reconnects = reconnects;
                }
                self.last_answer = Some(
                    self.last_answer
                        .map_or(outcome.done, |l| l.max(outcome.done)),
                );
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
    fn a_phase_is_settled_once_every_request_sent_in_it_ended() {
        let clock = PhaseClock::default();
        assert!(clock.settled(0), "nothing sent yet");
        clock.sent(0);
        clock.sent(0);
        clock.sent(1);
        assert!(!clock.settled(0));
        clock.ended(0);
        assert!(!clock.settled(0));
        clock.ended(0);
        assert!(clock.settled(0));
        assert!(!clock.settled(1), "the next phase counts apart");
        clock.ended(3);
        assert!(clock.settled(3), "an unknown phase has nothing pending");
    }

    fn outcome(done: Instant, answer: Answer) -> Outcome {
        Outcome {
            phase: 0,
            sent: done,
            done,
            answer,
        }
    }

    #[test]
    fn a_gap_spans_from_the_last_answer_before_a_loss_to_the_first_after() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let ok = || Answer::Code(200, None);
        let mut gaps = GapTracker::new(0);
        gaps.see(&outcome(at(0), ok()), 0, 0);
        gaps.see(&outcome(at(10), ok()), 0, 0);
        assert!(gaps.found.is_empty(), "no loss, no gap");
        // A cut, then the next answer on the new connection.
        gaps.see(&outcome(at(15), Answer::Cut), 0, 1);
        gaps.see(&outcome(at(400), ok()), 1, 1);
        // No request was in flight at the loss: only the reconnection count shows it.
        gaps.see(&outcome(at(410), ok()), 1, 2);
        gaps.see(&outcome(at(900), ok()), 2, 3);
        // A timeout is not a connection loss.
        gaps.see(&outcome(at(950), Answer::Timeout), 2, 3);
        gaps.see(&outcome(at(960), ok()), 2, 3);
        assert_eq!(
            gaps.found,
            vec![
                Gap {
                    phase: 1,
                    length: Duration::from_millis(390)
                },
                Gap {
                    phase: 3,
                    length: Duration::from_millis(490)
                },
            ]
        );
    }
}
