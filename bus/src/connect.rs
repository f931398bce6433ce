//! Opening one connection: dial, read INFO, TLS if asked, CONNECT with credentials,
//! and a PING answered, so a refused login shows here and not later.

use base64::Engine as _;
use bytes::BytesMut;
use nats_wire::{Limits, ServerOp, parse_server};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

use net::BusCredentials;

use super::options::{BusOptions, LocalStream, MAX_CONTROL_LINE, MAX_PAYLOAD, parse_url};

pub(super) const LIMITS: Limits = Limits {
    max_control_line: MAX_CONTROL_LINE,
    max_payload: MAX_PAYLOAD,
};

/// The handshake's read buffer at first (an INFO is a few hundred bytes; it grows up to
/// the control-line limit if a server sends more).
const HANDSHAKE_BUFFER: usize = 4096;

/// What a server says of itself in INFO (the fields the bus uses).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct Info {
    #[serde(flatten)]
    pub server: ServerInfo,
    pub tls_required: bool,
    pub nonce: Option<String>,
    /// Lame duck mode: the server is going away; move to another.
    pub ldm: bool,
}

/// What the server of the current connection says of itself ([`Bus::server_info`]).
///
/// [`Bus::server_info`]: crate::Bus::server_info
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ServerInfo {
    pub server_id: String,
    /// The largest message payload the server accepts.
    pub max_payload: usize,
}

impl Info {
    pub(super) fn parse(json: &[u8]) -> Result<Info, String> {
        serde_json::from_slice(json).map_err(|e| format!("unreadable INFO: {e}"))
    }
}

/// An open, logged-in connection.
pub(super) struct Conn {
    pub stream: LocalStream,
    pub info: Info,
    /// Bytes read past the handshake's PONG.
    pub leftover: BytesMut,
    /// Which server of the list it is, for logs and for moving elsewhere.
    pub server: usize,
}

/// Opens a connection to server `index` of `options`, within the connect timeout.
pub(super) async fn open(options: &BusOptions, index: usize) -> Result<Conn, String> {
    let name = options
        .urls
        .get(index)
        .cloned()
        .unwrap_or_else(|| "in-process".into());
    tokio::time::timeout(options.connect_timeout, handshake(options, index))
        .await
        .map_err(|_| format!("{name}: no answer within {:?}", options.connect_timeout))?
        .map_err(|e| format!("{name}: {e}"))
}

async fn handshake(options: &BusOptions, index: usize) -> Result<Conn, String> {
    let (mut stream, server) = match &options.dialer {
        Some(dial) => (dial().await.map_err(|e| e.to_string())?, None),
        None => {
            let server = parse_url(&options.urls[index])?;
            let tcp = TcpStream::connect((server.host.as_str(), server.port))
                .await
                .map_err(|e| e.to_string())?;
            let _ = tcp.set_nodelay(true);
            (Box::new(tcp) as LocalStream, Some(server))
        }
    };
    let mut buf = BytesMut::with_capacity(HANDSHAKE_BUFFER);
    let info = read_info(&mut stream, &mut buf).await?;
    let wants_tls = options.tls.is_some() || server.as_ref().is_some_and(|s| s.tls);
    if let Some(server) = &server
        && (wants_tls || info.tls_required)
    {
        let Some(config) = options.tls.clone() else {
            return Err("the server requires TLS: give --nats-tls or --nats-ca".into());
        };
        if !info.tls_required {
            return Err("TLS is required but the server offers none".into());
        }
        let name = ServerName::try_from(server.host.clone()).map_err(|e| e.to_string())?;
        let tls = TlsConnector::from(config)
            .connect(name, stream)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        stream = Box::new(tls);
        buf.clear();
    }
    let user = server.as_ref().and_then(|s| s.user.clone());
    let connect = connect_json(options, &info, user)?;
    let mut hello = Vec::with_capacity(connect.len() + 16);
    hello.extend_from_slice(b"CONNECT ");
    hello.extend_from_slice(connect.as_bytes());
    hello.extend_from_slice(b"\r\nPING\r\n");
    stream.write_all(&hello).await.map_err(|e| e.to_string())?;
    // Until the PONG: an -ERR here is the server refusing the login.
    loop {
        let (op_end, pong) = {
            let Some((op, used)) = next_op(&mut stream, &mut buf).await? else {
                return Err("the server closed the connection during the handshake".into());
            };
            match op {
                ServerOp::Pong => (used, true),
                ServerOp::Err(text) => {
                    return Err(format!("refused: {}", String::from_utf8_lossy(text)));
                }
                _ => (used, false),
            }
        };
        let _ = buf.split_to(op_end);
        if pong {
            break;
        }
    }
    Ok(Conn {
        stream,
        info,
        leftover: buf,
        server: index,
    })
}

