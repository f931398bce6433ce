//! The client protocol's frames: the one encoder and decoder of client [`Packet`]s, for
//! every program that speaks the protocol (the gate's codecs, the Rust SDK, the tools).
//!
//! A binary WebSocket frame carries a packet as protobuf, a text frame the same packet
//! as JSON ([`crate::json`]). This module works on frame payloads and leaves the
//! WebSocket library to its caller: a binary payload is [`Bytes`] and a text payload a
//! `String`, both of which become a WebSocket message without a copy.
//!
//! A request is the hot path of a client and of the load test, so [`request`] writes it
//! by hand: building a `Packet` first would allocate a `String` for the route and a
//! `Bytes` for the body only to copy both again into the frame. Its bytes are prost's
//! (tested below, fields by [`crate::wire`]), written into exactly one allocation.

use bytes::{Bytes, BytesMut};
use prost::Message as _;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::client::Packet;
use crate::json::{self, JsonError};
use crate::wire;

/// `Packet.request` (field 4).
const PACKET_REQUEST: u32 = 4;
/// `Request.id`, `Request.route`, `Request.body`.
const REQUEST_ID: u32 = 1;
const REQUEST_ROUTE: u32 = 2;
const REQUEST_BODY: u32 = 3;
const REQUEST_KEY: u32 = 4;

/// `Packet{heartbeat: Heartbeat{}}` as protobuf: field 3, length-delimited, zero
/// length. The same bytes every time.
pub const HEARTBEAT: Bytes = Bytes::from_static(&[(3 << 3) | 2, 0]);
/// The same as JSON.
pub const HEARTBEAT_JSON: &str = r#"{"heartbeat":{}}"#;

/// A packet as a binary frame's payload (protobuf).
pub fn encode_binary(packet: &Packet) -> Bytes {
    Bytes::from(packet.encode_to_vec())
}

/// A packet as a text frame's payload (JSON), bodies as strings; empty for a packet
/// without a kind.
pub fn encode_text(packet: &Packet) -> String {
    json::encode(packet).unwrap_or_default()
}

/// A packet whose body holds JSON (a transcoded typed body) as a text frame's payload,
/// the body going out as that JSON value.
pub fn encode_text_typed(packet: &Packet) -> String {
    json::encode_typed(packet, true).unwrap_or_default()
}

/// The packet a binary frame carries. The packet's byte fields share `payload`.
pub fn decode_binary(payload: Bytes) -> Result<Packet, prost::DecodeError> {
    Packet::decode(payload)
}

/// The packet a text frame carries; a typed body comes out as its JSON text.
pub fn decode_text(payload: &str) -> Result<Packet, JsonError> {
    json::decode(payload)
}

/// The packet a text frame carries, and whether its body was typed (then the body
/// holds the body's JSON text, for the caller to transcode).
pub fn decode_text_typed(payload: &str) -> Result<(Packet, bool), JsonError> {
    json::decode_typed(payload)
}

/// `Packet{request: Request{id, route, body, key}}` as protobuf, in one allocation. Id 0
/// is a notify; `key` is a keyed service's key, empty for none.
pub fn request(id: u64, route: &str, key: &str, body: &[u8]) -> Bytes {
    let inner = wire::varint_len(REQUEST_ID, id)
        + wire::bytes_len(REQUEST_ROUTE, route.len())
        + wire::bytes_len(REQUEST_BODY, body.len())
        + wire::bytes_len(REQUEST_KEY, key.len());
    let mut buf = BytesMut::with_capacity(wire::message_len(PACKET_REQUEST, inner));
    wire::put_message_header(&mut buf, PACKET_REQUEST, inner);
    wire::put_varint(&mut buf, REQUEST_ID, id);
    wire::put_bytes(&mut buf, REQUEST_ROUTE, route.as_bytes());
    wire::put_bytes(&mut buf, REQUEST_BODY, body);
    wire::put_bytes(&mut buf, REQUEST_KEY, key.as_bytes());
    buf.freeze()
}

