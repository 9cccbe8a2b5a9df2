//! Memory: reservations that size the tables before events arrive, and the
//! report of what the tables hold and cost.

use super::{Indexer, IndexerMemory, WorkerId};

impl Indexer {
    /// Reserves room for `blocks` blocks of one worker (its cache capacity,
    /// when known), so that its table does not grow while events arrive.
    /// The runs of the shared holder index are sized for the sum of every
    /// worker's reservation.
    pub fn reserve(&mut self, worker: WorkerId, blocks: usize) {
        let blocks = blocks.min(self.config.blocks_per_worker_max);
        if let Some(w) = self.workers.get_mut(worker.0 as usize) {
            w.keyed.reserve(blocks.saturating_sub(w.keyed.len()));
            w.reserved = blocks;
            let total: usize = self.workers.iter().map(|w| w.reserved).sum();
            self.index.runs.reserve(total.saturating_sub(self.index.runs.slots()));
        }
    }

    /// Table sizes and a memory estimate.
    pub fn memory(&self) -> IndexerMemory {
        let mut r = IndexerMemory {
            keys: self.index.len(),
            uuids: self.uuids.len(),
            uuids_ambiguous: self.uuids.ambiguous(),
            uuid_blocks: self.uuids.blocks(),
            uuid_unsure_slots: self.uuids.unsure_slots(),
            ..Default::default()
        };
        let mut bytes = self.index.bytes();
        for w in &self.workers {
            r.nodes += w.len();
            r.pending += w.waiting.len();
            bytes += w.bytes();
        }
        r.bytes = bytes + self.uuids.bytes();
        r
    }
}
