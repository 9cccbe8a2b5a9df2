//! The prefix indexer: which worker holds which block, in which tier, under
//! router keys computed from event contents.
//!
//! ```text
//!                 per worker                                  shared
//!   engine hash ──► router key ───────────────────────────► router key ──► holders: [worker|tiers]
//!   engine hash ──► Waiting { content, parent, tiers }   (parent not keyed yet)
//!   parent hash ──► waiting children
//!   UUID ─────────► (digest, worker, blocks) references      fleet-wide (uuids.rs)
//! ```
//!
//! Why this shape:
//! - Removals name engine hashes, lookups name router keys, so each worker
//!   keeps a map from its engine hashes to nodes, and one shared map goes from
//!   router key to the workers (and tiers) holding it. A lookup walks the
//!   request's keys, stopping at the first key nobody holds; the keys of a
//!   stored sequence also sit side by side in store order (`runs.rs`), so
//!   the walk compares keys there and probes only where a run breaks.
//! - A stored block whose parent the worker does not hold (the engine evicted
//!   the parent first, or re-advertised an orphan after a tier move or in a
//!   snapshot) cannot be chained yet. It is held as a *pending* node with its
//!   8-byte content hash and gets its router key when the parent is stored.
//!   That matches the engine: a block whose parent is gone is unreachable by a
//!   prefix match until the parent returns.
//! - The view of a worker (which engine hashes it holds in which tier) is
//!   exact whatever the order of parents and children; only the keying waits.
//! - An image block whose identity cannot be known (Dynamo's `block_mm_infos`
//!   alone gives a 64-bit `mm_hash`, which may come from a UUID, not from the
//!   pixels) is skipped and counted, together with the rest of its event (their
//!   keys chain through it). Removing a hash the worker never held is a no-op,
//!   so later removals of those blocks are harmless.
//! - A UUID resolves to a digest only while every block of the fleet that
//!   names it gives that digest; the references are counted per block, so a
//!   conflict ends when the conflicting copies are removed, cleared or their
//!   worker removed (`uuids.rs` says how forgetting under the bound stays
//!   safe).
//! - Memory is bounded: at most `blocks_per_worker_max` nodes per worker (and
//!   as many blocks naming a UUID) and `uuids_max` UUIDs; what does not fit
//!   is dropped and counted, and [`Indexer::memory`] reports the sizes.

//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the indexer and its public types, workers, lookups, invariants |
//! | `apply.rs` | applying events: stored blocks in three steps, removals, read-ahead |
//! | `memory.rs` | reservations and the memory report |
//! | `holders.rs` | the shared map from router key to holders and tiers |
//! | `runs.rs` | every key and its holders in store order, for lookups that compare instead of probing |
//! | `worker.rs` | one worker's keyed and waiting blocks |
//! | `uuids.rs` | the fleet-wide UUID view: digests per UUID by reference counts, bounded |

mod apply;
mod holders;
mod memory;
mod runs;
mod uuids;
mod worker;

#[cfg(test)]
mod tests;

use kvcore::{ImageRun, Tier};

use crate::hashing::{RouterKey, RouterScope, TextKeys, UuidLookup, UuidResolver};

use holders::{HolderIndex, TIER_BITS, tier_bit};
use uuids::{UuidView, ViewChange};
use worker::WorkerBlocks;

/// Blocks that [`Indexer::find_matches_text`] hashes at a time, when its
/// walk reaches the end of the keys made: hashing goes at most this many
/// blocks past the key where the walk stops, and each chunk costs one
/// call into the vector hash.
pub const LOOKUP_CHUNK_BLOCKS: usize = 32;

/// A worker's dense index in the indexer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u32);

/// Limits and the block size of the model this indexer serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexerConfig {
    /// Tokens per block; events with another block size are rejected.
    pub block_size: u32,
    /// Most blocks (held or pending) per worker.
    pub blocks_per_worker_max: usize,
    /// Most UUIDs in the fleet-wide view (the oldest learned is evicted
    /// first; a UUID evicted while held stays unresolvable until its holders
    /// clear, see [`UuidLookup::Unsure`]).
    pub uuids_max: usize,
}

impl Default for IndexerConfig {
    fn default() -> Self {
        Self { block_size: 32, blocks_per_worker_max: 1 << 24, uuids_max: 1 << 20 }
    }
}

