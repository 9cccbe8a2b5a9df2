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
/// not admit its request, digests are not
/// written (the refusal is counted in `requests_rejected`, as every refused
/// admission is), and the same request with host bytes is admitted afterwards.
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
        assert_eq!((c.requests_live, c.requests_admitted, c.requests_rejected), (0, 0, 1));
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

/// A text request of `tokens`.
fn text_request(tokens: &[u32]) -> kvc_request {
    kvc_request {
        tokens: tokens.as_ptr(),
        tokens_len: tokens.len(),
        lora_id: 0,
        has_lora_id: false,
        dummy: false,
        lora_name: kvc_bytes { ptr: ptr::null(), len: 0 },
        cache_salt: kvc_bytes { ptr: ptr::null(), len: 0 },
        items: ptr::null(),
        items_len: 0,
        uuids: ptr::null(),
        uuids_len: 0,
    }
}

/// The default C config with small blocks.
fn small_config() -> kvc_config {
    let mut config = std::mem::MaybeUninit::<kvc_config>::uninit();
    // SAFETY: `config` is valid for one write.
    assert_eq!(unsafe { kvc_config_default(config.as_mut_ptr()) }, kvc_status::Ok);
    // SAFETY: written by the successful call above.
    let mut config = unsafe { config.assume_init() };
    config.block_size_tokens = 4;
    config.blocks_device = 64;
    config
}

fn engine_with(config: &kvc_config) -> *mut kvc_engine {
    let mut engine = ptr::null_mut();
    // SAFETY: `config` is valid, its strings NULL or static; `engine` is writable.
    assert_eq!(unsafe { kvc_engine_new(config, &mut engine) }, kvc_status::Ok);
    engine
}

/// Admits, commits and finishes one 8-token request whose tokens start at
/// `first`, then closes the step: each step stores two new blocks and, once
/// the 64 pages are full, evicts older ones.
fn serve_one(e: *mut kvc_engine, first: u32) {
    let tokens: Vec<u32> = (first..first + 8).collect();
    let mut adm = std::mem::MaybeUninit::<kvc_admission>::uninit();
    let mut copies = 0usize;
    // SAFETY: live engine; the request points to `tokens`, alive for the call; out params writable.
    unsafe {
        assert_eq!(kvc_engine_add_request(e, &text_request(&tokens), adm.as_mut_ptr()), kvc_status::Ok);
        let id = adm.assume_init().request_id;
        assert_eq!(kvc_engine_commit(e, id, 8), kvc_status::Ok);
        assert_eq!(kvc_engine_finish(e, id), kvc_status::Ok);
        assert_eq!(kvc_engine_step(e, &mut copies), kvc_status::Ok);
    }
}

