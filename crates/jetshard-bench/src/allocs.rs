//! A counting global allocator: the bench binaries install [`Counting`] so that a pass can
//! report the client's heap allocations and bytes per command (issue 22's allocation diet).
//! It wraps the system allocator (glibc's, so `cpu::heap_in_use_bytes` still reads it) and adds
//! two relaxed atomic increments per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
/// Allocations by size: under 64 B, 256 B, 1 KiB, 4 KiB, 16 KiB, and larger.
static SIZES: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
/// Allocations (and reallocations) of more than [`SMALL_BIN_LIMIT`] bytes.
static LARGE: AtomicU64 = AtomicU64::new(0);
/// Reallocations.
static REALLOCS: AtomicU64 = AtomicU64::new(0);

/// The largest request glibc serves from its small bins on x86-64 (a chunk under 1,024 bytes):
/// a larger one, when its tcache is empty, first merges every free fast-bin chunk
/// (`malloc_consolidate`), a cost per request that grows with the heap's churn (issue 22).
pub const SMALL_BIN_LIMIT: usize = 1000;

fn count(size: usize) {
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(size as u64, Ordering::Relaxed);
    if size > SMALL_BIN_LIMIT {
        LARGE.fetch_add(1, Ordering::Relaxed);
    }
    let bucket = match size {
        0..64 => 0,
        64..256 => 1,
        256..1024 => 2,
        1024..4096 => 3,
        4096..16384 => 4,
        _ => 5,
    };
    SIZES[bucket].fetch_add(1, Ordering::Relaxed);
}

/// The system allocator, counting allocations (reallocations count as one) and bytes asked for.
pub struct Counting;

// SAFETY: every call is forwarded to `System` unchanged; the counters have no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        REALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations and bytes allocated so far by this process (zero unless [`Counting`] is the
/// global allocator).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Allocated {
    /// Allocations (and reallocations).
    pub allocs: u64,
    /// Bytes asked for.
    pub bytes: u64,
    /// Allocations by size: under 64 B, 256 B, 1 KiB, 4 KiB, 16 KiB, and larger.
    pub sizes: [u64; 6],
    /// Allocations (and reallocations) of more than [`SMALL_BIN_LIMIT`] bytes.
    pub large: u64,
    /// Reallocations (also counted in `allocs`).
    pub reallocs: u64,
}

/// The counters now.
pub fn now() -> Allocated {
    Allocated {
        allocs: ALLOCS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
        sizes: std::array::from_fn(|i| SIZES[i].load(Ordering::Relaxed)),
        large: LARGE.load(Ordering::Relaxed),
        reallocs: REALLOCS.load(Ordering::Relaxed),
    }
}

impl Allocated {
    /// What was allocated since `earlier`.
    pub fn since(self, earlier: Allocated) -> Allocated {
        Allocated {
            allocs: self.allocs.saturating_sub(earlier.allocs),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            sizes: std::array::from_fn(|i| self.sizes[i].saturating_sub(earlier.sizes[i])),
            large: self.large.saturating_sub(earlier.large),
            reallocs: self.reallocs.saturating_sub(earlier.reallocs),
        }
    }
}
