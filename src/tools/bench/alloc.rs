//! A global allocator that counts the bytes live, for the memory rows of the
//! native router comparison (`kvcore route-bench --native`).
//!
//! It forwards to the system allocator and keeps one relaxed atomic sum of
//! the bytes allocated and not yet freed, over all threads (Dynamo's thread
//! pool allocates on its own threads). The tool installs it; a binary that
//! does not install it reads 0.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Bytes allocated and not yet freed through [`CountingAlloc`].
static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting the bytes live (see the module docs).
pub struct CountingAlloc;

/// Bytes live through [`CountingAlloc`] now (0 where it is not installed).
pub fn live_bytes() -> isize {
    LIVE.load(Ordering::Relaxed)
}

#[allow(unsafe_code, reason = "a global allocator is an unsafe trait; each call forwards to System unchanged")]
// SAFETY: every method forwards its arguments unchanged to `System`, which
// upholds the `GlobalAlloc` contract; the counter has no effect on the memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract passes through to System.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator (so from System) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract passes through to System.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
}
