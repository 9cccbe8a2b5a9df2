//! The wire codec: projection round trips, compatibility with other
//! producers' encodings, tolerance of what it does not know, and robustness
//! against hostile bytes.

use kvcore::wire::{DecodeError, EncodeOptions, EventForm, decode_message, decode_payload, encode_events, wire_event};
use kvcore::wire::{WireBlockStored, WireEvent};
use kvcore::{Engine, EngineConfig, KvEvent, MmContent, MmItemSpec, RequestSpec, TokenRun};
use proptest::prelude::*;
use rmp::encode as mp;

/// A workload with text, LoRA, salt, an image split by text into two runs,
/// an image spanning blocks, evictions and a clear.
fn workload() -> Vec<KvEvent> {
    let mut e = Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 64, ..Default::default() }).unwrap();
    let tokens: Vec<u32> = (1..=16).collect();
    let go = |spec: RequestSpec<'_>, e: &mut Engine| {
        let a = e.add_request(&spec).unwrap();
        e.commit(a.id, spec.tokens.len() as u64).unwrap();
        e.finish(a.id).unwrap();
        e.step();
    };
    go(RequestSpec { tokens: &tokens, ..Default::default() }, &mut e);
    go(RequestSpec { tokens: &tokens, lora_id: Some(7), lora_name: Some("adapter"), ..Default::default() }, &mut e);
    go(RequestSpec { tokens: &tokens, cache_salt: Some("salt"), ..Default::default() }, &mut e);
    let img = [1, 2, 3, 0, 0, 0, 70, 0, 0, 0, 0, 0, 0, 14, 15, 16];
    go(
        RequestSpec {
            tokens: &img,
            items: vec![
                MmItemSpec {
                    content: MmContent::Bytes(b"split"),
                    runs: vec![TokenRun { start: 3, len: 3 }, TokenRun { start: 7, len: 2 }],
                },
                MmItemSpec { content: MmContent::Bytes(b"second"), runs: vec![TokenRun { start: 9, len: 4 }] },
            ],
            uuids: Some(vec![Some(b"sku-1".as_slice()), None]),
            ..Default::default()
        },
        &mut e,
    );
    e.evict(3);
    e.step();
    e.clear();
    e.step();
    e.drain_events()
}

/// Every event, in every form and option, must decode to exactly its wire
/// projection, and the image metadata must be present iff a block holds an image.
#[test]
fn projection_round_trips_in_every_form() {
    let events = workload();
    assert!(events.iter().any(|e| matches!(e, KvEvent::BlockStored(s) if !s.images.is_empty())));
    assert!(events.iter().any(|e| matches!(e, KvEvent::BlockRemoved(_))));
    for form in [EventForm::Map, EventForm::Array] {
        for token_ids in [true, false] {
            let opts = EncodeOptions { form, token_ids };
            let mut bytes = Vec::new();
            encode_events(&events, 12.5, None, &opts, &mut bytes);
            let batch = decode_payload(&bytes).unwrap();
            assert_eq!(batch.ts, 12.5);
            assert_eq!(batch.data_parallel_rank, None);
            let want: Vec<WireEvent> = events.iter().map(|e| wire_event(e, &opts)).collect();
            assert_eq!(batch.events, want);
            for (typed, wire) in events.iter().zip(&batch.events) {
                if let (KvEvent::BlockStored(t), WireEvent::BlockStored(w)) = (typed, wire) {
                    let has_image = t.block_images.iter().any(|b| !b.is_empty());
                    assert_eq!(w.image_routing.is_some(), has_image);
                    assert_eq!(w.block_mm_infos.is_some(), has_image && token_ids);
                    assert_eq!(w.token_ids.is_some(), token_ids);
                    assert_eq!(w.block_hashes, t.keys.iter().map(|k| k.wire_hash().0).collect::<Vec<_>>());
                }
            }
        }
    }
}

/// A split item must give one mm_object per item per block with all its runs'
/// ranges, and its mm_hash must follow the UUID when known, the digest when not.
#[test]
fn mm_infos_follow_dynamo_identity_rules() {
    let events = workload();
    let stored = events
        .iter()
        .find_map(|e| match e {
            KvEvent::BlockStored(s) if s.images.len() == 2 => Some(s),
            _ => None,
        })
        .expect("the image request's event");
    let WireEvent::BlockStored(w) = wire_event(&KvEvent::BlockStored(stored.clone()), &EncodeOptions::default()) else {
        panic!("expected BlockStored")
    };
    let infos = w.block_mm_infos.unwrap();
    let uuid_hash = kvcore::mm_hash_of_identifier("sku-1");
    let digest_hash = kvcore::mm_hash_of_identifier(&stored.images[1].digest.to_hex());
    // Block 0 = tokens 0..4: item 0 at 3. Block 1 = 4..8: item 0 at 4,5 and 7.
    // Block 2 = 8..12: item 0 at 8, item 1 at 9..12. Block 3 = 12..16: item 1 at 12.
    let obj = |i: usize| infos[i].as_ref().unwrap().mm_objects.clone();
    assert_eq!(obj(0).len(), 1);
    assert_eq!((obj(0)[0].mm_hash, obj(0)[0].offsets.clone()), (uuid_hash, vec![[3, 4]]));
    assert_eq!((obj(1)[0].mm_hash, obj(1)[0].offsets.clone()), (uuid_hash, vec![[0, 2], [3, 4]]));
    assert_eq!(obj(2).len(), 2);
    assert_eq!((obj(2)[1].mm_hash, obj(2)[1].offsets.clone()), (digest_hash, vec![[1, 4]]));
    assert_eq!((obj(3)[0].mm_hash, obj(3)[0].offsets.clone()), (digest_hash, vec![[0, 1]]));
    let routing = w.image_routing.unwrap();
    assert_eq!(routing.items.len(), 2);
    assert_eq!(routing.blocks[1].iter().map(|r| (r.item, r.item_offset)).collect::<Vec<_>>(), vec![(0, 1), (0, 3)]);
}

