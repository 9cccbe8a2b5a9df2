//! The engine's own exports: its configuration (`kvc_config`), creation and
//! destruction, its last error, and its capability document.
//!
//! `kvc_config` mirrors [`EngineConfig`] and [`Deployment`]: both conversions
//! (the defaults, and a C config into the engine's) name every field on both
//! sides without `..`, so a field added on one side fails to compile until it
//! is mirrored on the other.

use std::ffi::c_char;

use crate::capabilities::{self, Deployment, KvTransfer};
use crate::config::{self, EngineConfig, GroupConfig};
use crate::engine::Engine;
use crate::group::GroupKind;

use super::boundary::{
    ffi_boundary, optional_str, try_out, try_ref, try_slice, try_slice_out, with_engine, without_engine,
};
use super::handle::kvc_engine;
use super::publisher::check_endpoint;
use super::status::{Failure, kvc_status};

/// Largest `kvc_config.block_size_tokens`.
pub const KVC_CONFIG_BLOCK_SIZE_TOKENS_LIMIT: u32 = 1024;
/// Largest `kvc_config.blocks_device` (2^22).
pub const KVC_CONFIG_BLOCKS_DEVICE_LIMIT: u32 = 4_194_304;
/// Largest `kvc_config.blocks_host` (2^22).
pub const KVC_CONFIG_BLOCKS_HOST_LIMIT: u32 = 4_194_304;
/// Largest `(blocks_device + blocks_host) * block_size_tokens` (2^30): the
/// token ids of every page are kept, 4 bytes each.
pub const KVC_CONFIG_TOKEN_SLOTS_LIMIT: u64 = 1_073_741_824;
/// Largest `kvc_config.requests_max` (2^20).
pub const KVC_CONFIG_REQUESTS_LIMIT: u32 = 1_048_576;
/// Largest `kvc_config.mm_items_max` (2^20).
pub const KVC_CONFIG_MM_ITEMS_LIMIT: u32 = 1_048_576;
/// Largest `kvc_config.routing_hints_max` (2^20).
pub const KVC_CONFIG_ROUTING_HINTS_LIMIT: u32 = 1_048_576;
/// Largest `kvc_config.event_batches_max` (2^16).
pub const KVC_CONFIG_EVENT_BATCHES_LIMIT: u32 = 65_536;
/// Most entries of `kvc_config.groups` (16).
pub const KVC_CONFIG_GROUPS_LIMIT: usize = 16;
/// Largest `kvc_group_config.window_tokens` (2^24).
pub const KVC_CONFIG_WINDOW_TOKENS_LIMIT: u32 = 16_777_216;

// The header's limits are the validator's.
const _: () = {
    assert!(KVC_CONFIG_BLOCK_SIZE_TOKENS_LIMIT == config::BLOCK_SIZE_TOKENS_LIMIT);
    assert!(KVC_CONFIG_BLOCKS_DEVICE_LIMIT == config::BLOCKS_DEVICE_LIMIT);
    assert!(KVC_CONFIG_BLOCKS_HOST_LIMIT == config::BLOCKS_HOST_LIMIT);
    assert!(KVC_CONFIG_TOKEN_SLOTS_LIMIT == config::TOKEN_SLOTS_LIMIT);
    assert!(KVC_CONFIG_REQUESTS_LIMIT == config::REQUESTS_LIMIT);
    assert!(KVC_CONFIG_MM_ITEMS_LIMIT == config::MM_ITEMS_LIMIT);
    assert!(KVC_CONFIG_ROUTING_HINTS_LIMIT == config::ROUTING_HINTS_LIMIT);
    assert!(KVC_CONFIG_EVENT_BATCHES_LIMIT == config::EVENT_BATCHES_LIMIT);
    assert!(KVC_CONFIG_GROUPS_LIMIT == config::GROUPS_LIMIT);
    assert!(KVC_CONFIG_WINDOW_TOKENS_LIMIT == config::WINDOW_TOKENS_LIMIT);
};

