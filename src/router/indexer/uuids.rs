//! The fleet-wide view of image UUIDs: which content digests the workers
//! hold under each UUID, learned from the `image_routing` items of stored
//! events and kept by reference counts, so that a request naming an image by
//! UUID alone is keyed only when the whole fleet agrees on its content.
//!
//! ```text
//!   UUID ──► Entry { refs: [(digest, worker, blocks)] }      one digest: resolves; two or more: ambiguous
//!   per worker: engine hash ──► BlockUuids { tiers, partial, [(UUID, generation, digest)] }
//!   per worker: unsure bits, 1024 slots of XXH3-64(UUID)     set when a reference could not be kept
//! ```
//!
//! Why this shape:
//! - Each engine pairs UUIDs with digests in a table of its own, so two
//!   workers may advertise the same UUID for different pixels. A router that
//!   resolved the UUID to either digest would send a request whose pixels it
//!   does not know to a worker that may hold other pixels. A UUID held under
//!   two digests therefore resolves to nothing ([`UuidLookup::Ambiguous`]).
//! - The conflict lasts exactly as long as the conflicting copies: every
//!   block that names a UUID takes a reference on its `(digest, worker)`
//!   pair and gives it back when it leaves its last tier, when its worker
//!   clears, or when the worker is removed. The view keeps its own record of
//!   such blocks, apart from the indexer's nodes, because the fleet holds a
//!   block whether or not the indexer could key it (no token ids, another
//!   block size, worker table full).
//! - Bounded two ways: at most `uuids_max` UUIDs (the oldest learned is
//!   evicted first, counted in `uuids_forgotten`) and at most
//!   `blocks_per_worker_max` recorded blocks per worker (a reference beyond
//!   that is not kept, counted in `uuid_refs_unrecorded`). Forgetting must
//!   never turn into a false match: a UUID evicted while workers hold it, or
//!   a reference not kept, sets the UUID's slot in those workers' unsure
//!   bits, and a UUID whose slot is set on any worker resolves to
//!   [`UuidLookup::Unsure`] (keys stop at the image, as for an ambiguous
//!   one) until each of those workers has cleared or been removed. Another
//!   UUID sharing the slot is refused too; it is never resolved wrongly.
//! - A block not recorded stays unknown to the view in its tier, so a later
//!   record of the same hash in another tier would know that tier alone,
//!   and its removal from there would give back references the block still
//!   holds in the first. Hence a worker that failed to keep a reference is
//!   lossy until it clears, a block first recorded while its worker is
//!   lossy is partial, and a partial block leaving its last known tier sets
//!   its UUIDs' slots in the worker's unsure bits as it gives its
//!   references back.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kvcore::ImageDigest;

use super::worker::U64Map;
use crate::hashing::UuidLookup;

/// Slots of the unsure bits (a power of two).
const UNSURE_SLOTS: usize = 1024;

/// The unsure slot of a UUID.
fn slot(uuid: &str) -> usize {
    (xxhash_rust::xxh3::xxh3_64(uuid.as_bytes()) as usize) & (UNSURE_SLOTS - 1)
}

/// What the fleet holds under one UUID.
#[derive(Debug)]
struct Entry {
    /// Distinguishes this entry from an earlier one of the same UUID that was
    /// evicted: references taken on that one are not given back to this one.
    generation: u64,
    /// `(digest, worker, blocks)`: blocks of that worker naming the UUID with
    /// that digest, each at least 1.
    refs: Vec<(ImageDigest, u32, u32)>,
}

impl Entry {
    /// Whether the entry names two digests or more.
    fn ambiguous(&self) -> bool {
        self.refs.iter().any(|r| r.0 != self.refs[0].0)
    }
}

/// The UUID references of one block of one worker.
#[derive(Debug)]
struct BlockUuids {
    /// Tiers holding the block; references are given back at 0.
    tiers: u8,
    /// First recorded while the worker was lossy: the block may also be
    /// held in a tier whose store was not recorded.
    partial: bool,
    /// `(UUID, generation of its entry, digest)`, each pair once.
    refs: Vec<(Arc<str>, u64, ImageDigest)>,
}

