//! The client-facing decoders, reachable from outside the crate for the fuzz targets in
//! `fuzz/` and the seeded property tests that share their oracles
//! (`gateway/tests/decoder_props.rs`). Not an API: hidden from the docs, and nothing
//! here decides anything; it only hands a session's codec and a gate's schemas to a
//! caller that has no gate.

use crate::codec::{self, Codec};
use crate::schema::Schemas;
use bytes::Bytes;
use proto::client::{self, Packet, packet::Kind};

pub use crate::codec::pomelo::wire;
pub use crate::upgrade::{HeadError, MAX_HEADERS, Request as Head, parse_head};
pub use tokio_tungstenite::tungstenite::Message;

/// What a data frame held: the session core's view of it (`codec::Decoded`).
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    Packet(Packet),
    /// A request whose typed body did not transcode, and the 400 it is answered.
    BadBody(client::Response),
    /// Not a packet: the session closes with this reason.
    Invalid(&'static str),
    /// A JSON packet with a field its kind has not: the session closes naming it.
    UnknownField(String),
    /// Several packets of one frame (pomelo), in order.
    Many(Vec<Decoded>),
}

impl From<codec::Decoded> for Decoded {
    fn from(decoded: codec::Decoded) -> Decoded {
        match decoded {
            codec::Decoded::Packet(packet) => Decoded::Packet(packet),
            codec::Decoded::BadBody(response) => Decoded::BadBody(response),
            codec::Decoded::Invalid(reason) => Decoded::Invalid(reason),
            codec::Decoded::UnknownField(name) => Decoded::UnknownField(name),
            codec::Decoded::Many(many) => Decoded::Many(many.into_iter().map(Into::into).collect()),
        }
    }
}

/// One session's codec with a gate's announced types, as the session core uses them.
pub struct Session {
    codec: Codec,
    schemas: Schemas,
}

impl Session {
    /// The codec a session whose first frame is `first` speaks; no types known yet.
    pub fn for_first_frame(first: &Message) -> Session {
        Session {
            codec: Codec::of(first),
            schemas: Schemas::default(),
        }
    }

    /// Starts another session on the same gate: the codec `first` picks, fresh, with
    /// the types learnt so far.
    pub fn restart(&mut self, first: &Message) {
        self.codec = Codec::of(first);
    }

    /// Takes a worker's schema announcement (`rpc::ServiceSchema`, encoded) as the gate
    /// does; returns the service it was for.
    pub fn learn(&self, announcement: Bytes) -> Result<String, String> {
        self.schemas.learn(announcement).map_err(|e| e.to_string())
    }

    /// Decodes a binary or text frame.
    pub fn decode(&mut self, frame: &Message) -> Decoded {
        self.codec.decode(frame, &self.schemas).into()
    }

    /// The frame of a packet the gate sends (bodies not transcoded).
    pub fn encode(&self, kind: Kind) -> Message {
        self.codec.encode(kind)
    }

    /// The frame answering a request for `route`: bodies of typed routes as JSON for the
    /// JSON and pomelo codecs.
    pub fn encode_response(&self, response: client::Response, route: &str) -> Message {
        self.codec.encode_response(response, route, &self.schemas)
    }
}
