//! The `kv-ours` view: the real router ([`kvcore_router`]) subscribed over
//! loopback ZMQ to each engine's real publisher.
//!
//! ```text
//!  Engine w ──step──► Publisher w (PUB tcp://127.0.0.1:p_w, replay p'_w)
//!                           │ msgpack batches
//!                           ▼
//!                    Subscriber (SUB per worker, gap recovery) ──► Indexer
//!                                                                   │ find_matches(router keys)
//!  request ──► hash_request (images by content digest) ─────────────┘
//! ```
//!
//! Before each decision the view polls the subscriber until it has applied
//! every batch each publisher has numbered so far, so the router decides on
//! the state the engines advertised (never a stale one): a run is then
//! deterministic, and a false hit would be the router's own mistake, not a
//! race. A poll that cannot catch up within the timeout is counted and the
//! decision is made on what arrived.

use std::time::Duration;

use kvcore::Engine;
use kvcore::KvEvent;
use kvcore_router::{
    ImagePlacement, ImageRef, IndexerConfig, Subscriber, SubscriberConfig, TokenRequest, WorkerId, hash_request,
};

use super::SimError;
use super::view::{CacheView, Overlap, ViewRequest};

/// How long one decision waits for the router to catch up with the engines.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a decision waits before suspecting a batch lost at the end of a
/// stream.
const GAP_WAIT: Duration = Duration::from_millis(200);

/// The real router as a [`CacheView`].
pub struct RouterView {
    subscriber: Subscriber,
    workers: Vec<WorkerId>,
    placeholder: u32,
    sync_timeouts: u64,
    resyncs: u64,
    endpoints: Vec<String>,
}

impl std::fmt::Debug for RouterView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterView").field("endpoints", &self.endpoints).finish_non_exhaustive()
    }
}

impl RouterView {
    /// Connects one subscriber to every worker's publisher (`endpoints`:
    /// the `PUB` endpoint and the replay endpoint of each, in worker order).
    pub fn connect(
        endpoints: &[(String, Option<String>)],
        block_size: u32,
        placeholder: u32,
    ) -> Result<Self, SimError> {
        let mut subscriber = Subscriber::new(SubscriberConfig {
            indexer: IndexerConfig { block_size, ..Default::default() },
            ..Default::default()
        });
        let mut workers = Vec::with_capacity(endpoints.len());
        for (w, (endpoint, replay)) in endpoints.iter().enumerate() {
            let id = subscriber
                .connect(&format!("worker-{w}"), endpoint, replay.as_deref())
                .map_err(|e| SimError::Zmq(format!("worker {w}: subscribing to {endpoint}: {e}")))?;
            workers.push(id);
        }
        let endpoints = endpoints.iter().map(|(e, _)| e.clone()).collect();
        Ok(Self { subscriber, workers, placeholder, sync_timeouts: 0, resyncs: 0, endpoints })
    }

    /// The publishers' endpoints, in worker order.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Decisions made before the router had caught up (the timeout passed).
    pub fn sync_timeouts(&self) -> u64 {
        self.sync_timeouts
    }

    fn sync(&mut self, engines: &[Engine]) {
        let targets: Vec<(WorkerId, u64)> =
            self.workers.iter().zip(engines).map(|(w, e)| (*w, e.publisher().map_or(0, |p| p.next_seq()))).collect();
        if let Ok(true) = self.subscriber.poll_until_synced(&targets, GAP_WAIT) {
            return;
        }
        // A batch lost at the very end of a stream (typically the first one,
        // published before the SUB socket finished connecting) only shows as
        // a gap when a later batch arrives, and none will before this
        // decision: ask the lagging workers for a snapshot instead.
        for &(w, target) in &targets {
            if self.subscriber.sync_state(w).is_some_and(|s| s.expected_seq < target && !s.recovering)
                && self.subscriber.resync(w).is_ok()
            {
                self.resyncs += 1;
            }
        }
        match self.subscriber.poll_until_synced(&targets, SYNC_TIMEOUT) {
            Ok(true) => {}
            Ok(false) | Err(_) => self.sync_timeouts += 1,
        }
    }
}

impl CacheView for RouterView {
    fn overlaps(&mut self, request: &ViewRequest<'_>, engines: &[Engine]) -> Vec<Overlap> {
        self.sync(engines);
        let token_request = TokenRequest {
            tokens: request.tokens.to_vec(),
            images: request
                .request
                .images
                .iter()
                .map(|i| ImagePlacement { image: ImageRef::Digest(i.digest), runs: vec![(i.start, i.len)] })
                .collect(),
            lora: None,
            cache_salt: None,
        };
        let indexer = self.subscriber.indexer();
        let mut out = vec![Overlap::default(); self.workers.len()];
        // A request the router cannot hash (it cannot happen for a workload
        // the engine admits) is believed held nowhere.
        let Ok(hashed) = hash_request(&token_request, request.block_size, self.placeholder, indexer) else {
            return out;
        };
        // The engine matches at most the blocks before the last prompt token.
        let keys = &hashed.keys[..hashed.keys.len().min(request.engine_keys.len())];
        for o in indexer.find_matches(keys) {
            if let Some(w) = self.workers.iter().position(|w| *w == o.worker) {
                out[w] = Overlap { device_blocks: o.device_blocks, any_tier_blocks: o.any_tier_blocks };
            }
        }
        out
    }

    fn observe(&mut self, _worker: usize, _events: &[KvEvent]) {
        // The router learns from the wire only; the typed events are ignored.
    }

    fn events_unusable(&self) -> u64 {
        self.subscriber.indexer().counters().image_blocks_unkeyable + self.sync_timeouts
    }

    fn stats(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "endpoints": self.endpoints,
            "sync_timeouts": self.sync_timeouts,
            "resyncs": self.resyncs,
            "subscriber": self.subscriber.counters(),
            "indexer": self.subscriber.indexer().counters(),
        }))
    }
}
