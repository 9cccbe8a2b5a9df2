//! How events are laid out: the map and the array form, the array form's
//! positions of the fields vLLM does not define, and what the encoder
//! writes.

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

// The array form follows one reference layout: Dynamo 1.6.1's positional
// parser (`dynamo-kv-router` `src/zmq_wire/README.md`), which is vLLM 0.33's
// field order: 0 type, 1 block_hashes, 2 parent_block_hash, 3 token_ids,
// 4 block_size, 5 lora_id, 6 medium, 7 lora_name, 8 extra_keys, 9 group_idx,
// 10 kv_cache_spec_kind, 11 kv_cache_spec_sliding_window, 12 locality,
// 13 ownership, 14 session_id, 15 lookahead_token_ids. kvcore writes no
// field into a slot that names another: the cache salt and the per-block
// image identity travel in `extra_keys`, as Dynamo reads them there, and
// `image_routing` after the last slot either of them defines.

/// Position of `group_idx` in the array form of `BlockStored`.
pub(super) const POS_GROUP_IDX: usize = 9;
/// Position of `kv_cache_spec_kind` in the array form of `BlockStored`.
pub(super) const POS_SPEC_KIND: usize = 10;
/// Position of `kv_cache_spec_sliding_window` in the array form of
/// `BlockStored`.
pub(super) const POS_SLIDING_WINDOW: usize = 11;
/// Position of `group_idx` in the array form of `BlockRemoved` (vLLM 0.33:
/// `block_hashes, medium, group_idx, locality, ownership`). The kind and the
/// window have no slot there: Dynamo's positional parser would read them at
/// 4 and 5, where vLLM puts `locality` and `ownership`, so kvcore writes
/// neither and a positional consumer learns a group's kind from its stores.
pub(super) const POS_REMOVED_GROUP_IDX: usize = 3;

/// Position of `lora_name` in the array form.
pub(super) const POS_LORA_NAME: usize = 7;
/// Position of `extra_keys` in the array form.
pub(super) const POS_EXTRA_KEYS: usize = 8;
/// Position of `image_routing` in the array form: past vLLM 0.33's last
/// field (`lookahead_token_ids`, 15).
pub(super) const POS_IMAGE_ROUTING: usize = 16;

/// The tag that marks the cache salt among the first block's `extra_keys`
/// (Dynamo's `DYNAMO_CACHE_SALT_PREFIX`: a bare string there would be
/// ambiguous with a LoRA name or an image identifier).
pub(super) const CACHE_SALT_TAG: &str = "dynamo-cache-salt:";

/// How an `mm_hash` is written among a block's `extra_keys`: its 16 hex
/// digits padded with 48 zeros, the marker form Dynamo reads as an image
/// identity (a plain 64-hex digest is not read as one).
pub(super) fn mm_marker(mm_hash: u64) -> String {
    format!("{mm_hash:016x}{:048}", 0)
}

/// The `mm_hash` of a marker written by [`mm_marker`].
pub(super) fn mm_of_marker(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() == 64 && b[..16].iter().all(u8::is_ascii_hexdigit) && b[16..].iter().all(|&c| c == b'0') {
        u64::from_str_radix(&s[..16], 16).ok()
    } else {
        None
    }
}
