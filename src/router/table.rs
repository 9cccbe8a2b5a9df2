//! A hash table for 64-bit hash keys: open addressing, linear probing,
//! key and value side by side in one slot.
//!
//! Why not `HashMap`: the indexer's tables are larger than the cache and
//! every store touches a random slot. `hashbrown` keeps its control bytes
//! apart from its buckets, so a miss costs two cache lines; here a lookup or
//! an insert is one line in the common case. Keys are already hashes, so the
//! slot index is the top bits of one multiply. [`U64Table`]'s deletion
//! shifts later entries back (no tombstones), so the table never degrades
//! under churn; [`SlotTable`], the workers' tables, marks a removed entry
//! dead in place instead (one line written, nothing read past it) and drops
//! the dead entries when it fills.
//!
//! The key `EMPTY` (zero) marks a free slot; an entry whose key is `EMPTY`
//! lives in a side slot instead.

/// The key value that marks a free slot. Zero, so that filling free slots
/// is a `memset` (a fresh apply 2-3 % faster than with `u64::MAX`, whose
/// slots were written one store at a time).
const EMPTY: u64 = 0;

/// Slots below which a full table grows four-fold instead of two-fold,
/// unless it was made with [`U64Table::with_four_fold_below`]: 4 Ki slots
/// (64 KiB of `(u64, u64)` slots).
///
/// Why this low: an indexer holds one such table per worker, and a table
/// that stops growing just after a four-fold step sits at a load of 0.19.
/// At 16 384 blocks a worker (64 workers sharing a million blocks) a bound
/// of 64 Ki slots left each worker table at 65 536 slots, 64 bytes a block
/// where two-fold growth gives 32; the two-fold steps it adds below
/// 64 Ki slots move few keys.
const GROW_FOUR_SLOTS: usize = 1 << 12;

/// Hints the CPU to fetch the cache line holding `value` into every cache
/// level. A hint only: it never faults and nothing waits for it, so a loop
/// may issue many and let their misses overlap with other work.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    safe_arch::prefetch_t0(value);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// Lookups into a [`U64Table`] that does not change meanwhile, with the
/// table's shape (slots, shift, mask) held in registers across calls.
pub(crate) struct Reader<'a, V: Copy> {
    slots: &'a [(u64, V)],
    shift: u32,
    mask: usize,
    side: Option<V>,
}

impl<V: Copy> Reader<'_, V> {
    /// The value of `key`, as [`U64Table::get`] gives it.
    #[inline(always)]
    pub fn get(&self, key: u64) -> Option<V> {
        if key == EMPTY {
            return self.side;
        }
        if self.slots.is_empty() {
            return None;
        }
        let mut i = (key.wrapping_mul(FIB) >> self.shift) as usize;
        loop {
            let (k, v) = self.slots[i & self.mask];
            if k == key {
                return Some(v);
            }
            if k == EMPTY {
                return None;
            }
            i += 1;
        }
    }
}

/// A map from `u64` hash keys to small `Copy` values.
#[derive(Clone, Debug)]
pub(crate) struct U64Table<V: Copy> {
    slots: Vec<(u64, V)>,
    /// log2 of the slot count (0 when no slot is allocated).
    bits: u32,
    /// Slots below which a full table grows four-fold.
    four_below: usize,
    /// The load limit, in quarters of the slots: 3 by default, lower for a
    /// table probed mostly for keys it does not hold ([`U64Table::sparse`]).
    quarters: usize,
    len: usize,
    /// The entry whose key is `EMPTY`, if any.
    side: Option<V>,
}

impl<V: Copy + Default> Default for U64Table<V> {
    fn default() -> Self {
        Self::new()
    }
}

/// The home slot of a key: Fibonacci hashing, the top `bits` bits of one
/// multiply, which spreads random hashes and small integers alike.
#[inline]
fn home(key: u64, bits: u32) -> usize {
    (key.wrapping_mul(FIB) >> (64 - bits)) as usize
}

/// The multiplier of [`home`]: 2⁶⁴ over the golden ratio, odd.
const FIB: u64 = 0x9E37_79B9_7F4A_7C15;

impl<V: Copy + Default> U64Table<V> {
    /// An empty table; nothing is allocated until the first insert.
    pub fn new() -> Self {
        Self::with_four_fold_below(GROW_FOUR_SLOTS)
    }