/// A text-only event must be byte-identical to a vLLM-style encoding written
/// independently with `rmp`, i.e. to what a build without image support emits.
#[test]
fn text_only_event_is_plain_vllm_map_form() {
    let events = workload();
    let KvEvent::BlockStored(s) = &events[0] else { panic!("first event stores text") };
    assert!(s.images.is_empty());
    let mut ours = Vec::new();
    encode_events(&events[..1], 1.5, Some(3), &EncodeOptions::default(), &mut ours);
    let mut want = Vec::new();
    mp::write_array_len(&mut want, 3).unwrap();
    mp::write_f64(&mut want, 1.5).unwrap();
    mp::write_array_len(&mut want, 1).unwrap();
    mp::write_map_len(&mut want, 8).unwrap();
    mp::write_str(&mut want, "type").unwrap();
    mp::write_str(&mut want, "BlockStored").unwrap();
    mp::write_str(&mut want, "block_hashes").unwrap();
    mp::write_array_len(&mut want, s.keys.len() as u32).unwrap();
    for k in &s.keys {
        mp::write_sint(&mut want, k.wire_hash().0).unwrap();
    }
    mp::write_str(&mut want, "parent_block_hash").unwrap();
    mp::write_nil(&mut want).unwrap();
    mp::write_str(&mut want, "token_ids").unwrap();
    mp::write_array_len(&mut want, s.token_ids.len() as u32).unwrap();
    for t in &s.token_ids {
        mp::write_uint(&mut want, (*t).into()).unwrap();
    }
    mp::write_str(&mut want, "block_size").unwrap();
    mp::write_uint(&mut want, 4).unwrap();
    mp::write_str(&mut want, "lora_id").unwrap();
    mp::write_nil(&mut want).unwrap();
    mp::write_str(&mut want, "medium").unwrap();
    mp::write_str(&mut want, "GPU").unwrap();
    mp::write_str(&mut want, "lora_name").unwrap();
    mp::write_nil(&mut want).unwrap();
    mp::write_uint(&mut want, 3).unwrap();
    assert_eq!(ours, want);
}

/// A msgpack value as JSON (binary as a hex string), read with `rmp`'s
/// decoder: an independent view of what the encoder wrote.
fn to_json(rd: &mut &[u8]) -> serde_json::Value {
    use rmp::Marker as M;
    use rmp::decode::{self as d, RmpRead};
    use serde_json::Value as V;
    let text = |rd: &mut &[u8], n: usize| {
        let (head, rest) = rd.split_at(n);
        *rd = rest;
        head.to_vec()
    };
    match d::read_marker(rd).unwrap() {
        M::Null => V::Null,
        M::True => V::Bool(true),
        M::False => V::Bool(false),
        M::FixPos(n) => n.into(),
        M::FixNeg(n) => n.into(),
        M::U8 => rd.read_data_u8().unwrap().into(),
        M::U16 => rd.read_data_u16().unwrap().into(),
        M::U32 => rd.read_data_u32().unwrap().into(),
        M::U64 => rd.read_data_u64().unwrap().into(),
        M::I8 => rd.read_data_i8().unwrap().into(),
        M::I16 => rd.read_data_i16().unwrap().into(),
        M::I32 => rd.read_data_i32().unwrap().into(),
        M::I64 => rd.read_data_i64().unwrap().into(),
        M::F32 => rd.read_data_f32().unwrap().into(),
        M::F64 => rd.read_data_f64().unwrap().into(),
        M::FixStr(n) => V::String(String::from_utf8(text(rd, n.into())).unwrap()),
        M::Str8 => {
            let n = rd.read_data_u8().unwrap();
            V::String(String::from_utf8(text(rd, n.into())).unwrap())
        }
        M::Str16 => {
            let n = rd.read_data_u16().unwrap();
            V::String(String::from_utf8(text(rd, n.into())).unwrap())
        }
        M::Bin8 => {
            let n = rd.read_data_u8().unwrap();
            V::String(text(rd, n.into()).iter().map(|b| format!("{b:02x}")).collect())
        }
        M::FixArray(n) => V::Array((0..n).map(|_| to_json(rd)).collect()),
        M::Array16 => {
            let n = rd.read_data_u16().unwrap();
            V::Array((0..n).map(|_| to_json(rd)).collect())
        }
        M::FixMap(n) => V::Object((0..n).map(|_| (to_json(rd).as_str().unwrap().to_owned(), to_json(rd))).collect()),
        m => panic!("unexpected marker {m:?}"),
    }
}

