//! The GPU path: a context with its stream and module cache, digest batches,
//! the attached KV pool with its optional pinned host tier, and block copies.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr, PinnedHostSlice, sys};

use super::GpuError;
use super::digest::{CHUNK_BYTES, GROUP_CHUNKS, groups_of_len, scratch_of_len};
use super::dma::{self, RunList, StagedList};
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
    /// Reusable buffers of [`Gpu::digest_device`], grown when a call needs more.
    arena: std::sync::Mutex<Option<DigestArena>>,
}

/// Buffers one digest call reuses: set counters (zero between calls, as the
/// kernel leaves them), the device table and values, and a mapped pinned
/// host buffer that receives the digests from the kernel directly and holds
/// the table (read by the kernel in place for a few items, else uploaded),
/// so that a small call is one launch and one synchronize, with no
/// allocation, no memset and no copy.
#[derive(Debug)]
struct DigestArena {
    counters: CudaSlice<u32>,
    counters_ptr: u64,
    work: CudaSlice<u8>,
    work_ptr: u64,
    host: PinnedHostSlice<u8>,
    host_ptr: usize,
    /// The device-mapped address of `host`.
    host_dev: u64,
    /// The last completion value the one-item kernel was given (the flag
    /// word at the start of `host` holds it once that kernel is done).
    seq: u32,
    /// One-node graphs of the one-item kernels launched through a graph
    /// ([`OneItemPath::ByValueFlag`]), made on first use.
    graphs: Vec<launch::OneGraph>,
}

/// Items up to which the one-call digest's kernel reads the table from
/// mapped host memory instead of a device copy.
const MAPPED_TABLE_ITEMS: usize = 4;

/// Where the completion flag and the outputs start in a digest arena's host
/// buffer: the flag word at 0, the outputs at 256.
const ARENA_OUT_OFF: usize = 256;

/// Byte offsets in a digest arena for `n` items and `values` scratch values:
/// the completion flag at 0 and outputs at [`ARENA_OUT_OFF`] (host buffer),
/// the table after them (both buffers), the values after that (device
/// buffer); the device buffer's total.
fn arena_layout(n: usize, values: u64) -> (usize, usize, usize) {
    let up = |x: usize| x.div_ceil(256) * 256;
    let table_off = up(ARENA_OUT_OFF + 32 * n);
    let values_off = up(table_off + 48 * n);
    (table_off, values_off, values_off + 32 * values.max(1) as usize)
}

