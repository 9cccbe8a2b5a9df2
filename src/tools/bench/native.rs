//! kvcore's router side by side with NVIDIA Dynamo's native Rust indexer
//! (`dynamo-kv-router` 1.6.1), both in this process: `kvcore route-bench
//! --native`.
//!
//! Every row runs in interleaved rounds: in each round every side runs once,
//! in an order rotated from round to round, and the round gives a ratio of
//! kvcore's figure to the best of Dynamo's single-threaded indexers in that
//! round (`RadixTree`; `ConcurrentRadixTreeCompressed` and
//! `PositionalIndexer` behind a `ThreadPoolIndexer` of one thread, their
//! intended use). Above 1 means kvcore is faster. A row reports each side's
//! median and the ratio's min / median / max over the rounds.
//!
//! The footing, and where the two differ:
//! - Both sides start from the same decoded events, with token ids. kvcore's
//!   apply computes each block's router key from its tokens; Dynamo's
//!   indexers take a `RouterEvent` that already carries each block's token
//!   hash, so Dynamo's timed apply includes making those events from the
//!   decoded ones with its own `compute_block_hash_for_seq` (what its ZMQ
//!   listener does after decoding). The figure of Dynamo given ready events
//!   is printed beside it.
//! - The thread pool of one thread applies on its own thread while the
//!   caller makes the events: two threads for Dynamo's CRTC and positional
//!   rows, one for kvcore and `RadixTree`. The timed span ends when the pool
//!   has flushed.
//! - A request's keys: kvcore chains each block's key on its parent's (a key
//!   names a prefix); Dynamo hashes each block alone and lets the tree's
//!   structure chain them. Each side's request hash is what its lookup takes.
//! - A lookup answers, per worker, the longest held prefix: kvcore per tier
//!   (device and any tier), Dynamo one count (`early_exit` off, as its
//!   router calls it).
//! - `PositionalIndexer` accepts a stored block in a lookup only where the
//!   block's external hash equals Dynamo's own rolling sequence hash of the
//!   request's block hashes, so it never matches events stored under an
//!   engine's hashes (vLLM's, or these workloads'). Its lookup rows index
//!   the events with those sequence hashes in place of the engine's
//!   ([`to_dynamo_positional`]); its apply rows take the engine's hashes,
//!   as the others do.
//! - Request hashing: kvcore's [`RouterScope::text_keys`] from borrowed
//!   tokens against `compute_block_hash_for_seq`, each computing its
//!   scope's seed in the call, each returning a new `Vec` of keys.
//! - Decode: kvcore decodes into its wire structs; Dynamo's
//!   `decode_event_batch` into its raw events, then its `ZmqEventNormalizer`
//!   turns them into placement events.
//! - Fresh apply drops the previous round's index, untimed, before each
//!   round: kvcore's large tables are unmapped and faulted in again, where
//!   `RadixTree`'s small nodes come from the freed heap. [`fresh_kept_row`]
//!   measures it again with the allocator keeping freed memory for every
//!   side.

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::io::BufRead as _;
use std::path::Path;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, WorkerWithDpRank, compute_next_seq_hash,
};
use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};
use dynamo_kv_router::{
    ConcurrentRadixTreeCompressed, LocalBlockHash, PositionalIndexer, RadixTree, RouterEvent, SyncIndexer,
    ThreadPoolIndexer, compute_block_hash_for_seq,
};
use kvcore::wire::{EventForm, WireBatch, WireBlockStored, WireEvent, decode_payload, encode_payload};
use kvcore_router::{
    EventWorkload, EventWorkloadSpec, Indexer, IndexerConfig, RouterKey, RouterScope, ShardedIndexer, WorkerId,
};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};

use super::alloc::live_bytes;

/// Runs a future to completion on this thread (Dynamo's thread pool flush
/// is async; its completion comes from the pool's threads).
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// The indexers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// kvcore's `Indexer`.
    Kvcore,
    /// Dynamo's `RadixTree` (single-threaded, owned).
    Radix,
    /// Dynamo's `ConcurrentRadixTreeCompressed` in a `ThreadPoolIndexer` of
    /// one thread.
    Crtc,
    /// Dynamo's `PositionalIndexer` (jump 32) in a `ThreadPoolIndexer` of one
    /// thread.
    Positional,
    /// Dynamo's `ConcurrentRadixTreeCompressed` in a `ThreadPoolIndexer` of
    /// several threads (only in [`thread_rows`], not in [`Side::ALL`]).
    CrtcPool,
    /// kvcore's `ShardedIndexer`, one shard a thread (only in
    /// [`thread_rows`]).
    Sharded,
}

impl Side {
    /// Every side, kvcore first.
    pub const ALL: [Side; 4] = [Side::Kvcore, Side::Radix, Side::Crtc, Side::Positional];

    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Side::Kvcore => "kvcore",
            Side::Radix => "RadixTree",
            Side::Crtc => "CRTC",
            Side::Positional => "Positional",
            Side::CrtcPool => "CRTC pool",
            Side::Sharded => "kvcore shards",
        }
    }
}

/// One side's index.
enum Index {
    Kvcore(Box<Indexer>, Vec<WorkerId>),
    Radix(Box<RadixTree>),
    Crtc(ThreadPoolIndexer<ConcurrentRadixTreeCompressed>),
    Positional(ThreadPoolIndexer<PositionalIndexer>),
}

