//! The GPU path: a context with its stream and module cache, digest batches,
//! the attached KV pool with its optional pinned host tier, and block copies.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, DevicePtr, PinnedHostSlice, sys};

use super::GpuError;
use super::digest::{CHUNK_BYTES, GROUP_CHUNKS, groups_of_len, scratch_of_len};
use super::kernels::{KernelId, KernelOptions, ModuleCache, arch_for};
use super::launch::{self, Blake3Item};
use super::pool::{BlockGeometry, CopyOp, KvPool, plan_copy_waves};
use crate::resources::BlockCopy;

/// One CUDA device as kvcore uses it: its primary context, one stream on
/// which every kernel of this handle runs in order, and the module cache.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: ModuleCache,
    sm_count: u32,
    name: String,
}

/// A device-resident byte string: a device address and a length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBytes {
    /// Device address of the first byte (any alignment; 16-byte aligned is fastest).
    pub ptr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Gpu {
    /// Opens device `ordinal`, or says why it cannot. Never panics: a missing
    /// `libcuda` or `libnvrtc` (which cudarc's dynamic loading reports by
    /// panicking) and a machine without a device both become
    /// [`GpuError::Unavailable`], so callers fall back to the CPU path.
    pub fn probe(ordinal: usize) -> Result<Arc<Gpu>, GpuError> {
        Self::probe_with(ordinal, KernelOptions::default())
    }

    /// As [`Gpu::probe`], compiling the kernels with `options` (benchmarks
    /// compare variants with one handle each).
    pub fn probe_with(ordinal: usize, options: KernelOptions) -> Result<Arc<Gpu>, GpuError> {
        options.validate()?;
        let opened = std::panic::catch_unwind(|| -> Result<Gpu, GpuError> {
            // SAFETY: `is_culib_present` only tries to dlopen the library by its
            // usual names and drops the handle; it touches no CUDA state.
            if !unsafe { sys::is_culib_present() } {
                return Err(GpuError::Unavailable("libcuda was not found".to_owned()));
            }
            // SAFETY: as above, for libnvrtc.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err(GpuError::Unavailable("libnvrtc was not found".to_owned()));
            }
            let ctx = CudaContext::new(ordinal)?;
            let (major, minor) = ctx.compute_capability()?;
            let sm_count =
                ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
            let name = ctx.name()?;
            let stream = ctx.new_stream()?;
            let modules = ModuleCache::new(Arc::clone(&ctx), arch_for(major, minor), options);
            Ok(Gpu { ctx, stream, modules, sm_count, name })
        });
        match opened {
            Ok(Ok(gpu)) => Ok(Arc::new(gpu)),
            Ok(Err(GpuError::Driver(e))) => Err(GpuError::Unavailable(format!("{e}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(GpuError::Unavailable("loading the CUDA libraries panicked".to_owned())),
        }
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every kernel of this handle runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Multiprocessors on the device.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compiles and loads every kernel now (otherwise the first use does).
    pub fn warm(&self) -> Result<(), GpuError> {
        self.modules.warm()
    }

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        Ok(self.stream.synchronize()?)
    }

    /// The module cache of this context.
    pub fn modules(&self) -> &ModuleCache {
        &self.modules
    }

    pub(super) fn function(&self, id: KernelId) -> Result<cudarc::driver::CudaFunction, GpuError> {
        self.modules.function(id)
    }

    /// Lays out a digest batch: the item table (uploaded), scratch for the
    /// values and set counters above the groups, and the digests' output.
    ///
    /// # Safety
    /// Every `items[i]` must name `len` readable bytes of device memory of this
    /// context, which must stay allocated and unchanged until the batch's
    /// launches have completed (after [`Gpu::read_digests`] or a synchronize).
    pub unsafe fn prepare_digests(&self, items: &[DeviceBytes]) -> Result<DigestBatch, GpuError> {
        if items.is_empty() {
            return Err(GpuError::InvalidArgument("a digest batch needs at least one item".to_owned()));
        }
        let out: CudaSlice<u8> = self.stream.alloc_zeros(32 * items.len())?;
        let (out_base, _sync) = out.device_ptr(&self.stream);
        let mut table = Vec::with_capacity(items.len());
        let (mut group_next, mut cv_next, mut ctr_next) = (0u64, 0u64, 0u64);
        for (i, it) in items.iter().enumerate() {
            let groups = groups_of_len(it.len);
            let (values, counters) = scratch_of_len(it.len);
            table.push(Blake3Item {
                data: it.ptr,
                len: it.len,
                out: out_base + 32 * i as u64,
                cv_first: cv_next,
                ctr_first: ctr_next,
                group_first: u32::try_from(group_next)
                    .map_err(|_| GpuError::InvalidArgument("a digest batch has more than 2^32 groups".to_owned()))?,
                groups: groups as u32,
            });
            group_next += groups;
            cv_next += values;
            ctr_next += counters;
        }
        if group_next > i32::MAX as u64 {
            return Err(GpuError::InvalidArgument("a digest batch is limited to 2^31 - 1 groups (128 TiB)".to_owned()));
        }
        drop(_sync);
        let table_dev = self.stream.clone_htod(bytemuck::cast_slice::<Blake3Item, u8>(&table))?;
        let cvs: CudaSlice<u32> = self.stream.alloc_zeros((8 * cv_next).max(8) as usize)?;
        let counters: CudaSlice<u32> = self.stream.alloc_zeros(ctr_next.max(1) as usize)?;
        let batch = DigestBatch { table, table_dev, cvs, counters, out, groups: group_next as u32, keep: None };
        launch::check_digest_batch(&batch);
        Ok(batch)
    }

    /// Launches a prepared batch (one launch; a batch may be launched again).
    /// A batch of at most two groups per SM leaves SMs idle and waits on
    /// dependency chains, so it takes the latency kernel; larger ones take
    /// the throughput kernel.
    pub fn launch_digests(&self, batch: &DigestBatch) -> Result<(), GpuError> {
        let variant =
            if batch.groups <= 2 * self.sm_count { KernelId::Blake3Latency } else { KernelId::Blake3Throughput };
        launch::blake3_digest(self, batch, variant)
    }

    /// Waits for the batch and returns its digests in item order.
    pub fn read_digests(&self, batch: &DigestBatch) -> Result<Vec<[u8; 32]>, GpuError> {
        let bytes = self.stream.clone_dtoh(&batch.out)?;
        self.stream.synchronize()?;
        Ok(bytes.chunks_exact(32).map(|c| c.try_into().expect("32-byte chunks")).collect())
    }

    /// BLAKE3-256 of device-resident items: prepare, two launches, read back.
    /// This is what the C API wraps.
    ///
    /// # Safety
    /// As [`Gpu::prepare_digests`]; the call returns only after the kernels
    /// finished, so the items need to live only for the call.
    pub unsafe fn digest_device(&self, items: &[DeviceBytes]) -> Result<Vec<[u8; 32]>, GpuError> {
        // SAFETY: the caller upholds prepare_digests' contract for the call,
        // and read_digests synchronizes before returning.
        let batch = unsafe { self.prepare_digests(items)? };
        self.launch_digests(&batch)?;
        self.read_digests(&batch)
    }

    /// A digest batch over ranges `(offset, len)` of a device buffer the batch
    /// keeps alive: the safe way to prepare a batch that is launched many
    /// times (benchmarks). Ranges past the buffer are refused.
    pub fn prepare_digests_in(&self, data: Arc<CudaSlice<u8>>, ranges: &[(u64, u64)]) -> Result<DigestBatch, GpuError> {
        let base = data.device_ptr(&self.stream).0;
        let mut items = Vec::with_capacity(ranges.len());
        for (i, &(offset, len)) in ranges.iter().enumerate() {
            if offset.checked_add(len).is_none_or(|end| end > data.len() as u64) {
                return Err(GpuError::InvalidArgument(format!("range {i} ends past the buffer")));
            }
            items.push(DeviceBytes { ptr: base + offset, len });
        }
        // SAFETY: every range was checked to lie inside `data`, which the
        // batch holds (Arc) until it is dropped, after its launches.
        let mut batch = unsafe { self.prepare_digests(&items)? };
        batch.keep = Some(data);
        Ok(batch)
    }

    /// BLAKE3-256 of device buffers owned by Rust: the safe entry point.
    pub fn digest_views(&self, items: &[CudaView<'_, u8>]) -> Result<Vec<[u8; 32]>, GpuError> {
        let mut list = Vec::with_capacity(items.len());
        for v in items {
            let (ptr, _sync) = v.device_ptr(&self.stream);
            list.push(DeviceBytes { ptr, len: v.len() as u64 });
        }
        // SAFETY: each view borrows live device memory of this context for
        // the whole call, and digest_device synchronizes before returning.
        unsafe { self.digest_device(&list) }
    }

    /// Attaches a caller-owned KV pool (and optionally a host tier made by
    /// [`HostTier::new`]) for block copies: checks the layout and uploads the
    /// base addresses.
    ///
    /// # Safety
    /// Each of `device.region_bases` must be the device address of
    /// `device.blocks * block_bytes` bytes of this context's device memory,
    /// regions must not overlap, and the memory must outlive the returned
    /// engine's launches.
    pub unsafe fn attach(&self, device: KvPool, host: Option<Arc<HostTier>>) -> Result<CopyEngine, GpuError> {
        device.validate()?;
        if let Some(h) = &host
            && h.pool.geometry != device.geometry
        {
            return Err(GpuError::InvalidArgument(
                "the host tier's geometry differs from the device pool's".to_owned(),
            ));
        }
        let host_bases =
            host.as_ref().map(|h| h.pool.region_bases.clone()).unwrap_or_else(|| device.region_bases.clone());
        let g = device.geometry;
        let vec16 = g.block_bytes % 16 == 0
            && g.plane_bytes() % 16 == 0
            && g.token_bytes() % 16 == 0
            && device.region_bases.iter().chain(&host_bases).all(|b| b % 16 == 0);
        let device_bases_dev = self.stream.clone_htod(&device.region_bases)?;
        let host_bases_dev = self.stream.clone_htod(&host_bases)?;
        let id = NEXT_ENGINE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(CopyEngine { id, device, host, device_bases_dev, host_bases_dev, vec16, keep: None })
    }

    /// Checks a wave against `engine` (see `launch::check_wave`) and uploads
    /// it, host writes first so that the kernel can give each direction its
    /// own thread blocks (copies of a wave are independent, so their order is
    /// free).
    pub fn prepare_wave(&self, engine: &CopyEngine, mut ops: Vec<CopyOp>) -> Result<CopyWave, GpuError> {
        launch::check_wave(engine, &ops)?;
        ops.sort_by_key(|op| op.media & 2 == 0);
        let host_writes = ops.iter().take_while(|op| op.media & 2 != 0).count();
        let reads_host = ops.iter().any(|op| op.media & 1 != 0);
        let split_at = if host_writes > 0 && host_writes < ops.len() && reads_host { host_writes as u32 } else { 0 };
        let ops_dev = if ops.is_empty() {
            self.stream.alloc_zeros(16)?
        } else {
            self.stream.clone_htod(bytemuck::cast_slice::<CopyOp, u8>(&ops))?
        };
        let touches_host = ops.iter().any(CopyOp::touches_host);
        Ok(CopyWave { engine_id: engine.id, ops_dev, touches_host, split_at, ops })
    }

    /// Attaches a pool that lives in a device buffer the engine keeps alive:
    /// `regions` regions of `blocks` pages tile the buffer from its start. The
    /// safe way to attach a pool allocated from Rust (tests, benchmarks).
    pub fn attach_in(
        &self,
        buf: Arc<CudaSlice<u8>>,
        geometry: BlockGeometry,
        blocks: u32,
        host: Option<Arc<HostTier>>,
    ) -> Result<CopyEngine, GpuError> {
        geometry.validate()?;
        let region_bytes = geometry.block_bytes * blocks as u64;
        if region_bytes * geometry.regions as u64 > buf.len() as u64 {
            return Err(GpuError::InvalidArgument("the pool does not fit in the buffer".to_owned()));
        }
        let base = buf.device_ptr(&self.stream).0;
        let pool = KvPool {
            region_bases: (0..geometry.regions as u64).map(|r| base + r * region_bytes).collect(),
            blocks,
            geometry,
        };
        // SAFETY: the regions were checked to tile `buf` without overlap, and
        // the engine holds `buf` (Arc) for as long as it exists.
        let mut engine = unsafe { self.attach(pool, host)? };
        engine.keep = Some(buf);
        Ok(engine)
    }

    /// Performs a step's copies: validates them, cuts them into conflict-free
    /// waves and launches one kernel per wave on the stream (asynchronously:
    /// synchronize before reading the data on the host). Returns the number
    /// of launches.
    pub fn copy_blocks(&self, engine: &CopyEngine, copies: &[BlockCopy]) -> Result<usize, GpuError> {
        let waves = plan_copy_waves(
            copies,
            &engine.device.geometry,
            engine.device.blocks,
            engine.host.as_ref().map(|h| h.pool.blocks),
        )?;
        let n = waves.len();
        for ops in waves {
            let wave = self.prepare_wave(engine, ops)?;
            launch::kv_block_copy(self, engine, &wave, None)?;
        }
        Ok(n)
    }
}

/// A prepared digest batch: the item table (host and device copies), the
/// scratch for values and set counters above the groups, and the digests'
/// output. Built by
/// [`Gpu::prepare_digests`], whose contract makes every item address valid.
#[derive(Debug)]
pub struct DigestBatch {
    pub(super) table: Vec<Blake3Item>,
    pub(super) table_dev: CudaSlice<u8>,
    pub(super) cvs: CudaSlice<u32>,
    pub(super) counters: CudaSlice<u32>,
    pub(super) out: CudaSlice<u8>,
    pub(super) groups: u32,
    /// The buffer the items live in, when the batch owns a reference to it.
    keep: Option<Arc<CudaSlice<u8>>>,
}

impl DigestBatch {
    /// Items in the batch.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the batch is empty (never: preparation refuses that).
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Bytes hashed by the batch.
    pub fn bytes(&self) -> u64 {
        self.table.iter().map(|t| t.len).sum()
    }

    /// Thread blocks of the launch (groups of 64 chunks).
    pub fn groups(&self) -> u32 {
        self.groups
    }

    /// Chunk count of the batch's largest item, for reports.
    pub fn chunks_max(&self) -> u64 {
        self.table.iter().map(|t| t.len.div_ceil(CHUNK_BYTES).max(1)).max().unwrap_or(0)
    }

    /// Chunks per group (the block size of the launch).
    pub const GROUP_CHUNKS: u64 = GROUP_CHUNKS;
}

/// The pinned host tier: one page-locked allocation, device-mapped so that the
/// copy kernel reads and writes it over PCIe directly. Allocated without the
/// write-combined flag, because the CPU may read it (write-combined memory is
/// very slow to read from the host).
#[derive(Debug)]
pub struct HostTier {
    buf: PinnedHostSlice<u8>,
    pool: KvPool,
}

impl HostTier {
    /// Allocates `blocks` host pages of `geometry` in every region. Wrap it
    /// in an `Arc` to attach it.
    pub fn new(gpu: &Gpu, geometry: BlockGeometry, blocks: u32) -> Result<HostTier, GpuError> {
        geometry.validate()?;
        let region_bytes = geometry
            .block_bytes
            .checked_mul(blocks as u64)
            .ok_or_else(|| GpuError::InvalidArgument("host tier size overflows".to_owned()))?;
        let total = region_bytes
            .checked_mul(geometry.regions as u64)
            .filter(|t| *t > 0 && *t < isize::MAX as u64)
            .ok_or_else(|| GpuError::InvalidArgument("host tier size is zero or overflows".to_owned()))?;
        // SAFETY: the memory is uninitialised bytes, which is fine for u8 and
        // never read as anything else; PORTABLE | DEVICEMAP makes it usable
        // from kernels of any context, and no WRITECOMBINED flag keeps host
        // reads fast.
        let mut buf = unsafe {
            gpu.ctx.alloc_pinned_with_flags::<u8>(
                total as usize,
                sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )?
        };
        let host_ptr = buf.as_mut_ptr()?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: host_ptr is the start of a live DEVICEMAP pinned allocation
        // (just made), and dev is a valid out-pointer.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host_ptr.cast(), 0) }.result()?;
        let region_bases = (0..geometry.regions as u64).map(|r| dev + r * region_bytes).collect();
        Ok(HostTier { buf, pool: KvPool { region_bases, blocks, geometry } })
    }

    /// The tier as a pool (device-mapped addresses).
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// The tier's bytes, region after region. Kernels write it without the
    /// slice knowing: synchronize the stream first.
    pub fn bytes(&self) -> Result<&[u8], GpuError> {
        Ok(self.buf.as_slice()?)
    }

    /// The tier's bytes for writing, before it is shared with an engine.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], GpuError> {
        Ok(self.buf.as_mut_slice()?)
    }
}

static NEXT_ENGINE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A checked, uploaded wave of copies for one [`CopyEngine`]: no page is
/// written twice or both read and written, every page is inside its pool.
#[derive(Debug)]
pub struct CopyWave {
    pub(super) engine_id: u64,
    pub(super) ops: Vec<CopyOp>,
    pub(super) ops_dev: CudaSlice<u8>,
    pub(super) touches_host: bool,
    /// Ops before this index write the host tier and get their own half of
    /// the grid; 0 when the wave is not split.
    pub(super) split_at: u32,
}

impl CopyWave {
    /// Copies in the wave.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the wave is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// An attached KV pool, with its host tier if any, ready for block copies.
#[derive(Debug)]
pub struct CopyEngine {
    pub(super) id: u64,
    pub(super) device: KvPool,
    pub(super) host: Option<Arc<HostTier>>,
    pub(super) device_bases_dev: CudaSlice<u64>,
    pub(super) host_bases_dev: CudaSlice<u64>,
    pub(super) vec16: bool,
    /// The device buffer the pool lives in, when the engine owns a reference to it.
    keep: Option<Arc<CudaSlice<u8>>>,
}

impl CopyEngine {
    /// The device pool.
    pub fn device(&self) -> &KvPool {
        &self.device
    }

    /// The host tier.
    pub fn host(&self) -> Option<&Arc<HostTier>> {
        self.host.as_ref()
    }

    /// Whether copies move 16-byte words (every base and size aligned) rather than bytes.
    pub fn vectorized(&self) -> bool {
        self.vec16
    }
}

/// Launches one prepared wave with an explicit number of thread blocks (for
/// benchmarks that sweep it); `None` takes the default.
pub fn launch_copy_wave(gpu: &Gpu, engine: &CopyEngine, wave: &CopyWave, grid: Option<u32>) -> Result<(), GpuError> {
    launch::kv_block_copy(gpu, engine, wave, grid)
}
