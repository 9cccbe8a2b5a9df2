//! Resources: the engine's singletons (the block pool and its LRUs, the prefix
//! index, the routing-hint table, counters, the pending block copies).

mod block_pool;
mod counters;
mod lru;
mod routing_hints;
mod scopes;

pub use block_pool::{BlockCopy, KvCache, PageRef, copy_waves};
pub use counters::Counters;
pub use lru::Lru;
pub use routing_hints::{HintInsert, RoutingHints};
pub use scopes::Scopes;
