//! Fuzz target `parser`: the first byte picks the limits, the rest is a client's byte
//! stream. It is parsed as a connection parses it, checked step by step, and parsed
//! again split into chunks, which must give the same ops and the same end.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shaddock_fuzz::parser_check::{check_stream, cuts_for, feed_in_chunks, limits_from_byte};

fuzz_target!(|data: &[u8]| {
    let Some((&first, stream)) = data.split_first() else {
        return;
    };
    let limits = limits_from_byte(first);
    let whole = check_stream(stream, &limits);
    for count in [1, 3] {
        let cuts = cuts_for(stream, count);
        assert_eq!(
            feed_in_chunks(stream, &cuts, &limits),
            whole,
            "split at {cuts:?}"
        );
    }
});
