//! Model-based proptests of the tier state machine (device pool, pinned host
//! tier, offload, onboard, host eviction), driven through the Engine API on
//! the CPU path: the copies `Engine::step` returns are applied with the CPU
//! twin of the copy kernel to a byte model of both tiers, and a forward pass
//! writes each token's KV as a value that depends on the whole prefix.
//!
//! Checked after every step:
//! 1. no key is cached in two tiers at once, and Stored/Removed events
//!    balance per key and per medium (a router replaying the events holds
//!    exactly the engine's cache, tier included);
//! 2. no lost block: every cached block's page holds the KV it was stored
//!    with, wherever it moved since, and every live request's computed tokens
//!    are intact in its pages;
//! 3. the engine's own invariants.
//!
//! Tests also check that partial reuse copies a prefix into a fresh block,
//! and what `offload_first` trades: fewer copy waves for dropped blocks.

use std::collections::HashMap;

use kvcore::BlockKey;
use kvcore::Tier;
use kvcore::gpu::{BlockGeometry, CpuKvPool, copy_blocks_cpu};
use kvcore::{BlockCopy, copy_waves};
use kvcore::{Engine, EngineConfig, KvEvent, RequestId, RequestSpec};
use proptest::prelude::*;

const BS: u32 = 4;

#[derive(Clone, Debug)]
enum Op {
    Admit { base: u8, len: u8, twist: Option<u8> },
    Grow { req: u8, tokens: u8 },
    Step,
    Finish { req: u8 },
    Evict { n: u8 },
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 1u8..24, proptest::option::weighted(0.3, 0u8..24))
            .prop_map(|(base, len, twist)| Op::Admit { base, len, twist }),
        1 => (any::<u8>(), 1u8..6).prop_map(|(req, tokens)| Op::Grow { req, tokens }),
        4 => Just(Op::Step),
        3 => any::<u8>().prop_map(|req| Op::Finish { req }),
        1 => (1u8..4).prop_map(|n| Op::Evict { n }),
        1 => Just(Op::Clear).prop_filter("rare", |_| true),
    ]
}

/// The KV value of the token at `pos`: a hash of the whole prefix, so that a
/// block's data identifies its chain position, not only its own tokens.
fn kv_values(tokens: &[u32]) -> Vec<u32> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    tokens
        .iter()
        .map(|t| {
            h = (h ^ *t as u64).wrapping_mul(0x0100_0000_01b3);
            (h >> 17) as u32
        })
        .collect()
}

struct Harness {
    engine: Engine,
    geometry: BlockGeometry,
    device: CpuKvPool,
    host: Option<CpuKvPool>,
    live: Vec<(RequestId, Vec<u32>)>,
    /// Events replayed: the tier each key is advertised in, per a router.
    advertised: HashMap<BlockKey, Tier>,
    /// KV each key was stored with.
    expected: HashMap<BlockKey, [u8; 16]>,
    /// The copies of the last step.
    last_copies: Vec<BlockCopy>,
}

impl Harness {
    fn new(blocks_device: u32, blocks_host: u32, partial_reuse: bool, offload_first: bool) -> Self {
        let engine = Engine::new(EngineConfig {
            block_size_tokens: BS,
            blocks_device,
            blocks_host,
            partial_reuse,
            offload_first,
            requests_max: 64,
            ..Default::default()
        })
        .unwrap();
        let geometry = BlockGeometry { regions: 1, block_bytes: 4 * BS as u64, planes: 1, tokens_per_block: BS };
        Self {
            device: CpuKvPool::zeroed(&geometry, blocks_device),
            host: (blocks_host > 0).then(|| CpuKvPool::zeroed(&geometry, blocks_host)),
            engine,
            geometry,
            live: Vec::new(),
            advertised: HashMap::new(),
            expected: HashMap::new(),
            last_copies: Vec::new(),
        }
    }

    fn page_bytes(&self, medium: Tier, page: u32) -> [u8; 16] {
        let pool = match medium {
            Tier::Device => &self.device,
            Tier::Host => self.host.as_ref().expect("host pages exist only with a host tier"),
        };
        pool.data[0][page as usize * 16..page as usize * 16 + 16].try_into().unwrap()
    }

