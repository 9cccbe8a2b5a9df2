//! Variants of the host tier's "both ways at once" copies for fully
//! scattered blocks (device and host pages both in random order), measured
//! side by side in one run (`kvcore gpu-bench --only host` and
//! `--only host-explore`).
//!
//! Every variant moves the same wave: half of the host pages receive
//! offloaded device pages, the other half are onboarded into device pages,
//! one byte segment per (copy, region). The variants differ in who moves
//! which segments:
//!
//! - the library's copy kernel through the engine (`kv_block_copy`), once
//!   per [`KernelOptions`] set, so that the default is compared with the
//!   even split of before in the same run, and the automatic path;
//! - the lab kernels of `cuda/lab/host_copy_x.cu` over segment lists:
//!   the split with chosen loads in flight per direction and write blocks,
//!   read-side variants (an L2 fetch-size hint, bulk L2 prefetches), and a
//!   bulk-copy (TMA) kernel that moves each segment through shared memory;
//! - the copy engines (the driver's batched call) on several streams, each
//!   enqueued from its own thread, with the call's attributes.
//!
//! `full` runs the whole list; otherwise the option sets, the three
//! reference kernels and the copy engines with default attributes. Each
//! variant is checked against its sources after its timed launches (its
//! destinations are overwritten with a marker first). Mixes of kernel and
//! copy engines were measured with earlier versions of this file (logs in
//! `docs/gpu-runs/`); the copy engines lost there because the batched call
//! costs the host 0.5-3 µs per run, so they are no longer listed.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg, sys};

use kvcore::gpu::{
    BlockGeometry, CopyOp, Gpu, GpuError, HostCopyPath, HostLayout, HostTier, KernelOptions, launch_copy_wave,
    nvrtc_options,
};

use super::measure::{median, time_ms};

/// A byte segment as the lab kernels read it (`Seg` in
/// `cuda/lab/host_copy_x.cu`: destination, source, length).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seg {
    dst: u64,
    src: u64,
    len: u64,
}

/// The segments as the bytes the kernels read (three little-endian words each).
fn seg_bytes(segs: &[Seg]) -> Vec<u8> {
    segs.iter().flat_map(|s| [s.dst, s.src, s.len]).flat_map(u64::to_le_bytes).collect()
}

/// Byte runs for the copy engines' batched call, merged where they continue
/// each other.
#[derive(Debug, Default, Clone)]
struct RunList {
    dsts: Vec<u64>,
    srcs: Vec<u64>,
    sizes: Vec<usize>,
}

impl RunList {
    fn len(&self) -> usize {
        self.sizes.len()
    }

    fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    fn push(&mut self, dst: u64, src: u64, n: u64) {
        if n == 0 {
            return;
        }
        if let (Some(d), Some(s), Some(z)) = (self.dsts.last(), self.srcs.last(), self.sizes.last_mut())
            && *d + *z as u64 == dst
            && *s + *z as u64 == src
        {
            *z += n as usize;
            return;
        }
        self.dsts.push(dst);
        self.srcs.push(src);
        self.sizes.push(n as usize);
    }
}

/// One measured variant.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Variant {
    /// Block size in bytes.
    pub block_bytes: u64,
    /// What moved the bytes.
    pub name: String,
    /// Both directions' bytes over the median launch time, GB/s.
    pub gbps: f64,
    /// Median time of one wave, ms.
    pub ms: f64,
    /// Host time of the enqueueing calls of one wave (median), ms.
    pub enqueue_ms: f64,
    /// 4-byte words that differed from their source after the runs (0 = exact).
    pub mismatches: u64,
    /// For traced kernels: when the last block of the writes ended, ms
    /// after the first block started (0 untraced).
    pub writes_end_ms: f64,
    /// The same for the reads.
    pub reads_end_ms: f64,
}

/// A kernel launch of the lab module.
struct Kernel {
    f: CudaFunction,
    block: u32,
    smem: u32,
}

/// The verification kernels of the lab module.
struct Module {
    _m: Arc<CudaModule>,
    fill: CudaFunction,
    compare: CudaFunction,
}