/// The array form follows Dynamo 1.6.1's positional reference (vLLM 0.33's
/// field order): LoRA name at 7, the tagged salt and the per-block image
/// markers in `extra_keys` at 8, nothing but nil in vLLM's slots 9-15
/// (`group_idx` .. `lookahead_token_ids`, where a salt would otherwise read
/// as vLLM's `session_id`), and `image_routing` at 16. A map envelope decodes like
/// the array one.
#[test]
fn array_form_follows_the_reference_layout() {
    let events = workload();
    let opts = EncodeOptions { form: EventForm::Array, token_ids: true };
    let mut bytes = Vec::new();
    encode_events(&events, 1.0, Some(0), &opts, &mut bytes);
    let v = to_json(&mut &bytes[..]);
    let mut saw_salt = false;
    let mut saw_image = false;
    for (typed, ev) in events.iter().zip(v[1].as_array().unwrap()) {
        let KvEvent::BlockStored(t) = typed else { continue };
        let a = ev.as_array().unwrap();
        assert_eq!(a[0], "BlockStored");
        assert_eq!(a[7].as_str(), t.lora_name.as_deref(), "lora_name at 7");
        let has_image = t.block_images.iter().any(|b| !b.is_empty());
        let expected_len = if has_image {
            17
        } else if t.lora_name.is_some() || t.cache_salt.is_some() {
            9
        } else {
            8
        };
        assert_eq!(a.len(), expected_len, "{ev}");
        if a.len() > 9 {
            for (slot, x) in a.iter().enumerate().take(16).skip(9) {
                assert!(x.is_null(), "vLLM's slot {slot} stays unset: {x}");
            }
            assert!(a[16].is_object(), "image_routing at 16");
        }
        if let Some(salt) = &t.cache_salt {
            let first = a[8][0].as_array().unwrap();
            assert!(first.iter().any(|k| k.as_str() == Some(&format!("dynamo-cache-salt:{salt}"))), "{ev}");
            saw_salt = true;
        }
        if has_image {
            for (i, runs) in t.block_images.iter().enumerate() {
                let keys = a[8][i].as_array().map(Vec::as_slice).unwrap_or_default();
                let markers: Vec<&str> = keys.iter().filter_map(|k| k[0].as_str()).collect();
                // One marker per item present in the block, at its first run.
                let mut firsts: Vec<&kvcore::EventImageRun> = Vec::new();
                for r in runs {
                    if !firsts.iter().any(|f| f.image == r.image) {
                        firsts.push(r);
                    }
                }
                assert_eq!(markers.len(), firsts.len(), "block {i}: {ev}");
                for (m, r) in markers.iter().zip(firsts) {
                    let img = &t.images[r.image as usize];
                    let h = kvcore::mm_hash(&img.digest, img.uuid.as_deref());
                    assert_eq!(*m, format!("{h:016x}{}", "0".repeat(48)));
                    let offset = keys.iter().find(|k| k[0].as_str() == Some(m)).unwrap()[1].as_i64().unwrap();
                    assert_eq!(offset, i64::from(r.block_offset) - i64::from(r.item_offset), "vLLM's item start");
                }
            }
            saw_image = true;
        }
    }
    assert!(saw_salt && saw_image);
    // The same batch as a map envelope.
    let batch = decode_payload(&bytes).unwrap();
    let mut map = Vec::new();
    mp::write_map_len(&mut map, 3).unwrap();
    mp::write_str(&mut map, "events").unwrap();
    let at = {
        // The events array starts after the 3-element header and the f64 ts.
        1 + 9
    };
    map.extend_from_slice(&bytes[at..bytes.len() - 1]);
    mp::write_str(&mut map, "ts").unwrap();
    mp::write_f64(&mut map, 1.0).unwrap();
    mp::write_str(&mut map, "data_parallel_rank").unwrap();
    mp::write_uint(&mut map, 0).unwrap();
    assert_eq!(decode_payload(&map).unwrap(), batch);
}

