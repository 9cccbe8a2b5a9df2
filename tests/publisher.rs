//! The ZMQ publisher on real loopback sockets: live stream, replay ring,
//! snapshots, drops as counted gaps, and a stalled subscriber.

use std::time::{Duration, Instant};

use kvcore::wire::{END_SEQ, PROFILE_REQUEST, SNAPSHOT_REQUEST, endpoint_for_rank};
use kvcore::wire::{EncodeOptions, decode_message, decode_payload, wire_event};
use kvcore::wire::{WireEvent, WireMessage};
use kvcore::{Engine, EngineConfig, KvEvent, MmContent, MmItemSpec, RequestSpec, TokenRun};
use kvcore::{HashProfile, Publisher, PublisherConfig};

fn config() -> PublisherConfig {
    PublisherConfig {
        endpoint: "tcp://127.0.0.1:*".into(),
        replay_endpoint: Some("tcp://127.0.0.1:*".into()),
        topic: b"kv".to_vec(),
        data_parallel_rank: Some(0),
        // Off unless a test is about them: a heartbeat is a batch of its own.
        heartbeat_ms: 0,
        ..Default::default()
    }
}

fn engine() -> Engine {
    Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 64, ..Default::default() }).unwrap()
}

/// Runs one request to completion: admit, compute all, finish, step.
fn run(engine: &mut Engine, tokens: &[u32], image: Option<(&[u8], &str, TokenRun)>) {
    let spec = RequestSpec {
        tokens,
        items: image
            .map(|(bytes, _, run)| vec![MmItemSpec { content: MmContent::Bytes(bytes), runs: vec![run] }])
            .unwrap_or_default(),
        uuids: image.map(|(_, uuid, _)| vec![Some(uuid.as_bytes())]),
        ..Default::default()
    };
    let a = engine.add_request(&spec).unwrap();
    engine.commit(a.id, tokens.len() as u64).unwrap();
    engine.finish(a.id).unwrap();
    engine.step();
}

struct Sub {
    socket: zmq::Socket,
}

impl Sub {
    fn connect(ctx: &zmq::Context, endpoint: &str) -> Self {
        let socket = ctx.socket(zmq::SUB).unwrap();
        socket.set_subscribe(b"").unwrap();
        socket.set_rcvtimeo(5000).unwrap();
        socket.connect(endpoint).unwrap();
        Self { socket }
    }

    fn recv(&self) -> WireMessage {
        let frames = self.socket.recv_multipart(0).expect("a message within 5 s");
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        decode_message(&refs).unwrap()
    }
}

/// Publishes empty batches until the subscriber sees one (ZMQ's slow joiner),
/// then drains what is in flight; returns the next sequence number.
fn sync(publisher: &mut Publisher, sub: &Sub) -> u64 {
    sub.socket.set_rcvtimeo(20).unwrap();
    let mut last = None;
    for _ in 0..500 {
        publisher.publish(Vec::new());
        if let Ok(frames) = sub.socket.recv_multipart(0) {
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            last = Some(decode_message(&refs).unwrap().seq);
            break;
        }
    }
    assert!(last.is_some(), "subscriber never joined");
    assert!(publisher.flush(Duration::from_secs(5)));
    while let Ok(frames) = sub.socket.recv_multipart(0) {
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        last = Some(decode_message(&refs).unwrap().seq);
    }
    sub.socket.set_rcvtimeo(5000).unwrap();
    last.unwrap() + 1
}

fn request(ctx: &zmq::Context, endpoint: &str, request: &[u8]) -> Vec<WireMessage> {
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.set_rcvtimeo(5000).unwrap();
    dealer.connect(endpoint).unwrap();
    dealer.send_multipart([&b""[..], request], 0).unwrap();
    let mut out = Vec::new();
    loop {
        let frames = dealer.recv_multipart(0).expect("a reply within 5 s");
        assert_eq!(frames[0], b"", "replies start with the empty delimiter");
        if frames[2] == END_SEQ {
            assert_eq!(frames.len(), 4);
            return out;
        }
        let refs: Vec<&[u8]> = frames[1..].iter().map(Vec::as_slice).collect();
        out.push(decode_message(&refs).unwrap());
    }
}

