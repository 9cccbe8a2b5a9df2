//! The block side of the engine as one resource, [`KvCache`]: the block
//! table, the block pool (free pages and LRUs per tier), the prefix index, the
//! scopes that advertised blocks name, and the copies queued this step.
//!
//! Why one owner with verbs: a block's row, its page, its place in an LRU, its
//! index entry, its sibling links, its scope reference and the events that
//! advertise it must change together, or the invariants
//! ([`KvCache::check_invariants`]) break between two calls. So every field is
//! private, systems read through accessors, and every change is a verb that
//! takes what it must keep consistent and fixes it in the same call (the
//! shape of rapier's `RigidBodySet::remove`, which takes the islands,
//! colliders and joints it must update). Systems keep the policy: what to
//! match, which source to copy, how much room to make, when to evict.
//!
//! | verb | what it keeps in step |
//! |---|---|
//! | [`KvCache::acquire`] | reference count and LRU: the first reference takes a cached block out of its tier's LRU, so nothing evicts it |
//! | [`KvCache::release`], [`KvCache::release_rev`] | reference count, LRU, pool: the last reference lists a cached block at the back of its tier's LRU, or frees an uncached block's row and page |
//! | [`KvCache::take_free_block`], [`KvCache::take_free_device_blocks`] | pool and table: a page (or, in one pass, several free device pages) leaves the free list as a fresh row with one reference |
//! | [`KvCache::index_block`] | key, index entry, tokens, content, scope reference, sibling list: all or none (or in two halves, [`KvCache::enter_index`] then [`KvCache::complete_index`], with no other verb between them) |
//! | [`KvCache::move_block`] | a tier move: new page, tokens and content moved, LRU membership switched, the copy queued (its pages marked), the old page freed (cooling), `Removed` and `Stored` queued |
//! | [`KvCache::drop_block`] | index entry, LRU, content, scope reference, siblings, row and page go together; `Removed` queued |
//! | [`KvCache::queue_prefix_copy`] | a partial-reuse copy between two live blocks' pages, its pages marked |
//! | [`KvCache::clear`] | every index entry dropped; unreferenced blocks freed, referenced ones kept as private copies; `AllBlocksCleared` queued |
//! | [`KvCache::reserve_copies`] | room set aside in the step's bounded copy list for an admission's onboards and partial-reuse copy, before its evictions may offload |
//! | [`KvCache::close_step`] | the step's copies handed out as the free pages settle |
//! | [`KvCache::acquire_scope`], [`KvCache::release_scope`] | a request's reference on its interned scope |
//!
//! A pin (the partial-reuse source held while admission may evict) is an
//! [`KvCache::acquire`] that no request holds, given back with
//! [`KvCache::release`] before admission returns.
//!
//! The replacement policy built on these verbs (eviction, offload or drop,
//! onboarding, making room) is in `eviction.rs`, which reaches no field.
//!
//! Every verb is O(1) per block (`clear`: O(n log n) in the index entries,
//! which it sorts) and allocates nothing beyond the events and copies it
//! queues.
//!
//! The prefix index is a hash table of block ids, hashed by their keys with
//! ahash and a random seed per cache. Nothing that the cache decides may
//! follow its iteration order: lookups and inserts only, except `clear`,
//! which sorts what it drains, and `indexed`, whose callers sort or only
//! count.
//!
//! The index holds ids alone (8 bytes a bucket, not the 40 of a key and its
//! id): the key is in the block's row already, and a lookup that finds a
//! candidate reads that row to compare keys, a row its caller reads next
//! anyway. Inserting a committed block and removing an evicted one then
//! touch a table a fifth the size, which stays in the fastest cache.

use ahash::RandomState;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use super::block_pool::BlockPool;
use super::{BlockCopy, PageRef, Scopes};
use crate::events::{BlockStored, EventQueue};
use crate::group::{GroupKind, KvGroup};
use crate::ids::{BlockId, ScopeId};
use crate::keys::{BlockKey, ImageRun};
use crate::tables::{BlockContent, KvBlock, KvBlocks, LruLinks, RequestScope, SiblingLink, Siblings};
use crate::tier::Tier;

/// A key's hash in the index: the seeded hasher over the key's first 8
/// bytes, one word to mix instead of 32 bytes and a length. A key is a
/// SHA-256 output, so those bytes are as spread as the whole key. Callers
/// cannot aim keys at the table's buckets: they choose inputs, not digests,
/// and the seed is random; keys that share all 8 bytes (about 2^32 hashes
/// for one pair) still differ in the full comparison.
#[inline]
fn index_hash(hasher: &RandomState, key: &BlockKey) -> u64 {
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&key.0[..8]);
    hasher.hash_one(u64::from_le_bytes(prefix))
}

