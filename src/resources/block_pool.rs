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
use crate::resources::ScopeId;
use crate::resources::Scopes;
use crate::tables::{BlockContent, KvBlock, KvBlocks, LruLinks, Medium, SiblingLink};
use slotmap::SlotMap;

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

/// Splits an ordered list of copies into waves that may each run as one
/// batched launch: a new wave starts whenever a copy would read or write a
/// page that an earlier copy of the current wave writes, or write a page that
/// it reads. Running the waves in order gives the same result as running the
/// copies one by one (an offload that frees a device page and an onboard that
/// fills it in the same step stay ordered). Returns the end index of each wave.
pub fn copy_waves(copies: &[BlockCopy]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut reads = ahash::AHashSet::new();
    let mut writes = ahash::AHashSet::new();
    for (i, c) in copies.iter().enumerate() {
        if writes.contains(&c.src) || writes.contains(&c.dst) || reads.contains(&c.dst) {
            ends.push(i);
            reads.clear();
            writes.clear();
        }
        reads.insert(c.src);
        writes.insert(c.dst);
    }
    if !copies.is_empty() {
        ends.push(copies.len());
    }
    ends
}

/// An LRU list of blocks threaded through the block table's rows
/// ([`LruLinks`]): O(1) push, removal and pop, touching only the rows
/// involved. Each tier has one; a row's tier says which list it is in.
#[derive(Debug, Default)]
pub struct BlockLru {
    head: Option<BlockId>,
    tail: Option<BlockId>,
    len: usize,
}

impl BlockLru {
    /// Blocks listed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no block is listed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `id` as the most recently used.
    pub fn push_back(&mut self, rows: &mut SlotMap<BlockId, KvBlock>, id: BlockId) {
        debug_assert!(!rows[id].lru.linked, "a block is listed at most once");
        rows[id].lru = LruLinks { prev: self.tail, next: None, linked: true };
        match self.tail {
            Some(t) => rows[t].lru.next = Some(id),
            None => self.head = Some(id),
        }
        self.tail = Some(id);
        self.len += 1;
    }

    /// Unlinks `id`; returns whether it was listed.
    pub fn remove(&mut self, rows: &mut SlotMap<BlockId, KvBlock>, id: BlockId) -> bool {
        let Some(b) = rows.get_mut(id) else { return false };
        if !b.lru.linked {
            return false;
        }
        let l = std::mem::take(&mut b.lru);
        match l.prev {
            Some(p) => rows[p].lru.next = l.next,
            None => self.head = l.next,
        }
        match l.next {
            Some(n) => rows[n].lru.prev = l.prev,
            None => self.tail = l.prev,
        }
        self.len -= 1;
        true
    }

    /// Unlinks and returns the least recently used block.
    pub fn pop_front(&mut self, rows: &mut SlotMap<BlockId, KvBlock>) -> Option<BlockId> {
        let id = self.head?;
        self.remove(rows, id);
        Some(id)
    }
}

/// Free pages and eviction order of each tier.
#[derive(Debug)]
pub struct BlockPool {
    /// Free device pages (a stack: the most recently freed page is reused first).
    pub free_device: Vec<u32>,
    /// Free host pages.
    pub free_host: Vec<u32>,
    /// Unreferenced indexed device blocks, least recently used first.
    pub lru_device: BlockLru,
    /// Indexed host blocks, least recently used first.
    pub lru_host: BlockLru,
    /// Device pages in all.
    pub pages_device: u32,
    /// Host pages in all.
    pub pages_host: u32,
}