/// One worker's part of the view.
#[derive(Debug, Default)]
struct WorkerUuids {
    /// Blocks naming a UUID, by engine hash.
    blocks: U64Map<BlockUuids>,
    /// Unsure slots of this worker, one bit each (allocated on first use).
    unsure: Vec<u64>,
    /// A reference was not kept since the worker last cleared.
    lossy: bool,
}

/// What one update changed, for the indexer's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ViewChange {
    /// UUIDs that became ambiguous.
    pub(super) conflicts: u64,
    /// Ambiguous UUIDs that resolve again (their conflicting copies gone).
    pub(super) conflicts_resolved: u64,
    /// UUIDs evicted under `uuids_max`.
    pub(super) forgotten: u64,
    /// References not kept (worker at its block bound).
    pub(super) unrecorded: u64,
}

impl std::ops::AddAssign for ViewChange {
    fn add_assign(&mut self, o: Self) {
        self.conflicts += o.conflicts;
        self.conflicts_resolved += o.conflicts_resolved;
        self.forgotten += o.forgotten;
        self.unrecorded += o.unrecorded;
    }
}

/// The fleet-wide UUID view (see the module docs).
#[derive(Debug, Default)]
pub(super) struct UuidView {
    entries: HashMap<Arc<str>, Entry, ahash::RandomState>,
    /// Entries in the order they were created, `(UUID, generation)`; an item
    /// whose entry is gone or newer is skipped when evicting.
    order: VecDeque<(Arc<str>, u64)>,
    next_generation: u64,
    workers: Vec<WorkerUuids>,
    /// Per slot, the workers with that unsure bit set.
    unsure_workers: Vec<u32>,
    /// UUIDs now ambiguous.
    ambiguous: usize,
    /// Lookups answered ambiguous and unsure (lookups take `&self`).
    lookups_ambiguous: AtomicU64,
    lookups_unsure: AtomicU64,
}

impl UuidView {
    /// Makes room for worker `w`.
    pub(super) fn add_worker(&mut self, w: usize) {
        if self.workers.len() <= w {
            self.workers.resize_with(w + 1, WorkerUuids::default);
        }
    }

    /// Records that `worker` holds block `hash` in the tier `bit`, naming each
    /// `(uuid, digest)` of `items`. A block already recorded keeps its
    /// references and gains the new ones.
    pub(super) fn store(
        &mut self,
        worker: usize,
        hash: u64,
        bit: u8,
        items: &[(&str, ImageDigest)],
        uuids_max: usize,
        blocks_max: usize,
    ) -> ViewChange {
        let mut change = ViewChange::default();
        self.add_worker(worker);
        let recorded = self.workers[worker].blocks.contains_key(&hash);
        if !recorded && (self.workers[worker].blocks.len() >= blocks_max || uuids_max == 0) {
            for (uuid, _) in items {
                self.set_unsure(worker, slot(uuid));
            }
            self.workers[worker].lossy = true;
            change.unrecorded += items.len() as u64;
            return change;
        }
        let mut refs = match self.workers[worker].blocks.remove(&hash) {
            Some(b) => b,
            None => BlockUuids { tiers: 0, partial: self.workers[worker].lossy, refs: Vec::new() },
        };
        refs.tiers |= bit;
        for &(uuid, digest) in items {
            let entries = &self.entries;
            let held = |(u, g, d): &(Arc<str>, u64, ImageDigest)| {
                &**u == uuid && *d == digest && entries.get(uuid).is_some_and(|e| e.generation == *g)
            };
            if refs.refs.iter().any(held) {
                continue;
            }
            let (key, generation) = self.acquire(worker as u32, uuid, digest, uuids_max, &mut change);
            refs.refs.push((key, generation, digest));
        }
        self.workers[worker].blocks.insert(hash, refs);
        change
    }

