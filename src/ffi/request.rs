//! Requests: admission, UUID lists, growth, commits and endings.
//!
//! `kvc_request` and `kvc_image_item` mirror [`RequestSpec`] and
//! [`MmItemSpec`], `kvc_token_run` mirrors [`TokenRun`], `kvc_admission` and
//! `kvc_request_info` mirror [`Admission`] and [`RequestInfo`]: every
//! conversion names each field on both sides without `..`, so a field added
//! on one side fails to compile until it is mirrored on the other.
//!
//! Request ids cross as `uint64_t` (a slotmap key: slot and generation). An id
//! goes stale when its request is finished or cancelled; a stale or made-up id
//! is answered with `KVC_STATUS_UNKNOWN_ID`, never undefined behaviour, and
//! never aliases a newer request in the same slot.

use crate::engine::{Admission, GroupUsage, MmContent, MmItemSpec, RequestInfo, RequestSpec};
use crate::error::RequestError;
use crate::ids::{FfiId, RequestId};
use crate::tables::TokenRun;

use super::boundary::{ffi_boundary, fill_or_query, try_out, try_ref, try_slice, try_slice_out, with_engine};
use super::gpu::{device_digests, kvc_device_bytes};
use super::handle::kvc_engine;
use super::status::{Failure, kvc_status};

/// A byte string passed by pointer and length. `ptr` NULL with `len` 0 means
/// *absent*; `ptr` non-NULL with `len` 0 is the empty string; `ptr` NULL with
/// `len` > 0 is refused (`KVC_STATUS_INVALID_ARGUMENT`). Never NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvc_bytes {
    /// First byte, or NULL.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

/// One run of an image item's tokens in the prompt: positions `[start, start + len)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvc_token_run {
    /// First token position.
    pub start: u32,
    /// Number of tokens (at least 1).
    pub len: u32,
}

/// How `kvc_image_item.content` is to be read.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvc_image_content {
    /// The item's content bytes; kvcore computes their BLAKE3-256 digest.
    Bytes = 0,
    /// A BLAKE3-256 digest computed by the caller: exactly 32 bytes.
    Digest = 1,
    /// Device-resident content: `content` is the device address
    /// (`CUdeviceptr`) of the item's bytes and `content_len` their length;
    /// kvcore computes their BLAKE3-256 digest on the GPU opened with
    /// `kvc_engine_gpu_open`, every device item of the request in one batch.
    /// The digest equals that of `KVC_IMAGE_CONTENT_BYTES` for the same bytes.
    Device = 2,
}

/// An image item of a request: its content (or digest) and where its tokens sit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvc_image_item {
    /// A `kvc_image_content` value.
    pub content_kind: u32,
    /// Content bytes or digest (host memory), or a device address for
    /// `KVC_IMAGE_CONTENT_DEVICE`; read during the call only.
    pub content: *const u8,
    /// Length of `content` (32 for a digest).
    pub content_len: usize,
    /// The item's placement runs, in prompt order, at least one.
    pub runs: *const kvc_token_run,
    /// Number of runs.
    pub runs_len: usize,
}

/// A request to admit. Every pointer is read during `kvc_engine_add_request`
/// only; kvcore copies what it keeps.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvc_request {
    /// Prompt token ids.
    pub tokens: *const u32,
    /// Number of prompt tokens (at least 1).
    pub tokens_len: usize,
    /// LoRA adapter id, read only when `has_lora_id`.
    pub lora_id: u32,
    /// Whether the request runs under a LoRA adapter.
    pub has_lora_id: bool,
    /// Whether this is a warm-up request: it allocates but is never indexed
    /// and produces no events.
    pub dummy: bool,
    /// LoRA adapter name (UTF-8), or absent.
    pub lora_name: kvc_bytes,
    /// Cache salt (UTF-8), or absent. Requests with different salts never share blocks.
    pub cache_salt: kvc_bytes,
    /// Image items.
    pub items: *const kvc_image_item,
    /// Number of image items.
    pub items_len: usize,
    /// UUIDs, one entry per image item, each UTF-8 or absent (`ptr` NULL). NULL
    /// means the request has no UUID list at all. A UUID over 256 bytes is
    /// accepted and kept in the list, but is not used as a routing hint
    /// (counted in `kvc_counters.hint_oversized`).
    pub uuids: *const kvc_bytes,
    /// Number of UUID entries; must equal `items_len` when `uuids` is non-NULL.
    pub uuids_len: usize,
}

