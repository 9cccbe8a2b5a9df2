//! The encoder: wire events as msgpack, in the map or the array form, with
//! the smallest encoding of every integer, so that a batch's size is a
//! property of its content alone.

use super::layout::{
    CACHE_SALT_TAG, EncodeOptions, EventForm, POS_EXTRA_KEYS, POS_GROUP_IDX, POS_IMAGE_ROUTING, POS_LORA_NAME,
    POS_REMOVED_GROUP_IDX, POS_SLIDING_WINDOW, POS_SPEC_KIND, mm_marker,
};
use super::project::wire_event;
use super::write::{
    put_array_len, put_bin, put_f64, put_int, put_map_len, put_nil, put_opt_int, put_opt_str, put_str, put_u32,
    put_uint,
};
use crate::events::KvEvent;
use crate::events::wire::{
    IMAGE_ROUTING_VERSION, ImageRoutingV1, WireBatch, WireBlockRemoved, WireBlockStored, WireEvent, WireMmInfo,
};

/// Encodes typed events as one payload `[ts, events, data_parallel_rank]`,
/// appending to `out`.
pub fn encode_events(
    events: &[KvEvent],
    ts: f64,
    data_parallel_rank: Option<i64>,
    opts: &EncodeOptions,
    out: &mut Vec<u8>,
) {
    put_array_len(out, 3);
    put_f64(out, ts);
    put_array_len(out, events.len());
    for e in events {
        put_event(out, &wire_event(e, opts), opts.form);
    }
    put_opt_int(out, data_parallel_rank);
}

/// Encodes a decoded batch again, appending to `out` (for `kvcore events
/// replay`, tests and the fuzz targets).
pub fn encode_payload(batch: &WireBatch, form: EventForm, out: &mut Vec<u8>) {
    put_array_len(out, 3);
    put_f64(out, batch.ts);
    put_array_len(out, batch.events.len());
    for e in &batch.events {
        put_event(out, e, form);
    }
    put_opt_int(out, batch.data_parallel_rank);
}

