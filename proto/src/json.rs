//! The JSON form of a client [`Packet`], carried in text WebSocket frames.
//!
//! Each packet is an object with one key naming its kind, as in
//! `{"request":{"id":1,"route":"echo.echo","body":"hi"}}`. Bodies are strings: JSON
//! clients (browsers) send and receive text, so a body that is not UTF-8 is replaced
//! lossily on the way out. Absent fields take their protobuf defaults.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::client::{self, Packet, packet::Kind};

#[derive(Debug, thiserror::Error)]
#[error("invalid JSON packet: {0}")]
pub struct JsonError(#[from] serde_json::Error);

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum JsonPacket {
    Handshake(Handshake),
    HandshakeAck(HandshakeAck),
    Heartbeat {},
    Request(Request),
    Response(Response),
    Push(Push),
    Kick(Kick),
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Handshake {
    token: String,
    server_timing: bool,
    client: String,
    serial: bool,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct HandshakeAck {
    code: u32,
    session_id: u64,
    heartbeat_ms: u32,
    message: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Request {
    id: u64,
    route: String,
    body: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Response {
    id: u64,
    code: u32,
    body: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    timing: Option<Timing>,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Timing {
    total_us: u32,
    queue_us: u32,
    handler_us: u32,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Push {
    route: String,
    body: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Kick {
    reason: String,
}

fn text(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

/// Parses a text frame.
pub fn decode(frame: &str) -> Result<Packet, JsonError> {
    let kind = match serde_json::from_str(frame)? {
        JsonPacket::Handshake(h) => Kind::Handshake(client::Handshake {
            token: h.token,
            server_timing: h.server_timing,
            client: h.client,
            serial: h.serial,
        }),
        JsonPacket::HandshakeAck(a) => Kind::HandshakeAck(client::HandshakeAck {
            code: a.code,
            session_id: a.session_id,
            heartbeat_ms: a.heartbeat_ms,
            message: a.message,
        }),
        JsonPacket::Heartbeat {} => Kind::Heartbeat(client::Heartbeat {}),
        JsonPacket::Request(r) => Kind::Request(client::Request {
            id: r.id,
            route: r.route,
            body: Bytes::from(r.body),
        }),
        JsonPacket::Response(r) => Kind::Response(client::Response {
            id: r.id,
            code: r.code,
            body: Bytes::from(r.body),
            message: r.message,
            timing: r.timing.map(|t| client::Timing {
                total_us: t.total_us,
                queue_us: t.queue_us,
                handler_us: t.handler_us,
            }),
        }),
        JsonPacket::Push(p) => Kind::Push(client::Push {
            route: p.route,
            body: Bytes::from(p.body),
        }),
        JsonPacket::Kick(k) => Kind::Kick(client::Kick { reason: k.reason }),
    };
    Ok(Packet::new(kind))
}

/// Renders a packet as a text frame; `None` for an empty packet.
pub fn encode(packet: &Packet) -> Option<String> {
    let json = match packet.kind.as_ref()? {
        Kind::Handshake(h) => JsonPacket::Handshake(Handshake {
            token: h.token.clone(),
            server_timing: h.server_timing,
            client: h.client.clone(),
            serial: h.serial,
        }),
        Kind::HandshakeAck(a) => JsonPacket::HandshakeAck(HandshakeAck {
            code: a.code,
            session_id: a.session_id,
            heartbeat_ms: a.heartbeat_ms,
            message: a.message.clone(),
        }),
        Kind::Heartbeat(_) => JsonPacket::Heartbeat {},
        Kind::Request(r) => JsonPacket::Request(Request {
            id: r.id,
            route: r.route.clone(),
            body: text(&r.body),
        }),
        Kind::Response(r) => JsonPacket::Response(Response {
            id: r.id,
            code: r.code,
            body: text(&r.body),
            message: r.message.clone(),
            timing: r.timing.map(|t| Timing {
                total_us: t.total_us,
                queue_us: t.queue_us,
                handler_us: t.handler_us,
            }),
        }),
        Kind::Push(p) => JsonPacket::Push(Push {
            route: p.route.clone(),
            body: text(&p.body),
        }),
        Kind::Kick(k) => JsonPacket::Kick(Kick {
            reason: k.reason.clone(),
        }),
    };
    serde_json::to_string(&json).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_through_json() {
        let p = decode(r#"{"request":{"id":7,"route":"echo.echo","body":"hi"}}"#).unwrap();
        let Some(Kind::Request(r)) = &p.kind else {
            panic!("not a request: {p:?}")
        };
        assert_eq!(
            (r.id, r.route.as_str(), &r.body[..]),
            (7, "echo.echo", &b"hi"[..])
        );
        assert_eq!(decode(&encode(&p).unwrap()).unwrap(), p);
    }

    #[test]
    fn absent_fields_default_and_unknown_kinds_fail() {
        let p = decode(r#"{"handshake":{}}"#).unwrap();
        assert_eq!(
            p,
            Packet::new(Kind::Handshake(client::Handshake::default()))
        );
        assert!(decode(r#"{"bogus":{}}"#).is_err());
        assert!(decode("not json").is_err());
        assert!(decode(r#"{"request":{"id":-1}}"#).is_err());
    }
}
