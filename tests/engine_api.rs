//! Engine behaviour through its public API: content sensitivity of image
//! blocks, bad input, dummy requests, chunked prefill, duplicate copies and
//! routing hints.

use kvcore::KvEvent;
use kvcore::{AdmitError, Engine, EngineConfig, MmContent, MmItemSpec, RequestError, RequestSpec, TokenRun};

const BS: u32 = 4;

fn engine(blocks: u32) -> Engine {
    Engine::new(EngineConfig {
        block_size_tokens: BS,
        blocks_device: blocks,
        image_placeholder_token_id: 9,
        ..Default::default()
    })
    .unwrap()
}

/// 12 tokens with an image over positions 2..8.
fn image_prompt() -> Vec<u32> {
    vec![1, 2, 9, 9, 9, 9, 9, 9, 3, 4, 5, 6]
}

fn image_item(content: &[u8]) -> MmItemSpec<'_> {
    MmItemSpec { content: MmContent::Bytes(content), runs: vec![TokenRun { start: 2, len: 6 }] }
}

/// Runs a request to completion: admit, compute everything, finish, step.
fn serve(e: &mut Engine, spec: &RequestSpec<'_>) -> u32 {
    let a = e.add_request(spec).unwrap();
    e.commit(a.id, spec.tokens.len() as u64).unwrap();
    e.finish(a.id).unwrap();
    e.step();
    a.tokens_cached
}

/// Everything observable about an engine's state, to show a failed call changed nothing.
fn state(e: &Engine) -> (usize, usize, (usize, usize), kvcore::Counters, usize) {
    let mut c = e.counters();
    c.requests_rejected = 0;
    (e.requests_live(), e.blocks_free_device(), e.blocks_cached(), c, e.cached_blocks().len())
}

/// The same UUID on different pixels must never reuse a block; the same pixels
/// under two UUIDs must.
#[test]
fn image_identity_is_content_not_uuid() {
    let mut e = engine(32);
    let tokens = image_prompt();
    let uuid: &[u8] = b"sku-001";
    let spec = |content| RequestSpec {
        tokens: &tokens,
        items: vec![image_item(content)],
        uuids: Some(vec![Some(uuid)]),
        ..Default::default()
    };
    assert_eq!(serve(&mut e, &spec(b"red")), 0);
    assert_eq!(serve(&mut e, &spec(b"red")), 8, "same pixels, same UUID: reuse");
    assert_eq!(serve(&mut e, &spec(b"blue")), 0, "same UUID, other pixels: the first block already differs");
    let other_uuid = RequestSpec {
        tokens: &tokens,
        items: vec![image_item(b"red")],
        uuids: Some(vec![Some(b"sku-999")]),
        ..Default::default()
    };
    assert_eq!(serve(&mut e, &other_uuid), 8, "same pixels, other UUID: reuse");
    let no_uuid = RequestSpec { tokens: &tokens, items: vec![image_item(b"red")], ..Default::default() };
    assert_eq!(serve(&mut e, &no_uuid), 8, "same pixels, no UUID: reuse");
    // A digest given directly is the same identity as the bytes it digests.
    let digest = *blake3::hash(b"red").as_bytes();
    let by_digest = RequestSpec {
        tokens: &tokens,
        items: vec![MmItemSpec { content: MmContent::Digest(&digest), runs: vec![TokenRun { start: 2, len: 6 }] }],
        ..Default::default()
    };
    assert_eq!(serve(&mut e, &by_digest), 8);
}

/// Block 0 holds text and the image's first two tokens; with other pixels the
/// first block must differ too, so nothing at all is reused.
#[test]
fn first_image_block_differs_with_content() {
    let mut e = engine(32);
    let tokens = image_prompt();
    let spec = |content| RequestSpec { tokens: &tokens, items: vec![image_item(content)], ..Default::default() };
    serve(&mut e, &spec(b"a"));
    let a = e.add_request(&spec(b"b")).unwrap();
    assert_eq!(a.tokens_cached, 0);
}