impl Index {
    fn new(side: Side, workers: usize, block_size: u32) -> Self {
        match side {
            Side::Kvcore => {
                let mut ix = Indexer::new(IndexerConfig { block_size, ..Default::default() });
                let ids = (0..workers).map(|w| ix.add_worker(&format!("w{w}"))).collect();
                Index::Kvcore(Box::new(ix), ids)
            }
            Side::Radix => Index::Radix(Box::new(RadixTree::new())),
            Side::Crtc => Index::Crtc(ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, block_size)),
            Side::Positional => Index::Positional(ThreadPoolIndexer::new(PositionalIndexer::new(32), 1, block_size)),
            Side::CrtcPool => Self::crtc_pool(1, block_size),
            Side::Sharded => unreachable!("thread_rows makes its own sharded indexer"),
        }
    }

    /// CRTC in a `ThreadPoolIndexer` of `threads` threads.
    fn crtc_pool(threads: usize, block_size: u32) -> Self {
        Index::Crtc(ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), threads, block_size))
    }

    /// Applies decoded events (Dynamo's side converts and hashes them first).
    fn apply(&mut self, events: &[(usize, WireEvent)], block_size: u32) {
        match self {
            Index::Kvcore(ix, ids) => ix.apply_all(events.iter().map(|(w, e)| (ids[*w], e))),
            _ => {
                for (id, (w, e)) in events.iter().enumerate() {
                    if let Some(ev) = to_dynamo(*w as u64, id as u64, e, block_size) {
                        self.apply_dynamo(ev);
                    }
                }
            }
        }
        self.flush();
    }

    fn apply_dynamo(&mut self, ev: RouterEvent) {
        match self {
            Index::Kvcore(..) => unreachable!("Dynamo's events go to Dynamo's indexers"),
            Index::Radix(t) => {
                let _ = t.apply_event(ev);
            }
            Index::Crtc(p) => p.enqueue_event(ev).expect("the pool is running"),
            Index::Positional(p) => p.enqueue_event(ev).expect("the pool is running"),
        }
    }

    fn flush(&self) {
        match self {
            Index::Crtc(p) => block_on(p.flush_and_wait()).expect("the pool is running"),
            Index::Positional(p) => block_on(p.flush_and_wait()).expect("the pool is running"),
            _ => {}
        }
    }

    /// Looks up a request's keys; returns the workers matched (to keep the
    /// answer live).
    fn lookup(&self, keys: &Keys) -> usize {
        match (self, keys) {
            (Index::Kvcore(ix, _), Keys::Kvcore(k)) => ix.find_matches(k).len(),
            (Index::Radix(t), Keys::Dynamo(k)) => t.find_matches(k.clone(), false).scores.len(),
            (Index::Crtc(p), Keys::Dynamo(k)) => p.backend().find_matches(k, false).scores.len(),
            (Index::Positional(p), Keys::Dynamo(k)) => p.backend().find_matches(k, false).scores.len(),
            _ => unreachable!("keys of the index's own kind"),
        }
    }
}

/// A request's keys, as each side's lookup takes them.
enum Keys {
    Kvcore(Vec<RouterKey>),
    Dynamo(Vec<LocalBlockHash>),
}

/// Hashes a request the way `side` does before a lookup.
fn hash_keys(side: Side, tokens: &[u32], block_size: u32) -> Keys {
    match side {
        // Text from borrowed tokens, as Dynamo's function takes them; the
        // scope's seed is computed in each call, as Dynamo's is from its
        // options.
        Side::Kvcore => Keys::Kvcore(RouterScope { block_size, lora: None, cache_salt: None }.text_keys(tokens)),
        _ => Keys::Dynamo(compute_block_hash_for_seq(tokens, block_size, BlockHashOptions::default())),
    }
}

/// Dynamo's event for one of ours, its block token hashes computed by its
/// own function.
pub fn to_dynamo(worker: u64, id: u64, e: &WireEvent, block_size: u32) -> Option<RouterEvent> {
    let data = match e {
        WireEvent::BlockStored(s) => {
            let local = compute_block_hash_for_seq(s.token_ids.as_deref()?, block_size, BlockHashOptions::default());
            let blocks = s
                .block_hashes
                .iter()
                .zip(local)
                .map(|(h, l)| KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(*h as u64),
                    tokens_hash: l,
                    mm_extra_info: None,
                })
                .collect();
            KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: s.parent_block_hash.map(|p| ExternalSequenceBlockHash(p as u64)),
                start_position: None,
                blocks,
            })
        }
        WireEvent::BlockRemoved(r) => KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: r.block_hashes.iter().map(|h| ExternalSequenceBlockHash(*h as u64)).collect(),
        }),
        WireEvent::AllBlocksCleared => KvCacheEventData::Cleared,
        _ => return None,
    };
    Some(RouterEvent::new(worker, KvCacheEvent { event_id: id, data, dp_rank: 0 }))
}

