//! The shared holder index: for each router key, the workers holding it and
//! in which tiers.
//!
//! Most keys have one holder, so a slot of the table holds that holder packed
//! in place (`worker << 2 | tier bits`); a key held by several workers points
//! to an interned holder set instead (one list for every key with the same
//! holders and tiers). A lookup of a singly held key is then one probe with
//! no second load.

use kvcore::Tier;

use super::runs::Runs;
use crate::table::U64Table;

/// A tier's bit in a block's holder mask.
pub(super) fn tier_bit(tier: Tier) -> u8 {
    1 << tier as u8
}

/// Every tier bit a holder may carry.
pub(super) const TIER_BITS: u8 = 0b11;

/// Marks a holder value that is the id of an interned holder set.
pub(super) const MANY: u32 = 1 << 31;

/// A value of the holder index's map: the key's holder value (low 32 bits)
/// and its slot in the runs (high 32 bits).
#[inline(always)]
pub(super) fn entry(holder: u32, slot: u32) -> u64 {
    holder as u64 | (slot as u64) << 32
}

/// The holder value of a map entry.
#[inline(always)]
pub(super) fn holder_of(v: u64) -> u32 {
    v as u32
}

/// The slot in the runs of a map entry.
#[inline(always)]
pub(super) fn slot_of(v: u64) -> u32 {
    (v >> 32) as u32
}

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

/// The workers holding each router key. A key's holder value is one holder
/// packed as `worker << 2 | tier bits`, or, with [`MANY`] set, the id of an
/// interned holder set in `sets`; its map entry holds that value and the
/// key's slot in the runs (`runs.rs`), where the value is kept too.
///
/// Holder sets are interned: every key held by the same workers in the same
/// tiers points at one shared, sorted list. The keys of a prefix that a
/// group of workers holds as a whole then carry one id, so a lookup compares
/// ids from key to key and walks a list only where the holders change: its
/// cost does not grow with the holders per key (see `Indexer::find_matches`).
#[derive(Debug)]
pub(super) struct HolderIndex {
    /// Router key to its [`entry`]: holder value and slot.
    pub(super) map: U64Table<u64>,
    /// Every key and its holder value in store order (`runs.rs`).
    pub(super) runs: Runs,
    /// The interned holder sets.
    sets: HolderSets,
    /// The next list of an update, built before it is interned.
    scratch: Vec<u32>,
}

