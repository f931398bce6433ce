//! What every listener of Shaddock shares against hostile load: an accept loop that
//! backs off instead of spinning when descriptors run out ([`accept`]), log lines a
//! peer can trigger written at most once a second per kind ([`log_limit`]), and the
//! open-file limit raised and logged at start ([`nofile`]); and the credentials a
//! process presents to its bus ([`credentials`]).

pub mod accept;
pub mod credentials;
pub mod log_limit;
pub mod nofile;

pub use accept::{AcceptErrorKind, AcceptStats, Acceptor};
pub use credentials::BusCredentials;
pub use log_limit::{LogLimiter, Tally};
