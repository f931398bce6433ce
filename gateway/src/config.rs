//! The gate's configuration. Every limit is a named constant with a flag and an
//! environment override, and each says why it has the value it has.

use std::path::PathBuf;
use std::time::Duration;

/// Subject prefix shared by gates and workers, so several deployments can share a bus.
pub const DEFAULT_PREFIX: &str = "shaddock";
/// Port a gate listens on for WebSockets (pomelo's connector default).
pub const DEFAULT_PORT: u16 = 3250;
/// Largest WebSocket frame (and message) a client may send. Game requests are small;
/// anything larger is refused before it is buffered.
pub const DEFAULT_MAX_FRAME: usize = 64 * 1024;
/// Connections one gate holds at once, sessions and connections still in their upgrade
/// or handshake alike; past it new connections are answered 503 and closed. Counting the
/// unfinished ones too means a flood of connections that never upgrade cannot take more
/// descriptors than the sessions could.
pub const DEFAULT_MAX_SESSIONS: usize = 100_000;
/// Connections one IP address may hold at once (0: no limit); past it its new ones are
/// answered 429 and closed. A household, an office or a carrier-grade NAT rarely puts
/// more players of one game behind one address, and one address alone can then take
/// at most 256 of the gate's descriptors — a quarter of a default 1,024 soft limit —
/// so a single host flooding connections leaves room for everyone else.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 256;
/// How long a new connection has to send its HTTP upgrade request and take the answer.
/// A browser sends the request in one packet right after connecting; a client that
/// trickles it a byte a second (slowloris) is holding a descriptor, not upgrading.
pub const DEFAULT_UPGRADE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest HTTP upgrade request head. A browser's is well under 2 KiB even with
/// cookies for the site; bigger heads are answered 431 before they are buffered.
pub const DEFAULT_MAX_UPGRADE_BYTES: usize = 8 * 1024;
/// Requests one session may have awaiting an answer; past it the request gets 429.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;
/// Requests the whole gate may have awaiting workers. Past it a request is answered 503
/// at once instead of queueing behind the others: under overload, answered requests keep
/// a bounded wait (Little's law: in flight ÷ throughput) and the rest fail fast. 2,048 is
/// ~20 ms of queue at the ~100k req/s one gate serves on 2 cores; against 4,096 it halved
/// the p99 at 100 and 200 clients in the load test (docs/benchmarks.md). A bigger machine
/// serves more and can take more.
pub const DEFAULT_MAX_GATE_IN_FLIGHT: usize = 2048;
/// Requests per second one session may send (token bucket), past it 429.
pub const DEFAULT_RATE: u32 = 5_000;
/// Requests a session may send in one burst above the rate.
pub const DEFAULT_BURST: u32 = 1_000;
/// How long the gate waits for a worker before answering 408 itself.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an upgraded connection has to complete the Shaddock handshake (its first
/// packet).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The heartbeat interval a client is told; two intervals of silence close it, so a
/// dead link is noticed within 50 s. 25 s, not 10: each heartbeat costs the gate a
/// wake-up, a read and an answer, and at 10 s the heartbeats of 72,000 idle players
/// took a quarter of a core (docs/capacity.md); 25 s is what game and chat servers
/// commonly use, and keeps a frame each way well inside the 60 s idle timeout of
/// common proxies (AWS ALB's default, nginx's `proxy_read_timeout`).
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(25);
/// How long shutdown waits for in-flight requests before closing sessions.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Frames queued towards one client (answers and pushes) before it counts as too slow
/// and is closed; bounded so a client that stops reading cannot grow the gate.
/// Default for `--max-bus-pending`: bytes of requests waiting for the bus connection's
/// writer. At ~200 bytes a request that is thousands of requests, far more than one
/// write takes; reaching it means the bus (or the network to it) is not keeping up, and
/// waiting longer only turns answers into timeouts.
pub const DEFAULT_MAX_BUS_PENDING: usize = 4 * 1024 * 1024;
pub const DEFAULT_OUTBOUND_QUEUE: usize = 1024;
/// Bytes of frames waiting for one client's socket before it counts as too slow and is
/// closed (as Centrifugo's client queue): with the frame count alone, a client that
/// stops reading could hold a thousand 64 KiB answers. A game client with a megabyte
/// unread is not keeping up.
pub const DEFAULT_OUTBOUND_BYTES: usize = 1024 * 1024;
/// How long a session's socket may take nothing of what is queued for it before the
/// session is closed as too slow. A game client reads continuously; one that has taken
/// nothing for seconds has stopped, or its link has, and everything sent meanwhile only
/// piles up in the gate.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Slots of the gate's in-flight budget kept for light sessions (fewer than
/// [`DEFAULT_LIGHT_IN_FLIGHT`] requests in flight): heavier sessions are refused 503
/// before they reach them, so a handful of sessions flooding requests cannot take the
/// whole budget from everyone else. A quarter of the default budget.
pub const DEFAULT_GATE_RESERVE: usize = 512;
/// Requests in flight under which a session counts as light and may use the gate's
/// reserve. A game client rarely has more than a few requests out at once.
pub const DEFAULT_LIGHT_IN_FLIGHT: usize = 4;
/// How long a request waits for the bus connection to come back before it is answered
/// 503 (never past its own timeout). A broker restart or a reconnect to the next server
/// takes well under a second; two cover it, and a client waiting longer than that for
/// a request the gate could not send is better told at once.
pub const DEFAULT_BUS_HOLD: Duration = Duration::from_secs(2);
/// How long a request written to a bus connection that was then lost waits for its
/// answer through the next connection before it is answered 503 `bus connection lost`
/// (never past its own timeout). In a cluster the worker it reached lives on: its answer
/// goes to the gate's reply subject, which the next connection subscribes again a few
/// milliseconds after the loss. A second covers that and a worker's own reconnect
/// (its first attempt within 100 ms); a request that died with the server waits that
/// long for its 503.
pub const DEFAULT_BUS_LOST_WAIT: Duration = Duration::from_secs(1);
/// Requests the whole gate holds while its bus connection is down; past it a request is
/// answered 503 at once. As many as it lets await workers (`--max-gate-in-flight`):
/// once the bus is back, held requests go to the workers like any others, and the same
/// bound keeps the burst they make bounded.
pub const DEFAULT_MAX_HELD: usize = DEFAULT_MAX_GATE_IN_FLIGHT;
/// Bytes of request bodies the gate holds while its bus connection is down, the same as
/// what it lets wait for its bus writer (`--max-bus-pending`).
pub const DEFAULT_MAX_HELD_BYTES: usize = DEFAULT_MAX_BUS_PENDING;
/// The first wait before a request that reached no worker (the bus answered "no
/// responders": none was subscribed at that instant, e.g. a worker restarting) is sent
/// again; each further wait doubles, up to [`MAX_RESEND_BACKOFF`]. A worker restarting
/// or re-subscribing after a reconnect is back within tens of milliseconds.
pub const DEFAULT_RESEND_BACKOFF: Duration = Duration::from_millis(25);
/// Largest request body a gate keeps after sending it, to send it again if it reached no
/// worker. A body is a slice of the frame it came in, so keeping it keeps the frame for
/// as long as the request is in flight; game requests are tens to hundreds of bytes,
/// and without this bound a session's `--max-in-flight` requests of `--max-frame` each
/// would hold 16 MiB. A larger request that reaches no worker is answered 503 at once.
pub const MAX_RESENT_BODY: usize = 4 * 1024;
/// The longest wait between two sends of a request that reached no worker.
pub const MAX_RESEND_BACKOFF: Duration = Duration::from_millis(400);
/// Most bytes one read of a session's socket takes: a busy client's frames come in
/// with one system call per this much. Taken on the stack; what the WebSocket does not
/// take at once waits in a buffer of its size, freed once taken (`gateway/src/lean_io.rs`).
pub const WS_READ_BUFFER: usize = 4 * 1024;
/// The read buffer a session's WebSocket keeps for its whole life, and the most it asks
/// of the socket reader at once (from memory, see [`WS_READ_BUFFER`]): 256 bytes hold
/// a game's usual frames whole, and an idle session pays for no more. It grows to the
/// largest frame the session received.
pub const DEFAULT_WS_BUFFER: usize = 256;
/// Bytes tungstenite collects before writing; flushes write everything anyway.
pub const WS_WRITE_BUFFER: usize = 8 * 1024;
/// How long a refusing bind waits for a holder of the uid to answer its probe.
pub const DEFAULT_BIND_PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long a resumable session whose link dropped is kept for its client to resume.
pub const DEFAULT_RESUME_WINDOW: Duration = Duration::from_secs(30);
/// Frames a resumable session keeps until its client acknowledges them (or, detached,
/// until it resumes); a client acks every 64, so this leaves room for a burst.
pub const DEFAULT_RESUME_BUFFER: usize = 1024;
/// Bytes of those frames: well under [`MAX_HANDED_BYTES`], so what a session holds
/// can be handed over whole.
pub const DEFAULT_RESUME_BUFFER_BYTES: usize = 512 * 1024;
/// The most a hand-over to another gate carries in one bus message: under nats-server's
/// default `max_payload` (1 MiB), which a larger message would break the gate's bus
/// connection on. A session whose hand-over would be larger is refused (409).
pub const MAX_HANDED_BYTES: usize = 768 * 1024;
/// How long a hand-over to another gate may take: the old gate waits this long for the
/// new gate's marks, the new gate twice this for what the old one hands over.
pub const DEFAULT_RESUME_HANDOVER_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest route (`service.method`) accepted.
pub const MAX_ROUTE_LEN: usize = 64;
/// Shards a gate process runs unless told otherwise (`--shards`): one, today's gate, the
/// small-footprint setting. Issue 47 makes it one per core once measured.
pub const DEFAULT_SHARDS: u16 = 1;
/// The most shards a gate process runs: each is a thread, a runtime and a bus
/// connection, and a machine has not more cores than this to give them.
pub const MAX_SHARDS: u16 = 256;

