//! The JSON form of a client [`Packet`], carried in text WebSocket frames.
//!
//! Each packet is an object with one key naming its kind, as in
//! `{"request":{"id":1,"route":"echo.raw","body":"hi"}}`. Absent fields take their
//! protobuf defaults. Fields are written in snake_case with integers as numbers; read,
//! the proto3 JSON mapping's spellings are taken too (`lastSeq`, `"12"`), as a proto3
//! JSON parser takes them. A packet a client sends (handshake, request, refresh, ack,
//! heartbeat) with a field its kind does not have is refused, naming the field
//! ([`JsonError::unknown_field`]): a misspelt `last_seq` must not read as 0. Packets a
//! gate sends are read leniently, so an SDK reads a newer gate's.
//!
//! A body is either a JSON string, carrying the body's bytes as text (raw routes; a body
//! that is not UTF-8 is replaced lossily on the way out), or any other JSON value: a
//! *typed* body, the route's message in the proto3 JSON mapping. This module keeps a
//! typed body as its JSON text and says so ([`decode_typed`], [`encode_typed`]); the
//! gate transcodes it to and from protobuf with the types the workers announce.

use bytes::Bytes;
use serde::de::{self, Deserializer, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::client::{self, Packet, packet::Kind};

#[derive(Debug, thiserror::Error)]
#[error("invalid JSON packet: {0}")]
pub struct JsonError(#[from] serde_json::Error);

impl JsonError {
    /// The field the packet had that its kind does not, when that is what is wrong.
    pub fn unknown_field(&self) -> Option<String> {
        // serde's `Error::unknown_field` is the one source of this text.
        let text = self.0.to_string();
        let rest = text.strip_prefix("unknown field `")?;
        let end = rest
            .find("`, expected")
            .or_else(|| rest.find("`, there are no fields"))?;
        Some(rest[..end].to_owned())
    }
}

/// An integer field: a JSON number, or a string of its decimal digits (the proto3 JSON
/// mapping writes 64-bit integers so, and lets a parser take any integer so).
fn int<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64> + std::str::FromStr,
{
    struct Int<T>(std::marker::PhantomData<T>);
    impl<T: TryFrom<u64> + std::str::FromStr> Visitor<'_> for Int<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an unsigned integer, as a number or a string")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
            T::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            v.parse()
                .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
        }
    }
    d.deserialize_any(Int(std::marker::PhantomData))
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum JsonPacket {
    Handshake(Handshake),
    #[serde(alias = "handshakeAck")]
    HandshakeAck(HandshakeAck),
    Heartbeat {},
    Request(Request),
    Response(Response),
    Push(Push),
    Kick(Kick),
    Refresh(Refresh),
    #[serde(alias = "refreshAck")]
    RefreshAck(RefreshAck),
    Drain(Drain),
    Ack(Ack),
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Ack {
    #[serde(deserialize_with = "int")]
    seq: u64,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Drain {
    reason: String,
    #[serde(alias = "graceMs", deserialize_with = "int")]
    grace_ms: u32,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Refresh {
    token: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct RefreshAck {
    #[serde(deserialize_with = "int")]
    code: u32,
    message: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Handshake {
    token: String,
    #[serde(alias = "serverTiming")]
    server_timing: bool,
    client: String,
    serial: bool,
    #[serde(skip_serializing_if = "is_false")]
    resumable: bool,
    #[serde(alias = "resumeToken", skip_serializing_if = "String::is_empty")]
    resume_token: String,
    #[serde(
        alias = "lastSeq",
        deserialize_with = "int",
        skip_serializing_if = "is_zero"
    )]
    last_seq: u64,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct HandshakeAck {
    #[serde(deserialize_with = "int")]
    code: u32,
    #[serde(alias = "sessionId", deserialize_with = "int")]
    session_id: u64,
    #[serde(alias = "heartbeatMs", deserialize_with = "int")]
    heartbeat_ms: u32,
    message: String,
    #[serde(alias = "resumeToken", skip_serializing_if = "String::is_empty")]
    resume_token: String,
    #[serde(
        alias = "resumeCode",
        deserialize_with = "int",
        skip_serializing_if = "is_zero"
    )]
    resume_code: u32,
    #[serde(
        alias = "lastSeq",
        deserialize_with = "int",
        skip_serializing_if = "is_zero"
    )]
    last_seq: u64,
}

/// A packet's body: text, or a typed body's JSON.
#[derive(Default)]
enum Body {
    #[default]
    Empty,
    Text(String),
    Typed(Box<RawValue>),
}

impl Body {
    fn of(bytes: &[u8], typed: bool) -> Body {
        if typed {
            // The gate made this JSON itself; anything else is sent as text.
            if let Ok(raw) = RawValue::from_string(text(bytes)) {
                return Body::Typed(raw);
            }
        }
        Body::Text(text(bytes))
    }

    fn is_typed(&self) -> bool {
        matches!(self, Body::Typed(_))
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Body::Empty => Bytes::new(),
            Body::Text(t) => Bytes::from(t),
            Body::Typed(raw) => Bytes::from(String::from(Box::<str>::from(raw))),
        }
    }
}

