//! Cache views: what a KV-aware policy believes each worker holds.
//!
//! Every KV-aware policy makes the same decision from the same formula (see
//! [`crate::sim::policy`]); they differ only in where their beliefs come from,
//! behind one small trait, [`CacheView`]:
//!
//! | view | source | image blocks keyed by |
//! |---|---|---|
//! | [`OracleView`] | each engine's prefix index, read directly | the engine's own keys (exact) |
//! | [`TextOnlyView`] | the event stream's token ids | placeholder token ids alone (today's mistake) |
//! | [`ContentView`] | the event stream | the engine's content-addressed keys |
//!
//! The oracle reads with [`Engine::cached_medium`] (and, for a hybrid
//! engine's sliding windows, [`Engine::cached_medium_group`]), which touch
//! no LRU state: admitting and cancelling a probe request would move the probed
//! blocks to the back of the LRU and change the run it measures.

use ahash::AHashMap;

use kvcore::Engine;
use kvcore::FlatRun;
use kvcore::KvEvent;
use kvcore::Tier;
use kvcore::key_of_block;
use kvcore::{BlockKey, KeyScope, root_key};
use kvcore::{GroupKind, KvGroup};

use super::workload::SimRequest;

/// A worker's overlap with a request: its longest cached prefix, in blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Overlap {
    /// Leading blocks on the device.
    pub device_blocks: u32,
    /// Leading blocks in any tier (device or host).
    pub any_tier_blocks: u32,
}

/// A request as the views see it: token ids (with the placeholder at image
/// positions) and the engine keys of its matchable blocks.
#[derive(Debug)]
pub struct ViewRequest<'a> {
    /// The request.
    pub request: &'a SimRequest,
    /// Its prompt tokens, the image placeholder id at image positions.
    pub tokens: &'a [u32],
    /// Engine keys of the blocks a prefix match may cover: the first
    /// `(prompt_len - 1) / block_size` full blocks (the engine always
    /// computes the last token).
    pub engine_keys: &'a [BlockKey],
    /// Tokens per block.
    pub block_size: u32,
}

/// The engine keys of a request's matchable blocks, computed as the engine
/// computes them (the public recipe of docs/hashing.md: the root of the
/// request's scope, then one SHA-256 per block over its tokens and image runs).
pub fn engine_keys(request: &SimRequest, tokens: &[u32], block_size: u32, placeholder: u32) -> Vec<BlockKey> {
    let mut runs: Vec<FlatRun> = request
        .images
        .iter()
        .map(|i| FlatRun { start: i.start, len: i.len, item_offset: 0, digest: i.digest })
        .collect();
    runs.sort_by_key(|r| r.start);
    let root = root_key(&KeyScope { block_size_tokens: block_size, lora_id: None, cache_salt: None });
    let blocks = (tokens.len() as u32).saturating_sub(1) / block_size;
    let mut keys = Vec::with_capacity(blocks as usize);
    let (mut scratch, mut block_runs) = (Vec::new(), Vec::new());
    for i in 0..blocks {
        let parent = keys.last().copied().unwrap_or(root);
        let block = &tokens[(i * block_size) as usize..((i + 1) * block_size) as usize];
        keys.push(key_of_block(&parent, block, &runs, i * block_size, placeholder, &mut scratch, &mut block_runs));
    }
    keys
}