    /// Closes a step: copies, checks, forward pass, commit, event replay.
    fn step(&mut self) {
        let copies = self.engine.step();
        copy_blocks_cpu(&self.geometry, &mut self.device, self.host.as_mut(), &copies).unwrap();
        self.last_copies = copies;
        self.replay_events();
        self.check_data();
        // The forward pass writes the KV of every token not yet computed.
        for (id, tokens) in &self.live {
            let info = self.engine.request_info(*id).unwrap();
            let table = self.engine.block_table(*id).unwrap();
            let values = kv_values(tokens);
            for pos in info.tokens_computed as usize..tokens.len() {
                let page = table[pos / BS as usize] as usize;
                let at = page * 16 + (pos % BS as usize) * 4;
                self.device.data[0][at..at + 4].copy_from_slice(&values[pos].to_le_bytes());
            }
            self.engine.commit(*id, tokens.len() as u64).unwrap();
        }
        // Commits advertise in the next step's batch; record what they store now.
        for b in self.engine.cached_blocks() {
            if b.page.medium == Tier::Device && !self.advertised.contains_key(&b.key) {
                let data = self.page_bytes(Tier::Device, b.page.page);
                if let Some(old) = self.expected.insert(b.key, data) {
                    assert_eq!(old, data, "a key always stands for the same KV");
                }
            }
        }
    }

    fn replay_events(&mut self) {
        for e in self.engine.drain_events() {
            match e {
                KvEvent::BlockStored(s) => {
                    for k in s.keys {
                        let prev = self.advertised.insert(k, s.medium);
                        assert!(prev.is_none(), "key stored in {:?} while advertised in {prev:?}", s.medium);
                    }
                }
                KvEvent::BlockRemoved(r) => {
                    for k in r.keys {
                        let prev = self.advertised.remove(&k);
                        assert_eq!(prev, Some(r.medium), "removal in {:?} of a key not advertised there", r.medium);
                    }
                }
                KvEvent::AllBlocksCleared(_) => self.advertised.clear(),
            }
        }
        // The replayed view is the engine's cache, tier by tier.
        assert_eq!(
            self.advertised.len(),
            self.engine.cached_blocks().len(),
            "routers see as many blocks as are cached"
        );
        for (key, medium) in &self.advertised {
            assert_eq!(self.engine.cached_medium(key), Some(*medium), "advertised tier is the cached tier");
        }
    }

    fn check_data(&self) {
        for b in self.engine.cached_blocks() {
            let want = self.expected.get(&b.key).expect("every cached key was stored with known KV");
            assert_eq!(
                &self.page_bytes(b.page.medium, b.page.page),
                want,
                "cached block lost its KV ({:?} page {})",
                b.page.medium,
                b.page.page
            );
        }
        for (id, tokens) in &self.live {
            let info = self.engine.request_info(*id).unwrap();
            let table = self.engine.block_table(*id).unwrap();
            let values = kv_values(tokens);
            for pos in 0..info.tokens_computed as usize {
                let page = table[pos / BS as usize];
                let at = (pos % BS as usize) * 4;
                let got = u32::from_le_bytes(self.page_bytes(Tier::Device, page)[at..at + 4].try_into().unwrap());
                assert_eq!(got, values[pos], "request's computed token {pos} lost its KV");
            }
        }
    }

