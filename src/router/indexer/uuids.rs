//! UUIDs paired with content digests by the `image_routing` items of stored
//! events, so that a request naming an image by UUID alone can be keyed.

use std::collections::{HashMap, VecDeque};

use kvcore::ImageDigest;

use crate::hashing::UuidLookup;

/// What the router learned about one UUID.
#[derive(Debug)]
struct UuidEntry {
    /// The digest first paired with it.
    digest: ImageDigest,
    /// Whether another digest was paired with it since.
    ambiguous: bool,
}

/// What [`UuidMap::learn`] changed, for the indexer's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Learned {
    /// The UUID, known with another digest, became ambiguous.
    pub(super) conflict: bool,
    /// UUIDs forgotten to make room.
    pub(super) forgotten: u64,
}

/// UUIDs paired with digests, bounded, oldest first out.
#[derive(Debug, Default)]
pub(super) struct UuidMap {
    map: HashMap<Box<str>, UuidEntry, ahash::RandomState>,
    order: VecDeque<Box<str>>,
}

impl UuidMap {
    /// Pairs `uuid` with `digest`, keeping at most `max` UUIDs: a UUID seen
    /// with two digests identifies nothing from then on.
    pub(super) fn learn(&mut self, uuid: &str, digest: ImageDigest, max: usize) -> Learned {
        let mut learned = Learned::default();
        if max == 0 {
            return learned;
        }
        if let Some(e) = self.map.get_mut(uuid) {
            if e.digest != digest && !e.ambiguous {
                e.ambiguous = true;
                learned.conflict = true;
            }
            return learned;
        }
        while self.map.len() >= max {
            let Some(old) = self.order.pop_front() else { break };
            self.map.remove(&old);
            learned.forgotten += 1;
        }
        let key: Box<str> = uuid.into();
        self.order.push_back(key.clone());
        self.map.insert(key, UuidEntry { digest, ambiguous: false });
        learned
    }

    /// What is known about `uuid`.
    pub(super) fn lookup(&self, uuid: &str) -> UuidLookup {
        match self.map.get(uuid) {
            Some(e) if e.ambiguous => UuidLookup::Ambiguous,
            Some(e) => UuidLookup::Digest(e.digest),
            None => UuidLookup::Unknown,
        }
    }

    /// UUIDs remembered.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes allocated (capacity times entry size, plus the names twice, an
    /// estimate).
    pub(super) fn bytes(&self) -> usize {
        self.map.capacity() * (16 + std::mem::size_of::<UuidEntry>() + 1)
            + self.map.keys().map(|k| k.len() * 2).sum::<usize>()
            + self.order.capacity() * 16
    }
}
