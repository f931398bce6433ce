//! Fuzz target `client_json`: the bytes are one text frame of a JSON session whose gate
//! knows the echo, chat and mirror services' types.

#![no_main]

use std::cell::RefCell;

use gateway::fuzzing::{Message, Session};
use libfuzzer_sys::fuzz_target;
use shaddock_fuzz::{gate_fixture, heap, json_check};

thread_local! {
    static SESSION: RefCell<Session> =
        RefCell::new(gate_fixture::typed_session(&Message::text("")));
}

fuzz_target!(|data: &[u8]| {
    SESSION.with_borrow_mut(|session| json_check::check(data, session, heap::peak));
});