/// How KV data moves between workers (`kvc_config.kv_transfer_role`). Anything
/// but `KVC_KV_TRANSFER_ROLE_NONE` is disaggregated serving, which turns image
/// routing off.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvc_kv_transfer_role {
    /// Aggregated serving (the default).
    None = 0,
    /// This worker prefills and sends KV to decode workers.
    Producer = 1,
    /// This worker receives KV from prefill workers.
    Consumer = 2,
    /// Both.
    Both = 3,
}

/// Engine configuration. Fill it with `kvc_config_default`, then change the
/// fields you need: new fields get safe defaults that way. Each field's range
/// is given below; `kvc_engine_new` refuses a value outside it with
/// `KVC_STATUS_INVALID_CONFIG`, and a valid config whose tables this machine
/// cannot allocate with `KVC_STATUS_OUT_OF_MEMORY`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvc_config {
    /// Tokens per KV block, in `1..=KVC_CONFIG_BLOCK_SIZE_TOKENS_LIMIT`.
    pub block_size_tokens: u32,
    /// KV blocks on the device (GPU pages), in `1..=KVC_CONFIG_BLOCKS_DEVICE_LIMIT`;
    /// `(blocks_device + blocks_host) * block_size_tokens` is at most
    /// `KVC_CONFIG_TOKEN_SLOTS_LIMIT`.
    pub blocks_device: u32,
    /// KV blocks in the pinned host tier, in `0..=KVC_CONFIG_BLOCKS_HOST_LIMIT`;
    /// 0 turns the tier off.
    pub blocks_host: u32,
    /// The model's image placeholder token id (151655 for Qwen3-VL).
    pub image_placeholder_token_id: u32,
    /// Most requests alive at once, in `1..=KVC_CONFIG_REQUESTS_LIMIT`.
    pub requests_max: u32,
    /// Most tokens in one request (prompt plus generated), at least 1.
    pub tokens_per_request_max: u32,
    /// Most image items alive at once, over all requests, in
    /// `0..=KVC_CONFIG_MM_ITEMS_LIMIT`.
    pub mm_items_max: u32,
    /// Most image items in one request, at most `mm_items_max`.
    pub mm_items_per_request_max: u32,
    /// Most placement runs per image item, at least 1.
    pub runs_per_item_max: u32,
    /// Capacity of the digest-to-UUID routing-hint table, in
    /// `0..=KVC_CONFIG_ROUTING_HINTS_LIMIT`.
    pub routing_hints_max: u32,
    /// Most closed event batches kept for the drains, in
    /// `0..=KVC_CONFIG_EVENT_BATCHES_LIMIT`; when a step closes with that many
    /// unread (a batch partly drained counts until its last record is taken),
    /// the oldest is dropped and counted in `kvc_counters.event_batches_dropped`.
    /// With a publisher attached, 0 keeps none and publishes each batch
    /// without a copy. The open step's events are bounded too: a call that
    /// leaves `max(4096, 2 * (blocks_device + blocks_host))` block entries
    /// or more closes them into a batch of their own, with the same
    /// `step_index` (docs/c-api.md, "Memory a caller can make the engine
    /// hold").
    pub event_batches_max: u32,
    /// A `kvc_kv_transfer_role` value.
    pub kv_transfer_role: u32,
    /// Whether finished requests leave their blocks matchable (prefix reuse).
    pub block_reuse: bool,
    /// Whether KV-cache events are produced.
    pub kv_events: bool,
    /// Whether a request may reuse the leading tokens of a cached block it
    /// only partly matches: kvcore allocates a fresh block and queues a
    /// `kvc_block_copy` of those tokens, which the caller must perform before
    /// the forward pass. Off by default.
    pub partial_reuse: bool,
    /// Whether every device block a request takes the place of is offloaded
    /// before any host block is onboarded: a step's copies come in one or
    /// two waves instead of one per move when both tiers are full, for a
    /// lower hit rate (host blocks dropped to make room). Off by default.
    pub offload_first: bool,
    /// Whether the model takes image inputs.
    pub model_image_capable: bool,
    /// The model's Hugging Face `model_type` (e.g. "qwen3_vl"), NUL-terminated
    /// UTF-8, or NULL when unknown. Copied by `kvc_engine_new`.
    pub model_type: *const c_char,
    /// The ZMQ endpoint the KV-event publisher binds or will bind (e.g.
    /// "tcp://0.0.0.0:5557"), NUL-terminated UTF-8, or NULL for none. Copied by
    /// `kvc_engine_new`.
    pub kv_events_endpoint: *const c_char,
    /// The KV cache groups of a hybrid model, `groups_len` of them in group
    /// order, or NULL with `groups_len` 0 (the default) for one
    /// full-attention group with `blocks_device` and `blocks_host` pages,
    /// whose events and copies name no group. With groups: group 0 is the
    /// one full-attention group, every other a sliding window, at most
    /// `KVC_CONFIG_GROUPS_LIMIT` groups, `blocks_device` and `blocks_host`
    /// the sums of the groups' pages, `partial_reuse` off. Copied by
    /// `kvc_engine_new`.
    pub groups: *const kvc_group_config,
    /// Entries at `groups`.
    pub groups_len: usize,
}

