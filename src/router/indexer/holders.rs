//! The shared holder index: for each router key, the workers holding it and
//! in which tiers.
//!
//! Most keys have one holder, so a slot of the table holds that holder packed
//! in place (`worker << 2 | tier bits`); a key held by several workers points
//! to an interned holder set instead (one list for every key with the same
//! holders and tiers). A lookup of a singly held key is then one probe with
//! no second load.

use kvcore::Tier;

use crate::table::U64Table;

/// A tier's bit in a block's holder mask.
pub(super) fn tier_bit(tier: Tier) -> u8 {
    1 << tier as u8
}

/// Every tier bit a holder may carry.
pub(super) const TIER_BITS: u8 = 0b11;

/// Marks a holder value that is the id of an interned holder set.
pub(super) const MANY: u64 = 1 << 63;

/// Slots below which the holder index grows four-fold (1 Mi slots, 16 MiB).
///
/// Why larger than a worker table's bound: an indexer has one holder index
/// but a table per worker, so the memory this may cost (a 16 MiB table
/// where two-fold growth from empty would hold 8 MiB; after an
/// `Indexer::reserve` to an odd power of two, up to 16 MiB more) is small
/// next to the workers' tables, while the keys that its two-fold
/// growths would move are the sum of every worker's blocks. Measured: 18-20
/// % faster applies into fresh tables (docs/benchmarks.md, "Router").
const HOLDER_FOUR_BELOW: usize = 1 << 20;

/// The workers holding each router key. A value is one holder packed as
/// `worker << 2 | tier bits`, or, with [`MANY`] set, the id of an interned
/// holder set in `sets`.
///
/// Holder sets are interned: every key held by the same workers in the same
/// tiers points at one shared, sorted list. The keys of a prefix that a
/// group of workers holds as a whole then carry one id, so a lookup compares
/// ids from key to key and walks a list only where the holders change: its
/// cost does not grow with the holders per key (see `Indexer::find_matches`).
#[derive(Debug)]
pub(super) struct HolderIndex {
    /// Router key to its packed holder, or to an interned set.
    pub(super) map: U64Table<u64>,
    /// The interned holder sets.
    sets: HolderSets,
    /// The next list of an update, built before it is interned.
    scratch: Vec<u32>,
}

impl Default for HolderIndex {
    fn default() -> Self {
        Self {
            map: U64Table::with_four_fold_below(HOLDER_FOUR_BELOW),
            sets: HolderSets::default(),
            scratch: Vec::new(),
        }
    }
}

/// Interned holder lists, sorted by worker, counted by the keys using them.
#[derive(Debug, Default)]
struct HolderSets {
    /// The lists by id (empty while the id is free).
    lists: Vec<Box<[u32]>>,
    /// Keys using each list.
    refs: Vec<u32>,
    /// Each list's id.
    ids: ahash::AHashMap<Box<[u32]>, u32>,
    /// Ids free for reuse.
    free: Vec<u32>,
}

impl HolderSets {
    fn get(&self, id: u32) -> &[u32] {
        &self.lists[id as usize]
    }

    /// The id of `list`, one more key using it.
    fn acquire(&mut self, list: &[u32]) -> u32 {
        if let Some(&id) = self.ids.get(list) {
            self.refs[id as usize] += 1;
            return id;
        }
        let b: Box<[u32]> = list.into();
        let id = match self.free.pop() {
            Some(id) => {
                self.lists[id as usize] = b.clone();
                self.refs[id as usize] = 1;
                id
            }
            None => {
                self.lists.push(b.clone());
                self.refs.push(1);
                self.lists.len() as u32 - 1
            }
        };
        self.ids.insert(b, id);
        id
    }

    /// One key fewer using `id`; the list is dropped with its last key.
    fn release(&mut self, id: u32) {
        let r = &mut self.refs[id as usize];
        *r -= 1;
        if *r == 0 {
            let b = std::mem::take(&mut self.lists[id as usize]);
            self.ids.remove(&b);
            self.free.push(id);
        }
    }

    fn bytes(&self) -> usize {
        let listed: usize = self.lists.iter().map(|l| l.len() * 4).sum();
        // Each list is held twice (by id and as its map key); the map's
        // slots hold a fat pointer and an id.
        self.lists.capacity() * 16
            + self.refs.capacity() * 4
            + 2 * listed
            + self.ids.capacity() * 24
            + self.free.capacity() * 4
    }
}

/// The holders of one key, borrowed.
pub(super) enum HolderRef<'a> {
    /// A key held by one worker: its packed holder.
    One([u32; 1]),
    /// A key held by several workers: their interned list, sorted by worker.
    Many(&'a [u32]),
}

