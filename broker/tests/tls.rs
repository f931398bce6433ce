//! TLS the way nats-server serves it: INFO in plaintext says `tls_required`, the client
//! upgrades, and real clients (async-nats here, the Go tools in `go_tools.rs`) connect
//! unchanged. Certificates are made fresh by each test (`broker::testing::pki`).

mod common;

use std::time::Duration;

use async_nats::ConnectOptions;
use broker::testing::EmbeddedServer;
use broker::testing::pki::Pki;
use broker::{Auth, Config, Tls};
use common::{Conn, Read, get_json, http_get};
use futures::StreamExt;
use testkit::{NatsServer, nats_server_path, temp_file, within};

async fn tls_server(pki: &Pki, verify: bool) -> EmbeddedServer {
    EmbeddedServer::start(Config {
        tls: Some(pki.server_tls(verify)),
        ..Config::default()
    })
    .await
}

/// async-nats trusting the test CA, refusing anything but TLS.
fn trusting(pki: &Pki) -> ConnectOptions {
    ConnectOptions::new()
        .add_root_certificates(pki.ca.clone())
        .require_tls(true)
}

/// Subscribes and publishes on one connection and sees the message come back.
async fn pub_sub_works(client: &async_nats::Client) {
    let mut sub = within(client.subscribe("secure.greet")).await.unwrap();
    within(client.publish("secure.greet", "hello".into()))
        .await
        .unwrap();
    let msg = within(sub.next()).await.expect("subscription ended");
    assert_eq!(&msg.payload[..], b"hello");
}

#[tokio::test]
async fn async_nats_pub_sub_over_tls() {
    let pki = Pki::new();
    let server = tls_server(&pki, false).await;
    let client = within(trusting(&pki).connect(&server.url)).await.unwrap();
    assert!(client.server_info().tls_required);
    pub_sub_works(&client).await;
}

#[tokio::test]
async fn async_nats_upgrades_when_info_requires_it() {
    // No `require_tls`: the client upgrades because INFO says so, as with nats-server.
    let pki = Pki::new();
    let server = tls_server(&pki, false).await;
    let options = ConnectOptions::new().add_root_certificates(pki.ca.clone());
    let client = within(options.connect(&server.url)).await.unwrap();
    pub_sub_works(&client).await;
}

#[tokio::test]
async fn tls_and_user_password_together() {
    let pki = Pki::new();
    let server = EmbeddedServer::start(Config {
        tls: Some(pki.server_tls(false)),
        auth: Auth::UserPass {
            user: "gate".into(),
            pass: "s3cret".into(),
        },
        ..Config::default()
    })
    .await;
    let wrong = trusting(&pki).user_and_password("gate".into(), "guess".into());
    assert!(within(wrong.connect(&server.url)).await.is_err());
    let right = trusting(&pki).user_and_password("gate".into(), "s3cret".into());
    let client = within(right.connect(&server.url)).await.unwrap();
    pub_sub_works(&client).await;
}

#[tokio::test]
async fn a_client_not_trusting_the_ca_fails_the_handshake() {
    let pki = Pki::new();
    let server = tls_server(&pki, false).await;
    let other = Pki::new();
    let result = within(trusting(&other).connect(&server.url)).await;
    assert!(result.is_err(), "connected with an untrusted certificate");
}

#[tokio::test]
async fn plaintext_client_is_told_tls_is_required_and_closed() {
    let pki = Pki::new();
    let server = tls_server(&pki, false).await;
    let (mut conn, info) = Conn::connect_info(server.addr).await;
    assert_eq!(info["tls_required"], true);
    assert!(info.get("tls_verify").is_none(), "{info}");
    conn.send("CONNECT {\"verbose\":false}\r\nPING\r\n").await;
    assert_eq!(
        conn.read().await,
        Read::Line("-ERR 'Secure Connection - TLS Required'".into())
    );
    assert_eq!(conn.read().await, Read::Closed);

    // Counted, and shown with the TLS settings by monitoring.
    let monitor = server.start_monitor().await;
    let (_, metrics) = http_get(monitor, "/metrics").await;
    assert!(
        metrics.contains("broker_tls_handshake_failures_total 1"),
        "{metrics}"
    );
    let varz = get_json(monitor, "/varz").await;
    assert_eq!(varz["tls_required"], true);
    assert_eq!(varz["tls_timeout"], 2.0);
}

