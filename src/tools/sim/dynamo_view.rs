//! `dynamo`: NVIDIA Dynamo's KV router as users deploy it in front of kvcore
//! engines, from the native crate `dynamo-kv-router` 1.6.1.
//!
//! ```text
//!  Engine w ──► Publisher w ──► tap (SUB) ──► delay queue ──► zmq_wire::decode_event_batch
//!                                                         ──► ZmqEventNormalizer::normalize
//!                                                         ──► RouterEvent::targets_primary
//!                                     device ("GPU") ◄───────┴───► lower tier ("CPU" → HostPinned)
//!                               RadixTree::apply_event            LowerTierIndexers::get_or_create(tier)
//!                                                                   .enqueue_event, then before a
//!                                                                   query .flush_and_wait
//!  request ──► RequestExtraInfo (one mm_hash per image) ──► compute_block_hash_for_seq
//!          ──► RadixTree::find_match_details ──► query_lower_tiers_with_options (continued from
//!              each worker's last device hash) ──► OverlapAnalysis::signals
//!          ──► Dynamo's default worker logit ──► argmin
//! ```
//!
//! Everything that decides what Dynamo believes is Dynamo's own code: its wire
//! decoder, its event normalizer, its radix tree for the device tier and its
//! lower-tier indexers for the others, fed with the payload bytes the engines
//! published. Images reach it only as the `mm_hash` in `block_mm_infos`; a
//! request names an image by [`kvcore::mm_hash_of_identifier`] of its UUID
//! when the client sent one, and otherwise by the `mm_hash` of its content
//! digest (its pixels hashed, and paid for, see the fleet).
//!
//! **Tiers, as Dynamo's indexer assembly routes them.** A kvcore engine names
//! the tier of each event in vLLM's `medium` field, `"GPU"` or `"CPU"`; the
//! crate maps it with `StorageTier::from_kv_medium` (`"CPU"` is
//! `HostPinned`). `Indexer::apply_event_routed` (the crate's
//! `src/services/indexer/backend.rs`, behind its `standalone-indexer`
//! feature) sends an event for which `RouterEvent::targets_primary` holds to
//! the device indexer and any other to `LowerTierIndexers::get_or_create(tier)`;
//! a `Cleared` event goes to both. This view does the same with the public
//! types: a [`RadixTree`] (the single-threaded device backend of Dynamo's
//! `KvIndexer`) and a [`LowerTierIndexers`] with one thread per tier. The
//! query is `LookupPipeline::find_matches_by_tier`
//! (`src/services/indexer/lookup.rs`): device match details first, then
//! [`query_lower_tiers_with_options`] seeded with each worker's device
//! match (the host walk starts at the block after it, anchored on its last
//! device hash), then [`OverlapAnalysis::signals`] for the per-tier blocks the
//! scheduler uses. An event whose residency domain the crate does not support
//! is counted (`events_unsupported_domain`), as the crate's own
//! `record_unsupported_residency_event` does.
//!
//! The selection is Dynamo's default (`DefaultWorkerScorer::worker_logit` in
//! `src/scheduling/selector/reference.rs` of the crate, with
//! `KvRouterConfig::default()`: `overlap_score_credit` 1,
//! `host_cache_hit_weight` 0.75, `disk_cache_hit_weight` 0.25,
//! `prefill_load_scale` 1, `router_temperature` 0, prefill tokens and active
//! blocks tracked):
//!
//! ```text
//! logit_w = max(0, (active_prefill_tokens_w + isl) / block_size
//!                  - device_w - 0.75 · host_w - 0.25 · disk_w) + active_blocks_w
//! ```
//!
//! with `device_w`, `host_w` and `disk_w` the signals' `tier_overlap_blocks`
//! (`host_w` counts the host blocks that continue the device match). The loads
//! come from the router's own book of the requests it routed: a request's
//! prefill tokens, `effective_prefill_tokens(isl, cached)` with `cached` the
//! signals' weighted `effective_cached_tokens`, count until its first token,
//! its blocks until it completes. Temperature 0 picks the least logit; ties go
//! to a worker drawn from the request's first key.
//!
//! The selection function itself is not reachable from outside the crate
//! (it runs inside Dynamo's scheduler queue, with its runtime), so the formula
//! is applied here as documented; the decoder, indexers, tier walk and
//! overlap analysis are called directly.

