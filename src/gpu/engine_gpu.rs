//! The GPU side of one engine: the open device, the caller's KV pool
//! attached to it with the pinned host tier, and the copies of the last
//! closed step until they are performed.
//!
//! ```text
//! EngineGpu::open(ordinal)                   once: loads CUDA, compiles the kernels
//! EngineGpu::attach(&engine, pool)           once, before the engine's first request
//! loop:
//!     engine.add_request / grow ...          allocations queue copies
//!     set_pending(&engine.step())            the step's copies
//!     copy_pending()                         offloads, onboards, partial reuse: done on return
//!     forward pass, engine.commit / finish ...
//! digest_device(items)                       BLAKE3 of device-resident images, any time after open
//! ```
//!
//! Every check lives here, so that the C API (src/ffi/gpu.rs) only turns
//! pointers into slices and errors into statuses: a device address must lie
//! in device memory of the open device (`cuPointerGetAttribute`, through
//! [`Gpu::check_device_range`]), pool regions must not overlap, the pool's
//! pages must be the engine's device blocks, and the pool must be attached
//! before the engine admits a request (the engine's bookkeeping and the
//! pool's contents start together). A refused call changes nothing.
//!
//! Built without the `cuda` feature the type exists and refuses every GPU
//! call ([`GpuError::Unavailable`], [`GpuError::NotAttached`]).

#[cfg(feature = "cuda")]
use std::sync::Arc;

use super::digest::DeviceBytes;
use super::error::GpuError;
use crate::engine::Engine;
use crate::resources::BlockCopy;

#[cfg(feature = "cuda")]
use super::{
    attached_pool::AttachedPool,
    device::Gpu,
    host_tier::HostTier,
    pool::{BlockGeometry, KvPool},
};

/// The caller's paged KV pool in device memory, as [`EngineGpu::attach`]
/// takes it.
///
/// Region r (a layer, or a layer's K or V tensor) starts at device address
/// `region_bases[r]`; its page p is the `block_bytes` bytes at
/// `region_bases[r] + p * block_bytes`. A page holds `planes` equal planes
/// (for example 2 for K and V interleaved per block), each with the block's
/// tokens in order. A partial-reuse copy of k tokens moves the first k
/// tokens of every plane of every region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePool<'a> {
    /// One device address per region (at least one).
    pub region_bases: &'a [u64],
    /// Planes per page (at least 1; `block_bytes` must be a multiple of
    /// `planes` times the engine's `block_size_tokens`).
    pub planes: u32,
    /// Bytes of one page in one region.
    pub block_bytes: u64,
    /// Pages in each region; must equal the engine's `blocks_device`.
    pub blocks: u32,
}

/// The GPU side of one engine (see the module docs): nothing until
/// [`EngineGpu::open`].
#[derive(Debug, Default)]
pub struct EngineGpu {
    /// The attached pool (declared first: dropped before the device handle).
    #[cfg(feature = "cuda")]
    pool: Option<AttachedPool>,
    /// The open device's ordinal and handle.
    #[cfg(feature = "cuda")]
    gpu: Option<(u32, Arc<Gpu>)>,
    /// The last closed step's copies, until [`EngineGpu::copy_pending`]
    /// performs them (empty once done).
    pending: Vec<BlockCopy>,
    /// Waves of `pending` already launched (a failed call resumes after them).
    waves_done: usize,
}

#[cfg(not(feature = "cuda"))]
fn built_without_cuda() -> GpuError {
    GpuError::Unavailable("kvcore was built without the `cuda` feature".to_owned())
}

impl EngineGpu {
    /// Nothing open, nothing attached, nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens CUDA device `ordinal`: loads `libcuda` and `libnvrtc`, retains
    /// the device's primary context and compiles kvcore's kernels (a few
    /// hundred milliseconds, once). Opening the same ordinal again does
    /// nothing; another ordinal is refused ([`GpuError::InvalidArgument`])
    /// once one is open. No driver, no such device, or a build without
    /// CUDA: [`GpuError::Unavailable`]; a kernel that fails to compile:
    /// [`GpuError::Compile`].
    pub fn open(&mut self, ordinal: u32) -> Result<(), GpuError> {
        #[cfg(feature = "cuda")]
        {
            if let Some((open, _)) = &self.gpu {
                if *open == ordinal {
                    return Ok(());
                }
                return Err(GpuError::InvalidArgument(format!(
                    "device {open} is already open on this engine; {ordinal} cannot be opened too"
                )));
            }
            let gpu = Gpu::probe(ordinal as usize)?;
            gpu.warm()?;
            self.gpu = Some((ordinal, gpu));
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(built_without_cuda())
        }
    }

