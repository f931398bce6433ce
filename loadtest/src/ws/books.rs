//! A client's bookkeeping during a run: what it sent and what ended, for its own rate
//! ([`Tally`]), the shared progress counts (published in batches) and the run's record
//! ([`Recorder`]).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use indicatif::ProgressBar;

use super::schedule::Plan;
use super::stats::{Answer, Outcome, Recorder};

/// Completions a client counts locally before publishing them to the progress bar.
const PROGRESS_BATCH: u64 = 64;

/// What a client counts itself: its requests, and its answers for its own rate.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    /// Measured requests sent, and those that ended (answered, timed out, failed).
    pub sent: u64,
    pub ended: u64,
    pub ok: u64,
    pub last_answer: Option<Instant>,
}

impl Tally {
    fn end(&mut self, outcome: &Outcome) {
        self.ended += 1;
        if let Answer::Response { code, .. } = outcome.answer {
            self.last_answer = Some(
                self.last_answer
                    .map_or(outcome.received, |l| l.max(outcome.received)),
            );
            if code == proto::code::OK {
                self.ok += 1;
            }
        }
    }
}

/// Live counts for the progress bar (warm-up included).
#[derive(Debug, Default)]
pub struct Progress {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
}

impl Progress {
    pub fn draw(&self, bar: &ProgressBar, start: Instant) {
        let elapsed = Instant::now().saturating_duration_since(start);
        bar.set_position(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        bar.set_message(format!(
            "sent {} ok {} failed {}",
            self.sent.load(Ordering::Relaxed),
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        ));
    }
}

/// A client's counts not yet published, so the shared atomics are touched once per
/// [`PROGRESS_BATCH`] requests instead of once per request.
#[derive(Debug, Default)]
struct LocalCounts {
    sent: u64,
    ok: u64,
    failed: u64,
}

impl LocalCounts {
    fn sent(&mut self, n: u64, progress: &Progress) {
        self.sent += n;
        if self.sent >= PROGRESS_BATCH {
            self.flush(progress);
        }
    }

    fn done(&mut self, answer: &Answer, progress: &Progress) {
        match answer {
            Answer::Response { code: 200, .. } => self.ok += 1,
            _ => self.failed += 1,
        }
        if self.ok + self.failed >= PROGRESS_BATCH {
            self.flush(progress);
        }
    }

    fn flush(&mut self, progress: &Progress) {
        progress.sent.fetch_add(self.sent, Ordering::Relaxed);
        progress.ok.fetch_add(self.ok, Ordering::Relaxed);
        progress.failed.fetch_add(self.failed, Ordering::Relaxed);
        *self = LocalCounts::default();
    }
}

/// One client's books: every request it sends and every way one ends go through here.
#[derive(Debug)]
pub struct Books {
    plan: Plan,
    tally: Tally,
    counts: LocalCounts,
    progress: Arc<Progress>,
    recorder: Recorder,
}

impl Books {
    pub fn new(plan: Plan, progress: Arc<Progress>, recorder: Recorder) -> Self {
        Books {
            plan,
            tally: Tally::default(),
            counts: LocalCounts::default(),
            progress,
            recorder,
        }
    }

    /// Slots `slots` were sent (warm-up ones are counted for progress only).
    pub fn sent(&mut self, slots: Range<u64>) {
        self.tally.sent += self.plan.measured_in(slots.clone());
        self.counts
            .sent(slots.end.saturating_sub(slots.start), &self.progress);
    }

    /// Slot `slot` ended as `outcome`; recorded when it is a measured one.
    pub fn end(&mut self, slot: u64, outcome: Outcome) {
        self.counts.done(&outcome.answer, &self.progress);
        if self.plan.is_measured(slot) {
            self.tally.end(&outcome);
            self.recorder.record(outcome);
        }
    }

    /// Publishes what is left; measured requests that never ended count as unanswered.
    pub fn finish(mut self) -> Tally {
        self.counts.flush(&self.progress);
        let tally = self.tally;
        self.recorder
            .finish(tally.sent, tally.sent.saturating_sub(tally.ended));
        tally
    }
}
