//! The decoder allocates no more than its input justifies, measured with a
//! counting global allocator around each decode.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kvcore::wire::decode_payload;
use rand::{Rng, SeedableRng};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator with the caller's layout
// and pointer unchanged; the counters are only arithmetic on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Peak bytes allocated while decoding `input`.
fn peak_of(input: &[u8]) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = decode_payload(input);
    let peak = PEAK.load(Ordering::Relaxed) - base;
    drop(r);
    peak
}

/// Hostile length prefixes and random bytes must keep the decoder's peak
/// allocation within a fixed multiple of the input length (the bound in
/// docs/wire-format.md): 256 bytes per input byte plus 4 KiB.
#[test]
fn peak_allocation_is_linear_in_input() {
    let bound = |n: usize| 256 * n + 4096;
    let header = {
        let mut h = vec![0x93, 0xcb];
        h.extend_from_slice(&0f64.to_be_bytes());
        h
    };
    // Claims of 2^32-1 elements at each level that accepts a length.
    let mut cases: Vec<Vec<u8>> = Vec::new();
    let claim = [0xdd, 0xff, 0xff, 0xff, 0xff];
    cases.push([&header[..], &claim[..]].concat());
    let stored_prefix = |field: &str| {
        let mut v = header.clone();
        v.extend_from_slice(&[0x91, 0x81, 0xa0 | field.len() as u8]);
        v.extend_from_slice(field.as_bytes());
        v
    };
    for field in ["block_hashes", "token_ids", "block_mm_infos"] {
        let mut v = stored_prefix(field);
        v.extend_from_slice(&claim);
        v.extend(std::iter::repeat_n(0x01, 64));
        cases.push(v);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..2000 {
        let n = rng.random_range(0..256);
        let mut v = header.clone();
        v.push(0xdc);
        v.extend((0..n).map(|_| rng.random::<u8>()));
        cases.push(v);
    }
    for c in &cases {
        let peak = peak_of(c);
        assert!(peak <= bound(c.len()), "{} bytes allocated {peak}", c.len());
    }
}
