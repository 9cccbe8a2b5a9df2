//! `dynamo`: NVIDIA Dynamo's KV router as users deploy it in front of kvcore
//! engines, from the native crate `dynamo-kv-router` 1.6.1.
//!
//! ```text
//!  Engine w ──► Publisher w ──► tap (SUB) ──► delay queue ──► zmq_wire::decode_event_batch
//!                                                         ──► ZmqEventNormalizer::normalize
//!                                                         ──► RadixTree::apply_event
//!  request ──► RequestExtraInfo (one mm_hash per image) ──► compute_block_hash_for_seq
//!          ──► RadixTree::find_matches ──► Dynamo's default worker logit ──► argmin
//! ```
//!
//! Everything that decides what Dynamo believes is Dynamo's own code: its wire
//! decoder, its event normalizer and its radix-tree indexer, fed with the
//! payload bytes the engines published. Images reach it only as the `mm_hash`
//! in `block_mm_infos`; a request names an image by
//! [`kvcore::mm_hash_of_identifier`] of its UUID when the client sent one, and
//! otherwise by the `mm_hash` of its content digest (its pixels hashed, and
//! paid for, see the fleet).
//!
//! The selection is Dynamo's default (`DefaultWorkerScorer::worker_logit` in
//! `src/scheduling/selector/reference.rs` of the crate, with the defaults of
//! `KvRouterConfig` in `src/scheduling/config.rs`: `overlap_score_credit` 1,
//! `prefill_load_scale` 1, `router_temperature` 0, prefill tokens and
//! active blocks tracked):
//!
//! ```text
//! logit_w = max(0, (active_prefill_tokens_w + isl) / block_size - device_w - 0.75 · host_w) + active_blocks_w
//! ```
//!
//! with `device_w` the device overlap from the radix tree and `host_w` the
//! blocks beyond it in the host tier. As in Dynamo's `KvIndexer`, device
//! events go to the radix tree; Dynamo keeps other tiers in lower-tier
//! indexers (`src/indexer/lower_tier_indexers.rs`) whose event path is private
//! to the crate (reached only through its threaded indexer and runtime), so
//! this policy does not index host-tier events and `host_w` is 0: it gets no
//! credit for host-tier hits, which the kvcore policies do get. The loads come from
//! the router's own book of the requests it routed: a request's prefill
//! tokens (its prompt less the overlap it was routed on) count until its first
//! token, its blocks until it completes. Temperature 0 picks the least logit;
//! ties go to a worker drawn from the request's first key.
//!
//! The selection function itself is not reachable from outside the crate
//! (it runs inside Dynamo's scheduler queue, with its runtime), so the formula
//! is applied here as documented; the indexer and decoder are called directly.

use dynamo_kv_router::protocols::{
    BlockExtraInfo, BlockHashOptions, LocalBlockHash, RequestExtraInfo, RequestMmObjectInfo, WorkerWithDpRank,
    compute_block_hash_for_seq,
};
use dynamo_kv_router::radix_tree::RadixTree;
use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};

use kvcore::Engine;
use kvcore::KvEvent;
use kvcore::mm_hash;

use super::view::{CacheView, Overlap, ViewRequest};

/// `KvRouterConfig::default().overlap_score_credit`.
const OVERLAP_SCORE_CREDIT: f64 = 1.0;
/// `KvRouterConfig::default().host_cache_hit_weight`.
const HOST_CACHE_HIT_WEIGHT: f64 = 0.75;
/// `KvRouterConfig::default().prefill_load_scale`.
const PREFILL_LOAD_SCALE: f64 = 1.0;

/// One request in the router's own book.
#[derive(Clone, Copy, Debug)]
struct Active {
    prefill_tokens: u64,
    blocks: u64,
    first_token_us: f64,
    done_us: f64,
}

/// Dynamo's KV router as a [`CacheView`].
pub struct DynamoView {
    tree: RadixTree,
    normalizer: ZmqEventNormalizer,
    book: Vec<Vec<Active>>,
    block_size: u32,
    event_id: u64,
    last_hashes: Vec<LocalBlockHash>,
    last_isl: u64,
    last_overlaps: Vec<Overlap>,
    undecodable: u64,
    filtered: u64,
    rejected_events: u64,
    host_events: u64,
    rejections: std::collections::BTreeMap<String, u64>,
}

impl std::fmt::Debug for DynamoView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoView").field("workers", &self.book.len()).finish_non_exhaustive()
    }
}

