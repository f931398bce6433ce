//! The parser's contract as executable checks, shared by the libFuzzer target
//! (`fuzz_targets/parser.rs`) and the seeded CI test (`nats-wire/tests/parser_props.rs`,
//! which includes this file by path) so both hold the parser to one oracle.
//!
//! Everything here panics on a violation: under libFuzzer a panic is a crash report
//! with the input, under `cargo test` a failure.

use nats_wire::{ClientOp, Limits, ParseError, parse};

/// An op copied out of the buffer, so that runs over different buffers (one-shot and
/// chunked) can be compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedOp {
    Connect(Vec<u8>),
    Pub {
        subject: Vec<u8>,
        reply: Option<Vec<u8>>,
        headers: Option<Vec<u8>>,
        payload: Vec<u8>,
    },
    Sub {
        subject: Vec<u8>,
        queue: Option<Vec<u8>>,
        sid: Vec<u8>,
    },
    Unsub {
        sid: Vec<u8>,
        max: Option<u64>,
    },
    Ping,
    Pong,
    Ok,
    Info,
}

impl OwnedOp {
    pub fn from_op(op: &ClientOp<'_>) -> OwnedOp {
        let own = |s: &[u8]| s.to_vec();
        match *op {
            ClientOp::Connect(json) => OwnedOp::Connect(own(json)),
            ClientOp::Pub {
                subject,
                reply,
                headers,
                payload,
            } => OwnedOp::Pub {
                subject: own(subject),
                reply: reply.map(own),
                headers: headers.map(own),
                payload: own(payload),
            },
            ClientOp::Sub {
                subject,
                queue,
                sid,
            } => OwnedOp::Sub {
                subject: own(subject),
                queue: queue.map(own),
                sid: own(sid),
            },
            ClientOp::Unsub { sid, max } => OwnedOp::Unsub { sid: own(sid), max },
            ClientOp::Ping => OwnedOp::Ping,
            ClientOp::Pong => OwnedOp::Pong,
            ClientOp::Ok => OwnedOp::Ok,
            ClientOp::Info => OwnedOp::Info,
        }
    }
}

/// How a stream ended once no further op could be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The parser wants more bytes; `pending` of them are buffered and unconsumed.
    NeedMore { pending: usize },
    /// The connection would be closed.
    Error(ParseError),
}

/// Every op a stream yields, in order, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub ops: Vec<OwnedOp>,
    pub end: End,
}

/// Limits chosen by one byte of fuzz input. Small values are included so that inputs
/// of a few hundred bytes reach the limit checks, and the defaults so that real-sized
/// traffic is covered too.
pub fn limits_from_byte(b: u8) -> Limits {
    const CONTROL_LINES: [usize; 4] = [8, 32, 128, 4096];
    const PAYLOADS: [usize; 4] = [0, 16, 256, 1024 * 1024];
    Limits {
        max_control_line: CONTROL_LINES[usize::from(b & 3)],
        max_payload: PAYLOADS[usize::from((b >> 2) & 3)],
    }
}

/// Parses all of `buf` the way a connection does (advance by the used length; stop on
/// `Ok(None)` or an error), checking every step against the contract.
pub fn check_stream(buf: &[u8], limits: &Limits) -> Run {
    let mut ops = Vec::new();
    let mut pos = 0;
    loop {
        let rest = &buf[pos..];
        let result = parse(rest, limits);
        check_prefixes(rest, limits, &result);
        match result {
            Ok(Some((op, used))) => {
                check_op(rest, limits, &op, used);
                ops.push(OwnedOp::from_op(&op));
                pos += used;
            }
            Ok(None) => {
                assert!(
                    incomplete_is_justified(rest, limits),
                    "Ok(None) although a full op or an error is due at offset {pos}"
                );
                return Run {
                    ops,
                    end: End::NeedMore {
                        pending: rest.len(),
                    },
                };
            }
            Err(e) => {
                return Run {
                    ops,
                    end: End::Error(e),
                };
            }
        }
    }
}

/// Feeds `buf` to a growing read buffer in chunks ending at `cuts` (ascending offsets),
/// draining what each parse used, as a connection whose reads return those chunks does.
/// Its ops must equal a one-shot parse of the concatenation.
pub fn feed_in_chunks(buf: &[u8], cuts: &[usize], limits: &Limits) -> Run {
    let mut ops = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut fed = 0;
    for end in cuts.iter().copied().chain(std::iter::once(buf.len())) {
        let end = end.clamp(fed, buf.len());
        pending.extend_from_slice(&buf[fed..end]);
        fed = end;
        let mut used_total = 0;
        loop {
            match parse(&pending[used_total..], limits) {
                Ok(Some((op, used))) => {
                    ops.push(OwnedOp::from_op(&op));
                    used_total += used;
                }
                Ok(None) => break,
                Err(e) => {
                    return Run {
                        ops,
                        end: End::Error(e),
                    };
                }
            }
        }
        pending.drain(..used_total);
    }
    Run {
        ops,
        end: End::NeedMore {
            pending: pending.len(),
        },
    }
}

/// Cut points derived from the bytes themselves (FNV-1a), so a fuzz input or a test
/// case always splits the same way.
pub fn cuts_for(buf: &[u8], count: usize) -> Vec<usize> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in buf {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut cuts: Vec<usize> = (0..count)
        .map(|i| {
            h = h.rotate_left(17).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64;
            (h % (buf.len() as u64 + 1)) as usize
        })
        .collect();
    cuts.sort_unstable();
    cuts
}