/// How many shards a gate process runs (docs/gateway.md, "Shards"): flattened into every
/// role that runs a gate.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ShardsArg {
    /// Shards of the gate: each a thread with its own runtime, sessions, timers and bus
    /// connection, under its own gate id (`<gate-id>-<n>`), all on the same listening
    /// addresses. 1 (the default) runs one gate as before.
    #[arg(long = "shards", env = "SHADDOCK_SHARDS", value_name = "N", default_value_t = DEFAULT_SHARDS)]
    #[arg(value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_SHARDS)))]
    pub shards: u16,
}

/// A gate's id when it is given none: random, so that gates started without one do not
/// collide on a bus.
pub fn random_gate_id() -> String {
    format!("g{:08x}", fastrand::u32(..))
}

/// Gate settings; see the constants for defaults and reasons.
#[derive(Debug, Clone, clap::Args)]
pub struct GateConfig {
    /// This gate's id: one subject token, unique among the gates on a bus. Random when empty.
    #[arg(long = "gate-id", env = "SHADDOCK_GATE_ID", default_value = "")]
    pub gate_id: String,
    /// Subject prefix shared by gates and workers.
    #[arg(long, env = "SHADDOCK_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,
    /// Largest WebSocket frame a client may send, in bytes.
    #[arg(long, env = "SHADDOCK_MAX_FRAME", default_value_t = DEFAULT_MAX_FRAME)]
    pub max_frame: usize,
    /// Bytes of read buffer each session's WebSocket keeps while it lives (grown to the
    /// largest frame it received); socket reads take up to 4 KiB whatever this is.
    #[arg(long, env = "SHADDOCK_WS_BUFFER", default_value_t = DEFAULT_WS_BUFFER)]
    pub ws_buffer: usize,
    /// Connections this gate holds at once: sessions and connections not yet upgraded or
    /// handshaken alike (more are answered 503).
    #[arg(long, env = "SHADDOCK_MAX_SESSIONS", default_value_t = DEFAULT_MAX_SESSIONS)]
    pub max_sessions: usize,
    /// Connections one IP address may hold at once, 0 for no limit (more are answered 429).
    #[arg(long, env = "SHADDOCK_MAX_CONNECTIONS_PER_IP", default_value_t = DEFAULT_MAX_CONNECTIONS_PER_IP)]
    pub max_connections_per_ip: usize,
    /// How long a new connection has to send its HTTP upgrade request.
    #[arg(long = "upgrade-timeout", env = "SHADDOCK_UPGRADE_TIMEOUT", value_parser = net::duration::parse, default_value = "5s")]
    pub upgrade_timeout: Duration,
    /// Largest HTTP upgrade request head, in bytes (larger ones are answered 431).
    #[arg(long, env = "SHADDOCK_MAX_UPGRADE_BYTES", default_value_t = DEFAULT_MAX_UPGRADE_BYTES)]
    pub max_upgrade_bytes: usize,
    /// Browser pages allowed to open sessions: exact origins (`https://game.example`),
    /// comma-separated, or `*`. Empty allows any. A browser's upgrade from another origin
    /// is refused with 403; clients that send no Origin (not browsers) are unaffected.
    #[arg(long, env = "SHADDOCK_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Do not serve the demo page at `/` (plain HTTP GETs are then answered 404).
    #[arg(long, env = "SHADDOCK_NO_WEB")]
    pub no_web: bool,
    /// Requests one session may have awaiting an answer (more get 429).
    #[arg(long, env = "SHADDOCK_MAX_IN_FLIGHT", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// Requests the whole gate may have awaiting workers (more get 503 at once).
    #[arg(long, env = "SHADDOCK_MAX_GATE_IN_FLIGHT", default_value_t = DEFAULT_MAX_GATE_IN_FLIGHT)]
    pub max_gate_in_flight: usize,
    /// Requests per second one session may send (more get 429).
    #[arg(long, env = "SHADDOCK_RATE", default_value_t = DEFAULT_RATE)]
    pub rate: u32,
    /// Requests a session may send in a burst above the rate.
    #[arg(long, env = "SHADDOCK_BURST", default_value_t = DEFAULT_BURST)]
    pub burst: u32,
    /// How long to wait for a worker before answering 408.
    #[arg(long = "request-timeout", env = "SHADDOCK_REQUEST_TIMEOUT", value_parser = net::duration::parse, default_value = "5s")]
    pub request_timeout: Duration,
    /// How long an upgraded connection has to finish the Shaddock handshake.
    #[arg(long = "handshake-timeout", env = "SHADDOCK_HANDSHAKE_TIMEOUT", value_parser = net::duration::parse, default_value = "5s")]
    pub handshake_timeout: Duration,
    /// Heartbeat interval; two silent intervals close a session. Keep it under the
    /// idle timeout of every proxy and NAT between players and the gate.
    #[arg(long = "heartbeat", env = "SHADDOCK_HEARTBEAT", value_parser = net::duration::parse, default_value = "25s")]
    pub heartbeat: Duration,
    /// How long shutdown waits for in-flight requests.
    #[arg(long = "shutdown-grace", env = "SHADDOCK_SHUTDOWN_GRACE", value_parser = net::duration::parse, default_value = "5s")]
    pub shutdown_grace: Duration,
    /// Bytes of requests waiting for the bus connection's writer before new ones are
    /// answered 503 at once.
    #[arg(long, env = "SHADDOCK_MAX_BUS_PENDING", default_value_t = DEFAULT_MAX_BUS_PENDING)]
    pub max_bus_pending: usize,
    /// Frames queued towards one client before it is closed as too slow.
    #[arg(long, env = "SHADDOCK_OUTBOUND_QUEUE", default_value_t = DEFAULT_OUTBOUND_QUEUE)]
    pub outbound_queue: usize,
    /// Bytes of frames waiting for one client before it is closed as too slow.
    #[arg(long, env = "SHADDOCK_OUTBOUND_BYTES", default_value_t = DEFAULT_OUTBOUND_BYTES)]
    pub outbound_bytes: usize,
    /// How long a session's socket may take nothing of what is queued for it before
    /// the session is closed as too slow (also the most a close frame is waited for).
    #[arg(id = "client_write_timeout", long = "write-timeout", env = "SHADDOCK_WRITE_TIMEOUT", value_parser = net::duration::parse_positive, default_value = "5s")]
    pub write_timeout: Duration,
    /// Slots of --max-gate-in-flight only light sessions (fewer than
    /// --light-in-flight requests in flight) may take: heavier ones are answered 503
    /// before them. 0 keeps none.
    #[arg(long, env = "SHADDOCK_GATE_RESERVE", default_value_t = DEFAULT_GATE_RESERVE)]
    pub gate_reserve: usize,
    /// Requests in flight under which a session may use the --gate-reserve.
    #[arg(long, env = "SHADDOCK_LIGHT_IN_FLIGHT", default_value_t = DEFAULT_LIGHT_IN_FLIGHT)]
    pub light_in_flight: usize,
    /// How long a request waits for a lost bus connection to come back (never past its
    /// own timeout) before it is answered 503; 0 answers 503 at once.
    #[arg(long, env = "SHADDOCK_BUS_HOLD", value_parser = net::duration::parse, default_value = "2s")]
    pub bus_hold: Duration,
    /// How long a request written to a bus connection that was then lost waits for its
    /// answer through the next connection (never past its own timeout) before it is
    /// answered 503 `bus connection lost`; 0 answers it at once. It is never sent again.
    #[arg(long, env = "SHADDOCK_BUS_LOST_WAIT", value_parser = net::duration::parse, default_value = "1s")]
    pub bus_lost_wait: Duration,
    /// Requests the whole gate holds while its bus connection is down.
    #[arg(long, env = "SHADDOCK_MAX_HELD", default_value_t = DEFAULT_MAX_HELD)]
    pub max_held: usize,
    /// Bytes of request bodies the whole gate holds while its bus connection is down.
    #[arg(long, env = "SHADDOCK_MAX_HELD_BYTES", default_value_t = DEFAULT_MAX_HELD_BYTES)]
    pub max_held_bytes: usize,
    /// The first wait before a request that reached no worker is sent again (doubling
    /// each time, while its timeout leaves room); 0 answers such a request 503 at once.
    #[arg(long, env = "SHADDOCK_RESEND_BACKOFF", value_parser = net::duration::parse, default_value = "25ms")]
    pub resend_backoff: Duration,
    /// A token every handshake must carry; empty accepts any (see `TokenCheck`). Not
    /// with the --jwt-* flags.
    #[arg(long, env = "SHADDOCK_TOKEN", default_value = "")]
    pub token: String,
    /// Signed player tokens: a file holding the HMAC secret (HS256/384/512; trailing
    /// newlines are not part of it). The token's `sub` becomes the session's uid.
    #[arg(long, env = "SHADDOCK_JWT_SECRET_FILE")]
    pub jwt_secret_file: Option<PathBuf>,
    /// Signed player tokens: a PEM public key (RSA for RS*/PS*, EC for ES256/384,
    /// Ed25519 for EdDSA). Repeat, or separate with commas, to accept several (rotation).
    #[arg(long, env = "SHADDOCK_JWT_PUBLIC_KEY", value_delimiter = ',')]
    pub jwt_public_key: Vec<PathBuf>,
    /// Accept only tokens whose `aud` names this audience.
    #[arg(long, env = "SHADDOCK_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// Accept only tokens whose `iss` is this issuer.
    #[arg(long, env = "SHADDOCK_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// When a session binds a uid another session holds: kick the old one, or refuse (409).
    #[arg(
        long,
        env = "SHADDOCK_UID_CONFLICT",
        value_enum,
        default_value = "kick"
    )]
    pub uid_conflict: UidConflict,
    /// How long a bus round trip of a bind waits: a refusing bind for another gate's
    /// holder to answer, and an answer that joined or bound for the bus server to
    /// confirm its new subscription (past it the answer goes out anyway).
    #[arg(long = "bind-probe-timeout", env = "SHADDOCK_BIND_PROBE_TIMEOUT", value_parser = net::duration::parse, default_value = "200ms")]
    pub bind_probe_timeout: Duration,
    /// Routes whose requests a session sends strictly one after another (comma-separated),
    /// e.g. chat.say so a room sees each sender's messages in order.
    #[arg(long, env = "SHADDOCK_SERIAL_ROUTES", value_delimiter = ',')]
    pub serial_routes: Vec<String>,
    /// How long a resumable session whose link dropped (no close frame) is kept for its
    /// client to resume, on this gate or another (docs/protocol.md, "Resume"); 0 ends
    /// sessions when their link drops and hands out no resume tokens.
    #[arg(long = "resume-window", env = "SHADDOCK_RESUME_WINDOW", value_parser = net::duration::parse, default_value = "30s")]
    pub resume_window: Duration,
    /// Frames (pushes and answers) a resumable session keeps until its client
    /// acknowledges them. Live, the oldest go past it (a resume needing them is refused,
    /// 409); detached, overflowing ends the session.
    #[arg(long, env = "SHADDOCK_RESUME_BUFFER", default_value_t = DEFAULT_RESUME_BUFFER)]
    pub resume_buffer: usize,
    /// Bytes of those frames, bounded the same way.
    #[arg(long, env = "SHADDOCK_RESUME_BUFFER_BYTES", default_value_t = DEFAULT_RESUME_BUFFER_BYTES)]
    pub resume_buffer_bytes: usize,
    /// How long a session's hand-over to the gate its client resumed on may take.
    #[arg(long = "resume-handover-timeout", env = "SHADDOCK_RESUME_HANDOVER_TIMEOUT", value_parser = net::duration::parse_positive, default_value = "2s")]
    pub resume_handover_timeout: Duration,
}