/// What a KV-aware policy believes about every worker's cache.
pub trait CacheView {
    /// Per worker (by index), the longest prefix of `request` believed cached.
    /// `engines` is given to every view; only the oracle reads it.
    fn overlaps(&mut self, request: &ViewRequest<'_>, engines: &[Engine]) -> Vec<Overlap>;

    /// The events `worker` produced in its last step, in order.
    fn observe(&mut self, worker: usize, events: &[KvEvent]);

    /// Events the view could not use (for the report).
    fn events_unusable(&self) -> u64 {
        0
    }

    /// The view's own counters for the JSON report, if it keeps any.
    fn stats(&self) -> Option<serde_json::Value> {
        None
    }

    /// One published batch of `worker`'s stream (the payload frame as it
    /// came off the wire), delivered after the propagation delay. Views fed by
    /// typed events ignore it.
    fn apply_payload(&mut self, _worker: usize, _payload: &[u8]) {}

    /// A view that applies its own selection rule (Dynamo's) picks here from
    /// the overlaps it just returned; `None` leaves the choice to the shared
    /// cost ([`crate::sim::policy::decide`]).
    fn select(&mut self, _overlaps: &[Overlap], _request: &ViewRequest<'_>, _now_us: f64) -> Option<usize> {
        None
    }

    /// The request last passed to [`CacheView::overlaps`] was sent to
    /// `worker`; its first token is due at `first_token_us` and it completes
    /// at `done_us` (what a frontend sees of its own requests).
    fn routed(&mut self, _worker: usize, _first_token_us: f64, _done_us: f64) {}

    /// The prefix-chained per-block keys of the request last passed to
    /// [`CacheView::overlaps`], as this view keys blocks, for recording the
    /// view's own decisions as predicted blocks ([`Predictions`]). Empty when
    /// the view cannot predict.
    fn prediction_keys(&self) -> Vec<u64> {
        Vec::new()
    }
}

/// A router's own decisions, recorded as predicted blocks with an expiry (as
/// Dynamo's router and llm-d do): a request routed to a worker is believed
/// held there, block by block, until the expiry, whatever the events say.
#[derive(Debug, Default)]
pub struct Predictions {
    ttl_us: f64,
    workers: Vec<AHashMap<u64, f64>>,
    recorded: u64,
}

impl Predictions {
    /// No predictions yet, for `workers` workers, each kept `ttl_us`.
    pub fn new(workers: usize, ttl_us: f64) -> Self {
        Self { ttl_us, workers: vec![AHashMap::new(); workers], recorded: 0 }
    }

    /// Leading blocks of `keys` predicted on `worker` and not yet expired at `now_us`.
    pub fn prefix(&self, worker: usize, keys: &[u64], now_us: f64) -> u32 {
        let w = &self.workers[worker];
        keys.iter().take_while(|k| w.get(k).is_some_and(|&until| until > now_us)).count() as u32
    }

    /// Records `keys` on `worker` until `now_us + ttl`.
    pub fn record(&mut self, worker: usize, keys: &[u64], now_us: f64) {
        let until = now_us + self.ttl_us;
        let w = &mut self.workers[worker];
        for k in keys {
            w.insert(*k, until);
        }
        self.recorded += 1;
        if self.recorded.is_multiple_of(1024) {
            for w in &mut self.workers {
                w.retain(|_, until| *until > now_us);
            }
        }
    }
}

/// Walks keys while `lookup` finds them, counting device and any-tier blocks.
fn walk(keys: impl Iterator<Item = Option<Tier>>) -> Overlap {
    let mut o = Overlap::default();
    let mut all_device = true;
    for m in keys {
        let Some(m) = m else { break };
        o.any_tier_blocks += 1;
        all_device &= m == Tier::Device;
        if all_device {
            o.device_blocks += 1;
        }
    }
    o
}

/// Exact knowledge: asks each engine whether it holds each key.
#[derive(Debug, Default)]
pub struct OracleView;

impl CacheView for OracleView {
    fn overlaps(&mut self, request: &ViewRequest<'_>, engines: &[Engine]) -> Vec<Overlap> {
        engines.iter().map(|e| oracle_overlap(e, request.engine_keys, request.block_size)).collect()
    }

