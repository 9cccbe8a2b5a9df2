//! The indexer's unit tests: lookups per tier, pending parents, images,
//! the memory bound, table growth, and the whole-event store checked against
//! the block-by-block one on random streams.

use kvcore::wire::{
    ImageRoutingV1, WireBlockRemoved, WireBlockStored, WireEvent, WireImageItem, WireImageRef, WireMmInfo, WireMmObject,
};
use kvcore::{ImageDigest, Tier};

use super::{Indexer, IndexerConfig, WorkerId};
use crate::hashing::{
    ImagePlacement, ImageRef, KeysStop, NoUuids, RouterKey, TokenRequest, UuidLookup, UuidResolver, hash_request,
};
use crate::workload::{EventWorkload, EventWorkloadSpec};

fn stored(hashes: &[i64], parent: Option<i64>, tokens: Vec<u32>, medium: &str) -> WireEvent {
    WireEvent::BlockStored(WireBlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: Some(tokens),
        block_size: 4,
        medium: Some(medium.into()),
        ..Default::default()
    })
}

/// Only run heads go into the holder index's map: one key a sequence and
/// worker when each worker stores its sequences in order, while every key
/// keeps a slot in the runs; a worker's table of 12 800 keys follows the
/// default growth rule (two-fold from 4 Ki slots: 32 768, a load of 0.39).
#[test]
fn only_run_heads_are_mapped() {
    let spec = EventWorkloadSpec { sequences: 400, seq_tokens: 4096, workers: 4, ..Default::default() };
    let w = EventWorkload::generate(&spec);
    let mut ix = Indexer::new(IndexerConfig { block_size: spec.block_size, ..Default::default() });
    let ids: Vec<WorkerId> = (0..spec.workers).map(|i| ix.add_worker(&i.to_string())).collect();
    ix.apply_all(w.events.iter().map(|(wi, e)| (ids[*wi], e)));
    assert_eq!(ix.index.len(), 51_200);
    assert_eq!(ix.index.map.len(), 400);
    assert_eq!(ix.workers[0].keyed.len(), 12_800);
    assert_eq!(ix.workers[0].keyed.capacity(), 1 << 15);
    ix.check_invariants();
}

fn removed(hashes: &[i64], medium: &str) -> WireEvent {
    WireEvent::BlockRemoved(WireBlockRemoved {
        block_hashes: hashes.to_vec(),
        medium: Some(medium.into()),
        ..Default::default()
    })
}

fn keys_of(tokens: &[u32]) -> Vec<RouterKey> {
    let req = TokenRequest { tokens: tokens.to_vec(), ..Default::default() };
    hash_request(&req, 4, 0, &NoUuids).unwrap().keys
}

fn config() -> IndexerConfig {
    IndexerConfig { block_size: 4, ..Default::default() }
}

mod whole_event {
    use super::*;
    use proptest::prelude::*;

    /// One event of a small random stream: few hashes and few token
    /// blocks, so that blocks are stored again (under other parents,
    /// hence kept keys), removed, moved between tiers and stored before
    /// their parents.
    #[derive(Clone, Debug)]
    enum Ev {
        Store { worker: u32, first: i64, len: usize, parent: Option<i64>, salt: u32, cpu: bool },
        Remove { worker: u32, hashes: Vec<i64>, cpu: bool },
        Clear { worker: u32 },
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            6 => (0..3u32, 0..24i64, 1..6usize, proptest::option::of(0..24i64), 0..3u32, any::<bool>())
                .prop_map(|(worker, first, len, parent, salt, cpu)| Ev::Store { worker, first, len, parent, salt, cpu }),
            3 => (0..3u32, proptest::collection::vec(0..30i64, 1..6), any::<bool>())
                .prop_map(|(worker, hashes, cpu)| Ev::Remove { worker, hashes, cpu }),
            1 => (0..3u32).prop_map(|worker| Ev::Clear { worker }),
        ]
    }

    fn wire(e: &Ev) -> (WorkerId, WireEvent) {
        let medium = |cpu: bool| if cpu { "CPU" } else { "GPU" };
        match e {
            Ev::Store { worker, first, len, parent, salt, cpu } => {
                let hashes: Vec<i64> = (0..*len as i64).map(|i| first + i).collect();
                // Tokens follow from the hash and the salt, so a hash stored
                // twice may come with the same content or another one.
                let tokens = hashes.iter().flat_map(|h| (0..4).map(move |t| (*h as u32) * 8 + t + salt)).collect();
                (WorkerId(*worker), stored(&hashes, *parent, tokens, medium(*cpu)))
            }
            Ev::Remove { worker, hashes, cpu } => (WorkerId(*worker), removed(hashes, medium(*cpu))),
            Ev::Clear { worker } => (WorkerId(*worker), WireEvent::AllBlocksCleared),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

        /// `apply_all`, which reads ahead and stores a whole event's blocks
        /// at once when it can, leaves the indexer exactly as applying the
        /// events one by one and storing every block on its own does: the
        /// same router key for every (worker, hash), the same blocks per
        /// tier, the same counters and the same overlaps, under any stream
        /// of stores, re-stores, removals, tier moves, clears and
        /// out-of-order parents, with a per-worker limit that is reached.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn apply_all_matches_block_by_block(events in proptest::collection::vec(ev(), 1..80), max in 4..40usize) {
            let cfg = IndexerConfig { block_size: 4, blocks_per_worker_max: max, ..Default::default() };
            let (mut fast, mut slow) = (Indexer::new(cfg.clone()), Indexer::new(cfg));
            for ix in [&mut fast, &mut slow] {
                for w in 0..3 {
                    ix.add_worker(&w.to_string());
                }
            }
            let wired: Vec<(WorkerId, WireEvent)> = events.iter().map(wire).collect();
            fast.apply_all(wired.iter().map(|(w, e)| (*w, e)));
            for (w, e) in &wired {
                slow.apply_block_by_block(*w, e);
            }
            fast.check_invariants();
            prop_assert_eq!(fast.counters(), slow.counters());
            for w in 0..3 {
                let w = WorkerId(w);
                for tier in [Tier::Device, Tier::Host] {
                    prop_assert_eq!(fast.worker_blocks(w, tier), slow.worker_blocks(w, tier));
                }
                for h in 0..30 {
                    prop_assert_eq!(fast.router_key_of(w, h), slow.router_key_of(w, h));
                }
            }
            for (_, e) in &wired {
                if let WireEvent::BlockStored(s) = e {
                    let keys: Vec<RouterKey> = s.block_hashes.iter()
                        .filter_map(|h| slow.router_key_of(WorkerId(0), *h)).collect();
                    prop_assert_eq!(fast.find_matches(&keys), slow.find_matches(&keys));
                    prop_assert_eq!(fast.find_matches(&keys_of(s.token_ids.as_deref().unwrap_or(&[]))),
                        slow.find_matches(&keys_of(s.token_ids.as_deref().unwrap_or(&[]))));
                }
            }
        }
    }
}

