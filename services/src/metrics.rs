//! The worker's metrics: names in one place, and handles resolved once per loop so the hot
//! path records with an atomic operation instead of a registry lookup per request.
//!
//! All are labelled `service`; `worker_requests_total` also `code`. Every request counts
//! once in `worker_requests_total`, including the ones rejected with 503 (which also count
//! in `worker_rejected_total`), so the sum over codes is the worker's intake.

use metrics::{Counter, Gauge, Histogram, Unit};

/// Time from a request's arrival at the worker to its handler's start.
pub const QUEUE_WAIT_SECONDS: &str = "worker_queue_wait_seconds";
/// Time inside the handler, including decoding and encoding.
pub const HANDLER_SECONDS: &str = "worker_handler_seconds";
/// Length of one frame of the handler loop.
pub const FRAME_SECONDS: &str = "worker_frame_seconds";
/// Requests queued, waiting for a frame.
pub const QUEUE_DEPTH: &str = "worker_queue_depth";
/// Requests by the status code they were answered with.
pub const REQUESTS_TOTAL: &str = "worker_requests_total";
/// Requests answered 503 (or dropped, for notifies) because the queue was full.
pub const REJECTED_TOTAL: &str = "worker_rejected_total";
/// Replies the bus client would not take (connection closed).
pub const REPLY_ERRORS_TOTAL: &str = "worker_reply_errors_total";
/// Pushes and service messages the bus client would not take (connection closed).
pub const PUBLISH_ERRORS_TOTAL: &str = "worker_publish_errors_total";
/// Events (messages on a service's event subjects) handled, by outcome (`ok`, `error`).
pub const EVENTS_TOTAL: &str = "worker_events_total";
/// Queue subscriptions whose lease ran out before their successor was subscribed: the
/// worker was out of its group for a moment (docs/workers.md, "Bursts").
pub const LEASE_LAPSES_TOTAL: &str = "worker_queue_lease_lapses_total";
/// A keyed service's partitions this worker holds.
pub const PARTITIONS_HELD: &str = "worker_partitions_held";
/// Partitions a keyed service's worker took on, by how (`handed`: with the state its
/// old owner gave; `fresh`: with none).
pub const PARTITIONS_TAKEN_TOTAL: &str = "worker_partitions_taken_total";
/// Partitions handed over to another worker, by outcome (`ok`; `kept`: the new owner did
/// not take it in time, so this worker kept it and tries again).
pub const PARTITIONS_HANDED_TOTAL: &str = "worker_partitions_handed_total";
/// Moments a peer claimed a partition this worker holds too.
pub const PARTITION_CONFLICTS_TOTAL: &str = "worker_partition_conflicts_total";

/// Registers help text and units with the installed recorder (the Prometheus exporter
/// prints them). Call once at startup, after installing it.
pub fn describe() {
    metrics::describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time from a request's arrival at the worker to its handler's start"
    );
    metrics::describe_histogram!(
        HANDLER_SECONDS,
        Unit::Seconds,
        "Time in the handler, decoding and encoding included"
    );
    metrics::describe_histogram!(
        FRAME_SECONDS,
        Unit::Seconds,
        "Length of one frame of the handler loop"
    );
    metrics::describe_gauge!(QUEUE_DEPTH, "Requests queued, waiting for a frame");
    metrics::describe_counter!(
        REQUESTS_TOTAL,
        "Requests by answer code, 503 rejections included"
    );
    metrics::describe_counter!(
        REJECTED_TOTAL,
        "Requests rejected because the worker's queue was full"
    );
    metrics::describe_counter!(
        REPLY_ERRORS_TOTAL,
        "Replies that could not be handed to the bus client"
    );
    metrics::describe_counter!(
        PUBLISH_ERRORS_TOTAL,
        "Pushes and service messages that could not be handed to the bus client"
    );
    metrics::describe_counter!(EVENTS_TOTAL, "Events handled, by outcome");
    metrics::describe_counter!(
        LEASE_LAPSES_TOTAL,
        "Queue subscriptions whose lease ran out before their successor was subscribed"
    );
    metrics::describe_gauge!(PARTITIONS_HELD, "A keyed service's partitions held here");
    metrics::describe_counter!(
        PARTITIONS_TAKEN_TOTAL,
        "Partitions taken on, handed over with their state or fresh"
    );
    metrics::describe_counter!(
        PARTITIONS_HANDED_TOTAL,
        "Partitions handed over to another worker, or kept when it did not take them"
    );
    metrics::describe_counter!(
        PARTITION_CONFLICTS_TOTAL,
        "Heartbeats in which a peer claimed a partition this worker holds"
    );
}

