//! The prefix indexer: which worker holds which block, in which tier, under
//! router keys computed from event contents.
//!
//! ```text
//!                 per worker                                  shared
//!   engine hash ──► router key ───────────────────────────► router key ──► holders: [worker|tiers]
//!   engine hash ──► Waiting { content, parent, tiers }   (parent not keyed yet)
//!   parent hash ──► waiting children
//!   UUID ─────────► content digest (learned from image_routing items; ambiguous on conflict)
//! ```
//!
//! Why this shape:
//! - Removals name engine hashes, lookups name router keys, so each worker
//!   keeps a map from its engine hashes to nodes, and one shared map goes from
//!   router key to the workers (and tiers) holding it. A lookup is then one
//!   probe per request block, stopping at the first key nobody holds.
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
//! - Memory is bounded: at most `blocks_per_worker_max` nodes per worker and
//!   `uuids_max` learned UUIDs; what does not fit is dropped and counted, and
//!   [`Indexer::memory`] reports the sizes.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};

use crate::hashing::{RouterKey, UuidLookup, UuidResolver, chain, content_hash, lora_identity, scope_seed};
use crate::table::{U64Table, prefetch};
use kvcore::wire::{WireBlockRemoved, WireBlockStored, WireEvent};
use kvcore::{ImageDigest, ImageRun, Tier};

/// A tier's bit in a block's holder mask.
fn tier_bit(tier: Tier) -> u8 {
    1 << tier as u8
}

/// A worker's dense index in the indexer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u32);

/// A hasher for keys that are already 64-bit hashes (engine hashes, router
/// keys): one folded multiply, enough to spread hashes that engines made from
/// small integers too.
#[derive(Clone, Copy, Debug, Default)]
pub struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64 ^ self.0.rotate_left(8));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let m = (x ^ self.0) as u128 * 0x9E37_79B9_7F4A_7C15u128;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

/// Builds [`U64Hasher`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuildU64;

impl BuildHasher for BuildU64 {
    type Hasher = U64Hasher;
    fn build_hasher(&self) -> U64Hasher {
        U64Hasher(0)
    }
}

type U64Map<V> = HashMap<u64, V, BuildU64>;

/// Limits and the block size of the model this indexer serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexerConfig {
    /// Tokens per block; events with another block size are rejected.
    pub block_size: u32,
    /// Most blocks (held or pending) per worker.
    pub blocks_per_worker_max: usize,
    /// Most UUIDs remembered (oldest forgotten first).
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
    /// UUIDs seen with two different digests (they resolve to nothing).
    pub uuid_conflicts: u64,
    /// UUIDs forgotten under `uuids_max`.
    pub uuids_forgotten: u64,
}

/// Sizes of the indexer's tables, and an estimate of their memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReport {
    /// Nodes over all workers (held and pending blocks).
    pub nodes: usize,
    /// Of those, pending (not keyed yet).
    pub pending: usize,
    /// Distinct router keys held by some worker.
    pub keys: usize,
    /// UUIDs remembered.
    pub uuids: usize,
    /// Bytes allocated by the tables (capacity times entry size, an estimate).
    pub bytes: usize,
}

const TIER_BITS: u8 = 0b11;

/// A block waiting for its parent to be keyed: what it needs to be keyed
/// later, without its tokens.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    content: u64,
    parent: u64,
    tiers: u8,
}

/// Marks a holder value that is an index into the overflow lists.
const MANY: u64 = 1 << 63;

/// The workers holding each router key. A value is one holder packed as
/// `worker << 2 | tier bits`, or, with [`MANY`] set, an index into
/// `overflow` where the holders of a key held by several workers are listed.
#[derive(Debug)]
struct HolderIndex {
    map: U64Table<u64>,
    overflow: Vec<Vec<u32>>,
    free: Vec<u32>,
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

impl Default for HolderIndex {
    fn default() -> Self {
        Self { map: U64Table::with_four_fold_below(HOLDER_FOUR_BELOW), overflow: Vec::new(), free: Vec::new() }
    }
}

/// The holders of one key, borrowed.
enum HolderRef<'a> {
    One([u32; 1]),
    Many(&'a [u32]),
}

impl HolderRef<'_> {
    fn as_slice(&self) -> &[u32] {
        match self {
            HolderRef::One(a) => a,
            HolderRef::Many(s) => s,
        }
    }
}

fn pack(worker: u32, tiers: u8) -> u32 {
    worker << 2 | tiers as u32
}

impl HolderIndex {
    #[inline]
    fn get(&self, key: u64) -> Option<HolderRef<'_>> {
        let v = *self.map.get(key)?;
        Some(if v & MANY != 0 {
            HolderRef::Many(&self.overflow[(v & !MANY) as usize])
        } else {
            HolderRef::One([v as u32])
        })
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    /// Sets `worker`'s tiers for `key`: 0 removes the worker, and a key with
    /// no holder left is removed.
    fn set(&mut self, key: u64, worker: u32, tiers: u8) {
        self.update(key, worker, |_| tiers);
    }

    /// Sets `worker`'s tiers for `key`, which it does not hold under another
    /// engine hash: one probe when nobody holds the key yet.
    #[inline]
    fn add(&mut self, key: u64, worker: u32, tiers: u8) {
        if self.map.insert_new(key, pack(worker, tiers) as u64).is_some() {
            self.set(key, worker, tiers);
        }
    }

