//! `kvcore route` end to end: two engines publish on loopback, the command
//! subscribes, takes snapshots, hashes a chat request with an image through a
//! tokenizer.json, and prints each worker's overlap and the decision.

#[path = "../../../tests/router_support/mod.rs"]
mod router_support;

use std::process::Command;

use kvcore::TokenRun;
use kvcore_router::{ImageInput, ImageRef, Message, ModelProfile, Part};
use router_support::Worker;

/// The worker holding the chat's prefix and image gets the request; the JSON
/// output names both workers with their per-tier overlaps; a malformed
/// request file is a clear error, not a panic.
#[test]
fn route_prints_overlaps_and_decision() {
    let dir = router_support::temp_dir("router-cli");
    let tok_path = router_support::write_test_tokenizer(&dir);
    let tok = tokenizers::Tokenizer::from_file(&tok_path).unwrap();
    let profile = ModelProfile::qwen2_vl();
    let image = |r| {
        vec![Message {
            role: "user".into(),
            parts: vec![
                Part::Image(ImageInput { image: r, width: Some(56), height: Some(84) }),
                Part::Text("what is in the picture ?".into()),
            ],
        }]
    };
    let pixels = b"a small picture".as_slice();
    let req = profile.render(&tok, &image(ImageRef::Bytes(pixels.to_vec())), None, None).unwrap();
    let (start, len) = req.images[0].runs[0];
    let mut holder = Worker::new(4, 128, 0, 1000);
    let other = Worker::new(4, 128, 0, 1000);
    holder.run(&req.tokens, &[(pixels, Some("pic-1"), TokenRun { start, len })]).unwrap();
    holder.publisher.flush(std::time::Duration::from_secs(5));
    let ep = |w: &Worker| format!("{}@{}", w.publisher.endpoint(), w.publisher.replay_endpoint().unwrap());

    let request = serde_json::json!({
        "model": "Qwen/Qwen2-VL-2B-Instruct",
        "tokenizer": "tokenizer.json",
        "block_size": 4,
        "messages": [{"role": "user", "content": [
            {"type": "image", "uuid": "pic-1", "width": 56, "height": 84},
            {"type": "text", "text": "what is in the picture ?"}]}]
    });
    let path = dir.join("request.json");
    std::fs::write(&path, serde_json::to_vec(&request).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["route", "--json", "--listen-ms", "2000", "--endpoints"])
        .arg(format!("{},{}", ep(&holder), ep(&other)))
        .arg("--request")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let blocks = req.tokens.len() as u64 / 4;
    assert_eq!(v["request_blocks"], blocks);
    assert_eq!(v["keyed_blocks"], blocks, "the UUID was learned from the snapshot");
    assert_eq!(v["decision"], holder.publisher.endpoint());
    let workers = v["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2);
    assert_eq!(workers[0]["device_blocks"], blocks);
    assert_eq!(workers[1]["any_tier_blocks"], 0);

    // The table form prints the decision line too.
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["route", "--listen-ms", "1500", "--endpoints", &ep(&holder), "--request"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("decision: {}", holder.publisher.endpoint())), "{text}");

    std::fs::write(&path, b"{\"messages\": 3}").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["route", "--listen-ms", "10", "--endpoints", &ep(&holder), "--tokenizer"])
        .arg(&tok_path)
        .arg("--request")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("kvcore route: ") && !err.contains("panicked"), "{err}");
}

/// Two engines hold one UUID under different pixels: `kvcore route` keys the
/// request only up to the image, says why, and shows the UUID view.
#[test]
fn route_shows_an_ambiguous_uuid() {
    let dir = router_support::temp_dir("router-cli-uuid");
    let tokens: Vec<u32> = (100..124).collect();
    let run = TokenRun { start: 8, len: 8 };
    let (mut a, mut b) = (Worker::new(4, 128, 0, 1000), Worker::new(4, 128, 0, 1000));
    a.run(&tokens, &[(b"pixels on a", Some("shared"), run)]).unwrap();
    b.run(&tokens, &[(b"pixels on b", Some("shared"), run)]).unwrap();
    let ep = |w: &Worker| format!("{}@{}", w.publisher.endpoint(), w.publisher.replay_endpoint().unwrap());
    let request = serde_json::json!({"block_size": 4, "token_ids": tokens,
        "image_placements": [{"uuid": "shared", "runs": [[8, 8]]}]});
    let path = dir.join("request.json");
    std::fs::write(&path, serde_json::to_vec(&request).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["route", "--json", "--listen-ms", "1500", "--endpoints"])
        .arg(format!("{},{}", ep(&a), ep(&b)))
        .arg("--request")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["request_blocks"].as_u64(), v["keyed_blocks"].as_u64()), (Some(6), Some(2)), "{v}");
    assert!(v["keys_stop"].as_str().unwrap().starts_with("AmbiguousUuid"), "{v}");
    assert!(v["images"][0]["resolved"].as_str().unwrap().starts_with("ambiguous"), "{v}");
    assert_eq!(v["memory"]["uuids_ambiguous"], 1);
    assert_eq!(v["indexer"]["uuid_conflicts"], 1);
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["route", "--listen-ms", "1500", "--endpoints"])
        .arg(format!("{},{}", ep(&a), ep(&b)))
        .arg("--request")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("image uuid shared: ambiguous"), "{text}");
    assert!(text.contains("uuid view: 1 uuids (1 ambiguous"), "{text}");
}

