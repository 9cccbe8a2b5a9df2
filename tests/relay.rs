//! `kvcore_router::Relay` between real engines and a consumer reading its
//! republished sockets over loopback ZMQ: the `mm_hash` each image block
//! goes out with follows the fleet-wide UUID view, bounds included.

mod router_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvcore::wire::{WireEvent, decode_message};
use kvcore::{ImageDigest, TokenRun, mm_hash, mm_hash_of_identifier};
use kvcore_router::{IndexerConfig, Relay, RelayConfig, RelayWorker, SubscriberConfig};
use router_support::Worker;

const BS: u32 = 4;

/// What a consumer of the relay holds: per worker, block hash to the
/// `mm_hash`es it was last stored with.
struct Downstream {
    _ctx: zmq::Context,
    socks: Vec<zmq::Socket>,
    /// The next sequence number expected per worker (from the first seen).
    next_seq: Vec<Option<u64>>,
    held: Vec<HashMap<i64, Vec<u64>>>,
}

impl Downstream {
    fn new(relay: &Relay, n: usize) -> Self {
        let ctx = zmq::Context::new();
        let socks = (0..n)
            .map(|i| {
                let s = ctx.socket(zmq::SUB).unwrap();
                s.set_subscribe(b"").unwrap();
                s.connect(relay.endpoint(i).unwrap()).unwrap();
                s
            })
            .collect();
        Self { _ctx: ctx, socks, next_seq: vec![None; n], held: vec![HashMap::new(); n] }
    }

    /// Reads what arrived; sequence numbers must be contiguous from the
    /// first one seen.
    fn read(&mut self) {
        for (i, s) in self.socks.iter().enumerate() {
            while let Ok(frames) = s.recv_multipart(zmq::DONTWAIT) {
                let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
                let m = decode_message(&refs).expect("the relay's messages decode");
                assert_eq!(m.seq, self.next_seq[i].unwrap_or(m.seq), "worker {i}: contiguous sequence numbers");
                self.next_seq[i] = Some(m.seq + 1);
                for e in m.batch.events {
                    match e {
                        WireEvent::BlockStored(st) => {
                            for (k, h) in st.block_hashes.iter().enumerate() {
                                let mm = st.block_mm_infos.as_ref().and_then(|m| m[k].as_ref());
                                let hashes = mm.map(|m| m.mm_objects.iter().map(|o| o.mm_hash).collect());
                                self.held[i].insert(*h, hashes.unwrap_or_default());
                            }
                        }
                        WireEvent::BlockRemoved(r) => {
                            for h in r.block_hashes {
                                self.held[i].remove(&h);
                            }
                        }
                        WireEvent::AllBlocksCleared => self.held[i].clear(),
                        WireEvent::Unknown { .. } => {}
                    }
                }
            }
        }
    }

    /// Every `mm_hash` worker `i`'s image blocks hold now, sorted and deduplicated.
    fn image_hashes(&self, i: usize) -> Vec<u64> {
        let mut v: Vec<u64> = self.held[i].values().flatten().copied().collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Polls the relay and reads its output until `done` holds (20 s at most).
fn until(
    relay: &mut Relay,
    down: &mut Downstream,
    workers: &mut [&mut Worker],
    what: &str,
    done: impl Fn(&Downstream) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for w in workers.iter_mut() {
            w.publisher.publish(Vec::new());
        }
        relay.poll(Duration::from_millis(20)).unwrap();
        down.read();
        if done(down) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: worker views {:?} / {:?}",
            down.image_hashes(0),
            down.image_hashes(1)
        );
    }
}

