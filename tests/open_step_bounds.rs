//! The open step stays bounded whatever the caller calls before a step: its
//! events close into batches of their own at `events_per_step_max`, its block
//! copies stop at `copies_per_step_max` (evictions drop instead of
//! offloading, admissions compute instead of onboarding), and what a drain
//! or a subscriber sees afterwards is a consistent stream.

use std::collections::BTreeMap;
use std::time::Duration;

use kvcore::{Engine, EngineConfig, KvEvent, Publisher, PublisherConfig, RequestSpec, Tier};

const BS: u32 = 4;
const CALLS: usize = 20_000;

fn engine(device: u32, host: u32, event_batches_max: u32) -> Engine {
    Engine::new(EngineConfig {
        block_size_tokens: BS,
        blocks_device: device,
        blocks_host: host,
        event_batches_max,
        ..Default::default()
    })
    .unwrap()
}

/// A prompt of `blocks` full blocks plus one token, distinct per `n`.
fn prompt(n: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * BS + 1).map(|i| n * 1000 + i).collect()
}

/// Checks the bounds after a call, and returns how many calls were made.
fn check(e: &Engine, calls: &mut usize) {
    *calls += 1;
    let c = e.config();
    assert!(
        e.open_event_entries() < c.events_per_step_max(),
        "call {calls}: {} entries open, bound {}",
        e.open_event_entries(),
        c.events_per_step_max()
    );
    assert!(
        e.copies_queued() <= c.copies_per_step_max(),
        "call {calls}: {} copies queued, bound {}",
        e.copies_queued(),
        c.copies_per_step_max()
    );
}

/// Admits, computes and finishes one request, checking after each call.
fn serve(e: &mut Engine, tokens: &[u32], calls: &mut usize) {
    let a = e.add_request(&RequestSpec { tokens, ..Default::default() }).unwrap();
    check(e, calls);
    e.commit(a.id, tokens.len() as u64).unwrap();
    check(e, calls);
    e.finish(a.id).unwrap();
    check(e, calls);
}

/// What a router that applies the events holds: key to tier.
fn apply(model: &mut BTreeMap<[u8; 32], Tier>, events: &[KvEvent]) {
    for ev in events {
        match ev {
            KvEvent::BlockStored(s) => {
                for k in &s.keys {
                    assert!(model.insert(k.0, s.medium).is_none(), "stored twice without a removal");
                }
            }
            KvEvent::BlockRemoved(r) => {
                for k in &r.keys {
                    assert_eq!(model.remove(&k.0), Some(r.medium), "removed from a tier it was not stored in");
                }
            }
            KvEvent::AllBlocksCleared(_) => model.clear(),
        }
    }
}

fn engine_state(e: &Engine) -> BTreeMap<[u8; 32], Tier> {
    e.cached_blocks().map(|b| (b.key.0, b.page.medium)).collect()
}

fn event_seq(ev: &KvEvent) -> u64 {
    match ev {
        KvEvent::BlockStored(s) => s.event_seq,
        KvEvent::BlockRemoved(r) => r.event_seq,
        KvEvent::AllBlocksCleared(c) => c.event_seq,
    }
}

/// Steps once, drains, and checks that the drained stream is gapless,
/// closed early into several batches of the one step, and rebuilds exactly
/// the engine's cache.
fn check_stream(e: &mut Engine) {
    let copies = e.step();
    assert!(copies.len() <= e.config().copies_per_step_max());
    let batches = e.drain_batches();
    assert_eq!(e.counters().event_batches_dropped, 0, "the test keeps every batch");
    assert!(batches.len() > 1, "the open step was closed early");
    assert!(batches.iter().all(|b| b.step_index == 0), "every batch belongs to the one step");
    let mut model = BTreeMap::new();
    let mut next = 0;
    let mut events = 0;
    for b in &batches {
        for ev in &b.events {
            assert_eq!(event_seq(ev), next, "no event lost between early batches");
            next += 1;
        }
        events += b.events.len() as u64;
        apply(&mut model, &b.events);
    }
    assert_eq!(e.counters().events_emitted, events);
    assert_eq!(model, engine_state(e), "the drained stream rebuilds the cache");
}

#[test]
fn admit_commit_finish_loop_without_a_step_stays_bounded() {
    let mut e = engine(64, 0, 1 << 16);
    let mut calls = 0;
    let mut n = 0;
    while calls < CALLS {
        serve(&mut e, &prompt(n, 4), &mut calls);
        n += 1;
    }
    check_stream(&mut e);
}

#[test]
fn clear_loop_without_a_step_stays_bounded() {
    let mut e = engine(64, 0, 1 << 16);
    let mut calls = 0;
    let mut n = 0;
    while calls < CALLS {
        serve(&mut e, &prompt(n % 8, 2), &mut calls);
        e.clear();
        check(&e, &mut calls);
        e.clear();
        check(&e, &mut calls);
        n += 1;
    }
    check_stream(&mut e);
}

#[test]
fn evict_loop_without_a_step_stays_bounded() {
    let mut e = engine(64, 0, 1 << 16);
    let mut calls = 0;
    let mut n = 0;
    while calls < CALLS {
        serve(&mut e, &prompt(n % 16, 4), &mut calls);
        e.evict(3);
        check(&e, &mut calls);
        n += 1;
    }
    check_stream(&mut e);
}

