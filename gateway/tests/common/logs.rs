//! What the code under test logs, for tests that check an error is reported (a refused
//! bus login only shows in the gate's log: the gate keeps retrying).
//!
//! One subscriber for the whole test binary (tracing has one global default), sending
//! each event as one line to every [`Logs`] listening at the time; tests running in
//! parallel see each other's lines, so a test waits for a line only it can cause (one
//! naming its own server's address).

use std::io;
use std::sync::{LazyLock, Once};

use tokio::sync::broadcast;
use tracing_subscriber::fmt::MakeWriter;

/// Lines kept for a listener that falls behind.
const BACKLOG: usize = 1024;

static LINES: LazyLock<broadcast::Sender<String>> = LazyLock::new(|| broadcast::channel(BACKLOG).0);

static SUBSCRIBER: Once = Once::new();

/// Lines logged from now on.
pub struct Logs(broadcast::Receiver<String>);

impl Logs {
    /// Starts listening (and logging, the first time).
    pub fn listen() -> Logs {
        let logs = Logs(LINES.subscribe());
        SUBSCRIBER.call_once(|| {
            tracing_subscriber::fmt()
                .with_writer(Lines)
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .init();
        });
        logs
    }

    /// The first line from now on holding every one of `needles`, within the tests'
    /// deadline.
    pub async fn wait_for(&mut self, needles: &[&str]) -> String {
        super::within(async {
            loop {
                match self.0.recv().await {
                    Ok(line) if needles.iter().all(|n| line.contains(n)) => return line,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => unreachable!("never closed"),
                }
            }
        })
        .await
    }
}

#[derive(Clone, Copy)]
struct Lines;

impl<'a> MakeWriter<'a> for Lines {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line(Vec::new())
    }
}

/// One event, sent when the formatter is done with it.
struct Line(Vec<u8>);

impl io::Write for Line {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let line = String::from_utf8_lossy(&self.0).trim_end().to_owned();
        // No listener is fine: nobody is waiting for anything.
        let _ = LINES.send(line);
    }
}