/// A prefix of the buffer must say "need more" until it holds the whole op (or the
/// whole reason for the error), and from then on say exactly what the full buffer
/// says. This is what makes the parser independent of how reads split the stream.
fn check_prefixes(
    rest: &[u8],
    limits: &Limits,
    full: &Result<Option<(ClientOp<'_>, usize)>, ParseError>,
) {
    match full {
        Ok(Some((op, used))) => {
            for k in 0..*used {
                assert_eq!(
                    parse(&rest[..k], limits),
                    Ok(None),
                    "prefix of {k} bytes of a {used}-byte op is not incomplete"
                );
            }
            let exact = parse(&rest[..*used], limits);
            assert_eq!(
                exact.as_ref().map(|r| r.as_ref().map(|(o, n)| (o, *n))),
                Ok(Some((op, *used))),
                "op parsed differently without the bytes after it"
            );
        }
        Err(e) => {
            // The first prefix that is not "need more" must already be this error.
            for k in 0..=rest.len() {
                match parse(&rest[..k], limits) {
                    Ok(None) => continue,
                    other => {
                        assert_eq!(other, Err(*e), "prefix of {k} bytes disagrees");
                        break;
                    }
                }
            }
        }
        // Any prefix of an incomplete op is incomplete: nothing new to check.
        Ok(None) => {}
    }
}

/// Checks what one successful parse returned against the bytes it spans.
fn check_op(rest: &[u8], limits: &Limits, op: &ClientOp<'_>, used: usize) {
    assert!(used > 0, "parse used no bytes: a connection would spin");
    assert!(used <= rest.len(), "used {used} of {} bytes", rest.len());
    let span = &rest[..used];
    let nl = span
        .iter()
        .position(|&b| b == b'\n')
        .expect("an op without a newline");
    let line = span[..nl].strip_suffix(b"\r").unwrap_or(&span[..nl]);
    assert!(
        line.len() <= limits.max_control_line,
        "control line over the limit"
    );
    let arg = |name: &str, s: &[u8]| {
        assert!(within(s, line), "{name} is outside the control line");
        assert!(!s.is_empty(), "{name} is empty");
        assert!(
            !s.iter().any(|&b| b == b' ' || b == b'\t'),
            "{name} holds a separator"
        );
    };
    match *op {
        ClientOp::Pub {
            subject,
            reply,
            headers,
            payload,
        } => {
            arg("subject", subject);
            if let Some(reply) = reply {
                arg("reply", reply);
            }
            let body = &span[nl + 1..used - 2];
            assert_eq!(&span[used - 2..], b"\r\n", "payload not followed by CRLF");
            let hdr_len = headers.map_or(0, <[u8]>::len);
            assert_eq!(hdr_len + payload.len(), body.len(), "body length mismatch");
            assert!(body.len() <= limits.max_payload, "payload over the limit");
            if let Some(headers) = headers {
                assert!(within(headers, body), "headers outside the body");
                assert_eq!(
                    headers.as_ptr(),
                    body.as_ptr(),
                    "headers do not lead the body"
                );
            }
            assert!(within(payload, body), "payload outside the body");
            assert_eq!(
                payload.as_ptr_range().end,
                body.as_ptr_range().end,
                "payload does not end the body"
            );
        }
        ClientOp::Sub {
            subject,
            queue,
            sid,
        } => {
            arg("subject", subject);
            if let Some(queue) = queue {
                arg("queue", queue);
            }
            arg("sid", sid);
            assert_eq!(used, nl + 1);
        }
        ClientOp::Unsub { sid, .. } => {
            arg("sid", sid);
            assert_eq!(used, nl + 1);
        }
        ClientOp::Connect(json) => {
            assert!(within(json, line), "CONNECT json outside the control line");
            assert!(!json.is_empty(), "CONNECT without json");
            assert_eq!(used, nl + 1);
        }
        ClientOp::Ping | ClientOp::Pong | ClientOp::Ok | ClientOp::Info => {
            assert_eq!(used, nl + 1);
        }
    }
}

/// An independent reading of the framing rules: `Ok(None)` is right only while no
/// newline has arrived and the line could still fit, or while a PUB/HPUB whose control
/// line is complete and well formed still waits for its payload and CRLF.
pub fn incomplete_is_justified(rest: &[u8], limits: &Limits) -> bool {
    let window = &rest[..rest.len().min(limits.max_control_line + 2)];
    let Some(nl) = window.iter().position(|&b| b == b'\n') else {
        return rest.len() <= limits.max_control_line + 1;
    };
    let line = rest[..nl].strip_suffix(b"\r").unwrap_or(&rest[..nl]);
    if line.len() > limits.max_control_line {
        return false;
    }
    let words: Vec<&[u8]> = line
        .split(|&b| b == b' ' || b == b'\t')
        .filter(|w| !w.is_empty())
        .collect();
    let Some((verb, args)) = words.split_first() else {
        return false;
    };
    let sizes_at = if verb.eq_ignore_ascii_case(b"PUB") && (2..=3).contains(&args.len()) {
        args.len() - 1
    } else if verb.eq_ignore_ascii_case(b"HPUB") && (3..=4).contains(&args.len()) {
        args.len() - 2
    } else {
        return false;
    };
    let sizes: Option<Vec<u64>> = args[sizes_at..].iter().map(|a| digits(a)).collect();
    let Some(sizes) = sizes else {
        return false;
    };
    let total = sizes[sizes.len() - 1];
    if sizes[0] > total || total > limits.max_payload as u64 {
        return false;
    }
    // `total` is within max_payload, so the sum cannot overflow.
    (rest.len() as u64) < nl as u64 + 1 + total + 2
}

/// A size the protocol accepts: 1 to 19 ASCII digits.
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// Whether `part` lies inside `whole` (by address, not by content).
fn within(part: &[u8], whole: &[u8]) -> bool {
    let (p, w) = (part.as_ptr_range(), whole.as_ptr_range());
    p.start >= w.start && p.end <= w.end
}