/// Positional events as older vLLM writes them (eleven fields, u64 hashes,
/// extra_keys) must decode, with a u64 hash read as the same 64 bits.
#[test]
fn decodes_positional_events_of_older_producers() {
    let mut p = Vec::new();
    mp::write_array_len(&mut p, 3).unwrap();
    mp::write_f32(&mut p, 2.0).unwrap();
    mp::write_array_len(&mut p, 3).unwrap();
    mp::write_array_len(&mut p, 12).unwrap();
    mp::write_str(&mut p, "BlockStored").unwrap();
    mp::write_array_len(&mut p, 1).unwrap();
    mp::write_u64(&mut p, u64::MAX - 1).unwrap();
    mp::write_uint(&mut p, 5).unwrap();
    mp::write_array_len(&mut p, 2).unwrap();
    mp::write_uint(&mut p, 10).unwrap();
    mp::write_uint(&mut p, 70_000).unwrap();
    mp::write_uint(&mut p, 2).unwrap();
    mp::write_sint(&mut p, 4).unwrap();
    mp::write_str(&mut p, "CPU").unwrap();
    mp::write_str(&mut p, "lora").unwrap();
    mp::write_array_len(&mut p, 1).unwrap(); // extra_keys: [[ "sha", 0 ]]
    mp::write_array_len(&mut p, 2).unwrap();
    mp::write_str(&mut p, "sha").unwrap();
    mp::write_uint(&mut p, 0).unwrap();
    mp::write_uint(&mut p, 0).unwrap(); // group_idx
    mp::write_str(&mut p, "full_attention").unwrap();
    mp::write_nil(&mut p).unwrap();
    mp::write_array_len(&mut p, 3).unwrap();
    mp::write_str(&mut p, "BlockRemoved").unwrap();
    mp::write_array_len(&mut p, 1).unwrap();
    mp::write_sint(&mut p, -9).unwrap();
    mp::write_str(&mut p, "GPU").unwrap();
    mp::write_array_len(&mut p, 1).unwrap();
    mp::write_str(&mut p, "AllBlocksCleared").unwrap();
    mp::write_uint(&mut p, 1).unwrap();
    let b = decode_payload(&p).unwrap();
    assert_eq!(b.ts, 2.0);
    assert_eq!(b.data_parallel_rank, Some(1));
    assert_eq!(
        b.events[0],
        WireEvent::BlockStored(WireBlockStored {
            block_hashes: vec![-2],
            parent_block_hash: Some(5),
            token_ids: Some(vec![10, 70_000]),
            block_size: 2,
            lora_id: Some(4),
            medium: Some("CPU".into()),
            lora_name: Some("lora".into()),
            group_idx: Some(0),
            kv_cache_spec_kind: Some("full_attention".into()),
            ..Default::default()
        })
    );
    assert!(matches!(&b.events[1], WireEvent::BlockRemoved(r) if r.block_hashes == [-9]));
    assert_eq!(b.events[2], WireEvent::AllBlocksCleared);
}

/// One token id in a chosen msgpack integer form (the decoder must accept
/// every form whose value fits a u32, not only the shortest one).
#[derive(Clone, Debug)]
enum TokenForm {
    Shortest(u32),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u32),
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
}

fn write_token(p: &mut Vec<u8>, t: &TokenForm) {
    match *t {
        TokenForm::Shortest(v) => {
            mp::write_uint(p, v as u64).unwrap();
        }
        TokenForm::U8(v) => mp::write_u8(p, v).unwrap(),
        TokenForm::U16(v) => mp::write_u16(p, v).unwrap(),
        TokenForm::U32(v) => mp::write_u32(p, v).unwrap(),
        TokenForm::U64(v) => mp::write_u64(p, v as u64).unwrap(),
        TokenForm::I8(v) => mp::write_i8(p, v).unwrap(),
        TokenForm::I16(v) => mp::write_i16(p, v).unwrap(),
        TokenForm::I32(v) => mp::write_i32(p, v).unwrap(),
        TokenForm::I64(v) => mp::write_i64(p, v).unwrap(),
    }
}

/// The value a form carries, if it is a valid token id.
fn token_value(t: &TokenForm) -> Option<u32> {
    match *t {
        TokenForm::Shortest(v) | TokenForm::U32(v) | TokenForm::U64(v) => Some(v),
        TokenForm::U8(v) => Some(v.into()),
        TokenForm::U16(v) => Some(v.into()),
        TokenForm::I8(v) => u32::try_from(v).ok(),
        TokenForm::I16(v) => u32::try_from(v).ok(),
        TokenForm::I32(v) => u32::try_from(v).ok(),
        TokenForm::I64(v) => u32::try_from(v).ok(),
    }
}

fn token_form() -> impl Strategy<Value = TokenForm> {
    prop_oneof![
        any::<u32>().prop_map(TokenForm::Shortest),
        (0..200_000u32).prop_map(TokenForm::Shortest),
        any::<u8>().prop_map(TokenForm::U8),
        any::<u16>().prop_map(TokenForm::U16),
        any::<u32>().prop_map(TokenForm::U32),
        any::<u32>().prop_map(TokenForm::U64),
        any::<i8>().prop_map(TokenForm::I8),
        any::<i16>().prop_map(TokenForm::I16),
        any::<i32>().prop_map(TokenForm::I32),
        prop_oneof![any::<i64>(), 0..=u32::MAX as i64, (u32::MAX as i64 + 1)..i64::MAX].prop_map(TokenForm::I64),
    ]
}

