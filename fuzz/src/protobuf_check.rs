//! The gate's protobuf codec (binary frames) as executable checks, shared by the fuzz
//! target `client_protobuf` and `gateway/tests/decoder_props.rs`.
//!
//! A frame must decode exactly as prost decodes a `Packet` (else close with "invalid
//! packet"), agree with the SDK's decoder, come back unchanged from the gate's own
//! encoding, and hold no more heap than a small multiple of its size.

use bytes::Bytes;
use gateway::fuzzing::{Decoded, Message, Session};
use proto::Message as _;
use proto::client::Packet;

use crate::gate_fixture::{Meter, assert_bounded};

/// Heap per input byte a binary frame may take: strings are copied once, bodies are
/// slices of the frame.
const PER_BYTE: usize = 2;

/// Checks one binary frame against a protobuf session (see
/// [`crate::gate_fixture::typed_session`]).
pub fn check(frame: &[u8], session: &mut Session, meter: Meter) {
    let message = Message::Binary(Bytes::copy_from_slice(frame));
    let decoded = assert_bounded(meter, "protobuf frame", frame.len(), PER_BYTE, || {
        session.decode(&message)
    });
    let sdk = proto::frame::decode_binary(Bytes::copy_from_slice(frame)).ok();
    match (Packet::decode(frame), decoded) {
        (Ok(packet), Decoded::Packet(got)) => {
            assert_eq!(got, packet, "the codec decoded otherwise than prost");
            assert_eq!(sdk.as_ref(), Some(&packet), "the SDK decoded otherwise");
            round_trip(session, packet);
        }
        (Err(_), Decoded::Invalid(reason)) => {
            assert_eq!(reason, "invalid packet");
            assert_eq!(sdk, None, "the SDK took a frame the gate refuses");
        }
        (prost, got) => panic!("prost says {prost:?}, the codec {got:?}"),
    }
}

/// What the gate encodes from a decoded packet decodes to it again: the encoding is
/// prost's canonical one, whatever the client's was.
fn round_trip(session: &mut Session, packet: Packet) {
    let Some(kind) = packet.kind.clone() else {
        return;
    };
    let encoded = session.encode(kind);
    let Message::Binary(bytes) = &encoded else {
        panic!("a protobuf session sent a non-binary frame: {encoded:?}");
    };
    assert_eq!(
        bytes[..],
        packet.encode_to_vec()[..],
        "not prost's encoding"
    );
    assert_eq!(
        session.decode(&encoded),
        Decoded::Packet(packet),
        "the gate's own frame did not round trip"
    );
}
