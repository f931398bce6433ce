//! Raw NATS protocol over TCP (or any byte stream) for the protocol tests: write bytes, read lines, with
//! [`DEADLINE`] on every read. Starting servers is the shared harness's job
//! (`broker::testing`, feature `testing`).

#![allow(dead_code)] // not every test file uses every helper

use std::net::SocketAddr;
use std::time::Duration;

use testkit::DEADLINE;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt,
    BufReader as TokioBufReader,
};
use tokio::net::TcpStream;

/// A raw NATS protocol connection: write bytes, read lines, with [`DEADLINE`] on reads.
pub struct Conn {
    reader: TokioBufReader<Box<dyn AsyncRead + Send + Unpin>>,
    writer: Box<dyn AsyncWrite + Send + Unpin>,
    /// Answer the server's own PINGs and hide them from the test (on by default), so a
    /// check that runs past the server's first PING is not thrown off by it.
    pub auto_pong: bool,
}

/// What a read produced: a line, or the end of the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    Line(String),
    Closed,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Conn {
        Conn::from_stream(TcpStream::connect(addr).await.unwrap())
    }

    pub fn from_stream(stream: TcpStream) -> Conn {
        stream.set_nodelay(true).unwrap();
        Conn::from_io(stream)
    }

    /// Over any byte stream, e.g. an in-process connection.
    pub fn from_io<S: AsyncRead + AsyncWrite + Send + 'static>(stream: S) -> Conn {
        let (read, writer) = tokio::io::split(stream);
        Conn {
            reader: TokioBufReader::new(Box::new(read)),
            writer: Box::new(writer),
            auto_pong: true,
        }
    }

    /// Connects and consumes the INFO line, returning its JSON.
    pub async fn connect_info(addr: SocketAddr) -> (Conn, serde_json::Value) {
        let mut conn = Conn::connect(addr).await;
        let info = conn.read_info().await;
        (conn, info)
    }

    /// Connects, reads INFO, sends `CONNECT <json>` and a PING, and waits for the PONG.
    pub async fn connect_with(addr: SocketAddr, connect_json: &str) -> Conn {
        let (mut conn, _) = Conn::connect_info(addr).await;
        conn.send(&format!("CONNECT {connect_json}\r\nPING\r\n"))
            .await;
        conn.expect_line("PONG").await;
        conn
    }

    /// A connected client with verbose off, ready for ops.
    pub async fn quiet(addr: SocketAddr) -> Conn {
        Conn::connect_with(addr, r#"{"verbose":false,"pedantic":false}"#).await
    }

    pub async fn read_info(&mut self) -> serde_json::Value {
        let line = self.line().await;
        let json = line
            .strip_prefix("INFO ")
            .unwrap_or_else(|| panic!("expected INFO first, got {line:?}"));
        serde_json::from_str(json.trim()).unwrap()
    }

    /// Writes `data`; errors are ignored since several tests write to a connection the
    /// server may already have closed, and then check what was read.
    pub async fn send(&mut self, data: &str) {
        self.send_bytes(data.as_bytes()).await;
    }

    pub async fn send_bytes(&mut self, data: &[u8]) {
        let _ = self.writer.write_all(data).await;
        let _ = self.writer.flush().await;
    }

    /// Next line without its line ending, or `Closed` at EOF or on a reset.
    pub async fn read(&mut self) -> Read {
        self.read_within(DEADLINE).await.expect("timed out reading")
    }

    /// Like [`Conn::read`], but `None` when nothing arrives within `wait`.
    pub async fn read_within(&mut self, wait: Duration) -> Option<Read> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let mut buf = Vec::new();
            let read = self.reader.read_until(b'\n', &mut buf);
            let line = match tokio::time::timeout_at(deadline, read).await {
                Err(_) => return None,
                Ok(Err(_)) | Ok(Ok(0)) => return Some(Read::Closed),
                Ok(Ok(_)) => String::from_utf8_lossy(&buf)
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            };
            if self.auto_pong && line == "PING" {
                self.send("PONG\r\n").await;
                continue;
            }
            return Some(Read::Line(line));
        }
    }

    /// Next line; panics if the connection closed.
    pub async fn line(&mut self) -> String {
        match self.read().await {
            Read::Line(line) => line,
            Read::Closed => panic!("connection closed while a line was expected"),
        }
    }

    pub async fn expect_line(&mut self, expected: &str) {
        let line = self.line().await;
        assert_eq!(line, expected);
    }

    /// Reads exactly `n` payload bytes plus the trailing CRLF.
    pub async fn read_payload(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n + 2];
        tokio::time::timeout(DEADLINE, self.reader.read_exact(&mut buf))
            .await
            .expect("timed out reading a payload")
            .unwrap();
        assert_eq!(&buf[n..], b"\r\n", "payload not followed by CRLF");
        buf.truncate(n);
        buf
    }

    /// Expects `MSG`/`HMSG` control line `expected` followed by `payload`.
    pub async fn expect_msg(&mut self, expected: &str, payload: &[u8]) {
        self.expect_line(expected).await;
        let got = self.read_payload(payload.len()).await;
        assert_eq!(got, payload, "payload of {expected}");
    }

    /// Expects the server to close the connection without sending anything more.
    pub async fn expect_closed(&mut self) {
        let read = self.read().await;
        assert_eq!(read, Read::Closed, "expected the server to close");
    }

    /// Expects `-ERR '<text>'` and then the server closing the connection.
    pub async fn expect_err_and_close(&mut self, text: &str) {
        self.expect_line(&format!("-ERR '{text}'")).await;
        self.expect_closed().await;
    }

    /// Sends PING and expects PONG next: proves the connection is open and that nothing
    /// else (no MSG, no -ERR) was queued before it.
    pub async fn ping_pong(&mut self) {
        self.send("PING\r\n").await;
        self.expect_line("PONG").await;
    }
}

/// `GET path` over a raw TCP connection; returns the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(DEADLINE, exchange)
        .await
        .expect("HTTP request timed out");
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("no end of headers");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

pub async fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let (status, body) = http_get(addr, path).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}
