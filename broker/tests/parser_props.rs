//! Seeded property tests for the client-protocol parser, a few seconds long so they run
//! on every CI pass; the open-ended search is `scripts/fuzz.sh`, which checks the same
//! oracle (`fuzz/src/parser_check.rs`, included below) under libFuzzer.
//!
//! Three properties: generated valid op sequences come back exactly, however the stream
//! is split; mutated and random streams never panic the parser and always end in a
//! bounded number of steps; and a live server fed such streams over real sockets keeps
//! serving a well-behaved client afterwards. Seeds are fixed so a failure reproduces.

#[path = "../../fuzz/src/parser_check.rs"]
mod parser_check;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use broker::config::{DEFAULT_MAX_CONTROL_LINE, DEFAULT_MAX_PAYLOAD};
use broker::parser::Limits;
use broker::testing::damage::{damage, replayable};
use fastrand::Rng;
use parser_check::{End, OwnedOp, check_stream, cuts_for, feed_in_chunks, limits_from_byte};
use testkit::DEADLINE;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The server's defaults, so generated traffic is what a real client may send.
const LIMITS: Limits = Limits {
    max_control_line: DEFAULT_MAX_CONTROL_LINE,
    max_payload: DEFAULT_MAX_PAYLOAD,
};

/// Protocol fragments that random streams are built from, so that garbage often gets
/// past the verb and exercises argument, size and payload handling.
const FRAGMENTS: [&[u8]; 18] = [
    b"PUB ",
    b"HPUB ",
    b"SUB ",
    b"UNSUB ",
    b"PING",
    b"PONG",
    b"CONNECT ",
    b"INFO ",
    b"+OK",
    b"-ERR ",
    b"\r\n",
    b"\n",
    b" ",
    b"\t",
    b"foo.bar",
    b"12",
    b"0",
    b"NATS/1.0\r\n\r\n",
];

