//! Fuzz target `client_protobuf`: the bytes are one binary frame of a protobuf session.

#![no_main]

use std::cell::RefCell;

use gateway::fuzzing::{Message, Session};
use libfuzzer_sys::fuzz_target;
use shaddock_fuzz::{gate_fixture, heap, protobuf_check};

thread_local! {
    static SESSION: RefCell<Session> =
        RefCell::new(gate_fixture::typed_session(&Message::binary(Vec::new())));
}

fuzz_target!(|data: &[u8]| {
    SESSION.with_borrow_mut(|session| protobuf_check::check(data, session, heap::peak));
});
