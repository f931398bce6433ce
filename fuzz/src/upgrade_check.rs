//! The gate's HTTP upgrade head parser as executable checks, shared by the fuzz target
//! `upgrade` and `gateway/tests/decoder_props.rs`.
//!
//! The gate reads a head in chunks, at most one byte past the cap, and answers as soon
//! as `parse_head` stops saying "need more": so the answer must not depend on how the
//! client's bytes were split into reads, a head that is accepted must parse the same
//! without the bytes after it and be incomplete one byte short, what it yields must be
//! well formed, and parsing holds no more heap than a small multiple of the input.

use gateway::fuzzing::{Head, HeadError, parse_head};

use crate::gate_fixture::{Meter, assert_bounded};

/// Caps on the head the first input byte picks from: small ones so that short inputs
/// reach the limit, and the gate's default (8 KiB).
const CAPS: [usize; 4] = [16, 128, 1024, 8 * 1024];

/// The gate's read size while the head is incomplete (`upgrade::READ_CHUNK`).
const READ_CHUNK: usize = 1024;

/// Heap per input byte: the key, origin or path are copied out of the head.
const PER_BYTE: usize = 2;

/// How a connection's head ended.
pub type Outcome = Result<Option<(Head, usize)>, HeadError>;

/// Checks one input: the first byte picks the cap (low bits) and the read size (the
/// rest), the remainder is what the client sends.
pub fn check(input: &[u8], meter: Meter) {
    let Some((&first, stream)) = input.split_first() else {
        return;
    };
    let cap = CAPS[usize::from(first & 3)];
    let chunk = 1 + usize::from(first >> 2);
    let whole = read_head(stream, cap, READ_CHUNK);
    assert_eq!(
        read_head(stream, cap, chunk),
        whole,
        "reads of {chunk} bytes end otherwise than reads of {READ_CHUNK}"
    );
    let seen = &stream[..stream.len().min(cap + 1)];
    let parsed = assert_bounded(meter, "upgrade head", seen.len(), PER_BYTE, || {
        parse_head(seen, cap)
    });
    if let Ok(Some((head, len))) = parsed {
        check_accepted(stream, cap, &head, len);
    }
}

/// Reads `stream` as the gate does: `chunk` bytes at a time, never more than one past
/// the cap buffered, parsing after every read; returns the first answer that is not
/// "need more", or "need more" if the stream ends first.
pub fn read_head(stream: &[u8], cap: usize, chunk: usize) -> Outcome {
    let mut len = 0;
    loop {
        let result = parse_head(&stream[..len], cap);
        if !matches!(result, Ok(None)) || len == stream.len() {
            return result;
        }
        assert!(
            len <= cap,
            "still reading with {len} bytes buffered, cap {cap}"
        );
        let room = (cap + 1 - len).min(chunk);
        len = (len + room).min(stream.len());
    }
}

fn check_accepted(stream: &[u8], cap: usize, head: &Head, len: usize) {
    assert!(
        len <= cap,
        "a {len}-byte head accepted under a cap of {cap}"
    );
    assert!(len <= stream.len());
    let exact = parse_head(&stream[..len], cap);
    assert_eq!(
        exact.as_ref().map(|o| o.as_ref().map(|(h, n)| (h, *n))),
        Ok(Some((head, len)))
    );
    assert_eq!(
        parse_head(&stream[..len - 1], cap),
        Ok(None),
        "complete one byte short"
    );
    match head {
        Head::WebSocket { key, origin } => {
            assert!(!key.is_empty(), "an empty key");
            assert_eq!(key.trim(), key, "a key with blanks around it");
            if let Some(origin) = origin {
                assert_eq!(origin.trim(), origin, "an origin with blanks around it");
            }
        }
        Head::Page { path } => assert!(!path.is_empty(), "an empty path"),
    }
}