/// What the layers of a KV cache group attend to.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvc_group_kind {
    /// Every earlier token (vLLM's `full_attention`).
    FullAttention = 0,
    /// The last `window_tokens` tokens (vLLM's `sliding_window`).
    SlidingWindow = 1,
}

/// One KV cache group of a hybrid model: its kind and its share of the
/// block budget, each group a paged pool of its own.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvc_group_config {
    /// A `kvc_group_kind` value.
    pub kind: u32,
    /// The window in tokens of a sliding-window group, in
    /// `1..=KVC_CONFIG_WINDOW_TOKENS_LIMIT`; 0 for full attention.
    pub window_tokens: u32,
    /// The group's device pages: at least 1, at least 2 for a sliding window,
    /// whose page 0 is its null page (never handed out; its block tables name
    /// it for the blocks a request released early, as vLLM's null block).
    pub blocks_device: u32,
    /// The group's pinned host pages; 0 gives the group no host tier.
    pub blocks_host: u32,
}

/// Converts the C description of the groups.
fn group_configs(c: &kvc_config) -> Result<Vec<GroupConfig>, Failure> {
    let groups: &[kvc_group_config] = try_slice!(c.groups, c.groups_len, "config.groups");
    if groups.len() > KVC_CONFIG_GROUPS_LIMIT {
        return Err(Failure::new(
            kvc_status::InvalidConfig,
            format!("invalid engine config: {} groups, at most {KVC_CONFIG_GROUPS_LIMIT}", groups.len()),
        ));
    }
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let kvc_group_config { kind, window_tokens, blocks_device, blocks_host } = *g;
            let kind = match kind {
                k if k == kvc_group_kind::FullAttention as u32 && window_tokens == 0 => GroupKind::FullAttention,
                k if k == kvc_group_kind::FullAttention as u32 => {
                    return Err(Failure::new(
                        kvc_status::InvalidConfig,
                        format!("invalid engine config: group {i} is full attention with window_tokens {window_tokens}; it must be 0"),
                    ));
                }
                k if k == kvc_group_kind::SlidingWindow as u32 => GroupKind::SlidingWindow { window_tokens },
                k => {
                    return Err(Failure::new(
                        kvc_status::InvalidConfig,
                        format!("invalid engine config: group {i} has an unknown kind {k}"),
                    ));
                }
            };
            Ok(GroupConfig { kind, blocks_device, blocks_host })
        })
        .collect()
}

impl From<KvTransfer> for kvc_kv_transfer_role {
    fn from(role: KvTransfer) -> Self {
        match role {
            KvTransfer::None => Self::None,
            KvTransfer::Producer => Self::Producer,
            KvTransfer::Consumer => Self::Consumer,
            KvTransfer::Both => Self::Both,
        }
    }
}

