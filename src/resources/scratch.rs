//! Reusable buffers of the per-request systems, so that an engine in its
//! steady state allocates nothing (docs/architecture.md, "Allocations in the
//! steady state").
//!
//! Two kinds: working buffers that a call clears and fills and that keep
//! their capacity between calls (a block's keyed tokens and image runs, the
//! blocks an admission matched, the runs it sorts), and the vectors of
//! finished requests (tokens, blocks, keys, runs, items), which the next
//! admission takes back instead of allocating its own. At most as many
//! finished requests' vectors are kept as requests ever lived at once
//! (`requests_max` bounds both), each cleared, so what is kept is what the
//! busiest moment needed.

use crate::ids::{BlockId, MmItemId};
use crate::keys::{BlockKey, FlatRun, ImageDigest, ImageRun, KeyScope, root_key};
use crate::tables::Request;

/// The vectors a request row owns, empty, kept for the next admission.
#[derive(Debug, Default)]
pub struct RowBuffers {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Image items.
    pub items: Vec<MmItemId>,
    /// Flattened image runs.
    pub runs: Vec<FlatRun>,
    /// The block table.
    pub blocks: Vec<BlockId>,
    /// The block keys.
    pub keys: Vec<BlockKey>,
}

/// The systems' reusable buffers (see the module docs). Each call clears a
/// working buffer before it fills it, so what one call left there means
/// nothing to the next; only the capacity carries over.
#[derive(Debug, Default)]
pub struct Scratch {
    /// One block's keyed tokens (placeholders at image positions).
    pub tokens: Vec<u32>,
    /// One block's image runs.
    pub block_runs: Vec<ImageRun>,
    /// Commit's second pair of the two above: one pair holds the block it
    /// indexes and advertises while it hashes the next block with the other,
    /// and the two swap roles at each block.
    pub advertised_tokens: Vec<u32>,
    /// Image runs of the block commit indexes (see `advertised_tokens`).
    pub advertised_runs: Vec<ImageRun>,
    /// The blocks an admission matched.
    pub matched: Vec<BlockId>,
    /// An admission's item digests, in item order.
    pub digests: Vec<ImageDigest>,
    /// An admission's runs before sorting: start, length, item offset, item.
    pub flat: Vec<(u32, u32, u32, usize)>,
    /// Finished requests' vectors, cleared.
    spare_rows: Vec<RowBuffers>,
    /// The root key of the plain scope (no LoRA, no salt) and the block
    /// size it was computed for: most requests' root, hashed once.
    plain_root: Option<(u32, BlockKey)>,
}

impl Scratch {
    /// The root key of `scope`, from the one kept for the plain scope when
    /// `scope` is that one.
    pub fn root_key(&mut self, scope: &KeyScope) -> BlockKey {
        if scope.lora_id.is_some() || scope.cache_salt.is_some() {
            return root_key(scope);
        }
        match self.plain_root {
            Some((bs, root)) if bs == scope.block_size_tokens => root,
            _ => {
                let root = root_key(scope);
                self.plain_root = Some((scope.block_size_tokens, root));
                root
            }
        }
    }

    /// Empty vectors for a new request row: a finished request's (capacity
    /// kept) when one is spare, new (unallocated) ones otherwise.
    pub fn take_row(&mut self) -> RowBuffers {
        self.spare_rows.pop().unwrap_or_default()
    }

    /// Keeps a removed request row's vectors for the next admission.
    pub fn give_row(&mut self, request: Request) {
        let Request { mut tokens, mut items, mut runs, mut blocks, mut keys, .. } = request;
        tokens.clear();
        items.clear();
        runs.clear();
        blocks.clear();
        keys.clear();
        self.spare_rows.push(RowBuffers { tokens, items, runs, blocks, keys });
    }

    /// Keeps the vectors of a row that was never inserted (validation
    /// succeeded, admission then refused).
    pub fn give_buffers(&mut self, mut row: RowBuffers) {
        row.tokens.clear();
        row.items.clear();
        row.runs.clear();
        row.blocks.clear();
        row.keys.clear();
        self.spare_rows.push(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept plain root is the root of the scope asked for, whatever the
    /// block size, LoRA or salt of the scope asked before.
    #[test]
    fn root_key_is_the_scopes_root() {
        let mut scratch = Scratch::default();
        let scopes = [
            KeyScope { block_size_tokens: 16, ..Default::default() },
            KeyScope { block_size_tokens: 16, lora_id: Some(3), cache_salt: None },
            KeyScope { block_size_tokens: 16, ..Default::default() },
            KeyScope { block_size_tokens: 32, ..Default::default() },
            KeyScope { block_size_tokens: 32, lora_id: None, cache_salt: Some(b"s".to_vec()) },
            KeyScope { block_size_tokens: 16, ..Default::default() },
        ];
        for scope in &scopes {
            assert_eq!(scratch.root_key(scope), root_key(scope), "{scope:?}");
        }
    }
}