#[test]
fn grow_loop_without_a_step_stays_bounded() {
    let mut e = engine(64, 0, 1 << 16);
    let mut calls = 0;
    let mut n = 0;
    while calls < CALLS {
        let tokens = prompt(n, 2);
        let a = e.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }).unwrap();
        check(&e, &mut calls);
        let mut len = tokens.len() as u64;
        for g in 0..8u32 {
            let more: Vec<u32> = (0..BS).map(|i| n * 1000 + 500 + g * BS + i).collect();
            e.grow(a.id, &more).unwrap();
            check(&e, &mut calls);
            len += u64::from(BS);
            e.commit(a.id, len).unwrap();
            check(&e, &mut calls);
        }
        e.finish(a.id).unwrap();
        check(&e, &mut calls);
        n += 1;
    }
    check_stream(&mut e);
}

/// Offloads and onboards, back and forth between the tiers, without a step:
/// the copies stop at their bound, the moves they had no room for became
/// drops and recomputation, and the events still say where every block is.
#[test]
fn tier_moves_without_a_step_keep_their_copies_bounded() {
    for partial_reuse in [false, true] {
        let mut e = Engine::new(EngineConfig {
            block_size_tokens: BS,
            blocks_device: 16,
            blocks_host: 16,
            partial_reuse,
            event_batches_max: 1 << 16,
            ..Default::default()
        })
        .unwrap();
        let mut calls = 0;
        let mut n = 0;
        while calls < CALLS {
            // Six prompts of four blocks over 16 device pages: every admission
            // offloads some and onboards others.
            let mut tokens = prompt(n % 6, 4);
            if partial_reuse {
                // A last block that shares a prefix with a cached sibling.
                tokens.truncate(4 * BS as usize - 1);
                tokens.extend([n % 3, 7]);
            }
            serve(&mut e, &tokens, &mut calls);
            n += 1;
        }
        let c = e.counters();
        assert!(c.blocks_onboarded > 0 && c.blocks_offloaded > 0, "{c:?}");
        assert_eq!(e.copies_queued(), e.config().copies_per_step_max(), "the loop reached the copy bound");
        // At the bound, evictions drop instead of offloading.
        assert!(c.blocks_evicted_device > c.blocks_offloaded, "{c:?}");
        check_stream(&mut e);
        // A step empties the queue, and moves go on as usual.
        let before = e.counters().blocks_offloaded + e.counters().blocks_onboarded;
        let mut calls = 0;
        for n in 0..12 {
            serve(&mut e, &prompt(n % 6, 4), &mut calls);
            e.step();
        }
        let c = e.counters();
        assert!(c.blocks_offloaded + c.blocks_onboarded > before, "tier moves resume after a step: {c:?}");
    }
}

/// With few batches kept, the early batches beyond the bound are dropped
/// and counted, the drain sees a gap in `event_seq` (never a wrong state),
/// and a snapshot heals it.
#[test]
fn dropped_early_batches_are_counted_gaps_that_a_snapshot_heals() {
    let mut e = engine(64, 0, 2);
    let mut calls = 0;
    let mut n = 0;
    while calls < CALLS {
        serve(&mut e, &prompt(n, 4), &mut calls);
        n += 1;
    }
    e.step();
    let dropped = e.counters().event_batches_dropped;
    assert!(dropped > 0, "more early batches than kept");
    let batches = e.drain_batches();
    assert!(batches.len() <= 2);
    let first = event_seq(&batches[0].events[0]);
    assert!(first > 0, "the drain starts after a gap in event_seq");
    for pair in batches.windows(2) {
        let last = event_seq(pair[0].events.last().unwrap());
        assert_eq!(event_seq(&pair[1].events[0]), last + 1, "kept batches are contiguous");
    }
    let mut model = BTreeMap::new();
    apply(&mut model, &e.snapshot());
    assert_eq!(model, engine_state(&e), "a snapshot heals the gap");
}

/// With a publisher attached and nothing kept for the drains, the early
/// batches are published as they close, before any step.
#[test]
fn early_batches_go_to_the_publisher_before_the_step() {
    let mut e = engine(64, 0, 0);
    e.attach_publisher(
        Publisher::bind(PublisherConfig {
            endpoint: "tcp://127.0.0.1:*".into(),
            topic: b"kv".to_vec(),
            heartbeat_ms: 0,
            ..Default::default()
        })
        .unwrap(),
    );
    let mut calls = 0;
    let mut n = 0;
    while calls < CALLS {
        serve(&mut e, &prompt(n, 4), &mut calls);
        n += 1;
    }
    let p = e.publisher().unwrap();
    assert!(p.flush(Duration::from_secs(5)));
    let published = p.next_seq();
    assert!(published > 1, "early batches published before the step: {published}");
    assert_eq!(p.stats().dropped_queue_full, 0);
    assert_eq!(e.counters().event_batches_dropped, 0, "nothing is kept, so nothing is dropped");
    e.step();
    assert!(e.publisher().unwrap().next_seq() > published, "the step publishes the rest");
}
