//! What each client records during a run, and how the clients' records add up.
//!
//! Every client owns its [`ClientStats`] (no lock on the hot path) and merges them at the
//! end. The per-second timeline is the exception: a client keeps the current second
//! locally and hands it to the shared [`Timeline`] when the second changes, so the lock
//! is taken about once per client per second.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::hist::{Hist, Summary};

/// Seconds of timeline kept; later seconds still count in the totals.
pub const MAX_TIMELINE_SECONDS: usize = 3_600;

/// The server's own account of a request, from `Response.timing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerTiming {
    pub total_us: u32,
    pub queue_us: u32,
    pub handler_us: u32,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A response with any code.
    Response {
        code: u32,
        timing: Option<ServerTiming>,
        message: String,
    },
    /// No answer within the request timeout (client side).
    Timeout,
    /// Any other SDK error, by kind (`closed`, `protocol`, ...).
    Failed(&'static str),
}

/// One finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub scheduled: Instant,
    pub sent: Instant,
    pub received: Instant,
    pub answer: Answer,
}

/// The latency of answered requests, three ways.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    /// Answer minus scheduled send time: what a player waiting on the schedule sees, so
    /// a stall of the client or the server is never hidden.
    pub from_schedule: Hist,
    /// Answer minus the moment the request was handed to the SDK.
    pub from_send: Hist,
    /// Handed to the SDK minus scheduled: the load generator's own lateness.
    pub lag: Hist,
}

/// Where the time went according to the server (answers carrying timing only).
#[derive(Debug, Clone, Default)]
pub struct ServerSplit {
    /// Gate receive to gate answer.
    pub total: Hist,
    /// Waiting in the worker's queue.
    pub queue: Hist,
    /// Inside the handler.
    pub handler: Hist,
    /// total - queue - handler: the gate's own work and the bus both ways.
    pub gate_bus: Hist,
    /// from-send latency - total: the client SDK and the WebSocket both ways.
    pub client_ws: Hist,
}

/// One client's record of the measured part of a run.
#[derive(Debug, Clone, Default)]
pub struct ClientStats {
    /// Measured requests handed to the SDK.
    pub sent: u64,
    /// Answered 200.
    pub ok: u64,
    /// Answered with any code.
    pub answered: u64,
    /// Client-side timeouts (no answer within the request timeout).
    pub timeouts: u64,
    /// Still in flight when the run's hard deadline passed.
    pub unanswered: u64,
    /// Answers other than 200, by code.
    pub codes: BTreeMap<u32, u64>,
    /// The first message seen for each code in `codes`.
    pub messages: BTreeMap<u32, String>,
    /// SDK errors other than timeouts, by kind.
    pub failures: BTreeMap<&'static str, u64>,
    /// When the last measured answer arrived.
    pub last_answer: Option<Instant>,
    pub latency: Latency,
    pub server: ServerSplit,
    /// Answers by the second they arrived in (from the window start).
    pub answers_per_second: Vec<u64>,
}

impl ClientStats {
    /// Records a measured request's outcome.
    pub fn record(&mut self, window_start: Instant, o: &Outcome) {
        self.latency
            .lag
            .record(o.sent.saturating_duration_since(o.scheduled));
        match &o.answer {
            Answer::Response {
                code,
                timing,
                message,
            } => {
                self.answered += 1;
                if *code == OK {
                    self.ok += 1;
                } else {
                    *self.codes.entry(*code).or_default() += 1;
                    if !self.messages.contains_key(code) {
                        self.messages.insert(*code, message.clone());
                    }
                }
                let from_send = o.received.saturating_duration_since(o.sent);
                self.latency
                    .from_schedule
                    .record(o.received.saturating_duration_since(o.scheduled));
                self.latency.from_send.record(from_send);
                if let Some(t) = timing {
                    self.record_timing(*t, from_send);
                }
                self.last_answer = Some(self.last_answer.map_or(o.received, |l| l.max(o.received)));
                let second = o.received.saturating_duration_since(window_start).as_secs();
                if let Ok(second) = usize::try_from(second)
                    && second < MAX_TIMELINE_SECONDS
                {
                    if self.answers_per_second.len() <= second {
                        self.answers_per_second.resize(second + 1, 0);
                    }
                    self.answers_per_second[second] += 1;
                }
            }
            Answer::Timeout => self.timeouts += 1,
            Answer::Failed(kind) => *self.failures.entry(kind).or_default() += 1,
        }
    }

    fn record_timing(&mut self, t: ServerTiming, from_send: Duration) {
        let s = &mut self.server;
        let (total, queue, handler) = (
            u64::from(t.total_us),
            u64::from(t.queue_us),
            u64::from(t.handler_us),
        );
        s.total.record_us(total);
        s.queue.record_us(queue);
        s.handler.record_us(handler);
        s.gate_bus
            .record_us(total.saturating_sub(queue).saturating_sub(handler));
        s.client_ws
            .record(from_send.saturating_sub(Duration::from_micros(total)));
    }

