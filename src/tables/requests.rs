//! The request table.

use std::sync::Arc;

use slotmap::SlotMap;

use crate::ids::{BlockId, MmItemId, RequestId, ScopeId};
use crate::keys::{BlockKey, FlatRun};

/// What scopes a request's cache chain, shared by every block it advertises
/// (so a block can be re-advertised after its request is gone).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RequestScope {
    /// LoRA adapter id.
    pub lora_id: Option<u32>,
    /// LoRA adapter name, carried on the wire (Dynamo seeds its keys with it).
    pub lora_name: Option<Arc<str>>,
    /// Cache salt: requests with different salts never share blocks.
    pub cache_salt: Option<Arc<str>>,
}

/// A request row.
#[derive(Clone, Debug)]
pub struct Request {
    /// Token ids as the caller gave them: the prompt, then generated tokens.
    pub tokens: Vec<u32>,
    /// Tokens in the prompt.
    pub prompt_len: u32,
    /// LoRA and salt, interned in the cache's scope table.
    pub scope: ScopeId,
    /// The root key of the request's chain (derived from the scope).
    pub root: BlockKey,
    /// The request's image items, in the order given.
    pub items: Vec<MmItemId>,
    /// Image runs over all items, sorted by start.
    pub runs: Vec<FlatRun>,
    /// The UUID list exactly as given (absent when none was given).
    pub uuids: Option<Vec<Option<String>>>,
    /// The block table of group 0 (full attention, the only group of an
    /// engine that is not hybrid): block `i` holds tokens `[i*B, (i+1)*B)`.
    pub blocks: Vec<BlockId>,
    /// The block tables of the sliding-window groups (groups 1.., in order),
    /// as long as `blocks`.
    pub windows: Vec<WindowTable>,
    /// Keys of the leading full blocks computed so far (a prefix of `blocks`).
    pub keys: Vec<BlockKey>,
    /// Tokens whose KV the caller has reported as computed (includes cached ones).
    pub tokens_computed: u32,
    /// Tokens matched in the prefix cache at admission.
    pub tokens_cached: u32,
    /// Leading blocks that are full, computed and processed by commit.
    pub blocks_committed: u32,
    /// A warm-up request: allocates like any other, never indexed, no events.
    pub dummy: bool,
}

/// A request's block table in one sliding-window group: block `i` holds
/// tokens `[i*B, (i+1)*B)` of that group's layers, or nothing once it fell
/// out of the window (released early; the C block table names the group's
/// null page there).
#[derive(Clone, Debug)]
pub struct WindowTable {
    /// The blocks, `None` before `released`.
    pub blocks: Vec<Option<BlockId>>,
    /// Leading blocks released (or never taken, when admission matched past
    /// them): every entry before it is `None`, every one from it `Some`.
    pub released: u32,
    /// The request's scope, interned in that group's scope table (each
    /// group's cache keeps its own, which its advertised blocks name).
    pub scope: ScopeId,
}

/// The request table.
#[derive(Debug, Default)]
pub struct Requests {
    /// Rows.
    pub rows: SlotMap<RequestId, Request>,
}

impl Requests {
    /// An empty table with room for `capacity` rows, or `None` when that
    /// memory cannot be allocated.
    pub fn try_with_capacity(capacity: usize) -> Option<Self> {
        let mut rows = SlotMap::with_key();
        rows.try_reserve(capacity).ok()?;
        Some(Self { rows })
    }

    /// Checks the table's own invariants; panics naming the one broken.
    /// `keyed` says whether commits key blocks (prefix reuse on).
    ///
    /// 1. `blocks_committed` full blocks are covered by `keys`, unless the
    ///    request is a dummy or blocks are not keyed at all.
    /// 2. Computed tokens never pass the request's tokens.
    /// 3. `tokens_cached <= tokens_computed`.
    /// 4. A request holds exactly the blocks its tokens need, in every group.
    /// 5. A sliding-window table holds nothing before `released` and a block
    ///    at every place from it.
    pub fn check_invariants(&self, block_size: u32, keyed: bool) {
        for (id, r) in &self.rows {
            if keyed && !r.dummy {
                assert!(
                    r.keys.len() >= r.blocks_committed as usize,
                    "invariant 1: keys cover committed blocks of {id:?}"
                );
            }
            assert!(r.tokens_computed as usize <= r.tokens.len(), "invariant 2: computed <= tokens for {id:?}");
            assert!(r.tokens_cached <= r.tokens_computed, "invariant 3: cached <= computed for {id:?}");
            assert!(
                r.blocks.len() == (r.tokens.len()).div_ceil(block_size as usize),
                "invariant 4: a request holds exactly the blocks its tokens need ({id:?})"
            );
            for w in &r.windows {
                assert_eq!(w.blocks.len(), r.blocks.len(), "invariant 4: window table length of {id:?}");
                for (i, b) in w.blocks.iter().enumerate() {
                    assert_eq!(b.is_some(), i >= w.released as usize, "invariant 5: window entry {i} of {id:?}");
                }
            }
        }
    }
}
