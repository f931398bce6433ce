//! `wss://` on a real `shaddock up`: a certificate made here (rcgen, signed by a test CA),
//! a round trip through the TLS listener beside the plain one, and a certificate
//! renewed on SIGHUP while a session stays open: new connections get the new
//! certificate, the open session is still answered.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use nix::sys::signal::Signal;
use proto::Message as _;
use proto::client::{Handshake, Packet, Request, packet::Kind};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use testkit::within;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// Descriptors are not what this test is about: plenty.
const NOFILE: u64 = 4096;

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
}

fn ca() -> Ca {
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    let der = params.self_signed(&key).unwrap().der().clone();
    Ca {
        issuer: Issuer::new(params, key),
        der,
    }
}

/// A server certificate for localhost signed by `ca`, written as PEM to `cert`/`key`;
/// returns its DER, to tell which certificate a connection was served.
fn server_cert(ca: &Ca, cert: &Path, key: &Path) -> CertificateDer<'static> {
    let params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let pair = KeyPair::generate().unwrap();
    let signed = params.signed_by(&pair, &ca.issuer).unwrap();
    std::fs::write(cert, signed.pem()).unwrap();
    std::fs::write(key, pair.serialize_pem()).unwrap();
    signed.der().clone()
}

type Wss = WebSocketStream<TlsStream<TcpStream>>;

/// Opens a `wss://` session trusting only `ca`; returns it and the certificate the
/// gate presented.
async fn connect(addr: std::net::SocketAddr, ca: &Ca) -> (Wss, CertificateDer<'static>) {
    let mut roots = RootCertStore::empty();
    roots.add(ca.der.clone()).unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = within(TcpStream::connect(addr)).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = within(TlsConnector::from(Arc::new(config)).connect(name, tcp))
        .await
        .unwrap();
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (mut ws, _) = within(tokio_tungstenite::client_async("wss://localhost/", tls))
        .await
        .unwrap();
    send(&mut ws, Kind::Handshake(Handshake::default())).await;
    let Some(Kind::HandshakeAck(ack)) = next(&mut ws).await.kind else {
        panic!("no handshake ack")
    };
    assert_eq!(ack.code, proto::code::OK);
    (ws, presented)
}

async fn send(ws: &mut Wss, kind: Kind) {
    let frame = Packet::new(kind).encode_to_vec();
    within(ws.send(Message::binary(frame))).await.unwrap();
}

async fn next(ws: &mut Wss) -> Packet {
    loop {
        match within(ws.next()).await {
            Some(Ok(Message::Binary(bytes))) => return Packet::decode(bytes).unwrap(),
            Some(Ok(_)) => continue,
            other => panic!("the session ended: {other:?}"),
        }
    }
}

async fn echo(ws: &mut Wss, id: u64, text: &str) {
    let request = Request {
        id,
        route: "echo.raw".into(),
        body: text.as_bytes().to_vec().into(),
        key: String::new(),
    };
    send(ws, Kind::Request(request)).await;
    let Some(Kind::Response(resp)) = next(ws).await.kind else {
        panic!("no response")
    };
    assert_eq!(
        (resp.code, &resp.body[..]),
        (proto::code::OK, text.as_bytes())
    );
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("shaddock-tls-{}-{name}", std::process::id()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_round_trip_and_a_certificate_renewed_on_sighup() {
    let ca = ca();
    let (cert, key) = (temp("cert.pem"), temp("key.pem"));
    let first = server_cert(&ca, &cert, &key);
    let (cert_arg, key_arg) = (
        format!("--tls-cert={}", cert.display()),
        format!("--tls-key={}", key.display()),
    );
    let mut up = common::up(NOFILE, &["--tls-listen=127.0.0.1:0", &cert_arg, &key_arg]);
    let addr = up
        .addr_after("Gate listening for TLS WebSocket clients on ")
        .await;
    up.line("Server is ready").await;

    let (mut open, presented) = connect(addr, &ca).await;
    assert_eq!(presented, first);
    echo(&mut open, 1, "over tls").await;

    let second = server_cert(&ca, &cert, &key);
    assert_ne!(first, second);
    up.signal(Signal::SIGHUP);
    up.line("TLS certificate reloaded").await;

    let (mut fresh, presented) = connect(addr, &ca).await;
    assert_eq!(
        presented, second,
        "a connection after the reload gets the new certificate"
    );
    echo(&mut fresh, 1, "new").await;
    echo(&mut open, 2, "still open").await;

    // A broken renewal keeps the certificate in use.
    std::fs::write(&key, "not a key").unwrap();
    up.signal(Signal::SIGHUP);
    up.line("TLS certificate not reloaded").await;
    let (mut after, presented) = connect(addr, &ca).await;
    assert_eq!(presented, second);
    echo(&mut after, 1, "kept").await;
    for path in [cert, key] {
        let _ = std::fs::remove_file(path);
    }
}