/// One worker holding the same blocks (the same router keys) under two
/// engine hashes, as an engine does when its hash covers what the router
/// key does not (one image's pixels under two UUIDs): removing one copy
/// leaves the other findable, in its own tiers, and removing both leaves
/// nothing.
#[test]
fn a_key_held_under_two_engine_hashes_outlives_either() {
    let mut ix = Indexer::new(config());
    let w = ix.add_worker("w");
    let tokens: Vec<u32> = (0..8).collect();
    let keys = keys_of(&tokens);
    let found = |ix: &Indexer| -> Vec<(u32, u32)> {
        ix.find_matches(&keys).iter().map(|o| (o.device_blocks, o.any_tier_blocks)).collect()
    };
    ix.apply(w, &stored(&[4, 5], None, tokens.clone(), "GPU"));
    ix.apply(w, &stored(&[8, 9], None, tokens.clone(), "GPU"));
    ix.check_invariants();
    ix.apply(w, &removed(&[4, 5], "GPU"));
    ix.check_invariants();
    assert_eq!(found(&ix), vec![(2, 2)], "the second copy still holds both blocks");
    ix.apply(w, &removed(&[8, 9], "GPU"));
    ix.check_invariants();
    assert_eq!(found(&ix), vec![]);

    // In two tiers: each copy keeps its own.
    ix.apply(w, &stored(&[4, 5], None, tokens.clone(), "GPU"));
    ix.apply(w, &stored(&[8, 9], None, tokens.clone(), "CPU"));
    ix.check_invariants();
    assert_eq!(found(&ix), vec![(2, 2)]);
    ix.apply(w, &removed(&[4, 5], "GPU"));
    ix.check_invariants();
    assert_eq!(found(&ix), vec![(0, 2)], "only the host copy is left");
    assert_eq!(ix.worker_blocks(w, Tier::Device), Vec::<i64>::new());
    assert_eq!(ix.worker_blocks(w, Tier::Host), vec![8, 9]);
    ix.apply(w, &stored(&[4, 5], None, tokens.clone(), "GPU"));
    ix.apply(w, &removed(&[8, 9], "CPU"));
    ix.check_invariants();
    assert_eq!(found(&ix), vec![(2, 2)], "the device copy is back and the host one gone");
    assert_eq!(ix.worker_blocks(w, Tier::Host), Vec::<i64>::new());
    ix.apply(w, &WireEvent::AllBlocksCleared);
    ix.check_invariants();
    assert_eq!(found(&ix), vec![]);
}

mod shared_keys {
    use super::*;
    use proptest::prelude::*;

    /// A single-block event: hash `h` of worker `w`, its content `h % 3`, so
    /// that hashes 0, 3 and 6 (and so on) share a router key.
    #[derive(Clone, Debug)]
    enum Ev {
        Store { w: u32, h: i64, cpu: bool },
        Remove { w: u32, h: i64, cpu: bool },
        Clear { w: u32 },
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            5 => (0..2u32, 0..9i64, any::<bool>()).prop_map(|(w, h, cpu)| Ev::Store { w, h, cpu }),
            4 => (0..2u32, 0..9i64, any::<bool>()).prop_map(|(w, h, cpu)| Ev::Remove { w, h, cpu }),
            1 => (0..2u32).prop_map(|w| Ev::Clear { w }),
        ]
    }

    fn content(h: i64) -> Vec<u32> {
        (0..4).map(|t| (h % 3) as u32 * 4 + t).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        /// Against the truth of each engine hash's tiers: a worker's overlap
        /// with a key is the union of the tiers of every hash it holds under
        /// that key, whatever the order of stores, tier moves and removals.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn overlaps_are_the_union_over_hashes(events in proptest::collection::vec(ev(), 1..60)) {
            let mut ix = Indexer::new(config());
            let ws: Vec<WorkerId> = (0..2).map(|w| ix.add_worker(&w.to_string())).collect();
            let mut truth = std::collections::BTreeMap::<(u32, i64), u8>::new();
            let medium = |cpu: bool| if cpu { "CPU" } else { "GPU" };
            for e in &events {
                match *e {
                    Ev::Store { w, h, cpu } => {
                        *truth.entry((w, h)).or_default() |= 1 << cpu as u8;
                        ix.apply(ws[w as usize], &stored(&[h], None, content(h), medium(cpu)));
                    }
                    Ev::Remove { w, h, cpu } => {
                        if let Some(t) = truth.get_mut(&(w, h)) {
                            *t &= !(1 << cpu as u8);
                            if *t == 0 {
                                truth.remove(&(w, h));
                            }
                        }
                        ix.apply(ws[w as usize], &removed(&[h], medium(cpu)));
                    }
                    Ev::Clear { w } => {
                        truth.retain(|(tw, _), _| *tw != w);
                        ix.apply(ws[w as usize], &WireEvent::AllBlocksCleared);
                    }
                }
                ix.check_invariants();
                for c in 0..3i64 {
                    let keys = keys_of(&content(c));
                    let got: Vec<(u32, u32, u32)> =
                        ix.find_matches(&keys).iter().map(|o| (o.worker.0, o.device_blocks, o.any_tier_blocks)).collect();
                    let mut want = Vec::new();
                    for w in 0..2u32 {
                        let t = truth.iter().filter(|((tw, h), _)| *tw == w && h % 3 == c).fold(0u8, |a, (_, t)| a | t);
                        if t != 0 {
                            want.push((w, (t & 1) as u32, 1));
                        }
                    }
                    prop_assert_eq!(got, want, "content {}", c);
                }
            }
        }
    }
}

/// Stored blocks are found by the keys a request computes; removals,
/// tier moves and clears change the overlap as the engine's cache did.
#[test]
fn store_lookup_remove_per_tier() {
    let mut ix = Indexer::new(config());
    let (a, b) = (ix.add_worker("a"), ix.add_worker("b"));
    let tokens: Vec<u32> = (0..12).collect();
    ix.apply(a, &stored(&[1, 2, 3], None, tokens.clone(), "GPU"));
    ix.apply(b, &stored(&[1, 2], None, tokens[..8].to_vec(), "GPU"));
    ix.check_invariants();
    let keys = keys_of(&tokens);
    let m = ix.find_matches(&keys);
    assert_eq!(m.len(), 2);
    assert_eq!((m[0].worker, m[0].device_blocks, m[0].any_tier_blocks), (a, 3, 3));
    assert_eq!((m[1].worker, m[1].device_blocks, m[1].any_tier_blocks), (b, 2, 2));
    // Offload a's middle block: device prefix 1, any-tier prefix 3.
    ix.apply(a, &removed(&[2], "GPU"));
    ix.apply(a, &stored(&[2], Some(1), tokens[4..8].to_vec(), "CPU"));
    ix.check_invariants();
    let m = ix.find_matches(&keys);
    assert_eq!((m[0].device_blocks, m[0].any_tier_blocks), (1, 3));
    // Removing an unknown hash or the wrong tier is a no-op.
    ix.apply(a, &removed(&[99], "GPU"));
    ix.apply(a, &removed(&[2], "GPU"));
    assert_eq!(ix.counters().removed_unknown, 2);
    assert_eq!(ix.worker_blocks(a, Tier::Host), vec![2]);
    ix.apply(b, &WireEvent::AllBlocksCleared);
    ix.check_invariants();
    let m = ix.find_matches(&keys);
    assert_eq!(m.len(), 1);
    assert!(ix.worker_blocks(b, Tier::Device).is_empty());
}

