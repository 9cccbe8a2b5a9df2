//! Allocation of device blocks, under pressure by evicting the LRU.

use crate::config::EngineConfig;
use crate::error::RequestError;
use crate::events::EventQueue;
use crate::ids::{BlockId, RequestId};
use crate::resources::{Counters, KvCache};
use crate::systems::evict;
use crate::tables::{Medium, Requests};

/// Appends `n` fresh device blocks (one reference each) to `out`, evicting
/// least recently used cached blocks when no page is free.
///
/// The caller has checked that `n` blocks are available; running out here is
/// a broken invariant.
pub fn allocate_device_blocks(
    cache: &mut KvCache,
    n: usize,
    out: &mut Vec<BlockId>,
    events: &mut EventQueue,
    counters: &mut Counters,
) {
    for _ in 0..n {
        if cache.pool.free_device.is_empty() {
            evict::evict_device_block(cache, events, counters)
                .expect("admission checked that enough blocks are evictable");
        }
        out.push(cache.take_free_block(Medium::Gpu).expect("a page is free after eviction"));
    }
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
    allocate_device_blocks(cache, needed, &mut request.blocks, events, counters);
    Ok(())
}
