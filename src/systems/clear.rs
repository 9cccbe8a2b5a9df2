//! Clear: reset the prefix cache.

use crate::events::EventQueue;
use crate::resources::KvCache;

/// Forgets every cached key. Unreferenced cached blocks (device and host) are
/// freed; blocks still used by running requests stay with them as private
/// copies and are freed when those finish. Emits `AllBlocksCleared`. The
/// index keeps its allocated capacity.
pub fn clear_cache(cache: &mut KvCache, events: &mut EventQueue) {
    let mut index = std::mem::take(&mut cache.index.map);
    for (_, id) in index.drain() {
        let b = &mut cache.blocks.rows[id];
        b.indexed = false;
        let (unreferenced, medium) = (b.ref_count == 0, b.medium);
        cache.remove_content(id);
        if unreferenced {
            cache.pool.lru(medium).remove(&mut cache.blocks.rows, id);
            cache.release_row(id);
        }
    }
    cache.index.map = index;
    events.push_cleared();
}
