//! The engine core's steady state allocates nothing: once the engine has
//! served a request of a shape, serving the same shape again (admit, commit,
//! finish, step, drain) makes no heap allocation. "Steady state" is defined
//! in docs/architecture.md ("Allocations in the steady state").
//!
//! A counting global allocator counts only on the thread that turned it on,
//! so the test harness's own threads cannot disturb the counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kvcore::{Engine, EngineConfig, MmContent, MmItemSpec, RequestSpec, TokenRun};

thread_local! {
    /// Whether this thread counts, and what it counted.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

struct CountingAlloc;

fn note() {
    // `try_with`: the thread-locals may be gone while a thread exits.
    let _ = COUNTING.try_with(|c| {
        if c.get() {
            let _ = COUNT.try_with(|n| n.set(n.get() + 1));
        }
    });
}

#[allow(unsafe_code, reason = "a global allocator is an unsafe trait; each call forwards to System unchanged")]
// SAFETY: every method forwards its arguments unchanged to `System`; the
// counter touches no memory the allocator hands out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's layout contract passes through to System.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from System with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract passes through to System.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Allocations (allocs and reallocs) made on this thread by `f`.
fn allocations<R>(f: impl FnOnce() -> R) -> (R, u64) {
    COUNT.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, COUNT.with(Cell::get))
}

const BLOCK: u32 = 32;
const PROMPT: u32 = 4096;
const IMAGE_START: u32 = 512;
const IMAGE_LEN: u32 = 1024;

fn prompt(first: u32) -> Vec<u32> {
    (0..PROMPT)
        .map(|i| match i {
            0 => first,
            i if (IMAGE_START..IMAGE_START + IMAGE_LEN).contains(&i) => kvcore::QWEN_IMAGE_PAD_TOKEN,
            i => 1000 + (i * 7919) % 50_000,
        })
        .collect()
}

fn engine(prompts: u32, extra: u32, kv_events: bool) -> Engine {
    Engine::new(EngineConfig {
        block_size_tokens: BLOCK,
        blocks_device: prompts * PROMPT / BLOCK + extra,
        kv_events,
        ..Default::default()
    })
    .expect("a valid config")
}

/// Allocations per call of one served request.
#[derive(Debug, Default, PartialEq, Eq)]
struct Calls {
    admit: u64,
    commit: u64,
    finish: u64,
    step: u64,
    drain: u64,
}

/// Serves one request through the Rust API, counting each call's
/// allocations; returns them and the events drained.
fn serve(e: &mut Engine, spec: &RequestSpec<'_>) -> (Calls, usize) {
    let (a, admit) = allocations(|| e.add_request(spec).expect("capacity is ample"));
    let ((), commit) = allocations(|| e.commit(a.id, PROMPT as u64).expect("live"));
    let ((), finish) = allocations(|| e.finish(a.id).expect("live"));
    let (copies, mut step) = allocations(|| e.step());
    assert!(copies.is_empty());
    if cfg!(debug_assertions) {
        // A debug build checks the engine's invariants at every step, with
        // bookkeeping maps of its own: the same read-only check again, right
        // after, allocates exactly as much, which is not the step's.
        let ((), check) = allocations(|| e.check_invariants());
        step -= check;
    }
    let (events, drain) = allocations(|| e.drain_events());
    (Calls { admit, commit, finish, step, drain }, events.len())
}