    /// An empty table that grows four-fold while it has fewer than `slots`
    /// slots (two-fold from there): fewer growths, so fewer keys moved, for
    /// a table of which a process keeps one, where the memory this may cost
    /// (up to `slots` slots more than two-fold growth would hold) matters
    /// less.
    pub fn with_four_fold_below(slots: usize) -> Self {
        Self { slots: Vec::new(), bits: 0, four_below: slots, quarters: 3, len: 0, side: None }
    }

    /// An empty table held to a load of a quarter: for a small table that
    /// is probed mostly for keys it does not hold, where a probe walks on
    /// to the first free slot (some 8 slots at a load of 3/4, under 1.5 at
    /// 1/4) and the four-fold room costs little.
    pub fn sparse() -> Self {
        Self { quarters: 1, ..Self::new() }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len + self.side.is_some() as usize
    }

    /// Slots allocated (tests check the growth rule by it).
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<(u64, V)>()
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Makes room for `more` entries beyond the current ones without growing.
    /// The new slots are written (marked free) now, so their pages are mapped
    /// here rather than at the first inserts.
    pub fn reserve(&mut self, more: usize) {
        let want = (self.len + more) * 4 / self.quarters + 1;
        if want > self.slots.len() {
            self.resize(want.next_power_of_two().max(16), true);
        }
    }

    /// Rehashes the table into a new one of `slots` slots (a power of two,
    /// at least the current count); `write_first`: every new slot is
    /// written free before the keys go in, so that all its pages are
    /// mapped at once (`reserve`), where growth takes the allocator's
    /// zeroed memory, writing one slot a page so that each page faults in
    /// once, as a write.
    ///
    /// Why a new table, read in slot order: the old slots are read as one
    /// stream and each key lands near twice its old home (the top bits of
    /// the same product), so the writes are a second stream; a free old
    /// slot is placed too, into a spare slot past the end, so that the loop
    /// does not branch on it. Rehashing within the old allocation, which
    /// the allocator extends (or copies, for a block it does not remap),
    /// took 4-11 % more of a fresh apply of route-bench's workloads
    /// (docs/benchmarks.md).
    fn resize(&mut self, slots: usize, write_first: bool) {
        self.resize_keeping(slots, write_first, |_| true);
    }

    /// [`U64Table::resize`] that leaves out the entries whose value fails
    /// `keep` (into the spare slot, as a free one), and may stay at the
    /// same size; the caller sets `len` when it leaves any out.
    #[inline]
    fn resize_keeping(&mut self, slots: usize, write_first: bool, keep: impl Fn(&V) -> bool) {
        debug_assert!(slots.is_power_of_two() && slots >= self.slots.len());
        let mut new: Vec<(u64, V)> = if write_first {
            let mut v = Vec::with_capacity(slots + 1);
            v.resize(slots + 1, (EMPTY, V::default()));
            v
        } else {
            // The allocator's zeroed memory, one slot of each 4 KiB page
            // written (the zero it holds) before the loop below reads any:
            // a page first read is mapped twice, the zero page on the read
            // and a page of its own on the first write. `black_box`: the
            // compiler may not take the slots as known zeros and drop the
            // writes.
            let mut v = std::hint::black_box(vec![(EMPTY, V::default()); slots + 1]);
            for s in v.iter_mut().step_by((4096 / std::mem::size_of::<(u64, V)>()).max(1)) {
                s.0 = EMPTY;
            }
            v
        };
        let bits = slots.trailing_zeros();
        let mask = slots - 1;
        for &(k, v) in &self.slots {
            // An entry left out goes where a free slot goes, as a free one.
            let k = if keep(&v) { k } else { EMPTY };
            let mut i = if k == EMPTY { slots } else { home(k, bits) };
            while new[i].0 != EMPTY {
                i = (i + 1) & mask;
            }
            new[i] = (k, v);
        }
        new.truncate(slots);
        self.slots = new;
        self.bits = bits;
    }

    /// Grows a full table: four-fold while it is small, then two-fold.
    ///
    /// Why: each growth moves every key (see `resize`); growing
    /// four-fold up to `GROW_FOUR_SLOTS` (or the table's own bound) cuts the
    /// small steps, at the cost of at most that many slots (64 KiB by
    /// default) of slack in a table that stops growing there.
    #[cold]
    fn grow(&mut self) {
        self.resize(self.grown(), false);
    }