use std::collections::{BTreeMap, HashMap};

use dynamo_kv_router::KvRouterConfig;
use dynamo_kv_router::indexer::{
    LowerTierIndexers, LowerTierQueryOptions, TieredMatchDetails, query_lower_tiers_with_options,
};
use dynamo_kv_router::protocols::{
    BlockExtraInfo, BlockHashOptions, KvCacheEventData, LocalBlockHash, RequestExtraInfo, RequestMmObjectInfo,
    RouterEvent, StorageTier, WorkerWithDpRank, compute_block_hash_for_seq,
};
use dynamo_kv_router::radix_tree::RadixTree;
use dynamo_kv_router::scheduling::{OverlapAnalysis, OverlapSignals, effective_prefill_tokens};
use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};

use kvcore::Engine;
use kvcore::KvEvent;
use kvcore::mm_hash;

use super::view::{CacheView, Overlap, ViewRequest};

/// Threads of each lower-tier indexer (one keeps every worker's events in
/// arrival order; the count does not change what is indexed).
const LOWER_TIER_THREADS: usize = 1;

/// One request in the router's own book.
#[derive(Clone, Copy, Debug)]
struct Active {
    prefill_tokens: u64,
    blocks: u64,
    first_token_us: f64,
    done_us: f64,
}

/// Dynamo's overlap for one worker, by tier, as its scheduler sees it
/// (`OverlapSignals::tier_overlap_blocks`): the device match, then the blocks
/// of the host tier that continue it, then those of the disk and external
/// tiers that continue those.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierScores {
    /// Leading blocks on the device.
    pub device: u32,
    /// Host-tier blocks right after the device match.
    pub host: u32,
    /// Disk and external blocks right after the host ones.
    pub disk: u32,
}

/// What an event does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
}

impl Kind {
    fn of(data: &KvCacheEventData) -> Self {
        match data {
            KvCacheEventData::Stored(_) => Kind::Stored,
            KvCacheEventData::Removed(_) => Kind::Removed,
            KvCacheEventData::Cleared => Kind::Cleared,
        }
    }
}

/// Per-tier event counts.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct TierCounts {
    stored: u64,
    removed: u64,
    cleared: u64,
    rejected: u64,
}

/// Dynamo's KV router as a [`CacheView`].
pub struct DynamoView {
    tree: RadixTree,
    lower: LowerTierIndexers,
    runtime: tokio::runtime::Runtime,
    lower_pending: Vec<RouterEvent>,
    config: KvRouterConfig,
    normalizer: ZmqEventNormalizer,
    book: Vec<Vec<Active>>,
    block_size: u32,
    event_id: u64,
    last_hashes: Vec<LocalBlockHash>,
    last_isl: u64,
    last_tiered: TieredMatchDetails,
    last_signals: OverlapSignals,
    undecodable: u64,
    filtered: u64,
    unsupported_domain: u64,
    tiers: BTreeMap<String, TierCounts>,
    rejections: BTreeMap<String, u64>,
}

impl std::fmt::Debug for DynamoView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoView").field("workers", &self.book.len()).finish_non_exhaustive()
    }
}

fn worker_id(w: usize) -> WorkerWithDpRank {
    WorkerWithDpRank::new(w as u64, 0)
}

fn tier_name(tier: StorageTier) -> String {
    format!("{tier:?}")
}

