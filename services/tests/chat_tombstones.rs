//! What a chat replica keeps for closed sessions: a tombstone each, for a minute and at
//! most `MAX_TOMBSTONES`, and small (issue #34: at 140 bytes, a replica under a thousand
//! closes a second held 8 to 9 MB of them). A test binary of its own: it counts the heap
//! with a counting allocator, and no other test allocates beside it.

use std::alloc::System;
use std::time::Instant;

use proto::chat::{SessionRef, StateChange, state_change};
use services::chat::{MAX_TOMBSTONES, Rooms};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The most a tombstone may take, ring and set together.
const MAX_BYTES_PER_TOMBSTONE: isize = 48;

fn closed(gate: &str, sid: u64) -> StateChange {
    StateChange {
        kind: Some(state_change::Kind::Closed(SessionRef {
            gate: gate.to_owned(),
            sid,
        })),
    }
}

#[test]
fn tombstones_are_small_and_a_churn_at_the_bound_holds_no_more() {
    let now = Instant::now();
    let gates = ["gate-7f3a9c21", "gate-0b44e1d8"];
    let mut rooms = Rooms::default();
    let region = Region::new(ALLOCATOR);
    // What `region` saw allocated and not freed (a reallocation's difference is in both).
    let held = || {
        let change = region.change();
        change.bytes_allocated as isize - change.bytes_deallocated as isize
    };
    let bound = MAX_TOMBSTONES as u64;
    for sid in 0..bound {
        rooms.apply(closed(gates[(sid % 2) as usize], sid), now);
    }
    let full = held();
    assert!(
        full <= MAX_BYTES_PER_TOMBSTONE * MAX_TOMBSTONES as isize,
        "{MAX_TOMBSTONES} tombstones hold {full} bytes, {} each",
        full / MAX_TOMBSTONES as isize
    );
    // Closes go on at the bound, each forgetting the oldest: no more memory held.
    for sid in bound..4 * bound {
        rooms.apply(closed(gates[(sid % 2) as usize], sid), now);
    }
    let churned = held();
    assert_eq!(
        churned,
        full,
        "at the bound, {} more closes took {full} bytes to {churned}",
        3 * bound
    );
}
