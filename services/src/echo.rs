//! The echo service: answers with what it was sent. It does no work of its own, so load
//! tests through it measure the path (gate, bus, worker loop) and nothing else.
//!
//! - `echo.echo`: an `EchoRequest` answered by an `EchoResponse` with the same body.
//! - `echo.raw`: the request body answered unchanged, not decoded at all.

use proto::echo::{EchoRequest, EchoResponse};

use crate::context::Context;
use crate::service::{HandlerError, Service};

/// The service's name: its subject token and queue group.
pub const NAME: &str = "echo";

/// The echo service.
pub fn service() -> Service {
    Service::new(NAME)
        .method("echo", |_ctx: &mut Context, request: EchoRequest| {
            Ok::<_, HandlerError>(EchoResponse { body: request.body })
        })
        .raw_method("raw", |_ctx, body| Ok(body))
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
    fn raw_returns_the_bytes_unchanged() {
        let body = Bytes::from_static(&[0xff, 0x00, 0x01]);
        let response = service().call("raw", request(body.clone())).response;
        assert_eq!((response.code, response.body), (code::OK, body));
    }
}