/// Reads the first op, which must be INFO.
async fn read_info(stream: &mut LocalStream, buf: &mut BytesMut) -> Result<Info, String> {
    let Some((op, used)) = next_op(stream, buf).await? else {
        return Err("the server closed the connection before INFO".into());
    };
    let info = match op {
        ServerOp::Info(json) => Info::parse(json)?,
        _ => return Err("the server's first line was not INFO".into()),
    };
    let _ = buf.split_to(used);
    Ok(info)
}

/// Reads until `buf` starts with a whole op, and parses it; `None` at end of stream.
async fn next_op<'a>(
    stream: &mut LocalStream,
    buf: &'a mut BytesMut,
) -> Result<Option<(ServerOp<'a>, usize)>, String> {
    loop {
        match parse_server(buf, &LIMITS) {
            Ok(Some(_)) => break,
            Ok(None) => {}
            Err(e) => return Err(format!("unreadable server op: {e}")),
        }
        if stream.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Ok(None);
        }
    }
    // Parsed again to hand out the borrow (a handshake reads a few ops, once).
    parse_server(buf, &LIMITS).map_err(|e| e.to_string())
}

/// The CONNECT options: no echo of `+OK`, headers and "no responders" on (a request
/// with no worker is answered at once), and the credentials.
fn connect_json(
    options: &BusOptions,
    info: &Info,
    url_user: Option<(String, String)>,
) -> Result<String, String> {
    let mut connect = serde_json::json!({
        "verbose": false,
        "pedantic": false,
        "tls_required": options.tls.is_some(),
        "name": options.name,
        "lang": "rust-shaddock-bus",
        "version": env!("CARGO_PKG_VERSION"),
        "protocol": 1,
        "echo": true,
        "headers": true,
        "no_responders": true,
    });
    let sign = |seed: &str| -> Result<(String, String), String> {
        let nonce = info
            .nonce
            .as_deref()
            .ok_or("the server sent no nonce to sign")?;
        let pair = nkeys::KeyPair::from_seed(seed).map_err(|e| format!("NKey seed: {e}"))?;
        let sig = pair
            .sign(nonce.as_bytes())
            .map_err(|e| format!("signing the nonce: {e}"))?;
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sig);
        Ok((pair.public_key(), sig))
    };
    let fields = &mut connect;
    match (&options.auth, url_user) {
        (BusCredentials::None, Some((user, pass))) => {
            fields["user"] = user.into();
            fields["pass"] = pass.into();
        }
        (BusCredentials::None, None) => {}
        (BusCredentials::UserPassword { user, password }, _) => {
            fields["user"] = user.clone().into();
            fields["pass"] = password.clone().into();
        }
        (BusCredentials::Token(token), _) => fields["auth_token"] = token.clone().into(),
        (BusCredentials::NKey(seed), _) => {
            let (public, sig) = sign(seed)?;
            fields["nkey"] = public.into();
            fields["sig"] = sig.into();
        }
        (BusCredentials::Jwt { jwt, seed }, _) => {
            let (_, sig) = sign(seed)?;
            fields["jwt"] = jwt.clone().into();
            fields["sig"] = sig.into();
        }
    }
    Ok(connect.to_string())
}
