//! The flags, their defaults and their edges.

use super::*;
use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    worker: WorkerConfig,
}

#[test]
fn flag_defaults_match_default_impl() {
    let cli = Cli::try_parse_from(["worker"]).unwrap();
    assert_eq!(cli.worker, WorkerConfig::default());
}

#[test]
fn flags_override_defaults() {
    let cli = Cli::try_parse_from([
        "worker",
        "--nats",
        "nats://a:4222,nats://b:4222",
        "--prefix",
        "prod.shaddock",
        "--queue-capacity",
        "8",
        "--max-cost",
        "3",
        "--overrun-pause",
        "250us",
        "--tick-interval",
        "2s",
        "--drain-allowance",
        "0",
        "--drain-window",
        "1s",
        "--queue-lease",
        "64",
        "--move-timeout",
        "1ms",
        "--drain-grace",
        "5s",
        "--answer-timeout",
        "3s",
        "--call-timeout",
        "2s",
        "--call-margin",
        "0s",
        "--max-calls",
        "9",
        "--handler-stall",
        "5ms",
        "--replica-window",
        "300us",
    ])
    .unwrap();
    let worker = cli.worker;
    assert_eq!(worker.nats, ["nats://a:4222", "nats://b:4222"]);
    assert_eq!(worker.prefix, "prod.shaddock");
    assert_eq!(worker.move_timeout, Duration::from_millis(1));
    assert_eq!(
        worker.frames,
        FrameConfig {
            queue_capacity: 8,
            max_cost: 3,
            overrun_pause: Duration::from_micros(250),
            tick_interval: Duration::from_secs(2),
            answer_timeout: Duration::from_secs(3),
            call_timeout: Duration::from_secs(2),
            call_margin: Duration::ZERO,
            max_calls: 9,
            drain_grace: Duration::from_secs(5),
            handler_stall: Duration::from_millis(5),
            replica_window: Duration::from_micros(300),
            drain: DrainConfig {
                drain_allowance: 0,
                drain_window: Duration::from_secs(1),
                queue_lease: 64,
            },
        }
    );
    assert_eq!(worker.validate(), Ok(()));
}

#[test]
fn validation_rejects_zero_limits_and_wildcard_prefixes() {
    let mut config = WorkerConfig::default();
    config.frames.max_cost = 0;
    assert_eq!(config.validate(), Err(ConfigError::Zero("max cost")));
    let mut config = WorkerConfig::default();
    config.frames.handler_stall = Duration::ZERO;
    assert_eq!(config.validate(), Err(ConfigError::Zero("handler stall")));
    let mut config = WorkerConfig::default();
    config.frames.drain.drain_allowance = MAX_DRAIN_ALLOWANCE;
    assert_eq!(config.validate(), Ok(()));
    config.frames.drain.drain_allowance = MAX_DRAIN_ALLOWANCE + 1;
    assert_eq!(
        config.validate(),
        Err(ConfigError::TooLarge(
            "drain allowance",
            MAX_DRAIN_ALLOWANCE
        ))
    );
    let mut config = WorkerConfig::default();
    config.frames.drain.queue_lease = MIN_QUEUE_LEASE;
    assert_eq!(config.validate(), Ok(()));
    config.frames.drain.queue_lease = MIN_QUEUE_LEASE - 1;
    assert_eq!(
        config.validate(),
        Err(ConfigError::TooSmall("queue lease", MIN_QUEUE_LEASE))
    );
    config.frames.drain.queue_lease = MAX_QUEUE_LEASE;
    assert_eq!(config.validate(), Ok(()));
    config.frames.drain.queue_lease = MAX_QUEUE_LEASE + 1;
    assert_eq!(
        config.validate(),
        Err(ConfigError::TooLarge("queue lease", MAX_QUEUE_LEASE))
    );
    let config = WorkerConfig {
        move_timeout: Duration::ZERO,
        ..WorkerConfig::default()
    };
    assert_eq!(config.validate(), Err(ConfigError::Zero("move timeout")));
    // The grace must outlast a healthy drain: 500ms + 5s by default.
    let mut config = WorkerConfig::default();
    config.frames.drain_grace = config.frames.longest_drain() + Duration::from_millis(1);
    assert_eq!(config.validate(), Ok(()));
    config.frames.drain_grace = config.frames.longest_drain();
    assert!(matches!(config.validate(), Err(ConfigError::Relation(_))));
    let config = WorkerConfig {
        prefix: "a.>".into(),
        ..WorkerConfig::default()
    };
    assert!(matches!(config.validate(), Err(ConfigError::Prefix(_))));
    let mut config = WorkerConfig::default();
    config.keyed.keyed_heard_before_expiring = 1;
    assert_eq!(config.validate(), Ok(()));
    config.keyed.keyed_heard_before_expiring = 0;
    assert_eq!(
        config.validate(),
        Err(ConfigError::Zero("keyed heartbeats heard before expiring"))
    );
    let mut config = WorkerConfig::default();
    config.keyed.handover_buffer = 0;
    assert_eq!(
        config.validate(),
        Err(ConfigError::Zero("hand-over buffer"))
    );
    let mut config = WorkerConfig::default();
    config.keyed.replica_timeout = Duration::from_millis(1);
    assert_eq!(config.validate(), Ok(()));
    config.keyed.replica_timeout = Duration::ZERO;
    assert_eq!(config.validate(), Err(ConfigError::Zero("replica timeout")));
}

#[test]
fn the_lease_covers_twice_the_queue_up_to_the_largest() {
    let mut frames = FrameConfig::default();
    assert_eq!(
        frames.subscription_drain().queue_lease,
        2 * DEFAULT_QUEUE_CAPACITY as u64
    );
    // A configured lease above the floor stays; the rest of the settings too.
    frames.drain.queue_lease = 100_000;
    frames.drain.drain_allowance = 7;
    let drain = frames.subscription_drain();
    assert_eq!((drain.queue_lease, drain.drain_allowance), (100_000, 7));
    // A small queue leaves the configured lease as it is.
    frames.queue_capacity = 1;
    frames.drain.queue_lease = MIN_QUEUE_LEASE;
    assert_eq!(frames.subscription_drain().queue_lease, MIN_QUEUE_LEASE);
    // A huge queue is capped at the largest lease.
    frames.queue_capacity = usize::MAX;
    assert_eq!(frames.subscription_drain().queue_lease, MAX_QUEUE_LEASE);
}
