//! The echo service: answers with what it was sent. It does no work of its own, so load
//! tests through it measure the path (gate, bus, worker loop) and nothing else.
//!
//! - `echo.echo`: an `EchoRequest` answered by an `EchoResponse` with the same body.
//! - `echo.raw`: the request body answered unchanged, not decoded at all.
//! - `echo.work`: the body is a number of microseconds, in ASCII decimal, at most
//!   [`MAX_WORK_US`]; the handler keeps the CPU busy that long, then answers the body.
//!   Game logic stand-in for load tests: with real work per request the worker becomes
//!   the bottleneck, and adding workers shows what it adds. Declared cost 5 units
//!   (50 µs), the figure the load tests send.
//! - `echo.relay`: calls `echo.raw` with the body (a call between services, docs/workers.md
//!   "Calling other services") and answers what it answered: beside `echo.raw`, what one
//!   call hop costs.

use std::time::{Duration, Instant};

use bytes::Bytes;
use proto::echo::{EchoRequest, EchoResponse};

use crate::context::Context;
use crate::handler_error::HandlerError;
use crate::service::Service;

/// The service's name: its subject token and queue group.
pub const NAME: &str = "echo";

/// The most work one `echo.work` request may ask for.
pub const MAX_WORK_US: u64 = 1_000;

/// The route `echo.relay` calls.
const RELAY_TO: &str = "echo.raw";

/// `echo.work`'s declared cost: 50 µs of work at 10 µs per unit.
const WORK_COST: u32 = 5;

/// The echo service.
pub fn service() -> Service {
    Service::new(NAME)
        .descriptors(proto::DESCRIPTORS)
        .method("echo", |_ctx: &mut Context, request: EchoRequest| {
            Ok::<_, HandlerError>(EchoResponse { body: request.body })
        })
        .raw_method("raw", |_ctx, body| Ok(body))
        .raw_method("work", |_ctx, body| {
            burn(work_of(&body)?);
            Ok(body)
        })
        .raw_method("relay", |ctx, body| {
            let deferred = ctx.defer();
            ctx.call(RELAY_TO, body, move |ctx, result| {
                ctx.answer(deferred, result.into_result());
            });
            Ok(Bytes::new())
        })
        .cost("work", WORK_COST)
}

/// The work an `echo.work` body asks for.
fn work_of(body: &Bytes) -> Result<Duration, HandlerError> {
    let us: u64 = std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| HandlerError::bad_request("the body must be microseconds, in decimal"))?;
    if us > MAX_WORK_US {
        return Err(HandlerError::bad_request(format!(
            "at most {MAX_WORK_US} µs of work per request"
        )));
    }
    Ok(Duration::from_micros(us))
}

/// Keeps this thread busy for `work`: CPU spent, not time slept.
fn burn(work: Duration) {
    let start = Instant::now();
    while start.elapsed() < work {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proto::Message;
    use proto::code;
    use proto::rpc::RpcRequest;

    use super::*;

    fn request(body: Bytes) -> RpcRequest {
        RpcRequest {
            route: "echo.x".into(),
            body,
            ..RpcRequest::default()
        }
    }

    #[test]
    fn echo_returns_the_body() {
        let body = EchoRequest {
            body: Bytes::from_static(b"ping"),
        }
        .encode_to_vec();
        let response = service().call("echo", request(body.into())).response;
        assert_eq!(response.code, code::OK);
        let echoed = EchoResponse::decode(response.body).unwrap();
        assert_eq!(echoed.body, Bytes::from_static(b"ping"));
    }

    #[test]
    fn work_burns_the_time_asked_and_refuses_more_than_the_limit() {
        let started = Instant::now();
        let response = service()
            .call("work", request(Bytes::from_static(b"300")))
            .response;
        assert_eq!((response.code, &response.body[..]), (code::OK, &b"300"[..]));
        assert!(started.elapsed() >= Duration::from_micros(300));
        let limit = MAX_WORK_US.to_string();
        let over = (MAX_WORK_US + 1).to_string();
        for (body, want) in [
            (limit.as_str(), code::OK),
            (over.as_str(), code::BAD_REQUEST),
            ("", code::BAD_REQUEST),
            ("-5", code::BAD_REQUEST),
            ("ten", code::BAD_REQUEST),
        ] {
            let request = request(Bytes::copy_from_slice(body.as_bytes()));
            assert_eq!(
                service().call("work", request).response.code,
                want,
                "{body:?}"
            );
        }
        assert_eq!(service().cost_of("work"), WORK_COST);
    }

    #[test]
    fn raw_returns_the_bytes_unchanged() {
        let body = Bytes::from_static(&[0xff, 0x00, 0x01]);
        let response = service().call("raw", request(body.clone())).response;
        assert_eq!((response.code, response.body), (code::OK, body));
    }
}