/// A positional `BlockStored` payload of one block whose token ids are
/// written in the given forms.
fn payload_with_tokens(tokens: &[TokenForm]) -> Vec<u8> {
    let mut p = Vec::new();
    mp::write_array_len(&mut p, 3).unwrap();
    mp::write_f32(&mut p, 1.0).unwrap();
    mp::write_array_len(&mut p, 1).unwrap();
    mp::write_array_len(&mut p, 5).unwrap();
    mp::write_str(&mut p, "BlockStored").unwrap();
    mp::write_array_len(&mut p, 1).unwrap();
    mp::write_uint(&mut p, 7).unwrap();
    mp::write_nil(&mut p).unwrap();
    mp::write_array_len(&mut p, tokens.len() as u32).unwrap();
    for t in tokens {
        write_token(&mut p, t);
    }
    mp::write_uint(&mut p, tokens.len() as u64).unwrap();
    mp::write_nil(&mut p).unwrap();
    p
}

/// A payload whose token ids are written in `tokens`' forms decodes to their
/// values, or is rejected when one of them is not a valid id; cut at `cut`
/// inside the token array, it is rejected.
fn decodes_or_rejects(tokens: &[TokenForm], cut: prop::sample::Index) -> Result<(), TestCaseError> {
    let p = payload_with_tokens(tokens);
    let want: Option<Vec<u32>> = tokens.iter().map(token_value).collect();
    match (decode_payload(&p), want) {
        (Ok(b), Some(want)) => match &b.events[0] {
            WireEvent::BlockStored(s) => prop_assert_eq!(s.token_ids.as_deref(), Some(&want[..])),
            e => prop_assert!(false, "decoded {:?}", e),
        },
        (Err(_), None) => {}
        (got, want) => prop_assert!(false, "decoded {:?}, expected tokens {:?}", got.map(|b| b.events), want),
    }
    // The token array is followed by the block size and a nil.
    let token_bytes: usize = tokens
        .iter()
        .map(|t| {
            let mut b = Vec::new();
            write_token(&mut b, t);
            b.len()
        })
        .sum();
    let mut size = Vec::new();
    mp::write_uint(&mut size, tokens.len() as u64).unwrap();
    let start = p.len() - size.len() - 1 - token_bytes;
    let at = start + cut.index(token_bytes);
    prop_assert!(decode_payload(&p[..at]).is_err());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Token ids decode to their values in every msgpack integer form (the
    /// decoder reads the unsigned forms in a fast loop and the others through
    /// the general reader); a negative id or one above u32::MAX is an error,
    /// and so is a payload cut anywhere inside the token array, never a panic.
    #[test]
    fn token_ids_decode_in_every_integer_form(tokens in proptest::collection::vec(token_form(), 1..40), cut in any::<prop::sample::Index>()) {
        decodes_or_rejects(&tokens, cut)?;
    }

    /// Long token arrays whose first ids mix the unsigned forms (so that the
    /// decoder takes its loop without a branch on the form), followed by ids
    /// in any form (which that loop hands to the general reader): every value
    /// decodes, an invalid id is an error, and so is a cut anywhere inside.
    #[test]
    fn mixed_unsigned_token_ids_then_any_form(
        head in proptest::collection::vec(prop_oneof![
            (0..0x80u32).prop_map(TokenForm::Shortest),
            any::<u8>().prop_map(TokenForm::U8),
            any::<u16>().prop_map(TokenForm::U16),
            any::<u32>().prop_map(TokenForm::U32),
        ], 16..300),
        tail in proptest::collection::vec(token_form(), 0..24),
        cut in any::<prop::sample::Index>(),
    ) {
        let tokens: Vec<TokenForm> = head.into_iter().chain(tail).collect();
        decodes_or_rejects(&tokens, cut)?;
    }
}

/// Unknown fields, unknown event types and unknown image_routing versions are
/// skipped, and the rest of the event still decodes.
#[test]
fn unknown_fields_types_and_versions_are_skipped() {
    let mut p = Vec::new();
    mp::write_array_len(&mut p, 3).unwrap();
    mp::write_f64(&mut p, 0.0).unwrap();
    mp::write_array_len(&mut p, 2).unwrap();
    mp::write_map_len(&mut p, 6).unwrap();
    mp::write_str(&mut p, "future_field").unwrap();
    mp::write_map_len(&mut p, 1).unwrap();
    mp::write_uint(&mut p, 1).unwrap(); // a non-string key, nested
    mp::write_array_len(&mut p, 2).unwrap();
    mp::write_bin(&mut p, b"xyz").unwrap();
    mp::write_ext_meta(&mut p, 2, 7).unwrap();
    p.extend_from_slice(&[0, 0]);
    mp::write_str(&mut p, "block_hashes").unwrap();
    mp::write_array_len(&mut p, 1).unwrap();
    mp::write_sint(&mut p, 42).unwrap();
    mp::write_str(&mut p, "image_routing").unwrap();
    mp::write_map_len(&mut p, 2).unwrap();
    mp::write_str(&mut p, "items").unwrap();
    mp::write_str(&mut p, "a v2 layout").unwrap();
    mp::write_str(&mut p, "v").unwrap();
    mp::write_uint(&mut p, 2).unwrap();
    mp::write_str(&mut p, "block_size").unwrap();
    mp::write_uint(&mut p, 16).unwrap();
    mp::write_str(&mut p, "medium").unwrap();
    mp::write_nil(&mut p).unwrap();
    mp::write_str(&mut p, "type").unwrap(); // the type last
    mp::write_str(&mut p, "BlockStored").unwrap();
    mp::write_map_len(&mut p, 2).unwrap();
    mp::write_str(&mut p, "type").unwrap();
    mp::write_str(&mut p, "BlockUpdated").unwrap();
    mp::write_str(&mut p, "block_hashes").unwrap();
    mp::write_array_len(&mut p, 0).unwrap();
    mp::write_nil(&mut p).unwrap();
    let b = decode_payload(&p).unwrap();
    assert_eq!(
        b.events[0],
        WireEvent::BlockStored(WireBlockStored { block_hashes: vec![42], block_size: 16, ..Default::default() })
    );
    assert_eq!(b.events[1], WireEvent::Unknown { name: "BlockUpdated".into() });
}

/// Malformed input gets a clear error naming what is wrong.
#[test]
fn malformed_input_gets_clear_errors() {
    let mut map_envelope = Vec::new();
    mp::write_map_len(&mut map_envelope, 0).unwrap();
    assert!(matches!(decode_payload(&map_envelope), Err(DecodeError::Missing { field: "ts", .. })));
    let mut ok = Vec::new();
    encode_events(&workload()[..1], 0.0, None, &EncodeOptions::default(), &mut ok);
    assert!(matches!(decode_payload(&ok[..ok.len() - 1]), Err(DecodeError::Truncated(_))));
    let mut trailing = ok.clone();
    trailing.push(0);
    assert_eq!(decode_payload(&trailing), Err(DecodeError::Trailing(1)));
    assert_eq!(decode_message(&[b"", b"1234567", &ok]), Err(DecodeError::SeqLength(7)));
    assert_eq!(decode_message(&[b"", &ok]), Err(DecodeError::FrameCount(2)));
    let m = decode_message(&[b"t", &7u64.to_be_bytes(), &ok]).unwrap();
    assert_eq!((m.topic.as_slice(), m.seq), (&b"t"[..], 7));
    // A token id beyond u32 is out of range, not truncated to something else.
    let mut big = Vec::new();
    mp::write_array_len(&mut big, 3).unwrap();
    mp::write_f64(&mut big, 0.0).unwrap();
    mp::write_array_len(&mut big, 1).unwrap();
    mp::write_array_len(&mut big, 5).unwrap();
    mp::write_str(&mut big, "BlockStored").unwrap();
    mp::write_array_len(&mut big, 0).unwrap();
    mp::write_nil(&mut big).unwrap();
    mp::write_array_len(&mut big, 1).unwrap();
    mp::write_u64(&mut big, 1 << 40).unwrap();
    mp::write_uint(&mut big, 1).unwrap();
    mp::write_nil(&mut big).unwrap();
    let err = decode_payload(&big).unwrap_err();
    assert!(matches!(err, DecodeError::OutOfRange { what: "token id", .. }), "{err}");
    assert!(err.to_string().contains("token id out of range"));
}

/// A hostile length prefix (four billion events claimed in six bytes) fails
/// fast instead of reserving memory for what the input cannot hold.
#[test]
fn hostile_lengths_fail_fast() {
    let mut p = vec![0x93, 0xcb];
    p.extend_from_slice(&0f64.to_be_bytes());
    p.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
    assert!(matches!(decode_payload(&p), Err(DecodeError::Truncated(_))));
    // Deep nesting in a skipped field costs no stack.
    let mut deep = vec![0x93, 0xcb];
    deep.extend_from_slice(&0f64.to_be_bytes());
    deep.extend_from_slice(&[0x91, 0x82, 0xa4]);
    deep.extend_from_slice(b"type");
    deep.extend_from_slice(&[0xa1, b'X', 0xa1, b'z']);
    deep.extend(std::iter::repeat_n(0x91, 1_000_000));
    deep.push(0xc0);
    deep.push(0xc0);
    let b = decode_payload(&deep).unwrap();
    assert_eq!(b.events, vec![WireEvent::Unknown { name: "X".into() }]);
}

/// The workload and the hybrid events, each in both forms.
fn valid_payloads() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for events in [workload(), hybrid_events()] {
        for form in [EventForm::Map, EventForm::Array] {
            let mut b = Vec::new();
            encode_events(&events, 3.25, Some(1), &EncodeOptions { form, token_ids: true }, &mut b);
            out.push(b);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Arbitrary bytes never panic the decoder, and what decodes re-encodes
    /// to the same batch (the fuzz target's property, run as a test).
    #[test]
    #[cfg_attr(miri, ignore = "slow under miri")]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        kvcore::fuzzing::decode(&bytes);
    }

    /// Valid payloads with bytes flipped or cut never panic the decoder.
    #[test]
    #[cfg_attr(miri, ignore = "slow under miri")]
    fn mutated_payloads_never_panic(
        which in 0usize..4,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let mut p = valid_payloads()[which].clone();
        for (at, v) in flips {
            let i = at % p.len();
            p[i] = v;
        }
        kvcore::fuzzing::decode(&p);
        let n = cut % p.len();
        kvcore::fuzzing::decode(&p[..n]);
    }

    /// Typed events built from arbitrary bytes round-trip under every option.
    #[test]
    #[cfg_attr(miri, ignore = "slow under miri")]
    fn arbitrary_events_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        kvcore::fuzzing::roundtrip(&bytes);
    }
}

