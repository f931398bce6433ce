//! Worker configuration: every limit of the frame loop as a named constant, overridable by
//! flag or environment variable (clap derive with `env =` fallbacks).
//!
//! [`FrameConfig`] holds the loop's limits and is flattened into [`WorkerConfig`], which
//! adds where the bus is. A process that runs a worker on an embedded broker (`shaddock
//! up`) can flatten [`FrameConfig`] alone.

use std::time::Duration;

use crate::bus::BusSecurity;
use crate::names::is_valid_subject;

/// Requests a worker holds before answering 503. Beyond a few frames of work a queued
/// request would wait longer than a client's patience; answering "overloaded" at once lets
/// the client back off, instead of timing out later having cost a slot all along.
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// Cost units a frame may spend before it yields. At ~10 µs per unit (see
/// [`Service::cost`](crate::Service::cost)) this is a ~5 ms frame: long enough to amortise
/// the pause, short enough that a 50 ms tick is never late by more than one frame.
pub const DEFAULT_MAX_COST: u32 = 500;

/// Pause after a frame that ran out of budget with work still queued, so the loop's timers
/// and tick get their turn and the thread does not spin at 100% under overload.
pub const DEFAULT_OVERRUN_PAUSE: Duration = Duration::from_millis(1);

/// Interval of a service's tick callback: 20 Hz, a common server tick for action games.
pub const DEFAULT_TICK_INTERVAL: Duration = Duration::from_millis(50);

/// How long a deferred request waits for its answer when its caller did not say how
/// long it waits (`RpcRequest.timeout_ms` 0): the gate's default request timeout, so
/// the worker gives up about when the client would.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a call to another service waits for its answer when the request it is made
/// for has no deadline (a tick's, an event's call, or a caller that did not say).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How much sooner than its caller's deadline a call times out (docs/workers.md,
/// "Calling other services"). The caller's deadline is the gate's: an answer made at it
/// reaches the gate after its 408. So a call made for a request gives up this much
/// earlier, and the continuation's answer (a fallback, or the failure as it is) still
/// has this long to reach the gate: past the worker's queue and frame (milliseconds)
/// and the bus, both ways, under load.
pub const DEFAULT_CALL_MARGIN: Duration = Duration::from_millis(250);

/// Calls to other services a worker has in flight at most; past it a call's
/// continuation gets 503 at once. Bounds the continuations (and the sessions they
/// hold) a worker keeps for callees that are slow to answer.
pub const DEFAULT_MAX_CALLS: usize = 1024;

/// The most messages a draining subscription still accepts after asking the bus to stop
/// routing to it (docs/workers.md, "Draining on shutdown"; a quieter subscription asks
/// for what its recent rate brings in a quarter of the drain window): far above what the server can have
/// routed to it during one round trip, so nothing on the wire is left over, and small
/// enough that a busy worker uses it up in milliseconds.
pub const DEFAULT_DRAIN_ALLOWANCE: u64 = 64;

/// The largest drain allowance accepted: nats-server reads an UNSUB count of at most
/// nine digits, and the count sent is the subscription's messages so far plus this.
pub const MAX_DRAIN_ALLOWANCE: u64 = 1_000_000;

/// The fewest messages a queue subscription is granted ahead, its lease ("Leases" in
/// docs/workers.md; a busier one is granted what its rate brings in a quarter
/// of the drain window). A successor is subscribed when half is used; a worker whose
/// reading falls behind by more than half of it is out of its group for a moment.
pub const DEFAULT_QUEUE_LEASE: u64 = 1024;

/// A worker's leases are at least this many times its queue capacity: half a lease is
/// then never less than what the queue holds, so a burst the worker can queue does not
/// outrun the lease before the successor is made ("Bursts" in docs/workers.md).
pub const LEASE_PER_QUEUED: u64 = 2;

/// The smallest lease accepted. A lease is granted by an UNSUB sent right behind the
/// SUB; a server that routed more than the lease to the new subscription between the
/// two would send messages the client drops, so the lease must be far above what
/// arrives in that instant, even in a flood.
pub const MIN_QUEUE_LEASE: u64 = 64;

