//! The seed's routing scenarios, end to end: engines publish over loopback
//! ZMQ, the subscriber indexes their streams, requests are hashed from text
//! (through the test tokenizer and the Qwen2-VL profile) or token ids, and
//! the decision is checked.

mod router_support;

use std::time::Duration;

use kvcore::TokenRun;
use kvcore_router::{
    ImageInput, ImageRef, Message, ModelProfile, Part, ScoringConfig, Subscriber, SubscriberConfig, TokenRequest,
    WorkerId, decide, hash_request,
};
use router_support::{Worker, sync};
use tokenizers::Tokenizer;

const BS: u32 = 4;

fn cluster() -> (Worker, Worker, Subscriber, WorkerId, WorkerId) {
    let (a, b) = (Worker::new(BS, 256, 0, 1000), Worker::new(BS, 256, 0, 1000));
    let mut sub = Subscriber::new(SubscriberConfig {
        indexer: kvcore_router::IndexerConfig { block_size: BS, ..Default::default() },
        ..Default::default()
    });
    let ia = a.subscribe(&mut sub, "a");
    let ib = b.subscribe(&mut sub, "b");
    (a, b, sub, ia, ib)
}

fn synced(sub: &mut Subscriber, a: &mut Worker, ia: WorkerId, b: &mut Worker, ib: WorkerId) {
    assert!(sync(sub, &mut [(a, ia), (b, ib)], Duration::from_secs(20)), "subscriber caught up");
}

fn tokenizer() -> Tokenizer {
    let dir = router_support::temp_dir("router-scenarios");
    Tokenizer::from_file(router_support::write_test_tokenizer(&dir)).expect("test tokenizer")
}

fn chat(image: ImageRef, text: &str) -> Vec<Message> {
    vec![Message {
        role: "user".into(),
        parts: vec![Part::Image(ImageInput { image, width: Some(112), height: Some(112) }), Part::Text(text.into())],
    }]
}

/// The request's image run as the engine takes it.
fn image_run(req: &TokenRequest) -> TokenRun {
    let (start, len) = req.images[0].runs[0];
    TokenRun { start, len }
}

/// A repeated image routes to the worker that holds it, when the new request
/// names the image only by its UUID; and a different image under the same
/// UUID, or an image never seen, is not routed by cache.
#[test]
fn images_route_by_content_not_by_uuid() {
    let (mut a, mut b, mut sub, ia, ib) = cluster();
    let tok = tokenizer();
    let profile = ModelProfile::qwen2_vl();
    let cat = b"cat pixels".as_slice();
    let first =
        profile.render(&tok, &chat(ImageRef::Bytes(cat.to_vec()), "describe this image ."), None, None).unwrap();
    a.run(&first.tokens, &[(cat, Some("img-cat"), image_run(&first))]).unwrap();
    // b holds unrelated text, so that it is a live candidate with no overlap.
    b.run(&(1000..1040).collect::<Vec<u32>>(), &[]).unwrap();
    synced(&mut sub, &mut a, ia, &mut b, ib);
    let ix = sub.indexer();
    let workers = [(ia, 0.0), (ib, 0.0)];
    let blocks = first.tokens.len() as u32 / BS;

    // Same image by UUID only: resolved through what events taught the router.
    let again =
        profile.render(&tok, &chat(ImageRef::Uuid("img-cat".into()), "describe this image ."), None, None).unwrap();
    let h = hash_request(&again, BS, profile.image_placeholder, ix).unwrap();
    assert_eq!(h.keys.len() as u32, blocks);
    let m = ix.find_matches(&h.keys);
    assert_eq!(m.iter().find(|o| o.worker == ia).map(|o| o.device_blocks), Some(blocks));
    let d = decide(&ScoringConfig::default(), blocks, h.keys.first().copied(), &m, &workers);
    assert_eq!(d.worker, Some(ia.0));

    // The image starts inside this block: blocks before it are plain text.
    let image_block = image_run(&first).start / BS;
    let text_prefix = image_run(&first).start.saturating_sub(1) / BS; // vision_start sits before the pads
    assert!(text_prefix <= image_block);
    for other in [ImageRef::Bytes(b"other pixels, same uuid".to_vec()), ImageRef::Bytes(b"never seen".to_vec())] {
        let req = profile.render(&tok, &chat(other, "describe this image ."), None, None).unwrap();
        let h = hash_request(&req, BS, profile.image_placeholder, ix).unwrap();
        let m = ix.find_matches(&h.keys);
        let got = m.iter().find(|o| o.worker == ia).map_or(0, |o| o.any_tier_blocks);
        assert_eq!(got, image_block, "only the text before the image matches");
    }
    // An unseen UUID alone cannot be keyed past the image.
    let unseen = profile.render(&tok, &chat(ImageRef::Uuid("img-dog".into()), "describe"), None, None).unwrap();
    let h = hash_request(&unseen, BS, profile.image_placeholder, ix).unwrap();
    assert_eq!(h.keys.len() as u32, image_block);
    assert!(h.stop.is_some());
}

