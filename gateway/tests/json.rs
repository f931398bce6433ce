//! Typed JSON bodies end to end: JSON clients speak the chat service's messages as JSON
//! (proto3 JSON mapping) through a gate that learnt the types from the workers'
//! announcements, beside protobuf clients. Transcoding is the gate's alone: each test
//! runs once, on our broker.

mod common;

use std::time::Duration;

use common::raw::RawClient;
use common::{Bus, TestGate, start_worker, within};
use futures::StreamExt;
use gateway::GateConfig;
use proto::Message as _;
use proto::chat::{ChatMessage, JoinRequest, LoginRequest, SayRequest};
use proto::code;
use sdk::{ClientOptions, Push};
use serde_json::{Value, json};
use services::FrameConfig;
use tokio_tungstenite::tungstenite::Message;

/// A JSON session over a raw WebSocket: requests with JSON bodies, packets as JSON.
struct JsonClient {
    raw: RawClient,
    next_id: u64,
}

impl JsonClient {
    async fn connect(gate: &TestGate) -> JsonClient {
        let mut raw = RawClient::connect(&gate.url).await;
        raw.send(Message::text(r#"{"handshake":{"serial":true}}"#))
            .await;
        let ack: Value = serde_json::from_str(&raw.next_text().await).unwrap();
        assert_eq!(ack["handshake_ack"]["code"], 200, "{ack}");
        JsonClient { raw, next_id: 1 }
    }

    async fn send(&mut self, route: &str, body: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({"request": {"id": id, "route": route, "body": body}});
        self.raw.send(Message::text(request.to_string())).await;
        id
    }

    /// The next packet, as JSON.
    async fn next(&mut self) -> Value {
        serde_json::from_str(&self.raw.next_text().await).unwrap()
    }

    /// Sends a request and returns its response, keeping pushes that came first.
    async fn call(&mut self, route: &str, body: Value, pushes: &mut Vec<Value>) -> Value {
        let id = self.send(route, body).await;
        loop {
            let packet = self.next().await;
            if let Some(push) = packet.get("push") {
                pushes.push(push.clone());
            } else {
                assert_eq!(packet["response"]["id"], id, "{packet}");
                return packet["response"].clone();
            }
        }
    }

    /// Calls until the gate knows `route`'s types: announcements travel the bus on
    /// their own, so a gate may hear of a worker a moment after the worker serves.
    async fn call_when_typed(&mut self, route: &str, body: Value) -> Value {
        within(async {
            loop {
                let resp = self.call(route, body.clone(), &mut Vec::new()).await;
                let unknown = resp["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("no announced message types"));
                if !unknown {
                    return resp;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
    }

    /// The next push, as JSON.
    async fn push(&mut self) -> Value {
        let packet = self.next().await;
        packet
            .get("push")
            .unwrap_or_else(|| panic!("not a push: {packet}"))
            .clone()
    }
}

async fn chat_worker(bus: &Bus) -> common::TestWorker {
    start_worker(bus.url(), services::chat::service(), FrameConfig::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_and_a_protobuf_client_share_a_room() {
    let bus = Bus::embedded().await;
    let _chat = chat_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut ann = JsonClient::connect(&gate).await;
    let login = ann
        .call_when_typed("chat.login", json!({"name": "ann"}))
        .await;
    assert_eq!(login["code"], 200, "{login}");
    assert_eq!(login["body"]["name"], "ann", "{login}");
    let joined = ann
        .call("chat.join", json!({"room": "lobby"}), &mut Vec::new())
        .await;
    assert_eq!(joined["code"], 200, "{joined}");

    let bob = gate
        .client_with(ClientOptions {
            serial: true,
            ..ClientOptions::default()
        })
        .await;
    let mut bob_pushes = bob.pushes().unwrap();
    let ok = |r: sdk::Response| assert_eq!(r.code, code::OK, "{r:?}");
    ok(bob
        .request(
            "chat.login",
            LoginRequest { name: "bob".into() }.encode_to_vec(),
        )
        .await
        .unwrap());
    ok(bob
        .request(
            "chat.join",
            JoinRequest {
                room: "lobby".into(),
            }
            .encode_to_vec(),
        )
        .await
        .unwrap());
    for text in ["one", "two", "three"] {
        let say = SayRequest {
            room: "lobby".into(),
            text: text.into(),
        };
        ok(bob.request("chat.say", say.encode_to_vec()).await.unwrap());
    }
    let mut pushes = Vec::new();
    let said = ann
        .call(
            "chat.say",
            json!({"room": "lobby", "text": "four"}),
            &mut pushes,
        )
        .await;
    assert_eq!(said["code"], 200, "{said}");

    // Ann, in JSON: bob joined, his three messages in order, then her own.
    while pushes.len() < 5 {
        pushes.push(ann.push().await);
    }
    assert_eq!(pushes[0]["route"], "chat.joined");
    assert_eq!(
        pushes[0]["body"],
        json!({"room": "lobby", "name": "bob", "reason": "joined"})
    );
    let texts: Vec<&Value> = pushes[1..].iter().map(|p| &p["body"]["text"]).collect();
    assert_eq!(texts, ["one", "two", "three", "four"]);
    assert_eq!(pushes[4]["body"]["from"], "ann");

    // Bob, in protobuf: his own three, then ann's.
    let mut texts = Vec::new();
    while texts.len() < 4 {
        let Push { route, body, .. } = within(bob_pushes.next()).await.unwrap();
        if route == "chat.message" {
            texts.push(ChatMessage::decode(body).unwrap().text);
        }
    }
    assert_eq!(texts, ["one", "two", "three", "four"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_client_uses_every_chat_route() {
    let bus = Bus::embedded().await;
    let _chat = chat_worker(&bus).await;
    let _echo = common::echo_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut ann = JsonClient::connect(&gate).await;
    let mut cid = JsonClient::connect(&gate).await;
    let mut none = Vec::new();
    let login = ann
        .call_when_typed("chat.login", json!({"name": "ann"}))
        .await;
    assert_eq!(login["code"], 200, "{login}");
    let login = cid
        .call("chat.login", json!({"name": "cid"}), &mut none)
        .await;
    assert_eq!(login["code"], 200, "{login}");

    let joined = ann
        .call("chat.join", json!({"room": "den"}), &mut none)
        .await;
    assert_eq!(joined["code"], 200, "{joined}");
    let joined = cid
        .call("chat.join", json!({"room": "den"}), &mut none)
        .await;
    assert_eq!(joined["code"], 200, "{joined}");
    assert_eq!(
        ann.push().await,
        json!({"route": "chat.joined", "body": {"room": "den", "name": "cid", "reason": "joined"}})
    );

    let members = ann
        .call("chat.members", json!({"room": "den"}), &mut none)
        .await;
    assert_eq!(members["code"], 200, "{members}");
    let mut names: Vec<String> = members["body"]["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members: {members}"))
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["ann", "cid"]);

    let said = cid
        .call(
            "chat.say",
            json!({"room": "den", "text": "hello"}),
            &mut none,
        )
        .await;
    assert_eq!(said["code"], 200, "{said}");
    assert_eq!(
        ann.push().await,
        // No profile service here: the display name is the name, and there is no colour.
        json!({"route": "chat.message", "body": {"room": "den", "from": "cid", "text": "hello", "display": "cid"}})
    );

    let whispered = cid
        .call(
            "chat.whisper",
            json!({"to": "ann", "text": "psst"}),
            &mut none,
        )
        .await;
    assert_eq!(whispered["code"], 200, "{whispered}");
    assert_eq!(
        ann.push().await,
        json!({"route": "chat.whisper", "body": {"from": "cid", "text": "psst", "display": "cid"}})
    );

    let left = cid
        .call("chat.leave", json!({"room": "den"}), &mut none)
        .await;
    assert_eq!(left["code"], 200, "{left}");
    let push = ann.push().await;
    assert_eq!(push["route"], "chat.left", "{push}");
    assert_eq!(push["body"]["name"], "cid", "{push}");

    // A raw route stays raw beside the typed ones.
    let raw = ann.call("echo.raw", json!("as is"), &mut none).await;
    assert_eq!(raw["body"], "as is", "{raw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_after_the_gate_is_learnt() {
    let bus = Bus::embedded().await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut ann = JsonClient::connect(&gate).await;
    let before = ann
        .call("chat.login", json!({"name": "ann"}), &mut Vec::new())
        .await;
    assert_eq!(before["code"], 400, "{before}");
    let _chat = chat_worker(&bus).await;
    let login = ann
        .call_when_typed("chat.login", json!({"name": "ann"}))
        .await;
    assert_eq!(login["code"], 200, "{login}");
    assert_eq!(login["body"]["name"], "ann", "{login}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_body_is_answered_400_naming_the_field() {
    let bus = Bus::embedded().await;
    let _chat = chat_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut ann = JsonClient::connect(&gate).await;
    let mut none = Vec::new();
    ann.call_when_typed("chat.login", json!({"name": "ann"}))
        .await;
    let wrong = ann.call("chat.join", json!({"room": 5}), &mut none).await;
    assert_eq!(wrong["code"], 400, "{wrong}");
    let message = wrong["message"].as_str().unwrap();
    assert!(message.contains("field room"), "{message}");
    let unknown = ann
        .call("chat.join", json!({"rooom": "x"}), &mut none)
        .await;
    assert_eq!(unknown["code"], 400, "{unknown}");
    assert!(
        unknown["message"].as_str().unwrap().contains("rooom"),
        "{unknown}"
    );
    // The session goes on.
    let joined = ann.call("chat.join", json!({"room": "x"}), &mut none).await;
    assert_eq!(joined["code"], 200, "{joined}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_announcements_do_not_break_the_gate() {
    let bus = Bus::embedded().await;
    let chat = chat_worker(&bus).await;
    let _echo = common::echo_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut ann = JsonClient::connect(&gate).await;
    let mut none = Vec::new();
    ann.call_when_typed("chat.members", json!({"room": "x"}))
        .await;
    // Garbage and a schema naming a type it lacks, under the chat service's subject.
    let rogue = within(async_nats::connect(bus.url())).await.unwrap();
    let subject = proto::schema::announce_subject("shaddock", "chat");
    rogue
        .publish(subject.clone(), bytes::Bytes::from_static(b"\xff\xff"))
        .await
        .unwrap();
    let lacking = proto::rpc::ServiceSchema {
        service: "chat".into(),
        methods: vec![proto::rpc::MethodSchema {
            method: "login".into(),
            request_type: "nowhere.Nothing".into(),
            response_type: "nowhere.Nothing".into(),
        }],
        ..Default::default()
    };
    rogue
        .publish(subject, lacking.encode_to_vec().into())
        .await
        .unwrap();
    // Then a good announcement of another service on the same connection: the gate
    // reads announcements in order, so once it knows this one it has read the two bad
    // ones before it.
    let marker = proto::rpc::ServiceSchema {
        service: "marker".into(),
        methods: vec![proto::rpc::MethodSchema {
            method: "x".into(),
            request_type: "shaddock.chat.LoginRequest".into(),
            response_type: "shaddock.chat.LoginResponse".into(),
        }],
        descriptors: bytes::Bytes::from_static(proto::DESCRIPTORS),
        ..Default::default()
    };
    rogue
        .publish(
            proto::schema::announce_subject("shaddock", "marker"),
            marker.encode_to_vec().into(),
        )
        .await
        .unwrap();
    let marked = ann.call_when_typed("marker.x", json!({"name": "m"})).await;
    // Typed, and announced, so the route exists: no worker reachable now is an outage
    // (503, worth a retry), not an unknown route (404).
    assert_eq!(
        marked["code"], 503,
        "announced, and no worker serves it: {marked}"
    );
    // The gate keeps what it knew.
    let login = ann
        .call("chat.login", json!({"name": "ann"}), &mut none)
        .await;
    assert_eq!(login["code"], 200, "{login}");
    // With the workers gone, the route answers 503 (it exists; nobody serves it now)
    // and the gate serves on.
    drop(chat);
    let gone = within(async {
        loop {
            let r = ann
                .call("chat.members", json!({"room": "x"}), &mut none)
                .await;
            if r["code"] == 503 {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(gone["message"], "no worker available now", "{gone}");
    let raw = ann.call("echo.raw", json!("still here"), &mut none).await;
    assert_eq!(raw["body"], "still here", "{raw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_sdk_speaks_json() {
    let bus = Bus::embedded().await;
    let _chat = chat_worker(&bus).await;
    let _echo = common::echo_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let client = gate
        .client_with(ClientOptions {
            json: true,
            ..ClientOptions::default()
        })
        .await;
    let members = within(async {
        loop {
            let r = client
                .request("chat.members", br#"{"room":"x"}"#)
                .await
                .unwrap();
            if r.code == code::OK {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(&members.body[..], br#"{"room":"x"}"#);
    let raw = client.request("echo.raw", br#""as is""#).await.unwrap();
    assert_eq!(&raw.body[..], b"as is");
    let refused = client.request("echo.raw", b"not json").await.unwrap_err();
    assert!(refused.to_string().contains("must be JSON"), "{refused}");
    // The session is still up.
    let raw = client.request("echo.raw", br#""again""#).await.unwrap();
    assert_eq!(&raw.body[..], b"again");
}

/// docs/protocol.md, "Packets": a field a packet's kind does not have closes the
/// session naming it, in the handshake and after it, rather than reading as its
/// default; the proto3 JSON spellings of known fields are taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_packet_field_closes_the_session_naming_it() {
    let bus = Bus::embedded().await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut raw = RawClient::connect(&gate.url).await;
    raw.send(Message::text(
        r#"{"handshake":{"resumable":true,"resume_tokn":"x"}}"#,
    ))
    .await;
    raw.expect_close(1007, r#"invalid packet: unknown field "resume_tokn""#)
        .await;

    let mut raw = RawClient::connect(&gate.url).await;
    raw.send(Message::text(
        r#"{"handshake":{"serverTiming":true,"lastSeq":"0"}}"#,
    ))
    .await;
    let ack: Value = serde_json::from_str(&raw.next_text().await).unwrap();
    assert_eq!(ack["handshake_ack"]["code"], 200, "{ack}");
    raw.send(Message::text(r#"{"ack":{"seq":"0"}}"#)).await;
    raw.send(Message::text(
        r#"{"request":{"id":"1","route":"echo.raw","bdy":"hi"}}"#,
    ))
    .await;
    raw.expect_close(1007, r#"invalid packet: unknown field "bdy""#)
        .await;
}
