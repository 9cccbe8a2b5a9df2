//! The shared holder index: for each router key, the workers holding it and
//! in which tiers.
//!
//! Every held key has a slot in the runs (`runs.rs`), which holds its holder
//! value: most keys have one holder, packed in place (`worker << 2 | tier
//! bits`); a key held by several workers names an interned holder set
//! instead (one list for every key with the same holders and tiers).
//!
//! Where a key is found:
//!
//! ```text
//!   parent's slot p ──► slot p + 1 holds the key?  (a chained key: no probe)
//!   otherwise ────────► heads: router key ──► slot  (run heads only)
//! ```
//!
//! Why this shape: a worker's blocks are stored in order, so nearly every
//! key lands in the slot after its parent's. Only the keys that do not (a
//! chain start, the first key a worker adds after a prefix another worker
//! laid out, a key whose parent died or that a compaction moved apart) go
//! into the map of run heads. That map is a small fraction of the keys, so
//! it mostly stays in cache, and a store or removal of a block touches one
//! random line (its entry in the worker's table) instead of two. The
//! workers' tables name each block's key by its slot.
//!
//! The invariant, checked by `check_runs`: a live key not in the map sits
//! right after its parent's live slot. A slot dying (its last holder gone)
//! puts the key after it into the map, if that key was chained to it.

use hashbrown::HashTable;
use kvcore::Tier;

use super::runs::{CHUNK, Runs};
use crate::table::U64Table;

/// A tier's bit in a block's holder mask.
pub(super) fn tier_bit(tier: Tier) -> u8 {
    1 << tier as u8
}

/// Every tier bit a holder may carry.
pub(super) const TIER_BITS: u8 = 0b11;

/// Marks a holder value that is the id of an interned holder set.
pub(super) const MANY: u32 = 1 << 31;

/// The workers holding each router key. A key's holder value, in its slot
/// of the runs, is one holder packed as `worker << 2 | tier bits`, or, with
/// [`MANY`] set, the id of an interned holder set in `sets`.
///
/// Holder sets are interned: every key held by the same workers in the same
/// tiers points at one shared, sorted list. The keys of a prefix that a
/// group of workers holds as a whole then carry one id, so a lookup compares
/// ids from key to key and walks a list only where the holders change: its
/// cost does not grow with the holders per key (see `Indexer::find_matches`).
#[derive(Debug)]
pub(super) struct HolderIndex {
    /// Run heads: the router key to the slot of every key that is not
    /// chained to its parent's slot (see the module docs).
    pub(super) map: U64Table<u32>,
    /// Every key and its holder value in store order (`runs.rs`).
    pub(super) runs: Runs,
    /// The interned holder sets.
    sets: HolderSets,
    /// The next list of an update, built before it is interned.
    scratch: Vec<u32>,
    /// Slots freed since the last [`HolderIndex::settle`], whose next slot
    /// may hold a key chained to them.
    released: Vec<u32>,
}

impl Default for HolderIndex {
    fn default() -> Self {
        Self {
            // Every new key of a store misses in it (unless the key is held
            // elsewhere already): held to a quarter's load, a miss is mostly
            // one slot. The heads are few (a percent or two of the keys).
            map: U64Table::sparse(),
            runs: Runs::default(),
            sets: HolderSets::default(),
            scratch: Vec::new(),
            released: Vec::new(),
        }
    }
}

/// Where a compaction moved slots: for each moved chunk, the new slot of
/// each of its live slots, so that the workers' tables can follow; and
/// which workers hold a moved key, so that only their tables are read.
#[derive(Debug, Default)]
pub(super) struct Moved {
    /// Each chunk's index into `to`, or `u32::MAX` for a chunk not moved.
    chunk: Vec<u32>,
    /// `CHUNK` new slots per moved chunk.
    to: Vec<u32>,
    /// A bit per worker holding a moved key.
    workers: Vec<u64>,
}

impl Moved {
    /// Whether worker `w` holds a key that moved: a worker's table names
    /// only keys it holds, so the table of one that holds none has nothing
    /// to follow.
    #[inline]
    pub(super) fn touches(&self, w: usize) -> bool {
        self.workers.get(w / 64).is_some_and(|b| b & 1 << (w % 64) != 0)
    }