/// Each kind of bad input gets its own error and leaves the engine exactly as it was.
#[test]
fn bad_input_is_rejected_without_trace() {
    let mut e = engine(8);
    let tokens = image_prompt();
    serve(&mut e, &RequestSpec { tokens: &tokens, ..Default::default() });
    let running = e.add_request(&RequestSpec { tokens: &[7, 7, 7, 7, 7], ..Default::default() }).unwrap();
    let before = state(&e);
    let run = |start, len| TokenRun { start, len };
    let item = |runs| MmItemSpec { content: MmContent::Bytes(b"x"), runs };
    let bad_utf8: &[u8] = &[0xff, 0xfe];
    type Case<'a> = (RequestSpec<'a>, fn(&AdmitError) -> bool);
    let cases: Vec<Case> = vec![
        (RequestSpec { tokens: &[], ..Default::default() }, |e| matches!(e, AdmitError::EmptyPrompt)),
        (RequestSpec { tokens: &tokens, items: vec![item(vec![run(10, 4)])], ..Default::default() }, |e| {
            matches!(e, AdmitError::RunOutOfRange { .. })
        }),
        (RequestSpec { tokens: &tokens, items: vec![item(vec![run(u32::MAX, 4)])], ..Default::default() }, |e| {
            matches!(e, AdmitError::RunOutOfRange { .. })
        }),
        (
            RequestSpec {
                tokens: &tokens,
                items: vec![item(vec![run(2, 4)]), item(vec![run(5, 2)])],
                ..Default::default()
            },
            |e| matches!(e, AdmitError::OverlappingRuns { .. }),
        ),
        (RequestSpec { tokens: &tokens, items: vec![item(vec![run(5, 2), run(2, 2)])], ..Default::default() }, |e| {
            matches!(e, AdmitError::OverlappingRuns { .. })
        }),
        (RequestSpec { tokens: &tokens, items: vec![item(vec![run(2, 0)])], ..Default::default() }, |e| {
            matches!(e, AdmitError::ZeroLengthRun { .. })
        }),
        (RequestSpec { tokens: &tokens, items: vec![item(vec![])], ..Default::default() }, |e| {
            matches!(e, AdmitError::BadRunCount { .. })
        }),
        (
            RequestSpec {
                tokens: &tokens,
                items: vec![MmItemSpec { content: MmContent::Digest(&[0; 31]), runs: vec![run(2, 2)] }],
                ..Default::default()
            },
            |e| matches!(e, AdmitError::BadDigestLength { len: 31, .. }),
        ),
        (
            RequestSpec {
                tokens: &tokens,
                items: vec![item(vec![run(2, 2)])],
                uuids: Some(vec![]),
                ..Default::default()
            },
            |e| matches!(e, AdmitError::UuidCountMismatch { uuids: 0, items: 1 }),
        ),
        (
            RequestSpec {
                tokens: &tokens,
                items: vec![item(vec![run(2, 2)])],
                uuids: Some(vec![Some(bad_utf8)]),
                ..Default::default()
            },
            |e| matches!(e, AdmitError::InvalidUtf8Uuid { item: 0 }),
        ),
        (RequestSpec { tokens: &[1; 40], ..Default::default() }, |e| matches!(e, AdmitError::OutOfBlocks { .. })),
    ];
    for (spec, expected) in cases {
        let err = e.add_request(&spec).unwrap_err();
        assert!(expected(&err), "unexpected error {err:?}");
        assert!(!err.to_string().is_empty());
        assert_eq!(state(&e), before, "{err} left a trace");
    }
    // Request-level misuse: stale ids, going backwards, past the end, growing past capacity.
    assert_eq!(e.commit(running.id, 6), Err(RequestError::BadComputedCount { current: 0, len: 5, given: 6 }));
    e.commit(running.id, 4).unwrap();
    assert!(matches!(e.commit(running.id, 3), Err(RequestError::BadComputedCount { .. })));
    let before = state(&e);
    assert!(matches!(e.grow(running.id, &[1; 64]), Err(RequestError::OutOfBlocks { .. })));
    assert_eq!(state(&e), before);
    e.finish(running.id).unwrap();
    assert_eq!(e.finish(running.id), Err(RequestError::UnknownRequest));
    assert_eq!(e.commit(running.id, 1), Err(RequestError::UnknownRequest));
    assert_eq!(e.request_uuids(running.id), Err(RequestError::UnknownRequest));
    e.check_invariants();
}