    /// Takes one reference on `(uuid, digest, worker)`, creating the entry
    /// (and evicting the oldest under `uuids_max`) if needed.
    fn acquire(
        &mut self,
        worker: u32,
        uuid: &str,
        digest: ImageDigest,
        uuids_max: usize,
        change: &mut ViewChange,
    ) -> (Arc<str>, u64) {
        if let Some(e) = self.entries.get_mut(uuid) {
            let was = e.ambiguous();
            match e.refs.iter_mut().find(|r| r.0 == digest && r.1 == worker) {
                Some(r) => r.2 += 1,
                None => e.refs.push((digest, worker, 1)),
            }
            if !was && e.ambiguous() {
                self.ambiguous += 1;
                change.conflicts += 1;
            }
            let generation = e.generation;
            let key = self.entries.get_key_value(uuid).map(|(k, _)| k.clone()).expect("found above");
            return (key, generation);
        }
        while self.entries.len() >= uuids_max {
            let Some((old, g)) = self.order.pop_front() else { break };
            if self.entries.get(&old).is_some_and(|e| e.generation == g) {
                self.evict(&old);
                change.forgotten += 1;
            }
        }
        let key: Arc<str> = uuid.into();
        let generation = self.next_generation;
        self.next_generation += 1;
        self.entries.insert(key.clone(), Entry { generation, refs: vec![(digest, worker, 1)] });
        self.order.push_back((key.clone(), generation));
        if self.order.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.order.retain(|(u, g)| entries.get(u).is_some_and(|e| e.generation == *g));
        }
        (key, generation)
    }

    /// Drops an entry that workers may still hold: their blocks' references
    /// to it become stale, and the UUID's slot turns unsure on each of them.
    fn evict(&mut self, uuid: &str) {
        let Some(e) = self.entries.remove(uuid) else { return };
        if e.ambiguous() {
            self.ambiguous -= 1;
        }
        let s = slot(uuid);
        for &(_, w, _) in &e.refs {
            self.set_unsure(w as usize, s);
        }
    }

    fn set_unsure(&mut self, worker: usize, s: usize) {
        let bits = &mut self.workers[worker].unsure;
        if bits.is_empty() {
            bits.resize(UNSURE_SLOTS / 64, 0);
        }
        let (word, mask) = (s / 64, 1u64 << (s % 64));
        if bits[word] & mask == 0 {
            bits[word] |= mask;
            if self.unsure_workers.is_empty() {
                self.unsure_workers.resize(UNSURE_SLOTS, 0);
            }
            self.unsure_workers[s] += 1;
        }
    }

    /// Gives back one reference; returns whether an ambiguous UUID resolves
    /// again.
    fn release(&mut self, worker: u32, uuid: &str, generation: u64, digest: ImageDigest) -> bool {
        let Some(e) = self.entries.get_mut(uuid).filter(|e| e.generation == generation) else { return false };
        let was = e.ambiguous();
        if let Some(p) = e.refs.iter().position(|r| r.0 == digest && r.1 == worker) {
            e.refs[p].2 -= 1;
            if e.refs[p].2 == 0 {
                e.refs.swap_remove(p);
            }
        }
        let now = e.ambiguous();
        if e.refs.is_empty() {
            self.entries.remove(uuid);
        }
        if was && !now {
            self.ambiguous -= 1;
            return true;
        }
        false
    }

    /// The block `hash` of `worker` left the tier `bit`: at its last tier its
    /// references are given back, and a partial block's UUIDs turn unsure on
    /// the worker (it may still hold the block). Unknown blocks are no-ops.
    pub(super) fn remove(&mut self, worker: usize, hash: u64, bit: u8) -> ViewChange {
        let mut change = ViewChange::default();
        let Some(w) = self.workers.get_mut(worker) else { return change };
        let Some(b) = w.blocks.get_mut(&hash) else { return change };
        b.tiers &= !bit;
        if b.tiers != 0 {
            return change;
        }
        let b = w.blocks.remove(&hash).expect("looked up above");
        for (uuid, g, d) in b.refs {
            if b.partial {
                self.set_unsure(worker, slot(&uuid));
            }
            change.conflicts_resolved += u64::from(self.release(worker as u32, &uuid, g, d));
        }
        change
    }

    /// Whether `worker` has any block naming a UUID (removals skip the view
    /// when none has).
    pub(super) fn holds_any(&self, worker: usize) -> bool {
        self.workers.get(worker).is_some_and(|w| !w.blocks.is_empty())
    }

    /// Forgets everything `worker` holds: its references are given back and
    /// its unsure bits cleared (it holds nothing the view failed to record).
    pub(super) fn clear_worker(&mut self, worker: usize) -> ViewChange {
        let mut change = ViewChange::default();
        let Some(w) = self.workers.get_mut(worker) else { return change };
        let blocks = std::mem::take(&mut w.blocks);
        let bits = std::mem::take(&mut w.unsure);
        w.lossy = false;
        for (word, &v) in bits.iter().enumerate() {
            let mut v = v;
            while v != 0 {
                let b = v.trailing_zeros() as usize;
                self.unsure_workers[word * 64 + b] -= 1;
                v &= v - 1;
            }
        }
        for (_, b) in blocks {
            for (uuid, g, d) in b.refs {
                change.conflicts_resolved += u64::from(self.release(worker as u32, &uuid, g, d));
            }
        }
        change
    }

    /// What is known about `uuid` fleet-wide.
    pub(super) fn lookup(&self, uuid: &str) -> UuidLookup {
        let unsure = !self.unsure_workers.is_empty() && self.unsure_workers[slot(uuid)] > 0;
        match self.entries.get(uuid) {
            Some(e) if e.ambiguous() => {
                self.lookups_ambiguous.fetch_add(1, Ordering::Relaxed);
                UuidLookup::Ambiguous
            }
            _ if unsure => {
                self.lookups_unsure.fetch_add(1, Ordering::Relaxed);
                UuidLookup::Unsure
            }
            Some(e) => UuidLookup::Digest(e.refs[0].0),
            None => UuidLookup::Unknown,
        }
    }

    /// UUIDs remembered.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// UUIDs now held under two digests or more.
    pub(super) fn ambiguous(&self) -> usize {
        self.ambiguous
    }

    /// Unsure slots, summed over workers.
    pub(super) fn unsure_slots(&self) -> usize {
        self.unsure_workers.iter().map(|&n| n as usize).sum()
    }

    /// Blocks recorded as naming a UUID, over all workers.
    pub(super) fn blocks(&self) -> usize {
        self.workers.iter().map(|w| w.blocks.len()).sum()
    }

    /// Lookups answered ambiguous and unsure so far.
    pub(super) fn lookups(&self) -> (u64, u64) {
        (self.lookups_ambiguous.load(Ordering::Relaxed), self.lookups_unsure.load(Ordering::Relaxed))
    }

    /// Bytes allocated (capacities times entry sizes plus the names, an
    /// estimate).
    pub(super) fn bytes(&self) -> usize {
        let entry = 16 + std::mem::size_of::<Entry>() + 1;
        self.entries.capacity() * entry
            + self.entries.iter().map(|(k, e)| k.len() + 16 + e.refs.capacity() * 40).sum::<usize>()
            + self.order.capacity() * 24
            + self.unsure_workers.capacity() * 4
            + self
                .workers
                .iter()
                .map(|w| {
                    w.unsure.capacity() * 8
                        + w.blocks.capacity() * (8 + std::mem::size_of::<BlockUuids>() + 1)
                        + w.blocks.values().map(|b| b.refs.capacity() * 56).sum::<usize>()
                })
                .sum::<usize>()
    }
}
