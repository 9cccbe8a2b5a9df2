//! Clear: reset the prefix cache.

use crate::events::EventQueue;
use crate::resources::KvCache;

/// Forgets every cached key. Unreferenced cached blocks (device and host) are
/// freed; blocks still used by running requests stay with them as private
/// copies and are freed when those finish. Emits `AllBlocksCleared`.
pub fn clear_cache(cache: &mut KvCache, events: &mut EventQueue) {
    let index = std::mem::take(&mut cache.index.map);
    for (_, id) in index {
        let b = &mut cache.blocks.rows[id];
        b.indexed = false;
        cache.blocks.content.remove(id);
        if b.ref_count == 0 {
            cache.pool.lru(b.medium).remove(id);
            cache.release_row(id);
        }
    }
    events.push_cleared();
}