impl BlockPool {
    fn new(pages_device: u32, pages_host: u32) -> Self {
        Self {
            // Reversed so that page 0 is handed out first, which keeps demos readable.
            free_device: (0..pages_device).rev().collect(),
            free_host: (0..pages_host).rev().collect(),
            lru_device: BlockLru::default(),
            lru_host: BlockLru::default(),
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
    pub fn lru(&mut self, medium: Medium) -> &mut BlockLru {
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

    /// The content of a block that must hold some (an indexed block).
    pub fn content_of(&self, id: BlockId) -> &BlockContent {
        self.blocks.content(id).expect("indexed blocks hold content")
    }

    fn content_of_mut(&mut self, id: BlockId) -> &mut BlockContent {
        self.blocks.content_mut(id).expect("indexed blocks hold content")
    }

    /// Whether a host tier exists.
    pub fn has_host_tier(&self) -> bool {
        self.pool.pages_host > 0
    }

    /// Takes a free page and makes a fresh unkeyed row with one reference.
    /// Returns `None` when the tier has no free page (the caller evicts first).
    pub fn take_free_block(&mut self, medium: Medium) -> Option<BlockId> {
        let page = self.pool.free(medium).pop()?;
        Some(self.blocks.rows.insert(KvBlock {
            page,
            medium,
            key: None,
            ref_count: 1,
            indexed: false,
            lru: LruLinks::default(),
            has_content: false,
        }))
    }

    /// Removes a row that is neither referenced, indexed nor in an LRU, and
    /// gives its page back.
    pub fn release_row(&mut self, id: BlockId) {
        self.remove_content(id);
        let b = self.blocks.rows.remove(id).expect("release_row takes a live block");
        debug_assert!(b.ref_count == 0 && !b.indexed, "only unreferenced, unindexed rows are released");
        self.pool.free(b.medium).push(b.page);
    }

    /// Drops a block's re-advertising content and its scope reference,
    /// unlinking it from its siblings.
    pub fn remove_content(&mut self, id: BlockId) {
        self.unlink_child(id);
        if let Some(scope) = self.blocks.take_content(id) {
            self.scopes.release(scope);
        }
    }

    /// The head of the children list of `parent` (a block, or the scope's
    /// root list), or `None` when that parent is gone or not indexed.
    fn children_head(&mut self, parent: Option<BlockId>, scope: ScopeId) -> Option<&mut Option<BlockId>> {
        match parent {
            Some(p) => self.blocks.content_mut(p).map(|c| &mut c.first_child),
            None => Some(self.scopes.root_children_mut(scope)),
        }
    }

    /// Links an indexed block at the head of its parent's children list, so
    /// that partial reuse can find it. A parent that is not indexed has no
    /// list: the block then stays unlinked.
    pub fn link_child(&mut self, id: BlockId, parent: Option<BlockId>) {
        let scope = self.content_of(id).scope;
        let Some(head) = self.children_head(parent, scope) else { return };
        let next = head.replace(id);
        if let Some(n) = next {
            let link = self.content_of_mut(n).link.as_mut().expect("listed blocks are linked");
            link.prev = Some(id);
        }
        self.content_of_mut(id).link = Some(SiblingLink { parent, prev: None, next });
    }

    /// Removes a block from its parent's children list, if it is in one.
    fn unlink_child(&mut self, id: BlockId) {
        let Some(c) = self.blocks.content_mut(id) else { return };
        let Some(link) = c.link.take() else { return };
        let scope = c.scope;
        if let Some(n) = link.next {
            self.content_of_mut(n).link.as_mut().expect("listed blocks are linked").prev = link.prev;
        }
        match link.prev {
            Some(p) => self.content_of_mut(p).link.as_mut().expect("listed blocks are linked").next = link.next,
            None => {
                if let Some(head) = self.children_head(link.parent, scope)
                    && *head == Some(id)
                {
                    *head = link.next;
                }
            }
        }
    }

    /// Indexed device blocks in the children list starting at `head`, at most `max`.
    pub fn children(&self, head: Option<BlockId>, max: usize) -> impl Iterator<Item = BlockId> + '_ {
        std::iter::successors(head, move |id| self.content_of(*id).link.and_then(|l| l.next)).take(max)
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
    /// 5. Sibling lists are well formed: links are symmetric, a head is
    ///    the head of its parent's list, and every list member names it.
    pub fn check_invariants(&self) {
        let mut used = [0usize; 2];
        let mut seen = ahash::AHashSet::new();
        for (id, b) in &self.blocks.rows {
            used[b.medium as usize] += 1;
            assert!(seen.insert((b.medium, b.page)), "invariant 1: page {:?}/{} used twice", b.medium, b.page);
            let in_lru = b.lru.linked;
            assert_eq!(in_lru, b.indexed && b.ref_count == 0, "invariant 2: LRU membership of {id:?}");
            if b.medium == Medium::Cpu {
                assert!(b.indexed && b.ref_count == 0, "invariant 2: host blocks are indexed and unreferenced");
            }
            if b.indexed {
                let key = b.key.expect("invariant 3: indexed blocks have keys");
                assert_eq!(self.index.map.get(&key), Some(&id), "invariant 3: index entry of {id:?}");
            }
            assert_eq!(b.has_content, b.indexed, "invariant 4: content of {id:?}");
        }
        assert_eq!(used[0] + self.pool.free_device.len(), self.pool.pages_device as usize, "invariant 1: device pages");
        assert_eq!(used[1] + self.pool.free_host.len(), self.pool.pages_host as usize, "invariant 1: host pages");
        for (id, c) in self.blocks.contents() {
            let Some(link) = c.link else { continue };
            if let Some(n) = link.next {
                assert_eq!(self.content_of(n).link.and_then(|l| l.prev), Some(id), "invariant 5: next.prev of {id:?}");
                assert_eq!(
                    self.content_of(n).link.map(|l| l.parent),
                    Some(link.parent),
                    "invariant 5: siblings share a parent"
                );
            }
            match link.prev {
                Some(p) => assert_eq!(
                    self.content_of(p).link.and_then(|l| l.next),
                    Some(id),
                    "invariant 5: prev.next of {id:?}"
                ),
                None => {
                    let head = match link.parent {
                        Some(p) => self.blocks.content(p).map(|pc| pc.first_child),
                        None => Some(*self.scopes.root_children(c.scope)),
                    };
                    if let Some(head) = head {
                        assert_eq!(head, Some(id), "invariant 5: a list's first member is its head");
                    }
                }
            }
            if let Some(first) = c.first_child {
                let l = self.content_of(first).link.expect("invariant 5: a head is linked");
                assert_eq!((l.parent, l.prev), (Some(id), None), "invariant 5: head names its parent");
            }
        }
        for (key, id) in &self.index.map {
            let b = self.blocks.rows.get(*id).expect("invariant 3: index names a live block");
            assert!(b.indexed && b.key == Some(*key), "invariant 3: index entry matches its block");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(src: (Medium, u32), dst: (Medium, u32)) -> BlockCopy {
        BlockCopy {
            src: PageRef { medium: src.0, page: src.1 },
            dst: PageRef { medium: dst.0, page: dst.1 },
            tokens: 1,
        }
    }

    /// Independent copies share one wave; an onboard into a page that an
    /// offload of the same step reads, or a chain through one page, splits.
    #[test]
    fn waves_split_only_at_hazards() {
        use Medium::{Cpu, Gpu};
        assert_eq!(copy_waves(&[]), Vec::<usize>::new());
        assert_eq!(copy_waves(&[copy((Gpu, 1), (Cpu, 1)), copy((Gpu, 2), (Cpu, 2))]), vec![2]);
        // Offload reads GPU page 1; onboard writes GPU page 1: write-after-read.
        assert_eq!(copy_waves(&[copy((Gpu, 1), (Cpu, 1)), copy((Cpu, 9), (Gpu, 1))]), vec![1, 2]);
        // A copy reading what the previous one wrote: read-after-write.
        assert_eq!(copy_waves(&[copy((Cpu, 9), (Gpu, 3)), copy((Gpu, 3), (Gpu, 4))]), vec![1, 2]);
        // Two writes to one page: write-after-write.
        assert_eq!(
            copy_waves(&[copy((Gpu, 1), (Gpu, 5)), copy((Gpu, 2), (Gpu, 5)), copy((Gpu, 7), (Gpu, 8))]),
            vec![1, 3]
        );
    }
}
