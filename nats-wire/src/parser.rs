//! The client-protocol parser: bytes in, one [`ClientOp`] out.
//!
//! It is pure and cancel-safe: [`parse`] looks at a buffer, and either returns an op
//! borrowing from it together with the number of bytes it used, or `Ok(None)` when more
//! bytes are needed, without consuming anything. The caller advances its buffer. Ops
//! borrow the buffer instead of copying, so routing a message costs no allocation.
//!
//! Errors map onto what nats-server does (see `ParseError::err_text`): some get an
//! `-ERR` before the close, malformed arguments close silently.

use memchr::memchr;

mod server_ops;

pub use server_ops::{ServerOp, parse_server};

/// Largest message payload a client may publish (nats-server's default, 1 MiB).
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;
/// Longest protocol control line (verb and arguments) nats-server accepts by default.
pub const DEFAULT_MAX_CONTROL_LINE: usize = 4096;

/// An operation a client sent. Slices borrow the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp<'a> {
    /// `CONNECT {json}`: the raw JSON, decoded by the connection.
    Connect(&'a [u8]),
    /// `PUB` or `HPUB`; `headers` is empty for a plain `PUB`.
    Pub {
        subject: &'a [u8],
        reply: Option<&'a [u8]>,
        headers: Option<&'a [u8]>,
        payload: &'a [u8],
    },
    /// `SUB <subject> [queue] <sid>`.
    Sub {
        subject: &'a [u8],
        queue: Option<&'a [u8]>,
        sid: &'a [u8],
    },
    /// `UNSUB <sid> [max]`.
    Unsub {
        sid: &'a [u8],
        max: Option<u64>,
    },
    Ping,
    Pong,
    /// `+OK` from a client is accepted and ignored.
    Ok,
    /// `INFO` from a client is accepted and ignored.
    Info,
}

/// Why a buffer could not be parsed. Every variant closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("unknown protocol operation")]
    UnknownOp,
    #[error("control line longer than the maximum")]
    MaxControlLine,
    #[error("payload larger than the maximum")]
    MaxPayload,
    /// Arguments a well-behaved client never sends; closed without an `-ERR`.
    #[error("malformed arguments")]
    Malformed,
    /// The client sent `-ERR`; nats-server closes such a client.
    #[error("client sent -ERR")]
    ClientErr,
}

impl ParseError {
    /// The `-ERR` text nats-server sends before closing, if any.
    pub fn err_text(self) -> Option<&'static str> {
        match self {
            ParseError::UnknownOp => Some("Unknown Protocol Operation"),
            ParseError::MaxControlLine => Some("maximum control line exceeded"),
            ParseError::MaxPayload => Some("Maximum Payload Violation"),
            ParseError::Malformed | ParseError::ClientErr => None,
        }
    }
}

/// The limits the parser enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_control_line: usize,
    pub max_payload: usize,
}

