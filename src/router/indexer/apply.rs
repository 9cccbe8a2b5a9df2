//! Applying events: `BlockStored`, `BlockRemoved` and `AllBlocksCleared`,
//! with the table slots each event reads first fetched ahead.
//!
//! A stored event is applied in three steps, so that the cache misses of its
//! table slots overlap instead of coming one at a time:
//!
//! 1. the content hash of each block, pure computation, while the worker's
//!    table slots fetched ahead of the event arrive (an event of text
//!    blocks alone in one call into the vector hash, which dispatches on
//!    the CPU's features once for all its blocks);
//! 2. the router keys the blocks will most likely get, chained from the
//!    parent's key;
//! 3. the inserts: in the common case (every block keyed, no block of the
//!    worker waiting for a parent, room for all) the whole event at once,
//!    one probe of the worker's table a block (its lines were fetched
//!    before the hashes), the key found after its parent's slot or among
//!    the run heads, or given the worker's next slot in the runs
//!    (`holders.rs`); otherwise block by block, keying what can be keyed
//!    and holding the rest as pending.
//!
//! The steps work in the indexer's [`StoreScratch`], borrowed whole beside
//! the worker's tables ([`WorkerStore`]), so that applying allocates nothing
//! once its buffers have grown.

use kvcore::wire::{WireBlockRemoved, WireBlockStored, WireEvent};
use kvcore::{ImageDigest, ImageRun, Tier};

use super::holders::{HolderIndex, TierOp, tier_bit};
use super::worker::{Dup, U64Map, Waiting, WorkerBlocks, unlink_child};
use super::{Indexer, IndexerCounters, StoreScratch, ViewChange, WorkerId};
use crate::hashing::{RouterKey, chain, content_hash, lora_identity, scope_seed};
use crate::table::prefetch;

/// What steps 1 and 2 found out about a stored event, for step 3.
#[derive(Clone, Copy, Debug)]
struct Staged {
    /// The worker's index.
    worker: usize,
    /// The event's tier bit.
    bit: u8,
    /// The parent's router key (the seed for a chain start); `None` when the
    /// worker does not hold the parent keyed.
    parent_key: Option<u64>,
    /// The parent's slot in the runs, when the worker holds it keyed.
    parent_slot: Option<u32>,
}

/// One worker's tables and the shared holder index, borrowed together so
/// that step 3 writes them while it reads the scratch buffers.
struct WorkerStore<'a> {
    /// The worker's blocks.
    blocks: &'a mut WorkerBlocks,
    /// The worker's index, as the holder index packs it.
    worker: u32,
    /// The shared holder index.
    index: &'a mut HolderIndex,
    /// The indexer's counters.
    counters: &'a mut IndexerCounters,
    /// `blocks_per_worker_max`.
    blocks_max: usize,
    /// The event's tier bit.
    bit: u8,
}

/// Hints the lines of an event's own lists that [`Indexer::prefetch_event`]
/// and the apply read first: its block hashes and its medium.
#[inline]
fn prefetch_lists(event: &WireEvent) {
    let (hashes, medium) = match event {
        WireEvent::BlockStored(s) => (&s.block_hashes, &s.medium),
        WireEvent::BlockRemoved(r) => (&r.block_hashes, &r.medium),
        _ => return,
    };
    for h in hashes.iter().step_by(8) {
        prefetch(h);
    }
    if let Some(b) = medium.as_deref().and_then(|m| m.as_bytes().first()) {
        prefetch(b);
    }
}

impl Indexer {
    /// Applies one decoded event from `worker`. Events from unknown or
    /// removed workers are ignored.
    pub fn apply(&mut self, worker: WorkerId, event: &WireEvent) {
        self.prefetch_event(worker, event);
        self.apply_fetched(worker, event);
    }

    /// [`Indexer::apply`] once `prefetch_event` has run for the event.
    fn apply_fetched(&mut self, worker: WorkerId, event: &WireEvent) {
        if !self.is_live(worker) {
            return;
        }
        match event {
            WireEvent::BlockStored(s) => self.apply_stored(worker, s),
            WireEvent::BlockRemoved(r) => self.apply_removed(worker, r),
            WireEvent::AllBlocksCleared => {
                self.counters.cleared_events += 1;
                self.clear_worker(worker);
            }
            // A newer publisher's event type: nothing this router keys on.
            WireEvent::Unknown { .. } => self.counters.events_unknown += 1,
        }
        if self.index.unsettled() {
            self.settle();
        }
    }

