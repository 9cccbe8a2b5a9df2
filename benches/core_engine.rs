//! The engine's per-block cost against the bare cryptographic hash its keys
//! use (issue target: all-in cost per block at most 1.5 times the bare hash).
//!
//! Workload: a 4096-token prompt, block size 32 (128 blocks), one 1024-token
//! image given by its 32-byte digest (so the image's own BLAKE3 is not
//! measured here), admitted, committed in one go and finished; cold (empty
//! cache) and warm (the same prompt cached, so admission matches 127 blocks).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group};

use std::time::Duration;

use crate::cpu_time::{ThreadCpuTime, thread_cpu_time};
use kvcore::keys::{BlockKey, ImageDigest, ImageRun, KeyScope, block_key, root_key};
use kvcore::{Engine, EngineConfig, MmContent, MmItemSpec, RequestSpec, TokenRun};

const BS: u32 = 32;
const PROMPT: u32 = 4096;
const IMAGE_START: u32 = 512;
const IMAGE_LEN: u32 = 1024;

fn prompt() -> Vec<u32> {
    (0..PROMPT)
        .map(|i| if (IMAGE_START..IMAGE_START + IMAGE_LEN).contains(&i) { 151_655 } else { 1000 + (i * 7919) % 50_000 })
        .collect()
}

fn config() -> EngineConfig {
    EngineConfig { block_size_tokens: BS, blocks_device: 2 * PROMPT / BS, ..Default::default() }
}

fn serve(engine: &mut Engine, tokens: &[u32], digest: &[u8; 32]) {
    let spec = RequestSpec {
        tokens,
        items: vec![MmItemSpec {
            content: MmContent::Digest(digest),
            runs: vec![TokenRun { start: IMAGE_START, len: IMAGE_LEN }],
        }],
        ..Default::default()
    };
    let a = engine.add_request(&spec).expect("capacity is ample");
    engine.commit(a.id, PROMPT as u64).expect("live");
    engine.finish(a.id).expect("live");
    engine.step();
    black_box(engine.drain_events());
}

fn bench(c: &mut Criterion<ThreadCpuTime>) {
    let tokens = prompt();
    let digest = *blake3::hash(b"image").as_bytes();
    let mut g = c.benchmark_group("engine_4096_tokens");
    g.throughput(Throughput::Elements((PROMPT / BS) as u64));
    // Cold: an empty cache (nothing matches), on a long-lived engine whose
    // memory is warm: each timed admission is followed, untimed, by a clear.
    g.bench_function("admit_commit_cold", |b| {
        let mut e = Engine::new(config()).expect("valid");
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = thread_cpu_time();
                serve(&mut e, &tokens, &digest);
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
        let mut e = Engine::new(EngineConfig { blocks_device: 2 * PROMPT / BS + 1, ..config() }).expect("valid");
        let mut fresh = tokens.clone();
        let mut n = 0u32;
        b.iter(|| {
            n = n.wrapping_add(1);
            fresh[0] = n;
            serve(&mut e, &fresh, &digest)
        })
    });
    g.bench_function("admit_commit_warm", |b| {
        b.iter_batched_ref(
            || {
                let mut e = Engine::new(config()).expect("valid");
                serve(&mut e, &tokens, &digest);
                e
            },
            |e| serve(e, &tokens, &digest),
            BatchSize::LargeInput,
        )
    });
    // The bare hash over the same bytes: the 128-link SHA-256 chain alone.
    let root = root_key(&KeyScope { block_size_tokens: BS, ..Default::default() });
    let d = ImageDigest(digest);
    g.bench_function("bare_sha256_chain", |b| {
        b.iter(|| {
            let mut parent: BlockKey = root;
            for i in 0..PROMPT / BS {
                let s = i * BS;
                let run =
                    [ImageRun { digest: d, item_offset: s.saturating_sub(IMAGE_START), block_offset: 0, len: BS }];
                let in_image = (IMAGE_START..IMAGE_START + IMAGE_LEN).contains(&s);
                parent = block_key(
                    &parent,
                    black_box(&tokens[s as usize..(s + BS) as usize]),
                    if in_image { &run } else { &[] },
                );
            }
            black_box(parent)
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = bench
}
