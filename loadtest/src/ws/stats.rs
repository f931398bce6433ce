//! What the clients record during a run, and how their records add up: every client
//! counts its own requests and batches its outcomes in a [`Recorder`], which records a
//! batch at a time into the run's one [`Recorded`] (totals, histograms, timeline).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::schedule::Plan;
use crate::hist::Hist;

/// Seconds of timeline kept; later seconds still count in the totals.
pub const MAX_TIMELINE_SECONDS: usize = 3_600;
/// Outcomes a client records before taking the shared lock.
const BATCH: usize = 256;
const OK: u32 = proto::code::OK;

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A response with any code.
    Response {
        code: u32,
        /// The server's own account, from `Response.timing`.
        timing: Option<proto::client::Timing>,
        message: String,
    },
    /// No answer within the request timeout (client side).
    Timeout,
    /// The connection ended under it (`closed`, `kicked`, `protocol`).
    Failed(&'static str),
}

impl Answer {
    pub fn response(code: u32, timing: Option<proto::client::Timing>, message: String) -> Self {
        Answer::Response {
            code,
            timing,
            message,
        }
    }
}

/// One finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub scheduled: Instant,
    pub sent: Instant,
    pub received: Instant,
    pub answer: Answer,
}

/// The latency of answered requests, three ways (histograms, then summaries or curves).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latencies<T = Hist> {
    /// Answer minus scheduled send time: a stall of client or server is never hidden.
    pub from_schedule: T,
    pub from_send: T,
    /// Sent minus scheduled: the load generator's own lateness.
    pub lag: T,
}

impl<T> Latencies<T> {
    pub fn map<U>(&self, f: impl Fn(&T) -> U) -> Latencies<U> {
        Latencies {
            from_schedule: f(&self.from_schedule),
            from_send: f(&self.from_send),
            lag: f(&self.lag),
        }
    }
}

/// Where the time went by the server's timing (answers with it): adds up to from-send.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerSplit<T = Hist> {
    /// From-send latency - total: the client and the WebSocket both ways.
    pub client_ws: T,
    /// total - queue - handler - calls: the gate's own work and the bus both ways.
    pub gate_bus: T,
    pub queue: T,
    pub handler: T,
    /// Waiting on other services: the sum of the `us` of the calls the answering worker
    /// made for the request (hop 1), recorded for answers that made calls only. Calls in
    /// flight together overlap, so the sum may exceed the wait.
    pub calls: T,
    /// Gate receive to gate answer.
    pub total: T,
}

impl<T> ServerSplit<T> {
    pub fn map<U>(&self, f: impl Fn(&T) -> U) -> ServerSplit<U> {
        ServerSplit {
            client_ws: f(&self.client_ws),
            gate_bus: f(&self.gate_bus),
            queue: f(&self.queue),
            handler: f(&self.handler),
            calls: f(&self.calls),
            total: f(&self.total),
        }
    }
}

/// The record of the measured part of a run.
#[derive(Debug, Clone, Default)]
pub struct ClientStats {
    pub sent: u64,
    /// Answered 200.
    pub ok: u64,
    pub timeouts: u64,
    /// Still in flight when the run's hard deadline passed.
    pub unanswered: u64,
    /// Answers other than 200 by code, and the first message seen for each.
    pub codes: BTreeMap<u32, u64>,
    pub messages: BTreeMap<u32, String>,
    pub failures: BTreeMap<&'static str, u64>,
    pub last_answer: Option<Instant>,
    pub latency: Latencies,
    pub server: ServerSplit,
    /// Answers by the second they arrived in (from the window start).
    pub answers_per_second: Vec<u64>,
}