/// A step's batch must arrive as three frames whose payload decodes to exactly
/// the projection of the engine's typed events, with consecutive seq numbers.
#[test]
fn engine_steps_arrive_in_order_and_decode_to_their_events() {
    let ctx = zmq::Context::new();
    let mut publisher = Publisher::bind(config()).unwrap();
    let sub = Sub::connect(&ctx, publisher.endpoint());
    let first = sync(&mut publisher, &sub);
    let mut e = engine();
    e.attach_publisher(publisher);
    let mut expected = Vec::new();
    run(&mut e, &[1, 2, 3, 4, 5, 6, 7, 8, 9], None);
    expected.extend(e.drain_batches());
    run(&mut e, &[1, 2, 3, 4, 9, 9, 9, 9, 10, 11, 12, 13], Some((b"cat", "uuid-cat", TokenRun { start: 4, len: 6 })));
    expected.extend(e.drain_batches());
    e.evict(8);
    e.step();
    expected.extend(e.drain_batches());
    e.clear();
    e.step();
    expected.extend(e.drain_batches());
    assert_eq!(expected.len(), 4);
    for (i, batch) in expected.iter().enumerate() {
        let m = sub.recv();
        assert_eq!(m.topic, b"kv");
        assert_eq!(m.seq, first + i as u64);
        assert_eq!(m.batch.data_parallel_rank, Some(0));
        let want: Vec<WireEvent> = batch.events.iter().map(|ev| wire_event(ev, &EncodeOptions::default())).collect();
        assert_eq!(m.batch.events, want);
    }
    let stats = e.publisher().unwrap().stats();
    assert_eq!((stats.dropped_queue_full, stats.dropped_send_failed), (0, 0));
}

/// With `event_batches_max` 0 and a publisher attached, every batch goes to
/// the wire and none is kept for draining: a publish-only caller holds no
/// growing queue, and nothing is lost on the stream.
#[test]
fn publish_only_engine_keeps_no_batches() {
    let ctx = zmq::Context::new();
    let mut publisher = Publisher::bind(config()).unwrap();
    let sub = Sub::connect(&ctx, publisher.endpoint());
    let first = sync(&mut publisher, &sub);
    let mut e = Engine::new(EngineConfig {
        block_size_tokens: 4,
        blocks_device: 64,
        event_batches_max: 0,
        ..Default::default()
    })
    .unwrap();
    e.attach_publisher(publisher);
    for i in 0..3u32 {
        run(&mut e, &[10 + i, 1, 2, 3, 4], None);
    }
    assert!(e.drain_batches().is_empty());
    for i in 0..3u64 {
        let m = sub.recv();
        assert_eq!(m.seq, first + i);
        assert!(matches!(m.batch.events.as_slice(), [WireEvent::BlockStored(_)]));
    }
}

/// Replay must serve every retained batch from the asked sequence number on,
/// keep only `buffer_steps` of them, and end with the END sentinel.
#[test]
fn replay_serves_the_retained_tail_then_end() {
    let ctx = zmq::Context::new();
    let mut publisher = Publisher::bind(PublisherConfig { buffer_steps: 5, ..config() }).unwrap();
    let mut e = engine();
    let mut payloads = Vec::new();
    for i in 0..8u32 {
        run(&mut e, &[100 + i, 2, 3, 4], None);
        let batch = e.drain_batches().pop().unwrap();
        payloads.push(batch.events.clone());
        publisher.publish(batch.events);
    }
    assert!(publisher.flush(Duration::from_secs(5)));
    let replay = publisher.replay_endpoint().unwrap().to_owned();
    let got = request(&ctx, &replay, &4u64.to_be_bytes());
    assert_eq!(got.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![4, 5, 6, 7]);
    for m in &got {
        let want: Vec<WireEvent> =
            payloads[m.seq as usize].iter().map(|ev| wire_event(ev, &EncodeOptions::default())).collect();
        assert_eq!(m.batch.events, want);
    }
    // Older than the ring (8 published, 5 kept): the answer is the snapshot,
    // tagged with the last batch it covers, so the next live batch (8) follows.
    let got = request(&ctx, &replay, &0u64.to_be_bytes());
    assert_eq!(got.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![7]);
    assert_eq!(got[0].batch.events.first(), Some(&WireEvent::AllBlocksCleared));
    let stores: Vec<i64> = got[0]
        .batch
        .events
        .iter()
        .filter_map(|ev| match ev {
            WireEvent::BlockStored(s) => Some(s.block_hashes[0]),
            _ => None,
        })
        .collect();
    let mut want: Vec<i64> = e.cached_blocks().map(|b| b.key.wire_hash().0).collect();
    let mut have = stores.clone();
    want.sort_unstable();
    have.sort_unstable();
    assert_eq!(have, want, "every held block, once");
    assert!(request(&ctx, &replay, &100u64.to_be_bytes()).is_empty());
    assert!(request(&ctx, &replay, b"bad request").is_empty());
    let stats = publisher.stats();
    assert_eq!((stats.replays_served, stats.replays_answered_by_snapshot, stats.bad_requests), (3, 1, 1));
}

