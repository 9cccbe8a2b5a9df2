//! The msgpack codec of the event stream (docs/wire-format.md).
//!
//! Encoding is a projection then a write: [`wire_event`] turns a typed
//! [`KvEvent`] into the [`WireEvent`] a consumer will decode (block keys become
//! wire hashes, image items become `mm_hash` values and routing metadata), and
//! [`encode_payload`] writes it with the smallest msgpack encoding of every
//! integer, so that a batch's size is a property of its content alone. The
//! writer is hand-rolled over a `Vec<u8>` because that makes every byte
//! explicit and the write infallible.
//!
//! Decoding ([`decode_payload`], [`decode_message`]) faces bytes from the
//! network, so it is written to never panic, to allocate no more than the
//! input can justify (every element costs at least one input byte, so no
//! capacity exceeds the bytes left), to skip values iteratively (no recursion
//! an attacker can deepen) and to skip what it does not know: unknown fields,
//! unknown event types and unknown `image_routing` versions.

use crate::events::wire::{
    IMAGE_ROUTING_VERSION, ImageRoutingV1, WireBatch, WireBlockRemoved, WireBlockStored, WireEvent, WireImageItem,
    WireImageRef, WireMessage, WireMmInfo, WireMmObject,
};
use crate::events::{BlockStored, KvEvent};
use crate::keys::mm_hash;

/// How events are laid out inside the payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventForm {
    /// `{"type": "BlockStored", "block_hashes": ...}` (vLLM >= 0.26, TensorRT-LLM).
    #[default]
    Map,
    /// `["BlockStored", block_hashes, ...]` (vLLM before 0.26).
    Array,
}

/// What the encoder writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Map or positional events.
    pub form: EventForm,
    /// Whether `BlockStored` carries `token_ids` (and `block_mm_infos`, which
    /// only serves consumers that hash token ids). Leaving them out shrinks an
    /// event to engine hashes and image identities (llm-d-kv-cache#65).
    pub token_ids: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        Self { form: EventForm::Map, token_ids: true }
    }
}

/// Why bytes did not decode. Positions are byte offsets into the payload.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended inside a value.
    #[error("input truncated at byte {0}")]
    Truncated(usize),
    /// A value of the wrong msgpack type.
    #[error("byte {pos}: unexpected msgpack marker 0x{marker:02x} for {what}")]
    Unexpected {
        /// Where.
        pos: usize,
        /// The marker found.
        marker: u8,
        /// What was expected.
        what: &'static str,
    },
    /// An integer that does not fit its field.
    #[error("byte {pos}: {what} out of range")]
    OutOfRange {
        /// Where.
        pos: usize,
        /// The field.
        what: &'static str,
    },
    /// A string that is not UTF-8.
    #[error("byte {0}: string is not UTF-8")]
    Utf8(usize),
    /// A required field is missing.
    #[error("{event}: missing field {field}")]
    Missing {
        /// The event type.
        event: &'static str,
        /// The field.
        field: &'static str,
    },
    /// A value that is well-formed msgpack but inconsistent.
    #[error("{0}")]
    Invalid(&'static str),
    /// Bytes after the payload's value.
    #[error("{0} trailing bytes after the payload")]
    Trailing(usize),
    /// A message without exactly three frames.
    #[error("message has {0} frames, expected 3 (topic, seq, payload)")]
    FrameCount(usize),
    /// A sequence frame that is not 8 bytes.
    #[error("seq frame has {0} bytes, expected 8")]
    SeqLength(usize),
}

type Result<T> = std::result::Result<T, DecodeError>;

// ---------------------------------------------------------------------------
// Projection: typed events to wire events.

/// The wire view of a typed event under `opts`: what a consumer decodes.
pub fn wire_event(event: &KvEvent, opts: &EncodeOptions) -> WireEvent {
    match event {
        KvEvent::BlockStored(e) => WireEvent::BlockStored(wire_stored(e, opts)),
        KvEvent::BlockRemoved(e) => WireEvent::BlockRemoved(WireBlockRemoved {
            block_hashes: e.keys.iter().map(|k| k.wire_hash().0).collect(),
            medium: Some(e.medium.as_str().to_owned()),
        }),
        KvEvent::AllBlocksCleared(_) => WireEvent::AllBlocksCleared,
    }
}

