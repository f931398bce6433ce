//! What every listener of Shaddock shares against hostile load: a bind with a backlog
//! that holds a reconnect storm ([`listen`]), an accept loop that backs off instead of
//! spinning when descriptors run out ([`accept`]), log lines a peer can trigger written
//! at most once a second per kind ([`log_limit`]), and the open-file limit raised and
//! logged at start ([`nofile`]); the credentials a process presents to its bus
//! ([`credentials`]); and the one way durations are written on every command line and
//! config ([`duration`]).

pub mod accept;
pub mod credentials;
pub mod duration;
pub mod listen;
pub mod log_limit;
pub mod nofile;

pub use accept::{AcceptErrorKind, AcceptStats, Acceptor};
pub use credentials::BusCredentials;
pub use listen::{Backlog, BacklogArg, DEFAULT_LISTEN_BACKLOG, listen, listen_shared};
pub use log_limit::{LogLimiter, Tally};
