//! Eviction and tier moves.
//!
//! Device eviction takes the least recently used unreferenced cached block.
//! With a host tier, the block is offloaded (its KV copied to a host page, its
//! row moved) and routers see `Removed(GPU)` then `Stored(CPU)`; without one,
//! it is dropped and routers see `Removed(GPU)`. A prefix match on a host block
//! onboards it back (`Removed(CPU)`, `Stored(GPU)`). A key lives in one tier at
//! a time, so Stored and Removed balance per key and per tier.

use crate::events::EventQueue;
use crate::ids::BlockId;
use crate::resources::{BlockCopy, Counters, KvCache, PageRef};
use crate::systems::commit::stored_event_for_block;
use crate::tier::Tier;

/// Drops one indexed, unreferenced block of `medium` from the cache entirely.
fn drop_cached_block(cache: &mut KvCache, id: BlockId, events: &mut EventQueue) {
    let b = &mut cache.blocks.rows[id];
    let key = b.key.expect("cached blocks have keys");
    let medium = b.medium;
    b.indexed = false;
    cache.index.map.remove(&key);
    cache.release_row(id);
    events.push_removed(key, medium);
}

/// Evicts the least recently used host block. Returns whether one was evicted.
pub fn evict_host_block(cache: &mut KvCache, events: &mut EventQueue, counters: &mut Counters) -> bool {
    let Some(id) = cache.pool.lru_host.pop_front(&mut cache.blocks.rows) else { return false };
    drop_cached_block(cache, id, events);
    counters.blocks_evicted_host += 1;
    true
}

/// Evicts the least recently used unreferenced device block, offloading it to
/// the host tier when there is one, and leaves its device page free. Returns
/// `None` when no device block is evictable.
///
/// A full host tier drops its least recently used block to take the offload,
/// unless that block was itself offloaded this step (its copy is queued):
/// then the evicted device block is dropped instead, which keeps as many
/// blocks and saves a copy that would be overwritten in the same step.
pub fn evict_device_block(cache: &mut KvCache, events: &mut EventQueue, counters: &mut Counters) -> Option<()> {
    let id = cache.pool.lru_device.pop_front(&mut cache.blocks.rows)?;
    counters.blocks_evicted_device += 1;
    if cache.has_host_tier() {
        if cache.pool.free_host.is_empty() {
            let oldest = cache.pool.lru_host.front().map(|h| cache.blocks.rows[h].page);
            if oldest.is_some_and(|page| !cache.pool.free_host.is_touched(page)) {
                evict_host_block(cache, events, counters);
            }
        }
        if let Some(host_page) = cache.pool.free_host.pop() {
            let b = &mut cache.blocks.rows[id];
            let key = b.key.expect("cached blocks have keys");
            let from = PageRef { medium: Tier::Device, page: b.page };
            let to = PageRef { medium: Tier::Host, page: host_page };
            b.medium = Tier::Host;
            b.page = host_page;
            cache.blocks.move_page((from.medium, from.page), (to.medium, to.page));
            cache.queue_copy(BlockCopy { src: from, dst: to, tokens: cache.block_size });
            cache.pool.free_device.release(from.page);
            cache.pool.lru_host.push_back(&mut cache.blocks.rows, id);
            events.push_removed(key, Tier::Device);
            if events.enabled() {
                events.push_stored(stored_event_for_block(cache, id));
            }
            counters.blocks_offloaded += 1;
            return Some(());
        }
    }
    drop_cached_block(cache, id, events);
    Some(())
}

/// Moves a host block (already out of the host LRU) to a device page and takes
/// one reference on it. Admission has checked that a device page can be had.
pub fn onboard_block(cache: &mut KvCache, id: BlockId, events: &mut EventQueue, counters: &mut Counters) {
    if cache.pool.free_device.is_empty() {
        evict_device_block(cache, events, counters).expect("admission checked that a device page can be had");
    }
    let device_page = cache.pool.free_device.pop().expect("a page is free after eviction");
    let b = &mut cache.blocks.rows[id];
    debug_assert_eq!(b.medium, Tier::Host, "only host blocks are onboarded");
    let key = b.key.expect("cached blocks have keys");
    let from = PageRef { medium: Tier::Host, page: b.page };
    let to = PageRef { medium: Tier::Device, page: device_page };
    b.medium = Tier::Device;
    b.page = device_page;
    b.ref_count = 1;
    cache.blocks.move_page((from.medium, from.page), (to.medium, to.page));
    cache.queue_copy(BlockCopy { src: from, dst: to, tokens: cache.block_size });
    cache.pool.free_host.release(from.page);
    events.push_removed(key, Tier::Host);
    if events.enabled() {
        events.push_stored(stored_event_for_block(cache, id));
    }
    counters.blocks_onboarded += 1;
}

/// Evicts up to `n` unreferenced device blocks, least recently used first.
/// Returns how many were evicted.
pub fn evict_device_blocks(cache: &mut KvCache, n: usize, events: &mut EventQueue, counters: &mut Counters) -> usize {
    (0..n).take_while(|_| evict_device_block(cache, events, counters).is_some()).count()
}