/// The largest lease granted (and configured): each successor counts from 0, so the
/// counts an UNSUB carries stay far within the nine digits nats-server reads.
pub const MAX_QUEUE_LEASE: u64 = 1_000_000;

/// How long a draining subscription waits for its allowance to be used up before it
/// unsubscribes outright (a quiet subscription may never use it up); also the span its
/// recent arrival rate is measured over.
pub const DEFAULT_DRAIN_WINDOW: Duration = Duration::from_millis(500);

/// Subject prefix shared by gates and workers (`<prefix>.svc.<service>.<method>`).
pub const DEFAULT_PREFIX: &str = "shaddock";

/// How long a worker whose server enters lame duck mode tries to move its inputs to
/// another server (docs/workers.md, "Reconnecting and lame duck").
pub const DEFAULT_MOVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a worker told to stop has to drain before it exits anyway (docs/workers.md,
/// "Draining on shutdown"): a healthy drain takes the drain window and then at most the
/// longer of the answer and call timeouts (5.5 s with the defaults); a bus that is down
/// would keep it for ever, and an orchestrator kills it at its own grace (Kubernetes:
/// 30 s) without a word of what was lost.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(10);

/// How long a step of the frame loop (a frame, a tick) may run before the watchdog drives
/// the worker's bus I/O in its stead: past it, heartbeats and keyed ownership would go
/// late (the keyed heartbeat is 500 ms), and answers would wait behind the handler.
pub const DEFAULT_HANDLER_STALL: Duration = Duration::from_millis(20);

/// How long a frame's answers may wait for the next replica to its keyed partitions'
/// standbys, so that the frames of that window share one round trip: players' inputs
/// spread over a tick come a few to a frame, and a round trip per frame then costs
/// nearly as much as the frames. Measured (docs/benchmarks.md, "Standbys"): 1 ms saves
/// little, 4 ms most of it; a tenth of the default tick, and a tick never waits for it.
pub const DEFAULT_REPLICA_WINDOW: Duration = Duration::from_millis(4);

/// Where the bus is when nothing says otherwise: a local nats-server or embedded broker.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// The frame loop's limits.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct FrameConfig {
    /// Requests queued per worker before new ones are answered 503 (overloaded) at once.
    #[arg(long, env = "SHADDOCK_QUEUE_CAPACITY", default_value_t = DEFAULT_QUEUE_CAPACITY)]
    pub queue_capacity: usize,

    /// Cost units a frame may spend before yielding (a typical request costs 1 unit,
    /// about 10 µs of handler time; heavy methods declare more).
    #[arg(long, env = "SHADDOCK_MAX_COST", default_value_t = DEFAULT_MAX_COST)]
    pub max_cost: u32,

    /// Pause after a frame that spent its whole budget with requests still queued
    /// (e.g. 1ms, 500us; 0 for none: the next frame starts at once).
    #[arg(long, env = "SHADDOCK_OVERRUN_PAUSE", default_value = "1ms", value_parser = net::duration::parse)]
    pub overrun_pause: Duration,

    /// Interval of the service's tick callback, for services that register one
    /// (e.g. 50ms for 20 Hz).
    #[arg(long, env = "SHADDOCK_TICK_INTERVAL", default_value = "50ms", value_parser = net::duration::parse)]
    pub tick_interval: Duration,

    /// How long a deferred request waits for its answer (then 408) when its caller did
    /// not say how long it waits (e.g. 5s).
    #[arg(long, env = "SHADDOCK_ANSWER_TIMEOUT", default_value = "5s", value_parser = net::duration::parse)]
    pub answer_timeout: Duration,

    /// How long a call to another service waits for its answer (then 408) when the
    /// request it is made for has no deadline (e.g. 5s).
    #[arg(long, env = "SHADDOCK_CALL_TIMEOUT", default_value = "5s", value_parser = net::duration::parse)]
    pub call_timeout: Duration,

    /// How much sooner than the deadline of the request it is made for a call times out,
    /// so that the handler's answer (its fallback) still reaches the gate before the
    /// gate's 408 (e.g. 250ms; 0 shares the deadline).
    #[arg(long, env = "SHADDOCK_CALL_MARGIN", default_value = "250ms", value_parser = net::duration::parse)]
    pub call_margin: Duration,

    /// Calls to other services in flight at most; past it a call's continuation gets
    /// 503 at once.
    #[arg(long, env = "SHADDOCK_MAX_CALLS", default_value_t = DEFAULT_MAX_CALLS)]
    pub max_calls: usize,

    /// How long a worker told to stop (SIGTERM) has to drain: leave its groups, answer
    /// what it took, flush. Past it (the bus is down, say) it exits anyway, logging the
    /// answers and pushes it could not deliver. More than --drain-window plus the longer
    /// of --answer-timeout and --call-timeout (e.g. 10s).
    #[arg(long, env = "SHADDOCK_DRAIN_GRACE", default_value = "10s", value_parser = net::duration::parse)]
    pub drain_grace: Duration,

    /// How long one frame (or tick) of handlers may run on the worker's thread before a
    /// watchdog thread drives the worker's bus I/O (heartbeats, keyed ownership, drains)
    /// until it returns; each time is counted in worker_io_takeovers_total and logged
    /// (e.g. 20ms, 5ms).
    #[arg(long, env = "SHADDOCK_HANDLER_STALL", default_value = "20ms", value_parser = net::duration::parse)]
    pub handler_stall: Duration,

    /// How long the answers of a frame that changed keyed partitions may wait for the
    /// next replica to their standbys, so that the frames of that window share one round
    /// trip (e.g. 4ms; 0 for one round trip per frame). A tick sends what is held at once.
    #[arg(long, env = "SHADDOCK_REPLICA_WINDOW", default_value = "4ms", value_parser = net::duration::parse)]
    pub replica_window: Duration,

    #[command(flatten)]
    pub drain: DrainConfig,
}

