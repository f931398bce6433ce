//! The pomelo wire format and the gate's pomelo codec as executable checks, shared by
//! the fuzz target `pomelo` and `gateway/tests/decoder_props.rs`.
//!
//! Wire level: packages are what an independent reading of their headers says, a
//! stream of them parses the same however it is split into reads, a package cut inside
//! its header or one byte short is "need more", and packages and messages re-encode to
//! what parses back the same. Codec level: each package of a frame becomes the event
//! its type and the handshake state call for (a handshake's token and client type are
//! its JSON's `user.token` and `sys.type`), routes by code resolve through the
//! dictionary the handshake answer told the client, compressed bodies are refused
//! unread, and the heap held stays linear in the frame.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use gateway::fuzzing::wire::{self, MessageKind, PackageType, Route};
use gateway::fuzzing::{Decoded, Message, Session};
use proto::client::{self, Packet, packet::Kind};
use proto::code;

use crate::gate_fixture::{Meter, assert_bounded, is_typed};

/// Heap per input byte a frame may take: packages are slices of it, a request body is
/// copied or transcoded, a handshake's JSON is parsed.
const PER_BYTE: usize = 16;

/// A client's handshake and its ack in one frame, after which data may flow.
pub fn prelude() -> Bytes {
    let mut frame = BytesMut::new();
    frame.extend_from_slice(&wire::encode_package(
        PackageType::Handshake,
        br#"{"sys":{"type":"fuzz"},"user":{"token":"t"}}"#,
    ));
    frame.extend_from_slice(&wire::encode_package(PackageType::HandshakeAck, &[]));
    frame.freeze()
}

/// Checks one input: the first byte picks whether the session has done its handshake
/// (bit 0 clear) and how the frame is split into reads (the other bits); the rest is
/// one binary frame. `session` is restarted as a fresh pomelo session.
pub fn check(input: &[u8], session: &mut Session, meter: Meter) {
    let Some((&first, frame)) = input.split_first() else {
        return;
    };
    let frame = Bytes::copy_from_slice(frame);
    check_stream(&frame, 1 + usize::from(first >> 1));
    check_messages(&frame);

    session.restart(&Message::binary(vec![PackageType::Handshake as u8]));
    let mut state = State::default();
    if first & 1 == 0 {
        let prelude = prelude();
        let decoded = session.decode(&Message::Binary(prelude.clone()));
        state.expect(session, &prelude, decoded);
        assert!(state.acked, "the prelude did not ack");
    }
    let decoded = assert_bounded(meter, "pomelo frame", frame.len(), PER_BYTE, || {
        session.decode(&Message::Binary(frame.clone()))
    });
    state.expect(session, &frame, decoded);
}

/// The packages of a frame by an independent reading of the header rules: a type of 1
/// to 5, a big-endian 3-byte length, then that many bytes. Yields each package's type
/// and body, or the error that ends the frame.
fn reference_packages(bytes: &[u8]) -> Result<Vec<(u8, &[u8])>, wire::WireError> {
    let mut packages = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        // The header is read whole or not at all.
        if rest.len() < 4 {
            return Err(wire::WireError::Truncated);
        }
        if !(1..=5).contains(&rest[0]) {
            return Err(wire::WireError::PackageType);
        }
        let len = (usize::from(rest[1]) << 16) + (usize::from(rest[2]) << 8) + usize::from(rest[3]);
        let Some(body) = rest.get(4..4 + len) else {
            return Err(wire::WireError::Truncated);
        };
        packages.push((rest[0], body));
        rest = &rest[4 + len..];
    }
    Ok(packages)
}

