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

use crate::resources::BlockCopy;

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

/// What a handle holds of the GPU path: nothing until `kvc_engine_gpu_open`.
#[derive(Default)]
pub(crate) struct GpuState {
    /// The attached pool (dropped before the device handle).
    #[cfg(feature = "cuda")]
    pool: Option<crate::gpu::AttachedPool>,
    /// The open device's ordinal and handle.
    #[cfg(feature = "cuda")]
    gpu: Option<(u32, std::sync::Arc<crate::gpu::Gpu>)>,
    /// The last closed step's copies, until `kvc_engine_copy_blocks` performs
    /// them (empty once done).
    pending: Vec<BlockCopy>,
    /// Waves of `pending` already launched (a failed call resumes after them).
    waves_done: usize,
}

impl GpuState {
    /// Called by `kvc_engine_step`: the step's copies replace any that were
    /// not performed (the caller then performed them itself, or skipped them).
    pub(crate) fn set_pending(&mut self, copies: &[BlockCopy]) {
        self.pending.clear();
        self.pending.extend_from_slice(copies);
        self.waves_done = 0;
    }

    /// Digests of device-resident byte strings, in order. Every range is
    /// checked first.
    pub(crate) fn digests(&self, items: &[kvc_device_bytes]) -> Result<Vec<[u8; 32]>, Failure> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        #[cfg(feature = "cuda")]
        {
            let gpu = self.gpu()?;
            let mut list = Vec::with_capacity(items.len());
            for it in items {
                let what = format!("the device range {:#x} + {}", it.ptr, it.len);
                gpu.check_device_range(it.ptr, it.len, &what).map_err(gpu_failure)?;
                list.push(crate::gpu::DeviceBytes { ptr: it.ptr, len: it.len });
            }
            // SAFETY: every range was just found inside a live CUDA
            // allocation; the caller's contract (the exports' `# Safety`)
            // keeps it allocated and unchanged for the call, and
            // `digest_device` returns only after the kernel read it all.
            unsafe { gpu.digest_device(&list) }.map_err(gpu_failure)
        }
        #[cfg(not(feature = "cuda"))]
        Err(unavailable("kvcore was built without the `cuda` feature"))
    }

    #[cfg(feature = "cuda")]
    fn gpu(&self) -> Result<&std::sync::Arc<crate::gpu::Gpu>, Failure> {
        self.gpu.as_ref().map(|(_, g)| g).ok_or_else(|| unavailable("no GPU is open: call kvc_engine_gpu_open first"))
    }
}

fn unavailable(why: impl Into<String>) -> Failure {
    Failure::new(kvc_status::GpuUnavailable, why)
}

