//! What the clients record during a run, and how their records add up: every client
//! batches its outcomes in a [`Recorder`], which records a batch at a time into the run's
//! one [`Recorded`] (totals, histograms, per-second timeline).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::hist::{Hist, Summary};

/// Seconds of timeline kept; later seconds still count in the totals.
pub const MAX_TIMELINE_SECONDS: usize = 3_600;
/// Outcomes a client records before taking the shared lock.
const BATCH: usize = 256;
const OK: u32 = proto::code::OK;

/// The server's own account of a request, from `Response.timing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerTiming {
    pub total_us: u32,
    pub queue_us: u32,
    pub handler_us: u32,
}

impl From<proto::client::Timing> for ServerTiming {
    fn from(t: proto::client::Timing) -> Self {
        let (total_us, queue_us, handler_us) = (t.total_us, t.queue_us, t.handler_us);
        ServerTiming {
            total_us,
            queue_us,
            handler_us,
        }
    }
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
    /// The connection ended under it (`closed`, `kicked`, `protocol`).
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
    /// Answer minus scheduled send time: a stall of client or server is never hidden.
    pub from_schedule: Hist,
    pub from_send: Hist,
    /// Sent minus scheduled: the load generator's own lateness.
    pub lag: Hist,
}

/// Where the time went according to the server (answers carrying timing only).
#[derive(Debug, Clone, Default)]
pub struct ServerSplit {
    /// Gate receive to gate answer.
    pub total: Hist,
    pub queue: Hist,
    pub handler: Hist,
    /// total - queue - handler: the gate's own work and the bus both ways.
    pub gate_bus: Hist,
    /// From-send latency - total: the client and the WebSocket both ways.
    pub client_ws: Hist,
}

/// The record of the measured part of a run.
#[derive(Debug, Clone, Default)]
pub struct ClientStats {
    pub sent: u64,
    /// Answered 200.
    pub ok: u64,
    /// Answered with any code.
    pub answered: u64,
    pub timeouts: u64,
    /// Still in flight when the run's hard deadline passed.
    pub unanswered: u64,
    /// Answers other than 200 by code, and the first message seen for each.
    pub codes: BTreeMap<u32, u64>,
    pub messages: BTreeMap<u32, String>,
    pub failures: BTreeMap<&'static str, u64>,
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
        let (code, timing, message) = match &o.answer {
            Answer::Response {
                code,
                timing,
                message,
            } => (*code, timing, message),
            Answer::Timeout => return self.timeouts += 1,
            Answer::Failed(kind) => return *self.failures.entry(kind).or_default() += 1,
        };
        self.answered += 1;
        if code == OK {
            self.ok += 1;
        } else {
            *self.codes.entry(code).or_default() += 1;
            self.messages.entry(code).or_insert_with(|| message.clone());
        }
        let from_send = o.received.saturating_duration_since(o.sent);
        self.latency
            .from_schedule
            .record(o.received.saturating_duration_since(o.scheduled));
        self.latency.from_send.record(from_send);
        if let Some(t) = timing {
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
        self.last_answer = Some(self.last_answer.map_or(o.received, |l| l.max(o.received)));
        let second = o.received.saturating_duration_since(window_start).as_secs() as usize;
        if second < MAX_TIMELINE_SECONDS {
            if self.answers_per_second.len() <= second {
                self.answers_per_second.resize(second + 1, 0);
            }
            self.answers_per_second[second] += 1;
        }
    }

    /// Requests that got no answer: timeouts, cut by the connection, still in flight.
    pub fn lost(&self) -> u64 {
        self.timeouts + self.unanswered + self.failures.values().sum::<u64>()
    }
}

/// Achieved rate: answers ÷ the time from the window's start until the later of its
/// end and the last answer, so a server that answers late is charged for it.
pub fn rate(ok: u64, window_start: Instant, window_end: Instant, last: Option<Instant>) -> f64 {
    let end = last.map_or(window_end, |l| l.max(window_end));
    let secs = end.saturating_duration_since(window_start).as_secs_f64();
    if secs <= 0.0 { 0.0 } else { ok as f64 / secs }
}

/// What all clients of a run recorded: one set of histograms for the run, and the
/// latency from the schedule per second of the window ([`Hist::coarse`]).
#[derive(Debug, Default)]
pub struct Recorded {
    pub stats: ClientStats,
    pub timeline: Vec<Hist>,
}

/// A handle the clients share.
pub type SharedRecorded = Arc<Mutex<Recorded>>;

/// A client's recorder. A set of histograms per client made every record a cache miss
/// (~10 % of the generator's CPU); one shared set stays in cache, locked once a batch.
/// Clients in lockstep would fill equal batches at the same instant and queue on the
/// lock together, so client `i`'s first batch is cut short by its own amount.
#[derive(Debug)]
pub struct Recorder {
    shared: SharedRecorded,
    window_start: Instant,
    batch: Vec<Outcome>,
    /// The size at which the batch is recorded: smaller the first time.
    flush_at: usize,
}