/// The sequence frame: `seq` as 8 big-endian bytes.
pub fn seq_frame(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

fn put_event(out: &mut Vec<u8>, e: &WireEvent, form: EventForm) {
    match (e, form) {
        (WireEvent::BlockStored(s), EventForm::Map) => put_stored_map(out, s),
        (WireEvent::BlockStored(s), EventForm::Array) => put_stored_array(out, s),
        (WireEvent::BlockRemoved(r), EventForm::Map) => put_removed_map(out, r),
        (WireEvent::BlockRemoved(r), EventForm::Array) => {
            // vLLM 0.33's slots: the group at 3, nothing of the kind (see
            // POS_REMOVED_GROUP_IDX); a removal of no group keeps 3 fields.
            put_array_len(out, if r.group_idx.is_some() { POS_REMOVED_GROUP_IDX + 1 } else { 3 });
            put_str(out, "BlockRemoved");
            put_hashes(out, &r.block_hashes);
            put_opt_str(out, r.medium.as_deref());
            if let Some(g) = r.group_idx {
                put_uint(out, g.into());
            }
        }
        (WireEvent::AllBlocksCleared, EventForm::Map) => {
            put_map_len(out, 1);
            put_str(out, "type");
            put_str(out, "AllBlocksCleared");
        }
        (WireEvent::AllBlocksCleared, EventForm::Array) => {
            put_array_len(out, 1);
            put_str(out, "AllBlocksCleared");
        }
        (WireEvent::Unknown { name }, EventForm::Map) => {
            put_map_len(out, 1);
            put_str(out, "type");
            put_str(out, name);
        }
        (WireEvent::Unknown { name }, EventForm::Array) => {
            put_array_len(out, 1);
            put_str(out, name);
        }
    }
}

/// The group fields of an event in map form, each omitted when unset (as
/// vLLM's `omit_defaults` does): `group_idx`, `kv_cache_spec_kind`,
/// `kv_cache_spec_sliding_window`. Returns nothing; [`group_fields`] counts.
fn put_group_map(out: &mut Vec<u8>, group_idx: Option<u32>, kind: Option<&str>, window: Option<u32>) {
    if let Some(g) = group_idx {
        put_str(out, "group_idx");
        put_uint(out, g.into());
    }
    if let Some(k) = kind {
        put_str(out, "kv_cache_spec_kind");
        put_str(out, k);
    }
    if let Some(w) = window {
        put_str(out, "kv_cache_spec_sliding_window");
        put_uint(out, w.into());
    }
}

/// How many of the three group fields are set.
fn group_fields(group_idx: Option<u32>, kind: Option<&str>, window: Option<u32>) -> usize {
    usize::from(group_idx.is_some()) + usize::from(kind.is_some()) + usize::from(window.is_some())
}

fn put_removed_map(out: &mut Vec<u8>, r: &WireBlockRemoved) {
    let (g, k, w) = (r.group_idx, r.kv_cache_spec_kind.as_deref(), r.kv_cache_spec_sliding_window);
    put_map_len(out, 3 + group_fields(g, k, w));
    put_str(out, "type");
    put_str(out, "BlockRemoved");
    put_str(out, "block_hashes");
    put_hashes(out, &r.block_hashes);
    put_str(out, "medium");
    put_opt_str(out, r.medium.as_deref());
    put_group_map(out, g, k, w);
}

fn put_stored_map(out: &mut Vec<u8>, s: &WireBlockStored) {
    let (g, k, w) = (s.group_idx, s.kv_cache_spec_kind.as_deref(), s.kv_cache_spec_sliding_window);
    let fields = 7
        + usize::from(s.token_ids.is_some())
        + usize::from(s.cache_salt.is_some())
        + usize::from(s.block_mm_infos.is_some())
        + usize::from(s.image_routing.is_some())
        + group_fields(g, k, w);
    put_map_len(out, fields);
    put_str(out, "type");
    put_str(out, "BlockStored");
    put_str(out, "block_hashes");
    put_hashes(out, &s.block_hashes);
    put_str(out, "parent_block_hash");
    put_opt_int(out, s.parent_block_hash);
    if let Some(t) = &s.token_ids {
        put_str(out, "token_ids");
        put_tokens(out, t);
    }
    put_str(out, "block_size");
    put_uint(out, s.block_size.into());
    put_str(out, "lora_id");
    put_opt_int(out, s.lora_id);
    put_str(out, "medium");
    put_opt_str(out, s.medium.as_deref());
    put_str(out, "lora_name");
    put_opt_str(out, s.lora_name.as_deref());
    if let Some(salt) = &s.cache_salt {
        put_str(out, "cache_salt");
        put_str(out, salt);
    }
    if let Some(infos) = &s.block_mm_infos {
        put_str(out, "block_mm_infos");
        put_mm_infos(out, infos);
    }
    put_group_map(out, g, k, w);
    if let Some(r) = &s.image_routing {
        put_str(out, "image_routing");
        put_image_routing(out, r);
    }
}

fn put_stored_array(out: &mut Vec<u8>, s: &WireBlockStored) {
    // The reference layout (layout.rs): the seven core fields always, then
    // `extra_keys` when the event has a LoRA name, a salt or image
    // identity, the group fields at vLLM's slots 9-11 when set, and
    // `image_routing` past vLLM's last slot when set. The array ends after
    // its last set field; every earlier slot is written (nil when unset),
    // because a positional reader counts slots.
    let extra_keys = s.lora_name.is_some() || s.cache_salt.is_some() || s.block_mm_infos.is_some();
    let len = if s.image_routing.is_some() {
        POS_IMAGE_ROUTING + 1
    } else if s.kv_cache_spec_sliding_window.is_some() {
        POS_SLIDING_WINDOW + 1
    } else if s.kv_cache_spec_kind.is_some() {
        POS_SPEC_KIND + 1
    } else if s.group_idx.is_some() {
        POS_GROUP_IDX + 1
    } else if extra_keys {
        POS_EXTRA_KEYS + 1
    } else {
        POS_LORA_NAME + 1
    };
    put_array_len(out, len);
    put_str(out, "BlockStored");
    put_hashes(out, &s.block_hashes);
    put_opt_int(out, s.parent_block_hash);
    match &s.token_ids {
        Some(t) => put_tokens(out, t),
        None => put_nil(out),
    }
    put_uint(out, s.block_size.into());
    put_opt_int(out, s.lora_id);
    put_opt_str(out, s.medium.as_deref());
    put_opt_str(out, s.lora_name.as_deref());
    if len > POS_EXTRA_KEYS {
        if extra_keys {
            put_extra_keys(out, s);
        } else {
            put_nil(out);
        }
    }
    if len > POS_GROUP_IDX {
        put_opt_int(out, s.group_idx.map(i64::from));
    }
    if len > POS_SPEC_KIND {
        put_opt_str(out, s.kv_cache_spec_kind.as_deref());
    }
    if len > POS_SLIDING_WINDOW {
        put_opt_int(out, s.kv_cache_spec_sliding_window.map(i64::from));
    }
    if len > POS_IMAGE_ROUTING {
        // locality .. lookahead_token_ids: vLLM's, unset.
        for _ in POS_SLIDING_WINDOW + 1..POS_IMAGE_ROUTING {
            put_nil(out);
        }
        match &s.image_routing {
            Some(r) => put_image_routing(out, r),
            None => put_nil(out),
        }
    }
}

/// `extra_keys` as vLLM orders a block's entries and Dynamo reads them: the
/// LoRA name, then `[mm marker, block offset]` per image object, then (in
/// the first block) the tagged cache salt. One entry per block (at least
/// one when a salt has to be carried); nil for a block with none.
fn put_extra_keys(out: &mut Vec<u8>, s: &WireBlockStored) {
    let blocks = s.block_hashes.len().max(usize::from(s.cache_salt.is_some()));
    put_array_len(out, blocks);
    for i in 0..blocks {
        let objects = s.block_mm_infos.as_ref().and_then(|v| v.get(i)).and_then(Option::as_ref);
        let objects = objects.map_or(&[][..], |info| &info.mm_objects[..]);
        let salt = if i == 0 { s.cache_salt.as_deref() } else { None };
        let n = usize::from(s.lora_name.is_some()) + objects.len() + usize::from(salt.is_some());
        if n == 0 {
            put_nil(out);
            continue;
        }
        put_array_len(out, n);
        if let Some(name) = &s.lora_name {
            put_str(out, name);
        }
        // vLLM's offset: where the item starts relative to the block (negative
        // when it started in an earlier block), from the object's first run.
        // Objects are listed in the order of their items' first runs.
        let mut starts = Vec::with_capacity(objects.len());
        if let Some(refs) = s.image_routing.as_ref().and_then(|r| r.blocks.get(i)) {
            let mut seen = Vec::with_capacity(objects.len());
            for x in refs {
                if !seen.contains(&x.item) {
                    seen.push(x.item);
                    starts.push(i64::from(x.block_offset) - i64::from(x.item_offset));
                }
            }
        }
        for (k, o) in objects.iter().enumerate() {
            put_array_len(out, 2);
            put_str(out, &mm_marker(o.mm_hash));
            put_int(out, starts.get(k).copied().unwrap_or(0));
        }
        if let Some(salt) = salt {
            put_str(out, &format!("{CACHE_SALT_TAG}{salt}"));
        }
    }
}

fn put_mm_infos(out: &mut Vec<u8>, infos: &[Option<WireMmInfo>]) {
    put_array_len(out, infos.len());
    for info in infos {
        match info {
            None => put_nil(out),
            Some(info) => {
                put_map_len(out, 1);
                put_str(out, "mm_objects");
                put_array_len(out, info.mm_objects.len());
                for o in &info.mm_objects {
                    put_map_len(out, 2);
                    put_str(out, "mm_hash");
                    put_uint(out, o.mm_hash);
                    put_str(out, "offsets");
                    put_array_len(out, o.offsets.len());
                    for [s, e] in &o.offsets {
                        put_array_len(out, 2);
                        put_uint(out, (*s).into());
                        put_uint(out, (*e).into());
                    }
                }
            }
        }
    }
}

fn put_image_routing(out: &mut Vec<u8>, r: &ImageRoutingV1) {
    put_map_len(out, 3);
    put_str(out, "v");
    put_uint(out, IMAGE_ROUTING_VERSION);
    put_str(out, "items");
    put_array_len(out, r.items.len());
    for item in &r.items {
        put_array_len(out, 2);
        put_bin(out, &item.digest);
        put_opt_str(out, item.uuid.as_deref());
    }
    put_str(out, "blocks");
    put_array_len(out, r.blocks.len());
    for refs in &r.blocks {
        if refs.is_empty() {
            put_nil(out);
            continue;
        }
        put_array_len(out, refs.len());
        for x in refs {
            put_array_len(out, 4);
            put_uint(out, x.item.into());
            put_uint(out, x.item_offset.into());
            put_uint(out, x.block_offset.into());
            put_uint(out, x.len.into());
        }
    }
}

fn put_hashes(out: &mut Vec<u8>, hashes: &[i64]) {
    put_array_len(out, hashes.len());
    for h in hashes {
        put_int(out, *h);
    }
}

fn put_tokens(out: &mut Vec<u8>, tokens: &[u32]) {
    put_array_len(out, tokens.len());
    // At most 5 bytes a token: one reservation instead of a growth check
    // turning into a reallocation somewhere inside the loop.
    out.reserve(tokens.len() * 5);
    for &t in tokens {
        put_u32(out, t);
    }
}
