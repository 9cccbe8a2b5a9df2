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
use crate::keys::{BlockKey, FlatRun, ImageDigest, ImageRun};
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
        self.push_block_runs(block_index, runs);
    }

    /// Appends a chain's next blocks at once: `keys`, one per block, and
    /// `tokens`, the request's ids from the first block's start
    /// (`block_size` per block), of which `flat` (the request's image runs,
    /// sorted by start) says which are image positions. The event holds
    /// what pushing each block with [`BlockStored::push_block`] would have
    /// made (the placeholder id at image positions, each block's runs), in
    /// two copies and a pass over the blocks that hold an image.
    pub(crate) fn push_blocks(
        &mut self,
        keys: &[BlockKey],
        tokens: &[u32],
        first: u32,
        flat: &[FlatRun],
        placeholder: u32,
    ) {
        let bs = self.block_size;
        let start = first * bs;
        let end = start + keys.len() as u32 * bs;
        let (first_block, first_token) = (self.keys.len(), self.token_ids.len());
        self.keys.extend_from_slice(keys);
        // In pieces: one large copy can take glibc's slow string-move path
        // (src/copy.rs).
        crate::copy::extend_tokens(&mut self.token_ids, &tokens[start as usize..end as usize]);
        let mut cursor = flat.partition_point(|r| r.start + r.len <= start);
        let holding = flat[cursor..].iter().take_while(|r| r.start < end);
        for r in holding {
            let (s, e) = (r.start.max(start) - start, (r.start + r.len).min(end) - start);
            self.token_ids[first_token + s as usize..first_token + e as usize].fill(placeholder);
        }
        // Only the blocks that hold an image are visited; the others get
        // their empty entries in bulk.
        let mut next = 0;
        while let Some(r) = flat.get(cursor).filter(|r| r.start < end) {
            // The block where the run at the cursor starts, or the next
            // block when it started in one visited already.
            let b = ((r.start.max(start) - start) / bs).max(next);
            if b as usize >= keys.len() {
                break;
            }
            next = b + 1;
            let (block_start, block_end) = (start + b * bs, start + (b + 1) * bs);
            self.open_block_runs(first_block + b as usize);
            for r in flat[cursor..].iter().take_while(|r| r.start < block_end) {
                self.push_image_run(&r.cut(block_start, block_end));
            }
            self.block_images.end_block();
            while flat.get(cursor).is_some_and(|r| r.start + r.len <= block_end) {
                cursor += 1;
            }
        }
        if !self.block_images.is_empty() {
            self.block_images.end_blocks_to(first_block + keys.len());
        }
    }

    /// Appends block `block_index`'s image runs (the block's key and
    /// tokens are in already), listing each image once.
    fn push_block_runs(&mut self, block_index: usize, runs: &[ImageRun]) {
        self.open_block_runs(block_index);
        for r in runs {
            self.push_image_run(r);
        }
        self.block_images.end_block();
    }

    /// Starts the runs of block `block_index`: the first image block of the
    /// event sizes the per-block lists once, for every block the event was
    /// started for (the keys' capacity) and one run each from here on,
    /// instead of regrowing them block after block, and gives each block
    /// before it an empty entry.
    fn open_block_runs(&mut self, block_index: usize) {
        if self.block_images.is_empty() {
            let blocks = self.keys.capacity().max(block_index + 1);
            self.block_images.reserve(blocks, blocks - block_index);
        }
        self.block_images.end_blocks_to(block_index);
    }

    /// Adds a run to the block being built, listing its image if new.
    fn push_image_run(&mut self, r: &ImageRun) {
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

    /// Closes blocks with no run until `blocks` are listed.
    pub fn end_blocks_to(&mut self, blocks: usize) {
        if blocks > self.ends.len() {
            self.ends.resize(blocks, self.runs.len() as u32);
        }
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::keys::{keyed_tokens, runs_in_block};

    const BLOCK: u32 = 4;
    const PLACEHOLDER: u32 = 7;

    /// Sorted, disjoint image runs over `len` tokens from (gap, length, image)
    /// triples; an image named twice continues at a later item offset.
    fn flat_runs(len: u32, spec: &[(u32, u32, u8)]) -> Vec<FlatRun> {
        let mut runs = Vec::new();
        let mut at = 0;
        let mut offsets = [0u32; 3];
        for &(gap, run_len, image) in spec {
            let start = at + gap;
            let end = (start + run_len).min(len);
            if start >= end {
                break;
            }
            let item = &mut offsets[image as usize % 3];
            runs.push(FlatRun {
                start,
                len: end - start,
                item_offset: *item,
                digest: ImageDigest([image % 3 + 1; 32]),
            });
            *item += end - start;
            at = end;
        }
        runs
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        /// Pushing a chain's blocks at once (`push_blocks`) makes the event
        /// that pushing them one by one with each block's keyed tokens and
        /// runs makes: the same keys, tokens (placeholder at image
        /// positions), images and runs per block, for blocks with no image,
        /// blocks inside one, blocks cut by several, and runs before or
        /// after the pushed ones; and in an event that already holds
        /// blocks, with or without images.
        #[test]
        fn pushing_blocks_at_once_is_pushing_them_one_by_one(
            blocks in 1u32..12,
            spec in proptest::collection::vec((0u32..9, 1u32..10, 0u8..4), 0..6),
            before in 0u32..3,
            first in 0u32..6,
            short in 0u32..4,
        ) {
            let first = first.min(blocks - 1);
            // Blocks after the pushed ones may hold image runs too.
            let count = (blocks - first).saturating_sub(short).max(1);
            let len = blocks * BLOCK;
            let tokens: Vec<u32> = (100..100 + len).collect();
            let flat = flat_runs(len, &spec);
            let keys: Vec<BlockKey> = (0..blocks).map(|i| BlockKey([i as u8; 32])).collect();
            let scope = RequestScope::default();
            let mut one_by_one = BlockStored::start(None, BLOCK, Tier::Device, &scope, 1);
            let mut at_once = one_by_one.clone();
            // Blocks already in the event, the first `before` of them with an image.
            let image = ImageRun { digest: ImageDigest([9; 32]), item_offset: 0, block_offset: 1, len: 2 };
            for b in 0..first.min(3) {
                let runs: &[ImageRun] = if b < before { std::slice::from_ref(&image) } else { &[] };
                let held = [PLACEHOLDER; BLOCK as usize];
                for e in [&mut one_by_one, &mut at_once] {
                    e.push_block(BlockKey([200 + b as u8; 32]), &held, runs);
                }
            }
            let (mut runs, mut scratch) = (Vec::new(), Vec::new());
            for i in first..first + count {
                let start = i * BLOCK;
                runs_in_block(&flat, start, BLOCK, &mut runs);
                let keyed = keyed_tokens(&tokens[start as usize..(start + BLOCK) as usize], &runs, PLACEHOLDER, &mut scratch);
                one_by_one.push_block(keys[i as usize], keyed, &runs);
            }
            at_once.push_blocks(&keys[first as usize..(first + count) as usize], &tokens, first, &flat, PLACEHOLDER);
            prop_assert_eq!(&at_once.keys, &one_by_one.keys);
            prop_assert_eq!(&at_once.token_ids, &one_by_one.token_ids);
            prop_assert_eq!(&at_once.images, &one_by_one.images);
            prop_assert_eq!(&at_once.block_images, &one_by_one.block_images);
        }
    }
}
