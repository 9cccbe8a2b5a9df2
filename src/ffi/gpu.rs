//! The GPU path of the C API: open a device, attach the caller's paged KV
//! pool, perform each step's block copies with kvcore's kernels, and hash
//! device-resident images.
//!
//! The serving loop with a pool attached:
//!
//! ```text
//! kvc_engine_gpu_open(e, 0)                 once: loads CUDA, compiles the kernels
//! kvc_engine_attach_kv_pool(e, &pool)       once, before the first request
//! loop:
//!     kvc_engine_add_request / _grow ...    allocations queue copies
//!     kvc_engine_step(e, &n)                closes the step
//!     kvc_engine_copy_blocks(e, &launches)  offloads, onboards, partial reuse: done on return
//!     forward pass
//!     kvc_engine_commit / _finish ...
//! ```
//!
//! Every device address the caller passes (pool regions, image tensors) is
//! checked against CUDA's own allocation records before a kernel sees it, so
//! a made-up address is refused with `KVC_STATUS_INVALID_ARGUMENT` instead of
//! faulting the context. kvcore runs on the device's primary context (the
//! one the CUDA runtime, PyTorch and TensorRT-LLM use) and its own streams;
//! each GPU call returns only when its work on the device is complete.
//!
//! Built without the `cuda` feature, or on a machine without a CUDA driver,
//! the functions exist and report `KVC_STATUS_GPU_UNAVAILABLE`.
//!
//! The state (open device, attached pool, pending copies and the wave to
//! resume at) and every check live in [`EngineGpu`], which Rust callers use
//! directly; the exports here only turn pointers into references and slices,
//! call it, and map its [`GpuError`] to a status and message.

use crate::gpu::{DeviceBytes, DevicePool, EngineGpu, GpuError};

use super::boundary::{ffi_boundary, try_out, try_ref, try_slice, try_slice_out, with_engine};
use super::handle::kvc_engine;
use super::status::{Failure, kvc_status};

/// A device-resident byte string: a device address (`CUdeviceptr`) and a
/// length in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvc_device_bytes {
    /// Device address of the first byte (any alignment; 16-byte aligned is fastest).
    pub ptr: u64,
    /// Length in bytes (0 is the empty string, whatever `ptr` is).
    pub len: u64,
}

/// The caller's paged KV pool, for `kvc_engine_attach_kv_pool`.
///
/// Region r (a layer, or a layer's K or V tensor) starts at device address
/// `region_bases[r]`; its page p is the `block_bytes` bytes at
/// `region_bases[r] + p * block_bytes`. A page holds `planes` equal planes
/// (for example 2 for K and V interleaved per block), each with the block's
/// `block_size_tokens` tokens in order. A partial-reuse copy of k tokens
/// moves the first k tokens of every plane of every region.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvc_kv_pool {
    /// One device address per region; read during the call only.
    pub region_bases: *const u64,
    /// Number of regions (at least 1).
    pub regions: u32,
    /// Planes per page (at least 1; `block_bytes` must be a multiple of
    /// `planes * block_size_tokens`).
    pub planes: u32,
    /// Bytes of one page in one region.
    pub block_bytes: u64,
    /// Pages in each region; must equal `kvc_config.blocks_device`.
    pub blocks: u32,
    /// Zero.
    pub reserved: u32,
}

/// Digests of device-resident byte strings, in order (every range is checked
/// first by the engine's [`EngineGpu`]), for `kvc_engine_digest_device` and
/// device image items.
///
/// The caller's contract (the exports' `# Safety`) keeps every item's memory
/// allocated and unchanged for the call.
pub(crate) fn device_digests(gpu: &EngineGpu, items: &[kvc_device_bytes]) -> Result<Vec<[u8; 32]>, Failure> {
    let list: Vec<DeviceBytes> = items.iter().map(|it| DeviceBytes { ptr: it.ptr, len: it.len }).collect();
    // SAFETY: the items are the caller's, whose contract (the exports'
    // `# Safety`, for `kvc_engine_digest_device` and for device image items
    // of `kvc_engine_add_request`) keeps them allocated and unchanged for the
    // call; the ranges themselves are checked.
    unsafe { gpu.digest_device(&list) }.map_err(gpu_failure)
}

