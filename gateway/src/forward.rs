//! What the gate publishes for a request, built without per-request copies of what only
//! changes with the session.
//!
//! An [`RpcRequest`](proto::rpc::RpcRequest) carries the session (gate id, sid, uid,
//! data), which changes only on a bind or a data effect. Building the prost struct for
//! every request cloned all of it; [`SessionWire`] keeps the session encoded instead, and
//! [`Request`] writes the request's fields around it ([`proto::wire`]) straight into the
//! bus connection's outbound buffer; the tests compare the bytes with prost's.

use bytes::{Bytes, BytesMut};
use proto::Message as _;
use proto::{rpc, wire};

/// `RpcRequest` field numbers (proto/rpc.proto).
const ROUTE: u32 = 1;
const BODY: u32 = 2;
const SESSION: u32 = 3;
const TIMING: u32 = 4;
const KEY: u32 = 5;
const TIMEOUT_MS: u32 = 6;
const ORIGIN: u32 = 8;
const SEQ: u32 = 9;

/// A session as every request of it carries it, encoded once per change.
pub(crate) struct SessionWire {
    session: rpc::Session,
    encoded: Bytes,
}

impl SessionWire {
    pub(crate) fn new(gate: &str, sid: u64) -> Self {
        let session = rpc::Session {
            gate: gate.to_owned(),
            sid,
            ..Default::default()
        };
        let encoded = session.encode_to_vec().into();
        SessionWire { session, encoded }
    }

    pub(crate) fn get(&self) -> &rpc::Session {
        &self.session
    }

    /// Changes the session (a bind, a data effect) and encodes it anew.
    pub(crate) fn update(&mut self, change: impl FnOnce(&mut rpc::Session)) {
        change(&mut self.session);
        self.encoded = self.session.encode_to_vec().into();
    }
}

/// `RpcRequest { route, body, session, timing, key, timeout_ms, origin, seq }`, to be written straight into the
/// bus connection's outbound buffer: its exact length first, then its bytes.
pub(crate) struct Request<'a> {
    pub route: &'a str,
    pub body: &'a [u8],
    pub session: &'a SessionWire,
    pub timing: bool,
    /// A keyed service's key; empty for others.
    pub key: &'a str,
    /// How long the gate still waits for the answer, in ms (0 for a notify).
    pub timeout_ms: u32,
    /// A keyed request's ordering (docs/workers.md, "Hand-over"): the session's reply
    /// prefix and its number among the session's keyed requests; empty and 0 for others.
    pub origin: &'a str,
    pub seq: u64,
}

impl Request<'_> {
    /// The encoded length.
    pub(crate) fn len(&self) -> usize {
        wire::bytes_len(ROUTE, self.route.len())
            + wire::bytes_len(BODY, self.body.len())
            + wire::message_len(SESSION, self.session.encoded.len())
            + wire::varint_len(TIMING, u64::from(self.timing))
            + wire::bytes_len(KEY, self.key.len())
            + wire::varint_len(TIMEOUT_MS, u64::from(self.timeout_ms))
            + wire::bytes_len(ORIGIN, self.origin.len())
            + wire::varint_len(SEQ, self.seq)
    }

    /// Appends the encoding, [`Request::len`] bytes, to `buf`.
    pub(crate) fn put(&self, buf: &mut BytesMut) {
        wire::put_bytes(buf, ROUTE, self.route.as_bytes());
        wire::put_bytes(buf, BODY, self.body);
        wire::put_message(buf, SESSION, &self.session.encoded);
        wire::put_varint(buf, TIMING, u64::from(self.timing));
        wire::put_bytes(buf, KEY, self.key.as_bytes());
        wire::put_varint(buf, TIMEOUT_MS, u64::from(self.timeout_ms));
        wire::put_bytes(buf, ORIGIN, self.origin.as_bytes());
        wire::put_varint(buf, SEQ, self.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_prost(
        route: &str,
        body: &[u8],
        session: &rpc::Session,
        timing: bool,
        timeout_ms: u32,
    ) -> Vec<u8> {
        rpc::RpcRequest {
            route: route.to_owned(),
            body: Bytes::copy_from_slice(body),
            session: Some(session.clone()),
            timing,
            key: if timing {
                "match-7".into()
            } else {
                String::new()
            },
            timeout_ms,
            trace: Vec::new(),
            origin: if timing {
                "shaddock.gw.g1.7".into()
            } else {
                String::new()
            },
            seq: if timing { u64::from(timeout_ms) + 1 } else { 0 },
        }
        .encode_to_vec()
    }

    #[test]
    fn bytes_are_prosts() {
        let mut wire = SessionWire::new("g1", 7);
        let long_body = vec![0xab; 300];
        let cases: [(&str, &[u8], bool, u32); 4] = [
            ("echo.raw", b"Hello World #0042", true, 10_000),
            ("chat.members", b"", false, 1),
            ("", b"", false, 0),
            ("chat.send", &long_body, true, u32::MAX),
        ];
        for step in 0..3 {
            match step {
                1 => wire.update(|s| s.uid = "player-1".into()),
                2 => wire.update(|s| {
                    s.data.insert("room".into(), "lobby".into());
                    s.data.insert("level".into(), "3".into());
                }),
                _ => {}
            }
            for (route, body, timing, timeout_ms) in cases {
                let request = Request {
                    route,
                    body,
                    session: &wire,
                    timing,
                    key: if timing { "match-7" } else { "" },
                    timeout_ms,
                    origin: if timing { "shaddock.gw.g1.7" } else { "" },
                    seq: if timing { u64::from(timeout_ms) + 1 } else { 0 },
                };
                let mut ours = BytesMut::new();
                request.put(&mut ours);
                assert_eq!(
                    ours.len(),
                    request.len(),
                    "the length computed up front is exact"
                );
                let ours = ours.freeze();
                assert_eq!(
                    &ours[..],
                    by_prost(route, body, wire.get(), timing, timeout_ms),
                    "{route:?} step {step}"
                );
                let decoded = rpc::RpcRequest::decode(ours).expect("decodes");
                assert_eq!(decoded.session.as_ref(), Some(wire.get()));
                assert_eq!(decoded.route, route);
                assert_eq!(&decoded.body[..], body);
                assert_eq!(decoded.timing, timing);
                assert_eq!(decoded.key, request.key);
                assert_eq!(decoded.timeout_ms, timeout_ms);
                assert_eq!(decoded.origin, request.origin);
                assert_eq!(decoded.seq, request.seq);
            }
        }
    }
}
