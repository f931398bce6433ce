//! Fuzz target `upgrade`: the first byte picks the head cap and the read size, the rest
//! is what a client sends before its WebSocket frames.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shaddock_fuzz::{heap, upgrade_check};

fuzz_target!(|data: &[u8]| upgrade_check::check(data, heap::peak));
