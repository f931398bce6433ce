//! Seeded property tests for the gate's client-facing decoders, a few seconds long so
//! they run on every CI pass; the open-ended search is `scripts/fuzz.sh` with targets
//! `client_protobuf`, `client_json`, `pomelo` and `upgrade`, which check the same
//! oracles (`fuzz/src/*_check.rs`, included below) under libFuzzer.
//!
//! Each decoder gets generated valid input, which must decode to what was generated,
//! and damaged or random input, which must satisfy the oracle (never a panic, the same
//! answer however it is read, round trips, heap linear in the input). Seeds are fixed
//! so a failure reproduces; a failing case prints its input for the fuzz seeds.

#[path = "../../fuzz/src/gate_fixture.rs"]
mod gate_fixture;
#[path = "../../fuzz/src/json_check.rs"]
mod json_check;
#[path = "../../fuzz/src/pomelo_check.rs"]
mod pomelo_check;
#[path = "../../fuzz/src/protobuf_check.rs"]
mod protobuf_check;
#[path = "../../fuzz/src/upgrade_check.rs"]
mod upgrade_check;

use broker::testing::damage::{damage, replayable};
use bytes::Bytes;
use fastrand::Rng;
use gateway::fuzzing::wire::{self, MessageKind, PackageType, Route};
use gateway::fuzzing::{Decoded, Head, Message};
use proto::Message as _;
use proto::client::{self, Packet, packet::Kind};

/// The heap meter of the oracles, on `allocation-counter` (this thread only).
fn meter(f: &mut dyn FnMut()) -> usize {
    let info = allocation_counter::measure(f);
    usize::try_from(info.bytes_max).unwrap_or(usize::MAX)
}

/// Fragments that damaged input is spliced with, so that mutations often stay close to
/// the grammar: JSON punctuation and edge values, HTTP separators, varint bytes.
const FRAGMENTS: [&[u8]; 20] = [
    b"{",
    b"}",
    b"[",
    b"\"",
    b":",
    b",",
    b"null",
    b"-0",
    b"1e999",
    b"18446744073709551616",
    b"\"\\u0000\"",
    b"\\",
    b"\r\n",
    b"\r\n\r\n",
    b": ",
    b"Upgrade",
    b"websocket",
    b"\x80\x80\x80",
    b"\xff",
    b"\x00",
];

/// Generates the decoders' input, valid and damaged, from a seed.
struct Gen {
    rng: Rng,
}

impl Gen {
    fn text(&mut self, max: usize) -> String {
        let len = self.rng.usize(..=max);
        (0..len)
            .map(|_| match self.rng.u8(..8) {
                0 => char::from_u32(self.rng.u32(0x20..0x3000)).unwrap_or('x'),
                1 => ['"', '\\', '\n', '\u{0}', 'é'][self.rng.usize(..5)],
                _ => self.rng.alphanumeric(),
            })
            .collect()
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.rng.usize(..=max);
        (0..len).map(|_| self.rng.u8(..)).collect()
    }

    fn route(&mut self) -> String {
        const ROUTES: [&str; 8] = [
            "echo.echo",
            "echo.raw",
            "chat.say",
            "chat.join",
            "mirror.packet",
            "mirror.member",
            "nope.nope",
            "x",
        ];
        ROUTES[self.rng.usize(..ROUTES.len())].to_owned()
    }

    /// A packet of any kind with random fields.
    fn packet(&mut self) -> Packet {
        let kind = match self.rng.u8(..11) {
            0 => Kind::Handshake(client::Handshake {
                token: self.text(20),
                server_timing: self.rng.bool(),
                client: self.text(8),
                serial: self.rng.bool(),
                resumable: self.rng.bool(),
                resume_token: self.text(12),
                last_seq: self.rng.u64(..),
            }),
            1 => Kind::HandshakeAck(client::HandshakeAck {
                code: self.rng.u32(..),
                session_id: self.rng.u64(..),
                heartbeat_ms: self.rng.u32(..),
                message: self.text(10),
                resume_token: self.text(12),
                resume_code: self.rng.u32(..),
                last_seq: self.rng.u64(..),
            }),
            2 => Kind::Heartbeat(client::Heartbeat {}),
            3 | 4 => Kind::Request(client::Request {
                id: self.rng.u64(..),
                route: self.route(),
                body: self.bytes(64).into(),
                key: self.text(8),
            }),
            5 => Kind::Response(client::Response {
                id: self.rng.u64(..),
                code: self.rng.u32(..),
                body: self.bytes(64).into(),
                message: self.text(10),
                timing: self.rng.bool().then(|| client::Timing {
                    total_us: self.rng.u32(..),
                    queue_us: self.rng.u32(..),
                    handler_us: self.rng.u32(..),
                    calls: (0..self.rng.usize(..3))
                        .map(|_| client::CallTiming {
                            route: self.route(),
                            code: self.rng.u32(..),
                            us: self.rng.u32(..),
                            hop: self.rng.u32(..),
                        })
                        .collect(),
                }),
                seq: self.rng.u64(..),
            }),
            6 => Kind::Push(client::Push {
                route: self.route(),
                body: self.bytes(64).into(),
                seq: self.rng.u64(..),
            }),
            7 => Kind::Kick(client::Kick {
                reason: self.text(10),
            }),
            8 => Kind::Refresh(client::Refresh {
                token: self.text(20),
            }),
            9 => Kind::Ack(client::Ack {
                seq: self.rng.u64(..),
            }),
            _ => Kind::Drain(client::Drain {
                reason: self.text(10),
                grace_ms: self.rng.u32(..),
            }),
        };
        Packet::new(kind)
    }

