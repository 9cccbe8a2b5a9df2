//! Release: a finished or cancelled request drops its references. Cached
//! blocks that nobody references go to the device LRU and stay matchable;
//! blocks that were never cached go straight back to the free pages (both
//! through [`KvCache::release`]).

use crate::error::RequestError;
use crate::ids::RequestId;
use crate::resources::{KvGroups, Scratch};
use crate::tables::{MmItems, Requests};

/// Removes a request and its items, releasing its blocks in every group in
/// reverse order so that a chain's deepest blocks are the first evicted. The
/// row's vectors go to `scratch` for the next admission.
pub fn release_request(
    requests: &mut Requests,
    items: &mut MmItems,
    id: RequestId,
    groups: &mut KvGroups,
    scratch: &mut Scratch,
) -> Result<(), RequestError> {
    let request = requests.rows.remove(id).ok_or(RequestError::UnknownRequest)?;
    for (w, table) in groups.windows.iter_mut().zip(&request.windows) {
        w.cache.release_scope(table.scope);
        for b in table.blocks.iter().rev().flatten() {
            w.cache.release(*b);
        }
    }
    let cache = &mut groups.main;
    cache.release_scope(request.scope);
    for &item in &request.items {
        items.rows.remove(item);
    }
    cache.release_rev(&request.blocks);
    scratch.give_row(request);
    Ok(())
}