/// What the indexer did with the events it was given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IndexerCounters {
    /// `BlockStored` events applied.
    pub stored_events: u64,
    /// Blocks of those events now held (keyed or pending).
    pub stored_blocks: u64,
    /// `BlockRemoved` events applied.
    pub removed_events: u64,
    /// Blocks removed from a tier that held them.
    pub removed_blocks: u64,
    /// Removals of a hash (or tier) the worker did not hold: no-ops.
    pub removed_unknown: u64,
    /// `AllBlocksCleared` events applied.
    pub cleared_events: u64,
    /// Blocks stored while their parent was unknown (keyed later, if ever).
    pub blocks_pending: u64,
    /// Pending blocks keyed when their parent arrived.
    pub blocks_resolved_late: u64,
    /// Image blocks (and the rest of their event) skipped because no content
    /// digest identifies their image.
    pub image_blocks_unkeyable: u64,
    /// Blocks skipped because their event carried no token ids.
    pub blocks_without_tokens: u64,
    /// Events rejected for a block size other than the configured one.
    pub events_wrong_block_size: u64,
    /// Events rejected as malformed (token count or image references wrong).
    pub events_malformed: u64,
    /// Blocks dropped because the worker was at `blocks_per_worker_max`.
    pub blocks_dropped_full: u64,
    /// Events of a type this decoder does not know (ignored).
    pub events_unknown: u64,
    /// Times a UUID became held under two different digests (it resolves to
    /// nothing while it is).
    pub uuid_conflicts: u64,
    /// Times an ambiguous UUID became unambiguous again, its conflicting
    /// copies gone.
    pub uuid_conflicts_resolved: u64,
    /// UUIDs evicted from the view under `uuids_max`.
    pub uuids_forgotten: u64,
    /// UUID references of blocks not recorded because the worker had
    /// `blocks_per_worker_max` blocks naming UUIDs (their UUIDs turn unsure).
    pub uuid_refs_unrecorded: u64,
    /// Lookups of a UUID answered ambiguous.
    pub uuid_lookups_ambiguous: u64,
    /// Lookups of a UUID answered unsure (see [`UuidLookup::Unsure`]).
    pub uuid_lookups_unsure: u64,
}

/// Sizes of the indexer's tables, and an estimate of their memory
/// ([`Indexer::memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IndexerMemory {
    /// Nodes over all workers (held and pending blocks).
    pub nodes: usize,
    /// Of those, pending (not keyed yet).
    pub pending: usize,
    /// Distinct router keys held by some worker.
    pub keys: usize,
    /// UUIDs in the fleet-wide view.
    pub uuids: usize,
    /// Of those, held under two digests or more now.
    pub uuids_ambiguous: usize,
    /// Blocks recorded as naming a UUID, over all workers.
    pub uuid_blocks: usize,
    /// Unsure slots set, summed over workers (0 unless the view forgot or
    /// could not record a reference).
    pub uuid_unsure_slots: usize,
    /// Bytes allocated by the tables (capacity times entry size, an estimate).
    pub bytes: usize,
}

impl IndexerCounters {
    /// Adds `o`'s counts to these (a sum over indexers).
    pub(crate) fn add(&mut self, o: &IndexerCounters) {
        self.stored_events += o.stored_events;
        self.stored_blocks += o.stored_blocks;
        self.removed_events += o.removed_events;
        self.removed_blocks += o.removed_blocks;
        self.removed_unknown += o.removed_unknown;
        self.cleared_events += o.cleared_events;
        self.blocks_pending += o.blocks_pending;
        self.blocks_resolved_late += o.blocks_resolved_late;
        self.image_blocks_unkeyable += o.image_blocks_unkeyable;
        self.blocks_without_tokens += o.blocks_without_tokens;
        self.events_wrong_block_size += o.events_wrong_block_size;
        self.events_malformed += o.events_malformed;
        self.blocks_dropped_full += o.blocks_dropped_full;
        self.events_unknown += o.events_unknown;
        self.uuid_conflicts += o.uuid_conflicts;
        self.uuid_conflicts_resolved += o.uuid_conflicts_resolved;
        self.uuids_forgotten += o.uuids_forgotten;
        self.uuid_refs_unrecorded += o.uuid_refs_unrecorded;
        self.uuid_lookups_ambiguous += o.uuid_lookups_ambiguous;
        self.uuid_lookups_unsure += o.uuid_lookups_unsure;
    }
}

