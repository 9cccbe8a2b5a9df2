//! Rust-side tests of the boundary itself (the C and C++ programs in
//! ffi-tests/ test the surface as C sees it).

use std::ptr;

use super::boundary::with_engine;
use super::handle::*;
use super::request::*;
use super::status::kvc_status;
use super::step::*;

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
        lora_name: kvc_bytes { ptr: ptr::null(), len: 0 },
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
