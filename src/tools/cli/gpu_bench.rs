//! `kvcore gpu-bench [--out FILE] [--quick] [--only PART] ...`: measures the
//! physical limits of the device (device copy, pinned copies each way and
//! both ways) and every kernel in the same run (every BLAKE3 variant and
//! the lab's, every host-tier path), checks the digests, and writes one JSON
//! report. Figures go into docs/benchmarks.md. The lab variants and
//! measurements are in `kvcore_tools::lab`.

use clap::{Args, ValueEnum};

/// The options of `kvcore gpu-bench`.
#[derive(Args, Debug, Clone)]
pub struct GpuBenchArgs {
    /// Where to write the JSON report (stdout when absent).
    #[arg(long)]
    pub out: Option<String>,
    /// Smaller sizes, for a smoke run.
    #[arg(long)]
    pub quick: bool,
    /// Run one part alone instead of the whole bench (the copy limits are
    /// always measured first).
    #[arg(long, value_enum)]
    pub only: Option<Only>,
    /// With `--only host-runs`: `mixed` runs k = 1 and 64 and more cases
    /// where each direction has its own run length (absent: runs of 1 to 64
    /// pages, then three such cases).
    #[arg(long, value_enum)]
    pub runs: Option<Runs>,
    /// With `--only replay`: the `kvcore sim --record-copies` logs to replay
    /// (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub replay: Vec<String>,
    /// With `--only replay`: KiB per block and region of the replay's pools.
    #[arg(long, default_value_t = 128)]
    pub replay_block_kib: u64,
    /// With `--only replay`: the host copy paths to replay with
    /// (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "auto")]
    pub replay_paths: Vec<ReplayPath>,
    /// Block sizes in KiB (comma-separated) of the host-tier parts: default
    /// 8,16 for `host` and `host-explore`, 8,16,64 for `host-runs` and
    /// `host-bounce` (host page sizes there), 8,64 for `wave-sizes`.
    #[arg(long, value_delimiter = ',')]
    pub blocks: Option<Vec<u64>>,
    /// MiB of digest data (at least 3; 96 images of 3 MiB by default; 63
    /// with `--quick`, whatever this says).
    #[arg(long, default_value_t = 288)]
    pub digest_mib: usize,
    /// Host tier layouts of the host-tier cases (comma-separated); the
    /// replay takes the first.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "block")]
    pub host_layout: Vec<Layout>,
    /// With `--only wave-sizes`: the wave sizes in MiB (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [2u64, 4, 8, 16, 32, 64, 128, 512])]
    pub wave_mib: Vec<u64>,
}

/// The parts `--only` runs alone.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Only {
    /// The digests alone (every BLAKE3 kernel and lab variant).
    Blake3,
    /// The host tier's both-ways variants for fully scattered blocks: the
    /// library's paths and kernel options, the lab's reference kernels and
    /// the copy engines.
    Host,
    /// As `host`, with every lab variant.
    HostExplore,
    /// Both ways with host pages in runs of consecutive pages, then each
    /// direction with its own run length (see `--runs`).
    HostRuns,
    /// Replays `kvcore sim --record-copies` logs (`--replay`) through the
    /// engine's GPU path.
    Replay,
    /// Where the staged path starts to pay: fully scattered waves of each
    /// size of `--wave-mib`.
    WaveSizes,
    /// CPU threads gathering and scattering host pages through pinned bounce
    /// slots for the copy engines.
    HostBounce,
}

/// `--runs` values.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    /// k = 1 and 64, and more cases with a run length per direction.
    Mixed,
}

/// The host copy paths a replay can take.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayPath {
    /// The library's default: chosen per wave.
    Auto,
    /// The copy kernel.
    Kernel,
    /// The copy engines through the staging slots.
    Staged,
    /// The copy engines directly.
    CopyEngines,
}

/// Host tier layouts.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Block-major: a page's regions side by side (the library's default).
    Block,
    /// Region-major: each region's pages back to back.
    Region,
}

/// Runs the bench; returns the process exit code.
#[cfg(not(feature = "cuda"))]
pub fn run_cli(_args: &GpuBenchArgs) -> i32 {
    eprintln!("gpu-bench: built without the cuda feature");
    2
}

#[cfg(feature = "cuda")]
pub use imp::run_cli;

#[cfg(feature = "cuda")]
mod imp {
    use std::sync::Arc;
    use std::time::Instant;

    use cudarc::driver::CudaSlice;
    use kvcore::gpu::{
        AttachedPool, BlockGeometry, CopyOp, DeviceBytes, Gpu, GpuError, HostCopyPath, HostLayout, HostTier, KernelId,
        OneItemPath, StagingConfig, batch_api_in_use, launch_copy_wave,
    };
    use kvcore_tools::lab::blake3::Blake3Lab;
    use kvcore_tools::lab::host_explore::two_way_wave;
    use kvcore_tools::lab::measure::{CopyLimits, copy_limits, median, time_ms};
    use rand::{RngCore, SeedableRng, rngs::StdRng, seq::SliceRandom};
    use serde_json::{Value, json};

    use super::{GpuBenchArgs, Layout, Only, ReplayPath, Runs};

    type R<T> = Result<T, GpuError>;

