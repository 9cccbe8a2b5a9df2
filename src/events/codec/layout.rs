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

// Positions of `BlockStored` fields in the array form, after the type name at
// 0: vLLM's eleven, then ours. The encoder writes them and the decoder reads
// them by these numbers.

/// Position of `block_mm_infos` in the array form.
pub(super) const POS_BLOCK_MM_INFOS: usize = 12;
/// Position of `image_routing` in the array form.
pub(super) const POS_IMAGE_ROUTING: usize = 13;
/// Position of `cache_salt` in the array form.
pub(super) const POS_CACHE_SALT: usize = 14;