/// How [`Gpu::digest_device_via`] runs a call of one item (calls of several
/// items always take the table kernel and a stream synchronize). The
/// benchmark compares them; [`Gpu::digest_device`] takes the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OneItemPath {
    /// The item table (read from mapped host memory), the kernel of
    /// [`Gpu::digest_variant`], a stream synchronize.
    Table,
    /// The item passed by value to `blake3_digest_one_flag` (no table read
    /// before the first load), a stream synchronize.
    ByValue,
    /// As `ByValueFlag`, launched by `cuLaunchKernel` (the default before
    /// the fifth pass).
    ByValueFlagLaunch,
    /// The item by value, launched as a one-node CUDA graph (made on the
    /// first call; each call sets the node's parameters and launches it),
    /// waiting on the kernel's completion flag in mapped host memory
    /// instead of the stream (the stream is still checked for errors while
    /// waiting).
    #[default]
    ByValueFlag,
    /// Benchmarks only: as `ByValueFlagLaunch` with the diagnostic kernel of
    /// this name (`b3x_one_*` of the `B3_ONE` module, with the one-item
    /// signature plus a null trace); `b3x_one_empty` measures what launch
    /// and completion cost alone (its digest is not computed).
    Experiment(&'static str),
    /// Benchmarks only: as `Experiment`, launched as `ByValueFlag` is.
    GraphExperiment(&'static str),
}

/// A device-resident byte string: a device address and a length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBytes {
    /// Device address of the first byte (any alignment; 16-byte aligned is fastest).
    pub ptr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // The digest arena's graphs name functions of the module cache:
        // destroy them, and free the arena's buffers, while the modules
        // are loaded and the stream lives (fields drop in declaration
        // order, the arena last).
        let _ = self.stream.synchronize();
        if let Ok(mut a) = self.arena.lock() {
            *a = None;
        }
    }
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
            Ok(Gpu { ctx, stream, modules, sm_count, name, arena: std::sync::Mutex::new(None) })
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

    /// Checks that `[ptr, ptr + len)` lies inside one live allocation of
    /// device memory on this handle's device, so that a kernel given it
    /// cannot fault on a made-up or freed address or on another GPU's
    /// memory. The C API checks every device address it is given with this.
    /// An empty range passes whatever `ptr` is. What it cannot see: memory
    /// freed after the check.
    pub fn check_device_range(&self, ptr: u64, len: u64, what: &str) -> Result<(), GpuError> {
        if len == 0 {
            return Ok(());
        }
        let bad = |why: String| Err(GpuError::InvalidArgument(format!("{what}: {why}")));
        let Some(end) = ptr.checked_add(len) else {
            return bad(format!("{len} bytes from {ptr:#x} pass the end of the address space"));
        };
        self.ctx.bind_to_thread()?;
        let (mut start, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        let (mut kind, mut ordinal): (u32, i32) = (0, -1);
        let attr = |out: *mut std::ffi::c_void, a: sys::CUpointer_attribute| {
            // SAFETY: each call below passes an out-pointer to a value of the
            // attribute's type (CUdeviceptr for RANGE_START_ADDR, size_t for
            // RANGE_SIZE, an unsigned int CUmemorytype for MEMORY_TYPE, an
            // int for DEVICE_ORDINAL), and `ptr` is only read as a number:
            // an address no allocation holds gets an error code, not a fault.
            unsafe { sys::cuPointerGetAttribute(out, a, ptr) }.result()
        };
        use sys::CUpointer_attribute as A;
        let found = attr((&mut kind as *mut u32).cast(), A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
            .and_then(|()| attr((&mut ordinal as *mut i32).cast(), A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL))
            .and_then(|()| attr((&mut start as *mut sys::CUdeviceptr).cast(), A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR))
            .and_then(|()| attr((&mut size as *mut usize).cast(), A::CU_POINTER_ATTRIBUTE_RANGE_SIZE));
        if let Err(e) = found {
            return bad(format!("{ptr:#x} is not in memory CUDA has allocated ({e})"));
        }
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return bad(format!("{ptr:#x} is not device memory (CUmemorytype {kind})"));
        }
        if ordinal != self.ctx.ordinal() as i32 {
            return bad(format!(
                "{ptr:#x} is memory of device {ordinal}, not of the open device {}",
                self.ctx.ordinal()
            ));
        }
        if end > start + size as u64 {
            return bad(format!(
                "{len} bytes from {ptr:#x} pass the end of their allocation ({size} bytes from {start:#x})"
            ));
        }
        Ok(())
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
        let (table, group_next, cv_next, ctr_next) = build_table(items, out_base)?;
        drop(_sync);
        let table_dev = self.stream.clone_htod(bytemuck::cast_slice::<Blake3Item, u8>(&table))?;
        let cvs: CudaSlice<u32> = self.stream.alloc_zeros((8 * cv_next).max(8) as usize)?;
        let counters: CudaSlice<u32> = self.stream.alloc_zeros(ctr_next.max(1) as usize)?;
        let sets = ctr_next > 0;
        let batch = DigestBatch { table, table_dev, cvs, counters, out, groups: group_next, sets, keep: None };
        launch::check_digest_batch(&batch);
        Ok(batch)
    }

    /// Launches a prepared batch (one launch, or two for a large batch with
    /// items of several groups; a batch may be launched again).
    /// A batch of at most two groups per SM leaves SMs idle and waits on
    /// dependency chains, so it takes the latency kernel; larger ones take
    /// the four-groups-per-block kernel and, when some item has several
    /// groups, the fold launch after it.
    pub fn launch_digests(&self, batch: &DigestBatch) -> Result<(), GpuError> {
        launch::blake3_digest(self, batch, self.digest_variant(batch.groups))
    }

    /// The BLAKE3 kernel for a launch of `groups` groups (measured on an
    /// H200, docs/benchmarks.md): at most two groups per SM wait on their
    /// own dependency chains, so plain additions (one 3 MiB image: 29-31
    /// µs against 35-40 for the others); beyond, two chunks per thread and
    /// four groups per block folded side by side, the levels above the
    /// groups in a fold launch of their own (256 MiB: 1.54-1.58 TB/s against
    /// 1.47-1.48 in one launch, seventh pass; the one launch at 288 MiB,
    /// fourth pass: 1.44-1.49 TB/s
    /// against 1.30-1.35 for one group per warp and 1.24-1.26 for one chunk
    /// per thread; 8 images of 3 MiB: 38-41 µs against 42-45 for one chunk
    /// per thread; 1 KiB items as fast as one group per warp).
    pub fn digest_variant(&self, groups: u32) -> KernelId {
        if groups <= 2 * self.sm_count { KernelId::Blake3Latency } else { KernelId::Blake3Multi }
    }

    /// Zeroes the batch's digests (benchmarks: so that a kernel that writes
    /// none cannot pass for correct on the previous launch's digests).
    pub fn clear_digests(&self, batch: &mut DigestBatch) -> Result<(), GpuError> {
        self.stream.memset_zeros(&mut batch.out)?;
        Ok(())
    }

    /// Waits for the batch and returns its digests in item order.
    pub fn read_digests(&self, batch: &DigestBatch) -> Result<Vec<[u8; 32]>, GpuError> {
        let bytes = self.stream.clone_dtoh(&batch.out)?;
        self.stream.synchronize()?;
        Ok(bytes.chunks_exact(32).map(|c| c.try_into().expect("32-byte chunks")).collect())
    }

    /// BLAKE3-256 of device-resident items in one call, through buffers the
    /// handle keeps between calls (no allocation, no memset once they are
    /// large enough): one item goes to its own kernel by value, which writes
    /// the digest into mapped pinned memory and then raises a completion
    /// flag there that the host spins on ([`OneItemPath::ByValueFlag`]: one
    /// launch of a one-node graph kept by the handle, no synchronize);
    /// several items are read by the kernel from a
    /// table in mapped memory (a larger one goes up in one copy), followed
    /// by one synchronize. This is what the C API wraps. Calls on one handle
    /// take turns.
    ///
    /// # Safety
    /// As [`Gpu::prepare_digests`]; the call returns only after the kernel
    /// has read every byte of every item (with the completion flag, the
    /// flag is raised after the whole tree is folded; the last block may
    /// still be exiting, which later work on the stream waits for), so the
    /// items need to live only for the call.
    pub unsafe fn digest_device(&self, items: &[DeviceBytes]) -> Result<Vec<[u8; 32]>, GpuError> {
        // SAFETY: this function's contract.
        unsafe { self.digest_device_via(items, OneItemPath::default()) }
    }

    /// As [`Gpu::digest_device`], with the one-item path chosen by the
    /// caller (benchmarks compare them).
    ///
    /// # Safety
    /// As [`Gpu::digest_device`].
    pub unsafe fn digest_device_via(
        &self,
        items: &[DeviceBytes],
        path: OneItemPath,
    ) -> Result<Vec<[u8; 32]>, GpuError> {
        if items.is_empty() {
            return Err(GpuError::InvalidArgument("a digest batch needs at least one item".to_owned()));
        }
        let n = items.len();
        // Sizes first (the table needs the outputs' address, which depends on the arena).
        let (values, counters) = items.iter().fold((0u64, 0u64), |(v, c), it| {
            let (a, b) = scratch_of_len(it.len);
            (v + a, c + b)
        });
        let (table_off, values_off, work_bytes) = arena_layout(n, values);
        let mut guard = self.arena.lock().map_err(|_| GpuError::InvalidArgument("digest arena poisoned".to_owned()))?;
        let grow = match guard.as_ref() {
            None => true,
            Some(a) => {
                a.work.len() < work_bytes || (a.counters.len() as u64) < counters.max(1) || a.host.len() < values_off
            }
        };
        if grow {
            // Drop the old buffers after the stream is idle (a call that
            // waited on its flag may leave its kernel's last block exiting).
            self.stream.synchronize()?;
            *guard = None;
            let cap = |x: usize| x.next_power_of_two().max(1 << 16);
            let counters_buf: CudaSlice<u32> = self.stream.alloc_zeros(cap(counters.max(1) as usize))?;
            let work: CudaSlice<u8> = self.stream.alloc_zeros(cap(work_bytes))?;
            // SAFETY: plain bytes, written before they are read; DEVICEMAP
            // lets the kernel read the table from it and write the digests
            // into it directly (no copy each way for small calls).
            let mut host = unsafe {
                self.ctx.alloc_pinned_with_flags::<u8>(
                    cap(values_off),
                    sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
                )?
            };
            let counters_ptr = counters_buf.device_ptr(&self.stream).0;
            let work_ptr = work.device_ptr(&self.stream).0;
            let host_ptr = host.as_mut_ptr()? as usize;
            let mut host_dev: sys::CUdeviceptr = 0;
            // SAFETY: host_ptr starts a live DEVICEMAP pinned allocation (just
            // made) and host_dev is a valid out-pointer.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut host_dev, host_ptr as *mut std::ffi::c_void, 0) }
                .result()?;
            // SAFETY: the buffer holds at least 256 bytes (cap), and no kernel uses it yet.
            unsafe { std::ptr::write_volatile(host_ptr as *mut u32, 0) };
            self.stream.synchronize()?;
            *guard = Some(DigestArena {
                counters: counters_buf,
                counters_ptr,
                work,
                work_ptr,
                host,
                host_ptr,
                host_dev,
                seq: 0,
                graphs: Vec::new(),
            });
        }
        let a = guard.as_mut().expect("just made");
        if n == 1 && path != OneItemPath::Table {
            let it = items[0];
            a.seq = a.seq.wrapping_add(1).max(1);
            let experiment = match path {
                OneItemPath::Experiment(name) | OneItemPath::GraphExperiment(name) => Some(name),
                _ => None,
            };
            let graphs = match path {
                OneItemPath::ByValueFlag | OneItemPath::GraphExperiment(_) => Some(&mut a.graphs),
                _ => None,
            };
            let flag = if path == OneItemPath::ByValue { 0 } else { a.host_dev };
            // SAFETY: the item is valid by this function's contract; the
            // output (32 bytes at ARENA_OUT_OFF) and the flag (offset 0) lie
            // in the mapped host buffer, the values at work_ptr + values_off
            // and the zero counters were sized above by scratch_of_len for
            // this length (the kernel leaves the counters zero).
            unsafe {
                launch::blake3_digest_one_raw(
                    self,
                    (it.ptr, it.len),
                    a.host_dev + ARENA_OUT_OFF as u64,
                    a.work_ptr + values_off as u64,
                    a.counters_ptr,
                    (flag, a.seq),
                    experiment,
                    graphs,
                )
            }?;
            if flag != 0 {
                self.wait_flag(a.host_ptr as *const u32, a.seq)?;
            } else {
                self.stream.synchronize()?;
            }
            // SAFETY: the kernel wrote the digest before the flag (system
            // fence) or has completed; 32 bytes at ARENA_OUT_OFF lie inside
            // the pinned buffer, which lives while we hold the lock.
            let out = unsafe { std::slice::from_raw_parts((a.host_ptr + ARENA_OUT_OFF) as *const u8, 32) };
            return Ok(vec![out.try_into().expect("32 bytes")]);
        }
        // The digests go straight into the mapped host buffer.
        let out_dev = a.host_dev + ARENA_OUT_OFF as u64;
        let (table, groups, _, set_counters) = build_table(items, out_dev)?;
        launch::check_table(&table, out_dev, (a.work.len() - values_off) as u64 / 32, a.counters.len() as u64, groups);
        let table_bytes = bytemuck::cast_slice::<Blake3Item, u8>(&table);
        // SAFETY: the host buffer holds at least values_off >= table_off +
        // 48 n bytes (checked when it was sized); no kernel or copy uses it
        // (every call synchronizes before releasing the lock we hold).
        unsafe {
            std::ptr::copy_nonoverlapping(table_bytes.as_ptr(), (a.host_ptr + table_off) as *mut u8, table_bytes.len());
        }
        // A few items are read by the kernel over PCIe from the mapped
        // buffer (one read per block); more go up in one copy, because
        // every block searches the table.
        let table_ptr = if n <= MAPPED_TABLE_ITEMS {
            a.host_dev + table_off as u64
        } else {
            // SAFETY: both ranges lie inside buffers of this arena (sized
            // above); the host one is pinned, so the copy is a true
            // asynchronous DMA ordered before the launch on this stream.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    a.work_ptr + table_off as u64,
                    (a.host_ptr + table_off) as *const std::ffi::c_void,
                    table_bytes.len(),
                    self.stream.cu_stream(),
                )
            }
            .result()?;
            a.work_ptr + table_off as u64
        };
        let variant = self.digest_variant(groups);
        // SAFETY: the table at table_ptr (mapped host or device copy) was
        // built by build_table and checked by check_table against this
        // arena's sizes: outputs in the mapped host buffer at host_dev,
        // values at work_ptr + values_off, zero counters at counters_ptr
        // (zeroed at allocation, left zero by every launch). Item addresses
        // are valid by this function's contract.
        unsafe {
            launch::blake3_digest_raw(
                self,
                table_ptr,
                n as u32,
                a.work_ptr + values_off as u64,
                a.counters_ptr,
                groups,
                variant,
                set_counters > 0,
            )
        }?;
        self.stream.synchronize()?;
        // SAFETY: the stream is idle, so the kernel's writes to the mapped
        // buffer are complete and visible; the pinned buffer lives while we
        // hold the lock, and ARENA_OUT_OFF + 32 n <= table_off bytes lie inside it.
        let out = unsafe { std::slice::from_raw_parts((a.host_ptr + ARENA_OUT_OFF) as *const u8, 32 * n) };
        Ok(out.chunks_exact(32).map(|c| c.try_into().expect("32-byte chunks")).collect())
    }

    /// Waits until the word at `flag` (mapped pinned host memory) equals
    /// `seq`, checking the stream every few hundred reads so that a failed
    /// kernel becomes an error instead of a hang.
    fn wait_flag(&self, flag: *const u32, seq: u32) -> Result<(), GpuError> {
        let mut spins = 0u32;
        loop {
            // SAFETY: `flag` points into the arena's pinned buffer, held by
            // the caller's lock; the device writes it, hence the volatile read.
            if unsafe { std::ptr::read_volatile(flag) } == seq {
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                return Ok(());
            }
            spins += 1;
            if spins.is_multiple_of(512) {
                // SAFETY: the stream is a live stream of this context.
                match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) } {
                    sys::CUresult::CUDA_ERROR_NOT_READY => {}
                    sys::CUresult::CUDA_SUCCESS => {
                        // SAFETY: as above.
                        if unsafe { std::ptr::read_volatile(flag) } == seq {
                            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                            return Ok(());
                        }
                        return Err(GpuError::InvalidArgument(
                            "the digest kernel finished without raising its completion flag".to_owned(),
                        ));
                    }
                    e => return Err(GpuError::Driver(cudarc::driver::DriverError(e))),
                }
            }
            std::hint::spin_loop();
        }
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
    /// For every region r and page p < `device.blocks`, the `block_bytes`
    /// bytes at `device.page_addr(r, p)` must be device memory of this
    /// context, no two (region, page) pairs may overlap, and the memory must
    /// outlive the returned engine's launches.
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
        let host_stride = host.as_ref().map_or(device.page_stride, |h| h.pool.page_stride);
        let g = device.geometry;
        let vec16 = g.block_bytes.is_multiple_of(16)
            && g.plane_bytes().is_multiple_of(16)
            && g.token_bytes().is_multiple_of(16)
            && device.page_stride.is_multiple_of(16)
            && host_stride.is_multiple_of(16)
            && device.region_bases.iter().chain(&host_bases).all(|b| b % 16 == 0);
        let device_bases_dev = self.stream.clone_htod(&device.region_bases)?;
        let host_bases_dev = self.stream.clone_htod(&host_bases)?;
        let id = NEXT_ENGINE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (dma_out, dma_in) = (self.ctx.new_stream()?, self.ctx.new_stream()?);
        let staging = match &host {
            Some(_) => Some(Staging::new(self, StagingConfig::default())?),
            None => None,
        };
        Ok(CopyEngine {
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

    /// Checks a wave against `engine` (see `launch::check_wave`), hands the
    /// host copies that the engine's [`HostCopyPath`] gives the copy engines
    /// to them as lists of byte runs, and uploads the rest for the kernel,
    /// host writes first so that the kernel can give each direction its own
    /// thread blocks (copies of a wave are independent, so their order is
    /// free).
    pub fn prepare_wave(&self, engine: &CopyEngine, all: Vec<CopyOp>) -> Result<CopyWave, GpuError> {
        launch::check_wave(engine, &all)?;
        let total = all.len();
        let g = &engine.device.geometry;
        let ends = engine.ends();
        let runs_of = |ops: &[CopyOp]| dma::runs(g, ops, &ends);
        let (writes, reads): (Vec<CopyOp>, Vec<CopyOp>) =
            all.iter().filter(|op| op.touches_host()).partition(|op| op.media & 2 != 0);
        let offload: Vec<CopyOp> = writes.iter().copied().filter(|op| op.media == 2).collect();
        let onboard: Vec<CopyOp> = reads.iter().copied().filter(|op| op.media == 1).collect();
        let staged_of = |ops: &[CopyOp], to_host: bool| -> Option<StagedList> {
            let st = engine.staging.as_ref()?;
            let slots = if to_host { &st.out_slots } else { &st.in_slots };
            dma::staged(g, ops, &ends, to_host, slots, st.config.slot_bytes, st.config.whole_blocks)
        };
        let none = || (RunList::default(), RunList::default(), StagedList::default(), StagedList::default());
        let (dma_out, dma_in, st_out, st_in) = match engine.host_path {
            HostCopyPath::Kernel => none(),
            HostCopyPath::CopyEngines => {
                (runs_of(&writes), runs_of(&reads), StagedList::default(), StagedList::default())
            }
            HostCopyPath::Split => (runs_of(&writes), RunList::default(), StagedList::default(), StagedList::default()),
            HostCopyPath::Staged => match (staged_of(&offload, true), staged_of(&onboard, false)) {
                (Some(o), Some(i)) => (RunList::default(), RunList::default(), o, i),
                _ => none(),
            },
            HostCopyPath::Auto => {
                // The copy engines pay about a microsecond per run (measured:
                // 64 KiB runs reach 0.81 of their rate, 16 KiB runs 0.07), and
                // one direction on them with the other on the kernel is slower
                // than both on the kernel: they take a wave's host copies only
                // when every direction present merges into long runs, directly
                // (both ends consecutive) or through the staging buffer (host
                // pages consecutive, device pages anywhere).
                // With a block-major host tier and a region-major device pool
                // (different page strides, several regions) no two (page,
                // region) pieces continue each other at both ends, so a
                // direct run is one piece, long only if a piece is: else
                // skip building the lists.
                let direct_possible =
                    engine.device.page_stride == engine.host_stride || g.regions == 1 || g.block_bytes >= dma::LONG_RUN;
                let (o, i) = if direct_possible {
                    (runs_of(&writes), runs_of(&reads))
                } else {
                    (RunList::default(), RunList::default())
                };
                let long = |l: &RunList| l.is_empty() || l.bytes() >= dma::LONG_RUN * l.len() as u64;
                let staged_long = |l: &Option<StagedList>| {
                    l.as_ref()
                        .is_some_and(|l| !l.is_empty() && l.bytes() >= dma::STAGED_LONG_RUN * l.host_runs() as u64)
                };
                if direct_possible && long(&o) && long(&i) {
                    (o, i, StagedList::default(), StagedList::default())
                } else {
                    // Host-to-host copies (media 3) have no staged form.
                    let no_host_to_host = writes.iter().all(|op| op.media == 2);
                    // The staged path pays a fixed cost a wave (planning on
                    // the CPU, the gather or scatter launch, events) and
                    // gains only when both directions share PCIe: one way,
                    // the kernel is within 5 % of the copy engines, and in
                    // the replay of the engine's own copies every staged
                    // one-way or small wave cost time (docs/benchmarks.md,
                    // "Block-major host tier"). So it takes two-way waves of
                    // at least `dma::STAGED_MIN_BYTES` each way whose host
                    // runs are long.
                    let bytes = |ops: &[CopyOp]| -> u64 {
                        ops.iter().map(|op| g.copy_bytes(op.tokens) * g.regions as u64).sum()
                    };
                    let big = !offload.is_empty()
                        && !onboard.is_empty()
                        && bytes(&offload) >= dma::STAGED_MIN_BYTES
                        && bytes(&onboard) >= dma::STAGED_MIN_BYTES;
                    let (so, si) = if no_host_to_host && big {
                        (staged_of(&offload, true), staged_of(&onboard, false))
                    } else {
                        (None, None)
                    };
                    if staged_long(&so) && staged_long(&si) {
                        (RunList::default(), RunList::default(), so.unwrap_or_default(), si.unwrap_or_default())
                    } else {
                        none()
                    }
                }
            }
        };
        let by_dma = |op: &CopyOp| {
            (op.media & 2 != 0 && !dma_out.is_empty())
                || (op.media == 1 && !dma_in.is_empty())
                || (op.media == 2 && !st_out.is_empty())
                || (op.media == 1 && !st_in.is_empty())
        };
        let mut ops: Vec<CopyOp> = all.iter().copied().filter(|op| !by_dma(op)).collect();
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
        let upload = |l: &StagedList| -> Result<Option<CudaSlice<u8>>, GpuError> {
            if l.is_empty() {
                return Ok(None);
            }
            let bytes = if l.whole_blocks() {
                bytemuck::cast_slice::<dma::BlockSeg, u8>(&l.blocks)
            } else {
                bytemuck::cast_slice::<dma::Seg, u8>(&l.segs)
            };
            Ok(Some(self.stream.clone_htod(bytes)?))
        };
        let staged = [(upload(&st_out)?, st_out), (upload(&st_in)?, st_in)];
        let staging_gen = engine.staging.as_ref().map_or(0, |s| s.generation);
        Ok(CopyWave {
            engine_id: engine.id,
            ops_dev,
            touches_host,
            split_at,
            ops,
            dma_out,
            dma_in,
            staged,
            staging_gen,
            total,
        })
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
        let pool = KvPool::region_major(
            (0..geometry.regions as u64).map(|r| base + r * region_bytes).collect(),
            blocks,
            geometry,
        );
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
        self.copy_blocks_from(engine, copies, &mut 0)
    }

    /// As [`Gpu::copy_blocks`], skipping the first `*waves_done` waves and
    /// counting each wave launched in `*waves_done`, so that after a failed
    /// launch a new call resumes at the wave that failed (a wave may
    /// overwrite a page an earlier one read, so done waves must not run
    /// again). Returns the number of waves launched by this call.
    pub fn copy_blocks_from(
        &self,
        engine: &CopyEngine,
        copies: &[BlockCopy],
        waves_done: &mut usize,
    ) -> Result<usize, GpuError> {
        let waves = plan_copy_waves(
            copies,
            &engine.device.geometry,
            engine.device.blocks,
            engine.host.as_ref().map(|h| h.pool.blocks),
        )?;
        let mut launched = 0;
        for ops in waves.into_iter().skip(*waves_done) {
            let wave = self.prepare_wave(engine, ops)?;
            run_wave(self, engine, &wave, None)?;
            *waves_done += 1;
            launched += 1;
        }
        Ok(launched)
    }
}

/// The item table of a batch whose outputs start at `out_base`: items,
/// groups, scratch values and set counters in total.
fn build_table(items: &[DeviceBytes], out_base: u64) -> Result<(Vec<Blake3Item>, u32, u64, u64), GpuError> {
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
    Ok((table, group_next as u32, cv_next, ctr_next))
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
    /// Whether some item has several groups (sets of values to fold above them).
    pub(super) sets: bool,
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

/// How the host tier lays out its pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostLayout {
    /// A page's regions side by side (page p, region r at byte
    /// `(p * regions + r) * block_bytes`): a whole-block copy is one run of
    /// host memory, so the staged path moves even fully scattered blocks in
    /// runs of `regions * block_bytes` (docs/benchmarks.md, "Block-major
    /// host tier").
    #[default]
    BlockMajor,
    /// Each region's pages back to back, like the device pool (page p,
    /// region r at `(r * blocks + p) * block_bytes`): a block is `regions`
    /// separate runs.
    RegionMajor,
}

/// The pinned host tier: one page-locked allocation, device-mapped so that the
/// copy kernel reads and writes it over PCIe directly. Allocated without the
/// write-combined flag, because the CPU may read it (write-combined memory is
/// very slow to read from the host).
#[derive(Debug)]
pub struct HostTier {
    buf: PinnedHostSlice<u8>,
    pool: KvPool,
    layout: HostLayout,
}

impl HostTier {
    /// Allocates `blocks` host pages of `geometry` in every region, laid out
    /// block-major ([`HostLayout::BlockMajor`]). Wrap it in an `Arc` to
    /// attach it.
    pub fn new(gpu: &Gpu, geometry: BlockGeometry, blocks: u32) -> Result<HostTier, GpuError> {
        Self::with_layout(gpu, geometry, blocks, HostLayout::default())
    }

    /// As [`HostTier::new`], with the layout chosen.
    pub fn with_layout(
        gpu: &Gpu,
        geometry: BlockGeometry,
        blocks: u32,
        layout: HostLayout,
    ) -> Result<HostTier, GpuError> {
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
        let bb = geometry.block_bytes;
        let pool = match layout {
            HostLayout::BlockMajor => KvPool {
                region_bases: (0..geometry.regions as u64).map(|r| dev + r * bb).collect(),
                blocks,
                geometry,
                page_stride: bb * geometry.regions as u64,
            },
            HostLayout::RegionMajor => KvPool::region_major(
                (0..geometry.regions as u64).map(|r| dev + r * region_bytes).collect(),
                blocks,
                geometry,
            ),
        };
        Ok(HostTier { buf, pool, layout })
    }

    /// The tier as a pool (device-mapped addresses).
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// The tier's layout.
    pub fn layout(&self) -> HostLayout {
        self.layout
    }

    /// The offset in [`HostTier::bytes`] of page `page` of region `region`.
    pub fn offset(&self, region: usize, page: u32) -> usize {
        // Region 0 starts at the allocation's first byte in both layouts.
        (self.pool.page_addr(region, page) - self.pool.region_bases[0]) as usize
    }

    /// The tier's bytes in its layout. Kernels write it without the slice
    /// knowing: synchronize the stream first.
    pub fn bytes(&self) -> Result<&[u8], GpuError> {
        Ok(self.buf.as_slice()?)
    }

    /// The tier's bytes for writing, before it is shared with an engine.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], GpuError> {
        Ok(self.buf.as_mut_slice()?)
    }

    /// The tier's bytes region after region (each region's pages back to
    /// back, as [`CpuKvPool`](super::CpuKvPool) holds them), whatever the
    /// layout. Synchronize the stream first.
    pub fn to_regions(&self) -> Result<Vec<Vec<u8>>, GpuError> {
        let bytes = self.bytes()?;
        let (g, bb) = (&self.pool.geometry, self.pool.geometry.block_bytes as usize);
        Ok((0..g.regions as usize)
            .map(|r| {
                (0..self.pool.blocks).flat_map(|p| &bytes[self.offset(r, p)..self.offset(r, p) + bb]).copied().collect()
            })
            .collect())
    }

    /// Writes the tier from bytes region after region (the inverse of
    /// [`HostTier::to_regions`]), before it is shared with an engine.
    pub fn fill_from_regions(&mut self, regions: &[Vec<u8>]) -> Result<(), GpuError> {
        let (g, bb) = (self.pool.geometry, self.pool.geometry.block_bytes as usize);
        if regions.len() != g.regions as usize || regions.iter().any(|r| r.len() != bb * self.pool.blocks as usize) {
            return Err(GpuError::InvalidArgument("region bytes do not match the tier's size".to_owned()));
        }
        let offsets: Vec<Vec<usize>> =
            (0..g.regions as usize).map(|r| (0..self.pool.blocks).map(|p| self.offset(r, p)).collect()).collect();
        let bytes = self.bytes_mut()?;
        for (r, data) in regions.iter().enumerate() {
            for (p, at) in offsets[r].iter().enumerate() {
                bytes[*at..*at + bb].copy_from_slice(&data[p * bb..(p + 1) * bb]);
            }
        }
        Ok(())
    }
}

