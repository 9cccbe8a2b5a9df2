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