/// How a worker leaves its queue groups at shutdown (docs/workers.md, "Draining on
/// shutdown").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct DrainConfig {
    /// The most messages a draining subscription still takes after asking the bus to
    /// stop routing to it. Each subscription asks for what its recent rate brings in a
    /// quarter of --drain-window (at least 1, at most this), and the bus stops after
    /// exactly that many, so nothing already on the wire is lost. 0 unsubscribes
    /// outright; at most 1000000.
    #[arg(long, env = "SHADDOCK_DRAIN_ALLOWANCE", default_value_t = DEFAULT_DRAIN_ALLOWANCE)]
    pub drain_allowance: u64,

    /// How long a draining subscription waits for its allowance to be used up before it
    /// unsubscribes outright, and the span its recent rate is measured over (e.g. 500ms,
    /// 2s).
    #[arg(long, env = "SHADDOCK_DRAIN_WINDOW", default_value = "500ms", value_parser = net::duration::parse)]
    pub drain_window: Duration,

    /// The fewest messages each queue subscription is granted (its lease): the bus stops
    /// routing to a subscription after its lease, and the worker subscribes a successor
    /// when half has been delivered, which keeps a drain lossless across reconnects. The
    /// worker raises it to twice --queue-capacity, so a burst its queue can hold never
    /// outruns it; a busier subscription is granted what its rate brings in a quarter of
    /// --drain-window. 64 to 1000000.
    #[arg(long, env = "SHADDOCK_QUEUE_LEASE", default_value_t = DEFAULT_QUEUE_LEASE)]
    pub queue_lease: u64,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            drain_allowance: DEFAULT_DRAIN_ALLOWANCE,
            drain_window: DEFAULT_DRAIN_WINDOW,
            queue_lease: DEFAULT_QUEUE_LEASE,
        }
    }
}