/// Generates ops and their wire form, varying everything the grammar allows: verb
/// case, separator runs, trailing blanks, bare `\n` line ends, leading zeros in sizes.
struct Gen {
    rng: Rng,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::with_seed(seed),
        }
    }

    /// An argument: 1 to 12 bytes, none a separator or line end.
    fn word(&mut self) -> Vec<u8> {
        let len = self.rng.usize(1..=12);
        (0..len)
            .map(|_| match self.rng.u8(..4) {
                0 => self.rng.u8(0x21..=0xff),
                _ => self.rng.alphanumeric() as u8,
            })
            .collect()
    }

    fn subject(&mut self) -> Vec<u8> {
        let tokens = self.rng.usize(1..=4);
        let mut s = Vec::new();
        for i in 0..tokens {
            if i > 0 {
                s.push(b'.');
            }
            match self.rng.u8(..8) {
                0 => s.push(b'*'),
                1 if i + 1 == tokens => s.push(b'>'),
                _ => s.extend(self.word().into_iter().filter(|&b| b != b'.')),
            }
        }
        // Filtering dots can empty a token; the parser does not care, so neither do we,
        // as long as the subject is not empty.
        if s.is_empty() {
            s.push(b'x');
        }
        s
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = match self.rng.u8(..16) {
            0 => 0,
            1 => self.rng.usize(..=max),
            _ => self.rng.usize(..=max.min(64)),
        };
        (0..len).map(|_| self.rng.u8(..)).collect()
    }

    fn verb(&mut self, verb: &str, out: &mut Vec<u8>) {
        for b in verb.bytes() {
            out.push(if self.rng.bool() {
                b.to_ascii_lowercase()
            } else {
                b
            });
        }
    }

    fn sep(&mut self, out: &mut Vec<u8>) {
        for _ in 0..self.rng.usize(1..=3) {
            out.push(if self.rng.u8(..4) == 0 { b'\t' } else { b' ' });
        }
    }

    fn size(&mut self, n: u64, out: &mut Vec<u8>) {
        for _ in 0..self.rng.usize(..3).saturating_sub(1) {
            out.push(b'0');
        }
        out.extend_from_slice(n.to_string().as_bytes());
    }

    fn end_line(&mut self, out: &mut Vec<u8>) {
        if self.rng.u8(..4) == 0 {
            self.sep(out);
        }
        out.extend_from_slice(if self.rng.u8(..4) == 0 {
            b"\n"
        } else {
            b"\r\n"
        });
    }

    /// Appends one random op to `out` and returns what the parser must make of it.
    fn op(&mut self, out: &mut Vec<u8>) -> OwnedOp {
        match self.rng.u8(..9) {
            0 | 1 => {
                let (subject, reply, payload) = (self.subject(), self.opt_word(), self.bytes(4096));
                self.verb("PUB", out);
                self.sep(out);
                out.extend_from_slice(&subject);
                if let Some(reply) = &reply {
                    self.sep(out);
                    out.extend_from_slice(reply);
                }
                self.sep(out);
                self.size(payload.len() as u64, out);
                self.end_line(out);
                out.extend_from_slice(&payload);
                out.extend_from_slice(b"\r\n");
                OwnedOp::Pub {
                    subject,
                    reply,
                    headers: None,
                    payload,
                }
            }
            2 => {
                let (subject, reply, payload) = (self.subject(), self.opt_word(), self.bytes(1024));
                let mut headers = b"NATS/1.0\r\n".to_vec();
                for _ in 0..self.rng.usize(..3) {
                    headers.extend_from_slice(&self.word());
                    headers.extend_from_slice(b": ");
                    headers.extend_from_slice(&self.word());
                    headers.extend_from_slice(b"\r\n");
                }
                headers.extend_from_slice(b"\r\n");
                self.verb("HPUB", out);
                self.sep(out);
                out.extend_from_slice(&subject);
                if let Some(reply) = &reply {
                    self.sep(out);
                    out.extend_from_slice(reply);
                }
                self.sep(out);
                self.size(headers.len() as u64, out);
                self.sep(out);
                self.size((headers.len() + payload.len()) as u64, out);
                self.end_line(out);
                out.extend_from_slice(&headers);
                out.extend_from_slice(&payload);
                out.extend_from_slice(b"\r\n");
                OwnedOp::Pub {
                    subject,
                    reply,
                    headers: Some(headers),
                    payload,
                }
            }
            3 => {
                let (subject, queue, sid) = (self.subject(), self.opt_word(), self.word());
                self.verb("SUB", out);
                self.sep(out);
                out.extend_from_slice(&subject);
                if let Some(queue) = &queue {
                    self.sep(out);
                    out.extend_from_slice(queue);
                }
                self.sep(out);
                out.extend_from_slice(&sid);
                self.end_line(out);
                OwnedOp::Sub {
                    subject,
                    queue,
                    sid,
                }
            }
            4 => {
                let sid = self.word();
                let max = self
                    .rng
                    .bool()
                    .then(|| self.rng.u64(..10_000_000_000_000_000_000));
                self.verb("UNSUB", out);
                self.sep(out);
                out.extend_from_slice(&sid);
                if let Some(max) = max {
                    self.sep(out);
                    out.extend_from_slice(max.to_string().as_bytes());
                }
                self.end_line(out);
                OwnedOp::Unsub { sid, max }
            }
            5 => {
                let json = format!(
                    r#"{{"verbose":{},"name":"{}", "lang":"rust"}}"#,
                    self.rng.bool(),
                    self.rng.alphanumeric()
                )
                .into_bytes();
                self.verb("CONNECT", out);
                self.sep(out);
                out.extend_from_slice(&json);
                self.end_line(out);
                OwnedOp::Connect(json)
            }
            6 => self.bare("PING", OwnedOp::Ping, out),
            7 => self.bare("PONG", OwnedOp::Pong, out),
            _ => self.bare("+OK", OwnedOp::Ok, out),
        }
    }

    /// A verb that ignores whatever follows it on the line.
    fn bare(&mut self, verb: &str, op: OwnedOp, out: &mut Vec<u8>) -> OwnedOp {
        self.verb(verb, out);
        if self.rng.u8(..4) == 0 {
            self.sep(out);
            out.extend_from_slice(&self.word());
        }
        self.end_line(out);
        op
    }

    fn opt_word(&mut self) -> Option<Vec<u8>> {
        self.rng.bool().then(|| self.word())
    }

    /// A valid stream of up to `max_ops` ops and the ops it holds.
    fn stream(&mut self, max_ops: usize) -> (Vec<u8>, Vec<OwnedOp>) {
        let mut bytes = Vec::new();
        let ops = (0..self.rng.usize(1..=max_ops))
            .map(|_| self.op(&mut bytes))
            .collect();
        (bytes, ops)
    }

    /// A valid stream damaged by a few byte-level edits.
    fn mutated(&mut self) -> Vec<u8> {
        let (mut bytes, _) = self.stream(6);
        damage(&mut self.rng, &mut bytes, &FRAGMENTS, interesting_byte);
        bytes
    }

    /// Random bytes, mostly protocol fragments.
    fn garbage(&mut self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..self.rng.usize(..48) {
            if self.rng.bool() {
                bytes.extend_from_slice(FRAGMENTS[self.rng.usize(..FRAGMENTS.len())]);
            } else {
                bytes.push(self.interesting_byte());
            }
        }
        bytes
    }

    fn interesting_byte(&mut self) -> u8 {
        interesting_byte(&mut self.rng)
    }

    /// A few ascending cut points inside `len` bytes.
    fn cuts(&mut self, len: usize) -> Vec<usize> {
        let mut cuts: Vec<usize> = (0..self.rng.usize(..6))
            .map(|_| self.rng.usize(..=len))
            .collect();
        cuts.sort_unstable();
        cuts
    }
}