/// Dynamo's events for `PositionalIndexer`'s lookups: as [`to_dynamo`], but
/// each block's external hash replaced by Dynamo's own rolling sequence hash
/// of the block hashes (`compute_next_seq_hash`), the parent's by the
/// parent's. `PositionalIndexer::find_matches` recomputes that sequence hash
/// from the request and accepts a stored block only where the two agree, so
/// it never matches blocks stored under an engine's own hashes (vLLM's, or
/// this workload's): it is built for events whose block hashes Dynamo
/// computed. Removals are not converted (the lookup rows store only).
pub fn to_dynamo_positional(events: &[(usize, WireEvent)], block_size: u32) -> Vec<RouterEvent> {
    let mut seq_of: HashMap<(usize, i64), u64> = HashMap::new();
    let mut out = Vec::new();
    for (id, (w, e)) in events.iter().enumerate() {
        let WireEvent::BlockStored(s) = e else { continue };
        let Some(tokens) = s.token_ids.as_deref() else { continue };
        let local = compute_block_hash_for_seq(tokens, block_size, BlockHashOptions::default());
        let mut parent = s.parent_block_hash.and_then(|p| seq_of.get(&(*w, p)).copied());
        if s.parent_block_hash.is_some() && parent.is_none() {
            continue;
        }
        let parent_hash = parent.map(ExternalSequenceBlockHash);
        let blocks = s
            .block_hashes
            .iter()
            .zip(local)
            .map(|(h, l)| {
                let seq = match parent {
                    None => l.0,
                    Some(p) => compute_next_seq_hash(p, l),
                };
                parent = Some(seq);
                seq_of.insert((*w, *h), seq);
                KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(seq),
                    tokens_hash: l,
                    mm_extra_info: None,
                }
            })
            .collect();
        let data = KvCacheEventData::Stored(KvCacheStoreData { parent_hash, start_position: None, blocks });
        out.push(RouterEvent::new(*w as u64, KvCacheEvent { event_id: id as u64, data, dp_rank: 0 }));
    }
    out
}

/// A stream of stored events over a number of workers.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Its name in the tables.
    pub name: String,
    /// Workers.
    pub workers: usize,
    /// `(worker, event)` in order.
    pub events: Vec<(usize, WireEvent)>,
    /// Blocks stored.
    pub blocks: usize,
    /// Tokens of a request to look up against it.
    pub request: Vec<u32>,
}

impl Workload {
    /// The route-bench workload (`EventWorkload`), its request the first
    /// stored sequence's first half followed by unseen tokens (as many keys
    /// held as not).
    pub fn uniform(spec: &EventWorkloadSpec) -> Self {
        let w = EventWorkload::generate(spec);
        let mut request: Vec<u32> = w.sequences.first().map(|s| s.1.clone()).unwrap_or_default();
        let mut rng = StdRng::seed_from_u64(spec.seed ^ 0x5eed);
        request.extend((0..request.len()).map(|_| rng.random_range(0..152_000u32)));
        Self {
            name: format!("uniform {}x{} tok, {} workers", spec.sequences, spec.seq_tokens, spec.workers),
            workers: spec.workers,
            events: w.events,
            blocks: w.blocks,
            request,
        }
    }

    /// Prefixes held by `holders` of `workers` workers each: `prefixes`
    /// sequences of `seq_tokens`, sequence `s` stored by workers `s + j`
    /// (mod `workers`) for `j < holders`, in 16-block events. The request is
    /// sequence 0 followed by as many unseen tokens.
    pub fn held(workers: usize, holders: usize, prefixes: usize, seq_tokens: usize, block_size: u32) -> Self {
        let spec = EventWorkloadSpec {
            seed: 7,
            sequences: prefixes,
            seq_tokens,
            block_size,
            blocks_per_event: 16,
            workers: 1,
        };
        let base = EventWorkload::generate(&spec);
        let per_seq = base.events.len() / prefixes.max(1);
        let mut events = Vec::with_capacity(base.events.len() * holders);
        for s in 0..prefixes {
            for j in 0..holders {
                let w = (s + j) % workers;
                for (_, e) in &base.events[s * per_seq..(s + 1) * per_seq] {
                    events.push((w, e.clone()));
                }
            }
        }
        let mut request = base.sequences[0].1.clone();
        let mut rng = StdRng::seed_from_u64(99);
        request.extend((0..request.len()).map(|_| rng.random_range(0..152_000u32)));
        Self {
            name: format!("{prefixes} prefixes of {seq_tokens} tok, {holders} of {workers} workers hold each"),
            workers,
            blocks: base.blocks * holders,
            events,
            request,
        }
    }