/// A child stored before its parent (an orphan re-advertised) is held
/// but unkeyed until the parent is stored; then it is found.
#[test]
fn pending_children_are_keyed_when_the_parent_arrives() {
    let mut ix = Indexer::new(config());
    let a = ix.add_worker("a");
    let tokens: Vec<u32> = (100..112).collect();
    ix.apply(a, &stored(&[3], Some(2), tokens[8..].to_vec(), "GPU"));
    ix.apply(a, &stored(&[2], Some(1), tokens[4..8].to_vec(), "CPU"));
    assert_eq!(ix.memory().pending, 2);
    ix.check_invariants();
    assert_eq!(ix.worker_blocks(a, Tier::Device), vec![3]);
    ix.apply(a, &stored(&[1], None, tokens[..4].to_vec(), "GPU"));
    ix.check_invariants();
    assert_eq!(ix.memory().pending, 0);
    assert_eq!(ix.counters().blocks_resolved_late, 2);
    let m = ix.find_matches(&keys_of(&tokens));
    assert_eq!((m[0].device_blocks, m[0].any_tier_blocks), (1, 3));
    // A pending node removed before its parent arrives is forgotten cleanly.
    ix.apply(a, &stored(&[7], Some(6), tokens[..4].to_vec(), "GPU"));
    ix.apply(a, &removed(&[7], "GPU"));
    ix.check_invariants();
    assert_eq!(ix.memory().pending, 0);
}

/// Image blocks are keyed by digest (a request with the bytes finds them,
/// one with other bytes does not); the UUID is learned; an image known
/// only by `mm_hash` is skipped and counted, and removing it is harmless.
#[test]
fn images_by_digest_and_unkeyable_mm_hash() {
    let mut ix = Indexer::new(config());
    let a = ix.add_worker("a");
    let pixels = b"pixels".to_vec();
    let digest = ImageDigest::of_content(&pixels);
    let tokens = vec![1, 9, 9, 9, 9, 2, 3, 4];
    let mut s = WireBlockStored {
        block_hashes: vec![10, 11],
        token_ids: Some(tokens.clone()),
        block_size: 4,
        image_routing: Some(ImageRoutingV1 {
            items: vec![WireImageItem { digest: digest.0, uuid: Some("u1".into()) }],
            blocks: vec![
                vec![WireImageRef { item: 0, item_offset: 0, block_offset: 1, len: 3 }],
                vec![WireImageRef { item: 0, item_offset: 3, block_offset: 0, len: 1 }],
            ],
        }),
        ..Default::default()
    };
    ix.apply(a, &WireEvent::BlockStored(s.clone()));
    let req = |image| TokenRequest {
        tokens: tokens.clone(),
        images: vec![ImagePlacement { image, runs: vec![(1, 4)] }],
        ..Default::default()
    };
    let by_uuid = hash_request(&req(ImageRef::Uuid("u1".into())), 4, 9, &ix).unwrap();
    assert_eq!(ix.find_matches(&by_uuid.keys)[0].device_blocks, 2);
    let by_bytes = hash_request(&req(ImageRef::Bytes(pixels)), 4, 9, &ix).unwrap();
    assert_eq!(by_bytes.keys, by_uuid.keys);
    let other = hash_request(&req(ImageRef::Bytes(b"other".to_vec())), 4, 9, &ix).unwrap();
    assert!(ix.find_matches(&other.keys).is_empty());
    // Same UUID with other pixels on another event: ambiguous from then on.
    s.block_hashes = vec![20, 21];
    s.image_routing.as_mut().unwrap().items[0].digest = [5; 32];
    ix.apply(a, &WireEvent::BlockStored(s.clone()));
    assert_eq!(ix.resolve("u1"), UuidLookup::Ambiguous);
    assert_eq!(ix.counters().uuid_conflicts, 1);
    // Dynamo-style identity only: the image block and its successors are skipped.
    s.block_hashes = vec![30, 31];
    s.image_routing = None;
    s.block_mm_infos =
        Some(vec![Some(WireMmInfo { mm_objects: vec![WireMmObject { mm_hash: 7, offsets: vec![[1, 4]] }] }), None]);
    ix.apply(a, &WireEvent::BlockStored(s));
    assert_eq!(ix.counters().image_blocks_unkeyable, 2);
    ix.apply(a, &removed(&[30, 31], "GPU"));
    assert_eq!(ix.counters().removed_unknown, 2);
    ix.check_invariants();
}

/// The per-worker bound drops what does not fit, counts it, and the
/// memory report tracks the tables.
#[test]
fn bounded_memory() {
    let mut ix = Indexer::new(IndexerConfig { block_size: 4, blocks_per_worker_max: 2, uuids_max: 1 });
    let a = ix.add_worker("a");
    ix.apply(a, &stored(&[1, 2, 3], None, (0..12).collect(), "GPU"));
    assert_eq!(ix.counters().blocks_dropped_full, 1);
    assert_eq!(ix.worker_blocks(a, Tier::Device).len(), 2);
    let m = ix.memory();
    assert_eq!((m.nodes, m.keys), (2, 2));
    assert!(m.bytes > 0);
    ix.check_invariants();
}

/// The fleet-wide UUID view: conflicts counted per block, bounds that never
/// turn forgetting into a false match.
mod fleet_uuids {
    use super::*;
    use proptest::prelude::*;

    /// A two-block event of block size 4 whose image (3 + 1 tokens) names
    /// `uuid` with `digest`, in `medium`.
    fn image_event(hashes: [i64; 2], uuid: &str, digest: ImageDigest, medium: &str) -> WireEvent {
        WireEvent::BlockStored(WireBlockStored {
            block_hashes: hashes.to_vec(),
            token_ids: Some(vec![1, 9, 9, 9, 9, 2, 3, 4]),
            block_size: 4,
            medium: Some(medium.into()),
            image_routing: Some(ImageRoutingV1 {
                items: vec![WireImageItem { digest: digest.0, uuid: Some(uuid.into()) }],
                blocks: vec![
                    vec![WireImageRef { item: 0, item_offset: 0, block_offset: 1, len: 3 }],
                    vec![WireImageRef { item: 0, item_offset: 3, block_offset: 0, len: 1 }],
                ],
            }),
            ..Default::default()
        })
    }

