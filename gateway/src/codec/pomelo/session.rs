//! One pomelo session's codec: what the session core hears (handshake, request,
//! notify, heartbeat) and what it says (handshake answer, response, push, heartbeat,
//! kick), in pomelo packages. Its state is the handshake-ack step and the dictionary
//! version the handshake gave the client.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use proto::client::{self, Packet, packet::Kind};
use proto::code;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use super::wire::{self, MessageKind, PackageType, Route, WireError};
use crate::codec::{Decoded, answer_as_json, push_as_json, request_body};

/// The route of the push that tells a pomelo client its gate is draining (see
/// `docs/pomelo.md`): body `{"reason", "graceMs"}`.
pub(crate) const DRAIN_ROUTE: &str = "sys.drain";
use crate::schema::{Dict, Schemas};

/// The `serializer` a handshake answer names: bodies are JSON (no pomelo-protobuf).
const SERIALIZER: &str = "json";

/// A pomelo session's state.
#[derive(Debug, Default)]
pub(crate) struct PomeloCodec {
    /// The client acknowledged the handshake answer: data may flow.
    acked: bool,
    /// The dictionary its handshake answer gave the client.
    dict: Arc<Dict>,
}

impl PomeloCodec {
    /// Decodes a frame's packages. One package (the usual frame) is one event; a frame
    /// holding several is [`Decoded::Many`].
    pub fn decode(&mut self, frame: &Message, schemas: &Schemas) -> Decoded {
        let Message::Binary(bytes) = frame else {
            return Decoded::Invalid("pomelo packages are binary");
        };
        let packages = match wire::parse_packages(bytes.clone(), wire::MAX_BODY_LEN) {
            Ok(packages) => packages,
            Err(e) => return Decoded::Invalid(reason(e)),
        };
        let mut decoded: Vec<Decoded> = packages
            .into_iter()
            .map(|p| self.package(p, schemas))
            .collect();
        match decoded.len() {
            1 => decoded.pop().unwrap_or(Decoded::Invalid("empty frame")),
            0 => Decoded::Invalid("empty frame"),
            _ => Decoded::Many(decoded),
        }
    }

    fn package(&mut self, package: wire::Package, schemas: &Schemas) -> Decoded {
        match package.kind {
            PackageType::Handshake => self.handshake(&package.body, schemas),
            // The session core answers a heartbeat with one: after the ack that is
            // pomelo's first server heartbeat, which starts the client's own.
            PackageType::HandshakeAck => {
                self.acked = true;
                heartbeat()
            }
            PackageType::Heartbeat => heartbeat(),
            PackageType::Data if !self.acked => Decoded::Invalid("data before handshake ack"),
            PackageType::Data => self.data(&package.body, schemas),
            PackageType::Kick => Decoded::Invalid("package not for the gate"),
        }
    }

    /// A handshake `{sys, user}`: the token is `user.token`. Takes the gate's current
    /// dictionary as this session's.
    fn handshake(&mut self, body: &[u8], schemas: &Schemas) -> Decoded {
        let json: Value = if body.is_empty() {
            Value::Object(Default::default())
        } else {
            match serde_json::from_slice(body) {
                Ok(json) => json,
                Err(_) => return Decoded::Invalid("handshake is not JSON"),
            }
        };
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        self.dict = schemas.pomelo.current();
        Decoded::Packet(Packet::new(Kind::Handshake(client::Handshake {
            token: text(&json["user"]["token"]),
            client: text(&json["sys"]["type"]),
            ..Default::default()
        })))
    }

