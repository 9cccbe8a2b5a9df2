//! The C ABI: the only `extern "C"` code of the crate.
//!
//! `include/kvcore.h` is generated from this folder by cbindgen (see
//! `cbindgen.toml`; `tests/ffi.rs` regenerates it and fails on drift), so the
//! doc comments here *are* the C documentation: each export says what it
//! does, who owns what, which thread may call it, and which statuses it
//! returns. docs/c-api.md is the guide.
//!
//! | file | holds |
//! |---|---|
//! | `status.rs` | `kvc_status`, `kvc_status_str`, error-to-status mapping |
//! | `boundary.rs` | `ffi_boundary!` (panics), `try_*!` (pointers), `with_engine` (lock, poison, last error) |
//! | `handle.rs` | `kvc_config`, `kvc_engine_new`/`_free`, `kvc_engine_last_error`, `kvc_engine_model_info` |
//! | `request.rs` | add, UUID list, info, block table, grow, commit, finish, cancel |
//! | `step.rs` | step, block copies, event records, evict, clear, counters |
//! | `gpu.rs` | GPU open, KV pool attach, block copies on the pool, digests of device-resident images |
//! | `publisher.rs` | wire-encoded drain, ZMQ publisher start/stop/endpoint/stats |
//! | `version.rs` | `KVCORE_VERSION_*`, `kvc_version` |
//!
//! Rules every export follows:
//!
//! 1. It returns `kvc_status` (0 is success) unless it cannot fail.
//! 2. `_out` parameters are written only on success.
//! 3. Every pointer is checked for NULL and alignment before use.
//! 4. A panic is caught at the boundary: `KVC_STATUS_PANIC`, and the engine is
//!    poisoned (`KVC_STATUS_POISONED` from then on).
//! 5. Ids cross as `uint64_t`; a stale id gives `KVC_STATUS_UNKNOWN_ID`.
//! 6. No global state: every piece of state hangs off a `kvc_engine`.

#![allow(non_camel_case_types, reason = "C type names are written exactly as they appear in the header")]

pub(crate) mod boundary;
pub mod gpu;
pub mod handle;
pub mod publisher;
pub mod request;
pub mod status;
pub mod step;
pub mod version;

#[cfg(test)]
mod tests;
