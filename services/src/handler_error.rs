//! A handler's failure and the status code it is answered with.

use proto::code;

/// A handler's failure: answered with [`HandlerError::code`] (500 unless the handler
/// chose otherwise) and the message, which the client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (code {code})")]
pub struct HandlerError {
    code: u32,
    message: String,
}

impl HandlerError {
    /// A handler error: answered 500 with `message`.
    pub fn new(message: impl Into<String>) -> HandlerError {
        HandlerError::with_code(code::HANDLER_ERROR, message)
    }

    /// An error answered with `code` (a 4xx or 5xx from [`proto::code`]).
    pub fn with_code(code: u32, message: impl Into<String>) -> HandlerError {
        HandlerError {
            code,
            message: message.into(),
        }
    }

    /// 400: the request is wrong, and retrying it unchanged will not help.
    pub fn bad_request(message: impl Into<String>) -> HandlerError {
        HandlerError::with_code(code::BAD_REQUEST, message)
    }

    /// 401: the session must log in (bind a uid) first.
    pub fn unauthorized(message: impl Into<String>) -> HandlerError {
        HandlerError::with_code(code::UNAUTHORIZED, message)
    }

    /// The status code the client gets.
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The message the client gets.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<String> for HandlerError {
    fn from(message: String) -> Self {
        HandlerError::new(message)
    }
}

impl From<&str> for HandlerError {
    fn from(message: &str) -> Self {
        HandlerError::new(message)
    }
}

impl From<anyhow::Error> for HandlerError {
    /// `?` on an `anyhow::Result` answers 500 with the error and its causes.
    fn from(error: anyhow::Error) -> Self {
        HandlerError::new(format!("{error:#}"))
    }
}