/// The block side of the engine: table, pool, index, scopes and pending
/// copies, changed only through its verbs (see the module docs).
#[derive(Debug)]
pub struct KvCache {
    /// The block table.
    blocks: KvBlocks,
    /// Free pages and LRUs.
    pool: BlockPool,
    /// The one indexed (advertised, matchable) block of each cached key, by
    /// the key in its row (see the module docs). In-memory only, never on
    /// the wire.
    index: HashTable<BlockId>,
    /// The index's hasher: ahash with a random seed, over the first 8 bytes
    /// of a key ([`index_hash`]).
    index_hasher: RandomState,
    /// Copies queued this step, at most `copies_max`.
    copies: Vec<BlockCopy>,
    /// The bound on `copies` (`EngineConfig::copies_per_step_max`).
    copies_max: usize,
    /// Copies an admission has room set aside for (its onboards and its
    /// partial-reuse copy), which its evictions may not take; 0 between calls.
    copies_reserved: usize,
    /// Tokens per block.
    block_size: u32,
    /// Scopes of requests and advertised blocks.
    scopes: Scopes,
    /// [`KvCache::clear`]'s list of the blocks it releases, sorted; kept
    /// empty between calls, its capacity reserved once.
    cleared: Vec<BlockId>,
    /// The group this cache holds the blocks of, when the engine names its
    /// groups (a configuration with a group list); `None` for the one group
    /// of an engine that does not, whose events name no group.
    group: Option<KvGroup>,
    /// The device page a sliding-window group reserves as its null page
    /// (page 0): never handed out, named by block tables for the blocks a
    /// request released early, as vLLM's null block. `None` for full
    /// attention.
    null_page: Option<u32>,
}

/// A block that [`KvCache::enter_index`] gave its key and index entry, whose
/// tokens and content [`KvCache::complete_index`] still has to write.
#[must_use = "an entered block is completed before any other verb runs"]
#[derive(Debug)]
pub struct Entered {
    id: BlockId,
    medium: Tier,
    page: u32,
}

/// A block whose every token is computed, as its request knows it: what
/// [`KvCache::index_block`] needs to index it and to advertise it again
/// later without the request.
#[derive(Clone, Copy, Debug)]
pub struct CommittedBlock<'a> {
    /// The block's key.
    pub key: &'a BlockKey,
    /// The parent's key; `None` for the first block of a chain.
    pub parent: Option<&'a BlockKey>,
    /// The request's previous block, whose children list the block joins;
    /// `None` for a first block, which joins its scope's root list.
    pub parent_block: Option<BlockId>,
    /// Position of the block in its chain (0 for the first).
    pub depth: u32,
    /// The request's scope (LoRA and salt).
    pub scope: ScopeId,
    /// The keyed token ids (placeholder at image positions), one block's worth.
    pub tokens: &'a [u32],
    /// Image runs inside the block, in block order.
    pub images: &'a [ImageRun],
}

/// Reads: ids given here must be live (held by a request, or in the index),
/// as every caller's are; a stale one is a broken invariant and panics.
impl KvCache {
    /// A cache with every page free, all capacity reserved now, or `None`
    /// when that memory cannot be allocated. At most `copies_max` copies are
    /// queued between two steps (see [`KvCache::copy_room`]).
    ///
    /// The events it queues name `group` (when the engine names groups); a
    /// sliding window reserves device page 0 as its null page.
    pub fn try_new_group(
        block_size: u32,
        pages_device: u32,
        pages_host: u32,
        copies_max: usize,
        group: Option<KvGroup>,
        kind: GroupKind,
    ) -> Option<Self> {
        let windowed = matches!(kind, GroupKind::SlidingWindow { .. });
        let mut pool = BlockPool::new(pages_device, pages_host);
        let null_page = if windowed {
            let page = pool.free(Tier::Device).pop();
            debug_assert_eq!(page, Some(0), "a fresh device stack hands out page 0 first");
            page
        } else {
            None
        };
        let total = (pages_device + pages_host) as usize;
        let blocks = KvBlocks::try_new(block_size, pages_device, pages_host)?;
        let index_hasher = RandomState::new();
        let mut index = HashTable::new();
        // Empty: the rehash that a reservation may make reads no row.
        index.try_reserve(total, |_: &BlockId| 0).ok()?;
        Some(Self {
            blocks,
            pool,
            index,
            index_hasher,
            copies: Vec::with_capacity(copies_max.min(1 << 16)),
            copies_max,
            copies_reserved: 0,
            block_size,
            scopes: Scopes::default(),
            cleared: {
                let mut cleared = Vec::new();
                cleared.try_reserve(total).ok()?;
                cleared
            },
            group,
            null_page,
        })
    }

    /// The null page of a sliding-window group (page 0), `None` for full
    /// attention.
    pub fn null_page(&self) -> Option<u32> {
        self.null_page
    }

    /// The group this cache holds, as its events name it (`None` when the
    /// engine names no group).
    pub fn group(&self) -> Option<KvGroup> {
        self.group
    }

    /// The group's index in the engine (0 when the engine names no group).
    pub fn group_index(&self) -> u32 {
        self.group.map_or(0, |g| g.index)
    }

    /// Device pages in all, the null page included.
    pub fn pages_device(&self) -> u32 {
        self.pool.pages(Tier::Device)
    }