    /// One way of making the one-item digest call: the library's
    /// (`Gpu::digest_device_via`), or the lab's with a lab kernel, launched
    /// directly or as a graph. Labels as `OneItemPath` prints them, so that
    /// the report's keys stay the same.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum CallPath {
        Library(OneItemPath),
        Experiment(&'static str),
        GraphExperiment(&'static str),
    }

    impl CallPath {
        fn label(self) -> String {
            match self {
                CallPath::Library(p) => format!("{p:?}"),
                CallPath::Experiment(n) => format!("Experiment({n:?})"),
                CallPath::GraphExperiment(n) => format!("GraphExperiment({n:?})"),
            }
        }
    }

    /// Random bytes on the host and the device.
    fn random_data(gpu: &Gpu, rng: &mut StdRng, bytes: usize) -> R<(Vec<u8>, CudaSlice<u8>)> {
        let mut host = vec![0u8; bytes];
        rng.fill_bytes(&mut host);
        let dev = gpu.stream().clone_htod(&host)?;
        Ok((host, dev))
    }

    /// Digest cases over `data`: (name, items as (offset, len)).
    fn digest_cases(total: u64) -> Vec<(String, Vec<(u64, u64)>)> {
        let mib = 1u64 << 20;
        let n3 = total / (3 * mib);
        let mut cases = vec![(format!("{n3} images x 3 MiB"), (0..n3).map(|i| (i * 3 * mib, 3 * mib)).collect())];
        cases.push((format!("1 item x {} MiB", total / mib), vec![(0, total)]));
        let n64 = total / (64 << 10);
        cases.push((format!("{n64} items x 64 KiB"), (0..n64).map(|i| (i * (64 << 10), 64 << 10)).collect()));
        let n1k = (total / 1024).min(65536);
        cases.push((format!("{n1k} items x 1 KiB"), (0..n1k).map(|i| (i * 1024, 1024)).collect()));
        cases.push(("8 images x 3 MiB".to_owned(), (0..8).map(|i| (i * 3 * mib, 3 * mib)).collect()));
        cases.push(("1 image x 3 MiB".to_owned(), vec![(0, 3 * mib)]));
        cases
    }

    fn digests(gpu: &Arc<Gpu>, lab: &Blake3Lab, host: &[u8], data: &Arc<CudaSlice<u8>>) -> R<Vec<Value>> {
        let mut out = Vec::new();
        for (name, items) in digest_cases(host.len() as u64) {
            let mut batch = gpu.prepare_digests_in(Arc::clone(data), &items)?;
            let bytes = batch.bytes() as f64;
            gpu.launch_digests(&batch)?;
            let got = gpu.read_digests(&batch)?;
            let correct = items
                .iter()
                .zip(&got)
                .all(|((o, l), d)| blake3::hash(&host[*o as usize..(*o + *l) as usize]).as_bytes() == d);
            let mut variants = serde_json::Map::new();
            let mut again = true;
            for v in KernelId::BLAKE3 {
                let t = match time_ms(gpu, 3, 30, || gpu.launch_digests_with(&batch, v)) {
                    Ok(t) => t,
                    Err(e) => {
                        println!("blake3 {name:<24} {:<26} failed: {e}", v.name());
                        variants.insert(v.name().into(), json!({"error": e.to_string()}));
                        continue;
                    }
                };
                // Launching the same batch again must give the same digests
                // (the kernel resets its counters).
                again &= gpu.read_digests(&batch)? == got;
                variants.insert(v.name().into(), json!({"us": t * 1e3, "TBps": bytes / (t * 1e-3) / 1e12}));
                println!(
                    "blake3 {:<24} {:<26} {:>9.1} us  {:.3} TB/s",
                    name,
                    v.name(),
                    t * 1e3,
                    bytes / (t * 1e-3) / 1e12
                );
            }
            let mut experiments = serde_json::Map::new();
            let sms = gpu.sm_count();
            if batch.groups() > 16 * sms {
                // One climbing launch whose chunk loop tests the alignment
                // at each load, against the library's two fixed loops.
                let k = "b3x_multi_branchy";
                let g4 = batch.groups().div_ceil(4);
                let run = || lab.table_kernel(gpu, &batch, k, 128, Some(g4), None);
                let t = time_ms(gpu, 3, 30, run)?;
                let ok = gpu.read_digests(&batch)? == got;
                let tbps = bytes / (t * 1e-3) / 1e12;
                println!("blake3 {name:<24} {k:<26} {:>9.1} us  {tbps:.3} TB/s  correct={ok}", t * 1e3);
                experiments.insert(k.into(), json!({"us": t * 1e3, "TBps": tbps, "correct": ok}));
                // One launch whose warps climb (the scheme the two launches
                // replaced); the chunk launch with the plain table search
                // followed by the fold launch, without and with
                // programmatic stream serialization; the chunk launch that
                // triggers the fold launch early; then the library's
                // launches again.
                let cases: [(&str, Option<bool>); 5] = [
                    ("b3x_multi_climb", None),
                    ("b3x_multi_store", Some(false)),
                    ("b3x_multi_store", Some(true)),
                    ("b3x_multi_trigger", Some(true)),
                    ("blake3_digest_multi", None),
                ];
                for (k, second) in cases {
                    gpu.clear_digests(&mut batch)?;
                    let run = || {
                        if k == "blake3_digest_multi" {
                            return gpu.launch_digests_with(&batch, KernelId::Blake3Multi);
                        }
                        lab.table_kernel(gpu, &batch, k, 128, Some(g4), None)?;
                        match second {
                            Some(pdl) => gpu.launch_fold_sets(&batch, pdl),
                            None => Ok(()),
                        }
                    };
                    let name_k = match second {
                        Some(false) => format!("{k}+sets"),
                        Some(true) => format!("{k}+sets pdl"),
                        None if k == "blake3_digest_multi" => format!("{k} (again)"),
                        None => k.to_owned(),
                    };
                    run()?;
                    let ok = gpu.read_digests(&batch)? == got;
                    let t = time_ms(gpu, 3, 30, run)?;
                    let tbps = bytes / (t * 1e-3) / 1e12;
                    println!("blake3 {name:<24} {name_k:<26} {:>9.1} us  {tbps:.3} TB/s  correct={ok}", t * 1e3);
                    experiments.insert(name_k, json!({"us": t * 1e3, "TBps": tbps, "correct": ok}));
                }
            }
            if batch.len() == 1 && bytes <= (3 << 20) as f64 {
                // The one-image kernel alone (event-timed, no flag).
                for one in [KernelId::Blake3One.name(), "b3x_one_generic", "b3x_one_whole2"] {
                    let t = time_ms(gpu, 3, 30, || lab.one_kernel(gpu, &batch, one, None))?;
                    let ok = gpu.read_digests(&batch)? == got;
                    println!("blake3 {name:<24} {one:<26} {:>9.1} us  correct={ok}", t * 1e3);
                    experiments.insert(one.into(), json!({"us": t * 1e3, "correct": ok}));
                }
                // An empty kernel: launch and completion alone.
                let k = "b3x_one_empty";
                let t = time_ms(gpu, 3, 30, || lab.one_kernel(gpu, &batch, k, None))?;
                println!("blake3 {name:<24} {k:<26} {:>9.1} us", t * 1e3);
                experiments.insert(k.into(), json!({"us": t * 1e3}));
                // The host side of a launch alone (the call returns before
                // the kernel ends), through cudarc's builder and directly.
                for k in ["b3x_one_empty", "b3x_one_trace"] {
                    let probe = lab.launch_call_probe(gpu, &batch, k, 200)?;
                    println!("blake3 {name:<24} launch call of {k} (median us) {probe:?}");
                    experiments.insert(
                        format!("launch_call_{k}_us"),
                        Value::Object(probe.iter().map(|(k, v)| (k.to_string(), json!(v))).collect()),
                    );
                }
            }
            // Traces: where the time of one block goes, and the SM clock
            // while it runs (clock64 cycles over globaltimer ns).
            for kernel in ["b3x_one_trace", "b3x_one_generic", "b3x_one_whole2"] {
                if batch.len() != 1 || bytes > (3 << 20) as f64 {
                    break;
                }
                let mut tr = gpu.stream().alloc_zeros::<u64>(8 * batch.groups() as usize)?;
                for _ in 0..5 {
                    lab.one_kernel(gpu, &batch, kernel, Some(&mut tr))?;
                }
                let v = gpu.stream().clone_dtoh(&tr)?;
                gpu.synchronize()?;
                let rows: Vec<&[u64]> = v.chunks_exact(8).collect();
                let start = rows.iter().map(|r| r[0]).min().unwrap_or(0);
                let f = |x: u64| (x - start) as f64 / 1e3;
                let last = rows.iter().find(|r| r[5] == 1).copied().unwrap_or(rows[0]);
                let chunk_ns: Vec<f64> = rows.iter().map(|r| (r[1] - r[0]) as f64).collect();
                let ghz: Vec<f64> = rows.iter().map(|r| r[4] as f64 / (r[1] - r[0]).max(1) as f64).collect();
                // Words 6 and 7: the end of the group's own fold and, in the
                // block that folded the set, when it learned it was last.
                let summary = json!({
                    "kernel": kernel,
                    "group_fold_done_us_max": rows.iter().map(|r| f(r[6])).fold(0.0, f64::max),
                    "digest_block_last_us": f(last[7].max(start)),
                    "digest_block_group_fold_done_us": f(last[6]),
                    "blocks": rows.len(),
                    "start_spread_us": f(rows.iter().map(|r| r[0]).max().unwrap_or(0)),
                    "chunk_phase_us_median": median(chunk_ns.clone()) / 1e3,
                    "chunk_phase_us_max": chunk_ns.iter().cloned().fold(0.0, f64::max) / 1e3,
                    "all_chunks_done_us_max": rows.iter().map(|r| f(r[2])).fold(0.0, f64::max),
                    "digest_block": {"start_us": f(last[0]), "chunks_us": f(last[1]), "synced_us": f(last[2]), "end_us": f(last[3])},
                    "sm_clock_ghz_median": median(ghz),
                });
                println!("blake3 {name:<24} trace {summary}");
                experiments.insert(format!("trace_one_{kernel}"), summary);
            }
            let traced = [("b3x_multi_trace", 128u32, batch.groups().div_ceil(4))];
            for (kernel, block, grid) in traced {
                if batch.groups() <= 16 * sms {
                    break;
                }
                let mut tr = gpu.stream().alloc_zeros::<u64>(4 * grid as usize)?;
                for _ in 0..3 {
                    lab.table_kernel(gpu, &batch, kernel, block, Some(grid), Some(&mut tr))?;
                }
                let v = gpu.stream().clone_dtoh(&tr)?;
                gpu.synchronize()?;
                let rows: Vec<&[u64]> = v.chunks_exact(4).collect();
                let start = rows.iter().map(|r| r[0]).min().unwrap_or(0);
                let end = rows.iter().map(|r| r[1]).max().unwrap_or(0);
                let durs: Vec<f64> = rows.iter().map(|r| (r[1] - r[0]) as f64 / 1e3).collect();
                let ghz: Vec<f64> = rows.iter().map(|r| r[2] as f64 / (r[1] - r[0]).max(1) as f64).collect();
                // Blocks running at each tenth of the span.
                let span = (end - start) as f64;
                let occupancy: Vec<usize> = (0..10)
                    .map(|k| {
                        let at = start + (span * (k as f64 + 0.5) / 10.0) as u64;
                        rows.iter().filter(|r| r[0] <= at && at < r[1]).count()
                    })
                    .collect();
                // Blocks whose warps folded a set while climbing, and the others.
                let folded = |f: bool| -> Vec<f64> {
                    rows.iter().zip(&durs).filter(|(r, _)| (r[3] as u32 > 0) == f).map(|(_, d)| *d).collect()
                };
                let (with, without) = (folded(true), folded(false));
                let med = |v: &[f64]| (!v.is_empty()).then(|| median(v.to_vec()));
                let summary = json!({
                    "kernel": kernel,
                    "span_us": span / 1e3,
                    "block_us_median": median(durs.clone()),
                    "block_us_max": durs.iter().cloned().fold(0.0, f64::max),
                    "sm_clock_ghz_median": median(ghz),
                    "blocks_running_by_tenth": occupancy,
                    "folding_blocks": with.len(),
                    "folding_block_us_median": med(&with),
                    "folding_block_us_max": with.iter().cloned().fold(0.0, f64::max),
                    "other_block_us_median": med(&without),
                    "other_block_us_max": without.iter().cloned().fold(0.0, f64::max),
                });
                // Every block: start (µs after the first), length (µs), SM, set folds.
                let blocks: Vec<[f64; 4]> = rows
                    .iter()
                    .map(|r| {
                        [
                            (r[0] - start) as f64 / 1e3,
                            (r[1] - r[0]) as f64 / 1e3,
                            (r[3] >> 32) as f64,
                            (r[3] as u32) as f64,
                        ]
                    })
                    .collect();
                experiments.insert(format!("trace_blocks_{kernel}"), json!(blocks));
                println!("blake3 {name:<24} trace {summary}");
                experiments.insert(format!("trace_{kernel}"), summary);
            }
            let t = time_ms(gpu, 3, 30, || gpu.launch_digests(&batch))?;
            let mut entry = json!({"experiments": experiments,
                "case": name, "items": batch.len(), "bytes": bytes, "correct": correct && again,
                "kernel_us": t * 1e3, "TBps": bytes / (t * 1e-3) / 1e12, "variants": variants,
            });
            if batch.len() == 1 && bytes <= (3 << 20) as f64 {
                // The whole API call (launch, wait, digest in host memory),
                // by each one-item path, interleaved so that drift hits all
                // alike, each call after 30 µs of idling (so that no call
                // waits for the previous call's kernel to retire); then
                // some paths back to back.
                let view = data.slice(..items[0].1 as usize);
                let empty = "b3x_one_empty";
                let paths = [
                    CallPath::Library(OneItemPath::Table),
                    CallPath::Library(OneItemPath::ByValue),
                    CallPath::Library(OneItemPath::ByValueFlagLaunch),
                    CallPath::Library(OneItemPath::ByValueFlag),
                    CallPath::Experiment("b3x_one_generic"),
                    CallPath::GraphExperiment("b3x_one_generic"),
                    CallPath::Experiment(empty),
                    CallPath::GraphExperiment(empty),
                ];
                let (ptr, len) = {
                    use cudarc::driver::DevicePtr;
                    (view.device_ptr(gpu.stream()).0, view.len() as u64)
                };
                let item = [DeviceBytes { ptr, len }];
                let is_empty =
                    |p: &CallPath| matches!(p, CallPath::Experiment(n) | CallPath::GraphExperiment(n) if *n == empty);
                let call = |p: CallPath| -> R<f64> {
                    let t0 = Instant::now();
                    let d = match p {
                        // SAFETY: the item is a view of `data`, alive for the whole loop.
                        CallPath::Library(path) => (unsafe { gpu.digest_device_via(&item, path) })?[0],
                        // The batch's single item is the same bytes (offset 0).
                        CallPath::Experiment(k) => lab.one_call(gpu, &batch, k, false)?,
                        CallPath::GraphExperiment(k) => lab.one_call(gpu, &batch, k, true)?,
                    };
                    let us = t0.elapsed().as_secs_f64() * 1e6;
                    if !is_empty(&p) {
                        assert_eq!(d, got[0], "repeated digests agree ({})", p.label());
                    }
                    Ok(us)
                };
                let mut walls: Vec<(String, Vec<f64>)> = paths.iter().map(|p| (p.label(), Vec::new())).collect();
                for round in 0..300 {
                    for (k, p) in paths.iter().enumerate() {
                        let idle = Instant::now();
                        while idle.elapsed().as_secs_f64() < 30e-6 {
                            std::hint::spin_loop();
                        }
                        let us = call(*p)?;
                        if round >= 20 {
                            walls[k].1.push(us);
                        }
                    }
                }
                for p in [
                    CallPath::Library(OneItemPath::ByValueFlag),
                    CallPath::Library(OneItemPath::ByValueFlagLaunch),
                    CallPath::Experiment("b3x_one_generic"),
                ] {
                    let mut w = Vec::new();
                    for round in 0..220 {
                        let us = call(p)?;
                        if round >= 20 {
                            w.push(us);
                        }
                    }
                    walls.push((format!("{} back to back", p.label()), w));
                }
                let mut calls = serde_json::Map::new();
                for (p, w) in walls {
                    let mut sorted = w.clone();
                    sorted.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
                    let (med, p10, p90) =
                        (sorted[sorted.len() / 2], sorted[sorted.len() / 10], sorted[sorted.len() * 9 / 10]);
                    println!("blake3 {name:<24} API call {p:<12} median {med:>6.1} us (p10 {p10:.1}, p90 {p90:.1})");
                    calls.insert(p, json!({"median_us": med, "p10_us": p10, "p90_us": p90}));
                }
                let d = gpu.digest_views(std::slice::from_ref(&view))?;
                assert_eq!(d[0], got[0], "the safe call agrees");
                entry["api_call_us_median"] = calls["ByValueFlag"]["median_us"].clone();
                entry["api_call"] = Value::Object(calls);
            }
            println!(
                "blake3 {:<24} launch_digests {:>9.1} us  {:.3} TB/s  correct={}",
                name,
                t * 1e3,
                bytes / (t * 1e-3) / 1e12,
                correct && again
            );
            out.push(entry);
        }
        Ok(out)
    }

    /// A device pool of about `bytes` with `g`'s geometry, random content,
    /// attached with the host tier if any.
    fn device_pool(
        gpu: &Gpu,
        rng: &mut StdRng,
        g: BlockGeometry,
        bytes: usize,
        host: Option<Arc<HostTier>>,
    ) -> R<(AttachedPool, u32)> {
        let blocks = (bytes as u64 / (g.block_bytes * g.regions as u64)) as u32;
        let (_, buf) = random_data(gpu, rng, (g.block_bytes * g.regions as u64 * blocks as u64) as usize)?;
        Ok((gpu.attach_in(Arc::new(buf), g, blocks, host)?, blocks))
    }

    fn device_copies(gpu: &Arc<Gpu>, l: &CopyLimits, quick: bool) -> R<Vec<Value>> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut out = Vec::new();
        let pool_bytes: usize = if quick { 512 << 20 } else { 4 << 30 };
        for (bb, tokens) in [(8u64 << 10, 16u32), (16 << 10, 16), (64 << 10, 16), (16 << 10, 8), (2 << 10, 16)] {
            let g = BlockGeometry { regions: 32, block_bytes: bb, planes: 2, tokens_per_block: 16 };
            let (engine, blocks) = device_pool(gpu, &mut rng, g, pool_bytes, None)?;
            let half = blocks / 2;
            let mut dst: Vec<u32> = (half..2 * half).collect();
            dst.shuffle(&mut rng);
            let ops: Vec<CopyOp> =
                (0..half).map(|i| CopyOp { src_page: i, dst_page: dst[i as usize], tokens, media: 0 }).collect();
            let wave = gpu.prepare_wave(&engine, ops)?;
            let moved = half as f64 * 32.0 * g.copy_bytes(tokens) as f64;
            let mut sweep = Vec::new();
            for mult in [1u32, 2, 4, 8] {
                let grid = mult * gpu.sm_count();
                let t = time_ms(gpu, 2, 10, || launch_copy_wave(gpu, &engine, &wave, Some(grid)))?;
                sweep.push(
                    json!({"blocks": grid, "us": t * 1e3, "GBps_read_plus_write": 2.0 * moved / (t * 1e-3) / 1e9}),
                );
            }
            let t = time_ms(gpu, 2, 10, || launch_copy_wave(gpu, &engine, &wave, None))?;
            let rate = 2.0 * moved / (t * 1e-3) / 1e9;
            println!(
                "copy   d2d block {:>6} B tokens {:>2}/16  {:>7.0} GB/s (r+w) = {:.1} % of device copy",
                bb,
                tokens,
                rate,
                100.0 * rate / l.device_copy
            );
            out.push(json!({
                "kind": "device_to_device", "block_bytes": bb, "regions": 32, "tokens": tokens, "copies": half,
                "bytes_moved": moved, "us": t * 1e3, "GBps_read_plus_write": rate,
                "ratio_to_device_copy": rate / l.device_copy, "grid_sweep": sweep,
            }));
        }
        Ok(out)
    }

