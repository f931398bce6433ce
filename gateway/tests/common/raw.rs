//! A WebSocket client without the SDK: it sends exactly the frames a test writes, in
//! that order (garbage, JSON, requests before the handshake, oversized frames), and
//! reports every frame the gate sends back, close frames included, with a deadline on
//! each read.

use futures::{SinkExt, StreamExt};
use proto::Message as _;
use proto::client::{Handshake, HandshakeAck, Packet, Request, Response, packet::Kind};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::within;

/// What the gate sent next.
#[derive(Debug)]
pub enum Frame {
    /// A binary frame, decoded.
    Packet(Packet),
    /// A text frame, as sent.
    Text(String),
    /// A close frame: its code and reason.
    Close(u16, String),
    /// The connection ended without (another) close frame.
    Ended,
}

pub struct RawClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl RawClient {
    /// Opens the WebSocket only: no Shaddock handshake yet.
    pub async fn connect(url: &str) -> RawClient {
        let (ws, _) = within(tokio_tungstenite::connect_async(url)).await.unwrap();
        RawClient { ws }
    }

    /// Opens the WebSocket from local address `from` (e.g. 127.0.0.2: all of 127/8 is
    /// loopback on Linux), to tell clients apart by IP.
    pub async fn connect_from(url: &str, from: std::net::IpAddr) -> RawClient {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((from, 0).into()).unwrap();
        RawClient::over(url, socket).await
    }

    /// Opens the WebSocket over a socket whose receive buffer is as small as the kernel
    /// allows, and completes a binary handshake: a client that stops reading then fills
    /// up after a few kilobytes rather than megabytes.
    pub async fn handshaken_small_window(url: &str) -> RawClient {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        RawClient::over(url, socket).await.handshaken_now().await
    }

    /// Opens the WebSocket to `url` (`ws://` and an address) over `socket`.
    async fn over(url: &str, socket: tokio::net::TcpSocket) -> RawClient {
        let to: std::net::SocketAddr = url.trim_start_matches("ws://").parse().unwrap();
        let stream = within(socket.connect(to)).await.unwrap();
        let (ws, _) = within(tokio_tungstenite::client_async(
            url,
            MaybeTlsStream::Plain(stream),
        ))
        .await
        .unwrap();
        RawClient { ws }
    }

    /// Opens the WebSocket and completes a binary handshake, which must be accepted.
    pub async fn handshaken(url: &str) -> RawClient {
        RawClient::connect(url).await.handshaken_now().await
    }

    /// Completes a binary handshake, which must be accepted.
    pub async fn handshaken_now(mut self) -> RawClient {
        let ack = self.handshake(Handshake::default()).await;
        assert_eq!(ack.code, proto::code::OK, "{ack:?}");
        self
    }

    /// Sends `handshake` in a binary frame and returns the gate's answer.
    pub async fn handshake(&mut self, handshake: Handshake) -> HandshakeAck {
        self.send_packet(Kind::Handshake(handshake)).await;
        match self.next_packet().await.kind {
            Some(Kind::HandshakeAck(ack)) => ack,
            other => panic!("expected a handshake ack, got {other:?}"),
        }
    }

    pub async fn send(&mut self, message: Message) {
        within(self.ws.send(message)).await.unwrap();
    }

    pub async fn send_packet(&mut self, kind: Kind) {
        let bytes = Packet::new(kind).encode_to_vec();
        self.send(Message::binary(bytes)).await;
    }

    /// Sends request `id` (0: a notify) in a binary frame.
    pub async fn request(&mut self, id: u64, route: &str, body: &str) {
        let request = Request {
            id,
            route: route.to_owned(),
            body: body.to_owned().into(),
            key: String::new(),
        };
        self.send_packet(Kind::Request(request)).await;
    }

    /// Sends requests `ids` on `route` back to back in one write: the gate finds them
    /// all in its socket at once.
    pub async fn pipeline(&mut self, ids: impl IntoIterator<Item = u64>, route: &str) {
        for id in ids {
            let request = Request {
                id,
                route: route.to_owned(),
                body: Default::default(),
                key: String::new(),
            };
            let bytes = Packet::new(Kind::Request(request)).encode_to_vec();
            within(self.ws.feed(Message::binary(bytes))).await.unwrap();
        }
        within(self.ws.flush()).await.unwrap();
    }

    /// The next frame from the gate (pings and pongs skipped).
    pub async fn next_frame(&mut self) -> Frame {
        loop {
            let message = match within(self.ws.next()).await {
                None | Some(Err(_)) => return Frame::Ended,
                Some(Ok(message)) => message,
            };
            return match message {
                Message::Binary(bytes) => Frame::Packet(Packet::decode(bytes).unwrap()),
                Message::Text(text) => Frame::Text(text.as_str().to_owned()),
                Message::Close(Some(close)) => {
                    Frame::Close(u16::from(close.code), close.reason.as_str().to_owned())
                }
                Message::Close(None) => Frame::Close(1005, String::new()),
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
            };
        }
    }

    /// The next frame, which must be a binary packet.
    pub async fn next_packet(&mut self) -> Packet {
        match self.next_frame().await {
            Frame::Packet(packet) => packet,
            other => panic!("expected a packet, got {other:?}"),
        }
    }

    /// The next frame, which must be a response.
    pub async fn response(&mut self) -> Response {
        match self.next_packet().await.kind {
            Some(Kind::Response(response)) => response,
            other => panic!("expected a response, got {other:?}"),
        }
    }

    /// The next frame, which must be a text frame.
    pub async fn next_text(&mut self) -> String {
        match self.next_frame().await {
            Frame::Text(text) => text,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }

    /// The next frame must be a close frame with `code` and `reason`, and then the
    /// connection must end.
    pub async fn expect_close(&mut self, code: u16, reason: &str) {
        match self.next_frame().await {
            Frame::Close(got_code, got_reason) => {
                assert_eq!((got_code, got_reason.as_str()), (code, reason));
            }
            other => panic!("expected close {code} {reason:?}, got {other:?}"),
        }
        match self.next_frame().await {
            Frame::Ended => {}
            other => panic!("expected the connection to end after the close, got {other:?}"),
        }
    }
}
