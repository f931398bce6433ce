//! The client protocol's frames as tungstenite messages: [`proto::frame`] (the one
//! encoder of the protocol, shared with the gate) on the SDK's WebSocket.
//!
//! [`encode`] and [`decode`] are public for tools that speak the protocol by hand over
//! tungstenite (the load test's bare drivers and echo server).

use bytes::Bytes;
use proto::client::{Ack, Handshake, Packet, packet::Kind};
use proto::frame;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use super::SdkError;
use super::resume::Resume;

/// A frame carrying `packet`, as JSON text when `text`, else as protobuf.
pub fn encode(packet: &Packet, text: bool) -> Message {
    if text {
        Message::text(frame::encode_text(packet))
    } else {
        Message::Binary(frame::encode_binary(packet))
    }
}

/// The packet a data frame carries; `None` for control frames and undecodable data.
pub fn decode(message: &Message) -> Option<Packet> {
    match incoming(message.clone()) {
        Ok(Incoming::Packet(packet)) => Some(packet),
        _ => None,
    }
}

/// A heartbeat frame's bytes in the session's encoding.
pub(crate) fn heartbeat(json: bool) -> Bytes {
    if json {
        Bytes::from_static(frame::HEARTBEAT_JSON.as_bytes())
    } else {
        frame::HEARTBEAT
    }
}

/// An ack frame's bytes in the session's encoding: every push and response up to `seq`
/// has been handled.
pub(crate) fn ack(json: bool, seq: u64) -> Bytes {
    let packet = Packet::new(Kind::Ack(Ack { seq }));
    if json {
        Bytes::from(frame::encode_text(&packet))
    } else {
        frame::encode_binary(&packet)
    }
}

/// A request frame's bytes in the session's encoding. In JSON, `body` is the JSON text
/// of the body's value (see [`frame::request_json`]).
pub(crate) fn encode_request(
    json: bool,
    id: u64,
    (route, key): (&str, &str),
    body: &[u8],
) -> Result<Bytes, SdkError> {
    if !json {
        return Ok(frame::request(id, route, key, body));
    }
    frame::request_json(id, route, key, body)
        .map(Bytes::from)
        .map_err(|e| SdkError::protocol(format!("a JSON session's body must be JSON: {e}")))
}

/// The first frame of every connection; once per connection, so prost builds it. With
/// `resume`, it asks to take that session up again.
pub(crate) fn handshake(options: &super::ClientOptions, resume: Option<&Resume>) -> Message {
    let packet = Packet::new(Kind::Handshake(Handshake {
        token: options.token.clone(),
        server_timing: options.server_timing,
        client: options.client.clone(),
        serial: options.serial,
        resumable: options.resumable(),
        resume_token: resume.map(|r| r.token.clone()).unwrap_or_default(),
        last_seq: resume.map_or(0, |r| r.sequence.last()),
    }));
    encode(&packet, options.json)
}

/// A frame of the session's encoding as a WebSocket message.
pub(crate) fn message(json: bool, frame: Bytes) -> Message {
    if json {
        // Every JSON frame is made by serde_json: UTF-8 by construction.
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
pub(crate) fn incoming(message: Message) -> Result<Incoming, String> {
    match message {
        Message::Binary(bytes) => frame::decode_binary(bytes)
            .map(Incoming::Packet)
            .map_err(|e| format!("undecodable binary frame: {e}")),
        Message::Text(text) => frame::decode_text(text.as_str())
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
    use proto::client::Heartbeat;

    #[test]
    fn both_encodings_round_trip() {
        let packet = Packet::new(Kind::Heartbeat(Heartbeat {}));
        for text in [false, true] {
            assert_eq!(decode(&encode(&packet, text)), Some(packet.clone()));
        }
        assert_eq!(decode(&Message::Ping(Default::default())), None);
        assert_eq!(decode(&Message::binary(vec![0xff, 0xff])), None);
    }

    #[test]
    fn text_frames_decode_as_json() {
        let msg = Message::text(r#"{"push":{"route":"chat.msg","body":"hi"}}"#);
        let Ok(Incoming::Packet(p)) = incoming(msg) else {
            panic!("not a packet")
        };
        assert!(matches!(p.kind, Some(Kind::Push(ref push)) if push.route == "chat.msg"));
        assert!(incoming(Message::binary(vec![0xff, 0xff])).is_err());
    }

    #[test]
    fn a_request_frame_goes_out_in_the_session_encoding() {
        let binary = message(
            false,
            encode_request(false, 1, ("echo.echo", ""), b"hi").unwrap(),
        );
        let text = message(
            true,
            encode_request(true, 1, ("echo.echo", ""), br#""hi""#).unwrap(),
        );
        for frame in [binary, text] {
            let Some(Kind::Request(req)) = decode(&frame).and_then(|p| p.kind) else {
                panic!("not a request: {frame:?}")
            };
            assert_eq!(
                (req.id, req.route.as_str(), &req.body[..]),
                (1, "echo.echo", &b"hi"[..])
            );
        }
        assert!(encode_request(true, 1, ("echo.raw", ""), b"not json").is_err());
    }

    #[test]
    fn an_ack_frame_goes_out_in_the_session_encoding() {
        for json in [false, true] {
            let frame = message(json, ack(json, 42));
            assert_eq!(
                decode(&frame).and_then(|p| p.kind),
                Some(Kind::Ack(Ack { seq: 42 }))
            );
        }
    }
}