    fn apply(&mut self, op: &Op, bases: &[Vec<u32>; 3]) {
        match *op {
            Op::Admit { base, len, twist } => {
                let mut tokens = bases[base as usize][..len as usize].to_vec();
                if let Some(t) = twist.filter(|t| (*t as usize) < tokens.len()) {
                    tokens[t as usize] ^= 0x5a5a;
                }
                if let Ok(a) = self.engine.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }) {
                    self.live.push((a.id, tokens));
                }
            }
            Op::Grow { req, tokens } => {
                if self.live.is_empty() {
                    return;
                }
                let i = req as usize % self.live.len();
                let more: Vec<u32> = (0..tokens as u32).map(|k| 900 + k + self.live[i].1.len() as u32).collect();
                if self.engine.grow(self.live[i].0, &more).is_ok() {
                    self.live[i].1.extend_from_slice(&more);
                }
            }
            Op::Step => self.step(),
            Op::Finish { req } => {
                if self.live.is_empty() {
                    return;
                }
                let (id, _) = self.live.remove(req as usize % self.live.len());
                self.engine.finish(id).unwrap();
            }
            Op::Evict { n } => {
                self.engine.evict(n as usize);
            }
            Op::Clear => self.engine.clear(),
        }
        self.engine.check_invariants();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random admissions sharing prefixes, growth, finishes, evictions and
    /// clears under device pressure, with and without a host tier, partial
    /// reuse and `offload_first` (whose prefix copies go through the same copy list): the three
    /// properties in the module docs hold after every step.
    #[test]
    #[cfg_attr(miri, ignore)] // proptest runs thousands of engine steps: far too slow under Miri
    fn tiers_keep_blocks_and_events_consistent(
        blocks_device in 8u32..20,
        blocks_host in prop_oneof![Just(0u32), 1u32..12],
        partial_reuse in any::<bool>(),
        offload_first in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let bases: [Vec<u32>; 3] = std::array::from_fn(|b| (0..32).map(|i| (b as u32 * 1000) + (i % 7) * 3 + i).collect());
        let mut h = Harness::new(blocks_device, blocks_host, partial_reuse, offload_first);
        for op in &ops {
            h.apply(op, &bases);
        }
        h.step();
        // Finish everything and step: nothing is lost when requests are gone.
        for (id, _) in std::mem::take(&mut h.live) {
            h.engine.finish(id).unwrap();
        }
        h.step();
        h.step();
    }
}

/// Offload then onboard, step by step: a block evicted to the host tier comes
/// back with its KV intact when a prompt matches it, and the events tell a
/// router Removed(GPU), Stored(CPU), then Removed(CPU), Stored(GPU).
#[test]
fn offload_and_onboard_round_trip() {
    let mut h = Harness::new(3, 4, false, false);
    let bases: [Vec<u32>; 3] = std::array::from_fn(|b| (0..32).map(|i| b as u32 * 100 + i).collect());
    h.apply(&Op::Admit { base: 0, len: 9, twist: None }, &bases); // 3 blocks, 2 full ones become cached
    h.apply(&Op::Step, &bases);
    h.apply(&Op::Finish { req: 0 }, &bases);
    h.apply(&Op::Step, &bases);
    assert_eq!(h.engine.blocks_cached(), (2, 0));
    h.apply(&Op::Admit { base: 1, len: 9, twist: None }, &bases); // needs all 3 pages: both cached blocks offload
    assert_eq!(h.engine.blocks_cached(), (0, 2));
    h.apply(&Op::Step, &bases);
    h.apply(&Op::Finish { req: 0 }, &bases);
    h.apply(&Op::Step, &bases);
    let counters = h.engine.counters();
    assert_eq!(counters.blocks_offloaded, 2);
    h.apply(&Op::Admit { base: 0, len: 9, twist: None }, &bases); // matches 2 host blocks: onboard
    assert_eq!(h.engine.counters().blocks_onboarded, 2);
    h.apply(&Op::Step, &bases); // checks the onboarded KV
    let info = h.engine.request_info(h.live[0].0).unwrap();
    assert_eq!(info.tokens_cached, 8);
}

/// Partial reuse through the copy list: a prompt that shares 2 of a cached
/// block's 4 tokens gets a fresh block whose first 2 tokens' KV is copied in
/// at the step, and only the rest is computed.
#[test]
fn partial_reuse_copies_the_shared_prefix() {
    let mut h = Harness::new(8, 0, true, false);
    let bases: [Vec<u32>; 3] = std::array::from_fn(|b| (0..32).map(|i| b as u32 * 100 + i).collect());
    h.apply(&Op::Admit { base: 0, len: 9, twist: None }, &bases);
    h.apply(&Op::Step, &bases);
    h.apply(&Op::Finish { req: 0 }, &bases);
    h.apply(&Op::Step, &bases);
    // Same first block, then 2 of the second block's tokens, then a different token.
    h.apply(&Op::Admit { base: 0, len: 9, twist: Some(6) }, &bases);
    assert_eq!(h.engine.counters().blocks_partially_reused, 1);
    let info = h.engine.request_info(h.live[0].0).unwrap();
    assert_eq!(info.tokens_computed, 6, "one full block and 2 copied tokens");
    h.apply(&Op::Step, &bases); // applies the prefix copy, then checks every computed token's KV
}

