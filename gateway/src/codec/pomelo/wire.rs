//! The pomelo wire format, pure: packages (a 4-byte header, then the body) and the
//! messages that data packages carry. No I/O and no state; the parsers take bytes and
//! return `Ok(None)` for input that is not complete yet, so the same code reads a
//! WebSocket frame (which holds whole packages) and a TCP stream (which does not).
//!
//! ```text
//! package: | type: 1 byte | body length: 3 bytes, big-endian | body |
//! message: | flag: 1 byte | id: varint (request, response) | route | body |
//!   flag bits: 0 route is a 2-byte code (else 1 length byte + UTF-8),
//!              1-3 message type, 4 gzip-compressed body, 5 error (pitaya's)
//! ```

use bytes::{BufMut, Bytes, BytesMut};

/// Bytes of a package header: the type and a 3-byte length.
pub const HEADER_LEN: usize = 4;
/// The largest body a 3-byte length can announce.
pub const MAX_BODY_LEN: usize = 0xff_ffff;
/// Longest string route: its length is one byte.
pub const MAX_ROUTE_LEN: usize = 255;
/// Bytes of a message id at most: a u64 as a base-128 varint.
const MAX_ID_LEN: usize = 10;

const ROUTE_CODE_FLAG: u8 = 0x01;
const GZIP_FLAG: u8 = 0x10;
const ERROR_FLAG: u8 = 0x20;

/// What a package is, by its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackageType {
    /// Client to server: `{sys, user}`; server to client: `{code, sys}`.
    Handshake = 1,
    /// The client took the handshake answer; only now may data flow.
    HandshakeAck = 2,
    Heartbeat = 3,
    /// Carries one message.
    Data = 4,
    /// Server to client, before it closes: `{"reason": ...}`.
    Kick = 5,
}

impl PackageType {
    fn of(byte: u8) -> Option<PackageType> {
        Some(match byte {
            1 => PackageType::Handshake,
            2 => PackageType::HandshakeAck,
            3 => PackageType::Heartbeat,
            4 => PackageType::Data,
            5 => PackageType::Kick,
            _ => return None,
        })
    }
}

/// Why bytes are not pomelo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("unknown package type")]
    PackageType,
    #[error("package larger than allowed")]
    TooLarge,
    #[error("truncated package")]
    Truncated,
    #[error("unknown message type")]
    MessageType,
    #[error("truncated message")]
    TruncatedMessage,
    #[error("message id too long")]
    Id,
    #[error("route is not UTF-8")]
    Route,
}

/// One package: its type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub kind: PackageType,
    pub body: Bytes,
}

/// Parses the package at the front of `buf`: `Ok(None)` until it is all there, else
/// the package and the bytes it took. A body longer than `max_body` is refused from
/// the header alone, before any of it is buffered.
pub fn parse_package(buf: &Bytes, max_body: usize) -> Result<Option<(Package, usize)>, WireError> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let kind = PackageType::of(header[0]).ok_or(WireError::PackageType)?;
    let len = usize::from(header[1]) << 16 | usize::from(header[2]) << 8 | usize::from(header[3]);
    if len > max_body {
        return Err(WireError::TooLarge);
    }
    let end = HEADER_LEN + len;
    if buf.len() < end {
        return Ok(None);
    }
    let body = buf.slice(HEADER_LEN..end);
    Ok(Some((Package { kind, body }, end)))
}

/// Every package of a buffer that holds only whole ones (a WebSocket frame).
pub fn parse_packages(mut buf: Bytes, max_body: usize) -> Result<Vec<Package>, WireError> {
    let mut packages = Vec::with_capacity(1);
    while !buf.is_empty() {
        let (package, used) = parse_package(&buf, max_body)?.ok_or(WireError::Truncated)?;
        packages.push(package);
        buf = buf.slice(used..);
    }
    Ok(packages)
}

