//! The attached KV pool: the caller's paged device pool and the host tier,
//! with what copies on them need (bases uploaded for the kernel, the copy
//! engines' streams, the staged path's device buffers), and who moves the
//! host tier's bytes.
//!
//! ```text
//! Gpu::attach(device pool, host tier) -> AttachedPool
//!     Gpu::prepare_wave(&pool, ops) -> CopyWave     checks, splits between kernel / copy engines / staging
//!     launch_copy_wave(&gpu, &pool, &wave, grid)    enqueues it
//!     Gpu::copy_blocks(&pool, copies)               plans a step's copies into waves and runs them
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, sys};

use super::device::Gpu;
use super::dma;
use super::error::GpuError;
use super::host_tier::HostTier;
use super::pool::{BlockGeometry, KvPool};

static NEXT_POOL_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Who moves the bytes of copies to and from the host tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostCopyPath {
    /// The copy kernel, at most 16 thread blocks, over mapped pinned memory.
    Kernel,
    /// The copy engines, one batched driver call per direction on two
    /// streams: no SM is used. Device-to-device copies stay on the kernel.
    CopyEngines,
    /// The copy engine for offload (writes to the host tier), the kernel for
    /// onboard.
    Split,
    /// The copy engines through a device staging buffer: each direction's
    /// copies are sorted by host page, so that runs of consecutive host
    /// pages become single copy-engine runs whatever the device pages are; a
    /// gather (offload) or scatter (onboard) kernel of a few thread blocks
    /// moves the device pages to or from the staging slot, pipelined with
    /// the copy engines slot by slot ([`StagingConfig`]). Host-to-host copies
    /// and waves whose blocks exceed a slot stay on the kernel.
    Staged,
    /// Per wave: the copy engines when the host copies of every direction
    /// present merge into runs of at least [`LONG_RUN`](super::LONG_RUN) bytes on
    /// average (no SM used, full copy-engine rate); else the staged path
    /// for a wave that offloads and onboards at least
    /// [`STAGED_MIN_BYTES`](super::STAGED_MIN_BYTES) each and whose host pages alone merge into
    /// runs of at least [`STAGED_LONG_RUN`](super::STAGED_LONG_RUN) bytes on average (with the
    /// block-major host tier, every whole block is such a run once its
    /// regions add up to that); else the kernel.
    #[default]
    Auto,
}

/// An attached KV pool, with its host tier if any, ready for block copies:
/// the device pool's layout and its bases on the device, the host tier, who
/// moves host-tier bytes ([`HostCopyPath`]), the copy engines' streams and
/// the staged path's buffers. Made by [`Gpu::attach`] or [`Gpu::attach_in`];
/// [`Gpu::prepare_wave`] and [`Gpu::copy_blocks`] copy on it.
#[derive(Debug)]
pub struct AttachedPool {
    pub(super) id: u64,
    pub(super) device: KvPool,
    pub(super) host: Option<Arc<HostTier>>,
    /// The host tier's region bases (the device pool's when there is none).
    pub(super) host_bases: Vec<u64>,
    /// The host tier's page stride (the device pool's when there is none).
    pub(super) host_stride: u64,
    pub(super) host_path: HostCopyPath,
    /// Streams of the copy engines: writes to the host tier, reads from it.
    pub(super) dma_out: Arc<CudaStream>,
    pub(super) dma_in: Arc<CudaStream>,
    pub(super) device_bases_dev: CudaSlice<u64>,
    pub(super) host_bases_dev: CudaSlice<u64>,
    pub(super) vec16: bool,
    /// The device buffer the pool lives in, when the pool owns a reference to it.
    keep: Option<Arc<CudaSlice<u8>>>,
    /// Staging buffers and streams of the staged path (with a host tier).
    pub(super) staging: Option<Staging>,
}

/// Sizes of the staged host path's device buffers: per direction, `slots`
/// slots of `slot_bytes` each (the unit the gather or scatter kernel and the
/// copy engine hand each other). Two slots of 8 MiB per direction (32 MiB of
/// device memory in all): a slot takes about 150 µs over PCIe and 10-20 µs
/// to gather, so two keep the copy engine busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingConfig {
    /// Bytes of one slot (at least one block).
    pub slot_bytes: u64,
    /// Slots per direction (at least 1; 2 pipelines).
    pub slots: u32,
    /// Thread blocks of each gather or scatter launch (1 to 8, so that both
    /// directions together stay within 16).
    pub blocks: u32,
    /// Copy-engine streams per direction (1 to 4): slot k's copies go to
    /// stream k mod `copy_streams`, so that with more than one the copies
    /// of consecutive slots may run on different copy engines at once.
    pub copy_streams: u32,
    /// Whether a direction whose copies are all whole blocks of a
    /// block-major host tier is planned as one record per block (the
    /// default) rather than one segment per block and region (kept to
    /// compare the two).
    pub whole_blocks: bool,
}

