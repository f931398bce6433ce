//! The pomelo wire protocol on the gate, end to end with a hand-built pomelo client
//! over tokio-tungstenite: a pomelo and an SDK client chat in one room, bad input and
//! limits close only the session that sent them, errors carry pitaya's flag, kicks
//! and heartbeats are pomelo's. A codec of the gate's: each test runs once, on our
//! broker.

mod common;

use bytes::Bytes;
use common::{Bus, Bystander, TestGate, echo_worker, gate_config, start_worker, within};
use futures::{SinkExt, StreamExt};
use gateway::GateConfig;
use gateway::pomelo::wire::{
    self, MessageKind, PackageType, Route, encode_message, encode_package,
};
use proto::Message as _;
use proto::chat::{ChatMessage, JoinRequest, LoginRequest, SayRequest};
use proto::code;
use sdk::{ClientOptions, Push};
use serde_json::{Value, json};
use services::FrameConfig;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// What the gate sent next.
#[derive(Debug)]
enum Got {
    Package(PackageType, Bytes),
    Close(u16, String),
    Ended,
}

/// A pomelo client written from the protocol, package by package.
struct PomeloClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The handshake answer's `sys.dict`.
    dict: Value,
    heartbeat: Value,
    next_id: u64,
}

impl PomeloClient {
    /// Opens the socket, shakes hands and acknowledges; the gate's first heartbeat
    /// is taken.
    async fn connect(gate: &TestGate) -> PomeloClient {
        let mut client = PomeloClient::handshake_only(gate).await;
        client.ack().await;
        client
    }

    /// Handshake answered, not yet acknowledged.
    async fn handshake_only(gate: &TestGate) -> PomeloClient {
        let (ws, _) = within(tokio_tungstenite::connect_async(&gate.url))
            .await
            .unwrap();
        let mut client = PomeloClient {
            ws,
            dict: Value::Null,
            heartbeat: Value::Null,
            next_id: 1,
        };
        let hello = json!({"sys": {"type": "rust-test", "version": "0.0.1"}, "user": {}});
        client
            .send(encode_package(
                PackageType::Handshake,
                hello.to_string().as_bytes(),
            ))
            .await;
        let answer = client.json_of(PackageType::Handshake).await;
        assert_eq!(answer["code"], 200, "{answer}");
        assert_eq!(answer["sys"]["serializer"], "json", "{answer}");
        client.dict = answer["sys"]["dict"].clone();
        client.heartbeat = answer["sys"]["heartbeat"].clone();
        client
    }

    async fn ack(&mut self) {
        self.send(encode_package(PackageType::HandshakeAck, &[]))
            .await;
        assert!(matches!(
            self.next().await,
            Got::Package(PackageType::Heartbeat, _)
        ));
    }

