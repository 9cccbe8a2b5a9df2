//! The engine's per-block cost against the bare cryptographic hash its keys
//! use (issue target: all-in cost per block at most 1.5 times the bare hash).
//!
//! Workload: a 4096-token prompt, block size 32 (128 blocks), one 1024-token
//! image given by its 32-byte digest (so the image's own BLAKE3 is not
//! measured here), admitted, committed in one go and finished; cold (empty
//! cache) and warm (the same prompt cached, so admission matches 127 blocks).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group};
use kvcore::keys::{BlockKey, ImageDigest, ImageRun, KeyScope, block_key, root_key};
use kvcore::{Engine, EngineConfig, MmContent, MmItemSpec, RequestSpec, TokenRun};

const BS: u32 = 32;
const PROMPT: u32 = 4096;
const IMAGE_START: u32 = 512;
const IMAGE_LEN: u32 = 1024;

fn prompt() -> Vec<u32> {
    (0..PROMPT).map(|i| if (IMAGE_START..IMAGE_START + IMAGE_LEN).contains(&i) { 151_655 } else { 1000 + (i * 7919) % 50_000 }).collect()
}

/// Prompts served per fresh engine in the cold bench: all fit without eviction.
const COLD_CHUNK: u64 = 64;

fn config() -> EngineConfig {
    EngineConfig { block_size_tokens: BS, blocks_device: (COLD_CHUNK as u32) * PROMPT / BS, ..Default::default() }
}

fn serve(engine: &mut Engine, tokens: &[u32], digest: &[u8; 32]) {
    let spec = RequestSpec {
        tokens,
        items: vec![MmItemSpec { content: MmContent::Digest(digest), runs: vec![TokenRun { start: IMAGE_START, len: IMAGE_LEN }] }],
        ..Default::default()
    };
    let a = engine.add_request(&spec).expect("capacity is ample");
    engine.commit(a.id, PROMPT as u64).expect("live");
    engine.finish(a.id).expect("live");
    engine.step();
    black_box(engine.drain_events());
}

fn bench(c: &mut Criterion) {
    let tokens = prompt();
    let digest = *blake3::hash(b"image").as_bytes();
    let mut g = c.benchmark_group("engine_4096_tokens");
    g.throughput(Throughput::Elements((PROMPT / BS) as u64));
    // Cold: every prompt is new (its first token differs), on an engine whose
    // memory has been touched, so that the figure is the steady-state cost of
    // a miss, not page faults of a fresh allocation.
    g.bench_function("admit_commit_cold", |b| {
        b.iter_custom(|iters| {
            let mut total = std::time::Duration::ZERO;
            let mut done = 0;
            let mut fresh = tokens.clone();
            while done < iters {
                let mut e = Engine::new(config()).expect("valid");
                let chunk = (iters - done).min(COLD_CHUNK);
                for i in 0..COLD_CHUNK {
                    fresh[0] = u32::MAX - i as u32;
                    serve(&mut e, &fresh, &digest);
                }
                e.clear();
                e.step();
                e.drain_events();
                let start = std::time::Instant::now();
                for i in 0..chunk {
                    fresh[0] = i as u32;
                    serve(&mut e, &fresh, &digest);
                }
                total += start.elapsed();
                done += chunk;
            }
            total
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
                let run = [ImageRun { digest: d, item_offset: s.saturating_sub(IMAGE_START), block_offset: 0, len: BS }];
                let in_image = (IMAGE_START..IMAGE_START + IMAGE_LEN).contains(&s);
                parent = block_key(&parent, black_box(&tokens[s as usize..(s + BS) as usize]), if in_image { &run } else { &[] });
            }
            black_box(parent)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
