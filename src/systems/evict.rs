//! Explicit eviction: the caller frees cached device blocks ahead of need.
//!
//! The replacement policy (least recently used first, offload to the host
//! tier or drop, which host block makes room) is the block cache's
//! ([`KvCache::evict_device_block`]), because admission and growth evict
//! under the same policy as they take pages.

use crate::events::EventQueue;
use crate::resources::{Counters, KvCache};

/// Evicts up to `n` unreferenced device blocks, least recently used first.
/// Returns how many were evicted.
pub fn evict_device_blocks(cache: &mut KvCache, n: usize, events: &mut EventQueue, counters: &mut Counters) -> usize {
    cache.evict_device_blocks(n, events, counters)
}