    /// `worker`'s tiers for `key` (0 when it does not hold it).
    fn tiers(&self, key: u64, worker: u32) -> u8 {
        self.get(key).and_then(|h| h.as_slice().iter().find(|x| *x >> 2 == worker).map(|x| (x & 3) as u8)).unwrap_or(0)
    }

    /// Replaces `worker`'s tiers `t` for `key` by `f(t)` (0 when it did not
    /// hold the key; a result of 0 removes the worker, and a key with no
    /// holder left is removed). Returns the tiers before and after: one probe
    /// for a read and a write.
    fn update(&mut self, key: u64, worker: u32, f: impl FnOnce(u8) -> u8) -> (u8, u8) {
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

    fn bytes(&self) -> usize {
        self.map.bytes()
            + self.overflow.capacity() * 24
            + self.overflow.iter().map(|v| v.capacity() * 4).sum::<usize>()
            + self.free.capacity() * 4
    }
}

#[derive(Debug, Default)]
struct WorkerBlocks {
    name: String,
    live: bool,
    /// Keyed blocks by engine hash: their router keys. Their tiers are in
    /// the holder index, which every store and removal touches anyway, so a
    /// slot here is 16 bytes (four to a cache line, none straddling two).
    keyed: U64Table<u64>,
    /// Blocks waiting for their parent, by engine hash.
    waiting: U64Map<Waiting>,
    /// Parent engine hash to the waiting blocks stored under it.
    children: U64Map<Vec<u64>>,
    /// Blocks reserved by [`Indexer::reserve`].
    reserved: usize,
}

impl WorkerBlocks {
    fn len(&self) -> usize {
        self.keyed.len() + self.waiting.len()
    }
}

#[derive(Debug)]
struct UuidEntry {
    digest: ImageDigest,
    ambiguous: bool,
}

/// UUIDs paired with digests by `image_routing` items, bounded, oldest first out.
#[derive(Debug, Default)]
struct UuidMap {
    map: HashMap<Box<str>, UuidEntry, ahash::RandomState>,
    order: VecDeque<Box<str>>,
}

impl UuidMap {
    fn learn(&mut self, uuid: &str, digest: ImageDigest, max: usize, counters: &mut IndexerCounters) {
        if max == 0 {
            return;
        }
        if let Some(e) = self.map.get_mut(uuid) {
            if e.digest != digest && !e.ambiguous {
                e.ambiguous = true;
                counters.uuid_conflicts += 1;
            }
            return;
        }
        while self.map.len() >= max {
            let Some(old) = self.order.pop_front() else { break };
            self.map.remove(&old);
            counters.uuids_forgotten += 1;
        }
        let key: Box<str> = uuid.into();
        self.order.push_back(key.clone());
        self.map.insert(key, UuidEntry { digest, ambiguous: false });
    }
}

/// The router's view of every worker's cache (see the module docs).
#[derive(Debug)]
pub struct Indexer {
    config: IndexerConfig,
    workers: Vec<WorkerBlocks>,
    index: HolderIndex,
    uuids: UuidMap,
    counters: IndexerCounters,
    scratch: Vec<u8>,
    runs: Vec<ImageRun>,
    contents: Vec<u64>,
    keys: Vec<u64>,
    /// Per block of the event being applied: whether its worker table entry
    /// is new (reused between events, like the three above).
    added: Vec<bool>,
    /// Tests only: every block through the general path, the reference the
    /// event-at-once fast path is checked against.
    #[cfg(test)]
    general_path_only: bool,
    seed_cache: Option<(Option<String>, Option<String>, RouterKey)>,
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

impl Indexer {
    /// An empty indexer.
    pub fn new(config: IndexerConfig) -> Self {
        Self {
            config,
            workers: Vec::new(),
            index: HolderIndex::default(),
            uuids: UuidMap::default(),
            counters: IndexerCounters::default(),
            scratch: Vec::with_capacity(1024),
            runs: Vec::new(),
            contents: Vec::new(),
            keys: Vec::new(),
            added: Vec::new(),
            #[cfg(test)]
            general_path_only: false,
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
        self.counters
    }

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
    }