impl Default for FrameConfig {
    fn default() -> Self {
        FrameConfig {
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            max_cost: DEFAULT_MAX_COST,
            overrun_pause: DEFAULT_OVERRUN_PAUSE,
            tick_interval: DEFAULT_TICK_INTERVAL,
            answer_timeout: DEFAULT_ANSWER_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            call_margin: DEFAULT_CALL_MARGIN,
            max_calls: DEFAULT_MAX_CALLS,
            drain_grace: DEFAULT_DRAIN_GRACE,
            handler_stall: DEFAULT_HANDLER_STALL,
            replica_window: DEFAULT_REPLICA_WINDOW,
            drain: DrainConfig::default(),
        }
    }
}

impl FrameConfig {
    /// The drain settings of the worker's queue subscriptions: the configured least lease,
    /// raised to [`LEASE_PER_QUEUED`] times the queue capacity (at most
    /// [`MAX_QUEUE_LEASE`]).
    pub fn subscription_drain(&self) -> DrainConfig {
        let queued = u64::try_from(self.queue_capacity).unwrap_or(u64::MAX);
        let floor = queued.saturating_mul(LEASE_PER_QUEUED).min(MAX_QUEUE_LEASE);
        DrainConfig {
            queue_lease: self.drain.queue_lease.max(floor),
            ..self.drain
        }
    }

    /// The longest a drain takes with the bus up: the subscriptions' window, then the
    /// wait for deferred requests and calls, each until its deadline at most.
    pub fn longest_drain(&self) -> Duration {
        self.drain.drain_window + self.answer_timeout.max(self.call_timeout)
    }

    /// Checks the limits the loop cannot run with.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.queue_capacity == 0 {
            return Err(ConfigError::Zero("queue capacity"));
        }
        if self.max_cost == 0 {
            return Err(ConfigError::Zero("max cost"));
        }
        if self.tick_interval.is_zero() {
            return Err(ConfigError::Zero("tick interval"));
        }
        if self.handler_stall.is_zero() {
            return Err(ConfigError::Zero("handler stall"));
        }
        if self.answer_timeout.is_zero() {
            return Err(ConfigError::Zero("answer timeout"));
        }
        if self.call_timeout.is_zero() {
            return Err(ConfigError::Zero("call timeout"));
        }
        if self.max_calls == 0 {
            return Err(ConfigError::Zero("max calls"));
        }
        if self.drain_grace <= self.longest_drain() {
            return Err(ConfigError::Relation(
                "drain grace must be more than the drain window plus the longer of the answer and call timeouts",
            ));
        }
        if self.drain.drain_allowance > MAX_DRAIN_ALLOWANCE {
            return Err(ConfigError::TooLarge(
                "drain allowance",
                MAX_DRAIN_ALLOWANCE,
            ));
        }
        if self.drain.queue_lease < MIN_QUEUE_LEASE {
            return Err(ConfigError::TooSmall("queue lease", MIN_QUEUE_LEASE));
        }
        if self.drain.queue_lease > MAX_QUEUE_LEASE {
            return Err(ConfigError::TooLarge("queue lease", MAX_QUEUE_LEASE));
        }
        Ok(())
    }
}

