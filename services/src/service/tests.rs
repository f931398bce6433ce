//! The service's dispatch without a bus: decoding, errors, panics, effects, pushes,
//! events, costs and names.

use super::*;
use proto::echo::{EchoRequest, EchoResponse};
use proto::rpc::{Session, effect};

fn request(body: impl Into<Bytes>) -> RpcRequest {
    RpcRequest {
        route: "test.m".into(),
        body: body.into(),
        session: Some(Session {
            gate: "g".into(),
            sid: 1,
            ..Session::default()
        }),
        timing: false,
        ..RpcRequest::default()
    }
}

fn echo_body(text: &str) -> Bytes {
    EchoRequest {
        body: Bytes::copy_from_slice(text.as_bytes()),
    }
    .encode_to_vec()
    .into()
}

fn typed() -> Service {
    Service::new("test")
        .method("echo", |_ctx: &mut Context, req: EchoRequest| {
            Ok(EchoResponse { body: req.body })
        })
        .method("login", |ctx: &mut Context, req: EchoRequest| {
            let uid = String::from_utf8_lossy(&req.body).into_owned();
            ctx.bind_uid(uid);
            ctx.join("lobby");
            Ok(EchoResponse::default())
        })
        .method("fail", |ctx: &mut Context, _req: EchoRequest| {
            ctx.join("never");
            Err::<EchoResponse, _>(HandlerError::new("the dragon ate it"))
        })
        .method("deny", |_ctx: &mut Context, _req: EchoRequest| {
            Err::<EchoResponse, _>(HandlerError::unauthorized("log in first"))
        })
        .raw_method("panic", |_ctx, _body| panic!("boom"))
}

#[test]
fn typed_method_decodes_and_encodes() {
    let response = typed().call("echo", request(echo_body("hi"))).response;
    assert_eq!(response.code, code::OK);
    let echoed = EchoResponse::decode(response.body).unwrap();
    assert_eq!(echoed.body, Bytes::from_static(b"hi"));
}

#[test]
fn undecodable_body_is_400_with_a_message() {
    let response = typed()
        .call("echo", request(Bytes::from_static(&[0xff, 0xff])))
        .response;
    assert_eq!(response.code, code::BAD_REQUEST);
    assert!(
        response.message.starts_with("bad request body"),
        "{response:?}"
    );
}

#[test]
fn unknown_method_is_404() {
    let response = typed().call("nope", request(Bytes::new())).response;
    assert_eq!(response.code, code::NOT_FOUND);
    assert!(response.message.contains("nope"), "{response:?}");
}

#[test]
fn handler_error_is_500_with_its_message_and_no_effects() {
    let response = typed().call("fail", request(echo_body(""))).response;
    assert_eq!(response.code, code::HANDLER_ERROR);
    assert_eq!(response.message, "the dragon ate it");
    assert!(response.effects.is_empty());
}

#[test]
fn handler_error_may_choose_its_code() {
    let response = typed().call("deny", request(echo_body(""))).response;
    assert_eq!(response.code, code::UNAUTHORIZED);
    assert_eq!(response.message, "log in first");
}

#[test]
fn panicking_handler_is_500_and_the_service_survives() {
    let mut service = typed();
    let response = service.call("panic", request(Bytes::new())).response;
    assert_eq!(response.code, code::HANDLER_ERROR);
    assert_eq!(
        service.call("echo", request(echo_body("x"))).response.code,
        code::OK
    );
}

#[test]
fn effects_travel_in_the_response() {
    let response = typed().call("login", request(echo_body("alice"))).response;
    assert_eq!(response.code, code::OK);
    let kinds: Vec<_> = response.effects.into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![
            Some(effect::Kind::BindUid("alice".into())),
            Some(effect::Kind::Join("lobby".into())),
        ]
    );
}