impl Serialize for Body {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Body::Empty => s.serialize_str(""),
            Body::Text(t) => s.serialize_str(t),
            Body::Typed(raw) => raw.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Body {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Body, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        Ok(match raw.get().as_bytes().first() {
            Some(b'"') => {
                Body::Text(serde_json::from_str(raw.get()).map_err(serde::de::Error::custom)?)
            }
            Some(b'n') => Body::Empty,
            _ => Body::Typed(raw),
        })
    }
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Request {
    #[serde(deserialize_with = "int")]
    id: u64,
    route: String,
    body: Body,
    #[serde(skip_serializing_if = "String::is_empty")]
    key: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Response {
    #[serde(deserialize_with = "int")]
    id: u64,
    #[serde(deserialize_with = "int")]
    code: u32,
    body: Body,
    #[serde(skip_serializing_if = "String::is_empty")]
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    timing: Option<Timing>,
    #[serde(deserialize_with = "int", skip_serializing_if = "is_zero")]
    seq: u64,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Timing {
    #[serde(alias = "totalUs", deserialize_with = "int")]
    total_us: u32,
    #[serde(alias = "queueUs", deserialize_with = "int")]
    queue_us: u32,
    #[serde(alias = "handlerUs", deserialize_with = "int")]
    handler_us: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    calls: Vec<CallTiming>,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct CallTiming {
    route: String,
    #[serde(deserialize_with = "int")]
    code: u32,
    #[serde(deserialize_with = "int")]
    us: u32,
    #[serde(deserialize_with = "int")]
    hop: u32,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Push {
    route: String,
    body: Body,
    #[serde(deserialize_with = "int", skip_serializing_if = "is_zero")]
    seq: u64,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct Kick {
    reason: String,
}

fn text(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

/// Parses a text frame; a typed body comes out as its JSON text.
pub fn decode(frame: &str) -> Result<Packet, JsonError> {
    decode_typed(frame).map(|(packet, _)| packet)
}

/// Parses a text frame, and says whether its body was typed (then the packet's body
/// holds the body's JSON text, for the caller to transcode).
pub fn decode_typed(frame: &str) -> Result<(Packet, bool), JsonError> {
    let mut typed = false;
    let mut body = |b: Body| {
        typed = b.is_typed();
        b.into_bytes()
    };
    let kind = match serde_json::from_str(frame)? {
        JsonPacket::Handshake(h) => Kind::Handshake(client::Handshake {
            token: h.token,
            server_timing: h.server_timing,
            client: h.client,
            serial: h.serial,
            resumable: h.resumable,
            resume_token: h.resume_token,
            last_seq: h.last_seq,
        }),
        JsonPacket::HandshakeAck(a) => Kind::HandshakeAck(client::HandshakeAck {
            code: a.code,
            session_id: a.session_id,
            heartbeat_ms: a.heartbeat_ms,
            message: a.message,
            resume_token: a.resume_token,
            resume_code: a.resume_code,
            last_seq: a.last_seq,
        }),
        JsonPacket::Heartbeat {} => Kind::Heartbeat(client::Heartbeat {}),
        JsonPacket::Request(r) => Kind::Request(client::Request {
            id: r.id,
            route: r.route,
            body: body(r.body),
            key: r.key,
        }),
        JsonPacket::Response(r) => Kind::Response(client::Response {
            id: r.id,
            code: r.code,
            body: body(r.body),
            message: r.message,
            timing: r.timing.map(|t| client::Timing {
                total_us: t.total_us,
                queue_us: t.queue_us,
                handler_us: t.handler_us,
                calls: t
                    .calls
                    .into_iter()
                    .map(|c| client::CallTiming {
                        route: c.route,
                        code: c.code,
                        us: c.us,
                        hop: c.hop,
                    })
                    .collect(),
            }),
            seq: r.seq,
        }),
        JsonPacket::Push(p) => Kind::Push(client::Push {
            route: p.route,
            body: body(p.body),
            seq: p.seq,
        }),
        JsonPacket::Kick(k) => Kind::Kick(client::Kick { reason: k.reason }),
        JsonPacket::Refresh(r) => Kind::Refresh(client::Refresh { token: r.token }),
        JsonPacket::RefreshAck(a) => Kind::RefreshAck(client::RefreshAck {
            code: a.code,
            message: a.message,
        }),
        JsonPacket::Drain(d) => Kind::Drain(client::Drain {
            reason: d.reason,
            grace_ms: d.grace_ms,
        }),
        JsonPacket::Ack(a) => Kind::Ack(client::Ack { seq: a.seq }),
    };
    Ok((Packet::new(kind), typed))
}

/// Renders a packet as a text frame, bodies as strings; `None` for an empty packet.
pub fn encode(packet: &Packet) -> Option<String> {
    encode_typed(packet, false)
}

/// Renders a packet as a text frame; `None` for an empty packet. With `typed`, the
/// body holds JSON (a transcoded typed body) and goes out as that JSON value.
pub fn encode_typed(packet: &Packet, typed: bool) -> Option<String> {
    let json = match packet.kind.as_ref()? {
        Kind::Handshake(h) => JsonPacket::Handshake(Handshake {
            token: h.token.clone(),
            server_timing: h.server_timing,
            client: h.client.clone(),
            serial: h.serial,
            resumable: h.resumable,
            resume_token: h.resume_token.clone(),
            last_seq: h.last_seq,
        }),
        Kind::HandshakeAck(a) => JsonPacket::HandshakeAck(HandshakeAck {
            code: a.code,
            session_id: a.session_id,
            heartbeat_ms: a.heartbeat_ms,
            message: a.message.clone(),
            resume_token: a.resume_token.clone(),
            resume_code: a.resume_code,
            last_seq: a.last_seq,
        }),
        Kind::Heartbeat(_) => JsonPacket::Heartbeat {},
        Kind::Request(r) => JsonPacket::Request(Request {
            id: r.id,
            route: r.route.clone(),
            body: Body::of(&r.body, typed),
            key: r.key.clone(),
        }),
        Kind::Response(r) => JsonPacket::Response(Response {
            id: r.id,
            code: r.code,
            body: Body::of(&r.body, typed),
            message: r.message.clone(),
            timing: r.timing.as_ref().map(|t| Timing {
                total_us: t.total_us,
                queue_us: t.queue_us,
                handler_us: t.handler_us,
                calls: t
                    .calls
                    .iter()
                    .map(|c| CallTiming {
                        route: c.route.clone(),
                        code: c.code,
                        us: c.us,
                        hop: c.hop,
                    })
                    .collect(),
            }),
            seq: r.seq,
        }),
        Kind::Push(p) => JsonPacket::Push(Push {
            route: p.route.clone(),
            body: Body::of(&p.body, typed),
            seq: p.seq,
        }),
        Kind::Kick(k) => JsonPacket::Kick(Kick {
            reason: k.reason.clone(),
        }),
        Kind::Refresh(r) => JsonPacket::Refresh(Refresh {
            token: r.token.clone(),
        }),
        Kind::RefreshAck(a) => JsonPacket::RefreshAck(RefreshAck {
            code: a.code,
            message: a.message.clone(),
        }),
        Kind::Drain(d) => JsonPacket::Drain(Drain {
            reason: d.reason.clone(),
            grace_ms: d.grace_ms,
        }),
        Kind::Ack(a) => JsonPacket::Ack(Ack { seq: a.seq }),
    };
    serde_json::to_string(&json).ok()
}

#[cfg(test)]
mod tests;
