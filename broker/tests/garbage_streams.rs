//! A live server fed generated, damaged and random client streams over real sockets
//! (the parser's generator, `nats-wire/tests/common/streams.rs`) closes each of them
//! cleanly, never panics, and keeps serving a well-behaved client afterwards. The
//! parser's own properties are `nats-wire/tests/parser_props.rs`.

#[path = "../../fuzz/src/parser_check.rs"]
#[allow(dead_code)] // only its op type, which the generator returns
mod parser_check;
#[path = "../../nats-wire/tests/common/streams.rs"]
mod streams;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use broker::testing::damage;
use streams::Gen;
use testkit::DEADLINE;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Panics anywhere in the process, server tasks included: tokio contains a panicking
/// connection task, so without this a crash would look like a closed connection.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

/// Sends `bytes` in chunks, half-closes, and reads until the server closes. Errors
/// are fine (the server may reset a connection it rejected); not closing is not.
async fn blast(
    addr: std::net::SocketAddr,
    bytes: Vec<u8>,
    cuts: Vec<usize>,
) -> std::io::Result<()> {
    let stream = TcpStream::connect(addr).await?;
    let (mut rd, mut wr) = stream.into_split();
    // Drain replies concurrently, so a server answering every PING cannot stall on us.
    let reader = tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = rd.read_to_end(&mut sink).await;
    });
    let mut from = 0;
    for to in cuts.into_iter().chain([bytes.len()]) {
        if wr.write_all(&bytes[from..to]).await.is_err() {
            break;
        }
        from = to;
    }
    let _ = wr.shutdown().await;
    reader.await.map_err(std::io::Error::other)
}

/// The well-behaved client from the protocol's happy path: subscribe, publish to
/// itself, and expect the message before the PONG.
async fn well_behaved_client(addr: std::net::SocketAddr) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut line = String::new();
    rd.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("INFO {"), "expected INFO, got {line:?}");
    wr.write_all(b"CONNECT {\"verbose\":false}\r\nSUB a 1\r\nPUB a 2\r\nhi\r\nPING\r\n")
        .await
        .unwrap();
    for want in ["MSG a 1 2\r\n", "hi\r\n", "PONG\r\n"] {
        loop {
            line.clear();
            rd.read_line(&mut line).await.unwrap();
            // The server's liveness PING may come first; answer it and read on.
            if line != "PING\r\n" {
                break;
            }
            wr.write_all(b"PONG\r\n").await.unwrap();
        }
        assert_eq!(line, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_survives_garbage_and_still_serves_a_good_client() {
    count_panics();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = broker::Server::new(broker::Config::default());
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (server, shutdown) = (server.clone(), shutdown.clone());
        async move { server.run(listener, shutdown).await }
    });

    let mut g = Gen::new(0x5AD0_0C04);
    // Enough in flight to overlap, few enough not to exhaust loopback ports or fds.
    let in_flight = Arc::new(Semaphore::new(32));
    let mut conns = JoinSet::new();
    for case in 0..400 {
        let bytes = match case % 4 {
            0 => g.garbage(),
            1 => g.stream(6).0,
            _ => g.mutated(),
        };
        let cuts = g.cuts(bytes.len());
        let permit = in_flight.clone().acquire_owned().await.unwrap();
        conns.spawn(async move {
            let outcome = tokio::time::timeout(DEADLINE, blast(addr, bytes.clone(), cuts)).await;
            drop(permit);
            (case, bytes, outcome)
        });
    }
    while let Some(joined) = conns.join_next().await {
        let (case, bytes, outcome) = joined.unwrap();
        assert!(
            outcome.is_ok(),
            "case {case}: connection not closed within {DEADLINE:?} after EOF; sent b\"{}\"",
            bytes.escape_ascii()
        );
    }

    tokio::time::timeout(DEADLINE, well_behaved_client(addr))
        .await
        .expect("well-behaved client not served in time");
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "something panicked; see stderr"
    );

    shutdown.cancel();
    tokio::time::timeout(DEADLINE, running)
        .await
        .expect("server did not stop in time")
        .unwrap()
        .unwrap();
}