/// Once the host tier is full, the oldest offload is the one dropped, with
/// Removed(CPU) for its key; each step's offloads are reported as copies to
/// distinct host pages.
#[test]
fn full_host_tier_drops_the_oldest_offload_first() {
    let serve = |e: &mut Engine, first: u32| -> Vec<kvcore::BlockCopy> {
        let tokens: Vec<u32> = (0..8 * BS + 1).map(|i| first * 1000 + i).collect();
        let a = e.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }).unwrap();
        e.commit(a.id, tokens.len() as u64).unwrap();
        e.finish(a.id).unwrap();
        e.step()
    };
    let mut e =
        Engine::new(EngineConfig { block_size_tokens: BS, blocks_device: 9, blocks_host: 20, ..Default::default() })
            .unwrap();
    serve(&mut e, 1); // 8 cached blocks on the device
    e.drain_events();
    let mut first_offloads: Vec<BlockKey> = Vec::new();
    for round in 2..6u32 {
        let copies = serve(&mut e, round); // 9 new pages: the previous prompt's 8 blocks offload
        let mut pages: Vec<u32> = copies.iter().filter(|c| c.dst.medium == Tier::Host).map(|c| c.dst.page).collect();
        assert_eq!(pages.len(), 8, "round {round}");
        pages.sort_unstable();
        pages.dedup();
        assert_eq!(pages.len(), 8, "round {round}: distinct host pages");
        let events = e.drain_events();
        // Keys stored (or removed) on the host tier by the step's events.
        let host_keys = |stored: bool| -> Vec<BlockKey> {
            let mut keys = Vec::new();
            for ev in &events {
                match ev {
                    KvEvent::BlockStored(s) if stored && s.medium == Tier::Host => keys.extend(&s.keys),
                    KvEvent::BlockRemoved(r) if !stored && r.medium == Tier::Host => keys.extend(&r.keys),
                    _ => {}
                }
            }
            keys
        };
        let (stored_cpu, removed_cpu) = (host_keys(true), host_keys(false));
        if round == 2 {
            first_offloads = stored_cpu;
            assert!(removed_cpu.is_empty());
        } else if round == 4 {
            // 20 host pages held rounds 2 and 3 (16 blocks); round 4 needs 8
            // more, so the 4 oldest (the first offloads of round 2) go.
            let mut want = first_offloads[..4].to_vec();
            let mut got = removed_cpu.clone();
            want.sort();
            got.sort();
            assert_eq!(got, want, "the oldest offloads are dropped first");
        }
    }
}

/// Serves A (25 tokens: 6 full blocks and a partial one) then B (32 tokens,
/// 8 blocks), each to the end, so that both are cached.
fn serve_a_then_b(h: &mut Harness, bases: &[Vec<u32>; 3]) {
    for (base, len) in [(0, 25), (1, 32)] {
        h.apply(&Op::Admit { base, len, twist: None }, bases);
        h.apply(&Op::Step, bases);
        h.apply(&Op::Finish { req: 0 }, bases);
        h.apply(&Op::Step, bases);
    }
}