    /// The request of `image_event` naming its image by UUID alone.
    fn by_uuid(uuid: &str) -> TokenRequest {
        TokenRequest {
            tokens: vec![1, 9, 9, 9, 9, 2, 3, 4],
            images: vec![ImagePlacement { image: ImageRef::Uuid(uuid.into()), runs: vec![(1, 4)] }],
            ..Default::default()
        }
    }

    /// Blocks of `uuid`'s request each worker matches, in worker order.
    fn matched(ix: &Indexer, uuid: &str) -> Vec<(u32, u32)> {
        let h = hash_request(&by_uuid(uuid), 4, 9, ix).unwrap();
        ix.find_matches(&h.keys).iter().map(|o| (o.worker.0, o.any_tier_blocks)).collect()
    }

    /// Two workers hold one UUID under different pixels: the UUID resolves to
    /// nothing, and a request naming it matches no image block anywhere.
    /// The conflict lasts exactly as long as the second copy: a tier move
    /// keeps it, the last removal ends it; a clear and a worker's removal
    /// end it too. The digest stays the identity throughout: by bytes, each
    /// image matches its own holder only.
    #[test]
    fn a_conflict_lasts_as_long_as_the_conflicting_copies() {
        let mut ix = Indexer::new(config());
        let (a, b) = (ix.add_worker("a"), ix.add_worker("b"));
        let (pa, pb) = (b"pixels of a".to_vec(), b"pixels of b".to_vec());
        let (da, db) = (ImageDigest::of_content(&pa), ImageDigest::of_content(&pb));
        ix.apply(a, &image_event([10, 11], "u", da, "GPU"));
        assert_eq!(ix.resolve("u"), UuidLookup::Digest(da));
        assert_eq!(matched(&ix, "u"), vec![(0, 2)]);
        ix.apply(b, &image_event([20, 21], "u", db, "GPU"));
        assert_eq!(ix.resolve("u"), UuidLookup::Ambiguous);
        assert_eq!(matched(&ix, "u"), vec![], "no image block matches by an ambiguous UUID");
        assert_eq!(hash_request(&by_uuid("u"), 4, 9, &ix).unwrap().keys.len(), 0);
        let by_bytes = |p: &[u8]| TokenRequest {
            images: vec![ImagePlacement { image: ImageRef::Bytes(p.to_vec()), runs: vec![(1, 4)] }],
            ..by_uuid("u")
        };
        let m = ix.find_matches(&hash_request(&by_bytes(&pb), 4, 9, &ix).unwrap().keys);
        assert_eq!(m.iter().map(|o| (o.worker, o.any_tier_blocks)).collect::<Vec<_>>(), vec![(b, 2)]);
        assert_eq!((ix.counters().uuid_conflicts, ix.memory().uuids_ambiguous), (1, 1));

        // b offloads block 20 and drops it from the device: still held.
        ix.apply(b, &image_event([20, 21], "u", db, "CPU"));
        ix.apply(b, &removed(&[20, 21], "GPU"));
        assert_eq!(ix.resolve("u"), UuidLookup::Ambiguous);
        ix.apply(b, &removed(&[20], "CPU"));
        assert_eq!(ix.resolve("u"), UuidLookup::Ambiguous, "block 21 still names the UUID with b's pixels");
        ix.apply(b, &removed(&[21], "CPU"));
        assert_eq!(ix.resolve("u"), UuidLookup::Digest(da));
        assert_eq!(matched(&ix, "u"), vec![(0, 2)]);
        assert_eq!((ix.counters().uuid_conflicts_resolved, ix.memory().uuids_ambiguous), (1, 0));

        // A clear of the conflicting worker ends a conflict, and so does its removal.
        ix.apply(b, &image_event([20, 21], "u", db, "GPU"));
        assert_eq!(ix.resolve("u"), UuidLookup::Ambiguous);
        ix.apply(b, &WireEvent::AllBlocksCleared);
        assert_eq!(ix.resolve("u"), UuidLookup::Digest(da));
        ix.apply(b, &image_event([20, 21], "u", db, "GPU"));
        assert_eq!(ix.resolve("u"), UuidLookup::Ambiguous);
        ix.remove_worker(b);
        assert_eq!(ix.resolve("u"), UuidLookup::Digest(da));
        assert_eq!((ix.counters().uuid_conflicts, ix.counters().uuid_conflicts_resolved), (3, 3));
        // Nobody holds the UUID once a's copy goes: the view forgets it.
        ix.apply(a, &removed(&[10, 11], "GPU"));
        assert_eq!(ix.resolve("u"), UuidLookup::Unknown);
        assert_eq!((ix.memory().uuids, ix.memory().uuid_blocks), (0, 0));
        assert!(ix.counters().uuid_lookups_ambiguous >= 4);
        ix.check_invariants();
    }

    /// A conflict is seen even where the indexer cannot key the conflicting
    /// copy: an event without token ids still names the UUID with b's pixels.
    #[test]
    fn an_unkeyable_copy_still_counts() {
        let mut ix = Indexer::new(config());
        let (a, b) = (ix.add_worker("a"), ix.add_worker("b"));
        ix.apply(a, &image_event([10, 11], "u", ImageDigest([1; 32]), "GPU"));
        let WireEvent::BlockStored(mut s) = image_event([20, 21], "u", ImageDigest([2; 32]), "GPU") else {
            unreachable!()
        };
        s.token_ids = None;
        ix.apply(b, &WireEvent::BlockStored(s));
        assert_eq!(ix.counters().blocks_without_tokens, 2);
        assert_eq!(ix.resolve("u"), UuidLookup::Ambiguous);
        assert_eq!(matched(&ix, "u"), vec![]);
    }

    /// With room for one UUID, a UUID evicted while a holds it and then
    /// learned again from b with other pixels must not resolve to b's
    /// pixels: a may hold it under its own. It is unsure until a clears.
    #[test]
    fn an_evicted_uuid_never_resolves_wrongly() {
        let mut ix = Indexer::new(IndexerConfig { uuids_max: 1, ..config() });
        let (a, b) = (ix.add_worker("a"), ix.add_worker("b"));
        let (da, dx, db) = (ImageDigest([1; 32]), ImageDigest([2; 32]), ImageDigest([3; 32]));
        ix.apply(a, &image_event([10, 11], "u", da, "GPU"));
        ix.apply(a, &image_event([30, 31], "other", dx, "GPU"));
        assert_eq!(ix.counters().uuids_forgotten, 1);
        ix.apply(b, &image_event([20, 21], "u", db, "GPU"));
        assert_eq!(ix.counters().uuids_forgotten, 2);
        assert_eq!(ix.resolve("u"), UuidLookup::Unsure, "a may still hold u under other pixels");
        assert_eq!(matched(&ix, "u"), vec![]);
        assert_eq!(hash_request(&by_uuid("u"), 4, 9, &ix).unwrap().stop, Some(KeysStop::UnsureUuid { image: 0 }));
        assert!(ix.memory().uuid_unsure_slots >= 1);
        // Once a has cleared, only b holds u: it resolves to b's pixels.
        ix.apply(a, &WireEvent::AllBlocksCleared);
        assert_eq!(ix.resolve("u"), UuidLookup::Digest(db));
        assert_eq!(matched(&ix, "u"), vec![(1, 2)]);
        assert_eq!(ix.memory().uuid_unsure_slots, 0);
        assert!(ix.counters().uuid_lookups_unsure >= 2);
    }