/// However a caller drains, what the engine holds for the drains stays
/// within `event_batches_max` batches, and what it drops is counted. Method:
/// 2000 steps of a request each (two stored blocks, later evictions) on an
/// engine keeping 8 batches, under each drain pattern that used to move
/// batches into unbounded queues: only counting pending records, taking one
/// record per step, only asking the wire size, and offering a 1-byte wire
/// buffer. After every step the pending records (or wire bytes) must fit in
/// 8 batches of this workload, and at the end the drops are counted.
#[test]
fn held_events_stay_bounded_under_every_drain_pattern() {
    const STEPS: u32 = 2000;
    const KEPT: u32 = 8;
    // A batch here holds at most 2 stored and 2 removed blocks.
    const RECORDS_MAX: usize = (KEPT as usize) * 4;
    for pattern in ["pending", "one_record", "wire_size", "wire_tiny"] {
        let mut config = small_config();
        config.event_batches_max = KEPT;
        let e = engine_with(&config);
        let mut record = [bytemuck::Zeroable::zeroed(); 1];
        let mut tiny = [0u8; 1];
        let mut payload_max = 0usize;
        for step in 0..STEPS {
            serve_one(e, 1 + step * 8);
            let mut n = 0usize;
            // SAFETY: live engine; buffers as described by their lengths; `n` writable.
            let status = unsafe {
                match pattern {
                    "pending" => kvc_engine_events_pending(e, &mut n),
                    "one_record" => kvc_engine_drain_events(e, record.as_mut_ptr(), 1, &mut n),
                    "wire_size" => kvc_engine_drain_events_wire(e, ptr::null_mut(), 0, &mut n),
                    _ => kvc_engine_drain_events_wire(e, tiny.as_mut_ptr(), 1, &mut n),
                }
            };
            let expected = if pattern == "wire_tiny" { kvc_status::BufferTooSmall } else { kvc_status::Ok };
            assert_eq!(status, expected, "{pattern}, step {step}");
            let mut pending = 0usize;
            let mut bytes = 0usize;
            // SAFETY: live engine; `pending` and `bytes` writable.
            unsafe {
                assert_eq!(kvc_engine_events_pending(e, &mut pending), kvc_status::Ok);
                assert_eq!(kvc_engine_drain_events_wire(e, ptr::null_mut(), 0, &mut bytes), kvc_status::Ok);
            }
            if step == 0 {
                payload_max = bytes;
            }
            assert!(pending <= RECORDS_MAX, "{pattern}, step {step}: {pending} records held");
            // A later payload differs from the first only by a few removed keys.
            assert!(bytes <= KEPT as usize * (payload_max + 256), "{pattern}, step {step}: {bytes} wire bytes held");
        }
        let c = counters(e);
        assert!(
            c.event_batches_dropped >= u64::from(STEPS - 2 * KEPT),
            "{pattern}: {} batches counted as dropped",
            c.event_batches_dropped
        );
        // SAFETY: from kvc_engine_new, freed once.
        unsafe { kvc_engine_free(e) };
    }
}

/// A drain in small pieces still sees every record once, in order, and a
/// batch partly drained as records counts as one of the kept batches.
/// Method: 3 steps of 2 stored blocks each, drained 1 record at a time, with
/// `event_seq` and `block_index` checked.
#[test]
fn small_drains_see_every_record_once() {
    let config = small_config();
    let e = engine_with(&config);
    for i in 0..3 {
        serve_one(e, 1000 + i * 8);
    }
    let mut got = Vec::new();
    loop {
        let mut record = [bytemuck::Zeroable::zeroed(); 1];
        let mut n = 0usize;
        // SAFETY: live engine; one-record buffer; `n` writable.
        assert_eq!(unsafe { kvc_engine_drain_events(e, record.as_mut_ptr(), 1, &mut n) }, kvc_status::Ok);
        if n == 0 {
            break;
        }
        got.push(record[0]);
    }
    let seen: Vec<(u64, u32)> = got.iter().map(|r: &kvc_event| (r.step_index, r.block_index)).collect();
    assert_eq!(seen, vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]);
    // SAFETY: from kvc_engine_new, freed once.
    unsafe { kvc_engine_free(e) };
}