/// Both tiers full, a prompt matching 6 host blocks and needing 7 device
/// pages, one of them fresh: by default the offloads that make room
/// alternate with the onboards, so that the host pages the onboards free
/// take the offloads and no block is dropped, at one copy wave per move;
/// with `offload_first` the 7 evictions come first (5 of them dropped: the
/// host tier has 2 free pages and its other blocks are the ones being
/// onboarded), then the onboards: 2 waves. Both keep every block's KV (the
/// harness applies the copies wave by wave, as a GPU runs them, and checks
/// every cached page).
#[test]
fn offload_first_trades_dropped_blocks_for_fewer_waves() {
    let bases: [Vec<u32>; 3] = std::array::from_fn(|b| (0..32).map(|i| b as u32 * 100 + i).collect());
    let mut outcomes = Vec::new();
    for offload_first in [false, true] {
        let mut h = Harness::new(8, 8, false, offload_first);
        // B's 8 blocks offload A's 6 (the host tier then has 2 free pages).
        serve_a_then_b(&mut h, &bases);
        assert_eq!(h.engine.blocks_cached(), (8, 6));
        let before = h.engine.counters();
        // A again: 6 onboards and 1 fresh block, so 7 of B's blocks go.
        h.apply(&Op::Admit { base: 0, len: 25, twist: None }, &bases);
        h.apply(&Op::Step, &bases); // applies the copies wave by wave and checks every page
        let after = h.engine.counters();
        assert_eq!(after.blocks_onboarded - before.blocks_onboarded, 6);
        assert_eq!(after.blocks_evicted_device - before.blocks_evicted_device, 7);
        let offloaded = after.blocks_offloaded - before.blocks_offloaded;
        let waves = copy_waves(&h.last_copies).len();
        outcomes.push((offloaded, waves, h.engine.blocks_cached()));
    }
    // Default: every evicted block offloaded into the pages the onboards
    // freed; each onboard writes a page its offload reads and each later
    // offload a host page an onboard reads: 13 moves, 12 waves.
    assert_eq!(outcomes[0].0, 7);
    assert_eq!(outcomes[0].2, (7, 7));
    assert!(outcomes[0].1 >= 10, "default waves: {:?}", outcomes[0]);
    // offload_first: 2 offloads, 5 drops, then the onboards: 2 waves.
    assert_eq!(outcomes[1], (2, 2, (7, 2)));
}

/// Cooling pages: with free device pages and free host pages, a step's
/// offloads and onboards share one wave (both directions of PCIe at once).
/// The device has 10 pages: A's 6 blocks live on the host (4 offloaded for
/// B, 2 by an explicit eviction), B's 8 are cached and 2 pages are free, and
/// A again needs 7 pages. `offload_first` evicts 5
/// of B's blocks up front (2 offloaded into the host's 2 free pages, 3
/// dropped); 5 onboards take the 2 free pages and the 3 dropped blocks'
/// pages, which no copy of the step touches, so they run in the offloads'
/// wave; the sixth has only a page an offload reads left, and waits for the
/// second wave; the fresh block takes the other such page, no copy needed.
#[test]
fn onboards_into_untouched_pages_share_the_offloads_wave() {
    let bases: [Vec<u32>; 3] = std::array::from_fn(|b| (0..32).map(|i| b as u32 * 100 + i).collect());
    let mut h = Harness::new(10, 8, false, true);
    serve_a_then_b(&mut h, &bases);
    // B's blocks took 4 of A's pages; the other 2 are offloaded by hand.
    h.apply(&Op::Evict { n: 2 }, &bases);
    h.apply(&Op::Step, &bases);
    // B's 8 blocks on the device (2 pages free), A's 6 on the host (2 free).
    assert_eq!(h.engine.blocks_cached(), (8, 6));
    assert_eq!(h.engine.blocks_free_device(), 2);
    h.apply(&Op::Admit { base: 0, len: 25, twist: None }, &bases);
    h.apply(&Op::Step, &bases); // applies the copies wave by wave and checks every page
    let copies = &h.last_copies;
    let ends = copy_waves(copies);
    assert_eq!(ends.len(), 2, "copies: {copies:?}");
    let first = &copies[..ends[0]];
    let dir = |c: &BlockCopy| (c.src.medium, c.dst.medium);
    assert_eq!(first.iter().filter(|c| dir(c) == (Tier::Device, Tier::Host)).count(), 2);
    assert_eq!(first.iter().filter(|c| dir(c) == (Tier::Host, Tier::Device)).count(), 5);
    assert_eq!(copies.len() - ends[0], 1);
    assert_eq!(dir(&copies[ends[0]]), (Tier::Host, Tier::Device));
}