impl ClientStats {
    /// Records a measured request's outcome.
    pub fn record(&mut self, window_start: Instant, o: &Outcome) {
        let l = &mut self.latency;
        l.lag.record(o.sent.saturating_duration_since(o.scheduled));
        let (code, timing, message) = match &o.answer {
            Answer::Response {
                code,
                timing,
                message,
            } => (*code, timing, message),
            Answer::Timeout => return self.timeouts += 1,
            Answer::Failed(kind) => return *self.failures.entry(kind).or_default() += 1,
        };
        if code == OK {
            self.ok += 1;
        } else {
            *self.codes.entry(code).or_default() += 1;
            self.messages.entry(code).or_insert_with(|| message.clone());
        }
        let from_send = o.received.saturating_duration_since(o.sent);
        let l = &mut self.latency;
        l.from_schedule
            .record(o.received.saturating_duration_since(o.scheduled));
        l.from_send.record(from_send);
        if let Some(t) = timing {
            let s = &mut self.server;
            let [total, queue, handler] = [t.total_us, t.queue_us, t.handler_us].map(u64::from);
            let hop_1 = t.calls.iter().filter(|call| call.hop == 1);
            let calls: u64 = hop_1.map(|call| u64::from(call.us)).sum();
            s.total.record_us(total);
            s.queue.record_us(queue);
            s.handler.record_us(handler);
            if !t.calls.is_empty() {
                s.calls.record_us(calls);
            }
            s.gate_bus
                .record_us(total.saturating_sub(queue + handler + calls));
            let client_ws = from_send.saturating_sub(Duration::from_micros(total));
            s.client_ws.record(client_ws);
        }
        self.last_answer = Some(self.last_answer.map_or(o.received, |l| l.max(o.received)));
        let second = second_of(window_start, o.received);
        if second < MAX_TIMELINE_SECONDS {
            if self.answers_per_second.len() <= second {
                self.answers_per_second.resize(second + 1, 0);
            }
            self.answers_per_second[second] += 1;
        }
    }
}

/// The second of the window `at` falls in.
fn second_of(window_start: Instant, at: Instant) -> usize {
    at.saturating_duration_since(window_start).as_secs() as usize
}

/// Achieved rate: answers ÷ the time from the window's start until the later of its
/// end and the last answer, so a server that answers late is charged for it.
pub fn rate(ok: u64, window_start: Instant, window_end: Instant, last: Option<Instant>) -> f64 {
    let end = last.map_or(window_end, |l| l.max(window_end));
    let secs = end.saturating_duration_since(window_start).as_secs_f64();
    if secs <= 0.0 { 0.0 } else { ok as f64 / secs }
}

/// What a run's clients recorded: one set of histograms, and one coarse one a second.
#[derive(Debug, Default)]
pub struct Recorded {
    pub stats: ClientStats,
    pub timeline: Vec<Hist>,
}

/// A handle the clients share.
pub type SharedRecorded = Arc<Mutex<Recorded>>;

/// What a client counts itself: its measured requests, and its answers for its own rate.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    pub sent: u64,
    /// Answered, timed out or failed.
    pub ended: u64,
    pub ok: u64,
    pub last_answer: Option<Instant>,
}

/// A client's books: every request it sends and every way one ends go through here.
/// A set of histograms per client made every record a cache miss (~10 % of the
/// generator's CPU); one shared set stays in cache, locked once a batch. Clients in
/// lockstep would fill equal batches at the same instant and queue on the lock
/// together, so client `i`'s first batch is cut short by its own amount.
#[derive(Debug)]
pub struct Recorder {
    shared: SharedRecorded,
    plan: Plan,
    window_start: Instant,
    tally: Tally,
    batch: Vec<Outcome>,
    /// The size at which the batch is recorded: smaller the first time.
    flush_at: usize,
}

impl Recorder {
    /// The recorder of client `client` of `clients`.
    pub fn new(
        shared: SharedRecorded,
        plan: Plan,
        window_start: Instant,
        (client, clients): (usize, usize),
    ) -> Self {
        let flush_at = BATCH - client % clients.max(1) * BATCH / clients.max(1);
        Recorder {
            shared,
            plan,
            window_start,
            tally: Tally::default(),
            batch: Vec::with_capacity(BATCH),
            flush_at,
        }
    }

    /// Slots `slots` were sent (warm-up ones are not counted).
    pub fn sent(&mut self, slots: std::ops::Range<u64>) {
        self.tally.sent += self.plan.measured_in(slots);
    }

    /// Slot `slot`, sent at `sent`, ended at `received` as `answer`; recorded when it is
    /// a measured one.
    pub fn end(&mut self, slot: u64, sent: Instant, received: Instant, answer: Answer) {
        if !self.plan.is_measured(slot) {
            return;
        }
        let t = &mut self.tally;
        t.ended += 1;
        if let Answer::Response { code, .. } = answer {
            t.last_answer = Some(t.last_answer.map_or(received, |l| l.max(received)));
            t.ok += u64::from(code == OK);
        }
        let scheduled = self.plan.schedule.at(slot);
        self.batch.push(Outcome {
            scheduled,
            sent,
            received,
            answer,
        });
        if self.batch.len() >= self.flush_at {
            self.flush();
            self.flush_at = BATCH;
        }
    }