    /// Adds another client's record to this one (per-connection figures are kept
    /// apart by the caller).
    pub fn merge(&mut self, o: &ClientStats) {
        self.sent += o.sent;
        self.ok += o.ok;
        self.answered += o.answered;
        self.timeouts += o.timeouts;
        self.unanswered += o.unanswered;
        for (code, n) in &o.codes {
            *self.codes.entry(*code).or_default() += n;
        }
        for (code, m) in &o.messages {
            self.messages.entry(*code).or_insert_with(|| m.clone());
        }
        for (kind, n) in &o.failures {
            *self.failures.entry(kind).or_default() += n;
        }
        self.last_answer = match (self.last_answer, o.last_answer) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let l = &mut self.latency;
        l.from_schedule.merge(&o.latency.from_schedule);
        l.from_send.merge(&o.latency.from_send);
        l.lag.merge(&o.latency.lag);
        let s = &mut self.server;
        s.total.merge(&o.server.total);
        s.queue.merge(&o.server.queue);
        s.handler.merge(&o.server.handler);
        s.gate_bus.merge(&o.server.gate_bus);
        s.client_ws.merge(&o.server.client_ws);
        if self.answers_per_second.len() < o.answers_per_second.len() {
            self.answers_per_second
                .resize(o.answers_per_second.len(), 0);
        }
        for (sum, n) in self
            .answers_per_second
            .iter_mut()
            .zip(&o.answers_per_second)
        {
            *sum += n;
        }
    }

    /// Requests that got no answer: client timeouts, SDK errors, still in flight.
    pub fn lost(&self) -> u64 {
        self.timeouts + self.unanswered + self.failures.values().sum::<u64>()
    }
}

const OK: u32 = proto::code::OK;

/// Achieved rate: answers ÷ the time from the window's start until the later of its
/// end and the last answer, so a server that answers late is charged for it.
pub fn rate(ok: u64, window_start: Instant, window_end: Instant, last: Option<Instant>) -> f64 {
    let end = last.map_or(window_end, |l| l.max(window_end));
    let secs = end.saturating_duration_since(window_start).as_secs_f64();
    if secs <= 0.0 { 0.0 } else { ok as f64 / secs }
}

/// Latency from the schedule, per second of the measured window, fed by all clients
/// ([`Hist::coarse`]: 1% is plenty for a chart).
#[derive(Debug, Default)]
pub struct Timeline {
    seconds: Vec<Hist>,
}

/// A handle the clients share.
pub type SharedTimeline = Arc<Mutex<Timeline>>;

impl Timeline {
    fn add(&mut self, second: usize, h: &Hist) {
        if second >= MAX_TIMELINE_SECONDS {
            return;
        }
        if self.seconds.len() <= second {
            self.seconds.resize_with(second + 1, Hist::coarse);
        }
        self.seconds[second].merge(h);
    }

    /// Per second (by scheduled send time): the count and the latency summary.
    pub fn seconds(&self) -> impl Iterator<Item = (usize, Summary)> + '_ {
        self.seconds
            .iter()
            .enumerate()
            .map(|(s, h)| (s, h.summary()))
    }
}

/// A client's view of the timeline: the latest seconds kept locally.
#[derive(Debug)]
pub struct TimelineWriter {
    shared: SharedTimeline,
    window_start: Instant,
    /// Seconds with answers not yet handed over. Under overload answers come back far
    /// out of order (a fast 429 passes a request still queued), so more than the
    /// current second stays open; the oldest is handed over when too many are.
    open: BTreeMap<usize, Hist>,
}

/// Seconds a client keeps open before handing the oldest to the shared timeline.
const OPEN_SECONDS: usize = 4;

impl TimelineWriter {
    pub fn new(shared: SharedTimeline, window_start: Instant) -> Self {
        TimelineWriter {
            shared,
            window_start,
            open: BTreeMap::new(),
        }
    }

    /// Records the latency of a request scheduled at `scheduled`.
    pub fn record(&mut self, scheduled: Instant, latency: Duration) {
        let elapsed = scheduled.saturating_duration_since(self.window_start);
        let Ok(second) = usize::try_from(elapsed.as_secs()) else {
            return;
        };
        self.open
            .entry(second)
            .or_insert_with(Hist::coarse)
            .record(latency);
        if self.open.len() > OPEN_SECONDS
            && let Some((second, h)) = self.open.pop_first()
        {
            self.lock().add(second, &h);
        }
    }

