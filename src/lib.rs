//! # kvcore
//!
//! The KV-cache core of an LLM serving engine: paged KV blocks with
//! content-addressed prefix reuse, image items whose content (never their
//! UUID) is their cache identity, and the stream of KV-cache events that tells
//! a KV-aware router which worker holds which prefix.
//!
//! The shape is data-oriented: requests, blocks and image items are rows in
//! `slotmap` tables; singletons such as the block pool, the prefix index and
//! the routing-hint table are resources; behaviour lives in plain functions
//! (systems) that name the data they read and write; [`Engine`] owns it all.
//! See `docs/architecture.md`.
//!
//! Every module is private: the list below is the API. Three namespaces group
//! what is used together: [`wire`] (the event stream's encoding and
//! protocol, all a router needs besides the key recipes), [`gpu`] (the CUDA
//! path and its CPU twins) and [`ffi`] (the C ABI, which `include/kvcore.h`
//! declares).
//!
//! ```
//! use kvcore::{Engine, EngineConfig, RequestSpec};
//! let mut engine = Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 8, ..Default::default() }).unwrap();
//! let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
//! let a = engine.add_request(&RequestSpec { tokens: &prompt, ..Default::default() }).unwrap();
//! engine.commit(a.id, 9).unwrap(); // the forward pass wrote all 9 tokens
//! engine.finish(a.id).unwrap();
//! engine.step();
//! assert_eq!(engine.drain_events().len(), 1); // one BlockStored with two blocks
//! let b = engine.add_request(&RequestSpec { tokens: &prompt, ..Default::default() }).unwrap();
//! assert_eq!(b.tokens_cached, 8); // two full blocks reused
//! ```

#![deny(unsafe_code)]

mod call_log;
mod capabilities;
mod config;
mod copy;
mod engine;
mod error;
mod events;
// The C ABI needs raw pointers; every `unsafe` block there names its invariant.
#[allow(unsafe_code, reason = "the C ABI (src/ffi) is one of the places allowed to hold unsafe code")]
pub mod ffi;
// Not API: the fuzz targets' entry points (fuzz/), kept in the library so that
// their seeds also run under `cargo test` against the library as it is built
// for the other tests (a feature would build it a second time).
#[doc(hidden)]
pub mod fuzzing;
// The GPU path launches kernels and hands device addresses to the driver,
// which Rust cannot check; every unsafe block there names its invariant.
#[allow(unsafe_code, reason = "kernel launches and driver calls need unsafe; each block has a SAFETY comment")]
pub mod gpu;
mod group;
mod ids;
mod keys;
mod outbound;
mod replay;
mod resources;
mod systems;
mod tables;
mod tier;

pub use call_log::{
    CALL_LOG_MAGIC, CALL_LOG_VERSION, CallKind, CallLogError, CallLogReader, CallRecord, LoggedCall, LoggedItem,
    LoggedRequest, OutputKind,
};
pub use capabilities::{
    Deployment, IMAGE_ROUTING_VERSION, ImageRoutingGates, KvTransfer, ModelFamily, VALIDATED_FAMILIES, model_info,
    validated_family,
};
pub use config::{
    EVENTS_PER_STEP_MIN, EngineConfig, GROUPS_LIMIT, GroupConfig, QWEN_IMAGE_PAD_TOKEN, UUID_HINT_BYTES_MAX,
    WINDOW_TOKENS_LIMIT,
};
pub use engine::{Admission, CachedBlock, Engine, GroupUsage, MmContent, MmItemSpec, RequestInfo, RequestSpec};
pub use error::{AdmitError, ConfigError, RequestError};
pub use events::profile::HashProfile;
pub use events::publisher::{HEARTBEAT_MS_DEFAULT, PublishError, Publisher, PublisherConfig, PublisherStats};
pub use events::{AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, EventImage, EventImageRun, KvEvent};
pub use group::{GroupKind, KIND_FULL_ATTENTION, KIND_SLIDING_WINDOW, KvGroup};
pub use ids::{BlockId, FfiId, MmItemId, RequestId};
pub use keys::{
    BLOCK_KEY_ALGORITHM, BlockKey, FlatRun, ImageDigest, ImageRun, KeyScope, WireHash, block_content_hash,
    block_content_hashes, block_content_hashes_extend, block_content_hashes_fold, block_hash, block_key, key_of_block,
    mm_hash, mm_hash_of_identifier, root_key,
};
pub use outbound::{PublisherError, VacantPublisher};
pub use replay::{Divergence, ReplayReport, replay_calls};
pub use resources::{BlockCopy, Counters, PageRef, copy_waves};
pub use tables::TokenRun;
pub use tier::Tier;

/// The event stream's contract: the msgpack encoding of event batches (both
/// the map and the positional form), the decoded wire types a consumer works
/// from, and the publisher's replay and snapshot protocol. `docs/wire-format.md`
/// is its specification; a router needs nothing of the engine beyond this and
/// the key recipes.
pub mod wire {
    pub use crate::events::codec::{
        DecodeError, EncodeOptions, EventForm, decode_message, decode_payload, encode_events, encode_payload,
        seq_frame, wire_event,
    };
    pub use crate::events::profile::{
        HASH_PROFILE_VERSION, HashProfile, MM_HASH_RECIPE, ProfileGroup, SCOPE_RULE, WIRE_HASH_RECIPE,
    };
    pub use crate::events::publisher::{END_SEQ, PROFILE_REQUEST, SNAPSHOT_REQUEST, endpoint_for_rank};
    pub use crate::events::wire::{
        ImageRoutingV1, WireBatch, WireBlockRemoved, WireBlockStored, WireEvent, WireImageItem, WireImageRef,
        WireMessage, WireMmInfo, WireMmObject,
    };
}

/// The README's example runs as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