fn wire_stored(e: &BlockStored, opts: &EncodeOptions) -> WireBlockStored {
    let has_images = e.block_images.iter().any(|runs| !runs.is_empty());
    let block_mm_infos = (has_images && opts.token_ids).then(|| {
        e.block_images
            .iter()
            .map(|runs| {
                if runs.is_empty() {
                    return None;
                }
                let mut objects: Vec<(u32, WireMmObject)> = Vec::new();
                for r in runs {
                    let range = [r.block_offset, r.block_offset.saturating_add(r.len)];
                    match objects.iter_mut().find(|(i, _)| *i == r.image) {
                        Some((_, o)) => o.offsets.push(range),
                        None => {
                            let hash = e
                                .images
                                .get(r.image as usize)
                                .map(|img| mm_hash(&img.digest, img.uuid.as_deref()))
                                .unwrap_or(0);
                            objects.push((r.image, WireMmObject { mm_hash: hash, offsets: vec![range] }));
                        }
                    }
                }
                Some(WireMmInfo { mm_objects: objects.into_iter().map(|(_, o)| o).collect() })
            })
            .collect()
    });
    let image_routing = has_images.then(|| ImageRoutingV1 {
        items: e
            .images
            .iter()
            .map(|i| WireImageItem { digest: i.digest.0, uuid: i.uuid.as_deref().map(str::to_owned) })
            .collect(),
        blocks: e
            .block_images
            .iter()
            .map(|runs| {
                runs.iter()
                    .map(|r| WireImageRef {
                        item: r.image,
                        item_offset: r.item_offset,
                        block_offset: r.block_offset,
                        len: r.len,
                    })
                    .collect()
            })
            .collect(),
    });
    WireBlockStored {
        block_hashes: e.keys.iter().map(|k| k.wire_hash().0).collect(),
        parent_block_hash: e.parent.map(|p| p.wire_hash().0),
        token_ids: opts.token_ids.then(|| e.token_ids.clone()),
        block_size: e.block_size,
        lora_id: e.lora_id.map(i64::from),
        medium: Some(e.medium.as_str().to_owned()),
        lora_name: e.lora_name.as_deref().map(str::to_owned),
        cache_salt: e.cache_salt.as_deref().map(str::to_owned),
        block_mm_infos,
        image_routing,
    }
}

