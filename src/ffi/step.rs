//! Steps, block copies, events as flat records, eviction and counters.
//!
//! The records themselves (`kvc_event`, `kvc_block_copy`) and their
//! conversion live in `records.rs`, below the engine handle that keeps them
//! between calls; this file hands them out.

use bytemuck::{Pod, Zeroable};

use crate::engine::Engine;
use crate::resources::Counters;

use super::boundary::{ffi_boundary, fill_or_query, try_out, try_slice_out, with_engine};
use super::handle::kvc_engine;
use super::records::{block_copy_records, flatten_batch, kvc_block_copy, kvc_event};
use super::status::kvc_status;

/// Engine counters and gauges. Counters are monotonic since creation.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct kvc_counters {
    /// Requests admitted (dummy ones included).
    pub requests_admitted: u64,
    /// Admissions refused: every `kvc_engine_add_request` that failed, except
    /// for a NULL or misaligned `engine`, `KVC_STATUS_ENGINE_BUSY` and
    /// `KVC_STATUS_POISONED` (those never reach the engine).
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
    /// Closed event batches dropped unread, or only partly drained, because
    /// `kvc_config.event_batches_max` were waiting when a step closed another.
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

/// The engine's counters and gauges as the C record; `held_dropped` counts
/// the batches the handle dropped (see `HeldBatches`). Both sides are
/// spelled out without `..`: a counter added to [`Counters`] or a field added
/// to `kvc_counters` fails to compile here until the other side has it.
fn counters_record(engine: &Engine, held_dropped: u64) -> kvc_counters {
    let Counters {
        requests_admitted,
        requests_rejected,
        tokens_cached,
        tokens_uncached,
        blocks_evicted_device,
        blocks_offloaded,
        blocks_onboarded,
        blocks_evicted_host,
        blocks_partially_reused,
        hint_hits,
        hint_misses,
        hint_evictions,
        hint_conflicts,
        hint_oversized,
        events_emitted,
        event_batches_dropped,
    } = engine.counters();
    let (cached_device, cached_host) = engine.blocks_cached();
    kvc_counters {
        requests_admitted,
        requests_rejected,
        tokens_cached,
        tokens_uncached,
        blocks_evicted_device,
        blocks_offloaded,
        blocks_onboarded,
        blocks_evicted_host,
        blocks_partially_reused,
        hint_hits,
        hint_misses,
        hint_evictions,
        hint_conflicts,
        hint_oversized,
        events_emitted,
        event_batches_dropped: event_batches_dropped + held_dropped,
        requests_live: engine.requests_live() as u64,
        blocks_free_device: engine.blocks_free_device() as u64,
        blocks_cached_device: cached_device as u64,
        blocks_cached_host: cached_host as u64,
        step_index: engine.step_index(),
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
            st.held.absorb(&mut st.engine);
            st.gpu.set_pending(&copies);
            st.copies.clear();
            st.copies.extend(block_copy_records(&copies));
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
/// once. Only events of closed steps are drainable. Records not taken stay in
/// their batch, which counts against `kvc_config.event_batches_max` until
/// its last record is taken: however the caller drains, the engine holds at
/// most that many closed batches.
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
            st.held.absorb(&mut st.engine);
            let mut n = 0;
            while n < dst.len() {
                let Some(front) = st.held.batches.front_mut() else { break };
                let records = front.records.get_or_insert_with(|| flatten_batch(&front.batch));
                let rest = &records[front.records_taken..];
                let take = rest.len().min(dst.len() - n);
                for (d, e) in dst[n..n + take].iter_mut().zip(rest) {
                    d.write(*e);
                }
                n += take;
                front.records_taken += take;
                if front.records_taken == records.len() {
                    st.held.batches.pop_front();
                }
            }
            out.write(n);
            Ok(())
        })
    })
}

/// `*n_out` receives the number of event records ready to drain. Counting
/// moves and copies nothing.
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
            st.held.absorb(&mut st.engine);
            out.write(st.held.records_pending());
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
            out.write(counters_record(&st.engine, st.held.dropped));
            Ok(())
        })
    })
}