    /// A worker at its block bound cannot record another block naming a
    /// UUID: that UUID is unsure, never resolved to another worker's pixels.
    #[test]
    fn an_unrecorded_reference_makes_the_uuid_unsure() {
        let mut ix = Indexer::new(IndexerConfig { blocks_per_worker_max: 2, ..config() });
        let (a, b) = (ix.add_worker("a"), ix.add_worker("b"));
        ix.apply(a, &image_event([10, 11], "u", ImageDigest([1; 32]), "GPU"));
        ix.apply(b, &image_event([20, 21], "v", ImageDigest([4; 32]), "GPU"));
        ix.apply(b, &image_event([22, 23], "u", ImageDigest([2; 32]), "GPU"));
        assert_eq!(ix.counters().uuid_refs_unrecorded, 2);
        assert_eq!(ix.resolve("u"), UuidLookup::Unsure);
        ix.apply(b, &WireEvent::AllBlocksCleared);
        assert_eq!(ix.resolve("u"), UuidLookup::Digest(ImageDigest([1; 32])));
    }

    /// Applies `(worker, hash, UUID, digest, tier)` stores (`None` as the
    /// UUID: a removal from that tier) to a roomy and a tight indexer of 2
    /// workers, then returns what each answers for `u`.
    fn roomy_and_tight(
        steps: &[(u32, i64, Option<&str>, u8, &str)],
        uuids_max: usize,
        blocks_max: usize,
        u: &str,
    ) -> (UuidLookup, UuidLookup) {
        let roomy = IndexerConfig { uuids_max: 16, blocks_per_worker_max: 64, ..config() };
        let tight = IndexerConfig { uuids_max, blocks_per_worker_max: blocks_max, ..config() };
        let (mut exact, mut small) = (Indexer::new(roomy), Indexer::new(tight));
        for ix in [&mut exact, &mut small] {
            ix.add_worker("0");
            ix.add_worker("1");
            for &(w, h, uuid, d, medium) in steps {
                let e = match uuid {
                    Some(uuid) => image_event([h * 2, h * 2 + 1], uuid, ImageDigest([d + 1; 32]), medium),
                    None => removed(&[h * 2, h * 2 + 1], medium),
                };
                ix.apply(WorkerId(w), &e);
            }
        }
        (exact.resolve(u), small.resolve(u))
    }

    /// A worker at its block bound stores blocks 2 and 3 on the device
    /// unrecorded; once it has room again it offloads them naming another
    /// UUID, then drops the host copy. The device copy still names that
    /// UUID with worker 1's pixels: another worker's pixels must not win.
    #[test]
    fn a_block_unrecorded_in_one_tier_keeps_its_uuids_after_leaving_another() {
        let steps = [
            (1, 2, Some("u0"), 0, "GPU"),
            (1, 4, Some("u0"), 0, "GPU"),
            (1, 3, Some("u0"), 0, "GPU"),
            (1, 1, Some("u0"), 0, "GPU"),
            (1, 2, None, 0, "GPU"),
            (1, 1, Some("u2"), 0, "CPU"),
            (1, 1, None, 0, "CPU"),
            (0, 0, Some("u2"), 1, "GPU"),
        ];
        let (exact, small) = roomy_and_tight(&steps, 1, 2, "u2");
        assert_eq!(exact, UuidLookup::Ambiguous);
        assert_eq!(small, UuidLookup::Unsure, "worker 1 may still hold u2 on the device");
    }

    /// The same with a conflict already seen: the tight view must not end it
    /// when the host copy of a block also held, unrecorded, on the device
    /// goes.
    #[test]
    fn a_conflict_outlives_the_recorded_tier_of_a_block_unrecorded_in_another() {
        let steps = [
            (1, 2, Some("u0"), 0, "CPU"),
            (1, 3, Some("u1"), 0, "GPU"),
            (1, 4, Some("u1"), 0, "GPU"),
            (1, 1, Some("u1"), 0, "GPU"),
            (1, 2, None, 0, "CPU"),
            (1, 1, Some("u0"), 0, "CPU"),
            (0, 0, Some("u0"), 1, "GPU"),
            (1, 1, None, 0, "CPU"),
        ];
        let (exact, small) = roomy_and_tight(&steps, 2, 2, "u0");
        assert_eq!(exact, UuidLookup::Ambiguous);
        assert_eq!(small, UuidLookup::Unsure, "worker 1 may still hold u0 on the device with its own pixels");
    }

