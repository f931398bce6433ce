//! The client protocols as codecs: a session's frames become [`Packet`]s with protobuf
//! bodies, and the session's answers, pushes and kicks become frames again. The session
//! core (limits, forwarding, effects) sees only packets, never a protocol's bytes.
//!
//! - [`Codec::Protobuf`]: binary frames carrying the packet as protobuf; bodies pass
//!   through untouched.
//! - [`Codec::Json`]: text frames carrying the packet as JSON ([`proto::json`]). A typed
//!   body (a JSON value that is not a string) is transcoded to protobuf with the types
//!   the route's workers announced ([`crate::schema`]), and responses and pushes of
//!   routes with known types go back as JSON values; everything else passes through as
//!   a string.
//! - [`Codec::Pomelo`]: pomelo packages ([`crate::pomelo`]), told apart by the first
//!   frame's first byte (a handshake package's type, 1, which no protobuf `Packet` can
//!   start with). Bodies are JSON, transcoded as for JSON sessions when the route's
//!   types are known, else passed as they are.
//!
//! Protobuf and JSON packets are encoded and decoded by [`proto::frame`], the one
//! encoder of the client protocol, which the SDK uses too.

pub mod pomelo;

use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};
use proto::client::{self, Packet, packet::Kind};
use proto::rpc::ServerPush;
use proto::{code, frame, wire};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::schema::{Schemas, json_to_protobuf, protobuf_to_json};
use pomelo::{PomeloCodec, PomeloPush, wire::PackageType};

/// How one session's frames are encoded: fixed by its first frame.
#[derive(Debug)]
pub(crate) enum Codec {
    Protobuf,
    Json,
    Pomelo(PomeloCodec),
}

/// What a data frame held.
#[derive(Debug)]
pub(crate) enum Decoded {
    Packet(Packet),
    /// A request whose typed body cannot be transcoded: answer it with this 400 (unless
    /// it is a notify, id 0) and go on.
    BadBody(client::Response),
    /// Not a packet at all: the session closes, telling the client why.
    Invalid(&'static str),
    /// A JSON packet with a field its kind does not have (named): the session closes
    /// naming it, rather than reading the packet without it.
    UnknownField(String),
    /// A frame holding several packets (pomelo packages), in order; never nested.
    Many(Vec<Decoded>),
}

/// Why our own protocol's frames are refused.
const INVALID_PACKET: &str = "invalid packet";

impl Codec {
    /// The codec a session's first frame speaks.
    pub fn of(first: &Message) -> Codec {
        match first {
            Message::Text(_) => Codec::Json,
            Message::Binary(b) if b.first() == Some(&(PackageType::Handshake as u8)) => {
                Codec::Pomelo(PomeloCodec::default())
            }
            _ => Codec::Protobuf,
        }
    }

    /// Decodes a binary or text frame (control frames are the caller's).
    pub fn decode(&mut self, frame: &Message, schemas: &Schemas) -> Decoded {
        if let Codec::Pomelo(pomelo) = self {
            return pomelo.decode(frame, schemas);
        }
        let (mut packet, typed) = match frame {
            Message::Binary(b) => match frame::decode_binary(b.clone()) {
                Ok(packet) => (packet, false),
                Err(_) => return Decoded::Invalid(INVALID_PACKET),
            },
            Message::Text(t) => match frame::decode_text_typed(t.as_str()) {
                Ok(decoded) => decoded,
                Err(e) => {
                    return match e.unknown_field() {
                        Some(name) => Decoded::UnknownField(name),
                        None => Decoded::Invalid(INVALID_PACKET),
                    };
                }
            },
            _ => return Decoded::Invalid(INVALID_PACKET),
        };
        if typed && let Some(Kind::Request(req)) = &mut packet.kind {
            let typed = request_body(&req.route, &req.body, schemas).unwrap_or_else(|| {
                Err(format!(
                    "route {} has no announced message types: send its body as a JSON string",
                    req.route
                ))
            });
            match typed {
                Ok(body) => req.body = body,
                Err(message) => {
                    return Decoded::BadBody(client::Response {
                        id: req.id,
                        code: code::BAD_REQUEST,
                        message,
                        ..Default::default()
                    });
                }
            }
        }
        Decoded::Packet(packet)
    }