/// A keyed service's worker among its peers (docs/workers.md, "Keyed services").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct KeyedConfig {
    /// How often a keyed service's worker tells its peers it lives and what it holds. A
    /// starting worker listens for two of these before it takes partitions nobody holds
    /// (e.g. 500ms).
    #[arg(long, env = "SHADDOCK_KEYED_HEARTBEAT", default_value = "500ms", value_parser = net::duration::parse)]
    pub keyed_heartbeat: Duration,

    /// How long a keyed service's worker may go unheard before its peers count it dead
    /// and take its partitions fresh: how long a crashed worker's partitions stay
    /// unserved. More than two heartbeats (e.g. 2s).
    #[arg(long, env = "SHADDOCK_KEYED_MEMBER_TIMEOUT", default_value = "2s", value_parser = net::duration::parse)]
    pub keyed_member_timeout: Duration,

    /// How long a partition's old owner waits for each answer of its new owner: a prepare
    /// unanswered keeps the partition here (tried again later); a state unanswered is
    /// sent again at this pace while the new owner lives (e.g. 2s).
    #[arg(long, env = "SHADDOCK_HANDOVER_TIMEOUT", default_value = "2s", value_parser = net::duration::parse)]
    pub handover_timeout: Duration,

    /// How long a partition's old owner keeps serving it after its new owner has
    /// subscribed it too, before it leaves: long enough for every server of a NATS
    /// cluster to learn of the new subscription (e.g. 200ms; docs/workers.md, "Hand-over").
    #[arg(long, env = "SHADDOCK_HANDOVER_OVERLAP", default_value = "200ms", value_parser = net::duration::parse)]
    pub handover_overlap: Duration,

    /// The most requests a partition's new owner holds while it waits for the state; past
    /// it, what arrives is dropped, counted and logged (e.g. 4096).
    #[arg(long, env = "SHADDOCK_HANDOVER_BUFFER", default_value_t = DEFAULT_HANDOVER_BUFFER)]
    pub handover_buffer: usize,

    /// The most peers' heartbeats, already queued, that a keyed service's worker hears
    /// before it counts peers dead: all those of a busy moment (a few per peer a second),
    /// while a flood on the members subject cannot keep its tick from ever coming
    /// (e.g. 4096; docs/workers.md, "Ownership").
    #[arg(long, env = "SHADDOCK_KEYED_HEARD_BEFORE_EXPIRING", default_value_t = DEFAULT_KEYED_HEARD_BEFORE_EXPIRING)]
    pub keyed_heard_before_expiring: usize,

    /// Whether a keyed service's partitions have standbys: the owner sends what each
    /// frame changed to the partition's next worker in rendezvous order before the
    /// frame's answers leave, and that worker takes the partition with it when the owner
    /// dies (docs/workers.md, "Standbys"). Only for services that give snapshots.
    #[arg(long, env = "SHADDOCK_STANDBY", default_value_t = true, action = clap::ArgAction::Set)]
    pub standby: bool,

    /// How long a frame's answers wait for its standby to hold what the frame changed;
    /// past it they leave anyway, the partitions are counted unreplicated, and frames
    /// stop waiting for that standby until it answers again (e.g. 100ms).
    #[arg(long, env = "SHADDOCK_REPLICA_TIMEOUT", default_value = "100ms", value_parser = net::duration::parse)]
    pub replica_timeout: Duration,

    /// The most snapshot bytes a frame sends to standbys: a frame that changed more
    /// sends its partitions in order up to it, and the rest are counted unreplicated and
    /// sent at the next keyed heartbeat (its answers do not wait for them), so a huge
    /// frame cannot hold its answers behind megabytes (e.g. 8388608).
    #[arg(long, env = "SHADDOCK_REPLICA_MAX_BYTES", default_value_t = DEFAULT_REPLICA_MAX_BYTES)]
    pub replica_max_bytes: usize,
}

/// See [`KeyedConfig::keyed_heartbeat`].
pub const DEFAULT_KEYED_HEARTBEAT: Duration = Duration::from_millis(500);
/// See [`KeyedConfig::keyed_member_timeout`].
pub const DEFAULT_KEYED_MEMBER_TIMEOUT: Duration = Duration::from_secs(2);
/// See [`KeyedConfig::handover_timeout`].
pub const DEFAULT_HANDOVER_TIMEOUT: Duration = Duration::from_secs(2);
/// See [`KeyedConfig::handover_overlap`].
pub const DEFAULT_HANDOVER_OVERLAP: Duration = Duration::from_millis(200);
/// See [`KeyedConfig::handover_buffer`].
pub const DEFAULT_HANDOVER_BUFFER: usize = 4096;
/// See [`KeyedConfig::keyed_heard_before_expiring`].
pub const DEFAULT_KEYED_HEARD_BEFORE_EXPIRING: usize = 4096;
/// See [`KeyedConfig::replica_timeout`].
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_millis(100);
/// See [`KeyedConfig::replica_max_bytes`].
pub const DEFAULT_REPLICA_MAX_BYTES: usize = 8 * 1024 * 1024;