    /// Records what is left; measured requests that never ended count as unanswered.
    pub fn finish(mut self) -> Tally {
        self.flush();
        let t = self.tally;
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        shared.stats.sent += t.sent;
        shared.stats.unanswered += t.sent.saturating_sub(t.ended);
        t
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
            let second = second_of(self.window_start, o.scheduled);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ws::schedule::{Schedule, Stop};

    const MS: Duration = Duration::from_millis(1);

    fn near(got: f64, want: f64) -> bool {
        (got - want).abs() <= want * 0.001
    }

    fn answered(t0: Instant, sched_ms: u32, lag_us: u64, rtt_us: u64) -> Outcome {
        let scheduled = t0 + sched_ms * MS;
        let sent = scheduled + Duration::from_micros(lag_us);
        let timing = proto::client::Timing {
            total_us: 300,
            queue_us: 50,
            handler_us: 10,
            calls: Vec::new(),
        };
        Outcome {
            scheduled,
            sent,
            received: sent + Duration::from_micros(rtt_us),
            answer: Answer::response(OK, Some(timing), String::new()),
        }
    }

    #[test]
    fn latency_is_recorded_from_schedule_from_send_and_as_lag() {
        let t0 = Instant::now();
        let mut s = ClientStats::default();
        s.record(t0, &answered(t0, 0, 100, 500));
        let l = &s.latency;
        assert!(near(l.from_schedule.summary().max_us, 600.0));
        assert!(near(l.from_send.summary().max_us, 500.0));
        assert!(near(l.lag.summary().max_us, 100.0));
        // 300 total - 50 queue - 10 handler; 500 from send - 300 total.
        assert!(near(s.server.gate_bus.summary().max_us, 240.0));
        assert!(near(s.server.client_ws.summary().max_us, 200.0));
        assert_eq!(s.ok, 1);
    }

    #[test]
    fn the_calls_a_request_waited_on_are_their_own_share_of_server_time() {
        let t0 = Instant::now();
        let call = |us, hop| proto::client::CallTiming {
            us,
            hop,
            ..Default::default()
        };
        let mut relayed = answered(t0, 0, 0, 500);
        if let Answer::Response {
            timing: Some(t), ..
        } = &mut relayed.answer
        {
            // Two calls of the worker's, the first with one of its callee's inside it.
            t.calls = vec![call(100, 1), call(40, 2), call(20, 1)];
        }
        let mut s = ClientStats::default();
        s.record(t0, &relayed);
        s.record(t0, &answered(t0, 0, 0, 500));
        // Hop 1 only: 100 + 20, and only for the answer that made calls.
        let calls = s.server.calls.summary();
        assert_eq!(calls.count, 1);
        assert!(near(calls.max_us, 120.0));
        // 300 total - 50 queue - 10 handler - 120 calls; 240 without calls.
        let gate_bus = s.server.gate_bus.summary();
        assert!(near(gate_bus.max_us, 240.0));
        assert!(near(gate_bus.mean_us, 180.0));
    }

    #[test]
    fn batches_are_recorded_whole_and_clients_flush_at_different_counts() {
        let t0 = Instant::now();
        let plan = Plan::new(Schedule::new(t0, MS), t0, Stop::Count(1 << 20));
        let shared = SharedRecorded::default();
        let ok = || shared.lock().expect("not poisoned").stats.ok;
        let record = |r: &mut Recorder, n: usize| {
            for i in 0..n as u32 {
                let o = answered(t0, i, 0, 100);
                r.end(u64::from(i), o.sent, o.received, o.answer);
            }
        };
        // Client 0 of 4 records after a full batch; client 1 after 3/4 of one, then
        // after full ones.
        let mut first = Recorder::new(shared.clone(), plan, t0, (0, 4));
        let mut second = Recorder::new(shared.clone(), plan, t0, (1, 4));
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
        let tally = first.finish();
        drop(second);
        let all = BATCH as u64 + 1;
        assert_eq!((tally.ended, tally.ok), (all, all));
        let every = (BATCH * 11 / 4) as u64 + 1;
        assert_eq!(ok(), every, "the rest is recorded at the end");
    }
}
