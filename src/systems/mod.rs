//! Systems: plain functions over the tables and resources they name.
//!
//! Per-request systems run when the caller calls them (a scheduler decides
//! *when*; kvcore decides *how*): [`admit::admit_request`],
//! [`allocate::grow_request`], [`commit::commit_computed`],
//! [`release::release_request`], [`evict::evict_device_blocks`],
//! [`clear::clear_cache`]. [`run_step`] is what closes a step;
//! [`close_events`] closes the events of one early, at their bound.
//!
//! A system holds policy and depends on tables, resources, events and keys
//! only, never on a sibling system: what two systems share (eviction under
//! pressure, re-advertising a block) is a verb of the block cache
//! ([`KvCache`]), which keeps the pool, index, LRUs and references in step.

pub mod admit;
pub mod allocate;
pub mod clear;
pub mod commit;
pub mod evict;
pub mod release;
pub mod snapshot;

use crate::events::{EventBatch, EventQueue};
use crate::resources::{BlockCopy, Counters, KvGroups, RoutingHints};

/// Closes a step, in this order:
///
/// 1. take the block copies queued by this step's allocations (every group's), because the
///    offloads and onboards they describe must land before the forward pass
///    that reuses those pages (the caller or the GPU system performs them);
/// 2. close the event batch, resolving UUID hints last so that every pairing
///    recorded during the step is seen, and a conflict found late in the step
///    still keeps an ambiguous UUID off the wire.
pub fn run_step(
    step_index: u64,
    groups: &mut KvGroups,
    hints: &mut RoutingHints,
    events: &mut EventQueue,
    counters: &mut Counters,
) -> (Vec<BlockCopy>, Option<EventBatch>) {
    // Group 0's copies first, then each window's, each group's in the order
    // queued; every copy names its group.
    let mut copies = groups.main.close_step();
    for w in &mut groups.windows {
        copies.append(&mut w.cache.close_step());
    }
    let batch = events.close_step(step_index, |digest| hints.lookup(digest, counters));
    if let Some(batch) = &batch {
        counters.events_emitted += batch.events.len() as u64;
    }
    (copies, batch)
}

/// Closes the open step's events alone, before the step ends (the engine
/// does when they reach their bound): UUID hints resolved as [`run_step`]
/// resolves them, the events counted. The block copies stay queued for the
/// step.
pub fn close_events(
    step_index: u64,
    hints: &mut RoutingHints,
    events: &mut EventQueue,
    counters: &mut Counters,
) -> Option<EventBatch> {
    let batch = events.close_step(step_index, |digest| hints.lookup(digest, counters));
    if let Some(batch) = &batch {
        counters.events_emitted += batch.events.len() as u64;
    }
    batch
}
