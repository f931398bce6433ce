//! The one rule for names that become NATS subject tokens: service, method, group and
//! user names, and each token of a prefix or event subject. It is the rule the gate
//! applies to a route's tokens, so a name a worker accepts is one the gate routes, and a
//! name taken from a player's input can never widen a subject (`*`, `>`) or address
//! another one (`.`).

/// Longest token. Names become subject tokens and metric labels; the gate bounds a
/// route's tokens the same way.
pub const MAX_NAME_LEN: usize = 64;

/// Whether `token` may be one subject token: 1 to [`MAX_NAME_LEN`] bytes of
/// `[a-z0-9_-]` (the rule is the NATS wire crate's, shared with the gate).
pub fn is_valid_token(token: &str) -> bool {
    token.len() <= MAX_NAME_LEN && nats_wire::subject::is_valid_token(token)
}

/// Whether `subject` is one or more valid tokens joined by dots (`shaddock`,
/// `evt.session.closed`).
pub fn is_valid_subject(subject: &str) -> bool {
    subject.split('.').all(is_valid_token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_lowercase_words_of_bounded_length() {
        assert!(is_valid_token("chat"));
        assert!(is_valid_token("get_room-2"));
        assert!(is_valid_token(&"x".repeat(MAX_NAME_LEN)));
        for bad in [
            "",
            "Chat",
            "a.b",
            "*",
            ">",
            "a b",
            "é",
            &"x".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(!is_valid_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn subjects_are_dotted_tokens() {
        assert!(is_valid_subject("shaddock"));
        assert!(is_valid_subject("evt.session.closed"));
        for bad in ["", "a..b", "a.>", "a.*", ".a", "a.", "A.b"] {
            assert!(!is_valid_subject(bad), "{bad:?}");
        }
    }
}
