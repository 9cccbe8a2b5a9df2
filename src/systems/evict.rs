//! Explicit eviction: the caller frees cached device blocks ahead of need.
//!
//! The replacement policy (least recently used first, offload to the host
//! tier or drop, which host block makes room) is the block cache's
//! ([`KvCache::evict_device_block`]), because admission and growth evict
//! under the same policy as they take pages.

use crate::events::EventQueue;
use crate::resources::{Counters, KvGroups};

/// Evicts up to `n` unreferenced device blocks of every group, least
/// recently used first in each (each group has its own pool: freeing pages
/// in one helps only that one). Returns how many were evicted, over all
/// groups.
pub fn evict_device_blocks(groups: &mut KvGroups, n: usize, events: &mut EventQueue, counters: &mut Counters) -> usize {
    groups.iter_mut().map(|cache| cache.evict_device_blocks(n, events, counters)).sum()
}
