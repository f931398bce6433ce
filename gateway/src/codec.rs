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

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use proto::Message as _;
use proto::client::{self, Packet, packet::Kind};
use proto::code;
use proto::rpc::ServerPush;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::schema::{Schemas, json_to_protobuf, protobuf_to_json};

/// How one session's frames are encoded: fixed by its first frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    Protobuf,
    Json,
}

/// What a data frame held.
#[derive(Debug)]
pub(crate) enum Decoded {
    Packet(Packet),
    /// A request whose typed body cannot be transcoded: answer it with this 400 (unless
    /// it is a notify, id 0) and go on.
    BadBody(client::Response),
    /// Not a packet at all: the session closes.
    Invalid,
}

impl Codec {
    /// The codec a session's first frame speaks.
    pub fn of(first: &Message) -> Codec {
        if matches!(first, Message::Text(_)) {
            Codec::Json
        } else {
            Codec::Protobuf
        }
    }

    /// Decodes a binary or text frame (control frames are the caller's).
    pub fn decode(self, frame: &Message, schemas: &Schemas) -> Decoded {
        let (mut packet, typed) = match frame {
            Message::Binary(b) => match Packet::decode(b.clone()) {
                Ok(packet) => (packet, false),
                Err(_) => return Decoded::Invalid,
            },
            Message::Text(t) => match proto::json::decode_typed(t.as_str()) {
                Ok(decoded) => decoded,
                Err(_) => return Decoded::Invalid,
            },
            _ => return Decoded::Invalid,
        };
        if typed && let Some(Kind::Request(req)) = &mut packet.kind {
            match typed_body(req, schemas) {
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
    pub fn encode(self, kind: Kind) -> Message {
        let packet = Packet::new(kind);
        match self {
            Codec::Protobuf => Message::binary(packet.encode_to_vec()),
            Codec::Json => Message::text(proto::json::encode(&packet).unwrap_or_default()),
        }
    }

    /// A frame answering a request for `route`. For JSON, a successful answer of a
    /// route with known types carries its body as JSON; a body that is not the
    /// announced type is answered 500.
    pub fn encode_response(
        self,
        mut resp: client::Response,
        route: &str,
        schemas: &Schemas,
    ) -> Message {
        if self == Codec::Protobuf || resp.code != code::OK {
            return self.encode(Kind::Response(resp));
        }
        let Some(types) = schemas.method(route) else {
            return self.encode(Kind::Response(resp));
        };
        match protobuf_to_json(&types.response, &resp.body) {
            Ok(json) => resp.body = Bytes::from(json),
            Err(message) => {
                resp.code = code::HANDLER_ERROR;
                resp.message = format!("worker's answer: {message}");
                resp.body = Bytes::new();
                return self.encode(Kind::Response(resp));
            }
        }
        let packet = Packet::new(Kind::Response(resp));
        Message::text(proto::json::encode_typed(&packet, true).unwrap_or_default())
    }

    /// The frame of a push, made once per gate for each codec that needs it.
    pub fn encode_push(self, push: &PushFrame, schemas: &Schemas) -> Message {
        match self {
            Codec::Protobuf => Message::Binary(push.binary.clone()),
            Codec::Json => Message::Text(push.json(schemas)),
        }
    }
}

/// A typed JSON request body as protobuf, by the route's announced request type.
fn typed_body(req: &client::Request, schemas: &Schemas) -> Result<Bytes, String> {
    let Some(types) = schemas.method(&req.route) else {
        return Err(format!(
            "route {} has no announced message types: send its body as a JSON string",
            req.route
        ));
    };
    json_to_protobuf(&types.request, &req.body)
        .map(Bytes::from)
        .map_err(|e| format!("bad request body: {e}"))
}

/// A push encoded once for every local recipient, in both frame encodings; the JSON
/// form is made only if some recipient speaks JSON.
#[derive(Debug)]
pub(crate) struct PushFrame {
    pub binary: Bytes,
    packet: Packet,
    json: OnceLock<Utf8Bytes>,
}

impl PushFrame {
    pub fn new(push: ServerPush) -> Arc<PushFrame> {
        let packet = Packet::new(Kind::Push(client::Push {
            route: push.route,
            body: push.body,
        }));
        Arc::new(PushFrame {
            binary: packet.encode_to_vec().into(),
            packet,
            json: OnceLock::new(),
        })
    }

    /// The JSON frame: the body as a JSON value when the push route's type is known
    /// and the body is one, else as a string.
    fn json(&self, schemas: &Schemas) -> Utf8Bytes {
        self.json
            .get_or_init(|| {
                let Some(Kind::Push(push)) = &self.packet.kind else {
                    return Utf8Bytes::default();
                };
                let typed = schemas
                    .push(&push.route)
                    .and_then(|t| protobuf_to_json(&t, &push.body).ok());
                match typed {
                    Some(json) => {
                        let packet = Packet::new(Kind::Push(client::Push {
                            route: push.route.clone(),
                            body: Bytes::from(json),
                        }));
                        proto::json::encode_typed(&packet, true)
                    }
                    None => proto::json::encode(&self.packet),
                }
                .unwrap_or_default()
                .into()
            })
            .clone()
    }
}