impl Default for StagingConfig {
    fn default() -> Self {
        Self { slot_bytes: 8 << 20, slots: 2, blocks: 8, copy_streams: 1, whole_blocks: true }
    }
}

static NEXT_STAGING_GEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The staged path's device state: slots for each direction, the streams of
/// the gather and scatter kernels, and one event per slot and direction for
/// "slot filled" and "slot free" (reused wave after wave; a wait always
/// refers to the latest record, enqueued before the next one).
#[derive(Debug)]
pub(super) struct Staging {
    pub(super) config: StagingConfig,
    pub(super) generation: u64,
    _out_buf: CudaSlice<u8>,
    _in_buf: CudaSlice<u8>,
    pub(super) out_slots: Vec<u64>,
    pub(super) in_slots: Vec<u64>,
    pub(super) gather: Arc<CudaStream>,
    pub(super) scatter: Arc<CudaStream>,
    /// Copy-engine streams beyond the pool's own, per direction
    /// (`copy_streams - 1` each).
    pub(super) extra_out: Vec<Arc<CudaStream>>,
    pub(super) extra_in: Vec<Arc<CudaStream>>,
    /// Enqueueing of staged waves takes turns (the events are shared).
    pub(super) events: std::sync::Mutex<StagingEvents>,
}

/// The staged path's events, per slot and direction.
#[derive(Debug)]
pub(super) struct StagingEvents {
    pub(super) out_full: Vec<CudaEvent>,
    pub(super) out_free: Vec<CudaEvent>,
    pub(super) in_full: Vec<CudaEvent>,
    pub(super) in_free: Vec<CudaEvent>,
}

impl Staging {
    fn new(gpu: &Gpu, config: StagingConfig) -> Result<Staging, GpuError> {
        if config.slot_bytes == 0
            || config.slots == 0
            || !(1..=8).contains(&config.blocks)
            || !(1..=4).contains(&config.copy_streams)
        {
            return Err(GpuError::InvalidArgument(format!("unsupported staging configuration {config:?}")));
        }
        let bytes = usize::try_from(config.slot_bytes * config.slots as u64)
            .map_err(|_| GpuError::InvalidArgument("staging too large".to_owned()))?;
        let out_buf: CudaSlice<u8> = gpu.stream.alloc_zeros(bytes)?;
        let in_buf: CudaSlice<u8> = gpu.stream.alloc_zeros(bytes)?;
        let slots_of = |b: &CudaSlice<u8>| {
            let base = b.device_ptr(&gpu.stream).0;
            (0..config.slots as u64).map(|i| base + i * config.slot_bytes).collect::<Vec<u64>>()
        };
        let (out_slots, in_slots) = (slots_of(&out_buf), slots_of(&in_buf));
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let events = || -> Result<Vec<CudaEvent>, GpuError> {
            (0..config.slots).map(|_| Ok(gpu.ctx.new_event(flags)?)).collect()
        };
        let events = StagingEvents { out_full: events()?, out_free: events()?, in_full: events()?, in_free: events()? };
        gpu.stream.synchronize()?;
        Ok(Staging {
            config,
            generation: NEXT_STAGING_GEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            _out_buf: out_buf,
            _in_buf: in_buf,
            out_slots,
            in_slots,
            gather: gpu.ctx.new_stream()?,
            scatter: gpu.ctx.new_stream()?,
            extra_out: (1..config.copy_streams).map(|_| gpu.ctx.new_stream()).collect::<Result<_, _>>()?,
            extra_in: (1..config.copy_streams).map(|_| gpu.ctx.new_stream()).collect::<Result<_, _>>()?,
            events: std::sync::Mutex::new(events),
        })
    }
}

impl Staging {
    /// Waits for every stream of the staged path.
    pub(super) fn synchronize(&self) -> Result<(), GpuError> {
        for s in [&self.gather, &self.scatter].into_iter().chain(&self.extra_out).chain(&self.extra_in) {
            s.synchronize()?;
        }
        Ok(())
    }
}

impl AttachedPool {
    /// The device pool.
    pub fn device(&self) -> &KvPool {
        &self.device
    }

