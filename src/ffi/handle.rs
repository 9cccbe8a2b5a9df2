//! The engine handle: the opaque `kvc_engine` and the state behind its lock.
//!
//! A `kvc_engine` is a `Box` that C owns between `kvc_engine_new` and
//! `kvc_engine_free`. Everything a call needs lives behind the handle's
//! mutex: the engine, the deployment facts for `model_info`, the last error
//! message, the poison flag and the buffers that C drains (block copies,
//! flattened events, wire payloads). Nothing is global, so any number of
//! engines can live in one process, each used by one thread at a time.
//!
//! This module is below every export: it names the records it buffers and the
//! GPU state it holds, and no export module.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::capabilities::Deployment;
use crate::engine::Engine;
use crate::gpu::EngineGpu;

use super::records::{kvc_block_copy, kvc_event};

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
            deployment,
            last_error: String::new(),
            poisoned: false,
            copies: Vec::new(),
            events: VecDeque::new(),
            wire: VecDeque::new(),
            gpu: EngineGpu::default(),
        };
        Self { state: Mutex::new(state) }
    }
}

/// What lives behind a handle.
pub(crate) struct EngineState {
    /// The engine itself.
    pub engine: Engine,
    /// Deployment facts for `model_info`.
    pub deployment: Deployment,
    /// The message of the last failed call; empty after a successful one.
    pub last_error: String,
    /// Set when a call panicked: the engine's invariants may be broken.
    pub poisoned: bool,
    /// The block copies of the last closed step.
    pub copies: Vec<kvc_block_copy>,
    /// Closed events flattened to records, not yet drained.
    pub events: VecDeque<kvc_event>,
    /// Closed batches encoded as wire payloads, not yet drained.
    pub wire: VecDeque<Vec<u8>>,
    /// The GPU path: the open device, the attached KV pool, pending copies.
    pub gpu: EngineGpu,
}