    /// Applies events in order, each as [`Indexer::apply`] does, reading ahead
    /// one event: while an event is applied, the table slots that the next
    /// one will touch are already being fetched.
    ///
    /// Two events ahead, the event's own lists are fetched (its hashes and
    /// its medium): the slots of the next event are found from its hashes,
    /// which a batch of decoded events held in memory otherwise misses on.
    pub fn apply_all<'a>(&mut self, events: impl IntoIterator<Item = (WorkerId, &'a WireEvent)>) {
        let mut it = events.into_iter();
        let mut next = it.next();
        let mut after = it.next();
        if let Some((_, e)) = after {
            prefetch_lists(e);
        }
        if let Some((w, e)) = next {
            self.prefetch_event(w, e);
        }
        while let Some((w, e)) = next {
            next = after;
            after = it.next();
            if let Some((_, e)) = after {
                prefetch_lists(e);
            }
            if let Some((nw, ne)) = next {
                self.prefetch_event(nw, ne);
            }
            self.apply_fetched(w, e);
        }
    }

    /// Hints the cache lines `event` will read first: its blocks' slots (and
    /// its parent's) in the worker's table, and its token ids. The one place
    /// these are fetched: `apply` calls it just before the event,
    /// `apply_all` one event ahead.
    fn prefetch_event(&self, worker: WorkerId, event: &WireEvent) {
        let Some(wb) = self.workers.get(worker.0 as usize) else { return };
        match event {
            WireEvent::BlockStored(s) => {
                if let Some(t) = s.token_ids.as_deref() {
                    for line in t.iter().step_by(16) {
                        prefetch(line);
                    }
                }
                if let Some(p) = s.parent_block_hash {
                    wb.keyed.prefetch(p as u64);
                }
                for &h in &s.block_hashes {
                    wb.keyed.prefetch(h as u64);
                }
            }
            // A removal marks the entry dead where it finds it: the home
            // line, as for a store.
            WireEvent::BlockRemoved(r) => {
                for &h in &r.block_hashes {
                    wb.keyed.prefetch(h as u64);
                }
            }
            _ => {}
        }
    }

    /// The seed of a stored event's scope: the parent key of a chain start.
    fn seed_for(&mut self, s: &WireBlockStored) -> RouterKey {
        let lora = lora_identity(s.lora_name.as_deref(), s.lora_id.and_then(|i| u32::try_from(i).ok()));
        if let Some((l, c, seed)) = &self.seed_cache
            && *l == lora
            && c.as_deref() == s.cache_salt.as_deref()
        {
            return *seed;
        }
        let seed = scope_seed(s.block_size, lora.as_deref(), s.cache_salt.as_deref());
        self.seed_cache = Some((lora, s.cache_salt.clone(), seed));
        seed
    }

    /// Applies a `BlockStored` (see the module docs for what is skipped).
    ///
    /// Kept out of line, as it was while it was public: inlined into the
    /// dispatch with [`Indexer::apply_removed`], the two made `apply_fetched`
    /// large, and route-bench's removals ran some 8 % slower.
    #[inline(never)]
    fn apply_stored(&mut self, worker: WorkerId, s: &WireBlockStored) {
        if s.image_routing.is_some() {
            self.record_uuids(worker, s);
        }
        let Some(staged) = self.stage_stored(worker, s) else { return };
        let (mut store, scratch) = self.store_for(staged);
        if !store.store_whole_event(&s.block_hashes, scratch, staged.parent_slot) {
            store.store_block_by_block(s, scratch, staged.parent_key, staged.parent_slot);
        }
    }

    /// Applies an event as [`Indexer::apply`] does, except that a
    /// `BlockStored` goes block by block at step 3 whatever its case: the
    /// reference that the whole-event store is checked against.
    #[cfg(test)]
    pub(super) fn apply_block_by_block(&mut self, worker: WorkerId, event: &WireEvent) {
        match event {
            WireEvent::BlockStored(s) if self.is_live(worker) => {
                if s.image_routing.is_some() {
                    self.record_uuids(worker, s);
                }
                let Some(staged) = self.stage_stored(worker, s) else { return };
                let (mut store, scratch) = self.store_for(staged);
                store.store_block_by_block(s, scratch, staged.parent_key, staged.parent_slot);
            }
            _ => self.apply(worker, event),
        }
    }

    /// Everything of a stored event before its inserts: the checks, its seed, then steps 1 and 2 into the
    /// scratch buffers. `None`, counted, when the event stores nothing.
    fn stage_stored(&mut self, worker: WorkerId, s: &WireBlockStored) -> Option<Staged> {
        let w = worker.0 as usize;
        if w >= self.workers.len() {
            return None;
        }
        let tokens = self.checked_tokens(s)?;
        self.counters.stored_events += 1;
        let seed = self.seed_for(s);
        let bit = tier_bit(Tier::from_medium(s.medium.as_deref()));
        // The parent's slot and the blocks' own slots in the worker's table
        // were fetched ahead (`prefetch_event`, by `apply` or `apply_all`)
        // and are read after the content hashes.
        self.scratch.hash_contents(s, tokens, &mut self.counters);
        let parent_slot = s.parent_block_hash.and_then(|p| self.workers[w].keyed.get(p as u64).copied());
        let parent_key = match s.parent_block_hash {
            Some(_) => parent_slot.map(|p| self.index.key_at(p)),
            None => Some(seed.0),
        };
        self.scratch.predict_keys(parent_key);
        // A new key is looked up among the run heads before it takes a
        // slot: fetch those lines now, the misses overlapping.
        for &k in &self.scratch.keys {
            self.index.map.prefetch(k);
        }
        self.index.runs.prefetch(w + 1, self.scratch.keys.len());
        Some(Staged { worker: w, bit, parent_key, parent_slot })
    }

    /// The token ids of a stored event, or `None`, counted, when it cannot
    /// be keyed: another block size, no token ids, or token ids or image
    /// blocks that do not match its block count.
    fn checked_tokens<'s>(&mut self, s: &'s WireBlockStored) -> Option<&'s [u32]> {
        let n = s.block_hashes.len();
        if s.block_size != self.config.block_size {
            self.counters.events_wrong_block_size += 1;
            return None;
        }
        let Some(tokens) = s.token_ids.as_deref() else {
            self.counters.blocks_without_tokens += n as u64;
            return None;
        };
        let bs = s.block_size as usize;
        let routing = s.image_routing.as_ref();
        if tokens.len() != n * bs || routing.is_some_and(|r| !r.blocks.is_empty() && r.blocks.len() != n) {
            self.counters.events_malformed += 1;
            return None;
        }
        Some(tokens)
    }

    /// Records in the fleet-wide UUID view the `(UUID, digest)` pairs each
    /// block of a stored event names, whether or not the indexer can key the
    /// event (the worker holds the blocks either way). When the event's
    /// block list does not place the items (empty or of the wrong length),
    /// every block is taken to name every item: more references than the
    /// truth, never fewer.
    fn record_uuids(&mut self, worker: WorkerId, s: &WireBlockStored) {
        let Some(r) = &s.image_routing else { return };
        let bit = tier_bit(Tier::from_medium(s.medium.as_deref()));
        let (uuids_max, blocks_max) = (self.config.uuids_max, self.config.blocks_per_worker_max);
        let pair = |i: usize| r.items.get(i).and_then(|it| it.uuid.as_deref().map(|u| (u, ImageDigest(it.digest))));
        let all: Vec<(&str, ImageDigest)> = (0..r.items.len()).filter_map(pair).collect();
        if all.is_empty() {
            return;
        }
        let placed = r.blocks.len() == s.block_hashes.len();
        let mut items = Vec::new();
        let mut change = ViewChange::default();
        for (i, &hash) in s.block_hashes.iter().enumerate() {
            items.clear();
            if placed {
                for x in &r.blocks[i] {
                    if let Some(p) = pair(x.item as usize)
                        && !items.contains(&p)
                    {
                        items.push(p);
                    }
                }
            } else {
                items.extend_from_slice(&all);
            }
            if !items.is_empty() {
                change += self.uuids.store(worker.0 as usize, hash as u64, bit, &items, uuids_max, blocks_max);
            }
        }
        self.count_view(change);
    }

    /// The tables of a staged event's worker, and the scratch buffers
    /// holding its steps 1 and 2, borrowed apart.
    fn store_for(&mut self, staged: Staged) -> (WorkerStore<'_>, &mut StoreScratch) {
        let Self { config, workers, index, counters, scratch, .. } = self;
        let store = WorkerStore {
            blocks: &mut workers[staged.worker],
            worker: staged.worker as u32,
            index,
            counters,
            blocks_max: config.blocks_per_worker_max,
            bit: staged.bit,
        };
        (store, scratch)
    }

    /// Applies a `BlockRemoved`: each hash leaves the event's tier; a block in
    /// no tier is forgotten. Unknown hashes are no-ops. Out of line for the
    /// reason given at [`Indexer::apply_stored`].
    #[inline(never)]
    fn apply_removed(&mut self, worker: WorkerId, r: &WireBlockRemoved) {
        let w = worker.0 as usize;
        if w >= self.workers.len() {
            return;
        }
        self.counters.removed_events += 1;
        let bit = tier_bit(Tier::from_medium(r.medium.as_deref()));
        if self.uuids.holds_any(w) {
            let mut change = ViewChange::default();
            for &hash in &r.block_hashes {
                change += self.uuids.remove(w, hash as u64, bit);
            }
            self.count_view(change);
        }
        // Two passes. The first takes every block out of the worker's table
        // (its lines were fetched ahead, `prefetch_event`) and fetches the
        // line of its slot in the runs; the second changes the holders
        // there, by then in cache or on their way, one miss overlapping
        // the next. Most removals leave the block in no tier, so one probe
        // of the worker's table does it; a block left in another tier goes
        // back. A hash named twice is taken out once: the second finds
        // nothing, as it would after the first's whole removal.
        let Self { workers, index, counters, scratch, .. } = self;
        let worker = &mut workers[w];
        let taken = &mut scratch.taken;
        taken.clear();
        for &hash in &r.block_hashes {
            let hash = hash as u64;
            if let Some(slot) = worker.keyed.remove(hash) {
                index.runs.prefetch_slot(slot);
                taken.push((hash, slot));
            } else if let Some(wt) = worker.waiting.get_mut(&hash).filter(|wt| wt.tiers & bit != 0) {
                wt.tiers &= !bit;
                if wt.tiers == 0 {
                    let parent = wt.parent;
                    worker.waiting.remove(&hash);
                    unlink_child(&mut worker.children, hash, parent);
                }
                counters.removed_blocks += 1;
            } else {
                counters.removed_unknown += 1;
            }
        }
        for &(hash, slot) in taken.iter() {
            let (old, tiers) = retier(index, &mut worker.dups, w as u32, hash, slot, TierOp::Drop(bit));
            if tiers != 0 {
                worker.keyed.insert(hash, slot);
            }
            if old & bit != 0 {
                counters.removed_blocks += 1;
            } else {
                counters.removed_unknown += 1;
            }
        }
    }
}