    /// The slot count the table grows to from its current one.
    fn grown(&self) -> usize {
        let n = self.slots.len();
        if n < self.four_below { (n * 4).max(16) } else { n * 2 }
    }

    /// Whether `more` entries beyond the current ones pass the load limit.
    #[inline(always)]
    fn over_limit(&self, more: usize) -> bool {
        (self.len + more) * 4 > self.slots.len() * self.quarters
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = home(key, self.bits);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Hints the CPU to fetch the home line of `key`, so that a caller
    /// touching many keys can start all their cache misses before the
    /// first access: a prefetch is not waited for, where a load that
    /// merely warms the cache still holds its place in the reorder buffer
    /// until its line arrives.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        if !self.slots.is_empty() {
            prefetch(&self.slots[home(key, self.bits)]);
        }
    }

    /// A reader for many lookups in a row: the table's shape read once.
    #[inline]
    pub fn reader(&self) -> Reader<'_, V> {
        Reader { slots: &self.slots, shift: 64 - self.bits, mask: self.slots.len().wrapping_sub(1), side: self.side }
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<&V> {
        if key == EMPTY {
            return self.side.as_ref();
        }
        self.find(key).map(|i| &self.slots[i].1)
    }

    /// The value of `key`, mutably.
    #[inline]
    pub fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        if key == EMPTY {
            return self.side.as_mut();
        }
        self.find(key).map(|i| &mut self.slots[i].1)
    }

    /// The slot of `key` (`Ok`) or the free slot where it goes (`Err`),
    /// growing first when one more entry would pass the load limit. `key`
    /// is not `EMPTY`.
    #[inline]
    fn slot_for_insert(&mut self, key: u64) -> Result<usize, usize> {
        self.make_room(1);
        self.probe(key)
    }

    /// Grows, by the table's own rule, until `more` entries beyond the
    /// current ones fit under its load limit: a caller about to insert
    /// several keys checks the limit once, then probes with
    /// [`U64Table::probe`] and fills with [`U64Table::fill`].
    #[inline]
    pub fn make_room(&mut self, more: usize) {
        while self.over_limit(more) {
            self.grow();
        }
    }

    /// The slot of `key` (`Ok`) or the free slot where it goes (`Err`),
    /// without growing: [`U64Table::make_room`] left room for it. `key` is
    /// not `EMPTY`.
    #[inline(always)]
    pub fn probe(&self, key: u64) -> Result<usize, usize> {
        debug_assert!(key != EMPTY && (self.len + 1) * 4 <= self.slots.len() * self.quarters);
        let mask = self.mask();
        let mut i = home(key, self.bits);
        loop {
            match self.slots[i].0 {
                k if k == key => return Ok(i),
                EMPTY => return Err(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The value in slot `i`, which [`U64Table::probe`] found holding its
    /// key.
    #[inline(always)]
    pub fn value_at(&self, i: usize) -> V {
        self.slots[i].1
    }

    /// Puts `key` with `value` into the free slot `i` that
    /// [`U64Table::probe`] gave for it.
    #[inline(always)]
    pub fn fill(&mut self, i: usize, key: u64, value: V) {
        debug_assert!(self.slots[i].0 == EMPTY && key != EMPTY);
        self.slots[i] = (key, value);
        self.len += 1;
    }

    /// Inserts or replaces; returns the old value.
    #[inline]
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        if key == EMPTY {
            return self.side.replace(value);
        }
        match self.slot_for_insert(key) {
            Ok(i) => Some(std::mem::replace(&mut self.slots[i].1, value)),
            Err(i) => {
                self.slots[i] = (key, value);
                self.len += 1;
                None
            }
        }
    }

    /// The value of `key`, inserting `make()` first when it is absent;
    /// `true` with it when it was. One probe, and `make` runs after the
    /// probe (and any growth), so it may compute the value from other
    /// tables.
    #[inline]
    pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> V) -> (V, bool) {
        if key == EMPTY {
            return match self.side {
                Some(v) => (v, false),
                None => {
                    let v = make();
                    self.side = Some(v);
                    (v, true)
                }
            };
        }
        match self.slot_for_insert(key) {
            Ok(i) => (self.slots[i].1, false),
            Err(i) => {
                let v = make();
                self.slots[i] = (key, v);
                self.len += 1;
                (v, true)
            }
        }
    }

    /// Removes `key`; returns its value. Later entries of the probe run are
    /// shifted back so that no tombstone is left. Inline: it sits in the
    /// loop of every removal event.
    #[inline(always)]
    pub fn remove(&mut self, key: u64) -> Option<V> {
        if key == EMPTY {
            return self.side.take();
        }
        let mut hole = self.find(key)?;
        let value = self.slots[hole].1;
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.slots[j].0;
            if k == EMPTY {
                break;
            }
            // Move slot j into the hole unless its home lies cyclically in
            // (hole, j]: then it must stay where a probe from home finds it.
            let h = home(k, self.bits);
            let stays = if hole <= j { hole < h && h <= j } else { hole < h || h <= j };
            if !stays {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = (EMPTY, V::default());
        self.len -= 1;
        Some(value)
    }

    /// Removes every entry, keeping the allocation.
    pub fn clear(&mut self) {
        if self.len > 0 {
            self.slots.fill((EMPTY, V::default()));
        }
        self.len = 0;
        self.side = None;
    }

    /// Every value, mutably, in slot order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.slots.iter_mut().filter(|(k, _)| *k != EMPTY).map(|(_, v)| v).chain(self.side.iter_mut())
    }

    /// Every entry, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.slots.iter().filter(|(k, _)| *k != EMPTY).map(|(k, v)| (*k, v)).chain(self.side.iter().map(|v| (EMPTY, v)))
    }
}