impl IndexerMemory {
    /// Adds `o`'s sizes to these (a sum over indexers).
    pub(crate) fn add(&mut self, o: &IndexerMemory) {
        self.nodes += o.nodes;
        self.pending += o.pending;
        self.keys += o.keys;
        self.uuids += o.uuids;
        self.uuids_ambiguous += o.uuids_ambiguous;
        self.uuid_blocks += o.uuid_blocks;
        self.uuid_unsure_slots += o.uuid_unsure_slots;
        self.bytes += o.bytes;
    }
}

/// A worker's overlap with a request: the longest prefix, in blocks, held in
/// each tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Overlap {
    /// The worker.
    #[serde(serialize_with = "ser_worker")]
    pub worker: WorkerId,
    /// Leading blocks held on the device.
    pub device_blocks: u32,
    /// Leading blocks held on the device or a lower tier (at least
    /// `device_blocks`): a host block is reused after an onboard copy.
    pub any_tier_blocks: u32,
}

fn ser_worker<S: serde::Serializer>(w: &WorkerId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u32(w.0)
}

/// The buffers that storing one `BlockStored` event works in. The indexer
/// owns them and reuses them from event to event, so that once they have
/// grown to the largest event, applying allocates nothing.
#[derive(Debug)]
struct StoreScratch {
    /// The bytes a block with images is hashed from.
    bytes: Vec<u8>,
    /// The image runs of the block being hashed.
    runs: Vec<ImageRun>,
    /// Step 1: each block's content hash, up to the first block that cannot
    /// be keyed.
    contents: Vec<u64>,
    /// Step 2: the router key each block will most likely get (empty when the
    /// parent's key is unknown).
    keys: Vec<u64>,
    /// A removal's blocks taken out of the worker's table, with their
    /// slots, for its second pass.
    taken: Vec<(u64, u32)>,
}

impl StoreScratch {
    fn new() -> Self {
        Self {
            bytes: Vec::with_capacity(1024),
            runs: Vec::new(),
            contents: Vec::new(),
            keys: Vec::new(),
            taken: Vec::new(),
        }
    }
}

/// How many of `keys` sit, in order, in the slots `rk` / `rh` under holder
/// value `h`: the length of the run a lookup walks without a probe. Eight
/// at a time while they all match, then one by one.
#[inline]
fn run_len(keys: &[RouterKey], rk: &[u64], rh: &[u32], h: u32) -> usize {
    let n = keys.len().min(rk.len()).min(rh.len());
    let (keys, rk, rh) = (&keys[..n], &rk[..n], &rh[..n]);
    let mut j = 0;
    while j + 8 <= n {
        let mut all = true;
        for t in j..j + 8 {
            all &= (keys[t].0 == rk[t]) & (rh[t] == h);
        }
        if !all {
            break;
        }
        j += 8;
    }
    while j < n && keys[j].0 == rk[j] && rh[j] == h {
        j += 1;
    }
    j
}

/// Where a lookup's keys come from: given whole, or made as the walk needs
/// them.
pub(crate) trait KeySource {
    /// The keys made so far.
    fn keys(&self) -> &[RouterKey];
    /// Makes more keys; false when there are none.
    fn more(&mut self) -> bool;
}

/// Keys given whole.
pub(crate) struct Given<'a>(pub(crate) &'a [RouterKey]);

impl KeySource for Given<'_> {
    fn keys(&self) -> &[RouterKey] {
        self.0
    }
    fn more(&mut self) -> bool {
        false
    }
}

impl KeySource for TextKeys<'_> {
    fn keys(&self) -> &[RouterKey] {
        &self.keys
    }
    fn more(&mut self) -> bool {
        TextKeys::more(self)
    }
}

/// The router's view of every worker's cache (see the module docs).
#[derive(Debug)]
pub struct Indexer {
    config: IndexerConfig,
    workers: Vec<WorkerBlocks>,
    index: HolderIndex,
    uuids: UuidView,
    counters: IndexerCounters,
    scratch: StoreScratch,
    /// The last scope seen, `(LoRA identity, cache salt, seed)`: consecutive
    /// events nearly always share it, and its seed costs a hash.
    seed_cache: Option<(Option<String>, Option<String>, RouterKey)>,
}