/// Compiles `cuda/lab/host_copy_x.cu` after kvcore's shared header, with
/// `defines`, as kvcore compiles its own modules for `gpu`'s device, and
/// loads it.
fn compile(gpu: &Gpu, defines: &str) -> Result<Arc<CudaModule>, GpuError> {
    let src = format!(
        "{defines}{}\n{}",
        include_str!("../../../cuda/common.cuh"),
        include_str!("../../../cuda/lab/host_copy_x.cu")
    );
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, nvrtc_options(gpu.arch(), "host_copy_x.cu"))
        .map_err(|e| GpuError::Compile { kernel: "host_copy_x.cu", log: format!("{e:?}") })?;
    Ok(gpu.context().load_module(ptx)?)
}

/// Makes `streams` wait for the work queued so far on the handle's stream.
fn fork(gpu: &Gpu, streams: &[&Arc<CudaStream>]) -> Result<(), GpuError> {
    if streams.is_empty() {
        return Ok(());
    }
    let ev = gpu.context().new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
    ev.record(gpu.stream())?;
    for s in streams {
        s.wait(&ev)?;
    }
    Ok(())
}

/// Makes the handle's stream wait for the work queued so far on `streams`.
fn join(gpu: &Gpu, streams: &[&Arc<CudaStream>]) -> Result<(), GpuError> {
    for s in streams {
        let ev = gpu.context().new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        ev.record(s)?;
        gpu.stream().wait(&ev)?;
    }
    Ok(())
}

/// The driver's batched copy of `list` on `stream`, with the given source
/// access order and flags.
///
/// # Safety
/// Every run inside live allocations (device memory of the stream's context
/// or mapped pinned host memory) until the stream has passed this point, no
/// run writing bytes another reads or writes.
unsafe fn batch(list: &RunList, stream: &CudaStream, attr: CeAttr) -> Result<(), GpuError> {
    if list.is_empty() {
        return Ok(());
    }
    use sys::CUmemLocationType as L;
    use sys::CUmemcpySrcAccessOrder as O;
    let order = match attr.order {
        1 => O::CU_MEMCPY_SRC_ACCESS_ORDER_ANY,
        2 => O::CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL,
        _ => O::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
    };
    let (src_t, dst_t) = match attr.src_host {
        None => (L::CU_MEM_LOCATION_TYPE_INVALID, L::CU_MEM_LOCATION_TYPE_INVALID),
        Some(true) => (L::CU_MEM_LOCATION_TYPE_HOST, L::CU_MEM_LOCATION_TYPE_DEVICE),
        Some(false) => (L::CU_MEM_LOCATION_TYPE_DEVICE, L::CU_MEM_LOCATION_TYPE_HOST),
    };
    let mut attrs = [sys::CUmemcpyAttributes {
        srcAccessOrder: order,
        srcLocHint: sys::CUmemLocation { type_: src_t, id: 0 },
        dstLocHint: sys::CUmemLocation { type_: dst_t, id: 0 },
        flags: 0,
    }];
    let mut idx = [0usize];
    let (d, s, z) = (list.dsts.as_ptr().cast_mut(), list.srcs.as_ptr().cast_mut(), list.sizes.as_ptr().cast_mut());
    // SAFETY: three arrays of list.len() entries, only read by the driver;
    // one attribute for every run; the runs are valid by the contract.
    unsafe {
        sys::cuMemcpyBatchAsync_v2(d, s, z, list.len(), attrs.as_mut_ptr(), idx.as_mut_ptr(), 1, stream.cu_stream())
    }
    .result()?;
    Ok(())
}

/// Attributes of a batched copy: source access order (0 stream, 1 any, 2
/// during the call) and location hints (`Some(source is host)`).
#[derive(Clone, Copy, Default)]
struct CeAttr {
    order: u8,
    src_host: Option<bool>,
}

/// One kernel launch of a variant: `segs` holds `n` segments, the first
/// `split` of them writes to the host moved by the first `first_blocks`
/// blocks (a single-direction launch of writes passes split = n and
/// first_blocks = grid; of reads, 0 and 0); `stream`: index into the
/// lab's kernel streams, `None` for the handle's stream.
#[derive(Clone, Copy)]
struct Launch<'a> {
    k: &'a Kernel,
    segs: u64,
    n: u32,
    split: u32,
    fb: u32,
    grid: u32,
    stream: Option<usize>,
}

