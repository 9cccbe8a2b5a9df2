//! kvcore's router and Dynamo's native indexer (`dynamo-kv-router` 1.6.1)
//! side by side, each row one criterion group with both sides in it: a
//! 4096-token request hashed, 256 keys looked up (128 held by one worker,
//! then 128 unseen), and 2048 blocks applied into fresh tables. The full
//! comparison, in interleaved rounds with ratios and every workload, is
//! `kvcore route-bench --native` (docs/benchmarks.md); these are its main
//! rows on a small workload, in thread CPU time (see `cpu_time.rs`).
//!
//! Dynamo's apply here is its `RadixTree`, which applies on the calling
//! thread; CRTC applies on a thread pool's thread, whose time this
//! measurement would not see, so CRTC appears in the lookup group only
//! (its lookup runs on the calling thread).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group};
use dynamo_kv_router::protocols::BlockHashOptions;
use dynamo_kv_router::{
    ConcurrentRadixTreeCompressed, RadixTree, SyncIndexer, ThreadPoolIndexer, compute_block_hash_for_seq,
};
use kvcore_router::{EventWorkloadSpec, Indexer, IndexerConfig, RouterScope, WorkerId};
use kvcore_tools::bench::native::{Workload, to_dynamo};

use crate::cpu_time::ThreadCpuTime;

const BLOCK: u32 = 32;

fn kvcore_index(w: &Workload) -> (Indexer, Vec<WorkerId>) {
    let mut ix = Indexer::new(IndexerConfig { block_size: BLOCK, ..Default::default() });
    let ids = (0..w.workers).map(|i| ix.add_worker(&format!("w{i}"))).collect();
    (ix, ids)
}

fn radix_apply(t: &mut RadixTree, w: &Workload) {
    for (id, (wk, e)) in w.events.iter().enumerate() {
        if let Some(ev) = to_dynamo(*wk as u64, id as u64, e, BLOCK) {
            let _ = t.apply_event(ev);
        }
    }
}

/// The workload: 16 sequences of 4096 tokens over 4 workers (2048 blocks).
fn workload() -> Workload {
    Workload::uniform(&EventWorkloadSpec { sequences: 16, ..Default::default() })
}

/// A 4096-token request hashed by each side's own function.
fn hash(c: &mut Criterion<ThreadCpuTime>) {
    let w = workload();
    let tokens = &w.request[..4096];
    let mut g = c.benchmark_group("router_native/hash_4096_tokens");
    g.bench_function("kvcore", |b| {
        b.iter(|| RouterScope { block_size: BLOCK, lora: None, cache_salt: None }.text_keys(black_box(tokens)))
    });
    g.bench_function("dynamo", |b| {
        b.iter(|| compute_block_hash_for_seq(black_box(tokens), BLOCK, BlockHashOptions::default()))
    });
    g.finish();
}

/// 256 keys looked up: 128 held by one worker, then 128 unseen.
fn lookup(c: &mut Criterion<ThreadCpuTime>) {
    let w = workload();
    let (mut ix, ids) = kvcore_index(&w);
    ix.apply_all(w.events.iter().map(|(wk, e)| (ids[*wk], e)));
    let keys = RouterScope { block_size: BLOCK, lora: None, cache_salt: None }.text_keys(&w.request);
    let local = compute_block_hash_for_seq(&w.request, BLOCK, BlockHashOptions::default());
    let mut radix = RadixTree::new();
    radix_apply(&mut radix, &w);
    let crtc = ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), 1, BLOCK);
    for (id, (wk, e)) in w.events.iter().enumerate() {
        if let Some(ev) = to_dynamo(*wk as u64, id as u64, e, BLOCK) {
            crtc.enqueue_event(ev).expect("the pool is running");
        }
    }
    futures_lite_block_on(&crtc);
    // Every side finds the held half.
    assert_eq!(ix.find_matches(&keys)[0].device_blocks, 128);
    assert_eq!(radix.find_matches(local.clone(), false).scores.values().copied().max(), Some(128));
    assert_eq!(crtc.backend().find_matches(&local, false).scores.values().copied().max(), Some(128));
    let mut g = c.benchmark_group("router_native/lookup_256_keys");
    g.bench_function("kvcore", |b| b.iter(|| ix.find_matches(black_box(&keys))));
    g.bench_function("dynamo_radix_tree", |b| b.iter(|| radix.find_matches(black_box(local.clone()), false)));
    g.bench_function("dynamo_crtc", |b| b.iter(|| crtc.backend().find_matches(black_box(&local), false)));
    g.finish();
}

/// Waits for the pool to apply what was enqueued.
fn futures_lite_block_on(p: &ThreadPoolIndexer<ConcurrentRadixTreeCompressed>) {
    let rt = std::thread::scope(|_| {
        let mut f = std::pin::pin!(p.flush_and_wait());
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        loop {
            if let std::task::Poll::Ready(r) = f.as_mut().poll(&mut cx) {
                break r;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    });
    rt.expect("the pool is running");
}

/// 2048 blocks into fresh tables: kvcore from decoded events (hashing each
/// block's tokens), Dynamo's `RadixTree` from the same events, made into
/// its own with `compute_block_hash_for_seq` in the timed span.
fn apply(c: &mut Criterion<ThreadCpuTime>) {
    let w = workload();
    let mut g = c.benchmark_group("router_native/apply_2048_blocks");
    g.bench_function("kvcore", |b| {
        b.iter_batched(
            || kvcore_index(&w),
            |(mut ix, ids)| {
                ix.apply_all(w.events.iter().map(|(wk, e)| (ids[*wk], e)));
                ix
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("dynamo_radix_tree", |b| {
        b.iter_batched(
            RadixTree::new,
            |mut t| {
                radix_apply(&mut t, &w);
                t
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime).sample_size(20);
    targets = hash, lookup, apply
}