impl StoreScratch {
    /// Step 1: each block's content hash into `contents`, pure computation.
    /// Stops at the first block whose image refs are malformed (the event is
    /// counted malformed) or whose image is known only by `mm_hash` (it and
    /// the rest of the event are counted unkeyable, as their keys chain
    /// through it); the blocks before it are stored.
    fn hash_contents(&mut self, s: &WireBlockStored, tokens: &[u32], counters: &mut IndexerCounters) {
        let (n, bs) = (s.block_hashes.len(), s.block_size as usize);
        let routing = s.image_routing.as_ref();
        self.contents.clear();
        if bs > 0
            && routing.is_none()
            && s.block_mm_infos.as_ref().is_none_or(|m| m.iter().flatten().all(|i| i.mm_objects.is_empty()))
        {
            // Text only: the whole event in one call into the vector hash,
            // instead of one call (and one feature dispatch) per block.
            // `checked_tokens` made `tokens` exactly `n` blocks long. Each
            // hash is written into room reserved in `contents`.
            kvcore::block_content_hashes_extend(tokens, bs, (), &mut self.contents, |(), h| ((), h));
            return;
        }
        for i in 0..n {
            let block = &tokens[i * bs..(i + 1) * bs];
            self.runs.clear();
            if let Some(r) = routing
                && let Some(refs) = r.blocks.get(i)
            {
                let mut bad = false;
                for x in refs {
                    match r.items.get(x.item as usize) {
                        Some(item) if x.block_offset as u64 + x.len as u64 <= bs as u64 => self.runs.push(ImageRun {
                            digest: ImageDigest(item.digest),
                            item_offset: x.item_offset,
                            block_offset: x.block_offset,
                            len: x.len,
                        }),
                        _ => bad = true,
                    }
                }
                if bad {
                    counters.events_malformed += 1;
                    break;
                }
            } else if routing.is_none()
                && let Some(Some(info)) = s.block_mm_infos.as_ref().and_then(|m| m.get(i))
                && !info.mm_objects.is_empty()
            {
                // An image known only by `mm_hash`: no content identity.
                counters.image_blocks_unkeyable += (n - i) as u64;
                break;
            }
            self.contents.push(content_hash(block, &self.runs, &mut self.bytes));
        }
    }

