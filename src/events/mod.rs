//! KV-cache events: typed values first, wire bytes later.
//!
//! Systems push typed events into the step's [`EventQueue`]; at the end of the
//! step the batch is closed (routing hints resolved, sequence numbers fixed)
//! and becomes drainable. The typed events carry everything the wire needs, so
//! the codec is a pure function of them.
//!
//! Layering: events sit above the tables (a `BlockStored` carries a chain's
//! [`RequestScope`]) and below the resources, so that the block cache's verbs
//! can queue the events they imply; nothing here names a resource.

pub mod codec;
pub mod mirror;
pub mod profile;
pub mod publisher;
mod queue;
pub mod wire;

pub use queue::{EventBatch, EventQueue};

use std::sync::Arc;

pub use crate::group::KvGroup;
use crate::keys::{BlockKey, ImageDigest, ImageRun};
use crate::tables::RequestScope;
pub use crate::tier::Tier;

/// An image item referred to by a [`BlockStored`] event, listed once per event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventImage {
    /// The content digest (cache identity).
    pub digest: ImageDigest,
    /// The caller's UUID when the routing-hint table knows one unambiguously.
    /// Filled when the step's batch is closed.
    pub uuid: Option<Arc<str>>,
}

/// One run of an image inside one block of a [`BlockStored`] event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventImageRun {
    /// Index into the event's `images`.
    pub image: u32,
    /// Offset of the run's first token within the item.
    pub item_offset: u32,
    /// Offset of the run's first token within the block.
    pub block_offset: u32,
    /// Tokens in the run.
    pub len: u32,
}

/// Blocks became cached (advertised) in one tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockStored {
    /// Monotonic per engine.
    pub event_seq: u64,
    /// Full keys of the stored blocks, a parent chain in order.
    pub keys: Vec<BlockKey>,
    /// Key of the first block's parent; `None` for the start of a chain.
    pub parent: Option<BlockKey>,
    /// Token ids of all blocks, `block_size` per block, with the image
    /// placeholder id at image positions.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// LoRA id of the chain.
    pub lora_id: Option<u32>,
    /// LoRA name of the chain.
    pub lora_name: Option<Arc<str>>,
    /// Cache salt of the chain.
    pub cache_salt: Option<Arc<str>>,
    /// The tier.
    pub medium: Tier,
    /// Image items present in the event, each once.
    pub images: Vec<EventImage>,
    /// Per block, its image runs. Empty when no block holds an image;
    /// otherwise exactly one entry per block.
    pub block_images: BlockImages,
    /// The KV cache group the blocks belong to; `None` for an engine with a
    /// single group, whose events name no group (today's bytes).
    pub group: Option<KvGroup>,
}

/// Building an event block by block, for the engine only (`pub(crate)`: the
/// public type is a value its consumers read, not build).
impl BlockStored {
    /// An event with no block yet, for blocks of a chain of `scope` in
    /// `medium` whose first block extends `parent`, sized for `blocks_hint`
    /// blocks so that pushing them does not reallocate. Its `event_seq` is
    /// set when it is queued ([`EventQueue::push_stored`]).
    pub(crate) fn start(
        parent: Option<BlockKey>,
        block_size: u32,
        medium: Tier,
        scope: &RequestScope,
        blocks_hint: usize,
    ) -> Self {
        BlockStored {
            event_seq: 0,
            keys: Vec::with_capacity(blocks_hint),
            parent,
            token_ids: Vec::with_capacity(blocks_hint * block_size as usize),
            block_size,
            lora_id: scope.lora_id,
            lora_name: scope.lora_name.clone(),
            cache_salt: scope.cache_salt.clone(),
            medium,
            images: Vec::new(),
            block_images: BlockImages::new(),
            group: None,
        }
    }

