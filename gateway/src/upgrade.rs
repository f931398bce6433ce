//! The HTTP side of a new connection: reads the request head within a deadline and a
//! size cap, upgrades a WebSocket request (RFC 6455 §4.2), hands a plain GET to
//! [`crate::web`], and answers anything else with an HTTP error.
//!
//! Our own rather than tungstenite's `accept`, which has neither a deadline of its own
//! nor a cap we choose on the head: a client trickling its request a byte a second
//! (slowloris) or sending an endless header would hold a descriptor for as long as it
//! liked. [`parse_head`] is pure and returns `Ok(None)` while the head is incomplete.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use crate::lean_io::LeanIo;

/// Most header lines a request head may have; a browser's upgrade sends about 15.
/// More is answered 431 like a head that is too long.
pub const MAX_HEADERS: usize = 32;

/// Bytes read from the socket at a time while the head is incomplete.
const READ_CHUNK: usize = 1024;

/// What a complete request head asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// A WebSocket upgrade with this `Sec-WebSocket-Key`, from a page of `origin` when a
    /// browser sent it.
    WebSocket { key: String, origin: Option<String> },
    /// A plain GET of this path, for [`crate::web`].
    Page { path: String },
}

/// Why a head is refused, with the status it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// 431: longer than the cap, or too many header lines.
    TooLarge,
    /// 400: not HTTP, not a GET, or a WebSocket upgrade missing one of its headers.
    BadRequest,
    /// 403: a browser page from an origin the gate does not allow.
    Origin,
}

impl HeadError {
    fn response(self) -> &'static [u8] {
        match self {
            HeadError::TooLarge => {
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            }
            HeadError::BadRequest => {
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            }
            HeadError::Origin => {
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            }
        }
    }

    fn label(self) -> &'static str {
        match self {
            HeadError::TooLarge => "too_large",
            HeadError::BadRequest => "bad_request",
            HeadError::Origin => "origin",
        }
    }
}

/// Parses the request head at the start of `buf`: `Ok(None)` while it is incomplete
/// and still within `max_bytes`; otherwise the request and the head's length (what
/// follows is the client's first WebSocket bytes).
///
/// Only the first `max_bytes` are read: past them the head is too large whatever they
/// hold, so the answer cannot depend on whether the read that crossed the cap brought
/// one byte more or a thousand (it once did: 431 or 400, by how the client's bytes
/// were split into segments).
pub fn parse_head(buf: &[u8], max_bytes: usize) -> Result<Option<(Request, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let within = &buf[..buf.len().min(max_bytes)];
    let len = match req.parse(within) {
        Ok(httparse::Status::Complete(len)) => len,
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) if buf.len() >= max_bytes => {
            return Err(HeadError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(HeadError::BadRequest),
    };
    if req.method != Some("GET") {
        return Err(HeadError::BadRequest);
    }
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::trim)
    };
    let Some(upgrade) = header("upgrade") else {
        let path = req.path.unwrap_or("/").to_owned();
        return Ok(Some((Request::Page { path }, len)));
    };
    // `Connection` is a list (`keep-alive, Upgrade` from Firefox).
    let connection_upgrade = header("connection").is_some_and(|v| {
        v.split(',')
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
    });
    let key = header("sec-websocket-key").filter(|k| !k.is_empty());
    match key {
        Some(key)
            if upgrade.eq_ignore_ascii_case("websocket")
                && connection_upgrade
                && header("sec-websocket-version") == Some("13") =>
        {
            Ok(Some((
                Request::WebSocket {
                    key: key.to_owned(),
                    origin: header("origin").map(str::to_owned),
                },
                len,
            )))
        }
        _ => Err(HeadError::BadRequest),
    }
}

/// The `101 Switching Protocols` answer to a WebSocket request with `key`.
pub fn switching_protocols(key: &str) -> String {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        derive_accept_key(key.as_bytes())
    )
}

/// The answer to a plain GET: the page [`crate::web`] has for `path` (when the gate
/// serves pages), or 404.
fn page(path: &str, pages: bool) -> Vec<u8> {
    // The query string does not pick the page.
    let path = path.split('?').next().unwrap_or(path);
    match crate::web::respond(path).filter(|_| pages) {
        Some((content_type, body)) => {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            out.extend_from_slice(body);
            out
        }
        None => {
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
        }
    }
}

/// What [`accept`] allows; see the gate's config for the defaults and reasons.
#[derive(Debug, Clone)]
pub struct UpgradePolicy {
    pub timeout: Duration,
    pub max_bytes: usize,
    /// Serve [`crate::web`]'s pages to plain GETs.
    pub pages: bool,
    pub origins: Origins,
}