/// A snapshot must equal the engine's own full state (same blocks, same
/// content), be tagged with the next live sequence number, and reflect
/// removals and a clear.
#[test]
fn snapshot_matches_engine_state_and_is_tagged_with_next_seq() {
    let ctx = zmq::Context::new();
    let mut e = engine();
    // State from before the publisher existed must be in its snapshots too.
    run(&mut e, &[7, 7, 7, 7, 8, 8, 8, 8], None);
    e.drain_batches();
    e.attach_publisher(Publisher::bind(config()).unwrap());
    run(&mut e, &[1, 2, 3, 4, 5, 6, 7, 8, 9], None);
    run(&mut e, &[1, 2, 3, 4, 9, 9, 9, 9, 10, 11, 12, 13], Some((b"cat", "uuid-cat", TokenRun { start: 4, len: 6 })));
    run(&mut e, &[50, 51, 52, 53, 54, 55, 56, 57], Some((b"dog", "uuid-dog", TokenRun { start: 1, len: 6 })));
    e.evict(2);
    e.step();
    let check = |e: &mut Engine, ctx: &zmq::Context| {
        let p = e.publisher().unwrap();
        assert!(p.flush(Duration::from_secs(5)));
        let next = p.next_seq();
        let got = request(ctx, p.replay_endpoint().unwrap(), SNAPSHOT_REQUEST);
        assert_eq!(got.len(), 1, "a snapshot is one batch");
        assert_eq!(got[0].seq, next, "tagged with the first live seq it does not include");
        let mut want: Vec<WireEvent> =
            e.snapshot().iter().map(|ev| wire_event(ev, &EncodeOptions::default())).collect();
        let mut have = got[0].batch.events.clone();
        assert_eq!(have.first(), Some(&WireEvent::AllBlocksCleared));
        let key = |w: &WireEvent| format!("{w:?}");
        want.sort_by_key(key);
        have.sort_by_key(key);
        assert_eq!(have, want);
        have.len()
    };
    let (device, _) = e.blocks_cached();
    assert!(device >= 4);
    assert_eq!(check(&mut e, &ctx), device + 1);
    e.clear();
    e.step();
    assert_eq!(check(&mut e, &ctx), 1);
}

