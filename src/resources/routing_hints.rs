//! The bounded digest-to-UUID routing-hint table.
//!
//! An image's cache identity is its content digest. Its UUID is only a hint
//! that lets a router, which knows the caller's UUID but not the pixels, name
//! the same image. The table pairs each digest with the UUID it arrived with,
//! keeps at most `capacity` pairs (least recently used evicted), and drops a
//! hint for good (while the entry lives) as soon as the pairing is contradicted:
//! a digest seen with a second UUID, or a UUID seen with a second digest. A
//! dropped or evicted hint only means the wire falls back to the digest.

use std::sync::Arc;

use ahash::AHashMap;
use slotmap::SlotMap;

use crate::keys::ImageDigest;
use crate::resources::{Counters, Lru};

slotmap::new_key_type! {
    /// A row of the hint table.
    struct HintId;
}

#[derive(Debug)]
struct HintEntry {
    digest: ImageDigest,
    uuid: Arc<str>,
    ambiguous: bool,
}

/// What [`RoutingHints::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintInsert {
    /// A new pair was stored.
    Stored,
    /// The same pair was already there (refreshed).
    Refreshed,
    /// The pair contradicted an earlier one: both are now ambiguous.
    Conflict,
    /// The table has capacity 0.
    Disabled,
}

/// The digest-to-UUID table (one per engine).
#[derive(Debug)]
pub struct RoutingHints {
    capacity: usize,
    entries: SlotMap<HintId, HintEntry>,
    by_digest: AHashMap<ImageDigest, HintId>,
    by_uuid: AHashMap<Arc<str>, HintId>,
    lru: Lru<HintId>,
}

impl RoutingHints {
    /// A table holding at most `capacity` pairs, allocated now.
    #[cfg(test)]
    pub fn with_capacity(capacity: usize) -> Self {
        Self::try_with_capacity(capacity).expect("the routing-hint table's memory can be allocated")
    }

    /// As [`RoutingHints::with_capacity`], or `None` when that memory cannot
    /// be allocated.
    pub fn try_with_capacity(capacity: usize) -> Option<Self> {
        let mut entries = SlotMap::with_key();
        entries.try_reserve(capacity).ok()?;
        let mut by_digest = AHashMap::default();
        by_digest.try_reserve(capacity).ok()?;
        let mut by_uuid = AHashMap::default();
        by_uuid.try_reserve(capacity).ok()?;
        // The LRU's links (a few words per entry) are the one reservation
        // slotmap offers no fallible form of; the limit on `capacity` keeps
        // them within tens of MiB.
        Some(Self { capacity, entries, by_digest, by_uuid, lru: Lru::with_capacity(capacity) })
    }

    /// Records that `digest` arrived with `uuid`.
    pub fn insert(&mut self, digest: ImageDigest, uuid: &Arc<str>, counters: &mut Counters) -> HintInsert {
        if self.capacity == 0 {
            return HintInsert::Disabled;
        }
        if let Some(&id) = self.by_digest.get(&digest) {
            self.lru.touch(id);
            if *self.entries[id].uuid == **uuid {
                return HintInsert::Refreshed;
            }
            self.entries[id].ambiguous = true;
            if let Some(&other) = self.by_uuid.get(uuid) {
                self.entries[other].ambiguous = true;
            }
            counters.hint_conflicts += 1;
            return HintInsert::Conflict;
        }
        let conflict = match self.by_uuid.get(uuid) {
            Some(&other) => {
                self.entries[other].ambiguous = true;
                counters.hint_conflicts += 1;
                true
            }
            None => false,
        };
        if self.entries.len() == self.capacity {
            let victim = self.lru.pop_front().expect("a full table has an LRU front");
            let e = self.entries.remove(victim).expect("LRU keys are live entries");
            self.by_digest.remove(&e.digest);
            if self.by_uuid.get(&e.uuid) == Some(&victim) {
                self.by_uuid.remove(&e.uuid);
            }
            counters.hint_evictions += 1;
        }
        let id = self.entries.insert(HintEntry { digest, uuid: uuid.clone(), ambiguous: conflict });
        self.by_digest.insert(digest, id);
        self.by_uuid.entry(uuid.clone()).or_insert(id);
        self.lru.push_back(id);
        if conflict { HintInsert::Conflict } else { HintInsert::Stored }
    }

    /// The UUID hint for `digest`, when one is known and unambiguous. Counts a
    /// hit or a miss and refreshes the entry.
    pub fn lookup(&mut self, digest: &ImageDigest, counters: &mut Counters) -> Option<Arc<str>> {
        match self.by_digest.get(digest) {
            Some(&id) if !self.entries[id].ambiguous => {
                self.lru.touch(id);
                counters.hint_hits += 1;
                Some(self.entries[id].uuid.clone())
            }
            _ => {
                counters.hint_misses += 1;
                None
            }
        }
    }

    /// Checks the table's invariants; panics naming the one broken.
    ///
    /// 1. Never more pairs than the capacity.
    /// 2. The digest map, the LRU and the rows hold the same entries.
    /// 3. Every UUID map entry points at a row with that UUID.
    pub fn check_invariants(&self) {
        assert!(self.entries.len() <= self.capacity, "invariant 1: bounded");
        assert_eq!(self.by_digest.len(), self.entries.len(), "invariant 2: digest map");
        assert_eq!(self.lru.len(), self.entries.len(), "invariant 2: lru");
        for (uuid, id) in &self.by_uuid {
            assert_eq!(&self.entries[*id].uuid, uuid, "invariant 3: uuid map");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> ImageDigest {
        ImageDigest([n; 32])
    }

    /// Pairs are returned, bounded by LRU, and a contradicted pair is dropped in
    /// both directions, with every counter moving as documented.
    #[test]
    fn bounded_lru_and_conflicts() {
        let mut c = Counters::default();
        let mut t = RoutingHints::with_capacity(2);
        let (a, b, x) = (Arc::<str>::from("a"), Arc::<str>::from("b"), Arc::<str>::from("x"));
        assert_eq!(t.insert(d(1), &a, &mut c), HintInsert::Stored);
        assert_eq!(t.insert(d(2), &b, &mut c), HintInsert::Stored);
        assert_eq!(t.lookup(&d(1), &mut c).as_deref(), Some("a"));
        // d(2) is now least recently used and goes first.
        assert_eq!(t.insert(d(3), &x, &mut c), HintInsert::Stored);
        assert_eq!(c.hint_evictions, 1);
        assert_eq!(t.lookup(&d(2), &mut c), None);
        // Same digest, other UUID: ambiguous from then on.
        assert_eq!(t.insert(d(1), &b, &mut c), HintInsert::Conflict);
        assert_eq!(t.lookup(&d(1), &mut c), None);
        assert_eq!(t.insert(d(1), &a, &mut c), HintInsert::Refreshed);
        assert_eq!(t.lookup(&d(1), &mut c), None);
        // Same UUID, other digest: both ambiguous.
        assert_eq!(t.insert(d(4), &x, &mut c), HintInsert::Conflict);
        assert_eq!(t.lookup(&d(4), &mut c), None);
        assert_eq!(c.hint_conflicts, 2);
        assert_eq!(c.hint_hits, 1);
        t.check_invariants();
        let mut off = RoutingHints::with_capacity(0);
        assert_eq!(off.insert(d(1), &a, &mut c), HintInsert::Disabled);
        assert_eq!(off.lookup(&d(1), &mut c), None);
    }
}
