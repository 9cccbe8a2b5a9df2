//! Subscriber recovery cases one by one, over loopback ZMQ: a publisher
//! restart is detected (sequence going backwards) and healed by a snapshot,
//! and a late joiner catches up through a snapshot when the replay ring no
//! longer covers the start.

mod router_support;

use std::time::Duration;

use kvcore::HashProfile;
use kvcore::{Publisher, PublisherConfig};
use kvcore_router::{IndexerConfig, SubscribeError, Subscriber, SubscriberConfig, Tier};
use router_support::{Worker, sync};

fn subscriber() -> Subscriber {
    Subscriber::new(SubscriberConfig {
        indexer: IndexerConfig { block_size: 4, ..Default::default() },
        ..Default::default()
    })
}

/// A publisher replaced by a new one on the same endpoints starts again at
/// seq 0: the subscriber counts a restart, asks a snapshot, and its view
/// equals the engine's again.
#[test]
fn publisher_restart_is_healed_by_a_snapshot() {
    let mut w = Worker::new(4, 64, 0, 1000);
    let mut sub = subscriber();
    let id = w.subscribe(&mut sub, "w");
    for p in 0..6u32 {
        w.run(&(p * 100..p * 100 + 16).collect::<Vec<_>>(), &[]).unwrap();
    }
    assert!(sync(&mut sub, &mut [(&mut w, id)], Duration::from_secs(20)));
    let before = w.publisher.next_seq();
    assert!(before > 3);
    let (pub_ep, replay_ep) = (w.publisher.endpoint().to_owned(), w.publisher.replay_endpoint().map(str::to_owned));
    // Swap in a throwaway publisher so the old one can be dropped and its
    // ports freed, then bind the replacement on the same endpoints.
    let throwaway =
        Publisher::bind(PublisherConfig { endpoint: "tcp://127.0.0.1:*".into(), ..Default::default() }).unwrap();
    drop(std::mem::replace(&mut w.publisher, throwaway));
    let mut fresh = None;
    for _ in 0..50 {
        let config =
            PublisherConfig { endpoint: pub_ep.clone(), replay_endpoint: replay_ep.clone(), ..Default::default() };
        match Publisher::bind(config) {
            Ok(p) => {
                fresh = Some(p);
                break;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let mut fresh = fresh.expect("rebind the same endpoints");
    fresh.prime(w.engine.snapshot());
    w.publisher = fresh;
    // The engine goes on; its new publisher numbers from 0 again.
    w.engine.evict(3);
    w.step();
    w.run(&(7000..7012).collect::<Vec<_>>(), &[]).unwrap();
    assert!(w.publisher.next_seq() < before);
    assert!(sync(&mut sub, &mut [(&mut w, id)], Duration::from_secs(20)), "{:?}", sub.counters());
    let c = sub.counters();
    assert!(c.restarts >= 1, "{c:?}");
    assert!(c.snapshots_applied >= 1, "{c:?}");
    for tier in [Tier::Device, Tier::Host] {
        assert_eq!(sub.indexer().worker_blocks(id, tier), w.advertised(tier));
    }
}

/// A subscriber that joins after the replay ring has moved past seq 0 sees a
/// gap from 0, and the replay answers with the snapshot, which it applies.
#[test]
fn late_joiner_catches_up_by_snapshot() {
    let mut w = Worker::new(4, 64, 0, 2);
    for p in 0..8u32 {
        w.run(&(p * 50..p * 50 + 12).collect::<Vec<_>>(), &[]).unwrap();
    }
    w.publisher.flush(Duration::from_secs(5));
    let mut sub = subscriber();
    let id = w.subscribe(&mut sub, "late");
    assert!(sync(&mut sub, &mut [(&mut w, id)], Duration::from_secs(20)), "{:?}", sub.counters());
    let c = sub.counters();
    assert!(c.gaps >= 1 && c.snapshots_applied >= 1, "{c:?}");
    // The replay itself brought the snapshot: no second request.
    assert!(c.replays_answered_by_snapshot >= 1 && c.snapshots == 0, "{c:?}");
    assert_eq!(sub.indexer().worker_blocks(id, Tier::Device), w.advertised(Tier::Device));
    assert_eq!(w.advertised(Tier::Device).len(), 24);
}

/// A worker that publishes another hash profile than the router's (here its
/// image placeholder id; then its block size) is refused with an error that
/// names the field, its view stays empty and its batches are ignored; with
/// the same profile the same stream is accepted.
#[test]
fn a_worker_with_another_hash_profile_is_refused() {
    let mut w = Worker::new(4, 64, 0, 1000);
    for p in 0..3u32 {
        w.run(&(p * 100..p * 100 + 16).collect::<Vec<_>>(), &[]).unwrap();
    }
    let cases = [
        (Some(HashProfile::new(4, vec![32_000])), Some("image_placeholder_token_ids")),
        (None, None),
        (Some(w.engine.hash_profile()), None),
    ];
    for (profile, refused) in cases {
        let mut sub = Subscriber::new(SubscriberConfig {
            indexer: IndexerConfig { block_size: 4, ..Default::default() },
            profile,
            ..Default::default()
        });
        let id = w.subscribe(&mut sub, "w");
        sub.resync(id).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut error = None;
        while error.is_none() && sub.counters().snapshots_applied == 0 && std::time::Instant::now() < deadline {
            match sub.poll(Duration::from_millis(50)) {
                Ok(_) => {}
                Err(e) => error = Some(e),
            }
        }
        assert_eq!(sub.counters().profiles_checked, 1);
        match refused {
            Some(field) => {
                let e = error.expect("the mismatch is an error");
                assert!(matches!(&e, SubscribeError::ProfileMismatch { field: f, .. } if *f == field), "{e}");
                assert!(e.to_string().contains(field) && e.to_string().contains("151655"), "{e}");
                assert_eq!(sub.counters().snapshots_applied, 0);
                assert!(sub.indexer().worker_blocks(id, Tier::Device).is_empty());
                // Live batches of the refused worker are ignored.
                w.run(&[900, 901, 902, 903, 904], &[]).unwrap();
                w.publisher.flush(Duration::from_secs(5));
                for _ in 0..10 {
                    let _ = sub.poll(Duration::from_millis(30));
                }
                assert!(sub.indexer().worker_blocks(id, Tier::Device).is_empty());
            }
            None => {
                assert!(error.is_none(), "{error:?}");
                assert_eq!(sub.counters().snapshots_applied, 1);
                assert_eq!(sub.indexer().worker_blocks(id, Tier::Device), w.advertised(Tier::Device));
            }
        }
    }
    // Another block size is refused as well (the indexer's own block size is the default rule).
    let mut sub = Subscriber::new(SubscriberConfig {
        indexer: IndexerConfig { block_size: 8, ..Default::default() },
        ..Default::default()
    });
    let id = w.subscribe(&mut sub, "w");
    sub.resync(id).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let err = loop {
        if let Err(e) = sub.poll(Duration::from_millis(50)) {
            break e;
        }
        assert!(std::time::Instant::now() < deadline, "no profile check");
    };
    assert!(matches!(err, SubscribeError::ProfileMismatch { field: "block_size", .. }), "{err}");
}

/// A hybrid engine's stream over real ZMQ, joined late: the publisher's
/// replay ring no longer covers the start, so the subscriber rebuilds both
/// groups from the snapshot (which keeps each block's group, and sends a
/// sliding-window block whose parent the group released with that parent
/// unheld). A worker whose window lost the two blocks before the end scores
/// 6 of 8 while its main group, what Dynamo indexes, holds all 8; one whose
/// window lost only old blocks scores 8; live stores then heal the first.
#[test]
fn hybrid_stream_is_scored_per_group_after_a_snapshot() {
    use kvcore::{BlockKey, BlockRemoved, BlockStored, GroupKind, KvEvent, KvGroup};
    use kvcore_router::{NoUuids, TokenRequest, hash_request};
    let full = KvGroup { index: 0, kind: GroupKind::FullAttention };
    let window = KvGroup { index: 1, kind: GroupKind::SlidingWindow { window_tokens: 8 } };
    let tokens: Vec<u32> = (500..532).collect();
    let key = |i: usize| BlockKey([i as u8 + 1; 32]);
    let stored = |blocks: std::ops::Range<usize>, group| {
        KvEvent::BlockStored(BlockStored {
            event_seq: 0,
            keys: blocks.clone().map(key).collect(),
            parent: blocks.start.checked_sub(1).map(key),
            token_ids: tokens[blocks.start * 4..blocks.end * 4].to_vec(),
            block_size: 4,
            lora_id: None,
            lora_name: None,
            cache_salt: None,
            medium: Tier::Device,
            images: Vec::new(),
            block_images: Default::default(),
            group: Some(group),
        })
    };
    let removed = |blocks: &[usize]| {
        KvEvent::BlockRemoved(BlockRemoved {
            event_seq: 0,
            keys: blocks.iter().map(|&i| key(i)).collect(),
            medium: Tier::Device,
            group: Some(window),
        })
    };
    let publisher = || {
        Publisher::bind(PublisherConfig {
            endpoint: "tcp://127.0.0.1:*".into(),
            replay_endpoint: Some("tcp://127.0.0.1:*".into()),
            buffer_steps: 1,
            ..Default::default()
        })
        .unwrap()
    };
    let (mut lost_end, mut lost_old) = (publisher(), publisher());
    for (p, lost) in [(&mut lost_end, [6, 7].as_slice()), (&mut lost_old, [0, 1, 2, 3].as_slice())] {
        p.publish(vec![stored(0..8, full), stored(0..8, window)]);
        p.publish(vec![removed(lost)]);
        p.publish(Vec::new());
        assert!(p.flush(Duration::from_secs(5)));
    }
    let mut sub = subscriber();
    let a = sub.connect("lost-end", lost_end.endpoint(), lost_end.replay_endpoint()).unwrap();
    let b = sub.connect("lost-old", lost_old.endpoint(), lost_old.replay_endpoint()).unwrap();
    let sync = |sub: &mut Subscriber, ps: [&mut Publisher; 2]| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            for p in ps.iter() {
                p.flush(Duration::from_secs(5));
            }
            let targets = [(a, ps[0].next_seq()), (b, ps[1].next_seq())];
            if sub.poll_until_synced(&targets, Duration::from_millis(300)).unwrap() {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "subscriber caught up");
        }
    };
    sub.resync(a).unwrap();
    sub.resync(b).unwrap();
    sync(&mut sub, [&mut lost_end, &mut lost_old]);
    assert!(sub.counters().snapshots_applied >= 2, "{:?}", sub.counters());
    let keys =
        hash_request(&TokenRequest { tokens: tokens.clone(), ..Default::default() }, 4, 0, &NoUuids).unwrap().keys;
    let score = |sub: &Subscriber| {
        let mut v: Vec<(u32, u32)> = sub.find_matches(&keys).iter().map(|o| (o.worker.0, o.device_blocks)).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(score(&sub), vec![(a.0, 6), (b.0, 8)]);
    let main: Vec<u32> = sub.indexer().find_matches(&keys).iter().map(|o| o.device_blocks).collect();
    assert_eq!(main, vec![8, 8], "the main group holds every block");
    assert_eq!(sub.groups().group_blocks(b, 1, Tier::Device).len(), 4);
    // Live: the window's last blocks come back.
    lost_end.publish(vec![stored(6..8, window)]);
    sync(&mut sub, [&mut lost_end, &mut lost_old]);
    assert_eq!(score(&sub), vec![(a.0, 8), (b.0, 8)]);
}
