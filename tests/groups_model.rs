//! Model-based tests of a hybrid engine (one full-attention group and one or
//! two sliding windows): random operation sequences, checked after every
//! operation against a reference model of what each group must hold.
//!
//! The model keeps, per request, its tokens, how many are computed, and the
//! key of each block (computed here from the public key recipe); per group
//! it asks the engine only what is cached (`cached_medium_group`), never how
//! it decided. From that it predicts:
//!
//! - the reuse decision of every admission: the largest `k` such that
//!   group 0 holds blocks `0..k` and each window the blocks from the first
//!   one the next token reads (`(k*B + 1 - window) / B`) to `k`;
//! - each block table: as long as the request's blocks, the null page (0)
//!   in a window's table exactly before the first block its next token
//!   reads, real pages from there on, and a page shared by two requests only
//!   where both hold the same key at the same place;
//! - early freeing: a window's referenced blocks are exactly the distinct
//!   pages that running requests' tables name, so a released block is not
//!   held, and a released block that was cached stays cached (reusable);
//!
//! - the events: replaying every group's `BlockStored` and `BlockRemoved`
//!   (each naming its group and kind) gives, after each step, exactly the
//!   blocks and tiers each group holds;
//!
//! and `Engine::check_invariants` runs after every operation.

use std::collections::{HashMap, HashSet};

use kvcore::{
    BlockKey, Engine, EngineConfig, GroupConfig, GroupKind, KeyScope, KvEvent, KvGroup, RequestId, RequestSpec, Tier,
};
use kvcore::{block_key, root_key};
use proptest::prelude::*;

const BS: u32 = 4;

#[derive(Clone, Debug)]
enum Op {
    Admit { family: u32, shared: usize, tail: Vec<u32> },
    Grow { req: usize, n: u32 },
    Commit { req: usize, fraction: u8 },
    Finish { req: usize },
    Cancel { req: usize },
    Evict { n: usize },
    Clear,
    Step,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3, 1usize..28, prop::collection::vec(1u32..5, 0..8))
            .prop_map(|(family, shared, tail)| Op::Admit { family, shared, tail }),
        2 => (0usize..8, 1u32..9).prop_map(|(req, n)| Op::Grow { req, n }),
        4 => (0usize..8, 0u8..=4).prop_map(|(req, fraction)| Op::Commit { req, fraction }),
        2 => (0usize..8).prop_map(|req| Op::Finish { req }),
        1 => (0usize..8).prop_map(|req| Op::Cancel { req }),
        1 => (0usize..6).prop_map(|n| Op::Evict { n }),
        1 => Just(Op::Clear),
        2 => Just(Op::Step),
    ]
}

/// A running request as the model knows it.
struct Running {
    id: RequestId,
    tokens: Vec<u32>,
    computed: u32,
    /// Per window, the blocks that are private copies (their key was cached
    /// already when they were computed, or a clear forgot it since), which
    /// are freed, not cached, when released.
    private: Vec<HashSet<u32>>,
}

fn keys_of(tokens: &[u32]) -> Vec<BlockKey> {
    let mut parent = root_key(&KeyScope { block_size_tokens: BS, lora_id: None, cache_salt: None });
    tokens
        .chunks_exact(BS as usize)
        .map(|b| {
            parent = block_key(&parent, b, &[]);
            parent
        })
        .collect()
}

fn first_block(window: u32, computed: u32) -> u32 {
    (computed + 1).saturating_sub(window) / BS
}

fn config(windows: &[(u32, u32)], host: u32, device_full: u32) -> EngineConfig {
    let mut groups =
        vec![GroupConfig { kind: GroupKind::FullAttention, blocks_device: device_full, blocks_host: host }];
    groups.extend(windows.iter().map(|&(window_tokens, device)| GroupConfig {
        kind: GroupKind::SlidingWindow { window_tokens },
        blocks_device: device,
        blocks_host: host,
    }));
    EngineConfig {
        block_size_tokens: BS,
        blocks_device: groups.iter().map(|g| g.blocks_device).sum(),
        blocks_host: groups.iter().map(|g| g.blocks_host).sum(),
        requests_max: 8,
        tokens_per_request_max: 128,
        groups,
        ..EngineConfig::default()
    }
}

