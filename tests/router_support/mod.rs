//! Shared helpers of the router tests: a small tokenizer the tests build
//! themselves (no download), and engines wired to the wire types.
#![allow(dead_code, reason = "each test crate uses a different subset")]

use std::path::{Path, PathBuf};

/// Words of the test vocabulary, ids 1.. in this order (0 is `[UNK]`).
pub const WORDS: &[&str] = &[
    "system",
    "user",
    "assistant",
    "You",
    "are",
    "a",
    "helpful",
    "assistant",
    ".",
    "describe",
    "this",
    "image",
    "what",
    "is",
    "in",
    "the",
    "picture",
    "cat",
    "dog",
    "and",
    "compare",
    "them",
    "?",
    ",",
    "please",
    "story",
    "tell",
    "me",
    "about",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
];

/// Qwen special tokens at their real ids.
pub const SPECIALS: &[(&str, u32)] = &[
    ("<|endoftext|>", 151_643),
    ("<|im_start|>", 151_644),
    ("<|im_end|>", 151_645),
    ("<|vision_start|>", 151_652),
    ("<|vision_end|>", 151_653),
    ("<|image_pad|>", 151_655),
];

/// Writes a WordLevel tokenizer.json (whitespace pre-tokenizer, the words
/// above, the Qwen special tokens at their real ids) into `dir` and returns
/// its path. Built by our own code from the format's fields.
pub fn write_test_tokenizer(dir: &Path) -> PathBuf {
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), 0.into());
    let mut next = 1u32;
    for w in WORDS {
        if !vocab.contains_key(*w) {
            vocab.insert((*w).into(), next.into());
            next += 1;
        }
    }
    for (s, id) in SPECIALS {
        vocab.insert((*s).into(), (*id).into());
    }
    let added: Vec<serde_json::Value> = SPECIALS
        .iter()
        .map(|(s, id)| {
            serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, serde_json::to_vec(&json).expect("json")).expect("write tokenizer.json");
    path
}

/// A fresh temporary directory under the target dir, unique per call (tests
/// of one crate run in parallel threads), left for inspection.
pub fn temp_dir(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let base = std::env::var_os("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("kvcore-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

use std::time::{Duration, Instant};

use kvcore::{AdmitError, Engine, EngineConfig, MmContent, MmItemSpec, RequestSpec, TokenRun};
use kvcore::{Publisher, PublisherConfig};
use kvcore_router::{Subscriber, Tier, WorkerId};

/// An engine and its publisher on loopback, with a replay socket.
pub struct Worker {
    /// The engine.
    pub engine: Engine,
    /// Its publisher, fed one batch per step.
    pub publisher: Publisher,
}

/// One image of a test request: content bytes, optional UUID, its run.
pub type TestImage<'a> = (&'a [u8], Option<&'a str>, TokenRun);

impl Worker {
    /// A worker with `blocks_device` device blocks and `blocks_host` host
    /// blocks of `block_size` tokens, retaining `buffer_steps` batches for replay.
    pub fn new(block_size: u32, blocks_device: u32, blocks_host: u32, buffer_steps: usize) -> Self {
        let engine = Engine::new(EngineConfig {
            block_size_tokens: block_size,
            blocks_device,
            blocks_host,
            ..Default::default()
        })
        .expect("valid engine config");
        let publisher = Publisher::bind(PublisherConfig {
            endpoint: "tcp://127.0.0.1:*".into(),
            replay_endpoint: Some("tcp://127.0.0.1:*".into()),
            buffer_steps,
            profile: Some(engine.hash_profile()),
            ..Default::default()
        })
        .expect("bind loopback publisher");
        Self { engine, publisher }
    }

    /// Closes a step and publishes its batch, if it has one.
    pub fn step(&mut self) {
        self.engine.step();
        for b in self.engine.drain_batches() {
            self.publisher.publish(b.events);
        }
    }

    /// Runs one request to completion (admit, compute, finish) and steps.
    pub fn run(&mut self, tokens: &[u32], images: &[TestImage<'_>]) -> Result<(), AdmitError> {
        let spec = RequestSpec {
            tokens,
            items: images.iter().map(|(b, _, r)| MmItemSpec { content: MmContent::Bytes(b), runs: vec![*r] }).collect(),
            uuids: (!images.is_empty()).then(|| images.iter().map(|(_, u, _)| u.map(str::as_bytes)).collect()),
            ..Default::default()
        };
        let result = self.engine.add_request(&spec);
        if let Ok(a) = &result {
            self.engine.commit(a.id, tokens.len() as u64).expect("commit the whole prompt");
            self.engine.finish(a.id).expect("finish a live request");
        }
        self.step();
        result.map(|_| ())
    }

    /// The wire hashes the engine advertises as cached, per tier, sorted.
    pub fn advertised(&self, tier: Tier) -> Vec<i64> {
        let mut v: Vec<i64> = self
            .engine
            .cached_blocks()
            .filter(|b| (b.page.medium == kvcore::Tier::Device) == (tier == Tier::Device))
            .map(|b| b.key.wire_hash().0)
            .collect();
        v.sort_unstable();
        v
    }

    /// Connects `sub` to this worker.
    pub fn subscribe(&self, sub: &mut Subscriber, name: &str) -> WorkerId {
        sub.connect(name, self.publisher.endpoint(), self.publisher.replay_endpoint()).expect("connect")
    }
}

/// Publishes empty heartbeat batches until the subscriber has applied every
/// batch of every worker (a lost last batch only shows at the next one), or
/// `timeout` passes. Returns whether it synced.
pub fn sync(sub: &mut Subscriber, workers: &mut [(&mut Worker, WorkerId)], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        for (w, _) in workers.iter_mut() {
            w.publisher.publish(Vec::new());
            w.publisher.flush(Duration::from_secs(5));
        }
        let targets: Vec<(WorkerId, u64)> = workers.iter().map(|(w, id)| (*id, w.publisher.next_seq())).collect();
        if sub.poll_until_synced(&targets, Duration::from_millis(300)).expect("poll") {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}
