//! The block pool (free pages and eviction order per tier), the prefix index,
//! and the pending block copies, bundled with the block table as [`KvCache`].
//!
//! Why a bundle: a block's row, its page, its place in an LRU and its index
//! entry must change together or the pool's invariants break between two
//! calls. Systems that move blocks take `&mut KvCache` and nothing else of the
//! block side; the primitives here are each O(1).

use ahash::AHashMap;

use crate::ids::BlockId;
use crate::keys::BlockKey;
use crate::resources::{Lru, Scopes};
use crate::tables::{KvBlock, KvBlocks, Medium};

/// A page in one tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageRef {
    /// The tier.
    pub medium: Medium,
    /// The page index within the tier.
    pub page: u32,
}

/// A copy of KV data between two pages that the step's copy system performs
/// in one batched launch (offload, onboard, partial reuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    /// Source page.
    pub src: PageRef,
    /// Destination page.
    pub dst: PageRef,
    /// Leading tokens to copy: the whole block, or a prefix for partial reuse.
    pub tokens: u32,
}

/// Free pages and eviction order of each tier.
#[derive(Debug)]
pub struct BlockPool {
    /// Free device pages (a stack: the most recently freed page is reused first).
    pub free_device: Vec<u32>,
    /// Free host pages.
    pub free_host: Vec<u32>,
    /// Unreferenced indexed device blocks, least recently used first.
    pub lru_device: Lru<BlockId>,
    /// Indexed host blocks, least recently used first.
    pub lru_host: Lru<BlockId>,
    /// Device pages in all.
    pub pages_device: u32,
    /// Host pages in all.
    pub pages_host: u32,
}

impl BlockPool {
    fn new(pages_device: u32, pages_host: u32) -> Self {
        let total = (pages_device + pages_host) as usize;
        Self {
            // Reversed so that page 0 is handed out first, which keeps demos readable.
            free_device: (0..pages_device).rev().collect(),
            free_host: (0..pages_host).rev().collect(),
            lru_device: Lru::with_capacity(total),
            lru_host: Lru::with_capacity(total),
            pages_device,
            pages_host,
        }
    }

    /// Free pages of a tier.
    pub fn free(&mut self, medium: Medium) -> &mut Vec<u32> {
        match medium {
            Medium::Gpu => &mut self.free_device,
            Medium::Cpu => &mut self.free_host,
        }
    }

    /// The LRU of a tier.
    pub fn lru(&mut self, medium: Medium) -> &mut Lru<BlockId> {
        match medium {
            Medium::Gpu => &mut self.lru_device,
            Medium::Cpu => &mut self.lru_host,
        }
    }
}

/// Key to the one indexed (advertised, matchable) block that holds it.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    /// The map. ahash: in-memory only, never on the wire.
    pub map: AHashMap<BlockKey, BlockId>,
}

/// The block side of the engine: table, pool, index and pending copies.
#[derive(Debug)]
pub struct KvCache {
    /// The block table.
    pub blocks: KvBlocks,
    /// Free pages and LRUs.
    pub pool: BlockPool,
    /// The prefix index.
    pub index: PrefixIndex,
    /// Copies queued this step.
    pub copies: Vec<BlockCopy>,
    /// Tokens per block.
    pub block_size: u32,
    /// Scopes of requests and advertised blocks.
    pub scopes: Scopes,
}

impl KvCache {
    /// A cache with every page free, all capacity reserved now.
    pub fn new(block_size: u32, pages_device: u32, pages_host: u32) -> Self {
        let total = (pages_device + pages_host) as usize;
        let mut index = PrefixIndex::default();
        index.map.reserve(total);
        Self {
            blocks: KvBlocks::new(block_size, pages_device, pages_host),
            pool: BlockPool::new(pages_device, pages_host),
            index,
            copies: Vec::with_capacity(total.min(1 << 16)),
            block_size,
            scopes: Scopes::default(),
        }
    }

    /// Whether a host tier exists.
    pub fn has_host_tier(&self) -> bool {
        self.pool.pages_host > 0
    }

    /// Takes a free page and makes a fresh unkeyed row with one reference.
    /// Returns `None` when the tier has no free page (the caller evicts first).
    pub fn take_free_block(&mut self, medium: Medium) -> Option<BlockId> {
        let page = self.pool.free(medium).pop()?;
        Some(self.blocks.rows.insert(KvBlock { page, medium, key: None, ref_count: 1, indexed: false }))
    }

    /// Removes a row that is neither referenced, indexed nor in an LRU, and
    /// gives its page back.
    pub fn release_row(&mut self, id: BlockId) {
        let b = self.blocks.rows.remove(id).expect("release_row takes a live block");
        debug_assert!(b.ref_count == 0 && !b.indexed, "only unreferenced, unindexed rows are released");
        self.remove_content(id);
        self.pool.free(b.medium).push(b.page);
    }

    /// Drops a block's re-advertising content and its scope reference.
    pub fn remove_content(&mut self, id: BlockId) {
        if let Some(c) = self.blocks.content.remove(id) {
            self.scopes.release(c.scope);
        }
    }

    /// Device blocks that an allocation could get now: free pages plus
    /// unreferenced cached blocks.
    pub fn device_blocks_available(&self) -> usize {
        self.pool.free_device.len() + self.pool.lru_device.len()
    }

    /// Checks the block side's invariants; panics naming the one broken.
    ///
    /// 1. Free plus used pages equal capacity, per tier, and no page is used twice.
    /// 2. A block is in its tier's LRU exactly when it is indexed and unreferenced
    ///    (host blocks are never referenced).
    /// 3. The index and the table agree: every entry names a live, indexed block
    ///    with that key, and every indexed block is the entry for its key.
    /// 4. Indexed blocks have re-advertising content; others have none.
    pub fn check_invariants(&self) {
        let mut used = [0usize; 2];
        let mut seen = ahash::AHashSet::new();
        for (id, b) in &self.blocks.rows {
            used[b.medium as usize] += 1;
            assert!(seen.insert((b.medium, b.page)), "invariant 1: page {:?}/{} used twice", b.medium, b.page);
            let in_lru = match b.medium {
                Medium::Gpu => self.pool.lru_device.contains(id),
                Medium::Cpu => self.pool.lru_host.contains(id),
            };
            assert_eq!(in_lru, b.indexed && b.ref_count == 0, "invariant 2: LRU membership of {id:?}");
            if b.medium == Medium::Cpu {
                assert!(b.indexed && b.ref_count == 0, "invariant 2: host blocks are indexed and unreferenced");
            }
            if b.indexed {
                let key = b.key.expect("invariant 3: indexed blocks have keys");
                assert_eq!(self.index.map.get(&key), Some(&id), "invariant 3: index entry of {id:?}");
            }
            assert_eq!(self.blocks.content.contains_key(id), b.indexed, "invariant 4: content of {id:?}");
        }
        assert_eq!(used[0] + self.pool.free_device.len(), self.pool.pages_device as usize, "invariant 1: device pages");
        assert_eq!(used[1] + self.pool.free_host.len(), self.pool.pages_host as usize, "invariant 1: host pages");
        for (key, id) in &self.index.map {
            let b = self.blocks.rows.get(*id).expect("invariant 3: index names a live block");
            assert!(b.indexed && b.key == Some(*key), "invariant 3: index entry matches its block");
        }
    }
}
