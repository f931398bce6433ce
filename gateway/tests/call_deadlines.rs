//! A handler that calls another service and answers with a fallback when the call fails
//! must answer before the gate's 408: the call waits at most its own timeout, and never
//! past the request's deadline less the worker's `--call-margin` (docs/workers.md,
//! "Calling other services"). `chat.login` is the built-in case: a login does not fail
//! for want of a profile (docs/chat.md, "Profiles").

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Bus, TestGate, TestWorker, gate_config, start_worker, within};
use futures::future::join_all;
use proto::Message as _;
use proto::chat::{LoginRequest, LoginResponse};
use proto::code;
use services::chat::{self, ChatConfig};
use services::{FrameConfig, Service};

broker::on_both_buses!(
    logins_with_a_profile_service_that_never_answers_all_succeed_in_time,
    a_profile_call_timeout_beyond_the_request_s_is_cut_short_by_the_margin,
);

/// Logins at once, as a crowd arriving.
const LOGINS: usize = 20;

/// A `profile` service whose `get` never answers (the worker's own 408 comes at the
/// call's deadline, too late for the call).
async fn silent_profile(bus: &Bus) -> TestWorker {
    let silent = Service::new("profile").raw_method("get", |ctx, _body| {
        ctx.defer();
        Ok(Bytes::new())
    });
    start_worker(bus.url(), silent, FrameConfig::default()).await
}

/// `LOGINS` clients of a gate whose request timeout is `timeout` each log in at once;
/// every login must be answered 200 with the fallback (the name, no colour) within it.
async fn logins_all_fall_back_within(bus: &Bus, timeout: Duration) {
    let gate = TestGate::start(bus, gate_config(|c| c.request_timeout = timeout)).await;
    let mut clients = Vec::new();
    for _ in 0..LOGINS {
        clients.push(gate.client().await);
    }
    let start = Instant::now();
    let logins = clients.iter().enumerate().map(|(n, client)| async move {
        let name = format!("p{n}");
        let body = LoginRequest { name: name.clone() }.encode_to_vec();
        let answer = client.request("chat.login", body).await.unwrap();
        (name, answer, start.elapsed())
    });
    for (name, answer, took) in within(join_all(logins)).await {
        assert_eq!(answer.code, code::OK, "{name}: {answer:?}");
        let login = LoginResponse::decode(answer.body).unwrap();
        assert_eq!(
            (login.display.as_str(), login.color.as_str()),
            (name.as_str(), ""),
            "the fallback"
        );
        assert!(took < timeout, "{name} took {took:?}");
    }
}

async fn logins_with_a_profile_service_that_never_answers_all_succeed_in_time(bus: Bus) {
    let _profile = silent_profile(&bus).await;
    let _chat = start_worker(bus.url(), chat::service(), FrameConfig::default()).await;
    // The login's own wait for its profile (1 s) is well within the request's.
    logins_all_fall_back_within(&bus, Duration::from_secs(2)).await;
}

async fn a_profile_call_timeout_beyond_the_request_s_is_cut_short_by_the_margin(bus: Bus) {
    let _profile = silent_profile(&bus).await;
    let patient = ChatConfig {
        chat_profile_call_timeout: Duration::from_secs(30),
        ..ChatConfig::default()
    };
    let _chat = start_worker(
        bus.url(),
        chat::service_with(patient),
        FrameConfig::default(),
    )
    .await;
    logins_all_fall_back_within(&bus, Duration::from_secs(1)).await;
}
