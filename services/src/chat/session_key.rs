//! How the chat names a session: by its gate and the gate's session id.

use proto::chat::{Member, SessionRef};

/// A session, as the gates name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey {
    pub gate: String,
    pub sid: u64,
}

impl From<&Member> for SessionKey {
    fn from(m: &Member) -> Self {
        SessionKey {
            gate: m.gate.clone(),
            sid: m.sid,
        }
    }
}

impl From<SessionRef> for SessionKey {
    fn from(s: SessionRef) -> Self {
        SessionKey {
            gate: s.gate,
            sid: s.sid,
        }
    }
}

/// Gate `gate`'s session `sid`, for tests.
#[cfg(test)]
pub(super) fn key(gate: &str, sid: u64) -> SessionKey {
    SessionKey {
        gate: gate.into(),
        sid,
    }
}
