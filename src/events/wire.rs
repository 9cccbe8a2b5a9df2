//! Wire-level events: what a consumer sees after decoding the bytes.
//!
//! These types mirror the payload of the vLLM-style event stream field by
//! field (docs/wire-format.md), not the engine's typed events: a block is known
//! by its 64-bit wire hash only, token ids may have been left out, and image
//! identity arrives twice in two vocabularies, once for Dynamo
//! (`block_mm_infos`, one 64-bit `mm_hash` per item) and once for us
//! (`image_routing` v1, the 32-byte content digest and the UUID hint). A
//! consumer such as `crate::router` works from these types alone, so anything
//! it can do an outside router can do too.
//!
//! The types are stable: new optional fields may be added to the wire, and an
//! old decoder skips them; a field is never repurposed.
//!
//! ```text
//! frame 0  topic            bytes (default empty)
//! frame 1  seq              u64 big-endian, +1 per batch
//! frame 2  payload          msgpack [ts f64, [event, ...], data_parallel_rank int|nil]
//! ```

use serde::Serialize;

/// One message of the stream: the three ZMQ frames, decoded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WireMessage {
    /// The topic frame, as sent (usually empty).
    #[serde(serialize_with = "ser_lossy_str")]
    pub topic: Vec<u8>,
    /// The batch sequence number: +1 per batch per publisher, so a jump is a
    /// lost batch and the consumer must resync.
    pub seq: u64,
    /// The decoded payload.
    pub batch: WireBatch,
}

/// The payload of one message: the events of one engine step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WireBatch {
    /// Wall-clock time of the batch in seconds since the Unix epoch.
    pub ts: f64,
    /// The events, in the order they happened.
    pub events: Vec<WireEvent>,
    /// The data-parallel rank of the publisher, when it has one.
    pub data_parallel_rank: Option<i64>,
}

/// One event on the wire, tagged by `type`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum WireEvent {
    /// Blocks became cached.
    BlockStored(WireBlockStored),
    /// Blocks stopped being cached.
    BlockRemoved(WireBlockRemoved),
    /// Every cached block was dropped.
    AllBlocksCleared,
    /// An event type this decoder does not know (a newer publisher's); its
    /// fields were skipped. Consumers ignore it.
    Unknown {
        /// The event's `type`.
        name: String,
    },
}

/// `BlockStored` as it travels.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WireBlockStored {
    /// Wire hashes of the stored blocks, a parent chain in order. Engines that
    /// send u64 are read as the same 64 bits in an `i64`.
    pub block_hashes: Vec<i64>,
    /// Wire hash of the first block's parent; `None` at the start of a chain.
    pub parent_block_hash: Option<i64>,
    /// Token ids of all blocks, `block_size` per block, with the model's image
    /// placeholder id at image positions. `None` when the publisher left them
    /// out (a consumer keying by engine hashes and image identities alone).
    pub token_ids: Option<Vec<u32>>,
    /// Tokens per block.
    pub block_size: u32,
    /// LoRA adapter id.
    pub lora_id: Option<i64>,
    /// The tier, `"GPU"` or `"CPU"` (others name lower tiers).
    pub medium: Option<String>,
    /// LoRA adapter name (Dynamo seeds its block keys with it).
    pub lora_name: Option<String>,
    /// Cache salt (Dynamo seeds its block keys with it). Omitted when unset.
    pub cache_salt: Option<String>,
    /// Dynamo's per-block image identity: one entry per block, `None` for a
    /// block that holds no image. `None` as a whole when no block holds an
    /// image, or when token ids were left out (it only serves consumers that
    /// hash token ids).
    pub block_mm_infos: Option<Vec<Option<WireMmInfo>>>,
    /// Image routing metadata v1, present if and only if some block holds an
    /// image run. `None` also when the event carried a version this decoder
    /// does not know (it is skipped, not fatal).
    pub image_routing: Option<ImageRoutingV1>,
    /// The KV cache group of the blocks (vLLM's `group_idx`); `None` from a
    /// single-group engine, which names no group.
    pub group_idx: Option<u32>,
    /// The group's kind (vLLM's `kv_cache_spec_kind`): `"full_attention"`,
    /// `"sliding_window"` or another engine's name for another kind.
    pub kv_cache_spec_kind: Option<String>,
    /// A sliding-window group's window in tokens (vLLM's
    /// `kv_cache_spec_sliding_window`).
    pub kv_cache_spec_sliding_window: Option<u32>,
}

/// `BlockRemoved` as it travels.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WireBlockRemoved {
    /// Wire hashes of the removed blocks.
    pub block_hashes: Vec<i64>,
    /// The tier.
    pub medium: Option<String>,
    /// The KV cache group the blocks belonged to (vLLM's `group_idx`);
    /// `None` from a single-group engine.
    pub group_idx: Option<u32>,
    /// The group's kind. Map form only: vLLM's `BlockRemoved` has no such
    /// field (its decoder ignores the key), Dynamo reads it by name, so a
    /// removal filters by kind even when its group's stores were never seen.
    pub kv_cache_spec_kind: Option<String>,
    /// A sliding-window group's window in tokens. Map form only, as
    /// `kv_cache_spec_kind`.
    pub kv_cache_spec_sliding_window: Option<u32>,
}

/// One block's entry of `block_mm_infos`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WireMmInfo {
    /// One object per image item present in the block.
    pub mm_objects: Vec<WireMmObject>,
}

/// One image item inside one block, as Dynamo keys it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WireMmObject {
    /// The item's 64-bit identity ([`crate::keys::mm_hash`]).
    pub mm_hash: u64,
    /// `[start, end)` token ranges of the item within the block.
    pub offsets: Vec<[u32; 2]>,
}

/// The current version of the image routing metadata.
pub const IMAGE_ROUTING_VERSION: u64 = 1;

/// Image routing metadata v1 (`image_routing: {"v": 1, "items": ..., "blocks": ...}`):
/// each image item of the event once, and per block the runs that refer to it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ImageRoutingV1 {
    /// Each image item of the event, once.
    pub items: Vec<WireImageItem>,
    /// One entry per block of the event, in block order; empty for a block
    /// that holds no image.
    pub blocks: Vec<Vec<WireImageRef>>,
}

/// An image item of [`ImageRoutingV1`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WireImageItem {
    /// BLAKE3-256 of the item's content: its cache identity. Raw bytes on the
    /// wire (msgpack bin 8), hex in JSON.
    #[serde(serialize_with = "ser_hex")]
    pub digest: [u8; 32],
    /// The caller's UUID when the engine knows one unambiguously: a routing
    /// hint, never a cache identity.
    pub uuid: Option<String>,
}

/// One run of an image item inside one block: `[item, item_offset,
/// block_offset, len]` on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WireImageRef {
    /// Index into [`ImageRoutingV1::items`].
    pub item: u32,
    /// Offset of the run's first token within the item (item-local).
    pub item_offset: u32,
    /// Offset of the run's first token within the block.
    pub block_offset: u32,
    /// Tokens in the run.
    pub len: u32,
}

fn ser_hex<S: serde::Serializer>(bytes: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::keys::ImageDigest(*bytes).to_hex())
}

fn ser_lossy_str<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(bytes))
}
