//! # kvcore
//!
//! The KV-cache core of an LLM serving engine: paged KV blocks with
//! content-addressed prefix reuse, image items whose content (never their
//! UUID) is their cache identity, and the stream of KV-cache events that tells
//! a KV-aware router which worker holds which prefix.
//!
//! The shape is data-oriented: requests, blocks and image items are rows in
//! `slotmap` tables ([`tables`]); singletons such as the block pool, the prefix
//! index and the routing-hint table are [`resources`]; behaviour lives in plain
//! functions in [`systems`]; [`Engine`] owns it all. See `docs/architecture.md`.
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

pub mod bench;
pub mod capabilities;
pub mod config;
pub mod engine;
pub mod error;
pub mod events;
// The C ABI needs raw pointers; every `unsafe` block there names its invariant.
#[allow(unsafe_code, reason = "the C ABI (src/ffi) is one of the two places allowed to hold unsafe code")]
pub mod ffi;
pub mod fuzzing;
// The GPU path launches kernels and hands device addresses to the driver,
// which Rust cannot check; every unsafe block there names its invariant.
#[allow(unsafe_code, reason = "kernel launches and driver calls need unsafe; each block has a SAFETY comment")]
pub mod gpu;
pub mod ids;
pub mod keys;
pub mod resources;
pub mod router;
pub mod sim;
pub mod systems;
pub mod tables;

pub use config::EngineConfig;
pub use engine::{Admission, Engine, MmContent, MmItemSpec, RequestInfo, RequestSpec};
pub use error::{AdmitError, ConfigError, RequestError};
pub use events::{BlockRemoved, BlockStored, KvEvent, Medium};
pub use ids::{BlockId, FfiId, MmItemId, RequestId};
pub use keys::{BlockKey, ImageDigest, WireHash};
pub use tables::TokenRun;

/// The README's example runs as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
