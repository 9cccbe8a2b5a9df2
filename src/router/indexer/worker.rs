//! One worker's blocks: the keyed ones by engine hash, and the ones waiting
//! for their parent to be keyed.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use crate::table::SlotTable;

/// A hasher for keys that are already 64-bit hashes (engine hashes, router
/// keys): one folded multiply, enough to spread hashes that engines made from
/// small integers too.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64 ^ self.0.rotate_left(8));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let m = (x ^ self.0) as u128 * 0x9E37_79B9_7F4A_7C15u128;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

/// Builds [`U64Hasher`]s.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct BuildU64;

impl BuildHasher for BuildU64 {
    type Hasher = U64Hasher;
    fn build_hasher(&self) -> U64Hasher {
        U64Hasher(0)
    }
}

/// A map keyed by engine hashes, for the small tables of waiting blocks
/// (the large keyed table is a [`SlotTable`]).
pub(super) type U64Map<V> = HashMap<u64, V, BuildU64>;

/// A block waiting for its parent to be keyed: what it needs to be keyed
/// later, without its tokens.
#[derive(Clone, Copy, Debug)]
pub(super) struct Waiting {
    /// Its content hash.
    pub(super) content: u64,
    /// Its parent's engine hash.
    pub(super) parent: u64,
    /// The tiers holding it.
    pub(super) tiers: u8,
}

/// A router key that one worker holds under two engine hashes or more: an
/// engine hash covers what the key does not (one image's pixels named by
/// two UUIDs, for instance). The holder index keeps the union of their
/// tiers; this keeps each hash's own, so that one leaving a tier leaves the
/// key's tiers to the others. The first hash is listed only once an event
/// names it (its tiers are `first` until then): finding it would take a
/// walk of the worker's table.
#[derive(Clone, Debug, Default)]
pub(super) struct Dup {
    /// The tiers of the first hash while it is not listed (0 once it is).
    pub(super) first: u8,
    /// The other hashes (and the first, once listed) with their tiers.
    pub(super) hashes: Vec<(u64, u8)>,
}

impl Dup {
    /// The union of every hash's tiers.
    pub(super) fn tiers(&self) -> u8 {
        self.hashes.iter().fold(self.first, |a, (_, t)| a | t)
    }

    /// The tiers of `hash`, one of this key's hashes of the worker.
    pub(super) fn tiers_of(&self, hash: u64) -> u8 {
        self.hashes.iter().find(|(h, _)| *h == hash).map_or(self.first, |(_, t)| *t)
    }
}

/// The router's view of one worker.
#[derive(Debug, Default)]
pub(super) struct WorkerBlocks {
    /// The name it was added with, for reports.
    pub(super) name: String,
    /// Added and not removed.
    pub(super) live: bool,
    /// Keyed blocks by engine hash: the slot of their router key in the
    /// runs (`runs.rs`), which holds the key and its holders. Their tiers
    /// are there too, so a slot here is 16 bytes (four to a cache line,
    /// none straddling two). A removal marks its entry dead in place
    /// ([`SlotTable`]).
    pub(super) keyed: SlotTable,
    /// Blocks waiting for their parent, by engine hash.
    pub(super) waiting: U64Map<Waiting>,
    /// Parent engine hash to the waiting blocks stored under it.
    pub(super) children: U64Map<Vec<u64>>,
    /// Blocks reserved by `Indexer::reserve`.
    pub(super) reserved: usize,
    /// Router keys held under several engine hashes, by key (see [`Dup`]).
    pub(super) dups: U64Map<Dup>,
}

impl WorkerBlocks {
    /// Blocks held, keyed or waiting.
    pub(super) fn len(&self) -> usize {
        self.keyed.len() + self.waiting.len()
    }

    /// Bytes allocated by its tables (capacity times entry size, an estimate).
    pub(super) fn bytes(&self) -> usize {
        self.keyed.bytes()
            + self.waiting.capacity() * (8 + std::mem::size_of::<Waiting>() + 1)
            + self.children.capacity() * (8 + 24 + 1)
            + self.children.values().map(|v| v.capacity() * 8).sum::<usize>()
            + self.dups.capacity() * (8 + std::mem::size_of::<Dup>() + 1)
            + self.dups.values().map(|d| d.hashes.capacity() * 16).sum::<usize>()
    }
}

/// Removes `hash` from the children listed under `parent`.
pub(super) fn unlink_child(children: &mut U64Map<Vec<u64>>, hash: u64, parent: u64) {
    if let Some(v) = children.get_mut(&parent)
        && let Some(p) = v.iter().position(|h| *h == hash)
    {
        v.swap_remove(p);
        if v.is_empty() {
            children.remove(&parent);
        }
    }
}