    /// Offload, onboard and both at once through the host tier, by each
    /// [`HostCopyPath`] (the kernel with 16 thread blocks, the copy engines,
    /// or one of each).
    #[allow(clippy::too_many_arguments, reason = "one case of the report: the device, its limits and the case's knobs")]
    fn host_copies(
        gpu: &Arc<Gpu>,
        l: &CopyLimits,
        quick: bool,
        layouts: &[HostLayout],
        sizes: &[u64],
        path: HostCopyPath,
        staging: Option<StagingConfig>,
    ) -> R<Vec<Value>> {
        let mut rng = StdRng::seed_from_u64(8);
        let options = format!("{:?}", gpu.modules().options());
        let mut out = Vec::new();
        for (layout, bb) in layouts.iter().flat_map(|l| sizes.iter().map(move |bb| (*l, *bb))) {
            let g = BlockGeometry { regions: 32, block_bytes: bb, planes: 2, tokens_per_block: 16 };
            let tier_bytes: u64 = if quick { 128 << 20 } else { 1 << 30 };
            let host_blocks = (tier_bytes / (bb * 32)) as u32;
            let tier = Arc::new(HostTier::with_layout(gpu, g, host_blocks, layout)?);
            let (mut engine, dev_blocks) = device_pool(gpu, &mut rng, g, 2 * tier_bytes as usize, Some(tier))?;
            engine.set_host_path(path);
            if let Some(cfg) = staging {
                engine.set_staging(gpu, cfg)?;
            }
            let staging_desc = format!("{:?}", engine.staging());
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
            // Both ways with pages in order on both sides (runs merge: the
            // best case for the copy engines).
            let mut contiguous: Vec<CopyOp> = Vec::new();
            for i in 0..half {
                contiguous.push(CopyOp { src_page: i, dst_page: i, tokens: 16, media: 2 });
                contiguous.push(CopyOp { src_page: half + i, dst_page: dev_blocks - half + i, tokens: 16, media: 1 });
            }
            // Both ways, device pages in random order, host pages in order
            // (what the engine does when it allocates a step's offload host
            // pages consecutively), and fully scattered (host pages random too).
            let mut dev_perm: Vec<u32> = (0..dev_blocks).collect();
            dev_perm.shuffle(&mut rng);
            let mut host_perm: Vec<u32> = (0..n).collect();
            host_perm.shuffle(&mut rng);
            let mut dev_scattered: Vec<CopyOp> = Vec::new();
            let mut scattered: Vec<CopyOp> = Vec::new();
            for i in 0..half as usize {
                // Device pages: [0, half) offload sources, [half, 2 half) onboard targets (a permutation split).
                let (src, dst) = (dev_perm[i], dev_perm[half as usize + i]);
                dev_scattered.push(CopyOp { src_page: src, dst_page: i as u32, tokens: 16, media: 2 });
                dev_scattered.push(CopyOp { src_page: half + i as u32, dst_page: dst, tokens: 16, media: 1 });
                scattered.push(CopyOp { src_page: src, dst_page: host_perm[i], tokens: 16, media: 2 });
                scattered.push(CopyOp { src_page: host_perm[half as usize + i], dst_page: dst, tokens: 16, media: 1 });
            }
            let per_op = 32.0 * bb as f64;
            let mut entry = json!({"block_bytes": bb, "regions": 32, "tier_bytes": tier_bytes, "kernel_options": options,
                "path": format!("{path:?}"), "staging": staging_desc, "host_layout": format!("{layout:?}")});
            for (name, ops, limit) in [
                ("offload_d2h", offload, l.pinned_d2h),
                ("onboard_h2d", onboard, l.pinned_h2d),
                ("both_ways", mixed, l.pinned_both),
                ("both_ways_in_order", contiguous, l.pinned_both),
                ("both_ways_dev_scattered", dev_scattered, l.pinned_both),
                ("both_ways_scattered", scattered, l.pinned_both),
            ] {
                let moved = ops.len() as f64 * per_op;
                let wave = gpu.prepare_wave(&engine, ops)?;
                let t = time_ms(gpu, 2, 10, || launch_copy_wave(gpu, &engine, &wave, Some(16)))?;
                let rate = moved / (t * 1e-3) / 1e9;
                let (runs_out, runs_in) =
                    if matches!(wave.staged_runs(), (0, 0)) { wave.dma_runs() } else { wave.staged_runs() };
                println!(
                    "copy   {:<11} {:<23} {:<11} block {:>6} B  {:>6.1} GB/s = {:.1} % of the copy engines' {:.1} (DMA runs {runs_out}+{runs_in}, staged {}, batched call {}) {}",
                    format!("{path:?}"),
                    format!("{layout:?}"),
                    name,
                    bb,
                    rate,
                    100.0 * rate / limit,
                    limit,
                    wave.staged_runs() != (0, 0),
                    batch_api_in_use(),
                    if staging.is_some() { staging_desc.as_str() } else { "" }
                );
                gpu.synchronize()?;
                entry[name] = json!({"GBps": rate, "ratio_to_copy_engine": rate / limit, "bytes": moved,
                    "dma_runs": [runs_out, runs_in], "staged": wave.staged_runs() != (0, 0),
                    "batched_call": batch_api_in_use()});
            }
            out.push(entry);
        }
        Ok(out)
    }

