//! Event stream benches: encode and decode throughput in blocks per second,
//! text-only and with images, and the cost of `Publisher::publish` while a
//! subscriber has stalled (it must stay flat).
//!
//! Run: `cargo bench --bench main -- events/`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use kvcore::wire::{EncodeOptions, decode_payload, encode_events};
use kvcore::{Engine, EngineConfig, KvEvent, MmContent, MmItemSpec, RequestSpec, TokenRun};
use kvcore::{Publisher, PublisherConfig};

use crate::cpu_time::ThreadCpuTime;

/// One step's events from a warm engine: 64 requests of 16 blocks of 32
/// tokens, each with one 64-token image at token 33 when `images`.
fn step_events(images: bool) -> Vec<KvEvent> {
    let mut e = Engine::new(EngineConfig { block_size_tokens: 32, blocks_device: 2048, ..Default::default() }).unwrap();
    for r in 0..64u32 {
        let mut tokens: Vec<u32> = (0..512).map(|i| 1000 + (r * 7919 + i * 104_729) % 59_000).collect();
        let bytes = r.to_le_bytes();
        let uuid = format!("{r:08}-0000-4000-8000-000000000000");
        if images {
            tokens[33..97].fill(151_655);
        }
        let spec = RequestSpec {
            tokens: &tokens,
            items: if images {
                vec![MmItemSpec { content: MmContent::Bytes(&bytes), runs: vec![TokenRun { start: 33, len: 64 }] }]
            } else {
                Vec::new()
            },
            uuids: images.then(|| vec![Some(uuid.as_bytes())]),
            ..Default::default()
        };
        let a = e.add_request(&spec).unwrap();
        e.commit(a.id, 512).unwrap();
        e.finish(a.id).unwrap();
    }
    e.step();
    e.drain_events()
}

fn blocks(events: &[KvEvent]) -> u64 {
    events.iter().map(|e| if let KvEvent::BlockStored(s) = e { s.keys.len() as u64 } else { 0 }).sum()
}

/// Encode and decode throughput, text-only and with images, with and without
/// token ids, in thread CPU time (see `cpu_time.rs`).
fn codec(c: &mut Criterion<ThreadCpuTime>) {
    let mut g = c.benchmark_group("events/codec");
    for images in [false, true] {
        let events = step_events(images);
        let n = blocks(&events);
        let label = if images { "images" } else { "text" };
        for (opt_label, opts) in [
            ("full", EncodeOptions::default()),
            ("no_token_ids", EncodeOptions { token_ids: false, ..Default::default() }),
        ] {
            let mut payload = Vec::new();
            encode_events(&events, 1.0, Some(0), &opts, &mut payload);
            g.throughput(Throughput::Elements(n));
            g.bench_function(BenchmarkId::new(format!("encode_{opt_label}"), label), |b| {
                let mut out = Vec::with_capacity(payload.len());
                b.iter(|| {
                    out.clear();
                    encode_events(black_box(&events), 1.0, Some(0), &opts, &mut out);
                    black_box(out.len())
                })
            });
            g.bench_function(BenchmarkId::new(format!("decode_{opt_label}"), label), |b| {
                b.iter(|| black_box(decode_payload(black_box(&payload)).unwrap().events.len()))
            });
        }
    }
    g.finish();
}

/// The step-side cost of one `publish` (one step of 16 blocks with an image),
/// at a step's pace (the publisher thread drains between calls): no
/// subscriber, a subscriber that reads, and one that has stalled.
fn publish(c: &mut Criterion) {
    let mut g = c.benchmark_group("events/publish");
    let all = step_events(true);
    let step: Vec<KvEvent> = all[..1].to_vec();
    let ctx = zmq::Context::new();
    for mode in ["no_subscriber", "reading_subscriber", "stalled_subscriber"] {
        let mut p = Publisher::bind(PublisherConfig {
            endpoint: "tcp://127.0.0.1:*".into(),
            send_hwm: 1000,
            queue_capacity: 1024,
            ..Default::default()
        })
        .unwrap();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_rcvhwm(1000).unwrap();
        sub.set_subscribe(b"").unwrap();
        if mode != "no_subscriber" {
            sub.connect(p.endpoint()).unwrap();
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = (mode == "reading_subscriber").then(|| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                sub.set_rcvtimeo(50).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = sub.recv_multipart(0);
                }
            })
        });
        std::thread::sleep(Duration::from_millis(200));
        // Fill the stalled subscriber's queues (both high-water marks and the
        // kernel's socket buffers) before measuring, so the figure is the
        // steady state of a subscriber that stopped long ago.
        for i in 0..20_000u32 {
            p.publish(step.clone());
            if i % 64 == 0 {
                p.flush(Duration::from_secs(10));
            }
        }
        p.flush(Duration::from_secs(10));
        g.throughput(Throughput::Elements(1));
        g.bench_function(mode, |b| {
            // Time only the step-side call; let the publisher thread drain
            // between calls, as it does between the steps of a real engine.
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let batch = step.clone();
                    let start = Instant::now();
                    black_box(p.publish(batch));
                    total += start.elapsed();
                    p.flush(Duration::from_secs(10));
                }
                total
            })
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(r) = reader {
            r.join().unwrap();
        }
        let s = p.stats();
        eprintln!(
            "events/publish/{mode}: reserved {} sent {} dropped (queue full) {}",
            s.batches_reserved, s.batches_handed_to_socket, s.dropped_queue_full
        );
    }
    g.finish();
}

criterion_group! {
    name = codec_benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = codec
}

// Wall clock: the figure is what the step thread waits, and one call is too
// short for a per-call CPU-time syscall to measure it.
criterion_group!(publish_benches, publish);