/// Which browser pages may open a WebSocket: a browser names the page's origin in the
/// upgrade's `Origin` header, so a page on another site cannot use a player's browser
/// to reach the gate. Clients that are not browsers send none and are not affected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origins {
    Any,
    /// Exact origins (`https://game.example`), compared without regard to case.
    Only(Vec<String>),
}

impl Origins {
    /// `--allowed-origins`: empty or containing `*` allows any.
    pub fn from_list(list: &[String]) -> Origins {
        if list.is_empty() || list.iter().any(|o| o == "*") {
            Origins::Any
        } else {
            Origins::Only(
                list.iter()
                    .map(|o| o.trim_end_matches('/').to_owned())
                    .collect(),
            )
        }
    }

    fn allows(&self, origin: Option<&str>) -> bool {
        match (self, origin) {
            (Origins::Any, _) | (_, None) => true,
            (Origins::Only(list), Some(origin)) => {
                list.iter().any(|o| o.eq_ignore_ascii_case(origin))
            }
        }
    }
}

/// Why a connection did not become a WebSocket.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("no complete upgrade request within the deadline")]
    Timeout,
    #[error("refused: {0:?}")]
    Refused(HeadError),
    #[error("a plain HTTP request, answered")]
    Page,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl UpgradeError {
    /// The `reason` label of `gate_upgrade_failed_total`.
    pub fn label(&self) -> &'static str {
        match self {
            UpgradeError::Timeout => "timeout",
            UpgradeError::Refused(e) => e.label(),
            UpgradeError::Page => "http",
            UpgradeError::Io(_) => "io",
        }
    }
}

/// Reads the upgrade request and answers it, all within `limits.timeout`; returns the
/// WebSocket (reading through a [`LeanIo`]), with any bytes the client sent after its
/// head kept for it.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    policy: &UpgradePolicy,
    config: WebSocketConfig,
) -> Result<WebSocketStream<LeanIo<S>>, UpgradeError> {
    let mut stream = stream;
    let handshake = timeout(policy.timeout, answer(&mut stream, policy)).await;
    let leftover = handshake.map_err(|_| UpgradeError::Timeout)??;
    let stream = LeanIo::new(stream);
    Ok(WebSocketStream::from_partially_read(stream, leftover, Role::Server, Some(config)).await)
}

