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
use crate::keys::{BlockKey, ImageRun, block_key, keyed_tokens, runs_in_block};
use crate::resources::{CommittedBlock, KvGroups, Scratch, window_first_block};
use crate::tables::{Request, RequestScope, Requests};
use crate::tier::Tier;

/// Builds `BlockStored` events for a run of consecutive blocks of one chain:
/// the policy of how commit groups what it advertises (one event per run of
/// newly indexed blocks, cut where a block is not indexed).
struct StoredGroup {
    event: Option<BlockStored>,
    /// Blocks the event will probably hold, to size its vectors once.
    blocks_hint: usize,
    block_size: u32,
    medium: Tier,
    /// The group the blocks are in, as the events name it.
    group: Option<KvGroup>,
}

impl StoredGroup {
    fn push(
        &mut self,
        key: BlockKey,
        parent: Option<BlockKey>,
        tokens: &[u32],
        runs: &[ImageRun],
        scope: &RequestScope,
    ) {
        let (blocks_hint, block_size, medium, group) = (self.blocks_hint, self.block_size, self.medium, self.group);
        self.event
            .get_or_insert_with(|| {
                let mut e = BlockStored::start(parent, block_size, medium, scope, blocks_hint);
                e.group = group;
                e
            })
            .push_block(key, tokens, runs);
    }

    fn flush(&mut self, events: &mut EventQueue) {
        if let Some(e) = self.event.take() {
            events.push_stored(e);
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
    let cache = &mut groups.main;
    let Scratch { tokens: scratch, block_runs: runs, .. } = scratch;
    let mut group = StoredGroup {
        event: None,
        blocks_hint: full.saturating_sub(request.blocks_committed) as usize,
        block_size: bs,
        medium: Tier::Device,
        group: cache.group(),
    };
    let scope = &cache.scopes().get(request.scope).clone();
    for i in request.blocks_committed..full {
        let start = i * bs;
        let tokens = &request.tokens[start as usize..(start + bs) as usize];
        let parent = if i == 0 { None } else { Some(request.keys[i as usize - 1]) };
        // The block's runs and keyed tokens, computed once for the key, the
        // page's token copy and the event.
        runs_in_block(&request.runs, start, bs, runs);
        let keyed = keyed_tokens(tokens, runs, config.image_placeholder_token_id, scratch);
        let key = if (i as usize) < request.keys.len() {
            request.keys[i as usize]
        } else {
            let k = block_key(&parent.unwrap_or(request.root), keyed, runs);
            request.keys.push(k);
            k
        };
        let block = CommittedBlock {
            key,
            parent,
            parent_block: (i > 0).then(|| request.blocks[i as usize - 1]),
            depth: i,
            scope: request.scope,
            tokens: keyed,
            images: runs,
        };
        // The sibling lists serve partial reuse only, so without it none is kept.
        if !cache.index_block(request.blocks[i as usize], &block, config.partial_reuse) {
            // A block matched at admission, or a private copy of a cached key.
            group.flush(events);
            continue;
        }
        if events.enabled() {
            group.push(key, parent, keyed, runs, scope);
        }
    }
    group.flush(events);
    for (w, table) in groups.windows.iter_mut().zip(&request.windows) {
        let mut run = StoredGroup {
            event: None,
            blocks_hint: group.blocks_hint,
            block_size: bs,
            medium: Tier::Device,
            group: w.cache.group(),
        };
        for i in request.blocks_committed..full {
            let start = i * bs;
            runs_in_block(&request.runs, start, bs, runs);
            let tokens = &request.tokens[start as usize..(start + bs) as usize];
            let keyed = keyed_tokens(tokens, runs, config.image_placeholder_token_id, scratch);
            let block = CommittedBlock {
                key: request.keys[i as usize],
                parent: (i > 0).then(|| request.keys[i as usize - 1]),
                parent_block: None,
                depth: i,
                scope: table.scope,
                tokens: keyed,
                images: runs,
            };
            let b = table.blocks[i as usize].expect("a window holds every block it has not released");
            // No sibling lists: partial reuse is off with groups.
            if !w.cache.index_block(b, &block, false) {
                run.flush(events);
                continue;
            }
            if events.enabled() {
                run.push(block.key, block.parent, keyed, runs, scope);
            }
        }
        run.flush(events);
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