    /// Step 2: the router key each block will most likely get, chained from
    /// `parent_key` over the content hashes; none when the parent's key is
    /// unknown.
    fn predict_keys(&mut self, parent_key: Option<u64>) {
        self.keys.clear();
        if let Some(mut p) = parent_key {
            for &c in &self.contents {
                p = chain(RouterKey(p), c).0;
                self.keys.push(p);
            }
        }
    }
}

impl WorkerStore<'_> {
    /// Step 3 in the common case: every block keyed, no block of the worker
    /// waiting for a parent, room for all. One probe of the worker's table a
    /// block (its lines were fetched before the hashes); a new entry takes
    /// the key's slot, found after the previous block's or among the run
    /// heads, or a new one. `after` is the parent's slot (`None` for a chain
    /// start). Returns `false`, having stored nothing, when the event is not
    /// that case.
    fn store_whole_event(&mut self, hashes: &[i64], scratch: &mut StoreScratch, mut after: Option<u32>) -> bool {
        let StoreScratch { contents, keys, .. } = scratch;
        if keys.is_empty() || !self.blocks.waiting.is_empty() || self.blocks.len() + keys.len() > self.blocks_max {
            return false;
        }
        let (w, bit) = (self.worker, self.bit);
        // The load limit checked once for the event; then a block the
        // worker does not hold yet (the common case) is one probe and a
        // fill, its slot in the runs taken in between.
        self.blocks.keyed.make_room(keys.len());
        for i in 0..keys.len() {
            let hash = hashes[i] as u64;
            let (slot, new) = match hash {
                // The one key kept beside the table.
                0 => store_keyed(self.index, self.blocks, w, hash, keys[i], bit, after),
                _ => {
                    let probed = self.blocks.keyed.probe(hash);
                    store_probed(self.index, self.blocks, w, hash, keys[i], bit, after, probed)
                }
            };
            // Stored before under another parent: it keeps its key, and the
            // chain goes on from there.
            if !new && self.index.key_at(slot) != keys[i] {
                keys[i] = self.index.key_at(slot);
                for j in i + 1..keys.len() {
                    keys[j] = chain(RouterKey(keys[j - 1]), contents[j]).0;
                }
            }
            after = Some(slot);
        }
        self.counters.stored_blocks += keys.len() as u64;
        true
    }

    /// Step 3 in general: block by block, chaining on the keys the blocks
    /// really have (the predicted ones while each block took the key it was
    /// given). Stops when the worker is full, counting the blocks left.
    /// `parent_slot` is the parent's slot when the worker holds it keyed.
    fn store_block_by_block(
        &mut self,
        s: &WireBlockStored,
        scratch: &StoreScratch,
        mut parent_key: Option<u64>,
        mut after: Option<u32>,
    ) {
        let n = s.block_hashes.len();
        let mut parent = s.parent_block_hash.map(|p| p as u64);
        let mut on_track = !scratch.keys.is_empty();
        for (i, &content) in scratch.contents.iter().enumerate() {
            let hash = s.block_hashes[i] as u64;
            let key = if on_track { Some(scratch.keys[i]) } else { parent_key.map(|p| chain(RouterKey(p), content).0) };
            // The node may keep a key from before (its parent known then).
            let Ok(kept) = self.insert_node(hash, content, parent, key.map(|k| (k, after))) else {
                self.counters.blocks_dropped_full += (n - i) as u64;
                break;
            };
            self.counters.stored_blocks += 1;
            on_track &= kept.map(|(k, _)| k) == key;
            parent_key = kept.map(|(k, _)| k);
            after = kept.map(|(_, s)| s);
            parent = Some(hash);
        }
    }

    /// Inserts or updates one block under `parent` (`None` for a chain
    /// start). `key` is its key with its parent's slot (`None` for a chain
    /// start) when the parent is keyed. Returns its key and slot when it
    /// has them, or `Err` when the worker is full.
    fn insert_node(
        &mut self,
        hash: u64,
        content: u64,
        parent: Option<u64>,
        key: Option<(u64, Option<u32>)>,
    ) -> Result<Option<(u64, u32)>, ()> {
        let (w, bit) = (self.worker, self.bit);
        let full = self.blocks.len() >= self.blocks_max;
        let worker = &mut *self.blocks;
        // The common case: a keyed block, no block waiting (so none to
        // resolve and none that could be this one), room left. One probe of
        // the worker's table, where the general path below takes two.
        if let Some((k, after)) = key
            && !full
            && worker.waiting.is_empty()
        {
            let (slot, _) = store_keyed(self.index, worker, w, hash, k, bit, after);
            return Ok(Some((self.index.key_at(slot), slot)));
        }
        if let Some(&slot) = worker.keyed.get(hash) {
            retier(self.index, &mut worker.dups, w, hash, slot, TierOp::Add(bit));
            return Ok(Some((self.index.key_at(slot), slot)));
        }
        if let Some(wt) = worker.waiting.get_mut(&hash) {
            // A waiting block stored again: take the new parent, and key it
            // if the parent is known now.
            wt.tiers |= bit;
            let old = *wt;
            match (key, parent) {
                (Some((k, after)), _) => {
                    worker.waiting.remove(&hash);
                    unlink_child(&mut worker.children, hash, old.parent);
                    let (slot, _) = store_keyed(self.index, worker, w, hash, k, old.tiers, after);
                    self.resolve_children(hash, k, slot);
                    return Ok(Some((k, slot)));
                }
                (None, Some(parent)) => {
                    *wt = Waiting { content, parent, tiers: old.tiers };
                    if old.parent != parent {
                        unlink_child(&mut worker.children, hash, old.parent);
                        worker.children.entry(parent).or_default().push(hash);
                    }
                }
                (None, None) => {}
            }
            return Ok(None);
        }
        if full {
            return Err(());
        }
        match key {
            Some((k, after)) => {
                let has_children = !worker.children.is_empty();
                let (slot, _) = store_keyed(self.index, worker, w, hash, k, bit, after);
                if has_children {
                    self.resolve_children(hash, k, slot);
                }
                Ok(Some((k, slot)))
            }
            None => {
                debug_assert!(parent.is_some(), "a chain start always has a key (the seed)");
                let parent = parent.unwrap_or_default();
                worker.waiting.insert(hash, Waiting { content, parent, tiers: bit });
                worker.children.entry(parent).or_default().push(hash);
                self.counters.blocks_pending += 1;
                Ok(None)
            }
        }
    }

    /// Keys every waiting descendant of `hash`, now that it has key `key`
    /// in slot `slot`.
    fn resolve_children(&mut self, hash: u64, key: u64, slot: u32) {
        let mut stack = vec![(hash, key, slot)];
        while let Some((h, k, s)) = stack.pop() {
            let worker = &mut *self.blocks;
            let Some(children) = worker.children.remove(&h) else { continue };
            for c in children {
                let Some(wt) = worker.waiting.get(&c).copied().filter(|wt| wt.parent == h) else { continue };
                worker.waiting.remove(&c);
                let ck = chain(RouterKey(k), wt.content).0;
                let (cs, _) = store_keyed(self.index, worker, self.worker, c, ck, wt.tiers, Some(s));
                self.counters.blocks_resolved_late += 1;
                stack.push((c, ck, cs));
            }
        }
    }
}