    /// A live block's row.
    pub fn block(&self, id: BlockId) -> &KvBlock {
        &self.blocks.rows[id]
    }

    /// Every block row, in no particular order.
    pub fn blocks(&self) -> impl Iterator<Item = (BlockId, &KvBlock)> + '_ {
        self.blocks.rows.iter()
    }

    /// The token ids stored for a block (meaningful once keyed).
    pub fn tokens(&self, block: &KvBlock) -> &[u32] {
        self.blocks.tokens(block)
    }

    /// The content of a block that must hold some (an indexed block).
    pub fn content_of(&self, id: BlockId) -> &BlockContent {
        self.blocks.content(id).expect("indexed blocks hold content")
    }

    /// A block's sibling lists, `None` when it holds no content (not
    /// indexed) or the id is stale.
    pub fn siblings(&self, id: BlockId) -> Option<&Siblings> {
        self.blocks.siblings(id)
    }

    /// The sibling lists of a block that must hold content (an indexed
    /// block); never linked in a cache without partial reuse.
    pub fn siblings_of(&self, id: BlockId) -> &Siblings {
        self.blocks.siblings(id).expect("indexed blocks hold content")
    }

    /// Every block that holds content, with it.
    pub fn contents(&self) -> impl Iterator<Item = (BlockId, &BlockContent)> + '_ {
        self.blocks.contents()
    }

    /// The indexed block that holds `key`, if it is cached.
    pub fn lookup(&self, key: &BlockKey) -> Option<BlockId> {
        let rows = &self.blocks.rows;
        self.index.find(index_hash(&self.index_hasher, key), |&id| rows[id].key.as_ref() == Some(key)).copied()
    }

    /// Every index entry (cached key and its block), in the index's hash
    /// order, which changes with its seed: callers sort what they hand out
    /// or decide on (see the module docs).
    pub fn indexed(&self) -> impl ExactSizeIterator<Item = (&BlockKey, BlockId)> + '_ {
        let rows = &self.blocks.rows;
        self.index.iter().map(move |&id| (rows[id].key.as_ref().expect("indexed blocks have keys"), id))
    }

    /// The scope table (read only: scope references change with requests
    /// and indexed blocks, through the verbs).
    pub fn scopes(&self) -> &Scopes {
        &self.scopes
    }

    /// Whether a host tier exists.
    pub fn has_host_tier(&self) -> bool {
        self.pool.pages(Tier::Host) > 0
    }

    /// Free pages of a tier, cooling ones included.
    pub fn free_pages(&self, medium: Tier) -> usize {
        self.pool.free_ref(medium).len()
    }

    /// Blocks in a tier's LRU: the unreferenced cached device blocks, or
    /// every cached host block.
    pub fn lru_len(&self, medium: Tier) -> usize {
        self.pool.lru_ref(medium).len()
    }

    /// The least recently used block of a tier's LRU (the next to evict).
    pub fn lru_front(&self, medium: Tier) -> Option<BlockId> {
        self.pool.lru_ref(medium).front()
    }

    /// Copies queued this step.
    pub fn copies_queued(&self) -> usize {
        self.copies.len()
    }

    /// Copies that may still be queued this step beyond those set aside
    /// ([`KvCache::reserve_copies`]): what an offload or a new reservation
    /// may take.
    pub fn copy_room(&self) -> usize {
        self.copies_max - self.copies.len() - self.copies_reserved
    }

    /// Whether a copy queued this step reads or writes `page`.
    pub fn copy_touches(&self, page: PageRef) -> bool {
        self.pool.free_ref(page.medium).is_touched(page.page)
    }

    /// Device blocks that an allocation could get now: free pages plus
    /// unreferenced cached blocks.
    pub fn device_blocks_available(&self) -> usize {
        self.free_pages(Tier::Device) + self.lru_len(Tier::Device)
    }

    /// Indexed device blocks in the children list starting at `head`, at most `max`.
    pub fn children(&self, head: Option<BlockId>, max: usize) -> impl Iterator<Item = BlockId> + '_ {
        std::iter::successors(head, move |id| self.siblings_of(*id).link.and_then(|l| l.next)).take(max)
    }

    /// The `BlockStored` event that advertises one indexed block again (after
    /// a tier move, or in a snapshot), built from its retained content.
    pub fn stored_event(&self, id: BlockId) -> BlockStored {
        let b = &self.blocks.rows[id];
        let content = self.content_of(id);
        let mut e = BlockStored::start(content.parent, self.block_size, b.medium, self.scopes.get(content.scope), 1);
        e.push_block(b.key.expect("indexed blocks have keys"), self.blocks.tokens(b), content.images.as_slice());
        e.group = self.group;
        e
    }
}

/// The verbs. Each leaves every invariant of [`KvCache::check_invariants`]
/// holding, except that a pinned or matched host block holds a reference
/// until its onboard in the same admission (invariant 2 holds again by then).
impl KvCache {
    /// Takes a reference on `scope` for a request, interning it if new.
    pub fn acquire_scope(&mut self, scope: RequestScope) -> ScopeId {
        self.scopes.acquire(scope)
    }