/// The same request as JSON. `body` is the JSON text of the body's value (an object
/// for a typed route, a quoted string for a raw one), written as it is: no
/// intermediate value tree per request. Text that is not JSON is refused here rather
/// than closing the session at the gate.
pub fn request_json(
    id: u64,
    route: &str,
    key: &str,
    body: &[u8],
) -> Result<String, serde_json::Error> {
    let body = if body.is_empty() {
        None
    } else {
        Some(serde_json::from_slice::<&RawValue>(body)?)
    };
    let frame = JsonFrame {
        request: JsonRequest {
            id,
            route,
            body,
            key,
        },
    };
    serde_json::to_string(&frame)
}

#[derive(Serialize)]
struct JsonFrame<'a> {
    request: JsonRequest<'a>,
}

#[derive(Serialize)]
struct JsonRequest<'a> {
    id: u64,
    route: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "str::is_empty")]
    key: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Heartbeat, Request, packet::Kind};

    #[test]
    fn both_encodings_round_trip() {
        let packet = Packet::new(Kind::Heartbeat(Heartbeat {}));
        assert_eq!(decode_binary(encode_binary(&packet)).unwrap(), packet);
        assert_eq!(decode_text(&encode_text(&packet)).unwrap(), packet);
        assert!(decode_binary(Bytes::from_static(&[0xff, 0xff])).is_err());
    }

    #[test]
    fn a_json_request_carries_its_body_as_a_json_value() {
        let frame = request_json(7, "chat.say", "", br#"{"room":"a"}"#).unwrap();
        assert_eq!(
            frame,
            r#"{"request":{"id":7,"route":"chat.say","body":{"room":"a"}}}"#
        );
        let (_, typed) = decode_text_typed(&frame).unwrap();
        assert!(typed);
        let empty = request_json(0, "echo.raw", "", b"").unwrap();
        assert_eq!(empty, r#"{"request":{"id":0,"route":"echo.raw"}}"#);
        assert!(request_json(1, "echo.raw", "", b"not json").is_err());
        let keyed = request_json(2, "arena.input", "m1", br#"{"dx":1}"#).unwrap();
        assert_eq!(
            keyed,
            r#"{"request":{"id":2,"route":"arena.input","body":{"dx":1},"key":"m1"}}"#
        );
        let Some(Kind::Request(r)) = decode_text_typed(&keyed).unwrap().0.kind else {
            panic!("not a request");
        };
        assert_eq!(r.key, "m1");
    }

    fn prost_request(id: u64, route: &str, key: &str, body: &[u8]) -> Vec<u8> {
        Packet::new(Kind::Request(Request {
            id,
            route: route.into(),
            body: Bytes::copy_from_slice(body),
            key: key.into(),
        }))
        .encode_to_vec()
    }

    #[test]
    fn request_frame_is_what_prost_encodes() {
        let big = vec![7u8; 300];
        let cases: [(u64, &str, &str, &[u8]); 7] = [
            (1, "echo.echo", "", b"hello"),
            (0, "chat.say", "", b"notify"),
            (u64::MAX, "a.b", "", b""),
            (127, "", "", b""),
            (128, "echo.echo", "", &big),
            (0, "", "", b""),
            (9, "arena.input", "match-1", b"\x08\x01"),
        ];
        for (id, route, key, body) in cases {
            let frame = request(id, route, key, body);
            assert_eq!(
                &frame[..],
                &prost_request(id, route, key, body)[..],
                "id {id}"
            );
        }
    }

    #[test]
    fn heartbeat_frames_are_what_the_encoders_make() {
        let packet = Packet::new(Kind::Heartbeat(Heartbeat {}));
        assert_eq!(HEARTBEAT, encode_binary(&packet));
        assert_eq!(HEARTBEAT_JSON, encode_text(&packet));
    }
}
