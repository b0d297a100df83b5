//! A counting global allocator: the bench binaries install [`Counting`] so that a pass can
//! report the client's heap allocations and bytes per command (the allocation budget).
//! It wraps the system allocator (glibc's, so `cpu::heap_in_use_bytes` still reads it) and adds
//! two relaxed atomic increments per allocation. Built with the feature `cross-thread-frees`, it
//! also counts the frees made on another thread than the allocation's (a tag before each
//! allocation: a build for that count only, since the tag changes what glibc is asked for).

#[cfg(not(feature = "cross-thread-frees"))]
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
/// Frees (with the `cross-thread-frees` feature only).
static FREES: AtomicU64 = AtomicU64::new(0);
/// Of them, frees on another thread than the one that allocated (or last reallocated) the
/// memory (with the `cross-thread-frees` feature only).
static CROSS_FREES: AtomicU64 = AtomicU64::new(0);

/// The largest request glibc serves from its small bins on x86-64 (a chunk under 1,024 bytes):
/// a larger one, when its tcache is empty, first merges every free fast-bin chunk
/// (`malloc_consolidate`), a cost per request that grows with the heap's churn.
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

#[cfg(not(feature = "cross-thread-frees"))]
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

#[cfg(feature = "cross-thread-frees")]
mod tagged {
    //! Each allocation is preceded by a tag naming the thread that made it (at least 16 bytes,
    //! the allocation's alignment if larger), read back when it is freed.

    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::{CROSS_FREES, Counting, FREES, REALLOCS, count};

    static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

    thread_local! {
        static THREAD: Cell<u64> = const { Cell::new(0) };
    }

    fn this_thread() -> u64 {
        THREAD
            .try_with(|tag| {
                if tag.get() == 0 {
                    tag.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
                }
                tag.get()
            })
            .unwrap_or(u64::MAX)
    }

    fn header(layout: Layout) -> usize {
        layout.align().max(16)
    }

    fn outer(layout: Layout) -> Layout {
        let h = header(layout);
        // The caller's layout is valid, so its size plus a header no larger than its alignment
        // (or 16) fits too, short of a size within 16 bytes of `isize::MAX`.
        Layout::from_size_align(layout.size() + h, h).unwrap_or(layout)
    }

    // SAFETY: each allocation is `System`'s with a header before it; the pointer handed out is
    // aligned to the caller's alignment (the header is a multiple of it) and has `size` bytes.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size());
            // SAFETY: `outer` is a valid layout of non-zero size.
            let base = unsafe { System.alloc(outer(layout)) };
            if base.is_null() {
                return base;
            }
            // SAFETY: the header is at least 16 bytes, aligned to at least 16.
            unsafe {
                base.cast::<u64>().write(this_thread());
                base.add(header(layout))
            }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from `alloc` or `realloc` above with this layout.
            unsafe {
                let base = ptr.sub(header(layout));
                FREES.fetch_add(1, Ordering::Relaxed);
                if base.cast::<u64>().read() != this_thread() {
                    CROSS_FREES.fetch_add(1, Ordering::Relaxed);
                }
                System.dealloc(base, outer(layout));
            }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size);
            REALLOCS.fetch_add(1, Ordering::Relaxed);
            let h = header(layout);
            // SAFETY: as in `dealloc`; the header moves with the memory.
            unsafe {
                let base = System.realloc(ptr.sub(h), outer(layout), new_size + h);
                if base.is_null() {
                    return base;
                }
                base.cast::<u64>().write(this_thread());
                base.add(h)
            }
        }
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
    /// Frees (with the `cross-thread-frees` feature; 0 otherwise).
    pub frees: u64,
    /// Of them, on another thread than the allocation's (with the feature; 0 otherwise).
    pub cross_frees: u64,
}

/// The counters now.
pub fn now() -> Allocated {
    Allocated {
        allocs: ALLOCS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
        sizes: std::array::from_fn(|i| SIZES[i].load(Ordering::Relaxed)),
        large: LARGE.load(Ordering::Relaxed),
        reallocs: REALLOCS.load(Ordering::Relaxed),
        frees: FREES.load(Ordering::Relaxed),
        cross_frees: CROSS_FREES.load(Ordering::Relaxed),
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
            frees: self.frees.saturating_sub(earlier.frees),
            cross_frees: self.cross_frees.saturating_sub(earlier.cross_frees),
        }
    }
}