static NEXT_ENGINE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A checked, uploaded wave of copies for one [`CopyEngine`]: no page is
/// written twice or both read and written, every page is inside its pool.
#[derive(Debug)]
pub struct CopyWave {
    pub(super) engine_id: u64,
    /// The copies the kernel does (all of them on the kernel path).
    pub(super) ops: Vec<CopyOp>,
    /// Runs the copy engine writes to the host tier.
    pub(super) dma_out: RunList,
    /// Runs the other copy engine reads from the host tier.
    pub(super) dma_in: RunList,
    /// The staged path's offload and onboard, each with its segments on the
    /// device (`None` when the direction is empty).
    pub(super) staged: [(Option<CudaSlice<u8>>, StagedList); 2],
    /// The engine's staging generation the staged lists were built for.
    pub(super) staging_gen: u64,
    /// Copies in the wave, both paths.
    pub(super) total: usize,
    pub(super) ops_dev: CudaSlice<u8>,
    pub(super) touches_host: bool,
    /// Ops before this index write the host tier and get their own half of
    /// the grid; 0 when the wave is not split.
    pub(super) split_at: u32,
}

impl CopyWave {
    /// Copies in the wave.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether the wave is empty.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Byte runs given to the copy engines, to the host tier and from it
    /// (after merging runs that continue each other).
    pub fn dma_runs(&self) -> (usize, usize) {
        (self.dma_out.len(), self.dma_in.len())
    }

