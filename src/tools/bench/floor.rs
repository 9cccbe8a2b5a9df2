//! The floor of the engine-core workload: the least bookkeeping that a cold
//! prompt needs, written as plainly as it can be, so that `kvcore
//! core-bench` can show how far the engine's own work is from it (its
//! `floor` case).
//!
//! A cold prompt has to: copy its token ids in (the caller's buffer is not
//! kept), take a page for each block, key each block (the SHA-256 chain),
//! enter each key in an index, write each block's row (key, parent, depth)
//! and copy its token ids into its page's slot, build the event (the keys,
//! the token ids and the image run of each block that holds one) and, at
//! finish, list the blocks for eviction. [`FloorModel`] does that and
//! nothing else: no validation, no tiers, groups or scopes, no content kept
//! for advertising a block again, no sibling lists, no events queue, and
//! its image runs come from the workload's shape instead of the request's.
//! It is a measuring stick, not an engine.

use std::collections::HashMap;

use kvcore::{BlockKey, ImageDigest, ImageRun, KeyScope, block_key, root_key};

use super::{BLOCK_SIZE, IMAGE_LEN, IMAGE_START, PROMPT, PromptWorkload};

/// No block (an end of the LRU list, or the first block's parent).
const NONE: u32 = u32::MAX;

/// Token ids per piece of a bulk copy, as the engine copies a prompt (below
/// glibc's string-move threshold).
const PIECE: usize = 512;

/// Blocks of the workload's prompt.
const BLOCKS: u32 = PROMPT / BLOCK_SIZE;

/// One block's row.
#[derive(Clone, Copy, Debug)]
struct Row {
    key: BlockKey,
    /// The parent block's page, or [`NONE`].
    parent: u32,
    depth: u32,
    refs: u32,
    /// LRU neighbours, or [`NONE`].
    prev: u32,
    next: u32,
}

impl Default for Row {
    fn default() -> Self {
        Self { key: BlockKey([0; 32]), parent: NONE, depth: 0, refs: 0, prev: NONE, next: NONE }
    }
}

/// What the floor advertises for a prompt: the event's content.
#[derive(Clone, Debug, Default)]
pub struct FloorEvent {
    /// The blocks' keys, in chain order.
    pub keys: Vec<BlockKey>,
    /// The blocks' token ids.
    pub token_ids: Vec<u32>,
    /// Each image block's index and run.
    pub runs: Vec<(u32, ImageRun)>,
}

/// The least bookkeeping of the workload's cold prompt (module docs), with
/// room for one prompt's blocks.
#[derive(Debug)]
pub struct FloorModel {
    /// Free pages, as a stack.
    free: Vec<u32>,
    /// Rows by page.
    rows: Vec<Row>,
    /// Key (its first 8 bytes) to page.
    index: HashMap<u64, u32, ahash::RandomState>,
    /// Token ids by page.
    slots: Vec<u32>,
    /// The prompt's token ids, copied in.
    request: Vec<u32>,
    /// The prompt's pages, in block order.
    blocks: Vec<u32>,
    /// The most recently used end of the LRU list.
    lru_tail: u32,
    root: BlockKey,
    digest: ImageDigest,
}

impl FloorModel {
    /// A model with room for the workload's prompt.
    pub fn new(w: &PromptWorkload) -> Self {
        let pages = BLOCKS as usize;
        let mut index = HashMap::with_hasher(ahash::RandomState::new());
        index.reserve(pages);
        Self {
            free: (0..BLOCKS).rev().collect(),
            rows: vec![Row::default(); pages],
            index,
            slots: vec![0; pages * BLOCK_SIZE as usize],
            request: Vec::with_capacity(PROMPT as usize),
            blocks: Vec::with_capacity(pages),
            lru_tail: NONE,
            root: root_key(&KeyScope { block_size_tokens: BLOCK_SIZE, ..Default::default() }),
            digest: ImageDigest(w.digest),
        }
    }

