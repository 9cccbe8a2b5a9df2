//! The router: the consumer side of the event stream.
//!
//! It is built on the wire format alone ([`kvcore::wire`]), never on
//! engine internals, so whatever it can do an outside router can do too.
//!
//! | module | what |
//! |---|---|
//! | [`hashing`] | router keys, and a request's keys from token ids and image placements |
//! | [`profiles`] | text and images to token ids: chat template and image placeholder expansion per model |
//! | [`indexer`] | which worker holds which block in which tier; longest-prefix lookups |
//! | [`scoring`] | the decision: overlap per tier against load |
//! | [`subscriber`] | ZMQ SUB per worker, gap and restart detection, replay and snapshot recovery |
//! | [`workload`] | synthetic event workloads for benches and tests |
//! | [`table`] | the open-addressing hash table the indexer keeps its large maps in |
//!
//! See `docs/router.md` for the key scheme and the recovery protocol.

pub mod hashing;
pub mod indexer;
pub mod profiles;
pub mod scoring;
pub mod subscriber;
pub mod table;
pub mod workload;

pub use hashing::{
    HashedRequest, ImagePlacement, ImageRef, RouterKey, RouterScope, TokenRequest, UuidLookup, UuidResolver,
    hash_request,
};
pub use indexer::{Indexer, IndexerConfig, IndexerCounters, MemoryReport, Overlap, WorkerId};
pub use kvcore::Tier;
pub use profiles::{ImageInput, Message, ModelProfile, Part};
pub use scoring::{Decision, ScoringConfig, decide};
pub use subscriber::{Subscriber, SubscriberConfig, SubscriberCounters};
