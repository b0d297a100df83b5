//! The unit tests' allocator: the system's, counting the heap bytes each thread holds, so that
//! a test can measure what a structure costs (`held_by_this_thread` before and after). Counts
//! the bytes asked for, not the allocator's rounding. Also the size of a future, for the tests
//! that keep a per-command future a small allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
}

fn count(bytes: isize) {
    // During a thread's teardown the counter may be gone: nothing to count then.
    let _ = HELD.try_with(|held| held.set(held.get() + bytes));
}

/// Heap bytes allocated and not yet freed by this thread (frees of another thread's
/// allocations count against the freeing thread).
pub(crate) fn held_by_this_thread() -> isize {
    HELD.with(Cell::get)
}

/// The largest request glibc serves from its small bins. A larger one first merges every free
/// fast-bin chunk (`malloc_consolidate`), which cost 13% of the client's CPU when every command's
/// future was larger: a future boxed per command must stay at or below it.
pub(crate) const SMALL_ALLOCATION: usize = 1000;

/// The size of the future `make` would return; `make` is never called.
pub(crate) fn future_size<F: std::future::Future>(_make: impl FnOnce() -> F) -> usize {
    std::mem::size_of::<F>()
}

struct Counting;

// SAFETY: every call is passed on to `System` unchanged; only a thread-local counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;