/// Engine hash `hash` of worker `w` takes `tiers` under key `key` (its
/// parent key in slot `after`, `None` for a chain start), with one probe of
/// the worker's table: a new entry takes the key's slot
/// ([`HolderIndex::hold`]); an entry there already keeps the key it has and
/// gains the tiers. Returns the slot and whether the entry is new. When the
/// worker holds `key` under another hash already, the key's hashes are
/// recorded apart (`worker::Dup`).
#[inline]
fn store_keyed(
    index: &mut HolderIndex,
    wb: &mut WorkerBlocks,
    w: u32,
    hash: u64,
    key: u64,
    tiers: u8,
    after: Option<u32>,
) -> (u32, bool) {
    if hash != 0 {
        wb.keyed.make_room(1);
        let probed = wb.keyed.probe(hash);
        return store_probed(index, wb, w, hash, key, tiers, after, probed);
    }
    // The one key kept beside the table.
    let mut before = 0;
    let (slot, new) = wb.keyed.get_or_insert_with(hash, || {
        let (slot, b) = index.hold(key, w, tiers, after);
        before = b;
        slot
    });
    if !new {
        retier(index, &mut wb.dups, w, hash, slot, TierOp::Add(tiers));
    } else if before != 0 {
        note_dup(&mut wb.dups, hash, key, before, tiers);
    }
    (slot, new)
}

