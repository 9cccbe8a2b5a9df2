//! A hash table for 64-bit hash keys: open addressing, linear probing,
//! key and value side by side in one slot.
//!
//! Why not `HashMap`: the indexer's tables are larger than the cache and
//! every store touches a random slot. `hashbrown` keeps its control bytes
//! apart from its buckets, so a miss costs two cache lines; here a lookup or
//! an insert is one line in the common case. Keys are already hashes, so the
//! slot index is the top bits of one multiply. Deletion shifts later entries
//! back (no tombstones), so the table never degrades under churn.
//!
//! The key `EMPTY` marks a free slot; an entry whose key is `EMPTY` lives in
//! a side slot instead.

/// The key value that marks a free slot.
const EMPTY: u64 = u64::MAX;

/// Slots below which a full table grows four-fold instead of two-fold.
const GROW_FOUR_SLOTS: usize = 1 << 16;

/// A map from `u64` hash keys to small `Copy` values.
#[derive(Clone, Debug)]
pub struct U64Table<V: Copy> {
    slots: Vec<(u64, V)>,
    /// log2 of the slot count (0 when no slot is allocated).
    bits: u32,
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
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
}

impl<V: Copy + Default> U64Table<V> {
    /// An empty table; nothing is allocated until the first insert.
    pub fn new() -> Self {
        Self { slots: Vec::new(), bits: 0, len: 0, side: None }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len + self.side.is_some() as usize
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots allocated.
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
        let want = (self.len + more) * 4 / 3 + 1;
        if want > self.slots.len() {
            self.resize(want.next_power_of_two().max(16));
        }
    }

    fn resize(&mut self, slots: usize) {
        // Not zero, on purpose: zeroed memory from the allocator would skip
        // this fill but take its page faults during the inserts, which
        // measured slower (route-bench, fresh tables: 5.4 against 6.0 -
        // 6.6 M blocks/s).
        let old = std::mem::replace(&mut self.slots, vec![(EMPTY, V::default()); slots]);
        self.bits = slots.trailing_zeros();
        for (k, v) in old {
            if k != EMPTY {
                let mask = self.mask();
                let mut i = home(k, self.bits);
                while self.slots[i].0 != EMPTY {
                    i = (i + 1) & mask;
                }
                self.slots[i] = (k, v);
            }
        }
    }

    /// Grows a full table: four-fold while it is small, then two-fold.
    ///
    /// Why: each growth writes a new table (and faults its memory in) and
    /// frees the old one, so a table filled from empty writes about twice
    /// its final size when it doubles; growing four-fold up to
    /// `GROW_FOUR_SLOTS` cuts the small steps, at the cost of at most that
    /// many slots (1 MiB) of slack in a table that stops growing there.
    #[cold]
    fn grow(&mut self) {
        let n = self.slots.len();
        self.resize(if n < GROW_FOUR_SLOTS { (n * 4).max(16) } else { n * 2 });
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

    /// Reads the home slot of `key` and the slot a cache line further, and
    /// returns their keys, so that a later access to `key` finds its lines
    /// in cache (an insert probes past its home slot about half the time at
    /// the tables' load, often into the next line): a caller touching many
    /// keys first lets their misses overlap.
    #[inline]
    pub fn touch(&self, key: u64) -> u64 {
        if self.slots.is_empty() {
            return 0;
        }
        let i = home(key, self.bits);
        self.slots[i].0 ^ self.slots[(i + 64 / std::mem::size_of::<(u64, V)>().max(1)) & self.mask()].0
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
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
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

    /// Inserts `key` unless it is present; returns the value present (left
    /// as it is) when it is. One probe where `get` then `insert` take two.
    #[inline]
    pub fn insert_new(&mut self, key: u64, value: V) -> Option<V> {
        if key == EMPTY {
            return match self.side {
                Some(v) => Some(v),
                None => {
                    self.side = Some(value);
                    None
                }
            };
        }
        match self.slot_for_insert(key) {
            Ok(i) => Some(self.slots[i].1),
            Err(i) => {
                self.slots[i] = (key, value);
                self.len += 1;
                None
            }
        }
    }

    /// Removes `key`; returns its value. Later entries of the probe run are
    /// shifted back so that no tombstone is left.
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

    /// Every entry, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.slots.iter().filter(|(k, _)| *k != EMPTY).map(|(k, v)| (*k, v)).chain(self.side.iter().map(|v| (EMPTY, v)))
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
        InsertNew(u64, u32),
        Remove(u64),
        Get(u64),
        Clear,
    }

    fn key() -> impl Strategy<Value = u64> {
        // Few distinct keys (so removals hit) plus the sentinel and neighbours
        // that collide in the top bits.
        prop_oneof![0..64u64, Just(EMPTY), (0..64u64).prop_map(|k| k << 58), any::<u64>()]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// The table behaves as a `HashMap` under any sequence of inserts,
        /// removals (with backward shifts), lookups and clears.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn behaves_like_a_hashmap(ops in proptest::collection::vec(
            prop_oneof![
                4 => (key(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
                2 => (key(), any::<u32>()).prop_map(|(k, v)| Op::InsertNew(k, v)),
                3 => key().prop_map(Op::Remove),
                2 => key().prop_map(Op::Get),
                1 => Just(Op::Clear),
            ], 0..400)) {
            let mut t: U64Table<u32> = U64Table::new();
            let mut m: HashMap<u64, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(t.insert(k, v), m.insert(k, v)),
                    Op::InsertNew(k, v) => {
                        let present = m.get(&k).copied();
                        prop_assert_eq!(t.insert_new(k, v), present);
                        m.entry(k).or_insert(v);
                    }
                    Op::Remove(k) => prop_assert_eq!(t.remove(k), m.remove(&k)),
                    Op::Get(k) => prop_assert_eq!(t.get(k).copied(), m.get(&k).copied()),
                    Op::Clear => { t.clear(); m.clear(); }
                }
                prop_assert_eq!(t.len(), m.len());
            }
            let mut a: Vec<(u64, u32)> = t.iter().map(|(k, v)| (k, *v)).collect();
            let mut b: Vec<(u64, u32)> = m.into_iter().collect();
            a.sort_unstable();
            b.sort_unstable();
            prop_assert_eq!(a, b);
        }
    }
}