/// When another worker stores the same UUID with other pixels, the router
/// learns that the UUID is ambiguous and stops resolving it.
#[test]
fn a_uuid_seen_with_two_digests_resolves_to_nothing() {
    let (mut a, mut b, mut sub, ia, ib) = cluster();
    let tokens: Vec<u32> = (0..24).collect();
    let run = TokenRun { start: 8, len: 8 };
    a.run(&tokens, &[(b"one", Some("shared-uuid"), run)]).unwrap();
    b.run(&tokens, &[(b"two", Some("shared-uuid"), run)]).unwrap();
    synced(&mut sub, &mut a, ia, &mut b, ib);
    let req = TokenRequest {
        tokens,
        images: vec![kvcore_router::ImagePlacement { image: ImageRef::Uuid("shared-uuid".into()), runs: vec![(8, 8)] }],
        ..Default::default()
    };
    let h = hash_request(&req, BS, kvcore::QWEN_IMAGE_PAD_TOKEN, sub.indexer()).unwrap();
    assert_eq!(h.keys.len(), 2, "keys stop at the image's block");
    assert_eq!(sub.indexer().counters().uuid_conflicts, 1);
}

/// A text prefix held by two workers routes to either of them: both show the
/// full overlap, and the decision picks one of the two.
#[test]
fn a_shared_text_prefix_routes_to_either_holder() {
    let (mut a, mut b, mut sub, ia, ib) = cluster();
    let c = Worker::new(BS, 256, 0, 1000);
    let ic = c.subscribe(&mut sub, "c");
    let prompt: Vec<u32> = (500..540).collect();
    a.run(&prompt, &[]).unwrap();
    b.run(&prompt, &[]).unwrap();
    let mut c = c;
    assert!(sync(&mut sub, &mut [(&mut a, ia), (&mut b, ib), (&mut c, ic)], Duration::from_secs(20)));
    let mut longer = prompt.clone();
    longer.extend(900..908);
    let h = hash_request(&TokenRequest { tokens: longer, ..Default::default() }, BS, 0, sub.indexer()).unwrap();
    let m = sub.indexer().find_matches(&h.keys);
    assert_eq!(m.iter().map(|o| (o.worker, o.device_blocks)).collect::<Vec<_>>(), vec![(ia, 10), (ib, 10)]);
    let workers = [(ia, 0.0), (ib, 0.0), (ic, 0.0)];
    let mut picked = std::collections::BTreeSet::new();
    // Requests sharing the prefix but differing in their first key spread.
    for extra in 0..8u64 {
        let first = Some(kvcore_router::RouterKey(h.keys[0].0.wrapping_add(extra)));
        let d = decide(&ScoringConfig::default(), h.blocks_full as u32, first, &m, &workers);
        let w = d.worker.expect("a decision");
        assert!(w == ia.0 || w == ib.0, "routed to a holder, got {w}");
        picked.insert(w);
    }
    assert_eq!(picked.len(), 2, "equal holders share the traffic");
}