    /// Copy-engine runs of the staged path, to the host tier and from it
    /// (after sorting by host page and merging).
    pub fn staged_runs(&self) -> (usize, usize) {
        (self.staged[0].1.host_runs(), self.staged[1].1.host_runs())
    }
}

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
    /// present merge into runs of at least [`dma::LONG_RUN`] bytes on
    /// average (no SM used, full copy-engine rate); else the staged path
    /// for a wave that offloads and onboards at least
    /// [`dma::STAGED_MIN_BYTES`] each and whose host pages alone merge into
    /// runs of at least [`dma::STAGED_LONG_RUN`] bytes on average (with the
    /// block-major host tier, every whole block is such a run once its
    /// regions add up to that); else the kernel.
    #[default]
    Auto,
}

/// An attached KV pool, with its host tier if any, ready for block copies.
#[derive(Debug)]
pub struct CopyEngine {
    pub(super) id: u64,
    pub(super) device: KvPool,
    pub(super) host: Option<Arc<HostTier>>,
    /// The host tier's region bases (the device pool's when there is none).
    host_bases: Vec<u64>,
    /// The host tier's page stride (the device pool's when there is none).
    pub(super) host_stride: u64,
    host_path: HostCopyPath,
    /// Streams of the copy engines: writes to the host tier, reads from it.
    dma_out: Arc<CudaStream>,
    dma_in: Arc<CudaStream>,
    pub(super) device_bases_dev: CudaSlice<u64>,
    pub(super) host_bases_dev: CudaSlice<u64>,
    pub(super) vec16: bool,
    /// The device buffer the pool lives in, when the engine owns a reference to it.
    keep: Option<Arc<CudaSlice<u8>>>,
    /// Staging buffers and streams of the staged path (with a host tier).
    staging: Option<Staging>,
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
struct Staging {
    config: StagingConfig,
    generation: u64,
    _out_buf: CudaSlice<u8>,
    _in_buf: CudaSlice<u8>,
    out_slots: Vec<u64>,
    in_slots: Vec<u64>,
    gather: Arc<CudaStream>,
    scatter: Arc<CudaStream>,
    /// Copy-engine streams beyond the engine's own, per direction
    /// (`copy_streams - 1` each).
    extra_out: Vec<Arc<CudaStream>>,
    extra_in: Vec<Arc<CudaStream>>,
    /// Enqueueing of staged waves takes turns (the events are shared).
    events: std::sync::Mutex<StagingEvents>,
}

#[derive(Debug)]
struct StagingEvents {
    out_full: Vec<CudaEvent>,
    out_free: Vec<CudaEvent>,
    in_full: Vec<CudaEvent>,
    in_free: Vec<CudaEvent>,
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
    fn synchronize(&self) -> Result<(), GpuError> {
        for s in [&self.gather, &self.scatter].into_iter().chain(&self.extra_out).chain(&self.extra_in) {
            s.synchronize()?;
        }
        Ok(())
    }
}

impl CopyEngine {
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

