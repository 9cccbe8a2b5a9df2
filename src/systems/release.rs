//! Release: a finished or cancelled request drops its references. Cached
//! blocks that nobody references go to the device LRU and stay matchable;
//! blocks that were never cached go straight back to the free pages (both
//! through [`KvCache::release`]).

use crate::error::RequestError;
use crate::ids::RequestId;
use crate::resources::{KvCache, Scratch};
use crate::tables::{MmItems, Requests};

/// Removes a request and its items, releasing its blocks in reverse order so
/// that a chain's deepest blocks are the first evicted. The row's vectors go
/// to `scratch` for the next admission.
pub fn release_request(
    requests: &mut Requests,
    items: &mut MmItems,
    id: RequestId,
    cache: &mut KvCache,
    scratch: &mut Scratch,
) -> Result<(), RequestError> {
    let request = requests.rows.remove(id).ok_or(RequestError::UnknownRequest)?;
    cache.release_scope(request.scope);
    for &item in &request.items {
        items.rows.remove(item);
    }
    for &b in request.blocks.iter().rev() {
        cache.release(b);
    }
    scratch.give_row(request);
    Ok(())
}
