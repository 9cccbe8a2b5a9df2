//! The size budget of the seed's reference case, pinned byte for byte.

use kvcore::wire::WireEvent;
use kvcore::wire::{EncodeOptions, EventForm, decode_payload, encode_events};
use kvcore::{Engine, EngineConfig, KvEvent, MmContent, MmItemSpec, RequestSpec, TokenRun};
use rand::{Rng, SeedableRng};

const VISION_START: u32 = 151_652;
const IMAGE_PAD: u32 = 151_655;
const VISION_END: u32 = 151_653;
const UUID: &str = "0b8f2c7e-3d4a-4e5b-9c6d-7e8f9a0b1c2d";

/// The reference prompt: 32 text tokens, vision start, 64 image-pad tokens,
/// vision end, 30 text tokens; text ids from [1000, 60000) with a fixed seed.
fn reference_prompt() -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(20_260_101);
    let mut text = |n: usize| (0..n).map(|_| rng.random_range(1000..60_000)).collect::<Vec<u32>>();
    let mut p = text(32);
    p.push(VISION_START);
    p.extend(std::iter::repeat_n(IMAGE_PAD, 64));
    p.push(VISION_END);
    p.extend(text(30));
    p
}

/// The reference event, built by a real engine: the 64 image-pad tokens are the
/// item (vision start and end stay text), with a 36-character UUID.
fn reference_events() -> Vec<KvEvent> {
    let mut engine = Engine::new(EngineConfig { block_size_tokens: 32, ..Default::default() }).unwrap();
    let prompt = reference_prompt();
    assert_eq!(prompt.len(), 128);
    assert_eq!(UUID.len(), 36);
    let spec = RequestSpec {
        tokens: &prompt,
        items: vec![MmItemSpec {
            content: MmContent::Bytes(b"reference image"),
            runs: vec![TokenRun { start: 33, len: 64 }],
        }],
        uuids: Some(vec![Some(UUID.as_bytes())]),
        ..Default::default()
    };
    let a = engine.add_request(&spec).unwrap();
    engine.commit(a.id, 128).unwrap();
    engine.step();
    engine.drain_events()
}

fn size(events: &[KvEvent], opts: EncodeOptions) -> Vec<u8> {
    let mut out = Vec::new();
    encode_events(events, 1_764_460_800.25, Some(0), &opts, &mut out);
    out
}

/// One 4-block event with one image and its UUID must fit the wire budget (docs/wire-format.md) in
/// every form, and the exact sizes are pinned so that any change is deliberate.
#[test]
fn reference_case_sizes_are_pinned() {
    let events = reference_events();
    assert_eq!(events.len(), 1);
    let KvEvent::BlockStored(s) = &events[0] else { panic!("expected BlockStored") };
    assert_eq!(s.keys.len(), 4);
    assert_eq!(s.images.len(), 1);
    assert_eq!(s.images[0].uuid.as_deref(), Some(UUID));
    let full = size(&events, EncodeOptions::default());
    let lean = size(&events, EncodeOptions { token_ids: false, ..Default::default() });
    let array = size(&events, EncodeOptions { form: EventForm::Array, token_ids: true });
    // Within the wire budget: at most 950 bytes with everything a router
    // needs, at most 300 bytes without token ids.
    assert!(full.len() <= 950 && lean.len() <= 300, "full {} lean {}", full.len(), lean.len());
    // Exact, so that a change is deliberate (docs/wire-format.md explains every byte).
    assert_eq!((full.len(), lean.len(), array.len()), (942, 267, 919));
    // The budget holds what the docs say it holds.
    let WireEvent::BlockStored(w) = &decode_payload(&full).unwrap().events[0] else { panic!("expected BlockStored") };
    assert_eq!(w.token_ids.as_ref().map(Vec::len), Some(128));
    let infos = w.block_mm_infos.as_ref().expect("block_mm_infos");
    assert_eq!(
        infos.iter().map(|i| i.as_ref().map(|i| i.mm_objects[0].offsets.clone())).collect::<Vec<_>>(),
        vec![None, Some(vec![[1, 32]]), Some(vec![[0, 32]]), Some(vec![[0, 1]])]
    );
    let routing = w.image_routing.as_ref().expect("image_routing");
    assert_eq!(routing.items.len(), 1);
    assert_eq!(routing.items[0].uuid.as_deref(), Some(UUID));
    assert_eq!(routing.blocks.iter().map(Vec::len).collect::<Vec<_>>(), vec![0, 1, 1, 1]);
    // The digest is written once, raw: 32 bytes, not 64 hex digits.
    let digest = s.images[0].digest.0;
    assert_eq!(full.windows(32).filter(|w| *w == digest).count(), 1);
    assert!(!full.windows(64).any(|w| w == s.images[0].digest.to_hex().as_bytes()));
    let WireEvent::BlockStored(l) = &decode_payload(&lean).unwrap().events[0] else { panic!("expected BlockStored") };
    assert!(l.token_ids.is_none() && l.block_mm_infos.is_none() && l.image_routing == w.image_routing);
}
