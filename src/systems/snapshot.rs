//! Snapshot: the full cache state as events, for a consumer that fell behind
//! the replay ring.

use crate::events::KvEvent;
use crate::resources::{Counters, KvCache, RoutingHints};
use crate::systems::commit::stored_event_for_block;

/// `AllBlocksCleared` followed by one `BlockStored` per indexed block, parents
/// before children (by chain depth), device tier first. UUID hints are
/// resolved now. `event_seq` is 0 in every event: a snapshot is tagged with the
/// batch sequence number it is consistent with, not with event numbers.
pub fn snapshot_events(cache: &KvCache, hints: &mut RoutingHints, counters: &mut Counters) -> Vec<KvEvent> {
    let mut ids: Vec<_> = cache.index.map.values().copied().collect();
    ids.sort_by_key(|id| (cache.content_of(*id).depth, cache.blocks.rows[*id].medium, *id));
    let mut out = Vec::with_capacity(ids.len() + 1);
    out.push(KvEvent::AllBlocksCleared(crate::events::AllBlocksCleared { event_seq: 0 }));
    for id in ids {
        let mut e = stored_event_for_block(cache, id);
        for image in &mut e.images {
            image.uuid = hints.lookup(&image.digest, counters);
        }
        out.push(KvEvent::BlockStored(e));
    }
    out
}
