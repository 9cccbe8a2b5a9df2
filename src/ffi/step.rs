//! Steps, block copies, events as flat records, eviction and counters.
//!
//! Events cross as fixed-size, pointer-free `kvc_event` records (`bytemuck`
//! `Pod`): one record per block of a `BlockStored` or `BlockRemoved` event,
//! one for `AllBlocksCleared`. Records of one event share `event_seq` and
//! count `block_index` up from 0 to `block_count - 1`, so a C++ consumer can
//! `memcpy` them, regroup them, and never free anything. The token ids and
//! image details of a stored block are not in the records; they are what the
//! wire encoding is for.

use bytemuck::{Pod, Zeroable};

use crate::events::{EventBatch, KvEvent, Tier};
use crate::keys::BlockKey;
use crate::resources::{PageRef, copy_waves};

use super::boundary::{ffi_boundary, try_out, try_slice_out, with_engine};
use super::handle::kvc_engine;
use super::status::{Failure, kvc_status};

/// A KV tier.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvc_medium {
    /// No tier (an `AllBlocksCleared` record).
    None = 0,
    /// Device memory.
    Gpu = 1,
    /// The pinned host tier.
    Cpu = 2,
}

impl From<Tier> for kvc_medium {
    fn from(m: Tier) -> Self {
        match m {
            Tier::Device => kvc_medium::Gpu,
            Tier::Host => kvc_medium::Cpu,
        }
    }
}

/// What a `kvc_event` record reports.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvc_event_kind {
    /// A block became cached (advertised) in `medium`.
    BlockStored = 1,
    /// A block stopped being cached in `medium`.
    BlockRemoved = 2,
    /// Every cached block was dropped.
    AllBlocksCleared = 3,
}

/// `kvc_event.flags`: the record has a parent hash.
pub const KVC_EVENT_FLAG_HAS_PARENT: u32 = 1;
/// `kvc_event.flags`: the record has a LoRA id.
pub const KVC_EVENT_FLAG_HAS_LORA_ID: u32 = 2;

/// One block of one KV event: a fixed-size record without pointers.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct kvc_event {
    /// A `kvc_event_kind` value.
    pub kind: u32,
    /// A `kvc_medium` value.
    pub medium: u32,
    /// The event's sequence number (monotonic per engine, shared by the event's records).
    pub event_seq: u64,
    /// The step that closed the event.
    pub step_index: u64,
    /// The block's 64-bit wire hash (first 8 bytes of its key, big-endian, signed).
    pub block_hash: i64,
    /// The wire hash of the block's parent, when `flags` has `KVC_EVENT_FLAG_HAS_PARENT`.
    pub parent_hash: i64,
    /// Index of this block within its event.
    pub block_index: u32,
    /// Blocks in the event.
    pub block_count: u32,
    /// Tokens in the block (stored blocks; 0 otherwise).
    pub token_count: u32,
    /// Image runs inside this block (stored blocks; 0 otherwise).
    pub image_run_count: u32,
    /// Image items in the whole event (stored events; 0 otherwise).
    pub image_count: u32,
    /// `KVC_EVENT_FLAG_*` bits.
    pub flags: u32,
    /// The chain's LoRA id, when `flags` has `KVC_EVENT_FLAG_HAS_LORA_ID`.
    pub lora_id: u32,
    /// Zero; keeps the record free of padding.
    pub reserved: u32,
    /// The block's full 32-byte key.
    pub block_key: [u8; 32],
    /// The parent's full key (zero when there is no parent).
    pub parent_key: [u8; 32],
}

/// A copy between two pages that the caller performs before the next forward
/// pass (offload, onboard, partial reuse).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct kvc_block_copy {
    /// Source tier (`kvc_medium`).
    pub src_medium: u32,
    /// Source page within its tier.
    pub src_page: u32,
    /// Destination tier (`kvc_medium`).
    pub dst_medium: u32,
    /// Destination page within its tier.
    pub dst_page: u32,
    /// Leading tokens to copy: the whole block, or a prefix for partial reuse.
    pub tokens: u32,
    /// The copy's wave, counting from 0. Copies of one wave touch no page
    /// another copy of that wave writes, so each wave may run as one batched
    /// launch; run the waves in increasing order.
    pub wave: u32,
}

