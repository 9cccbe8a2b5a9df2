//! The KV block table.
//!
//! A row is one allocation of a physical page in one tier. Rows are inserted
//! when a page is taken and removed when it is given back, so a [`BlockId`]
//! held past a block's eviction is stale. Token ids of keyed blocks live in a
//! flat arena indexed by page (allocated once at creation), because an
//! advertised block must be re-advertisable (offload, onboard, snapshot) after
//! the request that wrote it is gone.

use slotmap::SlotMap;

use crate::ids::{BlockId, ScopeId};
use crate::keys::{BlockKey, ImageRun};
use crate::tier::Tier;

/// A KV block row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvBlock {
    /// Page index within its tier's pool.
    pub page: u32,
    /// Its tier.
    pub medium: Tier,
    /// Set once every token of the block is computed (never for dummy requests
    /// or with block reuse off).
    pub key: Option<BlockKey>,
    /// Live references from requests.
    pub ref_count: u32,
    /// Whether this block is the prefix index's copy of its key (advertised and
    /// matchable). A keyed block that is not indexed is a private duplicate.
    pub indexed: bool,
    /// Whether the block's page slot holds its re-advertising content (set
    /// while indexed; see [`KvBlocks::content`]).
    pub has_content: bool,
    /// The block's place in its tier's LRU list, whose head the block pool (a
    /// resource) keeps: the links live in the row so that listing a block
    /// writes the row it already touches instead of a side table.
    pub lru: LruLinks,
}

/// A block's links in its tier's LRU list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LruLinks {
    /// The block used just before (towards the list's front).
    pub prev: Option<BlockId>,
    /// The block used just after (towards the back).
    pub next: Option<BlockId>,
    /// Whether the block is in a list at all.
    pub linked: bool,
}

/// What an indexed block needs to be advertised again without its request.
#[derive(Clone, Debug, Default)]
pub struct BlockContent {
    /// The parent key; `None` for the first block of a chain.
    pub parent: Option<BlockKey>,
    /// Position of the block in its chain (0 for the first).
    pub depth: u32,
    /// LoRA and salt of the chain.
    pub scope: ScopeId,
    /// Image runs inside the block, in block order. A page slot whose block
    /// holds no content has none (dropping content clears them), so that
    /// indexing a text block writes nothing here.
    pub images: BlockImageRuns,
}

/// A block's places in the sibling lists of partial reuse: the indexed
/// blocks that extend the same parent form a list, headed by the parent's
/// `first_child` (or the scope's root list for first blocks). Kept apart
/// from [`BlockContent`], in a column of its own, because a cache without
/// partial reuse never writes it: indexing a block there leaves it as it
/// was made (unlinked, no children).
#[derive(Clone, Copy, Debug, Default)]
pub struct Siblings {
    /// The block's link in its parent's list; `None` when not linked.
    pub link: Option<SiblingLink>,
    /// Head of this block's list of indexed children.
    pub first_child: Option<BlockId>,
}

/// A block's image runs, kept inline when there is at most one (every block
/// that lies inside a single image), so that committing an image block does
/// not allocate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BlockImageRuns {
    /// A text-only block.
    #[default]
    None,
    /// One run.
    One(ImageRun),
    /// Two or more runs.
    Many(Vec<ImageRun>),
}

impl BlockImageRuns {
    /// Copies `runs`, allocating only for two or more.
    pub fn from_slice(runs: &[ImageRun]) -> Self {
        match runs {
            [] => Self::None,
            [one] => Self::One(*one),
            many => Self::Many(many.to_vec()),
        }
    }

    /// The runs, in block order.
    pub fn as_slice(&self) -> &[ImageRun] {
        match self {
            Self::None => &[],
            Self::One(run) => std::slice::from_ref(run),
            Self::Many(runs) => runs,
        }
    }
}

/// A block's place in its parent's list of children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiblingLink {
    /// The parent block (`None`: the chain's root, listed in the scope).
    pub parent: Option<BlockId>,
    /// Previous sibling (`None`: this block is the head).
    pub prev: Option<BlockId>,
    /// Next sibling.
    pub next: Option<BlockId>,
}

/// The index of a page in the per-page columns: device pages first, then
/// host pages.
fn page_slot(pages_device: usize, medium: Tier, page: u32) -> usize {
    match medium {
        Tier::Device => page as usize,
        Tier::Host => pages_device + page as usize,
    }
}

/// The KV block table.
///
/// Token ids and re-advertising content are kept by page slot (device pages
/// first, then host pages), in flat arrays allocated at creation: committing a
/// block writes them in place instead of inserting into a map, and a tier move
/// moves them to the new page. A slot's content is meaningful only while the
/// row on that page has `has_content` set.
#[derive(Debug)]
pub struct KvBlocks {
    /// Rows.
    pub rows: SlotMap<BlockId, KvBlock>,
    /// Re-advertising content by page slot.
    content: Vec<BlockContent>,
    /// Sibling lists by page slot (written only by a cache with partial
    /// reuse).
    siblings: Vec<Siblings>,
    /// Token ids of blocks by page slot.
    tokens: Vec<u32>,
    block_size: usize,
    pages_device: usize,
}