fn spec<'a>(tokens: &'a [u32], digest: &'a [u8; 32], image: bool) -> RequestSpec<'a> {
    RequestSpec {
        tokens,
        items: if image {
            vec![MmItemSpec {
                content: MmContent::Digest(digest),
                runs: vec![TokenRun { start: IMAGE_START, len: IMAGE_LEN }],
            }]
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

/// Warm requests (every full block but the last cached), text only and with
/// an image by digest, events on and drained by the caller: after one
/// request of the shape, each further one allocates nothing.
#[test]
fn warm_requests_allocate_nothing() {
    let digest = *blake3::hash(b"image").as_bytes();
    for image in [false, true] {
        let tokens = prompt(7);
        let spec = spec(&tokens, &digest, image);
        let mut e = engine(2, 0, true);
        // The first request is cold (it stores the blocks); the second is the
        // first warm one and may size the engine's scratch buffers.
        let (_, stored) = serve(&mut e, &spec);
        assert!(stored > 0, "the cold request is advertised");
        serve(&mut e, &spec);
        for round in 0..8 {
            let (calls, events) = serve(&mut e, &spec);
            assert_eq!(events, 0, "a warm request stores nothing new");
            assert_eq!(calls, Calls::default(), "image {image}, warm round {round}");
        }
        e.check_invariants();
    }
}

/// Cold requests under eviction (each admission evicts the previous
/// request's 128 blocks): with events off, nothing is allocated once the
/// engine has evicted once.
/// A cold commit with events on allocates only the `BlockStored` it builds,
/// each vector once: its keys, its token ids, its image list, its per-block
/// image ends and runs (sized at the first image block for every block the
/// event was started for), and the open step's event list that a drain
/// handed away. None of them regrows block after block. (The engine's own
/// buffers are sized by the first request of the shape.)
#[test]
fn cold_commit_allocates_its_event_once() {
    let digest = *blake3::hash(b"image").as_bytes();
    let mut e = engine(2, 0, true);
    for first in 0..4u32 {
        let tokens = prompt(first);
        let spec = spec(&tokens, &digest, true);
        let a = e.add_request(&spec).expect("capacity is ample");
        assert_eq!(a.tokens_cached, 0, "every request is cold");
        let ((), commit) = allocations(|| e.commit(a.id, PROMPT as u64).expect("live"));
        // The first commit also sizes the engine's keying buffers.
        assert!(first == 0 || commit <= 6, "request {first}: the commit allocated {commit} times");
        e.finish(a.id).expect("live");
        e.step();
        e.drain_events();
        e.clear();
        e.step();
        e.drain_events();
    }
}

#[test]
fn evicting_requests_allocate_nothing_without_events() {
    let digest = *blake3::hash(b"image").as_bytes();
    for image in [false, true] {
        let mut e = engine(2, 1, false);
        let mut tokens = prompt(0);
        for n in 0..12u32 {
            tokens[0] = 1_000_000 + n;
            let spec = spec(&tokens, &digest, image);
            let (calls, events) = serve(&mut e, &spec);
            assert_eq!(events, 0);
            if n >= 4 {
                assert_eq!(calls, Calls::default(), "image {image}, evicting round {n}");
            }
        }
        assert!(e.counters().blocks_evicted_device >= 128 * 8, "every round evicted");
        e.check_invariants();
    }
}

/// The C caller's loop on warm text requests, events on: admit, commit,
/// finish, step (which moves the closed batches onto the handle) and a
/// record drain into the caller's buffer allocate nothing once one request
/// of the shape was served warm.
#[test]
fn c_api_warm_requests_allocate_nothing() {
    use kvcore::ffi::{
        kvc_admission, kvc_config, kvc_config_default, kvc_engine, kvc_engine_add_request, kvc_engine_commit,
        kvc_engine_drain_events, kvc_engine_finish, kvc_engine_free, kvc_engine_new, kvc_engine_step, kvc_event,
        kvc_request, kvc_status,
    };
    use std::mem::MaybeUninit;

    let ok = |s: kvc_status| assert_eq!(s, kvc_status::Ok);
    let tokens = prompt(7);
    let mut config = MaybeUninit::<kvc_config>::uninit();
    // SAFETY: every pointer is valid for the call; the engine is freed last.
    unsafe {
        ok(kvc_config_default(config.as_mut_ptr()));
        let mut config = config.assume_init();
        config.block_size_tokens = BLOCK;
        config.blocks_device = 2 * PROMPT / BLOCK;
        let mut e: *mut kvc_engine = std::ptr::null_mut();
        ok(kvc_engine_new(&config, &mut e));
        let request = kvc_request { tokens: tokens.as_ptr(), tokens_len: tokens.len(), ..std::mem::zeroed() };
        let mut records = vec![std::mem::zeroed::<kvc_event>(); 4 * PROMPT as usize / BLOCK as usize];
        // A debug build checks the engine's invariants at every step (see
        // `serve`); the C handle's engine cannot be reached, so a twin driven
        // by the same calls, in the same state, tells what that check takes.
        let mut twin = engine(2, 0, true);
        let twin_spec = spec(&tokens, &[0; 32], false);
        let mut serve = || {
            let a = twin.add_request(&twin_spec).expect("fits");
            twin.commit(a.id, PROMPT as u64).expect("live");
            twin.finish(a.id).expect("live");
            twin.step();
            twin.drain_events();
            let ((), check) = allocations(|| twin.check_invariants());
            let mut a = std::mem::zeroed::<kvc_admission>();
            let mut copies = 0usize;
            let mut drained = 0usize;
            let ((), admit) = allocations(|| ok(kvc_engine_add_request(e, &request, &mut a)));
            let ((), commit) = allocations(|| ok(kvc_engine_commit(e, a.request_id, PROMPT as u64)));
            let ((), finish) = allocations(|| ok(kvc_engine_finish(e, a.request_id)));
            let ((), step) = allocations(|| ok(kvc_engine_step(e, &mut copies)));
            let ((), drain) =
                allocations(|| ok(kvc_engine_drain_events(e, records.as_mut_ptr(), records.len(), &mut drained)));
            assert_eq!(copies, 0);
            let step = if cfg!(debug_assertions) { step - check } else { step };
            (Calls { admit, commit, finish, step, drain }, drained)
        };
        let (_, stored) = serve();
        assert!(stored > 0, "the cold request is advertised");
        serve();
        for round in 0..8 {
            let (calls, drained) = serve();
            assert_eq!(drained, 0, "a warm request stores nothing new");
            assert_eq!(calls, Calls::default(), "C API, warm round {round}");
        }
        kvc_engine_free(e);
    }
}