    /// The Mooncake conversation trace (`../shared/data/traces/`): its first
    /// `requests` requests, request `i` stored by worker `i % workers`. Each
    /// 512-token `hash_id` becomes 16 blocks of 32 tokens derived from the id
    /// and the position (equal ids, equal tokens), stored as one event unless
    /// the worker already holds it, parent-linked to the previous id's last
    /// block: a branching, shared-prefix stream (every request starts with
    /// id 0). The request looked up is the next one in the trace.
    pub fn mooncake(path: &Path, requests: usize, workers: usize, block_size: u32) -> std::io::Result<Self> {
        let file = std::io::BufReader::new(std::fs::File::open(path)?);
        let bs = block_size as usize;
        let per_id = 512 / bs;
        let id_tokens = |id: u64| -> Vec<u32> {
            (0..512u64).map(|p| (xxhash_rust::xxh3::xxh3_64_with_seed(&p.to_le_bytes(), id) % 152_000) as u32).collect()
        };
        let mut held: Vec<ahash::AHashSet<u64>> = vec![Default::default(); workers];
        let mut hash_of: ahash::AHashMap<u64, i64> = Default::default();
        let (mut events, mut blocks, mut request) = (Vec::new(), 0, Vec::new());
        for (i, line) in file.lines().enumerate() {
            let line = line?;
            let v: serde_json::Value = serde_json::from_str(&line).map_err(std::io::Error::other)?;
            let ids: Vec<u64> =
                v["hash_ids"].as_array().map(|a| a.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default();
            if i == requests {
                request = ids.iter().flat_map(|id| id_tokens(*id)).collect();
                break;
            }
            let w = i % workers;
            let mut parent: Option<i64> = None;
            for id in ids {
                let tokens = id_tokens(id);
                if held[w].insert(id) {
                    let mut prev = parent.unwrap_or(0) as u64;
                    let mut hashes = Vec::with_capacity(per_id);
                    for b in 0..per_id {
                        let mut buf = Vec::with_capacity(8 + bs * 4);
                        buf.extend_from_slice(&prev.to_le_bytes());
                        tokens[b * bs..(b + 1) * bs].iter().for_each(|t| buf.extend_from_slice(&t.to_le_bytes()));
                        prev = xxhash_rust::xxh3::xxh3_64(&buf);
                        hashes.push(prev as i64);
                    }
                    hash_of.insert(id, prev as i64);
                    blocks += per_id;
                    events.push((
                        w,
                        WireEvent::BlockStored(WireBlockStored {
                            block_hashes: hashes,
                            parent_block_hash: parent,
                            token_ids: Some(tokens),
                            block_size,
                            medium: Some("GPU".into()),
                            ..Default::default()
                        }),
                    ));
                }
                parent = hash_of.get(&id).copied();
            }
        }
        Ok(Self {
            name: format!("Mooncake trace, {requests} requests, {workers} workers"),
            workers,
            events,
            blocks,
            request,
        })
    }

    /// The chat simulation's stream (`kvcore sim`'s default workload,
    /// `ChatConfig::default()`): request `i` of the first `requests` stored
    /// by worker `i % workers`, each full block of its prompt that the
    /// worker does not hold yet stored in parent-linked events of up to 16
    /// blocks, engine hashes chained over the tokens. The request looked up
    /// is the next one. Images enter both sides as the placeholder ids at
    /// their positions (no image metadata: Dynamo's text hash and kvcore's
    /// keys then see the same tokens).
    pub fn chat(requests: usize, workers: usize, block_size: u32) -> Self {
        use crate::sim::workload::{ChatConfig, chat_workload};
        let chat = chat_workload(&ChatConfig::default()).expect("the default chat workload is valid");
        let bs = block_size as usize;
        let mut held: Vec<ahash::AHashSet<i64>> = vec![Default::default(); workers];
        let (mut events, mut blocks, mut request) = (Vec::new(), 0, Vec::new());
        for (i, r) in chat.requests.iter().enumerate() {
            let tokens = r.prompt.tokens();
            if i == requests {
                request = tokens.into_owned();
                break;
            }
            let w = i % workers;
            let (mut prev, mut parent): (u64, Option<i64>) = (0, None);
            let mut pending: Vec<(i64, &[u32])> = Vec::new();
            let flush =
                |pending: &mut Vec<(i64, &[u32])>, parent: Option<i64>, events: &mut Vec<(usize, WireEvent)>| {
                    if pending.is_empty() {
                        return;
                    }
                    events.push((
                        w,
                        WireEvent::BlockStored(WireBlockStored {
                            block_hashes: pending.iter().map(|p| p.0).collect(),
                            parent_block_hash: parent,
                            token_ids: Some(pending.iter().flat_map(|p| p.1.iter().copied()).collect()),
                            block_size,
                            medium: Some("GPU".into()),
                            ..Default::default()
                        }),
                    ));
                    pending.clear();
                };
            let mut event_parent = None;
            for block in tokens.chunks_exact(bs) {
                let mut buf = Vec::with_capacity(8 + bs * 4);
                buf.extend_from_slice(&prev.to_le_bytes());
                block.iter().for_each(|t| buf.extend_from_slice(&t.to_le_bytes()));
                prev = xxhash_rust::xxh3::xxh3_64(&buf);
                let h = prev as i64;
                if held[w].insert(h) {
                    if pending.is_empty() {
                        event_parent = parent;
                    }
                    pending.push((h, block));
                    blocks += 1;
                    if pending.len() == 16 {
                        flush(&mut pending, event_parent, &mut events);
                    }
                } else {
                    flush(&mut pending, event_parent, &mut events);
                }
                parent = Some(h);
            }
            flush(&mut pending, event_parent, &mut events);
        }
        Self {
            name: format!("chat simulation, {requests} requests, {workers} workers"),
            workers,
            events,
            blocks,
            request,
        }
    }

    /// One `BlockRemoved` per stored event, in reverse order.
    pub fn removals(&self) -> Vec<(usize, WireEvent)> {
        kvcore_router::removals_of(self.events.iter().map(|(w, e)| (*w, e)))
    }
}

/// A row's result: each side's median figure over the rounds, and the
/// ratios of kvcore to Dynamo's best of each round.
#[derive(Clone, Debug)]
pub struct Row {
    /// What was measured.
    pub what: String,
    /// The figure's unit (larger is better for rates, smaller for times).
    pub unit: &'static str,
    /// Whether a larger figure is better.
    pub higher_better: bool,
    /// `(side, median figure)`.
    pub medians: Vec<(Side, f64)>,
    /// Ratio min, median, max (above 1: kvcore better).
    pub ratio: (f64, f64, f64),
    /// The Dynamo side that was best in most rounds.
    pub best: Side,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// Runs `rounds` interleaved rounds of `measure(side)` over `sides`; the
/// first side is kvcore.
fn rounds(
    what: String,
    unit: &'static str,
    higher_better: bool,
    rounds: usize,
    sides: &[Side],
    mut measure: impl FnMut(Side) -> f64,
) -> Row {
    let mut figs: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let mut ratios = Vec::new();
    let mut best_count = vec![0usize; sides.len()];
    for r in 0..rounds {
        let mut this = vec![0.0; sides.len()];
        for k in 0..sides.len() {
            let i = (k + r) % sides.len();
            this[i] = measure(sides[i]);
        }
        let better = |a: f64, b: f64| if higher_better { a > b } else { a < b };
        let mut bi = 1;
        for i in 2..sides.len() {
            if better(this[i], this[bi]) {
                bi = i;
            }
        }
        best_count[bi] += 1;
        ratios.push(if higher_better { this[0] / this[bi] } else { this[bi] / this[0] });
        for (i, f) in this.into_iter().enumerate() {
            figs[i].push(f);
        }
    }
    let best = (1..sides.len()).max_by_key(|i| best_count[*i]).unwrap_or(0);
    let medians = sides.iter().zip(figs.iter_mut()).map(|(s, f)| (*s, median(f))).collect();
    Row {
        what,
        unit,
        higher_better,
        medians,
        ratio: super::min_median_max(&ratios).expect("at least one round"),
        best: sides[best],
    }
}

/// One fresh round of `side`: the index in `slot` (the previous round's)
/// dropped untimed, a new one made and filled with the workload's events,
/// timed, and left in `slot`. Returns M blocks/s.
fn fresh_round(slot: &mut Option<Index>, side: Side, w: &Workload, block_size: u32) -> f64 {
    *slot = None;
    let mut ix = Index::new(side, w.workers, block_size);
    let t = Instant::now();
    ix.apply(&w.events, block_size);
    let s = t.elapsed().as_secs_f64();
    *slot = Some(ix);
    w.blocks as f64 / s / 1e6
}

/// Apply rows on one workload: fresh tables, removals, warm tables, and
/// kvcore with its tables reserved first, and Dynamo given its events ready
/// (both information: each changes what one side does).
pub fn apply_rows(w: &Workload, block_size: u32, n: usize) -> Vec<Row> {
    let removals = w.removals();
    let blocks = w.blocks as f64;
    let mut fresh_ix: Vec<Option<Index>> = Side::ALL.iter().map(|_| None).collect();
    let fresh = rounds(format!("fresh apply, {}", w.name), "M blocks/s", true, n, &Side::ALL, |side| {
        fresh_round(&mut fresh_ix[side as usize], side, w, block_size)
    });
    let removed = rounds(format!("removals, {}", w.name), "M blocks/s", true, n, &Side::ALL, |side| {
        let ix = fresh_ix[side as usize].as_mut().expect("filled by the fresh rounds");
        let t = Instant::now();
        ix.apply(&removals, block_size);
        let r = t.elapsed().as_secs_f64();
        ix.apply(&w.events, block_size);
        blocks / r / 1e6
    });
    let warm =
        rounds(format!("warm apply (after removing all), {}", w.name), "M blocks/s", true, n, &Side::ALL, |side| {
            let ix = fresh_ix[side as usize].as_mut().expect("filled by the fresh rounds");
            ix.apply(&removals, block_size);
            let t = Instant::now();
            ix.apply(&w.events, block_size);
            blocks / t.elapsed().as_secs_f64() / 1e6
        });
    drop(fresh_ix);
    // kvcore's tables sized first, as a router that knows each worker's
    // capacity sizes them when it adds the worker: the reservation is timed
    // with the apply (its memory written and faulted in), the growths are
    // gone. Dynamo's sides have no such call and apply as in the fresh row.
    let mut per_worker = vec![0usize; w.workers];
    for (wk, e) in &w.events {
        if let WireEvent::BlockStored(s) = e {
            per_worker[*wk] += s.block_hashes.len();
        }
    }
    let reserved = rounds(
        format!("fresh apply, kvcore's tables reserved first for each worker's blocks (reserve timed), {}", w.name),
        "M blocks/s",
        true,
        n,
        &Side::ALL,
        |side| {
            let mut ix = Index::new(side, w.workers, block_size);
            let t = Instant::now();
            if let Index::Kvcore(k, ids) = &mut ix {
                for (id, b) in ids.iter().zip(&per_worker) {
                    k.reserve(*id, *b);
                }
            }
            ix.apply(&w.events, block_size);
            blocks / t.elapsed().as_secs_f64() / 1e6
        },
    );
    // Dynamo given ready events: the apply alone.
    let ready: Vec<RouterEvent> =
        w.events.iter().enumerate().filter_map(|(i, (wk, e))| to_dynamo(*wk as u64, i as u64, e, block_size)).collect();
    let ready_row = rounds(
        format!("fresh apply, Dynamo given ready events (hashing untimed), {}", w.name),
        "M blocks/s",
        true,
        n,
        &Side::ALL,
        |side| {
            let mut ix = Index::new(side, w.workers, block_size);
            if side == Side::Kvcore {
                let t = Instant::now();
                ix.apply(&w.events, block_size);
                return blocks / t.elapsed().as_secs_f64() / 1e6;
            }
            let evs = ready.clone();
            let t = Instant::now();
            for ev in evs {
                ix.apply_dynamo(ev);
            }
            ix.flush();
            blocks / t.elapsed().as_secs_f64() / 1e6
        },
    );
    vec![fresh, warm, removed, reserved, ready_row]
}

/// Fresh apply with the C allocator keeping freed memory for every side:
/// no trimming of the heap and no block mapped apart (both thresholds
/// raised), so that a round's index takes the memory the previous round's
/// index freed, as `RadixTree`'s small nodes already do under the default
/// settings, instead of kvcore's tables being unmapped and faulted in
/// again. Information beside the fresh row: how much of that row is the
/// allocator's page faults. The settings stay for the rest of the process,
/// so `route-bench` runs these rows last.
pub fn fresh_kept_row(w: &Workload, block_size: u32, n: usize) -> Row {
    keep_freed_memory();
    let mut last: Vec<Option<Index>> = Side::ALL.iter().map(|_| None).collect();
    rounds(
        format!("fresh apply, freed memory kept by the allocator for every side, {}", w.name),
        "M blocks/s",
        true,
        n,
        &Side::ALL,
        |side| fresh_round(&mut last[side as usize], side, w, block_size),
    )
}

/// Raises glibc's trim and mmap thresholds (see [`fresh_kept_row`]); a
/// no-op elsewhere.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code, reason = "mallopt is a C call")]
    // SAFETY: mallopt only sets allocator parameters (M_TRIM_THRESHOLD,
    // M_MMAP_THRESHOLD: documented values) and takes the allocator's lock.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}

/// Microseconds a call of `f`: the median of samples that each time 16
/// calls back to back (a call may be shorter than the clock's resolution),
/// after a warm-up.
fn per_call(iters: usize, f: &mut dyn FnMut()) -> f64 {
    for _ in 0..iters.min(50) {
        f();
    }
    let mut ns: Vec<f64> = (0..iters.div_ceil(16))
        .map(|_| {
            let t = Instant::now();
            for _ in 0..16 {
                f();
            }
            t.elapsed().as_nanos() as f64 / 16.0
        })
        .collect();
    median(&mut ns) / 1000.0
}

/// The request hash row of one workload: kvcore's keys of the first half
/// of the workload's request against `compute_block_hash_for_seq`.
pub fn hash_row(w: &Workload, block_size: u32, n: usize, iters: usize) -> Row {
    let half = &w.request[..w.request.len() / 2];
    rounds(format!("hash a {}-token request", half.len()), "µs", false, n, &[Side::Kvcore, Side::Radix], |side| {
        per_call(iters, &mut || {
            black_box(hash_keys(side, black_box(half), block_size));
        })
    })
}

/// Lookup rows on one workload: the lookup alone (keys made untimed), the
/// request hash alone, and both (a routing decision's index work).
pub fn lookup_rows(w: &Workload, block_size: u32, n: usize, iters: usize) -> Vec<Row> {
    let positional = to_dynamo_positional(&w.events, block_size);
    let indexes: Vec<Index> = Side::ALL
        .iter()
        .map(|s| {
            let mut ix = Index::new(*s, w.workers, block_size);
            if *s == Side::Positional {
                for ev in positional.iter().cloned() {
                    ix.apply_dynamo(ev);
                }
                ix.flush();
            } else {
                ix.apply(&w.events, block_size);
            }
            ix
        })
        .collect();
    let keys: Vec<Keys> = Side::ALL.iter().map(|s| hash_keys(*s, &w.request, block_size)).collect();
    let nkeys = match &keys[0] {
        Keys::Kvcore(k) => k.len(),
        Keys::Dynamo(k) => k.len(),
    };
    // The matches must agree on which workers hold a prefix.
    let matched: Vec<usize> = Side::ALL.iter().map(|s| indexes[*s as usize].lookup(&keys[*s as usize])).collect();
    // Sides whose answer differs from kvcore's (a different set of workers
    // matched) are left out of the row: a wrong answer has no speed.
    let sides: Vec<Side> = Side::ALL.iter().copied().filter(|s| matched[*s as usize] == matched[0]).collect();
    let excluded: Vec<&str> = Side::ALL.iter().filter(|s| !sides.contains(s)).map(|s| s.name()).collect();
    let per_call = |f: &mut dyn FnMut()| per_call(iters, f);
    let note = if excluded.is_empty() {
        String::new()
    } else {
        format!(", left out (answer differs): {}", excluded.join(" "))
    };
    let lookup = rounds(
        format!("lookup {nkeys} keys (workers matched {}{note}), {}", matched[0], w.name),
        "µs",
        false,
        n,
        &sides,
        |side| {
            let (ix, k) = (&indexes[side as usize], &keys[side as usize]);
            per_call(&mut || {
                black_box(ix.lookup(k));
            })
        },
    );
    let hash = hash_row(w, block_size, n, iters);
    // kvcore's routing call hashes the prompt only as far as some worker
    // may hold it (`Indexer::find_matches_text`); Dynamo's lookup takes
    // every block's hash. Both answer alike (checked here).
    let scope = RouterScope { block_size, lora: None, cache_salt: None };
    let Index::Kvcore(kv, _) = &indexes[Side::Kvcore as usize] else { unreachable!("kvcore's index comes first") };
    assert_eq!(kv.find_matches_text(&scope, &w.request).len(), matched[0], "the routing call answers as the lookup");
    let both = rounds(
        format!("hash + lookup of {} tokens{note}, {}", w.request.len(), w.name),
        "µs",
        false,
        n,
        &sides,
        |side| {
            let ix = &indexes[side as usize];
            per_call(&mut || match ix {
                Index::Kvcore(kv, _) => {
                    black_box(kv.find_matches_text(&scope, black_box(&w.request)));
                }
                _ => {
                    let k = hash_keys(side, black_box(&w.request), block_size);
                    black_box(ix.lookup(&k));
                }
            })
        },
    );
    let every = rounds(
        format!("hash every key + lookup of {} tokens{note}, {}", w.request.len(), w.name),
        "µs",
        false,
        n,
        &sides,
        |side| {
            let ix = &indexes[side as usize];
            per_call(&mut || {
                let k = hash_keys(side, black_box(&w.request), block_size);
                black_box(ix.lookup(&k));
            })
        },
    );
    vec![lookup, hash, both, every]
}

/// kvcore's [`ShardedIndexer`] of `threads` shards against
/// `ThreadPoolIndexer<CRTC>` with `threads` threads: the same number of
/// threads applying events on each side, each worker's events on one of
/// them.
///
/// Fresh apply from decoded events: kvcore's `apply_all` hands each shard
/// its workers' events, and each shard hashes and applies them on its own
/// thread. Dynamo's caller side makes and hashes the events (as in
/// [`apply_rows`]) on `threads` producer threads, the workers split over
/// them as the pool splits them, so that its hashing scales too; its pool's
/// threads apply them, and the timed span ends when the pool has flushed.
/// Dynamo thus runs twice as many threads as kvcore.
///
/// Lookups: one call at a time from the calling thread on both sides;
/// kvcore's walks every shard in turn.
pub fn thread_rows(w: &Workload, block_size: u32, n: usize, iters: usize, threads: usize) -> Vec<Row> {
    let sides = [Side::Sharded, Side::CrtcPool];
    let blocks = w.blocks as f64;
    let events: Vec<(WorkerId, WireEvent)> = w.events.iter().map(|(wk, e)| (WorkerId(*wk as u32), e.clone())).collect();
    let make_sharded = || {
        let mut ix = ShardedIndexer::new(IndexerConfig { block_size, ..Default::default() }, threads)
            .expect("the ingest threads start");
        for k in 0..w.workers {
            ix.add_worker(&format!("w{k}"));
        }
        ix
    };
    let mut kept_sharded: Option<ShardedIndexer> = None;
    let mut kept_pool: Option<Index> = None;
    let apply =
        rounds(format!("fresh apply, {threads} threads a side, {}", w.name), "M blocks/s", true, n, &sides, |side| {
            match side {
                Side::Sharded => {
                    kept_sharded = None;
                    let ix = make_sharded();
                    let t = Instant::now();
                    ix.apply_all(&events);
                    let s = t.elapsed().as_secs_f64();
                    kept_sharded = Some(ix);
                    blocks / s / 1e6
                }
                _ => {
                    kept_pool = None;
                    let ix = Index::crtc_pool(threads, block_size);
                    let Index::Crtc(pool) = &ix else { unreachable!("a CRTC pool") };
                    let t = Instant::now();
                    std::thread::scope(|scope| {
                        for p in 0..threads {
                            scope.spawn(move || {
                                for (id, (wk, e)) in w.events.iter().enumerate() {
                                    if wk % threads == p
                                        && let Some(ev) = to_dynamo(*wk as u64, id as u64, e, block_size)
                                    {
                                        pool.enqueue_event(ev).expect("the pool is running");
                                    }
                                }
                            });
                        }
                    });
                    ix.flush();
                    let s = t.elapsed().as_secs_f64();
                    kept_pool = Some(ix);
                    blocks / s / 1e6
                }
            }
        });
    let sharded = kept_sharded.expect("filled by the apply rounds");
    let pool = kept_pool.expect("filled by the apply rounds");
    let kv_keys = match hash_keys(Side::Kvcore, &w.request, block_size) {
        Keys::Kvcore(k) => k,
        Keys::Dynamo(_) => unreachable!("kvcore's keys"),
    };
    let dyn_keys = hash_keys(Side::CrtcPool, &w.request, block_size);
    let matched = [sharded.find_matches(&kv_keys).len(), pool.lookup(&dyn_keys)];
    assert_eq!(matched[0], matched[1], "both sides match the same workers");
    let lookup = rounds(
        format!("lookup (one call at a time, workers matched {}), {threads} threads a side, {}", matched[0], w.name),
        "µs",
        false,
        n,
        &sides,
        |side| {
            let call = || match side {
                Side::Sharded => {
                    black_box(sharded.find_matches(&kv_keys));
                }
                _ => {
                    black_box(pool.lookup(&dyn_keys));
                }
            };
            for _ in 0..iters.min(50) {
                call();
            }
            let mut ns: Vec<f64> = (0..iters.div_ceil(16))
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..16 {
                        call();
                    }
                    t.elapsed().as_nanos() as f64 / 16.0
                })
                .collect();
            median(&mut ns) / 1000.0
        },
    );
    vec![apply, lookup]
}