    /// Both ways at once, device pages scattered, host pages in runs of k
    /// consecutive pages (the runs in random order): what the host tier's
    /// address-order allocation gives a step's offloads and onboards
    /// (docs/architecture.md, "Tier moves"), from k = 1 (fully scattered)
    /// up, by the kernel, the staged path and `Auto`; then the `mixed`
    /// cases (offload runs, onboard runs), where each direction has its own
    /// half of the tier and its own run length.
    /// `--runs mixed` runs k = 1 and 64 and more mixed cases.
    fn host_runs(
        gpu: &Arc<Gpu>,
        l: &CopyLimits,
        layouts: &[HostLayout],
        sizes: &[u64],
        runs: &[u32],
        mixed: &[(u32, u32)],
    ) -> R<Vec<Value>> {
        let mut rng = StdRng::seed_from_u64(9);
        let mut out = Vec::new();
        for (layout, bb) in layouts.iter().flat_map(|l| sizes.iter().map(move |bb| (*l, *bb))) {
            let g = BlockGeometry { regions: 32, block_bytes: bb, planes: 2, tokens_per_block: 16 };
            let tier_bytes: u64 = 1 << 30;
            let n = (tier_bytes / (bb * 32)) as u32;
            let tier = Arc::new(HostTier::with_layout(gpu, g, n, layout)?);
            let (mut engine, dev_blocks) = device_pool(gpu, &mut rng, g, 2 * tier_bytes as usize, Some(tier))?;
            let mut dev_perm: Vec<u32> = (0..dev_blocks).collect();
            dev_perm.shuffle(&mut rng);
            // Same runs both ways (k, k), then the engine's usual shape: one
            // direction's host pages in long runs, the other's scattered
            // (offload runs, onboard runs), each direction in its own part
            // of the tier (a third of the tier each way at most).
            let cases = runs.iter().map(|&k| (k, k, true)).chain(mixed.iter().map(|&(o, i)| (o, i, false)));
            for (k_out, k_in, same) in cases {
                let k = k_out;
                let order = |pages: std::ops::Range<u32>, k: u32, rng: &mut StdRng| -> Vec<u32> {
                    let mut chunks: Vec<Vec<u32>> =
                        pages.collect::<Vec<u32>>().chunks(k as usize).map(<[u32]>::to_vec).collect();
                    chunks.shuffle(rng);
                    chunks.concat()
                };
                let host = if same {
                    order(0..n, k, &mut rng)
                } else {
                    // m pages a direction, in runs of k with a free page
                    // after each run, so that sorting by host page (as the
                    // staged path does) cannot merge two runs.
                    let zone = |m: u32, k: u32| m.div_ceil(k) * (k + 1);
                    let m = (1..=n / 2).rev().find(|&m| zone(m, k_out) + zone(m, k_in) <= n).unwrap_or(1);
                    let pages = |start: u32, k: u32, rng: &mut StdRng| -> Vec<u32> {
                        let mut v: Vec<u32> = (0..m).map(|j| start + j / k * (k + 1) + j % k).collect();
                        v.shuffle(rng);
                        v
                    };
                    let mut h = pages(0, k_out, &mut rng);
                    h.extend(pages(zone(m, k_out), k_in, &mut rng));
                    h
                };
                let ops = two_way_wave(&dev_perm, &host);
                let moved = ops.len() as f64 * 32.0 * bb as f64;
                // The staged path also with more slots and copy-engine
                // streams (`StagingConfig`), each on its own staging buffers.
                let four = |streams| StagingConfig { slots: 4, copy_streams: streams, ..StagingConfig::default() };
                let variants = [
                    ("Kernel", HostCopyPath::Kernel, StagingConfig::default()),
                    ("Staged", HostCopyPath::Staged, StagingConfig::default()),
                    ("Auto", HostCopyPath::Auto, StagingConfig::default()),
                    ("Staged4x1", HostCopyPath::Staged, four(1)),
                    ("Staged4x2", HostCopyPath::Staged, four(2)),
                    ("Staged4x4", HostCopyPath::Staged, four(4)),
                    (
                        "StagedSeg",
                        HostCopyPath::Staged,
                        StagingConfig { whole_blocks: false, ..StagingConfig::default() },
                    ),
                ];
                for (label, path, staging) in variants {
                    if engine.staging() != Some(staging) {
                        engine.set_staging(gpu, staging)?;
                    }
                    engine.set_host_path(path);
                    let wave = gpu.prepare_wave(&engine, ops.clone())?;
                    let t = time_ms(gpu, 2, 7, || launch_copy_wave(gpu, &engine, &wave, Some(16)))?;
                    let rate = moved / (t * 1e-3) / 1e9;
                    let (so, si) = wave.staged_runs();
                    let staged = so + si > 0;
                    println!(
                        "runs   {:<11} block {:>6} B  host runs of {:>3}/{:>3} pages  {:<9} {:>6.1} GB/s = {:.2} of 85, {:.1} % of the copy engines' {:.1} (staged runs {so}/{si})",
                        format!("{layout:?}"),
                        bb,
                        k_out,
                        k_in,
                        label,
                        rate,
                        rate / 85.0,
                        100.0 * rate / l.pinned_both,
                        l.pinned_both
                    );
                    gpu.synchronize()?;
                    out.push(json!({"block_bytes": bb, "regions": 32, "host_run_pages": k, "path": label,
                        "host_layout": format!("{layout:?}"),
                        "staging": format!("{staging:?}"),
                        "host_run_pages_offload": k_out, "host_run_pages_onboard": k_in, "mixed": !same,
                        "GBps": rate, "ratio_to_85": rate / 85.0, "ratio_to_copy_engines": rate / l.pinned_both,
                        "staged": staged, "staged_runs": [so, si], "bytes": moved}));
                }
            }
        }
        Ok(out)
    }