impl DynamoView {
    /// Dynamo's router over `workers` workers, none of whose events arrived yet.
    pub fn new(workers: usize, block_size: u32) -> Self {
        Self {
            tree: RadixTree::new(),
            lower: LowerTierIndexers::new(LOWER_TIER_THREADS, block_size),
            runtime: tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a current-thread runtime needs no resources"),
            lower_pending: Vec::new(),
            config: KvRouterConfig::default(),
            normalizer: ZmqEventNormalizer::new(block_size),
            book: vec![Vec::new(); workers],
            block_size,
            event_id: 0,
            last_hashes: Vec::new(),
            last_isl: 0,
            last_tiered: TieredMatchDetails::default(),
            last_signals: OverlapSignals::default(),
            undecodable: 0,
            filtered: 0,
            unsupported_domain: 0,
            tiers: BTreeMap::new(),
            rejections: BTreeMap::new(),
        }
    }

    /// The tokens and per-block image identities (`block_mm_infos`) Dynamo
    /// hashes for the first `blocks` full blocks of a request.
    pub fn request_blocks<'a>(
        request: &ViewRequest<'a>,
        blocks: usize,
    ) -> (&'a [u32], Option<Vec<Option<BlockExtraInfo>>>) {
        let info = RequestExtraInfo {
            mm_objects: request
                .request
                .images
                .iter()
                .map(|i| RequestMmObjectInfo {
                    mm_hash: mm_hash(&i.digest, i.uuid.as_deref()),
                    offsets: vec![(i.start as usize, (i.start + i.len) as usize)],
                })
                .collect(),
        };
        let bs = request.block_size as usize;
        let tokens = &request.tokens[..(blocks * bs).min(request.tokens.len())];
        (tokens, (!info.mm_objects.is_empty()).then(|| info.to_block_level(bs, tokens.len())))
    }

    /// Dynamo's block hashes of a request (as its frontend computes them),
    /// for the first `blocks` full blocks.
    pub fn request_hashes(request: &ViewRequest<'_>, blocks: usize) -> Vec<LocalBlockHash> {
        let (tokens, mm) = Self::request_blocks(request, blocks);
        let options = BlockHashOptions { block_mm_infos: mm.as_deref(), ..Default::default() };
        compute_block_hash_for_seq(tokens, request.block_size, options)
    }

    /// Dynamo's tiered match for `hashes`: device match details from the
    /// radix tree, then every lower tier walked on from each worker's device
    /// match (`LookupPipeline::find_matches_by_tier`).
    fn tiered(&mut self, hashes: &[LocalBlockHash]) -> TieredMatchDetails {
        self.flush_lower_tiers();
        let device = self.tree.find_match_details(hashes.to_vec(), false);
        let lower_tier = query_lower_tiers_with_options(&self.lower, hashes, &device, LowerTierQueryOptions::default());
        TieredMatchDetails { device, lower_tier }
    }

    /// Waits until every lower-tier event delivered so far is applied
    /// (`ThreadPoolIndexer::flush_and_wait`), so that a query sees exactly
    /// the events whose delay has passed.
    fn flush_lower_tiers(&mut self) {
        if self.lower_pending.is_empty() {
            return;
        }
        for event in std::mem::take(&mut self.lower_pending) {
            // `ThreadPoolIndexer::apply_event`, as the crate's indexer calls
            // it: enqueued on the tier's thread.
            let (tier, kind) = (event.storage_tier, Kind::of(&event.event.data));
            let ok = self.lower.get_or_create(tier).enqueue_event(event);
            if let Err(e) = &ok {
                self.reject(e);
            }
            self.count(tier, kind, ok.is_ok());
        }
        for indexer in self.lower.all() {
            if let Err(e) = self.runtime.block_on(indexer.flush_and_wait()) {
                self.reject(e);
            }
        }
    }

    fn signals(&self, tiered: &TieredMatchDetails) -> OverlapSignals {
        OverlapAnalysis::new(&self.config, self.block_size, tiered).signals()
    }

    fn scores_of(signals: &OverlapSignals, workers: usize) -> Vec<TierScores> {
        let t = &signals.tier_overlap_blocks;
        fn get<S: std::hash::BuildHasher>(m: &HashMap<WorkerWithDpRank, usize, S>, w: usize) -> u32 {
            m.get(&worker_id(w)).copied().unwrap_or(0) as u32
        }
        (0..workers)
            .map(|w| TierScores { device: get(&t.device, w), host: get(&t.host_pinned, w), disk: get(&t.disk, w) })
            .collect()
    }

    /// Dynamo's overlap per worker and tier for `hashes`, as its scheduler
    /// receives it.
    pub fn tier_scores(&mut self, hashes: &[LocalBlockHash]) -> Vec<TierScores> {
        let tiered = self.tiered(hashes);
        Self::scores_of(&self.signals(&tiered), self.book.len())
    }

    /// Dynamo's overlap score per worker (device blocks) for `hashes`.
    pub fn overlap_scores(&mut self, hashes: &[LocalBlockHash]) -> Vec<u32> {
        self.tier_scores(hashes).into_iter().map(|t| t.device).collect()
    }

    fn logit(&self, worker: usize, tiers: TierScores, now_us: f64) -> f64 {
        let bs = self.block_size as f64;
        let (mut prefill, mut blocks) = (0u64, 0u64);
        for a in &self.book[worker] {
            if a.first_token_us > now_us {
                prefill += a.prefill_tokens;
            }
            if a.done_us > now_us {
                blocks += a.blocks;
            }
        }
        let c = &self.config;
        let credit = c.overlap_score_credit * tiers.device as f64
            + c.host_cache_hit_weight * tiers.host as f64
            + c.disk_cache_hit_weight * tiers.disk as f64;
        c.prefill_load_scale * ((prefill + self.last_isl) as f64 / bs - credit).max(0.0) + blocks as f64
    }

    fn count(&mut self, tier: StorageTier, kind: Kind, applied: bool) {
        let c = self.tiers.entry(tier_name(tier)).or_default();
        match (applied, kind) {
            (false, _) => c.rejected += 1,
            (true, Kind::Stored) => c.stored += 1,
            (true, Kind::Removed) => c.removed += 1,
            (true, Kind::Cleared) => c.cleared += 1,
        }
    }

    fn reject(&mut self, e: impl std::fmt::Debug) {
        *self.rejections.entry(format!("{e:?}")).or_default() += 1;
    }

    /// `Indexer::apply_event_routed` of the crate, with the radix tree as
    /// the device indexer.
    fn apply(&mut self, event: RouterEvent) {
        let Ok(targets_primary) = event.targets_primary() else {
            self.lower.record_unsupported_residency_event(&event);
            self.unsupported_domain += 1;
            return;
        };
        let (tier, kind) = (event.storage_tier, Kind::of(&event.event.data));
        if kind == Kind::Cleared {
            // After every lower-tier event delivered before it.
            self.flush_lower_tiers();
            if targets_primary {
                let ok = self.tree.apply_event(event.clone());
                if let Err(e) = &ok {
                    self.reject(e);
                }
                self.count(StorageTier::Device, kind, ok.is_ok());
            }
            for (t, indexer) in self.lower.entries() {
                let ok = self.runtime.block_on(indexer.apply_event_and_wait(event.clone()));
                if let Err(e) = &ok {
                    self.reject(e);
                }
                self.count(t, kind, ok.is_ok());
            }
        } else if targets_primary {
            let ok = self.tree.apply_event(event);
            if let Err(e) = &ok {
                self.reject(e);
            }
            self.count(tier, kind, ok.is_ok());
        } else {
            // Held until the next query, which hands them to the tier's
            // indexer in arrival order (`flush_lower_tiers`).
            self.lower_pending.push(event);
        }
    }
}

