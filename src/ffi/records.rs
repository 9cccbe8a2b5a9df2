//! The flat records C drains from an engine: KV events (`kvc_event`) and
//! block copies (`kvc_block_copy`), with the tier and kind codes they carry,
//! and their conversion from the engine's events and copies.
//!
//! Events cross as fixed-size, pointer-free `kvc_event` records (`bytemuck`
//! `Pod`): one record per block of a `BlockStored` or `BlockRemoved` event,
//! one for `AllBlocksCleared`. Records of one event share `event_seq` and
//! count `block_index` up from 0 to `block_count - 1`, so a C++ consumer can
//! `memcpy` them, regroup them, and never free anything. The token ids and
//! image details of a stored block are not in the records; they are what the
//! wire encoding is for.
//!
//! This module sits below the exports: the engine handle keeps these records
//! between calls, and `step.rs` hands them out.

use bytemuck::{Pod, Zeroable};

use crate::events::{EventBatch, KvEvent, Tier};
use crate::keys::BlockKey;
use crate::resources::{BlockCopy, PageRef, copy_waves};

/// A KV tier.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvc_medium {
    /// No tier (an `AllBlocksCleared` record).
    None = 0,
    /// Device memory.
    Gpu = 1,
    /// The pinned host tier.
    Cpu = 2,
}

impl From<Tier> for kvc_medium {
    fn from(m: Tier) -> Self {
        match m {
            Tier::Device => kvc_medium::Gpu,
            Tier::Host => kvc_medium::Cpu,
        }
    }
}

/// What a `kvc_event` record reports.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvc_event_kind {
    /// A block became cached (advertised) in `medium`.
    BlockStored = 1,
    /// A block stopped being cached in `medium`.
    BlockRemoved = 2,
    /// Every cached block was dropped.
    AllBlocksCleared = 3,
}

/// `kvc_event.flags`: the record has a parent hash.
pub const KVC_EVENT_FLAG_HAS_PARENT: u32 = 1;
/// `kvc_event.flags`: the record has a LoRA id.
pub const KVC_EVENT_FLAG_HAS_LORA_ID: u32 = 2;

/// One block of one KV event: a fixed-size record without pointers.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct kvc_event {
    /// A `kvc_event_kind` value.
    pub kind: u32,
    /// A `kvc_medium` value.
    pub medium: u32,
    /// The event's sequence number (monotonic per engine, shared by the event's records).
    pub event_seq: u64,
    /// The step that closed the event.
    pub step_index: u64,
    /// The block's 64-bit wire hash (first 8 bytes of its key, big-endian, signed).
    pub block_hash: i64,
    /// The wire hash of the block's parent, when `flags` has `KVC_EVENT_FLAG_HAS_PARENT`.
    pub parent_hash: i64,
    /// Index of this block within its event.
    pub block_index: u32,
    /// Blocks in the event.
    pub block_count: u32,
    /// Tokens in the block (stored blocks; 0 otherwise).
    pub token_count: u32,
    /// Image runs inside this block (stored blocks; 0 otherwise).
    pub image_run_count: u32,
    /// Image items in the whole event (stored events; 0 otherwise).
    pub image_count: u32,
    /// `KVC_EVENT_FLAG_*` bits.
    pub flags: u32,
    /// The chain's LoRA id, when `flags` has `KVC_EVENT_FLAG_HAS_LORA_ID`.
    pub lora_id: u32,
    /// The KV cache group the block is in: its index in `kvc_config.groups`
    /// (0 for an engine configured without groups, and for
    /// `KVC_EVENT_KIND_ALL_BLOCKS_CLEARED`, which clears every group).
    pub group: u32,
    /// The block's full 32-byte key.
    pub block_key: [u8; 32],
    /// The parent's full key (zero when there is no parent).
    pub parent_key: [u8; 32],
}

