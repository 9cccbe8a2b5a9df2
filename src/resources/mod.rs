//! Resources: the engine's singletons (the block cache with its pool, LRUs,
//! prefix index, scopes and pending block copies; the routing-hint table;
//! counters).
//!
//! Layering, one way: ids, keys and tiers, then tables, then events, then
//! resources, then systems. Resources use tables and events (the block
//! cache's verbs queue the events they imply); no table or event type names
//! a resource.

mod block_pool;
mod counters;
mod eviction;
mod groups;
mod kv_cache;
mod lru;
mod routing_hints;
mod scopes;
mod scratch;

pub use block_pool::{BlockCopy, PageRef, copy_waves};
pub use counters::Counters;
pub use groups::{KvGroups, WindowCache, window_first_block};
pub use kv_cache::{CommittedBlock, Entered, KvCache};
pub use lru::Lru;
pub use routing_hints::{HintInsert, RoutingHints};
pub use scopes::Scopes;
pub use scratch::{RowBuffers, Scratch};