/// Parses one op from the front of `buf`.
///
/// Returns the op and the bytes it spans (control line, payload and trailing CRLF), or
/// `Ok(None)` if `buf` holds only part of an op. A control line longer than the limit is
/// an error even before its newline arrives, so a peer cannot make us buffer without
/// bound by never sending one.
pub fn parse<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(ClientOp<'a>, usize)>, ParseError> {
    let Some((line, after_line)) = control_line(buf, limits)? else {
        return Ok(None);
    };
    let (verb, rest) = split_verb(line);

    // PING, PONG and +OK ignore anything after the verb, as nats-server does.
    if starts_with_ci(verb, b"PING") {
        return Ok(Some((ClientOp::Ping, after_line)));
    }
    if starts_with_ci(verb, b"PONG") {
        return Ok(Some((ClientOp::Pong, after_line)));
    }
    if starts_with_ci(verb, b"+OK") {
        return Ok(Some((ClientOp::Ok, after_line)));
    }
    if starts_with_ci(verb, b"-ERR") {
        return Err(ParseError::ClientErr);
    }
    // The other verbs must be followed by arguments.
    let Some(rest) = rest else {
        return Err(ParseError::UnknownOp);
    };
    if verb.eq_ignore_ascii_case(b"PUB") {
        parse_pub(buf, after_line, rest, limits)
    } else if verb.eq_ignore_ascii_case(b"HPUB") {
        parse_hpub(buf, after_line, rest, limits)
    } else if verb.eq_ignore_ascii_case(b"SUB") {
        let mut args = Args::new(rest);
        let op = match (args.next(), args.next(), args.next(), args.next()) {
            (Some(subject), Some(sid), None, None) => ClientOp::Sub {
                subject,
                queue: None,
                sid,
            },
            (Some(subject), Some(queue), Some(sid), None) => ClientOp::Sub {
                subject,
                queue: Some(queue),
                sid,
            },
            _ => return Err(ParseError::Malformed),
        };
        Ok(Some((op, after_line)))
    } else if verb.eq_ignore_ascii_case(b"UNSUB") {
        let mut args = Args::new(rest);
        let op = match (args.next(), args.next(), args.next()) {
            (Some(sid), None, None) => ClientOp::Unsub { sid, max: None },
            (Some(sid), Some(max), None) => ClientOp::Unsub {
                sid,
                max: Some(parse_size(max)?),
            },
            _ => return Err(ParseError::Malformed),
        };
        Ok(Some((op, after_line)))
    } else if verb.eq_ignore_ascii_case(b"CONNECT") {
        Ok(Some((ClientOp::Connect(trim(rest)), after_line)))
    } else if verb.eq_ignore_ascii_case(b"INFO") {
        Ok(Some((ClientOp::Info, after_line)))
    } else {
        Err(ParseError::UnknownOp)
    }
}

/// The control line at the front of `buf` (without its CRLF) and where what follows it
/// starts, or `None` while its newline has not arrived. A line longer than the limit is
/// an error even before its newline arrives, so a peer cannot make us buffer without
/// bound by never sending one.
fn control_line<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(&'a [u8], usize)>, ParseError> {
    let Some(nl) = memchr(b'\n', buf) else {
        return if buf.len() > limits.max_control_line + 1 {
            Err(ParseError::MaxControlLine)
        } else {
            Ok(None)
        };
    };
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    if line.len() > limits.max_control_line {
        return Err(ParseError::MaxControlLine);
    }
    Ok(Some((line, nl + 1)))
}

/// The header and total sizes of an `HPUB`/`HMSG`: the total checked against the
/// payload limit, the header no larger than the total.
fn header_sizes(hdr: &[u8], total: &[u8], limits: &Limits) -> Result<(usize, usize), ParseError> {
    let hdr = parse_size(hdr)?;
    let total = payload_size(total, limits)?;
    if hdr > total as u64 {
        return Err(ParseError::Malformed);
    }
    // No larger than `total`, which is a usize.
    Ok((hdr as usize, total))
}

fn parse_pub<'a>(
    buf: &'a [u8],
    start: usize,
    rest: &'a [u8],
    limits: &Limits,
) -> Result<Option<(ClientOp<'a>, usize)>, ParseError> {
    let mut args = Args::new(rest);
    let (subject, reply, size) = match (args.next(), args.next(), args.next(), args.next()) {
        (Some(s), Some(n), None, None) => (s, None, n),
        (Some(s), Some(r), Some(n), None) => (s, Some(r), n),
        _ => return Err(ParseError::Malformed),
    };
    let size = payload_size(size, limits)?;
    Ok(take_payload(buf, start, size)?.map(|(payload, used)| {
        let op = ClientOp::Pub {
            subject,
            reply,
            headers: None,
            payload,
        };
        (op, used)
    }))
}