/// Feeds `bytes` to a growing buffer `chunk` bytes at a time, parsing packages as a TCP
/// reader would; the packages and the end must be those of the whole frame at once,
/// and those the header rules give.
fn check_stream(bytes: &Bytes, chunk: usize) {
    let whole = wire::parse_packages(bytes.clone(), wire::MAX_BODY_LEN);
    let reference = reference_packages(bytes);
    match (&whole, &reference) {
        (Ok(got), Ok(want)) => {
            let got: Vec<(u8, &[u8])> = got.iter().map(|p| (p.kind as u8, &p.body[..])).collect();
            assert_eq!(&got, want, "packages otherwise than their headers say");
        }
        (got, want) => assert_eq!(
            got.as_ref().err(),
            want.as_ref().err(),
            "the frame's end otherwise than its headers say"
        ),
    }
    let mut buf = BytesMut::new();
    let mut packages = Vec::new();
    let mut error = None;
    'feed: for piece in bytes.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            let rest = buf.clone().freeze();
            match wire::parse_package(&rest, wire::MAX_BODY_LEN) {
                Ok(Some((package, used))) => {
                    check_prefixes(&rest, used);
                    assert_eq!(
                        wire::encode_package(package.kind, &package.body)[..],
                        rest[..used],
                        "a package did not re-encode to its bytes"
                    );
                    packages.push(package);
                    let _ = buf.split_to(used);
                }
                Ok(None) => break,
                Err(e) => {
                    error = Some(e);
                    break 'feed;
                }
            }
        }
    }
    match whole {
        Ok(all) => assert_eq!((packages, error, buf.len()), (all, None, 0)),
        Err(wire::WireError::Truncated) => {
            assert_eq!(error, None);
            assert!(!buf.is_empty(), "truncated, yet nothing left over");
            let all = wire::parse_packages(bytes.slice(..bytes.len() - buf.len()), usize::MAX);
            assert_eq!(all, Ok(packages));
        }
        Err(e) => assert_eq!(error, Some(e), "the whole frame failed otherwise"),
    }
}

/// Every strict prefix of a `used`-byte package is incomplete.
fn check_prefixes(rest: &Bytes, used: usize) {
    let ends = (0..wire::HEADER_LEN.min(used)).chain([used - 1]);
    for k in ends {
        assert_eq!(
            wire::parse_package(&rest.slice(..k), wire::MAX_BODY_LEN),
            Ok(None),
            "a {k}-byte prefix of a {used}-byte package"
        );
    }
}

/// Every message a data package of the frame holds re-encodes to one that parses back
/// the same, no longer than the original.
fn check_messages(frame: &Bytes) {
    let Ok(packages) = wire::parse_packages(frame.clone(), wire::MAX_BODY_LEN) else {
        return;
    };
    for package in packages.iter().filter(|p| p.kind == PackageType::Data) {
        let Ok(message) = wire::parse_message(&package.body) else {
            continue;
        };
        let encoded = wire::encode_message(&message);
        assert!(encoded.len() <= wire::HEADER_LEN + package.body.len());
        assert_eq!(
            wire::parse_message(&encoded[wire::HEADER_LEN..]),
            Ok(message)
        );
    }
}

/// What the oracle knows of the session: whether data may flow, and the dictionary the
/// last handshake answer gave (code to Shaddock route).
#[derive(Default)]
struct State {
    acked: bool,
    dict: HashMap<u16, String>,
}

impl State {
    /// Checks what a frame decoded to, package by package, updating the state.
    fn expect(&mut self, session: &Session, frame: &Bytes, decoded: Decoded) {
        let packages = match wire::parse_packages(frame.clone(), wire::MAX_BODY_LEN) {
            Ok(packages) => packages,
            Err(_) => {
                assert!(matches!(decoded, Decoded::Invalid(_)), "{decoded:?}");
                return;
            }
        };
        let events = match (packages.len(), decoded) {
            (0, decoded) => return assert_eq!(decoded, Decoded::Invalid("empty frame")),
            (1, Decoded::Many(many)) => panic!("one package decoded as many: {many:?}"),
            (1, decoded) => vec![decoded],
            (n, Decoded::Many(many)) => {
                assert_eq!(many.len(), n, "one event per package");
                many
            }
            (n, decoded) => panic!("{n} packages decoded as one: {decoded:?}"),
        };
        for (package, event) in packages.iter().zip(events) {
            assert!(!matches!(event, Decoded::Many(_)), "nested events");
            self.package(session, package, event);
        }
    }

