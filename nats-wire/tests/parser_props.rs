//! Seeded property tests for the client-protocol parser, a few seconds long so they run
//! on every CI pass; the open-ended search is `scripts/fuzz.sh`, which checks the same
//! oracle (`fuzz/src/parser_check.rs`, included below) under libFuzzer.
//!
//! Two properties: generated valid op sequences come back exactly, however the stream
//! is split; and mutated and random streams never panic the parser and always end in a
//! bounded number of steps. (That a live server fed such streams keeps serving is the
//! broker's `tests/garbage_streams.rs`.) Seeds are fixed so a failure reproduces.

#[path = "../../broker/src/testing/damage.rs"]
mod damage;
#[path = "../../fuzz/src/parser_check.rs"]
mod parser_check;
#[path = "common/streams.rs"]
mod streams;

use damage::replayable;
use nats_wire::{DEFAULT_MAX_CONTROL_LINE, DEFAULT_MAX_PAYLOAD, Limits};
use parser_check::{End, check_stream, cuts_for, feed_in_chunks, limits_from_byte};
use streams::Gen;

/// The server's defaults, so generated traffic is what a real client may send.
const LIMITS: Limits = Limits {
    max_control_line: DEFAULT_MAX_CONTROL_LINE,
    max_payload: DEFAULT_MAX_PAYLOAD,
};

#[test]
fn generated_ops_round_trip_however_the_stream_is_split() {
    let mut g = Gen::new(0x5AD0_0C01);
    for case in 0..1000 {
        let (bytes, ops) = g.stream(12);
        let cuts = g.cuts(bytes.len());
        replayable(case, &bytes, || {
            let whole = check_stream(&bytes, &LIMITS);
            assert_eq!(whole.ops, ops);
            assert_eq!(whole.end, End::NeedMore { pending: 0 });
            assert_eq!(
                feed_in_chunks(&bytes, &cuts, &LIMITS),
                whole,
                "cuts {cuts:?}"
            );
        });
    }
}

#[test]
fn every_single_split_of_a_stream_gives_the_same_ops() {
    let mut g = Gen::new(0x5AD0_0C02);
    for case in 0..20 {
        let (bytes, ops) = g.stream(4);
        replayable(case, &bytes, || {
            for cut in 0..=bytes.len() {
                let run = feed_in_chunks(&bytes, &[cut], &LIMITS);
                assert_eq!(run.ops, ops, "cut at {cut}");
                assert_eq!(run.end, End::NeedMore { pending: 0 });
            }
        });
    }
}

#[test]
fn damaged_and_random_streams_end_cleanly_in_bounded_steps() {
    let mut g = Gen::new(0x5AD0_0C03);
    for case in 0..10_000 {
        let bytes = if case % 3 == 0 {
            g.garbage()
        } else {
            g.mutated()
        };
        // Small limits half the time, so that the limit paths are reached too.
        let limits = if case % 2 == 0 {
            LIMITS
        } else {
            limits_from_byte(g.rng.u8(..))
        };
        replayable(case, &bytes, || {
            // Each step is asserted to use at least one byte, so the run is bounded by
            // the length; the chunked run must agree with it.
            let whole = check_stream(&bytes, &limits);
            assert!(whole.ops.len() <= bytes.len());
            for count in [1, 4] {
                let cuts = cuts_for(&bytes, count);
                assert_eq!(
                    feed_in_chunks(&bytes, &cuts, &limits),
                    whole,
                    "cuts {cuts:?}"
                );
            }
        });
    }
}