/// [`store_keyed`] of a hash other than 0 once the worker's table has room
/// and was probed for it (`probed`, from [`SlotTable::probe`]): a stored
/// event checks the load limit once for all its blocks.
///
/// [`SlotTable::probe`]: crate::table::SlotTable::probe
#[inline(always)]
#[allow(clippy::too_many_arguments, reason = "store_keyed's arguments and the probe's result, inlined into two loops")]
fn store_probed(
    index: &mut HolderIndex,
    wb: &mut WorkerBlocks,
    w: u32,
    hash: u64,
    key: u64,
    tiers: u8,
    after: Option<u32>,
    probed: Result<usize, usize>,
) -> (u32, bool) {
    match probed {
        Err(free) => {
            let (slot, before) = index.hold(key, w, tiers, after);
            wb.keyed.fill(free, hash, slot);
            if before != 0 {
                note_dup(&mut wb.dups, hash, key, before, tiers);
            }
            (slot, true)
        }
        // Held already: it keeps its key and gains the tiers.
        Ok(at) => {
            let slot = wb.keyed.value_at(at);
            retier(index, &mut wb.dups, w, hash, slot, TierOp::Add(tiers));
            (slot, false)
        }
    }
}

/// Records that `hash` holds `key` in `tiers` beside the worker's other
/// hashes of it (`before`: their tiers).
#[cold]
#[inline(never)]
fn note_dup(dups: &mut U64Map<Dup>, hash: u64, key: u64, before: u8, tiers: u8) {
    let d = dups.entry(key).or_insert_with(|| Dup { first: before, hashes: Vec::new() });
    d.hashes.push((hash, tiers));
}

