//! The other direction of the protocol: what a server sends a client, parsed with the
//! same rules and helpers as the client ops, for clients in this workspace that own
//! their connection (the gate's bus connection).
//!
//! Like [`parse`](super::parse) it is pure and cancel-safe, and borrows the buffer.

use super::{
    Args, Limits, ParseError, control_line, header_sizes, parse_size, payload_size, split_verb,
    starts_with_ci, take_payload,
};

/// An operation a server sent. Slices borrow the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerOp<'a> {
    /// `INFO {json}`: the raw JSON.
    Info(&'a [u8]),
    /// `MSG` or `HMSG`; `headers` is `None` for a plain `MSG`.
    Msg {
        subject: &'a [u8],
        sid: u64,
        reply: Option<&'a [u8]>,
        headers: Option<&'a [u8]>,
        payload: &'a [u8],
    },
    Ping,
    Pong,
    Ok,
    /// `-ERR 'text'`: the text, quotes removed.
    Err(&'a [u8]),
}

/// Parses one server op from the front of `buf`: the op and the bytes it spans, or
/// `Ok(None)` when `buf` holds only part of one. `limits` bound the control line and
/// the payload as for client ops.
pub fn parse_server<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(ServerOp<'a>, usize)>, ParseError> {
    let Some((line, after_line)) = control_line(buf, limits)? else {
        return Ok(None);
    };
    let (verb, rest) = split_verb(line);
    if verb.eq_ignore_ascii_case(b"MSG") || verb.eq_ignore_ascii_case(b"HMSG") {
        let rest = rest.ok_or(ParseError::Malformed)?;
        return parse_msg(buf, after_line, rest, verb.len() == 4, limits);
    }
    let op = if starts_with_ci(verb, b"PING") {
        ServerOp::Ping
    } else if starts_with_ci(verb, b"PONG") {
        ServerOp::Pong
    } else if starts_with_ci(verb, b"+OK") {
        ServerOp::Ok
    } else if starts_with_ci(verb, b"-ERR") {
        let text = rest.unwrap_or_default();
        let text = text.strip_prefix(b"'").unwrap_or(text);
        ServerOp::Err(text.strip_suffix(b"'").unwrap_or(text))
    } else if verb.eq_ignore_ascii_case(b"INFO") {
        ServerOp::Info(rest.ok_or(ParseError::Malformed)?)
    } else {
        return Err(ParseError::UnknownOp);
    };
    Ok(Some((op, after_line)))
}

/// `MSG <subject> <sid> [reply] <size>` or `HMSG <subject> <sid> [reply] <hdr> <total>`.
fn parse_msg<'a>(
    buf: &'a [u8],
    start: usize,
    rest: &'a [u8],
    with_headers: bool,
    limits: &Limits,
) -> Result<Option<(ServerOp<'a>, usize)>, ParseError> {
    // At most five arguments; a sixth makes the line malformed.
    let mut args: [&[u8]; 6] = [&[]; 6];
    let mut n = 0;
    for arg in Args::new(rest).take(6) {
        args[n] = arg;
        n += 1;
    }
    let sizes = if with_headers { 2 } else { 1 };
    let (subject, sid, reply, sizes) = match (n, sizes) {
        (3, 1) | (4, 2) => (args[0], args[1], None, &args[2..n]),
        (4, 1) | (5, 2) => (args[0], args[1], Some(args[2]), &args[3..n]),
        _ => return Err(ParseError::Malformed),
    };
    let sid = parse_size(sid)?;
    let (hdr, total) = match sizes {
        [hdr, total] => {
            let (hdr, total) = header_sizes(hdr, total, limits)?;
            (Some(hdr), total)
        }
        [total] => (None, payload_size(total, limits)?),
        _ => return Err(ParseError::Malformed),
    };
    Ok(take_payload(buf, start, total)?.map(|(all, used)| {
        let (headers, payload) = match hdr {
            Some(hdr) => {
                let (h, p) = all.split_at(hdr);
                (Some(h), p)
            }
            None => (None, all),
        };
        let op = ServerOp::Msg {
            subject,
            sid,
            reply,
            headers,
            payload,
        };
        (op, used)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parser::tests::LIMITS;

    fn one(input: &[u8]) -> Result<Option<(ServerOp<'_>, usize)>, ParseError> {
        parse_server(input, &LIMITS)
    }

    #[test]
    fn msg_with_and_without_reply() {
        let (op, n) = one(b"MSG a.b 7 5\r\nhello\r\nMSG").unwrap().unwrap();
        assert_eq!(n, 20);
        assert_eq!(
            op,
            ServerOp::Msg {
                subject: b"a.b",
                sid: 7,
                reply: None,
                headers: None,
                payload: b"hello"
            }
        );
        let (op, _) = one(b"MSG a 1 r.x 0\r\n\r\n").unwrap().unwrap();
        assert_eq!(
            op,
            ServerOp::Msg {
                subject: b"a",
                sid: 1,
                reply: Some(b"r.x"),
                headers: None,
                payload: b""
            }
        );
    }

    #[test]
    fn hmsg_splits_headers_from_payload() {
        let input = b"HMSG in.1 2 16 16\r\nNATS/1.0 503\r\n\r\n\r\n";
        let (op, n) = one(input).unwrap().unwrap();
        assert_eq!(n, input.len());
        assert_eq!(
            op,
            ServerOp::Msg {
                subject: b"in.1",
                sid: 2,
                reply: None,
                headers: Some(b"NATS/1.0 503\r\n\r\n"),
                payload: b"",
            }
        );
        assert_eq!(one(b"HMSG a 1 9 4\r\n"), Err(ParseError::Malformed));
    }

    #[test]
    fn partial_ops_wait_for_more() {
        assert_eq!(one(b"MSG a 1 5\r\nhel"), Ok(None));
        assert_eq!(one(b"MSG a 1"), Ok(None));
        assert_eq!(one(b""), Ok(None));
    }

    #[test]
    fn control_ops_and_errors() {
        assert_eq!(one(b"PING\r\n"), Ok(Some((ServerOp::Ping, 6))));
        assert_eq!(one(b"PONG\r\n"), Ok(Some((ServerOp::Pong, 6))));
        assert_eq!(one(b"+OK\r\n"), Ok(Some((ServerOp::Ok, 5))));
        assert_eq!(
            one(b"-ERR 'Authorization Violation'\r\n")
                .unwrap()
                .unwrap()
                .0,
            ServerOp::Err(b"Authorization Violation")
        );
        assert_eq!(
            one(b"INFO {\"a\":1}\r\n").unwrap().unwrap().0,
            ServerOp::Info(b"{\"a\":1}")
        );
    }

    #[test]
    fn bad_input_is_refused_not_panicked_on() {
        assert_eq!(one(b"MSG a x 1\r\nh\r\n"), Err(ParseError::Malformed));
        assert_eq!(one(b"MSG a 1\r\n"), Err(ParseError::Malformed));
        assert_eq!(one(b"MSG\r\n"), Err(ParseError::Malformed));
        assert_eq!(one(b"MSG a 1 99\r\n"), Err(ParseError::MaxPayload));
        assert_eq!(one(b"MSG a 1 2\r\nhiXX"), Err(ParseError::UnknownOp));
        assert_eq!(one(b"WHAT\r\n"), Err(ParseError::UnknownOp));
        assert_eq!(one(&[b'x'; 80]), Err(ParseError::MaxControlLine));
        assert_eq!(one(b"MSG a 1 2 3 4 5 6\r\n"), Err(ParseError::Malformed));
    }
}