impl Indexer {
    /// An empty indexer.
    pub fn new(config: IndexerConfig) -> Self {
        Self {
            config,
            workers: Vec::new(),
            index: HolderIndex::default(),
            uuids: UuidView::default(),
            counters: IndexerCounters::default(),
            scratch: StoreScratch::new(),
            seed_cache: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &IndexerConfig {
        &self.config
    }

    /// Adds a worker; its name is only for reports.
    pub fn add_worker(&mut self, name: &str) -> WorkerId {
        self.workers.push(WorkerBlocks { name: name.to_owned(), live: true, ..Default::default() });
        self.uuids.add_worker(self.workers.len() - 1);
        self.index.runs.add_stream(self.workers.len());
        WorkerId(self.workers.len() as u32 - 1)
    }

    /// Workers added so far, removed ones included (their view is empty).
    pub fn workers_len(&self) -> usize {
        self.workers.len()
    }

    /// The name a worker was added with.
    pub fn worker_name(&self, worker: WorkerId) -> Option<&str> {
        self.workers.get(worker.0 as usize).map(|w| w.name.as_str())
    }

    /// Forgets everything a worker holds and stops routing to it.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.clear_worker(worker);
        if let Some(w) = self.workers.get_mut(worker.0 as usize) {
            w.live = false;
        }
    }

    /// Whether the worker is live (added and not removed).
    pub fn is_live(&self, worker: WorkerId) -> bool {
        self.workers.get(worker.0 as usize).is_some_and(|w| w.live)
    }

    /// The counters.
    pub fn counters(&self) -> IndexerCounters {
        let (ambiguous, unsure) = self.uuids.lookups();
        IndexerCounters { uuid_lookups_ambiguous: ambiguous, uuid_lookups_unsure: unsure, ..self.counters }
    }

    /// Adds what the UUID view changed to the counters.
    fn count_view(&mut self, c: ViewChange) {
        self.counters.uuid_conflicts += c.conflicts;
        self.counters.uuid_conflicts_resolved += c.conflicts_resolved;
        self.counters.uuids_forgotten += c.forgotten;
        self.counters.uuid_refs_unrecorded += c.unrecorded;
    }

    /// Forgets every block of one worker (its `AllBlocksCleared`, or a resync).
    /// The tables keep their capacity for what comes next.
    pub fn clear_worker(&mut self, worker: WorkerId) {
        let w = worker.0 as usize;
        if w >= self.workers.len() {
            return;
        }
        let change = self.uuids.clear_worker(w);
        self.count_view(change);
        let wb = &mut self.workers[w];
        for (_, &slot) in wb.keyed.iter() {
            // A key held under two hashes is named twice: the second finds
            // the worker gone (or the slot dead) and changes nothing.
            self.index.update_at(slot, w as u32, holders::TierOp::Set(0));
        }
        wb.keyed.clear();
        wb.waiting.clear();
        wb.children.clear();
        wb.dups.clear();
        self.settle();
    }

    /// Restores the holder index's invariant after slots were freed
    /// (`holders.rs`); when that compacts the runs, the workers' tables
    /// follow the slots that moved.
    fn settle(&mut self) {
        if let Some(moved) = self.index.settle() {
            for (i, w) in self.workers.iter_mut().enumerate() {
                if !moved.touches(i) {
                    continue;
                }
                // A dead entry's value is past every slot: no chunk of it
                // moved.
                for s in w.keyed.values_mut_with_dead() {
                    if let Some(n) = moved.get(*s) {
                        *s = n;
                    }
                }
            }
        }
    }

    /// For each worker holding the request's first key, the longest prefix of
    /// `keys` it holds, per tier. Workers holding nothing are left out.
    ///
    /// One walk down the keys. Keys held by the same workers in the same
    /// tiers share one interned holder set (`holders.rs`), and a key whose
    /// set is the previous key's advances exactly the workers the previous
    /// key advanced: such a run is counted and added once where the set
    /// changes. The keys of a stored sequence sit in consecutive slots of
    /// the runs (`runs.rs`), so the walk first compares the request's keys
    /// with the slots after the last key found, and probes the holder index
    /// only where that run breaks. The cost is then a comparison per key, a
    /// probe per break, and the holders at each change of set, not the
    /// holders times the keys.
    pub fn find_matches(&self, keys: &[RouterKey]) -> Vec<Overlap> {
        let mut out = Vec::new();
        self.find_matches_into(keys, &mut out);
        out
    }

    /// [`Indexer::find_matches`] of the text keys of `tokens` in `scope`
    /// ([`RouterScope::text_keys`]), hashing only as far as the walk goes:
    /// the blocks are hashed [`LOOKUP_CHUNK_BLOCKS`] at a time, each chunk
    /// when the walk reaches the end of the keys made so far, so hashing
    /// stops within a chunk of the first key that advances nobody. The
    /// answer is the same as for every key: no prefix passes that key. A
    /// routing decision for a prompt that shares only its start with the
    /// cache then costs the hashing of that start, not of the whole prompt.
    pub fn find_matches_text(&self, scope: &RouterScope, tokens: &[u32]) -> Vec<Overlap> {
        let mut out = Vec::new();
        self.walk(&mut TextKeys::new(scope, tokens, LOOKUP_CHUNK_BLOCKS), &mut out);
        out
    }

    /// Hints the CPU to fetch the holder index's line for `key`.
    pub(crate) fn prefetch_key(&self, key: RouterKey) {
        self.index.map.prefetch(key.0);
    }

    /// [`Indexer::find_matches`], appending its answer to `out` (sorted by
    /// worker among themselves) instead of allocating a vector.
    pub fn find_matches_into(&self, keys: &[RouterKey], out: &mut Vec<Overlap>) {
        self.walk(&mut Given(keys), out);
    }

    /// The walk of [`Indexer::find_matches`] over the keys of `src`, asking
    /// it for more keys when it reaches the end of those made.
    pub(crate) fn walk(&self, src: &mut impl KeySource, out: &mut Vec<Overlap>) {
        if src.keys().is_empty() && !src.more() {
            return;
        }
        // A first key is a chain start: always a run head.
        let Some(&e0) = src.keys().first().and_then(|k| self.index.map.get(k.0)) else { return };
        let v0 = self.index.runs.holders[e0 as usize];
        // Candidates are the holders of the first key, sorted by worker (a
        // set's list is); a worker absent there cannot have a prefix > 0.
        let first = self.index.resolve(v0);
        let base = out.len();
        out.reserve(first.as_slice().len());
        for &h in first.as_slice() {
            let tiers = (h & 3) as u8;
            out.push(Overlap {
                worker: WorkerId(h >> 2),
                device_blocks: (tiers & tier_bit(Tier::Device) != 0) as u32,
                any_tier_blocks: 1,
            });
        }
        let out = &mut out[base..];
        // `mat`: the last key whose set was walked; a candidate advanced
        // there (in any tier, on the device) iff its count is `mat + 1`.
        // `run`: the keys since `mat` with that same set, which advanced
        // exactly the same candidates.
        let (mut prev, mut mat, mut run) = (v0, 0u32, 0u32);
        let flush = |out: &mut [Overlap], mat: u32, run: u32| {
            if run > 0 {
                for o in out {
                    if o.any_tier_blocks == mat + 1 {
                        o.any_tier_blocks += run;
                    }
                    if o.device_blocks == mat + 1 {
                        o.device_blocks += run;
                    }
                }
            }
        };
        let probe = self.index.map.reader();
        let (rk, rh) = (&self.index.runs.keys[..], &self.index.runs.holders[..]);
        // The slot the next key sits in if the run of the last one found
        // goes on.
        let mut slot = e0 as usize + 1;
        let mut i = 1;
        loop {
            if i >= src.keys().len() && !src.more() {
                break;
            }
            let keys = src.keys();
            let n = run_len(&keys[i..], rk.get(slot..).unwrap_or_default(), rh.get(slot..).unwrap_or_default(), prev);
            run += n as u32;
            i += n;
            slot += n;
            // At the end of the keys made: the loop asks for more.
            let Some(key) = keys.get(i) else { continue };
            // Key `i` is either in that slot under other holders, or
            // elsewhere: a live slot holding a key is that key's one slot.
            let (v, at) = match (rk.get(slot), rh.get(slot)) {
                (Some(&k), Some(&h)) if k == key.0 && h != 0 => (h, slot),
                _ => {
                    let Some(e) = probe.get(key.0) else { break };
                    (rh[e as usize], e as usize)
                }
            };
            slot = at + 1;
            if v == prev {
                run += 1;
                i += 1;
                continue;
            }
            flush(out, mat, run);
            let i32 = i as u32;
            (prev, mat, run) = (v, i32, 0);
            // Merge the sorted candidates with the sorted holders of key `i`.
            let holders = self.index.resolve(v);
            let (mut c, mut advanced) = (0usize, false);
            for &h in holders.as_slice() {
                let wid = h >> 2;
                while c < out.len() && out[c].worker.0 < wid {
                    c += 1;
                }
                let Some(o) = out.get_mut(c) else { break };
                if o.worker.0 == wid && o.any_tier_blocks == i32 {
                    o.any_tier_blocks += 1;
                    advanced = true;
                    if o.device_blocks == i32 && (h as u8) & tier_bit(Tier::Device) != 0 {
                        o.device_blocks += 1;
                    }
                }
            }
            if !advanced {
                // Nobody reached this key: no later key can extend a prefix.
                return;
            }
            i += 1;
        }
        flush(out, mat, run);
    }

    /// The engine hashes a worker holds in a tier (waiting ones included),
    /// sorted: the router's view, for checks and reports.
    pub fn worker_blocks(&self, worker: WorkerId, tier: Tier) -> Vec<i64> {
        let Some(w) = self.workers.get(worker.0 as usize) else { return Vec::new() };
        let bit = tier_bit(tier);
        let mut v: Vec<i64> = w
            .keyed
            .iter()
            .filter(|(h, s)| {
                let tiers = match w.dups.get(&self.index.key_at(**s)) {
                    Some(d) => d.tiers_of(*h),
                    None => self.index.tiers_at(**s, worker.0),
                };
                tiers & bit != 0
            })
            .map(|(h, _)| h as i64)
            .chain(w.waiting.iter().filter(|(_, k)| k.tiers & bit != 0).map(|(h, _)| *h as i64))
            .collect();
        v.sort_unstable();
        v
    }

    /// The router key a worker's block was filed under, when it is keyed.
    pub fn router_key_of(&self, worker: WorkerId, hash: i64) -> Option<RouterKey> {
        self.workers.get(worker.0 as usize)?.keyed.get(hash as u64).map(|s| RouterKey(self.index.key_at(*s)))
    }

    /// Checks the indexer's invariants; panics naming the one broken.
    ///
    /// 1. Every keyed block is listed among its key's holders, with a tier
    ///    (its tiers are kept there).
    /// 2. Every holder entry is a keyed block of that worker.
    /// 3. Every waiting block holds a tier and is listed under its parent;
    ///    every listed child is a waiting block with that parent.
    /// 4. A key that a worker holds under several engine hashes has the
    ///    union of their tiers in the holder index.
    pub fn check_invariants(&self) {
        let mut entries = 0usize;
        for (wi, w) in self.workers.iter().enumerate() {
            for (h, &s) in w.keyed.iter() {
                assert!((s as usize) < self.index.runs.slots(), "invariant 1: keyed block {h:x} has a slot");
                let tiers = self.index.tiers_at(s, wi as u32);
                assert!(tiers & TIER_BITS != 0 && tiers & !TIER_BITS == 0, "invariant 1: block {h:x} holds a tier");
                entries += 1;
            }
            for (k, d) in &w.dups {
                assert!(d.hashes.len() + (d.first != 0) as usize >= 2, "invariant 4: key {k:x} has two hashes or more");
                for (h, t) in &d.hashes {
                    let s = w.keyed.get(*h).copied();
                    assert!(
                        *t != 0 && s.is_some_and(|s| self.index.key_at(s) == *k),
                        "invariant 4: hash {h:x} is keyed {k:x}"
                    );
                    assert_eq!(
                        s.map(|s| self.index.tiers_at(s, wi as u32)),
                        Some(d.tiers()),
                        "invariant 4: key {k:x}'s tiers are its hashes'"
                    );
                }
            }
            for (h, wt) in &w.waiting {
                assert!(wt.tiers != 0, "invariant 3: waiting block {h:x} holds a tier");
                let listed = w.children.get(&wt.parent).is_some_and(|v| v.contains(h));
                assert!(listed, "invariant 3: waiting block {h:x} listed under its parent");
            }
            for (p, list) in &w.children {
                for c in list {
                    assert!(w.waiting.get(c).is_some_and(|wt| wt.parent == *p), "invariant 3: child {c:x} of {p:x}");
                }
            }
        }
        let total: usize = (0..self.index.runs.slots() as u32)
            .filter(|&s| self.index.runs.holders[s as usize] != 0)
            .map(|s| self.index.at(s).as_slice().len())
            .sum();
        assert!(total <= entries, "invariant 2: no stray holder entries ({total} > {entries})");
        self.index.check_runs();
    }
}

impl UuidResolver for Indexer {
    fn resolve(&self, uuid: &str) -> UuidLookup {
        self.uuids.lookup(uuid)
    }
}