impl kvc_kv_transfer_role {
    /// The engine's KV transfer role that a `kvc_config.kv_transfer_role`
    /// value names, if any.
    fn kv_transfer(code: u32) -> Option<KvTransfer> {
        let role = [Self::None, Self::Producer, Self::Consumer, Self::Both].into_iter().find(|r| *r as u32 == code)?;
        Some(match role {
            Self::None => KvTransfer::None,
            Self::Producer => KvTransfer::Producer,
            Self::Consumer => KvTransfer::Consumer,
            Self::Both => KvTransfer::Both,
        })
    }
}

impl kvc_config {
    /// The defaults of [`EngineConfig`] and [`Deployment`], field for field.
    fn defaults() -> Self {
        let EngineConfig {
            block_size_tokens,
            blocks_device,
            blocks_host,
            block_reuse,
            partial_reuse,
            offload_first,
            kv_events,
            image_placeholder_token_id,
            requests_max,
            tokens_per_request_max,
            mm_items_max,
            mm_items_per_request_max,
            runs_per_item_max,
            routing_hints_max,
            event_batches_max,
            groups,
        } = EngineConfig::default();
        let Deployment { model_type, model_image_capable, kv_events_endpoint, kv_transfer } = Deployment::default();
        // A default string would need storage that outlives the C struct; the
        // default deployment has none, which C reads as NULL.
        assert!(
            model_type.is_none() && kv_events_endpoint.is_none() && groups.is_empty(),
            "the default deployment names no model type and no endpoint, the default config no group"
        );
        Self {
            block_size_tokens,
            blocks_device,
            blocks_host,
            image_placeholder_token_id,
            requests_max,
            tokens_per_request_max,
            mm_items_max,
            mm_items_per_request_max,
            runs_per_item_max,
            routing_hints_max,
            event_batches_max,
            kv_transfer_role: kvc_kv_transfer_role::from(kv_transfer) as u32,
            block_reuse,
            kv_events,
            partial_reuse,
            offload_first,
            model_image_capable,
            model_type: std::ptr::null(),
            kv_events_endpoint: std::ptr::null(),
            groups: std::ptr::null(),
            groups_len: 0,
        }
    }
}

/// Converts and validates a C config.
fn engine_parts(c: &kvc_config) -> Result<(EngineConfig, Deployment), Failure> {
    let kvc_config {
        block_size_tokens,
        blocks_device,
        blocks_host,
        image_placeholder_token_id,
        requests_max,
        tokens_per_request_max,
        mm_items_max,
        mm_items_per_request_max,
        runs_per_item_max,
        routing_hints_max,
        event_batches_max,
        kv_transfer_role,
        block_reuse,
        kv_events,
        partial_reuse,
        offload_first,
        model_image_capable,
        model_type,
        kv_events_endpoint,
        groups: _,
        groups_len: _,
    } = *c;
    let groups = group_configs(c)?;
    let kv_transfer = kvc_kv_transfer_role::kv_transfer(kv_transfer_role).ok_or_else(|| {
        Failure::new(kvc_status::InvalidConfig, format!("unknown kv_transfer_role {kv_transfer_role}"))
    })?;
    let config = EngineConfig {
        block_size_tokens,
        blocks_device,
        blocks_host,
        block_reuse,
        kv_events,
        partial_reuse,
        offload_first,
        image_placeholder_token_id,
        requests_max,
        tokens_per_request_max,
        mm_items_max,
        mm_items_per_request_max,
        runs_per_item_max,
        routing_hints_max,
        event_batches_max,
        groups,
    };
    config.validate()?;
    let kv_events_endpoint = optional_str(kv_events_endpoint, "config.kv_events_endpoint")?;
    // An endpoint no publisher could bind is refused now rather than
    // advertised by model_info; empty means none, as for NULL.
    if let Some(endpoint) = kv_events_endpoint.as_deref().filter(|e| !e.is_empty()) {
        check_endpoint(endpoint, "kv_events_endpoint", None)
            .map_err(|f| Failure::new(kvc_status::InvalidConfig, f.message))?;
    }
    let deployment = Deployment {
        model_type: optional_str(model_type, "config.model_type")?,
        model_image_capable,
        kv_events_endpoint,
        kv_transfer,
    };
    Ok((config, deployment))
}

