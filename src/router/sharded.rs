//! Sharded ingest: the fleet's workers split over several [`Indexer`]s, each
//! applying its workers' events on a thread of its own.
//!
//! Why by worker: every event names one worker, and a worker's events must
//! apply in order, so a shard that owns whole workers applies its share of
//! a batch alone, with no lock or message per event and nothing shared with
//! the other shards. A key held by workers of two shards is then held in
//! both shards' holder indexes; a lookup asks every shard and merges their
//! answers, which are disjoint (each worker lives in one shard).
//!
//! What it gives up against one [`Indexer`]:
//! - A lookup costs one walk per shard (each one the walk of a smaller
//!   index), where one indexer walks once.
//! - Memory: a key held in several shards has an entry in each.
//! - The UUID view is per shard. A UUID resolves to a digest only when no
//!   shard finds it ambiguous or unsure and every shard that knows it gives
//!   the same digest; two shards giving two digests make it ambiguous, as
//!   two workers of one indexer would. `uuids_max` is split evenly over the
//!   shards, so the view's bound stays the configured one in all.
//!
//! Concurrency: the shards sit behind one read-write lock.
//! [`ShardedIndexer::apply_all`] write-locks them for the batch and hands
//! each pool thread its own shard; a lookup read-locks them once, from any
//! thread, and walks them in turn. A lock per shard would let a lookup
//! start on the shards done with a batch, but it walks every shard, so it
//! would wait for the slowest anyway, and it cost a lock and an unlock per
//! shard on every lookup (16 of them about 0.5 us on the development VM,
//! as long as the rest of a lookup held by one worker of 16 shards).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use kvcore::wire::WireEvent;

use crate::hashing::{RouterKey, RouterScope, TextKeys, UuidLookup, UuidResolver};
use crate::indexer::{
    Given, Indexer, IndexerConfig, IndexerCounters, IndexerMemory, KeySource, LOOKUP_CHUNK_BLOCKS, Overlap, WorkerId,
};

/// One shard: an indexer over some workers, and their fleet-wide ids.
#[derive(Debug)]
struct Shard {
    /// The indexer, over the shard's workers under its own (local) ids.
    indexer: Indexer,
    /// The fleet-wide id of each local worker, by local id.
    fleet_ids: Vec<WorkerId>,
}

/// The workers split over shards, events applied by shard in parallel (see
/// the module docs).
#[derive(Debug)]
pub struct ShardedIndexer {
    shards: RwLock<Vec<Shard>>,
    /// Each fleet-wide worker's shard and its id there.
    placement: Vec<(usize, WorkerId)>,
    /// The threads that apply events: one per shard.
    pool: rayon::ThreadPool,
    /// Lookups of a UUID found ambiguous across shards (two shards, two
    /// digests), which no shard's counters see.
    cross_shard_ambiguous: AtomicU64,
}

/// What [`ShardedIndexer::new`] cannot do.
#[derive(Debug, thiserror::Error)]
pub enum ShardedError {
    /// Zero shards were asked for.
    #[error("a sharded indexer needs one shard or more")]
    NoShards,
    /// The pool's threads could not be started.
    #[error("the ingest threads could not start: {0}")]
    Threads(String),
}

/// The shards' lock, taken even if a thread panicked while holding it: the
/// indexers' tables stay consistent between events, and apply never panics
/// on any event, so a poisoned lock holds nothing half done.
fn read(shards: &RwLock<Vec<Shard>>) -> RwLockReadGuard<'_, Vec<Shard>> {
    shards.read().unwrap_or_else(|p| p.into_inner())
}

/// See [`read`].
fn write(shards: &RwLock<Vec<Shard>>) -> RwLockWriteGuard<'_, Vec<Shard>> {
    shards.write().unwrap_or_else(|p| p.into_inner())
}