/// A hybrid engine's stores and removals: the same chain in a full-attention
/// group 0 and a sliding-window group 1 (window 8 tokens), then a removal
/// from each group.
fn hybrid_events() -> Vec<KvEvent> {
    use kvcore::{BlockKey, BlockRemoved, BlockStored, GroupKind, KvGroup, Tier};
    let full = KvGroup { index: 0, kind: GroupKind::FullAttention };
    let window = KvGroup { index: 1, kind: GroupKind::SlidingWindow { window_tokens: 8 } };
    let key = |b: u8| BlockKey([b; 32]);
    let stored = |event_seq, group| {
        KvEvent::BlockStored(BlockStored {
            event_seq,
            keys: vec![key(1), key(2)],
            parent: None,
            token_ids: (1..=8).collect(),
            block_size: 4,
            lora_id: None,
            lora_name: None,
            cache_salt: None,
            medium: Tier::Device,
            images: Vec::new(),
            block_images: Default::default(),
            group: Some(group),
        })
    };
    vec![
        stored(0, full),
        stored(1, window),
        KvEvent::BlockRemoved(BlockRemoved {
            event_seq: 2,
            keys: vec![key(1)],
            medium: Tier::Device,
            group: Some(window),
        }),
        KvEvent::BlockRemoved(BlockRemoved {
            event_seq: 3,
            keys: vec![key(2)],
            medium: Tier::Device,
            group: Some(full),
        }),
    ]
}

