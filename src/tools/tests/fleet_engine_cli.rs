//! `kvcore fleet-engine`: the control socket serves, answers what the engine
//! holds, republishes its state and clears it; a bad request gets an error
//! and changes nothing.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

fn call(sock: &zmq::Socket, req: &str) -> Value {
    sock.send(req.as_bytes(), 0).unwrap();
    let answer = sock.recv_bytes(0).unwrap();
    serde_json::from_slice(&answer).unwrap()
}

/// Kills the engine when a check fails before `quit`.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn control_socket_serves_and_refuses_bad_requests_without_a_trace() {
    let mut child = Reap(
        Command::new(env!("CARGO_BIN_EXE_kvcore"))
            .args(["fleet-engine", "--block-size", "32", "--blocks", "64"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut ready = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut ready).unwrap();
    let ready: Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["ready"], true, "{ready}");
    let ctx = zmq::Context::new();
    let sock = ctx.socket(zmq::REQ).unwrap();
    sock.set_rcvtimeo(10_000).unwrap();
    sock.connect(ready["control"].as_str().unwrap()).unwrap();

    let tokens: Vec<u32> = (1000..1070).collect();
    let text = |op: &str| json!({"op": op, "tokens": tokens}).to_string();
    assert_eq!(call(&sock, &text("serve"))["cached"], 0);
    assert_eq!(call(&sock, &text("held"))["cached"], 64, "two full blocks are reused");

    // Bad requests: each answers an error, and the engine holds what it held.
    let bad = call(&sock, "{not json");
    assert!(bad["error"].as_str().unwrap().starts_with("bad request"), "{bad}");
    let bad = call(&sock, r#"{"op":"launch"}"#);
    assert!(bad["error"].as_str().unwrap().contains("unknown op"), "{bad}");
    let outside = json!({"op": "serve", "tokens": tokens,
                         "image": {"pixels": "p", "uuid": "u", "start": 60, "len": 64}});
    let bad = call(&sock, &outside.to_string());
    assert!(bad["error"].as_str().unwrap().starts_with("admission"), "{bad}");
    let bad = call(&sock, r#"{"op":"mm_hash"}"#);
    assert!(bad["error"].is_string(), "{bad}");
    let bad = call(&sock, r#"{"op":"mm_hash","uuid":"u","pixels":"p"}"#);
    assert!(bad["error"].is_string(), "{bad}");
    let by_content = call(&sock, r#"{"op":"mm_hash","pixels":"p"}"#);
    assert_eq!(by_content["mm_hash"], kvcore::mm_hash(&kvcore::ImageDigest::of_content(b"p"), None), "{by_content}");
    let by_uuid = call(&sock, r#"{"op":"mm_hash","uuid":"p"}"#);
    assert_eq!(by_uuid["mm_hash"], kvcore::mm_hash_of_identifier("p"), "{by_uuid}");
    assert_eq!(call(&sock, &text("held"))["cached"], 64);
    let stats = call(&sock, r#"{"op":"stats"}"#);
    assert_eq!(stats["blocks_device"], 2, "{stats}");
    assert_eq!(stats["requests_live"], 0, "a probe or a refused request left a request behind: {stats}");

    // The state as one batch: AllBlocksCleared and the two cached blocks.
    assert_eq!(call(&sock, r#"{"op":"republish"}"#)["events"], 3);
    assert_eq!(call(&sock, r#"{"op":"clear"}"#)["ok"], true);
    assert_eq!(call(&sock, &text("held"))["cached"], 0);
    assert_eq!(call(&sock, r#"{"op":"quit"}"#)["ok"], true);
    assert!(child.0.wait().unwrap().success());
}

#[test]
fn a_bad_event_form_is_refused_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore")).args(["fleet-engine", "--form", "xml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--form must be map or array"), "{err}");
}
