//! Broker configuration: every limit the broker enforces, named, with nats-server's
//! defaults so that clients tuned against nats-server behave the same here.

use std::time::Duration;

use crate::tls::Tls;

// Largest message payload a client may publish (1 MiB) and longest protocol control
// line the parser accepts (4 KiB): nats-server's defaults, named by the protocol crate.
pub use nats_wire::{DEFAULT_MAX_CONTROL_LINE, DEFAULT_MAX_PAYLOAD};
/// Outbound bytes a client may have queued before it is closed as a slow consumer.
pub const DEFAULT_MAX_PENDING: usize = 64 * 1024 * 1024;
/// Outbound bytes a client may have queued before publishers feeding it wait for it
/// to drain (flow control). A subscriber that is slow but reading slows its publishers
/// instead of being cut off; one that stops reading is cut at `max_pending`. Small on
/// purpose: a fan-out to a hundred subscribers keeps at most this much each in flight,
/// which stays in cache (measured on B5: 128 KiB gave 1.3 M msgs/s where 4 MiB gave
/// 0.8 M, and B2/B4 did not change; docs/benchmarks.md).
pub const DEFAULT_FLOW_CONTROL_PENDING: usize = 128 * 1024;
/// How long a publisher waits for such a subscriber to make progress before it stops
/// waiting for it (and leaves it to the `max_pending` limit).
pub const DEFAULT_STALL_WINDOW: Duration = Duration::from_millis(250);
/// Connections the server accepts at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64 * 1024;
/// Subscriptions one client may hold; 0 means unlimited (nats-server's default).
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 0;
/// How often the server PINGs a client to detect dead peers.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(120);
/// The first PING comes sooner, so a dead peer right after connect is found quickly.
pub const FIRST_PING_INTERVAL: Duration = Duration::from_secs(2);
/// Unanswered server PINGs after which the connection is closed as stale.
pub const DEFAULT_MAX_PINGS_OUT: u32 = 2;
/// How long one write may stay blocked before the client counts as a slow consumer.
pub const DEFAULT_WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// How long a client has to send a valid CONNECT when auth is on.
pub const DEFAULT_AUTH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client has to start and finish its TLS handshake after INFO (nats-server's
/// default): a peer that never starts holds a connection slot until then.
pub const DEFAULT_TLS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long lame duck mode lasts from its start to the last client closed (nats-server's
/// default): the grace period, then the clients closed evenly over the rest.
pub const DEFAULT_LAME_DUCK_DURATION: Duration = Duration::from_secs(120);
/// How long lame duck mode waits after telling clients (`"ldm":true`) before it closes
/// the first of them (nats-server's default): time for the other servers of a fleet to
/// enter lame duck too, so clients do not move from one to the next.
pub const DEFAULT_LAME_DUCK_GRACE_PERIOD: Duration = Duration::from_secs(10);
/// Bytes an in-process connection buffers in each direction (see
/// [`Server::connect_in_process`](crate::Server::connect_in_process)): a side that writes
/// more than this before the other reads waits, as on a full socket. The size of one
/// writer turn, so a busy subscriber's batch goes across in one copy.
pub const DEFAULT_IN_PROCESS_BUFFER: usize = 256 * 1024;

/// Who may connect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Auth {
    /// Anyone.
    #[default]
    None,
    /// CONNECT must carry this `auth_token`.
    Token(String),
    /// CONNECT must carry this `user` and `pass`.
    UserPass { user: String, pass: String },
}

impl Auth {
    pub fn required(&self) -> bool {
        *self != Auth::None
    }
}

/// Everything the server enforces. Construct with `Config::default()` and override.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name reported in INFO (`server_name`); defaults to the server id.
    pub server_name: Option<String>,
    pub max_payload: usize,
    pub max_control_line: usize,
    pub max_pending: usize,
    pub flow_control_pending: usize,
    pub stall_window: Duration,
    pub max_connections: usize,
    pub max_subscriptions: usize,
    pub ping_interval: Duration,
    pub max_pings_out: u32,
    pub write_deadline: Duration,
    pub auth: Auth,
    pub auth_timeout: Duration,
    /// Serve TLS: INFO says `tls_required` and the client upgrades (see [`crate::tls`]).
    pub tls: Option<Tls>,
    /// Lame duck mode's whole length; 0 closes every client at once after the grace
    /// period. Must be longer than the grace period unless it is 0.
    pub lame_duck_duration: Duration,
    /// Lame duck mode's wait between telling clients and closing the first.
    pub lame_duck_grace_period: Duration,
    /// Each direction's buffer of an in-process connection; 0 counts as 1.
    pub in_process_buffer: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server_name: None,
            max_payload: DEFAULT_MAX_PAYLOAD,
            max_control_line: DEFAULT_MAX_CONTROL_LINE,
            max_pending: DEFAULT_MAX_PENDING,
            flow_control_pending: DEFAULT_FLOW_CONTROL_PENDING,
            stall_window: DEFAULT_STALL_WINDOW,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_subscriptions: DEFAULT_MAX_SUBSCRIPTIONS,
            ping_interval: DEFAULT_PING_INTERVAL,
            max_pings_out: DEFAULT_MAX_PINGS_OUT,
            write_deadline: DEFAULT_WRITE_DEADLINE,
            auth: Auth::None,
            auth_timeout: DEFAULT_AUTH_TIMEOUT,
            tls: None,
            lame_duck_duration: DEFAULT_LAME_DUCK_DURATION,
            lame_duck_grace_period: DEFAULT_LAME_DUCK_GRACE_PERIOD,
            in_process_buffer: DEFAULT_IN_PROCESS_BUFFER,
        }
    }
}