fn parse_hpub<'a>(
    buf: &'a [u8],
    start: usize,
    rest: &'a [u8],
    limits: &Limits,
) -> Result<Option<(ClientOp<'a>, usize)>, ParseError> {
    let mut args = Args::new(rest);
    let (subject, reply, hdr, total) = match (
        args.next(),
        args.next(),
        args.next(),
        args.next(),
        args.next(),
    ) {
        (Some(s), Some(h), Some(t), None, None) => (s, None, h, t),
        (Some(s), Some(r), Some(h), Some(t), None) => (s, Some(r), h, t),
        _ => return Err(ParseError::Malformed),
    };
    let (hdr, total) = header_sizes(hdr, total, limits)?;
    Ok(take_payload(buf, start, total)?.map(|(all, used)| {
        let (headers, payload) = all.split_at(hdr);
        let op = ClientOp::Pub {
            subject,
            reply,
            headers: Some(headers),
            payload,
        };
        (op, used)
    }))
}

/// Parses a size argument and checks it against the payload limit.
fn payload_size(arg: &[u8], limits: &Limits) -> Result<usize, ParseError> {
    let size = parse_size(arg)?;
    if size > limits.max_payload as u64 {
        return Err(ParseError::MaxPayload);
    }
    // Fits: it is no larger than a usize limit.
    Ok(size as usize)
}

/// The payload of `size` bytes starting at `start`, and the end of its trailing CRLF.
fn take_payload(
    buf: &[u8],
    start: usize,
    size: usize,
) -> Result<Option<(&[u8], usize)>, ParseError> {
    let end = start + size;
    if buf.len() < end + 2 {
        return Ok(None);
    }
    if &buf[end..end + 2] != b"\r\n" {
        return Err(ParseError::UnknownOp);
    }
    Ok(Some((&buf[start..end], end + 2)))
}

/// Digits only, no sign, no overflow.
fn parse_size(arg: &[u8]) -> Result<u64, ParseError> {
    if arg.is_empty() || arg.len() > 19 {
        return Err(ParseError::Malformed);
    }
    arg.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            Ok(n * 10 + u64::from(b - b'0'))
        } else {
            Err(ParseError::Malformed)
        }
    })
}

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Splits the verb off a line; `None` for the rest when no argument follows.
fn split_verb(line: &[u8]) -> (&[u8], Option<&[u8]>) {
    match line.iter().position(|&b| is_space(b)) {
        Some(i) => {
            let rest = trim(&line[i..]);
            (&line[..i], (!rest.is_empty()).then_some(rest))
        }
        None => (line, None),
    }
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| !is_space(b)).unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|&b| !is_space(b))
        .map_or(start, |i| i + 1);
    &s[start..end]
}

fn starts_with_ci(s: &[u8], prefix: &[u8]) -> bool {
    s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// Arguments separated by runs of spaces and tabs.
struct Args<'a> {
    rest: &'a [u8],
}

impl<'a> Args<'a> {
    fn new(rest: &'a [u8]) -> Self {
        Args { rest }
    }
}