    /// One event of a random stream over 3 workers, 6 block hashes, 3 UUIDs
    /// and 3 digests.
    #[derive(Clone, Debug)]
    enum Ev {
        Store { worker: u32, hash: i64, uuid: u8, digest: u8, cpu: bool },
        Remove { worker: u32, hash: i64, cpu: bool },
        Clear { worker: u32 },
        Drop { worker: u32 },
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            6 => (0..3u32, 0..6i64, 0..3u8, 0..3u8, any::<bool>())
                .prop_map(|(worker, hash, uuid, digest, cpu)| Ev::Store { worker, hash, uuid, digest, cpu }),
            4 => (0..3u32, 0..6i64, any::<bool>()).prop_map(|(worker, hash, cpu)| Ev::Remove { worker, hash, cpu }),
            1 => (0..3u32).prop_map(|worker| Ev::Clear { worker }),
            1 => (0..3u32).prop_map(|worker| Ev::Drop { worker }),
        ]
    }

    /// The truth: per live worker, block hash to its tiers and its
    /// `(uuid, digest)` pairs (a block stored again keeps what it named).
    type Truth = Vec<Option<std::collections::BTreeMap<i64, (u8, std::collections::BTreeSet<(u8, u8)>)>>>;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        /// Against the truth of what every worker holds: with room enough,
        /// a UUID resolves to a digest exactly when the fleet holds it under
        /// that digest alone, is ambiguous exactly when under several, and
        /// unknown when nobody holds it. With the view's bounds reached, an
        /// answer may only be more cautious, never another digest.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn the_view_follows_what_the_fleet_holds(
            events in proptest::collection::vec(ev(), 1..120), uuids_max in 1..4usize, blocks_max in 1..7usize,
        ) {
            let roomy = IndexerConfig { uuids_max: 16, blocks_per_worker_max: 64, ..config() };
            let tight = IndexerConfig { uuids_max, blocks_per_worker_max: blocks_max, ..config() };
            let (mut exact, mut small) = (Indexer::new(roomy), Indexer::new(tight));
            for ix in [&mut exact, &mut small] {
                for w in 0..3 {
                    ix.add_worker(&w.to_string());
                }
            }
            let mut truth: Truth = vec![Some(Default::default()); 3];
            let digest = |d: u8| ImageDigest([d + 1; 32]);
            let name = |u: u8| format!("uuid-{u}");
            let medium = |cpu: bool| if cpu { "CPU" } else { "GPU" };
            for e in &events {
                let (w, wire) = match *e {
                    Ev::Store { worker, hash, uuid, digest: d, cpu } => {
                        if let Some(t) = &mut truth[worker as usize] {
                            let b = t.entry(hash * 2).or_default();
                            b.0 |= 1 << cpu as u8;
                            b.1.insert((uuid, d));
                            let b = t.entry(hash * 2 + 1).or_default();
                            b.0 |= 1 << cpu as u8;
                            b.1.insert((uuid, d));
                        }
                        (worker, image_event([hash * 2, hash * 2 + 1], &name(uuid), digest(d), medium(cpu)))
                    }
                    Ev::Remove { worker, hash, cpu } => {
                        if let Some(t) = &mut truth[worker as usize] {
                            for h in [hash * 2, hash * 2 + 1] {
                                if let Some(b) = t.get_mut(&h) {
                                    b.0 &= !(1 << cpu as u8);
                                    if b.0 == 0 {
                                        t.remove(&h);
                                    }
                                }
                            }
                        }
                        (worker, removed(&[hash * 2, hash * 2 + 1], medium(cpu)))
                    }
                    Ev::Clear { worker } => {
                        if let Some(t) = &mut truth[worker as usize] {
                            t.clear();
                        }
                        (worker, WireEvent::AllBlocksCleared)
                    }
                    Ev::Drop { worker } => {
                        truth[worker as usize] = None;
                        exact.remove_worker(WorkerId(worker));
                        small.remove_worker(WorkerId(worker));
                        continue;
                    }
                };
                exact.apply(WorkerId(w), &wire);
                small.apply(WorkerId(w), &wire);
                for u in 0..3u8 {
                    let held: std::collections::BTreeSet<u8> = truth.iter().flatten()
                        .flat_map(|t| t.values().flat_map(|b| b.1.iter()))
                        .filter(|(uu, _)| *uu == u).map(|(_, d)| *d).collect();
                    let want = match held.len() {
                        0 => UuidLookup::Unknown,
                        1 => UuidLookup::Digest(digest(*held.first().unwrap())),
                        _ => UuidLookup::Ambiguous,
                    };
                    prop_assert_eq!(exact.resolve(&name(u)), want);
                    let got = small.resolve(&name(u));
                    if let UuidLookup::Digest(d) = got {
                        prop_assert_eq!(UuidLookup::Digest(d), want, "a bounded view resolves only what the fleet agrees on");
                    }
                }
            }
        }
    }
}

/// Lookups over interned holder sets, checked against a walk that asks the
/// holder index for each worker and key on its own.
mod shared_holders {
    use super::*;
    use proptest::prelude::*;

    /// The reference answer: for each worker holding the first key, the
    /// leading keys it holds in any tier and on the device, one key at a time.
    fn reference(ix: &Indexer, keys: &[RouterKey]) -> Vec<(u32, u32, u32)> {
        let mut out = Vec::new();
        for w in 0..ix.workers_len() as u32 {
            // What the worker holds, read from its own table (block to
            // slot), not from the run heads and chains that lookups follow.
            let held: std::collections::HashMap<u64, u8> = ix.workers[w as usize]
                .keyed
                .iter()
                .map(|(_, &s)| (ix.index.key_at(s), ix.index.tiers_at(s, w)))
                .collect();
            let tiers: Vec<u8> = keys.iter().map(|k| held.get(&k.0).copied().unwrap_or(0)).collect();
            let any = tiers.iter().take_while(|t| **t != 0).count() as u32;
            let dev = tiers.iter().take_while(|t| **t & super::super::tier_bit(Tier::Device) != 0).count() as u32;
            if any > 0 {
                out.push((w, dev, any));
            }
        }
        out
    }

    /// Three sequences of 12 blocks; worker `w` stores the blocks
    /// `first..first + len` of sequence `seq` in one tier (a parent-linked
    /// event), or removes some of them.
    #[derive(Clone, Debug)]
    enum Ev {
        Store { worker: u32, seq: usize, first: usize, len: usize, cpu: bool },
        Remove { worker: u32, seq: usize, blocks: Vec<usize>, cpu: bool },
    }

    fn ev(workers: u32) -> impl Strategy<Value = Ev> {
        prop_oneof![
            5 => (0..workers, 0..3usize, 0..12usize, 1..13usize, any::<bool>())
                .prop_map(|(worker, seq, first, len, cpu)| Ev::Store { worker, seq, first, len, cpu }),
            2 => (0..workers, 0..3usize, proptest::collection::vec(0..12usize, 1..4), any::<bool>())
                .prop_map(|(worker, seq, blocks, cpu)| Ev::Remove { worker, seq, blocks, cpu }),
        ]
    }

    fn tokens(seq: usize) -> Vec<u32> {
        (0..48u32).map(|t| seq as u32 * 1000 + t).collect()
    }

