//! Shared helpers of the router tests: a small tokenizer the tests build
//! themselves (no download), and engines wired to the wire types.
#![allow(dead_code, reason = "each test crate uses a different subset")]

use std::path::{Path, PathBuf};

/// Words of the test vocabulary, ids 1.. in this order (0 is `[UNK]`).
pub const WORDS: &[&str] = &[
    "system", "user", "assistant", "You", "are", "a", "helpful", "assistant", ".", "describe", "this", "image",
    "what", "is", "in", "the", "picture", "cat", "dog", "and", "compare", "them", "?", ",", "please", "story",
    "tell", "me", "about", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
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

/// A fresh temporary directory under the target dir (removed by the caller
/// or left for inspection on failure).
pub fn temp_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("kvcore-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}