/// Decode + apply from payload bytes, one event a payload (map form, token
/// ids included), into fresh tables.
pub fn decode_rows(w: &Workload, block_size: u32, n: usize) -> Vec<Row> {
    let payloads: Vec<(usize, Vec<u8>)> = w
        .events
        .iter()
        .map(|(wk, e)| {
            let mut out = Vec::new();
            let batch = WireBatch { ts: 0.0, events: vec![e.clone()], data_parallel_rank: None };
            encode_payload(&batch, EventForm::Map, &mut out);
            (*wk, out)
        })
        .collect();
    let bytes: usize = payloads.iter().map(|p| p.1.len()).sum();
    let decode_only = rounds(
        format!("decode payloads ({} MB), {}", bytes / 1_000_000, w.name),
        "GB/s",
        true,
        n,
        &[Side::Kvcore, Side::Radix],
        |side| {
            let t = Instant::now();
            let mut k = 0usize;
            for (_, p) in &payloads {
                k += match side {
                    Side::Kvcore => decode_payload(p).map_or(0, |b| b.events.len()),
                    _ => decode_event_batch(p).map_or(0, |b| b.events.len()),
                };
            }
            assert_eq!(k, payloads.len(), "{} decodes every payload", side.name());
            bytes as f64 / t.elapsed().as_secs_f64() / 1e9
        },
    );
    let blocks = w.blocks as f64;
    let mut slots: Vec<Option<Index>> = Side::ALL.iter().map(|_| None).collect();
    let mut applied = [0usize; 4];
    let apply =
        rounds(format!("decode + apply from payload bytes, {}", w.name), "M blocks/s", true, n, &Side::ALL, |side| {
            slots[side as usize] = None;
            let mut ix = Index::new(side, w.workers, block_size);
            let mut norm = ZmqEventNormalizer::new(block_size);
            let t = Instant::now();
            for (id, (wk, p)) in payloads.iter().enumerate() {
                match &mut ix {
                    Index::Kvcore(k, ids) => {
                        if let Ok(b) = decode_payload(p) {
                            k.apply_all(b.events.iter().map(|e| (ids[*wk], e)));
                        }
                    }
                    _ => {
                        let Ok(batch) = decode_event_batch(p) else { continue };
                        let worker = WorkerWithDpRank::new(*wk as u64, 0);
                        for raw in batch.events {
                            if let Some(ev) = norm.normalize(raw, id as u64, worker).and_then(|p| p.into_router_event())
                            {
                                applied[side as usize] += 1;
                                ix.apply_dynamo(ev);
                            }
                        }
                    }
                }
            }
            ix.flush();
            let s = t.elapsed().as_secs_f64();
            slots[side as usize] = Some(ix);
            blocks / s / 1e6
        });
    for s in &Side::ALL[1..] {
        assert_eq!(applied[*s as usize], payloads.len() * n, "{} normalized every event", s.name());
    }
    vec![decode_only, apply]
}