    /// A request or notify; a body is JSON, transcoded when its route is typed.
    fn data(&self, body: &[u8], schemas: &Schemas) -> Decoded {
        let message = match wire::parse_message(body) {
            Ok(message) => message,
            Err(e) => return Decoded::Invalid(reason(e)),
        };
        if message.gzip {
            return Decoded::Invalid("gzip bodies are not supported");
        }
        let id = match message.kind {
            MessageKind::Request(0) => return Decoded::Invalid("request id 0"),
            MessageKind::Request(id) => id,
            MessageKind::Notify => 0,
            MessageKind::Response(_) | MessageKind::Push => {
                return Decoded::Invalid("message not for the gate");
            }
        };
        let route: Cow<'_, str> = match message.route {
            Route::Name(name) => shaddock_route(name),
            Route::Code(code) => match self.dict.route(code) {
                Some(route) => Cow::Owned(route.to_string()),
                None => return Decoded::Invalid("unknown route code"),
            },
            Route::None => return Decoded::Invalid("message without a route"),
        };
        let body = match request_body(&route, message.body, schemas) {
            Some(Ok(body)) => body,
            None => Bytes::copy_from_slice(message.body),
            Some(Err(message)) => {
                return Decoded::BadBody(client::Response {
                    id,
                    code: code::BAD_REQUEST,
                    message,
                    ..Default::default()
                });
            }
        };
        // The pomelo wire has no place for a key: a keyed service routes a pomelo
        // client's requests by the session value it names, else the uid.
        Decoded::Packet(Packet::new(Kind::Request(client::Request {
            id,
            route: route.into_owned(),
            body,
            key: String::new(),
        })))
    }

    /// The frame of a packet the session core sends.
    pub fn encode(&self, kind: Kind) -> Message {
        let bytes = match kind {
            Kind::HandshakeAck(ack) => self.handshake_answer(&ack),
            Kind::Heartbeat(_) => wire::encode_package(PackageType::Heartbeat, &[]),
            Kind::Kick(kick) => {
                let body = serde_json::json!({ "reason": kick.reason }).to_string();
                wire::encode_package(PackageType::Kick, body.as_bytes())
            }
            Kind::Response(resp) => response(&resp, false),
            Kind::Push(push) => message(MessageKind::Push, Route::Name(&push.route), &push.body),
            // Pomelo has no such package: a push on a route of its own, which a client
            // that knows it moves on and any other ignores.
            Kind::Drain(drain) => {
                let body = serde_json::json!({ "reason": drain.reason, "graceMs": drain.grace_ms });
                message(
                    MessageKind::Push,
                    Route::Name(DRAIN_ROUTE),
                    body.to_string().as_bytes(),
                )
            }
            // Client packets: a gate never sends them. Pomelo has no token refresh, so
            // no RefreshAck is ever asked of a pomelo session (an expiring token kicks),
            // and no resume.
            Kind::Handshake(_)
            | Kind::Request(_)
            | Kind::Refresh(_)
            | Kind::RefreshAck(_)
            | Kind::Ack(_) => Bytes::new(),
        };
        Message::Binary(bytes)
    }

    /// `{code, sys: {heartbeat, dict, serializer}}`; a refusal is `{code, msg}`.
    fn handshake_answer(&self, ack: &client::HandshakeAck) -> Bytes {
        let body = if ack.code == code::OK {
            let dict = if self.dict.json.is_empty() {
                "{}"
            } else {
                &self.dict.json
            };
            format!(
                r#"{{"code":{},"sys":{{"heartbeat":{},"dict":{dict},"serializer":"{SERIALIZER}"}}}}"#,
                ack.code,
                heartbeat_secs(ack.heartbeat_ms),
            )
        } else {
            serde_json::json!({ "code": ack.code, "msg": ack.message }).to_string()
        };
        wire::encode_package(PackageType::Handshake, body.as_bytes())
    }

    /// A response for `route`: a success carries the body as JSON, an error the error
    /// flag and `{"code", "msg"}`.
    pub fn encode_response(
        &self,
        mut resp: client::Response,
        route: &str,
        schemas: &Schemas,
    ) -> Message {
        let json = resp.code == code::OK && answer_as_json(&mut resp, route, schemas);
        Message::Binary(response(&resp, json))
    }

    /// The push frame this session takes: by code when its dictionary has the route.
    pub fn push_frame(&self, push: &PomeloPush) -> Message {
        match &push.coded {
            Some((code, frame)) if self.dict.knows(*code) => Message::Binary(frame.clone()),
            _ => Message::Binary(push.plain.clone()),
        }
    }
}

/// A push as pomelo data packages, made once per gate: with the route as a string,
/// and by its code when the gate's dictionary has one.
#[derive(Debug)]
pub(crate) struct PomeloPush {
    plain: Bytes,
    coded: Option<(u16, Bytes)>,
}

impl PomeloPush {
    pub fn new(push: &client::Push, schemas: &Schemas) -> PomeloPush {
        let json = push_as_json(push, schemas);
        let body = json.as_deref().map_or(&push.body[..], str::as_bytes);
        let coded = schemas
            .pomelo
            .current()
            .code(&push.route)
            .map(|code| (code, message(MessageKind::Push, Route::Code(code), body)));
        PomeloPush {
            plain: message(MessageKind::Push, Route::Name(&push.route), body),
            coded,
        }
    }
}

/// How often a pomelo client is told to beat: whole seconds, at least one.
pub(crate) fn heartbeat_secs(ms: u32) -> u32 {
    ms.div_ceil(1000).max(1)
}

fn heartbeat() -> Decoded {
    Decoded::Packet(Packet::new(Kind::Heartbeat(client::Heartbeat {})))
}

fn message(kind: MessageKind, route: Route<'_>, body: &[u8]) -> Bytes {
    wire::encode_message(&wire::Message {
        kind,
        route,
        error: false,
        gzip: false,
        body,
    })
}

