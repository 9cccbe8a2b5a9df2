//! Router benches: events applied, a 4096-token request hashed, 256 keys
//! looked up, over the workload `tests/interop/dynamo_bench.py` gives Dynamo
//! (the side-by-side figures come from `kvcore route-bench`). Thread CPU
//! time (see `cpu_time.rs`).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group};
use kvcore_router::{
    EventWorkload, EventWorkloadSpec, Indexer, IndexerConfig, NoUuids, RouterKey, TokenRequest, WorkerId, hash_request,
};

use crate::cpu_time::ThreadCpuTime;

fn indexer_with_workers(n: usize) -> (Indexer, Vec<WorkerId>) {
    let mut ix = Indexer::new(IndexerConfig::default());
    let ws = (0..n).map(|i| ix.add_worker(&format!("w{i}"))).collect();
    (ix, ws)
}

/// Applies a whole workload to a fresh indexer, per size.
fn apply(c: &mut Criterion<ThreadCpuTime>) {
    let mut g = c.benchmark_group("router/apply_stored");
    for sequences in [16usize, 256] {
        let w = EventWorkload::generate(&EventWorkloadSpec { sequences, ..Default::default() });
        let wl = w.clone();
        g.throughput(Throughput::Elements(w.blocks as u64));
        g.bench_function(format!("{sequences}x128_blocks"), |b| {
            b.iter_batched(
                || indexer_with_workers(4),
                |(mut ix, ws)| {
                    ix.apply_all(w.events.iter().map(|(wi, e)| (ws[*wi], e)));
                    ix
                },
                BatchSize::LargeInput,
            )
        });
        // Tables sized up front from the workers' capacity (`Indexer::reserve`),
        // as a router that knows each worker's block count can do.
        g.bench_function(format!("{sequences}x128_blocks_sized"), |b| {
            b.iter_batched(
                || {
                    let (mut ix, ws) = indexer_with_workers(4);
                    for w in &ws {
                        ix.reserve(*w, w_blocks(w.0 as usize, &wl));
                    }
                    (ix, ws)
                },
                |(mut ix, ws)| {
                    ix.apply_all(wl.events.iter().map(|(wi, e)| (ws[*wi], e)));
                    ix
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

/// Blocks a worker stores in a workload.
fn w_blocks(worker: usize, w: &EventWorkload) -> usize {
    w.events
        .iter()
        .filter(|(wi, _)| *wi == worker)
        .map(|(_, e)| match e {
            kvcore::wire::WireEvent::BlockStored(s) => s.block_hashes.len(),
            _ => 0,
        })
        .sum()
}

/// Hashes a 4096-token text request (128 blocks of 32).
fn hash(c: &mut Criterion<ThreadCpuTime>) {
    let w = EventWorkload::generate(&EventWorkloadSpec { sequences: 1, ..Default::default() });
    let req = TokenRequest { tokens: w.sequences[0].1.clone(), ..Default::default() };
    c.bench_function("router/hash_4096_tokens", |b| b.iter(|| hash_request(black_box(&req), 32, 0, &NoUuids)));
}

/// Looks up 256 keys (128 held by one worker, then 128 unseen).
fn lookup(c: &mut Criterion<ThreadCpuTime>) {
    let w = EventWorkload::generate(&EventWorkloadSpec { sequences: 256, ..Default::default() });
    let (mut ix, ws) = indexer_with_workers(4);
    for (wi, e) in &w.events {
        ix.apply(ws[*wi], e);
    }
    let req = TokenRequest { tokens: w.sequences[0].1.clone(), ..Default::default() };
    let mut keys = hash_request(&req, 32, 0, &NoUuids).expect("valid request").keys;
    keys.extend((0..128u64).map(|i| RouterKey(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))));
    assert_eq!(ix.find_matches(&keys)[0].device_blocks, 128);
    c.bench_function("router/lookup_256_keys", |b| b.iter(|| ix.find_matches(black_box(&keys))));
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = apply, hash, lookup
}
