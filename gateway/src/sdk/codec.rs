//! Frames on the client side of the wire: outgoing packets encoded straight into one
//! buffer, incoming WebSocket messages decoded into packets.
//!
//! A request is the hot path of the load test, so it is encoded by hand: building a
//! `proto::client::Packet` first would allocate a `String` for the route and a `Bytes`
//! for the body only to copy both again into the frame. The hand encoding is the
//! protobuf encoding prost produces (tested below, fields by [`crate::wire`]), written
//! into exactly one allocation.

use bytes::{Bytes, BytesMut};
use proto::Message as _;
use proto::client::{Handshake, Packet, packet::Kind};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use super::SdkError;
use crate::wire;

/// `Packet.request` (field 4).
const PACKET_REQUEST: u32 = 4;
/// `Request.id`, `Request.route`, `Request.body`.
const REQUEST_ID: u32 = 1;
const REQUEST_ROUTE: u32 = 2;
const REQUEST_BODY: u32 = 3;

/// `Packet{heartbeat: Heartbeat{}}`: field 3, length-delimited, zero length. The same
/// bytes every time.
pub(crate) const HEARTBEAT: Bytes = Bytes::from_static(&[(3 << 3) | 2, 0]);
/// The same in JSON.
pub(crate) const HEARTBEAT_JSON: Bytes = Bytes::from_static(br#"{"heartbeat":{}}"#);

/// A heartbeat frame's bytes in the session's encoding.
pub(crate) fn heartbeat(json: bool) -> Bytes {
    if json { HEARTBEAT_JSON } else { HEARTBEAT }
}

/// A request frame in the session's encoding. In JSON, `body` is the JSON text of the
/// body's value (an object for a typed route, a quoted string for a raw one); text
/// that is not JSON is refused here rather than closing the session at the gate.
pub(crate) fn encode_request(
    json: bool,
    id: u64,
    route: &str,
    body: &[u8],
) -> Result<Bytes, SdkError> {
    if !json {
        return Ok(request(id, route, body));
    }
    let body = if body.is_empty() {
        None
    } else {
        let value: &RawValue = serde_json::from_slice(body)
            .map_err(|e| SdkError::protocol(format!("a JSON session's body must be JSON: {e}")))?;
        Some(value)
    };
    // Written straight from borrowed parts: no intermediate `Value` tree per request.
    let frame = JsonFrame {
        request: JsonRequest { id, route, body },
    };
    serde_json::to_vec(&frame)
        .map(Bytes::from)
        .map_err(|e| SdkError::protocol(e.to_string()))
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
}

/// `Packet{request: Request{id, route, body}}`, in one allocation. Id 0 is a notify.
pub(crate) fn request(id: u64, route: &str, body: &[u8]) -> Bytes {
    let inner = wire::varint_len(REQUEST_ID, id)
        + wire::bytes_len(REQUEST_ROUTE, route.len())
        + wire::bytes_len(REQUEST_BODY, body.len());
    let mut buf = BytesMut::with_capacity(wire::message_len(PACKET_REQUEST, inner));
    wire::put_message_header(&mut buf, PACKET_REQUEST, inner);
    wire::put_varint(&mut buf, REQUEST_ID, id);
    wire::put_bytes(&mut buf, REQUEST_ROUTE, route.as_bytes());
    wire::put_bytes(&mut buf, REQUEST_BODY, body);
    buf.freeze()
}

/// The first frame of every connection; once per connection, so prost builds it.
pub(crate) fn handshake(options: &super::ClientOptions) -> Bytes {
    let packet = Packet::new(Kind::Handshake(Handshake {
        token: options.token.clone(),
        server_timing: options.server_timing,
        client: options.client.clone(),
        serial: options.serial,
    }));
    if options.json {
        Bytes::from(proto::json::encode(&packet).unwrap_or_default())
    } else {
        Bytes::from(packet.encode_to_vec())
    }
}

/// A frame of the session's encoding as a WebSocket message.
pub(crate) fn message(json: bool, frame: Bytes) -> Message {
    if json {
        // Every JSON frame is made by serde_json above: UTF-8 by construction.
        Message::Text(Utf8Bytes::try_from(frame).unwrap_or_default())
    } else {
        Message::Binary(frame)
    }
}

/// One WebSocket message from the gate, as the connection task sees it.
#[derive(Debug)]
pub(crate) enum Incoming {
    Packet(Packet),
    /// The gate closed the WebSocket; the close frame's reason, if it gave one.
    Close(String),
    /// Ping, pong or a raw frame: tungstenite answers pings itself.
    Control,
}

/// Decodes a message: binary frames are protobuf, text frames are JSON.
pub(crate) fn decode(message: Message) -> Result<Incoming, String> {
    match message {
        Message::Binary(bytes) => Packet::decode(bytes)
            .map(Incoming::Packet)
            .map_err(|e| format!("undecodable binary frame: {e}")),
        Message::Text(text) => proto::json::decode(text.as_str())
            .map(Incoming::Packet)
            .map_err(|e| e.to_string()),
        Message::Close(frame) => Ok(Incoming::Close(
            frame
                .map(|f| f.reason.as_str().to_owned())
                .unwrap_or_default(),
        )),
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => Ok(Incoming::Control),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_request_carries_its_body_as_a_json_value() {
        let frame = encode_request(true, 7, "chat.say", br#"{"room":"a"}"#).unwrap();
        assert_eq!(
            &frame[..],
            br#"{"request":{"id":7,"route":"chat.say","body":{"room":"a"}}}"#
        );
        let (_, typed) = proto::json::decode_typed(std::str::from_utf8(&frame).unwrap()).unwrap();
        assert!(typed);
        let empty = encode_request(true, 0, "echo.raw", b"").unwrap();
        assert_eq!(&empty[..], br#"{"request":{"id":0,"route":"echo.raw"}}"#);
        assert!(encode_request(true, 1, "echo.raw", b"not json").is_err());
    }
    use proto::client::{Heartbeat, Request};

    fn prost_request(id: u64, route: &str, body: &[u8]) -> Vec<u8> {
        Packet::new(Kind::Request(Request {
            id,
            route: route.into(),
            body: Bytes::copy_from_slice(body),
        }))
        .encode_to_vec()
    }

    #[test]
    fn request_frame_is_what_prost_encodes() {
        let big = vec![7u8; 300];
        let cases: [(u64, &str, &[u8]); 6] = [
            (1, "echo.echo", b"hello"),
            (0, "chat.say", b"notify"),
            (u64::MAX, "a.b", b""),
            (127, "", b""),
            (128, "echo.echo", &big),
            (0, "", b""),
        ];
        for (id, route, body) in cases {
            let frame = request(id, route, body);
            assert_eq!(&frame[..], &prost_request(id, route, body)[..], "id {id}");
        }
    }

    #[test]
    fn heartbeat_frame_is_what_prost_encodes() {
        let prost = Packet::new(Kind::Heartbeat(Heartbeat {})).encode_to_vec();
        assert_eq!(&HEARTBEAT[..], &prost[..]);
    }

    #[test]
    fn text_frames_decode_as_json() {
        let msg = Message::text(r#"{"push":{"route":"chat.msg","body":"hi"}}"#);
        let Ok(Incoming::Packet(p)) = decode(msg) else {
            panic!("not a packet")
        };
        assert!(matches!(p.kind, Some(Kind::Push(ref push)) if push.route == "chat.msg"));
        assert!(decode(Message::binary(vec![0xff, 0xff])).is_err());
    }
}
