//! The shared holder index: for each router key, the workers holding it and
//! in which tiers.
//!
//! Most keys have one holder, so a slot of the table holds that holder packed
//! in place (`worker << 2 | tier bits`); a key held by several workers points
//! into an overflow list instead. A lookup of a singly held key is then one
//! probe with no second load.

use kvcore::Tier;

use crate::table::U64Table;

/// A tier's bit in a block's holder mask.
pub(super) fn tier_bit(tier: Tier) -> u8 {
    1 << tier as u8
}

/// Every tier bit a holder may carry.
pub(super) const TIER_BITS: u8 = 0b11;

/// Marks a holder value that is an index into the overflow lists.
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
/// `worker << 2 | tier bits`, or, with [`MANY`] set, an index into
/// `overflow` where the holders of a key held by several workers are listed.
#[derive(Debug)]
pub(super) struct HolderIndex {
    /// Router key to its packed holder, or to an overflow list.
    pub(super) map: U64Table<u64>,
    /// The holders of keys held by several workers, packed.
    pub(super) overflow: Vec<Vec<u32>>,
    /// Overflow lists free for reuse.
    free: Vec<u32>,
}

impl Default for HolderIndex {
    fn default() -> Self {
        Self { map: U64Table::with_four_fold_below(HOLDER_FOUR_BELOW), overflow: Vec::new(), free: Vec::new() }
    }
}

/// The holders of one key, borrowed.
pub(super) enum HolderRef<'a> {
    /// A key held by one worker: its packed holder.
    One([u32; 1]),
    /// A key held by several workers: their overflow list.
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
        let v = *self.map.get(key)?;
        Some(if v & MANY != 0 {
            HolderRef::Many(&self.overflow[(v & !MANY) as usize])
        } else {
            HolderRef::One([v as u32])
        })
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
            if tiers != 0 {
                let list = vec![one, pack(worker, tiers)];
                let slot = match self.free.pop() {
                    Some(i) => {
                        self.overflow[i as usize] = list;
                        i
                    }
                    None => {
                        self.overflow.push(list);
                        self.overflow.len() as u32 - 1
                    }
                };
                *v = MANY | slot as u64;
            }
            return (0, tiers);
        }
        let slot = (*v & !MANY) as usize;
        let list = &mut self.overflow[slot];
        let pos = list.iter().position(|x| *x >> 2 == worker);
        let old = pos.map_or(0, |p| (list[p] & 3) as u8);
        let tiers = f(old);
        match pos {
            Some(p) if tiers == 0 => {
                list.swap_remove(p);
            }
            Some(p) => list[p] = pack(worker, tiers),
            None if tiers != 0 => list.push(pack(worker, tiers)),
            None => {}
        }
        if list.len() <= 1 {
            match list.pop() {
                Some(last) => *v = last as u64,
                None => {
                    self.map.remove(key);
                }
            }
            self.overflow[slot] = Vec::new();
            self.free.push(slot as u32);
        }
        (old, tiers)
    }

    /// Bytes allocated (capacity times entry size, an estimate).
    pub(super) fn bytes(&self) -> usize {
        self.map.bytes()
            + self.overflow.capacity() * 24
            + self.overflow.iter().map(|v| v.capacity() * 4).sum::<usize>()
            + self.free.capacity() * 4
    }
}