    fn observe(&mut self, _worker: usize, _events: &[KvEvent]) {}
}

/// The longest prefix of `keys` an engine can reuse given every group: group
/// 0 holds all `k` blocks, each sliding window the blocks from the one
/// holding token `k·B + 1 − W` to `k` (the engine's admission rule). The
/// device overlap asks every group for device blocks, the any-tier overlap
/// for blocks in any tier. For an engine of one group, the walk of group 0.
pub fn oracle_overlap(engine: &Engine, keys: &[BlockKey], block_size: u32) -> Overlap {
    let main = walk(keys.iter().map(|k| engine.cached_medium(k)));
    let windows: Vec<(usize, u32)> = engine
        .config()
        .effective_groups()
        .iter()
        .enumerate()
        .filter_map(|(g, c)| match c.kind {
            GroupKind::SlidingWindow { window_tokens } => Some((g, window_tokens)),
            GroupKind::FullAttention => None,
        })
        .collect();
    let held: Vec<(u32, Vec<Option<Tier>>)> =
        windows.iter().map(|&(g, w)| (w, keys.iter().map(|k| engine.cached_medium_group(k, g)).collect())).collect();
    within_windows(main, &held, block_size)
}

/// Shrinks a main-group overlap to the longest prefix every sliding window
/// can serve: each window `(W, held)` (`held[i]` the tier of block `i` in
/// the window's group) must hold the blocks from the one holding token
/// `k·B + 1 − W` to `k`, on the device for the device overlap, in any tier
/// for the other.
pub fn within_windows(main: Overlap, windows: &[(u32, Vec<Option<Tier>>)], block_size: u32) -> Overlap {
    if windows.is_empty() {
        return main;
    }
    let fits = |k: u32, device_only: bool| {
        windows.iter().all(|(w, held)| {
            let first = (k * block_size + 1).saturating_sub(*w) / block_size;
            (first..k).all(|i| match held.get(i as usize).copied().flatten() {
                Some(Tier::Device) => true,
                Some(_) => !device_only,
                None => false,
            })
        })
    };
    let longest = |k_max: u32, device_only: bool| (0..=k_max).rev().find(|&k| fits(k, device_only)).unwrap_or(0);
    Overlap { device_blocks: longest(main.device_blocks, true), any_tier_blocks: longest(main.any_tier_blocks, false) }
}

/// Event-fed, keyed by the engine's content-addressed block keys (images by
/// their content digest). It learns only from typed events, in process: the
/// reference of what an exact event-fed view believes, against which the
/// unit tests hold the text-only view. `kv-uuid` and `kv-pixels` run the real router
/// over the wire ([`crate::sim::router_view`]).
#[derive(Debug, Default)]
pub struct ContentView {
    workers: Vec<AHashMap<BlockKey, Tier>>,
}

impl ContentView {
    /// A view of `workers` empty caches.
    pub fn new(workers: usize) -> Self {
        Self { workers: vec![AHashMap::new(); workers] }
    }
}

impl CacheView for ContentView {
    fn overlaps(&mut self, request: &ViewRequest<'_>, _engines: &[Engine]) -> Vec<Overlap> {
        self.workers.iter().map(|w| walk(request.engine_keys.iter().map(|k| w.get(k).copied()))).collect()
    }

    fn observe(&mut self, worker: usize, events: &[KvEvent]) {
        let map = &mut self.workers[worker];
        for e in events {
            match e {
                KvEvent::BlockStored(s) => {
                    for k in &s.keys {
                        map.insert(*k, s.medium);
                    }
                }
                KvEvent::BlockRemoved(r) => {
                    for k in &r.keys {
                        if map.get(k) == Some(&r.medium) {
                            map.remove(k);
                        }
                    }
                }
                KvEvent::AllBlocksCleared(_) => map.clear(),
            }
        }
    }
}

/// The seed Dynamo's token hashing uses for block content.
const TEXT_HASH_SEED: u64 = 1337;

/// A block's text-only content hash: XXH3-64 of its token ids, little-endian.
fn text_local_hash(tokens: &[u32]) -> u64 {
    let mut bytes = Vec::with_capacity(tokens.len() * 4);
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, TEXT_HASH_SEED)
}

/// Chains a block's text hash onto its parent's.
fn text_chain(parent: Option<u64>, local: u64) -> u64 {
    match parent {
        None => local,
        Some(p) => {
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&p.to_le_bytes());
            buf[8..].copy_from_slice(&local.to_le_bytes());
            xxhash_rust::xxh3::xxh3_64_with_seed(&buf, TEXT_HASH_SEED)
        }
    }
}

/// One worker of the text-only view.
#[derive(Clone, Debug, Default)]
struct TextWorker {
    /// Engine key to (text hash, tier), to apply removals.
    by_engine_key: AHashMap<BlockKey, (u64, Tier)>,
    /// Text hash to the number of engine blocks under it, per tier
    /// (device, host): two blocks with equal placeholders and different
    /// images fall under one text hash.
    held: AHashMap<u64, (u32, u32)>,
}

impl TextWorker {
    fn add(&mut self, key: BlockKey, text: u64, medium: Tier) {
        if let Some((old, m)) = self.by_engine_key.insert(key, (text, medium)) {
            self.drop_count(old, m);
        }
        let c = self.held.entry(text).or_default();
        if medium == Tier::Device { c.0 += 1 } else { c.1 += 1 }
    }

    fn drop_count(&mut self, text: u64, medium: Tier) {
        if let Some(c) = self.held.get_mut(&text) {
            if medium == Tier::Device {
                c.0 = c.0.saturating_sub(1)
            } else {
                c.1 = c.1.saturating_sub(1)
            }
            if *c == (0, 0) {
                self.held.remove(&text);
            }
        }
    }

    fn tier(&self, text: u64) -> Option<Tier> {
        self.held.get(&text).map(|c| if c.0 > 0 { Tier::Device } else { Tier::Host })
    }
}

