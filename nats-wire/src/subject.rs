//! Subject rules: tokens separated by `.`, none empty, no whitespace; `*` matches one
//! token and `>` one or more, both only as whole tokens, `>` only last.
//!
//! [`is_valid_token`] is Shaddock's stricter rule for the tokens it builds subjects
//! from (routes, gate ids, groups, uids, prefixes): one validator for every such name.

/// Whether `subject` may be subscribed to (wildcards allowed).
pub fn is_valid_subscribe(subject: &[u8]) -> bool {
    valid(subject, true)
}

/// Whether `subject` may be published to (no wildcards).
pub fn is_valid_publish(subject: &[u8]) -> bool {
    valid(subject, false)
}

/// Whether `token` may be put into a subject as one token of ours (a route's service or
/// method, a gate id, a group, a uid, a prefix part): non-empty, lowercase `[a-z0-9_-]`
/// only. Stricter than NATS on purpose: no wildcard, dot or space in outside input can
/// change what a subject means, and the name is fit for a metric label too. Length
/// bounds are each caller's.
pub fn is_valid_token(token: &str) -> bool {
    !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn valid(subject: &[u8], wildcards: bool) -> bool {
    if subject.is_empty() {
        return false;
    }
    let mut tokens = subject.split(|&b| b == b'.').peekable();
    while let Some(token) = tokens.next() {
        if token.is_empty() || token.iter().any(|b| b.is_ascii_whitespace()) {
            return false;
        }
        match token {
            b"*" if !wildcards => return false,
            b">" if !wildcards || tokens.peek().is_some() => return false,
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribe_subjects() {
        for ok in [
            "foo", "foo.bar", "foo.*", "*", ">", "foo.>", "*.*.>", "foo*.bar", "a.b>",
        ] {
            assert!(is_valid_subscribe(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            ".",
            "foo.",
            ".foo",
            "foo..bar",
            ">.foo",
            "foo.>.bar",
            "fo o",
            "a\tb",
        ] {
            assert!(!is_valid_subscribe(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn tokens_of_ours() {
        for ok in ["chat", "send_msg", "echo-2", "x9", "0"] {
            assert!(is_valid_token(ok), "{ok}");
        }
        for bad in ["", "a.b", "*", ">", "a b", "Echo", "\u{e9}", "a\tb"] {
            assert!(!is_valid_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn publish_subjects() {
        assert!(is_valid_publish(b"foo.bar"));
        assert!(is_valid_publish(b"foo*.b>"));
        assert!(!is_valid_publish(b"foo.*"));
        assert!(!is_valid_publish(b">"));
        assert!(!is_valid_publish(b"foo..bar"));
    }
}