// ---------------------------------------------------------------------------
// Encoding.

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
        (WireEvent::BlockRemoved(r), EventForm::Map) => {
            put_map_len(out, 3);
            put_str(out, "type");
            put_str(out, "BlockRemoved");
            put_str(out, "block_hashes");
            put_hashes(out, &r.block_hashes);
            put_str(out, "medium");
            put_opt_str(out, r.medium.as_deref());
        }
        (WireEvent::BlockRemoved(r), EventForm::Array) => {
            put_array_len(out, 3);
            put_str(out, "BlockRemoved");
            put_hashes(out, &r.block_hashes);
            put_opt_str(out, r.medium.as_deref());
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

fn put_stored_map(out: &mut Vec<u8>, s: &WireBlockStored) {
    let fields = 7
        + usize::from(s.token_ids.is_some())
        + usize::from(s.cache_salt.is_some())
        + usize::from(s.block_mm_infos.is_some())
        + usize::from(s.image_routing.is_some());
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
    if let Some(r) = &s.image_routing {
        put_str(out, "image_routing");
        put_image_routing(out, r);
    }
}

/// Positions of `BlockStored` fields in the array form, after the type name at
/// 0: vLLM's eleven, then ours.
const POS_BLOCK_MM_INFOS: usize = 12;
const POS_IMAGE_ROUTING: usize = 13;
const POS_CACHE_SALT: usize = 14;

fn put_stored_array(out: &mut Vec<u8>, s: &WireBlockStored) {
    // vLLM's seven core fields always; ours only as far as the last one set.
    let len = if s.cache_salt.is_some() {
        POS_CACHE_SALT + 1
    } else if s.image_routing.is_some() {
        POS_IMAGE_ROUTING + 1
    } else if s.block_mm_infos.is_some() {
        POS_BLOCK_MM_INFOS + 1
    } else {
        8
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
    if len > 8 {
        // extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window
        for _ in 8..POS_BLOCK_MM_INFOS {
            put_nil(out);
        }
        match &s.block_mm_infos {
            Some(i) => put_mm_infos(out, i),
            None => put_nil(out),
        }
    }
    if len > POS_IMAGE_ROUTING {
        match &s.image_routing {
            Some(r) => put_image_routing(out, r),
            None => put_nil(out),
        }
    }
    if len > POS_CACHE_SALT {
        put_opt_str(out, s.cache_salt.as_deref());
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

fn put_nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

fn put_f64(out: &mut Vec<u8>, v: f64) {
    out.push(0xcb);
    out.extend_from_slice(&v.to_be_bytes());
}

/// The smallest encoding of an unsigned integer.
fn put_uint(out: &mut Vec<u8>, v: u64) {
    match u32::try_from(v) {
        Ok(v) => put_u32(out, v),
        Err(_) => {
            out.push(0xcf);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// The shortest unsigned form of a u32 (token ids go through here one by one).
#[inline]
fn put_u32(out: &mut Vec<u8>, v: u32) {
    if v < 128 {
        out.push(v as u8);
    } else if v < 256 {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v < 65_536 {
        let [a, b] = (v as u16).to_be_bytes();
        out.extend_from_slice(&[0xcd, a, b]);
    } else {
        let [a, b, c, d] = v.to_be_bytes();
        out.extend_from_slice(&[0xce, a, b, c, d]);
    }
}

/// The smallest encoding of a signed integer (non-negative values use the
/// unsigned forms, as every msgpack library does).
fn put_int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        put_uint(out, v as u64);
    } else if v >= -32 {
        out.push(v as i8 as u8);
    } else if v >= i8::MIN.into() {
        out.extend_from_slice(&[0xd0, v as i8 as u8]);
    } else if v >= i16::MIN.into() {
        out.push(0xd1);
        out.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= i32::MIN.into() {
        out.push(0xd2);
        out.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

fn put_opt_int(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => put_int(out, v),
        None => put_nil(out),
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 256 {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 65_536 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

fn put_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_str(out, s),
        None => put_nil(out),
    }
}

fn put_bin(out: &mut Vec<u8>, b: &[u8]) {
    let n = b.len();
    if n < 256 {
        out.extend_from_slice(&[0xc4, n as u8]);
    } else if n < 65_536 {
        out.push(0xc5);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xc6);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(b);
}

fn put_array_len(out: &mut Vec<u8>, n: usize) {
    if n < 16 {
        out.push(0x90 | n as u8);
    } else if n < 65_536 {
        out.push(0xdc);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

fn put_map_len(out: &mut Vec<u8>, n: usize) {
    if n < 16 {
        out.push(0x80 | n as u8);
    } else if n < 65_536 {
        out.push(0xde);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdf);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

// ---------------------------------------------------------------------------
// Decoding.

/// Decodes the three frames of one message.
pub fn decode_message(frames: &[&[u8]]) -> Result<WireMessage> {
    let [topic, seq, payload] = frames else {
        return Err(DecodeError::FrameCount(frames.len()));
    };
    let seq: [u8; 8] = (*seq).try_into().map_err(|_| DecodeError::SeqLength(seq.len()))?;
    Ok(WireMessage { topic: topic.to_vec(), seq: u64::from_be_bytes(seq), batch: decode_payload(payload)? })
}

/// Decodes one payload `[ts, events, data_parallel_rank]`. Extra trailing
/// elements of the envelope are skipped; a map envelope is refused.
pub fn decode_payload(bytes: &[u8]) -> Result<WireBatch> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let n = r.array_len("payload array")?;
    if n < 2 {
        return Err(DecodeError::Invalid("payload array has fewer than 2 elements"));
    }
    let ts = r.f64("ts")?;
    let count = r.array_len("events array")?;
    let mut events = Vec::with_capacity(r.cap(count, MIN_EVENT_BYTES));
    for _ in 0..count {
        events.push(r.event()?);
    }
    let data_parallel_rank = if n >= 3 { r.opt_i64("data_parallel_rank")? } else { None };
    for _ in 3..n {
        r.skip()?;
    }
    if r.remaining() > 0 {
        return Err(DecodeError::Trailing(r.remaining()));
    }
    Ok(WireBatch { ts, events, data_parallel_rank })
}

/// For each msgpack marker byte, the number of value bytes that follow it
/// when it is one of the unsigned forms a u32 token id is read from in place
/// (a positive fixint: 0; uint8: 1; uint16: 2; uint32: 4), else
/// [`TOKEN_FORM_OTHER`].
const TOKEN_FORMS: [u8; 256] = {
    let mut t = [TOKEN_FORM_OTHER; 256];
    let mut m = 0;
    while m < 0x80 {
        t[m] = 0;
        m += 1;
    }
    t[0xcc] = 1;
    t[0xcd] = 2;
    t[0xce] = 4;
    t
};

/// A marker that `TOKEN_FORMS` leaves to the general reader.
const TOKEN_FORM_OTHER: u8 = 0xff;

/// Tokens whose forms [`forms_mixed`] looks at.
const TOKEN_WINDOW: usize = 16;

/// Form changes among those above which the forms count as mixed.
const TOKEN_MIXED: u32 = 4;

/// Whether the forms of the first `TOKEN_WINDOW` token ids at the start of
/// `buf` change more than `TOKEN_MIXED` times (false where a marker is not
/// one of the four unsigned forms or the bytes run out: the loop with a
/// branch per form handles those).
fn forms_mixed(buf: &[u8]) -> bool {
    let (mut pos, mut prev, mut changes) = (0usize, 0u8, 0u32);
    for _ in 0..TOKEN_WINDOW {
        let Some(&m) = buf.get(pos) else { return false };
        let form = TOKEN_FORMS[m as usize];
        if form == TOKEN_FORM_OTHER {
            return false;
        }
        changes += (form != prev) as u32;
        prev = form;
        pos += 1 + form as usize;
    }
    changes > TOKEN_MIXED
}

/// Reads token ids into `out` from `pos` without a branch on the form, while
/// each is an unsigned form with its four following bytes in `buf`; returns
/// the position reached and the count read.
///
/// Two ids a step: where one token starts depends on the marker of the one
/// before, so that chain sets the pace. The two markers are taken from one
/// 8-byte load by shifts, and each count of value bytes is computed from its
/// marker by arithmetic, so a step waits on one load instead of four; the
/// table only checks the forms, off that chain.
fn tokens_branch_free(buf: &[u8], mut pos: usize, out: &mut [u32]) -> (usize, usize) {
    /// The count of value bytes of a valid unsigned marker, by arithmetic
    /// (0 for a fixint; 1, 2, 4 for 0xcc, 0xcd, 0xce).
    #[inline(always)]
    fn value_bytes(m: u64) -> usize {
        if m < 0x80 { 0 } else { 1 << (m.wrapping_sub(0xcc) & 3) }
    }
    /// The id whose marker is `m` and whose value bytes start `bytes`.
    #[inline(always)]
    fn id(m: u64, form: usize, bytes: [u8; 4]) -> u32 {
        let word = u32::from_be_bytes(bytes) as u64;
        // A fixint (no value bytes) shifts the word out entirely and is its
        // own marker.
        let fixint = m as u32 & 0u32.wrapping_sub((form == 0) as u32);
        (word >> (32 - 8 * form as u32)) as u32 | fixint
    }
    let mut i = 0;
    while i + 2 <= out.len() {
        // Two ids take ten bytes at most.
        let Some(b) = buf.get(pos..pos + 10) else { break };
        let w = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        let m1 = w & 0xff;
        let f1 = value_bytes(m1);
        // (An invalid first marker may give a shift past 63: it wraps, and
        // the check below rejects the pair whatever `m2` came out.)
        let m2 = w.wrapping_shr(8 * (1 + f1) as u32) & 0xff;
        let f2 = value_bytes(m2);
        if TOKEN_FORMS[m1 as usize] == TOKEN_FORM_OTHER || TOKEN_FORMS[m2 as usize] == TOKEN_FORM_OTHER {
            break;
        }
        out[i] = id(m1, f1, [b[1], b[2], b[3], b[4]]);
        let o = 2 + f1;
        out[i + 1] = id(m2, f2, [b[o], b[o + 1], b[o + 2], b[o + 3]]);
        pos += 2 + f1 + f2;
        i += 2;
    }
    while i < out.len() {
        let Some(&[m, b1, b2, b3, b4]) = buf.get(pos..pos + 5) else { break };
        if TOKEN_FORMS[m as usize] == TOKEN_FORM_OTHER {
            break;
        }
        let form = value_bytes(m as u64);
        out[i] = id(m as u64, form, [b1, b2, b3, b4]);
        pos += 1 + form;
        i += 1;
    }
    (pos, i)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Every field any event type may carry, gathered before the type is known
/// (a map may name `type` last).
#[derive(Default)]
struct Fields {
    type_name: Option<String>,
    block_hashes: Option<Vec<i64>>,
    parent_block_hash: Option<i64>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<String>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
    block_mm_infos: Option<Vec<Option<WireMmInfo>>>,
    image_routing: Option<ImageRoutingV1>,
}

/// The fewest bytes an event can take (`[""]`, an unknown type).
const MIN_EVENT_BYTES: usize = 2;
/// The fewest bytes of an `mm_object` (`{"mm_hash": 0}`).
const MIN_MM_OBJECT_BYTES: usize = 10;
/// The fewest bytes of an image item (`[bin8 of 32 bytes, nil]`).
const MIN_IMAGE_ITEM_BYTES: usize = 36;

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A capacity for `n` claimed elements of at least `min_bytes` each: never
    /// more than the bytes left could hold, so a hostile length allocates
    /// nothing it cannot back with input.
    fn cap(&self, n: usize, min_bytes: usize) -> usize {
        n.min(self.remaining() / min_bytes)
    }

    fn peek(&self) -> Result<u8> {
        self.buf.get(self.pos).copied().ok_or(DecodeError::Truncated(self.pos))
    }

    fn byte(&mut self) -> Result<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated(self.buf.len()));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn unexpected(&self, at: usize, what: &'static str) -> DecodeError {
        DecodeError::Unexpected { pos: at, marker: self.buf.get(at).copied().unwrap_or(0), what }
    }

    /// Consumes a nil if one is next.
    fn nil(&mut self) -> Result<bool> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    fn array_len(&mut self, what: &'static str) -> Result<usize> {
        let at = self.pos;
        let n = match self.byte()? {
            m @ 0x90..=0x9f => (m & 0x0f) as usize,
            0xdc => u16::from_be_bytes(self.be()?) as usize,
            0xdd => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(self.unexpected(at, what)),
        };
        Ok(n)
    }

    fn map_len(&mut self, what: &'static str) -> Result<usize> {
        let at = self.pos;
        let n = match self.byte()? {
            m @ 0x80..=0x8f => (m & 0x0f) as usize,
            0xde => u16::from_be_bytes(self.be()?) as usize,
            0xdf => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(self.unexpected(at, what)),
        };
        Ok(n)
    }

    /// Any msgpack integer, widened so that u64 and i64 both fit.
    fn int(&mut self, what: &'static str) -> Result<i128> {
        let at = self.pos;
        Ok(match self.byte()? {
            m @ 0x00..=0x7f => m.into(),
            m @ 0xe0..=0xff => (m as i8).into(),
            0xcc => self.byte()?.into(),
            0xcd => u16::from_be_bytes(self.be()?).into(),
            0xce => u32::from_be_bytes(self.be()?).into(),
            0xcf => u64::from_be_bytes(self.be()?).into(),
            0xd0 => (self.byte()? as i8).into(),
            0xd1 => i16::from_be_bytes(self.be()?).into(),
            0xd2 => i32::from_be_bytes(self.be()?).into(),
            0xd3 => i64::from_be_bytes(self.be()?).into(),
            _ => return Err(self.unexpected(at, what)),
        })
    }

    /// A 64-bit integer sent signed or unsigned, kept as its 64 bits.
    fn bits64(&mut self, what: &'static str) -> Result<u64> {
        let v = self.int(what)?;
        Ok(if v < 0 { v as i64 as u64 } else { v as u64 })
    }

    fn i64_bits(&mut self, what: &'static str) -> Result<i64> {
        Ok(self.bits64(what)? as i64)
    }

    fn opt_i64(&mut self, what: &'static str) -> Result<Option<i64>> {
        if self.nil()? {
            return Ok(None);
        }
        let at = self.pos;
        let v = self.int(what)?;
        i64::try_from(v).map(Some).map_err(|_| DecodeError::OutOfRange { pos: at, what })
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        let at = self.pos;
        let v = self.int(what)?;
        u32::try_from(v).map_err(|_| DecodeError::OutOfRange { pos: at, what })
    }

    fn f64(&mut self, what: &'static str) -> Result<f64> {
        let at = self.pos;
        match self.peek()? {
            0xcb => {
                self.pos += 1;
                Ok(f64::from_be_bytes(self.be()?))
            }
            0xca => {
                self.pos += 1;
                Ok(f32::from_be_bytes(self.be()?).into())
            }
            _ => self.int(what).map(|v| v as f64).map_err(|_| self.unexpected(at, what)),
        }
    }

    fn str(&mut self, what: &'static str) -> Result<&'a str> {
        let at = self.pos;
        let n = match self.byte()? {
            m @ 0xa0..=0xbf => (m & 0x1f) as usize,
            0xd9 => self.byte()? as usize,
            0xda => u16::from_be_bytes(self.be()?) as usize,
            0xdb => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(self.unexpected(at, what)),
        };
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::Utf8(at))
    }

    fn opt_string(&mut self, what: &'static str) -> Result<Option<String>> {
        if self.nil()? {
            return Ok(None);
        }
        self.str(what).map(|s| Some(s.to_owned()))
    }

    fn bin(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let at = self.pos;
        let n = match self.byte()? {
            0xc4 => self.byte()? as usize,
            0xc5 => u16::from_be_bytes(self.be()?) as usize,
            0xc6 => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(self.unexpected(at, what)),
        };
        self.take(n)
    }

    /// Skips one value of any type, iteratively: nesting depth costs no stack.
    fn skip(&mut self) -> Result<()> {
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            let at = self.pos;
            let m = self.byte()?;
            let (children, payload): (u64, usize) = match m {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
                0x80..=0x8f => (2 * u64::from(m & 0x0f), 0),
                0x90..=0x9f => (u64::from(m & 0x0f), 0),
                0xa0..=0xbf => (0, (m & 0x1f) as usize),
                0xc4 | 0xd9 => (0, self.byte()? as usize),
                0xc5 | 0xda => (0, u16::from_be_bytes(self.be()?) as usize),
                0xc6 | 0xdb => (0, u32::from_be_bytes(self.be()?) as usize),
                0xc7 => (0, self.byte()? as usize + 1),
                0xc8 => (0, u16::from_be_bytes(self.be()?) as usize + 1),
                0xc9 => (0, u32::from_be_bytes(self.be()?) as usize + 1),
                0xca => (0, 4),
                0xcb => (0, 8),
                0xcc | 0xd0 => (0, 1),
                0xcd | 0xd1 => (0, 2),
                0xce | 0xd2 => (0, 4),
                0xcf | 0xd3 => (0, 8),
                0xd4 => (0, 2),
                0xd5 => (0, 3),
                0xd6 => (0, 5),
                0xd7 => (0, 9),
                0xd8 => (0, 17),
                0xdc => (u16::from_be_bytes(self.be()?).into(), 0),
                0xdd => (u32::from_be_bytes(self.be()?).into(), 0),
                0xde => (2 * u64::from(u16::from_be_bytes(self.be()?)), 0),
                0xdf => (2 * u64::from(u32::from_be_bytes(self.be()?)), 0),
                0xc1 => return Err(self.unexpected(at, "a msgpack value (0xc1 is never used)")),
            };
            self.take(payload)?;
            pending += children;
            // Each pending value needs at least one more byte.
            if pending > self.remaining() as u64 {
                return Err(DecodeError::Truncated(self.buf.len()));
            }
        }
        Ok(())
    }

    fn event(&mut self) -> Result<WireEvent> {
        let at = self.pos;
        match self.peek()? {
            0x80..=0x8f | 0xde | 0xdf => self.event_map(),
            0x90..=0x9f | 0xdc | 0xdd => self.event_array(),
            _ => Err(self.unexpected(at, "event (map or array)")),
        }
    }

    fn event_map(&mut self) -> Result<WireEvent> {
        let n = self.map_len("event map")?;
        let mut f = Fields::default();
        for _ in 0..n {
            let key = match self.peek()? {
                0xa0..=0xbf | 0xd9 | 0xda | 0xdb => self.str("field name")?,
                _ => {
                    self.skip()?;
                    self.skip()?;
                    continue;
                }
            };
            match key {
                "type" => f.type_name = Some(self.str("type")?.to_owned()),
                "block_hashes" => f.block_hashes = Some(self.hashes()?),
                "parent_block_hash" => f.parent_block_hash = self.opt_hash("parent_block_hash")?,
                "token_ids" => f.token_ids = self.opt_tokens()?,
                "block_size" => f.block_size = Some(self.u32("block_size")?),
                "lora_id" => f.lora_id = self.opt_i64("lora_id")?,
                "medium" => f.medium = self.opt_string("medium")?,
                "lora_name" => f.lora_name = self.opt_string("lora_name")?,
                "cache_salt" => f.cache_salt = self.opt_string("cache_salt")?,
                "block_mm_infos" => f.block_mm_infos = self.mm_infos()?,
                "image_routing" => f.image_routing = self.image_routing()?,
                _ => self.skip()?,
            }
        }
        build_event(f)
    }

    fn event_array(&mut self) -> Result<WireEvent> {
        let n = self.array_len("event array")?;
        if n == 0 {
            return Err(DecodeError::Invalid("empty event array"));
        }
        let name = self.str("type")?.to_owned();
        let mut f = Fields::default();
        for i in 1..n {
            match (name.as_str(), i) {
                ("BlockStored" | "BlockRemoved", 1) => f.block_hashes = Some(self.hashes()?),
                ("BlockStored", 2) => f.parent_block_hash = self.opt_hash("parent_block_hash")?,
                ("BlockStored", 3) => f.token_ids = self.opt_tokens()?,
                ("BlockStored", 4) => f.block_size = Some(self.u32("block_size")?),
                ("BlockStored", 5) => f.lora_id = self.opt_i64("lora_id")?,
                ("BlockStored", 6) | ("BlockRemoved", 2) => f.medium = self.opt_string("medium")?,
                ("BlockStored", 7) => f.lora_name = self.opt_string("lora_name")?,
                ("BlockStored", POS_BLOCK_MM_INFOS) => f.block_mm_infos = self.mm_infos()?,
                ("BlockStored", POS_IMAGE_ROUTING) => f.image_routing = self.image_routing()?,
                ("BlockStored", POS_CACHE_SALT) => f.cache_salt = self.opt_string("cache_salt")?,
                _ => self.skip()?,
            }
        }
        f.type_name = Some(name);
        build_event(f)
    }

    fn hashes(&mut self) -> Result<Vec<i64>> {
        let n = self.array_len("block_hashes")?;
        let mut v = Vec::with_capacity(self.cap(n, 1));
        for _ in 0..n {
            v.push(self.i64_bits("block hash")?);
        }
        Ok(v)
    }

    fn opt_hash(&mut self, what: &'static str) -> Result<Option<i64>> {
        if self.nil()? {
            return Ok(None);
        }
        self.i64_bits(what).map(Some)
    }

    fn opt_tokens(&mut self) -> Result<Option<Vec<u32>>> {
        if self.nil()? {
            return Ok(None);
        }
        let n = self.array_len("token_ids")?;
        let mut v = Vec::with_capacity(self.cap(n, 1));
        // Token ids are most of a stored event's bytes, so they get loops of
        // their own: the unsigned forms an encoder picks for a u32 (fixint,
        // uint8, uint16, uint32) are read in place; any other form (a signed
        // or 64-bit encoding, a bad marker, a value out of range) goes
        // through the general reader, which decodes or rejects it.
        //
        // Why two loops: with one form throughout (ids of one size), the
        // branch per form below is always predicted and the CPU runs ahead
        // of the loads, faster than a loop whose next position waits on the
        // marker it just read. With forms mixed at random (uniform ids over a
        // vocabulary larger than 65 536, as in `route-bench`), every other
        // token mispredicts there, and `tokens_branch_free` is about twice as
        // fast. `forms_mixed` looks at the first tokens to choose.
        if n >= TOKEN_WINDOW && n <= self.remaining() && forms_mixed(&self.buf[self.pos..]) {
            // Forms mixed at random: the loop without a branch on the form,
            // while the input has five bytes left, one token through the
            // general reader where it stops.
            v.resize(n, 0);
            let mut i = 0;
            while i < n {
                let (p, k) = tokens_branch_free(self.buf, self.pos, &mut v[i..]);
                self.pos = p;
                i += k;
                if i < n {
                    v[i] = self.u32("token id")?;
                    i += 1;
                }
            }
            return Ok(Some(v));
        }
        let buf = self.buf;
        let mut pos = self.pos;
        for _ in 0..n {
            let (value, len) = match buf.get(pos) {
                Some(&m @ 0x00..=0x7f) => (m as u32, 1),
                Some(0xcc) if pos + 2 <= buf.len() => (buf[pos + 1] as u32, 2),
                Some(0xcd) if pos + 3 <= buf.len() => (u16::from_be_bytes([buf[pos + 1], buf[pos + 2]]) as u32, 3),
                Some(0xce) if pos + 5 <= buf.len() => {
                    (u32::from_be_bytes([buf[pos + 1], buf[pos + 2], buf[pos + 3], buf[pos + 4]]), 5)
                }
                _ => {
                    self.pos = pos;
                    v.push(self.u32("token id")?);
                    pos = self.pos;
                    continue;
                }
            };
            v.push(value);
            pos += len;
        }
        self.pos = pos;
        Ok(Some(v))
    }

    fn mm_infos(&mut self) -> Result<Option<Vec<Option<WireMmInfo>>>> {
        if self.nil()? {
            return Ok(None);
        }
        let n = self.array_len("block_mm_infos")?;
        let mut v = Vec::with_capacity(self.cap(n, 1));
        for _ in 0..n {
            if self.nil()? {
                v.push(None);
                continue;
            }
            let fields = self.map_len("block_mm_infos entry")?;
            let mut info = WireMmInfo::default();
            for _ in 0..fields {
                if self.key()? != Some("mm_objects") {
                    self.skip()?;
                    continue;
                }
                let objects = self.array_len("mm_objects")?;
                info.mm_objects = Vec::with_capacity(self.cap(objects, MIN_MM_OBJECT_BYTES));
                for _ in 0..objects {
                    info.mm_objects.push(self.mm_object()?);
                }
            }
            v.push(Some(info));
        }
        Ok(Some(v))
    }

    fn mm_object(&mut self) -> Result<WireMmObject> {
        let fields = self.map_len("mm_object")?;
        let mut hash = None;
        let mut offsets = Vec::new();
        for _ in 0..fields {
            match self.key()? {
                Some("mm_hash") => hash = Some(self.bits64("mm_hash")?),
                Some("offsets") => {
                    let n = self.array_len("offsets")?;
                    offsets = Vec::with_capacity(self.cap(n, 3));
                    for _ in 0..n {
                        if self.array_len("offset pair")? != 2 {
                            return Err(DecodeError::Invalid("an mm_object offset is not a [start, end] pair"));
                        }
                        offsets.push([self.u32("offset start")?, self.u32("offset end")?]);
                    }
                }
                _ => self.skip()?,
            }
        }
        let mm_hash = hash.ok_or(DecodeError::Missing { event: "mm_object", field: "mm_hash" })?;
        Ok(WireMmObject { mm_hash, offsets })
    }

    /// A map key: `Some(name)` for a string key, `None` for any other key
    /// (skipped). The value is left for the caller.
    fn key(&mut self) -> Result<Option<&'a str>> {
        match self.peek()? {
            0xa0..=0xbf | 0xd9 | 0xda | 0xdb => self.str("field name").map(Some),
            _ => self.skip().map(|()| None),
        }
    }

    /// Image routing metadata: v1 decoded, any other version skipped.
    fn image_routing(&mut self) -> Result<Option<ImageRoutingV1>> {
        if self.nil()? {
            return Ok(None);
        }
        // Find the version first: a map may list it last, and a later version
        // may shape its other fields differently.
        let start = self.pos;
        let fields = self.map_len("image_routing")?;
        let mut version = None;
        for _ in 0..fields {
            if self.key()? == Some("v") && matches!(self.peek()?, 0x00..=0x7f | 0xcc..=0xd3 | 0xe0..=0xff) {
                version = Some(self.int("image_routing version")?);
            } else {
                self.skip()?;
            }
        }
        if version != Some(IMAGE_ROUTING_VERSION.into()) {
            return Ok(None);
        }
        let end = self.pos;
        self.pos = start;
        self.map_len("image_routing")?;
        let mut r = ImageRoutingV1::default();
        for _ in 0..fields {
            match self.key()? {
                Some("items") => {
                    let n = self.array_len("image_routing items")?;
                    r.items = Vec::with_capacity(self.cap(n, MIN_IMAGE_ITEM_BYTES));
                    for _ in 0..n {
                        if self.array_len("image item")? != 2 {
                            return Err(DecodeError::Invalid("an image item is not [digest, uuid]"));
                        }
                        let at = self.pos;
                        let digest: [u8; 32] = self
                            .bin("image digest")?
                            .try_into()
                            .map_err(|_| DecodeError::OutOfRange { pos: at, what: "image digest length" })?;
                        let uuid = self.opt_string("image uuid")?;
                        r.items.push(WireImageItem { digest, uuid });
                    }
                }
                Some("blocks") => {
                    let n = self.array_len("image_routing blocks")?;
                    r.blocks = Vec::with_capacity(self.cap(n, 1));
                    for _ in 0..n {
                        if self.nil()? {
                            r.blocks.push(Vec::new());
                            continue;
                        }
                        let refs = self.array_len("block image refs")?;
                        let mut v = Vec::with_capacity(self.cap(refs, 5));
                        for _ in 0..refs {
                            if self.array_len("image ref")? != 4 {
                                return Err(DecodeError::Invalid(
                                    "an image ref is not [item, item_offset, block_offset, len]",
                                ));
                            }
                            v.push(WireImageRef {
                                item: self.u32("image ref item")?,
                                item_offset: self.u32("image ref item_offset")?,
                                block_offset: self.u32("image ref block_offset")?,
                                len: self.u32("image ref len")?,
                            });
                        }
                        r.blocks.push(v);
                    }
                }
                _ => self.skip()?,
            }
        }
        debug_assert_eq!(self.pos, end, "the second pass reads what the first skipped");
        if r.blocks.iter().flatten().any(|x| x.item as usize >= r.items.len()) {
            return Err(DecodeError::Invalid("an image ref names an item the event does not list"));
        }
        Ok(Some(r))
    }
}

fn build_event(f: Fields) -> Result<WireEvent> {
    let name = f.type_name.ok_or(DecodeError::Missing { event: "event", field: "type" })?;
    Ok(match name.as_str() {
        "BlockStored" => {
            let block_hashes =
                f.block_hashes.ok_or(DecodeError::Missing { event: "BlockStored", field: "block_hashes" })?;
            let block_size = f.block_size.ok_or(DecodeError::Missing { event: "BlockStored", field: "block_size" })?;
            if let Some(r) = &f.image_routing
                && r.blocks.len() != block_hashes.len()
            {
                return Err(DecodeError::Invalid("image_routing lists a different number of blocks than block_hashes"));
            }
            WireEvent::BlockStored(WireBlockStored {
                block_hashes,
                parent_block_hash: f.parent_block_hash,
                token_ids: f.token_ids,
                block_size,
                lora_id: f.lora_id,
                medium: f.medium,
                lora_name: f.lora_name,
                cache_salt: f.cache_salt,
                block_mm_infos: f.block_mm_infos,
                image_routing: f.image_routing,
            })
        }
        "BlockRemoved" => WireEvent::BlockRemoved(WireBlockRemoved {
            block_hashes: f
                .block_hashes
                .ok_or(DecodeError::Missing { event: "BlockRemoved", field: "block_hashes" })?,
            medium: f.medium,
        }),
        "AllBlocksCleared" => WireEvent::AllBlocksCleared,
        _ => WireEvent::Unknown { name },
    })
}