/// A LoRA adapter given by id without a name is refused with its own error,
/// counted as a rejection, and leaves nothing behind; with its name (and a
/// name alone) it is admitted, and its events carry the name routers key on.
#[test]
fn a_lora_id_needs_its_name() {
    let mut e = engine(8);
    let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    let before = state(&e);
    let rejected = e.counters().requests_rejected;
    for name in [None, Some("")] {
        let spec = RequestSpec { tokens: &tokens, lora_id: Some(5), lora_name: name, ..Default::default() };
        let err = e.add_request(&spec).unwrap_err();
        assert_eq!(err, AdmitError::LoraNameRequired { lora_id: 5 }, "{name:?}");
        assert!(err.to_string().contains("lora_name"), "{err}");
        assert_eq!(state(&e), before, "{err} left a trace");
    }
    assert_eq!(e.counters().requests_rejected, rejected + 2);
    e.step();
    assert!(e.drain_events().is_empty());
    serve(
        &mut e,
        &RequestSpec { tokens: &tokens, lora_id: Some(5), lora_name: Some("adapter-5"), ..Default::default() },
    );
    let events = e.drain_events();
    let KvEvent::BlockStored(s) = &events[0] else { panic!("{events:?}") };
    assert_eq!((s.lora_id, s.lora_name.as_deref()), (Some(5), Some("adapter-5")));
}

/// Warm-up requests use blocks like others but never reach the index or the events.
#[test]
fn dummy_requests_are_invisible() {
    let mut e = engine(16);
    let tokens = [5u32; 12];
    let a = e.add_request(&RequestSpec { tokens: &tokens, dummy: true, ..Default::default() }).unwrap();
    assert_eq!(e.blocks_free_device(), 13);
    e.commit(a.id, 12).unwrap();
    e.finish(a.id).unwrap();
    e.step();
    assert!(e.drain_events().is_empty());
    assert_eq!(e.blocks_cached(), (0, 0));
    assert_eq!(e.blocks_free_device(), 16);
    let b = e.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }).unwrap();
    assert_eq!(b.tokens_cached, 0);
}

/// Chunked prefill: a block is advertised only once all its tokens are
/// computed, and is not matchable before.
#[test]
fn chunked_prefill_advertises_when_computed() {
    let mut e = engine(16);
    let tokens: Vec<u32> = (0..10).collect();
    let a = e.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }).unwrap();
    e.commit(a.id, 3).unwrap();
    e.step();
    assert!(e.drain_events().is_empty(), "no block is full yet");
    let probe = e.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }).unwrap();
    assert_eq!(probe.tokens_cached, 0, "an uncomputed block is not matchable");
    e.cancel(probe.id).unwrap();
    e.commit(a.id, 9).unwrap();
    e.step();
    let events = e.drain_events();
    assert_eq!(events.len(), 1);
    let KvEvent::BlockStored(s) = &events[0] else { panic!("expected BlockStored") };
    assert_eq!(s.keys.len(), 2);
    assert_eq!(s.token_ids, (0..8).collect::<Vec<u32>>());
    assert_eq!(s.parent, None);
    e.commit(a.id, 10).unwrap();
    e.step();
    assert!(e.drain_events().is_empty(), "the last partial block is never advertised");
}

/// Two requests computing the same block at once: one copy is indexed and
/// advertised; the key is removed once, only when no cached copy remains.
#[test]
fn duplicate_copies_advertise_and_remove_once() {
    let mut e = engine(8);
    let tokens = [1u32, 2, 3, 4, 5];
    let a = e.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }).unwrap();
    let b = e.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }).unwrap();
    e.commit(a.id, 5).unwrap();
    e.commit(b.id, 5).unwrap();
    e.finish(a.id).unwrap();
    e.finish(b.id).unwrap();
    e.step();
    let stored = e.drain_events();
    assert_eq!(stored.len(), 1, "one Stored for two copies");
    assert_eq!(e.blocks_cached(), (1, 0));
    assert_eq!(e.blocks_free_device(), 7, "the private copy went back to the pool");
    assert_eq!(e.evict(8), 1);
    e.step();
    let removed = e.drain_events();
    assert!(matches!(&removed[..], [KvEvent::BlockRemoved(r)] if r.keys.len() == 1));
}

/// Under pressure, allocation evicts least recently used cached blocks first
/// and emits one Removed for the burst.
#[test]
fn eviction_takes_lru_tail() {
    let mut e = engine(4);
    serve(&mut e, &RequestSpec { tokens: &[1, 1, 1, 1, 2, 2, 2, 2, 0], ..Default::default() });
    serve(&mut e, &RequestSpec { tokens: &[3, 3, 3, 3, 0], ..Default::default() });
    e.drain_events();
    // Needs 3 blocks with one free: evicts two cached ones, deepest of the oldest chain first.
    let a = e.add_request(&RequestSpec { tokens: &[8; 12], ..Default::default() }).unwrap();
    e.step();
    let events = e.drain_events();
    let KvEvent::BlockRemoved(r) = &events[0] else { panic!("expected BlockRemoved") };
    assert_eq!(r.keys.len(), 2);
    e.finish(a.id).unwrap();
    // The second chain survived.
    let b = e.add_request(&RequestSpec { tokens: &[3, 3, 3, 3, 0], ..Default::default() }).unwrap();
    assert_eq!(b.tokens_cached, 4);
}