/// A package of `kind` with `body` (at most [`MAX_BODY_LEN`] bytes: longer bodies are
/// the caller's bug, and cut to an empty package rather than sent mislabelled).
pub fn encode_package(kind: PackageType, body: &[u8]) -> Bytes {
    let body = if body.len() > MAX_BODY_LEN {
        &[][..]
    } else {
        body
    };
    let mut buf = BytesMut::with_capacity(HEADER_LEN + body.len());
    put_header(&mut buf, kind, body.len());
    buf.put_slice(body);
    buf.freeze()
}

fn put_header(buf: &mut BytesMut, kind: PackageType, len: usize) {
    buf.put_u8(kind as u8);
    // Three bytes of the length, big-endian.
    buf.put_slice(&(len as u32).to_be_bytes()[1..]);
}

/// A message's type, with the id requests and responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    Request(u64),
    Notify,
    Response(u64),
    Push,
}

impl MessageKind {
    fn type_bits(self) -> u8 {
        match self {
            MessageKind::Request(_) => 0,
            MessageKind::Notify => 1,
            MessageKind::Response(_) => 2,
            MessageKind::Push => 3,
        }
    }

    fn id(self) -> Option<u64> {
        match self {
            MessageKind::Request(id) | MessageKind::Response(id) => Some(id),
            MessageKind::Notify | MessageKind::Push => None,
        }
    }

    fn has_route(self) -> bool {
        !matches!(self, MessageKind::Response(_))
    }
}

/// A message's route: a string, or its code in the handshake's dictionary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// Responses carry none.
    None,
    Name(&'a str),
    Code(u16),
}

/// One message of a data package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    pub kind: MessageKind,
    pub route: Route<'a>,
    /// Set on pitaya's error responses; pomelo's own clients ignore it.
    pub error: bool,
    /// The body is gzip-compressed.
    pub gzip: bool,
    pub body: &'a [u8],
}

/// Parses the message a data package's body holds.
pub fn parse_message(buf: &[u8]) -> Result<Message<'_>, WireError> {
    let (&flag, mut rest) = buf.split_first().ok_or(WireError::TruncatedMessage)?;
    let kind = match (flag >> 1) & 0x07 {
        0 => MessageKind::Request(take_varint(&mut rest)?),
        1 => MessageKind::Notify,
        2 => MessageKind::Response(take_varint(&mut rest)?),
        3 => MessageKind::Push,
        _ => return Err(WireError::MessageType),
    };
    let route = if !kind.has_route() {
        Route::None
    } else if flag & ROUTE_CODE_FLAG != 0 {
        let (code, tail) = rest
            .split_at_checked(2)
            .ok_or(WireError::TruncatedMessage)?;
        rest = tail;
        Route::Code(u16::from_be_bytes([code[0], code[1]]))
    } else {
        let (&len, tail) = rest.split_first().ok_or(WireError::TruncatedMessage)?;
        let (name, tail) = tail
            .split_at_checked(usize::from(len))
            .ok_or(WireError::TruncatedMessage)?;
        rest = tail;
        Route::Name(std::str::from_utf8(name).map_err(|_| WireError::Route)?)
    };
    Ok(Message {
        kind,
        route,
        error: flag & ERROR_FLAG != 0,
        gzip: flag & GZIP_FLAG != 0,
        body: rest,
    })
}

/// A data package carrying `message`, built in one buffer. A string route longer than
/// [`MAX_ROUTE_LEN`] bytes is the caller's bug and goes out empty.
pub fn encode_message(message: &Message<'_>) -> Bytes {
    let route = match message.route {
        Route::Name(name) if name.len() > MAX_ROUTE_LEN => Route::Name(""),
        route => route,
    };
    let mut flag = message.kind.type_bits() << 1;
    if matches!(route, Route::Code(_)) {
        flag |= ROUTE_CODE_FLAG;
    }
    if message.error {
        flag |= ERROR_FLAG;
    }
    if message.gzip {
        flag |= GZIP_FLAG;
    }
    let id_len = message.kind.id().map_or(0, varint_len);
    let route_len = match route {
        Route::None => 0,
        Route::Code(_) => 2,
        Route::Name(name) => 1 + name.len(),
    };
    let len = 1 + id_len + route_len + message.body.len();
    if len > MAX_BODY_LEN {
        return encode_package(PackageType::Data, &[]);
    }
    let mut buf = BytesMut::with_capacity(HEADER_LEN + len);
    put_header(&mut buf, PackageType::Data, len);
    buf.put_u8(flag);
    if let Some(id) = message.kind.id() {
        put_varint(&mut buf, id);
    }
    match route {
        Route::None => {}
        Route::Code(code) => buf.put_u16(code),
        Route::Name(name) => {
            buf.put_u8(name.len() as u8);
            buf.put_slice(name.as_bytes());
        }
    }
    buf.put_slice(message.body);
    buf.freeze()
}