    /// Admits, commits and finishes `tokens` (the workload's shape, from an
    /// empty model) and returns its event: the measured unit.
    pub fn serve(&mut self, tokens: &[u32]) -> FloorEvent {
        self.request.clear();
        for piece in tokens.chunks(PIECE) {
            self.request.extend_from_slice(piece);
        }
        self.blocks.clear();
        for _ in 0..BLOCKS {
            let page = self.free.pop().expect("the model is cleared between prompts");
            self.rows[page as usize] = Row { refs: 1, ..Row::default() };
            self.blocks.push(page);
        }
        let mut event = FloorEvent {
            keys: Vec::with_capacity(BLOCKS as usize),
            token_ids: Vec::with_capacity(PROMPT as usize),
            runs: Vec::new(),
        };
        let bs = BLOCK_SIZE as usize;
        let (mut parent, mut parent_page) = (self.root, NONE);
        for i in 0..BLOCKS {
            let start = i * BLOCK_SIZE;
            let ids = &self.request[start as usize..start as usize + bs];
            let run = ImageRun {
                digest: self.digest,
                item_offset: start.saturating_sub(IMAGE_START),
                block_offset: 0,
                len: BLOCK_SIZE,
            };
            let image = (IMAGE_START..IMAGE_START + IMAGE_LEN).contains(&start);
            let key = block_key(&parent, ids, if image { std::slice::from_ref(&run) } else { &[] });
            let page = self.blocks[i as usize];
            self.index.insert(u64::from_le_bytes(key.0[..8].try_into().expect("8 bytes")), page);
            let row = &mut self.rows[page as usize];
            (row.key, row.parent, row.depth) = (key, parent_page, i);
            self.slots[page as usize * bs..(page as usize + 1) * bs].copy_from_slice(ids);
            event.keys.push(key);
            if image {
                event.runs.push((i, run));
            }
            (parent, parent_page) = (key, page);
        }
        for piece in self.request.chunks(PIECE) {
            event.token_ids.extend_from_slice(piece);
        }
        // Finish: the deepest block first in line for eviction.
        for &page in self.blocks.iter().rev() {
            let row = &mut self.rows[page as usize];
            row.refs -= 1;
            (row.prev, row.next) = (self.lru_tail, NONE);
            if self.lru_tail != NONE {
                self.rows[self.lru_tail as usize].next = page;
            }
            self.lru_tail = page;
        }
        event
    }

    /// Empties the model for the next prompt (untimed, as the cold engine's
    /// clear is).
    pub fn clear(&mut self) {
        self.index.clear();
        self.free.extend(self.blocks.iter().rev());
        self.blocks.clear();
        self.lru_tail = NONE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcore::KvEvent;

    /// The floor does the engine's work for the cold prompt: the same keys,
    /// token ids and image blocks in its event as the engine's
    /// `BlockStored`, every key indexed, each row's parent the block before,
    /// every page's slot holding its block's ids, and all blocks listed for
    /// eviction deepest first; and it does it again after a clear.
    #[test]
    fn the_floor_does_the_engines_work() {
        let w = PromptWorkload::default();
        let mut e = PromptWorkload::engine(1, 0);
        let stored: Vec<_> = w
            .serve_events(&mut e, &w.tokens)
            .into_iter()
            .filter_map(|ev| match ev {
                KvEvent::BlockStored(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(stored.len(), 1);
        let mut f = FloorModel::new(&w);
        for _ in 0..2 {
            let ev = f.serve(&w.tokens);
            assert_eq!(ev.keys, stored[0].keys);
            assert_eq!(ev.token_ids, stored[0].token_ids);
            let image_blocks: Vec<u32> = ev.runs.iter().map(|(b, _)| *b).collect();
            let engine_image_blocks: Vec<u32> = (0..BLOCKS)
                .filter(|&b| stored[0].block_images.get(b as usize).is_some_and(|r| !r.is_empty()))
                .collect();
            assert_eq!(image_blocks, engine_image_blocks);
            assert_eq!(f.index.len(), BLOCKS as usize);
            for (i, &page) in f.blocks.iter().enumerate() {
                let row = &f.rows[page as usize];
                assert_eq!(row.key, ev.keys[i]);
                assert_eq!(row.refs, 0);
                assert_eq!(row.parent, if i == 0 { NONE } else { f.blocks[i - 1] });
                let bs = BLOCK_SIZE as usize;
                assert_eq!(&f.slots[page as usize * bs..][..bs], &w.tokens[i * bs..][..bs]);
            }
            assert_eq!(f.lru_tail, f.blocks[0], "the first block is the most recently listed");
            f.clear();
            assert_eq!(f.free.len(), BLOCKS as usize);
        }
    }
}