/// Event-fed and keyed the way routers key blocks today: a chained XXH3-64
/// over each block's token ids (Dynamo's recipe without `mm_hash`), so an
/// image block is known by its placeholder tokens alone. Two different images
/// of one size at one position look the same to it: its false hits.
#[derive(Debug, Default)]
pub struct TextOnlyView {
    workers: Vec<TextWorker>,
    /// Per worker, each sliding-window group a hybrid engine names: its
    /// index, its window and what it holds.
    windows: Vec<Vec<(u32, u32, TextWorker)>>,
    unchained_blocks: u64,
    last: Vec<u64>,
}

impl TextOnlyView {
    /// A view of `workers` empty caches.
    pub fn new(workers: usize) -> Self {
        Self {
            workers: vec![TextWorker::default(); workers],
            windows: vec![Vec::new(); workers],
            unchained_blocks: 0,
            last: Vec::new(),
        }
    }
}

impl CacheView for TextOnlyView {
    fn overlaps(&mut self, request: &ViewRequest<'_>, _engines: &[Engine]) -> Vec<Overlap> {
        let bs = request.block_size as usize;
        let mut hashes = Vec::with_capacity(request.engine_keys.len());
        let mut parent = None;
        for block in request.tokens.chunks_exact(bs).take(request.engine_keys.len()) {
            let h = text_chain(parent, text_local_hash(block));
            hashes.push(h);
            parent = Some(h);
        }
        let out = self
            .workers
            .iter()
            .zip(&self.windows)
            .map(|(w, windows)| {
                let main = walk(hashes.iter().map(|h| w.tier(*h)));
                let held: Vec<(u32, Vec<Option<Tier>>)> =
                    windows.iter().map(|(_, win, g)| (*win, hashes.iter().map(|h| g.tier(*h)).collect())).collect();
                within_windows(main, &held, request.block_size)
            })
            .collect();
        self.last = hashes;
        out
    }

    fn prediction_keys(&self) -> Vec<u64> {
        self.last.clone()
    }

    fn observe(&mut self, worker: usize, events: &[KvEvent]) {
        let (main, windows) = (&mut self.workers[worker], &mut self.windows[worker]);
        for e in events {
            // A hybrid engine's sliding-window group has a view of its own;
            // its blocks chain on the text hashes the main group gave the
            // same engine keys (every group shares the keys).
            let group = match e {
                KvEvent::BlockStored(s) => s.group,
                KvEvent::BlockRemoved(r) => r.group,
                KvEvent::AllBlocksCleared(_) => None,
            };
            let (w, main_keys) = match group {
                Some(KvGroup { index, kind: GroupKind::SlidingWindow { window_tokens } }) if index > 0 => {
                    let at = match windows.iter().position(|(i, _, _)| *i == index) {
                        Some(at) => at,
                        None => {
                            windows.push((index, window_tokens, TextWorker::default()));
                            windows.len() - 1
                        }
                    };
                    (&mut windows[at].2, Some(&main.by_engine_key))
                }
                _ => (&mut *main, None),
            };
            match e {
                KvEvent::BlockStored(s) => {
                    let mut parent = match &s.parent {
                        None => None,
                        Some(p) => match w.by_engine_key.get(p).or_else(|| main_keys.and_then(|m| m.get(p))) {
                            Some((h, _)) => Some(*h),
                            None => {
                                // The parent is unknown (evicted first): the
                                // chain cannot be extended, as in any router.
                                self.unchained_blocks += s.keys.len() as u64;
                                continue;
                            }
                        },
                    };
                    let bs = s.block_size as usize;
                    for (k, block) in s.keys.iter().zip(s.token_ids.chunks_exact(bs)) {
                        let h = text_chain(parent, text_local_hash(block));
                        w.add(*k, h, s.medium);
                        parent = Some(h);
                    }
                }
                KvEvent::BlockRemoved(r) => {
                    for k in &r.keys {
                        if let Some(&(h, m)) = w.by_engine_key.get(k)
                            && m == r.medium
                        {
                            w.by_engine_key.remove(k);
                            w.drop_count(h, m);
                        }
                    }
                }
                KvEvent::AllBlocksCleared(_) => {
                    *w = TextWorker::default();
                    windows.clear();
                }
            }
        }
    }

