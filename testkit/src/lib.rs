//! The workspace's test kit, one of each piece every test suite needs: a launcher for
//! child processes that waits on their log lines ([`Process`]), a NATS server process on
//! a random port built on it ([`NatsServer`]: nats-server, or our `broker` binary, which
//! takes the same flags), and one deadline for every wait ([`DEADLINE`], [`within`]).
//!
//! A crate of its own rather than a feature of the broker: nothing here is about our
//! broker, so whatever starts processes (every crate's tests, and the load tester)
//! takes it without linking a broker's test feature. The buses tests run on (our broker
//! in-process, or nats-server) and `on_both_buses!` are `broker::testing`, built on this.
//!
//! [`copies`] starts copies of this program that each do a share of one job and say how
//! it went in JSON lines (the load tester past one process's open-file limit).
//!
//! [`fleet`] launches a whole fleet of `shaddock` processes (a broker or a nats-server
//! cluster, gates, workers) on [`Process`]: the root fleet tests and the load tester's
//! scenarios run on it. [`Cut`] is a TCP hop a test (or the load tester) cuts, as a
//! dropped link would; [`Pki`] a throwaway CA and the certificates it signed.
//!
//! [`fleet`] returns errors (the load tester reports them); everything else panics on
//! failure, with the process's log: it is test code, and a panic is how a test fails.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub mod copies;
mod cut;
pub mod fleet;
mod nats;
mod pki;
mod process;

pub use cut::Cut;
pub use nats::{NatsServer, find_go_binary, go_binary, nats_server_path};
pub use pki::{CertFiles, Pki};
pub use process::{Process, word_after};

/// How long any single wait in a test may take before the test fails. Only a failing
/// test (a hang) ever reaches a deadline, so a long one costs a passing run nothing,
/// while one too short fails honest runs: it is set for the slowest honest wait, not the
/// usual one. That is a debug build of a process starting, or a 3-node nats-server
/// cluster meshing, on a two-core CI machine that other test binaries and builds load
/// at the same time; the fleet tests needed 20 s there, so every wait gets 20 s, and a
/// hang is still reported well within a minute.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Awaits `future`, failing the test after [`DEADLINE`].
pub async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("timed out waiting")
}

/// Writes `contents` to a fresh file in the temp dir, readable by this user only (it may
/// be a private key), and returns its path.
pub fn temp_file(name: &str, contents: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("shaddock-test-{}-{n}-{name}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| file.write_all(contents.as_bytes()))
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}