    /// Appends the chain's next block: its key, its `block_size` keyed token
    /// ids and its image runs in block order. Each image is listed once in
    /// `images`; `block_images` stays empty until a block holds an image,
    /// and from then on has one entry per block (the text blocks before the
    /// first image block listed empty).
    #[inline]
    pub(crate) fn push_block(&mut self, key: BlockKey, tokens: &[u32], runs: &[ImageRun]) {
        let block_index = self.keys.len();
        self.keys.push(key);
        crate::copy::extend_block(&mut self.token_ids, tokens);
        if runs.is_empty() && self.block_images.is_empty() {
            return;
        }
        if self.block_images.is_empty() {
            // The first image block: size the per-block lists once, for
            // every block the event was started for (the keys' capacity)
            // and one run each from here on, instead of regrowing them
            // block after block.
            let blocks = self.keys.capacity().max(block_index + 1);
            self.block_images.reserve(blocks, blocks - block_index);
        }
        while self.block_images.len() < block_index {
            self.block_images.end_block();
        }
        for r in runs {
            let image = match self.images.iter().position(|i| i.digest == r.digest) {
                Some(p) => p,
                None => {
                    self.images.push(EventImage { digest: r.digest, uuid: None });
                    self.images.len() - 1
                }
            } as u32;
            self.block_images.push_run(EventImageRun {
                image,
                item_offset: r.item_offset,
                block_offset: r.block_offset,
                len: r.len,
            });
        }
        self.block_images.end_block();
    }
}

/// The image runs of each block of a [`BlockStored`] event, stored flat (one
/// vector of runs and one of per-block ends) so that building an event with
/// many image blocks does not allocate per block. Read it like a list of
/// per-block slices: [`BlockImages::get`], [`BlockImages::iter`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockImages {
    runs: Vec<EventImageRun>,
    /// `ends[i]`: one past the last run of block `i` in `runs`.
    ends: Vec<u32>,
}

impl BlockImages {
    /// No blocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks listed (0, or one per block of the event).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether no block is listed.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The runs of block `i`, `None` past the end.
    pub fn get(&self, i: usize) -> Option<&[EventImageRun]> {
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        Some(&self.runs[start..end])
    }

    /// Each block's runs, in block order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[EventImageRun]> + '_ {
        (0..self.ends.len()).map(|i| self.get(i).expect("i < len"))
    }

    /// Makes room for `blocks` blocks in all and `runs` more runs, so that
    /// building them does not reallocate.
    pub fn reserve(&mut self, blocks: usize, runs: usize) {
        self.ends.reserve(blocks.saturating_sub(self.ends.len()));
        self.runs.reserve(runs);
    }

    /// Appends a run to the block being built (the one after the last
    /// [`BlockImages::end_block`]).
    pub fn push_run(&mut self, run: EventImageRun) {
        self.runs.push(run);
    }

    /// Closes the block being built (with no run when none was pushed).
    pub fn end_block(&mut self) {
        self.ends.push(self.runs.len() as u32);
    }

    /// Appends one block with `runs`.
    pub fn push_block(&mut self, runs: &[EventImageRun]) {
        self.runs.extend_from_slice(runs);
        self.end_block();
    }
}

impl From<Vec<Vec<EventImageRun>>> for BlockImages {
    fn from(blocks: Vec<Vec<EventImageRun>>) -> Self {
        let mut out = Self::new();
        for b in &blocks {
            out.push_block(b);
        }
        out
    }
}

/// Blocks stopped being cached in one tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRemoved {
    /// Monotonic per engine.
    pub event_seq: u64,
    /// Keys of the removed blocks.
    pub keys: Vec<BlockKey>,
    /// The tier.
    pub medium: Tier,
    /// The KV cache group the blocks belonged to; `None` for an engine with
    /// a single group (today's bytes).
    pub group: Option<KvGroup>,
}

/// Every cached block of every group was dropped (prefix cache reset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllBlocksCleared {
    /// Monotonic per engine.
    pub event_seq: u64,
}

/// A KV-cache event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// See [`BlockStored`].
    BlockStored(BlockStored),
    /// See [`BlockRemoved`].
    BlockRemoved(BlockRemoved),
    /// See [`AllBlocksCleared`].
    AllBlocksCleared(AllBlocksCleared),
}

impl KvEvent {
    /// The event's sequence number.
    pub fn event_seq(&self) -> u64 {
        match self {
            KvEvent::BlockStored(e) => e.event_seq,
            KvEvent::BlockRemoved(e) => e.event_seq,
            KvEvent::AllBlocksCleared(e) => e.event_seq,
        }
    }
}