/// When the queue is full the batch is dropped, its seq stays a gap on the
/// wire, the drop is counted, and snapshots still include its blocks.
#[test]
fn full_queue_drops_are_counted_gaps_and_snapshots_stay_exact() {
    let ctx = zmq::Context::new();
    let mut publisher = Publisher::bind(PublisherConfig { queue_capacity: 1, send_hwm: 0, ..config() }).unwrap();
    let sub = {
        let socket = ctx.socket(zmq::SUB).unwrap();
        socket.set_rcvhwm(0).unwrap(); // unlimited: every sent batch must arrive
        socket.set_subscribe(b"").unwrap();
        socket.connect(publisher.endpoint()).unwrap();
        Sub { socket }
    };
    let first = sync(&mut publisher, &sub);
    let big: Vec<KvEvent> = {
        let mut warm =
            Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 2048, ..Default::default() }).unwrap();
        run(&mut warm, &(0..4000).collect::<Vec<u32>>(), None);
        warm.drain_events()
    };
    // Fill the one-slot queue with a slow-to-encode batch, then offer a batch
    // that stores a block of its own, until one such batch is dropped.
    let mut e = engine();
    let mut dropped_store = None;
    for k in 0..10_000u32 {
        publisher.publish(big.clone());
        run(&mut e, &[9, 9, 9, 1000 + k], None);
        let stored = e.drain_events();
        let before = publisher.stats().dropped_queue_full;
        publisher.publish(stored.clone());
        if publisher.stats().dropped_queue_full > before {
            dropped_store = Some(stored);
            break;
        }
    }
    let stored = dropped_store.expect("a one-slot queue overflowed");
    assert!(publisher.flush(Duration::from_secs(10)));
    publisher.publish(Vec::new()); // carries the dropped events to the mirror
    assert!(publisher.flush(Duration::from_secs(10)));
    let stats = publisher.stats();
    assert!(stats.dropped_queue_full > 0);
    assert_eq!(
        stats.batches_reserved,
        stats.batches_handed_to_socket + stats.dropped_queue_full + stats.dropped_send_failed
    );
    // The subscriber sees exactly the sent batches; the rest are gaps.
    let mut gaps = 0u64;
    let mut expect = first;
    while expect < publisher.next_seq() {
        let m = sub.recv();
        assert!(m.seq >= expect, "seq numbers only grow");
        gaps += m.seq - expect;
        expect = m.seq + 1;
    }
    assert_eq!(gaps, stats.dropped_queue_full, "every drop is a gap and every gap a drop");
    let snap = request(&ctx, publisher.replay_endpoint().unwrap(), SNAPSHOT_REQUEST);
    let want = wire_event(&stored[0], &EncodeOptions::default());
    let WireEvent::BlockStored(w) = want else { panic!("expected BlockStored") };
    let found = snap[0].batch.events.iter().any(|ev| match ev {
        WireEvent::BlockStored(s) => s.block_hashes == w.block_hashes && s.token_ids == w.token_ids,
        _ => false,
    });
    assert!(found, "the dropped batch's block is in the snapshot");
}

/// A heartbeat after a dropped batch carries the dropped events to the
/// mirror like any batch: a snapshot tagged past the drop includes them.
#[test]
fn a_heartbeat_carries_dropped_events_to_the_snapshot() {
    let ctx = zmq::Context::new();
    let mut publisher =
        Publisher::bind(PublisherConfig { queue_capacity: 1, send_hwm: 0, heartbeat_ms: 100, ..config() }).unwrap();
    let big: Vec<KvEvent> = {
        let mut warm =
            Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 2048, ..Default::default() }).unwrap();
        run(&mut warm, &(0..4000).collect::<Vec<u32>>(), None);
        warm.drain_events()
    };
    let mut e = engine();
    let mut dropped_store = None;
    for k in 0..10_000u32 {
        publisher.publish(big.clone());
        run(&mut e, &[9, 9, 9, 2000 + k], None);
        let stored = e.drain_events();
        let before = publisher.stats().dropped_queue_full;
        publisher.publish(stored.clone());
        if publisher.stats().dropped_queue_full > before {
            dropped_store = Some(stored);
            break;
        }
    }
    let stored = dropped_store.expect("a one-slot queue overflowed");
    assert!(publisher.flush(Duration::from_secs(10)));
    // Idle now: only a heartbeat can carry the dropped events.
    let heartbeats = publisher.stats().heartbeats;
    let deadline = Instant::now() + Duration::from_secs(5);
    while publisher.stats().heartbeats == heartbeats {
        assert!(Instant::now() < deadline, "no heartbeat");
        std::thread::sleep(Duration::from_millis(20));
    }
    let snap = request(&ctx, publisher.replay_endpoint().unwrap(), SNAPSHOT_REQUEST);
    let WireEvent::BlockStored(w) = wire_event(&stored[0], &EncodeOptions::default()) else { panic!() };
    assert!(snap[0].seq > 0);
    let found = snap[0].batch.events.iter().any(|ev| match ev {
        WireEvent::BlockStored(s) => s.block_hashes == w.block_hashes,
        _ => false,
    });
    assert!(found, "the dropped batch's block is in the snapshot tagged {}", snap[0].seq);
}

