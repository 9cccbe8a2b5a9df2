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
