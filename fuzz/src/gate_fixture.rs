//! What the gate's decoder oracles share: a session whose gate knows the built-in
//! services' message types, and the heap meter that bounds what a decode may allocate.
//!
//! Included by path into `gateway/tests/decoder_props.rs` as well, so it may use only
//! what the gateway's tests have: the gateway, proto and bytes crates.

use bytes::Bytes;
use gateway::fuzzing::{Message, Session};
use proto::Message as _;
use proto::rpc::{MethodSchema, PushSchema, ServiceSchema};

/// Runs a closure and returns the most heap its thread held at once while it ran, above
/// what it held before: the fuzz targets count with their own global allocator, the
/// tests with `allocation-counter`.
pub type Meter = fn(&mut dyn FnMut()) -> usize;

/// Heap any decode may hold whatever its input (the packet, error strings, a descriptor
/// lookup), on top of its share per input byte.
pub const ALLOC_SLACK: usize = 64 * 1024;

/// Runs `decode` under `meter` and fails when it held more than `per_byte` times
/// `input_len` plus [`ALLOC_SLACK`]: a decoder that sizes a buffer from a length the
/// peer wrote, or expands its input, shows up here long before it exhausts memory.
pub fn assert_bounded<T>(
    meter: Meter,
    what: &str,
    input_len: usize,
    per_byte: usize,
    decode: impl FnOnce() -> T,
) -> T {
    let mut decode = Some(decode);
    let mut out = None;
    let peak = meter(&mut || out = decode.take().map(|f| f()));
    let bound = input_len * per_byte + ALLOC_SLACK;
    assert!(
        peak <= bound,
        "{what}: held {peak} bytes of heap decoding {input_len} bytes (bound {bound})"
    );
    out.expect("the meter did not run the decode")
}

/// Routes of the `mirror` service, each typed with one message as both its request and
/// its response type, so that a typed body can be sent back as it came: JSON to protobuf
/// and back must give the same protobuf. Types cover strings, bytes, repeated fields,
/// 64-bit integers (strings in JSON), nested messages and oneofs.
pub const MIRROR_ROUTES: [(&str, &str); 8] = [
    ("echo", "shaddock.echo.EchoRequest"),
    ("say", "shaddock.chat.SayRequest"),
    ("join", "shaddock.chat.JoinResponse"),
    ("state", "shaddock.chat.StateChange"),
    ("member", "shaddock.chat.Member"),
    ("packet", "shaddock.client.Packet"),
    ("response", "shaddock.client.Response"),
    ("schema", "shaddock.rpc.ServiceSchema"),
];

fn announcement(service: &str, methods: &[(&str, &str, &str)], pushes: &[(&str, &str)]) -> Bytes {
    let schema = ServiceSchema {
        service: service.into(),
        methods: methods
            .iter()
            .map(|&(method, request, response)| MethodSchema {
                method: method.into(),
                request_type: request.into(),
                response_type: response.into(),
            })
            .collect(),
        pushes: pushes
            .iter()
            .map(|&(route, message)| PushSchema {
                route: route.into(),
                message_type: message.into(),
            })
            .collect(),
        descriptors: Bytes::from_static(proto::DESCRIPTORS),
        keyed: None,
    };
    Bytes::from(schema.encode_to_vec())
}

/// The typed methods of the chat service, as its workers announce them.
const CHAT_METHODS: [(&str, &str, &str); 3] = [
    (
        "login",
        "shaddock.chat.LoginRequest",
        "shaddock.chat.LoginResponse",
    ),
    (
        "join",
        "shaddock.chat.JoinRequest",
        "shaddock.chat.JoinResponse",
    ),
    (
        "say",
        "shaddock.chat.SayRequest",
        "shaddock.chat.SayResponse",
    ),
];

/// Whether the gate of [`typed_session`] transcodes bodies of `route`.
pub fn is_typed(route: &str) -> bool {
    match route.split_once('.') {
        Some(("echo", method)) => method == "echo",
        Some(("chat", method)) => CHAT_METHODS.iter().any(|(m, _, _)| *m == method),
        Some(("mirror", method)) => MIRROR_ROUTES.iter().any(|(m, _)| *m == method),
        _ => false,
    }
}

/// A session of the codec `first` picks, whose gate has heard the echo and chat
/// services announce (as their workers do) and the `mirror` service.
pub fn typed_session(first: &Message) -> Session {
    let session = Session::for_first_frame(first);
    let echo = announcement(
        "echo",
        &[(
            "echo",
            "shaddock.echo.EchoRequest",
            "shaddock.echo.EchoResponse",
        )],
        &[],
    );
    let chat = announcement(
        "chat",
        &CHAT_METHODS,
        &[("chat.message", "shaddock.chat.ChatMessage")],
    );
    let mirror: Vec<(&str, &str, &str)> = MIRROR_ROUTES
        .iter()
        .map(|&(method, message)| (method, message, message))
        .collect();
    let mirror = announcement("mirror", &mirror, &[]);
    for schema in [echo, chat, mirror] {
        session.learn(schema).expect("a built-in announcement");
    }
    session
}