    /// Connects until the gate's dictionary has `route`: workers announce on the
    /// bus on their own time, and a session keeps the dictionary of its handshake.
    async fn connect_knowing(gate: &TestGate, route: &str) -> PomeloClient {
        within(async {
            loop {
                let client = PomeloClient::connect(gate).await;
                if client.dict.get(route).is_some() {
                    return client;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
    }

    fn code(&self, route: &str) -> u16 {
        let code = self.dict[route].as_u64();
        code.and_then(|c| c.try_into().ok())
            .unwrap_or_else(|| panic!("{route} not in {}", self.dict))
    }

    async fn send(&mut self, bytes: Bytes) {
        within(self.ws.send(Message::Binary(bytes))).await.unwrap();
    }

    /// Sends a request; returns its id.
    async fn request(&mut self, route: Route<'_>, body: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.message(MessageKind::Request(id), route, body).await;
        id
    }

    async fn message(&mut self, kind: MessageKind, route: Route<'_>, body: Value) {
        let body = body.to_string();
        let message = wire::Message {
            kind,
            route,
            error: false,
            gzip: false,
            body: body.as_bytes(),
        };
        self.send(encode_message(&message)).await;
    }

    async fn next(&mut self) -> Got {
        loop {
            let frame = match within(self.ws.next()).await {
                None | Some(Err(_)) => return Got::Ended,
                Some(Ok(frame)) => frame,
            };
            return match frame {
                Message::Binary(bytes) => {
                    let (package, used) = wire::parse_package(&bytes, wire::MAX_BODY_LEN)
                        .unwrap()
                        .unwrap();
                    assert_eq!(used, bytes.len(), "one package per frame");
                    Got::Package(package.kind, package.body)
                }
                Message::Close(Some(close)) => {
                    Got::Close(close.code.into(), close.reason.as_str().to_owned())
                }
                Message::Close(None) => Got::Close(1005, String::new()),
                Message::Text(t) => panic!("pomelo is binary, got {t}"),
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
            };
        }
    }

    /// The next package, which must be `kind`, its body as JSON.
    async fn json_of(&mut self, kind: PackageType) -> Value {
        match self.next().await {
            Got::Package(k, body) if k == kind => serde_json::from_slice(&body).unwrap(),
            other => panic!("expected {kind:?}, got {other:?}"),
        }
    }

    /// The next data package's message: (kind, route, error flag, JSON body).
    async fn message_in(&mut self) -> (MessageKind, String, bool, Value) {
        let body = match self.next().await {
            Got::Package(PackageType::Data, body) => body,
            other => panic!("expected data, got {other:?}"),
        };
        let m = wire::parse_message(&body).unwrap();
        let route = match m.route {
            Route::Name(name) => name.to_owned(),
            Route::Code(code) => self.route_of(code),
            Route::None => String::new(),
        };
        (
            m.kind,
            route,
            m.error,
            serde_json::from_slice(m.body).unwrap(),
        )
    }

    fn route_of(&self, code: u16) -> String {
        let entries = self.dict.as_object().unwrap();
        let found = entries
            .iter()
            .find(|(_, c)| c.as_u64() == Some(code.into()));
        found.map(|(r, _)| r.clone()).unwrap()
    }

    /// Calls and returns (error flag, body), keeping pushes that came first.
    async fn call(
        &mut self,
        route: Route<'_>,
        body: Value,
        pushes: &mut Vec<(String, Value)>,
    ) -> (bool, Value) {
        let id = self.request(route, body).await;
        loop {
            match self.message_in().await {
                (MessageKind::Push, route, _, body) => pushes.push((route, body)),
                (MessageKind::Response(got), _, error, body) => {
                    assert_eq!(got, id);
                    return (error, body);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    async fn expect_close(&mut self, code: u16, reason: &str) {
        match self.next().await {
            Got::Close(c, r) => assert_eq!((c, r.as_str()), (code, reason)),
            other => panic!("expected close {code} {reason}, got {other:?}"),
        }
    }
}

async fn chat_worker(bus: &Bus) -> common::TestWorker {
    start_worker(bus.url(), services::chat::service(), FrameConfig::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pomelo_and_an_sdk_client_chat_in_one_room() {
    let bus = Bus::embedded().await;
    let _chat = chat_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut ann = PomeloClient::connect_knowing(&gate, "chat.chat.login").await;
    let mut pushes = Vec::new();
    // By dictionary code, then by string route in pomelo's own shape.
    let login = Route::Code(ann.code("chat.chat.login"));
    let (error, body) = ann.call(login, json!({"name": "ann"}), &mut pushes).await;
    assert!(!error, "{body}");
    assert_eq!(body["name"], "ann");
    let join = Route::Name("chat.chatHandler.join");
    let (error, body) = ann.call(join, json!({"room": "lobby"}), &mut pushes).await;
    assert!(!error, "{body}");

    let options = ClientOptions {
        serial: true,
        ..ClientOptions::default()
    };
    let bob = gate.client_with(options).await;
    let mut bob_pushes = bob.pushes().unwrap();
    let ok = |r: sdk::Response| assert_eq!(r.code, code::OK, "{r:?}");
    let login = LoginRequest { name: "bob".into() };
    ok(bob
        .request("chat.login", login.encode_to_vec())
        .await
        .unwrap());
    let join = JoinRequest {
        room: "lobby".into(),
    };
    ok(bob
        .request("chat.join", join.encode_to_vec())
        .await
        .unwrap());
    let say = SayRequest {
        room: "lobby".into(),
        text: "from bob".into(),
    };
    ok(bob.request("chat.say", say.encode_to_vec()).await.unwrap());
    // A notify: no answer, but the room hears it.
    let say = json!({"room": "lobby", "text": "from ann"});
    ann.message(
        MessageKind::Notify,
        Route::Name("chat.chatHandler.say"),
        say,
    )
    .await;

    while pushes.len() < 3 {
        match ann.message_in().await {
            (MessageKind::Push, route, false, body) => pushes.push((route, body)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(pushes[0].0, "chat.joined");
    assert_eq!(pushes[0].1["name"], "bob");
    assert_eq!(
        pushes[1],
        (
            "chat.message".into(),
            json!({"room": "lobby", "from": "bob", "text": "from bob", "display": "bob"})
        )
    );
    assert_eq!(pushes[2].1["text"], "from ann");
    let mut texts = Vec::new();
    while texts.len() < 2 {
        let Push { route, body, .. } = within(bob_pushes.next()).await.unwrap();
        if route == "chat.message" {
            texts.push(ChatMessage::decode(body).unwrap().text);
        }
    }
    assert_eq!(texts, ["from bob", "from ann"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_closes_only_the_session_that_sent_it() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let gate = TestGate::start(&bus, gate_config(|c| c.max_frame = 1024)).await;
    let mut bystander = Bystander::join(&gate).await;

    let mut early = PomeloClient::handshake_only(&gate).await;
    early
        .message(
            MessageKind::Request(1),
            Route::Name("echo.echo.raw"),
            json!(1),
        )
        .await;
    early.expect_close(1007, "data before handshake ack").await;
    bystander.still_served().await;

    let header = |bytes: &'static [u8]| Bytes::from_static(bytes);
    for (bytes, reason) in [
        (header(&[9, 0, 0, 0]), "unknown package type"),
        (header(&[4, 0, 0, 9, 0]), "truncated package"),
        (header(&[4, 0, 0, 1, 0x0e]), "unknown message type"),
    ] {
        let mut client = PomeloClient::connect(&gate).await;
        client.send(bytes).await;
        client.expect_close(1007, reason).await;
        bystander.still_served().await;
    }

    let mut unknown = PomeloClient::connect(&gate).await;
    unknown
        .message(MessageKind::Request(1), Route::Code(60_000), json!({}))
        .await;
    unknown.expect_close(1007, "unknown route code").await;
    bystander.still_served().await;

    let mut large = PomeloClient::connect(&gate).await;
    let body = json!("x".repeat(2048));
    large
        .message(MessageKind::Request(1), Route::Name("echo.echo.raw"), body)
        .await;
    large.expect_close(1009, "frame too large").await;
    bystander.still_served().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_the_error_flag_code_and_msg() {
    let bus = Bus::embedded().await;
    let _echo = echo_worker(&bus).await;
    let _chat = chat_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut client = PomeloClient::connect_knowing(&gate, "chat.chat.login").await;
    let mut pushes = Vec::new();
    // An untyped route: the JSON body goes to the worker as it is, and comes back.
    let raw = Route::Name("echo.echoHandler.raw");
    let (error, body) = client.call(raw, json!({"msg": "hi"}), &mut pushes).await;
    assert_eq!((error, body), (false, json!({"msg": "hi"})));
    let nowhere = Route::Name("nosuch.handler.method");
    let (error, body) = client.call(nowhere, json!({}), &mut pushes).await;
    assert!(error);
    assert_eq!(body["code"], 404, "{body}");
    let login = Route::Name("chat.chat.login");
    let (error, body) = client.call(login, json!({"name": 5}), &mut pushes).await;
    assert!(error);
    assert_eq!(body["code"], 400, "{body}");
    assert!(body["msg"].as_str().unwrap().contains("name"), "{body}");
    let shape = Route::Name("chat.login");
    let (error, body) = client.call(shape, json!({"name": "x"}), &mut pushes).await;
    assert_eq!((error, &body["code"]), (false, &json!(null)), "{body}");
    let bad = Route::Name("chat.Bad Handler.login");
    let (error, body) = client.call(bad, json!({}), &mut pushes).await;
    assert!(error);
    assert_eq!(body["code"], 400, "{body}");
    assert!(pushes.is_empty(), "{pushes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_login_kicks_with_a_pomelo_kick() {
    let bus = Bus::embedded().await;
    let _chat = chat_worker(&bus).await;
    let gate = TestGate::start(&bus, GateConfig::default()).await;
    let mut first = PomeloClient::connect_knowing(&gate, "chat.chat.login").await;
    let login = Route::Name("chat.chat.login");
    let (error, body) = first
        .call(login, json!({"name": "kim"}), &mut Vec::new())
        .await;
    assert!(!error, "{body}");
    let mut second = PomeloClient::connect(&gate).await;
    let (error, body) = second
        .call(login, json!({"name": "kim"}), &mut Vec::new())
        .await;
    assert!(!error, "{body}");
    let kick = first.json_of(PackageType::Kick).await;
    assert!(
        kick["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{kick}"
    );
    first.expect_close(1008, "kicked").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_closed_after_two_heartbeats() {
    let bus = Bus::embedded().await;
    let gate = TestGate::start(
        &bus,
        gate_config(|c| c.heartbeat = std::time::Duration::from_millis(300)),
    )
    .await;
    let mut client = PomeloClient::handshake_only(&gate).await;
    // Pomelo counts whole seconds: the gate keeps the interval it told.
    assert_eq!(client.heartbeat, 1);
    client.ack().await;
    // A heartbeat is answered at once.
    client
        .send(encode_package(PackageType::Heartbeat, &[]))
        .await;
    assert!(matches!(client.next().await, Got::Package(PackageType::Heartbeat, b) if b.is_empty()));
    let silent = tokio::time::Instant::now();
    client.expect_close(1008, "heartbeat missed").await;
    assert!(silent.elapsed() >= std::time::Duration::from_millis(1900));
}
