//! Clear: reset the prefix cache.

use crate::events::EventQueue;
use crate::resources::KvCache;

/// Forgets every cached key ([`KvCache::clear`]): unreferenced cached blocks
/// (device and host) are freed; blocks still used by running requests stay
/// with them as private copies and are freed when those finish. Emits
/// `AllBlocksCleared`.
pub fn clear_cache(cache: &mut KvCache, events: &mut EventQueue) {
    cache.clear(events);
}
