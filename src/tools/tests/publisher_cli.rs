//! `kvcore events tail|record|replay|snapshot`, run as the real binary against real
//! ZMQ sockets on loopback.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use kvcore::wire::{EncodeOptions, encode_events};
use kvcore::{Engine, EngineConfig, KvEvent, RequestSpec};

fn kvcore() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvcore"))
}

fn pub_socket(ctx: &zmq::Context) -> (zmq::Socket, String) {
    let s = ctx.socket(zmq::PUB).unwrap();
    s.bind("tcp://127.0.0.1:*").unwrap();
    let e = s.get_last_endpoint().unwrap().unwrap();
    (s, e)
}

fn send(s: &zmq::Socket, seq: u64, events: &[KvEvent]) -> Vec<u8> {
    let mut payload = Vec::new();
    encode_events(events, 1.0, Some(0), &EncodeOptions::default(), &mut payload);
    s.send_multipart([&b"kv"[..], &seq.to_be_bytes()[..], &payload[..]], 0).unwrap();
    payload
}

fn stored_events() -> Vec<KvEvent> {
    let mut e = Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 16, ..Default::default() }).unwrap();
    let a = e.add_request(&RequestSpec { tokens: &[1, 2, 3, 4, 5, 6, 7, 8], ..Default::default() }).unwrap();
    e.commit(a.id, 8).unwrap();
    e.step();
    e.drain_events()
}

fn lines(child: &mut Child) -> Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    rx
}

/// `tail` must print each batch as a JSON line with its decoded events and
/// flag a jump in sequence numbers with a gap line before the batch.
#[test]
fn tail_prints_batches_and_flags_gaps() {
    let ctx = zmq::Context::new();
    let (s, endpoint) = pub_socket(&ctx);
    let mut child = kvcore()
        .args(["events", "tail", "--endpoint", &endpoint, "--idle-exit-s", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rx = lines(&mut child);
    // Probe until the subscriber has joined (ZMQ's slow joiner).
    let mut seq = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        send(&s, seq, &[]);
        seq += 1;
        if rx.recv_timeout(Duration::from_millis(50)).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "tail never received a probe");
    }
    std::thread::sleep(Duration::from_millis(100));
    while rx.try_recv().is_ok() {}
    let events = stored_events();
    send(&s, seq, &events);
    send(&s, seq + 4, &[]);
    let first: serde_json::Value = serde_json::from_str(&rx.recv_timeout(Duration::from_secs(10)).unwrap()).unwrap();
    assert_eq!(first["seq"], seq);
    assert_eq!(first["topic"], "kv");
    let ev = &first["batch"]["events"][0];
    assert_eq!(ev["type"], "BlockStored");
    assert_eq!(ev["block_size"], 4);
    assert_eq!(ev["token_ids"].as_array().unwrap().len(), 8);
    let KvEvent::BlockStored(st) = &events[0] else { panic!("expected BlockStored") };
    assert_eq!(ev["block_hashes"][0], st.keys[0].wire_hash().0);
    let gap: serde_json::Value = serde_json::from_str(&rx.recv_timeout(Duration::from_secs(10)).unwrap()).unwrap();
    assert_eq!(gap["gap"]["expected"], seq + 1);
    assert_eq!(gap["gap"]["got"], seq + 4);
    assert_eq!(gap["gap"]["lost"], 3);
    let next: serde_json::Value = serde_json::from_str(&rx.recv_timeout(Duration::from_secs(10)).unwrap()).unwrap();
    assert_eq!(next["seq"], seq + 4);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `record` then `replay` must publish the same frames (topic, seq, payload)
/// that were recorded.
#[test]
fn record_then_replay_reproduces_the_stream() {
    let dir = std::env::temp_dir().join(format!("kvcore-rec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("stream.kvrec");
    let ctx = zmq::Context::new();
    let (s, endpoint) = pub_socket(&ctx);
    let mut child = kvcore()
        .args(["events", "record", "--endpoint", &endpoint, "--out"])
        .arg(&file)
        .args(["--idle-exit-s", "2"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut seq = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) <= 8 {
        send(&s, seq, &[]);
        seq += 1;
        std::thread::sleep(Duration::from_millis(50));
        assert!(Instant::now() < deadline, "record never received a probe");
    }
    let events = stored_events();
    let sent: Vec<(u64, Vec<u8>)> = (0..5).map(|i| (seq + i, send(&s, seq + i, &events[..(i as usize % 2)]))).collect();
    assert!(child.wait().unwrap().success(), "record exits after 2 s idle");

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.set_rcvtimeo(10_000).unwrap();
    sub.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    let mut replay = kvcore()
        .args(["events", "replay", "--file"])
        .arg(&file)
        .args(["--bind", &format!("tcp://127.0.0.1:{port}"), "--wait-ms", "1500"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut got = Vec::new();
    while let Ok(frames) = sub.recv_multipart(0) {
        let seq = u64::from_be_bytes(frames[1][..].try_into().unwrap());
        assert_eq!(frames[0], b"kv");
        got.push((seq, frames[2].clone()));
        if seq == sent.last().unwrap().0 {
            break;
        }
    }
    assert!(replay.wait().unwrap().success());
    assert_eq!(&got[got.len() - sent.len()..], &sent[..]);
    // A file that is not a recording is a clear error, not a panic.
    std::fs::write(&file, b"garbage!").unwrap();
    let out = kvcore().args(["events", "replay", "--file"]).arg(&file).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a kvcore recording"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `snapshot` must print the publisher's full state as one decoded batch:
/// `AllBlocksCleared` then one `BlockStored` per advertised block, tagged with
/// the next live sequence number.
#[test]
fn snapshot_prints_the_advertised_state() {
    use kvcore::{Publisher, PublisherConfig};
    let mut e = Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 16, ..Default::default() }).unwrap();
    e.attach_publisher(
        Publisher::bind(PublisherConfig {
            endpoint: "tcp://127.0.0.1:*".into(),
            replay_endpoint: Some("tcp://127.0.0.1:*".into()),
            // The snapshot's tag is compared with `next_seq` below: no heartbeat in between.
            heartbeat_ms: 0,
            ..Default::default()
        })
        .unwrap(),
    );
    for tokens in [[1u32, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9, 1, 1, 1, 1]] {
        let a = e.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }).unwrap();
        e.commit(a.id, 8).unwrap();
        e.finish(a.id).unwrap();
        e.step();
    }
    let p = e.publisher().unwrap();
    assert!(p.flush(Duration::from_secs(5)));
    let out = kvcore().args(["events", "snapshot", "--endpoint", p.replay_endpoint().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1);
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(v["seq"], p.next_seq());
    let events = v["batch"]["events"].as_array().unwrap();
    assert_eq!(events[0]["type"], "AllBlocksCleared");
    assert_eq!(events.len(), 1 + 4);
    assert!(
        events[1..].iter().all(|ev| ev["type"] == "BlockStored" && ev["block_hashes"].as_array().unwrap().len() == 1)
    );
    // Nothing listening: a clear error, not a hang.
    let out =
        kvcore().args(["events", "snapshot", "--endpoint", "tcp://127.0.0.1:1", "--timeout-s", "1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no answer"));
}