/// Maps a GPU error to a status and message: bad arguments stay
/// `INVALID_ARGUMENT`, a missing driver or device and no open GPU are
/// `GPU_UNAVAILABLE`, no attached pool is `KV_POOL_NOT_ATTACHED`, anything
/// else a failed CUDA call. The messages of the two state refusals name the
/// call that fixes them.
fn gpu_failure(e: GpuError) -> Failure {
    match e {
        GpuError::NotOpen => Failure::new(kvc_status::GpuUnavailable, "no GPU is open: call kvc_engine_gpu_open first"),
        GpuError::NotAttached => {
            Failure::new(kvc_status::KvPoolNotAttached, "no KV pool is attached: call kvc_engine_attach_kv_pool first")
        }
        GpuError::InvalidArgument(_) => Failure::new(kvc_status::InvalidArgument, e.to_string()),
        GpuError::Unavailable(_) => Failure::new(kvc_status::GpuUnavailable, e.to_string()),
        #[cfg(feature = "cuda")]
        GpuError::Driver(_) => Failure::new(kvc_status::GpuFailed, e.to_string()),
        GpuError::Compile { .. } => Failure::new(kvc_status::GpuFailed, e.to_string()),
    }
}

/// Opens CUDA device `ordinal` for this engine: loads `libcuda` and
/// `libnvrtc`, retains the device's primary context and compiles kvcore's
/// kernels (a few hundred milliseconds, once). Opening the same ordinal again
/// does nothing.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_GPU_UNAVAILABLE` (no CUDA driver, no such device, built
/// without CUDA: the message says which); `KVC_STATUS_GPU_FAILED` (kernel
/// compilation failed); `KVC_STATUS_INVALID_ARGUMENT` (another ordinal is
/// already open); `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_gpu_open(engine: *mut kvc_engine, ordinal: u32) -> kvc_status {
    ffi_boundary!({ with_engine(engine, |st| st.gpu.open(ordinal).map_err(gpu_failure)) })
}

