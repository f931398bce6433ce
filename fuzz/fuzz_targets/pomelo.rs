//! Fuzz target `pomelo`: the first byte picks the handshake state and the read size,
//! the rest is one binary frame of pomelo packages to a fresh pomelo session.

#![no_main]

use std::cell::RefCell;

use gateway::fuzzing::{Message, Session};
use libfuzzer_sys::fuzz_target;
use shaddock_fuzz::{gate_fixture, heap, pomelo_check};

thread_local! {
    static SESSION: RefCell<Session> =
        RefCell::new(gate_fixture::typed_session(&Message::binary(vec![1])));
}

fuzz_target!(|data: &[u8]| {
    SESSION.with_borrow_mut(|session| pomelo_check::check(data, session, heap::peak));
});