    /// Gives back a request's reference on its scope; the scope is
    /// forgotten when no request and no indexed block names it any more.
    pub fn release_scope(&mut self, scope: ScopeId) {
        self.scopes.release(scope);
    }

    /// Takes one reference on a live block (a request's, or a pin). The
    /// first reference takes a cached block out of its tier's LRU: nothing
    /// evicts it, and a host block stays put until it is onboarded.
    pub fn acquire(&mut self, id: BlockId) {
        let row = &mut self.blocks.rows[id];
        row.ref_count += 1;
        if row.ref_count == 1 {
            let medium = row.medium;
            self.pool.lru(medium).remove(&mut self.blocks.rows, id);
        }
    }

    /// [`KvCache::release`] for each of `ids`, last to first (so that a
    /// chain's deepest block is listed first, the first to be evicted), in
    /// one loop.
    pub fn release_rev(&mut self, ids: &[BlockId]) {
        for &id in ids.iter().rev() {
            self.release(id);
        }
    }

    /// Gives back one reference. The last one lists a cached block as the
    /// most recently used of its tier's LRU (it stays matchable until
    /// evicted), or frees an uncached block's row and page.
    #[inline]
    pub fn release(&mut self, id: BlockId) {
        let row = &mut self.blocks.rows[id];
        row.ref_count -= 1;
        if row.ref_count == 0 {
            if row.indexed {
                let medium = row.medium;
                self.pool.lru(medium).push_back(&mut self.blocks.rows, id);
            } else {
                self.release_row(id);
            }
        }
    }

    /// Takes a free page and makes a fresh unkeyed row with one reference.
    /// `copy_target`: a copy will write the page this step (partial reuse),
    /// so it should not be one a queued copy reads (see the block pool's
    /// cooling pages). Returns `None` when the tier has no free page (the
    /// caller evicts first).
    pub fn take_free_block(&mut self, medium: Tier, copy_target: bool) -> Option<BlockId> {
        let free = self.pool.free(medium);
        let page = if copy_target { free.pop() } else { free.pop_for_compute() }?;
        Some(self.blocks.rows.insert(fresh_row(medium, page)))
    }

    /// [`KvCache::take_free_block`] on the device tier `n` times, for fresh
    /// blocks (no copy writes them), appending them to `out`: one pass over
    /// the free pages and the table. The tier has `n` free pages; the
    /// caller has reserved room for `n` more in `out`.
    pub fn take_free_device_blocks(&mut self, n: usize, out: &mut Vec<BlockId>) {
        let rows = &mut self.blocks.rows;
        self.pool
            .free(Tier::Device)
            .pop_many_for_compute(n, |page| out.push(rows.insert(fresh_row(Tier::Device, page))));
    }

    /// Gives a computed block its key and, unless it already had one or the
    /// key is cached already, makes it the index's copy of the key: the
    /// entry, its tokens, its re-advertising content, a reference on its
    /// scope and (with `link_siblings`) its place in its parent's children
    /// list for partial reuse, all in this one call. Returns whether it was
    /// indexed; the caller advertises it (commit puts a chain's blocks in one
    /// `BlockStored`). A block left unindexed is a private copy, freed with
    /// its last reference.
    #[inline]
    pub fn index_block(&mut self, id: BlockId, block: &CommittedBlock<'_>, link_siblings: bool) -> bool {
        match self.enter_index(id, block.key) {
            Some(entered) => {
                self.complete_index(entered, block, link_siblings);
                true
            }
            None => false,
        }
    }

    /// The first half of [`KvCache::index_block`], for a caller that runs
    /// other work between the halves: gives block `id` its key and, unless
    /// it had one already or the key is cached, its index entry. The
    /// [`Entered`] it returns must go to [`KvCache::complete_index`] before
    /// any other verb runs, which writes the rest.
    #[inline(always)]
    pub fn enter_index(&mut self, id: BlockId, key: &BlockKey) -> Option<Entered> {
        let row = &mut self.blocks.rows[id];
        if row.key.is_some() {
            // A block matched at admission.
            return None;
        }
        // Set as if indexed, in this one lookup of the row, and undone in
        // the rare case that another block holds the key.
        row.key = Some(*key);
        row.indexed = true;
        row.has_content = true;
        let (medium, page) = (row.medium, row.page);
        let (rows, hasher) = (&mut self.blocks.rows, &self.index_hasher);
        let entry = self.index.entry(
            index_hash(hasher, key),
            |&other| rows[other].key.as_ref() == Some(key),
            |&other| index_hash(hasher, rows[other].key.as_ref().expect("indexed blocks have keys")),
        );
        match entry {
            Entry::Vacant(v) => v.insert(id),
            // A private copy of a cached key.
            Entry::Occupied(_) => {
                let row = &mut rows[id];
                (row.indexed, row.has_content) = (false, false);
                return None;
            }
        };
        Some(Entered { id, medium, page })
    }

