//! A global allocator that counts, per thread, the heap a closure holds at its peak:
//! the fuzz targets' [`crate::gate_fixture::Meter`]. (The property tests use
//! `allocation-counter` for the same; the workspace forbids `unsafe`, this crate may.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    /// Bytes this thread holds now, and the most it held since the last reset.
    static HELD: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

fn add(bytes: usize) {
    // `try_with`: the thread's storage may be gone while it exits.
    let _ = HELD.try_with(|held| {
        let (now, peak) = held.get();
        let now = now + bytes;
        held.set((now, peak.max(now)));
    });
}

fn sub(bytes: usize) {
    let _ = HELD.try_with(|held| {
        let (now, peak) = held.get();
        held.set((now.saturating_sub(bytes), peak));
    });
}

// SAFETY: every call is passed to the system allocator unchanged; the counting beside
// it touches only a thread-local cell and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        sub(layout.size());
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size);
        sub(layout.size());
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Runs `f` and returns the most heap this thread held while it ran, above what it held
/// when it started.
pub fn peak(f: &mut dyn FnMut()) -> usize {
    let start = HELD.with(|held| {
        let (now, _) = held.get();
        held.set((now, now));
        now
    });
    f();
    HELD.with(|held| held.get().1 - start)
}
