//! Rust-side tests of the boundary itself (the C and C++ programs in
//! ffi-tests/ test the surface as C sees it).

use std::ptr;

use super::boundary::with_engine;
use super::*;

fn new_engine() -> *mut kvc_engine {
    let mut config = std::mem::MaybeUninit::<kvc_config>::uninit();
    // SAFETY: `config` is valid for one write.
    assert_eq!(unsafe { kvc_config_default(config.as_mut_ptr()) }, kvc_status::Ok);
    // SAFETY: written by the successful call above.
    let mut config = unsafe { config.assume_init() };
    config.block_size_tokens = 4;
    config.blocks_device = 16;
    let mut engine = ptr::null_mut();
    // SAFETY: `config` is a valid config with NULL strings; `engine` is writable.
    assert_eq!(unsafe { kvc_engine_new(&config, &mut engine) }, kvc_status::Ok);
    engine
}

fn last_error(engine: *mut kvc_engine) -> String {
    let mut buf = [0 as std::ffi::c_char; 256];
    let mut n = 0usize;
    // SAFETY: live engine, buffer of 256 bytes, `n` writable.
    assert_eq!(unsafe { kvc_engine_last_error(engine, buf.as_mut_ptr(), buf.len(), &mut n) }, kvc_status::Ok);
    String::from_utf8(buf[..n].iter().map(|c| *c as u8).collect()).unwrap()
}

/// A panic inside an engine call comes back as PANIC, poisons that engine
/// (later calls say POISONED, the message survives) and leaves a second
/// engine untouched; driven through `with_engine` with a closure that panics.
#[test]
fn panic_poisons_only_its_engine() {
    let a = new_engine();
    let b = new_engine();
    let status = with_engine(a, |_| panic!("invariant 7 broken on purpose"));
    assert_eq!(status, kvc_status::Panic);
    let mut n = 0usize;
    // SAFETY: live engines; `n` writable.
    assert_eq!(unsafe { kvc_engine_events_pending(a, &mut n) }, kvc_status::Poisoned);
    assert!(last_error(a).contains("invariant 7 broken on purpose"), "{}", last_error(a));
    // SAFETY: as above.
    assert_eq!(unsafe { kvc_engine_events_pending(b, &mut n) }, kvc_status::Ok);
    // SAFETY: both came from kvc_engine_new and are freed once.
    unsafe {
        kvc_engine_free(a);
        kvc_engine_free(b);
    }
}

/// A second call while one is in flight on the same engine is refused with
/// ENGINE_BUSY instead of racing; checked by re-entering from inside a call.
#[test]
fn concurrent_call_is_refused() {
    let e = new_engine();
    let mut inner = kvc_status::Ok;
    let outer = with_engine(e, |_| {
        let mut n = 0usize;
        // SAFETY: live engine; `n` writable. The re-entry is the point of the test.
        inner = unsafe { kvc_engine_events_pending(e, &mut n) };
        Ok(())
    });
    assert_eq!((outer, inner), (kvc_status::Ok, kvc_status::EngineBusy));
    // SAFETY: from kvc_engine_new, freed once.
    unsafe { kvc_engine_free(e) };
}

/// Stored-event records carry the chain: parent of block i is block i-1, the
/// first one's parent is the event's parent; checked on a two-block commit.
#[test]
fn event_records_chain_parents() {
    let e = new_engine();
    let tokens: Vec<u32> = (1..=9).collect();
    let req = kvc_request {
        tokens: tokens.as_ptr(),
        tokens_len: tokens.len(),
        lora_id: 7,
        has_lora_id: true,
        dummy: false,
        lora_name: kvc_bytes { ptr: b"adapter-7".as_ptr(), len: 9 },
        cache_salt: kvc_bytes { ptr: ptr::null(), len: 0 },
        items: ptr::null(),
        items_len: 0,
        uuids: ptr::null(),
        uuids_len: 0,
    };
    let mut adm = std::mem::MaybeUninit::<kvc_admission>::uninit();
    let mut copies = 0usize;
    let mut events = [bytemuck::Zeroable::zeroed(); 8];
    let mut n = 0usize;
    // SAFETY: live engine; every pointer in `req` is valid for the call; out params writable.
    unsafe {
        assert_eq!(kvc_engine_add_request(e, &req, adm.as_mut_ptr()), kvc_status::Ok);
        let id = adm.assume_init().request_id;
        assert_eq!(kvc_engine_commit(e, id, 9), kvc_status::Ok);
        assert_eq!(kvc_engine_step(e, &mut copies), kvc_status::Ok);
        assert_eq!(kvc_engine_drain_events(e, events.as_mut_ptr(), events.len(), &mut n), kvc_status::Ok);
        kvc_engine_free(e);
    }
    let events: &[kvc_event] = &events[..n];
    assert_eq!(n, 2);
    assert_eq!(events[0].flags & KVC_EVENT_FLAG_HAS_PARENT, 0);
    assert_eq!(events[1].parent_hash, events[0].block_hash);
    assert_eq!(events[1].parent_key, events[0].block_key);
    assert!(events.iter().all(|r| r.lora_id == 7 && r.block_count == 2 && r.token_count == 4));
    assert_eq!(events[0].event_seq, events[1].event_seq);
}

fn counters(e: *mut kvc_engine) -> kvc_counters {
    let mut c = std::mem::MaybeUninit::<kvc_counters>::uninit();
    // SAFETY: live engine; `c` writable.
    assert_eq!(unsafe { kvc_engine_counters(e, c.as_mut_ptr()) }, kvc_status::Ok);
    // SAFETY: written by the successful call.
    unsafe { c.assume_init() }
}