/// Reads the head and writes the answer; returns what followed the head.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    policy: &UpgradePolicy,
) -> Result<Vec<u8>, UpgradeError> {
    let max_bytes = policy.max_bytes;
    let mut buf = Vec::with_capacity(READ_CHUNK.min(max_bytes));
    let mut chunk = [0u8; READ_CHUNK];
    let (request, len) = loop {
        match parse_head(&buf, max_bytes) {
            Ok(Some(parsed)) => break parsed,
            Ok(None) => {}
            Err(refused) => {
                stream.write_all(refused.response()).await?;
                return Err(UpgradeError::Refused(refused));
            }
        }
        // Never more than the cap buffered: one byte past it proves the head too long.
        let room = (max_bytes + 1 - buf.len()).min(READ_CHUNK);
        let n = stream.read(&mut chunk[..room]).await?;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    match request {
        Request::WebSocket { origin, .. } if !policy.origins.allows(origin.as_deref()) => {
            stream.write_all(HeadError::Origin.response()).await?;
            Err(UpgradeError::Refused(HeadError::Origin))
        }
        Request::WebSocket { key, .. } => {
            stream
                .write_all(switching_protocols(&key).as_bytes())
                .await?;
            buf.drain(..len);
            Ok(buf)
        }
        Request::Page { path } => {
            stream.write_all(&page(&path, policy.pages)).await?;
            Err(UpgradeError::Page)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 8 * 1024;

    const UPGRADE: &str = "GET /ws HTTP/1.1\r\nHost: gate\r\nUpgrade: websocket\r\n\
        Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
        Sec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn an_upgrade_is_incomplete_until_its_last_byte() {
        let bytes = UPGRADE.as_bytes();
        for end in 0..bytes.len() {
            assert_eq!(parse_head(&bytes[..end], MAX), Ok(None), "at {end}");
        }
        let (request, len) = parse_head(bytes, MAX).unwrap().unwrap();
        assert_eq!(len, bytes.len());
        assert_eq!(
            request,
            Request::WebSocket {
                key: "dGhlIHNhbXBsZSBub25jZQ==".into(),
                origin: None,
            }
        );
        let from_page = UPGRADE.replace(
            "Host: gate\r\n",
            "Host: gate\r\nOrigin: https://game.example\r\n",
        );
        let (request, _) = parse_head(from_page.as_bytes(), MAX).unwrap().unwrap();
        assert!(
            matches!(request, Request::WebSocket { origin: Some(o), .. } if o == "https://game.example")
        );
    }

    #[test]
    fn origins_are_allowed_exactly_and_absent_ones_always() {
        let only = Origins::from_list(&["https://game.example/".into()]);
        assert!(only.allows(Some("https://game.example")));
        assert!(only.allows(Some("HTTPS://Game.Example")));
        assert!(only.allows(None));
        assert!(!only.allows(Some("https://evil.example")));
        assert!(!only.allows(Some("https://game.example.evil")));
        assert_eq!(Origins::from_list(&[]), Origins::Any);
        assert_eq!(
            Origins::from_list(&["https://a".into(), "*".into()]),
            Origins::Any
        );
        assert!(Origins::Any.allows(Some("https://evil.example")));
    }

    #[test]
    fn bytes_after_the_head_are_not_part_of_it() {
        let mut bytes = UPGRADE.as_bytes().to_vec();
        bytes.extend_from_slice(&[0x82, 0x00]);
        let (_, len) = parse_head(&bytes, MAX).unwrap().unwrap();
        assert_eq!(&bytes[len..], &[0x82, 0x00]);
    }

    #[test]
    fn the_accept_key_is_rfc_6455s() {
        // The example of RFC 6455 §1.3.
        assert!(
            switching_protocols("dGhlIHNhbXBsZSBub25jZQ==")
                .contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n")
        );
    }

    #[test]
    fn a_head_past_the_cap_is_too_large() {
        let long = format!("GET / HTTP/1.1\r\nX-Pad: {}\r\n", "a".repeat(MAX));
        assert_eq!(parse_head(long.as_bytes(), MAX), Err(HeadError::TooLarge));
        // Complete but over the cap counts the same.
        let complete = format!("{long}\r\n");
        assert_eq!(
            parse_head(complete.as_bytes(), MAX),
            Err(HeadError::TooLarge)
        );
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: 1\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parse_head(many.as_bytes(), MAX), Err(HeadError::TooLarge));
    }

    #[test]
    fn bytes_past_the_cap_never_change_the_answer() {
        // Found by the `upgrade` fuzz target: a head still incomplete at the cap, whose
        // next byte is not HTTP, was 431 when a read ended at the cap and 400 when one
        // ran past it.
        let line = "GET / HTTP/1.1\r\n";
        let pad = format!("X-Pad: {}\r\n", "a".repeat(128 - line.len() - 9));
        let head = format!("{line}{pad}(bad: 1\r\n\r\n");
        let cap = line.len() + pad.len();
        assert_eq!(cap, 128);
        for end in cap..=head.len() {
            assert_eq!(
                parse_head(&head.as_bytes()[..end], cap),
                Err(HeadError::TooLarge),
                "with {end} bytes read"
            );
        }
        // Under a larger cap the same bytes are what they are: not HTTP.
        assert_eq!(parse_head(head.as_bytes(), MAX), Err(HeadError::BadRequest));
    }

    #[test]
    fn a_plain_get_is_a_page() {
        let head = b"GET /index.html?x=1 HTTP/1.1\r\nHost: gate\r\n\r\n";
        assert_eq!(
            parse_head(head, MAX),
            Ok(Some((
                Request::Page {
                    path: "/index.html?x=1".into()
                },
                head.len()
            )))
        );
    }

    #[test]
    fn malformed_or_partial_upgrades_are_bad_requests() {
        let cases = [
            "POST / HTTP/1.1\r\n\r\n".to_owned(),
            "NOT HTTP AT ALL\r\n\r\n".to_owned(),
            UPGRADE.replace("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 8"),
            UPGRADE.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", ""),
            UPGRADE.replace("keep-alive, Upgrade", "keep-alive"),
            UPGRADE.replace("Upgrade: websocket", "Upgrade: h2c"),
        ];
        for head in cases {
            assert_eq!(
                parse_head(head.as_bytes(), MAX),
                Err(HeadError::BadRequest),
                "{head:?}"
            );
        }
    }

    #[test]
    fn a_page_without_content_is_404() {
        assert!(page("/nothing-here", true).starts_with(b"HTTP/1.1 404 Not Found\r\n"));
        assert!(page("/", false).starts_with(b"HTTP/1.1 404 Not Found\r\n"));
        let index = page("/?gate=x", true);
        assert!(index.starts_with(b"HTTP/1.1 200 OK\r\nContent-Type: text/html"));
    }
}
