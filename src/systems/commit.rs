//! Commit: the caller reports tokens whose KV the forward pass has written.
//! Blocks whose tokens are all computed get their keys, enter the prefix index
//! and are advertised with a `BlockStored` event. A block is never matchable,
//! nor advertised, before that.
//!
//! Indexing one block is [`KvCache::index_block`], which sets its key, index
//! entry, tokens, content, scope reference and sibling place together; commit
//! keeps the policy: keying the blocks, and grouping a chain's newly indexed
//! blocks into one event.

use crate::config::EngineConfig;
use crate::error::RequestError;
use crate::events::{BlockStored, EventQueue, KvGroup};
use crate::ids::RequestId;
use crate::ids::{BlockId, ScopeId};
use crate::keys::{BlockKey, FlatRun, ImageRun, StagedKey, keyed_tokens, runs_in_block, runs_in_block_from};
use crate::resources::{CommittedBlock, Entered, KvCache, KvGroups, Scratch, window_first_block};
use crate::tables::{Request, RequestScope, Requests};
use crate::tier::Tier;

/// Gathers a run of consecutive newly indexed blocks of one chain into one
/// `BlockStored` event: the policy of how commit groups what it advertises
/// (one event per run, cut where a block is not indexed). The blocks are
/// noted by index as they are indexed, and the event is built in one go when
/// the run ends, from the request's keys, tokens and image runs.
struct StoredGroup<'a> {
    /// Blocks `first..end` of the request: indexed, not advertised yet.
    run: Option<(u32, u32)>,
    medium: Tier,
    /// The group the blocks are in, as the events name it.
    group: Option<KvGroup>,
    config: &'a EngineConfig,
    scope: &'a RequestScope,
}

impl<'a> StoredGroup<'a> {
    fn new(medium: Tier, group: Option<KvGroup>, config: &'a EngineConfig, scope: &'a RequestScope) -> Self {
        Self { run: None, medium, group, config, scope }
    }

    /// Adds block `i`, the block after the run's last.
    fn push(&mut self, i: u32) {
        match &mut self.run {
            Some((_, end)) => {
                debug_assert_eq!(*end, i, "a run's blocks are consecutive");
                *end = i + 1;
            }
            None => self.run = Some((i, i + 1)),
        }
    }

    /// Queues the run's event, if a run is open, from the request's keys,
    /// tokens and image runs.
    fn flush(&mut self, events: &mut EventQueue, r: &RequestView<'_>) {
        let Some((first, end)) = self.run.take() else { return };
        let (bs, blocks) = (self.config.block_size_tokens, (end - first) as usize);
        let parent = (first > 0).then(|| r.keys[first as usize - 1]);
        let mut e = BlockStored::start(parent, bs, self.medium, self.scope, blocks);
        e.group = self.group;
        let keys = &r.keys[first as usize..end as usize];
        e.push_blocks(keys, r.tokens, first, r.flat, self.config.image_placeholder_token_id);
        events.push_stored(e);
    }
}

/// Indexes and advertises committed blocks one at a time, in block order:
/// the second half of committing a block, once its key is known.
struct BlockIndexer<'a, 'g> {
    cache: &'a mut KvCache,
    events: &'a mut EventQueue,
    group: &'a mut StoredGroup<'g>,
    scope_id: ScopeId,
    config: &'a EngineConfig,
}

/// One block's image runs and keyed tokens (the latter filled only when the
/// block holds an image), as computed for its key.
struct BlockParts<'a> {
    tokens: &'a mut Vec<u32>,
    runs: &'a mut Vec<ImageRun>,
}

impl BlockParts<'_> {
    /// Computes block `i`'s runs and, when it holds an image, its keyed tokens.
    fn fill(&mut self, i: u32, tokens: &[u32], flat: &[FlatRun], config: &EngineConfig) {
        runs_in_block(flat, i * config.block_size_tokens, config.block_size_tokens, self.runs);
        self.key_tokens(i, tokens, config);
    }

    /// [`BlockParts::fill`] for blocks filled in increasing order: the
    /// request's runs from `cursor` on ([`runs_in_block_from`]).
    #[inline(always)]
    fn fill_next(&mut self, i: u32, tokens: &[u32], flat: &[FlatRun], cursor: &mut usize, config: &EngineConfig) {
        runs_in_block_from(flat, cursor, i * config.block_size_tokens, config.block_size_tokens, self.runs);
        self.key_tokens(i, tokens, config);
    }

    /// Block `i`'s keyed tokens into the buffer, once its runs are in place
    /// (nothing to do for a block without an image: [`BlockParts::keyed`]
    /// borrows the request's ids then).
    #[inline(always)]
    fn key_tokens(&mut self, i: u32, tokens: &[u32], config: &EngineConfig) {
        if self.runs.is_empty() {
            return;
        }
        let (bs, start) = (config.block_size_tokens as usize, (i * config.block_size_tokens) as usize);
        keyed_tokens(&tokens[start..start + bs], self.runs, config.image_placeholder_token_id, self.tokens);
    }

    /// The keyed tokens of block `i` once [`BlockParts::fill`] ran for it.
    fn keyed<'t>(&'t self, i: u32, tokens: &'t [u32], bs: u32) -> &'t [u32] {
        if self.runs.is_empty() {
            let start = (i * bs) as usize;
            &tokens[start..start + bs as usize]
        } else {
            self.tokens
        }
    }
}

