//! The publisher's mirror of advertised blocks, which answers snapshots.
//!
//! The publisher thread applies every batch it is handed (published or
//! dropped) to this mirror, so it can serve "give me the full current state"
//! without touching the engine, whose owner is busy stepping. The mirror holds
//! what the stream has *said*, which is exactly what a consumer needs to
//! rebuild: one single-block `BlockStored` per advertised `(group, key, tier)`
//! (the group is `None` for a single-group engine).

use std::collections::HashMap;

use crate::events::{AllBlocksCleared, BlockImages, BlockStored, EventImageRun, KvEvent, Tier};
use crate::group::KvGroup;
use crate::keys::BlockKey;

/// Advertised blocks, as single-block events.
#[derive(Debug, Default)]
pub struct Mirror {
    blocks: HashMap<(Option<KvGroup>, BlockKey, Tier), MirrorBlock>,
}

#[derive(Debug)]
struct MirrorBlock {
    /// Chain depth when it was stored: parents sort before children.
    depth: u32,
    event: BlockStored,
}

impl Mirror {
    /// An empty mirror.
    pub fn new() -> Self {
        Self::default()
    }

    /// Advertised `(group, key, tier)` entries.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Applies a batch's events in order.
    pub fn apply(&mut self, events: &[KvEvent]) {
        for e in events {
            match e {
                KvEvent::BlockStored(s) => {
                    for block in split_stored(s) {
                        let depth = match block.parent {
                            Some(p) => self.depth_of(block.group, &p).map_or(0, |d| d + 1),
                            None => 0,
                        };
                        self.blocks
                            .insert((block.group, block.keys[0], block.medium), MirrorBlock { depth, event: block });
                    }
                }
                KvEvent::BlockRemoved(r) => {
                    for k in &r.keys {
                        self.blocks.remove(&(r.group, *k, r.medium));
                    }
                }
                KvEvent::AllBlocksCleared(_) => self.blocks.clear(),
            }
        }
    }

    fn depth_of(&self, group: Option<KvGroup>, key: &BlockKey) -> Option<u32> {
        [Tier::Device, Tier::Host].iter().find_map(|m| self.blocks.get(&(group, *key, *m)).map(|b| b.depth))
    }

    /// The full state: `AllBlocksCleared`, then one `BlockStored` per
    /// advertised block, parents before children, then by group, device tier
    /// first. Every
    /// `event_seq` is 0, as in `Engine::snapshot` (a snapshot is tagged with a
    /// batch sequence number instead).
    pub fn snapshot(&self) -> Vec<KvEvent> {
        let mut blocks: Vec<&MirrorBlock> = self.blocks.values().collect();
        blocks.sort_by_key(|b| (b.depth, b.event.group, b.event.medium, b.event.keys[0]));
        let mut out = Vec::with_capacity(blocks.len() + 1);
        out.push(KvEvent::AllBlocksCleared(AllBlocksCleared { event_seq: 0 }));
        out.extend(blocks.into_iter().map(|b| KvEvent::BlockStored(BlockStored { event_seq: 0, ..b.event.clone() })));
        out
    }
}

/// Splits a multi-block `BlockStored` into one event per block, each listing
/// only the image items its own runs refer to.
pub fn split_stored(s: &BlockStored) -> Vec<BlockStored> {
    let bs = s.block_size as usize;
    let mut out = Vec::with_capacity(s.keys.len());
    for (i, key) in s.keys.iter().enumerate() {
        let parent = if i == 0 { s.parent } else { Some(s.keys[i - 1]) };
        let token_ids = s.token_ids.get(i * bs..(i + 1) * bs).map(<[u32]>::to_vec).unwrap_or_default();
        let mut images = Vec::new();
        let mut runs = Vec::new();
        for r in s.block_images.get(i).unwrap_or_default() {
            let Some(img) = s.images.get(r.image as usize) else { continue };
            let image = match images.iter().position(|x| x == img) {
                Some(p) => p,
                None => {
                    images.push(img.clone());
                    images.len() - 1
                }
            } as u32;
            runs.push(EventImageRun { image, ..*r });
        }
        out.push(BlockStored {
            event_seq: s.event_seq,
            keys: vec![*key],
            parent,
            token_ids,
            block_size: s.block_size,
            lora_id: s.lora_id,
            lora_name: s.lora_name.clone(),
            cache_salt: s.cache_salt.clone(),
            medium: s.medium,
            block_images: {
                let mut b = BlockImages::new();
                if !runs.is_empty() {
                    b.push_block(&runs);
                }
                b
            },
            images,
            group: s.group,
        });
    }
    out
}