impl ShardedIndexer {
    /// An empty indexer of `shards` shards, with as many ingest threads.
    /// Each shard takes `config`, but for `uuids_max`, which is split over
    /// the shards (at least one UUID each).
    pub fn new(config: IndexerConfig, shards: usize) -> Result<Self, ShardedError> {
        if shards == 0 {
            return Err(ShardedError::NoShards);
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(shards)
            .thread_name(|i| format!("kvcore-ingest-{i}"))
            .build()
            .map_err(|e| ShardedError::Threads(e.to_string()))?;
        let per_shard = IndexerConfig { uuids_max: (config.uuids_max / shards).max(1), ..config };
        let shards =
            (0..shards).map(|_| Shard { indexer: Indexer::new(per_shard.clone()), fleet_ids: Vec::new() }).collect();
        Ok(Self { shards: RwLock::new(shards), placement: Vec::new(), pool, cross_shard_ambiguous: AtomicU64::new(0) })
    }

    /// Shards (and ingest threads).
    pub fn shards(&self) -> usize {
        // The pool has one thread a shard; reading it takes no lock.
        self.pool.current_num_threads()
    }

    /// Adds a worker, to the shard holding the fewest workers (the lowest
    /// such shard): workers added one after another go round the shards.
    pub fn add_worker(&mut self, name: &str) -> WorkerId {
        let fleet = WorkerId(self.placement.len() as u32);
        let (i, shard) = self
            .shards
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
            .enumerate()
            .min_by_key(|(i, s)| (s.fleet_ids.len(), *i))
            .expect("one shard or more");
        let local = shard.indexer.add_worker(name);
        shard.fleet_ids.push(fleet);
        self.placement.push((i, local));
        fleet
    }

    /// Workers added so far, removed ones included.
    pub fn workers_len(&self) -> usize {
        self.placement.len()
    }

    /// The shard a worker was placed in, and its id there.
    fn place(&self, worker: WorkerId) -> Option<(usize, WorkerId)> {
        self.placement.get(worker.0 as usize).copied()
    }

    /// Forgets everything a worker holds and stops routing to it.
    pub fn remove_worker(&self, worker: WorkerId) {
        if let Some((s, local)) = self.place(worker) {
            write(&self.shards)[s].indexer.remove_worker(local);
        }
    }

    /// Forgets every block of one worker (its `AllBlocksCleared`, or a resync).
    pub fn clear_worker(&self, worker: WorkerId) {
        if let Some((s, local)) = self.place(worker) {
            write(&self.shards)[s].indexer.clear_worker(local);
        }
    }

    /// Applies one decoded event from `worker` on the calling thread, as
    /// [`Indexer::apply`] does.
    pub fn apply(&self, worker: WorkerId, event: &WireEvent) {
        if let Some((s, local)) = self.place(worker) {
            write(&self.shards)[s].indexer.apply(local, event);
        }
    }

    /// Applies a batch of events, each worker's in their order: every shard
    /// applies its workers' events on its own thread of the pool, and the
    /// call returns when all have. Events of unknown workers are ignored.
    pub fn apply_all(&self, events: &[(WorkerId, WireEvent)]) {
        let placement = &self.placement;
        let mut shards = write(&self.shards);
        if let [shard] = shards.as_mut_slice() {
            shard.indexer.apply_all(events.iter().filter_map(|(w, e)| Some((placement.get(w.0 as usize)?.1, e))));
            return;
        }
        let shards: &mut [Shard] = &mut shards;
        self.pool.scope(|scope| {
            for (i, shard) in shards.iter_mut().enumerate() {
                scope.spawn(move |_| {
                    let mine = events.iter().filter_map(|(w, e)| match placement.get(w.0 as usize) {
                        Some(&(s, local)) if s == i => Some((local, e)),
                        _ => None,
                    });
                    shard.indexer.apply_all(mine);
                });
            }
        });
    }

    /// For each worker holding the request's first key, the longest prefix
    /// of `keys` it holds, per tier: what one [`Indexer`] holding every
    /// worker answers ([`Indexer::find_matches`]), in another order. The
    /// answer comes shard by shard (each shard's workers in the order they
    /// were added), not sorted by worker across shards: merging the shards'
    /// lists cost more than their walks did, and a caller picking a worker
    /// needs no order. Sort by `worker` where one is wanted.
    pub fn find_matches(&self, keys: &[RouterKey]) -> Vec<Overlap> {
        self.gather(&mut Given(keys))
    }

    /// [`ShardedIndexer::find_matches`] of the text keys of `tokens` in
    /// `scope`, hashed only as far as the walks go
    /// ([`Indexer::find_matches_text`]); each key is hashed once, whatever
    /// the shards.
    pub fn find_matches_text(&self, scope: &RouterScope, tokens: &[u32]) -> Vec<Overlap> {
        self.gather(&mut TextKeys::new(scope, tokens, LOOKUP_CHUNK_BLOCKS))
    }

    /// Every shard's walk over the keys of `src`, shard by shard, with the
    /// fleet's ids. The first key's line is fetched in every shard before
    /// the first walk, so that the shards holding none of the prompt (one
    /// probe each) do not wait for their misses one after another.
    fn gather(&self, src: &mut impl KeySource) -> Vec<Overlap> {
        // Room for every worker up to a bound, so that the shards' answers
        // seldom regrow it.
        let mut out = Vec::with_capacity(self.placement.len().min(256));
        if src.keys().is_empty() && !src.more() {
            return out;
        }
        let shards = read(&self.shards);
        if shards.len() > 1 {
            for shard in shards.iter() {
                shard.indexer.prefetch_key(src.keys()[0]);
            }
        }
        for shard in shards.iter() {
            let at = out.len();
            shard.indexer.walk(src, &mut out);
            for o in &mut out[at..] {
                o.worker = shard.fleet_ids[o.worker.0 as usize];
            }
        }
        out
    }

    /// The counters, summed over the shards; `uuid_lookups_ambiguous` also
    /// counts UUIDs found ambiguous across shards.
    pub fn counters(&self) -> IndexerCounters {
        let mut c = IndexerCounters::default();
        for shard in read(&self.shards).iter() {
            c.add(&shard.indexer.counters());
        }
        c.uuid_lookups_ambiguous += self.cross_shard_ambiguous.load(Ordering::Relaxed);
        c
    }

    /// Table sizes and the memory estimate, summed over the shards (a key
    /// held in two shards counts twice, as it is held twice).
    pub fn memory(&self) -> IndexerMemory {
        let mut m = IndexerMemory::default();
        for shard in read(&self.shards).iter() {
            m.add(&shard.indexer.memory());
        }
        m
    }

    /// Checks every shard's invariants ([`Indexer::check_invariants`]), and
    /// that each worker's fleet-wide id maps back to itself.
    pub fn check_invariants(&self) {
        let shards = read(&self.shards);
        for (fleet, &(s, local)) in self.placement.iter().enumerate() {
            assert_eq!(
                shards[s].fleet_ids.get(local.0 as usize),
                Some(&WorkerId(fleet as u32)),
                "placement of {fleet}"
            );
        }
        for shard in shards.iter() {
            shard.indexer.check_invariants();
        }
    }
}

impl UuidResolver for ShardedIndexer {
    fn resolve(&self, uuid: &str) -> UuidLookup {
        let mut found: Option<kvcore::ImageDigest> = None;
        let mut unsure = false;
        for shard in read(&self.shards).iter() {
            match shard.indexer.resolve(uuid) {
                UuidLookup::Ambiguous => return UuidLookup::Ambiguous,
                UuidLookup::Unsure => unsure = true,
                UuidLookup::Digest(d) => match found {
                    Some(f) if f != d => {
                        self.cross_shard_ambiguous.fetch_add(1, Ordering::Relaxed);
                        return UuidLookup::Ambiguous;
                    }
                    _ => found = Some(d),
                },
                UuidLookup::Unknown => {}
            }
        }
        match (unsure, found) {
            (true, _) => UuidLookup::Unsure,
            (false, Some(d)) => UuidLookup::Digest(d),
            (false, None) => UuidLookup::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use kvcore::Tier;
    use kvcore::wire::{ImageRoutingV1, WireBlockRemoved, WireBlockStored, WireImageItem, WireImageRef};
    use proptest::prelude::*;

    use super::*;
    use crate::hashing::{NoUuids, TokenRequest, hash_request};

    const WORKERS: u32 = 5;

    fn config() -> IndexerConfig {
        IndexerConfig { block_size: 4, blocks_per_worker_max: 24, ..Default::default() }
    }

    /// A stored event of blocks `first..first + len` under `parent`; a
    /// block's tokens follow from its hash and `salt` alone, so that
    /// workers storing the same hashes share router keys (across shards).
    fn stored(first: i64, len: usize, parent: Option<i64>, salt: u32, cpu: bool) -> WireEvent {
        let hashes: Vec<i64> = (first..first + len as i64).collect();
        let tokens = hashes.iter().flat_map(|h| (0..4).map(move |t| (*h as u32) * 8 + t + salt)).collect();
        WireEvent::BlockStored(WireBlockStored {
            block_hashes: hashes,
            parent_block_hash: parent,
            token_ids: Some(tokens),
            block_size: 4,
            medium: Some(if cpu { "CPU" } else { "GPU" }.into()),
            ..Default::default()
        })
    }

    fn ev() -> impl Strategy<Value = (u32, WireEvent)> {
        prop_oneof![
            6 => (0..WORKERS, 0..20i64, 1..6usize, proptest::option::of(0..20i64), 0..2u32, any::<bool>())
                .prop_map(|(w, first, len, parent, salt, cpu)| (w, stored(first, len, parent, salt, cpu))),
            3 => (0..WORKERS, proptest::collection::vec(0..26i64, 1..6), any::<bool>()).prop_map(|(w, hashes, cpu)| {
                let medium = Some(if cpu { "CPU" } else { "GPU" }.into());
                (w, WireEvent::BlockRemoved(WireBlockRemoved { block_hashes: hashes, medium, ..Default::default() }))
            }),
            1 => (0..WORKERS).prop_map(|w| (w, WireEvent::AllBlocksCleared)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 150, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any number of shards, events applied a batch at a time on the
        /// pool, answer every lookup as one indexer given the same events
        /// does, with the same counters and the same blocks per worker and
        /// tier; workers share keys across shards, are removed, cleared and
        /// filled to their limit.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn shards_answer_as_one_indexer(
            events in proptest::collection::vec(ev(), 1..80),
            shards in 1..5usize,
            batch in 1..12usize,
            gone in proptest::option::of(0..WORKERS),
        ) {
            let mut one = Indexer::new(config());
            let mut many = ShardedIndexer::new(config(), shards).unwrap();
            for w in 0..WORKERS {
                prop_assert_eq!(one.add_worker(&w.to_string()), many.add_worker(&w.to_string()));
            }
            let wired: Vec<(WorkerId, WireEvent)> = events.iter().map(|(w, e)| (WorkerId(*w), e.clone())).collect();
            for (i, chunk) in wired.chunks(batch).enumerate() {
                if i == 1 && let Some(g) = gone {
                    one.remove_worker(WorkerId(g));
                    many.remove_worker(WorkerId(g));
                }
                one.apply_all(chunk.iter().map(|(w, e)| (*w, e)));
                many.apply_all(chunk);
            }
            many.check_invariants();
            prop_assert_eq!(one.counters(), many.counters());
            for (_, e) in &wired {
                if let WireEvent::BlockStored(s) = e {
                    let req = TokenRequest { tokens: s.token_ids.clone().unwrap_or_default(), ..Default::default() };
                    let keys = hash_request(&req, 4, 0, &NoUuids).unwrap().keys;
                    let want = one.find_matches(&keys);
                    let mut got = many.find_matches(&keys);
                    got.sort_by_key(|o| o.worker);
                    prop_assert_eq!(&want, &got);
                    let scope = RouterScope { block_size: 4, lora: None, cache_salt: None };
                    let mut text = many.find_matches_text(&scope, &req.tokens);
                    text.sort_by_key(|o| o.worker);
                    prop_assert_eq!(&want, &text);
                }
            }
            let m = many.memory();
            prop_assert_eq!(m.nodes, one.memory().nodes);
            for w in 0..WORKERS {
                let (s, local) = many.place(WorkerId(w)).unwrap();
                let shard = &read(&many.shards)[s];
                for tier in [Tier::Device, Tier::Host] {
                    prop_assert_eq!(shard.indexer.worker_blocks(local, tier), one.worker_blocks(WorkerId(w), tier));
                }
            }
        }
    }

    /// An event naming image `uuid` with `digest`, for worker-independent
    /// blocks 10 and 11.
    fn image_event(uuid: &str, digest: [u8; 32]) -> WireEvent {
        WireEvent::BlockStored(WireBlockStored {
            block_hashes: vec![10, 11],
            token_ids: Some(vec![1, 9, 9, 9, 9, 2, 3, 4]),
            block_size: 4,
            image_routing: Some(ImageRoutingV1 {
                items: vec![WireImageItem { digest, uuid: Some(uuid.into()) }],
                blocks: vec![
                    vec![WireImageRef { item: 0, item_offset: 0, block_offset: 1, len: 3 }],
                    vec![WireImageRef { item: 0, item_offset: 3, block_offset: 0, len: 1 }],
                ],
            }),
            ..Default::default()
        })
    }

    /// Lookups from tokens over prompts many hashing chunks long, whose
    /// holders sit in different shards and stop at different depths (one
    /// inside the first chunk, others past one and two chunks, one holding
    /// all): each shard's walk reads the keys the earlier shards' walks made
    /// and asks for more, and the answer is one indexer's.
    #[test]
    fn lookups_from_tokens_span_chunks_and_shards() {
        let blocks = 3 * LOOKUP_CHUNK_BLOCKS + 5;
        let depths = [7, LOOKUP_CHUNK_BLOCKS + 3, 2 * LOOKUP_CHUNK_BLOCKS, blocks, LOOKUP_CHUNK_BLOCKS];
        let big = IndexerConfig { block_size: 4, ..Default::default() };
        let mut one = Indexer::new(big.clone());
        let mut many = ShardedIndexer::new(big, 3).unwrap();
        for (w, &depth) in depths.iter().enumerate() {
            let (a, b) = (one.add_worker(&w.to_string()), many.add_worker(&w.to_string()));
            for start in (0..depth).step_by(16) {
                let e = stored(start as i64, (depth - start).min(16), start.checked_sub(1).map(|p| p as i64), 0, false);
                one.apply(a, &e);
                many.apply(b, &e);
            }
        }
        let WireEvent::BlockStored(all) = stored(0, blocks, None, 0, false) else { unreachable!("a stored event") };
        let scope = RouterScope { block_size: 4, lora: None, cache_salt: None };
        for cut in [1, LOOKUP_CHUNK_BLOCKS, LOOKUP_CHUNK_BLOCKS + 4, blocks] {
            let mut tokens = all.token_ids.as_deref().unwrap()[..cut * 4].to_vec();
            tokens.push(1);
            let want = one.find_matches(&scope.text_keys(&tokens));
            let depth_of: Vec<u32> = want.iter().map(|o| o.any_tier_blocks).collect();
            let expected: Vec<u32> = depths.iter().map(|&d| d.min(cut) as u32).collect();
            assert_eq!(depth_of, expected, "every worker matches its own depth");
            let mut got = many.find_matches_text(&scope, &tokens);
            got.sort_by_key(|o| o.worker);
            assert_eq!(got, want, "a prompt of {cut} blocks");
        }
    }

    /// A UUID held under two digests by workers of two shards identifies
    /// nothing, as it would in one indexer; under one digest in both it
    /// resolves to it; once the conflicting copy is cleared it resolves
    /// again.
    #[test]
    fn a_uuid_conflict_across_shards_is_ambiguous() {
        let mut ix = ShardedIndexer::new(config(), 2).unwrap();
        let (a, b, c) = (ix.add_worker("a"), ix.add_worker("b"), ix.add_worker("c"));
        assert_ne!(ix.place(a).unwrap().0, ix.place(b).unwrap().0, "a and b in two shards");
        assert_eq!(ix.place(a).unwrap().0, ix.place(c).unwrap().0);
        ix.apply_all(&[(a, image_event("u", [1; 32])), (b, image_event("u", [1; 32]))]);
        assert_eq!(ix.resolve("u"), UuidLookup::Digest(kvcore::ImageDigest([1; 32])));
        ix.apply_all(&[(b, image_event("v", [2; 32])), (a, image_event("v", [3; 32]))]);
        assert_eq!(ix.resolve("v"), UuidLookup::Ambiguous);
        assert_eq!(ix.counters().uuid_lookups_ambiguous, 1);
        ix.clear_worker(a);
        assert_eq!(ix.resolve("v"), UuidLookup::Digest(kvcore::ImageDigest([2; 32])));
        assert_eq!(ix.resolve("w"), UuidLookup::Unknown);
    }

    /// Zero shards is an error, not a panic; events of a worker never added
    /// change nothing.
    #[test]
    fn bad_shards_and_unknown_workers() {
        assert!(matches!(ShardedIndexer::new(config(), 0), Err(ShardedError::NoShards)));
        let mut ix = ShardedIndexer::new(config(), 3).unwrap();
        let a = ix.add_worker("a");
        ix.apply_all(&[(WorkerId(7), stored(0, 3, None, 0, false)), (a, stored(0, 2, None, 0, false))]);
        ix.apply(WorkerId(9), &stored(0, 3, None, 0, false));
        ix.remove_worker(WorkerId(9));
        assert_eq!(ix.counters().stored_blocks, 2);
        assert_eq!(ix.memory().nodes, 2);
        assert_eq!(ix.workers_len(), 1);
        assert_eq!(ix.shards(), 3);
    }
}
