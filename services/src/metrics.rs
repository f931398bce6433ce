//! The worker's metrics: names in one place, and handles resolved once per loop so the hot
//! path records with an atomic operation instead of a registry lookup per request.
//!
//! All are labelled `service`; `worker_requests_total` also `code`, the calls' `route`
//! (and `code`). Every request counts
//! once in `worker_requests_total`, including the ones rejected with 503 (which also count
//! in `worker_rejected_total`), so the sum over codes is the worker's intake.

use std::collections::HashMap;
use std::time::Duration;

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
/// old owner gave; `standby`: with the replica it held of a dead owner's; `fresh`: with
/// none).
pub const PARTITIONS_TAKEN_TOTAL: &str = "worker_partitions_taken_total";
/// Partitions handed over to another worker, by outcome (`ok`; `kept`: the new owner did
/// not take it in time, so this worker kept it and tries again).
pub const PARTITIONS_HANDED_TOTAL: &str = "worker_partitions_handed_total";
/// Partitions held here whose latest state is not at a standby: none (one worker), or
/// one that did not answer in time (docs/workers.md, "Standbys").
pub const KEYED_PARTITIONS_UNREPLICATED: &str = "worker_partitions_unreplicated";
/// Replicas a standby did not answer in time, or refused: the frame's answers left
/// without waiting further.
pub const KEYED_REPLICA_FAILURES_TOTAL: &str = "worker_replica_failures_total";
/// Moments a peer claimed a partition this worker holds too.
pub const PARTITION_CONFLICTS_TOTAL: &str = "worker_partition_conflicts_total";
/// Keyed peers counted dead: not heard from for `--keyed-member-timeout`, their last
/// heartbeat not one of a worker that left (leaving, holding nothing).
pub const KEYED_PEERS_DEAD_TOTAL: &str = "worker_keyed_peers_dead_total";
/// Keyed peers that left: not heard from for `--keyed-member-timeout` after a heartbeat
/// saying leaving, holding nothing (a drained worker).
pub const KEYED_PEERS_LEFT_TOTAL: &str = "worker_keyed_peers_left_total";
/// Requests a partition's new owner dropped while it waited for the state, its
/// `--handover-buffer` full.
pub const HANDOVER_OVERFLOW_TOTAL: &str = "worker_handover_overflow_total";
/// Time from a deferred request's arrival to its answer (or its 408).
pub const DEFERRED_WAIT_SECONDS: &str = "worker_deferred_wait_seconds";
/// Deferred requests answered 408 by the worker: nothing answered them by their deadline.
pub const DEFERRED_EXPIRED_TOTAL: &str = "worker_deferred_expired_total";
/// Answers to deferred requests dropped: the request had been answered already (its
/// 408, or an earlier answer) or was never deferred.
pub const DEFERRED_LATE_TOTAL: &str = "worker_deferred_late_total";
/// Calls to other services by route and the code their continuation got.
pub const CALLS_TOTAL: &str = "worker_calls_total";
/// Time from a call's sending to its result (or its timeout), by route.
pub const CALL_SECONDS: &str = "worker_call_seconds";
/// Messages an in-process bus connection dropped because their subscription's queue was
/// full (a slow consumer; `services::bus::SUBSCRIPTION_CAPACITY`).
pub const SLOW_CONSUMER_DROPS_TOTAL: &str = "worker_slow_consumer_drops_total";
/// Frames that ran past `--handler-stall`, during which the watchdog thread drove the
/// worker's bus I/O (docs/workers.md, "In Rust: threads, and the handler that overruns").
pub const IO_TAKEOVERS_TOTAL: &str = "worker_io_takeovers_total";

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
        "Partitions taken on: handed over with their state, from a standby's replica, or fresh"
    );
    metrics::describe_gauge!(
        KEYED_PARTITIONS_UNREPLICATED,
        "Partitions held here whose latest state no standby holds"
    );
    metrics::describe_counter!(
        KEYED_REPLICA_FAILURES_TOTAL,
        "Replicas a standby did not hold in time: the frame's answers left without it"
    );
    metrics::describe_counter!(
        PARTITIONS_HANDED_TOTAL,
        "Partitions handed over to another worker, or kept when it did not take them"
    );
    metrics::describe_histogram!(
        DEFERRED_WAIT_SECONDS,
        Unit::Seconds,
        "Time from a deferred request's arrival to its answer"
    );
    metrics::describe_counter!(
        DEFERRED_EXPIRED_TOTAL,
        "Deferred requests answered 408: nothing answered them by their deadline"
    );
    metrics::describe_counter!(
        DEFERRED_LATE_TOTAL,
        "Answers to deferred requests dropped: already answered, or never deferred"
    );
    metrics::describe_counter!(
        CALLS_TOTAL,
        "Calls to other services, by route and the code their continuation got"
    );
    metrics::describe_histogram!(
        CALL_SECONDS,
        Unit::Seconds,
        "Time from a call's sending to its result or timeout"
    );
    metrics::describe_counter!(
        SLOW_CONSUMER_DROPS_TOTAL,
        "Messages an in-process bus connection dropped: their subscription's queue was full"
    );
    metrics::describe_counter!(
        IO_TAKEOVERS_TOTAL,
        "Frames that ran past the handler stall budget: the watchdog drove the bus I/O meanwhile"
    );
    metrics::describe_counter!(
        PARTITION_CONFLICTS_TOTAL,
        "Heartbeats in which a peer claimed a partition this worker holds"
    );
    metrics::describe_counter!(
        KEYED_PEERS_DEAD_TOTAL,
        "Keyed peers counted dead: not heard from for the member timeout, not having left"
    );
    metrics::describe_counter!(
        KEYED_PEERS_LEFT_TOTAL,
        "Keyed peers that left: silent after saying leaving with nothing held"
    );
    metrics::describe_counter!(
        HANDOVER_OVERFLOW_TOTAL,
        "Requests a partition's new owner dropped while waiting for its state, its hand-over buffer full"
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

/// Handles for deferred requests and calls, resolved on first use, so a service that
/// defers nothing shows no such series; calls' per route (and code): a service calls a
/// handful of routes its code names.
pub(crate) struct CallMetrics {
    deferred: Option<DeferredMetrics>,
    service: String,
    calls: HashMap<(String, u32), Counter>,
    latency: HashMap<String, Histogram>,
}

/// See [`CallMetrics`].
pub(crate) struct DeferredMetrics {
    pub wait: Histogram,
    pub expired: Counter,
    pub late: Counter,
}

impl CallMetrics {
    pub fn new(service: &str) -> CallMetrics {
        CallMetrics {
            deferred: None,
            service: service.to_owned(),
            calls: HashMap::new(),
            latency: HashMap::new(),
        }
    }

    /// The deferred requests' handles.
    pub fn deferred(&mut self) -> &DeferredMetrics {
        let service = &self.service;
        self.deferred.get_or_insert_with(|| DeferredMetrics {
            wait: metrics::histogram!(DEFERRED_WAIT_SECONDS, "service" => service.clone()),
            expired: metrics::counter!(DEFERRED_EXPIRED_TOTAL, "service" => service.clone()),
            late: metrics::counter!(DEFERRED_LATE_TOTAL, "service" => service.clone()),
        })
    }

    /// Counts a call to `route` whose continuation got `code`.
    pub fn count_call(&mut self, route: &str, code: u32) {
        let service = &self.service;
        self.calls
            .entry((route.to_owned(), code))
            .or_insert_with(|| {
                metrics::counter!(
                    CALLS_TOTAL,
                    "service" => service.clone(),
                    "route" => route.to_owned(),
                    "code" => code.to_string()
                )
            })
            .increment(1);
    }

    /// Records how long a call to `route` took to come back (or time out).
    pub fn call_took(&mut self, route: &str, took: Duration) {
        let service = &self.service;
        self.latency
            .entry(route.to_owned())
            .or_insert_with(|| {
                metrics::histogram!(CALL_SECONDS, "service" => service.clone(), "route" => route.to_owned())
            })
            .record(took);
    }
}