    /// The open device, if any.
    #[cfg(feature = "cuda")]
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.gpu.as_ref().map(|(_, g)| g)
    }

    /// The attached pool, if any.
    #[cfg(feature = "cuda")]
    pub fn pool(&self) -> Option<&AttachedPool> {
        self.pool.as_ref()
    }

    #[cfg(feature = "cuda")]
    fn open_gpu(&self) -> Result<&Arc<Gpu>, GpuError> {
        self.gpu().ok_or(GpuError::NotOpen)
    }

    /// Attaches the caller's paged KV pool to the open device for `engine`'s
    /// copies, and allocates the pinned host tier of the engine's
    /// `blocks_host` pages of the same geometry (none when 0). From then on
    /// [`EngineGpu::copy_pending`] performs each step's copies.
    ///
    /// Refused, changing nothing: no device open ([`GpuError::NotOpen`]); a
    /// pool already attached, requests already admitted by `engine`,
    /// `pool.blocks` other than the engine's device blocks, geometry that
    /// does not divide evenly, a region outside the device memory CUDA has
    /// allocated on the open device, or overlapping regions
    /// ([`GpuError::InvalidArgument`]); a host tier that cannot be
    /// allocated ([`GpuError::Driver`]). A region may be a view into a
    /// larger tensor.
    ///
    /// # Safety
    /// The pool's memory must stay allocated as long as this value holds the
    /// pool (until it is dropped), and no one else may write a page while
    /// [`EngineGpu::copy_pending`] copies it. (That each region lies in live
    /// device memory when attached is checked.)
    pub unsafe fn attach(&mut self, engine: &Engine, pool: DevicePool<'_>) -> Result<(), GpuError> {
        #[cfg(feature = "cuda")]
        {
            let invalid = |m: String| GpuError::InvalidArgument(m);
            let gpu = Arc::clone(self.open_gpu()?);
            if self.pool.is_some() {
                return Err(invalid("a KV pool is already attached to this engine".to_owned()));
            }
            let config = engine.config();
            if engine.counters().requests_admitted > 0 {
                return Err(invalid("attach the KV pool before the first request".to_owned()));
            }
            if pool.blocks != config.blocks_device {
                return Err(invalid(format!(
                    "`pool.blocks` is {} but the engine has {} device blocks",
                    pool.blocks, config.blocks_device
                )));
            }
            let geometry = BlockGeometry {
                regions: u32::try_from(pool.region_bases.len())
                    .map_err(|_| invalid("more than 2^32 pool regions".to_owned()))?,
                block_bytes: pool.block_bytes,
                planes: pool.planes,
                tokens_per_block: config.block_size_tokens,
            };
            geometry.validate()?;
            let region_bytes = pool
                .block_bytes
                .checked_mul(pool.blocks as u64)
                .ok_or_else(|| invalid("`pool.block_bytes * pool.blocks` overflows".to_owned()))?;
            for (r, base) in pool.region_bases.iter().enumerate() {
                gpu.check_device_range(*base, region_bytes, &format!("pool region {r}"))?;
            }
            let mut sorted: Vec<u64> = pool.region_bases.to_vec();
            sorted.sort_unstable();
            if sorted.windows(2).any(|w| w[1] - w[0] < region_bytes) {
                return Err(invalid("two pool regions overlap".to_owned()));
            }
            let host = match config.blocks_host {
                0 => None,
                n => Some(Arc::new(HostTier::new(&gpu, geometry, n)?)),
            };
            let device = KvPool::region_major(pool.region_bases.to_vec(), pool.blocks, geometry);
            // SAFETY: every region was found inside a live allocation of
            // device memory of this context and no two overlap (checked
            // above); this function's contract keeps the memory allocated
            // while `self` holds the attached pool, which is dropped before
            // the device handle (field order).
            let attached = unsafe { gpu.attach(device, host) }?;
            self.pool = Some(attached);
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (engine, pool);
            Err(built_without_cuda())
        }
    }

    /// The step's copies replace any that were not performed (the caller
    /// then performed them itself, or skipped them). Call it with what
    /// [`Engine::step`] returns.
    pub fn set_pending(&mut self, copies: &[BlockCopy]) {
        self.pending.clear();
        self.pending.extend_from_slice(copies);
        self.waves_done = 0;
    }

    /// The copies not yet performed.
    pub fn pending(&self) -> &[BlockCopy] {
        &self.pending
    }

    /// Performs the pending copies on the attached pool (offloads to the
    /// host tier, onboards from it, partial-reuse copies) in their order, one
    /// launch or copy-engine batch per conflict-free wave, and returns when
    /// they are complete on the device, with the number of waves run; a
    /// second call for the same step runs none.
    ///
    /// If a launch fails, the waves before it stay done and the rest stay
    /// pending: a new call resumes at the wave that failed (a wave may
    /// overwrite a page an earlier one read, so done waves must not run
    /// again). A failure reported while waiting for the device is a fault
    /// that CUDA keeps for the context. No pool attached:
    /// [`GpuError::NotAttached`].
    pub fn copy_pending(&mut self) -> Result<usize, GpuError> {
        #[cfg(feature = "cuda")]
        {
            let (Some(pool), Some((_, gpu))) = (self.pool.as_ref(), self.gpu.as_ref()) else {
                return Err(GpuError::NotAttached);
            };
            let launches = gpu.copy_blocks_from(pool, &self.pending, &mut self.waves_done)?;
            gpu.synchronize()?;
            self.pending.clear();
            self.waves_done = 0;
            Ok(launches)
        }
        #[cfg(not(feature = "cuda"))]
        Err(GpuError::NotAttached)
    }

    /// BLAKE3-256 of device-resident byte strings (image tensors) on the open
    /// device, in order, all in one batch; equal to the `blake3` crate's
    /// digests of the same bytes. No items: none, whatever is open. Every
    /// range is checked first to lie in device memory of the open device
    /// ([`GpuError::InvalidArgument`] otherwise); no device open:
    /// [`GpuError::NotOpen`].
    ///
    /// # Safety
    /// Every item's memory must stay allocated and unchanged for the call
    /// (the call returns after the kernel has read it all).
    pub unsafe fn digest_device(&self, items: &[DeviceBytes]) -> Result<Vec<[u8; 32]>, GpuError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        #[cfg(feature = "cuda")]
        {
            let gpu = self.open_gpu()?;
            for it in items {
                let what = format!("the device range {:#x} + {}", it.ptr, it.len);
                gpu.check_device_range(it.ptr, it.len, &what)?;
            }
            // SAFETY: every range was just found inside a live allocation of
            // device memory of this context; this function's contract keeps
            // it allocated and unchanged for the call, and `digest_device`
            // returns only after the kernel read it all.
            unsafe { gpu.digest_device(items) }
        }
        #[cfg(not(feature = "cuda"))]
        Err(built_without_cuda())
    }
}
