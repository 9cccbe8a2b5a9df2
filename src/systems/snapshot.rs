//! Snapshot: the full cache state as events, for a consumer that fell behind
//! the replay ring.

use crate::events::{AllBlocksCleared, KvEvent};
use crate::resources::{Counters, KvCache, RoutingHints};

/// `AllBlocksCleared` followed by one `BlockStored` per indexed block, parents
/// before children (by chain depth), device tier first. UUID hints are
/// resolved now. `event_seq` is 0 in every event: a snapshot is tagged with the
/// batch sequence number it is consistent with, not with event numbers.
pub fn snapshot_events(cache: &KvCache, hints: &mut RoutingHints, counters: &mut Counters) -> Vec<KvEvent> {
    let mut ids: Vec<_> = cache.indexed().map(|(_, id)| id).collect();
    ids.sort_by_key(|id| (cache.content_of(*id).depth, cache.block(*id).medium, *id));
    let mut out = Vec::with_capacity(ids.len() + 1);
    out.push(KvEvent::AllBlocksCleared(AllBlocksCleared { event_seq: 0 }));
    for id in ids {
        let mut e = cache.stored_event(id);
        for image in &mut e.images {
            image.uuid = hints.lookup(&image.digest, counters);
        }
        out.push(KvEvent::BlockStored(e));
    }
    out
}
