//! Signed player tokens at the handshake: each refusal with its own 401 message, the
//! token's `sub` bound as the uid before the first request, its claims readable by
//! handlers, expiry enforced during the session and moved by `Refresh`, and chat
//! refusing a name that is not the token's.
//!
//! Tokens are made here with `jsonwebtoken` from keys in `tests/fixtures` (an RSA and
//! an Ed25519 pair made with openssl for these tests only) and a secret file.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::raw::RawClient;
use common::{Bus, TestGate, start_worker, within};
use gateway::{GateConfig, JwtCheck, TokenCheck};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use proto::Message as _;
use proto::chat::{LoginRequest, LoginResponse};
use proto::client::{Handshake, Refresh, packet::Kind};
use proto::code;
use serde_json::{Value, json};
use services::{FrameConfig, Service};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

const SECRET: &[u8] = b"a test secret, long enough for HS256";

/// A check with the secret and these public keys. The secret goes through a file of this
/// call's own (tests run in parallel threads of one process: a shared file would be
/// rewritten under another test's reader), removed once loaded.
fn load_check(keys: &[PathBuf], audience: Option<String>, issuer: Option<String>) -> JwtCheck {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "shaddock-jwt-secret-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, [SECRET, b"\n"].concat()).unwrap();
    let check = JwtCheck::load(Some(&path), keys, audience, issuer);
    let _ = std::fs::remove_file(&path);
    check.unwrap()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn hs256(claims: &Value) -> String {
    sign(Algorithm::HS256, claims, &EncodingKey::from_secret(SECRET))
}

fn sign(alg: Algorithm, claims: &Value, key: &EncodingKey) -> String {
    encode(&Header::new(alg), claims, key).unwrap()
}

fn rsa_key() -> EncodingKey {
    EncodingKey::from_rsa_pem(&std::fs::read(fixture("jwt-rsa.key")).unwrap()).unwrap()
}

/// A gate checking tokens signed with the secret, the RSA key or the Ed25519 key, for
/// audience `game` and issuer `studio`.
async fn jwt_gate(bus: &Bus) -> TestGate {
    let check = load_check(
        &[fixture("jwt-rsa.pub"), fixture("jwt-ed25519.pub")],
        Some("game".into()),
        Some("studio".into()),
    );
    let check: Arc<dyn TokenCheck> = Arc::new(check);
    TestGate::start_with_tokens(bus, GateConfig::default(), check).await
}

fn claims(sub: &str, exp: u64) -> Value {
    json!({"sub": sub, "exp": exp, "aud": "game", "iss": "studio", "role": "admin"})
}

async fn handshake(gate: &TestGate, token: &str) -> (RawClient, proto::client::HandshakeAck) {
    let mut raw = RawClient::connect(&gate.url).await;
    let ack = raw
        .handshake(Handshake {
            token: token.into(),
            ..Default::default()
        })
        .await;
    (raw, ack)
}

/// A service that answers with what it knows of the caller.
fn whoami() -> Service {
    Service::new("who").raw_method("ami", |ctx, _| {
        let answer = format!(
            "{} {} {}",
            ctx.uid().unwrap_or("-"),
            ctx.authenticated(),
            ctx.claim("role").unwrap_or("-")
        );
        Ok(answer.into())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_token_binds_its_player_and_claims() {
    let bus = Bus::embedded().await;
    let _who = start_worker(bus.url(), whoami(), FrameConfig::default()).await;
    let gate = jwt_gate(&bus).await;
    let ed = EncodingKey::from_ed_pem(&std::fs::read(fixture("jwt-ed25519.key")).unwrap()).unwrap();
    for token in [
        hs256(&claims("ann", now() + 60)),
        sign(Algorithm::RS256, &claims("ann", now() + 60), &rsa_key()),
        sign(Algorithm::EdDSA, &claims("ann", now() + 60), &ed),
    ] {
        let (mut raw, ack) = handshake(&gate, &token).await;
        assert_eq!(ack.code, code::OK, "{ack:?}");
        raw.request(1, "who.ami", "").await;
        let resp = raw.response().await;
        assert_eq!(resp.code, code::OK, "{resp:?}");
        assert_eq!(&resp.body[..], b"ann true admin");
    }
}

#[tokio::test]
async fn each_bad_token_gets_its_own_401() {
    let bus = Bus::embedded().await;
    let gate = jwt_gate(&bus).await;
    let ok = claims("ann", now() + 60);
    let with = |k: &str, v: Value| {
        let mut c = ok.clone();
        if v.is_null() {
            c.as_object_mut().unwrap().remove(k);
        } else {
            c[k] = v;
        }
        c
    };
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(ok.to_string())
    );
    // The classic confusion: HS256 keyed with the RSA public key's PEM.
    let confused = sign(
        Algorithm::HS256,
        &ok,
        &EncodingKey::from_secret(&std::fs::read(fixture("jwt-rsa.pub")).unwrap()),
    );
    let forged = sign(Algorithm::HS256, &ok, &EncodingKey::from_secret(b"guess"));
    let cases = [
        (hs256(&with("exp", json!(now() - 30))), "token expired"),
        (
            hs256(&with("nbf", json!(now() + 600))),
            "token not yet valid",
        ),
        (forged, "token signature does not verify"),
        (none, "token uses alg none: unsigned tokens are refused"),
        (confused, "token signature does not verify"),
        (
            hs256(&with("aud", json!("other"))),
            "token audience is not accepted",
        ),
        (
            hs256(&with("iss", json!("other"))),
            "token issuer is not accepted",
        ),
        (hs256(&with("sub", Value::Null)), "token has no sub"),
        (
            "not.a.jwt".to_owned(),
            "token is not a JWT: its header does not decode",
        ),
    ];
    for (token, message) in cases {
        let (mut raw, ack) = handshake(&gate, &token).await;
        assert_eq!(ack.code, code::UNAUTHORIZED, "{message}: {ack:?}");
        assert_eq!(ack.message, message);
        raw.expect_close(1008, "unauthorized").await;
    }
    // An RS256 token against a gate with only an HMAC secret: the algorithm is refused.
    let hmac_only = load_check(&[], None, None);
    let rs = sign(Algorithm::RS256, &ok, &rsa_key());
    assert_eq!(
        hmac_only.check(&rs).unwrap_err().to_string(),
        "token algorithm RS256 does not match any configured key"
    );
}

#[tokio::test]
async fn expiry_closes_the_session_unless_refreshed() {
    let bus = Bus::embedded().await;
    let _who = start_worker(bus.url(), whoami(), FrameConfig::default()).await;
    let gate = jwt_gate(&bus).await;
    // Whole seconds: this token expires one to two seconds from now.
    let soon = now() + 2;
    let (mut expiring, ack) = handshake(&gate, &hs256(&claims("ann", soon))).await;
    assert_eq!(ack.code, code::OK);
    let (mut refreshed, ack) = handshake(&gate, &hs256(&claims("bob", soon))).await;
    assert_eq!(ack.code, code::OK);

    // A refresh for another player, and a bad one, are refused and change nothing.
    refreshed
        .send_packet(Kind::Refresh(Refresh {
            token: hs256(&claims("ann", now() + 60)),
        }))
        .await;
    let Some(Kind::RefreshAck(refused)) = refreshed.next_packet().await.kind else {
        panic!("no refresh ack")
    };
    assert_eq!(refused.code, code::UNAUTHORIZED, "{refused:?}");
    refreshed
        .send_packet(Kind::Refresh(Refresh {
            token: hs256(&claims("bob", now() + 60)),
        }))
        .await;
    let Some(Kind::RefreshAck(accepted)) = refreshed.next_packet().await.kind else {
        panic!("no refresh ack")
    };
    assert_eq!(accepted.code, code::OK, "{accepted:?}");

    let Some(Kind::Kick(kick)) = within(expiring.next_packet()).await.kind else {
        panic!("the expired session was not kicked")
    };
    assert_eq!(kick.reason, "token expired");
    expiring.expect_close(1008, "token expired").await;

    // Past the old expiry, the refreshed session still answers.
    let past = SystemTime::UNIX_EPOCH + Duration::from_secs(soon);
    while SystemTime::now() < past + Duration::from_millis(100) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    refreshed.request(1, "who.ami", "").await;
    let resp = refreshed.response().await;
    assert_eq!(&resp.body[..], b"bob true admin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_refuses_a_name_that_is_not_the_tokens() {
    let bus = Bus::embedded().await;
    let _chat = start_worker(bus.url(), services::chat::service(), FrameConfig::default()).await;
    let gate = jwt_gate(&bus).await;
    let (mut raw, ack) = handshake(&gate, &hs256(&claims("ann", now() + 60))).await;
    assert_eq!(ack.code, code::OK);
    let login = |name: &str| LoginRequest { name: name.into() }.encode_to_vec();
    raw.send_packet(Kind::Request(proto::client::Request {
        id: 1,
        route: "chat.login".into(),
        body: login("mallory").into(),
        ..Default::default()
    }))
    .await;
    let refused = raw.response().await;
    assert_eq!(refused.code, code::FORBIDDEN, "{refused:?}");
    raw.send_packet(Kind::Request(proto::client::Request {
        id: 2,
        route: "chat.login".into(),
        body: login("").into(),
        ..Default::default()
    }))
    .await;
    let accepted = raw.response().await;
    assert_eq!(accepted.code, code::OK, "{accepted:?}");
    assert_eq!(LoginResponse::decode(accepted.body).unwrap().name, "ann");
}