impl KvBlocks {
    /// A table for `pages_device + pages_host` pages of `block_size` tokens,
    /// or `None` when that memory cannot be allocated. The token column is
    /// allocated zeroed, so its pages cost memory only once written.
    pub fn try_new(block_size: u32, pages_device: u32, pages_host: u32) -> Option<Self> {
        let pages = pages_device as usize + pages_host as usize;
        let mut rows = SlotMap::with_key();
        rows.try_reserve(pages).ok()?;
        let mut content = Vec::new();
        content.try_reserve_exact(pages).ok()?;
        content.resize(pages, BlockContent::default());
        let mut siblings = Vec::new();
        siblings.try_reserve_exact(pages).ok()?;
        siblings.resize(pages, Siblings::default());
        let tokens = bytemuck::allocation::try_zeroed_vec(pages.checked_mul(block_size as usize)?).ok()?;
        Some(Self {
            rows,
            content,
            siblings,
            tokens,
            block_size: block_size as usize,
            pages_device: pages_device as usize,
        })
    }

    fn slot(&self, medium: Tier, page: u32) -> usize {
        page_slot(self.pages_device, medium, page)
    }

    fn page_range(&self, medium: Tier, page: u32) -> std::ops::Range<usize> {
        let slot = self.slot(medium, page);
        slot * self.block_size..(slot + 1) * self.block_size
    }

    /// The re-advertising content of a block, `None` when the id is stale or
    /// the block holds none (not indexed).
    pub fn content(&self, id: BlockId) -> Option<&BlockContent> {
        let b = self.rows.get(id)?;
        b.has_content.then(|| &self.content[self.slot(b.medium, b.page)])
    }

    /// A block's sibling lists; `None` as for [`KvBlocks::content`].
    pub fn siblings(&self, id: BlockId) -> Option<&Siblings> {
        let b = self.rows.get(id)?;
        b.has_content.then(|| &self.siblings[self.slot(b.medium, b.page)])
    }

    /// Mutable access to a block's sibling lists; `None` as for
    /// [`KvBlocks::content`].
    pub fn siblings_mut(&mut self, id: BlockId) -> Option<&mut Siblings> {
        let b = self.rows.get(id)?;
        let slot = self.slot(b.medium, b.page);
        b.has_content.then(|| &mut self.siblings[slot])
    }

    /// Every block that holds content, with it.
    pub fn contents(&self) -> impl Iterator<Item = (BlockId, &BlockContent)> + '_ {
        self.rows.iter().filter(|(_, b)| b.has_content).map(|(id, b)| (id, &self.content[self.slot(b.medium, b.page)]))
    }

    /// Writes what the block on page `page` of `medium` keeps once indexed,
    /// in place in its page slot (found once for both): its token ids, and
    /// its content; with `siblings` (a cache with partial reuse), its sibling
    /// lists, unlinked and with no children (a cache without never writes
    /// them). The caller sets the row's `has_content` (it holds the row
    /// already). The slot holds no content before: its image runs are none
    /// already, so a text block's are not written.
    #[inline(always)]
    #[allow(clippy::too_many_arguments, reason = "one block's columns, written in one go from its page slot")]
    pub fn set_indexed(
        &mut self,
        (medium, page): (Tier, u32),
        tokens: &[u32],
        parent: Option<BlockKey>,
        depth: u32,
        scope: ScopeId,
        images: &[ImageRun],
        siblings: bool,
    ) {
        let slot = page_slot(self.pages_device, medium, page);
        crate::copy::copy_block(&mut self.tokens[slot * self.block_size..(slot + 1) * self.block_size], tokens);
        let c = &mut self.content[slot];
        c.parent = parent;
        c.depth = depth;
        c.scope = scope;
        debug_assert!(c.images == BlockImageRuns::None, "a slot without content holds no image runs");
        if !images.is_empty() {
            c.images = BlockImageRuns::from_slice(images);
        }
        if siblings {
            self.siblings[slot] = Siblings::default();
        }
    }

    /// Drops a block's content (the caller unlinked it first) and returns
    /// its scope, whose reference the caller gives back. `None` when the
    /// block holds no content.
    pub fn take_content(&mut self, id: BlockId) -> Option<ScopeId> {
        let b = self.rows.get_mut(id)?;
        if !b.has_content {
            return None;
        }
        b.has_content = false;
        let slot = page_slot(self.pages_device, b.medium, b.page);
        debug_assert!(self.siblings[slot].link.is_none(), "content is unlinked before it is dropped");
        let c = &mut self.content[slot];
        c.images = BlockImageRuns::None;
        Some(c.scope)
    }

    /// Drops the content of a row already taken out of the table (`block`,
    /// which held content: `has_content`) and returns its sibling link, for the caller to
    /// unlink, and its scope, whose reference the caller gives back.
    pub fn take_content_of_taken(&mut self, block: &KvBlock) -> (Option<SiblingLink>, ScopeId) {
        debug_assert!(block.has_content, "the taken row held content");
        let slot = self.slot(block.medium, block.page);
        let c = &mut self.content[slot];
        c.images = BlockImageRuns::None;
        (self.siblings[slot].link.take(), c.scope)
    }

    /// Token ids stored for a block (meaningful once keyed).
    pub fn tokens(&self, block: &KvBlock) -> &[u32] {
        &self.tokens[self.page_range(block.medium, block.page)]
    }

    /// Moves a block's token ids and content between pages (tier moves).
    pub fn move_page(&mut self, from: (Tier, u32), to: (Tier, u32)) {
        let src = self.page_range(from.0, from.1);
        let dst = self.page_range(to.0, to.1).start;
        self.tokens.copy_within(src, dst);
        let (a, b) = (self.slot(from.0, from.1), self.slot(to.0, to.1));
        self.content.swap(a, b);
        self.siblings.swap(a, b);
    }
}
