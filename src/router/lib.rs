//! The router: the consumer side of the event stream.
//!
//! It is built on the wire format alone ([`kvcore::wire`]), never on
//! engine internals, so whatever it can do an outside router can do too.
//!
//! Every module is private and the list of `pub use` below is the API, by
//! concern:
//!
//! | concern | items |
//! |---|---|
//! | a request's keys | [`hash_request`] of a [`TokenRequest`] (token ids and [`ImagePlacement`]s) into a [`HashedRequest`] of [`RouterKey`]s; [`RouterScope::text_keys`] of borrowed text tokens |
//! | images by UUID | [`UuidResolver`] (the [`Indexer`] is one, [`NoUuids`] knows none), [`UuidLookup`] |
//! | text and images to token ids | [`ModelProfile`] renders [`Message`]s of [`Part`]s through a tokenizer |
//! | which worker holds what | [`Indexer`]: events in, [`Overlap`]s per worker and [`Tier`] out |
//! | ingest on several threads | [`ShardedIndexer`]: the workers split over indexers, each shard's events applied on a thread of its own ([`ShardedError`]) |
//! | hybrid models | [`GroupViews`]: the KV cache groups beside the main one, and the prefix reusable in every group ([`GroupRole`], [`GroupCounters`]) |
//! | the decision | [`decide`] weighs overlap against load ([`ScoringConfig`]) into a [`Decision`] |
//! | the stream | [`Subscriber`]: ZMQ per worker, gap and restart detection, replay and snapshot recovery ([`Applied`] steps for followers) |
//! | Dynamo behind a fleet-wide view | [`Relay`] republishes each worker's stream with `mm_hash`es the whole fleet agrees on ([`RelayConfig`], [`RelayWorker`], [`RelayCounters`]) |
//! | benches and tests | [`EventWorkload`]: synthetic stored events shaped like Dynamo's benchmark |
//!
//! Inside, the modules depend on each other in one direction only:
//! `hashing` and `table` use nothing of the crate; `indexer` uses both;
//! `profiles` uses `hashing`; `scoring` uses `hashing` and `indexer`;
//! `groups` uses `hashing` and `indexer`; `sharded` uses both; `subscriber` uses `indexer` and
//! `groups`; `relay` uses `hashing`, `indexer` and
//! `subscriber`; `workload` stands alone.
//!
//! See `docs/router.md` for the key scheme and the recovery protocol.

#![forbid(unsafe_code)]

mod groups;
mod hashing;
mod indexer;
mod profiles;
mod relay;
mod scoring;
mod sharded;
mod subscriber;
mod table;
mod workload;

pub use groups::{GroupCounters, GroupRole, GroupViews};
pub use hashing::{
    HashError, HashedRequest, ImagePlacement, ImageRef, KeysStop, NoUuids, RouterKey, RouterScope, TokenRequest,
    UuidLookup, UuidResolver, hash_request, lora_identity,
};
pub use indexer::{Indexer, IndexerConfig, IndexerCounters, IndexerMemory, LOOKUP_CHUNK_BLOCKS, Overlap, WorkerId};
pub use kvcore::Tier;
pub use profiles::{
    ChatTemplate, ImageInput, ImageTokens, Message, ModelProfile, Part, ProfileError, QWEN_VISION_END_TOKEN,
    QWEN_VISION_START_TOKEN,
};
pub use relay::{Relay, RelayConfig, RelayCounters, RelayWorker};
pub use scoring::{Decision, ScoringConfig, WorkerScore, decide};
pub use sharded::{ShardedError, ShardedIndexer};
pub use subscriber::{Applied, SubscribeError, Subscriber, SubscriberConfig, SubscriberCounters, WorkerSync};
pub use workload::{EventWorkload, EventWorkloadSpec, removals_of};