impl Default for HolderIndex {
    fn default() -> Self {
        Self {
            map: U64Table::with_four_fold_below(HOLDER_FOUR_BELOW),
            runs: Runs::default(),
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
    /// Each id's generation, advanced when its list is dropped, so that a
    /// remembered transition naming an id from before is not taken.
    gens: Vec<u32>,
    /// Recent transitions (empty until the first one).
    moves: Vec<Move>,
}

/// Entries of the transition cache, a power of two.
const MOVES: usize = 1 << 12;

/// A remembered transition: holder value `src` with holder `op` set (a
/// worker and its new tier bits, 0 tiers for its removal) gave `dst`.
/// Many keys of a prefix go through the same transition one after another
/// (a worker storing or dropping a prefix others hold): after the first,
/// each is a cache hit instead of a list built, hashed and looked up.
#[derive(Clone, Copy, Debug, Default)]
struct Move {
    src: u32,
    src_gen: u32,
    op: u32,
    dst: u32,
    dst_gen: u32,
}

/// The cache entry of a transition.
#[inline]
fn move_slot(src: u32, op: u32) -> usize {
    ((src.wrapping_mul(0x9E37_79B1) ^ op.wrapping_mul(0x85EB_CA77)).rotate_left(7).wrapping_mul(0xC2B2_AE3D) >> 20)
        as usize
        & (MOVES - 1)
}

impl HolderSets {
    /// The generation of a holder value: its set's for a set, 0 for one
    /// holder.
    #[inline]
    fn gen_of(&self, h: u32) -> u32 {
        if h & MANY != 0 { self.gens[(h & !MANY) as usize] } else { 0 }
    }

    /// The holder value that `src` with holder `op` set became the last
    /// time, if that is remembered and both sets are still the same ones.
    /// The result's set (if one) is acquired for the caller.
    #[inline]
    fn remembered(&mut self, src: u32, op: u32) -> Option<u32> {
        let m = *self.moves.get(move_slot(src, op))?;
        if m.src != src || m.op != op || m.dst == 0 || m.src_gen != self.gen_of(src) || m.dst_gen != self.gen_of(m.dst)
        {
            return None;
        }
        if m.dst & MANY != 0 {
            self.refs[(m.dst & !MANY) as usize] += 1;
        }
        Some(m.dst)
    }

    /// Remembers that `src` with holder `op` set gave `dst`.
    #[inline]
    fn remember(&mut self, src: u32, op: u32, dst: u32) {
        if self.moves.is_empty() {
            self.moves = vec![Move::default(); MOVES];
        }
        let (src_gen, dst_gen) = (self.gen_of(src), self.gen_of(dst));
        self.moves[move_slot(src, op)] = Move { src, src_gen, op, dst, dst_gen };
    }

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
                self.gens.push(0);
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
            self.gens[id as usize] = self.gens[id as usize].wrapping_add(1);
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
            + self.gens.capacity() * 4
            + self.moves.capacity() * std::mem::size_of::<Move>()
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
        self.map.get(key).map(|v| self.resolve(holder_of(*v)))
    }

    /// The holders a holder value stands for.
    #[inline]
    pub(super) fn resolve(&self, h: u32) -> HolderRef<'_> {
        if h & MANY != 0 { HolderRef::Many(self.sets.get(h & !MANY)) } else { HolderRef::One([h]) }
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

    /// Adds `tiers` to `worker`'s for `key`, for an engine hash of the worker
    /// newly keyed `key`: one probe when nobody holds the key yet. Returns the
    /// worker's tiers before (not 0 when it holds the key under another
    /// hash, which the caller records, see `worker::Dup`).
    #[inline(always)]
    pub(super) fn add(&mut self, key: u64, worker: u32, tiers: u8) -> u8 {
        let stream = worker as usize + 1;
        let holder = pack(worker, tiers);
        let slot = self.runs.next_slot(stream);
        match self.map.insert_new(key, entry(holder, slot)) {
            None => {
                self.runs.fill(stream, slot, key, holder);
                0
            }
            Some(_) => self.add_held(key, worker, tiers),
        }
    }

    /// [`HolderIndex::add`] of a key that others hold: out of line, so that
    /// the common path stays small where it is inlined.
    #[inline(never)]
    fn add_held(&mut self, key: u64, worker: u32, tiers: u8) -> u8 {
        self.update(key, worker, |t| t | tiers).0
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
                let stream = worker as usize + 1;
                let holder = pack(worker, tiers);
                let slot = self.runs.take(stream, key, holder);
                self.map.insert(key, entry(holder, slot));
            }
            return (0, tiers);
        };
        self.scratch.clear();
        let (h, slot) = (holder_of(*v), slot_of(*v));
        if h & MANY == 0 {
            if h >> 2 == worker {
                let old = (h & 3) as u8;
                let tiers = f(old);
                if tiers == 0 {
                    self.map.remove(key);
                    if self.runs.release(slot) {
                        self.compact();
                    }
                } else {
                    let nh = pack(worker, tiers);
                    *v = entry(nh, slot);
                    self.runs.holders[slot as usize] = nh;
                }
                return (old, tiers);
            }
            let tiers = f(0);
            if tiers == 0 {
                return (0, 0);
            }
            let new = pack(worker, tiers);
            let nh = match self.sets.remembered(h, new) {
                Some(nh) => nh,
                None => {
                    self.scratch.extend(if h >> 2 < worker { [h, new] } else { [new, h] });
                    let nh = MANY | self.sets.acquire(&self.scratch);
                    self.sets.remember(h, new, nh);
                    nh
                }
            };
            *v = entry(nh, slot);
            self.runs.holders[slot as usize] = nh;
            return (0, tiers);
        }
        let id = h & !MANY;
        let list = self.sets.get(id);
        let pos = list.binary_search_by_key(&worker, |x| x >> 2);
        let old = pos.map_or(0, |p| (list[p] & 3) as u8);
        let tiers = f(old);
        if tiers == old {
            return (old, tiers);
        }
        let op = pack(worker, tiers);
        let nh = match self.sets.remembered(h, op) {
            Some(nh) => nh,
            None => {
                let list = self.sets.get(id);
                self.scratch.extend_from_slice(list);
                match pos {
                    Ok(p) if tiers == 0 => {
                        self.scratch.remove(p);
                    }
                    Ok(p) => self.scratch[p] = op,
                    Err(p) => self.scratch.insert(p, op),
                }
                let nh = match self.scratch.as_slice() {
                    [] => unreachable!("a set holds two workers or more"),
                    [last] => *last,
                    list => MANY | self.sets.acquire(list),
                };
                self.sets.remember(h, op, nh);
                nh
            }
        };
        *v = entry(nh, slot);
        self.runs.holders[slot as usize] = nh;
        self.sets.release(id);
        (old, tiers)
    }

    /// Moves the keys of the runs' sparse chunks together, so that the
    /// chunks in use are at least half live again (`runs.rs`).
    #[cold]
    fn compact(&mut self) {
        let Self { map, runs, .. } = self;
        for c in runs.sparse_chunks() {
            runs.relocate(c, |key, slot| {
                if let Some(v) = map.get_mut(key) {
                    *v = entry(holder_of(*v), slot);
                }
            });
        }
    }

    /// Checks that every key's entry names a slot holding that key and its
    /// holder value, and that no other slot is live; panics naming what is
    /// wrong.
    pub(super) fn check_runs(&self) {
        self.runs.check();
        for (k, v) in self.map.iter() {
            let s = slot_of(*v) as usize;
            assert_eq!(self.runs.keys.get(s), Some(&k), "runs: key {k:x} sits in its slot");
            assert_eq!(self.runs.holders[s], holder_of(*v), "runs: key {k:x}'s slot has its holders");
        }
        assert_eq!(self.runs.live(), self.map.len(), "runs: one live slot a key");
        let mut refs = vec![0u32; self.sets.refs.len()];
        for (_, v) in self.map.iter() {
            let h = holder_of(*v);
            if h & MANY != 0 {
                refs[(h & !MANY) as usize] += 1;
                assert!(self.sets.get(h & !MANY).len() >= 2, "sets: a set holds two workers or more");
            }
        }
        assert_eq!(refs, self.sets.refs, "sets: each set counted by the keys using it");
        let slack = (self.runs.streams() + 3) * super::runs::CHUNK;
        assert!(
            self.runs.slots_used() <= 2 * self.runs.live() + slack,
            "runs: {} slots in use for {} keys",
            self.runs.slots_used(),
            self.runs.live()
        );
    }

    /// Bytes allocated (capacity times entry size, an estimate).
    pub(super) fn bytes(&self) -> usize {
        self.map.bytes() + self.runs.bytes() + self.sets.bytes() + self.scratch.capacity() * 4
    }
}
