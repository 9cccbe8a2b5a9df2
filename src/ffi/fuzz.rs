//! The C API driven as a hostile caller would: the entry point of the
//! `c_api` fuzz target (`fuzz/fuzz_targets/c_api.rs`) and of its seeds under
//! `cargo test` (tests/c_api_fuzz_seeds.rs).
//!
//! It lives here rather than in `kvcore::fuzzing` because only the crate
//! root and this folder may name the C layer (tests/layering.rs); it still
//! calls nothing but the exported functions, with the arguments C could pass.
//!
//! The bytes choose a configuration (extremes included) and then a sequence
//! of calls with arbitrary arguments: issued, stale and forged ids, NULL
//! buffers with lengths, short and odd-sized buffers, invalid UTF-8, image
//! items of every content kind, publisher endpoints good and bad. After
//! every call the driver checks, and panics (a finding) otherwise, that:
//!
//! 1. the status is one that the function's own comment in `include/kvcore.h`
//!    lists (parsed from the header), and never `KVC_STATUS_PANIC` or
//!    `KVC_STATUS_POISONED`;
//! 2. an `_out` value is unchanged when the call failed;
//! 3. the engine's invariants hold (`Engine::check_invariants`);
//! 4. what the handle holds stays within the configured bounds: at most
//!    `event_batches_max` closed batches on the handle and as many in the
//!    engine, the open step's events below `events_per_step_max` block
//!    entries and its copies at most `copies_per_step_max`, at most
//!    `requests_max` live requests, drains within the caller's buffer, and
//!    every wire payload handed out decodes.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, c_char};
use std::ptr;
use std::sync::OnceLock;

use bytemuck::Zeroable;

use crate::events::codec::decode_payload;

use super::handle::kvc_engine;
use super::lifecycle::{
    KVC_CONFIG_BLOCKS_DEVICE_LIMIT, KVC_CONFIG_BLOCKS_HOST_LIMIT, KVC_CONFIG_EVENT_BATCHES_LIMIT,
    KVC_CONFIG_MM_ITEMS_LIMIT, KVC_CONFIG_REQUESTS_LIMIT, KVC_CONFIG_ROUTING_HINTS_LIMIT, kvc_config,
    kvc_config_default, kvc_engine_free, kvc_engine_last_error, kvc_engine_model_info, kvc_engine_new,
    kvc_group_config,
};
use super::publisher::{
    kvc_engine_drain_events_wire, kvc_engine_publisher_endpoint, kvc_engine_publisher_start,
    kvc_engine_publisher_stats, kvc_engine_publisher_stop, kvc_publisher_config, kvc_publisher_config_default,
    kvc_publisher_stats,
};
use super::records::{kvc_block_copy, kvc_event};
use super::request::{
    kvc_admission, kvc_bytes, kvc_engine_add_request, kvc_engine_block_table, kvc_engine_block_table_group,
    kvc_engine_cancel, kvc_engine_commit, kvc_engine_finish, kvc_engine_group_usage, kvc_engine_grow,
    kvc_engine_request_info, kvc_engine_request_uuids, kvc_group_usage, kvc_image_item, kvc_request, kvc_request_info,
    kvc_token_run, kvc_uuid_entry, kvc_uuid_list,
};
use super::status::kvc_status;
use super::step::{
    kvc_counters, kvc_engine_block_copies, kvc_engine_clear, kvc_engine_counters, kvc_engine_drain_events,
    kvc_engine_events_pending, kvc_engine_evict, kvc_engine_step,
};

/// What one run did, for the seed tests to check that the seeds reach the
/// calls they are meant to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallTally {
    /// Whether `kvc_engine_new` accepted the configuration.
    pub engine_built: bool,
    /// Calls made, by function name, with the statuses they returned.
    pub calls: BTreeMap<&'static str, BTreeMap<String, u32>>,
}

impl CallTally {
    /// How many calls of `function` returned `status` (e.g. "OK").
    pub fn count(&self, function: &str, status: &str) -> u32 {
        self.calls.get(function).and_then(|s| s.get(status)).copied().unwrap_or(0)
    }
}

