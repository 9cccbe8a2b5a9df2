//! Allocation of device blocks, under pressure by evicting the LRU.

use crate::config::EngineConfig;
use crate::error::RequestError;
use crate::events::EventQueue;
use crate::ids::{BlockId, RequestId};
use crate::resources::{Counters, KvCache};
use crate::systems::evict;
use crate::tables::Requests;
use crate::tier::Tier;

/// Appends `n` fresh device blocks (one reference each) to `out`, evicting
/// least recently used cached blocks when no page is free. With
/// `first_copied`, a copy writes the first block this step (partial reuse).
///
/// The caller has checked that `n` blocks are available; running out here is
/// a broken invariant.
pub fn allocate_device_blocks(
    cache: &mut KvCache,
    n: usize,
    first_copied: bool,
    out: &mut Vec<BlockId>,
    events: &mut EventQueue,
    counters: &mut Counters,
) {
    for i in 0..n {
        if cache.pool.free_device.is_empty() {
            evict::evict_device_block(cache, events, counters)
                .expect("admission checked that enough blocks are evictable");
        }
        let block = cache.take_free_block(Tier::Device, first_copied && i == 0);
        out.push(block.expect("a page is free after eviction"));
    }
}

/// Evicts least recently used device blocks up front, before any page is
/// filled, towards `pages` free device pages: the step's offloads then come
/// first in its copy list, and the copies that fill pages can keep clear of
/// the ones they read ([`FreePages`](crate::resources::FreePages)), so that
/// they batch into few waves. With a host tier, and unless
/// `offload_first`, only as many as the host tier has free pages for: an
/// offload into a full tier drops a host block, which the onboards that
/// follow might have made room for. The rest is evicted one page at a time
/// as pages are taken. The caller has checked that enough blocks are
/// evictable.
pub fn make_room(
    cache: &mut KvCache,
    pages: usize,
    offload_first: bool,
    events: &mut EventQueue,
    counters: &mut Counters,
) {
    let mut short = pages.saturating_sub(cache.pool.free_device.len());
    if cache.has_host_tier() && !offload_first {
        short = short.min(cache.pool.free_host.len());
    }
    let evicted = evict::evict_device_blocks(cache, short, events, counters);
    debug_assert_eq!(evicted, short, "admission checked that enough blocks are evictable");
}

/// Appends generated tokens to a running request and allocates the blocks
/// they need. All or nothing: on error the request and the pool are unchanged.
pub fn grow_request(
    requests: &mut Requests,
    id: RequestId,
    tokens: &[u32],
    config: &EngineConfig,
    cache: &mut KvCache,
    events: &mut EventQueue,
    counters: &mut Counters,
) -> Result<(), RequestError> {
    let request = requests.rows.get_mut(id).ok_or(RequestError::UnknownRequest)?;
    let new_len = request.tokens.len() as u64 + tokens.len() as u64;
    if new_len > config.tokens_per_request_max as u64 {
        return Err(RequestError::TooLong { tokens: new_len, max: config.tokens_per_request_max });
    }
    let needed = (new_len as usize).div_ceil(config.block_size_tokens as usize) - request.blocks.len();
    let available = cache.device_blocks_available();
    if needed > available {
        return Err(RequestError::OutOfBlocks { needed, available });
    }
    request.tokens.extend_from_slice(tokens);
    make_room(cache, needed, config.offload_first, events, counters);
    allocate_device_blocks(cache, needed, false, &mut request.blocks, events, counters);
    Ok(())
}
