//! How a bus connection reaches its servers: URLs, credentials, TLS, limits.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use nats_wire::direct::{Link, Sink};
use net::BusCredentials;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls::ClientConfig;

/// A byte stream to a server: TCP, TLS over TCP, or an in-process connection.
pub type LocalStream = Box<dyn BusIo>;

/// What a bus connection runs on.
pub trait BusIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> BusIo for T {}

/// Opens a connection over any byte stream instead of the network (an embedded broker's
/// in-process pipe); used instead of the URLs when set. `shaddock up` links to its broker
/// directly instead ([`Attach`]); this is how the bus's own tests put a tap between it
/// and a real broker, to hold, cut or read what crosses.
pub type Dialer = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = std::io::Result<LocalStream>> + Send>> + Send + Sync,
>;

/// A [`Dialer`] opening each connection with `open` at once, e.g. an embedded broker's
/// `connect_in_process`.
pub fn dial_with<S: BusIo>(open: impl Fn() -> S + Send + Sync + 'static) -> Dialer {
    Arc::new(move || {
        let stream: LocalStream = Box::new(open());
        Box::pin(std::future::ready(Ok(stream)))
    })
}

/// Attaches a direct connection ([`nats_wire::direct`]) named by its first argument,
/// its messages going to the sink: an embedded broker's `attach`; `None` while the
/// broker takes no clients. Used instead of the URLs and any [`Dialer`] when set.
pub type Attach = Arc<dyn Fn(&str, Arc<dyn Sink>) -> Option<Box<dyn Link>> + Send + Sync>;

/// Default for [`BusOptions::connect_timeout`]: TCP, TLS and the CONNECT round trip.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default for [`BusOptions::ping_interval`]: how often a quiet connection is checked;
/// two unanswered pings in a row declare it dead.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(5);
/// Default for [`BusOptions::write_timeout`]: how long one write to a server may take
/// before the connection is declared dead. A server that stops reading (frozen,
/// SIGSTOPped, wedged) keeps its socket open and its kernel acknowledging until the
/// buffers fill; without a bound the gate would wait on it for ever, refusing every
/// request with 503 `gate overloaded` once its own buffer is full, and never move.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default for [`BusOptions::linger`]: after a server announces lame duck and the gate
/// has moved to another, how long replies are still read from the old connection.
pub const DEFAULT_LINGER: Duration = Duration::from_secs(5);
/// Default for [`BusOptions::move_unpaired`].
pub const DEFAULT_MOVE_UNPAIRED: usize = 65_536;
/// The largest control line or INFO the bus reads from a server.
pub(super) const MAX_CONTROL_LINE: usize = 64 * 1024;
/// The largest message payload the bus accepts from a server (nats-server's maximum
/// is 64 MiB).
pub(super) const MAX_PAYLOAD: usize = 64 * 1024 * 1024;

/// A bus connection's settings.
#[derive(Clone)]
pub struct BusOptions {
    /// Servers, tried in turn: `nats://host:port`, `tls://host:port`, `host:port`; a
    /// `user:password@` in one is used for it.
    pub urls: Vec<String>,
    /// The connection's name, as servers show it (default `shaddock`; a gate gives
    /// `shaddock-gate`, an in-process worker `shaddock-worker-<service>`).
    pub name: String,
    pub auth: BusCredentials,
    /// TLS, required when set (and a server that offers none is refused).
    pub tls: Option<Arc<ClientConfig>>,
    /// Used instead of `urls` when set.
    pub dialer: Option<Dialer>,
    /// Used instead of `urls` and `dialer` when set: no bytes at all.
    pub attach: Option<Attach>,
    pub connect_timeout: Duration,
    pub ping_interval: Duration,
    pub write_timeout: Duration,
    pub linger: Duration,
    /// While moving off a server in lame duck mode, the most messages kept that came on
    /// one of the two connections only, to take each message once from the two
    /// (`pairing.rs`); past it only the new connection's are taken.
    pub move_unpaired: usize,
    /// Start from a random server of the list (as NATS clients do, so a fleet of gates
    /// spreads over the servers); off, the first is tried first.
    pub randomize: bool,
}