impl CacheView for DynamoView {
    fn overlaps(&mut self, request: &ViewRequest<'_>, _engines: &[Engine]) -> Vec<Overlap> {
        let hashes = Self::request_hashes(request, request.engine_keys.len());
        let tiered = self.tiered(&hashes);
        let out: Vec<Overlap> = Self::scores_of(&self.signals(&tiered), self.book.len())
            .into_iter()
            .map(|t| Overlap { device_blocks: t.device, any_tier_blocks: t.device + t.host + t.disk })
            .collect();
        self.last_hashes = hashes;
        self.last_isl = request.tokens.len() as u64;
        self.last_tiered = tiered;
        out
    }

    fn observe(&mut self, _worker: usize, _events: &[KvEvent]) {}

    fn apply_payload(&mut self, worker: usize, payload: &[u8]) {
        let Ok(batch) = decode_event_batch(payload) else {
            self.undecodable += 1;
            return;
        };
        let who = worker_id(worker);
        for raw in batch.events {
            self.event_id += 1;
            let Some(event) = self.normalizer.normalize(raw, self.event_id, who).and_then(|p| p.into_router_event())
            else {
                self.filtered += 1;
                continue;
            };
            self.apply(event);
        }
    }

    fn select(&mut self, overlaps: &[Overlap], request: &ViewRequest<'_>, now_us: f64) -> Option<usize> {
        for b in &mut self.book {
            b.retain(|a| a.done_us > now_us);
        }
        // Predicted blocks raise the device match only, as Dynamo merges its
        // predict-on-route side indexer into the device scores after the
        // lower tiers were walked from the confirmed device match.
        let mut tiered = std::mem::take(&mut self.last_tiered);
        for (w, o) in overlaps.iter().enumerate() {
            let scores = &mut tiered.device.overlap_scores.scores;
            if o.device_blocks > scores.get(&worker_id(w)).copied().unwrap_or(0) {
                scores.insert(worker_id(w), o.device_blocks);
            }
        }
        let signals = self.signals(&tiered);
        let tiers = Self::scores_of(&signals, overlaps.len());
        self.last_signals = signals;
        let logits: Vec<f64> = (0..overlaps.len()).map(|w| self.logit(w, tiers[w], now_us)).collect();
        let least = logits.iter().copied().fold(f64::INFINITY, f64::min);
        let tied: Vec<usize> = (0..logits.len()).filter(|&w| logits[w] <= least + 1e-9).collect();
        let spread = self.last_hashes.first().map_or(request.request.id, |h| h.0);
        tied.get((spread % tied.len().max(1) as u64) as usize).copied()
    }

