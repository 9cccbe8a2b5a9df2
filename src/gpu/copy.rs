//! Running copy waves: a wave's copy-engine runs, staged pieces and kernel
//! copies enqueued side by side and joined into the handle's stream, and a
//! step's copies planned into waves and run in order (resuming after the
//! waves already launched when a launch failed).

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, sys};

use super::attached_pool::AttachedPool;
use super::device::Gpu;
use super::dma::{self, RunList};
use super::error::GpuError;
use super::launch;
use super::pool::plan_copy_waves;
use super::wave::CopyWave;
use crate::resources::BlockCopy;

impl Gpu {
    /// Performs a step's copies: validates them, cuts them into conflict-free
    /// waves and launches one kernel per wave on the stream (asynchronously:
    /// synchronize before reading the data on the host). Returns the number
    /// of launches.
    pub fn copy_blocks(&self, pool: &AttachedPool, copies: &[BlockCopy]) -> Result<usize, GpuError> {
        self.copy_blocks_from(pool, copies, &mut 0)
    }

    /// As [`Gpu::copy_blocks`], skipping the first `*waves_done` waves and
    /// counting each wave launched in `*waves_done`, so that after a failed
    /// launch a new call resumes at the wave that failed (a wave may
    /// overwrite a page an earlier one read, so done waves must not run
    /// again). Returns the number of waves launched by this call.
    pub fn copy_blocks_from(
        &self,
        pool: &AttachedPool,
        copies: &[BlockCopy],
        waves_done: &mut usize,
    ) -> Result<usize, GpuError> {
        let waves = plan_copy_waves(
            copies,
            &pool.device.geometry,
            pool.device.blocks,
            pool.host.as_ref().map(|h| h.pool().blocks),
        )?;
        let mut launched = 0;
        for ops in waves.into_iter().skip(*waves_done) {
            let wave = self.prepare_wave(pool, ops)?;
            run_wave(self, pool, &wave, None)?;
            *waves_done += 1;
            launched += 1;
        }
        Ok(launched)
    }
}

/// Runs one prepared wave: the copy engines' runs on their two streams,
/// forked from and joined back into the handle's stream, and the kernel's
/// copies on the handle's stream, all overlapping (the copies of a wave are
/// independent).
fn run_wave(gpu: &Gpu, pool: &AttachedPool, wave: &CopyWave, grid: Option<u32>) -> Result<(), GpuError> {
    assert_eq!(wave.pool_id, pool.id, "the wave was checked against this pool");
    let main = gpu.stream();
    let sides: Vec<(&Arc<CudaStream>, &RunList)> = [(&pool.dma_out, &wave.dma_out), (&pool.dma_in, &wave.dma_in)]
        .into_iter()
        .filter(|(_, l)| !l.is_empty())
        .collect();
    if !sides.is_empty() {
        let fork = gpu.ctx.new_event(None)?;
        fork.record(main)?;
        for (s, list) in &sides {
            s.wait(&fork)?;
            // SAFETY: every run was built by `dma::runs` from pages that
            // `check_wave` put inside their pools, whose memory the pool
            // keeps valid (attach's contract, or owned through Arcs) and
            // whose drop waits for these streams; the wave's copies are
            // disjoint (checked), so no run overlaps another's writes.
            unsafe { dma::enqueue(list, s) }?;
        }
    }
    let staged_ends =
        if wave.staged.iter().any(|(_, l)| !l.is_empty()) { run_staged(gpu, pool, wave)? } else { vec![] };
    launch::kv_block_copy(gpu, pool, wave, grid)?;
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
fn run_staged(gpu: &Gpu, pool: &AttachedPool, wave: &CopyWave) -> Result<Vec<Arc<CudaStream>>, GpuError> {
    let st = pool.staging.as_ref().ok_or_else(|| GpuError::InvalidArgument("no staging buffers".to_owned()))?;
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
            (&st.gather, &pool.dma_out, &st.extra_out)
        } else {
            (&st.scatter, &pool.dma_in, &st.extra_in)
        };
        // Slot k's copy-engine stream: the pool's own, or an extra one.
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
                    // generation's slot k (owned by the pool, checked
                    // above), whole blocks back to back inside the slot.
                    unsafe { launch::kv_block_seg_copy_raw(gpu, stream, pool, segs, n, to_host, st.config.blocks) }
                } else {
                    // SAFETY: as above, for segments (each inside its pool
                    // page or its slot); vec16 is the pool's proof of
                    // alignment.
                    unsafe { launch::kv_seg_copy_raw(gpu, stream, segs, n, pool.vec16, st.config.blocks) }
                }
            };
            if to_host {
                kernel_s.wait(&free[k])?;
                // The gather stream waited for the copy engine to finish
                // reading the slot; vec16 is the pool's proof of alignment
                // (slots are 256-byte aligned and hold whole segments or
                // blocks back to back).
                move_slot(kernel_s)?;
                full[k].record(kernel_s)?;
                dma_s.wait(&full[k])?;
                // SAFETY: the runs join slot k (filled above, on this stream's
                // side of the event) and host pages inside the host tier,
                // which the pool holds; runs of one piece do not overlap.
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
pub fn launch_copy_wave(gpu: &Gpu, pool: &AttachedPool, wave: &CopyWave, grid: Option<u32>) -> Result<(), GpuError> {
    run_wave(gpu, pool, wave, grid)
}