/// A response package; `json` says the body is the answer's JSON already.
fn response(resp: &client::Response, json: bool) -> Bytes {
    if resp.code == code::OK {
        let body = if json || !resp.body.is_empty() {
            &resp.body[..]
        } else {
            b"{}"
        };
        return message(MessageKind::Response(resp.id), Route::None, body);
    }
    let body = serde_json::json!({ "code": resp.code, "msg": resp.message }).to_string();
    wire::encode_message(&wire::Message {
        kind: MessageKind::Response(resp.id),
        route: Route::None,
        error: true,
        gzip: false,
        body: body.as_bytes(),
    })
}

/// The Shaddock route of a pomelo route: `serverType.handler.method` is service
/// `serverType`, method `method`; the handler token is checked but not used. Any other
/// shape goes on as it is, for the session core's route check to judge.
fn shaddock_route(route: &str) -> Cow<'_, str> {
    let mut tokens = route.splitn(3, '.');
    let (Some(service), Some(handler), Some(method)) =
        (tokens.next(), tokens.next(), tokens.next())
    else {
        return Cow::Borrowed(route);
    };
    if !is_handler(handler) {
        return Cow::Borrowed(route);
    }
    Cow::Owned(format!("{service}.{method}"))
}

/// A handler token: ASCII letters of either case (pomelo's `chatHandler`), digits,
/// `_` and `-`. It never reaches a subject, so case is harmless.
fn is_handler(token: &str) -> bool {
    !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn reason(e: WireError) -> &'static str {
    match e {
        WireError::PackageType => "unknown package type",
        WireError::TooLarge => "package too large",
        WireError::Truncated => "truncated package",
        WireError::MessageType => "unknown message type",
        WireError::TruncatedMessage => "truncated message",
        WireError::Id => "message id too long",
        WireError::Route => "route is not UTF-8",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: PackageType, body: &[u8]) -> Message {
        Message::Binary(wire::encode_package(kind, body))
    }

    fn data(kind: MessageKind, route: Route<'_>, body: &[u8]) -> Message {
        Message::Binary(message(kind, route, body))
    }

    fn request(decoded: Decoded) -> client::Request {
        match decoded {
            Decoded::Packet(Packet {
                kind: Some(Kind::Request(req)),
            }) => req,
            other => panic!("not a request: {other:?}"),
        }
    }

    fn invalid(decoded: Decoded) -> &'static str {
        match decoded {
            Decoded::Invalid(reason) => reason,
            other => panic!("not invalid: {other:?}"),
        }
    }

    /// A codec past its handshake and ack, with `chat`'s routes in the dictionary.
    fn acked(schemas: &Schemas) -> PomeloCodec {
        schemas
            .pomelo
            .add("chat", &["join", "say"], &["chat.message"]);
        let mut codec = PomeloCodec::default();
        let hello = frame(
            PackageType::Handshake,
            br#"{"sys":{"type":"js"},"user":{"token":"t"}}"#,
        );
        match codec.decode(&hello, schemas) {
            Decoded::Packet(Packet {
                kind: Some(Kind::Handshake(h)),
            }) => {
                assert_eq!((h.token.as_str(), h.client.as_str()), ("t", "js"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            codec.decode(&frame(PackageType::HandshakeAck, &[]), schemas),
            Decoded::Packet(Packet {
                kind: Some(Kind::Heartbeat(_))
            })
        ));
        codec
    }

    #[test]
    fn routes_map_by_string_and_by_code() {
        let schemas = Schemas::default();
        let mut codec = acked(&schemas);
        let by_name = data(
            MessageKind::Request(3),
            Route::Name("chat.chatHandler.say"),
            b"\"x\"",
        );
        let req = request(codec.decode(&by_name, &schemas));
        assert_eq!(
            (req.id, req.route.as_str(), &req.body[..]),
            (3, "chat.say", &b"\"x\""[..])
        );
        let by_code = data(MessageKind::Notify, Route::Code(2), b"{}");
        let req = request(codec.decode(&by_code, &schemas));
        assert_eq!((req.id, req.route.as_str()), (0, "chat.say"));
        // Not three tokens, or a bad handler: left for the core's route check.
        for route in ["echo.echo", "a.b.c.d", "a.b c.d", "a..b"] {
            let req = data(MessageKind::Request(1), Route::Name(route), b"");
            let expected = if route == "a.b.c.d" { "a.c.d" } else { route };
            assert_eq!(request(codec.decode(&req, &schemas)).route, expected);
        }
    }

    #[test]
    fn bad_input_closes_with_a_reason() {
        let schemas = Schemas::default();
        let mut fresh = PomeloCodec::default();
        let req = data(MessageKind::Request(1), Route::Name("a.b.c"), b"");
        assert_eq!(
            invalid(fresh.decode(&req, &schemas)),
            "data before handshake ack"
        );
        let mut codec = acked(&schemas);
        for (frame, why) in [
            (
                data(MessageKind::Request(1), Route::Code(9), b""),
                "unknown route code",
            ),
            (
                data(MessageKind::Request(0), Route::Name("a.b.c"), b""),
                "request id 0",
            ),
            (
                data(MessageKind::Push, Route::Name("a.b"), b""),
                "message not for the gate",
            ),
            (
                Message::Binary(Bytes::from_static(&[4, 0, 0, 9, 0])),
                "truncated package",
            ),
            (
                Message::Binary(Bytes::from_static(&[9, 0, 0, 0])),
                "unknown package type",
            ),
            (Message::text("{}"), "pomelo packages are binary"),
            (frame(PackageType::Kick, b""), "package not for the gate"),
            (
                frame(PackageType::Data, &[0x12, 1, b'x']),
                "gzip bodies are not supported",
            ),
        ] {
            assert_eq!(invalid(codec.decode(&frame, &schemas)), why);
        }
        let hello = frame(PackageType::Handshake, b"{not json");
        assert_eq!(
            invalid(PomeloCodec::default().decode(&hello, &schemas)),
            "handshake is not JSON"
        );
    }

    #[test]
    fn the_handshake_answer_carries_heartbeat_dict_and_serializer() {
        let schemas = Schemas::default();
        let codec = acked(&schemas);
        let ack = client::HandshakeAck {
            code: 200,
            heartbeat_ms: 1500,
            ..Default::default()
        };
        let Message::Binary(bytes) = codec.encode(Kind::HandshakeAck(ack)) else {
            panic!()
        };
        assert_eq!(bytes[0], PackageType::Handshake as u8);
        let json: Value = serde_json::from_slice(&bytes[4..]).unwrap();
        assert_eq!(json["code"], 200);
        assert_eq!(json["sys"]["heartbeat"], 2);
        assert_eq!(json["sys"]["serializer"], "json");
        assert_eq!(json["sys"]["dict"]["chat.chat.join"], 1);
        let refused = client::HandshakeAck {
            code: 401,
            message: "no".into(),
            ..Default::default()
        };
        let Message::Binary(bytes) = codec.encode(Kind::HandshakeAck(refused)) else {
            panic!()
        };
        assert_eq!(&bytes[4..], br#"{"code":401,"msg":"no"}"#);
        assert_eq!(heartbeat_secs(0), 1);
        assert_eq!(heartbeat_secs(10_000), 10);
    }

    #[test]
    fn errors_set_the_flag_and_carry_code_and_msg() {
        let codec = PomeloCodec::default();
        let resp = client::Response {
            id: 7,
            code: 404,
            message: "none".into(),
            ..Default::default()
        };
        let Message::Binary(bytes) = codec.encode(Kind::Response(resp)) else {
            panic!()
        };
        let message = wire::parse_message(&bytes[4..]).unwrap();
        assert!(message.error);
        assert_eq!(message.kind, MessageKind::Response(7));
        assert_eq!(message.body, br#"{"code":404,"msg":"none"}"#);
        let kick = codec.encode(Kind::Kick(client::Kick {
            reason: "bye".into(),
        }));
        assert_eq!(kick, frame(PackageType::Kick, br#"{"reason":"bye"}"#));
    }

    #[test]
    fn a_drain_is_a_push_on_its_own_route() {
        let codec = PomeloCodec::default();
        let drain = codec.encode(Kind::Drain(client::Drain {
            reason: "gate shutting down".into(),
            grace_ms: 5000,
        }));
        assert_eq!(
            drain,
            data(
                MessageKind::Push,
                Route::Name(DRAIN_ROUTE),
                br#"{"graceMs":5000,"reason":"gate shutting down"}"#
            )
        );
    }

    #[test]
    fn pushes_go_by_code_only_to_sessions_whose_dictionary_has_it() {
        let schemas = Schemas::default();
        let old = acked(&schemas);
        schemas.pomelo.add("room", &[], &["room.news"]);
        let new = acked(&schemas);
        let push = client::Push {
            route: "room.news".into(),
            body: Bytes::from_static(b"1"),
            seq: 0,
        };
        let frames = PomeloPush::new(&push, &schemas);
        let route = |m: Message| match m {
            Message::Binary(b) => format!("{:?}", wire::parse_message(&b[4..]).unwrap().route),
            _ => panic!(),
        };
        assert_eq!(route(old.push_frame(&frames)), "Name(\"room.news\")");
        assert_eq!(route(new.push_frame(&frames)), "Code(4)");
    }
}