    fn routed(&mut self, worker: usize, first_token_us: f64, done_us: f64) {
        let cached = self.last_signals.effective_cached_tokens.get(&worker_id(worker)).copied().unwrap_or(0);
        let bs = self.block_size as u64;
        self.book[worker].push(Active {
            prefill_tokens: effective_prefill_tokens(self.last_isl as usize, cached) as u64,
            blocks: self.last_isl.div_ceil(bs),
            first_token_us,
            done_us,
        });
    }

    fn prediction_keys(&self) -> Vec<u64> {
        // Dynamo's local hashes are per block; chain them so that a predicted
        // prefix is a prefix.
        let mut out = Vec::with_capacity(self.last_hashes.len());
        let mut parent = 0u64;
        for h in &self.last_hashes {
            parent = xxhash_rust::xxh3::xxh3_64_with_seed(&h.0.to_le_bytes(), parent);
            out.push(parent);
        }
        out
    }

    fn events_unusable(&self) -> u64 {
        self.undecodable + self.unsupported_domain + self.tiers.values().map(|c| c.rejected).sum::<u64>()
    }

    fn stats(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "undecodable_payloads": self.undecodable,
            "events_filtered": self.filtered,
            "events_unsupported_domain": self.unsupported_domain,
            "events_by_tier": self.tiers,
            "lower_tier_events_pending": self.lower_pending.len(),
            "rejections": self.rejections,
            "events_applied": self.tiers.values().map(|c| c.stored + c.removed + c.cleared).sum::<u64>(),
        }))
    }
}