impl HolderRef<'_> {
    /// The packed holders.
    pub(super) fn as_slice(&self) -> &[u32] {
        match self {
            HolderRef::One(a) => a,
            HolderRef::Many(s) => s,
        }
    }
}

/// A holder packed as its worker and its tier bits.
fn pack(worker: u32, tiers: u8) -> u32 {
    worker << 2 | tiers as u32
}

impl HolderIndex {
    /// The holders of `key`.
    #[inline]
    pub(super) fn get(&self, key: u64) -> Option<HolderRef<'_>> {
        self.map.get(key).map(|v| self.resolve(*v))
    }

    /// The holders a value of `map` stands for.
    #[inline]
    pub(super) fn resolve(&self, v: u64) -> HolderRef<'_> {
        if v & MANY != 0 { HolderRef::Many(self.sets.get((v & !MANY) as u32)) } else { HolderRef::One([v as u32]) }
    }

    /// Interned holder sets in use.
    #[cfg(test)]
    pub(super) fn sets_live(&self) -> usize {
        self.sets.ids.len()
    }

    /// Keys held by some worker.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Sets `worker`'s tiers for `key`: 0 removes the worker, and a key with
    /// no holder left is removed.
    pub(super) fn set(&mut self, key: u64, worker: u32, tiers: u8) {
        self.update(key, worker, |_| tiers);
    }

    /// Sets `worker`'s tiers for `key`, which it does not hold under another
    /// engine hash: one probe when nobody holds the key yet.
    #[inline]
    pub(super) fn add(&mut self, key: u64, worker: u32, tiers: u8) {
        if self.map.insert_new(key, pack(worker, tiers) as u64).is_some() {
            self.set(key, worker, tiers);
        }
    }

    /// `worker`'s tiers for `key` (0 when it does not hold it).
    pub(super) fn tiers(&self, key: u64, worker: u32) -> u8 {
        self.get(key).and_then(|h| h.as_slice().iter().find(|x| *x >> 2 == worker).map(|x| (x & 3) as u8)).unwrap_or(0)
    }

    /// Replaces `worker`'s tiers `t` for `key` by `f(t)` (0 when it did not
    /// hold the key; a result of 0 removes the worker, and a key with no
    /// holder left is removed). Returns the tiers before and after: one probe
    /// for a read and a write. Inline: it sits in the loops of every store
    /// and removal, which lie in another module (without the hint it stayed
    /// a call per block there).
    #[inline]
    pub(super) fn update(&mut self, key: u64, worker: u32, f: impl FnOnce(u8) -> u8) -> (u8, u8) {
        let Some(v) = self.map.get_mut(key) else {
            let tiers = f(0);
            if tiers != 0 {
                self.map.insert(key, pack(worker, tiers) as u64);
            }
            return (0, tiers);
        };
        self.scratch.clear();
        if *v & MANY == 0 {
            let one = *v as u32;
            if one >> 2 == worker {
                let old = (one & 3) as u8;
                let tiers = f(old);
                if tiers == 0 {
                    self.map.remove(key);
                } else {
                    *v = pack(worker, tiers) as u64;
                }
                return (old, tiers);
            }
            let tiers = f(0);
            if tiers == 0 {
                return (0, 0);
            }
            let new = pack(worker, tiers);
            self.scratch.extend(if one >> 2 < worker { [one, new] } else { [new, one] });
            *v = MANY | self.sets.acquire(&self.scratch) as u64;
            return (0, tiers);
        }
        {
            let id = (*v & !MANY) as u32;
            let list = self.sets.get(id);
            let pos = list.binary_search_by_key(&worker, |x| x >> 2);
            let old = pos.map_or(0, |p| (list[p] & 3) as u8);
            let tiers = f(old);
            if tiers == old {
                return (old, tiers);
            }
            self.scratch.extend_from_slice(list);
            match pos {
                Ok(p) if tiers == 0 => {
                    self.scratch.remove(p);
                }
                Ok(p) => self.scratch[p] = pack(worker, tiers),
                Err(p) => self.scratch.insert(p, pack(worker, tiers)),
            }
            match self.scratch.as_slice() {
                [] => unreachable!("a set holds two workers or more"),
                [last] => *v = *last as u64,
                list => *v = MANY | self.sets.acquire(list) as u64,
            }
            self.sets.release(id);
            (old, tiers)
        }
    }

    /// Bytes allocated (capacity times entry size, an estimate).
    pub(super) fn bytes(&self) -> usize {
        self.map.bytes() + self.sets.bytes() + self.scratch.capacity() * 4
    }
}
