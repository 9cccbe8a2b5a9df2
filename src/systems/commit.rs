//! Commit: the caller reports tokens whose KV the forward pass has written.
//! Blocks whose tokens are all computed get their keys, enter the prefix index
//! and are advertised with a `BlockStored` event. A block is never matchable,
//! nor advertised, before that.

use crate::config::EngineConfig;
use crate::error::RequestError;
use crate::events::{BlockStored, EventQueue};
use crate::ids::RequestId;
use crate::keys::{BlockKey, ImageRun, block_key, keyed_tokens, runs_in_block};
use crate::resources::KvCache;
use crate::tables::{RequestScope, Requests};
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
        let (blocks_hint, block_size, medium) = (self.blocks_hint, self.block_size, self.medium);
        self.event
            .get_or_insert_with(|| BlockStored::start(parent, block_size, medium, scope, blocks_hint))
            .push_block(key, tokens, runs);
    }

    fn flush(&mut self, events: &mut EventQueue) {
        if let Some(e) = self.event.take() {
            events.push_stored(e);
        }
    }
}

/// The `BlockStored` event that advertises one indexed block again (after a
/// tier move, or in a snapshot), built from its retained content.
pub fn stored_event_for_block(cache: &KvCache, id: crate::ids::BlockId) -> BlockStored {
    let b = &cache.blocks.rows[id];
    let content = cache.content_of(id);
    let mut g = StoredGroup { event: None, blocks_hint: 1, block_size: cache.block_size, medium: b.medium };
    g.push(
        b.key.expect("indexed blocks have keys"),
        content.parent,
        cache.blocks.tokens(b),
        content.images.as_slice(),
        cache.scopes.get(content.scope),
    );
    g.event.expect("one block was pushed")
}

/// Records that the request's first `tokens_computed` tokens have their KV
/// written. Newly full blocks are keyed; each key not yet cached enters the
/// index and is advertised. A key that is already cached (another request
/// computed the same block meanwhile) leaves this block a private copy, so a
/// key is advertised once and removed once, whatever the number of copies.
pub fn commit_computed(
    requests: &mut Requests,
    id: RequestId,
    tokens_computed: u64,
    config: &EngineConfig,
    cache: &mut KvCache,
    events: &mut EventQueue,
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
        return Ok(());
    }
    let mut scratch = Vec::new();
    let mut runs = Vec::new();
    let mut group = StoredGroup {
        event: None,
        blocks_hint: full.saturating_sub(request.blocks_committed) as usize,
        block_size: bs,
        medium: Tier::Device,
    };
    // Each advertised block holds a reference on the scope; taken once below.
    let mut scope_refs = 0u32;
    let scope = &cache.scopes.get(request.scope).clone();
    for i in request.blocks_committed..full {
        let start = i * bs;
        let tokens = &request.tokens[start as usize..(start + bs) as usize];
        let parent = if i == 0 { None } else { Some(request.keys[i as usize - 1]) };
        // The block's runs and keyed tokens, computed once for the key, the
        // page's token copy and the event.
        runs_in_block(&request.runs, start, bs, &mut runs);
        let keyed = keyed_tokens(tokens, &runs, config.image_placeholder_token_id, &mut scratch);
        let key = if (i as usize) < request.keys.len() {
            request.keys[i as usize]
        } else {
            let k = block_key(&parent.unwrap_or(request.root), keyed, &runs);
            request.keys.push(k);
            k
        };
        let block_id = request.blocks[i as usize];
        let block = &mut cache.blocks.rows[block_id];
        let matched = block.key.is_some();
        block.key = Some(key);
        let entry = match cache.index.map.entry(key) {
            std::collections::hash_map::Entry::Vacant(v) if !matched => v,
            // A block matched at admission, or a private copy of a cached key.
            _ => {
                group.flush(events);
                continue;
            }
        };
        entry.insert(block_id);
        block.indexed = true;
        let (medium, page) = (block.medium, block.page);
        cache.blocks.set_tokens(medium, page, keyed);
        if events.enabled() {
            group.push(key, parent, keyed, &runs, scope);
        }
        scope_refs += 1;
        cache.blocks.set_content(block_id, parent, i, request.scope, &runs);
        // Listed under its parent for partial reuse, when the parent is the
        // indexed copy of its key (a private duplicate parent has no list).
        // The lists serve partial reuse only, so without it none is kept.
        if config.partial_reuse {
            let parent_block = if i == 0 {
                Some(None)
            } else {
                let p = request.blocks[i as usize - 1];
                cache.blocks.rows[p].indexed.then_some(Some(p))
            };
            if let Some(parent_block) = parent_block {
                cache.link_child(block_id, parent_block);
            }
        }
    }
    group.flush(events);
    cache.scopes.retain(request.scope, scope_refs);
    request.blocks_committed = full;
    Ok(())
}
