//! A gate and a worker on a secured bus: TLS with our test CA plus credentials
//! (user/password, token, NKey), connected through `services::connect` and
//! `BusSecurity` exactly as `shaddock gate` and `shaddock worker` connect, on the real
//! nats-server (configured with `tls {}` and `authorization {}` blocks) and on our broker.
//! A WebSocket client's echo request crossing them is the proof.

mod common;

use std::sync::Arc;

use broker::testing::EmbeddedServer;
use broker::testing::pki::Pki;
use broker::{Auth, Config};
use bus::BusOptions;
use common::{Bus, TestGate, start_worker_with, within};
use gateway::{AnyToken, GateConfig};
use proto::code;
use services::{BusSecurity, WorkerConfig};
use testkit::temp_file;

/// Trusts the test CA (and so requires TLS), with `auth`'s credentials.
fn trusting(pki: &Pki, auth: impl FnOnce(&mut BusSecurity)) -> BusSecurity {
    let mut security = BusSecurity {
        nats_ca: Some(pki.ca.clone()),
        ..BusSecurity::default()
    };
    auth(&mut security);
    security
}

fn user_password(security: &mut BusSecurity) {
    security.nats_user = Some("shaddock".into());
    security.nats_password = Some("bus-s3cret".into());
}

fn token(security: &mut BusSecurity) {
    security.nats_token = Some("bus-t0ken".into());
}

/// Echo through a gate and a worker that both connect with `security`.
async fn echo_crosses(bus: &Bus, security: BusSecurity) {
    let url = bus.url().to_owned();
    let config = WorkerConfig {
        nats: vec![url.clone()],
        security: security.clone(),
        ..WorkerConfig::default()
    };
    let _worker = start_worker_with(services::echo::service(), config).await;
    let mut options = BusOptions::new([url]);
    options.auth = security.credentials().unwrap();
    options.tls = security.tls_config().unwrap().map(Arc::new);
    let gate = TestGate::start_on(options, GateConfig::default(), Arc::new(AnyToken)).await;
    let client = gate.client().await;
    let response = within(client.request("echo.raw", "over tls"))
        .await
        .unwrap();
    assert_eq!(response.code, code::OK, "{response:?} on {}", bus.name());
    assert_eq!(response.body, b"over tls".as_slice());
}

async fn our_broker(pki: &Pki, auth: Auth) -> Bus {
    Bus::Embedded(
        EmbeddedServer::start(Config {
            tls: Some(pki.server_tls(false)),
            auth,
            ..Config::default()
        })
        .await,
    )
}

async fn nats_server(pki: &Pki, authorization: &str) -> Bus {
    let config = format!(
        "{}authorization {{ {authorization} }}\n",
        pki.conf_block(false)
    );
    Bus::nats_server_with(&config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_user_password_on_our_broker() {
    let pki = Pki::new();
    let auth = Auth::UserPass {
        user: "shaddock".into(),
        pass: "bus-s3cret".into(),
    };
    let bus = our_broker(&pki, auth).await;
    echo_crosses(&bus, trusting(&pki, user_password)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_user_password_on_nats_server() {
    let pki = Pki::new();
    let bus = nats_server(&pki, "user: shaddock, password: bus-s3cret").await;
    echo_crosses(&bus, trusting(&pki, user_password)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_token_on_our_broker() {
    let pki = Pki::new();
    let bus = our_broker(&pki, Auth::Token("bus-t0ken".into())).await;
    echo_crosses(&bus, trusting(&pki, token)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_token_on_nats_server() {
    let pki = Pki::new();
    let bus = nats_server(&pki, "token: bus-t0ken").await;
    echo_crosses(&bus, trusting(&pki, token)).await;
}

/// NKeys need nats-server (our broker has user/password and token auth only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_nkey_on_nats_server() {
    let pki = Pki::new();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let seed_file = temp_file("user.nk", &format!("{seed}\n"));
    let bus = nats_server(
        &pki,
        &format!("users = [ {{ nkey: {} }} ]", user.public_key()),
    )
    .await;
    let security = trusting(&pki, |s| s.nats_nkey = Some(seed_file.clone()));
    echo_crosses(&bus, security).await;
    let _ = std::fs::remove_file(seed_file);
}

/// With client certificates required, the gate and worker present theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_on_both_buses() {
    let pki = Pki::new();
    let with_cert = trusting(&pki, |s| {
        s.nats_tls_cert = Some(pki.client.cert.clone());
        s.nats_tls_key = Some(pki.client.key.clone());
    });
    let ours = Bus::Embedded(
        EmbeddedServer::start(Config {
            tls: Some(pki.server_tls(true)),
            ..Config::default()
        })
        .await,
    );
    echo_crosses(&ours, with_cert.clone()).await;
    let theirs = Bus::nats_server_with(&pki.conf_block(true)).await;
    echo_crosses(&theirs, with_cert).await;
}