    /// Bases and strides of both ends, as the run builders take them.
    pub(super) fn ends(&self) -> dma::Ends<'_> {
        dma::Ends {
            device_bases: &self.device.region_bases,
            device_stride: self.device.page_stride,
            host_bases: &self.host_bases,
            host_stride: self.host_stride,
        }
    }

    /// The host tier.
    pub fn host(&self) -> Option<&Arc<HostTier>> {
        self.host.as_ref()
    }

    /// Whether copies move 16-byte words (every base and size aligned) rather than bytes.
    pub fn vectorized(&self) -> bool {
        self.vec16
    }

    /// Who moves host-tier bytes for waves prepared from now on (the default
    /// is [`HostCopyPath::Auto`]).
    pub fn host_path(&self) -> HostCopyPath {
        self.host_path
    }

    /// Chooses who moves host-tier bytes for waves prepared from now on
    /// (waves already prepared keep their split).
    pub fn set_host_path(&mut self, path: HostCopyPath) {
        self.host_path = path;
    }

    /// The staged path's buffer sizes (`None` without a host tier).
    pub fn staging(&self) -> Option<StagingConfig> {
        self.staging.as_ref().map(|s| s.config)
    }

    /// Reallocates the staged path's buffers (after the pool's queued
    /// copies finish); waves prepared before are refused afterwards.
    pub fn set_staging(&mut self, gpu: &Gpu, config: StagingConfig) -> Result<(), GpuError> {
        if self.host.is_none() {
            return Err(GpuError::InvalidArgument("staging needs a host tier".to_owned()));
        }
        gpu.synchronize()?;
        if let Some(st) = &self.staging {
            st.synchronize()?;
        }
        self.dma_out.synchronize()?;
        self.dma_in.synchronize()?;
        self.staging = Some(Staging::new(gpu, config)?);
        Ok(())
    }
}

impl Drop for AttachedPool {
    fn drop(&mut self) {
        // The pools may be freed with this value: let its copies finish first.
        let _ = self.dma_out.synchronize();
        let _ = self.dma_in.synchronize();
        if let Some(st) = &self.staging {
            let _ = st.synchronize();
        }
    }
}

impl Gpu {
    /// Attaches a caller-owned KV pool (and optionally a host tier made by
    /// [`HostTier::new`]) for block copies: checks the layout and uploads the
    /// base addresses.
    ///
    /// # Safety
    /// For every region r and page p < `device.blocks`, the `block_bytes`
    /// bytes at `device.page_addr(r, p)` must be device memory of this
    /// context, no two (region, page) pairs may overlap, and the memory must
    /// outlive the returned pool's launches.
    pub unsafe fn attach(&self, device: KvPool, host: Option<Arc<HostTier>>) -> Result<AttachedPool, GpuError> {
        device.validate()?;
        if let Some(h) = &host
            && h.pool().geometry != device.geometry
        {
            return Err(GpuError::InvalidArgument(
                "the host tier's geometry differs from the device pool's".to_owned(),
            ));
        }
        let host_bases =
            host.as_ref().map(|h| h.pool().region_bases.clone()).unwrap_or_else(|| device.region_bases.clone());
        let host_stride = host.as_ref().map_or(device.page_stride, |h| h.pool().page_stride);
        let g = device.geometry;
        let vec16 = g.block_bytes.is_multiple_of(16)
            && g.plane_bytes().is_multiple_of(16)
            && g.token_bytes().is_multiple_of(16)
            && device.page_stride.is_multiple_of(16)
            && host_stride.is_multiple_of(16)
            && device.region_bases.iter().chain(&host_bases).all(|b| b % 16 == 0);
        let device_bases_dev = self.stream.clone_htod(&device.region_bases)?;
        let host_bases_dev = self.stream.clone_htod(&host_bases)?;
        let id = NEXT_POOL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (dma_out, dma_in) = (self.ctx.new_stream()?, self.ctx.new_stream()?);
        let staging = match &host {
            Some(_) => Some(Staging::new(self, StagingConfig::default())?),
            None => None,
        };
        Ok(AttachedPool {
            staging,
            id,
            device,
            host,
            host_bases,
            host_stride,
            device_bases_dev,
            host_bases_dev,
            vec16,
            host_path: HostCopyPath::default(),
            dma_out,
            dma_in,
            keep: None,
        })
    }

    /// Attaches a pool that lives in a device buffer the attached pool keeps alive:
    /// `regions` regions of `blocks` pages tile the buffer from its start. The
    /// safe way to attach a pool allocated from Rust (tests, benchmarks).
    pub fn attach_in(
        &self,
        buf: Arc<CudaSlice<u8>>,
        geometry: BlockGeometry,
        blocks: u32,
        host: Option<Arc<HostTier>>,
    ) -> Result<AttachedPool, GpuError> {
        geometry.validate()?;
        let region_bytes = geometry.block_bytes * blocks as u64;
        if region_bytes * geometry.regions as u64 > buf.len() as u64 {
            return Err(GpuError::InvalidArgument("the pool does not fit in the buffer".to_owned()));
        }
        let base = buf.device_ptr(&self.stream).0;
        let pool = KvPool::region_major(
            (0..geometry.regions as u64).map(|r| base + r * region_bytes).collect(),
            blocks,
            geometry,
        );
        // SAFETY: the regions were checked to tile `buf` without overlap, and
        // the attached pool holds `buf` (Arc) for as long as it exists.
        let mut attached = unsafe { self.attach(pool, host)? };
        attached.keep = Some(buf);
        Ok(attached)
    }
}
