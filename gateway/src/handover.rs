//! What gates share about resumable sessions (docs/gateway.md, "Resume"): the resume
//! token a client is given, the subject a gate takes hand-over requests on, and the
//! marks that cut a session's subjects between the gate that held it and the gate it
//! moves to.

use std::fmt::Write as _;

use bus::{Bus, Reply};
use proto::Message as _;
use proto::code;
use proto::resume::Mark;
use proto::rpc::{RpcResponse, ServerPush, UserCommand, user_command};

use crate::bus_target::Target;

/// The refusal of a resume whose session is not (or no longer) anywhere.
pub(crate) const NO_SUCH_SESSION: &str =
    "no such session: it ended, its window passed, or it was resumed already";

/// The route of a hand-over mark: a push on it is never a push to anyone.
pub(crate) const MARK_ROUTE: &str = "$handover";

/// Bytes of a token's secret: 128 random bits.
const SECRET_LEN: usize = 16;

/// `<gate>.<sid>.<secret in hex>`: where the session is, and the proof of holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Token {
    pub gate: String,
    pub sid: u64,
    pub secret: [u8; SECRET_LEN],
}

impl Token {
    /// A fresh token for session `sid` of `gate`; `None` when the system has no
    /// randomness to give (then the session is not resumable).
    pub(crate) fn new(gate: &str, sid: u64) -> Option<Token> {
        let mut secret = [0; SECRET_LEN];
        getrandom::fill(&mut secret).ok()?;
        Some(Token {
            gate: gate.to_owned(),
            sid,
            secret,
        })
    }

    pub(crate) fn parse(text: &str) -> Option<Token> {
        let mut parts = text.split('.');
        let (gate, sid, hex) = (parts.next()?, parts.next()?, parts.next()?);
        // The gate names a subject the token's holder publishes on: a subject token,
        // never a wildcard.
        if parts.next().is_some()
            || crate::route::check_token(gate).is_err()
            || hex.len() != 2 * SECRET_LEN
        {
            return None;
        }
        let mut secret = [0; SECRET_LEN];
        for (i, byte) in secret.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Token {
            gate: gate.to_owned(),
            sid: sid.parse().ok()?,
            secret,
        })
    }

    /// Whether `secret` is this token's, compared in constant time.
    pub(crate) fn proves(&self, secret: &[u8]) -> bool {
        secret.len() == SECRET_LEN
            && self
                .secret
                .iter()
                .zip(secret)
                .fold(0, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.", self.gate, self.sid)?;
        let mut hex = String::with_capacity(2 * SECRET_LEN);
        for byte in self.secret {
            let _ = write!(hex, "{byte:02x}");
        }
        f.write_str(&hex)
    }
}

/// The subject gate `gate` takes hand-over requests (`TakeOver`) on.
pub(crate) fn subject(prefix: &str, gate: &str) -> String {
    format!("{prefix}.resume.{gate}")
}

/// The pushes a hand-over mark travels in: on a group's subject, and on a player's.
pub(crate) fn mark_pushes(mark: &Mark) -> (Vec<u8>, Vec<u8>) {
    let push = ServerPush {
        route: MARK_ROUTE.into(),
        body: mark.encode_to_vec().into(),
    };
    let command = UserCommand {
        kind: Some(user_command::Kind::Push(push.clone())),
    };
    (push.encode_to_vec(), command.encode_to_vec())
}

/// Passes the worker's answer to request `id` of a session that moved to another gate
/// on to it (`to` is the reply subject prefix there): `answer` as the worker sent it, or
/// `None` for "no responders", which cannot be sent again from here and goes as the
/// 503 the new gate would answer.
pub(crate) fn relay(bus: &Bus<Target>, to: &str, id: u64, answer: Option<&[u8]>) {
    let subject = format!("{to}{id}");
    let unavailable;
    let payload = match answer {
        Some(answer) => answer,
        None => {
            unavailable = RpcResponse {
                code: code::UNAVAILABLE,
                message: "no worker available now".into(),
                ..Default::default()
            }
            .encode_to_vec();
            &unavailable
        }
    };
    if bus.publish_bytes(&subject, Reply::None, payload).is_err() {
        metrics::counter!("gate_replies_dropped_total").increment(1);
    }
}

/// A mark's body, as a hand-over mark push carries it.
pub(crate) fn decode_mark(body: &[u8]) -> Option<Mark> {
    Mark::decode(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_prove_only_their_own_secret() {
        let token = Token::new("g1", 42).unwrap();
        let text = token.to_string();
        assert!(text.starts_with("g1.42."), "{text}");
        let parsed = Token::parse(&text).unwrap();
        assert_eq!(parsed, token);
        assert!(parsed.proves(&token.secret));
        let mut other = token.secret;
        other[15] ^= 1;
        assert!(!parsed.proves(&other));
        assert!(!parsed.proves(&token.secret[..15]));
        assert_ne!(Token::new("g1", 42).unwrap().secret, token.secret);
        let secret = "0".repeat(32);
        for gate in ["*", ">", "a b"] {
            assert_eq!(Token::parse(&format!("{gate}.1.{secret}")), None, "{gate}");
        }
        for bad in [
            "",
            "g1.42",
            "g1.x.00",
            "g1.42.zz",
            ".42.00",
            "g1.42.00.1",
            "g1.42.0g",
        ] {
            assert_eq!(Token::parse(bad), None, "{bad}");
        }
    }
}