/// A request of `tokens` with one image item and no UUID list.
fn image_request(tokens: &[u32], item: &kvc_image_item) -> kvc_request {
    kvc_request {
        tokens: tokens.as_ptr(),
        tokens_len: tokens.len(),
        lora_id: 0,
        has_lora_id: false,
        dummy: false,
        lora_name: kvc_bytes { ptr: ptr::null(), len: 0 },
        cache_salt: kvc_bytes { ptr: ptr::null(), len: 0 },
        items: item,
        items_len: 1,
        uuids: ptr::null(),
        uuids_len: 0,
    }
}

/// On an engine with no GPU open, every GPU call is refused with its
/// documented status and changes nothing: a device-resident image item does
/// not admit its request (nor count as an engine refusal), digests are not
/// written, and the same request with host bytes is admitted afterwards.
/// Holds on any machine, with or without CUDA.
#[test]
fn gpu_calls_without_an_open_gpu_change_nothing() {
    let e = new_engine();
    let placeholder = 151_655;
    let tokens: Vec<u32> = (0..12).map(|i| if (4..8).contains(&i) { placeholder } else { i + 1 }).collect();
    let runs = [kvc_token_run { start: 4, len: 4 }];
    let pixels = [7u8; 64];
    let device_item = kvc_image_item {
        content_kind: kvc_image_content::Device as u32,
        content: 0x7f00_0000_1000usize as *const u8,
        content_len: 64,
        runs: runs.as_ptr(),
        runs_len: 1,
    };
    let mut adm = std::mem::MaybeUninit::<kvc_admission>::uninit();
    let items =
        [kvc_device_bytes { ptr: 0x7f00_0000_1000, len: 64 }, kvc_device_bytes { ptr: 0x7f00_0000_2000, len: 8 }];
    let mut digests = [0xAAu8; 64];
    let mut launches = 99usize;
    let region = [0x7f00_0000_0000u64];
    let pool =
        kvc_kv_pool { region_bases: region.as_ptr(), regions: 1, planes: 1, block_bytes: 64, blocks: 16, reserved: 0 };
    // SAFETY: live engine; every pointer is valid for the call (the device
    // address is never dereferenced on the host: no GPU is open).
    unsafe {
        assert_eq!(
            kvc_engine_add_request(e, &image_request(&tokens, &device_item), adm.as_mut_ptr()),
            kvc_status::GpuUnavailable
        );
        assert!(last_error(e).contains("kvc_engine_gpu_open"), "{}", last_error(e));
        let c = counters(e);
        assert_eq!((c.requests_live, c.requests_admitted, c.requests_rejected), (0, 0, 0));
        assert_eq!(
            kvc_engine_digest_device(e, items.as_ptr(), 1, digests.as_mut_ptr(), 64),
            kvc_status::GpuUnavailable
        );
        assert_eq!(
            kvc_engine_digest_device(e, items.as_ptr(), 2, digests.as_mut_ptr(), 63),
            kvc_status::BufferTooSmall
        );
        assert!(digests.iter().all(|b| *b == 0xAA), "nothing written on failure");
        assert_eq!(
            kvc_engine_digest_device(e, ptr::null(), 0, ptr::null_mut(), 0),
            kvc_status::Ok,
            "no items, nothing to do"
        );
        assert_eq!(kvc_engine_copy_blocks(e, &mut launches), kvc_status::KvPoolNotAttached);
        assert_eq!(launches, 99);
        assert_eq!(kvc_engine_attach_kv_pool(e, &pool), kvc_status::GpuUnavailable);
        assert_eq!(kvc_engine_attach_kv_pool(e, ptr::null()), kvc_status::NullArgument);
        let bad_kind = kvc_image_item { content_kind: 3, ..device_item };
        assert_eq!(
            kvc_engine_add_request(e, &image_request(&tokens, &bad_kind), adm.as_mut_ptr()),
            kvc_status::InvalidArgument
        );
        let host_item =
            kvc_image_item { content_kind: kvc_image_content::Bytes as u32, content: pixels.as_ptr(), ..device_item };
        assert_eq!(kvc_engine_add_request(e, &image_request(&tokens, &host_item), adm.as_mut_ptr()), kvc_status::Ok);
        assert_eq!(counters(e).requests_live, 1);
        kvc_engine_free(e);
    }
    for code in [300, 301, 302] {
        // SAFETY: any code is accepted; the result is a static C string.
        let s = unsafe { std::ffi::CStr::from_ptr(kvc_status_str(code)) };
        assert_ne!(s.to_str().unwrap(), "unknown status code", "{code}");
    }
}

/// `kvc_engine_gpu_open` either opens the device or says why not with
/// GPU_UNAVAILABLE and a message; opening a second ordinal is refused once
/// one is open. (On the development and CI machines there is no CUDA driver,
/// so the first branch runs there; tests/gpu.rs covers the open device.)
#[test]
fn gpu_open_opens_or_says_why() {
    let e = new_engine();
    // SAFETY: live engine.
    let status = unsafe { kvc_engine_gpu_open(e, 0) };
    if status == kvc_status::Ok {
        // SAFETY: live engine.
        unsafe {
            assert_eq!(kvc_engine_gpu_open(e, 0), kvc_status::Ok, "the same ordinal again is a no-op");
            assert_eq!(kvc_engine_gpu_open(e, 1), kvc_status::InvalidArgument);
        }
    } else {
        assert_eq!(status, kvc_status::GpuUnavailable);
        let msg = last_error(e);
        assert!(msg.contains("libcuda") || msg.contains("CUDA") || msg.contains("cuda"), "{msg}");
    }
    // SAFETY: from kvc_engine_new, freed once.
    unsafe { kvc_engine_free(e) };
}
