//! Clear: reset the prefix cache.

use crate::events::EventQueue;
use crate::resources::KvGroups;

/// Forgets every cached key of every group
/// ([`crate::resources::KvCache::clear`]): unreferenced cached blocks
/// (device and host) are freed; blocks still used by running requests stay
/// with them as private copies and are freed when those finish. Emits one
/// `AllBlocksCleared`, which clears every group.
pub fn clear_cache(groups: &mut KvGroups, events: &mut EventQueue) {
    groups.main.clear(events);
    for w in &mut groups.windows {
        w.cache.clear_blocks();
    }
}