/// A copy between two pages that the caller performs before the next forward
/// pass (offload, onboard, partial reuse).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct kvc_block_copy {
    /// Source tier (`kvc_medium`).
    pub src_medium: u32,
    /// Source page within its tier.
    pub src_page: u32,
    /// Destination tier (`kvc_medium`).
    pub dst_medium: u32,
    /// Destination page within its tier.
    pub dst_page: u32,
    /// Leading tokens to copy: the whole block, or a prefix for partial reuse.
    pub tokens: u32,
    /// The copy's wave, counting from 0. Copies of one wave touch no page
    /// another copy of that wave writes, so each wave may run as one batched
    /// launch; run the waves in increasing order.
    pub wave: u32,
    /// The KV cache group whose pool both pages are in (0 for an engine
    /// configured without groups): each group has pages of its own, so
    /// page `p` of two groups are two pages.
    pub group: u32,
}

fn page_medium(p: PageRef) -> u32 {
    kvc_medium::from(p.medium) as u32
}

/// The records of a step's copies, in order, each with its wave (a copy's
/// wave is the number of waves that end at or before it).
pub(crate) fn block_copy_records(copies: &[BlockCopy]) -> impl Iterator<Item = kvc_block_copy> + '_ {
    let wave_ends = copy_waves(copies);
    copies.iter().enumerate().map(move |(i, copy)| {
        // Spelled out without `..`: a field added to `BlockCopy` fails to
        // compile here until the record carries it.
        let BlockCopy { src, dst, tokens, group } = *copy;
        kvc_block_copy {
            src_medium: page_medium(src),
            src_page: src.page,
            dst_medium: page_medium(dst),
            dst_page: dst.page,
            tokens,
            wave: wave_ends.partition_point(|end| *end <= i) as u32,
            group,
        }
    })
}

/// How many records [`flatten_batch`] makes of a batch: one per block of a
/// stored or removed event, one per cache reset.
pub(crate) fn record_count(batch: &EventBatch) -> usize {
    batch
        .events
        .iter()
        .map(|event| match event {
            KvEvent::BlockStored(e) => e.keys.len(),
            KvEvent::BlockRemoved(e) => e.keys.len(),
            KvEvent::AllBlocksCleared(_) => 1,
        })
        .sum()
}

/// Flattens one closed batch into its records.
pub(crate) fn flatten_batch(batch: &EventBatch) -> Vec<kvc_event> {
    let mut out = Vec::with_capacity(record_count(batch));
    for event in &batch.events {
        let base = kvc_event { event_seq: event.event_seq(), step_index: batch.step_index, ..Zeroable::zeroed() };
        match event {
            KvEvent::BlockStored(e) => {
                let lora = e.lora_id.map_or((0, 0), |id| (KVC_EVENT_FLAG_HAS_LORA_ID, id));
                let count = e.keys.len() as u32;
                out.extend(e.keys.iter().enumerate().map(|(i, key)| {
                    let parent: Option<BlockKey> = if i == 0 { e.parent } else { Some(e.keys[i - 1]) };
                    kvc_event {
                        kind: kvc_event_kind::BlockStored as u32,
                        medium: kvc_medium::from(e.medium) as u32,
                        block_hash: key.wire_hash().0,
                        parent_hash: parent.map_or(0, |p| p.wire_hash().0),
                        block_index: i as u32,
                        block_count: count,
                        token_count: e.block_size,
                        image_run_count: e.block_images.get(i).map_or(0, |r| r.len() as u32),
                        image_count: e.images.len() as u32,
                        flags: lora.0 | if parent.is_some() { KVC_EVENT_FLAG_HAS_PARENT } else { 0 },
                        lora_id: lora.1,
                        group: e.group.map_or(0, |g| g.index),
                        block_key: key.0,
                        parent_key: parent.map_or([0; 32], |p| p.0),
                        ..base
                    }
                }));
            }
            KvEvent::BlockRemoved(e) => {
                let count = e.keys.len() as u32;
                out.extend(e.keys.iter().enumerate().map(|(i, key)| kvc_event {
                    kind: kvc_event_kind::BlockRemoved as u32,
                    medium: kvc_medium::from(e.medium) as u32,
                    block_hash: key.wire_hash().0,
                    block_index: i as u32,
                    block_count: count,
                    group: e.group.map_or(0, |g| g.index),
                    block_key: key.0,
                    ..base
                }));
            }
            KvEvent::AllBlocksCleared(_) => {
                out.extend([kvc_event { kind: kvc_event_kind::AllBlocksCleared as u32, block_count: 1, ..base }])
            }
        }
    }
    out
}