/// Three engines over loopback ZMQ: a and b hold one UUID under different
/// pixels, c holds text. A request naming the UUID matches the text before
/// the image on a and b and no image block anywhere. Once b evicts its copy
/// the UUID names a's pixels alone again, and the request routes to a with
/// its whole prompt matched; when b stores its pixels again the conflict is
/// back, and b's restart (a clear) ends it.
#[test]
fn a_uuid_conflict_lasts_until_the_conflicting_copy_is_gone() {
    let (mut a, mut b, mut sub, ia, ib) = cluster();
    let mut c = Worker::new(BS, 256, 0, 1000);
    let ic = c.subscribe(&mut sub, "c");
    let tokens: Vec<u32> = (100..124).collect();
    let run = TokenRun { start: 8, len: 8 };
    a.run(&tokens, &[(b"pixels on a", Some("shared-uuid"), run)]).unwrap();
    b.run(&tokens, &[(b"pixels on b", Some("shared-uuid"), run)]).unwrap();
    c.run(&(1000..1024).collect::<Vec<u32>>(), &[]).unwrap();
    let all = |sub: &mut Subscriber, a: &mut Worker, b: &mut Worker, c: &mut Worker| {
        assert!(sync(sub, &mut [(a, ia), (b, ib), (c, ic)], Duration::from_secs(20)), "subscriber caught up");
    };
    all(&mut sub, &mut a, &mut b, &mut c);
    let req = TokenRequest {
        tokens: tokens.clone(),
        images: vec![kvcore_router::ImagePlacement { image: ImageRef::Uuid("shared-uuid".into()), runs: vec![(8, 8)] }],
        ..Default::default()
    };
    let workers = [(ia, 0.0), (ib, 0.0), (ic, 0.0)];
    let matched = |sub: &Subscriber| {
        let h = hash_request(&req, BS, kvcore::QWEN_IMAGE_PAD_TOKEN, sub.indexer()).unwrap();
        let m = sub.indexer().find_matches(&h.keys);
        (m.iter().map(|o| (o.worker, o.any_tier_blocks)).collect::<Vec<_>>(), h)
    };
    let (m, h) = matched(&sub);
    assert_eq!(m, vec![(ia, 2), (ib, 2)], "only the two text blocks before the image match");
    assert_eq!(h.stop, Some(kvcore_router::KeysStop::AmbiguousUuid { image: 0 }));
    assert_eq!(sub.indexer().memory().uuids_ambiguous, 1);

    // b evicts its copy: the fleet holds the UUID under a's pixels alone.
    assert!(b.engine.evict(1000) > 0);
    b.step();
    all(&mut sub, &mut a, &mut b, &mut c);
    let (m, h) = matched(&sub);
    assert_eq!(h.keys.len(), 6);
    assert_eq!(m, vec![(ia, 6)], "the whole prompt matches on a, the holder of the UUID's pixels");
    let d =
        decide(&ScoringConfig::default(), 6, h.keys.first().copied(), &sub.indexer().find_matches(&h.keys), &workers);
    assert_eq!(d.worker, Some(ia.0));
    assert_eq!(sub.indexer().counters().uuid_conflicts_resolved, 1);

    // b stores its pixels again, then restarts (its cache cleared).
    b.run(&tokens, &[(b"pixels on b", Some("shared-uuid"), run)]).unwrap();
    all(&mut sub, &mut a, &mut b, &mut c);
    assert_eq!(matched(&sub).0, vec![(ia, 2), (ib, 2)]);
    b.engine.clear();
    b.step();
    all(&mut sub, &mut a, &mut b, &mut c);
    assert_eq!(matched(&sub).0, vec![(ia, 6)]);
    let counters = sub.indexer().counters();
    assert_eq!((counters.uuid_conflicts, counters.uuid_conflicts_resolved), (2, 2));
}
