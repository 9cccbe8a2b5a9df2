//! The engine's per-block cost against the bare cryptographic hash its keys
//! use (issue target: all-in cost per block at most 1.5 times the bare hash).
//!
//! Workload (`kvcore::bench`, shared with `kvcore core-bench`): a 4096-token
//! prompt, block size 32 (128 blocks), one 1024-token image given by its
//! 32-byte digest, admitted, committed in one go and finished; cold (empty
//! cache) and warm (the same prompt cached, so admission matches 127 blocks).

use criterion::{BatchSize, Criterion, Throughput, criterion_group};

use std::time::Duration;

use crate::cpu_time::{ThreadCpuTime, thread_cpu_time};
use kvcore_tools::bench::{BLOCK_SIZE as BS, PROMPT, PromptWorkload};

fn bench(c: &mut Criterion<ThreadCpuTime>) {
    let w = PromptWorkload::default();
    let tokens = w.tokens.clone();
    let mut g = c.benchmark_group("engine_4096_tokens");
    g.throughput(Throughput::Elements((PROMPT / BS) as u64));
    // Cold: an empty cache (nothing matches), on a long-lived engine whose
    // memory is warm: each timed admission is followed, untimed, by a clear.
    g.bench_function("admit_commit_cold", |b| {
        let mut e = PromptWorkload::engine(2, 0);
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = thread_cpu_time();
                w.serve(&mut e, &tokens);
                total += thread_cpu_time() - start;
                e.clear();
                e.step();
                e.drain_events();
            }
            total
        })
    });
    // Cold under pressure: every prompt is new (its first token differs) on an
    // engine with room for two prompts, so each admission also evicts the
    // blocks of the prompt before last, Removed events included: the steady
    // state of a full cache.
    g.bench_function("admit_commit_cold_evicting", |b| {
        let mut e = PromptWorkload::engine(2, 1);
        let mut fresh = tokens.clone();
        let mut n = 0u32;
        b.iter(|| {
            n = n.wrapping_add(1);
            fresh[0] = n;
            w.serve(&mut e, &fresh)
        })
    });
    g.bench_function("admit_commit_warm", |b| {
        b.iter_batched_ref(
            || {
                let mut e = PromptWorkload::engine(2, 0);
                w.serve(&mut e, &tokens);
                e
            },
            |e| w.serve(e, &tokens),
            BatchSize::LargeInput,
        )
    });
    // The bare hash over the same bytes: the 128-link SHA-256 chain alone.
    g.bench_function("bare_sha256_chain", |b| b.iter(|| w.bare_chain()));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = bench
}
