//! The listen backlog at its edge: a listener bound by `net::listen` holds a burst of
//! connections that nobody accepts (tokio's own bind, at 128, would leave most of them
//! retrying their SYNs), and a backlog above the kernel's cap is clamped and logged.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use net::Backlog;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// How long the burst may take: loopback handshakes finish in microseconds, a dropped
/// SYN is retried only after a second, then three more.
const DEADLINE: Duration = Duration::from_secs(10);

/// Connections in the burst: well past tokio's 128, within the default 1,024.
const BURST: usize = 600;

#[tokio::test]
async fn a_burst_of_connections_completes_while_nothing_accepts() {
    let listener = net::listen("127.0.0.1:0", Backlog::default())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    // Where the kernel caps backlogs lower, that cap is the edge (Linux queues one
    // more than the backlog).
    let burst = BURST.min(Backlog::default().effective() as usize + 1);
    let mut connects = JoinSet::new();
    for _ in 0..burst {
        connects.spawn(TcpStream::connect(addr));
    }
    let all = async {
        let mut streams = Vec::with_capacity(burst);
        while let Some(joined) = connects.join_next().await {
            streams.push(joined.unwrap().unwrap());
        }
        streams
    };
    let streams = tokio::time::timeout(DEADLINE, all)
        .await
        .expect("handshakes still waiting: the backlog dropped SYNs");
    assert_eq!(streams.len(), burst);
    drop(listener);
}

/// A log sink the test reads back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_backlog_above_somaxconn_is_clamped_and_logged() {
    let Some(max) = net::listen::somaxconn() else {
        panic!("no /proc/sys/net/core/somaxconn to clamp to");
    };
    let asked = Backlog::new(max + 1).unwrap();
    assert_eq!(asked.effective(), max);
    let within = Backlog::new(max).unwrap();
    assert_eq!(within.effective(), max);

    let log = Captured::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            net::listen("127.0.0.1:0", within).await.unwrap();
            assert!(
                log.0.lock().unwrap().is_empty(),
                "a backlog within the cap logged"
            );
            net::listen("127.0.0.1:0", asked).await.unwrap();
        });
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains(" INFO "), "{text}");
    assert!(text.contains("clamped"), "{text}");
    assert!(text.contains(&format!("effective={max}")), "{text}");
}