/// The map form names the group fields as vLLM 0.33 does (`group_idx`,
/// `kv_cache_spec_kind`, `kv_cache_spec_sliding_window`, the window omitted
/// for full attention), on stores and removals alike; the array form puts
/// them at vLLM's slots 9, 10 and 11 of `BlockStored` (8 a nil placeholder
/// for `extra_keys`) and the group at slot 3 of `BlockRemoved`, with nothing
/// after it. Both decode back to the projection.
#[test]
fn group_fields_sit_at_vllm_names_and_positions() {
    let events = hybrid_events();
    let mut map = Vec::new();
    encode_events(&events, 1.0, None, &EncodeOptions::default(), &mut map);
    let v = to_json(&mut &map[..]);
    let ev = v[1].as_array().unwrap();
    assert_eq!(ev[0]["group_idx"], 0);
    assert_eq!(ev[0]["kv_cache_spec_kind"], "full_attention");
    assert!(ev[0].get("kv_cache_spec_sliding_window").is_none(), "{}", ev[0]);
    assert_eq!(ev[1]["group_idx"], 1);
    assert_eq!(ev[1]["kv_cache_spec_kind"], "sliding_window");
    assert_eq!(ev[1]["kv_cache_spec_sliding_window"], 8);
    assert_eq!(ev[2]["type"], "BlockRemoved");
    assert_eq!(ev[2]["group_idx"], 1);
    assert_eq!(ev[2]["kv_cache_spec_kind"], "sliding_window");
    assert_eq!(ev[2]["kv_cache_spec_sliding_window"], 8);
    assert_eq!(ev[3]["group_idx"], 0);
    assert_eq!(ev[3]["kv_cache_spec_kind"], "full_attention");

    let mut arr = Vec::new();
    let opts = EncodeOptions { form: EventForm::Array, token_ids: true };
    encode_events(&events, 1.0, None, &opts, &mut arr);
    let v = to_json(&mut &arr[..]);
    let ev = v[1].as_array().unwrap();
    let full = ev[0].as_array().unwrap();
    assert_eq!(full.len(), 11, "ends after the kind: {}", ev[0]);
    assert!(full[8].is_null(), "extra_keys placeholder");
    assert_eq!((&full[9], &full[10]), (&0.into(), &"full_attention".into()));
    let window = ev[1].as_array().unwrap();
    assert_eq!(window.len(), 12, "{}", ev[1]);
    assert_eq!((&window[9], &window[10], &window[11]), (&1.into(), &"sliding_window".into(), &8.into()));
    for (i, group) in [(2, 1), (3, 0)] {
        let r = ev[i].as_array().unwrap();
        assert_eq!(r.len(), 4, "{}", ev[i]);
        assert_eq!((&r[0], &r[2], &r[3]), (&"BlockRemoved".into(), &"GPU".into(), &group.into()));
    }

    for (bytes, form) in [(&map, EventForm::Map), (&arr, EventForm::Array)] {
        let want: Vec<WireEvent> =
            events.iter().map(|e| wire_event(e, &EncodeOptions { form, token_ids: true })).collect();
        assert_eq!(decode_payload(bytes).unwrap().events, want, "{form:?}");
        let WireEvent::BlockStored(s) = &want[1] else { panic!() };
        assert_eq!(
            (s.group_idx, s.kv_cache_spec_kind.as_deref(), s.kv_cache_spec_sliding_window),
            (Some(1), Some("sliding_window"), Some(8))
        );
    }
}

