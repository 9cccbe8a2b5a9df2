//! The fuzz targets' checked-in seeds, run as ordinary tests: every seed goes
//! through the same entry point libFuzzer calls.

use std::path::{Path, PathBuf};

use kvcore::KvEvent;
use kvcore::fuzzing::ByteSource;

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds").join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            (path.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&path).unwrap())
        })
        .collect();
    out.sort();
    out
}

/// Decode seeds: `ok-*` must decode (and re-encode to the same batch), `bad-*`
/// must be refused; neither may panic.
#[test]
fn decode_seeds() {
    let seeds = seeds("decode");
    assert!(seeds.len() >= 6, "the seed corpus is checked in");
    for (name, bytes) in &seeds {
        let decoded = kvcore::fuzzing::decode(bytes);
        assert_eq!(decoded, name.starts_with("ok-"), "{name}");
    }
}

/// Round-trip seeds: each builds events that survive every encoding; together
/// they reach stores with images, removals and clears, and stores and
/// removals that name a KV cache group.
#[test]
fn roundtrip_seeds() {
    let seeds = seeds("roundtrip");
    assert!(seeds.len() >= 5, "the seed corpus is checked in");
    let (mut images, mut removed, mut cleared, mut grouped) = (0, 0, 0, [0, 0]);
    for (_, bytes) in &seeds {
        kvcore::fuzzing::roundtrip(bytes);
        for e in ByteSource::new(bytes).events() {
            match &e {
                KvEvent::BlockStored(s) if s.group.is_some() => grouped[0] += 1,
                KvEvent::BlockRemoved(r) if r.group.is_some() => grouped[1] += 1,
                _ => {}
            }
            match e {
                KvEvent::BlockStored(s) if s.block_images.iter().any(|b| !b.is_empty()) => images += 1,
                KvEvent::BlockRemoved(_) => removed += 1,
                KvEvent::AllBlocksCleared(_) => cleared += 1,
                KvEvent::BlockStored(_) => {}
            }
        }
    }
    assert!(images > 0 && removed > 0 && cleared > 0, "images {images} removed {removed} cleared {cleared}");
    assert!(grouped[0] > 0 && grouped[1] > 0, "grouped stores and removals {grouped:?}");
}