    fn package(&mut self, session: &Session, package: &wire::Package, event: Decoded) {
        let heartbeat = Decoded::Packet(Packet::new(Kind::Heartbeat(client::Heartbeat {})));
        match package.kind {
            PackageType::Handshake => {
                // `{sys: {type}, user: {token}}`; an empty body is an empty object.
                let json = match &package.body[..] {
                    [] => Ok(serde_json::Value::Object(Default::default())),
                    body => serde_json::from_slice::<serde_json::Value>(body),
                };
                let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
                match (json, event) {
                    (
                        Ok(json),
                        Decoded::Packet(Packet {
                            kind: Some(Kind::Handshake(hello)),
                        }),
                    ) => {
                        assert_eq!(hello.token, text(&json["user"]["token"]));
                        assert_eq!(hello.client, text(&json["sys"]["type"]));
                        self.dict = dictionary(session);
                    }
                    (Err(_), Decoded::Invalid(reason)) => {
                        assert_eq!(reason, "handshake is not JSON");
                    }
                    (json, other) => panic!("handshake {json:?} decoded as {other:?}"),
                }
            }
            PackageType::HandshakeAck => {
                self.acked = true;
                assert_eq!(event, heartbeat);
            }
            PackageType::Heartbeat => assert_eq!(event, heartbeat),
            PackageType::Kick => assert!(matches!(event, Decoded::Invalid(_))),
            PackageType::Data if !self.acked => {
                assert_eq!(event, Decoded::Invalid("data before handshake ack"));
            }
            PackageType::Data => self.data(&package.body, event),
        }
    }

    fn data(&self, body: &[u8], event: Decoded) {
        let Ok(message) = wire::parse_message(body) else {
            return assert!(matches!(event, Decoded::Invalid(_)), "{event:?}");
        };
        if message.gzip {
            return assert_eq!(event, Decoded::Invalid("gzip bodies are not supported"));
        }
        let id = match message.kind {
            MessageKind::Request(0) | MessageKind::Response(_) | MessageKind::Push => {
                return assert!(matches!(event, Decoded::Invalid(_)), "{event:?}");
            }
            MessageKind::Request(id) => id,
            MessageKind::Notify => 0,
        };
        let route = match message.route {
            Route::Name(name) => shaddock_route(name),
            Route::Code(code) => match self.dict.get(&code) {
                Some(route) => route.clone(),
                None => return assert_eq!(event, Decoded::Invalid("unknown route code")),
            },
            Route::None => unreachable!("requests and notifies carry a route"),
        };
        match event {
            Decoded::Packet(Packet {
                kind: Some(Kind::Request(request)),
            }) => {
                assert_eq!((request.id, &request.route), (id, &route));
                if !is_typed(&route) {
                    assert_eq!(request.body[..], message.body[..], "a raw body changed");
                }
            }
            Decoded::BadBody(response) => {
                assert!(is_typed(&route), "a raw body refused: {response:?}");
                assert_eq!((response.id, response.code), (id, code::BAD_REQUEST));
            }
            other => panic!("a request for {route} decoded as {other:?}"),
        }
    }
}

/// The dictionary the session's handshake answer tells its client, as code to the
/// Shaddock route (`svc.svc.method` is `svc.method`; push routes are themselves).
fn dictionary(session: &Session) -> HashMap<u16, String> {
    let ack = client::HandshakeAck {
        code: code::OK,
        heartbeat_ms: 1000,
        ..Default::default()
    };
    let Message::Binary(answer) = session.encode(Kind::HandshakeAck(ack)) else {
        panic!("a pomelo handshake answer is binary");
    };
    let json: serde_json::Value =
        serde_json::from_slice(&answer[wire::HEADER_LEN..]).expect("the answer is JSON");
    let dict = json["sys"]["dict"]
        .as_object()
        .expect("the answer has a dict");
    dict.iter()
        .map(|(route, code)| {
            let code = code.as_u64().and_then(|c| u16::try_from(c).ok());
            (code.expect("a 2-byte code"), shaddock_route(route))
        })
        .collect()
}

/// pomelo's `server.handler.method` is Shaddock's `server.method` when the handler is a
/// plain token; any other route is kept as it is (restated from docs/pomelo.md).
fn shaddock_route(route: &str) -> String {
    let mut tokens = route.splitn(3, '.');
    match (tokens.next(), tokens.next(), tokens.next()) {
        (Some(service), Some(handler), Some(method))
            if !handler.is_empty()
                && handler
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
        {
            format!("{service}.{method}")
        }
        _ => route.to_owned(),
    }
}
