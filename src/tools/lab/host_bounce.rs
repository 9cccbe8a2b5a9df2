//! Can host CPU threads do what the copy engines cannot,
//! gather and scatter fully scattered host pages, so that the copy engines
//! move only large contiguous buffers? (docs/benchmarks.md, "CPU bounce
//! buffers".)
//!
//! The host tier's both-ways target is missed for fully scattered pages: the
//! kernel's own PCIe traffic tops out near 80 GB/s both ways, and the copy
//! engines cost the host about a microsecond per run. This probe measures the
//! one path left: per direction, `threads` CPU threads, each with its own
//! stream and two 2 MiB pinned bounce slots. An onboard thread copies its
//! next 2 MiB of scattered host pages into a slot (`memcpy`) and enqueues one
//! host-to-device copy of the slot; an offload thread enqueues one
//! device-to-host copy into a slot, waits for it, and scatters the slot over
//! its host pages. The device side is a contiguous buffer per direction (a
//! gather or scatter kernel there would run at device speed).
//!
//! Two figures per page size and thread count: the CPU threads alone (the
//! gather and scatter with no copy engine running), and the whole pipeline.
//! The pipeline's onboarded pages are checked against their host source.

use std::time::Instant;

use cudarc::driver::{CudaEvent, DevicePtr, sys};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use kvcore::gpu::{Gpu, GpuError};

/// One measured case.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BounceCase {
    /// Host page size in bytes.
    pub page_bytes: usize,
    /// CPU threads per direction.
    pub threads: usize,
    /// `cpu` (gather and scatter alone) or `pipeline` (with the copy engines).
    pub mode: &'static str,
    /// Both directions' bytes over the best wall time, GB/s.
    pub gbps: f64,
    /// Onboarded pages that differed from their host source (pipeline only).
    pub mismatches: u64,
}

/// Bytes of one bounce slot.
const SLOT: usize = 2 << 20;

/// A random permutation of `0..n`, the same for the same seed.
fn permutation(n: usize, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    v.shuffle(&mut StdRng::seed_from_u64(seed));
    v
}

/// Copies `n` bytes between two host addresses.
///
/// # Safety
/// Both ranges lie in live allocations and do not overlap.
unsafe fn copy(dst: usize, src: usize, n: usize) {
    // SAFETY: by this function's contract.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) }
}