/// The outcome of a successful admission.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvc_admission {
    /// The new request's id.
    pub request_id: u64,
    /// Prompt tokens found in the prefix cache (their KV is already there).
    pub tokens_cached: u32,
    /// Of those, tokens onboarded from the host tier (copies come with the next step).
    pub tokens_onboarded: u32,
}

/// A request's token and block counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvc_request_info {
    /// Tokens in the request (prompt and generated).
    pub tokens: u32,
    /// Tokens in the prompt.
    pub prompt_len: u32,
    /// Tokens reported as computed (cached ones included).
    pub tokens_computed: u32,
    /// Prompt tokens matched in the cache at admission.
    pub tokens_cached: u32,
    /// Blocks held.
    pub blocks: u32,
}

/// One entry of a copied UUID list: where its bytes are in the caller's byte buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvc_uuid_entry {
    /// Offset of the UUID's first byte in the byte buffer.
    pub offset: u64,
    /// Length in bytes (0 for an absent entry or an empty UUID).
    pub len: u32,
    /// 1 when the entry has a UUID, 0 when it is absent.
    pub present: u32,
}

/// The shape of a request's UUID list.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvc_uuid_list {
    /// 1 when the request was given a UUID list, 0 when it has none.
    pub present: u32,
    /// Entries in the list (one per image item; 0 when absent).
    pub count: u32,
    /// Total bytes of all UUIDs.
    pub bytes: u64,
}

/// Reads an optional byte string.
fn optional_bytes<'a>(b: kvc_bytes, name: &str) -> Result<Option<&'a [u8]>, Failure> {
    if b.ptr.is_null() {
        if b.len != 0 {
            return Err(Failure::new(
                kvc_status::InvalidArgument,
                format!("`{name}.ptr` is NULL but `{name}.len` is {}", b.len),
            ));
        }
        return Ok(None);
    }
    Ok(Some(try_slice!(b.ptr, b.len, name)))
}

/// Reads an optional UTF-8 string.
fn optional_utf8<'a>(b: kvc_bytes, name: &'static str) -> Result<Option<&'a str>, Failure> {
    optional_bytes(b, name)?
        .map(|bytes| {
            std::str::from_utf8(bytes)
                .map_err(|_| Failure::new(kvc_status::InvalidUtf8, format!("`{name}` is not valid UTF-8")))
        })
        .transpose()
}

impl From<kvc_token_run> for TokenRun {
    fn from(run: kvc_token_run) -> Self {
        let kvc_token_run { start, len } = run;
        Self { start, len }
    }
}

impl From<Admission> for kvc_admission {
    fn from(admission: Admission) -> Self {
        let Admission { id, tokens_cached, tokens_onboarded } = admission;
        Self { request_id: id.to_ffi(), tokens_cached, tokens_onboarded }
    }
}

impl From<RequestInfo> for kvc_request_info {
    fn from(info: RequestInfo) -> Self {
        let RequestInfo { tokens, prompt_len, tokens_computed, tokens_cached, blocks } = info;
        Self { tokens, prompt_len, tokens_computed, tokens_cached, blocks }
    }
}

/// The device-resident items of a request (`KVC_IMAGE_CONTENT_DEVICE`), in
/// item order, for one digest batch.
fn device_items(r: &kvc_request) -> Result<Vec<kvc_device_bytes>, Failure> {
    let items_c: &[kvc_image_item] = try_slice!(r.items, r.items_len, "request.items");
    Ok(items_c
        .iter()
        .filter(|it| it.content_kind == kvc_image_content::Device as u32)
        .map(|it| kvc_device_bytes { ptr: it.content as u64, len: it.content_len as u64 })
        .collect())
}