/// What indexing reads of the request: its token ids, flat image runs,
/// keys so far and blocks.
#[derive(Clone, Copy)]
struct RequestView<'r> {
    tokens: &'r [u32],
    flat: &'r [FlatRun],
    keys: &'r [BlockKey],
    blocks: &'r [BlockId],
}

/// The block keyed last and not indexed yet, and whether its parts are
/// already in the buffers it will be indexed from (they are when commit
/// hashed it; for a block keyed at admission, indexing computes them first).
#[derive(Clone, Copy)]
struct Keyed {
    block: u32,
    parts_filled: bool,
}

impl BlockIndexer<'_, '_> {
    /// Indexes block `k.block` of a request (its key is `keys[i]`; its parts
    /// in `parts`, computed there first unless `k.parts_filled`) and adds it
    /// to the run being advertised; a block that was matched at admission,
    /// or whose key another copy holds, ends the run instead.
    fn index(&mut self, k: Keyed, parts: &mut BlockParts<'_>, r: &RequestView<'_>) {
        let entered = self.enter(k, parts, r);
        self.complete(k, entered, parts, r);
    }

    /// The first half of [`BlockIndexer::index`]: the block's parts, key and
    /// index entry ([`KvCache::enter_index`]).
    #[inline(always)]
    fn enter(&mut self, k: Keyed, parts: &mut BlockParts<'_>, r: &RequestView<'_>) -> Option<Entered> {
        let i = k.block;
        if !k.parts_filled {
            parts.fill(i, r.tokens, r.flat, self.config);
        }
        self.cache.enter_index(r.blocks[i as usize], &r.keys[i as usize])
    }

    /// The second half: the entered block's tokens and content
    /// ([`KvCache::complete_index`]) and its place in the run advertised, or
    /// the end of the run when it was not entered (matched at admission, or
    /// a private copy of a cached key).
    #[inline(always)]
    fn complete(&mut self, k: Keyed, entered: Option<Entered>, parts: &BlockParts<'_>, r: &RequestView<'_>) {
        let i = k.block;
        let Some(entered) = entered else {
            self.group.flush(self.events, r);
            return;
        };
        let RequestView { tokens, keys, blocks, .. } = *r;
        let block = CommittedBlock {
            key: &keys[i as usize],
            parent: (i > 0).then(|| &keys[i as usize - 1]),
            parent_block: (i > 0).then(|| blocks[i as usize - 1]),
            depth: i,
            scope: self.scope_id,
            tokens: parts.keyed(i, tokens, self.config.block_size_tokens),
            images: parts.runs,
        };
        // The sibling lists serve partial reuse only, so without it none is kept.
        self.cache.complete_index(entered, &block, self.config.partial_reuse);
        if self.events.enabled() {
            self.group.push(i);
        }
    }
}