/// Writes the default configuration into `*config_out`: 32-token blocks,
/// 4096 device blocks, no host tier, reuse and events on, the Qwen image
/// placeholder, aggregated serving, no model type, no publisher endpoint.
///
/// Returns `KVC_STATUS_OK`, or `KVC_STATUS_NULL_ARGUMENT` when `config_out` is NULL.
/// Threading: any thread.
///
/// # Safety
///
/// `config_out` is NULL or valid for writing one `kvc_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_config_default(config_out: *mut kvc_config) -> kvc_status {
    ffi_boundary!({
        without_engine(|| {
            let out = try_out!(config_out);
            out.write(kvc_config::defaults());
            Ok(())
        })
    })
}

/// Creates an engine, reserving all of its memory now.
///
/// Ownership: on success `*engine_out` receives a new engine that the caller
/// owns and must release with `kvc_engine_free` exactly once. The strings in
/// `config` are copied; the caller keeps ownership of `config`.
///
/// Threading: an engine may be used from any thread, but by one thread at a
/// time (a concurrent call gets `KVC_STATUS_ENGINE_BUSY`). Different engines
/// are independent and may be used concurrently.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT` (`config` or
/// `engine_out` NULL); `KVC_STATUS_INVALID_ARGUMENT` (`config` or
/// `engine_out` misaligned); `KVC_STATUS_INVALID_CONFIG` (a field out of its
/// range, see `kvc_config`, an unknown `kv_transfer_role`, or a non-empty
/// `kv_events_endpoint` that `kvc_engine_publisher_start` would refuse);
/// `KVC_STATUS_OUT_OF_MEMORY` (valid, but its tables could not be
/// allocated); `KVC_STATUS_INVALID_UTF8` (`model_type` or
/// `kv_events_endpoint`); `KVC_STATUS_PANIC`. Every input gets one of these:
/// the process never ends here. There is no engine yet to hold a detailed
/// message.
///
/// # Safety
///
/// `config` is NULL or points to a valid `kvc_config` whose string fields are
/// NULL or NUL-terminated; `engine_out` is NULL or valid for writing one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_new(config: *const kvc_config, engine_out: *mut *mut kvc_engine) -> kvc_status {
    ffi_boundary!({
        without_engine(|| {
            let c = try_ref!(config);
            let out = try_out!(engine_out);
            let (config, deployment) = engine_parts(c)?;
            let engine = Engine::new(config)?;
            out.write(Box::into_raw(Box::new(kvc_engine::new(engine, deployment))));
            Ok(())
        })
    })
}

/// Destroys an engine and everything it holds (requests, blocks, undrained
/// events). `kvc_engine_free(NULL)` does nothing. A poisoned engine is freed
/// like any other.
///
/// Ownership: takes back the engine from `kvc_engine_new`; the pointer is
/// dangling afterwards (freeing it a second time is undefined behaviour, as
/// with `free`). Threading: no other call on this engine may be running or
/// start afterwards.
///
/// # Safety
///
/// `engine` is NULL or a pointer returned by `kvc_engine_new` that was not
/// freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_free(engine: *mut kvc_engine) {
    ffi_boundary!((), {
        if !engine.is_null() {
            // SAFETY: the caller guarantees `engine` came from `kvc_engine_new`
            // (which made it with `Box::into_raw`) and is freed only once, with
            // no call on it running.
            drop(unsafe { Box::from_raw(engine) });
        }
    })
}