/// Builds the engine's image item from the C one (`k` is its index, for
/// messages); `device_next` yields the digests of the request's
/// device-resident items in item order.
fn item_spec<'a>(
    k: usize,
    item: &kvc_image_item,
    device_next: &mut impl Iterator<Item = &'a [u8; 32]>,
) -> Result<MmItemSpec<'a>, Failure> {
    const BYTES: u32 = kvc_image_content::Bytes as u32;
    const DIGEST: u32 = kvc_image_content::Digest as u32;
    const DEVICE: u32 = kvc_image_content::Device as u32;
    let kvc_image_item { content_kind, content, content_len, runs, runs_len } = *item;
    let content = match content_kind {
        BYTES => MmContent::Bytes(try_slice!(content, content_len, "request.items[].content")),
        DIGEST => MmContent::Digest(try_slice!(content, content_len, "request.items[].content")),
        DEVICE => MmContent::Digest(
            device_next
                .next()
                .ok_or_else(|| Failure::new(kvc_status::Internal, format!("image item {k} has no device digest")))?,
        ),
        other => {
            return Err(Failure::new(
                kvc_status::InvalidArgument,
                format!("image item {k} has unknown content_kind {other}"),
            ));
        }
    };
    let runs: &[kvc_token_run] = try_slice!(runs, runs_len, "request.items[].runs");
    Ok(MmItemSpec { content, runs: runs.iter().copied().map(TokenRun::from).collect() })
}

/// Builds the engine's request from the C one, checking every pointer.
/// `device_digests` holds the digests of the request's device-resident items,
/// in item order.
fn request_spec<'a>(r: &kvc_request, device_digests: &'a [[u8; 32]]) -> Result<RequestSpec<'a>, Failure> {
    let kvc_request {
        tokens,
        tokens_len,
        lora_id,
        has_lora_id,
        dummy,
        lora_name,
        cache_salt,
        items,
        items_len,
        uuids,
        uuids_len,
    } = *r;
    let tokens: &[u32] = try_slice!(tokens, tokens_len, "request.tokens");
    let items_c: &[kvc_image_item] = try_slice!(items, items_len, "request.items");
    let mut device_next = device_digests.iter();
    let items =
        items_c.iter().enumerate().map(|(k, it)| item_spec(k, it, &mut device_next)).collect::<Result<Vec<_>, _>>()?;
    let uuids = if uuids.is_null() {
        if uuids_len != 0 {
            return Err(Failure::new(
                kvc_status::InvalidArgument,
                format!("`request.uuids` is NULL but `request.uuids_len` is {uuids_len}"),
            ));
        }
        None
    } else {
        let list: &[kvc_bytes] = try_slice!(uuids, uuids_len, "request.uuids");
        Some(list.iter().map(|u| optional_bytes(*u, "request.uuids[]")).collect::<Result<Vec<_>, _>>()?)
    };
    Ok(RequestSpec {
        tokens,
        lora_id: has_lora_id.then_some(lora_id),
        lora_name: optional_utf8(lora_name, "request.lora_name")?,
        cache_salt: optional_utf8(cache_salt, "request.cache_salt")?,
        items,
        uuids,
        dummy,
    })
}