impl Default for KeyedConfig {
    fn default() -> Self {
        KeyedConfig {
            keyed_heartbeat: DEFAULT_KEYED_HEARTBEAT,
            keyed_member_timeout: DEFAULT_KEYED_MEMBER_TIMEOUT,
            handover_timeout: DEFAULT_HANDOVER_TIMEOUT,
            handover_overlap: DEFAULT_HANDOVER_OVERLAP,
            handover_buffer: DEFAULT_HANDOVER_BUFFER,
            keyed_heard_before_expiring: DEFAULT_KEYED_HEARD_BEFORE_EXPIRING,
            standby: true,
            replica_timeout: DEFAULT_REPLICA_TIMEOUT,
            replica_max_bytes: DEFAULT_REPLICA_MAX_BYTES,
        }
    }
}

impl KeyedConfig {
    /// Checks that a live worker, heard every heartbeat, is never counted dead.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.keyed_heartbeat.is_zero() {
            return Err(ConfigError::Zero("keyed heartbeat"));
        }
        if self.handover_timeout.is_zero() {
            return Err(ConfigError::Zero("hand-over timeout"));
        }
        if self.handover_buffer == 0 {
            return Err(ConfigError::Zero("hand-over buffer"));
        }
        if self.keyed_heard_before_expiring == 0 {
            return Err(ConfigError::Zero("keyed heartbeats heard before expiring"));
        }
        if self.replica_timeout.is_zero() {
            return Err(ConfigError::Zero("replica timeout"));
        }
        if self.replica_max_bytes == 0 {
            return Err(ConfigError::Zero("replica max bytes"));
        }
        if self.keyed_member_timeout <= self.keyed_heartbeat * 2 {
            return Err(ConfigError::Relation(
                "keyed member timeout must be more than two keyed heartbeats",
            ));
        }
        Ok(())
    }
}

/// A worker: where the bus is, its subject prefix, and the frame loop's limits.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct WorkerConfig {
    /// NATS server URLs, comma-separated; the client fails over between them
    /// (e.g. nats://a:4222,nats://b:4222).
    #[arg(
        long = "nats",
        env = "SHADDOCK_NATS",
        value_delimiter = ',',
        default_value = DEFAULT_NATS_URL
    )]
    pub nats: Vec<String>,

    /// Subject prefix shared with the gates: requests arrive on
    /// PREFIX.svc.SERVICE.METHOD.
    #[arg(long, env = "SHADDOCK_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,

    #[command(flatten)]
    pub security: BusSecurity,

    /// How long a worker whose server enters lame duck mode tries to connect to another
    /// server and have its subscriptions seen there; past it, it stays until the server
    /// closes the connection, then reconnects (e.g. 5s).
    #[arg(long, env = "SHADDOCK_MOVE_TIMEOUT", default_value = "5s", value_parser = net::duration::parse)]
    pub move_timeout: Duration,

    #[command(flatten)]
    pub frames: FrameConfig,

    #[command(flatten)]
    pub keyed: KeyedConfig,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            nats: vec![DEFAULT_NATS_URL.to_owned()],
            prefix: DEFAULT_PREFIX.to_owned(),
            security: BusSecurity::default(),
            move_timeout: DEFAULT_MOVE_TIMEOUT,
            frames: FrameConfig::default(),
            keyed: KeyedConfig::default(),
        }
    }
}

impl WorkerConfig {
    /// Checks the prefix and the frame loop's limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !is_valid_subject(&self.prefix) {
            return Err(ConfigError::Prefix(self.prefix.clone()));
        }
        if self.move_timeout.is_zero() {
            return Err(ConfigError::Zero("move timeout"));
        }
        self.keyed.validate()?;
        self.frames.validate()
    }
}

/// A configuration the worker cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    #[error("{0} must be at most {1}")]
    TooLarge(&'static str, u64),
    #[error("{0} must be at least {1}")]
    TooSmall(&'static str, u64),
    #[error("invalid subject prefix {0:?}: use dot-separated tokens of [a-z0-9_-]")]
    Prefix(String),
    #[error("{0}")]
    Relation(&'static str),
}

#[cfg(test)]
mod tests;
