//! The Rust SDK over `wss://`: a gate served in-process with a plain and a TLS listener
//! side by side (a certificate made here with rcgen, signed by a test CA), an echo
//! worker on the embedded bus, and SDK clients that trust that CA, trust another one,
//! or bring no TLS configuration at all.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bus::BusOptions;
use common::{Bus, echo_worker, within};
use gateway::tls::Tls;
use gateway::{AnyToken, Gate, GateConfig, Listener};
use proto::code;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use sdk::{Client, ClientOptions, ErrorKind, tls_client_config};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// PEM files made for one test, removed when it ends (however it ends).
struct Files(Vec<PathBuf>);

impl Files {
    fn path(&mut self, name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "shaddock-wss-{}-{:?}-{name}",
            std::process::id(),
            std::thread::current().id()
        ));
        self.0.push(path.clone());
        path
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A CA, written as PEM to `ca`; returns what signs with it.
fn ca(ca: &Path) -> Issuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    std::fs::write(ca, params.self_signed(&key).unwrap().pem()).unwrap();
    Issuer::new(params, key)
}

/// A gate serving `ws://` and `wss://` (a certificate for 127.0.0.1 and localhost that
/// `issuer` signed) on port 0; stopped when the token is dropped.
struct TwoListenerGate {
    plain: SocketAddr,
    tls: SocketAddr,
    _shutdown: tokio_util::sync::DropGuard,
}

async fn gate(bus: &Bus, issuer: &Issuer<'static, KeyPair>, files: &mut Files) -> TwoListenerGate {
    let (cert, key) = (files.path("cert.pem"), files.path("key.pem"));
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let pair = KeyPair::generate().unwrap();
    let signed = CertificateParams::new(names)
        .unwrap()
        .signed_by(&pair, issuer)
        .unwrap();
    std::fs::write(&cert, signed.pem()).unwrap();
    std::fs::write(&key, pair.serialize_pem()).unwrap();

    let options = BusOptions::new([bus.url()]);
    let gate = within(Gate::new(
        options,
        GateConfig::default(),
        Arc::new(AnyToken),
    ))
    .await
    .unwrap();
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (plain_addr, tls_addr) = (plain.local_addr().unwrap(), tls.local_addr().unwrap());
    let listeners = vec![
        Listener::plain(plain),
        Listener::tls(tls, Tls::load(&cert, &key).unwrap()),
    ];
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move { gate.serve(listeners, shutdown).await }
    });
    TwoListenerGate {
        plain: plain_addr,
        tls: tls_addr,
        _shutdown: shutdown.drop_guard(),
    }
}

async fn echo(client: &Client, text: &str) {
    let response = within(client.request("echo.raw", text)).await.unwrap();
    assert_eq!(
        (response.code, &response.body[..]),
        (code::OK, text.as_bytes())
    );
}

#[tokio::test]
async fn a_client_trusting_the_ca_round_trips_over_wss_beside_a_plain_one() {
    let bus = Bus::embedded().await;
    let _worker = echo_worker(&bus).await;
    let mut files = Files(Vec::new());
    let ca_path = files.path("ca.pem");
    let issuer = ca(&ca_path);
    let gate = gate(&bus, &issuer, &mut files).await;

    let options = ClientOptions {
        tls: Some(tls_client_config(&ca_path).unwrap()),
        ..ClientOptions::default()
    };
    let secure = within(Client::connect(
        &format!("wss://{}", gate.tls),
        options.clone(),
    ))
    .await
    .unwrap();
    // By name as well as by address: the certificate covers both.
    let by_name = format!("wss://localhost:{}/", gate.tls.port());
    let named = within(Client::connect(&by_name, options)).await.unwrap();
    let plain = within(Client::connect(
        &format!("ws://{}", gate.plain),
        ClientOptions::default(),
    ))
    .await
    .unwrap();
    for (n, client) in [&secure, &named, &plain].into_iter().enumerate() {
        echo(client, &format!("hello #{n}")).await;
    }
    // Several in flight at once go through the TLS writer's batching too.
    let burst: Vec<String> = (0..32).map(|n| format!("burst {n}")).collect();
    futures::future::join_all(burst.iter().map(|text| echo(&secure, text))).await;
    for client in [secure, named, plain] {
        within(client.close()).await;
    }
}

#[tokio::test]
async fn wss_without_a_tls_configuration_is_a_connect_error_that_says_so() {
    let error = Client::connect("wss://127.0.0.1:9/", ClientOptions::default())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), &ErrorKind::Connect);
    assert!(error.detail().contains("ClientOptions::tls"), "{error}");
}

#[tokio::test]
async fn a_gate_whose_certificate_another_ca_signed_is_refused() {
    let bus = Bus::embedded().await;
    let mut files = Files(Vec::new());
    let issuer = ca(&files.path("ca.pem"));
    let other_ca = files.path("other-ca.pem");
    ca(&other_ca);
    let gate = gate(&bus, &issuer, &mut files).await;

    let options = ClientOptions {
        tls: Some(tls_client_config(&other_ca).unwrap()),
        ..ClientOptions::default()
    };
    let error = within(Client::connect(&format!("wss://{}", gate.tls), options))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), &ErrorKind::Connect);
    assert!(error.detail().contains("TLS handshake"), "{error}");
}

#[test]
fn a_ca_file_without_certificates_is_refused() {
    let mut files = Files(Vec::new());
    let empty = files.path("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    let error = tls_client_config(&empty).unwrap_err();
    assert!(
        error.to_string().contains("holds no certificate"),
        "{error}"
    );
}