/// Admits a request: matches its longest cached prefix and allocates the rest
/// of its prompt, all or nothing. On success `*admission_out` receives the
/// request id and the number of prompt tokens already cached (start the
/// forward pass at that position).
///
/// Ownership: everything `request` points to is read during the call only.
/// The request lives until `kvc_engine_finish` or `kvc_engine_cancel`.
/// Threading: one thread at a time per engine.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT` (NULL pointer with a non-zero length,
/// misaligned pointer, unknown `content_kind`); `KVC_STATUS_INVALID_UTF8`
/// (LoRA name, cache salt or a UUID); `KVC_STATUS_LORA_NAME_REQUIRED` (a
/// LoRA adapter id without its name); `KVC_STATUS_EMPTY_PROMPT`;
/// `KVC_STATUS_INVALID_IMAGE_RUNS`; `KVC_STATUS_BAD_DIGEST_LENGTH`;
/// `KVC_STATUS_UUID_COUNT_MISMATCH`; `KVC_STATUS_REQUEST_TOO_LONG`;
/// `KVC_STATUS_TOO_MANY_ITEMS_PER_REQUEST`; `KVC_STATUS_TOO_MANY_REQUESTS`;
/// `KVC_STATUS_TOO_MANY_ITEMS`; `KVC_STATUS_OUT_OF_BLOCKS`;
/// for `KVC_IMAGE_CONTENT_DEVICE` items also `KVC_STATUS_GPU_UNAVAILABLE`
/// (no GPU open), `KVC_STATUS_GPU_FAILED`, and
/// `KVC_STATUS_INVALID_ARGUMENT` for a range outside CUDA's allocations;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`; `KVC_STATUS_PANIC`.
/// An oversized UUID (over 256 bytes) is not an error: see `kvc_request.uuids`.
/// A refused request leaves the engine unchanged, except that
/// `kvc_counters.requests_rejected` counts it: every status but
/// `KVC_STATUS_OK` counts once, except the three that never reach the engine
/// (`KVC_STATUS_NULL_ARGUMENT` or `KVC_STATUS_INVALID_ARGUMENT` for the
/// `engine` handle itself, `KVC_STATUS_ENGINE_BUSY`, `KVC_STATUS_POISONED`).
///
/// # Safety
///
/// `engine` is NULL or a live engine; `request` is NULL or a valid
/// `kvc_request` whose pointer and length pairs describe readable memory
/// (device memory, unchanged during the call, for `KVC_IMAGE_CONTENT_DEVICE`);
/// `admission_out` is NULL or valid for one `kvc_admission` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_add_request(
    engine: *mut kvc_engine,
    request: *const kvc_request,
    admission_out: *mut kvc_admission,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            // The engine counts the refusals it makes; one refused here,
            // before the request reaches it, is counted here, so that every
            // refused admission is counted once.
            let described = (|| -> Result<_, Failure> {
                let r = try_ref!(request);
                let out = try_out!(admission_out);
                // Device-resident images are hashed first, all in one batch.
                let device_digests = device_digests(&st.gpu, &device_items(r)?)?;
                Ok((out, r, device_digests))
            })();
            let (out, r, device_digests) = described.inspect_err(|_| st.engine.count_rejected())?;
            let spec = request_spec(r, &device_digests).inspect_err(|_| st.engine.count_rejected())?;
            let admission = st.engine.add_request(&spec)?;
            out.write(kvc_admission::from(admission));
            Ok(())
        })
    })
}