impl<'a> Iterator for Args<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| !is_space(b))?;
        let rest = &self.rest[start..];
        let end = rest.iter().position(|&b| is_space(b)).unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small limits, for the tests here and in `server_ops`.
    pub(super) const LIMITS: Limits = Limits {
        max_control_line: 64,
        max_payload: 16,
    };

    fn one(input: &[u8]) -> Result<Option<(ClientOp<'_>, usize)>, ParseError> {
        parse(input, &LIMITS)
    }

    #[test]
    fn pub_with_and_without_reply() {
        let (op, n) = one(b"PUB foo 5\r\nhello\r\nrest").unwrap().unwrap();
        assert_eq!(n, 18);
        assert_eq!(
            op,
            ClientOp::Pub {
                subject: b"foo",
                reply: None,
                headers: None,
                payload: b"hello"
            }
        );
        let (op, _) = one(b"pub foo  _INBOX.1\t2\r\nhi\r\n").unwrap().unwrap();
        assert_eq!(
            op,
            ClientOp::Pub {
                subject: b"foo",
                reply: Some(b"_INBOX.1"),
                headers: None,
                payload: b"hi"
            }
        );
    }

    #[test]
    fn every_prefix_of_a_message_is_incomplete() {
        let full = b"HPUB foo r 12 14\r\nNATS/1.0\r\n\r\nhi\r\n";
        for cut in 0..full.len() {
            assert_eq!(one(&full[..cut]), Ok(None), "cut at {cut}");
        }
        let (op, n) = one(full).unwrap().unwrap();
        assert_eq!(n, full.len());
        assert_eq!(
            op,
            ClientOp::Pub {
                subject: b"foo",
                reply: Some(b"r"),
                headers: Some(b"NATS/1.0\r\n\r\n"),
                payload: b"hi"
            }
        );
    }

    #[test]
    fn sub_unsub_ping_pong_connect() {
        assert_eq!(
            one(b"SUB foo.* q 1\r\n").unwrap().unwrap().0,
            ClientOp::Sub {
                subject: b"foo.*",
                queue: Some(b"q"),
                sid: b"1"
            }
        );
        assert_eq!(
            one(b"sub foo 7\n").unwrap().unwrap(),
            (
                ClientOp::Sub {
                    subject: b"foo",
                    queue: None,
                    sid: b"7"
                },
                10
            )
        );
        assert_eq!(
            one(b"UNSUB 7 3\r\n").unwrap().unwrap().0,
            ClientOp::Unsub {
                sid: b"7",
                max: Some(3)
            }
        );
        assert_eq!(one(b"PING foo\r\n").unwrap().unwrap().0, ClientOp::Ping);
        assert_eq!(one(b"pong\r\n").unwrap().unwrap().0, ClientOp::Pong);
        assert_eq!(one(b"+OK\r\n").unwrap().unwrap().0, ClientOp::Ok);
        assert_eq!(
            one(b"CONNECT {\"a\":1} \r\n").unwrap().unwrap().0,
            ClientOp::Connect(b"{\"a\":1}")
        );
    }

    #[test]
    fn errors_match_nats_server() {
        assert_eq!(one(b"FOO bar\r\n"), Err(ParseError::UnknownOp));
        assert_eq!(one(b"PUB\r\n"), Err(ParseError::UnknownOp));
        assert_eq!(one(b"PUB foo 2\r\nhiX\r\n"), Err(ParseError::UnknownOp));
        assert_eq!(one(b"PUB foo x\r\n"), Err(ParseError::Malformed));
        assert_eq!(one(b"PUB foo\r\n"), Err(ParseError::Malformed));
        assert_eq!(one(b"PUB a b c 1\r\n"), Err(ParseError::Malformed));
        assert_eq!(one(b"PUB foo -1\r\n"), Err(ParseError::Malformed));
        assert_eq!(
            one(b"PUB foo 99999999999999999999\r\n"),
            Err(ParseError::Malformed)
        );
        assert_eq!(one(b"PUB foo 17\r\n"), Err(ParseError::MaxPayload));
        assert_eq!(one(b"HPUB foo 5 4\r\n"), Err(ParseError::Malformed));
        assert_eq!(one(b"SUB foo\r\n"), Err(ParseError::Malformed));
        assert_eq!(one(b"UNSUB 1 x\r\n"), Err(ParseError::Malformed));
        assert_eq!(one(b"-ERR 'x'\r\n"), Err(ParseError::ClientErr));
    }

    #[test]
    fn control_line_limit_holds_before_the_newline_arrives() {
        let long = [b'A'; 70];
        assert_eq!(one(&long[..65]), Ok(None));
        assert_eq!(one(&long), Err(ParseError::MaxControlLine));
        let mut line = b"SUB ".to_vec();
        line.extend_from_slice(&[b'a'; 61]);
        line.extend_from_slice(b"\r\n");
        assert_eq!(one(&line), Err(ParseError::MaxControlLine));
    }
}