/// Measures every page size and thread count: `half` bytes each way, best of
/// `reps` runs.
pub fn run(
    gpu: &Gpu,
    pages: &[usize],
    threads: &[usize],
    half: usize,
    reps: usize,
) -> Result<Vec<BounceCase>, GpuError> {
    let ctx = gpu.context().clone();
    let max_threads = threads.iter().copied().max().unwrap_or(1);
    // SAFETY: plain bytes, written below before any read.
    let mut tier = unsafe { ctx.alloc_pinned_with_flags::<u8>(2 * half, sys::CU_MEMHOSTALLOC_PORTABLE)? };
    // SAFETY: as above.
    let mut bounce =
        unsafe { ctx.alloc_pinned_with_flags::<u8>(4 * max_threads * SLOT, sys::CU_MEMHOSTALLOC_PORTABLE)? };
    let tier_ptr = tier.as_mut_ptr()? as usize;
    let bounce_ptr = bounce.as_mut_ptr()? as usize;
    {
        // SAFETY: the tier holds 2 * half bytes, 8-aligned (pinned pages).
        let words = unsafe { std::slice::from_raw_parts_mut(tier_ptr as *mut u64, 2 * half / 8) };
        for (i, w) in words.iter_mut().enumerate() {
            *w = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        // SAFETY: the bounce slots hold 4 * max_threads * SLOT bytes.
        unsafe { std::ptr::write_bytes(bounce_ptr as *mut u8, 1, 4 * max_threads * SLOT) };
    }
    let stream = gpu.stream().clone();
    let dev_on = stream.alloc_zeros::<u8>(half)?;
    let dev_off = stream.alloc_zeros::<u8>(half)?;
    let (on_ptr, off_ptr) = (dev_on.device_ptr(&stream).0, dev_off.device_ptr(&stream).0);
    stream.synchronize()?;
    let streams: Vec<_> = (0..2 * max_threads).map(|_| ctx.new_stream()).collect::<Result<_, _>>()?;
    let onboard_src = tier_ptr + half;
    let mut out = Vec::new();
    for &page in pages {
        let n_pages = half / page;
        let per_slot = SLOT / page;
        for &p in threads {
            for mode in ["cpu", "pipeline"] {
                let pipeline = mode == "pipeline";
                let mut best = f64::INFINITY;
                let mut mismatches = 0u64;
                for rep in 0..reps {
                    let on = permutation(n_pages, 7 + rep as u64);
                    let off = permutation(n_pages, 2000 + rep as u64);
                    let t = Instant::now();
                    let results: Vec<Result<(), GpuError>> = std::thread::scope(|sc| {
                        let mut hs = Vec::new();
                        for th in 0..p {
                            let (on, st, cx) = (&on, streams[th].clone(), ctx.clone());
                            hs.push(sc.spawn(move || -> Result<(), GpuError> {
                                cx.bind_to_thread()?;
                                let slots = bounce_ptr + th * 2 * SLOT;
                                let mut done: [Option<CudaEvent>; 2] = [None, None];
                                let (mut c, mut k) = (th, 0);
                                while (c + 1) * per_slot <= n_pages {
                                    let s = k & 1;
                                    if let Some(e) = done[s].take() {
                                        e.synchronize()?;
                                    }
                                    let dst = slots + s * SLOT;
                                    for (i, &pg) in on[c * per_slot..(c + 1) * per_slot].iter().enumerate() {
                                        // SAFETY: slot s of this thread (SLOT bytes) and
                                        // one onboard page of the tier; the slot's last
                                        // copy has completed (its event, above).
                                        unsafe { copy(dst + i * page, onboard_src + pg as usize * page, page) };
                                    }
                                    if pipeline {
                                        // SAFETY: device range c*SLOT.. lies in dev_on
                                        // (c+1)*per_slot <= n_pages); the pinned slot
                                        // stays untouched until the event recorded next.
                                        unsafe {
                                            sys::cuMemcpyHtoDAsync_v2(
                                                on_ptr + (c * SLOT) as u64,
                                                dst as *const std::ffi::c_void,
                                                SLOT,
                                                st.cu_stream(),
                                            )
                                        }
                                        .result()?;
                                        done[s] = Some(st.record_event(None)?);
                                    }
                                    c += p;
                                    k += 1;
                                }
                                st.synchronize()?;
                                Ok(())
                            }));
                            let (off, st, cx) = (&off, streams[p + th].clone(), ctx.clone());
                            hs.push(sc.spawn(move || -> Result<(), GpuError> {
                                cx.bind_to_thread()?;
                                let slots = bounce_ptr + (2 * max_threads + 2 * th) * SLOT;
                                let fetch = |c: usize, s: usize| -> Result<Option<CudaEvent>, GpuError> {
                                    if !pipeline || (c + 1) * per_slot > n_pages {
                                        return Ok(None);
                                    }
                                    // SAFETY: device range c*SLOT.. lies in dev_off;
                                    // the slot is not read until the event completes.
                                    unsafe {
                                        sys::cuMemcpyDtoHAsync_v2(
                                            (slots + s * SLOT) as *mut std::ffi::c_void,
                                            off_ptr + (c * SLOT) as u64,
                                            SLOT,
                                            st.cu_stream(),
                                        )
                                    }
                                    .result()?;
                                    Ok(Some(st.record_event(None)?))
                                };
                                let (mut c, mut k) = (th, 0);
                                let mut ready = fetch(c, 0)?;
                                while (c + 1) * per_slot <= n_pages {
                                    let next = fetch(c + p, (k + 1) & 1)?;
                                    if let Some(e) = ready.take() {
                                        e.synchronize()?;
                                    }
                                    let src = slots + (k & 1) * SLOT;
                                    for (i, &pg) in off[c * per_slot..(c + 1) * per_slot].iter().enumerate() {
                                        // SAFETY: one offload page of the tier and slot
                                        // k&1 of this thread, whose copy has completed.
                                        unsafe { copy(tier_ptr + pg as usize * page, src + i * page, page) };
                                    }
                                    ready = next;
                                    c += p;
                                    k += 1;
                                }
                                st.synchronize()?;
                                Ok(())
                            }));
                        }
                        hs.into_iter()
                            .map(|h| h.join().unwrap_or(Err(GpuError::Unavailable("thread panicked".into()))))
                            .collect()
                    });
                    let dt = t.elapsed().as_secs_f64();
                    for r in results {
                        r?;
                    }
                    best = best.min(dt);
                    if pipeline && rep == 0 {
                        let mut buf = vec![0u8; page];
                        for probe in 0..64usize {
                            let pos = (probe * 7919) % (n_pages / per_slot * per_slot);
                            let pg = on[pos] as usize;
                            stream.memcpy_dtoh(&dev_on.slice(pos * page..(pos + 1) * page), &mut buf)?;
                            stream.synchronize()?;
                            // SAFETY: one onboard page of the tier, not written by anyone now.
                            let want =
                                unsafe { std::slice::from_raw_parts((onboard_src + pg * page) as *const u8, page) };
                            mismatches += (buf != want) as u64;
                        }
                    }
                }
                let moved = 2 * (n_pages / per_slot * per_slot * page);
                let gbps = moved as f64 / best / 1e9;
                println!(
                    "host-bounce  page {:>3} KiB  {p}+{p} threads  {mode:<8}  {gbps:6.1} GB/s both ways  mismatches {mismatches}",
                    page >> 10
                );
                out.push(BounceCase { page_bytes: page, threads: p, mode, gbps, mismatches });
            }
        }
    }
    Ok(out)
}