/// The gate's duration flags that once took bare milliseconds as `--<name>-ms`; those
/// names still work, deprecated ([`net::duration::MsFlags`]).
pub const MS_FLAGS: &[&str] = &[
    "upgrade-timeout",
    "request-timeout",
    "handshake-timeout",
    "heartbeat",
    "shutdown-grace",
    "write-timeout",
    "bind-probe-timeout",
];

impl GateConfig {
    /// The configurations of `count` shards of this gate: gate ids `<id>-0`,
    /// `<id>-1`... (the id random when none is set; one shard keeps the id), and the budgets of the whole gate
    /// (`--max-gate-in-flight`, `--gate-reserve`, `--max-held`, `--max-held-bytes`,
    /// `--max-bus-pending`) split evenly among them, rounded up, so the process keeps
    /// the totals it was given. Per-session limits hold in every shard as they are.
    /// (`--max-sessions` and `--max-connections-per-ip` are counted once over the
    /// process: the shards share their admission.)
    pub fn shards(&self, count: usize) -> Vec<GateConfig> {
        let base = match self.gate_id.as_str() {
            "" => random_gate_id(),
            id => id.to_owned(),
        };
        let count = count.max(1);
        let share = |total: usize| total.div_ceil(count);
        (0..count)
            .map(|index| GateConfig {
                gate_id: if count == 1 {
                    base.clone()
                } else {
                    format!("{base}-{index}")
                },
                max_gate_in_flight: share(self.max_gate_in_flight),
                gate_reserve: share(self.gate_reserve),
                max_held: share(self.max_held),
                max_held_bytes: share(self.max_held_bytes),
                max_bus_pending: share(self.max_bus_pending),
                ..self.clone()
            })
            .collect()
    }
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            gate_id: String::new(),
            prefix: DEFAULT_PREFIX.into(),
            max_frame: DEFAULT_MAX_FRAME,
            ws_buffer: DEFAULT_WS_BUFFER,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            upgrade_timeout: DEFAULT_UPGRADE_TIMEOUT,
            max_upgrade_bytes: DEFAULT_MAX_UPGRADE_BYTES,
            allowed_origins: Vec::new(),
            no_web: false,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_gate_in_flight: DEFAULT_MAX_GATE_IN_FLIGHT,
            rate: DEFAULT_RATE,
            burst: DEFAULT_BURST,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            heartbeat: DEFAULT_HEARTBEAT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            outbound_queue: DEFAULT_OUTBOUND_QUEUE,
            outbound_bytes: DEFAULT_OUTBOUND_BYTES,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            gate_reserve: DEFAULT_GATE_RESERVE,
            light_in_flight: DEFAULT_LIGHT_IN_FLIGHT,
            bus_hold: DEFAULT_BUS_HOLD,
            bus_lost_wait: DEFAULT_BUS_LOST_WAIT,
            max_held: DEFAULT_MAX_HELD,
            max_held_bytes: DEFAULT_MAX_HELD_BYTES,
            resend_backoff: DEFAULT_RESEND_BACKOFF,
            max_bus_pending: DEFAULT_MAX_BUS_PENDING,
            token: String::new(),
            jwt_secret_file: None,
            jwt_public_key: Vec::new(),
            jwt_audience: None,
            jwt_issuer: None,
            uid_conflict: UidConflict::Kick,
            bind_probe_timeout: DEFAULT_BIND_PROBE_TIMEOUT,
            serial_routes: Vec::new(),
            resume_window: DEFAULT_RESUME_WINDOW,
            resume_buffer: DEFAULT_RESUME_BUFFER,
            resume_buffer_bytes: DEFAULT_RESUME_BUFFER_BYTES,
            resume_handover_timeout: DEFAULT_RESUME_HANDOVER_TIMEOUT,
        }
    }
}