/// Engine counters and gauges. Counters are monotonic since creation.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct kvc_counters {
    /// Requests admitted (dummy ones included).
    pub requests_admitted: u64,
    /// Requests the engine refused.
    pub requests_rejected: u64,
    /// Prompt tokens matched in the prefix cache.
    pub tokens_cached: u64,
    /// Prompt tokens that had to be computed.
    pub tokens_uncached: u64,
    /// Blocks evicted from the device (dropped or offloaded).
    pub blocks_evicted_device: u64,
    /// Blocks offloaded to the host tier.
    pub blocks_offloaded: u64,
    /// Blocks onboarded from the host tier.
    pub blocks_onboarded: u64,
    /// Blocks dropped from the host tier.
    pub blocks_evicted_host: u64,
    /// Blocks given fresh with a partial prefix copied in.
    pub blocks_partially_reused: u64,
    /// Routing-hint lookups that found an unambiguous UUID.
    pub hint_hits: u64,
    /// Routing-hint lookups that found none.
    pub hint_misses: u64,
    /// Routing hints evicted by the table's bound.
    pub hint_evictions: u64,
    /// Digest/UUID pairs that contradicted an earlier pair.
    pub hint_conflicts: u64,
    /// UUIDs ignored as routing hints for being longer than 256 bytes.
    pub hint_oversized: u64,
    /// Events produced.
    pub events_emitted: u64,
    /// Closed event batches dropped unread (`kvc_config.event_batches_max`).
    pub event_batches_dropped: u64,
    /// Gauge: requests alive now.
    pub requests_live: u64,
    /// Gauge: free device blocks now.
    pub blocks_free_device: u64,
    /// Gauge: cached device blocks now.
    pub blocks_cached_device: u64,
    /// Gauge: cached host blocks now.
    pub blocks_cached_host: u64,
    /// Gauge: index of the next step to close.
    pub step_index: u64,
}

/// Copies all of `src` into `dst`, or only reports the size when the caller
/// passed a NULL buffer (`query`), or fails when `dst` is too small.
pub(crate) fn fill_or_query<T: Copy>(
    dst: &mut [std::mem::MaybeUninit<T>],
    query: bool,
    src: &[T],
    what: &str,
) -> Result<(), Failure> {
    if query {
        return Ok(());
    }
    if dst.len() < src.len() {
        return Err(Failure::new(
            kvc_status::BufferTooSmall,
            format!("the {what} has {} entries; the buffer holds {}", src.len(), dst.len()),
        ));
    }
    for (d, s) in dst.iter_mut().zip(src) {
        d.write(*s);
    }
    Ok(())
}

fn page_medium(p: PageRef) -> u32 {
    kvc_medium::from(p.medium) as u32
}

/// Flattens closed batches into records, appended to `out`.
pub(crate) fn flatten_batches(batches: Vec<EventBatch>, out: &mut impl Extend<kvc_event>) {
    for batch in batches {
        for event in batch.events {
            let base = kvc_event { event_seq: event.event_seq(), step_index: batch.step_index, ..Zeroable::zeroed() };
            match event {
                KvEvent::BlockStored(e) => {
                    let lora = e.lora_id.map_or((0, 0), |id| (KVC_EVENT_FLAG_HAS_LORA_ID, id));
                    let count = e.keys.len() as u32;
                    out.extend(e.keys.iter().enumerate().map(|(i, key)| {
                        let parent: Option<BlockKey> = if i == 0 { e.parent } else { Some(e.keys[i - 1]) };
                        kvc_event {
                            kind: kvc_event_kind::BlockStored as u32,
                            medium: kvc_medium::from(e.medium) as u32,
                            block_hash: key.wire_hash().0,
                            parent_hash: parent.map_or(0, |p| p.wire_hash().0),
                            block_index: i as u32,
                            block_count: count,
                            token_count: e.block_size,
                            image_run_count: e.block_images.get(i).map_or(0, |r| r.len() as u32),
                            image_count: e.images.len() as u32,
                            flags: lora.0 | if parent.is_some() { KVC_EVENT_FLAG_HAS_PARENT } else { 0 },
                            lora_id: lora.1,
                            block_key: key.0,
                            parent_key: parent.map_or([0; 32], |p| p.0),
                            ..base
                        }
                    }));
                }
                KvEvent::BlockRemoved(e) => {
                    let count = e.keys.len() as u32;
                    out.extend(e.keys.iter().enumerate().map(|(i, key)| kvc_event {
                        kind: kvc_event_kind::BlockRemoved as u32,
                        medium: kvc_medium::from(e.medium) as u32,
                        block_hash: key.wire_hash().0,
                        block_index: i as u32,
                        block_count: count,
                        block_key: key.0,
                        ..base
                    }));
                }
                KvEvent::AllBlocksCleared(_) => {
                    out.extend([kvc_event { kind: kvc_event_kind::AllBlocksCleared as u32, block_count: 1, ..base }])
                }
            }
        }
    }
}