    /// The second half of [`KvCache::index_block`]: the entered block's
    /// tokens, content, scope reference and (with `link_siblings`) sibling
    /// place.
    #[inline(always)]
    pub fn complete_index(&mut self, entered: Entered, block: &CommittedBlock<'_>, link_siblings: bool) {
        let Entered { id, medium, page } = entered;
        self.blocks.set_indexed(
            (medium, page),
            block.tokens,
            block.parent.copied(),
            block.depth,
            block.scope,
            block.images,
            link_siblings,
        );
        self.scopes.retain(block.scope, 1);
        // A parent that is not the indexed copy of its key has no list
        // (`link_child` leaves the block unlinked then).
        if link_siblings {
            self.link_child(id, block.parent_block);
        }
    }

    /// Sets room aside for `n` copies that an admission is about to queue
    /// (its onboards and its partial-reuse copy), so that the evictions it
    /// makes room with offload only into what is left. Each onboard and
    /// partial-reuse copy takes one back; the admission queues all of them.
    pub fn reserve_copies(&mut self, n: usize) {
        assert!(n <= self.copy_room(), "admission checked the copy room");
        self.copies_reserved += n;
    }

    /// Moves an indexed block to a free page of the other tier (an offload
    /// or an onboard): its tokens and content move with it, it leaves its old
    /// tier's LRU and, unless referenced, joins the new tier's at the back,
    /// the copy is queued (its pages marked, so the old page, freed last,
    /// cools until the step closes), and `Removed` from the old tier then
    /// `Stored` in the new one are queued. The block keeps its id, so its
    /// index entry stays as it is. Returns `false`, changing nothing, when
    /// the tier has no free page.
    pub fn move_block(&mut self, id: BlockId, to: Tier, events: &mut EventQueue) -> bool {
        let Some(page) = self.pool.free(to).pop() else { return false };
        let row = &mut self.blocks.rows[id];
        debug_assert!(row.indexed && row.medium != to, "only indexed blocks move, to the other tier");
        let key = row.key.expect("indexed blocks have keys");
        let from = PageRef { medium: row.medium, page: row.page };
        let dst = PageRef { medium: to, page };
        let listed_after = row.ref_count == 0;
        row.medium = to;
        row.page = page;
        self.pool.lru(from.medium).remove(&mut self.blocks.rows, id);
        self.blocks.move_page((from.medium, from.page), (dst.medium, dst.page));
        // An onboard's copy was set aside by its admission; an offload's
        // was checked against the room by its eviction.
        self.queue_copy(
            BlockCopy { src: from, dst, tokens: self.block_size, group: self.group_index() },
            to == Tier::Device,
        );
        self.pool.free(from.medium).release(from.page);
        if listed_after {
            self.pool.lru(to).push_back(&mut self.blocks.rows, id);
        }
        events.push_removed_in(key, from.medium, self.group);
        if events.enabled() {
            events.push_stored(self.stored_event(id));
        }
        true
    }

    /// Drops a cached, unreferenced block from the cache entirely: its index
    /// entry, its LRU place, its content (sibling links and scope reference
    /// with it), its row and its page, and queues `Removed` in its tier.
    ///
    /// The row leaves the table first, in one lookup (evictions drop many
    /// blocks in a row); its links, index entry, content and page are then
    /// released from the row taken out, as `release_row` does.
    pub fn drop_block(&mut self, id: BlockId, events: &mut EventQueue) {
        let b = self.blocks.rows.remove(id).expect("dropped blocks are live");
        debug_assert!(b.indexed && b.ref_count == 0, "only cached, unreferenced blocks are dropped");
        if b.lru.linked {
            self.pool.lru(b.medium).unlink(&mut self.blocks.rows, b.lru);
        }
        let key = self.forget_taken(id, &b);
        events.push_removed_in(key, b.medium, self.group);
    }

    /// Releases what the row of a cached block, already taken out of the
    /// table, held: its index entry, then its content and page
    /// (`release_taken_row`). Returns its key, for the removal event. Its
    /// LRU place is the caller's to unlink.
    #[inline(always)]
    fn forget_taken(&mut self, id: BlockId, b: &KvBlock) -> BlockKey {
        let (key, scope) = self.forget_taken_but_scope(id, b);
        if let Some(scope) = scope {
            self.scopes.release(scope);
        }
        key
    }

    /// [`KvCache::forget_taken`] but for the scope reference, returned as
    /// [`KvCache::release_taken_row_but_scope`] returns it. Always inline: a
    /// plain hint left it a call in the eviction loop, 3 300 more
    /// instructions a prompt.
    #[inline(always)]
    fn forget_taken_but_scope(&mut self, id: BlockId, b: &KvBlock) -> (BlockKey, Option<ScopeId>) {
        let key = b.key.expect("cached blocks have keys");
        match self.index.find_entry(index_hash(&self.index_hasher, &key), |&other| other == id) {
            Ok(entry) => drop(entry.remove()),
            Err(_) => debug_assert!(false, "an indexed block has its index entry"),
        }
        (key, self.release_taken_row_but_scope(id, b))
    }

