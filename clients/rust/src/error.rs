//! The SDK's error: one type with an [`ErrorKind`] that callers and tests match on,
//! and a human-readable detail (which includes the underlying cause, so a plain `{e}`
//! in a log line says everything).

use std::fmt;

/// What went wrong, without the detail: match on this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The WebSocket could not be opened, or broke before the handshake finished.
    Connect,
    /// The gate answered the handshake with a non-200 code (401: token refused).
    Handshake { code: u32 },
    /// No answer within the request timeout (client side; the gate's own timeout
    /// arrives as a `Response` with code 408).
    Timeout,
    /// The connection is gone: closed by the client, kicked by the gate (the reason is
    /// the kick's), or lost while the request was in flight.
    Closed { reason: String },
    /// The gate sent something the protocol does not allow.
    Protocol,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Connect => f.write_str("connect failed"),
            ErrorKind::Handshake { code } => write!(f, "handshake refused with code {code}"),
            ErrorKind::Timeout => f.write_str("timed out"),
            ErrorKind::Closed { reason } => write!(f, "connection closed ({reason})"),
            ErrorKind::Protocol => f.write_str("protocol error"),
        }
    }
}

/// An error from the client SDK; [`SdkError::kind`] says which.
#[derive(Debug, thiserror::Error)]
#[error("{kind}{sep}{detail}", sep = if .detail.is_empty() { "" } else { ": " })]
pub struct SdkError {
    kind: ErrorKind,
    detail: String,
}

impl SdkError {
    fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        SdkError {
            kind,
            detail: detail.into(),
        }
    }

    pub(crate) fn connect(detail: impl Into<String>) -> Self {
        SdkError::new(ErrorKind::Connect, detail)
    }

    pub(crate) fn connect_io(context: &str, cause: impl fmt::Display) -> Self {
        SdkError::connect(format!("{context}: {cause}"))
    }

    pub(crate) fn handshake(code: u32, message: String) -> Self {
        SdkError::new(ErrorKind::Handshake { code }, message)
    }

    /// Allocation-free: a timeout is the one error an overloaded load test sees a lot.
    pub(crate) fn timeout() -> Self {
        SdkError::new(ErrorKind::Timeout, String::new())
    }

    pub(crate) fn closed(reason: impl Into<String>) -> Self {
        SdkError::new(
            ErrorKind::Closed {
                reason: reason.into(),
            },
            String::new(),
        )
    }

    pub(crate) fn protocol(detail: impl Into<String>) -> Self {
        SdkError::new(ErrorKind::Protocol, detail)
    }

    /// Which kind of error this is.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The detail: the handshake's message, the I/O error, what was malformed.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.kind, ErrorKind::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_kind_and_the_detail() {
        assert_eq!(SdkError::timeout().to_string(), "timed out");
        assert_eq!(
            SdkError::handshake(401, "bad token".into()).to_string(),
            "handshake refused with code 401: bad token"
        );
        assert_eq!(
            SdkError::closed("bye").to_string(),
            "connection closed (bye)"
        );
        let e = SdkError::closed("bye");
        assert!(matches!(e.kind(), ErrorKind::Closed { reason } if reason == "bye"));
    }
}