/// The reuse the model predicts for a prompt: the largest `k` every group
/// can serve, from what each group holds now.
fn predicted_match(engine: &Engine, windows: &[(u32, u32)], keys: &[BlockKey], prompt_len: u32) -> u32 {
    let max = ((prompt_len - 1) / BS) as usize;
    let held = |g: usize, i: usize| engine.cached_medium_group(&keys[i], g).is_some();
    let full = (0..max).take_while(|&i| held(0, i)).count();
    (0..=full as u32)
        .rev()
        .find(|&k| {
            windows
                .iter()
                .enumerate()
                .all(|(w, &(window, _))| (first_block(window, k * BS)..k).all(|i| held(w + 1, i as usize)))
        })
        .unwrap_or(0)
}

fn check_tables(engine: &Engine, windows: &[(u32, u32)], running: &[Running]) {
    for g in 0..engine.groups() {
        // Page -> the key held there and the place, across requests.
        let mut pages: HashMap<u32, (Option<BlockKey>, usize)> = HashMap::new();
        for r in running {
            let table = engine.block_table_group(r.id, g).expect("a live request has a table per group");
            let keys = keys_of(&r.tokens);
            assert_eq!(table.len(), r.tokens.len().div_ceil(BS as usize), "group {g}: a page per block");
            let first = match g {
                0 => 0,
                _ => first_block(windows[g - 1].0, r.computed) as usize,
            };
            for (i, &page) in table.iter().enumerate() {
                if i < first {
                    assert_eq!(page, 0, "group {g}: block {i} left the window: the null page");
                    continue;
                }
                if g > 0 {
                    assert_ne!(page, 0, "group {g}: block {i} is in the window: a real page");
                }
                // Only full, computed blocks may be shared (as the same key).
                let key = (i < (r.computed / BS) as usize).then(|| keys[i]);
                if let Some(&(other, place)) = pages.get(&page) {
                    assert!(key.is_some() && other == key && place == i, "group {g}: page {page} shared by two blocks");
                }
                pages.insert(page, (key, i));
            }
        }
        let usage = engine.group_usage(g).expect("the group exists");
        assert_eq!(
            usage.blocks_referenced as usize,
            pages.len(),
            "group {g}: the blocks held are exactly those the tables name"
        );
    }
    assert!(engine.group_usage(engine.groups()).is_none());
    assert!(engine.block_table_group(running.first().map_or(RequestId::default(), |r| r.id), engine.groups()).is_err());
}