/// Closes the step: the block copies its allocations queued are kept on the
/// engine (read them with `kvc_engine_block_copies` and perform them, wave by
/// wave, before the next forward pass), and its events become drainable.
/// `*copies_out` receives the number of copies.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`; `KVC_STATUS_PANIC`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `copies_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_step(engine: *mut kvc_engine, copies_out: *mut usize) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(copies_out);
            let copies = st.engine.step();
            st.gpu.set_pending(&copies);
            let wave_ends = copy_waves(&copies);
            st.copies.clear();
            st.copies.extend(copies.iter().enumerate().map(|(i, c)| kvc_block_copy {
                src_medium: page_medium(c.src),
                src_page: c.src.page,
                dst_medium: page_medium(c.dst),
                dst_page: c.dst.page,
                tokens: c.tokens,
                wave: wave_ends.partition_point(|end| *end <= i) as u32,
            }));
            out.write(st.copies.len());
            Ok(())
        })
    })
}

/// Copies the block copies of the last closed step into `copies`; `*n_out`
/// receives their number. They stay readable until the next
/// `kvc_engine_step`. With `copies` NULL and `len` 0 only the number is
/// reported; a smaller non-NULL buffer fails with
/// `KVC_STATUS_BUFFER_TOO_SMALL` and writes nothing.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT`; `KVC_STATUS_BUFFER_TOO_SMALL`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `copies` is valid for writing `len`
/// records (or NULL with `len` 0); `n_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_block_copies(
    engine: *mut kvc_engine,
    copies: *mut kvc_block_copy,
    len: usize,
    n_out: *mut usize,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(n_out);
            let dst = try_slice_out!(copies, len);
            fill_or_query(dst, copies.is_null(), &st.copies, "block copy list")?;
            out.write(st.copies.len());
            Ok(())
        })
    })
}

/// Moves up to `len` event records, oldest first, into `events`; `*n_out`
/// receives how many were written. Records not taken stay for the next call,
/// so a fixed buffer drained in a loop until `*n_out` is 0 sees every event
/// once. Only events of closed steps are drainable.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT` (`events` NULL with `len` > 0);
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `events` is valid for writing `len`
/// records (or NULL with `len` 0); `n_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_drain_events(
    engine: *mut kvc_engine,
    events: *mut kvc_event,
    len: usize,
    n_out: *mut usize,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(n_out);
            let dst = try_slice_out!(events, len);
            let batches = st.engine.drain_batches();
            flatten_batches(batches, &mut st.events);
            let n = dst.len().min(st.events.len());
            for (d, e) in dst.iter_mut().zip(st.events.drain(..n)) {
                d.write(e);
            }
            out.write(n);
            Ok(())
        })
    })
}

/// `*n_out` receives the number of event records ready to drain.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `n_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_events_pending(engine: *mut kvc_engine, n_out: *mut usize) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(n_out);
            let batches = st.engine.drain_batches();
            flatten_batches(batches, &mut st.events);
            out.write(st.events.len());
            Ok(())
        })
    })
}

/// Evicts up to `n` unreferenced cached device blocks (oldest first);
/// `*evicted_out` receives how many were evicted.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `evicted_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_evict(engine: *mut kvc_engine, n: usize, evicted_out: *mut usize) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(evicted_out);
            out.write(st.engine.evict(n));
            Ok(())
        })
    })
}

/// Resets the prefix cache: every unreferenced cached block is dropped and an
/// `AllBlocksCleared` event is produced.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_clear(engine: *mut kvc_engine) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            st.engine.clear();
            Ok(())
        })
    })
}

/// Reads the engine's counters and gauges into `*counters_out`.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `counters_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_counters(engine: *mut kvc_engine, counters_out: *mut kvc_counters) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(counters_out);
            let c = st.engine.counters();
            let (cached_device, cached_host) = st.engine.blocks_cached();
            out.write(kvc_counters {
                requests_admitted: c.requests_admitted,
                requests_rejected: c.requests_rejected,
                tokens_cached: c.tokens_cached,
                tokens_uncached: c.tokens_uncached,
                blocks_evicted_device: c.blocks_evicted_device,
                blocks_offloaded: c.blocks_offloaded,
                blocks_onboarded: c.blocks_onboarded,
                blocks_evicted_host: c.blocks_evicted_host,
                blocks_partially_reused: c.blocks_partially_reused,
                hint_hits: c.hint_hits,
                hint_misses: c.hint_misses,
                hint_evictions: c.hint_evictions,
                hint_conflicts: c.hint_conflicts,
                hint_oversized: c.hint_oversized,
                events_emitted: c.events_emitted,
                event_batches_dropped: c.event_batches_dropped,
                requests_live: st.engine.requests_live() as u64,
                blocks_free_device: st.engine.blocks_free_device() as u64,
                blocks_cached_device: cached_device as u64,
                blocks_cached_host: cached_host as u64,
                step_index: st.engine.step_index(),
            });
            Ok(())
        })
    })
}