/// What one variant runs: kernel launches, and copy-engine run lists on
/// streams, enqueued from one thread each when `threads`, after the
/// kernels when `kernel_first`.
struct Plan<'a> {
    launches: Vec<Launch<'a>>,
    ce: Vec<(Arc<CudaStream>, RunList)>,
    threads: bool,
    kernel_first: bool,
    attr: CeAttr,
}

/// A plan of one split launch of 16 blocks, `fb` of them writing.
fn kernel_plan(k: &Kernel, segs: u64, n: u32, split: u32, fb: u32) -> Plan<'_> {
    Plan {
        launches: vec![Launch { k, segs, n, split, fb, grid: 16, stream: None }],
        ce: vec![],
        threads: false,
        kernel_first: true,
        attr: CeAttr::default(),
    }
}

fn run_plan(
    gpu: &Gpu,
    p: &Plan<'_>,
    kstreams: &[Arc<CudaStream>],
    trace: u64,
    enqueue: &mut Vec<f64>,
) -> Result<(), GpuError> {
    let t0 = Instant::now();
    let mut streams: Vec<&Arc<CudaStream>> = p.ce.iter().map(|(s, _)| s).collect();
    streams.extend(p.launches.iter().filter_map(|l| l.stream.map(|i| &kstreams[i])));
    fork(gpu, &streams)?;
    let launch_all = || -> Result<(), GpuError> {
        for (i, l) in p.launches.iter().enumerate() {
            let cfg =
                LaunchConfig { grid_dim: (l.grid, 1, 1), block_dim: (l.k.block, 1, 1), shared_mem_bytes: l.k.smem };
            let stream = l.stream.map_or(gpu.stream(), |i| &kstreams[i]);
            let mut b = stream.launch_builder(&l.k.f);
            let tr = if trace == 0 { 0 } else { trace + 8 * 64 * i as u64 };
            b.arg(&l.segs).arg(&l.n).arg(&l.split).arg(&l.fb).arg(&tr);
            // SAFETY: the signature is (const Seg*, u32, u32, u32, u64*); the
            // segments are in device memory and name memory of this
            // experiment, 16-byte aligned, disjoint; the trace (if any) holds
            // 64 words per launch for at most 32 blocks; the shared memory
            // size was allowed on the function.
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    };
    let enqueue_all = || -> Result<(), GpuError> {
        if p.threads && p.ce.len() > 1 {
            std::thread::scope(|sc| {
                let hs: Vec<_> =
                    p.ce.iter()
                        .map(|(s, l)| {
                            sc.spawn(move || -> Result<(), GpuError> {
                                gpu.context().bind_to_thread()?;
                                // SAFETY: the runs were made from segments inside
                                // the host tier and the device buffer of this
                                // experiment, which outlive the run (the caller
                                // synchronizes every stream before dropping
                                // them); the wave's segments are disjoint, and
                                // each thread enqueues its own list on its own
                                // stream, the context bound just above.
                                unsafe { batch(l, s, p.attr) }
                            })
                        })
                        .collect();
                hs.into_iter().try_for_each(|h| h.join().expect("an enqueue thread does not panic"))
            })
        } else {
            for (s, l) in &p.ce {
                // SAFETY: the runs were made from segments inside the host
                // tier and the device buffer of this experiment, which
                // outlive the run (the caller synchronizes before dropping
                // them); the wave's segments are disjoint.
                unsafe { batch(l, s, p.attr) }?;
            }
            Ok(())
        }
    };
    if p.kernel_first {
        launch_all()?;
        enqueue_all()?;
    } else {
        enqueue_all()?;
        launch_all()?;
    }
    join(gpu, &streams)?;
    enqueue.push(t0.elapsed().as_secs_f64() * 1e3);
    Ok(())
}

fn upload_segs(gpu: &Gpu, segs: &[Seg]) -> Result<(CudaSlice<u8>, u64), GpuError> {
    let buf =
        if segs.is_empty() { gpu.stream().alloc_zeros(24)? } else { gpu.stream().clone_htod(&seg_bytes(segs))? };
    let p = buf.device_ptr(gpu.stream()).0;
    Ok((buf, p))
}

fn runs_of(segs: &[Seg]) -> RunList {
    let mut l = RunList::default();
    for s in segs {
        l.push(s.dst, s.src, s.len);
    }
    l
}

/// Per-direction spans of a traced run: (write start, write end, read
/// start, read end) in ns of globaltimer, from the blocks' own stamps.
fn spans(trace: &[u64], launches: &[Launch<'_>]) -> Option<(u64, u64, u64, u64)> {
    let (mut ws, mut we, mut rs, mut re) = (u64::MAX, 0u64, u64::MAX, 0u64);
    for (i, l) in launches.iter().enumerate() {
        for b in 0..l.grid as usize {
            let (t0, t1) = (trace[64 * i + 2 * b], trace[64 * i + 2 * b + 1]);
            if t0 == 0 || t1 == 0 {
                return None;
            }
            let writes = if l.split >= l.n {
                true
            } else if l.split == 0 {
                false
            } else {
                (b as u32) < l.fb
            };
            if writes {
                ws = ws.min(t0);
                we = we.max(t1);
            } else {
                rs = rs.min(t0);
                re = re.max(t1);
            }
        }
    }
    Some((ws, we, rs, re))
}

/// A wave both ways of whole 16-token blocks, offloads and onboards
/// interleaved: device pages `dev[i]` to host pages `host[i]` and host pages
/// `host[half + i]` to device pages `dev[half + i]`, for `i < half` (half of
/// `host.len()`; `dev` at least as long).
pub fn two_way_wave(dev: &[u32], host: &[u32]) -> Vec<CopyOp> {
    let half = host.len() / 2;
    (0..half)
        .flat_map(|i| {
            [
                CopyOp { src_page: dev[i], dst_page: host[i], tokens: 16, media: 2 },
                CopyOp { src_page: host[half + i], dst_page: dev[half + i], tokens: 16, media: 1 },
            ]
        })
        .collect()
}

/// Runs every variant for each block size in `sizes` (1 GiB host tier and
/// device pool of 32 regions each, half of the tier offloaded into, half
/// onboarded from), `reps` timed waves each.
pub fn run(gpu: &Arc<Gpu>, sizes: &[u64], reps: usize, full: bool) -> Result<Vec<Variant>, GpuError> {
    // The copy kernel's option sets compared through the engine, each with
    // its own handle (module cache) on the same device.
    let mut option_gpus: Vec<(String, Arc<Gpu>)> = vec![("default options".to_owned(), Arc::clone(gpu))];
    let mut sets = vec![KernelOptions::even_split()];
    for (w, r, share) in [(8u32, 4u32, 8u32), (8, 4, 9), (8, 4, 10), (12, 4, 10), (16, 4, 9), (16, 4, 10), (16, 2, 8)] {
        sets.push(KernelOptions {
            copy_unroll_write: w,
            copy_unroll_read: r,
            copy_write_share: share,
            ..KernelOptions::default()
        });
    }
    for o in sets {
        if o != gpu.modules().options() {
            let label = format!(
                "write unroll {} read unroll {}, {} of 16 blocks writing",
                o.copy_unroll_write, o.copy_unroll_read, o.copy_write_share
            );
            option_gpus.push((label, Gpu::probe_with(0, o)?));
        }
    }
    let ctx = gpu.context();
    let engines = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)?;
    println!("explore: async engine count {engines}");
    let m = compile(gpu, "")?;
    let md = Module { fill: m.load_function("hx_fill")?, compare: m.load_function("hx_compare")?, _m: Arc::clone(&m) };
    let split_k = |w: u32, r: u32| -> Result<Kernel, GpuError> {
        Ok(Kernel { f: m.load_function(&format!("hx_split_{w}_{r}"))?, block: 1024, smem: 0 })
    };
    let tma = |module: &Arc<CudaModule>, smem: u32| -> Result<Kernel, GpuError> {
        let f = module.load_function("hx_tma")?;
        f.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)?;
        Ok(Kernel { f, block: 32, smem })
    };
    let unrolls: Vec<(u32, u32)> = vec![(8, 8), (8, 4), (8, 2), (8, 1), (16, 8), (16, 4), (16, 2), (16, 1), (4, 4)];
    let splits: Vec<((u32, u32), Kernel)> =
        unrolls.iter().map(|&(w, r)| Ok(((w, r), split_k(w, r)?))).collect::<Result<_, GpuError>>()?;
    let sk = |w: u32, r: u32| &splits.iter().find(|(u, _)| *u == (w, r)).expect("compiled above").1;
    let t8 = tma(&m, 8192 * 16)?;
    let mode_list: [(u32, u32, u32); 8] =
        [(8, 4, 1), (8, 8, 1), (16, 4, 1), (8, 4, 2), (8, 8, 2), (8, 4, 3), (8, 8, 3), (16, 4, 3)];
    let modes: Vec<((u32, u32, u32), Kernel)> = mode_list
        .iter()
        .map(|&(w, r, md)| {
            Ok(((w, r, md), Kernel { f: m.load_function(&format!("hx_split_{w}_{r}_m{md}"))?, block: 1024, smem: 0 }))
        })
        .collect::<Result<_, GpuError>>()?;
    let streams: Vec<Arc<CudaStream>> = (0..16).map(|_| ctx.new_stream()).collect::<Result<_, _>>()?;
    let kstreams: Vec<Arc<CudaStream>> = (0..2).map(|_| ctx.new_stream()).collect::<Result<_, _>>()?;
    let trace_buf: CudaSlice<u64> = gpu.stream().alloc_zeros(64 * 4)?;
    let trace_ptr = trace_buf.device_ptr(gpu.stream()).0;
    let mut out = Vec::new();
    for &bb in sizes {
        let regions = 32u32;
        let g = BlockGeometry { regions, block_bytes: bb, planes: 2, tokens_per_block: 16 };
        let n = ((1u64 << 30) / (bb * regions as u64)) as u32;
        let mut tier = HostTier::with_layout(gpu, g, n, HostLayout::RegionMajor)?;
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ bb;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for c in tier.bytes_mut()?.chunks_exact_mut(8) {
            c.copy_from_slice(&next().to_le_bytes());
        }
        let host_pattern: Vec<u8> = (0..(1usize << 30) / 8).flat_map(|_| next().to_le_bytes()).collect();
        let dev = Arc::new(gpu.stream().clone_htod(&host_pattern)?);
        drop(host_pattern);
        let tier = Arc::new(tier);
        let mut engine = gpu.attach_in(Arc::clone(&dev), g, n, Some(Arc::clone(&tier)))?;
        // Permutations: device pages [0, half) of dev_perm offloaded, the
        // rest onboarded into; host pages likewise.
        let perm = |next: &mut dyn FnMut() -> u64| {
            let mut p: Vec<u32> = (0..n).collect();
            for i in (1..p.len()).rev() {
                p.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            p
        };
        let (dev_perm, host_perm) = (perm(&mut next), perm(&mut next));
        let ops = two_way_wave(&dev_perm, &host_perm);
        let (db, hb) = (engine.device().region_bases.clone(), tier.pool().region_bases.clone());
        let mut out_segs = Vec::new();
        let mut in_segs = Vec::new();
        for op in &ops {
            for r in 0..regions as usize {
                if op.media == 2 {
                    out_segs.push(Seg {
                        dst: hb[r] + op.dst_page as u64 * bb,
                        src: db[r] + op.src_page as u64 * bb,
                        len: bb,
                    });
                } else {
                    in_segs.push(Seg {
                        dst: db[r] + op.dst_page as u64 * bb,
                        src: hb[r] + op.src_page as u64 * bb,
                        len: bb,
                    });
                }
            }
        }
        let all: Vec<Seg> = out_segs.iter().chain(&in_segs).copied().collect();
        let (_all_buf, all_ptr) = upload_segs(gpu, &all)?;
        let (_out_buf, out_ptr) = upload_segs(gpu, &out_segs)?;
        let (_in_buf, in_ptr) = upload_segs(gpu, &in_segs)?;
        let bytes = all.iter().map(|s| s.len).sum::<u64>() as f64;
        let n_all = all.len() as u32;
        let (n_out, n_in) = (out_segs.len() as u32, in_segs.len() as u32);
        let vgrid = 4 * gpu.sm_count();

        // Overwrites every destination of `ver`, runs `f` (warm-up and
        // timed), then counts words that differ from their sources; with
        // `traced` launches, reads the last run's block stamps.
        let mut measure = |name: String,
                           timer: &Gpu,
                           (ver_ptr, ver_n): (u64, u32),
                           moved: f64,
                           traced: &[Launch<'_>],
                           f: &mut dyn FnMut(&mut Vec<f64>) -> Result<(), GpuError>|
         -> Result<(), GpuError> {
            gpu.synchronize()?;
            timer.synchronize()?;
            let mut fill = gpu.stream().launch_builder(&md.fill);
            let marker = 0xDEAD_BEEFu32;
            fill.arg(&ver_ptr).arg(&ver_n).arg(&marker);
            let cfg = LaunchConfig { grid_dim: (vgrid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: (const Seg*, u32, u32); every destination is inside the
            // tier or the device buffer, which live to the end of the loop body.
            unsafe { fill.launch(cfg) }?;
            let mut enq = Vec::new();
            gpu.synchronize()?;
            let ms = time_ms(timer, 1, reps, || f(&mut enq))?;
            timer.synchronize()?;
            gpu.synchronize()?;
            for s in kstreams.iter().chain(&streams) {
                s.synchronize()?;
            }
            let span = if traced.is_empty() { None } else { spans(&gpu.stream().clone_dtoh(&trace_buf)?, traced) };
            let counter: CudaSlice<u64> = gpu.stream().alloc_zeros(1)?;
            let mut cmp = gpu.stream().launch_builder(&md.compare);
            cmp.arg(&ver_ptr).arg(&ver_n).arg(&counter);
            // SAFETY: (const Seg*, u32, u64*); reads inside the buffers above,
            // one counter of 8 bytes.
            unsafe { cmp.launch(cfg) }?;
            let bad = gpu.stream().clone_dtoh(&counter)?[0];
            let (span_text, w_ms, r_ms) = match span {
                Some((ws, we, rs, re)) => {
                    let t0 = ws.min(rs);
                    let (w, r) = ((we - t0) as f64 * 1e-6, (re - t0) as f64 * 1e-6);
                    (format!("  writes end {w:.2} ms, reads end {r:.2} ms"), w, r)
                }
                None => (String::new(), 0.0, 0.0),
            };
            let v = Variant {
                block_bytes: bb,
                gbps: moved / (ms * 1e-3) / 1e9,
                ms,
                enqueue_ms: median(enq),
                mismatches: bad,
                name,
                writes_end_ms: w_ms,
                reads_end_ms: r_ms,
            };
            println!(
                "explore block {:>6} {:<58} {:>6.1} GB/s  {:>8.2} ms  enqueue {:>7.2} ms  mismatches {}{}",
                bb, v.name, v.gbps, v.ms, v.enqueue_ms, v.mismatches, span_text
            );
            out.push(v);
            Ok(())
        };

        // The library's copy kernel through the engine, with each option
        // set (the first is `gpu`'s own, the default), then the automatic path.
        for (label, gx) in &option_gpus {
            let mut e = gx.attach_in(Arc::clone(&dev), g, n, Some(Arc::clone(&tier)))?;
            e.set_host_path(HostCopyPath::Kernel);
            let wave = gx.prepare_wave(&e, ops.clone())?;
            measure(format!("engine Kernel, {label}"), gx, (all_ptr, n_all), bytes, &[], &mut |t| {
                let t0 = Instant::now();
                launch_copy_wave(gx, &e, &wave, Some(16))?;
                t.push(t0.elapsed().as_secs_f64() * 1e3);
                Ok(())
            })?;
        }
        engine.set_host_path(HostCopyPath::Auto);
        let wave = gpu.prepare_wave(&engine, ops.clone())?;
        measure("engine Auto (default options)".to_owned(), gpu, (all_ptr, n_all), bytes, &[], &mut |t| {
            let t0 = Instant::now();
            launch_copy_wave(gpu, &engine, &wave, Some(16))?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            Ok(())
        })?;
        drop(wave);
        drop(engine);

        let mut plans: Vec<(String, Plan<'_>, (u64, u32), f64)> = Vec::new();
        let both = (all_ptr, n_all);
        let kernel_plan = |k, fb| kernel_plan(k, all_ptr, n_all, n_out, fb);
        // The same split as segment copies (links these runs to the explorations).
        plans.push(("split w8 r8, 8 write blocks (segments)".to_owned(), kernel_plan(sk(8, 8), 8), both, bytes));
        plans.push(("split w16 r4, 10 write blocks (segments)".to_owned(), kernel_plan(sk(16, 4), 10), both, bytes));
        plans.push(("tma 8K x16, 8 write blocks".to_owned(), kernel_plan(&t8, 8), both, bytes));
        // SM kernel, the grid split between the directions, unrolls per direction.
        let grid: Vec<(u32, u32, Vec<u32>)> =
            vec![(8, 8, vec![8]), (8, 4, vec![7, 8, 9]), (16, 4, vec![9, 10, 11]), (16, 2, vec![8])];
        for (w, r, fbs) in if full { grid } else { vec![] } {
            for fb in fbs {
                plans.push((format!("split w{w} r{r}, {fb} write blocks"), kernel_plan(sk(w, r), fb), both, bytes));
            }
        }
        // Read-side modes: 1 = 256-byte L2 fetch hint, 2 = bulk L2 prefetch
        // of the segment, 3 = bulk L2 prefetch of the next segment.
        for (w, r, m, fbs) in if !full {
            vec![]
        } else {
            vec![
                (8u32, 4u32, 1u32, vec![8u32, 9]),
                (8, 8, 1, vec![8, 10]),
                (16, 4, 1, vec![9, 10]),
                (8, 4, 2, vec![8, 10]),
                (8, 8, 2, vec![8, 10]),
                (8, 4, 3, vec![8, 10]),
                (8, 8, 3, vec![8, 10]),
                (16, 4, 3, vec![10]),
            ]
        } {
            let k = &modes.iter().find(|(u, _)| *u == (w, r, m)).expect("compiled above").1;
            for fb in fbs {
                plans.push((format!("split w{w} r{r} mode {m}, {fb} write blocks"), kernel_plan(k, fb), both, bytes));
            }
        }
        // Copy engines, one direction, with the batched call's attributes.
        let ce_lists = |segs: &[Seg], k: usize, first: usize| -> Vec<(Arc<CudaStream>, RunList)> {
            if segs.is_empty() {
                return vec![];
            }
            let per = segs.len().div_ceil(k);
            segs.chunks(per).enumerate().map(|(i, c)| (Arc::clone(&streams[first + i]), runs_of(c))).collect()
        };
        let attrs = [
            ("stream order", 0u8, false),
            ("location hints", 0, true),
            ("hints, any order", 1, true),
            ("during call", 2, false),
        ];
        for (attr_name, order, hint) in if full { &attrs[..] } else { &attrs[..1] } {
            for (dir, segs, ver, first) in
                [("onboard", &in_segs, (in_ptr, n_in), 8usize), ("offload", &out_segs, (out_ptr, n_out), 0)]
            {
                let attr = CeAttr { order: *order, src_host: hint.then_some(dir == "onboard") };
                plans.push((
                    format!("ce {dir} only, 4 streams+threads, {attr_name}"),
                    Plan { launches: vec![], ce: ce_lists(segs, 4, first), threads: true, kernel_first: true, attr },
                    ver,
                    bytes / 2.0,
                ));
            }
        }
        for (name, plan, ver, moved) in &plans {
            let traced: Vec<Launch<'_>> = plan.launches.clone();
            measure(name.clone(), gpu, *ver, *moved, &traced, &mut |e| run_plan(gpu, plan, &kstreams, trace_ptr, e))?;
        }
        gpu.synchronize()?;
        for s in streams.iter().chain(&kstreams) {
            s.synchronize()?;
        }
    }
    Ok(out)
}