/// With room for one UUID in the view: a's UUID evicted by another of its
/// UUIDs can no longer be vouched for, so a's blocks naming it go out again
/// under their content; b's copy of the UUID with other pixels goes out by
/// content too; once a clears, b is the only holder and its blocks go out
/// under the UUID again. The consumer's sequence numbers stay contiguous.
#[test]
fn a_bounded_view_republishes_what_it_cannot_vouch_for_by_content() {
    let (mut a, mut b) = (Worker::new(BS, 64, 0, 1000), Worker::new(BS, 64, 0, 1000));
    let workers: Vec<RelayWorker> = [&a, &b]
        .iter()
        .enumerate()
        .map(|(i, w)| RelayWorker {
            name: format!("w{i}"),
            upstream: w.publisher.endpoint().to_owned(),
            upstream_replay: w.publisher.replay_endpoint().map(str::to_owned),
            bind: "tcp://127.0.0.1:*".into(),
            bind_replay: None,
        })
        .collect();
    let config = RelayConfig {
        subscriber: SubscriberConfig {
            indexer: IndexerConfig { block_size: BS, uuids_max: 1, ..Default::default() },
            ..Default::default()
        },
        ..Default::default()
    };
    let mut relay = Relay::new(config, &workers).unwrap();
    let mut down = Downstream::new(&relay, 2);
    // Slow joiners: the consumer's subscriptions are live (it has received a
    // republished heartbeat of each worker) before anything is stored.
    until(&mut relay, &mut down, &mut [&mut a, &mut b], "the consumer joins", |d| {
        d.next_seq.iter().all(Option::is_some)
    });
    let run = TokenRun { start: 4, len: 4 };
    let (pa, pb) = (b"pixels on a".as_slice(), b"pixels on b".as_slice());
    let uuid = mm_hash_of_identifier("u");
    let content = |p: &[u8]| mm_hash(&ImageDigest::of_content(p), None);

    a.run(&(0..12).collect::<Vec<u32>>(), &[(pa, Some("u"), run)]).unwrap();
    until(&mut relay, &mut down, &mut [&mut a, &mut b], "a's image by UUID", |d| d.image_hashes(0) == vec![uuid]);

    // Another UUID on a evicts "u" from the view: a's "u" blocks by content.
    let other = b"other image".as_slice();
    a.run(&(100..112).collect::<Vec<u32>>(), &[(other, Some("v"), run)]).unwrap();
    let v = mm_hash_of_identifier("v");
    let want = {
        let mut w = vec![content(pa), v];
        w.sort_unstable();
        w
    };
    until(&mut relay, &mut down, &mut [&mut a, &mut b], "an evicted UUID goes out by content", |d| {
        d.image_hashes(0) == want
    });

    // b holds "u" with other pixels: unsure (and held twice), by content.
    b.run(&(0..12).collect::<Vec<u32>>(), &[(pb, Some("u"), run)]).unwrap();
    until(&mut relay, &mut down, &mut [&mut a, &mut b], "b's copy by content", |d| {
        d.image_hashes(1) == vec![content(pb)]
    });

    // a clears: b is the only holder of "u", and the view can vouch for it.
    a.engine.clear();
    a.step();
    until(&mut relay, &mut down, &mut [&mut a, &mut b], "b's copy by UUID once a cleared", |d| {
        d.image_hashes(0).is_empty() && d.image_hashes(1) == vec![uuid]
    });
    let c = relay.counters();
    assert!(c.blocks_restored >= 2, "{c:?}");
    assert!(relay.subscriber().indexer().counters().uuids_forgotten >= 1);
}