/// Records that the request's first `tokens_computed` tokens have their KV
/// written. Newly full blocks are keyed; each key not yet cached enters the
/// index and is advertised. A key that is already cached (another request
/// computed the same block meanwhile) leaves this block a private copy, so a
/// key is advertised once and removed once, whatever the number of copies.
///
/// Every group indexes its copy of each newly full block (group 0 first,
/// then the windows in order, one event per run in each). Then each
/// sliding window releases the blocks that fell out of it
/// ([`window_first_block`]): a cached one joins its group's LRU and stays
/// reusable until evicted, an uncached one (a dummy's, or with reuse off)
/// is freed at once, and the table names the null page there.
pub fn commit_computed(
    requests: &mut Requests,
    id: RequestId,
    tokens_computed: u64,
    config: &EngineConfig,
    groups: &mut KvGroups,
    events: &mut EventQueue,
    scratch: &mut Scratch,
) -> Result<(), RequestError> {
    let request = requests.rows.get_mut(id).ok_or(RequestError::UnknownRequest)?;
    let len = request.tokens.len() as u32;
    if tokens_computed < request.tokens_computed as u64 || tokens_computed > len as u64 {
        return Err(RequestError::BadComputedCount { current: request.tokens_computed, len, given: tokens_computed });
    }
    request.tokens_computed = tokens_computed as u32;
    let bs = config.block_size_tokens;
    let full = tokens_computed as u32 / bs;
    if request.dummy || !config.block_reuse {
        request.blocks_committed = request.blocks_committed.max(full);
        release_out_of_window(request, groups, bs);
        return Ok(());
    }
    let committed = request.blocks_committed;
    let cache = &mut groups.main;
    let Scratch { tokens: scratch, block_runs: runs, advertised_tokens, advertised_runs, .. } = scratch;
    let scope = &cache.scopes().get(request.scope).clone();
    let mut group = StoredGroup::new(Tier::Device, cache.group(), config, scope);
    let mut indexer = BlockIndexer { cache, events, group: &mut group, scope_id: request.scope, config };
    // Software-pipelined: each block is indexed while the next one's key is
    // hashed, on execution units that the hash's chain of dependent rounds
    // leaves idle. Between the key's stages (`StagedKey`) go the previous
    // block's key and index entry, after the hash's first compression, and
    // its tokens and content, after the second, so that little stands
    // between two compressions. Its event is built when the run of indexed
    // blocks ends, in bulk. Keys, index entries and events come in block
    // order all the same; only the instructions interleave. The two blocks'
    // parts sit in two pairs of buffers that swap roles.
    let Request { tokens, keys, blocks, runs: flat, root, .. } = &mut *request;
    let mut hashing = BlockParts { tokens: scratch, runs };
    let mut waiting = BlockParts { tokens: advertised_tokens, runs: advertised_runs };
    let mut keyed: Option<Keyed> = None;
    let mut staged = StagedKey::default();
    // The first of the request's image runs that can reach the block being
    // hashed: blocks are hashed in order.
    let mut run_cursor = 0;
    for i in committed..full {
        if (i as usize) < keys.len() {
            // Keyed at admission: no hash to overlap.
            if let Some(k) = keyed.take() {
                indexer.index(k, &mut waiting, &RequestView { tokens, flat, keys, blocks });
            }
            keyed = Some(Keyed { block: i, parts_filled: false });
            continue;
        }
        let parent = if i == 0 { *root } else { keys[i as usize - 1] };
        hashing.fill_next(i, tokens, flat, &mut run_cursor, config);
        let block_tokens = hashing.keyed(i, tokens, bs);
        staged.begin(&parent, block_tokens);
        let r = RequestView { tokens, flat, keys, blocks };
        let entered = keyed.map(|k| indexer.enter(k, &mut waiting, &r));
        staged.second(block_tokens);
        if let (Some(k), Some(entered)) = (keyed, entered) {
            indexer.complete(k, entered, &waiting, &r);
        }
        let key = staged.finish(block_tokens, hashing.runs);
        keys.push(key);
        keyed = Some(Keyed { block: i, parts_filled: true });
        std::mem::swap(&mut hashing, &mut waiting);
    }
    if let Some(k) = keyed {
        indexer.index(k, &mut waiting, &RequestView { tokens, flat, keys, blocks });
    }
    let view =
        RequestView { tokens: &request.tokens, flat: &request.runs, keys: &request.keys, blocks: &request.blocks };
    group.flush(events, &view);
    for (w, table) in groups.windows.iter_mut().zip(&request.windows) {
        let mut run = StoredGroup::new(Tier::Device, w.cache.group(), config, scope);
        for i in request.blocks_committed..full {
            let start = i * bs;
            runs_in_block(&request.runs, start, bs, runs);
            let tokens = &request.tokens[start as usize..(start + bs) as usize];
            let keyed = keyed_tokens(tokens, runs, config.image_placeholder_token_id, scratch);
            let block = CommittedBlock {
                key: &request.keys[i as usize],
                parent: (i > 0).then(|| &request.keys[i as usize - 1]),
                parent_block: None,
                depth: i,
                scope: table.scope,
                tokens: keyed,
                images: runs,
            };
            let b = table.blocks[i as usize].expect("a window holds every block it has not released");
            // No sibling lists: partial reuse is off with groups.
            if !w.cache.index_block(b, &block, false) {
                run.flush(events, &view);
                continue;
            }
            if events.enabled() {
                run.push(i);
            }
        }
        run.flush(events, &view);
    }
    request.blocks_committed = full;
    release_out_of_window(request, groups, bs);
    Ok(())
}

/// Releases, in every sliding window, the blocks that the request's next
/// token no longer reads, oldest first (so that they are also the first of
/// the group's LRU to be evicted).
fn release_out_of_window(request: &mut Request, groups: &mut KvGroups, block_size: u32) {
    for (w, table) in groups.windows.iter_mut().zip(&mut request.windows) {
        let first = window_first_block(w.window_tokens, request.tokens_computed, block_size);
        while table.released < first {
            let b = table.blocks[table.released as usize].take().expect("blocks from `released` on are held");
            w.cache.release(b);
            table.released += 1;
        }
    }
}
