//! Eviction, and the verbs that may need it: the cache's replacement policy
//! between its tiers, written on the verbs of [`KvCache`] alone (this file
//! reaches no field), so that every system that needs device pages (admission,
//! growth, an explicit evict) gets the same policy from one place.
//!
//! Device eviction takes the least recently used unreferenced cached block.
//! With a host tier, the block is offloaded ([`KvCache::move_block`]: its KV
//! copied to a host page, its row moved) and routers see `Removed(GPU)` then
//! `Stored(CPU)`; without one, it is dropped and routers see `Removed(GPU)`.
//! A prefix match on a host block onboards it back (`Removed(CPU)`,
//! `Stored(GPU)`). A key lives in one tier at a time, so Stored and Removed
//! balance per key and per tier.
//!
//! Every call that may evict has been preceded by the caller's capacity
//! check (admission, growth), so running out of evictable blocks here is a
//! broken invariant and panics.

use super::{Counters, KvCache, PageRef};
use crate::events::EventQueue;
use crate::ids::BlockId;
use crate::tier::Tier;

impl KvCache {
    /// Evicts the least recently used host block. Returns whether one was evicted.
    pub fn evict_host_block(&mut self, events: &mut EventQueue, counters: &mut Counters) -> bool {
        let Some(id) = self.lru_front(Tier::Host) else { return false };
        self.drop_block(id, events);
        counters.blocks_evicted_host += 1;
        true
    }

    /// Evicts the least recently used unreferenced device block, offloading
    /// it to the host tier when there is one, and leaves its device page
    /// free. Returns `false` when no device block is evictable.
    ///
    /// A full host tier drops its least recently used block to take the
    /// offload, unless that block was itself offloaded this step (its copy
    /// is queued): then the evicted device block is dropped instead, which
    /// keeps as many blocks and saves a copy that would be overwritten in the
    /// same step. So does a step whose copies reached their bound
    /// ([`KvCache::copy_room`]): the block is dropped, never offloaded
    /// without its copy.
    pub fn evict_device_block(&mut self, events: &mut EventQueue, counters: &mut Counters) -> bool {
        let Some(id) = self.lru_front(Tier::Device) else { return false };
        counters.blocks_evicted_device += 1;
        if self.has_host_tier() && self.copy_room() > 0 {
            if self.free_pages(Tier::Host) == 0 {
                let oldest =
                    self.lru_front(Tier::Host).map(|h| PageRef { medium: Tier::Host, page: self.block(h).page });
                if oldest.is_some_and(|page| !self.copy_touches(page)) {
                    self.evict_host_block(events, counters);
                }
            }
            if self.move_block(id, Tier::Host, events) {
                counters.blocks_offloaded += 1;
                return true;
            }
        }
        self.drop_block(id, events);
        true
    }

    /// Evicts up to `n` unreferenced device blocks, least recently used first.
    /// Returns how many were evicted.
    pub fn evict_device_blocks(&mut self, n: usize, events: &mut EventQueue, counters: &mut Counters) -> usize {
        if !self.has_host_tier() {
            // Nothing to offload to: every victim is dropped, in one pass.
            // At most what the LRU holds: `n` comes from the caller and may be
            // anything (a capacity sized by it alone could overflow).
            events.expect_removals(n.min(self.lru_len(Tier::Device)));
            let evicted = self.drop_lru_front(Tier::Device, n, events);
            counters.blocks_evicted_device += evicted as u64;
            events.expect_removals(0);
            return evicted;
        }
        let evicted = (0..n).take_while(|_| self.evict_device_block(events, counters)).count();
        events.expect_removals(0);
        evicted
    }

    /// Evicts least recently used device blocks up front, before any page is
    /// filled, towards `pages` free device pages: the step's offloads then
    /// come first in its copy list, and the copies that fill pages can keep
    /// clear of the ones they read (the block pool's cooling pages), so that
    /// they batch into few waves. With a host tier, and unless
    /// `offload_first`, only as many as the host tier has free pages for: an
    /// offload into a full tier drops a host block, which the onboards that
    /// follow might have made room for. The rest is evicted one page at a
    /// time as pages are taken. The caller has checked that enough blocks
    /// are evictable.
    pub fn make_room(&mut self, pages: usize, offload_first: bool, events: &mut EventQueue, counters: &mut Counters) {
        let mut short = pages.saturating_sub(self.free_pages(Tier::Device));
        if self.has_host_tier() && !offload_first {
            short = short.min(self.free_pages(Tier::Host));
        }
        let evicted = self.evict_device_blocks(short, events, counters);
        debug_assert_eq!(evicted, short, "admission checked that enough blocks are evictable");
    }

    /// Appends `n` fresh device blocks (one reference each) to `out`,
    /// evicting least recently used cached blocks when no page is free. With
    /// `first_copied`, a copy writes the first block this step (partial
    /// reuse). The caller has checked that `n` blocks are available.
    pub fn allocate_device_blocks(
        &mut self,
        n: usize,
        first_copied: bool,
        out: &mut Vec<BlockId>,
        events: &mut EventQueue,
        counters: &mut Counters,
    ) {
        out.reserve(n);
        // The copy's target first, on a page that no queued copy reads.
        let copied = usize::from(first_copied && n > 0);
        if copied == 1 {
            self.allocate_device_block(true, out, events, counters);
        }
        // The pages free now serve the next blocks in one pass; each block
        // after them evicts one.
        let free = self.free_pages(Tier::Device).min(n - copied);
        self.take_free_device_blocks(free, out);
        for _ in copied + free..n {
            self.allocate_device_block(false, out, events, counters);
        }
    }

    /// Appends one fresh device block to `out`, evicting first when no page
    /// is free ([`KvCache::allocate_device_blocks`] for one block).
    fn allocate_device_block(
        &mut self,
        copy_target: bool,
        out: &mut Vec<BlockId>,
        events: &mut EventQueue,
        counters: &mut Counters,
    ) {
        if self.free_pages(Tier::Device) == 0 {
            let evicted = self.evict_device_block(events, counters);
            assert!(evicted, "admission checked that enough blocks are evictable");
        }
        let block = self.take_free_block(Tier::Device, copy_target);
        out.push(block.expect("a page is free after eviction"));
    }

    /// Moves a host block that its admission holds a reference on (so it is
    /// out of the host LRU) to a device page, evicting one device block
    /// first when none is free. Admission has checked that a device page can
    /// be had.
    pub fn onboard(&mut self, id: BlockId, events: &mut EventQueue, counters: &mut Counters) {
        debug_assert_eq!(self.block(id).medium, Tier::Host, "only host blocks are onboarded");
        if self.free_pages(Tier::Device) == 0 {
            let evicted = self.evict_device_block(events, counters);
            assert!(evicted, "admission checked that a device page can be had");
        }
        let moved = self.move_block(id, Tier::Device, events);
        assert!(moved, "a page is free after eviction");
        counters.blocks_onboarded += 1;
    }
}