/// Pomelo's message id: base-128, low groups first, the high bit saying more follow.
fn take_varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    let mut value = 0u64;
    for (i, &byte) in buf.iter().enumerate().take(MAX_ID_LEN) {
        let bits = u64::from(byte & 0x7f);
        if i == MAX_ID_LEN - 1 && bits > 1 {
            return Err(WireError::Id);
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            *buf = &buf[i + 1..];
            return Ok(value);
        }
    }
    Err(if buf.len() >= MAX_ID_LEN {
        WireError::Id
    } else {
        WireError::TruncatedMessage
    })
}

fn varint_len(value: u64) -> usize {
    (64 - value.leading_zeros() as usize).div_ceil(7).max(1)
}

fn put_varint(buf: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        buf.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(b: &[u8]) -> Bytes {
        Bytes::copy_from_slice(b)
    }

    #[test]
    fn a_package_is_its_type_a_three_byte_length_and_the_body() {
        let package = encode_package(PackageType::Handshake, b"{}");
        assert_eq!(&package[..], &[1, 0, 0, 2, b'{', b'}']);
        assert_eq!(
            &encode_package(PackageType::Heartbeat, &[])[..],
            &[3, 0, 0, 0]
        );
        let (parsed, used) = parse_package(&package, 100).unwrap().unwrap();
        assert_eq!(used, 6);
        assert_eq!(parsed.kind, PackageType::Handshake);
        assert_eq!(&parsed.body[..], b"{}");
        let long = encode_package(PackageType::Data, &[7; 0x1_0203]);
        assert_eq!(&long[..4], &[4, 0x01, 0x02, 0x03]);
    }

    #[test]
    fn an_incomplete_package_is_not_an_error_until_the_frame_ends() {
        let package = encode_package(PackageType::Kick, b"{\"reason\":\"x\"}");
        for cut in 0..package.len() {
            assert_eq!(parse_package(&package.slice(..cut), 100), Ok(None), "{cut}");
            assert_eq!(
                parse_packages(package.slice(..cut), 100).map(|p| p.len()),
                if cut == 0 {
                    Ok(0)
                } else {
                    Err(WireError::Truncated)
                },
            );
        }
    }

    #[test]
    fn bad_headers_are_refused_before_the_body_arrives() {
        assert_eq!(
            parse_package(&bytes(&[0, 0, 0, 0]), 10),
            Err(WireError::PackageType)
        );
        assert_eq!(
            parse_package(&bytes(&[6, 0, 0, 0]), 10),
            Err(WireError::PackageType)
        );
        assert_eq!(
            parse_package(&bytes(&[4, 0, 0, 11]), 10),
            Err(WireError::TooLarge)
        );
        assert_eq!(
            parse_package(&bytes(&[4, 0xff, 0xff, 0xff]), 10),
            Err(WireError::TooLarge)
        );
    }

    #[test]
    fn a_frame_may_hold_several_packages() {
        let mut frame = BytesMut::new();
        frame.put(encode_package(PackageType::HandshakeAck, &[]));
        frame.put(encode_package(PackageType::Heartbeat, &[]));
        let packages = parse_packages(frame.freeze(), 10).unwrap();
        let kinds: Vec<_> = packages.iter().map(|p| p.kind).collect();
        assert_eq!(kinds, [PackageType::HandshakeAck, PackageType::Heartbeat]);
    }

    #[test]
    fn a_request_by_string_route_byte_by_byte() {
        let message = Message {
            kind: MessageKind::Request(300),
            route: Route::Name("a.b.c"),
            error: false,
            gzip: false,
            body: b"{}",
        };
        let data = encode_message(&message);
        // Flag 0 (request, string route); id 300 = 0b10_0101100: 0xac, 0x02.
        let expect = [
            4, 0, 0, 11, 0x00, 0xac, 0x02, 5, b'a', b'.', b'b', b'.', b'c', b'{', b'}',
        ];
        assert_eq!(&data[..], &expect);
        assert_eq!(parse_message(&data[HEADER_LEN..]), Ok(message));
    }

    #[test]
    fn every_kind_round_trips() {
        for (kind, route) in [
            (MessageKind::Request(1), Route::Code(0x0102)),
            (MessageKind::Notify, Route::Name("chat.chatHandler.send")),
            (MessageKind::Notify, Route::Code(7)),
            (MessageKind::Response(u64::MAX), Route::None),
            (MessageKind::Response(0), Route::None),
            (MessageKind::Push, Route::Name("")),
            (MessageKind::Push, Route::Code(u16::MAX)),
        ] {
            for error in [false, true] {
                let message = Message {
                    kind,
                    route,
                    error,
                    gzip: false,
                    body: b"[1]",
                };
                let data = encode_message(&message);
                assert_eq!(parse_message(&data[HEADER_LEN..]), Ok(message));
            }
        }
    }

    #[test]
    fn flags_byte_by_byte() {
        let response = |error| Message {
            kind: MessageKind::Response(5),
            route: Route::None,
            error,
            gzip: false,
            body: b"",
        };
        // Response: type 2 << 1; pitaya's error bit 0x20.
        assert_eq!(&encode_message(&response(false))[4..], &[0x04, 5]);
        assert_eq!(&encode_message(&response(true))[4..], &[0x24, 5]);
        let push = Message {
            kind: MessageKind::Push,
            route: Route::Code(0x0203),
            error: false,
            gzip: false,
            body: b"x",
        };
        assert_eq!(&encode_message(&push)[4..], &[0x07, 2, 3, b'x']);
        let notify = parse_message(&[0x03, 0x00, 0x09, b'{']).unwrap();
        assert_eq!(notify.kind, MessageKind::Notify);
        assert_eq!(notify.route, Route::Code(9));
        assert_eq!(notify.body, b"{");
        assert!(parse_message(&[0x12, 1, 0]).unwrap().gzip);
    }

    #[test]
    fn broken_messages_are_errors_not_panics() {
        assert_eq!(parse_message(&[]), Err(WireError::TruncatedMessage));
        // Types 4 to 7 do not exist.
        assert_eq!(parse_message(&[0x08]), Err(WireError::MessageType));
        // An id that never ends, and one past u64.
        assert_eq!(
            parse_message(&[0x00, 0x80]),
            Err(WireError::TruncatedMessage)
        );
        assert_eq!(
            parse_message(&[0x00, 0x80, 0x80]),
            Err(WireError::TruncatedMessage)
        );
        let mut long = vec![0x00];
        long.extend([0xff; 9]);
        long.push(0x02);
        assert_eq!(parse_message(&long), Err(WireError::Id));
        assert_eq!(
            parse_message(&[
                0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff
            ]),
            Err(WireError::Id)
        );
        // A route code cut short, a route longer than the message, a route not UTF-8.
        assert_eq!(
            parse_message(&[0x01, 1, 0]),
            Err(WireError::TruncatedMessage)
        );
        assert_eq!(
            parse_message(&[0x00, 1, 5, b'a']),
            Err(WireError::TruncatedMessage)
        );
        assert_eq!(parse_message(&[0x02, 1, 0xff]), Err(WireError::Route));
    }

    #[test]
    fn varints_match_pomelo_for_every_length() {
        for value in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = BytesMut::new();
            put_varint(&mut buf, value);
            assert_eq!(buf.len(), varint_len(value), "{value}");
            let mut slice = &buf[..];
            assert_eq!(take_varint(&mut slice), Ok(value));
            assert!(slice.is_empty());
        }
    }
}