/// Handles for the frame loop.
pub(crate) struct LoopMetrics {
    pub queue_wait: Histogram,
    pub handler: Histogram,
    pub frame: Histogram,
    pub depth: Gauge,
    pub requests: RequestCounters,
    /// `worker_events_total` by outcome (ok, error); resolved on the first event, so a
    /// service without events shows no such series.
    events: Option<[Counter; 2]>,
    service: String,
}

impl LoopMetrics {
    pub fn new(service: &str) -> LoopMetrics {
        let label = service.to_owned();
        LoopMetrics {
            queue_wait: metrics::histogram!(QUEUE_WAIT_SECONDS, "service" => label.clone()),
            handler: metrics::histogram!(HANDLER_SECONDS, "service" => label.clone()),
            frame: metrics::histogram!(FRAME_SECONDS, "service" => label.clone()),
            depth: metrics::gauge!(QUEUE_DEPTH, "service" => label),
            requests: RequestCounters::new(service),
            events: None,
            service: service.to_owned(),
        }
    }

    /// Counts one event handled, successfully or not.
    pub fn count_event(&mut self, ok: bool) {
        let service = &self.service;
        let [ok_counter, error_counter] = self.events.get_or_insert_with(|| {
            [
                metrics::counter!(EVENTS_TOTAL, "service" => service.clone(), "outcome" => "ok"),
                metrics::counter!(EVENTS_TOTAL, "service" => service.clone(), "outcome" => "error"),
            ]
        });
        if ok {
            ok_counter.increment(1);
        } else {
            error_counter.increment(1);
        }
    }
}

/// Handles for the intake (the side that queues or rejects).
pub(crate) struct IntakeMetrics {
    pub rejected: Counter,
    pub overloaded: Counter,
    pub depth: Gauge,
}

impl IntakeMetrics {
    pub fn new(service: &str) -> IntakeMetrics {
        let label = service.to_owned();
        IntakeMetrics {
            rejected: metrics::counter!(REJECTED_TOTAL, "service" => label.clone()),
            overloaded: metrics::counter!(
                REQUESTS_TOTAL,
                "service" => label.clone(),
                "code" => proto::code::UNAVAILABLE.to_string()
            ),
            depth: metrics::gauge!(QUEUE_DEPTH, "service" => label),
        }
    }
}

/// `worker_requests_total` per code, resolved on first use. Codes are a handful of
/// constants chosen by handlers, so the list stays tiny and a linear scan beats hashing.
pub(crate) struct RequestCounters {
    service: String,
    by_code: Vec<(u32, Counter)>,
}

impl RequestCounters {
    fn new(service: &str) -> RequestCounters {
        RequestCounters {
            service: service.to_owned(),
            by_code: Vec::new(),
        }
    }

    pub fn count(&mut self, code: u32) {
        if let Some((_, counter)) = self.by_code.iter().find(|(c, _)| *c == code) {
            counter.increment(1);
            return;
        }
        let counter = metrics::counter!(
            REQUESTS_TOTAL,
            "service" => self.service.clone(),
            "code" => code.to_string()
        );
        counter.increment(1);
        self.by_code.push((code, counter));
    }
}
