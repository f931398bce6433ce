//! Subject rules: tokens separated by `.`, none empty, no whitespace; `*` matches one
//! token and `>` one or more, both only as whole tokens, `>` only last.

/// Whether `subject` may be subscribed to (wildcards allowed).
pub fn is_valid_subscribe(subject: &[u8]) -> bool {
    valid(subject, true)
}

/// Whether `subject` may be published to (no wildcards).
pub fn is_valid_publish(subject: &[u8]) -> bool {
    valid(subject, false)
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
    fn publish_subjects() {
        assert!(is_valid_publish(b"foo.bar"));
        assert!(is_valid_publish(b"foo*.b>"));
        assert!(!is_valid_publish(b"foo.*"));
        assert!(!is_valid_publish(b">"));
        assert!(!is_valid_publish(b"foo..bar"));
    }
}