    /// The slot that `slot` moved to, if its chunk moved.
    #[inline]
    pub(super) fn get(&self, slot: u32) -> Option<u32> {
        let c = *self.chunk.get(slot as usize / CHUNK)?;
        (c != u32::MAX).then(|| self.to[c as usize * CHUNK + slot as usize % CHUNK])
    }
}

/// Sets worker `w`'s bit in `bits`.
fn mark(bits: &mut Vec<u64>, w: u32) {
    let (i, bit) = (w as usize / 64, 1u64 << (w % 64));
    if i >= bits.len() {
        bits.resize(i + 1, 0);
    }
    bits[i] |= bit;
}

/// Interned holder lists, sorted by worker, counted by the keys using them.
#[derive(Debug, Default)]
struct HolderSets {
    /// The lists by id (empty while the id is free).
    lists: Vec<Box<[u32]>>,
    /// Each live list's hash (by `hasher`).
    hashes: Vec<u64>,
    /// Keys using each list.
    refs: Vec<u32>,
    /// The live ids, hashed by their lists: each list is held once, and
    /// dropping one finds its entry by its remembered hash and its id,
    /// without hashing or comparing the list again.
    ids: HashTable<u32>,
    /// The hasher of the lists.
    hasher: ahash::RandomState,
    /// Ids free for reuse.
    free: Vec<u32>,
    /// Each id's generation, advanced when its list is dropped, so that a
    /// remembered transition naming an id from before is not taken.
    gens: Vec<u32>,
    /// Recent transitions (empty until the first one).
    moves: Vec<Move>,
    /// The last transition taken, checked before `moves`: the keys of a
    /// prefix one after another take the same one, and this is in a
    /// register's reach where a slot of `moves` may be a cache miss.
    /// Cleared when a set is dropped.
    last: Move,
}

/// Entries of the transition cache, a power of two.
const MOVES: usize = 1 << 12;

/// A change of one worker's tiers for a key, as the holder index takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TierOp {
    /// Adds these tiers.
    Add(u8),
    /// Takes these tiers away.
    Drop(u8),
    /// Sets the tiers to these (0: the worker no longer holds the key).
    Set(u8),
}

impl TierOp {
    /// The tiers after the change, from `t`.
    #[inline(always)]
    pub(super) fn apply(self, t: u8) -> u8 {
        match self {
            TierOp::Add(b) => t | b,
            TierOp::Drop(b) => t & !b,
            TierOp::Set(b) => b,
        }
    }

    /// A small code naming the change, for the transition cache.
    #[inline(always)]
    fn code(self) -> u8 {
        match self {
            TierOp::Add(b) => b,
            TierOp::Drop(b) => 4 | b,
            TierOp::Set(b) => 8 | b,
        }
    }
}

/// A remembered transition: holder value `src`, with `worker`'s tiers
/// changed by the operation `code` ([`TierOp`]), gave `dst`, the worker's
/// tiers going from `old` to `new`. Many keys of a prefix go through the
/// same transition one after another (a worker storing or dropping a prefix
/// others hold): after the first, each is a cache hit, without reading the
/// source list, nor building, hashing and looking up the new one.
#[derive(Clone, Copy, Debug, Default)]
struct Move {
    src: u32,
    src_gen: u32,
    worker: u32,
    dst: u32,
    dst_gen: u32,
    code: u8,
    old: u8,
    new: u8,
}