/// Replaces the tiers `t` of worker `w`'s engine hash `hash`, whose key is
/// in slot `slot`, by `op`; returns the hash's tiers before and after.
/// The worker's tiers for the key become the union over its hashes of the
/// key: one update unless the worker holds the key under several hashes.
/// `dups` is the worker's record of keys held under several hashes.
#[inline]
fn retier(index: &mut HolderIndex, dups: &mut U64Map<Dup>, w: u32, hash: u64, slot: u32, op: TierOp) -> (u8, u8) {
    if dups.is_empty() {
        return index.update_at(slot, w, op);
    }
    let key = index.key_at(slot);
    let Some(d) = dups.get_mut(&key) else { return index.update_at(slot, w, op) };
    let i = match d.hashes.iter().position(|(h, _)| *h == hash) {
        Some(i) => i,
        None => {
            // Not listed: the key's first hash, named for the first time.
            debug_assert!(d.first != 0, "an unlisted hash of a key is its first, held");
            d.hashes.push((hash, d.first));
            d.first = 0;
            d.hashes.len() - 1
        }
    };
    let old = d.hashes[i].1;
    let new = op.apply(old);
    if new == 0 {
        d.hashes.swap_remove(i);
    } else {
        d.hashes[i].1 = new;
    }
    let union = d.tiers();
    if d.hashes.len() + (d.first != 0) as usize <= 1 {
        dups.remove(&key);
    }
    index.update_at(slot, w, TierOp::Set(union));
    (old, new)
}