    /// A typed request for a `mirror` route with a well-typed body, as JSON.
    fn typed_request(&mut self) -> String {
        let word = |g: &mut Gen| serde_json::to_string(&g.text(12)).unwrap();
        let (method, body) = match self.rng.u8(..5) {
            0 => ("echo", r#"{"body":"aGk="}"#.to_owned()),
            1 => (
                "say",
                format!(r#"{{"room":{},"text":{}}}"#, word(self), word(self)),
            ),
            2 => (
                "join",
                format!(r#"{{"room":{},"members":[{}]}}"#, word(self), word(self)),
            ),
            3 => (
                "member",
                format!(r#"{{"name":{},"sid":"{}"}}"#, word(self), self.rng.u64(..)),
            ),
            _ => (
                "packet",
                format!(
                    r#"{{"request":{{"id":"{}","route":"a.b"}}}}"#,
                    self.rng.u64(..)
                ),
            ),
        };
        format!(
            r#"{{"request":{{"id":{},"route":"mirror.{method}","body":{body}}}}}"#,
            self.rng.u64(..)
        )
    }

    /// `bytes` damaged by a few byte-level edits.
    fn mutate(&mut self, mut bytes: Vec<u8>) -> Vec<u8> {
        damage(&mut self.rng, &mut bytes, &FRAGMENTS, |rng| rng.u8(..));
        bytes
    }

    /// A pomelo data package from a client: a request or notify by name or code.
    fn pomelo_data(&mut self) -> Bytes {
        let route = if self.rng.bool() {
            Route::Code(self.rng.u16(..20))
        } else {
            Route::Name(
                ["chat.chatHandler.say", "echo.h.raw", "mirror.m.say", "a.b"][self.rng.usize(..4)],
            )
        };
        let body = [&b"{}"[..], br#"{"room":"r","text":"t"}"#, b"[1]", b""][self.rng.usize(..4)];
        // Ids of every varint length, 0 (refused) included.
        let id_bits = self.rng.u32(..64);
        let kind = if self.rng.u8(..4) == 0 {
            MessageKind::Notify
        } else {
            MessageKind::Request(self.rng.u64(..1u64 << id_bits))
        };
        wire::encode_message(&wire::Message {
            kind,
            route,
            error: false,
            gzip: self.rng.u8(..8) == 0,
            body,
        })
    }

    /// A frame of a few pomelo packages, mostly data.
    fn pomelo_frame(&mut self) -> Vec<u8> {
        let mut frame = Vec::new();
        for _ in 0..self.rng.usize(1..=3) {
            let package = match self.rng.u8(..8) {
                0 => wire::encode_package(PackageType::Handshake, br#"{"user":{"token":"x"}}"#),
                1 => wire::encode_package(PackageType::HandshakeAck, &[]),
                2 => wire::encode_package(PackageType::Heartbeat, &[]),
                _ => self.pomelo_data(),
            };
            frame.extend_from_slice(&package);
        }
        frame
    }

    /// An upgrade or page request head, with the variations browsers and tools send.
    fn head(&mut self) -> Vec<u8> {
        let path: String = (0..self.rng.usize(..8))
            .map(|_| self.rng.alphanumeric())
            .collect();
        let mut head = format!("GET /{path} HTTP/1.1\r\nHost: gate\r\n");
        if self.rng.u8(..4) != 0 {
            // Now and then a key that is blank, which must be refused.
            let key = match self.rng.u8(..8) {
                0 => "",
                1 => " \t",
                _ => "dGhlIHNhbXBsZSBub25jZQ==",
            };
            head.push_str("Upgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n");
            head.push_str(&format!(
                "Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            ));
        }
        if self.rng.bool() {
            head.push_str("Origin:  https://game.example \r\n");
        }
        head.push_str("\r\n");
        head.into_bytes()
    }
}

#[test]
fn protobuf_frames_decode_as_prost_and_round_trip() {
    let mut g = Gen {
        rng: Rng::with_seed(0x5AD0_DEC1),
    };
    let mut session = gate_fixture::typed_session(&Message::binary(Vec::new()));
    for case in 0..16_000 {
        let packet = g.packet();
        let valid = packet.encode_to_vec();
        let frame = if case % 2 == 0 {
            valid.clone()
        } else {
            g.mutate(valid)
        };
        replayable(case, &frame, || {
            protobuf_check::check(&frame, &mut session, meter);
            if case % 2 == 0 {
                let decoded = session.decode(&Message::binary(frame.clone()));
                assert_eq!(decoded, Decoded::Packet(packet));
            }
        });
    }
}

#[test]
fn json_frames_transcode_typed_bodies_and_round_trip() {
    let mut g = Gen {
        rng: Rng::with_seed(0x5AD0_DEC2),
    };
    let mut session = gate_fixture::typed_session(&Message::text(""));
    let mut transcoded = 0;
    for case in 0..10_000 {
        let valid = match case % 3 {
            0 => g.typed_request(),
            _ => proto::json::encode(&g.packet()).unwrap(),
        };
        let frame = if case % 2 == 0 {
            valid.into_bytes()
        } else {
            g.mutate(valid.into_bytes())
        };
        replayable(case, &frame, || {
            json_check::check(&frame, &mut session, meter);
        });
        let text = String::from_utf8_lossy(&frame).into_owned();
        if let Decoded::Packet(Packet {
            kind: Some(Kind::Request(r)),
        }) = session.decode(&Message::text(text))
            && r.route.starts_with("mirror.")
            && !r.body.is_empty()
        {
            transcoded += 1;
        }
    }
    // The typed path was taken, not only the refusals.
    assert!(
        transcoded > 1000,
        "only {transcoded} typed bodies transcoded"
    );
}

#[test]
fn pomelo_frames_decode_package_by_package_however_they_are_read() {
    let mut g = Gen {
        rng: Rng::with_seed(0x5AD0_DEC3),
    };
    let mut session = gate_fixture::typed_session(&Message::binary(vec![1]));
    for case in 0..20_000 {
        let mut input = vec![g.rng.u8(..)];
        let frame = g.pomelo_frame();
        input.extend(if case % 2 == 0 {
            frame
        } else {
            g.mutate(frame)
        });
        replayable(case, &input, || {
            pomelo_check::check(&input, &mut session, meter)
        });
    }
}

#[test]
fn pomelo_requests_by_code_reach_their_routes() {
    let mut session = gate_fixture::typed_session(&Message::binary(vec![1]));
    session.decode(&Message::Binary(pomelo_check::prelude()));
    // echo is announced first, and its one typed method has the first code.
    let by_code = wire::encode_message(&wire::Message {
        kind: MessageKind::Request(9),
        route: Route::Code(1),
        error: false,
        gzip: false,
        body: br#"{"body":"aGk="}"#,
    });
    let mut input = vec![0];
    input.extend_from_slice(&by_code);
    pomelo_check::check(&input, &mut session, meter);
    session.decode(&Message::Binary(pomelo_check::prelude()));
    match session.decode(&Message::Binary(by_code)) {
        Decoded::Packet(Packet {
            kind: Some(Kind::Request(r)),
        }) => assert_eq!(
            (r.id, r.route.as_str(), &r.body[..]),
            (9, "echo.echo", &b"\n\x02hi"[..])
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn upgrade_heads_end_the_same_however_they_are_read() {
    let mut g = Gen {
        rng: Rng::with_seed(0x5AD0_DEC4),
    };
    let mut accepted = 0;
    for case in 0..20_000 {
        let mut input = vec![g.rng.u8(..)];
        let head = g.head();
        input.extend(if case % 2 == 0 { head } else { g.mutate(head) });
        replayable(case, &input, || upgrade_check::check(&input, meter));
        let stream = &input[1..];
        if let Ok(Some((Head::WebSocket { .. } | Head::Page { .. }, _))) =
            upgrade_check::read_head(stream, 8 * 1024, 1024)
        {
            accepted += 1;
        }
    }
    assert!(accepted > 5000, "only {accepted} heads accepted");
}