/// Reads values from the fuzz bytes; `done` once they are used up.
struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Bytes<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    /// True for one byte value in `n`.
    fn one_in(&mut self, n: u8) -> bool {
        self.u8().is_multiple_of(n)
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    /// Small most of the time, an extreme or anything otherwise.
    fn size(&mut self) -> usize {
        match self.u8() % 8 {
            0..=4 => usize::from(self.u8() % 24),
            5 => usize::from(self.u8()),
            6 => [0, 1, 4096, usize::MAX / 64, usize::MAX][usize::from(self.u8() % 5)],
            _ => self.u32() as usize,
        }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }
}

/// The status names (`OK`, `NULL_ARGUMENT`, ...) each function's comment in
/// the header lists after "Returns", by function name.
fn documented_statuses() -> &'static BTreeMap<String, BTreeSet<String>> {
    static TABLE: OnceLock<BTreeMap<String, BTreeSet<String>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let header = include_str!("../../include/kvcore.h");
        let mut table = BTreeMap::new();
        let mut doc = String::new();
        for line in header.lines() {
            if line.trim_start().starts_with("/**") {
                doc.clear();
            }
            doc.push_str(line);
            doc.push('\n');
            // A declaration starts unindented with its return type, then the name.
            let is_decl = !line.starts_with([' ', '#', '*', '/', '}']) && !line.starts_with("typedef");
            let Some(name) = line.split(" kvc_").nth(1).and_then(|rest| rest.split_once('(')).map(|(n, _)| n) else {
                continue;
            };
            if !is_decl {
                continue;
            }
            let returns = doc.find("Returns").map_or("", |at| &doc[at..]);
            let names = returns
                .split("KVC_STATUS_")
                .skip(1)
                .map(|s| s.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit()))
                .map(|s| s.collect::<String>().trim_end_matches('_').to_owned())
                .collect();
            table.insert(format!("kvc_{name}"), names);
        }
        table
    })
}