    fn hash(seq: usize, block: usize) -> i64 {
        (seq * 100 + block) as i64 + 1
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever the stores, tier moves and removals of up to 12 workers
        /// on shared prefixes, each lookup (of every prefix of every
        /// sequence) gives what the key-by-key reference gives.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn lookups_agree_with_the_key_by_key_walk(workers in 1..12u32, events in proptest::collection::vec(ev(12), 1..120)) {
            let mut ix = Indexer::new(config());
            for w in 0..12 {
                ix.add_worker(&w.to_string());
            }
            let medium = |cpu: bool| if cpu { "CPU" } else { "GPU" };
            for e in &events {
                match e {
                    Ev::Store { worker, seq, first, len, cpu } => {
                        let end = (first + len).min(12);
                        let hashes: Vec<i64> = (*first..end).map(|b| hash(*seq, b)).collect();
                        let parent = (*first > 0).then(|| hash(*seq, first - 1));
                        let t = tokens(*seq)[first * 4..end * 4].to_vec();
                        ix.apply(WorkerId(worker % workers), &stored(&hashes, parent, t, medium(*cpu)));
                    }
                    Ev::Remove { worker, seq, blocks, cpu } => {
                        let hashes: Vec<i64> = blocks.iter().map(|b| hash(*seq, *b)).collect();
                        ix.apply(WorkerId(worker % workers), &removed(&hashes, medium(*cpu)));
                    }
                }
                for seq in 0..3 {
                    let keys = keys_of(&tokens(seq));
                    for n in [1, 5, 12] {
                        let got: Vec<(u32, u32, u32)> = ix
                            .find_matches(&keys[..n])
                            .iter()
                            .map(|o| (o.worker.0, o.device_blocks, o.any_tier_blocks))
                            .collect();
                        prop_assert_eq!(got, reference(&ix, &keys[..n]));
                    }
                }
            }
            ix.check_invariants();
        }
    }

    /// Under churn that leaves the runs' chunks sparse (most blocks of 2048
    /// sequences removed in a random order), the runs are compacted (the
    /// invariants bound the slots in use by the live keys) and every lookup
    /// still gives the reference's answer, before and after the removals and
    /// after storing everything again.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn lookups_agree_while_the_runs_compact() {
        const SEQS: u64 = 2048;
        const BLOCKS: u64 = 64;
        let mut ix = Indexer::new(config());
        let workers: Vec<WorkerId> = (0..8).map(|w| ix.add_worker(&w.to_string())).collect();
        // Sequence `s` shares its first `16 · (s % 4)` blocks with
        // sequence `s - s % 4`: shared keys, several holders, runs that
        // break where the sequences part.
        let token = |s: u64, b: u64| -> u32 {
            let owner = if b < 16 * (s % 4) { s - s % 4 } else { s };
            (owner * BLOCKS + b) as u32
        };
        let tokens =
            |s: u64| -> Vec<u32> { (0..BLOCKS).flat_map(|b| (0..4).map(move |t| token(s, b) * 4 + t)).collect() };
        let hash = |s: u64, b: u64| (s << 8 | b) as i64;
        let store_all = |ix: &mut Indexer| {
            for s in 0..SEQS {
                let t = tokens(s);
                for first in (0..BLOCKS).step_by(8) {
                    let hashes: Vec<i64> = (first..first + 8).map(|b| hash(s, b)).collect();
                    let parent = (first > 0).then(|| hash(s, first - 1));
                    let ev = stored(&hashes, parent, t[first as usize * 4..(first as usize + 8) * 4].to_vec(), "GPU");
                    ix.apply(workers[(s % 8) as usize], &ev);
                }
            }
        };
        let check = |ix: &Indexer| {
            ix.check_invariants();
            for s in (0..SEQS).step_by(7) {
                let keys = keys_of(&tokens(s));
                let got: Vec<(u32, u32, u32)> =
                    ix.find_matches(&keys).iter().map(|o| (o.worker.0, o.device_blocks, o.any_tier_blocks)).collect();
                assert_eq!(got, reference(ix, &keys), "sequence {s}");
            }
        };
        store_all(&mut ix);
        check(&ix);
        let used = ix.index.runs.slots_used();
        // 80 % of the blocks, in a random order, four to an event.
        let mut all: Vec<(u64, u64)> = (0..SEQS).flat_map(|s| (0..BLOCKS).map(move |b| (s, b))).collect();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in (1..all.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            all.swap(i, (x % (i as u64 + 1)) as usize);
        }
        all.truncate(all.len() * 4 / 5);
        for group in all.chunks(4) {
            for &(s, b) in group {
                ix.apply(workers[(s % 8) as usize], &removed(&[hash(s, b)], "GPU"));
            }
        }
        check(&ix);
        assert!(
            ix.index.runs.slots_used() * 4 < used * 3,
            "{} slots in use after the removals, {used} before",
            ix.index.runs.slots_used()
        );
        store_all(&mut ix);
        check(&ix);
    }

    /// The tokens of test sequence `seq`, `n` blocks of 4.
    fn seq_tokens(seq: u32, n: usize) -> Vec<u32> {
        (0..n as u32 * 4).map(|t| seq << 20 | t).collect()
    }

    /// The engine hash of block `b` of test sequence `seq`.
    fn seq_hash(seq: u32, b: usize) -> i64 {
        (seq as i64) << 32 | b as i64
    }

    /// Worker `w` stores the `n` blocks of sequence `seq` in order, eight
    /// to a parent-linked event.
    fn store_seq(ix: &mut Indexer, w: WorkerId, seq: u32, n: usize) {
        let t = seq_tokens(seq, n);
        for first in (0..n).step_by(8) {
            let end = (first + 8).min(n);
            let hashes: Vec<i64> = (first..end).map(|b| seq_hash(seq, b)).collect();
            let parent = (first > 0).then(|| seq_hash(seq, first - 1));
            ix.apply(w, &stored(&hashes, parent, t[first * 4..end * 4].to_vec(), "GPU"));
        }
    }

    /// Worker `w` removes the blocks `blocks` of sequence `seq`, one to an
    /// event.
    fn remove_seq(ix: &mut Indexer, w: WorkerId, seq: u32, blocks: impl Iterator<Item = usize>) {
        for b in blocks {
            ix.apply(w, &removed(&[seq_hash(seq, b)], "GPU"));
        }
    }

    /// After the removals, the runs were compacted, the invariants hold, and
    /// a lookup of sequence `seq` finds its `n` blocks at worker `w`.
    fn check_found_after_compaction(ix: &Indexer, used: usize, w: WorkerId, seq: u32, n: usize) {
        assert!(ix.index.runs.slots_used() < used, "the runs were compacted");
        ix.check_invariants();
        let m = ix.find_matches(&keys_of(&seq_tokens(seq, n)));
        assert_eq!(m.iter().map(|o| (o.worker, o.any_tier_blocks)).collect::<Vec<_>>(), vec![(w, n as u32)]);
    }

    /// A compaction that moves a key away from its parent's slot makes it a
    /// run head. Sequence A fills one chunk and half the next; sequence B
    /// follows it in the same stream, and all of B but a few blocks in later
    /// chunks is removed. The half-empty chunk is then moved while the full
    /// one before it stays: A's first key in the moved chunk no longer sits
    /// after its parent's slot, and a lookup of A must still see all of it.
    #[test]
    fn a_key_moved_away_from_its_parent_is_found() {
        const A: usize = 1536;
        const B: usize = 8192;
        let mut ix = Indexer::new(config());
        let w = ix.add_worker("0");
        store_seq(&mut ix, w, 1, A);
        store_seq(&mut ix, w, 2, B);
        let used = ix.index.runs.slots_used();
        remove_seq(&mut ix, w, 2, (0..B).filter(|b| *b < 512 || b % 64 != 0));
        check_found_after_compaction(&ix, used, w, 1, A);
    }

    /// A key left in place after a moved chunk, chained to that chunk's
    /// last slot, becomes a run head. Sequence X fills the first 600 slots
    /// of a chunk and sequence A the rest of it and the next chunk; X is
    /// removed, and most of a third sequence B, so that the runs compact:
    /// A's first chunk (424 keys left) moves, the full one after it stays,
    /// and A's key at that chunk's start no longer follows its parent.
    #[test]
    fn a_key_after_a_moved_chunk_is_found() {
        const X: usize = 600;
        const A: usize = 1448;
        const B: usize = 8192;
        let mut ix = Indexer::new(config());
        let w = ix.add_worker("0");
        store_seq(&mut ix, w, 1, X);
        store_seq(&mut ix, w, 2, A);
        store_seq(&mut ix, w, 3, B);
        let used = ix.index.runs.slots_used();
        remove_seq(&mut ix, w, 1, (0..X).rev());
        remove_seq(&mut ix, w, 3, (0..B).rev().filter(|b| b % 64 != 0));
        check_found_after_compaction(&ix, used, w, 2, A);
    }

    /// A prefix that 64 workers hold in the same tier is one interned holder
    /// set for all its keys, and a lookup answers every worker with the whole
    /// prefix; when one worker drops a block, that key alone gets a set of
    /// its own, and the other keys keep sharing theirs.
    #[test]
    fn one_set_for_a_prefix_held_by_many() {
        let mut ix = Indexer::new(config());
        let tokens = tokens(0);
        let hashes: Vec<i64> = (0..12).map(|b| hash(0, b)).collect();
        for w in 0..64 {
            let id = ix.add_worker(&w.to_string());
            ix.apply(id, &stored(&hashes, None, tokens.clone(), "GPU"));
        }
        assert_eq!(ix.index.sets_live(), 1);
        let keys = keys_of(&tokens);
        let m = ix.find_matches(&keys);
        assert_eq!(m.len(), 64);
        assert!(m.iter().all(|o| o.device_blocks == 12 && o.any_tier_blocks == 12));
        ix.apply(WorkerId(5), &removed(&hashes[6..7], "GPU"));
        assert_eq!(ix.index.sets_live(), 2);
        let m = ix.find_matches(&keys);
        assert_eq!((m[5].worker.0, m[5].any_tier_blocks), (5, 6));
        assert!(m.iter().filter(|o| o.worker.0 != 5).all(|o| o.any_tier_blocks == 12));
        ix.check_invariants();
    }
}