    /// Applies events in order, each as [`Indexer::apply`] does, reading ahead
    /// one event: while an event is applied, the table slots that the next
    /// one will touch are already being fetched.
    pub fn apply_all<'a>(&mut self, events: impl IntoIterator<Item = (WorkerId, &'a WireEvent)>) {
        let mut it = events.into_iter().peekable();
        if let Some((w, e)) = it.peek() {
            self.prefetch_event(*w, e);
        }
        while let Some((w, e)) = it.next() {
            if let Some((nw, ne)) = it.peek() {
                self.prefetch_event(*nw, ne);
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
        let hashes = match event {
            WireEvent::BlockStored(s) => {
                if let Some(t) = s.token_ids.as_deref() {
                    for line in t.iter().step_by(16) {
                        prefetch(line);
                    }
                }
                if let Some(p) = s.parent_block_hash {
                    wb.keyed.prefetch(p as u64);
                }
                &s.block_hashes
            }
            WireEvent::BlockRemoved(r) => &r.block_hashes,
            _ => return,
        };
        for &h in hashes {
            wb.keyed.prefetch(h as u64);
        }
    }

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

    /// Applies a `BlockStored` (see the module docs for what is skipped),
    /// without the read-ahead that [`Indexer::apply`] does first.
    pub fn apply_stored(&mut self, worker: WorkerId, s: &WireBlockStored) {
        let w = worker.0 as usize;
        if w >= self.workers.len() {
            return;
        }
        let n = s.block_hashes.len();
        if s.block_size != self.config.block_size {
            self.counters.events_wrong_block_size += 1;
            return;
        }
        let Some(tokens) = s.token_ids.as_deref() else {
            self.counters.blocks_without_tokens += n as u64;
            return;
        };
        let bs = s.block_size as usize;
        let routing = s.image_routing.as_ref();
        if tokens.len() != n * bs || routing.is_some_and(|r| !r.blocks.is_empty() && r.blocks.len() != n) {
            self.counters.events_malformed += 1;
            return;
        }
        self.counters.stored_events += 1;
        if let Some(r) = routing {
            for item in &r.items {
                if let Some(u) = &item.uuid {
                    self.uuids.learn(u, ImageDigest(item.digest), self.config.uuids_max, &mut self.counters);
                }
            }
        }
        let seed = self.seed_for(s);
        let tier = Tier::from_medium(s.medium.as_deref());
        // The parent's key, when known: the seed for a chain start. Its slot
        // and the blocks' own slots were fetched ahead (`prefetch_event`, by
        // `apply` or `apply_all`) and are read after the content hashes.
        let (mut parent_hash, mut has_parent) = (0u64, false);
        if let Some(p) = s.parent_block_hash {
            parent_hash = p as u64;
            has_parent = true;
        }
        // Pass 1: content hashes, pure computation.
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut runs = std::mem::take(&mut self.runs);
        let mut contents = std::mem::take(&mut self.contents);
        contents.clear();
        for (i, _) in s.block_hashes.iter().enumerate() {
            let block = &tokens[i * bs..(i + 1) * bs];
            runs.clear();
            if let Some(r) = routing
                && let Some(refs) = r.blocks.get(i)
            {
                let mut bad = false;
                for x in refs {
                    match r.items.get(x.item as usize) {
                        Some(item) if x.block_offset as u64 + x.len as u64 <= bs as u64 => runs.push(ImageRun {
                            digest: ImageDigest(item.digest),
                            item_offset: x.item_offset,
                            block_offset: x.block_offset,
                            len: x.len,
                        }),
                        _ => bad = true,
                    }
                }
                if bad {
                    self.counters.events_malformed += 1;
                    break;
                }
            } else if routing.is_none()
                && let Some(Some(info)) = s.block_mm_infos.as_ref().and_then(|m| m.get(i))
                && !info.mm_objects.is_empty()
            {
                // An image known only by `mm_hash`: no content identity.
                self.counters.image_blocks_unkeyable += (n - i) as u64;
                break;
            }
            contents.push(content_hash(block, &runs, &mut scratch));
        }
        let mut parent_key = if has_parent { self.workers[w].keyed.get(parent_hash).copied() } else { Some(seed.0) };
        // Pass 2: the keys the blocks will most likely get, then a tight loop
        // reading every holder slot pass 3 will write. The reads are independent and
        // few instructions apart, so their cache misses are all in flight at
        // once instead of one or two at a time between hash computations.
        let mut keys = std::mem::take(&mut self.keys);
        keys.clear();
        if let Some(mut p) = parent_key {
            for &c in &contents {
                p = chain(RouterKey(p), c).0;
                keys.push(p);
            }
        }
        for &k in &keys {
            self.index.map.prefetch(k);
        }
        // Pass 3, the common case: every block keyed, no block of the worker
        // waiting for a parent, room for all. The worker's table first (its
        // lines were fetched before the hashes), then the holder index, whose
        // lines have had those inserts' time to arrive.
        #[cfg(test)]
        let general = self.general_path_only;
        #[cfg(not(test))]
        let general = false;
        let worker = &mut self.workers[w];
        if !general
            && !keys.is_empty()
            && worker.waiting.is_empty()
            && worker.len() + keys.len() <= self.config.blocks_per_worker_max
        {
            let mut added = std::mem::take(&mut self.added);
            added.clear();
            for i in 0..keys.len() {
                match worker.keyed.insert_new(s.block_hashes[i] as u64, keys[i]) {
                    None => added.push(true),
                    Some(kept) => {
                        added.push(false);
                        // Stored before under another parent: it keeps its
                        // key, and the chain goes on from there.
                        if kept != keys[i] {
                            keys[i] = kept;
                            for j in i + 1..keys.len() {
                                keys[j] = chain(RouterKey(keys[j - 1]), contents[j]).0;
                            }
                        }
                    }
                }
            }
            let bit = tier_bit(tier);
            for (&k, &new) in keys.iter().zip(&added) {
                if new {
                    self.index.add(k, w as u32, bit);
                } else {
                    self.index.update(k, w as u32, |t| t | bit);
                }
            }
            self.counters.stored_blocks += keys.len() as u64;
            self.added = added;
            self.scratch = scratch;
            self.runs = runs;
            self.contents = contents;
            self.keys = keys;
            return;
        }
        // Pass 3: insert, chaining on the keys the blocks really have (the
        // predicted ones while each block took the key it was given).
        let mut on_track = !keys.is_empty();
        for (i, &content) in contents.iter().enumerate() {
            let hash = s.block_hashes[i] as u64;
            let key = if on_track { Some(keys[i]) } else { parent_key.map(|p| chain(RouterKey(p), content).0) };
            // The node may keep a key from before (its parent known then).
            let Ok(kept) = self.insert_node(w, hash, content, parent_hash, has_parent, key, tier) else {
                self.counters.blocks_dropped_full += (n - i) as u64;
                break;
            };
            self.counters.stored_blocks += 1;
            on_track &= kept == key;
            parent_key = kept;
            parent_hash = hash;
            has_parent = true;
        }
        self.scratch = scratch;
        self.runs = runs;
        self.contents = contents;
        self.keys = keys;
    }

    /// Inserts or updates one block. Returns its key when it has one, or
    /// `Err` when the worker is full.
    #[allow(clippy::too_many_arguments, reason = "one call site, all plain values")]
    fn insert_node(
        &mut self,
        w: usize,
        hash: u64,
        content: u64,
        parent: u64,
        has_parent: bool,
        key: Option<u64>,
        tier: Tier,
    ) -> Result<Option<u64>, ()> {
        let bit = tier_bit(tier);
        let full = self.workers[w].len() >= self.config.blocks_per_worker_max;
        let worker = &mut self.workers[w];
        // The common case: a keyed block, no block waiting (so none to
        // resolve and none that could be this one), room left. One probe of
        // each table, where the general path below takes two.
        if let Some(k) = key
            && !full
            && worker.waiting.is_empty()
        {
            return Ok(Some(match worker.keyed.insert_new(hash, k) {
                Some(kept) => {
                    self.index.update(kept, w as u32, |t| t | bit);
                    kept
                }
                None => {
                    self.index.add(k, w as u32, bit);
                    k
                }
            }));
        }
        if let Some(&k) = worker.keyed.get(hash) {
            self.index.update(k, w as u32, |t| t | bit);
            return Ok(Some(k));
        }
        if let Some(wt) = worker.waiting.get_mut(&hash) {
            // A waiting block stored again: take the new parent, and key it
            // if the parent is known now.
            wt.tiers |= bit;
            let old = *wt;
            match key {
                Some(k) => {
                    worker.waiting.remove(&hash);
                    unlink_child(&mut worker.children, hash, old.parent);
                    worker.keyed.insert(hash, k);
                    self.index.set(k, w as u32, old.tiers);
                    self.resolve_children(w, hash, k);
                }
                None if has_parent => {
                    *wt = Waiting { content, parent, tiers: old.tiers };
                    if old.parent != parent {
                        unlink_child(&mut worker.children, hash, old.parent);
                        worker.children.entry(parent).or_default().push(hash);
                    }
                }
                None => {}
            }
            return Ok(key);
        }
        if full {
            return Err(());
        }
        match key {
            Some(k) => {
                worker.keyed.insert(hash, k);
                let has_children = !worker.children.is_empty();
                self.index.set(k, w as u32, bit);
                if has_children {
                    self.resolve_children(w, hash, k);
                }
            }
            None => {
                debug_assert!(has_parent, "a chain start always has a key (the seed)");
                worker.waiting.insert(hash, Waiting { content, parent, tiers: bit });
                worker.children.entry(parent).or_default().push(hash);
                self.counters.blocks_pending += 1;
            }
        }
        Ok(key)
    }

    /// Keys every waiting descendant of `hash`, now that it has key `key`.
    fn resolve_children(&mut self, w: usize, hash: u64, key: u64) {
        let mut stack = vec![(hash, key)];
        while let Some((h, k)) = stack.pop() {
            let worker = &mut self.workers[w];
            let Some(children) = worker.children.remove(&h) else { continue };
            for c in children {
                let Some(wt) = worker.waiting.get(&c).copied().filter(|wt| wt.parent == h) else { continue };
                worker.waiting.remove(&c);
                let ck = chain(RouterKey(k), wt.content).0;
                worker.keyed.insert(c, ck);
                self.index.set(ck, w as u32, wt.tiers);
                self.counters.blocks_resolved_late += 1;
                stack.push((c, ck));
            }
        }
    }

    /// Applies a `BlockRemoved`: each hash leaves the event's tier; a block in
    /// no tier is forgotten. Unknown hashes are no-ops. Without the
    /// read-ahead that [`Indexer::apply`] does first.
    pub fn apply_removed(&mut self, worker: WorkerId, r: &WireBlockRemoved) {
        let w = worker.0 as usize;
        if w >= self.workers.len() {
            return;
        }
        self.counters.removed_events += 1;
        let bit = tier_bit(Tier::from_medium(r.medium.as_deref()));
        if r.block_hashes.len() > 1 {
            // The blocks' slots were fetched ahead (`prefetch_event`); fetch
            // the holder slots of the keys found there, so that their misses
            // overlap. Only hints: the loop below looks everything up again
            // (in cache by then).
            let keyed = &self.workers[w].keyed;
            for &hash in &r.block_hashes {
                if let Some(&k) = keyed.get(hash as u64) {
                    self.index.map.prefetch(k);
                }
            }
        }
        for &hash in &r.block_hashes {
            let hash = hash as u64;
            let worker = &mut self.workers[w];
            if let Some(&key) = worker.keyed.get(hash) {
                let (old, tiers) = self.index.update(key, w as u32, |t| t & !bit);
                if tiers == 0 {
                    worker.keyed.remove(hash);
                }
                if old & bit != 0 {
                    self.counters.removed_blocks += 1;
                } else {
                    self.counters.removed_unknown += 1;
                }
            } else if let Some(wt) = worker.waiting.get_mut(&hash).filter(|wt| wt.tiers & bit != 0) {
                wt.tiers &= !bit;
                if wt.tiers == 0 {
                    let parent = wt.parent;
                    worker.waiting.remove(&hash);
                    unlink_child(&mut worker.children, hash, parent);
                }
                self.counters.removed_blocks += 1;
            } else {
                self.counters.removed_unknown += 1;
            }
        }
    }

    /// Forgets every block of one worker (its `AllBlocksCleared`, or a resync).
    /// The tables keep their capacity for what comes next.
    pub fn clear_worker(&mut self, worker: WorkerId) {
        let w = worker.0 as usize;
        let Some(wb) = self.workers.get_mut(w) else { return };
        for (_, k) in wb.keyed.iter() {
            self.index.set(*k, w as u32, 0);
        }
        wb.keyed.clear();
        wb.waiting.clear();
        wb.children.clear();
    }

    /// For each worker holding the request's first key, the longest prefix of
    /// `keys` it holds, per tier. Workers holding nothing are left out.
    pub fn find_matches(&self, keys: &[RouterKey]) -> Vec<Overlap> {
        let mut out = Vec::new();
        let Some(first) = keys.first().and_then(|k| self.index.get(k.0)) else { return out };
        // Candidates are the holders of the first key; a worker absent there
        // cannot have a prefix of length > 0.
        for &h in first.as_slice() {
            let tiers = (h & 3) as u8;
            out.push(Overlap {
                worker: WorkerId(h >> 2),
                device_blocks: (tiers & tier_bit(Tier::Device) != 0) as u32,
                any_tier_blocks: 1,
            });
        }
        let mut slot: Vec<u32> = Vec::new();
        if out.len() > 8 {
            slot = vec![u32::MAX; self.workers.len()];
            for (i, o) in out.iter().enumerate() {
                slot[o.worker.0 as usize] = i as u32;
            }
        }
        // Advances a worker's prefix if it reached block `i`; returns whether it did.
        let advance = |out: &mut Vec<Overlap>, h: u32, i: u32| -> bool {
            let (wid, tiers) = (h >> 2, (h & 3) as u8);
            let found = if slot.is_empty() {
                out.iter_mut().find(|o| o.worker.0 == wid)
            } else {
                match slot[wid as usize] {
                    u32::MAX => None,
                    s => out.get_mut(s as usize),
                }
            };
            match found {
                Some(o) if o.any_tier_blocks == i => {
                    o.any_tier_blocks += 1;
                    if o.device_blocks == i && tiers & tier_bit(Tier::Device) != 0 {
                        o.device_blocks += 1;
                    }
                    true
                }
                _ => false,
            }
        };
        for (i, key) in keys.iter().enumerate().skip(1) {
            let i = i as u32;
            let Some(&v) = self.index.map.get(key.0) else { break };
            let advanced = if v & MANY == 0 {
                // One holder: the common case, no slice to build.
                advance(&mut out, v as u32, i)
            } else {
                let mut any = false;
                for &h in &self.index.overflow[(v & !MANY) as usize] {
                    any |= advance(&mut out, h, i);
                }
                any
            };
            if !advanced {
                break;
            }
        }
        out.sort_by_key(|o| o.worker);
        out
    }

    /// The engine hashes a worker holds in a tier (waiting ones included),
    /// sorted: the router's view, for checks and reports.
    pub fn worker_blocks(&self, worker: WorkerId, tier: Tier) -> Vec<i64> {
        let Some(w) = self.workers.get(worker.0 as usize) else { return Vec::new() };
        let bit = tier_bit(tier);
        let mut v: Vec<i64> = w
            .keyed
            .iter()
            .filter(|(_, k)| self.index.tiers(**k, worker.0) & bit != 0)
            .map(|(h, _)| h as i64)
            .chain(w.waiting.iter().filter(|(_, k)| k.tiers & bit != 0).map(|(h, _)| *h as i64))
            .collect();
        v.sort_unstable();
        v
    }

    /// The router key a worker's block was filed under, when it is keyed.
    pub fn router_key_of(&self, worker: WorkerId, hash: i64) -> Option<RouterKey> {
        self.workers.get(worker.0 as usize)?.keyed.get(hash as u64).map(|k| RouterKey(*k))
    }

    /// Reserves room for `blocks` blocks of one worker (its cache capacity,
    /// when known), so that its table does not grow while events arrive.
    /// The shared holder index is sized for the sum of every worker's
    /// reservation.
    pub fn reserve(&mut self, worker: WorkerId, blocks: usize) {
        let blocks = blocks.min(self.config.blocks_per_worker_max);
        if let Some(w) = self.workers.get_mut(worker.0 as usize) {
            w.keyed.reserve(blocks.saturating_sub(w.keyed.len()));
            w.reserved = blocks;
            let total: usize = self.workers.iter().map(|w| w.reserved).sum();
            self.index.map.reserve(total.saturating_sub(self.index.len()));
        }
    }

    /// Table sizes and a memory estimate.
    pub fn memory(&self) -> MemoryReport {
        let mut r = MemoryReport { keys: self.index.len(), uuids: self.uuids.map.len(), ..Default::default() };
        let mut bytes = self.index.bytes();
        for w in &self.workers {
            r.nodes += w.len();
            r.pending += w.waiting.len();
            bytes += w.keyed.bytes();
            bytes += w.waiting.capacity() * (8 + std::mem::size_of::<Waiting>() + 1);
            bytes +=
                w.children.capacity() * (8 + 24 + 1) + w.children.values().map(|v| v.capacity() * 8).sum::<usize>();
        }
        bytes += self.uuids.map.capacity() * (16 + std::mem::size_of::<UuidEntry>() + 1)
            + self.uuids.map.keys().map(|k| k.len() * 2).sum::<usize>()
            + self.uuids.order.capacity() * 16;
        r.bytes = bytes;
        r
    }

    /// Checks the indexer's invariants; panics naming the one broken.
    ///
    /// 1. Every keyed block is listed among its key's holders, with a tier
    ///    (its tiers are kept there).
    /// 2. Every holder entry is a keyed block of that worker.
    /// 3. Every waiting block holds a tier and is listed under its parent;
    ///    every listed child is a waiting block with that parent.
    pub fn check_invariants(&self) {
        let mut entries = 0usize;
        for (wi, w) in self.workers.iter().enumerate() {
            for (h, &k) in w.keyed.iter() {
                assert!(self.index.get(k).is_some(), "invariant 1: keyed block {h:x} is indexed");
                let tiers = self.index.tiers(k, wi as u32);
                assert!(tiers & TIER_BITS != 0 && tiers & !TIER_BITS == 0, "invariant 1: block {h:x} holds a tier");
                entries += 1;
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
        let total: usize =
            self.index.map.iter().map(|(k, _)| self.index.get(k).map_or(0, |h| h.as_slice().len())).sum();
        assert!(total <= entries, "invariant 2: no stray holder entries ({total} > {entries})");
    }
}

impl UuidResolver for Indexer {
    fn resolve(&self, uuid: &str) -> UuidLookup {
        match self.uuids.map.get(uuid) {
            Some(e) if e.ambiguous => UuidLookup::Ambiguous,
            Some(e) => UuidLookup::Digest(e.digest),
            None => UuidLookup::Unknown,
        }
    }
}

/// Removes `hash` from the children listed under `parent`.
fn unlink_child(children: &mut U64Map<Vec<u64>>, hash: u64, parent: u64) {
    if let Some(v) = children.get_mut(&parent)
        && let Some(p) = v.iter().position(|h| *h == hash)
    {
        v.swap_remove(p);
        if v.is_empty() {
            children.remove(&parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::{ImagePlacement, ImageRef, NoUuids, TokenRequest, hash_request};
    use kvcore::wire::{ImageRoutingV1, WireImageItem, WireImageRef, WireMmInfo, WireMmObject};

    fn stored(hashes: &[i64], parent: Option<i64>, tokens: Vec<u32>, medium: &str) -> WireEvent {
        WireEvent::BlockStored(WireBlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: parent,
            token_ids: Some(tokens),
            block_size: 4,
            medium: Some(medium.into()),
            ..Default::default()
        })
    }

    /// The holder index grows four-fold past the worker tables' bound: with
    /// 51 200 keys it went 65 536 -> 262 144 slots (two-fold would have
    /// stopped at 131 072), while a worker's table of 12 800 keys follows
    /// the default rule.
    #[test]
    fn holder_index_grows_four_fold_past_the_worker_bound() {
        use crate::workload::{WorkloadSpec, generate};
        let spec = WorkloadSpec { sequences: 400, seq_tokens: 4096, workers: 4, ..Default::default() };
        let w = generate(&spec);
        let mut ix = Indexer::new(IndexerConfig { block_size: spec.block_size, ..Default::default() });
        let ids: Vec<WorkerId> = (0..spec.workers).map(|i| ix.add_worker(&i.to_string())).collect();
        ix.apply_all(w.events.iter().map(|(wi, e)| (ids[*wi], e)));
        assert_eq!(ix.index.len(), 51_200);
        assert_eq!(ix.index.map.capacity(), 1 << 18);
        assert_eq!(ix.workers[0].keyed.len(), 12_800);
        assert_eq!(ix.workers[0].keyed.capacity(), 1 << 16);
    }

    fn removed(hashes: &[i64], medium: &str) -> WireEvent {
        WireEvent::BlockRemoved(WireBlockRemoved { block_hashes: hashes.to_vec(), medium: Some(medium.into()) })
    }

    fn keys_of(tokens: &[u32]) -> Vec<RouterKey> {
        let req = TokenRequest { tokens: tokens.to_vec(), ..Default::default() };
        hash_request(&req, 4, 0, &NoUuids).unwrap().keys
    }

    fn config() -> IndexerConfig {
        IndexerConfig { block_size: 4, ..Default::default() }
    }

    mod fast_path {
        use super::*;
        use proptest::prelude::*;

        /// One event of a small random stream: few hashes and few token
        /// blocks, so that blocks are stored again (under other parents,
        /// hence kept keys), removed, moved between tiers and stored before
        /// their parents.
        #[derive(Clone, Debug)]
        enum Ev {
            Store { worker: u32, first: i64, len: usize, parent: Option<i64>, salt: u32, cpu: bool },
            Remove { worker: u32, hashes: Vec<i64>, cpu: bool },
            Clear { worker: u32 },
        }

        fn ev() -> impl Strategy<Value = Ev> {
            prop_oneof![
                6 => (0..3u32, 0..24i64, 1..6usize, proptest::option::of(0..24i64), 0..3u32, any::<bool>())
                    .prop_map(|(worker, first, len, parent, salt, cpu)| Ev::Store { worker, first, len, parent, salt, cpu }),
                3 => (0..3u32, proptest::collection::vec(0..30i64, 1..6), any::<bool>())
                    .prop_map(|(worker, hashes, cpu)| Ev::Remove { worker, hashes, cpu }),
                1 => (0..3u32).prop_map(|worker| Ev::Clear { worker }),
            ]
        }

        fn wire(e: &Ev) -> (WorkerId, WireEvent) {
            let medium = |cpu: bool| if cpu { "CPU" } else { "GPU" };
            match e {
                Ev::Store { worker, first, len, parent, salt, cpu } => {
                    let hashes: Vec<i64> = (0..*len as i64).map(|i| first + i).collect();
                    // Tokens follow from the hash and the salt, so a hash stored
                    // twice may come with the same content or another one.
                    let tokens = hashes.iter().flat_map(|h| (0..4).map(move |t| (*h as u32) * 8 + t + salt)).collect();
                    (WorkerId(*worker), stored(&hashes, *parent, tokens, medium(*cpu)))
                }
                Ev::Remove { worker, hashes, cpu } => (WorkerId(*worker), removed(hashes, medium(*cpu))),
                Ev::Clear { worker } => (WorkerId(*worker), WireEvent::AllBlocksCleared),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

            /// `apply_all`, which reads ahead and stores a whole event's blocks
            /// at once when it can, leaves the indexer exactly as applying the
            /// events one by one through the general per-block path does: the
            /// same router key for every (worker, hash), the same blocks per
            /// tier, the same counters and the same overlaps, under any stream
            /// of stores, re-stores, removals, tier moves, clears and
            /// out-of-order parents, with a per-worker limit that is reached.
            #[test]
            #[cfg_attr(miri, ignore)]
            fn apply_all_matches_the_general_path(events in proptest::collection::vec(ev(), 1..80), max in 4..40usize) {
                let cfg = IndexerConfig { block_size: 4, blocks_per_worker_max: max, ..Default::default() };
                let (mut fast, mut slow) = (Indexer::new(cfg.clone()), Indexer::new(cfg));
                slow.general_path_only = true;
                for ix in [&mut fast, &mut slow] {
                    for w in 0..3 {
                        ix.add_worker(&w.to_string());
                    }
                }
                let wired: Vec<(WorkerId, WireEvent)> = events.iter().map(wire).collect();
                fast.apply_all(wired.iter().map(|(w, e)| (*w, e)));
                for (w, e) in &wired {
                    slow.apply(*w, e);
                }
                fast.check_invariants();
                prop_assert_eq!(fast.counters(), slow.counters());
                for w in 0..3 {
                    let w = WorkerId(w);
                    for tier in [Tier::Device, Tier::Host] {
                        prop_assert_eq!(fast.worker_blocks(w, tier), slow.worker_blocks(w, tier));
                    }
                    for h in 0..30 {
                        prop_assert_eq!(fast.router_key_of(w, h), slow.router_key_of(w, h));
                    }
                }
                for (_, e) in &wired {
                    if let WireEvent::BlockStored(s) = e {
                        let keys: Vec<RouterKey> = s.block_hashes.iter()
                            .filter_map(|h| slow.router_key_of(WorkerId(0), *h)).collect();
                        prop_assert_eq!(fast.find_matches(&keys), slow.find_matches(&keys));
                        prop_assert_eq!(fast.find_matches(&keys_of(s.token_ids.as_deref().unwrap_or(&[]))),
                            slow.find_matches(&keys_of(s.token_ids.as_deref().unwrap_or(&[]))));
                    }
                }
            }
        }
    }

    /// Stored blocks are found by the keys a request computes; removals,
    /// tier moves and clears change the overlap as the engine's cache did.
    #[test]
    fn store_lookup_remove_per_tier() {
        let mut ix = Indexer::new(config());
        let (a, b) = (ix.add_worker("a"), ix.add_worker("b"));
        let tokens: Vec<u32> = (0..12).collect();
        ix.apply(a, &stored(&[1, 2, 3], None, tokens.clone(), "GPU"));
        ix.apply(b, &stored(&[1, 2], None, tokens[..8].to_vec(), "GPU"));
        ix.check_invariants();
        let keys = keys_of(&tokens);
        let m = ix.find_matches(&keys);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].worker, m[0].device_blocks, m[0].any_tier_blocks), (a, 3, 3));
        assert_eq!((m[1].worker, m[1].device_blocks, m[1].any_tier_blocks), (b, 2, 2));
        // Offload a's middle block: device prefix 1, any-tier prefix 3.
        ix.apply(a, &removed(&[2], "GPU"));
        ix.apply(a, &stored(&[2], Some(1), tokens[4..8].to_vec(), "CPU"));
        ix.check_invariants();
        let m = ix.find_matches(&keys);
        assert_eq!((m[0].device_blocks, m[0].any_tier_blocks), (1, 3));
        // Removing an unknown hash or the wrong tier is a no-op.
        ix.apply(a, &removed(&[99], "GPU"));
        ix.apply(a, &removed(&[2], "GPU"));
        assert_eq!(ix.counters().removed_unknown, 2);
        assert_eq!(ix.worker_blocks(a, Tier::Host), vec![2]);
        ix.apply(b, &WireEvent::AllBlocksCleared);
        ix.check_invariants();
        let m = ix.find_matches(&keys);
        assert_eq!(m.len(), 1);
        assert!(ix.worker_blocks(b, Tier::Device).is_empty());
    }

    /// A child stored before its parent (an orphan re-advertised) is held
    /// but unkeyed until the parent is stored; then it is found.
    #[test]
    fn pending_children_are_keyed_when_the_parent_arrives() {
        let mut ix = Indexer::new(config());
        let a = ix.add_worker("a");
        let tokens: Vec<u32> = (100..112).collect();
        ix.apply(a, &stored(&[3], Some(2), tokens[8..].to_vec(), "GPU"));
        ix.apply(a, &stored(&[2], Some(1), tokens[4..8].to_vec(), "CPU"));
        assert_eq!(ix.memory().pending, 2);
        ix.check_invariants();
        assert_eq!(ix.worker_blocks(a, Tier::Device), vec![3]);
        ix.apply(a, &stored(&[1], None, tokens[..4].to_vec(), "GPU"));
        ix.check_invariants();
        assert_eq!(ix.memory().pending, 0);
        assert_eq!(ix.counters().blocks_resolved_late, 2);
        let m = ix.find_matches(&keys_of(&tokens));
        assert_eq!((m[0].device_blocks, m[0].any_tier_blocks), (1, 3));
        // A pending node removed before its parent arrives is forgotten cleanly.
        ix.apply(a, &stored(&[7], Some(6), tokens[..4].to_vec(), "GPU"));
        ix.apply(a, &removed(&[7], "GPU"));
        ix.check_invariants();
        assert_eq!(ix.memory().pending, 0);
    }

    /// Image blocks are keyed by digest (a request with the bytes finds them,
    /// one with other bytes does not); the UUID is learned; an image known
    /// only by `mm_hash` is skipped and counted, and removing it is harmless.
    #[test]
    fn images_by_digest_and_unkeyable_mm_hash() {
        let mut ix = Indexer::new(config());
        let a = ix.add_worker("a");
        let pixels = b"pixels".to_vec();
        let digest = ImageDigest::of_content(&pixels);
        let tokens = vec![1, 9, 9, 9, 9, 2, 3, 4];
        let mut s = WireBlockStored {
            block_hashes: vec![10, 11],
            token_ids: Some(tokens.clone()),
            block_size: 4,
            image_routing: Some(ImageRoutingV1 {
                items: vec![WireImageItem { digest: digest.0, uuid: Some("u1".into()) }],
                blocks: vec![
                    vec![WireImageRef { item: 0, item_offset: 0, block_offset: 1, len: 3 }],
                    vec![WireImageRef { item: 0, item_offset: 3, block_offset: 0, len: 1 }],
                ],
            }),
            ..Default::default()
        };
        ix.apply(a, &WireEvent::BlockStored(s.clone()));
        let req = |image| TokenRequest {
            tokens: tokens.clone(),
            images: vec![ImagePlacement { image, runs: vec![(1, 4)] }],
            ..Default::default()
        };
        let by_uuid = hash_request(&req(ImageRef::Uuid("u1".into())), 4, 9, &ix).unwrap();
        assert_eq!(ix.find_matches(&by_uuid.keys)[0].device_blocks, 2);
        let by_bytes = hash_request(&req(ImageRef::Bytes(pixels)), 4, 9, &ix).unwrap();
        assert_eq!(by_bytes.keys, by_uuid.keys);
        let other = hash_request(&req(ImageRef::Bytes(b"other".to_vec())), 4, 9, &ix).unwrap();
        assert!(ix.find_matches(&other.keys).is_empty());
        // Same UUID with other pixels on another event: ambiguous from then on.
        s.block_hashes = vec![20, 21];
        s.image_routing.as_mut().unwrap().items[0].digest = [5; 32];
        ix.apply(a, &WireEvent::BlockStored(s.clone()));
        assert_eq!(ix.resolve("u1"), UuidLookup::Ambiguous);
        assert_eq!(ix.counters().uuid_conflicts, 1);
        // Dynamo-style identity only: the image block and its successors are skipped.
        s.block_hashes = vec![30, 31];
        s.image_routing = None;
        s.block_mm_infos =
            Some(vec![Some(WireMmInfo { mm_objects: vec![WireMmObject { mm_hash: 7, offsets: vec![[1, 4]] }] }), None]);
        ix.apply(a, &WireEvent::BlockStored(s));
        assert_eq!(ix.counters().image_blocks_unkeyable, 2);
        ix.apply(a, &removed(&[30, 31], "GPU"));
        assert_eq!(ix.counters().removed_unknown, 2);
        ix.check_invariants();
    }

    /// The per-worker bound drops what does not fit, counts it, and the
    /// memory report tracks the tables.
    #[test]
    fn bounded_memory() {
        let mut ix = Indexer::new(IndexerConfig { block_size: 4, blocks_per_worker_max: 2, uuids_max: 1 });
        let a = ix.add_worker("a");
        ix.apply(a, &stored(&[1, 2, 3], None, (0..12).collect(), "GPU"));
        assert_eq!(ix.counters().blocks_dropped_full, 1);
        assert_eq!(ix.worker_blocks(a, Tier::Device).len(), 2);
        let m = ix.memory();
        assert_eq!((m.nodes, m.keys), (2, 2));
        assert!(m.bytes > 0);
        ix.check_invariants();
    }
}