/// The value that marks a dead entry of a [`SlotTable`]: no slot of the
/// runs has this index.
const DEAD: u32 = u32::MAX;

/// A [`U64Table`] of `u32` values (slots of the runs) whose removals leave
/// the entry in place, marked dead, where [`U64Table::remove`] shifts the
/// entries after it back: a removal then writes the line it found the key
/// in and reads nothing past it. A key stored again finds its dead entry
/// and takes it back; other keys probe past dead entries as past live ones.
///
/// Why: a worker's table takes every removal event's blocks, and on the
/// route-bench streams the shift read the slots after a removed one, in
/// the next cache line in about half of the cases, a miss of its own.
///
/// Dead entries count towards the load limit. When the table is full, they
/// are dropped by a rehash at the same size when they are a sixteenth of
/// the slots or more (room for that many inserts before the next), and
/// otherwise by the growth's own rehash: the table grows only when its live
/// entries pass 11/16 of the slots, where a [`U64Table`] grows at 3/4.
#[derive(Clone, Debug, Default)]
pub(crate) struct SlotTable {
    table: U64Table<u32>,
    /// Entries marked dead.
    dead: usize,
}

impl SlotTable {
    /// Live entries.
    pub fn len(&self) -> usize {
        self.table.len() - self.dead
    }