#[tokio::test]
async fn silent_client_is_closed_after_the_tls_timeout() {
    let pki = Pki::new();
    let tls = Tls::from_files(
        &pki.server.cert,
        &pki.server.key,
        None,
        Duration::from_millis(200),
    )
    .unwrap();
    let server = EmbeddedServer::start(Config {
        tls: Some(tls),
        ..Config::default()
    })
    .await;
    let (mut conn, _) = Conn::connect_info(server.addr).await;
    assert_eq!(
        conn.read().await,
        Read::Line("-ERR 'Secure Connection - TLS Required'".into())
    );
    assert_eq!(conn.read().await, Read::Closed);
}

#[tokio::test]
async fn verify_refuses_clients_without_a_ca_signed_certificate() {
    let pki = Pki::new();
    let server = tls_server(&pki, true).await;
    let (_, info) = Conn::connect_info(server.addr).await;
    assert_eq!(info["tls_verify"], true);

    let without = within(trusting(&pki).connect(&server.url)).await;
    assert!(without.is_err(), "connected without a client certificate");
    let stranger =
        trusting(&pki).add_client_certificate(pki.stranger.cert.clone(), pki.stranger.key.clone());
    let stranger = within(stranger.connect(&server.url)).await;
    assert!(
        stranger.is_err(),
        "connected with a stranger CA's certificate"
    );

    let signed =
        trusting(&pki).add_client_certificate(pki.client.cert.clone(), pki.client.key.clone());
    let client = within(signed.connect(&server.url)).await.unwrap();
    pub_sub_works(&client).await;
}

#[test]
fn setup_errors_name_the_file() {
    let pki = Pki::new();
    let missing = std::env::temp_dir().join("shaddock-no-such-ca.pem");
    let timeout = Duration::from_secs(1);
    let error = Tls::from_files(&pki.server.cert, &pki.server.key, Some(&missing), timeout)
        .unwrap_err()
        .to_string();
    assert!(error.contains("shaddock-no-such-ca.pem"), "{error}");
    let error = Tls::from_files(&pki.server.cert, &pki.server.cert, None, timeout).unwrap_err();
    assert!(error.to_string().contains("key file"), "{error}");
    assert!(std::error::Error::source(&error).is_some(), "says why");
    let not_pem = temp_file("not-a-cert.pem", "hello");
    let error = Tls::from_files(&not_pem, &pki.server.key, None, timeout)
        .unwrap_err()
        .to_string();
    assert!(error.contains("not-a-cert.pem"), "{error}");
    let _ = std::fs::remove_file(not_pem);
}

/// Our broker binary and nats-server, each started with the same `-c` file holding a
/// `tls { ... }` block: the syntax and the behaviour agree.
async fn with_tls_config(binary: &std::path::Path, pki: &Pki, verify: bool) -> NatsServer {
    NatsServer::binary_with_config(binary, &pki.conf_block(verify)).await
}

async fn config_file_tls_block_is_served(binary: &std::path::Path) {
    let pki = Pki::new();
    let server = with_tls_config(binary, &pki, true).await;
    let without = within(trusting(&pki).connect(&server.url)).await;
    assert!(without.is_err(), "verify: connected without a certificate");
    let signed =
        trusting(&pki).add_client_certificate(pki.client.cert.clone(), pki.client.key.clone());
    let client = within(signed.connect(&server.url)).await.unwrap();
    assert!(client.server_info().tls_required);
    pub_sub_works(&client).await;
}

#[tokio::test]
async fn config_file_tls_block_ours() {
    config_file_tls_block_is_served(env!("CARGO_BIN_EXE_broker").as_ref()).await;
}

#[tokio::test]
async fn config_file_tls_block_nats_server() {
    config_file_tls_block_is_served(&nats_server_path()).await;
}
