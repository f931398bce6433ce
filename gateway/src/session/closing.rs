//! Why a session's link ends, and the close frame that tells its client: a fixed
//! reason (also the `gate_sessions_closed_total` label), what becomes of the session
//! (closed, detached for a resume, or handed over), and for a JSON packet's unknown
//! field the field's name, which only the close frame carries.

use std::time::Duration;

use futures::SinkExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::{Io, Ws};

/// Why a session's link ends, sent to the client in the close frame, and what becomes
/// of the session.
#[derive(Clone)]
pub(super) struct Closing {
    pub code: CloseCode,
    /// A fixed text: the close frame's reason, and a metric label.
    pub reason: &'static str,
    /// What the close frame says instead of `reason` when the peer needs more (the
    /// field it got wrong); never a label, as a peer wrote part of it.
    pub detail: Option<Box<str>>,
    pub ending: Ending,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// The session ends.
    Closed,
    /// The link was lost without a close: a resumable session waits for its client.
    LinkLost,
    /// The session went on at another gate (or as another session of this one).
    HandedOver,
}

impl Closing {
    pub(super) const fn new(code: CloseCode, reason: &'static str) -> Self {
        Closing {
            code,
            reason,
            detail: None,
            ending: Ending::Closed,
        }
    }

    /// The link is lost (a resumable session outlives it).
    pub(super) const fn lost(code: CloseCode, reason: &'static str) -> Self {
        Closing {
            code,
            reason,
            detail: None,
            ending: Ending::LinkLost,
        }
    }

    pub(super) const fn handed_over() -> Self {
        Closing {
            code: CloseCode::Away,
            reason: RESUMED_ELSEWHERE,
            detail: None,
            ending: Ending::HandedOver,
        }
    }
}

/// Sends the close frame saying why, waiting at most `wait` for the socket to take it
/// (and what was queued before it): a client that stops reading must not hold the
/// session's task, or its socket, for longer.
pub(super) async fn close<S: Io>(ws: &mut Ws<S>, closing: &Closing, wait: Duration) {
    let frame = CloseFrame {
        code: closing.code,
        reason: closing.detail.as_deref().unwrap_or(closing.reason).into(),
    };
    let _ = tokio::time::timeout(wait, ws.send(Message::Close(Some(frame)))).await;
}

/// Closes a session whose client does not take what is sent to it (a resumable one
/// waits for its client to resume: what it missed is kept).
pub(super) const fn too_slow() -> Closing {
    Closing::lost(CloseCode::Policy, TOO_SLOW)
}

/// The close reason of a session closed as too slow.
pub(super) const TOO_SLOW: &str = "too slow";

/// The close reason of a session whose socket refused a write.
pub(super) const WRITE_FAILED: &str = "write failed";

/// Closes a connection whose client sent a frame WebSocket itself refuses, or whose
/// link broke (a reset, a socket error: the link is lost).
pub(super) fn frame_error(e: &tokio_tungstenite::tungstenite::Error) -> Closing {
    use tokio_tungstenite::tungstenite::Error as WsError;
    use tokio_tungstenite::tungstenite::error::ProtocolError;
    match e {
        WsError::Capacity(_) => {
            metrics::counter!("gate_rejected_total", "reason" => "frame_size").increment(1);
            Closing::new(CloseCode::Size, "frame too large")
        }
        WsError::Io(_)
        | WsError::ConnectionClosed
        | WsError::AlreadyClosed
        | WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => {
            Closing::lost(CloseCode::Away, LINK_LOST)
        }
        _ => Closing::new(CloseCode::Protocol, "websocket error"),
    }
}

/// The close reason of a session whose link broke.
pub(super) const LINK_LOST: &str = "link lost";

/// Closes a session whose client sent what its protocol cannot mean.
pub(super) fn invalid(reason: &'static str) -> Closing {
    metrics::counter!("gate_rejected_total", "reason" => "invalid_packet").increment(1);
    Closing::new(CloseCode::Invalid, reason)
}

/// Bytes a close frame's reason holds (RFC 6455: a control frame's 125 bytes, less the
/// code's two); a longer one is cut at a character's boundary.
const MAX_CLOSE_REASON: usize = 123;

/// Closes a session whose JSON packet has a field its kind does not: `invalid packet:
/// unknown field "x"`, so a misspelt field is never taken for an absent one.
pub(super) fn unknown_field(name: &str) -> Closing {
    let mut reason = format!("{INVALID_PACKET}: unknown field {name:?}");
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.truncate(end);
    Closing {
        detail: Some(reason.into()),
        ..invalid(INVALID_PACKET)
    }
}

/// The close reason of a frame that is no packet of the protocol.
pub(super) const INVALID_PACKET: &str = "invalid packet";

/// The close reason of a socket whose session its client took up on another
/// connection (docs/protocol.md, "Kicks and closes").
const RESUMED_ELSEWHERE: &str = "resumed elsewhere";