    /// Drops the `n` least recently used blocks of a tier's LRU (fewer when
    /// it lists fewer), front first, each as [`KvCache::drop_block`] drops
    /// one, and returns how many it dropped. The list is cut once after the
    /// last of them instead of being relinked at every block, and the scope
    /// references are given back once for each run of blocks of one scope
    /// (a chain's blocks share theirs) instead of at every block; the
    /// scopes outlive the loop's sibling unlinking either way.
    pub fn drop_lru_front(&mut self, medium: Tier, n: usize, events: &mut EventQueue) -> usize {
        let mut next = self.pool.lru_ref(medium).front();
        if n == 0 || next.is_none() {
            return 0;
        }
        // Keys go straight into the removal event (at least one follows).
        let mut keys = events.removals_in(medium, self.group);
        let mut dropped = 0;
        // The scope references given back, a run of one scope at a time:
        // the blocks of a chain share one, given back once for the run.
        let mut scope_run: Option<(ScopeId, u32)> = None;
        while dropped < n {
            let Some(id) = next else { break };
            let b = self.blocks.rows.remove(id).expect("listed blocks are live");
            debug_assert!(b.indexed && b.ref_count == 0 && b.lru.linked, "the LRU lists cached, unreferenced blocks");
            next = b.lru.next;
            let (key, scope) = self.forget_taken_but_scope(id, &b);
            if let Some(keys) = keys.as_deref_mut() {
                keys.push(key);
            }
            match (scope, &mut scope_run) {
                (Some(s), Some((run, count))) if s == *run => *count += 1,
                (Some(s), _) => {
                    if let Some((run, count)) = scope_run.replace((s, 1)) {
                        self.scopes.release_n(run, count);
                    }
                }
                (None, _) => {}
            }
            dropped += 1;
        }
        if let Some((run, count)) = scope_run {
            self.scopes.release_n(run, count);
        }
        events.count_entries(dropped);
        self.pool.lru(medium).cut_front(&mut self.blocks.rows, next, dropped);
        dropped
    }

    /// Queues the copy of a partial reuse: the first `tokens` tokens of
    /// `source`'s page into `dest`'s page, marking both pages.
    pub fn queue_prefix_copy(&mut self, source: BlockId, dest: BlockId, tokens: u32) {
        let (s, d) = (&self.blocks.rows[source], &self.blocks.rows[dest]);
        let src = PageRef { medium: s.medium, page: s.page };
        let dst = PageRef { medium: d.medium, page: d.page };
        self.queue_copy(BlockCopy { src, dst, tokens, group: self.group_index() }, true);
    }

    /// Forgets every cached key: unreferenced cached blocks (device and host)
    /// leave their LRU and are freed; blocks still used by running requests
    /// stay with them as private copies, freed with their last reference.
    /// Queues `AllBlocksCleared`. The index keeps its allocated capacity.
    ///
    /// The blocks are released in tier and page order, never in the index's
    /// iteration order: that order follows the map's hash seed, which differs
    /// between maps and between processes, and the order in which pages
    /// return to the free lists (and rows to the table's free slots) decides
    /// which page and id every later allocation gets.
    pub fn clear(&mut self, events: &mut EventQueue) {
        self.clear_blocks();
        events.push_cleared();
    }

    /// [`KvCache::clear`] without the event: the engine's other groups, whose
    /// reset the one `AllBlocksCleared` of a clear announces.
    pub fn clear_blocks(&mut self) {
        let mut cleared = std::mem::take(&mut self.cleared);
        cleared.extend(self.index.drain());
        cleared.sort_unstable_by_key(|id| {
            let b = &self.blocks.rows[*id];
            (b.medium, b.page)
        });
        for id in cleared.drain(..) {
            let b = &mut self.blocks.rows[id];
            b.indexed = false;
            let (unreferenced, medium) = (b.ref_count == 0, b.medium);
            self.remove_content(id);
            if unreferenced {
                self.pool.lru(medium).remove(&mut self.blocks.rows, id);
                self.release_row(id);
            }
        }
        self.cleared = cleared;
    }

    /// Closes the step's block side: hands out the copies queued this step
    /// (they run before the next step's) and settles both tiers' free pages,
    /// so that no page counts as touched by a copy any more.
    pub fn close_step(&mut self) -> Vec<BlockCopy> {
        let copies = std::mem::take(&mut self.copies);
        self.pool.settle();
        copies
    }
}

/// The steps the verbs share, each of which leaves some invariant broken
/// until the verb that calls it is done.
impl KvCache {
    fn siblings_of_mut(&mut self, id: BlockId) -> &mut Siblings {
        self.blocks.siblings_mut(id).expect("indexed blocks hold content")
    }