/// `kvcore relay` between two engines and a late consumer: the consumer,
/// which missed every batch, recovers the relay's stream through the
/// relay's own replay socket with nothing lost (its sequence numbers are
/// contiguous), holds what the engines hold, and a snapshot of the relay
/// gives the ambiguous UUID's image blocks their content's `mm_hash`.
#[test]
fn relay_serves_replay_and_snapshot_of_its_stream() {
    use kvcore_router::{Subscriber, SubscriberConfig, Tier, UuidResolver};
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let tokens: Vec<u32> = (100..124).collect();
    let run = TokenRun { start: 8, len: 8 };
    let (mut a, mut b) = (Worker::new(4, 128, 0, 1000), Worker::new(4, 128, 0, 1000));
    let ep = |w: &Worker| format!("{}@{}", w.publisher.endpoint(), w.publisher.replay_endpoint().unwrap());
    /// Stops the relay when the test ends, whatever its outcome.
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut relay = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["relay", "--block-size", "4", "--upstream"])
        .arg(format!("{},{}", ep(&a), ep(&b)))
        .args(["--bind", "tcp://127.0.0.1:*@tcp://127.0.0.1:*,tcp://127.0.0.1:*@tcp://127.0.0.1:*"])
        .args(["--stats-ms", "50"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(relay.stdout.take().unwrap()).lines();
    let _relay = Child(relay);
    let ready: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let relayed = |i: usize, k: &str| ready["workers"][i][k].as_str().unwrap().to_owned();
    // The relay's counters, one JSON line every 50 ms, read on a thread.
    let (tx, stats) = std::sync::mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if tx.send(serde_json::from_str(&l).unwrap_or_default()).is_err() {
                return;
            }
        }
    });
    a.run(&tokens, &[(b"pixels on a", Some("shared"), run)]).unwrap();
    b.run(&tokens, &[(b"pixels on b", Some("shared"), run)]).unwrap();
    // The relay recovers the engines' batches (its own late join) and
    // republishes them before the consumer connects: wait until it has
    // taken in both stores.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for w in [&mut a, &mut b] {
            w.publisher.publish(Vec::new());
        }
        let s = stats.recv_timeout(Duration::from_secs(5)).expect("the relay prints its counters");
        if s["indexer"]["stored_events"].as_u64().unwrap_or(0) >= 2
            && s["relay"]["batches_out"].as_u64().unwrap_or(0) >= 4
        {
            break;
        }
        assert!(Instant::now() < deadline, "the relay never took in both engines' stores: {s}");
    }

    let mut sub = Subscriber::new(SubscriberConfig {
        indexer: kvcore_router::IndexerConfig { block_size: 4, ..Default::default() },
        ..Default::default()
    });
    let ia = sub.connect("a", &relayed(0, "endpoint"), Some(&relayed(0, "replay_endpoint"))).unwrap();
    let ib = sub.connect("b", &relayed(1, "endpoint"), Some(&relayed(1, "replay_endpoint"))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while sub.indexer().worker_blocks(ia, Tier::Device) != a.advertised(Tier::Device)
        || sub.indexer().worker_blocks(ib, Tier::Device) != b.advertised(Tier::Device)
    {
        assert!(Instant::now() < deadline, "the consumer never caught up: {:?}", sub.counters());
        for w in [&mut a, &mut b] {
            w.publisher.publish(Vec::new());
        }
        sub.poll(Duration::from_millis(100)).unwrap();
    }
    let c = sub.counters();
    assert!(c.replays >= 1, "the consumer recovered through the relay's replay socket: {c:?}");
    assert_eq!(c.batches_lost, 0, "{c:?}");
    assert_eq!(sub.indexer().resolve("shared"), kvcore_router::UuidLookup::Ambiguous);

    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["events", "snapshot", "--endpoint"])
        .arg(relayed(0, "replay_endpoint"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = snap["batch"]["events"].as_array().unwrap_or_else(|| panic!("{snap}"));
    assert_eq!(events[0]["type"], "AllBlocksCleared");
    let stored: Vec<&serde_json::Value> = events.iter().filter(|e| e["type"] == "BlockStored").collect();
    assert_eq!(stored.len(), a.advertised(Tier::Device).len());
    let content = kvcore::mm_hash(&kvcore::ImageDigest::of_content(b"pixels on a"), None);
    let hashes: Vec<u64> =
        stored.iter().filter_map(|e| e["block_mm_infos"][0]["mm_objects"][0]["mm_hash"].as_u64()).collect();
    assert_eq!(hashes, vec![content, content], "both image blocks go out under their content");
}

/// `kvcore route` on hybrid engines: three engines with a full-attention
/// group and a sliding window of 8 tokens hold the same 8 blocks in their
/// full-attention groups; in a small window pool, one more request evicted
/// only the window's oldest blocks (released early, outside the last
/// window) on one engine, and two more evicted its last ones on another.
/// The command, which learns them from their snapshots, scores each as the
/// engine itself reuses (8, 8 and fewer) and counts the group events.
#[test]
fn route_scores_hybrid_engines_per_group() {
    use kvcore::{Engine, EngineConfig, GroupConfig, GroupKind, PublisherConfig, RequestSpec};
    let engine = |window_pages: u32| {
        let mut e = Engine::new(EngineConfig {
            block_size_tokens: 4,
            blocks_device: 64 + window_pages,
            groups: vec![
                GroupConfig { kind: GroupKind::FullAttention, blocks_device: 64, blocks_host: 0 },
                GroupConfig {
                    kind: GroupKind::SlidingWindow { window_tokens: 8 },
                    blocks_device: window_pages,
                    blocks_host: 0,
                },
            ],
            ..Default::default()
        })
        .unwrap();
        e.vacant_publisher()
            .unwrap()
            .start(PublisherConfig {
                endpoint: "tcp://127.0.0.1:*".into(),
                replay_endpoint: Some("tcp://127.0.0.1:*".into()),
                ..Default::default()
            })
            .unwrap();
        e
    };
    let serve = |e: &mut Engine, tokens: &[u32]| {
        let a = e.add_request(&RequestSpec { tokens, ..Default::default() }).unwrap();
        e.commit(a.id, tokens.len() as u64).unwrap();
        e.finish(a.id).unwrap();
        e.step();
    };
    let prompt: Vec<u32> = (100..134).collect();
    let (mut keeps, mut old, mut loses) = (engine(32), engine(12), engine(12));
    for e in [&mut keeps, &mut old, &mut loses] {
        serve(e, &prompt);
    }
    // More prompts in the 11 usable window pages evict the least recently
    // used window blocks: the first prompt's early-released blocks 0-5,
    // then its last blocks 6 and 7. The full-attention group keeps all.
    serve(&mut old, &(900..934).collect::<Vec<u32>>());
    serve(&mut loses, &(900..934).collect::<Vec<u32>>());
    serve(&mut loses, &(1900..1934).collect::<Vec<u32>>());
    let held = |e: &mut Engine| {
        let a = e.add_request(&RequestSpec { tokens: &prompt, ..Default::default() }).unwrap();
        e.cancel(a.id).unwrap();
        e.step();
        u64::from(a.tokens_cached) / 4
    };
    let (k_keeps, k_old, k_loses) = (held(&mut keeps), held(&mut old), held(&mut loses));
    assert_eq!((k_keeps, k_old), (8, 8));
    assert!(k_loses < 8, "the window lost blocks before the end: {k_loses}");
    for e in [&keeps, &old, &loses] {
        e.publisher().unwrap().flush(std::time::Duration::from_secs(5));
    }
    let dir = router_support::temp_dir("router-cli-hybrid");
    let path = dir.join("request.json");
    std::fs::write(&path, serde_json::to_vec(&serde_json::json!({"block_size": 4, "token_ids": prompt})).unwrap())
        .unwrap();
    let ep = |e: &Engine| {
        let p = e.publisher().unwrap();
        format!("{}@{}", p.endpoint(), p.replay_endpoint().unwrap())
    };
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["route", "--json", "--listen-ms", "2000", "--endpoints"])
        .arg(format!("{},{},{}", ep(&keeps), ep(&old), ep(&loses)))
        .arg("--request")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let workers = v["workers"].as_array().unwrap();
    let blocks_of = |name: String| {
        workers.iter().find(|w| w["worker"] == name.as_str()).map_or(0, |w| w["device_blocks"].as_u64().unwrap())
    };
    let name = |e: &Engine| e.publisher().unwrap().endpoint().to_owned();
    assert_eq!(
        (blocks_of(name(&keeps)), blocks_of(name(&old)), blocks_of(name(&loses))),
        (k_keeps, k_old, k_loses),
        "{v}"
    );
    assert!(v["groups"]["group_events"].as_u64().unwrap() > 0, "{v}");
}