impl DynamoView {
    /// Dynamo's router over `workers` workers, none of whose events arrived yet.
    pub fn new(workers: usize, block_size: u32) -> Self {
        Self {
            tree: RadixTree::new(),
            host_events: 0,
            normalizer: ZmqEventNormalizer::new(block_size),
            book: vec![Vec::new(); workers],
            block_size,
            event_id: 0,
            last_hashes: Vec::new(),
            last_isl: 0,
            last_overlaps: Vec::new(),
            undecodable: 0,
            filtered: 0,
            rejected_events: 0,
            rejections: Default::default(),
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

    /// Dynamo's overlap score per worker (device blocks) for `hashes`.
    pub fn overlap_scores(&self, hashes: &[LocalBlockHash]) -> Vec<u32> {
        Self::scores(&self.tree, hashes, self.book.len())
    }

    fn scores(tree: &RadixTree, hashes: &[LocalBlockHash], workers: usize) -> Vec<u32> {
        let scores = tree.find_matches(hashes.to_vec(), false);
        (0..workers).map(|w| scores.scores.get(&WorkerWithDpRank::new(w as u64, 0)).copied().unwrap_or(0)).collect()
    }

    fn logit(&self, worker: usize, overlap: Overlap, now_us: f64) -> f64 {
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
        let host = overlap.any_tier_blocks.saturating_sub(overlap.device_blocks) as f64;
        let credit = OVERLAP_SCORE_CREDIT * overlap.device_blocks as f64 + HOST_CACHE_HIT_WEIGHT * host;
        PREFILL_LOAD_SCALE * ((prefill + self.last_isl) as f64 / bs - credit).max(0.0) + blocks as f64
    }
}

impl CacheView for DynamoView {
    fn overlaps(&mut self, request: &ViewRequest<'_>, _engines: &[Engine]) -> Vec<Overlap> {
        let hashes = Self::request_hashes(request, request.engine_keys.len());
        let out: Vec<Overlap> = self
            .overlap_scores(&hashes)
            .into_iter()
            .map(|d| Overlap { device_blocks: d, any_tier_blocks: d })
            .collect();
        self.last_hashes = hashes;
        self.last_isl = request.tokens.len() as u64;
        self.last_overlaps = out.clone();
        out
    }

    fn observe(&mut self, _worker: usize, _events: &[KvEvent]) {}

    fn apply_payload(&mut self, worker: usize, payload: &[u8]) {
        let Ok(batch) = decode_event_batch(payload) else {
            self.undecodable += 1;
            return;
        };
        let who = WorkerWithDpRank::new(worker as u64, 0);
        for raw in batch.events {
            self.event_id += 1;
            let Some(event) = self.normalizer.normalize(raw, self.event_id, who).and_then(|p| p.into_router_event())
            else {
                self.filtered += 1;
                continue;
            };
            // Dynamo's KvIndexer keeps non-device tiers in lower-tier
            // indexers whose event path is private to the crate.
            if !event.storage_tier.is_gpu() {
                self.host_events += 1;
                continue;
            }
            if let Err(e) = self.tree.apply_event(event) {
                self.rejected_events += 1;
                *self.rejections.entry(format!("{e:?}")).or_default() += 1;
            }
        }
    }

    fn select(&mut self, overlaps: &[Overlap], request: &ViewRequest<'_>, now_us: f64) -> Option<usize> {
        for b in &mut self.book {
            b.retain(|a| a.done_us > now_us);
        }
        let logits: Vec<f64> = (0..overlaps.len()).map(|w| self.logit(w, overlaps[w], now_us)).collect();
        let least = logits.iter().copied().fold(f64::INFINITY, f64::min);
        let tied: Vec<usize> = (0..logits.len()).filter(|&w| logits[w] <= least + 1e-9).collect();
        let spread = self.last_hashes.first().map_or(request.request.id, |h| h.0);
        tied.get((spread % tied.len().max(1) as u64) as usize).copied()
    }

    fn routed(&mut self, worker: usize, first_token_us: f64, done_us: f64) {
        let overlap = self.last_overlaps.get(worker).map_or(0, |o| o.device_blocks) as u64;
        let bs = self.block_size as u64;
        self.book[worker].push(Active {
            prefill_tokens: self.last_isl.saturating_sub(overlap * bs),
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
        self.undecodable + self.rejected_events
    }

    fn stats(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "undecodable_payloads": self.undecodable,
            "events_filtered": self.filtered,
            "events_rejected_by_indexer": self.rejected_events,
            "rejections": self.rejections,
            "host_tier_events_not_indexed": self.host_events,
            "events_applied": self.event_id - self.filtered,
        }))
    }
}