    /// Queues a copy for the step, noting the pages it touches, so that
    /// freeing one of them cools it. `reserved`: its room was set aside
    /// ([`KvCache::reserve_copies`]) and is taken back now.
    fn queue_copy(&mut self, copy: BlockCopy, reserved: bool) {
        if reserved {
            assert!(self.copies_reserved > 0, "an onboard or partial copy has its room set aside");
            self.copies_reserved -= 1;
        }
        debug_assert!(self.copies.len() < self.copies_max, "the copies queued this step stay within their bound");
        self.pool.free(copy.src.medium).touch(copy.src.page);
        self.pool.free(copy.dst.medium).touch(copy.dst.page);
        self.copies.push(copy);
    }

    /// Removes a row that is neither referenced, indexed nor in an LRU, and
    /// gives its page back.
    fn release_row(&mut self, id: BlockId) {
        let b = self.blocks.rows.remove(id).expect("release_row takes a live block");
        debug_assert!(b.ref_count == 0 && !b.indexed, "only unreferenced, unindexed rows are released");
        self.release_taken_row(id, &b);
    }

    /// Releases what the row of `id`, already taken out of the table (one
    /// lookup), held: its content (sibling link and scope reference) and
    /// its page.
    fn release_taken_row(&mut self, id: BlockId, b: &KvBlock) {
        if let Some(scope) = self.release_taken_row_but_scope(id, b) {
            self.scopes.release(scope);
        }
    }

    /// [`KvCache::release_taken_row`] but for the scope reference that the
    /// row's content held: the scope is returned (`None` when the row held
    /// no content) for the caller to give back, so that a burst of drops
    /// gives back a chain's references at once.
    #[inline(always)]
    fn release_taken_row_but_scope(&mut self, id: BlockId, b: &KvBlock) -> Option<ScopeId> {
        let scope = if b.has_content {
            let (link, scope) = self.blocks.take_content_of_taken(b);
            if let Some(link) = link {
                self.unlink_sibling(id, link, scope);
            }
            Some(scope)
        } else {
            None
        };
        self.pool.free(b.medium).release(b.page);
        scope
    }

    /// Drops a block's re-advertising content and its scope reference,
    /// unlinking it from its siblings.
    fn remove_content(&mut self, id: BlockId) {
        self.unlink_child(id);
        if let Some(scope) = self.blocks.take_content(id) {
            self.scopes.release(scope);
        }
    }

    /// The head of the children list of `parent` (a block, or the scope's
    /// root list), or `None` when that parent is gone or not indexed.
    fn children_head(&mut self, parent: Option<BlockId>, scope: ScopeId) -> Option<&mut Option<BlockId>> {
        match parent {
            Some(p) => self.blocks.siblings_mut(p).map(|s| &mut s.first_child),
            None => Some(self.scopes.root_children_mut(scope)),
        }
    }

    /// Links an indexed block at the head of its parent's children list, so
    /// that partial reuse can find it. A parent that is not indexed has no
    /// list: the block then stays unlinked.
    fn link_child(&mut self, id: BlockId, parent: Option<BlockId>) {
        let scope = self.content_of(id).scope;
        let Some(head) = self.children_head(parent, scope) else { return };
        let next = head.replace(id);
        if let Some(n) = next {
            let link = self.siblings_of_mut(n).link.as_mut().expect("listed blocks are linked");
            link.prev = Some(id);
        }
        self.siblings_of_mut(id).link = Some(SiblingLink { parent, prev: None, next });
    }

    /// Removes a block from its parent's children list, if it is in one.
    fn unlink_child(&mut self, id: BlockId) {
        let Some(link) = self.blocks.siblings_mut(id).and_then(|s| s.link.take()) else { return };
        let scope = self.content_of(id).scope;
        self.unlink_sibling(id, link, scope);
    }

    /// Joins the neighbours of block `id` in its parent's children list
    /// (`link`, already taken from its content; `scope`, its scope).
    fn unlink_sibling(&mut self, id: BlockId, link: SiblingLink, scope: ScopeId) {
        if let Some(n) = link.next {
            self.siblings_of_mut(n).link.as_mut().expect("listed blocks are linked").prev = link.prev;
        }
        match link.prev {
            Some(p) => self.siblings_of_mut(p).link.as_mut().expect("listed blocks are linked").next = link.next,
            None => {
                if let Some(head) = self.children_head(link.parent, scope)
                    && *head == Some(id)
                {
                    *head = link.next;
                }
            }
        }
    }
}