/// Copies a request's UUID list. `*list_out` receives its shape: `present` 0
/// when the request was given no list. The entries go to `entries` (one per
/// image item, in order) and the UUID bytes, concatenated, to `bytes`; each
/// entry gives its UUID's offset and length there.
///
/// Two-call pattern: call with `entries` and `bytes` NULL and their lengths 0
/// to learn `count` and `bytes`, allocate, call again. When `entries_len <
/// count` or `bytes_len < bytes` (and the buffers are not both NULL) the call
/// fails with `KVC_STATUS_BUFFER_TOO_SMALL` and writes nothing.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT`; `KVC_STATUS_UNKNOWN_ID`;
/// `KVC_STATUS_BUFFER_TOO_SMALL`; `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `entries` and `bytes` are valid for
/// writing their lengths (or NULL with length 0); `list_out` is NULL or valid
/// for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_request_uuids(
    engine: *mut kvc_engine,
    request_id: u64,
    entries: *mut kvc_uuid_entry,
    entries_len: usize,
    bytes: *mut u8,
    bytes_len: usize,
    list_out: *mut kvc_uuid_list,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(list_out);
            let entries_dst = try_slice_out!(entries, entries_len);
            let bytes_dst = try_slice_out!(bytes, bytes_len);
            let uuids = st.engine.request_uuids(RequestId::from_ffi(request_id))?;
            let list = match &uuids {
                None => kvc_uuid_list { present: 0, count: 0, bytes: 0 },
                Some(u) => kvc_uuid_list {
                    present: 1,
                    count: u.len() as u32,
                    bytes: u.iter().flatten().map(|s| s.len() as u64).sum(),
                },
            };
            let query = entries.is_null() && bytes.is_null();
            if !query {
                if (entries_dst.len() as u64) < list.count as u64 || (bytes_dst.len() as u64) < list.bytes {
                    return Err(Failure::new(
                        kvc_status::BufferTooSmall,
                        format!(
                            "the UUID list needs {} entries and {} bytes; the buffers have {} and {}",
                            list.count,
                            list.bytes,
                            entries_dst.len(),
                            bytes_dst.len()
                        ),
                    ));
                }
                let mut offset = 0usize;
                for (dst, uuid) in entries_dst.iter_mut().zip(uuids.iter().flatten()) {
                    let entry = match uuid {
                        None => kvc_uuid_entry { offset: offset as u64, len: 0, present: 0 },
                        Some(s) => {
                            for (d, b) in bytes_dst[offset..offset + s.len()].iter_mut().zip(s.as_bytes()) {
                                d.write(*b);
                            }
                            let e = kvc_uuid_entry { offset: offset as u64, len: s.len() as u32, present: 1 };
                            offset += s.len();
                            e
                        }
                    };
                    dst.write(entry);
                }
            }
            out.write(list);
            Ok(())
        })
    })
}

/// Reads a request's token and block counts into `*info_out`.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`; `KVC_STATUS_UNKNOWN_ID`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `info_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_request_info(
    engine: *mut kvc_engine,
    request_id: u64,
    info_out: *mut kvc_request_info,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(info_out);
            let info = st.engine.request_info(RequestId::from_ffi(request_id))?;
            out.write(kvc_request_info::from(info));
            Ok(())
        })
    })
}

/// Copies a request's block table (the device page of each of its blocks, in
/// order) into `pages`; `*n_out` receives the number of blocks. With `pages`
/// NULL and `len` 0 only the count is reported. A `len` below the count fails
/// with `KVC_STATUS_BUFFER_TOO_SMALL` and writes nothing.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT`; `KVC_STATUS_UNKNOWN_ID`;
/// `KVC_STATUS_BUFFER_TOO_SMALL`; `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `pages` is valid for writing `len`
/// `uint32_t` (or NULL with `len` 0); `n_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_block_table(
    engine: *mut kvc_engine,
    request_id: u64,
    pages: *mut u32,
    len: usize,
    n_out: *mut usize,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(n_out);
            let dst = try_slice_out!(pages, len);
            let table = st.engine.block_table(RequestId::from_ffi(request_id))?;
            fill_or_query(dst, pages.is_null(), &table, "block table")?;
            out.write(table.len());
            Ok(())
        })
    })
}

/// Copies a request's block table in KV cache group `group` into `pages`, as
/// `kvc_engine_block_table` does for group 0 (which this call gives for
/// `group` 0): one device page of that group's pool per block, as many
/// entries as group 0's table. A sliding-window group names its null page,
/// page 0 of its pool (never handed out, as vLLM's null block), for the
/// blocks that fell out of the window and were released; attention kernels
/// read it only where the window masks it.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT`; `KVC_STATUS_UNKNOWN_ID`;
/// `KVC_STATUS_UNKNOWN_GROUP` (`group` past the engine's last group);
/// `KVC_STATUS_BUFFER_TOO_SMALL`; `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `pages` is valid for writing `len`
/// `uint32_t` (or NULL with `len` 0); `n_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_block_table_group(
    engine: *mut kvc_engine,
    request_id: u64,
    group: u32,
    pages: *mut u32,
    len: usize,
    n_out: *mut usize,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(n_out);
            let dst = try_slice_out!(pages, len);
            let table = st.engine.block_table_group(RequestId::from_ffi(request_id), group as usize)?;
            fill_or_query(dst, pages.is_null(), &table, "block table")?;
            out.write(table.len());
            Ok(())
        })
    })
}

