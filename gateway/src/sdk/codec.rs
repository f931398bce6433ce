//! Frames on the client side of the wire: outgoing packets encoded straight into one
//! buffer, incoming WebSocket messages decoded into packets.
//!
//! A request is the hot path of the load test, so it is encoded by hand: building a
//! `proto::client::Packet` first would allocate a `String` for the route and a `Bytes`
//! for the body only to copy both again into the frame. The hand encoding is the
//! protobuf encoding prost produces (tested below), written into exactly one allocation.

use bytes::{BufMut, Bytes, BytesMut};
use proto::Message as _;
use proto::client::{Handshake, Packet, packet::Kind};
use tokio_tungstenite::tungstenite::Message;

/// Wire type 2 (length-delimited) key for a field number.
const fn len_key(field: u8) -> u8 {
    (field << 3) | 2
}

/// `Packet.request` (field 4).
const PACKET_REQUEST: u8 = len_key(4);
/// `Request.id` (field 1, varint).
const REQUEST_ID: u8 = 1 << 3;
/// `Request.route` (field 2).
const REQUEST_ROUTE: u8 = len_key(2);
/// `Request.body` (field 3).
const REQUEST_BODY: u8 = len_key(3);

/// `Packet{heartbeat: Heartbeat{}}`: field 3, zero length. The same bytes every time.
pub(crate) const HEARTBEAT: Bytes = Bytes::from_static(&[len_key(3), 0]);

fn varint_len(v: u64) -> usize {
    // Seven bits per byte; zero still takes one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// Encoded size of a length-delimited field; proto3 omits empty ones.
fn bytes_field_len(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        1 + varint_len(len as u64) + len
    }
}

fn put_bytes_field(buf: &mut BytesMut, key: u8, value: &[u8]) {
    if !value.is_empty() {
        buf.put_u8(key);
        put_varint(buf, value.len() as u64);
        buf.put_slice(value);
    }
}

/// `Packet{request: Request{id, route, body}}`, in one allocation. Id 0 is a notify.
pub(crate) fn request(id: u64, route: &str, body: &[u8]) -> Bytes {
    let id_len = if id == 0 { 0 } else { 1 + varint_len(id) };
    let inner = id_len + bytes_field_len(route.len()) + bytes_field_len(body.len());
    let mut buf = BytesMut::with_capacity(1 + varint_len(inner as u64) + inner);
    buf.put_u8(PACKET_REQUEST);
    put_varint(&mut buf, inner as u64);
    if id != 0 {
        buf.put_u8(REQUEST_ID);
        put_varint(&mut buf, id);
    }
    put_bytes_field(&mut buf, REQUEST_ROUTE, route.as_bytes());
    put_bytes_field(&mut buf, REQUEST_BODY, body);
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
    Bytes::from(packet.encode_to_vec())
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
    fn varint_len_counts_seven_bits_per_byte() {
        for (v, n) in [
            (0, 1),
            (127, 1),
            (128, 2),
            (16383, 2),
            (16384, 3),
            (u64::MAX, 10),
        ] {
            assert_eq!(varint_len(v), n, "{v}");
        }
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