#[test]
fn raw_method_gets_the_bytes() {
    let mut service = Service::new("raw").raw_method("rev", |_ctx, body| {
        Ok(body.iter().rev().copied().collect::<Vec<u8>>().into())
    });
    let response = service
        .call("rev", request(Bytes::from_static(b"abc")))
        .response;
    assert_eq!(response.body, Bytes::from_static(b"cba"));
}

#[test]
fn malformed_rpc_request_is_400() {
    let response = typed()
        .call_encoded(
            "echo",
            Bytes::from_static(&[0x0a, 0x05, b'x']),
            Instant::now(),
        )
        .response;
    assert_eq!(response.code, code::BAD_REQUEST);
    assert!(
        response.message.starts_with("malformed RpcRequest"),
        "{response:?}"
    );
}

#[test]
fn encoded_call_round_trips() {
    let payload = Bytes::from(request(echo_body("yo")).encode_to_vec());
    let response = typed()
        .call_encoded("echo", payload, Instant::now())
        .response;
    assert_eq!(response.code, code::OK);
}

#[test]
fn cost_applies_to_the_method_it_names_and_defaults_to_one() {
    let service = Service::new("s")
        .raw_method("dear", |_, b| Ok(b))
        .raw_method("cheap", |_, b| Ok(b))
        .cost("dear", 5);
    assert_eq!(service.cost_of("cheap"), 1);
    assert_eq!(service.cost_of("dear"), 5);
    assert_eq!(service.cost_of("unknown"), DEFAULT_COST);
}

#[test]
#[should_panic(expected = "register it first")]
fn cost_of_an_unregistered_method_panics() {
    let _ = Service::new("s").cost("m", 2).raw_method("m", |_, b| Ok(b));
}

#[test]
#[should_panic(expected = "set twice")]
fn cost_set_twice_panics() {
    let _ = Service::new("s")
        .raw_method("m", |_, b| Ok(b))
        .cost("m", 2)
        .cost("m", 3);
}

#[test]
fn handlers_may_keep_state() {
    let mut count = 0u32;
    let mut service = Service::new("s").raw_method("count", move |_, _| {
        count += 1;
        Ok(Bytes::from(count.to_string()))
    });
    service.call("count", request(Bytes::new()));
    let response = service.call("count", request(Bytes::new())).response;
    assert_eq!(response.body, Bytes::from_static(b"2"));
}

#[test]
#[should_panic(expected = "registered twice")]
fn duplicate_method_panics() {
    let _ = Service::new("s")
        .raw_method("m", |_, b| Ok(b))
        .raw_method("m", |_, b| Ok(b));
}

#[test]
#[should_panic(expected = "invalid method name")]
fn dotted_method_panics() {
    let _ = Service::new("s").raw_method("a.b", |_, b| Ok(b));
}

#[test]
#[should_panic(expected = "at least 1")]
fn zero_cost_panics() {
    let _ = Service::new("s").raw_method("m", |_, b| Ok(b)).cost("m", 0);
}

#[test]
fn a_failed_handler_pushes_nothing() {
    let mut service = Service::new("s")
        .raw_method("ok", |ctx, _| {
            ctx.broadcast("g", "s.x", "1")?;
            Ok(Bytes::new())
        })
        .raw_method("fail", |ctx, _| {
            ctx.broadcast("g", "s.x", "1")?;
            Err(HandlerError::new("no"))
        })
        .raw_method("panic", |ctx, _| {
            ctx.broadcast("g", "s.x", "1")?;
            panic!("boom")
        });
    assert_eq!(service.call("ok", request(Bytes::new())).outbound.len(), 1);
    assert!(
        service
            .call("fail", request(Bytes::new()))
            .outbound
            .is_empty()
    );
    assert!(
        service
            .call("panic", request(Bytes::new()))
            .outbound
            .is_empty()
    );
}