/// Bytes live per stored block after storing the whole workload into one
/// fresh index of each side (the counting allocator must be installed).
pub fn memory_row(w: &Workload, block_size: u32) -> Row {
    let mut medians = Vec::new();
    for side in Side::ALL {
        let before = live_bytes();
        let mut ix = Index::new(side, w.workers, block_size);
        ix.apply(&w.events, block_size);
        let after = live_bytes();
        medians.push((side, (after - before) as f64 / w.blocks as f64));
        drop(ix);
    }
    let (bi, best) = medians[1..]
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.1.total_cmp(&b.1.1))
        .map(|(i, m)| (i + 1, m.1))
        .expect("Dynamo's sides");
    let r = best / medians[0].1;
    Row {
        what: format!("memory per block, {} ({} blocks)", w.name, w.blocks),
        unit: "B",
        higher_better: false,
        medians,
        ratio: (r, r, r),
        best: Side::ALL[bi],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both sides index the same events to the same answer: for a prefix
    /// held by 4 of 8 workers, kvcore's overlaps and Dynamo's `RadixTree`,
    /// CRTC and `PositionalIndexer` scores name the same workers with the
    /// same prefix lengths (the held half of the request), and every event
    /// converts.
    #[test]
    fn both_sides_answer_alike() {
        let w = Workload::held(8, 4, 2, 256, 32);
        let mut kv = Index::new(Side::Kvcore, w.workers, 32);
        kv.apply(&w.events, 32);
        let Index::Kvcore(ix, _) = &kv else { unreachable!() };
        let Keys::Kvcore(keys) = hash_keys(Side::Kvcore, &w.request, 32) else { unreachable!() };
        let ours: Vec<(u64, u32)> =
            ix.find_matches(&keys).iter().map(|o| (o.worker.0 as u64, o.any_tier_blocks)).collect();
        assert_eq!(ours, vec![(0, 8), (1, 8), (2, 8), (3, 8)]);
        let Keys::Dynamo(local) = hash_keys(Side::Radix, &w.request, 32) else { unreachable!() };
        for side in [Side::Radix, Side::Crtc] {
            let mut d = Index::new(side, w.workers, 32);
            d.apply(&w.events, 32);
            let scores = match &d {
                Index::Radix(t) => t.find_matches(local.clone(), false).scores,
                Index::Crtc(p) => p.backend().find_matches(&local, false).scores,
                _ => unreachable!(),
            };
            let mut theirs: Vec<(u64, u32)> = scores.iter().map(|(k, v)| (k.worker_id, *v)).collect();
            theirs.sort_unstable();
            assert_eq!(theirs, ours, "{}", side.name());
        }
        assert_eq!(w.events.iter().filter_map(|(wk, e)| to_dynamo(*wk as u64, 0, e, 32)).count(), w.events.len());
        // `PositionalIndexer` answers alike from events carrying Dynamo's
        // sequence hashes, and matches nothing under the engine's hashes.
        let positional = |evs: Vec<RouterEvent>| {
            let mut d = Index::new(Side::Positional, w.workers, 32);
            for ev in evs {
                d.apply_dynamo(ev);
            }
            d.flush();
            let Index::Positional(p) = &d else { unreachable!() };
            let mut v: Vec<(u64, u32)> =
                p.backend().find_matches(&local, false).scores.iter().map(|(k, v)| (k.worker_id, *v)).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(positional(to_dynamo_positional(&w.events, 32)), ours);
        let engine_hashes =
            w.events.iter().enumerate().filter_map(|(i, (wk, e))| to_dynamo(*wk as u64, i as u64, e, 32));
        assert_eq!(positional(engine_hashes.collect()), vec![]);
    }
}