/// A single-group engine's events name no group: no group key in the map
/// form and no slot past the ones they used before groups existed.
#[test]
fn single_group_events_carry_no_group_field() {
    for form in [EventForm::Map, EventForm::Array] {
        let mut bytes = Vec::new();
        encode_events(&workload(), 1.0, None, &EncodeOptions { form, token_ids: true }, &mut bytes);
        for ev in to_json(&mut &bytes[..])[1].as_array().unwrap() {
            if let Some(m) = ev.as_object() {
                assert!(m.keys().all(|k| !k.starts_with("group") && !k.starts_with("kv_cache_spec")), "{ev}");
            } else {
                let a = ev.as_array().unwrap();
                let limit = if a[0] == "BlockRemoved" { 3 } else { 17 };
                assert!(a.len() <= limit, "{ev}");
                if a[0] == "BlockStored" && a.len() > 9 {
                    assert!(a[9..12].iter().all(serde_json::Value::is_null), "{ev}");
                }
            }
        }
    }
}

/// The positional group slots are read by type: a list at 9 (vLLM 1.2
/// appended `block_mm_infos` there), an integer at 10, a negative group or
/// a string at 11 are skipped, not misread, and the event still decodes.
/// In the map form a wrong type under a group name is a clear error.
#[test]
fn group_slots_of_other_shapes_are_skipped_not_misread() {
    let stored = |p: &mut Vec<u8>, tail: &dyn Fn(&mut Vec<u8>)| {
        mp::write_array_len(p, 3).unwrap();
        mp::write_f64(p, 1.0).unwrap();
        mp::write_array_len(p, 1).unwrap();
        mp::write_array_len(p, 12).unwrap();
        mp::write_str(p, "BlockStored").unwrap();
        mp::write_array_len(p, 1).unwrap();
        mp::write_uint(p, 7).unwrap();
        mp::write_nil(p).unwrap();
        mp::write_array_len(p, 1).unwrap();
        mp::write_uint(p, 3).unwrap();
        mp::write_uint(p, 1).unwrap();
        mp::write_nil(p).unwrap();
        mp::write_str(p, "GPU").unwrap();
        mp::write_nil(p).unwrap();
        mp::write_nil(p).unwrap();
        tail(p);
        mp::write_nil(p).unwrap();
    };
    let mut p = Vec::new();
    stored(&mut p, &|p| {
        mp::write_array_len(p, 1).unwrap(); // a block_mm_infos list at 9
        mp::write_nil(p).unwrap();
        mp::write_uint(p, 5).unwrap(); // an integer at 10
        mp::write_str(p, "x").unwrap(); // a string at 11
    });
    let WireEvent::BlockStored(s) = &decode_payload(&p).unwrap().events[0] else { panic!() };
    assert_eq!((s.group_idx, s.kv_cache_spec_kind.as_deref(), s.kv_cache_spec_sliding_window), (None, None, None));
    let mut p = Vec::new();
    stored(&mut p, &|p| {
        mp::write_sint(p, -1).unwrap();
        mp::write_str(p, "mamba").unwrap();
        mp::write_uint(p, u64::from(u32::MAX) + 1).unwrap();
    });
    let WireEvent::BlockStored(s) = &decode_payload(&p).unwrap().events[0] else { panic!() };
    assert_eq!(
        (s.group_idx, s.kv_cache_spec_kind.as_deref(), s.kv_cache_spec_sliding_window),
        (None, Some("mamba"), None)
    );

    let mut p = Vec::new();
    mp::write_array_len(&mut p, 3).unwrap();
    mp::write_f64(&mut p, 1.0).unwrap();
    mp::write_array_len(&mut p, 1).unwrap();
    mp::write_map_len(&mut p, 3).unwrap();
    mp::write_str(&mut p, "type").unwrap();
    mp::write_str(&mut p, "BlockRemoved").unwrap();
    mp::write_str(&mut p, "block_hashes").unwrap();
    mp::write_array_len(&mut p, 0).unwrap();
    mp::write_str(&mut p, "group_idx").unwrap();
    mp::write_str(&mut p, "zero").unwrap();
    mp::write_nil(&mut p).unwrap();
    assert!(
        matches!(decode_payload(&p), Err(DecodeError::Unexpected { what: "group_idx", .. })),
        "{:?}",
        decode_payload(&p)
    );
}