/// The bus connection's timings as flags (`shaddock gate`); a library user sets
/// the fields of [`BusOptions`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct BusTimings {
    /// How long opening a bus connection may take: TCP, TLS and the CONNECT round trip.
    #[arg(long = "bus-connect-timeout", env = "SHADDOCK_BUS_CONNECT_TIMEOUT", value_parser = net::duration::parse_positive, default_value = "2s")]
    pub connect_timeout: Duration,
    /// How often a quiet bus connection is pinged; two unanswered pings in a row declare
    /// it dead.
    #[arg(long = "bus-ping-interval", env = "SHADDOCK_BUS_PING_INTERVAL", value_parser = net::duration::parse_positive, default_value = "5s")]
    pub ping_interval: Duration,
    /// How long one write to the bus may wait for the server to take it before the
    /// connection is declared dead (a server that stopped reading).
    #[arg(long = "bus-write-timeout", env = "SHADDOCK_BUS_WRITE_TIMEOUT", value_parser = net::duration::parse_positive, default_value = "5s")]
    pub write_timeout: Duration,
    /// After moving off a server in lame duck mode, how long replies are still read from
    /// it (0: not at all).
    #[arg(long = "bus-linger", env = "SHADDOCK_BUS_LINGER", value_parser = net::duration::parse, default_value = "5s")]
    pub linger: Duration,
    /// While moving off a server in lame duck mode (until the old connection ends), the
    /// most messages kept that came on one connection only, so that each message
    /// published meanwhile is taken once from the two; past it only the new
    /// connection's are taken, and some may be lost (0: that at once).
    #[arg(long = "bus-move-unpaired", env = "SHADDOCK_BUS_MOVE_UNPAIRED", default_value_t = DEFAULT_MOVE_UNPAIRED)]
    pub move_unpaired: usize,
}

/// The bus flags that once took bare milliseconds as `--<name>-ms`; those names still
/// work, deprecated ([`net::duration::MsFlags`]).
pub const MS_FLAGS: &[&str] = &[
    "bus-connect-timeout",
    "bus-ping-interval",
    "bus-write-timeout",
    "bus-linger",
];

impl Default for BusTimings {
    fn default() -> Self {
        BusTimings {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            ping_interval: DEFAULT_PING_INTERVAL,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            linger: DEFAULT_LINGER,
            move_unpaired: DEFAULT_MOVE_UNPAIRED,
        }
    }
}

impl BusTimings {
    /// Sets these timings on `options`.
    pub fn apply(self, options: &mut BusOptions) {
        options.connect_timeout = self.connect_timeout;
        options.ping_interval = self.ping_interval;
        options.write_timeout = self.write_timeout;
        options.linger = self.linger;
        options.move_unpaired = self.move_unpaired;
    }
}

impl fmt::Debug for BusOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BusOptions")
            .field("urls", &self.urls)
            .field("name", &self.name)
            .field("auth", &self.auth)
            .field("tls", &self.tls.is_some())
            .field("in_process", &self.dialer.is_some())
            .field("direct", &self.attach.is_some())
            .finish_non_exhaustive()
    }
}

impl BusOptions {
    /// Plain connections to `urls`, default limits.
    pub fn new<S: Into<String>>(urls: impl IntoIterator<Item = S>) -> BusOptions {
        let BusTimings {
            connect_timeout,
            ping_interval,
            write_timeout,
            linger,
            move_unpaired,
        } = BusTimings::default();
        BusOptions {
            urls: urls.into_iter().map(Into::into).collect(),
            name: "shaddock".into(),
            auth: BusCredentials::None,
            tls: None,
            dialer: None,
            attach: None,
            connect_timeout,
            ping_interval,
            write_timeout,
            linger,
            move_unpaired,
            randomize: true,
        }
    }

    /// Connections made by `dialer` (in-process), default limits.
    pub fn in_process(dialer: Dialer) -> BusOptions {
        BusOptions {
            dialer: Some(dialer),
            ..BusOptions::new(["in-process"])
        }
    }

    /// A direct connection made by `attach` (to a broker in this process), default
    /// limits.
    pub fn direct(attach: Attach) -> BusOptions {
        BusOptions {
            attach: Some(attach),
            ..BusOptions::new(["direct"])
        }
    }