    /// Hands every open second to the shared timeline.
    pub fn flush(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let open = std::mem::take(&mut self.open);
        let mut shared = self.lock();
        for (second, h) in &open {
            shared.add(*second, h);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Timeline> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for TimelineWriter {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Within the histogram's 3 significant digits.
    fn near(got: f64, want: f64) -> bool {
        (got - want).abs() <= want * 0.001
    }

    fn answered(t0: Instant, sched_ms: u32, lag_us: u64, rtt_us: u64, code: u32) -> Outcome {
        let scheduled = t0 + sched_ms * MS;
        let sent = scheduled + Duration::from_micros(lag_us);
        Outcome {
            scheduled,
            sent,
            received: sent + Duration::from_micros(rtt_us),
            answer: Answer::Response {
                code,
                timing: Some(ServerTiming {
                    total_us: 300,
                    queue_us: 50,
                    handler_us: 10,
                }),
                message: if code == 200 {
                    String::new()
                } else {
                    "busy".into()
                },
            },
        }
    }

    #[test]
    fn latency_is_recorded_from_schedule_from_send_and_as_lag() {
        let t0 = Instant::now();
        let mut s = ClientStats::default();
        s.record(t0, &answered(t0, 0, 100, 500, 200));
        let l = &s.latency;
        assert!(near(l.from_schedule.summary().max_us, 600.0));
        assert!(near(l.from_send.summary().max_us, 500.0));
        assert!(near(l.lag.summary().max_us, 100.0));
        // 300 total - 50 queue - 10 handler; 500 from send - 300 total.
        assert!(near(s.server.gate_bus.summary().max_us, 240.0));
        assert!(near(s.server.client_ws.summary().max_us, 200.0));
        assert_eq!((s.ok, s.answered), (1, 1));
    }

    #[test]
    fn errors_are_counted_by_code_and_kind() {
        let t0 = Instant::now();
        let mut s = ClientStats::default();
        s.record(t0, &answered(t0, 0, 0, 10, 503));
        s.record(t0, &answered(t0, 1, 0, 10, 503));
        let lost = |answer| Outcome {
            scheduled: t0,
            sent: t0,
            received: t0,
            answer,
        };
        s.record(t0, &lost(Answer::Timeout));
        s.record(t0, &lost(Answer::Failed("closed")));
        assert_eq!(s.codes.get(&503), Some(&2));
        assert_eq!(s.messages.get(&503).map(String::as_str), Some("busy"));
        assert_eq!((s.ok, s.answered, s.timeouts), (0, 2, 1));
        assert_eq!(s.failures.get("closed"), Some(&1));
        assert_eq!(s.lost(), 2);
        // A lost request still has a lag, but no latency.
        assert_eq!(s.latency.lag.len(), 4);
        assert_eq!(s.latency.from_schedule.len(), 2);
    }

    #[test]
    fn merge_adds_everything_up() {
        let t0 = Instant::now();
        let mut a = ClientStats::default();
        let mut b = ClientStats::default();
        a.sent = 2;
        b.sent = 3;
        a.record(t0, &answered(t0, 0, 0, 100, 200));
        b.record(t0, &answered(t0, 1500, 0, 100, 200));
        b.record(t0, &answered(t0, 2, 0, 100, 429));
        a.merge(&b);
        assert_eq!((a.sent, a.ok, a.answered), (5, 2, 3));
        assert_eq!(a.codes.get(&429), Some(&1));
        assert_eq!(a.latency.from_send.len(), 3);
        assert_eq!(a.answers_per_second, vec![2, 1]);
        assert_eq!(a.last_answer, b.last_answer);
    }

    #[test]
    fn rate_charges_late_answers() {
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs(10);
        assert_eq!(
            rate(10_000, t0, end, Some(t0 + Duration::from_secs(5))),
            1000.0
        );
        assert_eq!(
            rate(10_000, t0, end, Some(t0 + Duration::from_secs(20))),
            500.0
        );
        assert_eq!(rate(10, t0, t0, None), 0.0);
    }

    #[test]
    fn timeline_buckets_by_scheduled_second_across_clients() {
        let t0 = Instant::now();
        let shared = SharedTimeline::default();
        let mut a = TimelineWriter::new(shared.clone(), t0);
        let mut b = TimelineWriter::new(shared.clone(), t0);
        a.record(t0 + 10 * MS, MS);
        b.record(t0 + 20 * MS, 3 * MS);
        a.record(t0 + 1010 * MS, 5 * MS);
        // Out of order: second 0 again after second 1 was opened.
        a.record(t0 + 30 * MS, 2 * MS);
        drop(a);
        drop(b);
        let timeline = shared.lock().expect("not poisoned");
        let seconds: Vec<_> = timeline.seconds().collect();
        assert_eq!(seconds.len(), 2);
        assert_eq!(seconds[0].1.count, 3);
        // Coarse histograms: within 1%.
        assert!((seconds[0].1.max_us - 3000.0).abs() <= 30.0);
        assert_eq!(seconds[1].1.count, 1);
    }

    #[test]
    fn out_of_order_answers_over_many_seconds_all_land() {
        let t0 = Instant::now();
        let shared = SharedTimeline::default();
        let mut w = TimelineWriter::new(shared.clone(), t0);
        for i in 0..20u32 {
            // Alternating far-apart seconds: more than OPEN_SECONDS open at once.
            w.record(t0 + (i % 10) * 1000 * MS + MS, MS);
            w.record(t0 + (9 - i % 10) * 1000 * MS + MS, MS);
        }
        drop(w);
        let timeline = shared.lock().expect("not poisoned");
        let seconds: Vec<_> = timeline.seconds().collect();
        assert_eq!(seconds.len(), 10);
        assert_eq!(seconds.iter().map(|(_, s)| s.count).sum::<u64>(), 40);
        assert!(seconds.iter().all(|(_, s)| s.count == 4));
    }
}
