use super::*;

#[test]
fn drain_round_trips_through_json() {
    let drain = Packet::new(Kind::Drain(client::Drain {
        reason: "gate shutting down".into(),
        grace_ms: 5000,
    }));
    let text = encode(&drain).unwrap();
    assert_eq!(
        text,
        r#"{"drain":{"reason":"gate shutting down","grace_ms":5000}}"#
    );
    assert_eq!(decode(&text).unwrap(), drain);
}

#[test]
fn request_round_trips_through_json() {
    let p = decode(r#"{"request":{"id":7,"route":"echo.echo","body":"hi"}}"#).unwrap();
    let Some(Kind::Request(r)) = &p.kind else {
        panic!("not a request: {p:?}")
    };
    assert_eq!(
        (r.id, r.route.as_str(), &r.body[..]),
        (7, "echo.echo", &b"hi"[..])
    );
    assert_eq!(decode(&encode(&p).unwrap()).unwrap(), p);
    let keyed =
        decode(r#"{"request":{"id":8,"route":"arena.input","body":"","key":"m1"}}"#).unwrap();
    let Some(Kind::Request(r)) = &keyed.kind else {
        panic!("not a request: {keyed:?}")
    };
    assert_eq!(r.key, "m1");
    assert_eq!(decode(&encode(&keyed).unwrap()).unwrap(), keyed);
}

#[test]
fn typed_bodies_keep_their_json_and_say_so() {
    let (p, typed) =
        decode_typed(r#"{"request":{"id":3,"route":"chat.login","body":{"name":"ann"}}}"#).unwrap();
    let Some(Kind::Request(r)) = &p.kind else {
        panic!("not a request: {p:?}")
    };
    assert!(typed);
    assert_eq!(&r.body[..], br#"{"name":"ann"}"#);
    let (p, typed) =
        decode_typed(r#"{"request":{"id":3,"route":"echo.raw","body":"{x"}}"#).unwrap();
    assert!(!typed);
    let Some(Kind::Request(r)) = &p.kind else {
        panic!("not a request: {p:?}")
    };
    assert_eq!(&r.body[..], b"{x");
    let (_, typed) = decode_typed(r#"{"request":{"id":3,"route":"a.b","body":null}}"#).unwrap();
    assert!(!typed);

    let push = Packet::new(Kind::Push(client::Push {
        route: "chat.message".into(),
        body: Bytes::from_static(br#"{"text":"hi"}"#),
        seq: 0,
    }));
    assert_eq!(
        encode_typed(&push, true).unwrap(),
        r#"{"push":{"route":"chat.message","body":{"text":"hi"}}}"#
    );
    assert_eq!(
        encode(&push).unwrap(),
        r#"{"push":{"route":"chat.message","body":"{\"text\":\"hi\"}"}}"#
    );
}

#[test]
fn absent_fields_default_and_unknown_kinds_fail() {
    let p = decode(r#"{"handshake":{}}"#).unwrap();
    assert_eq!(
        p,
        Packet::new(Kind::Handshake(client::Handshake::default()))
    );
    assert!(decode(r#"{"bogus":{}}"#).is_err());
    assert!(decode("not json").is_err());
    assert!(decode(r#"{"request":{"id":-1}}"#).is_err());
}

/// docs/protocol.md, "Packets": a field a client's packet cannot have is refused,
/// naming it; one in a gate's packet is read past (an SDK reads a newer gate's).
#[test]
fn unknown_fields_of_a_clients_packet_are_refused_by_name() {
    let unknown = |frame: &str| decode(frame).unwrap_err().unknown_field();
    for (frame, field) in [
        (
            r#"{"request":{"id":7,"route":"echo.raw","added_later":[1]}}"#,
            "added_later",
        ),
        (r#"{"handshake":{"resume_tokn":"g.1.00"}}"#, "resume_tokn"),
        (r#"{"handshake":{"lastseq":3}}"#, "lastseq"),
        (r#"{"ack":{"sequence":3}}"#, "sequence"),
        (r#"{"refresh":{"jwt":"x"}}"#, "jwt"),
        (r#"{"heartbeat":{"x":1}}"#, "x"),
    ] {
        assert_eq!(unknown(frame).as_deref(), Some(field), "{frame}");
    }
    assert_eq!(unknown(r#"{"request":{"id":-1}}"#), None);
    assert_eq!(unknown("not json"), None);
    assert!(decode(r#"{"request":{"id":7},"heartbeat":{}}"#).is_err());
    let ack = decode(r#"{"handshake_ack":{"code":200,"added_later":1}}"#).unwrap();
    assert!(matches!(ack.kind, Some(Kind::HandshakeAck(a)) if a.code == 200));
}

/// The proto3 JSON mapping's spellings read as the snake_case ones: lowerCamelCase
/// names, and integers as strings.
#[test]
fn proto3_json_spellings_are_read_too() {
    let camel = decode(
        r#"{"handshake":{"resumable":true,"resumeToken":"g.1.00","lastSeq":"12","serverTiming":true}}"#,
    )
    .unwrap();
    let snake = decode(
        r#"{"handshake":{"resumable":true,"resume_token":"g.1.00","last_seq":12,"server_timing":true}}"#,
    )
    .unwrap();
    assert_eq!(camel, snake);
    let Some(Kind::Handshake(h)) = &snake.kind else {
        panic!("{snake:?}");
    };
    assert_eq!((h.resume_token.as_str(), h.last_seq), ("g.1.00", 12));
    let max = decode(r#"{"request":{"id":"18446744073709551615","route":"a.b"}}"#).unwrap();
    assert!(matches!(max.kind, Some(Kind::Request(r)) if r.id == u64::MAX));
    assert_eq!(
        decode(r#"{"ack":{"seq":"7"}}"#).unwrap(),
        decode(r#"{"ack":{"seq":7}}"#).unwrap()
    );
    let ack = decode(r#"{"handshakeAck":{"code":"200","sessionId":"9"}}"#).unwrap();
    assert!(matches!(ack.kind, Some(Kind::HandshakeAck(a)) if (a.code, a.session_id) == (200, 9)));
    for bad in [
        r#"{"ack":{"seq":"x"}}"#,
        r#"{"ack":{"seq":"-1"}}"#,
        r#"{"ack":{"seq":1.5}}"#,
        r#"{"drain":{"grace_ms":"4294967296"}}"#,
        r#"{"drain":{"grace_ms":4294967296}}"#,
    ] {
        assert!(decode(bad).is_err(), "{bad}");
    }
}