    /// Where the staged path starts to pay: fully scattered blocks (device
    /// and host pages in random order) in waves of `mibs` MiB, both ways at
    /// once, offload alone and onboard alone, each through the kernel and
    /// the staged path, timed as the engine runs a wave: the wall clock of
    /// preparing it, launching it and waiting for it (median of 7 after 2).
    fn wave_sizes(
        gpu: &Arc<Gpu>,
        l: &CopyLimits,
        layouts: &[HostLayout],
        sizes: &[u64],
        mibs: &[u64],
    ) -> R<Vec<Value>> {
        let mut rng = StdRng::seed_from_u64(11);
        let mut out = Vec::new();
        for (layout, bb) in layouts.iter().flat_map(|l| sizes.iter().map(move |bb| (*l, *bb))) {
            let g = BlockGeometry { regions: 32, block_bytes: bb, planes: 2, tokens_per_block: 16 };
            let n = ((1u64 << 30) / (bb * 32)) as u32;
            let tier = Arc::new(HostTier::with_layout(gpu, g, n, layout)?);
            let (mut engine, dev_blocks) = device_pool(gpu, &mut rng, g, 2 << 30, Some(tier))?;
            let mut dev_perm: Vec<u32> = (0..dev_blocks).collect();
            dev_perm.shuffle(&mut rng);
            let mut host_perm: Vec<u32> = (0..n).collect();
            host_perm.shuffle(&mut rng);
            let all = two_way_wave(&dev_perm, &host_perm);
            for &mib in mibs {
                let blocks = ((mib << 20) / (32 * bb)).max(1) as usize;
                let both: Vec<CopyOp> = all.iter().take(blocks.max(2)).copied().collect();
                let offload: Vec<CopyOp> = all.iter().filter(|o| o.media == 2).take(blocks).copied().collect();
                let onboard: Vec<CopyOp> = all.iter().filter(|o| o.media == 1).take(blocks).copied().collect();
                for (shape, ops) in [("both_ways", both), ("offload", offload), ("onboard", onboard)] {
                    let moved = ops.len() as f64 * 32.0 * bb as f64;
                    for path in [HostCopyPath::Kernel, HostCopyPath::Staged, HostCopyPath::Auto] {
                        engine.set_host_path(path);
                        let mut t = Vec::new();
                        for rep in 0..9 {
                            let start = Instant::now();
                            let wave = gpu.prepare_wave(&engine, ops.clone())?;
                            launch_copy_wave(gpu, &engine, &wave, Some(16))?;
                            gpu.synchronize()?;
                            if rep >= 2 {
                                t.push(start.elapsed().as_secs_f64() * 1e3);
                            }
                        }
                        let ms = median(t);
                        let rate = moved / (ms * 1e-3) / 1e9;
                        println!(
                            "wave   {:<11} block {:>6} B  {:>5} MiB {:<9} {:<7} {:>9.1} us {:>6.1} GB/s (copy engines both ways {:.1})",
                            format!("{layout:?}"),
                            bb,
                            mib,
                            shape,
                            format!("{path:?}"),
                            ms * 1e3,
                            rate,
                            l.pinned_both
                        );
                        out.push(json!({"host_layout": format!("{layout:?}"), "block_bytes": bb, "regions": 32,
                            "wave_mib": mib, "shape": shape, "path": format!("{path:?}"), "ms": ms, "GBps": rate,
                            "bytes": moved}));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Replays `kvcore sim --record-copies` logs: each step's copies go
    /// through `Gpu::copy_blocks`, the engine's GPU path (planned into
    /// waves, one launch a wave, host copies by `Auto`), on pools of the
    /// log's size with `block_kib` KiB per block and region, 32 regions.
    /// Timed by the wall clock from the first step to the synchronize after
    /// the last, planning included; each log twice, interleaved.
    fn replay(
        gpu: &Arc<Gpu>,
        l: &CopyLimits,
        layout: HostLayout,
        files: &[String],
        block_kib: u64,
        paths: &[HostCopyPath],
    ) -> R<Vec<Value>> {
        use kvcore::Tier;
        use kvcore::{BlockCopy, PageRef};
        let bad = |f: &str, e: String| GpuError::InvalidArgument(format!("replay log {f}: {e}"));
        let mut logs = Vec::new();
        let mut shape = None;
        for f in files {
            let text = std::fs::read(f).map_err(|e| bad(f, e.to_string()))?;
            let doc: Value = serde_json::from_slice(&text).map_err(|e| bad(f, e.to_string()))?;
            let field = |k: &str| doc[k].as_u64().map(|v| v as u32).ok_or_else(|| bad(f, format!("no `{k}`")));
            let this = (field("block_size_tokens")?, field("blocks_device")?, field("blocks_host")?);
            if shape.is_some_and(|s| s != this) {
                return Err(bad(f, "pool shape differs from the first log's".into()));
            }
            shape = Some(this);
            let medium = |m: u64| if m == 1 { Tier::Host } else { Tier::Device };
            let steps: Vec<Vec<BlockCopy>> = serde_json::from_value::<Vec<Vec<[u64; 5]>>>(doc["steps"].clone())
                .map_err(|e| bad(f, e.to_string()))?
                .into_iter()
                .map(|step| {
                    step.into_iter()
                        .map(|c| BlockCopy {
                            src: PageRef { medium: medium(c[0]), page: c[1] as u32 },
                            dst: PageRef { medium: medium(c[2]), page: c[3] as u32 },
                            tokens: c[4] as u32,
                            group: 0,
                        })
                        .collect()
                })
                .collect();
            logs.push((f.clone(), doc["offload_first"].as_bool().unwrap_or(false), steps));
        }
        let Some((bs, blocks_device, blocks_host)) = shape else { return Ok(Vec::new()) };
        let g = BlockGeometry { regions: 32, block_bytes: block_kib << 10, planes: 2, tokens_per_block: bs };
        let tier = Arc::new(HostTier::with_layout(gpu, g, blocks_host, layout)?);
        let mut rng = StdRng::seed_from_u64(10);
        let pool_bytes = (blocks_device as u64 * 32 * g.block_bytes) as usize;
        let (mut engine, _) = device_pool(gpu, &mut rng, g, pool_bytes, Some(tier))?;
        let mut out = Vec::new();
        for (pass, path) in (0..2).flat_map(|p| paths.iter().map(move |x| (p, *x))) {
            engine.set_host_path(path);
            for (name, offload_first, steps) in &logs {
                let (mut off, mut on, mut other, mut ideal) = (0f64, 0f64, 0f64, 0f64);
                for step in steps {
                    let (mut so, mut si) = (0f64, 0f64);
                    for c in step {
                        let b = 32.0 * g.copy_bytes(c.tokens) as f64;
                        match (c.src.medium, c.dst.medium) {
                            (Tier::Device, Tier::Host) => so += b,
                            (Tier::Host, Tier::Device) => si += b,
                            _ => other += b,
                        }
                    }
                    off += so;
                    on += si;
                    // The copy engines' limits: each direction alone, and both at once.
                    ideal += (so / (l.pinned_d2h * 1e9))
                        .max(si / (l.pinned_h2d * 1e9))
                        .max((so + si) / (l.pinned_both * 1e9));
                }
                gpu.synchronize()?;
                let t0 = Instant::now();
                let mut launches = 0usize;
                for step in steps {
                    launches += gpu.copy_blocks(&engine, step)?;
                }
                gpu.synchronize()?;
                let secs = t0.elapsed().as_secs_f64();
                let rate = (off + on) / secs / 1e9;
                println!(
                    "replay {name} (offload_first {offload_first}) {path:?} pass {pass}: {} steps, {launches} launches, {:.1} GiB off + {:.1} GiB on in {:.3} s = {rate:.1} GB/s; copy-engine bound {:.3} s ({:.2} of it)",
                    steps.len(),
                    off / (1u64 << 30) as f64,
                    on / (1u64 << 30) as f64,
                    secs,
                    ideal,
                    ideal / secs
                );
                out.push(json!({"log": name, "offload_first": offload_first, "pass": pass, "path": format!("{path:?}"), "steps": steps.len(),
                    "launches": launches, "offload_bytes": off, "onboard_bytes": on, "device_bytes": other,
                    "seconds": secs, "GBps": rate, "bound_seconds": ideal, "ratio_to_bound": ideal / secs,
                    "block_bytes": g.block_bytes, "regions": 32}));
            }
        }
        Ok(out)
    }

    /// The host tier layouts of `--host-layout`.
    fn host_layouts(args: &GpuBenchArgs) -> Vec<HostLayout> {
        let layout = |l: &Layout| match l {
            Layout::Block => HostLayout::BlockMajor,
            Layout::Region => HostLayout::RegionMajor,
        };
        args.host_layout.iter().map(layout).collect()
    }

    /// Block sizes in bytes from `--blocks` (KiB), else `default_kib`.
    fn block_sizes(args: &GpuBenchArgs, default_kib: &[u64]) -> Vec<u64> {
        args.blocks.as_deref().unwrap_or(default_kib).iter().map(|k| k << 10).collect()
    }

    /// Writes the report as pretty JSON to `out_path`, when given.
    fn write_report(report: serde_json::Map<String, Value>, out_path: Option<&str>) -> R<()> {
        let text = serde_json::to_string_pretty(&Value::Object(report)).expect("a JSON value serialises");
        if let Some(p) = out_path {
            std::fs::write(p, text).map_err(|e| GpuError::InvalidArgument(format!("writing {p}: {e}")))?;
        }
        Ok(())
    }

    fn run(args: &GpuBenchArgs) -> R<()> {
        let (out_path, quick) = (args.out.as_deref(), args.quick);
        let layouts = host_layouts(args);
        let t0 = Instant::now();
        let gpu = Gpu::probe(0)?;
        gpu.warm()?;
        let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut report = serde_json::Map::new();
        report.insert("device".into(), json!(gpu.name()));
        report.insert("sm_count".into(), json!(gpu.sm_count()));
        report.insert("default_options".into(), json!(format!("{:?}", gpu.modules().options())));
        report.insert("open_compile_and_load_ms".into(), json!(compile_ms));
        let mut regs = serde_json::Map::new();
        for k in KernelId::ALL {
            match gpu.modules().function(k) {
                Ok(f) => {
                    regs.insert(k.name().into(), json!({"regs": f.num_regs()?, "local_bytes": f.local_size_bytes()?}));
                    println!("kernel {:<28} {} registers, {} B local", k.name(), f.num_regs()?, f.local_size_bytes()?);
                }
                Err(e) => {
                    println!("kernel {:<28} unavailable: {e}", k.name());
                    regs.insert(k.name().into(), json!({"error": e.to_string()}));
                }
            }
        }
        report.insert("kernels".into(), Value::Object(regs));
        println!("device {} ({} SMs), modules compiled and loaded in {compile_ms:.0} ms", gpu.name(), gpu.sm_count());

        let l = if quick { copy_limits(&gpu, 256 << 20, 128 << 20)? } else { copy_limits(&gpu, 2 << 30, 1 << 30)? };
        println!(
            "limit  device copy {:.0} GB/s (r+w) | pinned h2d {:.1} d2h {:.1} both {:.1} GB/s",
            l.device_copy, l.pinned_h2d, l.pinned_d2h, l.pinned_both
        );
        report.insert("limits".into(), serde_json::to_value(l).expect("limits serialise"));
        match args.only {
            Some(only @ (Only::Host | Only::HostExplore)) => {
                // The host tier's both-ways variants for fully scattered blocks alone.
                let sizes = block_sizes(args, &[8, 16]);
                let full = only == Only::HostExplore;
                let v = kvcore_tools::lab::host_explore::run(&gpu, &sizes, if quick { 3 } else { 7 }, full)?;
                report.insert("host_explore".into(), serde_json::to_value(v).expect("variants serialise"));
                return write_report(report, out_path);
            }
            Some(Only::HostBounce) => {
                // CPU threads gather and scatter scattered host pages through
                // pinned bounce slots; the copy engines move only whole slots.
                let pages: Vec<usize> = block_sizes(args, &[8, 16, 64]).iter().map(|b| *b as usize).collect();
                let half = if quick { 256 << 20 } else { 1 << 30 };
                let reps = if quick { 1 } else { 3 };
                let v = kvcore_tools::lab::host_bounce::run(&gpu, &pages, &[1, 2, 4, 6, 8], half, reps)?;
                report.insert("host_bounce".into(), serde_json::to_value(v).expect("cases serialise"));
                return write_report(report, out_path);
            }
            Some(Only::Replay) => {
                let files: Vec<String> = args.replay.iter().filter(|f| !f.is_empty()).cloned().collect();
                let paths: Vec<HostCopyPath> = args
                    .replay_paths
                    .iter()
                    .map(|p| match p {
                        ReplayPath::Kernel => HostCopyPath::Kernel,
                        ReplayPath::Staged => HostCopyPath::Staged,
                        ReplayPath::CopyEngines => HostCopyPath::CopyEngines,
                        ReplayPath::Auto => HostCopyPath::Auto,
                    })
                    .collect();
                let layout = *layouts.first().expect("at least one layout");
                let v = replay(&gpu, &l, layout, &files, args.replay_block_kib, &paths)?;
                report.insert("replay".into(), Value::Array(v));
                return write_report(report, out_path);
            }
            Some(Only::WaveSizes) => {
                let sizes = block_sizes(args, &[8, 64]);
                let v = wave_sizes(&gpu, &l, &layouts, &sizes, &args.wave_mib)?;
                report.insert("wave_sizes".into(), Value::Array(v));
                return write_report(report, out_path);
            }
            Some(Only::HostRuns) => {
                let sizes = block_sizes(args, &[8, 16, 64]);
                let (runs, mixed): (Vec<u32>, Vec<(u32, u32)>) = if args.runs == Some(Runs::Mixed) {
                    (vec![1, 64], vec![(64, 1), (16, 1), (8, 1), (4, 1), (1, 64), (1, 16)])
                } else {
                    (vec![1, 2, 4, 8, 16, 32, 64], vec![(64, 1), (16, 1), (1, 64)])
                };
                let v = host_runs(&gpu, &l, &layouts, &sizes, &runs, &mixed)?;
                report.insert("host_runs".into(), Value::Array(v));
                return write_report(report, out_path);
            }
            Some(Only::Blake3) | None => {}
        }

        let mut rng = StdRng::seed_from_u64(42);
        // `--digest-mib` sets the digest data (default 288 MiB, 96 images of
        // 3 MiB): the digest's throughput target holds for batches of 256 MiB
        // or more, and larger ones show how much of a launch the tail is.
        let total: usize = if quick { 63 << 20 } else { args.digest_mib.max(3) << 20 };
        let (host, data) = random_data(&gpu, &mut rng, total)?;
        let data = Arc::new(data);
        let lab = Blake3Lab::new(&gpu)?;
        report.insert("blake3".into(), Value::Array(digests(&gpu, &lab, &host, &data)?));

        if args.only == Some(Only::Blake3) {
            // A shorter run while tuning the digest kernels.
            return write_report(report, out_path);
        }
        report.insert("device_copy".into(), Value::Array(device_copies(&gpu, &l, quick)?));
        let mut hc = Vec::new();
        for path in [HostCopyPath::Kernel, HostCopyPath::CopyEngines, HostCopyPath::Staged, HostCopyPath::Auto] {
            hc.extend(host_copies(&gpu, &l, quick, &layouts, &[8 << 10, 16 << 10, 64 << 10], path, None)?);
        }
        for slot_mib in [4u64, 16] {
            let cfg = StagingConfig { slot_bytes: slot_mib << 20, ..StagingConfig::default() };
            hc.extend(host_copies(&gpu, &l, quick, &layouts, &[16 << 10], HostCopyPath::Staged, Some(cfg))?);
        }
        let cfg = StagingConfig { blocks: 4, ..StagingConfig::default() };
        hc.extend(host_copies(&gpu, &l, quick, &layouts, &[16 << 10], HostCopyPath::Staged, Some(cfg))?);
        report.insert("host_copy".into(), Value::Array(hc));

        let text = serde_json::to_string_pretty(&Value::Object(report)).expect("a JSON value serialises");
        match out_path {
            Some(p) => std::fs::write(p, text).map_err(|e| GpuError::InvalidArgument(format!("writing {p}: {e}")))?,
            None => println!("{text}"),
        }
        Ok(())
    }

    /// Runs the bench; returns the process exit code.
    pub fn run_cli(args: &GpuBenchArgs) -> i32 {
        match run(args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("gpu-bench: {e}");
                1
            }
        }
    }
}