/// The header's name of a status, without the prefix (`UNKNOWN_ID`).
fn status_name(status: kvc_status) -> String {
    let mut out = String::new();
    for (i, ch) in format!("{status:?}").chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

/// The driver's state: the engine and what it has seen.
struct Run {
    engine: *mut kvc_engine,
    config: kvc_config,
    ids: Vec<u64>,
    log: CallTally,
    /// `KVC_FUZZ_TRACE` set: every call and its status go to stderr, to
    /// replay a finding.
    trace: bool,
}

impl Run {
    /// Check 1: `status` is documented for `function` and is no panic.
    fn check(&mut self, function: &'static str, status: kvc_status) -> bool {
        let name = status_name(status);
        let documented = documented_statuses().get(function).unwrap_or_else(|| panic!("{function} is in the header"));
        assert!(
            !matches!(status, kvc_status::Panic | kvc_status::Poisoned),
            "{function} returned {name}: {}",
            self.last_error()
        );
        assert!(
            documented.contains(&name),
            "{function} returned {name}, which its comment does not list: {documented:?}"
        );
        if self.trace {
            eprintln!("{function} -> {name}");
        }
        *self.log.calls.entry(function).or_default().entry(name).or_default() += 1;
        status == kvc_status::Ok
    }

    fn last_error(&self) -> String {
        if self.engine.is_null() {
            return String::new();
        }
        let mut buf = [0 as c_char; 512];
        let mut n = 0usize;
        // SAFETY: live engine; 512-byte buffer; `n` writable.
        unsafe { kvc_engine_last_error(self.engine, buf.as_mut_ptr(), buf.len(), &mut n) };
        buf[..n.min(511)].iter().map(|c| *c as u8 as char).collect()
    }

    /// Checks 3 and 4 on the state behind the handle.
    fn check_engine(&self) {
        // SAFETY: live engine from `kvc_engine_new`; no call is running on it.
        let handle = unsafe { &*self.engine };
        let state = handle.state.lock().expect("the handle's lock is never poisoned");
        state.engine.check_invariants();
        let max = self.config.event_batches_max as usize;
        assert!(state.held.batches.len() <= max, "{} batches held, max {max}", state.held.batches.len());
        let engine = &state.engine;
        assert!(engine.batches_waiting() <= max, "{} batches in the engine, max {max}", engine.batches_waiting());
        let (entries, entries_max) = (engine.open_event_entries(), engine.config().events_per_step_max());
        assert!(entries < entries_max, "{entries} entries in the open step, max {entries_max}");
        let (copies, copies_max) = (engine.copies_queued(), engine.config().copies_per_step_max());
        assert!(copies <= copies_max, "{copies} copies queued, max {copies_max}");
        assert!(state.engine.requests_live() <= self.config.requests_max as usize, "live requests past requests_max");
        assert!(!state.poisoned, "the engine is poisoned");
    }

    /// An id to call with: issued ones (live or stale), their neighbours in
    /// generation, and anything.
    fn id(&self, b: &mut Bytes<'_>) -> u64 {
        let pick = b.u8();
        let issued = if self.ids.is_empty() { 0 } else { self.ids[usize::from(b.u8()) % self.ids.len()] };
        match pick % 8 {
            0..=4 => issued,
            5 => issued.wrapping_sub(1 << 32),
            6 => issued.wrapping_add(1 << 32),
            _ => b.u64(),
        }
    }
}

/// A buffer of `T` and the pointer and length to pass for it: NULL with 0
/// (a size query), NULL with a length, or a real buffer of some size.
fn buffer<T: Clone>(b: &mut Bytes<'_>, fill: T) -> (Vec<T>, bool, usize) {
    match b.u8() % 6 {
        0 => (Vec::new(), true, 0),
        1 => (Vec::new(), true, b.size().max(1)),
        _ => {
            let n = b.size().min(4096);
            (vec![fill; n], false, n)
        }
    }
}

fn ptr_of<T>(v: &mut [T], null: bool) -> *mut T {
    if null { ptr::null_mut() } else { v.as_mut_ptr() }
}

/// A configuration from the bytes: each field kept at its default, set to a
/// small value or to an extreme (0, a limit and past it, `u32::MAX`). The
/// fields whose limit reserves hundreds of MiB are never set to the limit
/// itself, only past it (tests of `kvc_engine_new` cover the limits).
///
/// One configuration in eight whose offload flag byte has its bits 1..=3 set
/// describes KV cache groups (`groups` points into `store`): most of them a
/// valid hybrid configuration (full attention and sliding windows, totals
/// the sums), the rest anything (kinds, windows, pages and totals from the
/// bytes, a NULL list with a length).
fn config(b: &mut Bytes<'_>, store: &mut Vec<kvc_group_config>) -> kvc_config {
    let mut c = default_config();
    c.block_size_tokens = 4;
    c.blocks_device = 16;
    let fields: [(&mut u32, u32, bool); 11] = [
        (&mut c.block_size_tokens, 1024, true),
        (&mut c.blocks_device, KVC_CONFIG_BLOCKS_DEVICE_LIMIT, false),
        (&mut c.blocks_host, KVC_CONFIG_BLOCKS_HOST_LIMIT, false),
        (&mut c.image_placeholder_token_id, u32::MAX, true),
        (&mut c.requests_max, KVC_CONFIG_REQUESTS_LIMIT, false),
        (&mut c.tokens_per_request_max, u32::MAX, true),
        (&mut c.mm_items_max, KVC_CONFIG_MM_ITEMS_LIMIT, false),
        (&mut c.mm_items_per_request_max, 64, true),
        (&mut c.runs_per_item_max, u32::MAX, true),
        (&mut c.routing_hints_max, KVC_CONFIG_ROUTING_HINTS_LIMIT, false),
        (&mut c.event_batches_max, KVC_CONFIG_EVENT_BATCHES_LIMIT, true),
    ];
    for (field, limit, limit_is_cheap) in fields {
        match b.u8() % 8 {
            0..=3 => {}
            4 | 5 => *field = u32::from(b.u8() % 48),
            6 => *field = [0, 1, 2, limit.saturating_add(1), u32::MAX][usize::from(b.u8() % 5)],
            _ if limit_is_cheap => *field = limit,
            _ => *field = limit.saturating_add(1),
        }
    }
    c.kv_transfer_role = if b.one_in(16) { u32::from(b.u8()) } else { 0 };
    c.block_reuse = !b.one_in(8);
    c.kv_events = !b.one_in(8);
    c.partial_reuse = b.bool();
    let flags = b.u8();
    c.offload_first = flags & 1 == 1;
    if (flags >> 1) & 7 == 7 {
        groups(b, &mut c, store);
    }
    c.model_image_capable = b.bool();
    c.model_type = match b.u8() % 4 {
        0 => ptr::null(),
        1 => c"qwen3_vl".as_ptr(),
        2 => c"\xff\xfe".as_ptr(),
        _ => c"".as_ptr(),
    };
    c.kv_events_endpoint = match b.u8() % 4 {
        0 | 1 => ptr::null(),
        2 => c"inproc://kvcore-fuzz".as_ptr(),
        _ => c"tcp://127.0.0.1:70000".as_ptr(),
    };
    c
}

/// Fills `store` with the groups the bytes describe and points `c` at them.
fn groups(b: &mut Bytes<'_>, c: &mut kvc_config, store: &mut Vec<kvc_group_config>) {
    let n = 1 + usize::from(b.u8() % 4);
    if b.one_in(4) {
        for _ in 0..usize::from(b.u8() % 20) {
            store.push(kvc_group_config {
                kind: u32::from(b.u8() % 3),
                window_tokens: [0, 1, 4, 33, u32::MAX][usize::from(b.u8() % 5)],
                blocks_device: u32::from(b.u8() % 24),
                blocks_host: u32::from(b.u8() % 8),
            });
        }
        c.blocks_device = store.iter().map(|g| g.blocks_device).fold(0, u32::wrapping_add);
        if b.one_in(3) {
            c.blocks_device = c.blocks_device.wrapping_add(1);
        }
    } else {
        for i in 0..n {
            store.push(kvc_group_config {
                kind: u32::from(i > 0),
                window_tokens: if i > 0 { 1 + u32::from(b.u8() % 40) } else { 0 },
                blocks_device: 2 + u32::from(b.u8() % 16),
                blocks_host: u32::from(b.u8() % 4),
            });
        }
        c.blocks_device = store.iter().map(|g| g.blocks_device).sum();
        c.blocks_host = store.iter().map(|g| g.blocks_host).sum();
        c.partial_reuse = false;
    }
    c.groups = if b.one_in(16) { ptr::null() } else { store.as_ptr() };
    c.groups_len = store.len();
}

/// The default configuration as `kvc_config_default` writes it.
fn default_config() -> kvc_config {
    let mut c = std::mem::MaybeUninit::<kvc_config>::uninit();
    // SAFETY: `c` is valid for one write.
    assert_eq!(unsafe { kvc_config_default(c.as_mut_ptr()) }, kvc_status::Ok);
    // SAFETY: written by the successful call.
    unsafe { c.assume_init() }
}

/// The storage behind one `kvc_request` built from the bytes.
#[derive(Default)]
struct RequestParts {
    tokens: Vec<u32>,
    strings: Vec<Vec<u8>>,
    runs: Vec<Vec<kvc_token_run>>,
    items: Vec<kvc_image_item>,
    uuids: Vec<kvc_bytes>,
}

/// A non-NULL pointer for the empty string (`{p, 0}` is empty, not absent).
static EMPTY: [u8; 1] = [0];

/// Optional bytes: absent, NULL with a length, or some (maybe invalid UTF-8,
/// maybe long) bytes kept in `store`.
fn optional_bytes(b: &mut Bytes<'_>, store: &mut Vec<Vec<u8>>) -> kvc_bytes {
    match b.u8() % 8 {
        0..=3 => kvc_bytes { ptr: ptr::null(), len: 0 },
        4 => kvc_bytes { ptr: ptr::null(), len: b.size().max(1) },
        5 => {
            store.push(vec![b'u'; 300]);
            kvc_bytes { ptr: store.last().expect("just pushed").as_ptr(), len: 300 }
        }
        _ => {
            let n = usize::from(b.u8() % 12);
            store.push(b.bytes(n));
            let s = store.last().expect("just pushed");
            kvc_bytes { ptr: if s.is_empty() { EMPTY.as_ptr() } else { s.as_ptr() }, len: s.len() }
        }
    }
}

/// A request from the bytes; its pointers point into `parts`.
fn request(b: &mut Bytes<'_>, parts: &mut RequestParts) -> kvc_request {
    let n = match b.u8() % 8 {
        0 => 0,
        1 => 64 + usize::from(b.u8()),
        _ => usize::from(b.u8() % 40),
    };
    // Few distinct tokens, so that prompts share prefixes.
    let alphabet = 1 + u32::from(b.u8() % 4);
    parts.tokens = (0..n).map(|_| u32::from(b.u8()) % alphabet).collect();
    let items = if b.one_in(4) { usize::from(b.u8() % 4) } else { 0 };
    let mut kinds = Vec::new();
    for _ in 0..items {
        let runs: Vec<kvc_token_run> = (0..1 + b.u8() % 3)
            .map(|_| kvc_token_run { start: u32::from(b.u8() % 48), len: u32::from(b.u8() % 12) })
            .collect();
        parts.runs.push(runs);
        // Bytes, digest, device (refused: no GPU is open), and unknown kinds.
        let kind = [0, 1, 0, 2, 9][usize::from(b.u8() % 5)];
        kinds.push(kind);
        let content_len = if kind == 1 && !b.one_in(4) { 32 } else { usize::from(b.u8() % 40) };
        parts.strings.push(b.bytes(content_len));
    }
    for (i, runs) in parts.runs.iter().enumerate() {
        let content = &parts.strings[i];
        parts.items.push(kvc_image_item {
            content_kind: kinds[i],
            content: if content.is_empty() { ptr::null() } else { content.as_ptr() },
            content_len: content.len(),
            runs: runs.as_ptr(),
            runs_len: runs.len(),
        });
    }
    let with_uuids = b.one_in(3);
    let mut extra = Vec::new();
    if with_uuids {
        let count = if b.one_in(8) { items + 1 } else { items };
        for _ in 0..count {
            let u = optional_bytes(b, &mut extra);
            parts.uuids.push(u);
        }
    }
    let lora_name = optional_bytes(b, &mut extra);
    let cache_salt = optional_bytes(b, &mut extra);
    parts.strings.extend(extra);
    let null_tokens = b.one_in(16);
    kvc_request {
        tokens: if null_tokens || parts.tokens.is_empty() { ptr::null() } else { parts.tokens.as_ptr() },
        tokens_len: if null_tokens { b.size().max(1) } else { parts.tokens.len() },
        lora_id: u32::from(b.u8() % 3),
        has_lora_id: b.bool(),
        dummy: b.one_in(8),
        lora_name,
        cache_salt,
        items: if parts.items.is_empty() { ptr::null() } else { parts.items.as_ptr() },
        items_len: parts.items.len(),
        uuids: if with_uuids && !parts.uuids.is_empty() { parts.uuids.as_ptr() } else { ptr::null() },
        uuids_len: if with_uuids { parts.uuids.len() } else { 0 },
    }
}

/// Sentinel for `_out` values: a failed call must leave it.
const UNTOUCHED: usize = 0xA5A5_A5A5;

/// Runs the calls the bytes describe (see the module doc); panics on a
/// finding. Returns what was called, for the seed tests.
pub fn c_api_calls(data: &[u8]) -> CallTally {
    let mut b = Bytes { data, pos: 0 };
    // The group list the config points to; kvc_engine_new copies it, and it
    // lives as long as the run anyway.
    let mut group_store = Vec::new();
    let config = config(&mut b, &mut group_store);
    let trace = std::env::var_os("KVC_FUZZ_TRACE").is_some();
    let mut run = Run { engine: ptr::null_mut(), config, ids: Vec::new(), log: CallTally::default(), trace };
    if trace {
        eprintln!("{config:?}");
    }
    let mut engine = ptr::null_mut();
    // SAFETY: `config` is valid, its strings NULL or static; `engine` writable.
    let status = unsafe { kvc_engine_new(&config, &mut engine) };
    if !run.check("kvc_engine_new", status) {
        assert!(engine.is_null(), "engine_out written on failure");
        return run.log;
    }
    run.engine = engine;
    run.log.engine_built = true;
    let mut ops = 0;
    while !b.done() && ops < 512 {
        ops += 1;
        step(&mut run, &mut b);
        run.check_engine();
    }
    // SAFETY: from kvc_engine_new, freed once.
    unsafe { kvc_engine_free(run.engine) };
    run.log
}

/// One call chosen by the bytes.
fn step(run: &mut Run, b: &mut Bytes<'_>) {
    let e = run.engine;
    let mut n = UNTOUCHED;
    match b.u8() % 20 {
        0..=3 => {
            let mut parts = RequestParts::default();
            let r = request(b, &mut parts);
            let mut a = kvc_admission { request_id: 7, tokens_cached: 7, tokens_onboarded: 7 };
            if run.trace {
                eprintln!("tokens {:?} items {} dummy {}", parts.tokens, parts.items.len(), r.dummy);
            }
            // SAFETY: live engine; every pointer in `r` is NULL or into `parts`, with its length.
            let status = unsafe { kvc_engine_add_request(e, &r, &mut a) };
            if run.check("kvc_engine_add_request", status) {
                run.ids.push(a.request_id);
            } else {
                assert_eq!(a, kvc_admission { request_id: 7, tokens_cached: 7, tokens_onboarded: 7 });
            }
        }
        4 => {
            let id = run.id(b);
            let tokens: Vec<u32> = (0..usize::from(b.u8() % 12)).map(|_| u32::from(b.u8() % 3)).collect();
            let null = b.one_in(8);
            let (p, len) = if null { (ptr::null(), b.size()) } else { (tokens.as_ptr(), tokens.len()) };
            // SAFETY: live engine; `p` is NULL or `tokens` with its length.
            let status = unsafe { kvc_engine_grow(e, id, p, len) };
            run.check("kvc_engine_grow", status);
        }
        5 | 6 => {
            let id = run.id(b);
            let count = match b.u8() % 4 {
                0 => b.u64(),
                _ => u64::from(b.u8() % 48),
            };
            if run.trace {
                eprintln!("commit {id:#x} {count}");
            }
            // SAFETY: live engine.
            let status = unsafe { kvc_engine_commit(e, id, count) };
            run.check("kvc_engine_commit", status);
        }
        7 => {
            let id = run.id(b);
            if b.bool() {
                // SAFETY: live engine.
                let status = unsafe { kvc_engine_finish(e, id) };
                run.check("kvc_engine_finish", status);
            } else {
                // SAFETY: live engine.
                let status = unsafe { kvc_engine_cancel(e, id) };
                run.check("kvc_engine_cancel", status);
            }
        }
        8 | 9 => {
            // SAFETY: live engine; `n` writable.
            let status = unsafe { kvc_engine_step(e, &mut n) };
            if run.check("kvc_engine_step", status) {
                let (mut buf, null, len) = buffer(b, kvc_block_copy::zeroed());
                let mut m = UNTOUCHED;
                // SAFETY: live engine; `buf` NULL or holding `len` records.
                let status = unsafe { kvc_engine_block_copies(e, ptr_of(&mut buf, null), len, &mut m) };
                if run.check("kvc_engine_block_copies", status) {
                    assert_eq!(m, n, "block_copies reports the step's count");
                } else {
                    assert_eq!(m, UNTOUCHED);
                }
            }
        }
        10 => {
            let (mut buf, null, len) = buffer(b, kvc_event::zeroed());
            // SAFETY: live engine; `buf` NULL or holding `len` records.
            let status = unsafe { kvc_engine_drain_events(e, ptr_of(&mut buf, null), len, &mut n) };
            if run.check("kvc_engine_drain_events", status) {
                assert!(n <= len, "{n} records written into {len}");
            } else {
                assert_eq!(n, UNTOUCHED);
            }
        }
        11 => {
            // SAFETY: live engine; `n` writable.
            let status = unsafe { kvc_engine_events_pending(e, &mut n) };
            run.check("kvc_engine_events_pending", status);
        }
        12 => {
            let (mut buf, null, len) = buffer(b, 0u8);
            // SAFETY: live engine; `buf` NULL or holding `len` bytes.
            let status = unsafe { kvc_engine_drain_events_wire(e, ptr_of(&mut buf, null), len, &mut n) };
            if run.check("kvc_engine_drain_events_wire", status) && !null {
                assert!(n <= len, "{n} bytes written into {len}");
                let mut at = 0;
                while at < n {
                    let size = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
                    decode_payload(&buf[at + 4..at + 4 + size]).expect("a drained payload decodes");
                    at += 4 + size;
                }
                assert_eq!(at, n, "whole payloads only");
            } else if status != kvc_status::Ok {
                assert_eq!(n, UNTOUCHED);
            }
        }
        13 => {
            let id = run.id(b);
            let (mut pages, null, len) = buffer(b, 0u32);
            // SAFETY: live engine; `pages` NULL or holding `len` entries.
            let status = unsafe { kvc_engine_block_table(e, id, ptr_of(&mut pages, null), len, &mut n) };
            run.check("kvc_engine_block_table", status);
            let mut info =
                kvc_request_info { tokens: 1, prompt_len: 2, tokens_computed: 3, tokens_cached: 4, blocks: 5 };
            // SAFETY: live engine; `info` writable.
            let status = unsafe { kvc_engine_request_info(e, id, &mut info) };
            let info_ok = run.check("kvc_engine_request_info", status);
            if info_ok {
                assert!(info.tokens_cached <= info.tokens_computed && info.tokens_computed <= info.tokens);
            }
            // The calls of a hybrid engine, only where one was configured
            // (so that the bytes of the other seeds keep their meaning): a
            // group's table, as long as group 0's, and its usage.
            if run.config.groups_len > 0 {
                let group = u32::from(b.u8() % 6);
                let (mut pages, null, len) = buffer(b, 0u32);
                let mut m = UNTOUCHED;
                // SAFETY: live engine; `pages` NULL or holding `len` entries.
                let status =
                    unsafe { kvc_engine_block_table_group(e, id, group, ptr_of(&mut pages, null), len, &mut m) };
                if run.check("kvc_engine_block_table_group", status) {
                    assert!(!info_ok || m == info.blocks as usize, "every group's table is as long as group 0's");
                } else {
                    assert_eq!(m, UNTOUCHED);
                }
                let mut usage = kvc_group_usage {
                    pages_device: 1,
                    blocks_used_device: 2,
                    blocks_referenced: 3,
                    blocks_cached_device: 4,
                    blocks_cached_host: 5,
                };
                let before = usage;
                // SAFETY: live engine; `usage` writable.
                let status = unsafe { kvc_engine_group_usage(e, group, &mut usage) };
                if run.check("kvc_engine_group_usage", status) {
                    assert!(usage.blocks_referenced <= usage.blocks_used_device, "held blocks are used pages");
                    assert!(usage.blocks_used_device <= usage.pages_device, "used pages exist");
                } else {
                    assert_eq!(usage, before);
                }
            }
        }
        14 => {
            let id = run.id(b);
            let (mut entries, enull, elen) = buffer(b, kvc_uuid_entry { offset: 0, len: 0, present: 0 });
            let (mut bytes, bnull, blen) = buffer(b, 0u8);
            let mut list = kvc_uuid_list { present: 9, count: 9, bytes: 9 };
            // SAFETY: live engine; each buffer NULL or holding its length.
            let status = unsafe {
                kvc_engine_request_uuids(
                    e,
                    id,
                    ptr_of(&mut entries, enull),
                    elen,
                    ptr_of(&mut bytes, bnull),
                    blen,
                    &mut list,
                )
            };
            if !run.check("kvc_engine_request_uuids", status) {
                assert_eq!(list, kvc_uuid_list { present: 9, count: 9, bytes: 9 });
            }
        }
        15 => {
            let count = if b.bool() { usize::from(b.u8()) } else { b.size() };
            // SAFETY: live engine; `n` writable.
            let status = unsafe { kvc_engine_evict(e, count, &mut n) };
            run.check("kvc_engine_evict", status);
            if b.one_in(4) {
                // SAFETY: live engine.
                let status = unsafe { kvc_engine_clear(e) };
                run.check("kvc_engine_clear", status);
            }
        }
        16 => {
            let mut c = kvc_counters::zeroed();
            // SAFETY: live engine; `c` writable.
            let status = unsafe { kvc_engine_counters(e, &mut c) };
            run.check("kvc_engine_counters", status);
            let (mut buf, null, len) = buffer(b, 0 as c_char);
            // SAFETY: live engine; `buf` NULL or holding `len` bytes.
            let status = unsafe { kvc_engine_model_info(e, ptr_of(&mut buf, null), len, &mut n) };
            if run.check("kvc_engine_model_info", status) && !null {
                // SAFETY: on success the document is NUL-terminated within `buf`.
                let doc = unsafe { CStr::from_ptr(buf.as_ptr()) };
                assert_eq!(doc.to_bytes().len(), n);
            }
        }
        17 => {
            let (mut buf, null, len) = buffer(b, 0 as c_char);
            // SAFETY: live engine; `buf` NULL or holding `len` bytes.
            let status = unsafe { kvc_engine_last_error(e, ptr_of(&mut buf, null), len, &mut n) };
            if run.check("kvc_engine_last_error", status) && !null {
                assert!(n < len && buf[n] == 0, "a NUL-terminated message within the buffer");
            }
        }
        _ => publisher(run, b),
    }
}

/// Publisher calls: start with good and bad endpoints and bounds, stop,
/// endpoint, stats.
fn publisher(run: &mut Run, b: &mut Bytes<'_>) {
    let e = run.engine;
    match b.u8() % 4 {
        0 | 1 => {
            let mut pc = std::mem::MaybeUninit::<kvc_publisher_config>::uninit();
            // SAFETY: valid for one write.
            assert_eq!(unsafe { kvc_publisher_config_default(pc.as_mut_ptr()) }, kvc_status::Ok);
            // SAFETY: written by the successful call.
            let mut pc = unsafe { pc.assume_init() };
            pc.endpoint = match b.u8() % 6 {
                0 => ptr::null(),
                1 | 2 => c"inproc://kvcore-fuzz".as_ptr(),
                3 => c"tcp://127.0.0.1:99999".as_ptr(),
                4 => c"".as_ptr(),
                _ => c"tcp://\xff:1".as_ptr(),
            };
            if b.one_in(4) {
                pc.has_data_parallel_rank = true;
                pc.data_parallel_rank = b.u32();
            }
            match b.u8() % 6 {
                0 => pc.send_hwm = [0, -1, i32::MAX][usize::from(b.u8() % 3)],
                1 => pc.queue_capacity = [0, 1, u32::MAX][usize::from(b.u8() % 3)],
                2 => pc.buffer_steps = [0, 1, u32::MAX][usize::from(b.u8() % 3)],
                _ => {}
            }
            pc.buffer_steps = pc.buffer_steps.min(1 << 20);
            // SAFETY: live engine; `pc` holds NULL or static NUL-terminated strings.
            let status = unsafe { kvc_engine_publisher_start(e, &pc) };
            run.check("kvc_engine_publisher_start", status);
        }
        2 => {
            // SAFETY: live engine.
            let status = unsafe { kvc_engine_publisher_stop(e) };
            run.check("kvc_engine_publisher_stop", status);
        }
        _ => {
            let (mut buf, null, len) = buffer(b, 0 as c_char);
            let mut n = UNTOUCHED;
            // SAFETY: live engine; `buf` NULL or holding `len` bytes.
            let status = unsafe { kvc_engine_publisher_endpoint(e, ptr_of(&mut buf, null), len, &mut n) };
            run.check("kvc_engine_publisher_endpoint", status);
            let mut s = std::mem::MaybeUninit::<kvc_publisher_stats>::uninit();
            // SAFETY: live engine; `s` writable.
            let status = unsafe { kvc_engine_publisher_stats(e, s.as_mut_ptr()) };
            run.check("kvc_engine_publisher_stats", status);
        }
    }
}