/// Maps a GPU error to a status: bad arguments stay `INVALID_ARGUMENT`, a
/// missing driver or device is `GPU_UNAVAILABLE`, anything else a failed
/// CUDA call.
#[cfg(feature = "cuda")]
fn gpu_failure(e: crate::gpu::GpuError) -> Failure {
    use crate::gpu::GpuError as E;
    let status = match &e {
        E::InvalidArgument(_) => kvc_status::InvalidArgument,
        E::Unavailable(_) => kvc_status::GpuUnavailable,
        E::Driver(_) | E::Compile { .. } => kvc_status::GpuFailed,
    };
    Failure::new(status, e.to_string())
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
    ffi_boundary!({
        with_engine(engine, |st| {
            #[cfg(feature = "cuda")]
            {
                if let Some((open, _)) = &st.gpu.gpu {
                    if *open == ordinal {
                        return Ok(());
                    }
                    return Err(Failure::new(
                        kvc_status::InvalidArgument,
                        format!("device {open} is already open on this engine; {ordinal} cannot be opened too"),
                    ));
                }
                let gpu = crate::gpu::Gpu::probe(ordinal as usize).map_err(gpu_failure)?;
                gpu.warm().map_err(gpu_failure)?;
                st.gpu.gpu = Some((ordinal, gpu));
                Ok(())
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = (st, ordinal);
                Err(unavailable("kvcore was built without the `cuda` feature"))
            }
        })
    })
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
/// `KVC_STATUS_INVALID_ARGUMENT` (geometry that does not divide evenly,
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
            #[cfg(feature = "cuda")]
            {
                use crate::gpu::{BlockGeometry, HostTier, KvPool};
                let invalid = |m: String| Failure::new(kvc_status::InvalidArgument, m);
                let gpu = std::sync::Arc::clone(st.gpu.gpu()?);
                if st.gpu.pool.is_some() {
                    return Err(invalid("a KV pool is already attached to this engine".to_owned()));
                }
                let config = st.engine.config();
                if st.engine.counters().requests_admitted > 0 {
                    return Err(invalid("attach the KV pool before the first request".to_owned()));
                }
                if p.reserved != 0 {
                    return Err(invalid("`pool.reserved` must be 0".to_owned()));
                }
                if p.blocks != config.blocks_device {
                    return Err(invalid(format!(
                        "`pool.blocks` is {} but the engine has {} device blocks",
                        p.blocks, config.blocks_device
                    )));
                }
                let geometry = BlockGeometry {
                    regions: p.regions,
                    block_bytes: p.block_bytes,
                    planes: p.planes,
                    tokens_per_block: config.block_size_tokens,
                };
                geometry.validate().map_err(gpu_failure)?;
                let region_bytes = p
                    .block_bytes
                    .checked_mul(p.blocks as u64)
                    .ok_or_else(|| invalid("`pool.block_bytes * pool.blocks` overflows".to_owned()))?;
                for (r, base) in bases.iter().enumerate() {
                    gpu.check_device_range(*base, region_bytes, &format!("pool region {r}")).map_err(gpu_failure)?;
                }
                let mut sorted: Vec<u64> = bases.to_vec();
                sorted.sort_unstable();
                if sorted.windows(2).any(|w| w[1] - w[0] < region_bytes) {
                    return Err(invalid("two pool regions overlap".to_owned()));
                }
                let host = match config.blocks_host {
                    0 => None,
                    n => Some(std::sync::Arc::new(HostTier::new(&gpu, geometry, n).map_err(gpu_failure)?)),
                };
                let device = KvPool::region_major(bases.to_vec(), p.blocks, geometry);
                // SAFETY: every region was found inside a live CUDA allocation
                // and no two overlap (checked above); the caller's contract
                // (this export's `# Safety`) keeps the memory allocated for
                // the engine's life, which the attached pool does not outlive
                // (it is dropped with the handle).
                let attached = unsafe { gpu.attach(device, host) }.map_err(gpu_failure)?;
                st.gpu.pool = Some(attached);
                Ok(())
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = (st, bases);
                Err(unavailable("kvcore was built without the `cuda` feature"))
            }
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
            #[cfg(feature = "cuda")]
            {
                let GpuState { pool, gpu, pending, waves_done } = &mut st.gpu;
                let (Some(pool), Some((_, gpu))) = (pool.as_ref(), gpu.as_ref()) else {
                    return Err(Failure::new(
                        kvc_status::KvPoolNotAttached,
                        "no KV pool is attached: call kvc_engine_attach_kv_pool first",
                    ));
                };
                let launches = gpu.copy_blocks_from(pool, pending, waves_done).map_err(gpu_failure)?;
                gpu.synchronize().map_err(gpu_failure)?;
                pending.clear();
                *waves_done = 0;
                out.write(launches);
                Ok(())
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = (out, st);
                Err(Failure::new(kvc_status::KvPoolNotAttached, "kvcore was built without the `cuda` feature"))
            }
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
            let digests = st.gpu.digests(list)?;
            for (d, s) in dst.iter_mut().zip(digests.iter().flatten()) {
                d.write(*s);
            }
            Ok(())
        })
    })
}