/// Clear drops every cached key, keeps running requests working, and says so.
#[test]
fn clear_resets_the_cache() {
    let mut e = engine(8);
    serve(&mut e, &RequestSpec { tokens: &[1, 2, 3, 4, 5], ..Default::default() });
    let running = e.add_request(&RequestSpec { tokens: &[1, 2, 3, 4, 5, 6], ..Default::default() }).unwrap();
    assert_eq!(running.tokens_cached, 4);
    e.clear();
    e.step();
    assert!(matches!(e.drain_events().last(), Some(KvEvent::AllBlocksCleared(_))));
    assert_eq!(e.blocks_cached(), (0, 0));
    e.commit(running.id, 6).unwrap();
    e.finish(running.id).unwrap();
    e.check_invariants();
    assert_eq!(e.blocks_free_device(), 8);
}

/// The UUID list accessor: absent when none was given, an exact copy otherwise
/// (partial lists included); hints flow into events and conflicts drop them.
#[test]
fn uuid_list_and_hints() {
    let mut e = engine(32);
    let tokens = image_prompt();
    let none = e.add_request(&RequestSpec { tokens: &tokens, ..Default::default() }).unwrap();
    assert_eq!(e.request_uuids(none.id).unwrap(), None);
    let two_items = [1u32, 9, 9, 2, 9, 9, 3, 4];
    let partial = RequestSpec {
        tokens: &two_items,
        items: vec![
            MmItemSpec { content: MmContent::Bytes(b"p"), runs: vec![TokenRun { start: 1, len: 2 }] },
            MmItemSpec { content: MmContent::Bytes(b"q"), runs: vec![TokenRun { start: 4, len: 2 }] },
        ],
        uuids: Some(vec![Some(b"sku-001"), None]),
        ..Default::default()
    };
    let p = e.add_request(&partial).unwrap();
    assert_eq!(e.request_uuids(p.id).unwrap(), Some(vec![Some("sku-001".to_owned()), None]));
    e.commit(p.id, 8).unwrap();
    e.step();
    let events = e.drain_events();
    let KvEvent::BlockStored(s) = &events[0] else { panic!() };
    assert_eq!(s.images.len(), 2);
    assert_eq!(s.images[0].uuid.as_deref(), Some("sku-001"));
    assert_eq!(s.images[1].uuid, None);
    // Oversized UUIDs are kept on the request but never become hints.
    let long = vec![b'u'; 257];
    let o = e
        .add_request(&RequestSpec {
            tokens: &tokens,
            items: vec![image_item(b"z")],
            uuids: Some(vec![Some(&long)]),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(e.counters().hint_oversized, 1);
    assert_eq!(e.request_uuids(o.id).unwrap().unwrap()[0].as_ref().map(String::len), Some(257));
    // The same pixels under a second UUID make the hint ambiguous: dropped from events.
    let conflict = RequestSpec {
        tokens: &two_items[..4],
        items: vec![MmItemSpec { content: MmContent::Bytes(b"p"), runs: vec![TokenRun { start: 1, len: 2 }] }],
        uuids: Some(vec![Some(b"sku-002")]),
        lora_id: Some(3),
        lora_name: Some("adapter-3"),
        ..Default::default()
    };
    let c = e.add_request(&conflict).unwrap();
    e.commit(c.id, 4).unwrap();
    e.step();
    let events = e.drain_events();
    let KvEvent::BlockStored(s) = &events[0] else { panic!() };
    assert_eq!(s.images[0].uuid, None, "an ambiguous hint never reaches the wire");
    assert_eq!(e.counters().hint_conflicts, 1);
}

/// Partial reuse: a prompt sharing k < block size tokens with a cached block
/// gets a fresh block and one copy of those k tokens from the cached page,
/// counted as cached; off, nothing is copied. Image positions stop the shared run.
#[test]
fn partial_reuse_copies_the_shared_tokens() {
    use kvcore::{BlockCopy, PageRef};
    let config = EngineConfig { block_size_tokens: BS, blocks_device: 16, partial_reuse: true, ..Default::default() };
    let mut e = Engine::new(config.clone()).unwrap();
    let first: Vec<u32> = (1..=12).collect();
    let a = e.add_request(&RequestSpec { tokens: &first, ..Default::default() }).unwrap();
    let a_pages = e.block_table(a.id).unwrap();
    e.commit(a.id, 12).unwrap();
    e.finish(a.id).unwrap();
    e.step();
    // Shares block 0 fully and 5, 6 of block 1.
    let second = [1, 2, 3, 4, 5, 6, 70, 80, 90];
    let b = e.add_request(&RequestSpec { tokens: &second, ..Default::default() }).unwrap();
    assert_eq!(b.tokens_cached, 6);
    let b_pages = e.block_table(b.id).unwrap();
    assert_eq!(b_pages[0], a_pages[0], "the full block is shared");
    assert_ne!(b_pages[1], a_pages[1], "the partial block is a fresh page");
    let copies = e.step();
    let gpu = |page| PageRef { medium: kvcore::Tier::Device, page };
    assert_eq!(copies, vec![BlockCopy { src: gpu(a_pages[1]), dst: gpu(b_pages[1]), tokens: 2, group: 0 }]);
    assert_eq!(e.request_info(b.id).unwrap().tokens_computed, 6);
    assert_eq!(e.counters().blocks_partially_reused, 1);
    // The partial block is committed normally once the rest is computed.
    e.commit(b.id, 9).unwrap();
    e.finish(b.id).unwrap();
    e.check_invariants();
    // A first block shared in part: found among the scope's first blocks.
    let third = [1, 2, 3, 50, 60];
    let c = e.add_request(&RequestSpec { tokens: &third, ..Default::default() }).unwrap();
    assert_eq!(c.tokens_cached, 3);
    e.cancel(c.id).unwrap();
    // At least one prompt token is always left to compute.
    let short = [1, 2, 3];
    let d = e.add_request(&RequestSpec { tokens: &short, ..Default::default() }).unwrap();
    assert_eq!(d.tokens_cached, 2);
    e.cancel(d.id).unwrap();
    // An image position ends the shared run, even where placeholder tokens agree.
    let with_image = [1, 2, 3, 9, 9];
    let img = MmItemSpec { content: MmContent::Bytes(b"i"), runs: vec![TokenRun { start: 3, len: 2 }] };
    let f = e.add_request(&RequestSpec { tokens: &with_image, items: vec![img], ..Default::default() }).unwrap();
    assert_eq!(f.tokens_cached, 3);
    e.cancel(f.id).unwrap();
    e.step();
    // Off: the same prompt matches full blocks only and nothing is copied.
    let mut off = Engine::new(EngineConfig { partial_reuse: false, ..config }).unwrap();
    let a = off.add_request(&RequestSpec { tokens: &first, ..Default::default() }).unwrap();
    off.commit(a.id, 12).unwrap();
    off.finish(a.id).unwrap();
    off.step();
    let b = off.add_request(&RequestSpec { tokens: &second, ..Default::default() }).unwrap();
    assert_eq!(b.tokens_cached, 4);
    assert!(off.step().is_empty());
}

/// Undrained event batches are bounded by `event_batches_max`: a caller that
/// never drains keeps only the newest batches, and every dropped one is
/// counted; draining keeps them all.
#[test]
fn undrained_batches_are_bounded_and_counted() {
    let mut e = Engine::new(EngineConfig {
        block_size_tokens: BS,
        blocks_device: 64,
        event_batches_max: 2,
        ..Default::default()
    })
    .unwrap();
    let mut steps = Vec::new();
    for i in 0..5u32 {
        serve(&mut e, &RequestSpec { tokens: &[100 + i, 1, 2, 3, 4], ..Default::default() });
        steps.push(e.step_index() - 1);
    }
    let kept = e.drain_batches();
    assert_eq!(kept.iter().map(|b| b.step_index).collect::<Vec<_>>(), steps[3..].to_vec(), "the newest two");
    assert_eq!(e.counters().event_batches_dropped, 3);
    serve(&mut e, &RequestSpec { tokens: &[200, 1, 2, 3, 4], ..Default::default() });
    assert_eq!(e.drain_batches().len(), 1);
    assert_eq!(e.counters().event_batches_dropped, 3, "a drained queue drops nothing");
}