/// `kvc_engine_new` answers every config with a documented status and never
/// ends the process: each numeric field at 0, 1, 2, around its limit, at
/// half and all of its range, every other field at its default; then every
/// capacity at its limit at once. A value over a field's limit is
/// INVALID_CONFIG; a value within every limit is OK or OUT_OF_MEMORY.
#[test]
#[cfg_attr(miri, ignore = "reserves hundreds of MiB")]
fn engine_new_answers_every_config_extreme() {
    type Field = (&'static str, fn(&mut kvc_config) -> &mut u32, u64);
    let fields: [Field; 11] = [
        ("block_size_tokens", |c| &mut c.block_size_tokens, u64::from(KVC_CONFIG_BLOCK_SIZE_TOKENS_LIMIT)),
        ("blocks_device", |c| &mut c.blocks_device, u64::from(KVC_CONFIG_BLOCKS_DEVICE_LIMIT)),
        ("blocks_host", |c| &mut c.blocks_host, u64::from(KVC_CONFIG_BLOCKS_HOST_LIMIT)),
        ("image_placeholder_token_id", |c| &mut c.image_placeholder_token_id, u64::from(u32::MAX)),
        ("requests_max", |c| &mut c.requests_max, u64::from(KVC_CONFIG_REQUESTS_LIMIT)),
        ("tokens_per_request_max", |c| &mut c.tokens_per_request_max, u64::from(u32::MAX)),
        ("mm_items_max", |c| &mut c.mm_items_max, u64::from(KVC_CONFIG_MM_ITEMS_LIMIT)),
        ("mm_items_per_request_max", |c| &mut c.mm_items_per_request_max, 4096),
        ("runs_per_item_max", |c| &mut c.runs_per_item_max, u64::from(u32::MAX)),
        ("routing_hints_max", |c| &mut c.routing_hints_max, u64::from(KVC_CONFIG_ROUTING_HINTS_LIMIT)),
        ("event_batches_max", |c| &mut c.event_batches_max, u64::from(KVC_CONFIG_EVENT_BATCHES_LIMIT)),
    ];
    let try_new = |c: &kvc_config| {
        let mut engine = ptr::null_mut();
        // SAFETY: `c` is a valid config with NULL strings; `engine` is writable.
        let status = unsafe { kvc_engine_new(c, &mut engine) };
        // SAFETY: NULL or an engine just made, freed once.
        unsafe { kvc_engine_free(engine) };
        status
    };
    let mut default = std::mem::MaybeUninit::<kvc_config>::uninit();
    // SAFETY: valid for one write.
    assert_eq!(unsafe { kvc_config_default(default.as_mut_ptr()) }, kvc_status::Ok);
    // SAFETY: written by the successful call.
    let default = unsafe { default.assume_init() };
    for (name, field, limit) in fields {
        let mut values = vec![0u64, 1, 2, limit.saturating_sub(1), limit, limit + 1];
        values.extend([u64::from(u32::MAX / 2), u64::from(u32::MAX - 1), u64::from(u32::MAX)]);
        for value in values.into_iter().filter(|v| *v <= u64::from(u32::MAX)) {
            let mut c = default;
            *field(&mut c) = value as u32;
            let status = try_new(&c);
            let min_ok = match name {
                "blocks_host"
                | "image_placeholder_token_id"
                | "mm_items_max"
                | "mm_items_per_request_max"
                | "routing_hints_max"
                | "event_batches_max" => 0,
                _ => 1,
            };
            // The defaults' other fields make these cross-field rules bite first.
            let slots_ok = (u64::from(c.blocks_device) + u64::from(c.blocks_host)) * u64::from(c.block_size_tokens)
                <= KVC_CONFIG_TOKEN_SLOTS_LIMIT;
            let in_range =
                (min_ok..=limit).contains(&value) && slots_ok && c.mm_items_per_request_max <= c.mm_items_max;
            if in_range {
                assert!(
                    matches!(status, kvc_status::Ok | kvc_status::OutOfMemory),
                    "{name} = {value}: {status:?}, expected OK or OUT_OF_MEMORY"
                );
            } else {
                assert_eq!(status, kvc_status::InvalidConfig, "{name} = {value}");
            }
        }
    }
    // Every capacity at its limit at once (the token slots at theirs).
    let mut c = default;
    c.blocks_device = KVC_CONFIG_BLOCKS_DEVICE_LIMIT;
    c.blocks_host = KVC_CONFIG_BLOCKS_HOST_LIMIT;
    c.block_size_tokens = (KVC_CONFIG_TOKEN_SLOTS_LIMIT / (2 * u64::from(KVC_CONFIG_BLOCKS_DEVICE_LIMIT))) as u32;
    c.requests_max = KVC_CONFIG_REQUESTS_LIMIT;
    c.mm_items_max = KVC_CONFIG_MM_ITEMS_LIMIT;
    c.mm_items_per_request_max = KVC_CONFIG_MM_ITEMS_LIMIT;
    c.routing_hints_max = KVC_CONFIG_ROUTING_HINTS_LIMIT;
    c.event_batches_max = KVC_CONFIG_EVENT_BATCHES_LIMIT;
    c.tokens_per_request_max = u32::MAX;
    c.runs_per_item_max = u32::MAX;
    let status = try_new(&c);
    assert!(matches!(status, kvc_status::Ok | kvc_status::OutOfMemory), "every limit at once: {status:?}");
    c.kv_transfer_role = u32::MAX;
    assert_eq!(try_new(&c), kvc_status::InvalidConfig, "unknown kv_transfer_role");
    let mut c = default;
    c.model_type = c"\xff\xfe".as_ptr();
    assert_eq!(try_new(&c), kvc_status::InvalidUtf8, "model_type not UTF-8");
    let mut c = default;
    c.kv_events_endpoint = c"tcp://127.0.0.1:70000".as_ptr();
    assert_eq!(try_new(&c), kvc_status::InvalidConfig, "an endpoint ZMQ would wrap to another port");
    c.kv_events_endpoint = c"".as_ptr();
    assert_eq!(try_new(&c), kvc_status::Ok, "an empty endpoint is none");
}

/// A request id resolves only as issued: the same slot with any other
/// generation, odd or even (the even one below the live generation is what
/// slotmap's `from_ffi` used to turn into the live id), and made-up slots,
/// answer UNKNOWN_ID on every id call and leave the live request untouched.
/// Method: a live request, then forged ids from generation 0 to 64 and the
/// extremes, each tried with info, block table, grow, commit, finish and
/// cancel.
#[test]
fn ids_never_issued_are_unknown() {
    let config = small_config();
    let e = engine_with(&config);
    let tokens: Vec<u32> = (1..=8).collect();
    let mut adm = std::mem::MaybeUninit::<kvc_admission>::uninit();
    // SAFETY: live engine; the request points to `tokens`; `adm` writable.
    let live = unsafe {
        assert_eq!(kvc_engine_add_request(e, &text_request(&tokens), adm.as_mut_ptr()), kvc_status::Ok);
        adm.assume_init().request_id
    };
    let slot = live & 0xffff_ffff;
    let generation = live >> 32;
    let mut forged: Vec<u64> =
        (0..=64u64).chain([u64::from(u32::MAX) - 1, u64::from(u32::MAX)]).map(|g| (g << 32) | slot).collect();
    forged.extend([0, u64::MAX, live + 1, live ^ (1 << 31), (generation << 32) | 0xffff_fffe]);
    forged.retain(|id| *id != live);
    let info = |id: u64| {
        let mut out = std::mem::MaybeUninit::<kvc_request_info>::uninit();
        // SAFETY: live engine; `out` writable.
        let status = unsafe { kvc_engine_request_info(e, id, out.as_mut_ptr()) };
        // SAFETY: written when the call succeeded.
        (status, (status == kvc_status::Ok).then(|| unsafe { out.assume_init() }))
    };
    let before = info(live).1.expect("the live id resolves");
    for id in forged {
        let mut pages = [0u32; 8];
        let mut n = 0usize;
        let one = [9u32];
        // SAFETY: live engine; buffers as described by their lengths.
        let statuses = unsafe {
            [
                info(id).0,
                kvc_engine_block_table(e, id, pages.as_mut_ptr(), pages.len(), &mut n),
                kvc_engine_grow(e, id, one.as_ptr(), 1),
                kvc_engine_commit(e, id, 8),
                kvc_engine_finish(e, id),
                kvc_engine_cancel(e, id),
            ]
        };
        assert!(
            statuses.iter().all(|s| *s == kvc_status::UnknownId),
            "id {id:#018x} (live {live:#018x}): {statuses:?}"
        );
    }
    assert_eq!(info(live).1, Some(before), "the live request is untouched");
    // SAFETY: live engine, freed once.
    unsafe {
        assert_eq!(kvc_engine_finish(e, live), kvc_status::Ok);
        assert_eq!(kvc_engine_finish(e, live), kvc_status::UnknownId);
        kvc_engine_free(e);
    }
}

/// The model-info document as a string.
fn model_info(e: *mut kvc_engine) -> String {
    let mut buf = vec![0 as std::ffi::c_char; 4096];
    let mut n = 0usize;
    // SAFETY: live engine; 4096-byte buffer; `n` writable.
    assert_eq!(unsafe { kvc_engine_model_info(e, buf.as_mut_ptr(), buf.len(), &mut n) }, kvc_status::Ok);
    buf[..n].iter().map(|c| *c as u8 as char).collect()
}

/// A stopped publisher leaves the engine as if it had never published, and
/// every start checks its endpoint and bounds. Method: an image-routing
/// deployment with no endpoint of its own; a publisher on a loopback `*`
/// port turns image routing on in model_info, its stop turns it off again,
/// and a restart without an endpoint is refused instead of re-binding the old
/// one. Ports past 65535 (which ZMQ would wrap), port 0, a missing host, an
/// empty endpoint, a rank that pushes the port out of range, a HWM of 0 (no
/// limit in ZMQ) and a huge queue are all refused, and none leaves a
/// publisher running.
#[test]
fn publisher_stop_forgets_and_start_validates() {
    let mut config = small_config();
    config.model_type = c"qwen3_vl".as_ptr();
    config.model_image_capable = true;
    let e = engine_with(&config);
    let mut pc = std::mem::MaybeUninit::<kvc_publisher_config>::uninit();
    // SAFETY: valid for one write.
    assert_eq!(unsafe { kvc_publisher_config_default(pc.as_mut_ptr()) }, kvc_status::Ok);
    // SAFETY: written by the successful call.
    let defaults = unsafe { pc.assume_init() };
    let start = |f: &dyn Fn(&mut kvc_publisher_config)| {
        let mut pc = defaults;
        f(&mut pc);
        // SAFETY: live engine; `pc` holds NULL or static NUL-terminated strings.
        unsafe { kvc_engine_publisher_start(e, &pc) }
    };
    let running = || {
        let mut n = 0usize;
        // SAFETY: live engine; query with a NULL buffer.
        unsafe { kvc_engine_publisher_endpoint(e, ptr::null_mut(), 0, &mut n) == kvc_status::Ok }
    };
    assert!(!model_info(e).contains("image_routing_version"));
    assert_eq!(start(&|pc| pc.endpoint = c"tcp://127.0.0.1:*".as_ptr()), kvc_status::Ok);
    assert!(model_info(e).contains("image_routing_version"), "{}", model_info(e));
    // SAFETY: live engine with a publisher.
    assert_eq!(unsafe { kvc_engine_publisher_stop(e) }, kvc_status::Ok);
    assert!(!model_info(e).contains("image_routing_version"), "after stop: {}", model_info(e));
    assert_eq!(start(&|_| {}), kvc_status::InvalidArgument, "a restart with no endpoint anywhere");
    assert!(!running());
    type Change<'a> = &'a dyn Fn(&mut kvc_publisher_config);
    let refused: [(&str, Change<'_>); 9] = [
        ("port 70000", &|pc| pc.endpoint = c"tcp://127.0.0.1:70000".as_ptr()),
        ("port 65536", &|pc| pc.endpoint = c"tcp://127.0.0.1:65536".as_ptr()),
        ("port 0", &|pc| pc.endpoint = c"tcp://127.0.0.1:0".as_ptr()),
        ("no host", &|pc| pc.endpoint = c"tcp://:5557".as_ptr()),
        ("empty", &|pc| pc.endpoint = c"".as_ptr()),
        ("replay port", &|pc| {
            pc.endpoint = c"tcp://127.0.0.1:*".as_ptr();
            pc.replay_endpoint = c"tcp://127.0.0.1:99999".as_ptr();
        }),
        ("rank past 65535", &|pc| {
            pc.endpoint = c"tcp://127.0.0.1:65535".as_ptr();
            pc.has_data_parallel_rank = true;
            pc.data_parallel_rank = 1;
        }),
        ("hwm 0", &|pc| {
            pc.endpoint = c"tcp://127.0.0.1:*".as_ptr();
            pc.send_hwm = 0;
        }),
        ("queue u32::MAX", &|pc| {
            pc.endpoint = c"tcp://127.0.0.1:*".as_ptr();
            pc.queue_capacity = u32::MAX;
        }),
    ];
    for (what, f) in refused {
        let status = start(f);
        assert!(
            matches!(status, kvc_status::PublisherStartFailed | kvc_status::InvalidArgument),
            "{what}: {status:?} ({})",
            last_error(e)
        );
        assert!(!running(), "{what}: a publisher is running");
    }
    // SAFETY: from kvc_engine_new, freed once.
    unsafe { kvc_engine_free(e) };
}

/// Every refused admission is counted once in `requests_rejected`, whether
/// the engine refused it or the C description was malformed. Method: a
/// NULL token pointer with a length, a non-UTF-8 cache salt, an unknown
/// content kind, an empty prompt and a prompt too long; then the count.
#[test]
fn every_refused_admission_is_counted() {
    let mut config = small_config();
    config.tokens_per_request_max = 16;
    let e = engine_with(&config);
    let tokens: Vec<u32> = (1..=8).collect();
    let long: Vec<u32> = (1..=17).collect();
    let bad_salt = [0xffu8, 0xfe];
    let runs = [kvc_token_run { start: 0, len: 4 }];
    let item = kvc_image_item {
        content_kind: 99,
        content: tokens.as_ptr().cast(),
        content_len: 4,
        runs: runs.as_ptr(),
        runs_len: 1,
    };
    let mut requests = vec![
        (kvc_request { tokens: ptr::null(), ..text_request(&tokens) }, kvc_status::InvalidArgument),
        (
            kvc_request { cache_salt: kvc_bytes { ptr: bad_salt.as_ptr(), len: 2 }, ..text_request(&tokens) },
            kvc_status::InvalidUtf8,
        ),
        (image_request(&tokens, &item), kvc_status::InvalidArgument),
        (text_request(&[]), kvc_status::EmptyPrompt),
        (text_request(&long), kvc_status::RequestTooLong),
    ];
    let refused = requests.len() as u64;
    requests.push((text_request(&tokens), kvc_status::Ok));
    for (r, expected) in &requests {
        let mut adm = std::mem::MaybeUninit::<kvc_admission>::uninit();
        // SAFETY: live engine; every non-NULL pointer in `r` is valid for the call.
        assert_eq!(unsafe { kvc_engine_add_request(e, r, adm.as_mut_ptr()) }, *expected);
    }
    let c = counters(e);
    assert_eq!((c.requests_rejected, c.requests_admitted), (refused, 1));
    // SAFETY: from kvc_engine_new, freed once.
    unsafe { kvc_engine_free(e) };
}

/// `kvc_engine_last_error` returns exactly what its header documentation
/// lists, and keeps the message whatever it returns. Method: every outcome
/// provoked (a re-entered call gives ENGINE_BUSY; a panic cannot be
/// provoked from outside), then the statuses named in its header comment
/// compared with the ones seen plus PANIC.
#[test]
fn last_error_returns_what_its_header_says() {
    let e = new_engine();
    // SAFETY: live engine; a refused call to leave a message.
    assert_eq!(unsafe { kvc_engine_commit(e, 12345, 1) }, kvc_status::UnknownId);
    let message = last_error(e);
    assert!(!message.is_empty());
    let mut seen = std::collections::BTreeSet::new();
    let mut buf = [0 as std::ffi::c_char; 4];
    let mut n = 0usize;
    // SAFETY: each call's pointers are NULL, dangling-but-unused (length 0
    // with a non-NULL buffer is checked before any write) or valid.
    unsafe {
        let misaligned = (e as *mut u8).wrapping_add(1) as *const kvc_engine;
        for (status, expected) in [
            (kvc_engine_last_error(e, buf.as_mut_ptr(), buf.len(), &mut n), kvc_status::Ok),
            (kvc_engine_last_error(e, ptr::null_mut(), 0, &mut n), kvc_status::Ok),
            (kvc_engine_last_error(ptr::null(), buf.as_mut_ptr(), buf.len(), &mut n), kvc_status::NullArgument),
            (kvc_engine_last_error(e, buf.as_mut_ptr(), buf.len(), ptr::null_mut()), kvc_status::NullArgument),
            (kvc_engine_last_error(e, ptr::null_mut(), 4, &mut n), kvc_status::InvalidArgument),
            (kvc_engine_last_error(misaligned, buf.as_mut_ptr(), buf.len(), &mut n), kvc_status::InvalidArgument),
            (kvc_engine_last_error(e, buf.as_mut_ptr(), 0, &mut n), kvc_status::BufferTooSmall),
        ] {
            assert_eq!(status, expected);
            seen.insert(format!("{status:?}"));
        }
    }
    let mut busy = kvc_status::Ok;
    with_engine(e, |_| {
        // SAFETY: live engine; the re-entry is the point.
        busy = unsafe { kvc_engine_last_error(e, ptr::null_mut(), 0, &mut n) };
        Ok(())
    });
    assert_eq!(busy, kvc_status::EngineBusy);
    seen.insert(format!("{busy:?}"));
    // `with_engine` cleared the message on success; provoke it again.
    // SAFETY: live engine.
    assert_eq!(unsafe { kvc_engine_commit(e, 12345, 1) }, kvc_status::UnknownId);
    assert_eq!(last_error(e), message, "last_error keeps the message");
    seen.insert("Panic".into());

    let header = include_str!("../../include/kvcore.h");
    let decl = header.find("kvc_status kvc_engine_last_error(").expect("declared");
    let doc = &header[header[..decl].rfind("/**").expect("documented")..decl];
    let returns = &doc[doc.find("Returns").expect("a Returns list")..doc.find("# Safety").expect("a Safety section")];
    let documented: std::collections::BTreeSet<String> = kvc_status::ALL
        .iter()
        .filter(|s| returns.contains(&format!("KVC_STATUS_{}`", screaming(&format!("{s:?}")))))
        .map(|s| format!("{s:?}"))
        .collect();
    assert_eq!(documented, seen, "kvc_engine_last_error's documented returns");
    // SAFETY: from kvc_engine_new, freed once.
    unsafe { kvc_engine_free(e) };
}

/// `UpperCamel` as `SCREAMING_SNAKE`, as cbindgen renames the variants.
fn screaming(name: &str) -> String {
    let mut out = String::new();
    for (i, ch) in name.chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

/// With prefix reuse off, committed blocks get no keys, and the engine's
/// invariants (checked at every step in debug builds) allow that: a commit of
/// full blocks followed by a step is no panic. Found by the `c_api` fuzz
/// target (seed `fuzz/seeds/c_api/crash-reuse-off-commit`).
#[test]
fn reuse_off_commit_then_step_keeps_invariants() {
    let mut config = small_config();
    config.block_reuse = false;
    let e = engine_with(&config);
    serve_one(e, 1);
    let tokens: Vec<u32> = (1..=9).collect();
    let mut adm = std::mem::MaybeUninit::<kvc_admission>::uninit();
    let mut copies = 0usize;
    // SAFETY: live engine; the request points to `tokens`; out params writable.
    unsafe {
        assert_eq!(kvc_engine_add_request(e, &text_request(&tokens), adm.as_mut_ptr()), kvc_status::Ok);
        let id = adm.assume_init().request_id;
        assert_eq!(kvc_engine_commit(e, id, 9), kvc_status::Ok);
        assert_eq!(kvc_engine_step(e, &mut copies), kvc_status::Ok);
        assert_eq!(kvc_engine_commit(e, id, 9), kvc_status::Ok);
        kvc_engine_free(e);
    }
}

/// Calls made through the C API without a step keep the open step bounded:
/// after each of 24 000 calls (admissions, commits, finishes, clears and
/// evictions, over a host tier so that blocks move) the open step's events
/// stay below `events_per_step_max` entries, its copies within
/// `copies_per_step_max`, and the engine's early batches within
/// `event_batches_max`. The step then hands out at most that many copies,
/// the drops are counted, and the records drained start after a gap in
/// `event_seq` and follow on without one.
#[test]
fn calls_without_a_step_keep_the_open_step_bounded() {
    const CALLS: usize = 24_000;
    const KEPT: u32 = 4;
    let mut config = small_config();
    config.blocks_device = 16;
    config.blocks_host = 16;
    config.event_batches_max = KEPT;
    let e = engine_with(&config);
    let bounds = |e: *mut kvc_engine, call: usize| {
        // SAFETY: live engine from `kvc_engine_new`; no call is running on it.
        let state = unsafe { &*e }.state.lock().unwrap();
        let engine = &state.engine;
        let c = engine.config();
        assert!(engine.open_event_entries() < c.events_per_step_max(), "call {call}: open events");
        assert!(engine.copies_queued() <= c.copies_per_step_max(), "call {call}: copies");
        assert!(engine.batches_waiting() <= KEPT as usize, "call {call}: early batches");
    };
    let mut calls = 0;
    let mut n = 0u32;
    while calls < CALLS {
        // Six prompts of four blocks over 16 device pages: offloads and onboards.
        let tokens: Vec<u32> = (0..17).map(|i| (n % 6) * 1000 + i).collect();
        let mut adm = std::mem::MaybeUninit::<kvc_admission>::uninit();
        let mut evicted = 0usize;
        // SAFETY: live engine; the request points to `tokens`, alive for the call; out params writable.
        unsafe {
            assert_eq!(kvc_engine_add_request(e, &text_request(&tokens), adm.as_mut_ptr()), kvc_status::Ok);
            bounds(e, calls);
            let id = adm.assume_init().request_id;
            assert_eq!(kvc_engine_commit(e, id, 17), kvc_status::Ok);
            bounds(e, calls + 1);
            assert_eq!(kvc_engine_finish(e, id), kvc_status::Ok);
            bounds(e, calls + 2);
            if n % 7 == 6 {
                assert_eq!(kvc_engine_clear(e), kvc_status::Ok);
            } else {
                assert_eq!(kvc_engine_evict(e, (n % 3) as usize, &mut evicted), kvc_status::Ok);
            }
            bounds(e, calls + 3);
        }
        calls += 4;
        n += 1;
    }
    let mut copies = 0usize;
    // SAFETY: live engine; `copies` writable.
    assert_eq!(unsafe { kvc_engine_step(e, &mut copies) }, kvc_status::Ok);
    assert!(copies <= 32, "{copies} copies handed out");
    let c = counters(e);
    assert!(c.event_batches_dropped > 0, "early batches past the bound are counted");
    assert!(c.blocks_onboarded > 0 && c.blocks_offloaded > 0);
    let mut records = vec![bytemuck::Zeroable::zeroed(); 1 << 16];
    let mut got = 0usize;
    // SAFETY: live engine; buffer of `records.len()` records; `got` writable.
    assert_eq!(unsafe { kvc_engine_drain_events(e, records.as_mut_ptr(), records.len(), &mut got) }, kvc_status::Ok);
    let records: &[kvc_event] = &records[..got];
    assert!(!records.is_empty() && records[0].event_seq > 0, "the drain starts after a gap");
    assert!(records.iter().all(|r| r.step_index == 0), "every batch belongs to step 0");
    for w in records.windows(2) {
        let (a, b) = (w[0].event_seq, w[1].event_seq);
        assert!(b == a || b == a + 1, "kept batches follow on: {a} then {b}");
    }
    // SAFETY: from kvc_engine_new, freed once.
    unsafe { kvc_engine_free(e) };
}
