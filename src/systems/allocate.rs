//! Growth: a running request appends generated tokens and gets the device
//! blocks they need, evicting under pressure. The policy here is the
//! all-or-nothing capacity check and the order (room made up front, then
//! blocks taken); the eviction itself is the block cache's
//! ([`KvCache::make_room`], [`KvCache::allocate_device_blocks`]), shared
//! with admission.

use crate::config::EngineConfig;
use crate::error::RequestError;
use crate::events::EventQueue;
use crate::ids::RequestId;
use crate::resources::{Counters, KvGroups};
use crate::tables::Requests;

/// Appends generated tokens to a running request and allocates the blocks
/// they need, in every group (a sliding window needs the new blocks as much
/// as full attention does; what it gives back is the blocks that fall out
/// of the window, when commit reports them computed). All or nothing: on
/// error the request and every group's pool are unchanged.
pub fn grow_request(
    requests: &mut Requests,
    id: RequestId,
    tokens: &[u32],
    config: &EngineConfig,
    groups: &mut KvGroups,
    events: &mut EventQueue,
    counters: &mut Counters,
) -> Result<(), RequestError> {
    let request = requests.rows.get_mut(id).ok_or(RequestError::UnknownRequest)?;
    let new_len = request.tokens.len() as u64 + tokens.len() as u64;
    if new_len > config.tokens_per_request_max as u64 {
        return Err(RequestError::TooLong { tokens: new_len, max: config.tokens_per_request_max });
    }
    let needed = (new_len as usize).div_ceil(config.block_size_tokens as usize) - request.blocks.len();
    for cache in groups.iter() {
        let available = cache.device_blocks_available();
        if needed > available {
            return Err(RequestError::OutOfBlocks { needed, available });
        }
    }
    crate::copy::extend_tokens(&mut request.tokens, tokens);
    let KvGroups { main, windows } = groups;
    main.make_room(needed, config.offload_first, events, counters);
    main.allocate_device_blocks(needed, false, &mut request.blocks, events, counters);
    let mut fresh = Vec::with_capacity(needed);
    for (w, table) in windows.iter_mut().zip(&mut request.windows) {
        w.cache.make_room(needed, config.offload_first, events, counters);
        w.cache.allocate_device_blocks(needed, false, &mut fresh, events, counters);
        table.blocks.extend(fresh.drain(..).map(Some));
    }
    Ok(())
}