/// The cache entry of a transition.
#[inline]
fn move_slot(src: u32, worker: u32, code: u8) -> usize {
    let op = worker << 4 ^ code as u32;
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

    /// What holder value `src` became, with `worker`'s tiers before and
    /// after, if the last transition taken was this one (`worker`'s tiers
    /// in `src` changed by `op`): the keys of a prefix one after another
    /// take it, so this check sits inline in every update of a shared key
    /// and the rest stays out of line. The result's set (if one) is
    /// acquired for the caller.
    #[inline(always)]
    fn repeated(&mut self, src: u32, worker: u32, op: TierOp) -> Option<(u32, u8, u8)> {
        let l = self.last;
        if l.src == src && l.worker == worker && l.code == op.code() && l.dst != 0 {
            if l.dst & MANY != 0 {
                self.refs[(l.dst & !MANY) as usize] += 1;
            }
            return Some((l.dst, l.old, l.new));
        }
        None
    }

    /// What holder value `src` became the last time `worker`'s tiers in
    /// it changed by `op`, from the transition cache (the caller checked
    /// [`HolderSets::repeated`] first), as that gives it.
    #[inline]
    fn remembered(&mut self, src: u32, worker: u32, op: TierOp) -> Option<(u32, u8, u8)> {
        let code = op.code();
        let m = *self.moves.get(move_slot(src, worker, code))?;
        if m.src != src
            || m.worker != worker
            || m.code != code
            || m.dst == 0
            || m.src_gen != self.gen_of(src)
            || m.dst_gen != self.gen_of(m.dst)
        {
            return None;
        }
        if m.dst & MANY != 0 {
            self.refs[(m.dst & !MANY) as usize] += 1;
        }
        self.last = m;
        Some((m.dst, m.old, m.new))
    }

    /// Remembers that `src`, with `worker`'s tiers changed by `op` from
    /// `old` to `new`, gave `dst`.
    #[inline]
    fn remember(&mut self, src: u32, worker: u32, op: TierOp, dst: u32, old: u8, new: u8) {
        if self.moves.is_empty() {
            self.moves = vec![Move::default(); MOVES];
        }
        let (src_gen, dst_gen, code) = (self.gen_of(src), self.gen_of(dst), op.code());
        let m = Move { src, src_gen, worker, dst, dst_gen, code, old, new };
        self.moves[move_slot(src, worker, code)] = m;
        self.last = m;
    }

    fn get(&self, id: u32) -> &[u32] {
        &self.lists[id as usize]
    }

    /// The id of `list`, one more key using it.
    fn acquire(&mut self, list: &[u32]) -> u32 {
        let hash = self.hasher.hash_one(list);
        let lists = &self.lists;
        if let Some(&id) = self.ids.find(hash, |&id| *lists[id as usize] == *list) {
            self.refs[id as usize] += 1;
            return id;
        }
        let b: Box<[u32]> = list.into();
        let id = match self.free.pop() {
            Some(id) => {
                self.lists[id as usize] = b;
                self.hashes[id as usize] = hash;
                self.refs[id as usize] = 1;
                id
            }
            None => {
                self.lists.push(b);
                self.hashes.push(hash);
                self.refs.push(1);
                self.gens.push(0);
                self.lists.len() as u32 - 1
            }
        };
        let hashes = &self.hashes;
        self.ids.insert_unique(hash, id, |&id| hashes[id as usize]);
        id
    }

    /// One key fewer using `id`; the list is dropped with its last key.
    /// The count inline (it sits in every update of a shared key), the
    /// drop out of line.
    #[inline]
    fn release(&mut self, id: u32) {
        let r = &mut self.refs[id as usize];
        *r -= 1;
        if *r == 0 {
            self.drop_set(id);
        }
    }

    /// Drops set `id`, which no key uses any more.
    #[cold]
    #[inline(never)]
    fn drop_set(&mut self, id: u32) {
        match self.ids.find_entry(self.hashes[id as usize], |&other| other == id) {
            Ok(entry) => drop(entry.remove()),
            Err(_) => debug_assert!(false, "a live set has its intern entry"),
        }
        self.lists[id as usize] = Box::default();
        self.gens[id as usize] = self.gens[id as usize].wrapping_add(1);
        self.last = Move::default();
        self.free.push(id);
    }

    fn bytes(&self) -> usize {
        let listed: usize = self.lists.iter().map(|l| l.len() * 4).sum();
        // Each list is held once; the intern table's slots hold an id and a
        // control byte.
        self.lists.capacity() * 16
            + self.hashes.capacity() * 8
            + self.refs.capacity() * 4
            + listed
            + self.ids.capacity() * 5
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
    /// The holders a holder value stands for.
    #[inline]
    pub(super) fn resolve(&self, h: u32) -> HolderRef<'_> {
        if h & MANY != 0 { HolderRef::Many(self.sets.get(h & !MANY)) } else { HolderRef::One([h]) }
    }

    /// The holders of the key in live slot `slot`.
    #[inline]
    pub(super) fn at(&self, slot: u32) -> HolderRef<'_> {
        self.resolve(self.runs.holders[slot as usize])
    }

    /// The key in slot `slot`.
    #[inline(always)]
    pub(super) fn key_at(&self, slot: u32) -> u64 {
        self.runs.keys[slot as usize]
    }

    /// Interned holder sets in use.
    #[cfg(test)]
    pub(super) fn sets_live(&self) -> usize {
        self.sets.ids.len()
    }

    /// Keys held by some worker.
    pub(super) fn len(&self) -> usize {
        self.runs.live()
    }

    /// The slot of `key`, given the slot of its parent key when that is
    /// live (`None` for a chain start, or when unknown): the slot after the
    /// parent's if the key sits there, else the map of run heads.
    #[inline(always)]
    pub(super) fn find(&self, key: u64, after: Option<u32>) -> Option<u32> {
        if let Some(p) = after {
            let s = p as usize + 1;
            if self.runs.keys.get(s) == Some(&key) && self.runs.holders[s] != 0 {
                return Some(s as u32);
            }
        }
        self.map.get(key).copied()
    }

    /// Adds `tiers` to `worker`'s for `key`, whose parent key is live in
    /// slot `after` (`None` for a chain start), for an engine hash of the
    /// worker newly keyed `key`. Returns the key's slot and the worker's
    /// tiers before (not 0 when it holds the key under another hash, which
    /// the caller records, see `worker::Dup`). A new key takes the worker's
    /// next slot in the runs and goes into the map of run heads unless that
    /// slot is the one after its parent's.
    #[inline(always)]
    pub(super) fn hold(&mut self, key: u64, worker: u32, tiers: u8, after: Option<u32>) -> (u32, u8) {
        if let Some(s) = self.find(key, after) {
            return (s, self.add_held(s, worker, tiers));
        }
        let stream = worker as usize + 1;
        let slot = self.runs.next_slot(stream);
        self.runs.fill(stream, slot, key, pack(worker, tiers));
        if after.is_none_or(|p| p + 1 != slot) {
            self.map.insert(key, slot);
            self.runs.set_mapped(slot as usize);
        }
        (slot, 0)
    }

    /// [`HolderIndex::hold`] of a key already held. Inline: a stored event
    /// probes and fills its blocks in one loop (`apply.rs`), and a key held
    /// by other workers is most of a shared prefix's blocks; the change of
    /// a shared key's holders stays out of line.
    #[inline(always)]
    fn add_held(&mut self, slot: u32, worker: u32, tiers: u8) -> u8 {
        self.update_at(slot, worker, TierOp::Add(tiers)).0
    }

    /// `worker`'s tiers for the key in slot `slot` (0 when it does not hold
    /// it, or the slot is dead).
    pub(super) fn tiers_at(&self, slot: u32, worker: u32) -> u8 {
        if self.runs.holders.get(slot as usize).is_none_or(|h| *h == 0) {
            return 0;
        }
        self.at(slot).as_slice().iter().find(|x| *x >> 2 == worker).map_or(0, |x| (x & 3) as u8)
    }

    /// Changes `worker`'s tiers for the key in slot `slot` by `op` (from 0
    /// when it did not hold the key; a result of 0 removes the worker, and
    /// a key with no holder left frees its slot). Returns the tiers before
    /// and after. A dead slot is left alone: `(0, 0)`. Inline: it sits in
    /// the loops of every store and removal, which lie in another module.
    #[inline(always)]
    pub(super) fn update_at(&mut self, slot: u32, worker: u32, op: TierOp) -> (u8, u8) {
        let s = slot as usize;
        let h = self.runs.holders[s];
        if h == 0 {
            return (0, 0);
        }
        if h & MANY == 0 && h >> 2 == worker {
            let old = (h & 3) as u8;
            let tiers = op.apply(old);
            if tiers == 0 {
                self.free(slot);
            } else {
                self.runs.holders[s] = pack(worker, tiers);
            }
            return (old, tiers);
        }
        if let Some((nh, old, tiers)) = self.sets.repeated(h, worker, op) {
            self.runs.holders[s] = nh;
            if h & MANY != 0 {
                self.sets.release(h & !MANY);
            }
            return (old, tiers);
        }
        self.update_shared(s, h, worker, op)
    }

    /// [`HolderIndex::update_at`] where the key's holders are not `worker`
    /// alone: a holder set to change, or one to make. A transition taken
    /// before is a hit in the transition cache, which gives the new holder
    /// value and the worker's tiers without reading the list.
    #[inline(never)]
    fn update_shared(&mut self, s: usize, h: u32, worker: u32, op: TierOp) -> (u8, u8) {
        if let Some((nh, old, tiers)) = self.sets.remembered(h, worker, op) {
            self.runs.holders[s] = nh;
            if h & MANY != 0 {
                self.sets.release(h & !MANY);
            }
            return (old, tiers);
        }
        self.scratch.clear();
        if h & MANY == 0 {
            // One other holder: a set of two, unless the worker gains nothing.
            let tiers = op.apply(0);
            let nh = if tiers == 0 {
                h
            } else {
                let new = pack(worker, tiers);
                self.scratch.extend(if h >> 2 < worker { [h, new] } else { [new, h] });
                MANY | self.sets.acquire(&self.scratch)
            };
            self.sets.remember(h, worker, op, nh, 0, tiers);
            self.runs.holders[s] = nh;
            return (0, tiers);
        }
        let id = h & !MANY;
        let list = self.sets.get(id);
        let pos = list.binary_search_by_key(&worker, |x| x >> 2);
        let old = pos.map_or(0, |p| (list[p] & 3) as u8);
        let tiers = op.apply(old);
        if tiers == old {
            self.sets.remember(h, worker, op, h, old, tiers);
            return (old, tiers);
        }
        let new = pack(worker, tiers);
        self.scratch.extend_from_slice(list);
        match pos {
            Ok(p) if tiers == 0 => {
                self.scratch.remove(p);
            }
            Ok(p) => self.scratch[p] = new,
            Err(p) => self.scratch.insert(p, new),
        }
        let nh = match self.scratch.as_slice() {
            [] => unreachable!("a set holds two workers or more"),
            [last] => *last,
            list => MANY | self.sets.acquire(list),
        };
        self.sets.remember(h, worker, op, nh, old, tiers);
        self.runs.holders[s] = nh;
        self.sets.release(id);
        (old, tiers)
    }

    /// Frees the slot of a key with no holder left: out of the map if it
    /// was a run head, and noted for [`HolderIndex::settle`], which puts the
    /// key chained after it (if any) into the map.
    #[inline]
    fn free(&mut self, slot: u32) {
        if self.runs.mapped(slot as usize) {
            self.map.remove(self.runs.keys[slot as usize]);
        }
        self.runs.release(slot);
        self.released.push(slot);
    }

    /// Whether slots were freed since the last settle.
    #[inline(always)]
    pub(super) fn unsettled(&self) -> bool {
        !self.released.is_empty()
    }

    /// Restores the invariant after slots were freed: a live key that was
    /// chained to a freed slot becomes a run head. Then compacts the runs
    /// when they waste enough, checked once here rather than at every
    /// freed slot; the slots it moved are returned, for the workers' tables
    /// to follow.
    pub(super) fn settle(&mut self) -> Option<Moved> {
        let mut released = std::mem::take(&mut self.released);
        for &s in &released {
            self.head_if_orphaned(s as usize + 1);
        }
        released.clear();
        self.released = released;
        if !self.runs.wasteful() {
            return None;
        }
        Some(self.compact())
    }

    /// Puts the key in `slot` into the map of run heads if it is live and
    /// not there: called for a slot whose previous slot died or moved, so
    /// that a key chained to it is found again.
    #[inline]
    fn head_if_orphaned(&mut self, slot: usize) {
        if self.runs.holders.get(slot).is_some_and(|h| *h != 0) && !self.runs.mapped(slot) {
            self.map.insert(self.runs.keys[slot], slot as u32);
            self.runs.set_mapped(slot);
        }
    }

    /// Moves the keys of the runs' sparse chunks together, so that the
    /// chunks in use are at least half live again (`runs.rs`). A moved key
    /// stays chained when its parent moved just before it into the slot
    /// before its new one; otherwise it becomes a run head (or its map
    /// entry follows it). A key left in place after a moved chunk becomes
    /// a run head too.
    #[cold]
    fn compact(&mut self) -> Moved {
        let Self { map, runs, sets, .. } = self;
        let chunks = runs.sparse_chunks();
        let mut moved = Moved {
            chunk: vec![u32::MAX; runs.slots() / CHUNK],
            to: vec![0; chunks.len() * CHUNK],
            workers: Vec::new(),
        };
        let mut last: Option<(u32, u32)> = None;
        // The holders of the moved keys: single ones marked as they come,
        // sets once each after the loop.
        let mut workers: Vec<u64> = Vec::new();
        let mut holder_sets: Vec<u32> = Vec::new();
        for (i, &c) in chunks.iter().enumerate() {
            moved.chunk[c as usize] = i as u32;
            let to = &mut moved.to[i * CHUNK..(i + 1) * CHUNK];
            runs.relocate(c, |old, key, h, new, was_mapped| {
                to[old as usize % CHUNK] = new;
                if h & MANY == 0 {
                    mark(&mut workers, h >> 2);
                } else if holder_sets.last() != Some(&(h & !MANY)) {
                    holder_sets.push(h & !MANY);
                }
                let chained = !was_mapped && old > 0 && new > 0 && last == Some((old - 1, new - 1));
                last = Some((old, new));
                if was_mapped {
                    if let Some(v) = map.get_mut(key) {
                        *v = new;
                    }
                    true
                } else if chained {
                    false
                } else {
                    map.insert(key, new);
                    true
                }
            });
        }
        holder_sets.sort_unstable();
        holder_sets.dedup();
        for id in holder_sets {
            for &x in sets.get(id) {
                mark(&mut workers, x >> 2);
            }
        }
        moved.workers = workers;
        for &c in &chunks {
            self.head_if_orphaned((c as usize + 1) * CHUNK);
        }
        moved
    }

    /// Checks that every run head's entry names a live slot holding that
    /// key and marked mapped, that every live key not in the map sits after
    /// a live slot (its parent's), and that the holder sets are counted
    /// right; panics naming what is wrong.
    pub(super) fn check_runs(&self) {
        self.runs.check();
        for (k, &s) in self.map.iter() {
            let s = s as usize;
            assert_eq!(self.runs.keys.get(s), Some(&k), "runs: head {k:x} sits in its slot");
            assert!(self.runs.holders[s] != 0, "runs: head {k:x}'s slot is live");
            assert!(self.runs.mapped(s), "runs: head {k:x}'s slot is marked");
        }
        let mut marked = 0;
        let mut refs = vec![0u32; self.sets.refs.len()];
        for (s, &h) in self.runs.holders.iter().enumerate() {
            if h == 0 {
                continue;
            }
            if self.runs.mapped(s) {
                marked += 1;
            } else {
                assert!(s > 0 && self.runs.holders[s - 1] != 0, "runs: chained slot {s} follows a live slot");
            }
            if h & MANY != 0 {
                refs[(h & !MANY) as usize] += 1;
                assert!(self.sets.get(h & !MANY).len() >= 2, "sets: a set holds two workers or more");
            }
        }
        assert_eq!(marked, self.map.len(), "runs: one marked slot a head");
        assert_eq!(refs, self.sets.refs, "sets: each set counted by the keys using it");
        assert!(self.released.is_empty(), "runs: settled");
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
        self.map.bytes()
            + self.runs.bytes()
            + self.sets.bytes()
            + self.scratch.capacity() * 4
            + self.released.capacity() * 4
    }
}
