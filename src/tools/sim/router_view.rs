//! `kv-uuid` and `kv-pixels`: kvcore's router ([`kvcore_router`]) fed by the
//! payloads each engine's publisher put on the wire.
//!
//! ```text
//!  Engine w ──step──► Publisher w (PUB tcp://127.0.0.1:p_w) ──► tap (SUB) ──► delay queue
//!                                                                              │ payload bytes
//!                                                                              ▼
//!                                             decode_payload ──► Indexer (fleet-wide UUID view)
//!                                                                              │ find_matches
//!  request ──► hash_request (images by UUID, or by hashed pixels) ─────────────┘
//! ```
//!
//! The two policies differ only in how a request names its images:
//!
//! - `kv-uuid` ([`ImageNaming::Uuid`]): by the client's UUID when it sent one,
//!   resolved through the indexer's fleet-wide UUID-to-digest view (a UUID
//!   held under two digests resolves to nothing, so the request is keyed up to
//!   the block before that image); an image without a UUID has its pixels
//!   hashed, and the policy pays for that hash.
//! - `kv-pixels` ([`ImageNaming::Pixels`]): every image's pixels are hashed
//!   (BLAKE3, paid per image in the timing model), so the router keys images
//!   by content, as the engines do.
//!
//! Both score through [`GroupViews`]: a hybrid engine's (`--hybrid`) main
//! group goes to the indexer, its sliding-window group to the group view,
//! and a prefix counts only where the window still holds what the next
//! token reads. With one group, the scores are the indexer's.

use kvcore::Engine;
use kvcore::KvEvent;
use kvcore::wire::decode_payload;
use kvcore_router::{
    GroupViews, ImagePlacement, ImageRef, Indexer, IndexerConfig, RouterKey, TokenRequest, WorkerId, hash_request,
};

use super::view::{CacheView, Overlap, ViewRequest};

/// How a router names a request's images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageNaming {
    /// By UUID when the client sent one, else by hashed pixels.
    Uuid,
    /// Always by hashed pixels.
    Pixels,
}

/// kvcore's router as a [`CacheView`], fed with wire payloads.
#[derive(Debug)]
pub struct RouterView {
    indexer: Indexer,
    groups: GroupViews,
    workers: Vec<WorkerId>,
    placeholder: u32,
    naming: ImageNaming,
    last: Vec<RouterKey>,
    undecodable: u64,
    unhashable: u64,
}

impl RouterView {
    /// A router over `workers` workers, none of whose events arrived yet,
    /// each holding at most `blocks_per_worker` blocks in a group other than
    /// its main one.
    pub fn new(
        workers: usize,
        block_size: u32,
        placeholder: u32,
        naming: ImageNaming,
        blocks_per_worker: usize,
    ) -> Self {
        let mut indexer = Indexer::new(IndexerConfig { block_size, ..Default::default() });
        let workers = (0..workers).map(|w| indexer.add_worker(&format!("worker-{w}"))).collect();
        let groups = GroupViews::new(block_size, blocks_per_worker);
        Self { indexer, groups, workers, placeholder, naming, last: Vec::new(), undecodable: 0, unhashable: 0 }
    }

    /// The router's indexer.
    pub fn indexer(&self) -> &Indexer {
        &self.indexer
    }
}

impl CacheView for RouterView {
    fn overlaps(&mut self, request: &ViewRequest<'_>, _engines: &[Engine]) -> Vec<Overlap> {
        let token_request = TokenRequest {
            tokens: request.tokens.to_vec(),
            images: request
                .request
                .images
                .iter()
                .map(|i| {
                    let image = match (&i.uuid, self.naming) {
                        (Some(u), ImageNaming::Uuid) => ImageRef::Uuid(u.to_string()),
                        // The pixels were hashed (and paid for, see the fleet).
                        _ => ImageRef::Digest(i.digest),
                    };
                    ImagePlacement { image, runs: vec![(i.start, i.len)] }
                })
                .collect(),
            lora: None,
            cache_salt: None,
        };
        let mut out = vec![Overlap::default(); self.workers.len()];
        self.last.clear();
        // A request the router cannot hash (it cannot happen for a workload
        // the engine admits) is believed held nowhere.
        let Ok(hashed) = hash_request(&token_request, request.block_size, self.placeholder, &self.indexer) else {
            self.unhashable += 1;
            return out;
        };
        // The engine matches at most the blocks before the last prompt token.
        let keys = &hashed.keys[..hashed.keys.len().min(request.engine_keys.len())];
        // Every group must hold what the next token reads (a hybrid engine's
        // sliding windows); with the main group alone, the indexer's match.
        for o in self.groups.find_matches(&self.indexer, keys) {
            if let Some(w) = self.workers.iter().position(|w| *w == o.worker) {
                out[w] = Overlap { device_blocks: o.device_blocks, any_tier_blocks: o.any_tier_blocks };
            }
        }
        self.last = keys.to_vec();
        out
    }

    fn observe(&mut self, _worker: usize, _events: &[KvEvent]) {
        // The router learns from the wire only; the typed events are ignored.
    }

    fn apply_payload(&mut self, worker: usize, payload: &[u8]) {
        match decode_payload(payload) {
            Ok(batch) => {
                for e in &batch.events {
                    self.groups.apply(&mut self.indexer, self.workers[worker], e);
                }
            }
            Err(_) => self.undecodable += 1,
        }
    }

    fn prediction_keys(&self) -> Vec<u64> {
        self.last.iter().map(|k| k.0).collect()
    }

    fn events_unusable(&self) -> u64 {
        self.indexer.counters().image_blocks_unkeyable + self.undecodable
    }

    fn stats(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "undecodable_payloads": self.undecodable,
            "unhashable_requests": self.unhashable,
            "indexer": self.indexer.counters(),
            "groups": self.groups.counters(),
        }))
    }
}