#[test]
fn events_run_their_handler_with_a_sessionless_context() {
    let mut seen = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut service = Service::new("s")
        .on_event("evt.a", Delivery::All, move |ctx, body| {
            assert!(!ctx.has_session());
            tx.send(body.clone()).unwrap();
            ctx.broadcast("g", "s.x", body)?;
            // Dropped, with a warning: there is no session to act on.
            ctx.join("g");
            ctx.reply("ack");
            Ok(())
        })
        .on_event("evt.b", Delivery::Queue, |_ctx, _| {
            Err(HandlerError::new("no"))
        })
        .on_event("s.sync", Delivery::Queue, |ctx, _| {
            ctx.reply("state");
            Ok(())
        })
        .on_start_sync("s.sync", |ctx, snapshot| {
            ctx.publish("s.restored", snapshot)?;
            Ok(())
        });
    let handled = service.event("evt.a", Bytes::from_static(b"1"));
    seen.extend(rx.try_iter());
    assert!(handled.ok);
    assert_eq!(handled.outbound.len(), 1);
    assert_eq!(handled.reply, Some(Bytes::from_static(b"ack")));
    assert_eq!(seen, [Bytes::from_static(b"1")]);
    assert!(!service.event("evt.b", Bytes::new()).ok);
    assert!(!service.event("evt.unknown", Bytes::new()).ok);
    assert_eq!(service.start_sync_subject(), Some("s.sync"));
    let restored = service.restore(Bytes::from_static(b"state"));
    assert!(restored.ok);
    assert_eq!(restored.outbound[0].subject("p"), "p.s.restored");
    let mut events: Vec<_> = service.events().collect();
    events.sort();
    assert_eq!(
        events,
        [
            ("evt.a", Delivery::All),
            ("evt.b", Delivery::Queue),
            ("s.sync", Delivery::Queue)
        ]
    );
}

#[test]
#[should_panic(expected = "needs an on_event")]
fn start_sync_without_an_answering_event_panics() {
    let _ = Service::new("s").on_start_sync("s.sync", |_, _| Ok(()));
}

#[test]
#[should_panic(expected = "invalid event subject")]
fn wildcard_event_subject_panics() {
    let _ = Service::new("s").on_event("evt.>", Delivery::All, |_, _| Ok(()));
}

#[test]
fn every_service_announces_itself_with_types_only_when_it_has_descriptors() {
    let raw = Service::new("plain").raw_method("m", |_, body| Ok(body));
    let schema = raw.schema();
    assert_eq!(schema.service, "plain");
    assert!(schema.methods.is_empty() && schema.descriptors.is_empty());
    // Typed methods without descriptors: the types could not be loaded, so none is named.
    let undescribed = Service::new("t")
        .method("echo", |_: &mut Context, r: EchoRequest| {
            Ok::<_, HandlerError>(EchoResponse { body: r.body })
        })
        .push::<EchoResponse>("t.pushed");
    let schema = undescribed.schema();
    assert!(schema.methods.is_empty() && schema.pushes.is_empty());
    let described = undescribed.descriptors(proto::DESCRIPTORS).schema();
    assert_eq!(described.methods.len(), 1);
    assert_eq!(described.pushes.len(), 1);
}

#[test]
fn a_deferral_and_calls_are_kept_only_when_the_handler_succeeds() {
    let mut service = Service::new("shop")
        .raw_method("buy", |ctx, _| {
            ctx.defer();
            ctx.call("bank.pay", "1", |_, _| {});
            Ok(Bytes::new())
        })
        .raw_method("fail", |ctx, _| {
            ctx.defer();
            ctx.call("bank.pay", "1", |_, _| {});
            Err(HandlerError::new("no"))
        });
    let handled = service.call("buy", request(""));
    assert!(handled.deferred());
    assert_eq!(handled.calls().collect::<Vec<_>>(), ["bank.pay"]);
    let failed = service.call("fail", request(""));
    assert_eq!(failed.response.code, code::HANDLER_ERROR);
    assert!(!failed.deferred());
    assert_eq!(failed.calls().count(), 0);
}
