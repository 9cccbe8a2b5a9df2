//! The C ABI: the only `extern "C"` code of the crate.
//!
//! `include/kvcore.h` is generated from this folder by cbindgen (see
//! `cbindgen.toml`; `tests/ffi.rs` regenerates it and fails on drift), so the
//! doc comments here *are* the C documentation: each export says what it
//! does, who owns what, which thread may call it, and which statuses it
//! returns. docs/c-api.md is the guide.
//!
//! The shared pieces (`status.rs`, `records.rs`, `boundary.rs`, `handle.rs`)
//! sit below the exporting files, which import them, and another exporting
//! file only for its C type, one way (`tests/layering.rs` checks that the
//! files form no cycle). The handle holds the GPU path's state as the core's
//! `kvcore::gpu::EngineGpu`:
//!
//! | file | imports from `ffi` |
//! |---|---|
//! | `status.rs`, `records.rs`, `version.rs` | nothing |
//! | `handle.rs` | `records.rs` (the records it buffers) |
//! | `boundary.rs` | `handle.rs`, `status.rs` |
//! | `lifecycle.rs`, `step.rs` | `boundary.rs`, `handle.rs`, `status.rs`; `lifecycle.rs` also `publisher.rs` (`check_endpoint`), `step.rs` also `records.rs` |
//! | `request.rs` | `boundary.rs`, `handle.rs`, `status.rs`, `gpu.rs` (`kvc_device_bytes`, `device_digests`) |
//! | `publisher.rs` | `boundary.rs`, `handle.rs`, `status.rs`, `request.rs` (`kvc_bytes`) |
//! | `gpu.rs`, `calllog.rs` | `boundary.rs`, `handle.rs`, `status.rs` |
//! | `fuzz.rs` | every export file, `handle.rs` (to check the state behind it) |
//!
//! | file | holds |
//! |---|---|
//! | `status.rs` | `kvc_status` and its one table of codes and messages, `kvc_status_str`, error-to-status mapping |
//! | `boundary.rs` | `ffi_boundary!` (panics), `try_*!` (pointers), `with_engine` (lock, poison, last error), buffer and string helpers |
//! | `handle.rs` | `kvc_engine` and the state behind its lock |
//! | `records.rs` | the flat records C drains: `kvc_event`, `kvc_block_copy`, their tier and kind codes |
//! | `lifecycle.rs` | `kvc_config`, `kvc_engine_new`/`_free`, `kvc_engine_last_error`, `kvc_engine_model_info` |
//! | `request.rs` | add, UUID list, info, block table, grow, commit, finish, cancel |
//! | `step.rs` | step, block copies, event records, evict, clear, counters |
//! | `gpu.rs` | GPU open, KV pool attach, block copies on the pool, digests of device-resident images |
//! | `publisher.rs` | wire-encoded drain, ZMQ publisher start/stop/endpoint/stats |
//! | `calllog.rs` | the call log switch: open (record every call into a file), close |
//! | `version.rs` | `KVCORE_VERSION_*`, `kvc_version` |
//! | `fuzz.rs` | the `c_api` fuzz target's driver: random calls through the exports, checked after each |
//!
//! Every submodule is private; the C surface is the flat list re-exported
//! below, named as in `include/kvcore.h`. cbindgen walks the submodules in
//! the order they are declared (alphabetical, as rustfmt sorts them), which
//! is the order of the header's functions: a new exporting file's name
//! decides where its functions appear.
//!
//! Every C struct that mirrors an engine type (`kvc_config`, `kvc_counters`,
//! `kvc_publisher_config`, `kvc_publisher_stats`, `kvc_request`,
//! `kvc_admission`, ...) is converted by naming every field on both sides
//! without `..`, so that a field added on one side fails to compile until it
//! is mirrored on the other.
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

mod boundary;
mod calllog;
mod fuzz;
mod gpu;
mod handle;
mod lifecycle;
mod publisher;
mod records;
mod request;
mod status;
mod step;
mod version;

pub use calllog::{kvc_engine_call_log_close, kvc_engine_call_log_open};
#[doc(hidden)]
pub use fuzz::{CallTally, c_api_calls};
pub use gpu::{
    kvc_device_bytes, kvc_engine_attach_kv_pool, kvc_engine_copy_blocks, kvc_engine_digest_device, kvc_engine_gpu_open,
    kvc_kv_pool,
};
pub use handle::kvc_engine;
pub use lifecycle::{
    KVC_CONFIG_BLOCK_SIZE_TOKENS_LIMIT, KVC_CONFIG_BLOCKS_DEVICE_LIMIT, KVC_CONFIG_BLOCKS_HOST_LIMIT,
    KVC_CONFIG_EVENT_BATCHES_LIMIT, KVC_CONFIG_MM_ITEMS_LIMIT, KVC_CONFIG_REQUESTS_LIMIT,
    KVC_CONFIG_ROUTING_HINTS_LIMIT, KVC_CONFIG_TOKEN_SLOTS_LIMIT, kvc_config, kvc_config_default, kvc_engine_free,
    kvc_engine_last_error, kvc_engine_model_info, kvc_engine_new, kvc_kv_transfer_role,
};
pub use publisher::{
    KVC_PUBLISHER_BUFFER_STEPS_LIMIT, KVC_PUBLISHER_QUEUE_CAPACITY_LIMIT, KVC_PUBLISHER_SEND_HWM_LIMIT,
    kvc_engine_drain_events_wire, kvc_engine_publisher_endpoint, kvc_engine_publisher_start,
    kvc_engine_publisher_stats, kvc_engine_publisher_stop, kvc_publisher_config, kvc_publisher_config_default,
    kvc_publisher_stats,
};
pub use records::{
    KVC_EVENT_FLAG_HAS_LORA_ID, KVC_EVENT_FLAG_HAS_PARENT, kvc_block_copy, kvc_event, kvc_event_kind, kvc_medium,
};
pub use request::{
    kvc_admission, kvc_bytes, kvc_engine_add_request, kvc_engine_block_table, kvc_engine_cancel, kvc_engine_commit,
    kvc_engine_finish, kvc_engine_grow, kvc_engine_request_info, kvc_engine_request_uuids, kvc_image_content,
    kvc_image_item, kvc_request, kvc_request_info, kvc_token_run, kvc_uuid_entry, kvc_uuid_list,
};
pub use status::{kvc_status, kvc_status_str};
pub use step::{
    kvc_counters, kvc_engine_block_copies, kvc_engine_clear, kvc_engine_counters, kvc_engine_drain_events,
    kvc_engine_events_pending, kvc_engine_evict, kvc_engine_step,
};
pub use version::{KVCORE_VERSION_MAJOR, KVCORE_VERSION_MINOR, KVCORE_VERSION_PATCH, kvc_version};

#[cfg(test)]
mod tests;
