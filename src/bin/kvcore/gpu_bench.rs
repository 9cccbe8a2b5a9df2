//! `kvcore gpu-bench [--out FILE] [--quick]`: measures the physical limits of
//! the device (device copy, pinned copies each way and both ways) and every
//! kernel in the same run, checks the kernels' results, and writes one JSON
//! report. Figures go into docs/benchmarks.md ("CUDA kernels").

#[cfg(not(feature = "cuda"))]
pub fn main(_args: &[String]) -> i32 {
    eprintln!("gpu-bench: built without the cuda feature");
    2
}

#[cfg(feature = "cuda")]
pub use imp::main;

#[cfg(feature = "cuda")]
mod imp {
    use std::sync::Arc;
    use std::time::Instant;

    use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, sys};
    use kvcore::gpu::{BlockGeometry, CopyOp, DeviceBytes, Gpu, GpuError, HostTier, KvPool, launch_copy_wave};
    use rand::{RngCore, SeedableRng, rngs::StdRng, seq::SliceRandom};
    use serde_json::{Value, json};

    type R<T> = Result<T, GpuError>;

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(|a, b| a.partial_cmp(b).expect("timings are finite"));
        v[v.len() / 2]
    }

    /// Times `f` on the stream with events, `reps` times after `warm` warm-ups; median ms.
    fn time_events(gpu: &Gpu, warm: usize, reps: usize, mut f: impl FnMut() -> R<()>) -> R<f64> {
        let ctx = gpu.context();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
        for _ in 0..warm {
            f()?;
        }
        gpu.synchronize()?;
        let mut t = Vec::with_capacity(reps);
        for _ in 0..reps {
            a.record(gpu.stream())?;
            f()?;
            b.record(gpu.stream())?;
            b.synchronize()?;
            t.push(a.elapsed_ms(&b)? as f64);
        }
        Ok(median(t))
    }

    fn random_device(gpu: &Gpu, rng: &mut StdRng, bytes: usize) -> R<CudaSlice<u8>> {
        let mut host = vec![0u8; bytes];
        rng.fill_bytes(&mut host);
        Ok(gpu.stream().clone_htod(&host)?)
    }

    fn memcpy_async(dst: u64, src: u64, n: usize, s: &CudaStream) -> R<()> {
        // SAFETY: callers pass addresses of live allocations of at least n
        // bytes (device or mapped pinned memory; UVA lets cuMemcpyAsync infer
        // the direction).
        unsafe { sys::cuMemcpyAsync(dst, src, n, s.cu_stream()) }.result()?;
        Ok(())
    }

    struct Limits {
        device_copy: f64,
        h2d: f64,
        d2h: f64,
        both: f64,
    }

    fn limits(gpu: &Arc<Gpu>, report: &mut serde_json::Map<String, Value>, quick: bool) -> R<Limits> {
        let s = gpu.stream();
        let n: usize = if quick { 256 << 20 } else { 2 << 30 };
        // SAFETY: uninitialised device bytes, only ever copied (copy rates do
        // not depend on the content).
        let (a, b) = unsafe { (s.alloc::<u8>(n)?, s.alloc::<u8>(n)?) };
        let (pa, _g1) = a.device_ptr(s);
        let (pb, _g2) = b.device_ptr(s);
        let t = time_events(gpu, 2, 10, || memcpy_async(pb, pa, n, s))?;
        let device_copy = 2.0 * n as f64 / (t * 1e-3) / 1e9;

        let m: usize = if quick { 128 << 20 } else { 1 << 30 };
        let g = BlockGeometry { regions: 1, block_bytes: m as u64, planes: 1, tokens_per_block: 1 };
        let h1 = HostTier::new(gpu, g, 1)?;
        let h2 = HostTier::new(gpu, g, 1)?;
        let (hp1, hp2) = (h1.pool().region_bases[0], h2.pool().region_bases[0]);
        let t_h2d = time_events(gpu, 2, 10, || memcpy_async(pa, hp1, m, s))?;
        let t_d2h = time_events(gpu, 2, 10, || memcpy_async(hp2, pb, m, s))?;
        let s2 = gpu.context().new_stream()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let t_both = time_events(gpu, 2, 10, || {
            let fork = gpu.context().new_event(flags)?;
            fork.record(s)?;
            s2.wait(&fork)?;
            memcpy_async(pa, hp1, m, s)?;
            memcpy_async(hp2, pb, m, &s2)?;
            let join = gpu.context().new_event(flags)?;
            join.record(&s2)?;
            s.wait(&join)?;
            Ok(())
        })?;
        let l = Limits {
            device_copy,
            h2d: m as f64 / (t_h2d * 1e-3) / 1e9,
            d2h: m as f64 / (t_d2h * 1e-3) / 1e9,
            both: 2.0 * m as f64 / (t_both * 1e-3) / 1e9,
        };
        report.insert(
            "limits".into(),
            json!({
                "device_copy_GBps_read_plus_write": l.device_copy, "device_copy_bytes": n,
                "pinned_h2d_GBps": l.h2d, "pinned_d2h_GBps": l.d2h, "pinned_both_ways_GBps": l.both, "pinned_bytes": m,
            }),
        );
        println!("limit  device copy {:.0} GB/s (r+w) | pinned h2d {:.1} d2h {:.1} both {:.1} GB/s", l.device_copy, l.h2d, l.d2h, l.both);
        Ok(l)
    }

    fn digests(gpu: &Arc<Gpu>, report: &mut serde_json::Map<String, Value>, quick: bool) -> R<()> {
        let mut rng = StdRng::seed_from_u64(42);
        let total: usize = if quick { 64 << 20 } else { 288 << 20 };
        let data_host = {
            let mut v = vec![0u8; total];
            rng.fill_bytes(&mut v);
            v
        };
        let data = gpu.stream().clone_htod(&data_host)?;
        let (base, _g) = data.device_ptr(gpu.stream());
        let mut cases: Vec<(String, Vec<(u64, u64)>)> = Vec::new();
        let mib = 1u64 << 20;
        let n3 = total as u64 / (3 * mib);
        cases.push((format!("{n3} images x 3 MiB"), (0..n3).map(|i| (i * 3 * mib, 3 * mib)).collect()));
        cases.push((format!("1 item x {} MiB", total as u64 / mib), vec![(0, total as u64)]));
        let n64 = total as u64 / (64 << 10);
        cases.push((format!("{n64} items x 64 KiB"), (0..n64).map(|i| (i * (64 << 10), 64 << 10)).collect()));
        let n1k = (total as u64 / 1024).min(65536);
        cases.push((format!("{n1k} items x 1 KiB"), (0..n1k).map(|i| (i * 1024, 1024)).collect()));
        cases.push(("1 image x 3 MiB".to_owned(), vec![(0, 3 * mib)]));
        let mut out = Vec::new();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let ev = || gpu.context().new_event(flags);
        for (name, items) in cases {
            let list: Vec<DeviceBytes> = items.iter().map(|(o, l)| DeviceBytes { ptr: base + o, len: *l }).collect();
            // SAFETY: every item lies inside `data`, alive until the end of this function.
            let batch = unsafe { gpu.prepare_digests(&list)? };
            let bytes = batch.bytes() as f64;
            gpu.launch_digests(&batch)?;
            let got = gpu.read_digests(&batch)?;
            let correct = items
                .iter()
                .zip(&got)
                .all(|((o, l), d)| blake3::hash(&data_host[*o as usize..(*o + *l) as usize]).as_bytes() == d);
            let (e0, e1, e2) = (ev()?, ev()?, ev()?);
            let reps = 30;
            let (mut all, mut chunk) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                e0.record(gpu.stream())?;
                kvcore::gpu::launch::blake3_chunks(gpu, &batch)?;
                e1.record(gpu.stream())?;
                if batch.needs_tree_launch() {
                    kvcore::gpu::launch::blake3_tree(gpu, &batch)?;
                }
                e2.record(gpu.stream())?;
                e2.synchronize()?;
                all.push(e0.elapsed_ms(&e2)? as f64);
                chunk.push(e0.elapsed_ms(&e1)? as f64);
            }
            let (t, tc) = (median(all), median(chunk));
            let mut entry = json!({
                "case": name, "items": batch.len(), "bytes": bytes, "correct": correct,
                "kernel_us": t * 1e3, "chunk_launch_us": tc * 1e3,
                "TBps": bytes / (t * 1e-3) / 1e12, "chunk_launch_TBps": bytes / (tc * 1e-3) / 1e12,
            });
            if batch.len() == 1 && bytes <= (3 << 20) as f64 {
                // The whole API call: table upload, two launches, digest read-back.
                let mut wall = Vec::new();
                for _ in 0..50 {
                    let t0 = Instant::now();
                    // SAFETY: as above.
                    let d = unsafe { gpu.digest_device(&list)? };
                    wall.push(t0.elapsed().as_secs_f64() * 1e6);
                    assert_eq!(d[0], got[0], "repeated digests agree");
                }
                entry["api_call_us_median"] = json!(median(wall));
            }
            println!(
                "blake3 {:<24} {:>9.1} us  {:.3} TB/s (chunk launch {:.3} TB/s)  correct={}",
                name,
                t * 1e3,
                bytes / (t * 1e-3) / 1e12,
                bytes / (tc * 1e-3) / 1e12,
                correct
            );
            out.push(entry);
        }
        report.insert("blake3".into(), Value::Array(out));
        Ok(())
    }

    /// A device pool of `bytes` with `g`'s geometry; returns the buffer and its pool.
    fn device_pool(gpu: &Gpu, rng: &mut StdRng, g: BlockGeometry, bytes: usize) -> R<(CudaSlice<u8>, KvPool)> {
        let blocks = (bytes as u64 / (g.block_bytes * g.regions as u64)) as u32;
        let buf = random_device(gpu, rng, (g.block_bytes * g.regions as u64 * blocks as u64) as usize)?;
        let base = buf.device_ptr(gpu.stream()).0;
        let rb = g.block_bytes * blocks as u64;
        let pool = KvPool { region_bases: (0..g.regions as u64).map(|r| base + r * rb).collect(), blocks, geometry: g };
        Ok((buf, pool))
    }

    fn copies(gpu: &Arc<Gpu>, report: &mut serde_json::Map<String, Value>, l: &Limits, quick: bool) -> R<()> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut out = Vec::new();
        let pool_bytes: usize = if quick { 512 << 20 } else { 4 << 30 };
        for (bb, tokens) in [(8u64 << 10, 16u32), (16 << 10, 16), (64 << 10, 16), (16 << 10, 8), (2 << 10, 16)] {
            let g = BlockGeometry { regions: 32, block_bytes: bb, planes: 2, tokens_per_block: 16 };
            let (_buf, pool) = device_pool(gpu, &mut rng, g, pool_bytes)?;
            let half = pool.blocks / 2;
            let mut dst: Vec<u32> = (half..2 * half).collect();
            dst.shuffle(&mut rng);
            let wave: Vec<CopyOp> =
                (0..half).map(|i| CopyOp { src_page: i, dst_page: dst[i as usize], tokens, media: 0 }).collect();
            // SAFETY: the regions tile `_buf`, alive until the end of this iteration (synchronized below).
            let engine = unsafe { gpu.attach(pool, None)? };
            let wave = gpu.prepare_wave(&engine, wave)?;
            let moved = half as f64 * 32.0 * g.copy_bytes(tokens) as f64;
            let mut best = (0u32, f64::MAX);
            let mut sweep = Vec::new();
            for mult in [1u32, 2, 4, 8] {
                let grid = mult * gpu.sm_count();
                let t = time_events(gpu, 2, 10, || launch_copy_wave(gpu, &engine, &wave, Some(grid)))?;
                sweep.push(json!({"blocks": grid, "us": t * 1e3, "GBps_read_plus_write": 2.0 * moved / (t * 1e-3) / 1e9}));
                if t < best.1 {
                    best = (grid, t);
                }
            }
            let t_default = time_events(gpu, 2, 10, || launch_copy_wave(gpu, &engine, &wave, None))?;
            let rate = 2.0 * moved / (t_default * 1e-3) / 1e9;
            println!(
                "copy   d2d block {:>6} B tokens {:>2}/16  {:>7.0} GB/s (r+w) = {:.1} % of device copy (best grid {} : {:.1} %)",
                bb,
                tokens,
                rate,
                100.0 * rate / l.device_copy,
                best.0,
                100.0 * 2.0 * moved / (best.1 * 1e-3) / 1e9 / l.device_copy
            );
            out.push(json!({
                "kind": "device_to_device", "block_bytes": bb, "regions": 32, "tokens": tokens, "copies": half,
                "bytes_moved": moved, "us_default_grid": t_default * 1e3, "GBps_read_plus_write": rate,
                "ratio_to_device_copy": rate / l.device_copy, "grid_sweep": sweep,
            }));
        }

        // Host tier: offload, onboard, and both in one launch, 16 thread blocks.
        for bb in [16u64 << 10, 64 << 10, 8 << 10] {
            let g = BlockGeometry { regions: 32, block_bytes: bb, planes: 2, tokens_per_block: 16 };
            let tier_bytes: u64 = if quick { 128 << 20 } else { 1 << 30 };
            let host_blocks = (tier_bytes / (bb * 32)) as u32;
            let (_buf, pool) = device_pool(gpu, &mut rng, g, 2 * tier_bytes as usize)?;
            let tier = HostTier::new(gpu, g, host_blocks)?;
            let dev_blocks = pool.blocks;
            // SAFETY: as above.
            let engine = unsafe { gpu.attach(pool, Some(tier))? };
            let n = host_blocks;
            let offload: Vec<CopyOp> =
                (0..n).map(|i| CopyOp { src_page: i, dst_page: i, tokens: 16, media: 2 }).collect();
            let onboard: Vec<CopyOp> =
                (0..n).map(|i| CopyOp { src_page: i, dst_page: dev_blocks - 1 - i, tokens: 16, media: 1 }).collect();
            let half = n / 2;
            let mut mixed: Vec<CopyOp> = Vec::new();
            for i in 0..half {
                // Offload device page i to host page i; onboard host page half+i to a
                // device page in the upper half: no page is both read and written.
                mixed.push(CopyOp { src_page: i, dst_page: i, tokens: 16, media: 2 });
                mixed.push(CopyOp { src_page: half + i, dst_page: dev_blocks - 1 - i, tokens: 16, media: 1 });
            }
            let per_op = 32.0 * bb as f64;
            let mut entry = json!({"block_bytes": bb, "regions": 32, "tier_bytes": tier_bytes});
            for (name, wave, limit) in
                [("offload_d2h", offload.clone(), l.d2h), ("onboard_h2d", onboard.clone(), l.h2d), ("both_ways", mixed.clone(), l.both)]
            {
                let moved = wave.len() as f64 * per_op;
                let wave = gpu.prepare_wave(&engine, wave)?;
                let mut sweep = Vec::new();
                for grid in [4u32, 8, 16] {
                    let t = time_events(gpu, 1, 5, || launch_copy_wave(gpu, &engine, &wave, Some(grid)))?;
                    sweep.push(json!({"blocks": grid, "GBps": moved / (t * 1e-3) / 1e9}));
                }
                let t = time_events(gpu, 2, 10, || launch_copy_wave(gpu, &engine, &wave, Some(16)))?;
                let rate = moved / (t * 1e-3) / 1e9;
                println!(
                    "copy   {:<11} block {:>6} B  16 blocks {:>6.1} GB/s = {:.1} % of the copy engine's {:.1}",
                    name,
                    bb,
                    rate,
                    100.0 * rate / limit,
                    limit
                );
                entry[name] = json!({"GBps": rate, "ratio_to_copy_engine": rate / limit, "bytes": moved, "grid_sweep": sweep});
            }
            out.push(entry);
        }
        report.insert("block_copy".into(), Value::Array(out));
        Ok(())
    }

    fn run(out_path: Option<&str>, quick: bool) -> R<()> {
        let gpu = Gpu::probe(0)?;
        let t0 = Instant::now();
        gpu.warm()?;
        let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut report = serde_json::Map::new();
        report.insert("device".into(), json!(gpu.name()));
        report.insert("sm_count".into(), json!(gpu.sm_count()));
        report.insert("compile_and_load_ms".into(), json!(compile_ms));
        let mut regs = serde_json::Map::new();
        for k in kvcore::gpu::kernels::KernelId::ALL {
            let f = gpu_function(&gpu, k)?;
            regs.insert(k.name().into(), json!({"regs": f.num_regs()?, "local_bytes": f.local_size_bytes()?}));
        }
        report.insert("kernels".into(), Value::Object(regs));
        println!("device {} ({} SMs), modules compiled and loaded in {compile_ms:.0} ms", gpu.name(), gpu.sm_count());
        let l = limits(&gpu, &mut report, quick)?;
        digests(&gpu, &mut report, quick)?;
        copies(&gpu, &mut report, &l, quick)?;
        let text = serde_json::to_string_pretty(&Value::Object(report)).expect("a JSON value serialises");
        match out_path {
            Some(p) => std::fs::write(p, text).map_err(|e| GpuError::InvalidArgument(format!("writing {p}: {e}")))?,
            None => println!("{text}"),
        }
        Ok(())
    }

    fn gpu_function(gpu: &Gpu, k: kvcore::gpu::kernels::KernelId) -> R<cudarc::driver::CudaFunction> {
        kvcore::gpu::kernels::ModuleCache::function(gpu.modules(), k)
    }

    /// Entry point; returns the process exit code.
    pub fn main(args: &[String]) -> i32 {
        let mut out = None;
        let mut quick = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--out" => out = it.next().cloned(),
                "--quick" => quick = true,
                other => {
                    eprintln!("gpu-bench: unknown argument {other}; usage: kvcore gpu-bench [--out FILE] [--quick]");
                    return 2;
                }
            }
        }
        match run(out.as_deref(), quick) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("gpu-bench: {e}");
                1
            }
        }
    }
}
