//! Snapshot: the full cache state as events, for a consumer that fell behind
//! the replay ring.

use crate::events::{AllBlocksCleared, KvEvent};
use crate::resources::{Counters, KvGroups, RoutingHints};

/// `AllBlocksCleared` followed by one `BlockStored` per indexed block, group
/// by group in group order, and in each group parents before children (by
/// chain depth), device tier first. UUID hints are resolved now. `event_seq`
/// is 0 in every event: a snapshot is tagged with the batch sequence number
/// it is consistent with, not with event numbers.
pub fn snapshot_events(groups: &KvGroups, hints: &mut RoutingHints, counters: &mut Counters) -> Vec<KvEvent> {
    let mut out = vec![KvEvent::AllBlocksCleared(AllBlocksCleared { event_seq: 0 })];
    for cache in groups.iter() {
        let mut ids: Vec<_> = cache.indexed().map(|(_, id)| id).collect();
        ids.sort_by_key(|id| (cache.content_of(*id).depth, cache.block(*id).medium, *id));
        out.reserve(ids.len());
        for id in ids {
            let mut e = cache.stored_event(id);
            for image in &mut e.images {
                image.uuid = hints.lookup(&image.digest, counters);
            }
            out.push(KvEvent::BlockStored(e));
        }
    }
    out
}
