//! One worker's blocks: the keyed ones by engine hash, and the ones waiting
//! for their parent to be keyed.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use crate::table::U64Table;

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
/// (the large keyed table is a [`U64Table`]).
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

/// The router's view of one worker.
#[derive(Debug, Default)]
pub(super) struct WorkerBlocks {
    /// The name it was added with, for reports.
    pub(super) name: String,
    /// Added and not removed.
    pub(super) live: bool,
    /// Keyed blocks by engine hash: their router keys. Their tiers are in
    /// the holder index, which every store and removal touches anyway, so a
    /// slot here is 16 bytes (four to a cache line, none straddling two).
    pub(super) keyed: U64Table<u64>,
    /// Blocks waiting for their parent, by engine hash.
    pub(super) waiting: U64Map<Waiting>,
    /// Parent engine hash to the waiting blocks stored under it.
    pub(super) children: U64Map<Vec<u64>>,
    /// Blocks reserved by `Indexer::reserve`.
    pub(super) reserved: usize,
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
