//! The gate's JSON codec (text frames) with typed-body transcoding as executable checks,
//! shared by the fuzz target `client_json` and `gateway/tests/decoder_props.rs`.
//!
//! A frame must decode as `proto::json` reads it, with a typed body transcoded by its
//! route's announced type (or answered 400, never a panic); a typed body that transcodes
//! must come back as the same protobuf after a trip through the gate's JSON answer
//! (the `mirror` routes answer in their request type); a packet with text bodies must
//! round trip through the gate's encoding; and the heap held stays linear in the frame.

use gateway::fuzzing::{Decoded, Message, Session};
use proto::client::{self, Packet, packet::Kind};
use proto::code;

use crate::gate_fixture::{MIRROR_ROUTES, Meter, assert_bounded, is_typed};

/// Heap per input byte a text frame may take: the parsed JSON, the typed body's raw
/// text, the dynamic message and its encoding each hold at most about the frame.
const PER_BYTE: usize = 16;

/// Checks one text frame (bytes that are not UTF-8 are replaced, as only text can be
/// sent in a text frame) against a JSON session with the built-in types.
pub fn check(input: &[u8], session: &mut Session, meter: Meter) {
    let text = String::from_utf8_lossy(input).into_owned();
    let message = Message::text(text.clone());
    let decoded = assert_bounded(meter, "JSON frame", text.len(), PER_BYTE, || {
        session.decode(&message)
    });
    let (packet, typed) = match proto::json::decode_typed(&text) {
        Ok(decoded) => decoded,
        Err(e) => {
            let expected = match e.unknown_field() {
                Some(name) => Decoded::UnknownField(name),
                None => Decoded::Invalid("invalid packet"),
            };
            assert_eq!(decoded, expected);
            return;
        }
    };
    match (&packet.kind, typed) {
        (Some(Kind::Request(request)), true) => check_typed(session, request, decoded),
        _ => {
            assert_eq!(decoded, Decoded::Packet(packet.clone()), "untyped packet");
            if !typed {
                round_trip(session, packet);
            }
        }
    }
}

/// A request with a typed body: transcoded, or answered 400 with its id.
fn check_typed(session: &mut Session, request: &client::Request, decoded: Decoded) {
    match decoded {
        Decoded::BadBody(response) => {
            assert_eq!(
                (response.id, response.code),
                (request.id, code::BAD_REQUEST)
            );
            assert!(!response.message.is_empty(), "a 400 without a reason");
        }
        Decoded::Packet(Packet {
            kind: Some(Kind::Request(transcoded)),
        }) => {
            assert_eq!(
                (transcoded.id, &transcoded.route),
                (request.id, &request.route)
            );
            assert!(is_typed(&request.route), "an untyped route transcoded");
            if let Some(method) = request.route.strip_prefix("mirror.") {
                assert!(MIRROR_ROUTES.iter().any(|(m, _)| *m == method));
                mirror(session, &transcoded);
            }
        }
        other => panic!("a typed request decoded as {other:?}"),
    }
}

/// Sends a transcoded body back as the answer of its `mirror` route, whose response
/// type is its request type, and reads the answer's JSON as a request again: the
/// protobuf must be the same.
fn mirror(session: &mut Session, request: &client::Request) {
    let response = client::Response {
        id: request.id,
        code: code::OK,
        body: request.body.clone(),
        ..Default::default()
    };
    let answer = session.encode_response(response, &request.route);
    let Message::Text(answer) = answer else {
        panic!("a JSON session answered in a non-text frame");
    };
    let (packet, typed) = proto::json::decode_typed(answer.as_str()).expect("the gate's JSON");
    let Some(Kind::Response(response)) = packet.kind else {
        panic!("the answer is not a response: {answer}");
    };
    assert_eq!(
        response.code,
        code::OK,
        "the answer failed: {}",
        response.message
    );
    assert!(typed, "a typed route answered with a text body");
    let again = format!(
        r#"{{"request":{{"id":{},"route":"{}","body":{}}}}}"#,
        request.id,
        request.route,
        String::from_utf8_lossy(&response.body)
    );
    match session.decode(&Message::text(again)) {
        Decoded::Packet(Packet {
            kind: Some(Kind::Request(back)),
        }) => assert_eq!(back.body, request.body, "JSON round trip changed the body"),
        other => panic!("the gate's own JSON body did not decode: {other:?}"),
    }
}

/// A packet whose bodies are text comes back from the gate's encoding unchanged.
fn round_trip(session: &mut Session, packet: Packet) {
    let Some(kind) = packet.kind.clone() else {
        return;
    };
    let encoded = session.encode(kind);
    assert_eq!(
        session.decode(&encoded),
        Decoded::Packet(packet),
        "the gate's own frame did not round trip: {encoded:?}"
    );
}
