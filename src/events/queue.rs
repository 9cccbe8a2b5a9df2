//! The per-step event queue.
//!
//! The queue sits below the resources: it names no resource, so the block
//! cache can push the events its verbs imply (a tier move's `Removed` and
//! `Stored`) in the same call. What closing a step needs from the resources
//! (a UUID for each image digest) comes in as a function, and what the
//! queue counts (events emitted, batches dropped) goes back as return
//! values for the caller's counters. The open step counts its block entries
//! so that the engine can close it early at its bound
//! ([`crate::EngineConfig::events_per_step_max`]).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::events::{AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, KvGroup, Tier};
use crate::keys::{BlockKey, ImageDigest};

/// The events of one closed step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventBatch {
    /// The step that produced them.
    pub step_index: u64,
    /// The events, in the order they happened.
    pub events: Vec<KvEvent>,
}

/// Events of the open step, and closed batches not yet drained.
#[derive(Debug, Default)]
pub struct EventQueue {
    enabled: bool,
    next_event_seq: u64,
    open: Vec<KvEvent>,
    /// Block entries in `open`: a stored or removed key counts one, a
    /// clear counts one.
    open_entries: usize,
    /// The bound on `open_entries` the engine closes the open batch at.
    open_max: usize,
    closed: VecDeque<EventBatch>,
    retain_max: usize,
    /// Removals announced by [`EventQueue::expect_removals`]: the next new
    /// `BlockRemoved` is sized for them, so that a burst does not regrow it.
    removals_expected: usize,
}

impl EventQueue {
    /// A queue; when `enabled` is false every push is a no-op. At most
    /// `retain_max` closed batches are kept for draining (see
    /// [`EventQueue::retain`]); once the open step holds `open_max` block
    /// entries, [`EventQueue::open_full`] says so and the caller closes it
    /// early.
    pub fn new(enabled: bool, retain_max: usize, open_max: usize) -> Self {
        Self { enabled, retain_max, open_max, ..Default::default() }
    }

    /// Block entries in the open step's events: each key a `BlockStored` or
    /// `BlockRemoved` names counts one, an `AllBlocksCleared` one.
    pub fn open_entries(&self) -> usize {
        self.open_entries
    }

    /// Whether the open step holds `open_max` block entries or more: the
    /// engine then closes it into a batch of its own without waiting for
    /// the step, so that the open step's events stay bounded.
    pub fn open_full(&self) -> bool {
        self.open_entries >= self.open_max
    }

    /// Whether events are produced at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn next_seq(&mut self) -> u64 {
        let s = self.next_event_seq;
        self.next_event_seq += 1;
        s
    }

    /// Appends a stored event; its `event_seq` is assigned here.
    pub fn push_stored(&mut self, mut e: BlockStored) {
        if !self.enabled || e.keys.is_empty() {
            return;
        }
        e.event_seq = self.next_seq();
        self.open_entries += e.keys.len();
        self.open.push(KvEvent::BlockStored(e));
    }

    /// Says that about `n` removals follow (a burst of evictions), so that
    /// the `BlockRemoved` the next one starts is sized for them. Only the
    /// vector's capacity depends on it, never an event.
    pub fn expect_removals(&mut self, n: usize) {
        self.removals_expected = n;
    }

    /// Records a removal from `group` (`None`: the single group of an engine
    /// that names none), merged into the previous event when that is a
    /// removal in the same tier and group (one event per burst of
    /// evictions).
    pub fn push_removed_in(&mut self, key: BlockKey, medium: Tier, group: Option<KvGroup>) {
        if let Some(keys) = self.removals_in(medium, group) {
            keys.push(key);
            self.count_entries(1);
        }
    }

    /// Counts `n` block entries into the open step: the keys a burst pushed
    /// into [`EventQueue::removals_in`]'s vector.
    pub fn count_entries(&mut self, n: usize) {
        if self.enabled {
            self.open_entries += n;
        }
    }

    /// The keys of the `BlockRemoved` that the next removal from `medium`
    /// and `group` goes into (the previous event when it is one of the same
    /// tier and group, a new one otherwise), for a burst of removals that
    /// pushes its keys there in order; `None` when events are off. The
    /// caller pushes at least one key (an event without keys would be
    /// delivered as it is) and then counts the keys it pushed with
    /// [`EventQueue::count_entries`].
    pub fn removals_in(&mut self, medium: Tier, group: Option<KvGroup>) -> Option<&mut Vec<BlockKey>> {
        if !self.enabled {
            return None;
        }
        let continues = matches!(
            self.open.last(),
            Some(KvEvent::BlockRemoved(last)) if last.medium == medium && last.group == group
        );
        if !continues {
            let event_seq = self.next_seq();
            let keys = Vec::with_capacity(std::mem::take(&mut self.removals_expected).max(1));
            self.open.push(KvEvent::BlockRemoved(BlockRemoved { event_seq, keys, medium, group }));
        }
        match self.open.last_mut() {
            Some(KvEvent::BlockRemoved(last)) => Some(&mut last.keys),
            _ => unreachable!("the open step ends with this removal event"),
        }
    }

    /// Records a cache reset.
    pub fn push_cleared(&mut self) {
        if !self.enabled {
            return;
        }
        let event_seq = self.next_seq();
        self.open_entries += 1;
        self.open.push(KvEvent::AllBlocksCleared(AllBlocksCleared { event_seq }));
    }

    /// Closes the open step (or, at its bound, the events it holds so far:
    /// the engine closes early with the same `step_index`): gives each image item of its events the UUID
    /// that `uuid_of` finds for its digest (the routing-hint lookup), in event
    /// order, and returns its events as a batch (the caller counts them,
    /// publishes the batch and/or keeps it with [`EventQueue::retain`]), or
    /// `None` when the step produced no event (no empty batch is made).
    pub fn close_step(
        &mut self,
        step_index: u64,
        mut uuid_of: impl FnMut(&ImageDigest) -> Option<Arc<str>>,
    ) -> Option<EventBatch> {
        if self.open.is_empty() {
            return None;
        }
        let mut events = std::mem::take(&mut self.open);
        self.open_entries = 0;
        for e in &mut events {
            if let KvEvent::BlockStored(s) = e {
                for image in &mut s.images {
                    image.uuid = uuid_of(&image.digest);
                }
            }
        }
        Some(EventBatch { step_index, events })
    }

    /// Most closed batches kept for draining.
    pub fn retain_max(&self) -> usize {
        self.retain_max
    }

    /// Keeps a closed batch for draining. When `retain_max` batches are
    /// already waiting, the oldest is dropped (all of them when `retain_max`
    /// is 0, this one included), so memory stays bounded when nobody drains.
    /// Returns how many batches were dropped, for the caller's counters.
    #[must_use = "dropped batches are counted"]
    pub fn retain(&mut self, batch: EventBatch) -> u64 {
        if self.retain_max == 0 {
            return 1;
        }
        let mut dropped = 0;
        while self.closed.len() >= self.retain_max {
            self.closed.pop_front();
            dropped += 1;
        }
        self.closed.push_back(batch);
        dropped
    }

    /// Closed batches waiting for a drain.
    pub fn closed_len(&self) -> usize {
        self.closed.len()
    }

    /// Takes every closed batch, oldest first.
    pub fn drain(&mut self) -> Vec<EventBatch> {
        self.closed.drain(..).collect()
    }

    /// Takes every closed event, flattened, oldest first. A single batch
    /// hands its own vector over.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        if self.closed.len() == 1 {
            return self.closed.pop_front().map(|b| b.events).unwrap_or_default();
        }
        self.closed.drain(..).flat_map(|b| b.events).collect()
    }
}
