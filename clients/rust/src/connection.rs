//! Dialing a gate: TCP, TLS for `wss://`, the WebSocket upgrade and the handshake,
//! within the connect timeout; and dialing one of several gates in turn.

use std::net::{IpAddr, SocketAddr};

use futures::{SinkExt, StreamExt};
use proto::client::{HandshakeAck, packet::Kind};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::debug;

use super::ClientOptions;
use super::error::{ErrorKind, SdkError};
use super::frame::{self, Incoming};
use super::resume::Resume;
use super::stream::Stream;

/// A WebSocket to a gate, as the SDK dials it.
pub type Ws = WebSocketStream<Stream>;

/// Ports a URL without one means, as browsers read them.
const WS_PORT: u16 = 80;
const WSS_PORT: u16 = 443;

/// A handshaken connection and the index of the URL it went to.
pub(crate) struct Dialed {
    pub(crate) url_index: usize,
    pub(crate) ws: Ws,
    pub(crate) ack: HandshakeAck,
}

/// Tries `count` of `urls` in turn, starting at index `first` and wrapping around, each
/// once; the first that handshakes wins, with a fresh session. Fails with the last attempt's error, or at once
/// when a gate refuses the handshake with a 4xx (the others would refuse that token too).
pub(crate) async fn connect_in_turn(
    urls: &[String],
    first: usize,
    count: usize,
    options: &ClientOptions,
) -> Result<Dialed, SdkError> {
    let mut last = SdkError::connect("no gate URL given");
    for step in 0..count.min(urls.len()) {
        let url_index = (first + step) % urls.len();
        match connect(&urls[url_index], options, None).await {
            Ok((ws, ack)) => return Ok(Dialed { url_index, ws, ack }),
            Err(e) if matches!(e.kind(), ErrorKind::Handshake { code: 400..=499 }) => {
                return Err(e);
            }
            Err(e) => {
                debug!(url = urls[url_index], error = %e, "gate did not answer");
                last = e;
            }
        }
    }
    Err(last)
}

/// Opens the WebSocket and handshakes, within `connect_timeout`, asking to take up the
/// session of `resume` if given (the ack's `resume_code` says whether it was). Public
/// (without `resume`: [`crate::dial`]) for tools that drive the session themselves.
pub(crate) async fn connect(
    url: &str,
    options: &ClientOptions,
    resume: Option<&Resume>,
) -> Result<(Ws, HandshakeAck), SdkError> {
    let handshake = async {
        let mut ws = open(url, options).await?;
        ws.send(frame::handshake(options, resume))
            .await
            .map_err(|e| SdkError::connect_io("sending the handshake", e))?;
        loop {
            let message = match ws.next().await {
                Some(Ok(message)) => message,
                Some(Err(e)) => return Err(SdkError::connect_io("awaiting the handshake ack", e)),
                None => {
                    return Err(SdkError::connect(
                        "the gate closed before the handshake ack",
                    ));
                }
            };
            let packet = match frame::incoming(message).map_err(SdkError::protocol)? {
                Incoming::Packet(packet) => packet,
                Incoming::Close(reason) => {
                    return Err(SdkError::connect(format!(
                        "the gate closed before the handshake ack: {reason}"
                    )));
                }
                Incoming::Control => continue,
            };
            match packet.kind {
                Some(Kind::HandshakeAck(ack)) if ack.code == proto::code::OK => {
                    return Ok((ws, ack));
                }
                Some(Kind::HandshakeAck(ack)) => {
                    return Err(SdkError::handshake(ack.code, ack.message));
                }
                Some(Kind::Heartbeat(_)) => continue,
                other => {
                    return Err(SdkError::protocol(format!(
                        "expected a handshake ack, got {other:?}"
                    )));
                }
            }
        }
    };
    match tokio::time::timeout(options.connect_timeout, handshake).await {
        Ok(result) => result,
        Err(_) => Err(SdkError::connect(format!(
            "no handshake ack within {:?}",
            options.connect_timeout
        ))),
    }
}

/// Opens the socket (TCP, then TLS for `wss://` with [`ClientOptions::tls`]) and
/// upgrades it to a WebSocket, without the handshake: public for tools that speak the
/// protocol themselves over the SDK's dialing (the load generator).
pub async fn open(url: &str, options: &ClientOptions) -> Result<Ws, SdkError> {
    let config = WebSocketConfig::default()
        .read_buffer_size(8 * 1024)
        .max_message_size(Some(options.max_frame_bytes))
        .max_frame_size(Some(options.max_frame_bytes));
    let request = url
        .into_client_request()
        .map_err(|e| SdkError::connect_io(url, e))?;
    let uri = request.uri();
    let tls = match uri.scheme_str() {
        Some("ws") => None,
        Some("wss") => Some(options.tls.clone().ok_or_else(|| {
            SdkError::connect(format!(
                "{url}: wss:// needs ClientOptions::tls (sdk::tls_client_config makes one \
                 trusting a CA file)"
            ))
        })?),
        _ => {
            return Err(SdkError::connect(format!(
                "{url}: not a ws:// or wss:// URL"
            )));
        }
    };
    let host = uri
        .host()
        .ok_or_else(|| SdkError::connect(format!("{url}: no host")))?;
    // An IPv6 literal comes bracketed; neither the resolver nor the server name wants it so.
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri
        .port_u16()
        .unwrap_or(if tls.is_some() { WSS_PORT } else { WS_PORT });
    let tcp = tcp_connect(&host, port, options.source_addr)
        .await
        .map_err(|e| SdkError::connect_io(url, e))?;
    // The writer batches frames itself; Nagle would only delay the flush it asked for.
    tcp.set_nodelay(true)
        .map_err(|e| SdkError::connect_io(url, e))?;
    let stream = match tls {
        None => Stream::Plain(tcp),
        Some(tls) => {
            let name = ServerName::try_from(host).map_err(|e| SdkError::connect_io(url, e))?;
            let tls = TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|e| SdkError::connect_io(&format!("{url}: TLS handshake"), e))?;
            Stream::Tls(Box::new(tls))
        }
    };
    let (ws, _) = tokio_tungstenite::client_async_with_config(request, stream, Some(config))
        .await
        .map_err(|e| SdkError::connect_io(url, e))?;
    Ok(ws)
}

/// TCP to `host:port`, from `source` when given: the socket is bound to it (any port)
/// before it connects, to the first of the host's addresses of the same family.
async fn tcp_connect(host: &str, port: u16, source: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect((host, port)).await;
    };
    let mut addrs = tokio::net::lookup_host((host, port)).await?;
    let Some(addr) = addrs.find(|a| a.is_ipv4() == source.is_ipv4()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!("{host} has no address of the family of the source address {source}"),
        ));
    };
    let socket = match source {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(source, 0)).map_err(|e| {
        std::io::Error::new(e.kind(), format!("binding to source address {source}: {e}"))
    })?;
    socket.connect(addr).await
}