    /// A frame carrying `kind`, whose body (if any) is not transcoded.
    pub fn encode(&self, kind: Kind) -> Message {
        match self {
            Codec::Protobuf => Message::Binary(frame::encode_binary(&Packet::new(kind))),
            Codec::Json => Message::text(frame::encode_text(&Packet::new(kind))),
            Codec::Pomelo(pomelo) => pomelo.encode(kind),
        }
    }

    /// A frame answering a request for `route`. For JSON, a successful answer of a
    /// route with known types carries its body as JSON; a body that is not the
    /// announced type is answered 500.
    pub fn encode_response(
        &self,
        mut resp: client::Response,
        route: &str,
        schemas: &Schemas,
    ) -> Message {
        match self {
            Codec::Pomelo(pomelo) => pomelo.encode_response(resp, route, schemas),
            Codec::Json if resp.code == code::OK && answer_as_json(&mut resp, route, schemas) => {
                let packet = Packet::new(Kind::Response(resp));
                Message::text(frame::encode_text_typed(&packet))
            }
            _ => self.encode(Kind::Response(resp)),
        }
    }

    /// The frame of a push, made once per gate for each codec that needs it.
    pub fn encode_push(&self, push: &PushFrame, schemas: &Schemas) -> Message {
        match self {
            Codec::Protobuf => Message::Binary(push.binary.clone()),
            Codec::Json => Message::Text(push.json(schemas)),
            Codec::Pomelo(pomelo) => pomelo.push_frame(push.pomelo(schemas)),
        }
    }

    /// A push frame of a resumable session: the shared frame (from
    /// [`Codec::encode_push`]) with this session's `seq` added (`Push.seq`), one copy
    /// and no second encoding. Pomelo sessions are never resumable: theirs is unchanged.
    pub fn numbered_push(frame: &Message, seq: u64) -> Message {
        match frame {
            Message::Binary(b) => Message::Binary(number_binary_push(b, seq)),
            Message::Text(t) => match t.as_str().strip_suffix("}}") {
                Some(head) => Message::text(format!("{head},\"seq\":{seq}}}}}")),
                None => frame.clone(),
            },
            _ => frame.clone(),
        }
    }

    /// The heartbeat interval the session keeps: pomelo tells clients whole seconds,
    /// so its sessions keep the interval they were told.
    pub fn heartbeat(&self, configured: std::time::Duration) -> std::time::Duration {
        match self {
            Codec::Pomelo(_) => {
                let ms = configured.as_millis().try_into().unwrap_or(u32::MAX);
                std::time::Duration::from_secs(pomelo::heartbeat_secs(ms).into())
            }
            Codec::Protobuf | Codec::Json => configured,
        }
    }
}

/// A typed JSON request body as protobuf, by the route's announced request type;
/// `None` when the route has none.
pub(crate) fn request_body(
    route: &str,
    json: &[u8],
    schemas: &Schemas,
) -> Option<Result<Bytes, String>> {
    let types = schemas.method(route)?;
    Some(
        json_to_protobuf(&types.request, json)
            .map(Bytes::from)
            .map_err(|e| format!("bad request body: {e}")),
    )
}

/// Turns a successful answer's body into JSON by the route's announced response type;
/// false when the route has none. A body that is not the announced type makes the
/// answer a 500.
pub(crate) fn answer_as_json(resp: &mut client::Response, route: &str, schemas: &Schemas) -> bool {
    let Some(types) = schemas.method(route) else {
        return false;
    };
    match protobuf_to_json(&types.response, &resp.body) {
        Ok(json) => {
            resp.body = Bytes::from(json);
            true
        }
        Err(message) => {
            resp.code = code::HANDLER_ERROR;
            resp.message = format!("worker's answer: {message}");
            resp.body = Bytes::new();
            false
        }
    }
}

/// A push body as JSON, when the push route's type is known and the body is one.
pub(crate) fn push_as_json(push: &client::Push, schemas: &Schemas) -> Option<String> {
    schemas
        .push(&push.route)
        .and_then(|t| protobuf_to_json(&t, &push.body).ok())
}

/// A push encoded once for every local recipient, in each protocol's frames; the JSON
/// and pomelo forms are made only if some recipient speaks them.
#[derive(Debug)]
pub(crate) struct PushFrame {
    pub binary: Bytes,
    packet: Packet,
    json: OnceLock<Utf8Bytes>,
    pomelo: OnceLock<PomeloPush>,
}

impl PushFrame {
    pub fn new(push: ServerPush) -> Arc<PushFrame> {
        let packet = Packet::new(Kind::Push(client::Push {
            route: push.route,
            body: push.body,
            seq: 0,
        }));
        Arc::new(PushFrame {
            binary: frame::encode_binary(&packet),
            packet,
            json: OnceLock::new(),
            pomelo: OnceLock::new(),
        })
    }

