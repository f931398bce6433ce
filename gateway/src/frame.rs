//! WebSocket frames ↔ client packets: binary frames carry protobuf, text frames the
//! same packet as JSON, bodies as they are (no transcoding: that needs the gate's
//! announced types, see the gate's codec). For the SDK and anything else that speaks
//! the client protocol without a gate's schemas (the load test's bare echo server).

use proto::Message as _;
use proto::client::Packet;
use tokio_tungstenite::tungstenite::Message;

/// The packet a data frame carries; `None` for control frames and undecodable data.
pub fn decode(frame: &Message) -> Option<Packet> {
    match frame {
        Message::Binary(b) => Packet::decode(b.clone()).ok(),
        Message::Text(t) => proto::json::decode(t.as_str()).ok(),
        _ => None,
    }
}

/// A frame carrying `packet`, as JSON text when `text`, else as protobuf.
pub fn encode(packet: &Packet, text: bool) -> Message {
    if text {
        Message::text(proto::json::encode(packet).unwrap_or_default())
    } else {
        Message::binary(packet.encode_to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::client::{Heartbeat, packet::Kind};

    #[test]
    fn both_encodings_round_trip() {
        let packet = Packet::new(Kind::Heartbeat(Heartbeat {}));
        for text in [false, true] {
            assert_eq!(decode(&encode(&packet, text)), Some(packet.clone()));
        }
        assert_eq!(decode(&Message::Ping(Default::default())), None);
        assert_eq!(decode(&Message::binary(vec![0xff, 0xff])), None);
    }
}