/// A consumer that joins the relay after its ring moved on reaches the
/// engine's exact state through the relay's replay socket: the relay
/// answers the too-old replay with its snapshot (tagged so that the next
/// live batch follows it) and forwards the engine's hash profile, which the
/// consumer checks.
#[test]
fn a_late_consumer_of_the_relay_recovers_past_its_ring() {
    use kvcore::Tier;
    use kvcore_router::Subscriber;
    let mut a = Worker::new(BS, 64, 0, 1000);
    let workers = vec![RelayWorker {
        name: "w0".into(),
        upstream: a.publisher.endpoint().to_owned(),
        upstream_replay: a.publisher.replay_endpoint().map(str::to_owned),
        bind: "tcp://127.0.0.1:*".into(),
        bind_replay: Some("tcp://127.0.0.1:*".into()),
    }];
    let indexer = IndexerConfig { block_size: BS, ..Default::default() };
    let config = RelayConfig {
        subscriber: SubscriberConfig { indexer: indexer.clone(), ..Default::default() },
        buffer_steps: 2,
        ..Default::default()
    };
    let mut relay = Relay::new(config, &workers).unwrap();
    // As `kvcore relay --resync`: the engine's snapshot reply brings its
    // hash profile, which the relay forwards.
    relay.resync_all().unwrap();
    let mut down = Downstream::new(&relay, 1);
    until(&mut relay, &mut down, &mut [&mut a], "the relay forwards", |d| d.next_seq[0].is_some());
    // Ten stores, each its own batch: the relay's ring of two moves on.
    for r in 0..10u32 {
        a.run(&(r * 100..r * 100 + 8).collect::<Vec<u32>>(), &[]).unwrap();
    }
    let want = a.advertised(Tier::Device);
    until(&mut relay, &mut down, &mut [&mut a], "the relay republished every store", |d| d.held[0].len() == want.len());

    let mut sub = Subscriber::new(SubscriberConfig { indexer, ..Default::default() });
    let id = sub.connect("late", relay.endpoint(0).unwrap(), relay.replay_endpoint(0)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while sub.indexer().worker_blocks(id, Tier::Device) != want {
        assert!(Instant::now() < deadline, "the late consumer never caught up: {:?}", sub.counters());
        a.publisher.publish(Vec::new());
        relay.poll(Duration::from_millis(20)).unwrap();
        sub.poll(Duration::from_millis(20)).unwrap();
    }
    // Later live batches apply on top of the snapshot.
    a.run(&(5000..5008).collect::<Vec<u32>>(), &[]).unwrap();
    let want = a.advertised(Tier::Device);
    let deadline = Instant::now() + Duration::from_secs(20);
    while sub.indexer().worker_blocks(id, Tier::Device) != want {
        assert!(Instant::now() < deadline, "live batches after the snapshot: {:?}", sub.counters());
        relay.poll(Duration::from_millis(20)).unwrap();
        sub.poll(Duration::from_millis(20)).unwrap();
    }
    let c = sub.counters();
    assert_eq!((c.batches_lost, c.recovery_timeouts, c.profile_mismatches), (0, 0, 0), "{c:?}");
    assert!(c.profiles_checked >= 1, "the relay forwards the engine's profile: {c:?}");
    assert!(relay.counters().replays_answered_by_snapshot >= 1, "{:?}", relay.counters());
}

/// A hybrid engine behind the relay: the relay republishes its main
/// group's events alone (Dynamo indexes nothing else, and the relay's
/// mirror holds one group), so a consumer of the relay holds chain A, which
/// the full-attention group stores, and nothing of chain B, which only the
/// sliding-window group holds, and sees no group besides the main one.
#[test]
fn the_relay_republishes_a_hybrid_engine_s_main_group() {
    use kvcore::{BlockKey, BlockStored, GroupKind, KvEvent, KvGroup, Publisher, PublisherConfig, Tier};
    use kvcore_router::Subscriber;
    let full = KvGroup { index: 0, kind: GroupKind::FullAttention };
    let window = KvGroup { index: 1, kind: GroupKind::SlidingWindow { window_tokens: 8 } };
    let stored = |chain: u8, group| {
        KvEvent::BlockStored(BlockStored {
            event_seq: 0,
            keys: (0..2).map(|i| BlockKey([chain + i; 32])).collect(),
            parent: None,
            token_ids: (0..8).map(|t| u32::from(chain) * 100 + t).collect(),
            block_size: BS,
            lora_id: None,
            lora_name: None,
            cache_salt: None,
            medium: Tier::Device,
            images: Vec::new(),
            block_images: Default::default(),
            group: Some(group),
        })
    };
    let mut up =
        Publisher::bind(PublisherConfig { endpoint: "tcp://127.0.0.1:*".into(), ..Default::default() }).unwrap();
    let workers = vec![RelayWorker {
        name: "hybrid".into(),
        upstream: up.endpoint().to_owned(),
        upstream_replay: None,
        bind: "tcp://127.0.0.1:*".into(),
        bind_replay: None,
    }];
    let indexer = IndexerConfig { block_size: BS, ..Default::default() };
    let config = RelayConfig {
        subscriber: SubscriberConfig { indexer: indexer.clone(), ..Default::default() },
        ..Default::default()
    };
    let mut relay = Relay::new(config, &workers).unwrap();
    let mut sub = Subscriber::new(SubscriberConfig { indexer, ..Default::default() });
    let id = sub.connect("down", relay.endpoint(0).unwrap(), None).unwrap();
    let chain_a: Vec<i64> = {
        let mut v: Vec<i64> = (0..2).map(|i| BlockKey([10 + i; 32]).wire_hash().0).collect();
        v.sort_unstable();
        v
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while sub.indexer().worker_blocks(id, Tier::Device) != chain_a {
        assert!(Instant::now() < deadline, "the consumer never held chain A: {:?}", relay.counters());
        // Resent until both sockets joined (ZMQ's slow joiner); stores of
        // blocks already held change nothing.
        up.publish(vec![stored(10, full), stored(10, window), stored(50, window)]);
        for _ in 0..5 {
            relay.poll(Duration::from_millis(20)).unwrap();
            sub.poll(Duration::from_millis(20)).unwrap();
        }
    }
    assert!(relay.counters().events_other_groups >= 2, "{:?}", relay.counters());
    assert!(sub.groups().is_empty(), "the relay republished a group besides the main one");
    assert_eq!(sub.groups().counters().group_events, 0);
}