/// Attaches the caller's paged KV pool (see `kvc_kv_pool`) to the engine
/// whose GPU is open, and allocates the pinned host tier of
/// `kvc_config.blocks_host` pages of the same geometry (none when 0). From
/// then on `kvc_engine_copy_blocks` performs each step's copies. Attach
/// before the first request: the engine's bookkeeping and the pool's
/// contents must start together.
///
/// Every region is checked to lie inside one CUDA allocation. The regions
/// must not overlap; a region may be a view into a larger tensor.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT` (an engine with several KV cache groups,
/// whose copies the caller performs on each group's pool; geometry that does not divide evenly,
/// `blocks` other than `blocks_device`, a region outside CUDA's allocations,
/// overlapping regions, non-zero `reserved`, a pool already attached, or
/// requests already admitted); `KVC_STATUS_GPU_UNAVAILABLE` (no GPU open);
/// `KVC_STATUS_GPU_FAILED` (the host tier could not be allocated);
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`. A refused attach changes
/// nothing.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `pool` is NULL or a valid `kvc_kv_pool`
/// whose `region_bases` holds `regions` readable entries. The pool's memory
/// must stay allocated until the engine is freed, and no one else may write
/// a page while a `kvc_engine_copy_blocks` call copies it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_attach_kv_pool(engine: *mut kvc_engine, pool: *const kvc_kv_pool) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let p = try_ref!(pool);
            let bases: &[u64] = try_slice!(p.region_bases, p.regions as usize, "pool.region_bases");
            if p.reserved != 0 {
                return Err(Failure::new(kvc_status::InvalidArgument, "`pool.reserved` must be 0"));
            }
            // One pool holds one group's pages: the copies of an engine with
            // several groups name pages of several pools.
            if st.engine.groups() > 1 {
                return Err(Failure::new(
                    kvc_status::InvalidArgument,
                    "an engine with several KV cache groups performs its copies itself: each copy names its group's pool",
                ));
            }
            let device =
                DevicePool { region_bases: bases, planes: p.planes, block_bytes: p.block_bytes, blocks: p.blocks };
            // SAFETY: this export's contract keeps the pool's memory
            // allocated until the engine is freed (which drops its
            // `EngineGpu` and the attached pool with it) and forbids other
            // writes to a page while `kvc_engine_copy_blocks` copies it.
            unsafe { st.gpu.attach(&st.engine, device) }.map_err(gpu_failure)
        })
    })
}

/// Performs the block copies of the last closed step on the attached pool
/// (offloads to the host tier, onboards from it, partial-reuse copies), in
/// the order `kvc_engine_block_copies` lists them, one launch or copy-engine
/// batch per wave, and returns when they are complete on the device: the
/// forward pass may read the pages. `*launches_out` receives the number of
/// waves run; a second call for the same step runs none.
///
/// How host copies move: per wave, the copy kernel on at most 16 thread
/// blocks, the copy engines (long runs of consecutive pages at both ends),
/// or, for two-way waves of 16 MiB or more each way, the copy engines
/// through a device staging buffer (docs/benchmarks.md).
///
/// If a launch fails (`KVC_STATUS_GPU_FAILED`), the waves before it stay
/// done and the rest stay pending: a new call resumes at the wave that
/// failed. A failure reported while waiting for the device is a fault that
/// CUDA keeps for the context (every later GPU call fails too).
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_KV_POOL_NOT_ATTACHED`; `KVC_STATUS_GPU_FAILED`;
/// `KVC_STATUS_INVALID_ARGUMENT` (a copy the pool cannot take, which the
/// engine's own copies never are); `KVC_STATUS_ENGINE_BUSY`;
/// `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `launches_out` is NULL or valid for
/// one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_copy_blocks(engine: *mut kvc_engine, launches_out: *mut usize) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(launches_out);
            let launches = st.gpu.copy_pending().map_err(gpu_failure)?;
            out.write(launches);
            Ok(())
        })
    })
}

/// BLAKE3-256 of device-resident byte strings (image tensors), all in one
/// batch on the open GPU; the digest of item i goes to
/// `digests_out[32 * i .. 32 * i + 32]`. The digests are those of the
/// `blake3` reference for the same bytes, and are what an image item of
/// kind `KVC_IMAGE_CONTENT_DEVICE` is keyed by. Returns when done; the items
/// need to live only for the call.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT` (a range outside CUDA's allocations, a NULL
/// array with a non-zero length); `KVC_STATUS_BUFFER_TOO_SMALL`
/// (`digests_len` under `32 * items_len`; nothing written);
/// `KVC_STATUS_GPU_UNAVAILABLE` (no GPU open); `KVC_STATUS_GPU_FAILED`;
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `items` holds `items_len` readable
/// records (or is NULL with 0), each naming device memory that nobody
/// writes during the call; `digests_out` is valid for writing `digests_len`
/// bytes (or NULL with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_digest_device(
    engine: *mut kvc_engine,
    items: *const kvc_device_bytes,
    items_len: usize,
    digests_out: *mut u8,
    digests_len: usize,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let list: &[kvc_device_bytes] = try_slice!(items, items_len, "items");
            let dst = try_slice_out!(digests_out, digests_len);
            let need = list.len().saturating_mul(32);
            if dst.len() < need {
                return Err(Failure::new(
                    kvc_status::BufferTooSmall,
                    format!("{} digests need {need} bytes; the buffer has {}", list.len(), dst.len()),
                ));
            }
            let digests = device_digests(&st.gpu, list)?;
            for (d, s) in dst.iter_mut().zip(digests.iter().flatten()) {
                d.write(*s);
            }
            Ok(())
        })
    })
}
