//! The msgpack codec of the event stream (docs/wire-format.md).
//!
//! Encoding is a projection then a write: [`wire_event`] turns a typed
//! [`KvEvent`](crate::events::KvEvent) into the
//! [`WireEvent`](crate::events::wire::WireEvent) a consumer will decode (block
//! keys become wire hashes, image items become `mm_hash` values and routing
//! metadata), and [`encode_payload`] writes it with the smallest msgpack
//! encoding of every integer, so that a batch's size is a property of its
//! content alone. The writer is hand-rolled over a `Vec<u8>` because that
//! makes every byte explicit and the write infallible.
//!
//! Decoding ([`decode_payload`], [`decode_message`]) faces bytes from the
//! network, so it is written to never panic, to allocate no more than the
//! input can justify (every element costs at least one input byte, so no
//! capacity exceeds the bytes left), to skip values iteratively (no recursion
//! an attacker can deepen) and to skip what it does not know: unknown fields,
//! unknown event types and unknown `image_routing` versions.
//!
//! | file | what |
//! |---|---|
//! | `layout.rs` | map or array form, the array form's field positions, the encoder's options |
//! | `project.rs` | typed events to wire events |
//! | `write.rs` | msgpack writes, smallest encoding first |
//! | `encode.rs` | wire events to payload bytes |
//! | `error.rs` | why bytes did not decode |
//! | `reader.rs` | msgpack reads, bounded by the bytes left; iterative skip |
//! | `tokens.rs` | token ids read in place, with and without a branch on the form |
//! | `decode.rs` | messages and payloads to wire events |
//!
//! The files depend one way: `encode` on `project`, `write` and `layout`;
//! `decode` on `reader`, `tokens`, `error` and `layout`; `tokens` on
//! `reader`; `reader` on `error`. This file only lists them.

mod decode;
mod encode;
mod error;
mod layout;
mod project;
mod reader;
mod tokens;
mod write;

pub use decode::{decode_message, decode_payload};
pub use encode::{encode_events, encode_payload, seq_frame};
pub use error::DecodeError;
pub use layout::{EncodeOptions, EventForm};
pub use project::wire_event;