    fn push(&self) -> Option<&client::Push> {
        match &self.packet.kind {
            Some(Kind::Push(push)) => Some(push),
            _ => None,
        }
    }

    fn pomelo(&self, schemas: &Schemas) -> &PomeloPush {
        self.pomelo.get_or_init(|| {
            let empty = client::Push::default();
            PomeloPush::new(self.push().unwrap_or(&empty), schemas)
        })
    }

    /// The JSON frame: the body as a JSON value when the push route's type is known
    /// and the body is one, else as a string.
    fn json(&self, schemas: &Schemas) -> Utf8Bytes {
        self.json
            .get_or_init(|| {
                let Some(push) = self.push() else {
                    return Utf8Bytes::default();
                };
                match push_as_json(push, schemas) {
                    Some(json) => {
                        let packet = Packet::new(Kind::Push(client::Push {
                            route: push.route.clone(),
                            body: Bytes::from(json),
                            seq: 0,
                        }));
                        frame::encode_text_typed(&packet)
                    }
                    None => frame::encode_text(&self.packet),
                }
                .into()
            })
            .clone()
    }
}

/// `Packet.push` (field 6) and `Push.seq` (field 3).
const PACKET_PUSH: u32 = 6;
const PUSH_SEQ: u32 = 3;

/// `Packet{push}` as protobuf with `Push.seq` appended to the push: its length prefix
/// grows by the field's size. Anything else is decoded and encoded again.
fn number_binary_push(packet: &Bytes, seq: u64) -> Bytes {
    use bytes::Buf as _;
    let mut rest = &packet[..];
    let key = wire::decode_varint(&mut rest).ok();
    let len = wire::decode_varint(&mut rest).ok();
    let expected = (u64::from(PACKET_PUSH) << 3) | 2;
    match (key, len) {
        (Some(key), Some(len)) if key == expected && len == rest.remaining() as u64 => {
            let field = wire::varint_len(PUSH_SEQ, seq);
            let mut out = BytesMut::with_capacity(packet.len() + field + 2);
            wire::put_message_header(&mut out, PACKET_PUSH, rest.len() + field);
            out.extend_from_slice(rest);
            wire::put_varint(&mut out, PUSH_SEQ, seq);
            out.freeze()
        }
        _ => {
            let mut decoded = frame::decode_binary(packet.clone()).unwrap_or_default();
            if let Some(Kind::Push(push)) = &mut decoded.kind {
                push.seq = seq;
            }
            frame::encode_binary(&decoded)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::Message as _;

    fn packet(kind: Kind) -> Message {
        Message::binary(Packet::new(kind).encode_to_vec())
    }

    fn request(id: u64, body: &[u8]) -> Kind {
        Kind::Request(client::Request {
            id,
            route: "echo.echo".into(),
            body: body.to_vec().into(),
            ..Default::default()
        })
    }

    #[test]
    fn the_first_frame_picks_the_codec() {
        assert!(matches!(Codec::of(&Message::text("{}")), Codec::Json));
        let pomelo = Message::binary(vec![PackageType::Handshake as u8, 0, 0, 2]);
        assert!(matches!(Codec::of(&pomelo), Codec::Pomelo(_)));
        assert!(matches!(
            Codec::of(&packet(request(1, b""))),
            Codec::Protobuf
        ));
    }

    #[test]
    fn protobuf_bodies_pass_through_and_what_is_no_packet_is_invalid() {
        let schemas = Schemas::default();
        let mut codec = Codec::Protobuf;
        let Decoded::Packet(p) = codec.decode(&packet(request(4, b"\x00\xff")), &schemas) else {
            panic!("not a packet");
        };
        assert_eq!(p.kind, Some(request(4, b"\x00\xff")));
        let garbage = Message::binary(vec![0xff; 9]);
        assert!(matches!(
            codec.decode(&garbage, &schemas),
            Decoded::Invalid(INVALID_PACKET)
        ));
        let answer = codec.encode(Kind::Heartbeat(client::Heartbeat {}));
        let Message::Binary(bytes) = answer else {
            panic!("a binary frame");
        };
        assert_eq!(
            Packet::decode(bytes).unwrap().kind,
            Some(Kind::Heartbeat(client::Heartbeat {}))
        );
    }

    #[test]
    fn json_takes_string_bodies_as_they_are_and_typed_ones_only_for_announced_routes() {
        let schemas = Schemas::default();
        let mut codec = Codec::Json;
        let text = r#"{"request":{"id":3,"route":"echo.echo","body":"hi"}}"#;
        let Decoded::Packet(p) = codec.decode(&Message::text(text), &schemas) else {
            panic!("not a packet");
        };
        assert_eq!(p.kind, Some(request(3, b"hi")));
        // A JSON value as body needs the route's types, which nobody announced.
        let typed = r#"{"request":{"id":5,"route":"echo.echo","body":{"body":"aGk="}}}"#;
        let Decoded::BadBody(resp) = codec.decode(&Message::text(typed), &schemas) else {
            panic!("not refused");
        };
        assert_eq!((resp.id, resp.code), (5, code::BAD_REQUEST));
        assert!(
            resp.message.contains("no announced message types"),
            "{}",
            resp.message
        );
        assert!(matches!(
            codec.decode(&Message::text("[1,2"), &schemas),
            Decoded::Invalid(INVALID_PACKET)
        ));
        let Message::Text(answer) = codec.encode(Kind::Heartbeat(client::Heartbeat {})) else {
            panic!("a text frame");
        };
        assert_eq!(answer.as_str(), r#"{"heartbeat":{}}"#);
    }

    #[test]
    fn a_push_is_encoded_once_per_codec_and_shared() {
        let schemas = Schemas::default();
        let frame = PushFrame::new(ServerPush {
            route: "chat.message".into(),
            body: b"x".to_vec().into(),
        });
        let Message::Binary(a) = Codec::Protobuf.encode_push(&frame, &schemas) else {
            panic!("binary");
        };
        let Message::Binary(b) = Codec::Protobuf.encode_push(&frame, &schemas) else {
            panic!("binary");
        };
        assert_eq!(a.as_ptr(), b.as_ptr(), "the same bytes, not a copy");
        let Message::Text(json) = Codec::Json.encode_push(&frame, &schemas) else {
            panic!("text");
        };
        assert!(
            json.as_str().contains(r#""route":"chat.message""#),
            "{json}"
        );
    }
    #[test]
    fn a_numbered_push_is_the_shared_frame_with_its_seq() {
        let schemas = Schemas::default();
        let frame = PushFrame::new(ServerPush {
            route: "chat.message".into(),
            body: vec![7; 200].into(),
        });
        for seq in [1, 300, u64::MAX] {
            let Message::Binary(b) =
                Codec::numbered_push(&Codec::Protobuf.encode_push(&frame, &schemas), seq)
            else {
                panic!("binary");
            };
            let expected = Packet::new(Kind::Push(client::Push {
                route: "chat.message".into(),
                body: vec![7; 200].into(),
                seq,
            }));
            assert_eq!(b, frame::encode_binary(&expected), "seq {seq}");
            let Message::Text(t) =
                Codec::numbered_push(&Codec::Json.encode_push(&frame, &schemas), seq)
            else {
                panic!("text");
            };
            assert_eq!(frame::decode_text(t.as_str()).unwrap(), expected);
        }
    }
}