/// A subscriber that stops reading must not stall publishing: the publisher
/// thread keeps draining its queue (PUB drops at the high-water mark).
#[test]
fn stalled_subscriber_does_not_block_publishing() {
    let ctx = zmq::Context::new();
    let mut publisher = Publisher::bind(PublisherConfig { send_hwm: 16, replay_endpoint: None, ..config() }).unwrap();
    let stalled = ctx.socket(zmq::SUB).unwrap();
    stalled.set_rcvhwm(16).unwrap();
    stalled.set_subscribe(b"").unwrap();
    stalled.connect(publisher.endpoint()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut e = engine();
    run(&mut e, &(0..64).collect::<Vec<u32>>(), None);
    let batch = e.drain_events();
    let start = Instant::now();
    for _ in 0..20_000 {
        publisher.publish(batch.clone());
    }
    assert!(publisher.flush(Duration::from_secs(30)), "the publisher thread kept up");
    let stats = publisher.stats();
    assert_eq!(stats.batches_reserved, 20_000);
    assert_eq!(stats.batches_handed_to_socket + stats.dropped_queue_full, 20_000);
    assert!(start.elapsed() < Duration::from_secs(30));
    // The stalled socket holds at most its high-water marks' worth.
    stalled.set_rcvtimeo(100).unwrap();
    let mut held = 0;
    while stalled.recv_multipart(0).is_ok() {
        held += 1;
    }
    assert!(held < 20_000, "held {held}");
}

/// An idle publisher sends an empty batch with the next sequence number once
/// per heartbeat, so a subscriber that joins after the last step still sees
/// where the stream stands (and its gap from 0) without waiting for a step;
/// with heartbeats off it sees nothing.
#[test]
fn an_idle_publisher_sends_heartbeats_with_the_next_seq() {
    let ctx = zmq::Context::new();
    for on in [true, false] {
        let mut e = engine();
        let heartbeat_ms = if on { 50 } else { 0 };
        let mut publisher = Publisher::bind(PublisherConfig { heartbeat_ms, ..config() }).unwrap();
        for i in 0..3u32 {
            run(&mut e, &[200 + i, 2, 3, 4], None);
            publisher.publish(e.drain_batches().pop().unwrap().events);
        }
        assert!(publisher.flush(Duration::from_secs(5)));
        // Joins after the last step; the engine stays idle from here on.
        let sub = Sub::connect(&ctx, publisher.endpoint());
        sub.socket.set_rcvtimeo(600).unwrap();
        let got = sub.socket.recv_multipart(0);
        if !on {
            assert!(got.is_err(), "no heartbeat when they are off");
            assert_eq!(publisher.stats().heartbeats, 0);
            continue;
        }
        let frames = got.expect("a heartbeat within 600 ms of joining");
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let m = decode_message(&refs).unwrap();
        assert!(m.seq >= 3, "numbered after the three batches: {}", m.seq);
        assert!(m.batch.events.is_empty());
        let next = sub.recv();
        assert_eq!(next.seq, m.seq + 1, "heartbeats are consecutive");
        // A step after heartbeats continues the numbering, and replay serves
        // the heartbeats too, so a replaying consumer sees no hole.
        run(&mut e, &[300, 2, 3, 4], None);
        let seq = publisher.publish(e.drain_batches().pop().unwrap().events);
        assert!(seq > next.seq);
        assert!(publisher.flush(Duration::from_secs(5)));
        let replayed = request(&ctx, publisher.replay_endpoint().unwrap(), &0u64.to_be_bytes());
        assert_eq!(replayed.iter().map(|m| m.seq).collect::<Vec<_>>(), (0..=seq).collect::<Vec<_>>());
        let stats = publisher.stats();
        assert!(stats.heartbeats >= 2);
        assert_eq!(
            stats.batches_reserved,
            stats.batches_handed_to_socket + stats.dropped_queue_full + stats.dropped_send_failed
        );
    }
}

/// A request that ends with `PROFILE_REQUEST` gets the publisher's hash
/// profile first (the engine's block size and placeholder); one without it
/// gets the vLLM protocol unchanged.
#[test]
fn replies_carry_the_hash_profile_when_asked() {
    let ctx = zmq::Context::new();
    let mut e = engine();
    e.vacant_publisher().unwrap().start(config()).unwrap();
    let p = e.publisher().unwrap();
    let endpoint = p.replay_endpoint().unwrap().to_owned();
    for req in [&0u64.to_be_bytes()[..], SNAPSHOT_REQUEST] {
        let dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_rcvtimeo(5000).unwrap();
        dealer.connect(&endpoint).unwrap();
        dealer.send_multipart([&b""[..], req, PROFILE_REQUEST], 0).unwrap();
        let first = dealer.recv_multipart(0).unwrap();
        assert_eq!(first.len(), 3, "[\"\", PROFILE_REQUEST, json]");
        assert_eq!(first[1], PROFILE_REQUEST);
        let profile = HashProfile::from_json(&first[2]).unwrap();
        assert_eq!(profile, HashProfile::new(4, vec![kvcore::QWEN_IMAGE_PAD_TOKEN]));
        assert_eq!(profile, e.hash_profile());
    }
    // Without the trailing frame: no profile message.
    let plain = request(&ctx, &endpoint, SNAPSHOT_REQUEST);
    assert_eq!(plain.len(), 1);
    // model_info publishes the same profile.
    let info = kvcore::model_info(e.config(), &kvcore::Deployment::default());
    assert_eq!(serde_json::from_value::<HashProfile>(info["hash_profile"].clone()).unwrap(), e.hash_profile());
}

/// A subscriber that stops reading loses batches at the high-water mark while
/// the socket takes every one of them: the counter says "handed to the
/// socket", the subscriber sees the loss as a gap, and a replay heals it.
#[test]
fn a_stalled_subscriber_sees_a_gap_that_replay_heals() {
    let ctx = zmq::Context::new();
    // The queue to the publisher thread holds every batch, so that only the
    // socket's high-water mark can lose any.
    let config = PublisherConfig { send_hwm: 8, buffer_steps: 10_000, queue_capacity: 4096, ..config() };
    let mut publisher = Publisher::bind(config).unwrap();
    let stalled = ctx.socket(zmq::SUB).unwrap();
    stalled.set_rcvhwm(8).unwrap();
    stalled.set_subscribe(b"").unwrap();
    stalled.connect(publisher.endpoint()).unwrap();
    let sub = Sub { socket: stalled };
    let first = sync(&mut publisher, &sub);
    let mut e = engine();
    run(&mut e, &(0..64).collect::<Vec<u32>>(), None);
    let batch = e.drain_events();
    for _ in 0..2_000 {
        publisher.publish(batch.clone());
    }
    assert!(publisher.flush(Duration::from_secs(30)));
    let stats = publisher.stats();
    assert_eq!(stats.dropped_queue_full + stats.dropped_send_failed, 0, "the publisher lost nothing itself");
    assert_eq!(stats.batches_handed_to_socket, stats.batches_reserved);
    // The subscriber reads now: it got far fewer than were handed over.
    sub.socket.set_rcvtimeo(200).unwrap();
    let mut seen = Vec::new();
    while let Ok(frames) = sub.socket.recv_multipart(0) {
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        seen.push(decode_message(&refs).unwrap().seq);
    }
    assert!(seen.len() < 2_000, "the stalled socket held {} of 2000", seen.len());
    let end = publisher.next_seq();
    let missing: Vec<u64> = (first..end).filter(|s| !seen.contains(s)).collect();
    assert!(!missing.is_empty(), "the loss shows as a gap");
    // Replay from the first missing number brings every batch back.
    let replayed = request(&ctx, publisher.replay_endpoint().unwrap(), &missing[0].to_be_bytes());
    let got: Vec<u64> = replayed.iter().map(|m| m.seq).collect();
    assert_eq!(got, (missing[0]..end).collect::<Vec<_>>());
}

/// Data-parallel ranks bind `base port + rank`, and a bad endpoint is a clear error.
#[test]
fn ranks_offset_the_port() {
    assert_eq!(endpoint_for_rank("tcp://*:5557", Some(3)).unwrap(), "tcp://*:5560");
    assert_eq!(endpoint_for_rank("tcp://*:5557", None).unwrap(), "tcp://*:5557");
    assert!(endpoint_for_rank("ipc:///tmp/x", Some(1)).is_err());
    assert!(endpoint_for_rank("tcp://*:65535", Some(1)).is_err());
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = PublisherConfig {
        endpoint: format!("tcp://127.0.0.1:{}", port - 2),
        replay_endpoint: None,
        data_parallel_rank: Some(2),
        ..Default::default()
    };
    let p = Publisher::bind(cfg).unwrap();
    assert_eq!(p.endpoint(), format!("tcp://127.0.0.1:{port}"));
    let payload = {
        let mut v = Vec::new();
        kvcore::wire::encode_events(&[], 0.0, Some(2), &EncodeOptions::default(), &mut v);
        v
    };
    assert_eq!(decode_payload(&payload).unwrap().data_parallel_rank, Some(2));
}