    /// Slots allocated.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.table.bytes()
    }

    /// [`U64Table::reserve`] (dead entries count as held).
    pub fn reserve(&mut self, more: usize) {
        self.table.reserve(more);
    }

    /// [`U64Table::prefetch`].
    #[inline]
    pub fn prefetch(&self, key: u64) {
        self.table.prefetch(key);
    }

    /// The value of live `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<&u32> {
        self.table.get(key).filter(|v| **v != DEAD)
    }

    /// [`U64Table::make_room`], dropping the dead entries first when the
    /// table is full (see the type's docs).
    #[inline]
    pub fn make_room(&mut self, more: usize) {
        if self.table.over_limit(more) {
            self.drop_dead(more);
        }
    }

    /// The table is full for `more` entries: rehashes without the dead
    /// entries, at the same size when they are worth it, else at the grown
    /// one, then grows on if that is still short.
    #[cold]
    #[inline(never)]
    fn drop_dead(&mut self, more: usize) {
        if self.dead > 0 {
            let t = &mut self.table;
            let live = t.len - self.dead;
            let n = t.slots.len();
            let same = self.dead * 16 >= n && (live + more) * 4 <= n * t.quarters;
            let slots = if same { n } else { t.grown() };
            t.resize_keeping(slots, false, |v| *v != DEAD);
            t.len = live;
            self.dead = 0;
        }
        self.table.make_room(more);
    }

    /// [`U64Table::probe`], a dead entry of `key` given as the free slot
    /// where it goes (`Err`): [`SlotTable::fill`] takes it back.
    #[inline(always)]
    pub fn probe(&self, key: u64) -> Result<usize, usize> {
        match self.table.probe(key) {
            Ok(i) if self.table.slots[i].1 == DEAD => Err(i),
            r => r,
        }
    }

    /// [`U64Table::value_at`].
    #[inline(always)]
    pub fn value_at(&self, i: usize) -> u32 {
        self.table.value_at(i)
    }

    /// Puts `key` with `value` into the slot `i` that
    /// [`SlotTable::probe`] gave as free for it: a free slot, or the
    /// key's own dead entry.
    #[inline(always)]
    pub fn fill(&mut self, i: usize, key: u64, value: u32) {
        debug_assert!(value != DEAD);
        if self.table.slots[i].0 == key {
            debug_assert!(self.table.slots[i].1 == DEAD);
            self.table.slots[i].1 = value;
            self.dead -= 1;
        } else {
            self.table.fill(i, key, value);
        }
    }

    /// Inserts or replaces; returns the old value of a live entry.
    #[inline]
    pub fn insert(&mut self, key: u64, value: u32) -> Option<u32> {
        debug_assert!(value != DEAD);
        if key == EMPTY {
            return self.table.insert(key, value);
        }
        self.make_room(1);
        match self.probe(key) {
            Ok(i) => Some(std::mem::replace(&mut self.table.slots[i].1, value)),
            Err(i) => {
                self.fill(i, key, value);
                None
            }
        }
    }

    /// [`U64Table::get_or_insert_with`], a dead entry taken as absent.
    #[inline]
    pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> u32) -> (u32, bool) {
        if key == EMPTY {
            return self.table.get_or_insert_with(key, make);
        }
        self.make_room(1);
        match self.probe(key) {
            Ok(i) => (self.table.slots[i].1, false),
            Err(i) => {
                let v = make();
                self.fill(i, key, v);
                (v, true)
            }
        }
    }

    /// Removes live `key`, marking its entry dead; returns its value.
    /// Inline: it sits in the loop of every removal event.
    #[inline(always)]
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        if key == EMPTY {
            return self.table.remove(key);
        }
        let v = self.table.get_mut(key).filter(|v| **v != DEAD)?;
        let value = std::mem::replace(v, DEAD);
        self.dead += 1;
        Some(value)
    }

    /// Removes every entry, keeping the allocation.
    pub fn clear(&mut self) {
        self.table.clear();
        self.dead = 0;
    }

    /// Every value, dead ones ([`u32::MAX`]) included, mutably, in slot
    /// order: for a pass that maps the values it knows and leaves others
    /// alone, which the check of each entry for death would only slow.
    pub fn values_mut_with_dead(&mut self) -> impl Iterator<Item = &mut u32> {
        self.table.values_mut()
    }

    /// Every live entry, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &u32)> {
        self.table.iter().filter(|(_, v)| **v != DEAD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u32),
        GetOrInsert(u64, u32),
        /// `make_room` for a few keys, then `probe` and `fill` of one.
        Fill(u64, u32),
        Remove(u64),
        Get(u64),
        Clear,
    }

    fn key() -> impl Strategy<Value = u64> {
        // Few distinct keys (so removals hit) plus the sentinel and neighbours
        // that collide in the top bits.
        prop_oneof![0..64u64, Just(EMPTY), (0..64u64).prop_map(|k| k << 58), any::<u64>()]
    }

    /// The multiplicative inverse of the home multiplier modulo 2^64, so a
    /// test can pick a key whose home is any slot it wants.
    fn inverse() -> u64 {
        let m = 0x9E37_79B9_7F4A_7C15u64;
        let mut x = m; // Newton's iteration: correct to 3, 6, 12, ... bits.
        for _ in 0..6 {
            x = x.wrapping_mul(2u64.wrapping_sub(m.wrapping_mul(x)));
        }
        assert_eq!(m.wrapping_mul(x), 1);
        x
    }

    /// A key whose home is `slot` in a table of `2^bits` slots (`salt` tells
    /// keys of the same home apart).
    fn key_at(slot: u64, bits: u32, salt: u64) -> u64 {
        let product = slot << (64 - bits) | (salt & ((1u64 << (64 - bits)) - 1));
        product.wrapping_mul(inverse())
    }

    /// A full table grows four-fold below its bound and two-fold from it.
    #[test]
    fn growth_factor_follows_the_bound() {
        let caps = |mut t: U64Table<u64>, n: u64| {
            let mut seen = vec![];
            for k in 1..=n {
                t.insert(k.wrapping_mul(0x2545_F491_4F6C_DD1D), k);
                if seen.last() != Some(&t.capacity()) {
                    seen.push(t.capacity());
                }
            }
            seen
        };
        assert_eq!(caps(U64Table::with_four_fold_below(256), 1000), vec![16, 64, 256, 512, 1024, 2048]);
        assert_eq!(caps(U64Table::with_four_fold_below(1 << 20), 1000), vec![16, 64, 256, 1024, 4096]);
        // The default bound, 4 Ki slots: 16 384 entries end at 32 Ki slots
        // (a load of 0.5), not 64 Ki.
        assert_eq!(caps(U64Table::new(), 16_384), vec![16, 64, 256, 1024, 4096, 8192, 16_384, 32_768]);
        // A sparse table stays at a quarter's load or under: 1100 entries
        // end at 8 Ki slots (four-fold steps to 4 Ki, then one two-fold).
        assert_eq!(caps(U64Table::sparse(), 1100), vec![16, 64, 256, 1024, 4096, 8192]);
        let mut t = U64Table::sparse();
        for k in 1..=5000u64 {
            t.insert(k.wrapping_mul(0x2545_F491_4F6C_DD1D), k);
            assert!(t.len() * 4 <= t.capacity(), "{} entries in {} slots", t.len(), t.capacity());
        }
        t.reserve(20_000);
        assert!((t.len() + 20_000) * 4 <= t.capacity(), "reserve keeps the sparse load");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// Growth keeps every entry findable when keys crowd the two ends of
        /// the table: clusters that wrap from the last slot to the first,
        /// keys far from their homes near slot 0, and growth by four and by
        /// two; removals after growth still shift correctly.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn grows_with_wrapped_clusters(
            homes in proptest::collection::vec(prop_oneof![0..8u64, 56..64u64, 0..64u64], 1..48),
            remove_every in 2..5usize,
        ) {
            let mut t: U64Table<u32> = U64Table::new();
            t.reserve(40); // 64 slots, so the homes above are slots of this table
            prop_assert_eq!(t.capacity(), 64);
            let mut m = HashMap::new();
            for (i, &h) in homes.iter().enumerate() {
                let k = key_at(h, 6, i as u64 + 1);
                prop_assert_eq!(t.insert(k, i as u32), m.insert(k, i as u32));
            }
            // Grow four-fold (below GROW_FOUR_SLOTS), then two-fold by reserve.
            for more in [100, 400] {
                t.reserve(more);
                for (k, v) in &m {
                    prop_assert_eq!(t.get(*k), Some(v));
                }
            }
            let keys: Vec<u64> = m.keys().copied().collect();
            for k in keys.iter().step_by(remove_every) {
                prop_assert_eq!(t.remove(*k), m.remove(k));
            }
            for (k, v) in &m {
                prop_assert_eq!(t.get(*k), Some(v));
            }
            prop_assert_eq!(t.len(), m.len());
        }
    }

    proptest! {
        // Many cases: a broken removal shows only where keys collide.
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The table behaves as a `HashMap` under any sequence of inserts,
        /// removals (with backward shifts), lookups and clears.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn behaves_like_a_hashmap(ops in ops(400)) {
            agrees_with_a_hashmap(U64Table::new(), ops, |_, _, _, _| Ok(()))?;
        }

        /// A [`SlotTable`] behaves as a `HashMap` under any sequence of
        /// inserts, probes and fills, removals (marking entries dead, a key
        /// stored again taking its entry back), lookups and clears; its
        /// dead entries are dropped when it fills, so it grows only for its
        /// live entries: when one more would pass 11/16 of its slots.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn slot_table_behaves_like_a_hashmap(ops in ops(600)) {
            agrees_with_a_hashmap(SlotTable::default(), ops, |t, before, slots, more| {
                if t.capacity() > slots && slots > 0 {
                    prop_assert!((before + more) * 16 > slots * 11, "grew from {slots} slots at {before} live entries");
                }
                Ok(())
            })?;
        }
    }

    /// Up to `n` operations on keys that collide often.
    fn ops(n: usize) -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                4 => (key(), 0..u32::MAX).prop_map(|(k, v)| Op::Insert(k, v)),
                2 => (key(), 0..u32::MAX).prop_map(|(k, v)| Op::GetOrInsert(k, v)),
                3 => (key(), 0..u32::MAX).prop_map(|(k, v)| Op::Fill(k, v)),
                4 => key().prop_map(Op::Remove),
                2 => key().prop_map(Op::Get),
                1 => Just(Op::Clear),
            ],
            0..n,
        )
    }

    /// The calls both tables share, for [`agrees_with_a_hashmap`].
    trait Map {
        fn insert(&mut self, k: u64, v: u32) -> Option<u32>;
        fn get_or_insert_with(&mut self, k: u64, make: impl FnOnce() -> u32) -> (u32, bool);
        fn make_room(&mut self, more: usize);
        /// Entries that fit before the load limit, dead ones counted as held.
        fn room(&self) -> usize;
        fn probe(&self, k: u64) -> Result<usize, usize>;
        fn value_at(&self, i: usize) -> u32;
        fn fill(&mut self, i: usize, k: u64, v: u32);
        fn remove(&mut self, k: u64) -> Option<u32>;
        fn get(&self, k: u64) -> Option<u32>;
        fn clear(&mut self);
        fn len(&self) -> usize;
        fn capacity(&self) -> usize;
        fn entries(&self) -> Vec<(u64, u32)>;
    }

    /// Forwards each call of [`Map`] to the table's own method.
    macro_rules! map_of {
        ($t:ty, $table:ident) => {
            impl Map for $t {
                fn insert(&mut self, k: u64, v: u32) -> Option<u32> {
                    <$t>::insert(self, k, v)
                }
                fn get_or_insert_with(&mut self, k: u64, make: impl FnOnce() -> u32) -> (u32, bool) {
                    <$t>::get_or_insert_with(self, k, make)
                }
                fn make_room(&mut self, more: usize) {
                    <$t>::make_room(self, more)
                }
                fn room(&self) -> usize {
                    let t: &U64Table<u32> = $table(self);
                    t.capacity() * t.quarters / 4 - t.len
                }
                fn probe(&self, k: u64) -> Result<usize, usize> {
                    <$t>::probe(self, k)
                }
                fn value_at(&self, i: usize) -> u32 {
                    <$t>::value_at(self, i)
                }
                fn fill(&mut self, i: usize, k: u64, v: u32) {
                    <$t>::fill(self, i, k, v)
                }
                fn remove(&mut self, k: u64) -> Option<u32> {
                    <$t>::remove(self, k)
                }
                fn get(&self, k: u64) -> Option<u32> {
                    <$t>::get(self, k).copied()
                }
                fn clear(&mut self) {
                    <$t>::clear(self)
                }
                fn len(&self) -> usize {
                    <$t>::len(self)
                }
                fn capacity(&self) -> usize {
                    <$t>::capacity(self)
                }
                fn entries(&self) -> Vec<(u64, u32)> {
                    let mut v: Vec<(u64, u32)> = <$t>::iter(self).map(|(k, v)| (k, *v)).collect();
                    v.sort_unstable();
                    v
                }
            }
        };
    }
    map_of!(U64Table<u32>, itself);
    map_of!(SlotTable, inner);

    fn itself(t: &U64Table<u32>) -> &U64Table<u32> {
        t
    }

    fn inner(t: &SlotTable) -> &U64Table<u32> {
        &t.table
    }

    /// Runs `ops` on `t` and on a `HashMap`, checking that every answer,
    /// the length after each operation and the entries at the end agree,
    /// that `make_room` leaves room, and `after(t, len before, slots
    /// before, room asked for)` after each operation.
    fn agrees_with_a_hashmap<T: Map>(
        mut t: T,
        ops: Vec<Op>,
        after: impl Fn(&T, usize, usize, usize) -> Result<(), TestCaseError>,
    ) -> Result<(), TestCaseError> {
        let mut m: HashMap<u64, u32> = HashMap::new();
        for op in ops {
            let (before, slots) = (t.len(), t.capacity());
            let more = match op {
                Op::Fill(_, v) => 1 + (v % 4) as usize,
                Op::Insert(..) | Op::GetOrInsert(..) => 1,
                _ => 0,
            };
            match op {
                Op::Insert(k, v) => prop_assert_eq!(t.insert(k, v), m.insert(k, v)),
                Op::GetOrInsert(k, v) => {
                    let present = m.get(&k).copied();
                    prop_assert_eq!(t.get_or_insert_with(k, || v), (present.unwrap_or(v), present.is_none()));
                    m.entry(k).or_insert(v);
                }
                Op::Fill(k, v) => {
                    t.make_room(more);
                    prop_assert!(t.room() >= more, "make_room left room");
                    if k == EMPTY {
                        continue;
                    }
                    match t.probe(k) {
                        Ok(i) => prop_assert_eq!(Some(&t.value_at(i)), m.get(&k)),
                        Err(i) => {
                            prop_assert!(!m.contains_key(&k));
                            t.fill(i, k, v);
                            m.insert(k, v);
                        }
                    }
                }
                Op::Remove(k) => prop_assert_eq!(t.remove(k), m.remove(&k)),
                Op::Get(k) => prop_assert_eq!(t.get(k), m.get(&k).copied()),
                Op::Clear => {
                    t.clear();
                    m.clear();
                }
            }
            prop_assert_eq!(t.len(), m.len());
            after(&t, before, slots, more)?;
        }
        let mut b: Vec<(u64, u32)> = m.into_iter().collect();
        b.sort_unstable();
        prop_assert_eq!(t.entries(), b);
        Ok(())
    }

    /// Churn of ever new keys, as a worker's cache turns over, leaves a
    /// [`SlotTable`] at the size its live entries need: the dead entries of
    /// each round are dropped, not grown over.
    #[test]
    fn slot_table_churn_keeps_its_size() {
        let mut t = SlotTable::default();
        let (n, mut next) = (3000u64, 1u64);
        let mut sizes = Vec::new();
        for _ in 0..20 {
            let keys: Vec<u64> = (next..next + n).map(|k| k.wrapping_mul(0x2545_F491_4F6C_DD1D)).collect();
            next += n;
            for &k in &keys {
                t.insert(k, k as u32 >> 1);
            }
            for &k in keys.iter().step_by(2) {
                assert_eq!(t.remove(k), Some(k as u32 >> 1));
            }
            for &k in keys.iter().skip(1).step_by(2) {
                assert_eq!(t.get(k), Some(&(k as u32 >> 1)));
                assert_eq!(t.remove(k), Some(k as u32 >> 1));
            }
            assert_eq!(t.len(), 0);
            sizes.push(t.capacity());
        }
        // 3000 live entries need 4096 slots at the load limit (4 Ki slots grow four-fold below).
        assert!(sizes.iter().all(|&s| s == 4096), "{sizes:?}");
    }

    /// The minor page faults of this thread so far (field 10 of
    /// `/proc/thread-self/stat`).
    #[cfg(target_os = "linux")]
    fn minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("procfs");
        // The command name (field 2) may hold spaces: count from its ')'.
        let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
        rest.split(' ').nth(7).and_then(|f| f.parse().ok()).expect("minflt")
    }

    /// A growth maps each page of the new table once: the loop that places
    /// the keys reads slots before it writes them, and a page of zeroed
    /// memory read first is mapped twice (the shared zero page, then a page
    /// of its own at the write).
    #[cfg(target_os = "linux")]
    #[test]
    fn growth_faults_each_new_page_in_once() {
        let mut t: U64Table<u32> = U64Table::new();
        let mut k = 0u64;
        // Fill to the load limit of 2^18 slots (4 MiB), the next insert
        // growing to 2^19 (8 MiB, 2048 pages).
        while t.capacity() < 1 << 18 || (t.len() + 1) * 4 <= t.capacity() * 3 {
            k += 1;
            t.insert(k, k as u32);
        }
        assert_eq!(t.capacity(), 1 << 18);
        let before = minor_faults();
        t.insert(k + 1, 0);
        let faults = minor_faults() - before;
        assert_eq!(t.capacity(), 1 << 19);
        let pages = (1u64 << 19) * 16 / 4096;
        // Twice the pages when each is mapped twice; a little slack for the
        // allocator's own pages.
        assert!(faults <= pages + pages / 4, "{faults} faults for {pages} pages");
        assert_eq!(t.get(k), Some(&(k as u32)));
    }
}