impl Recorder {
    /// The recorder of client `client` of `clients`.
    pub fn new(
        shared: SharedRecorded,
        window_start: Instant,
        client: usize,
        clients: usize,
    ) -> Self {
        let flush_at = BATCH - client % clients.max(1) * BATCH / clients.max(1);
        Recorder {
            shared,
            window_start,
            batch: Vec::with_capacity(BATCH),
            flush_at,
        }
    }

    pub fn record(&mut self, outcome: Outcome) {
        self.batch.push(outcome);
        if self.batch.len() >= self.flush_at {
            self.flush();
            self.flush_at = BATCH;
        }
    }

    /// Records what is left, and the client's measured requests sent and unanswered.
    pub fn finish(mut self, sent: u64, unanswered: u64) {
        self.flush();
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        shared.stats.sent += sent;
        shared.stats.unanswered += unanswered;
    }

    /// Records the batch; also called when the recorder is dropped.
    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        let Recorded { stats, timeline } = &mut *shared;
        for o in self.batch.drain(..) {
            stats.record(self.window_start, &o);
            let second = o
                .scheduled
                .saturating_duration_since(self.window_start)
                .as_secs() as usize;
            if matches!(o.answer, Answer::Response { .. }) && second < MAX_TIMELINE_SECONDS {
                if timeline.len() <= second {
                    timeline.resize_with(second + 1, Hist::coarse);
                }
                timeline[second].record(o.received.saturating_duration_since(o.scheduled));
            }
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Per second of the window (by scheduled send time): the latency summary.
pub fn seconds(timeline: &[Hist]) -> Vec<(usize, Summary)> {
    timeline.iter().map(Hist::summary).enumerate().collect()
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
    fn recorders_share_one_record_and_timeline() {
        let t0 = Instant::now();
        let shared = SharedRecorded::default();
        let mut a = Recorder::new(shared.clone(), t0, 0, 2);
        let mut b = Recorder::new(shared.clone(), t0, 1, 2);
        a.record(answered(t0, 10, 0, 1000, 200));
        b.record(answered(t0, 20, 0, 3000, 200));
        a.record(answered(t0, 1010, 0, 5000, 503));
        // Out of order: second 0 again after second 1.
        a.record(answered(t0, 30, 0, 2000, 200));
        b.record(Outcome {
            scheduled: t0,
            sent: t0,
            received: t0,
            answer: Answer::Timeout,
        });
        // Nothing is recorded until a batch fills or the recorder goes.
        assert_eq!(
            shared.lock().expect("not poisoned").stats.latency.lag.len(),
            0
        );
        drop(a);
        drop(b);
        let recorded = shared.lock().expect("not poisoned");
        let s = &recorded.stats;
        assert_eq!((s.ok, s.answered, s.timeouts), (3, 4, 1));
        assert_eq!(s.latency.lag.len(), 5);
        assert_eq!(s.latency.from_send.len(), 4);
        let seconds = seconds(&recorded.timeline);
        assert_eq!(seconds.len(), 2);
        assert_eq!(seconds[0].1.count, 3);
        // Coarse histograms: within 1%.
        assert!((seconds[0].1.max_us - 3000.0).abs() <= 30.0);
        assert_eq!(seconds[1].1.count, 1);
    }

    #[test]
    fn batches_are_recorded_whole_and_clients_flush_at_different_counts() {
        let t0 = Instant::now();
        let shared = SharedRecorded::default();
        let ok = || shared.lock().expect("not poisoned").stats.ok;
        let record = |r: &mut Recorder, n: usize| {
            for i in 0..n as u32 {
                r.record(answered(t0, i, 0, 100, 200));
            }
        };
        // Client 0 of 4 records after a full batch; client 1 after 3/4 of one, then
        // after full ones.
        let mut first = Recorder::new(shared.clone(), t0, 0, 4);
        let mut second = Recorder::new(shared.clone(), t0, 1, 4);
        record(&mut first, BATCH * 3 / 4);
        record(&mut second, BATCH * 3 / 4);
        assert_eq!(ok(), (BATCH * 3 / 4) as u64, "only the second has recorded");
        record(&mut first, BATCH / 4);
        assert_eq!(ok(), (BATCH * 7 / 4) as u64);
        record(&mut second, BATCH - 1);
        assert_eq!(ok(), (BATCH * 7 / 4) as u64, "later batches are full ones");
        record(&mut second, 1);
        assert_eq!(ok(), (BATCH * 11 / 4) as u64);
        record(&mut first, 1);
        drop(first);
        drop(second);
        assert_eq!(
            ok(),
            (BATCH * 11 / 4) as u64 + 1,
            "the rest is recorded on drop"
        );
    }
}