    fn events_unusable(&self) -> u64 {
        self.unchained_blocks
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sim::workload::{Prompt, SimImage};
    use kvcore::ImageDigest;
    use kvcore::TokenRun;
    use kvcore::{Engine, EngineConfig};
    use kvcore::{MmContent, MmItemSpec, RequestSpec};

    const BS: u32 = 4;
    const PAD: u32 = 9;

    fn request(pixels: &'static [u8]) -> SimRequest {
        let tokens = vec![1, 2, 3, 4, PAD, PAD, PAD, PAD, PAD, PAD, PAD, PAD, 5, 6, 7, 8, 10];
        SimRequest {
            id: 0,
            arrival_us: 0,
            session: 0,
            prompt: Prompt::Tokens(tokens),
            images: vec![SimImage {
                pixels: Arc::from(pixels),
                digest: ImageDigest::of_content(pixels),
                uuid: None,
                start: 4,
                len: 8,
            }],
            output_len: 0,
            generated: Vec::new(),
        }
    }

    fn serve(engine: &mut Engine, r: &SimRequest) -> Vec<KvEvent> {
        let tokens = r.prompt.tokens();
        let items = r
            .images
            .iter()
            .map(|i| MmItemSpec {
                content: MmContent::Bytes(&i.pixels),
                runs: vec![TokenRun { start: i.start, len: i.len }],
            })
            .collect();
        let a = engine.add_request(&RequestSpec { tokens: &tokens, items, ..Default::default() }).unwrap();
        engine.commit(a.id, tokens.len() as u64).unwrap();
        engine.finish(a.id).unwrap();
        engine.step();
        engine.drain_events()
    }

    fn overlap(view: &mut dyn CacheView, r: &SimRequest, engines: &[Engine]) -> Overlap {
        let tokens = r.prompt.tokens();
        let keys = engine_keys(r, &tokens, BS, PAD);
        view.overlaps(&ViewRequest { request: r, tokens: &tokens, engine_keys: &keys, block_size: BS }, engines)[0]
    }

    /// After a worker served a prompt with one image, the same prompt with
    /// other pixels of the same size matches only the text block before the
    /// image. The oracle and the content view say so; the text-only view
    /// believes the image blocks are held too (a false hit in the making),
    /// and every view agrees on the identical request. Method: one real
    /// engine, its events fed to the event-fed views.
    #[test]
    fn text_only_is_fooled_by_equal_placeholders() {
        let config = EngineConfig {
            block_size_tokens: BS,
            blocks_device: 64,
            image_placeholder_token_id: PAD,
            ..Default::default()
        };
        let mut engines = vec![Engine::new(config).unwrap()];
        let (mut text, mut content, mut oracle) = (TextOnlyView::new(1), ContentView::new(1), OracleView);
        let events = serve(&mut engines[0], &request(b"red"));
        text.observe(0, &events);
        content.observe(0, &events);
        let full = Overlap { device_blocks: 4, any_tier_blocks: 4 };
        let same = request(b"red");
        for view in [&mut text as &mut dyn CacheView, &mut content, &mut oracle] {
            assert_eq!(overlap(view, &same, &engines), full);
        }
        let other = request(b"blue");
        let text_prefix = Overlap { device_blocks: 1, any_tier_blocks: 1 };
        assert_eq!(overlap(&mut oracle, &other, &engines), text_prefix);
        assert_eq!(overlap(&mut content, &other, &engines), text_prefix);
        assert_eq!(overlap(&mut text, &other, &engines), full, "text-only keys ignore the pixels");
        let admitted = engines[0]
            .add_request(&RequestSpec {
                tokens: &other.prompt.tokens(),
                items: vec![MmItemSpec {
                    content: MmContent::Bytes(b"blue"),
                    runs: vec![TokenRun { start: 4, len: 8 }],
                }],
                ..Default::default()
            })
            .unwrap();
        assert_eq!(admitted.tokens_cached, BS, "the engine agrees with the oracle");
    }

    /// Removals and tier moves keep an event-fed view equal to the engine:
    /// after eviction, nothing is believed held. Method: evict everything and
    /// feed the events.
    #[test]
    fn views_follow_evictions() {
        let config = EngineConfig {
            block_size_tokens: BS,
            blocks_device: 64,
            image_placeholder_token_id: PAD,
            ..Default::default()
        };
        let mut engines = vec![Engine::new(config).unwrap()];
        let (mut text, mut content) = (TextOnlyView::new(1), ContentView::new(1));
        let events = serve(&mut engines[0], &request(b"red"));
        text.observe(0, &events);
        content.observe(0, &events);
        engines[0].evict(64);
        engines[0].step();
        let removed = engines[0].drain_events();
        text.observe(0, &removed);
        content.observe(0, &removed);
        let r = request(b"red");
        assert_eq!(overlap(&mut text, &r, &engines), Overlap::default());
        assert_eq!(overlap(&mut content, &r, &engines), Overlap::default());
        assert_eq!(overlap(&mut OracleView, &r, &engines), Overlap::default());
    }
}
