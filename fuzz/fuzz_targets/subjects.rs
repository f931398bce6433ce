//! Fuzz target `subjects`: subject validation against a restatement of the rules, and
//! the subscription trie, index and match cache against a brute-force list.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shaddock_fuzz::subjects_check::check(data));