    /// How many servers there are to try.
    pub(super) fn servers(&self) -> usize {
        if self.dialer.is_some() {
            1
        } else {
            self.urls.len()
        }
    }
}

/// One server of the list, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Server {
    pub host: String,
    pub port: u16,
    /// `tls://`: TLS required for this one.
    pub tls: bool,
    pub user: Option<(String, String)>,
}

/// Parses `[nats|tls]://[user:password@]host[:port]`.
pub(super) fn parse_url(url: &str) -> Result<Server, String> {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (scheme, rest),
        None => ("nats", url),
    };
    let tls = match scheme {
        "nats" => false,
        "tls" => true,
        other => return Err(format!("unsupported scheme {other:?} in NATS URL {url:?}")),
    };
    let rest = rest.trim_end_matches('/');
    let (user, hostport) = match rest.rsplit_once('@') {
        Some((info, hostport)) => {
            let (u, p) = info.split_once(':').unwrap_or((info, ""));
            (Some((u.to_owned(), p.to_owned())), hostport)
        }
        None => (None, rest),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        // An IPv6 literal without a port has colons inside its brackets.
        Some((host, port)) if !port.ends_with(']') => {
            let port = port
                .parse()
                .map_err(|_| format!("invalid port {port:?} in NATS URL {url:?}"))?;
            (host, port)
        }
        _ => (hostport, 4222),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("no host in NATS URL {url:?}"));
    }
    Ok(Server {
        host: host.to_owned(),
        port,
        tls,
        user,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_as_nats_clients_write_them() {
        let s = parse_url("nats://127.0.0.1:4333").unwrap();
        assert_eq!(
            (s.host.as_str(), s.port, s.tls, s.user),
            ("127.0.0.1", 4333, false, None)
        );
        let s = parse_url("tls://u:p@bus.example:4443/").unwrap();
        assert_eq!(
            (s.host.as_str(), s.port, s.tls),
            ("bus.example", 4443, true)
        );
        assert_eq!(s.user, Some(("u".into(), "p".into())));
        assert_eq!(parse_url("localhost").unwrap().port, 4222);
        assert_eq!(parse_url("[::1]:5000").unwrap().host, "::1");
        assert_eq!(parse_url("[::1]").unwrap().port, 4222);
        assert!(parse_url("http://x:1").unwrap_err().contains("scheme"));
        assert!(parse_url("nats://x:port").unwrap_err().contains("port"));
        assert!(parse_url("nats://:4222").unwrap_err().contains("host"));
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let mut options = BusOptions::new(["nats://x"]);
        options.auth = BusCredentials::UserPassword {
            user: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{options:?}").contains("hunter2"));
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        timings: BusTimings,
    }

    #[test]
    fn timing_flags_default_to_the_options_and_set_them() {
        use clap::Parser as _;
        let defaults = Cli::try_parse_from(["gate"]).unwrap().timings;
        assert_eq!(defaults, BusTimings::default());
        let set = Cli::try_parse_from([
            "gate",
            "--bus-connect-timeout",
            "1ms",
            "--bus-ping-interval",
            "2ms",
            "--bus-write-timeout",
            "3ms",
            "--bus-linger",
            "0",
            "--bus-move-unpaired",
            "7",
        ])
        .unwrap()
        .timings;
        let mut options = BusOptions::new(["nats://x"]);
        set.apply(&mut options);
        let ms = Duration::from_millis;
        assert_eq!(
            (
                options.connect_timeout,
                options.ping_interval,
                options.write_timeout,
                options.linger,
                options.move_unpaired,
            ),
            (ms(1), ms(2), ms(3), ms(0), 7)
        );
        // Zero would leave nothing to work with (a zero ping interval would not even
        // start); only the linger may be zero.
        for flag in [
            "--bus-connect-timeout",
            "--bus-ping-interval",
            "--bus-write-timeout",
        ] {
            let refused = Cli::try_parse_from(["gate", flag, "0"]).unwrap_err();
            assert!(
                refused.to_string().contains("greater than zero"),
                "{flag}: {refused}"
            );
        }
    }
}