    /// Reallocates the staged path's buffers (after the engine's queued
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

impl Drop for CopyEngine {
    fn drop(&mut self) {
        // The pools may be freed with the engine: let its copies finish first.
        let _ = self.dma_out.synchronize();
        let _ = self.dma_in.synchronize();
        if let Some(st) = &self.staging {
            let _ = st.synchronize();
        }
    }
}

/// Runs one prepared wave: the copy engines' runs on their two streams,
/// forked from and joined back into the handle's stream, and the kernel's
/// copies on the handle's stream, all overlapping (the copies of a wave are
/// independent).
fn run_wave(gpu: &Gpu, engine: &CopyEngine, wave: &CopyWave, grid: Option<u32>) -> Result<(), GpuError> {
    assert_eq!(wave.engine_id, engine.id, "the wave was checked against this engine");
    let main = gpu.stream();
    let sides: Vec<(&Arc<CudaStream>, &RunList)> = [(&engine.dma_out, &wave.dma_out), (&engine.dma_in, &wave.dma_in)]
        .into_iter()
        .filter(|(_, l)| !l.is_empty())
        .collect();
    if !sides.is_empty() {
        let fork = gpu.ctx.new_event(None)?;
        fork.record(main)?;
        for (s, list) in &sides {
            s.wait(&fork)?;
            // SAFETY: every run was built by `dma::runs` from pages that
            // `check_wave` put inside their pools, whose memory the engine
            // keeps valid (attach's contract, or owned through Arcs) and
            // whose drop waits for these streams; the wave's copies are
            // disjoint (checked), so no run overlaps another's writes.
            unsafe { dma::enqueue(list, s) }?;
        }
    }
    let staged_ends =
        if wave.staged.iter().any(|(_, l)| !l.is_empty()) { run_staged(gpu, engine, wave)? } else { vec![] };
    launch::kv_block_copy(gpu, engine, wave, grid)?;
    for s in sides.iter().map(|(s, _)| *s).chain(staged_ends.iter()) {
        let join = gpu.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        join.record(s)?;
        main.wait(&join)?;
    }
    Ok(())
}

/// Enqueues a wave's staged directions, forked from the handle's stream;
/// returns the streams that end each direction (for the caller to join).
///
/// Offload, piece i in slot k = i mod slots: the gather stream waits until
/// the copy engine emptied slot k (piece i - slots), gathers the device
/// pages into it, and the copy engine's stream waits for that and moves the
/// slot to the host runs. Onboard mirrors it: the copy engine fills slot k
/// once the scatter kernel emptied it, then the scatter stream scatters it.
fn run_staged(gpu: &Gpu, engine: &CopyEngine, wave: &CopyWave) -> Result<Vec<Arc<CudaStream>>, GpuError> {
    let st = engine.staging.as_ref().ok_or_else(|| GpuError::InvalidArgument("no staging buffers".to_owned()))?;
    if st.generation != wave.staging_gen {
        return Err(GpuError::InvalidArgument("the wave was prepared for other staging buffers".to_owned()));
    }
    let ev = st.events.lock().map_err(|_| GpuError::InvalidArgument("staging events poisoned".to_owned()))?;
    let fork = gpu.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
    fork.record(gpu.stream())?;
    let slots = st.config.slots as usize;
    let mut ends = Vec::new();
    for (dir, (segs_dev, list)) in wave.staged.iter().enumerate() {
        let Some(segs_dev) = segs_dev else { continue };
        let to_host = dir == 0;
        let segs_base = segs_dev.device_ptr(gpu.stream()).0;
        // (first stage, second stage) streams and (full, free) events.
        let (kernel_s, own, extra) = if to_host {
            (&st.gather, &engine.dma_out, &st.extra_out)
        } else {
            (&st.scatter, &engine.dma_in, &st.extra_in)
        };
        // Slot k's copy-engine stream: the engine's own, or an extra one.
        let dma_of = |k: usize| match k % (extra.len() + 1) {
            0 => own,
            j => &extra[j - 1],
        };
        let (full, free) = if to_host { (&ev.out_full, &ev.out_free) } else { (&ev.in_full, &ev.in_free) };
        if to_host {
            kernel_s.wait(&fork)?;
        } else {
            for k in 0..slots.min(extra.len() + 1) {
                dma_of(k).wait(&fork)?;
            }
        }
        for (i, piece) in list.pieces.iter().enumerate() {
            let k = i % slots;
            let dma_s = dma_of(k);
            let record = if list.whole_blocks() { 16 } else { 24 };
            let segs = segs_base + record * piece.seg_first as u64;
            let n = u32::try_from(piece.seg_count).expect("a slot holds fewer than 2^32 segments");
            // The gather (offload) or scatter (onboard) of the piece's
            // records. Called only once the stream has waited for the other
            // side of slot k, as described at each call.
            let move_slot = |stream: &CudaStream| -> Result<(), GpuError> {
                if list.whole_blocks() {
                    // SAFETY: the records were built by `dma::staged` from
                    // pages that `check_wave` put inside the device pool
                    // (valid by attach's contract) and from this staging
                    // generation's slot k (owned by the engine, checked
                    // above), whole blocks back to back inside the slot.
                    unsafe { launch::kv_block_seg_copy_raw(gpu, stream, engine, segs, n, to_host, st.config.blocks) }
                } else {
                    // SAFETY: as above, for segments (each inside its pool
                    // page or its slot); vec16 is the engine's proof of
                    // alignment.
                    unsafe { launch::kv_seg_copy_raw(gpu, stream, segs, n, engine.vec16, st.config.blocks) }
                }
            };
            if to_host {
                kernel_s.wait(&free[k])?;
                // The gather stream waited for the copy engine to finish
                // reading the slot; vec16 is the engine's proof of alignment
                // (slots are 256-byte aligned and hold whole segments or
                // blocks back to back).
                move_slot(kernel_s)?;
                full[k].record(kernel_s)?;
                dma_s.wait(&full[k])?;
                // SAFETY: the runs join slot k (filled above, on this stream's
                // side of the event) and host pages inside the host tier,
                // which the engine holds; runs of one piece do not overlap.
                unsafe { dma::enqueue(&piece.runs, dma_s) }?;
                free[k].record(dma_s)?;
            } else {
                dma_s.wait(&free[k])?;
                // SAFETY: as above, in the other direction; the copy engine
                // waited for the scatter kernel to finish reading slot k.
                unsafe { dma::enqueue(&piece.runs, dma_s) }?;
                full[k].record(dma_s)?;
                kernel_s.wait(&full[k])?;
                // As for the gather; the slot was filled before the event this
                // stream waited on.
                move_slot(kernel_s)?;
                free[k].record(kernel_s)?;
            }
        }
        if to_host {
            let used = list.pieces.len().min(slots).min(extra.len() + 1);
            ends.extend((0..used).map(|k| Arc::clone(dma_of(k))));
        } else {
            ends.push(Arc::clone(kernel_s));
        }
    }
    Ok(ends)
}

/// Launches one prepared wave with an explicit number of thread blocks (for
/// benchmarks that sweep it); `None` takes the default.
pub fn launch_copy_wave(gpu: &Gpu, engine: &CopyEngine, wave: &CopyWave, grid: Option<u32>) -> Result<(), GpuError> {
    run_wave(gpu, engine, wave, grid)
}