mod text_lookups {
    use super::*;
    use crate::hashing::{RouterScope, TextKeys};
    use crate::indexer::LOOKUP_CHUNK_BLOCKS;
    use proptest::prelude::*;

    /// Prompt `p`'s engine hash and tokens of block `j`: the first `shared`
    /// blocks are the same in every prompt (a system prompt), the rest are
    /// the prompt's own.
    fn block(p: usize, j: usize, shared: usize) -> (i64, Vec<u32>) {
        let id = if j < shared { j } else { (p + 1) * 1000 + j };
        (id as i64 + 1, (0..4).map(|t| (id * 4 + t) as u32).collect())
    }

    fn prompt_tokens(p: usize, blocks: usize, shared: usize) -> Vec<u32> {
        (0..blocks).flat_map(|j| block(p, j, shared).1).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        /// The lookup that hashes a prompt only as far as some worker may
        /// hold it answers as the lookup of all its keys, whatever prefixes
        /// the workers hold (shorter and longer than a chunk of
        /// `LOOKUP_CHUNK_BLOCKS`, with blocks removed from their middles),
        /// for prompts that leave the cache before, at and after a chunk's
        /// end.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn hashing_as_far_as_held_answers_as_all_keys(
            shared in 0..80usize,
            stores in proptest::collection::vec((0..3u32, 0..4usize, 0..130usize), 1..12),
            holes in proptest::collection::vec((0..3u32, 0..4usize, 0..130usize), 0..6),
            extra in 0..70usize,
        ) {
            let mut ix = Indexer::new(config());
            for w in 0..3 {
                ix.add_worker(&w.to_string());
            }
            for &(w, p, n) in &stores {
                for start in (0..n).step_by(16) {
                    let end = (start + 16).min(n);
                    let blocks: Vec<_> = (start..end).map(|j| block(p, j, shared)).collect();
                    let hashes: Vec<i64> = blocks.iter().map(|b| b.0).collect();
                    let tokens = blocks.iter().flat_map(|b| b.1.clone()).collect();
                    let parent = start.checked_sub(1).map(|j| block(p, j, shared).0);
                    ix.apply(WorkerId(w), &stored(&hashes, parent, tokens, "GPU"));
                }
            }
            for &(w, p, j) in &holes {
                ix.apply(WorkerId(w), &removed(&[block(p, j, shared).0], "GPU"));
            }
            let scope = RouterScope { block_size: 4, lora: None, cache_salt: None };
            for p in 0..4 {
                for blocks in [1, LOOKUP_CHUNK_BLOCKS, LOOKUP_CHUNK_BLOCKS + 1, 130 + extra] {
                    let mut tokens = prompt_tokens(p, blocks, shared);
                    tokens.extend([7, 7]);
                    let all = ix.find_matches(&scope.text_keys(&tokens));
                    prop_assert_eq!(ix.find_matches_text(&scope, &tokens), all);
                }
            }
        }
    }

    /// A prompt is hashed no further than the chunk holding the first key
    /// that nobody holds, wherever that key falls (inside the first chunk,
    /// on a chunk's first key, inside a later one).
    #[test]
    fn hashing_stops_in_the_chunk_where_the_walk_stops() {
        for held in [10, LOOKUP_CHUNK_BLOCKS, LOOKUP_CHUNK_BLOCKS + 4] {
            let mut ix = Indexer::new(config());
            let w = ix.add_worker("w");
            let blocks: Vec<_> = (0..held).map(|j| block(0, j, 0)).collect();
            let hashes: Vec<i64> = blocks.iter().map(|b| b.0).collect();
            ix.apply(w, &stored(&hashes, None, blocks.iter().flat_map(|b| b.1.clone()).collect(), "GPU"));
            let scope = RouterScope { block_size: 4, lora: None, cache_salt: None };
            let tokens = prompt_tokens(0, 200, 0);
            let mut src = TextKeys::new(&scope, &tokens, LOOKUP_CHUNK_BLOCKS);
            let mut m = Vec::new();
            ix.walk(&mut src, &mut m);
            assert_eq!(src.keys.len(), (held / LOOKUP_CHUNK_BLOCKS + 1) * LOOKUP_CHUNK_BLOCKS, "held {held}");
            assert_eq!(m.len(), 1);
            assert_eq!(m[0].any_tier_blocks, held as u32);
            assert_eq!(ix.find_matches_text(&scope, &tokens), m);
        }
    }
}
