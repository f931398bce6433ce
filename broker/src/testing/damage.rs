//! Seeded damage for the decoders' property tests (the NATS parser, the gate's
//! codecs): valid input edited a few bytes at a time, so that most cases stay near
//! the grammar, and a failing case reported with its input for the fuzz seeds.

use std::panic::{AssertUnwindSafe, catch_unwind};

use fastrand::Rng;

/// Damages `bytes` with one to four edits: a flipped bit, an inserted byte (from
/// `byte`), a removed byte, a cut, a repeated run, or one of `fragments` spliced in.
pub fn damage(
    rng: &mut Rng,
    bytes: &mut Vec<u8>,
    fragments: &[&[u8]],
    mut byte: impl FnMut(&mut Rng) -> u8,
) {
    for _ in 0..rng.usize(1..=4) {
        let at = rng.usize(..=bytes.len());
        match rng.u8(..6) {
            0 if at < bytes.len() => bytes[at] ^= 1 << rng.u8(..8),
            1 => bytes.insert(at, byte(rng)),
            2 if at < bytes.len() => {
                bytes.remove(at);
            }
            3 => bytes.truncate(at),
            4 => {
                let end = rng.usize(at..=bytes.len().min(at + 16));
                let copy = bytes[at..end].to_vec();
                bytes.splice(at..at, copy);
            }
            _ => {
                let fragment = fragments[rng.usize(..fragments.len())];
                bytes.splice(at..at, fragment.iter().copied());
            }
        }
    }
}

/// Runs `check` on `input`, and if it panics, fails naming the case and the input so
/// the failure can be replayed (and added to the fuzz seeds).
pub fn replayable(case: usize, input: &[u8], check: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(check)).is_err() {
        panic!("case {case} failed on input b\"{}\"", input.escape_ascii());
    }
}