/// A byte the parser treats specially half the time, any byte otherwise.
fn interesting_byte(rng: &mut Rng) -> u8 {
    const SPECIAL: &[u8] = b" \t\r\n0123456789.*>";
    if rng.bool() {
        SPECIAL[rng.usize(..SPECIAL.len())]
    } else {
        rng.u8(..)
    }
}

#[test]
fn generated_ops_round_trip_however_the_stream_is_split() {
    let mut g = Gen::new(0x5AD0_0C01);
    for case in 0..1000 {
        let (bytes, ops) = g.stream(12);
        let cuts = g.cuts(bytes.len());
        replayable(case, &bytes, || {
            let whole = check_stream(&bytes, &LIMITS);
            assert_eq!(whole.ops, ops);
            assert_eq!(whole.end, End::NeedMore { pending: 0 });
            assert_eq!(
                feed_in_chunks(&bytes, &cuts, &LIMITS),
                whole,
                "cuts {cuts:?}"
            );
        });
    }
}

#[test]
fn every_single_split_of_a_stream_gives_the_same_ops() {
    let mut g = Gen::new(0x5AD0_0C02);
    for case in 0..20 {
        let (bytes, ops) = g.stream(4);
        replayable(case, &bytes, || {
            for cut in 0..=bytes.len() {
                let run = feed_in_chunks(&bytes, &[cut], &LIMITS);
                assert_eq!(run.ops, ops, "cut at {cut}");
                assert_eq!(run.end, End::NeedMore { pending: 0 });
            }
        });
    }
}

#[test]
fn damaged_and_random_streams_end_cleanly_in_bounded_steps() {
    let mut g = Gen::new(0x5AD0_0C03);
    for case in 0..10_000 {
        let bytes = if case % 3 == 0 {
            g.garbage()
        } else {
            g.mutated()
        };
        // Small limits half the time, so that the limit paths are reached too.
        let limits = if case % 2 == 0 {
            LIMITS
        } else {
            limits_from_byte(g.rng.u8(..))
        };
        replayable(case, &bytes, || {
            // Each step is asserted to use at least one byte, so the run is bounded by
            // the length; the chunked run must agree with it.
            let whole = check_stream(&bytes, &limits);
            assert!(whole.ops.len() <= bytes.len());
            for count in [1, 4] {
                let cuts = cuts_for(&bytes, count);
                assert_eq!(
                    feed_in_chunks(&bytes, &cuts, &limits),
                    whole,
                    "cuts {cuts:?}"
                );
            }
        });
    }
}

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