fn run_ops(windows: &[(u32, u32)], host: u32, ops: Vec<Op>) {
    let mut engine = Engine::new(config(windows, host, 24)).expect("valid config");
    let mut running: Vec<Running> = Vec::new();
    let kinds: Vec<GroupKind> = config(windows, host, 24).effective_groups().iter().map(|g| g.kind).collect();
    // What each group's events say it holds: key -> tier.
    let mut advertised: Vec<HashMap<BlockKey, Tier>> = vec![HashMap::new(); kinds.len()];
    for op in ops {
        match op {
            Op::Admit { family, shared, tail } => {
                let mut tokens: Vec<u32> = (0..shared as u32).map(|i| 10 + family * 100 + i).collect();
                tokens.extend(tail);
                let keys = keys_of(&tokens);
                let quiet = engine.copies_queued() == 0;
                let predicted = predicted_match(&engine, windows, &keys, tokens.len() as u32);
                let spec = RequestSpec { tokens: &tokens, ..RequestSpec::default() };
                let before: Vec<_> = (0..engine.groups()).map(|g| engine.group_usage(g).unwrap()).collect();
                match engine.add_request(&spec) {
                    Ok(a) => {
                        // The copies of a host match need room in the step;
                        // with copies queued already the match may stop early.
                        if quiet {
                            assert_eq!(a.tokens_cached, predicted * BS, "reuse decision for {tokens:?}");
                        } else {
                            assert!(a.tokens_cached <= predicted * BS, "reuse never exceeds what every group holds");
                        }
                        running.push(Running {
                            id: a.id,
                            tokens,
                            computed: a.tokens_cached,
                            private: vec![HashSet::new(); windows.len()],
                        });
                    }
                    Err(_) => {
                        let after: Vec<_> = (0..engine.groups()).map(|g| engine.group_usage(g).unwrap()).collect();
                        assert_eq!(before, after, "a refused admission leaves every group as it was");
                    }
                }
            }
            Op::Grow { req, n } => {
                if running.is_empty() {
                    continue;
                }
                let i = req % running.len();
                let grown: Vec<u32> = (0..n).map(|t| 50 + t).collect();
                if engine.grow(running[i].id, &grown).is_ok() {
                    running[i].tokens.extend(grown);
                }
            }
            Op::Commit { req, fraction } => {
                if running.is_empty() {
                    continue;
                }
                let i = req % running.len();
                let r = &mut running[i];
                let len = r.tokens.len() as u32;
                let target = r.computed + (len - r.computed) * u32::from(fraction) / 4;
                let keys = keys_of(&r.tokens);
                for (w, private) in r.private.iter_mut().enumerate() {
                    for b in r.computed / BS..target / BS {
                        if engine.cached_medium_group(&keys[b as usize], w + 1).is_some() {
                            private.insert(b);
                        }
                    }
                }
                engine.commit(r.id, u64::from(target)).expect("a valid commit");
                let before = r.computed;
                r.computed = target;
                // Blocks that fell out of a window this commit are released,
                // and, being computed and indexed, stay cached in the group.
                for (w, &(window, _)) in windows.iter().enumerate() {
                    for b in
                        (first_block(window, before)..first_block(window, target)).filter(|b| !r.private[w].contains(b))
                    {
                        assert!(
                            engine.cached_medium_group(&keys[b as usize], w + 1).is_some(),
                            "group {}: block {b} released early stays reusable",
                            w + 1
                        );
                    }
                }
            }
            Op::Finish { req } => {
                if running.is_empty() {
                    continue;
                }
                let r = running.swap_remove(req % running.len());
                engine.finish(r.id).expect("a live request");
            }
            Op::Cancel { req } => {
                if running.is_empty() {
                    continue;
                }
                let r = running.swap_remove(req % running.len());
                engine.cancel(r.id).expect("a live request");
            }
            Op::Evict { n } => {
                engine.evict(n);
            }
            Op::Clear => {
                engine.clear();
                for r in &mut running {
                    for private in &mut r.private {
                        private.extend(0..r.computed / BS);
                    }
                }
                for g in 0..engine.groups() {
                    assert_eq!(engine.cached_blocks_group(g).len(), 0, "group {g}: a clear forgets every key");
                }
            }
            Op::Step => {
                let copies = engine.step();
                for event in engine.drain_events() {
                    let group = |g: Option<KvGroup>| {
                        let g = g.expect("a hybrid engine's block events name their group");
                        assert_eq!(g.kind, kinds[g.index as usize], "an event names its group's kind");
                        g.index as usize
                    };
                    match event {
                        KvEvent::BlockStored(e) => {
                            let g = group(e.group);
                            for key in e.keys {
                                assert!(advertised[g].insert(key, e.medium).is_none(), "group {g}: stored once");
                            }
                        }
                        KvEvent::BlockRemoved(e) => {
                            let g = group(e.group);
                            for key in e.keys {
                                assert_eq!(advertised[g].remove(&key), Some(e.medium), "group {g}: removed as stored");
                            }
                        }
                        KvEvent::AllBlocksCleared(_) => advertised.iter_mut().for_each(HashMap::clear),
                    }
                }
                for (g, held) in advertised.iter().enumerate() {
                    let cached: HashMap<BlockKey, Tier> =
                        engine.cached_blocks_group(g).map(|b| (b.key, b.page.medium)).collect();
                    assert_eq!(&cached, held, "group {g}: the events say what the group holds");
                }
                for c in &copies {
                    assert!((c.group as usize) < engine.groups(), "a copy names a group the engine has");
                    let pages = config(windows, host, 24).effective_groups()[c.group as usize];
                    let bound = |t: Tier| if t == Tier::Device { pages.blocks_device } else { pages.blocks_host };
                    assert!(c.src.page < bound(c.src.medium) && c.dst.page < bound(c.dst.medium), "pages of its group");
                }
            }
        }
        engine.check_invariants();
        check_tables(&engine, windows, &running);
    }
    // Every request gone, no group holds a block.
    for r in running {
        engine.finish(r.id).expect("a live request");
    }
    for g in 0..engine.groups() {
        assert_eq!(engine.group_usage(g).unwrap().blocks_referenced, 0, "group {g}: nothing held at the end");
    }
    engine.check_invariants();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// Two groups: full attention and a window of 8 tokens (two blocks).
    #[test]
    #[cfg_attr(miri, ignore = "proptest is too slow under miri")]
    fn two_groups_agree_with_the_model(ops in prop::collection::vec(op_strategy(), 1..80)) {
        run_ops(&[(8, 16)], 0, ops);
    }

    /// Three groups: full attention and windows of 5 and 13 tokens (not
    /// multiples of the block size), with a host tier in every group.
    #[test]
    #[cfg_attr(miri, ignore = "proptest is too slow under miri")]
    fn three_groups_agree_with_the_model(ops in prop::collection::vec(op_strategy(), 1..80)) {
        run_ops(&[(5, 12), (13, 20)], 6, ops);
    }
}