impl KvCache {
    /// Checks the block side's invariants; panics naming the one broken.
    ///
    /// 1. Free plus used pages equal capacity, per tier, and no page is used
    ///    twice (a sliding-window group's null page counts as used, by no block).
    /// 2. A block is in an LRU exactly when it is indexed and unreferenced
    ///    (host blocks are never referenced).
    /// 3. The index and the table agree: every entry names a live, indexed block
    ///    with that key, and every indexed block is the entry for its key.
    /// 4. Indexed blocks have re-advertising content; others have none.
    /// 5. Sibling lists are well formed: links are symmetric, a head is
    ///    the head of its parent's list, and every list member names it.
    /// 6. Each tier's LRU lists exactly the linked blocks of that tier, as a
    ///    well-formed chain (`acquire`, `release`, `move_block` and
    ///    `drop_block` pick the list from the block's tier and switch it on
    ///    a move).
    /// 7. Every page that a queued copy reads or writes is marked touched in
    ///    its tier's free pages (`queue_copy`), so a freed one cools until the
    ///    step closes instead of being written under the copy.
    /// 8. At most `copies_max` copies are queued, and no room is set aside
    ///    between calls.
    pub fn check_invariants(&self) {
        let mut used = [0usize; 2];
        let mut linked = [0usize; 2];
        let mut seen = ahash::AHashSet::new();
        if let Some(p) = self.null_page {
            used[Tier::Device as usize] += 1;
            seen.insert((Tier::Device, p));
        }
        for (id, b) in &self.blocks.rows {
            used[b.medium as usize] += 1;
            assert!(seen.insert((b.medium, b.page)), "invariant 1: page {:?}/{} used twice", b.medium, b.page);
            let in_lru = b.lru.linked;
            linked[b.medium as usize] += in_lru as usize;
            assert_eq!(in_lru, b.indexed && b.ref_count == 0, "invariant 2: LRU membership of {id:?}");
            if b.medium == Tier::Host {
                assert!(b.indexed && b.ref_count == 0, "invariant 2: host blocks are indexed and unreferenced");
            }
            if b.indexed {
                let key = b.key.expect("invariant 3: indexed blocks have keys");
                assert_eq!(self.lookup(&key), Some(id), "invariant 3: index entry of {id:?}");
            }
            assert_eq!(b.has_content, b.indexed, "invariant 4: content of {id:?}");
        }
        for medium in [Tier::Device, Tier::Host] {
            assert_eq!(
                used[medium as usize] + self.free_pages(medium),
                self.pool.pages(medium) as usize,
                "invariant 1: {medium:?} pages"
            );
        }
        for (id, c) in self.blocks.contents() {
            let s = self.siblings_of(id);
            if let Some(first) = s.first_child {
                let l = self.siblings_of(first).link.expect("invariant 5: a head is linked");
                assert_eq!((l.parent, l.prev), (Some(id), None), "invariant 5: head names its parent");
            }
            let Some(link) = s.link else { continue };
            if let Some(n) = link.next {
                assert_eq!(self.siblings_of(n).link.and_then(|l| l.prev), Some(id), "invariant 5: next.prev of {id:?}");
                assert_eq!(
                    self.siblings_of(n).link.map(|l| l.parent),
                    Some(link.parent),
                    "invariant 5: siblings share a parent"
                );
            }
            match link.prev {
                Some(p) => assert_eq!(
                    self.siblings_of(p).link.and_then(|l| l.next),
                    Some(id),
                    "invariant 5: prev.next of {id:?}"
                ),
                None => {
                    let head = match link.parent {
                        Some(p) => self.blocks.siblings(p).map(|ps| ps.first_child),
                        None => Some(*self.scopes.root_children(c.scope)),
                    };
                    if let Some(head) = head {
                        assert_eq!(head, Some(id), "invariant 5: a list's first member is its head");
                    }
                }
            }
        }
        let mut entries = 0usize;
        for &id in &self.index {
            let b = self.blocks.rows.get(id).expect("invariant 3: index names a live block");
            assert!(b.indexed && b.key.is_some(), "invariant 3: index entry names an indexed, keyed block");
            entries += 1;
        }
        let indexed = self.blocks.rows.values().filter(|b| b.indexed).count();
        assert_eq!(entries, indexed, "invariant 3: one index entry per indexed block");
        for medium in [Tier::Device, Tier::Host] {
            let lru = self.pool.lru_ref(medium);
            assert_eq!(lru.len(), linked[medium as usize], "invariant 6: {medium:?} LRU length");
            let (mut prev, mut walked) = (None, 0usize);
            let mut at = lru.front();
            while let Some(id) = at {
                let b = self.blocks.rows.get(id).expect("invariant 6: LRU names a live block");
                assert!(b.medium == medium && b.lru.linked, "invariant 6: {id:?} listed in the {medium:?} LRU");
                assert_eq!(b.lru.prev, prev, "invariant 6: LRU prev link of {id:?}");
                walked += 1;
                assert!(walked <= lru.len(), "invariant 6: {medium:?} LRU is a chain");
                (prev, at) = (Some(id), b.lru.next);
            }
            assert_eq!(walked, lru.len(), "invariant 6: {medium:?} LRU walk");
        }
        for c in &self.copies {
            for page in [c.src, c.dst] {
                assert!(self.copy_touches(page), "invariant 7: queued copy's page {page:?} is marked");
            }
        }
        assert!(self.copies.len() <= self.copies_max, "invariant 8: {} copies queued", self.copies.len());
        assert_eq!(self.copies_reserved, 0, "invariant 8: no copy room set aside between calls");
    }
}

/// The row of a block just taken on `page` of `medium`: unkeyed, one
/// reference, in no list.
fn fresh_row(medium: Tier, page: u32) -> KvBlock {
    KvBlock { page, medium, key: None, ref_count: 1, indexed: false, lru: LruLinks::default(), has_content: false }
}