/// Copies the detailed message of the engine's last failed call (empty when
/// the last call succeeded) into `buf` as NUL-terminated UTF-8, truncated to
/// `len - 1` bytes at a character boundary. `*n_out` receives the bytes
/// written, without the NUL. With `buf` NULL and `len` 0 nothing is copied
/// and `*n_out` receives the full message length (allocate that plus one).
///
/// Unlike the other buffer calls, a short non-NULL buffer is not an error:
/// the message is truncated to fit. Only a buffer of length 0 has no room
/// for the NUL.
///
/// Works on a poisoned engine (it then says why the engine panicked). Does
/// not change the last error, whatever it returns.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT` (`engine` or `n_out`);
/// `KVC_STATUS_INVALID_ARGUMENT` (`engine`, `buf` or `n_out` misaligned, or
/// `buf` NULL with `len` > 0); `KVC_STATUS_BUFFER_TOO_SMALL` (`buf` non-NULL
/// with `len` 0); `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_PANIC`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `buf` is valid for writing `len` bytes
/// (or NULL with `len` 0); `n_out` is NULL or valid for one `size_t` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_last_error(
    engine: *const kvc_engine,
    buf: *mut c_char,
    len: usize,
    n_out: *mut usize,
) -> kvc_status {
    ffi_boundary!({
        if engine.is_null() {
            return kvc_status::NullArgument;
        }
        if !engine.is_aligned() {
            return kvc_status::InvalidArgument;
        }
        // SAFETY: non-null and aligned (checked above); the caller guarantees a live engine from
        // `kvc_engine_new` (see `# Safety`). Only a shared reference is formed.
        let handle = unsafe { &*engine };
        // Read even when poisoned: the poison flag is not checked here, and a
        // mutex poisoned by a panic elsewhere still holds a readable message.
        let state = match handle.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return kvc_status::EngineBusy,
        };
        without_engine(|| {
            let out = try_out!(n_out);
            let dst = try_slice_out!(buf, len);
            let msg = state.last_error.as_bytes();
            if buf.is_null() {
                out.write(msg.len());
                return Ok(());
            }
            if dst.is_empty() {
                return Err(Failure::new(kvc_status::BufferTooSmall, "no room for the NUL terminator"));
            }
            let mut n = msg.len().min(dst.len() - 1);
            while !state.last_error.is_char_boundary(n) {
                n -= 1;
            }
            for (d, s) in dst.iter_mut().zip(&msg[..n]) {
                d.write(*s as c_char);
            }
            dst[n].write(0);
            out.write(n);
            Ok(())
        })
    })
}

/// Writes the engine's capability document as NUL-terminated JSON into `buf`;
/// `*n_out` receives its length without the NUL. With `buf` NULL and `len` 0
/// only the length is reported (allocate that plus one).
///
/// The document holds `kvcore_version`, `model_type`, `block_size`,
/// `block_key_algorithm`, `image_placeholder_token_id`, `block_reuse`,
/// `kv_events` and `extra`. `extra.image_routing_version` is 1 only when every
/// gate holds: `model_image_capable`, a validated `model_type` whose
/// placeholder matches `image_placeholder_token_id` (Qwen3-VL, "qwen3_vl",
/// 151655), `block_reuse`, `kv_events`, a non-empty `kv_events_endpoint`, and
/// `kv_transfer_role` NONE. Otherwise the key is absent.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT`; `KVC_STATUS_BUFFER_TOO_SMALL` (nothing
/// written); `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `buf` is valid for writing `len` bytes
/// (or NULL with `len` 0); `n_out` is NULL or valid for one `size_t` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_model_info(
    engine: *mut kvc_engine,
    buf: *mut c_char,
    len: usize,
    n_out: *mut usize,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(n_out);
            let dst = try_slice_out!(buf, len);
            let doc = capabilities::model_info(st.engine.config(), &st.deployment).to_string();
            if buf.is_null() {
                out.write(doc.len());
                return Ok(());
            }
            if dst.len() <= doc.len() {
                return Err(Failure::new(
                    kvc_status::BufferTooSmall,
                    format!("model_info needs {} bytes, the buffer has {}", doc.len() + 1, dst.len()),
                ));
            }
            for (d, s) in dst.iter_mut().zip(doc.as_bytes()) {
                d.write(*s as c_char);
            }
            dst[doc.len()].write(0);
            out.write(doc.len());
            Ok(())
        })
    })
}