/// A hybrid engine's call log records its groups and replays: the replay
/// builds the same groups (its report names them) and every call answers as
/// logged, block tables of every group included. Method: record a fixed
/// serving script into a file, replay it with `kvcore::replay_calls`.
#[test]
fn a_hybrid_call_log_replays() {
    let windows = [(5, 12), (13, 20)];
    let config = config(&windows, 6, 24);
    let mut engine = Engine::new(config.clone()).expect("valid config");
    let dir = std::env::temp_dir().join(format!("kvcore-groups-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("calls.kvclog");
    engine.record_calls_to_file(&path).unwrap();
    let prompt: Vec<u32> = (0..23).collect();
    for round in 0..4u32 {
        let a = engine.add_request(&RequestSpec { tokens: &prompt, ..RequestSpec::default() }).unwrap();
        engine.commit(a.id, 23).unwrap();
        engine.grow(a.id, &[100 + round, 101, 102, 103, 104]).unwrap();
        engine.commit(a.id, 28).unwrap();
        engine.step();
        engine.finish(a.id).unwrap();
        engine.evict(usize::from(round == 2) * 3);
        engine.step();
    }
    let calls = engine.stop_recording().unwrap();
    let report = kvcore::replay_calls(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(report.config, config, "the log carries the groups");
    assert_eq!(report.divergence, None, "every call answers as logged");
    assert_eq!(report.calls_matched, calls);
}

/// Runs `ops` on two engines side by side: one configured without groups,
/// one with a single full-attention group listed. Everything they answer is
/// the same, and their events differ only in naming the group.
fn one_listed_group_is_the_default(ops: Vec<Op>) {
    let plain = EngineConfig {
        block_size_tokens: BS,
        blocks_device: 24,
        blocks_host: 6,
        requests_max: 8,
        tokens_per_request_max: 128,
        ..EngineConfig::default()
    };
    let listed = EngineConfig {
        groups: vec![GroupConfig { kind: GroupKind::FullAttention, blocks_device: 24, blocks_host: 6 }],
        ..plain.clone()
    };
    let (mut a, mut b) = (Engine::new(plain).unwrap(), Engine::new(listed).unwrap());
    let mut ids: Vec<(RequestId, RequestId, u32, u32)> = Vec::new();
    for op in ops {
        match op {
            Op::Admit { family, shared, tail } => {
                let mut tokens: Vec<u32> = (0..shared as u32).map(|i| 10 + family * 100 + i).collect();
                tokens.extend(tail);
                let spec = RequestSpec { tokens: &tokens, ..RequestSpec::default() };
                match (a.add_request(&spec), b.add_request(&spec)) {
                    (Ok(x), Ok(y)) => {
                        assert_eq!((x.tokens_cached, x.tokens_onboarded), (y.tokens_cached, y.tokens_onboarded));
                        assert_eq!(a.block_table(x.id).unwrap(), b.block_table_group(y.id, 0).unwrap());
                        ids.push((x.id, y.id, tokens.len() as u32, x.tokens_cached));
                    }
                    (Err(x), Err(y)) => assert_eq!(x, y),
                    (x, y) => panic!("{x:?} against {y:?}"),
                }
            }
            Op::Grow { req, n } if !ids.is_empty() => {
                let i = req % ids.len();
                let grown: Vec<u32> = (0..n).map(|t| 50 + t).collect();
                let (x, y) = (a.grow(ids[i].0, &grown), b.grow(ids[i].1, &grown));
                assert_eq!(x, y);
                if x.is_ok() {
                    ids[i].2 += n;
                }
            }
            Op::Commit { req, fraction } if !ids.is_empty() => {
                let i = req % ids.len();
                let (_, _, len, done) = ids[i];
                let target = done + (len - done) * u32::from(fraction) / 4;
                assert_eq!(a.commit(ids[i].0, u64::from(target)), b.commit(ids[i].1, u64::from(target)));
                ids[i].3 = target;
            }
            Op::Finish { req } | Op::Cancel { req } if !ids.is_empty() => {
                let (x, y, _, _) = ids.swap_remove(req % ids.len());
                assert_eq!(a.finish(x), b.finish(y));
            }
            Op::Evict { n } => assert_eq!(a.evict(n), b.evict(n)),
            Op::Clear => {
                a.clear();
                b.clear();
            }
            Op::Step => assert_eq!(a.step(), b.step()),
            _ => {}
        }
        let strip = |events: Vec<KvEvent>, named: bool| -> Vec<KvEvent> {
            events
                .into_iter()
                .map(|e| match e {
                    KvEvent::BlockStored(mut s) => {
                        assert_eq!(s.group.is_some(), named, "only a listed group is named");
                        s.group = None;
                        KvEvent::BlockStored(s)
                    }
                    KvEvent::BlockRemoved(mut r) => {
                        assert_eq!(r.group.is_some(), named, "only a listed group is named");
                        r.group = None;
                        KvEvent::BlockRemoved(r)
                    }
                    other => other,
                })
                .collect()
        };
        assert_eq!(strip(a.drain_events(), false), strip(b.drain_events(), true));
        assert_eq!(a.counters(), b.counters());
        assert_eq!(a.cached_blocks().collect::<Vec<_>>(), b.cached_blocks().collect::<Vec<_>>());
        b.check_invariants();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A configuration listing one full-attention group behaves as the
    /// default configuration, event for event, except that it names its group.
    #[test]
    #[cfg_attr(miri, ignore = "proptest is too slow under miri")]
    fn a_single_listed_group_matches_the_default(ops in prop::collection::vec(op_strategy(), 1..80)) {
        one_listed_group_is_the_default(ops);
    }
}
