//! An intrusive doubly linked LRU list over slotmap keys: O(1) push, remove and
//! pop, with the links in a `SecondaryMap` so that rows stay plain data.

use slotmap::{Key, SecondaryMap};

#[derive(Clone, Copy, Debug)]
struct Links<K> {
    prev: Option<K>,
    next: Option<K>,
}

/// Least recently used order over keys of one slotmap. The front is the least
/// recently used entry (the next victim), the back the most recent.
#[derive(Debug)]
pub struct Lru<K: Key> {
    links: SecondaryMap<K, Links<K>>,
    head: Option<K>,
    tail: Option<K>,
    len: usize,
}

impl<K: Key> Lru<K> {
    /// An empty list with room for `capacity` keys.
    pub fn with_capacity(capacity: usize) -> Self {
        Self { links: SecondaryMap::with_capacity(capacity), head: None, tail: None, len: 0 }
    }

    /// Number of keys in the list.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `key` is in the list.
    pub fn contains(&self, key: K) -> bool {
        self.links.contains_key(key)
    }

    /// Appends `key` as the most recently used. It must not be in the list.
    pub fn push_back(&mut self, key: K) {
        debug_assert!(!self.contains(key), "a key is in the LRU at most once");
        self.links.insert(key, Links { prev: self.tail, next: None });
        match self.tail {
            Some(t) => self.links[t].next = Some(key),
            None => self.head = Some(key),
        }
        self.tail = Some(key);
        self.len += 1;
    }

    /// Removes `key`; returns whether it was there.
    pub fn remove(&mut self, key: K) -> bool {
        let Some(l) = self.links.remove(key) else { return false };
        match l.prev {
            Some(p) => self.links[p].next = l.next,
            None => self.head = l.next,
        }
        match l.next {
            Some(n) => self.links[n].prev = l.prev,
            None => self.tail = l.prev,
        }
        self.len -= 1;
        true
    }

    /// Moves `key` to the most recently used end, if present.
    pub fn touch(&mut self, key: K) {
        if self.remove(key) {
            self.push_back(key);
        }
    }

    /// Removes and returns the least recently used key.
    pub fn pop_front(&mut self) -> Option<K> {
        let k = self.head?;
        self.remove(k);
        Some(k)
    }

    /// Keys from least to most recently used.
    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = K> + '_ {
        std::iter::successors(self.head, move |k| self.links[*k].next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::BlockId;
    use slotmap::SlotMap;

    /// The list must keep the order of a `VecDeque` model under pushes,
    /// removals from anywhere, touches and pops.
    #[test]
    fn matches_vecdeque_model() {
        let mut ids: SlotMap<BlockId, ()> = SlotMap::with_key();
        let keys: Vec<BlockId> = (0..8).map(|_| ids.insert(())).collect();
        let mut lru = Lru::with_capacity(8);
        let mut model = std::collections::VecDeque::new();
        for &k in &keys {
            lru.push_back(k);
            model.push_back(k);
        }
        lru.remove(keys[3]);
        model.retain(|k| *k != keys[3]);
        lru.touch(keys[0]);
        model.retain(|k| *k != keys[0]);
        model.push_back(keys[0]);
        assert_eq!(lru.pop_front(), model.pop_front());
        assert_eq!(lru.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
        assert_eq!(lru.len(), model.len());
        assert!(!lru.remove(keys[3]));
    }
}