/// How a bind of a uid that another session holds is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum UidConflict {
    /// The new session wins; the old one is kicked wherever it is.
    #[default]
    Kick,
    /// The new bind is refused (409) while another session holds the uid.
    Refuse,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        gate: GateConfig,
    }

    #[test]
    fn shards_get_their_own_ids_and_split_the_gate_wide_budgets() {
        let gate = GateConfig {
            gate_id: "eu".into(),
            max_gate_in_flight: 2049,
            gate_reserve: 0,
            ..GateConfig::default()
        };
        let shards = gate.shards(2);
        let ids: Vec<&str> = shards.iter().map(|s| s.gate_id.as_str()).collect();
        assert_eq!(ids, ["eu-0", "eu-1"]);
        for shard in &shards {
            crate::route::check_token(&shard.gate_id).unwrap();
            // Rounded up: the shards together hold at least the total, never 0 of a
            // budget that was not 0.
            assert_eq!(shard.max_gate_in_flight, 1025);
            assert_eq!(shard.gate_reserve, 0);
            assert_eq!(shard.max_held, DEFAULT_MAX_HELD / 2);
            assert_eq!(shard.max_held_bytes, DEFAULT_MAX_HELD_BYTES / 2);
            assert_eq!(shard.max_bus_pending, DEFAULT_MAX_BUS_PENDING / 2);
            assert_eq!(shard.max_in_flight, DEFAULT_MAX_IN_FLIGHT);
            assert_eq!(shard.max_sessions, DEFAULT_MAX_SESSIONS);
        }
        // Without an id the shards share one random one.
        let random = GateConfig::default().shards(3);
        let base = random[0].gate_id.strip_suffix("-0").unwrap();
        assert!(random[2].gate_id == format!("{base}-2"), "{random:?}");
        assert_eq!(GateConfig::default().shards(MAX_SHARDS.into()).len(), 256);
        // One shard is the gate itself: its id and budgets as given.
        let one = gate.shards(1);
        assert_eq!(one[0].gate_id, "eu");
        assert_eq!(one[0].max_gate_in_flight, 2049);
    }

    #[test]
    fn shards_are_one_to_max_shards() {
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            shards: ShardsArg,
        }
        let parse = |argv: &[&str]| Cli::try_parse_from(argv).map(|cli| cli.shards.shards);
        assert_eq!(parse(&["gate"]).unwrap(), DEFAULT_SHARDS);
        assert_eq!(parse(&["gate", "--shards", "256"]).unwrap(), MAX_SHARDS);
        assert!(parse(&["gate", "--shards", "0"]).is_err());
        assert!(parse(&["gate", "--shards", "257"]).is_err());
    }

    #[test]
    fn the_heartbeat_defaults_to_25_s_on_the_flag_and_in_code() {
        let gate = Cli::try_parse_from(["gate"]).unwrap().gate;
        assert_eq!(gate.heartbeat, Duration::from_secs(25));
        assert_eq!(GateConfig::default().heartbeat, gate.heartbeat);
        let gate = Cli::try_parse_from(["gate", "--heartbeat", "10s"])
            .unwrap()
            .gate;
        assert_eq!(gate.heartbeat, Duration::from_secs(10));
    }

    #[test]
    fn slow_client_flags_default_and_refuse_a_zero_write_timeout() {
        let gate = Cli::try_parse_from(["gate"]).unwrap().gate;
        assert_eq!(
            (
                gate.write_timeout,
                gate.outbound_queue,
                gate.gate_reserve,
                gate.light_in_flight
            ),
            (
                DEFAULT_WRITE_TIMEOUT,
                DEFAULT_OUTBOUND_QUEUE,
                DEFAULT_GATE_RESERVE,
                DEFAULT_LIGHT_IN_FLIGHT
            )
        );
        let gate = Cli::try_parse_from(["gate", "--write-timeout", "1ms", "--gate-reserve", "0"])
            .unwrap()
            .gate;
        assert_eq!(gate.write_timeout, Duration::from_millis(1));
        assert_eq!(gate.gate_reserve, 0);
        let refused = Cli::try_parse_from(["gate", "--write-timeout", "0"]).unwrap_err();
        assert!(
            refused.to_string().contains("greater than zero"),
            "{refused}"
        );
    }
}
