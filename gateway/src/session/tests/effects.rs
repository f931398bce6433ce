//! Effects go with 200 only (docs/workers.md, "RpcResponse"): the gate ignores those of
//! any other answer.

use proto::rpc::{Effect, SetData, effect};

use super::*;

/// Answers request `id` with `code` and one `set_data` effect `key = value`.
fn answer_setting(cx: &Context, sid: u64, id: u64, code: u32, key: &str, value: &str) {
    let resp = RpcResponse {
        code,
        message: if code == code::OK { "" } else { "refused" }.into(),
        effects: vec![Effect {
            kind: Some(effect::Kind::SetData(SetData {
                key: key.into(),
                value: value.into(),
            })),
        }],
        ..Default::default()
    };
    let reply = WorkerReply::Response(Box::new(resp));
    cx.sessions
        .offer(sid, ToSession::Reply { id, reply })
        .expect("the session's queue takes it");
}

/// The session's data as the next request carries it.
async fn data_sent_with(cx: &Context, client: &mut Client, id: u64) -> Vec<(String, String)> {
    request(client, id, "echo.echo").await;
    let sent = published(&cx.bus.written().await);
    let [(_, _, req)] = &sent[..] else {
        panic!("one request: {sent:?}");
    };
    let session = req.session.as_ref().expect("the session rides along");
    let mut data: Vec<_> = session.data.clone().into_iter().collect();
    data.sort();
    data
}

#[tokio::test]
async fn a_non_200_answer_s_effects_are_ignored() {
    let cx = gate(|_| {});
    let mut client = connect(&cx, client::Handshake::default()).await;
    assert_eq!(data_sent_with(&cx, &mut client, 1).await, []);
    answer_setting(&cx, client.sid, 1, code::OK, "kept", "yes");
    assert_eq!(response(&mut client).await.code, code::OK);

    for (id, refusal) in [
        (2, code::CONFLICT),
        (3, code::BAD_REQUEST),
        (4, code::TIMEOUT),
    ] {
        let data = data_sent_with(&cx, &mut client, id).await;
        assert_eq!(
            data,
            [("kept".to_owned(), "yes".to_owned())],
            "200's effects apply"
        );
        answer_setting(&cx, client.sid, id, refusal, "stolen", "yes");
        let resp = response(&mut client).await;
        assert_eq!(
            (resp.id, resp.code, resp.message.as_str()),
            (id, refusal, "refused"),
            "answered as the worker said"
        );
    }
    let data = data_sent_with(&cx, &mut client, 5).await;
    assert_eq!(
        data,
        [("kept".to_owned(), "yes".to_owned())],
        "no refusal's effect was applied"
    );
}

/// A client whose `chat.join` the worker answered 200 with a join of `lobby`, the
/// answer handed to its session (not yet to the client).
async fn joined_lobby(cx: &Arc<Context>) -> Client {
    let mut client = connect(cx, client::Handshake::default()).await;
    request(&mut client, 1, "chat.join").await;
    assert_eq!(published(&cx.bus.written().await).len(), 1);
    let resp = RpcResponse {
        code: code::OK,
        effects: vec![Effect {
            kind: Some(effect::Kind::Join("lobby".into())),
        }],
        ..Default::default()
    };
    let reply = WorkerReply::Response(Box::new(resp));
    cx.sessions
        .offer(client.sid, ToSession::Reply { id: 1, reply })
        .expect("the session's queue takes it");
    client
}

/// A join that subscribes the group here is answered only once the bus server has
/// taken the subscription (the answer to a PING sent after it): a push the client
/// makes happen after seeing the answer must reach it (docs/workers.md, "Effects").
#[tokio::test(start_paused = true)]
async fn a_join_is_answered_once_its_subscription_is_in_place_at_the_server() {
    let cx = gate(|_| {});
    let mut client = joined_lobby(&cx).await;
    let written = cx.bus.written().await;
    let sub = written.find("SUB shaddock.grp.lobby ").expect("subscribed");
    assert!(written[sub..].contains("PING\r\n"), "{written:?}");
    // Short of `--bind-probe-timeout` (200 ms), past which the answer would go anyway.
    let early = tokio::time::timeout(Duration::from_millis(150), client.ws.next()).await;
    assert!(
        early.is_err(),
        "answered before the server had the SUB: {early:?}"
    );
    cx.bus.answer_ping();
    assert_eq!(response(&mut client).await.code, code::OK);
}

/// A bus server that never answers the PING holds the answer no longer than
/// `--bind-probe-timeout`: then it goes out anyway.
#[tokio::test(start_paused = true)]
async fn a_join_s_wait_for_its_subscription_is_bounded_by_the_bind_probe_timeout() {
    let cx = gate(|c| c.bind_probe_timeout = Duration::from_millis(300));
    let mut client = joined_lobby(&cx).await;
    let started = tokio::time::Instant::now();
    assert_eq!(response(&mut client).await.code, code::OK);
    assert_eq!(started.elapsed(), Duration::from_millis(300));
}
