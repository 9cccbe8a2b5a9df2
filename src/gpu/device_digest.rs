//! Digests of device-resident bytes on an open [`Gpu`]: prepared batches
//! (launched as often as wanted, for tests and benchmarks) and the one-call
//! digest the C API wraps, through the buffers of `digest_arena`.
//!
//! ```text
//! prepare_digests(items) -> DigestBatch ── launch_digests ── read_digests -> [digest; n]
//! digest_device(items)   one item:  blake3_digest_one_flag by value, wait on its flag (no synchronize)
//!                        several:   the table kernel (table in mapped memory, or uploaded), synchronize
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView, DevicePtr, sys};

use super::device::Gpu;
use super::digest::{DeviceBytes, scratch_of_len};
use super::digest_arena::{ARENA_OUT_OFF, DigestArena, MAPPED_TABLE_ITEMS, arena_layout};
use super::digest_batch::{Blake3Item, DigestBatch, build_table, check_digest_batch, check_table};
use super::error::GpuError;
use super::kernels::KernelId;
use super::launch;

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
    /// As `ByValueFlag`, launched by `cuLaunchKernel` (1.7-1.9 µs slower
    /// from the call to the flag than the graph on H200 hosts).
    ByValueFlagLaunch,
    /// The item by value, launched as a one-node CUDA graph (made on the
    /// first call; each call sets the node's parameters and launches it),
    /// waiting on the kernel's completion flag in mapped host memory
    /// instead of the stream (the stream is still checked for errors while
    /// waiting).
    #[default]
    ByValueFlag,
}

impl Gpu {
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
        check_digest_batch(&batch);
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

    /// Launches a prepared batch with the BLAKE3 kernel `variant` (one of
    /// [`KernelId::BLAKE3`]; tests and benchmarks compare them) instead of
    /// the one [`Gpu::digest_variant`] picks. Every variant gives the same
    /// digests.
    ///
    /// # Panics
    /// If `variant` is not a BLAKE3 table kernel.
    pub fn launch_digests_with(&self, batch: &DigestBatch, variant: KernelId) -> Result<(), GpuError> {
        launch::blake3_digest(self, batch, variant)
    }

    /// Launches the fold of a prepared batch alone (`blake3_fold_sets`, the
    /// second launch that [`Gpu::launch_digests`] makes after
    /// `blake3_digest_multi` for batches with an item of several groups),
    /// with or without programmatic stream serialization, so that the fold
    /// can be timed on its own. Its digests are right only after a
    /// `blake3_digest_multi` launch of the same batch stored every group's
    /// value; without one it computes wrong digests, inside the batch's own
    /// buffers.
    pub fn launch_fold_sets(&self, batch: &DigestBatch, programmatic: bool) -> Result<(), GpuError> {
        let a = batch.launch_args();
        // The raw launch below does not bind the context itself.
        self.context().bind_to_thread()?;
        // SAFETY: the addresses are the batch's own table and scratch, valid
        // while the batch lives (its invariant, established by
        // `Gpu::prepare_digests`, the only constructor of a batch); the
        // kernel reads the table, reads and writes its items' scratch ranges
        // and writes their 32 output bytes only, whatever the scratch holds.
        unsafe { launch::fold_sets_raw(self, a.table, a.items, a.values, a.counters, a.groups, programmatic) }
    }

    /// The BLAKE3 kernel for a launch of `groups` groups (measured on an
    /// H200): at most two groups per SM wait on their own dependency chains,
    /// so plain additions (one 3 MiB image: 29-31 µs against 35-40 for the
    /// others); beyond, two chunks per thread and four groups per block
    /// folded side by side, the levels above the groups in a fold launch of
    /// their own (256 MiB: 1.54-1.58 TB/s against 1.47-1.48 in one launch;
    /// with the folds in the same launch, 288 MiB reached 1.44-1.49 TB/s
    /// against 1.30-1.35 for one group per warp and 1.24-1.26 for one chunk
    /// per thread; 8 images of 3 MiB: 38-41 µs against 42-45 for one chunk
    /// per thread; 1 KiB items as fast as one group per warp).
    pub fn digest_variant(&self, groups: u32) -> KernelId {
        if groups <= 2 * self.sm_count() { KernelId::Blake3Latency } else { KernelId::Blake3Multi }
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
        if !guard.as_ref().is_some_and(|a| a.fits(counters, work_bytes, values_off)) {
            // Drop the old buffers after the stream is idle (a call that
            // waited on its flag may leave its kernel's last block exiting).
            self.stream.synchronize()?;
            *guard = None;
            *guard = Some(DigestArena::new(&self.ctx, &self.stream, counters, work_bytes, values_off)?);
        }
        let a = guard.as_mut().expect("just made");
        if n == 1 && path != OneItemPath::Table {
            let it = items[0];
            a.seq = a.seq.wrapping_add(1).max(1);
            let graph = if path == OneItemPath::ByValueFlag { Some(&mut a.graph) } else { None };
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
                    (a.work_ptr + values_off as u64, a.counters_ptr),
                    (flag, a.seq),
                    graph,
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
        check_table(&table, out_dev, (a.work.len() - values_off) as u64 / 32, a.counters.len() as u64, groups);
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
}
