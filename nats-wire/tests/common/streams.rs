//! A generator of client-op streams for the parser's property tests: valid streams
//! together with the ops they hold, the same damaged a few bytes at a time, and
//! garbage made mostly of protocol fragments. Shared by `nats-wire/tests/parser_props.rs`
//! (the parser alone) and `broker/tests/garbage_streams.rs` (a live server), which
//! include it by path; each provides `crate::damage` and `crate::parser_check`.

use fastrand::Rng;

use crate::damage::damage;
use crate::parser_check::OwnedOp;

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
pub struct Gen {
    pub rng: Rng,
}

impl Gen {
    pub fn new(seed: u64) -> Gen {
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
    pub fn stream(&mut self, max_ops: usize) -> (Vec<u8>, Vec<OwnedOp>) {
        let mut bytes = Vec::new();
        let ops = (0..self.rng.usize(1..=max_ops))
            .map(|_| self.op(&mut bytes))
            .collect();
        (bytes, ops)
    }

    /// A valid stream damaged by a few byte-level edits.
    pub fn mutated(&mut self) -> Vec<u8> {
        let (mut bytes, _) = self.stream(6);
        damage(&mut self.rng, &mut bytes, &FRAGMENTS, interesting_byte);
        bytes
    }

    /// Random bytes, mostly protocol fragments.
    pub fn garbage(&mut self) -> Vec<u8> {
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
    pub fn cuts(&mut self, len: usize) -> Vec<usize> {
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