/// What one KV cache group holds now (`kvc_engine_group_usage`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvc_group_usage {
    /// Device pages that blocks may take (a sliding window's null page not
    /// counted).
    pub pages_device: u32,
    /// Device pages in use: held by requests or cached.
    pub blocks_used_device: u32,
    /// Device blocks that running requests hold (the rest of
    /// `blocks_used_device` is cache, evictable at any time).
    pub blocks_referenced: u32,
    /// Cached blocks on the device.
    pub blocks_cached_device: u32,
    /// Cached blocks on the host tier.
    pub blocks_cached_host: u32,
}

impl From<GroupUsage> for kvc_group_usage {
    fn from(u: GroupUsage) -> Self {
        let GroupUsage {
            pages_device,
            blocks_used_device,
            blocks_referenced,
            blocks_cached_device,
            blocks_cached_host,
        } = u;
        Self { pages_device, blocks_used_device, blocks_referenced, blocks_cached_device, blocks_cached_host }
    }
}

/// Writes what KV cache group `group` holds now into `*usage_out`: an
/// engine configured without groups has group 0 only.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT`; `KVC_STATUS_UNKNOWN_GROUP`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `usage_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_group_usage(
    engine: *mut kvc_engine,
    group: u32,
    usage_out: *mut kvc_group_usage,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(usage_out);
            let groups = st.engine.groups();
            let usage = st
                .engine
                .group_usage(group as usize)
                .ok_or(RequestError::UnknownGroup { group: group as usize, groups })?;
            out.write(kvc_group_usage::from(usage));
            Ok(())
        })
    })
}

/// Appends generated tokens to a request and allocates the blocks they need.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT` (`tokens` NULL with `tokens_len` > 0);
/// `KVC_STATUS_UNKNOWN_ID`; `KVC_STATUS_REQUEST_TOO_LONG`;
/// `KVC_STATUS_OUT_OF_BLOCKS`; `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `tokens` is valid for reading
/// `tokens_len` `uint32_t` (or NULL with `tokens_len` 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_grow(
    engine: *mut kvc_engine,
    request_id: u64,
    tokens: *const u32,
    tokens_len: usize,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let tokens: &[u32] = try_slice!(tokens, tokens_len, "tokens");
            st.engine.grow(RequestId::from_ffi(request_id), tokens)?;
            Ok(())
        })
    })
}

/// Reports that the request's first `tokens_computed` tokens have their KV
/// written (counts only grow; chunked prefill reports a prompt over several
/// calls). Full blocks become cached and produce `BlockStored` events.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_UNKNOWN_ID`;
/// `KVC_STATUS_BAD_COMPUTED_COUNT`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_commit(
    engine: *mut kvc_engine,
    request_id: u64,
    tokens_computed: u64,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            st.engine.commit(RequestId::from_ffi(request_id), tokens_computed)?;
            Ok(())
        })
    })
}

/// Ends a request normally and releases its blocks (cached ones stay
/// matchable). The id is stale afterwards: a second finish or cancel returns
/// `KVC_STATUS_UNKNOWN_ID` and changes nothing.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_UNKNOWN_ID`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_finish(engine: *mut kvc_engine, request_id: u64) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            st.engine.finish(RequestId::from_ffi(request_id))?;
            Ok(())
        })
    })
}

/// Ends a request early: blocks it fully computed stay cached, the rest are
/// freed. The id is stale afterwards, as with `kvc_engine_finish`.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_UNKNOWN_ID`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_cancel(engine: *mut kvc_engine, request_id: u64) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            st.engine.cancel(RequestId::from_ffi(request_id))?;
            Ok(())
        })
    })
}
