//! The engine handle: the opaque `kvc_engine` and the state behind its lock.
//!
//! A `kvc_engine` is a `Box` that C owns between `kvc_engine_new` and
//! `kvc_engine_free`. Everything a call needs lives behind the handle's
//! mutex: the engine, the deployment facts for `model_info`, the last error
//! message, the poison flag and the buffers that C drains (block copies,
//! closed event batches). Nothing is global, so any number of engines can
//! live in one process, each used by one thread at a time.
//!
//! Closed event batches move from the engine's queue to the handle when a
//! step closes, and wait there in [`HeldBatches`] for either drain. Whatever
//! the caller calls in whatever order, the handle holds at most
//! `event_batches_max` of them (the oldest is dropped and counted when a
//! step closes one more), each with at most one flattened and one encoded
//! form: a drain that takes a few records, a size query, a wire buffer that
//! is too small or a pending count never moves a batch anywhere else.
//!
//! This module is below every export: it names the records it buffers and the
//! GPU state it holds, and no export module.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::capabilities::Deployment;
use crate::engine::Engine;
use crate::events::EventBatch;
use crate::gpu::EngineGpu;

use super::records::{kvc_block_copy, kvc_event, record_count};

/// An engine. Opaque: create with `kvc_engine_new`, destroy with
/// `kvc_engine_free`.
pub struct kvc_engine {
    pub(crate) state: Mutex<EngineState>,
}

// The threading contract (an engine may move between threads; calls on it are
// serialised by its mutex) holds only if the handle is Send and Sync.
const _: fn() = || {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<kvc_engine>();
};

impl kvc_engine {
    /// A handle around a new engine in its deployment: no error yet, not
    /// poisoned, nothing to drain, no GPU open.
    pub(crate) fn new(engine: Engine, deployment: Deployment) -> Self {
        let state = EngineState {
            engine,
            configured_endpoint: deployment.kv_events_endpoint.clone(),
            deployment,
            last_error: String::new(),
            poisoned: false,
            copies: Vec::new(),
            held: HeldBatches::default(),
            gpu: EngineGpu::default(),
        };
        Self { state: Mutex::new(state) }
    }
}

/// What lives behind a handle.
pub(crate) struct EngineState {
    /// The engine itself.
    pub engine: Engine,
    /// Deployment facts for `model_info`. A running publisher's bound
    /// endpoint replaces `kv_events_endpoint` here while it runs.
    pub deployment: Deployment,
    /// `kv_events_endpoint` as the configuration gave it: what a stopped
    /// publisher leaves behind, as if none had ever run.
    pub configured_endpoint: Option<String>,
    /// The message of the last failed call; empty after a successful one.
    pub last_error: String,
    /// Set when a call panicked: the engine's invariants may be broken.
    pub poisoned: bool,
    /// The block copies of the last closed step.
    pub copies: Vec<kvc_block_copy>,
    /// Closed event batches not yet drained, at most `event_batches_max`.
    pub held: HeldBatches,
    /// The GPU path: the open device, the attached KV pool, pending copies.
    pub gpu: EngineGpu,
}

/// One closed batch waiting on the handle, with the forms the drains made of
/// it so far.
pub(crate) struct HeldBatch {
    /// The batch.
    pub batch: EventBatch,
    /// Its records, flattened when a record drain first reaches it.
    pub records: Option<Vec<kvc_event>>,
    /// Records already handed out by `kvc_engine_drain_events`.
    pub records_taken: usize,
    /// Its wire payload, encoded when a wire call first reaches it (so a
    /// size query and the copy after it see the same bytes).
    pub payload: Option<Vec<u8>>,
}

/// The closed batches a handle holds for the drains, oldest first.
#[derive(Default)]
pub(crate) struct HeldBatches {
    /// The batches.
    pub batches: VecDeque<HeldBatch>,
    /// Batches dropped here because `event_batches_max` were waiting when a
    /// step closed another; added to `kvc_counters.event_batches_dropped`.
    pub dropped: u64,
}

impl HeldBatches {
    /// Moves the engine's closed batches here, then drops the oldest until at
    /// most `max` wait (each counted in `dropped`).
    pub fn absorb(&mut self, engine: &mut Engine) {
        let max = engine.config().event_batches_max as usize;
        for batch in engine.drain_batches() {
            self.batches.push_back(HeldBatch { batch, records: None, records_taken: 0, payload: None });
        }
        while self.batches.len() > max {
            self.batches.pop_front();
            self.dropped += 1;
        }
    }

    /// Records not yet drained, counted without flattening anything.
    pub fn records_pending(&self) -> usize {
        self.batches.iter().map(|h| record_count(&h.batch) - h.records_taken).sum()
    }
}
