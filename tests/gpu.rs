//! GPU kernels against their CPU twins and the `blake3` crate.
//!
//! Tests that need a device skip themselves, saying so, where no CUDA driver
//! or device is found; the CPU-twin tests run everywhere.

use kvcore::Tier;
use kvcore::gpu::{BlockGeometry, CpuKvPool, copy_blocks_cpu, plan_copy_waves};
use kvcore::{BlockCopy, PageRef};
use rand::{Rng, RngCore, SeedableRng, rngs::StdRng};

fn page(medium: Tier, page: u32) -> PageRef {
    PageRef { medium, page }
}

fn random_pool(rng: &mut StdRng, g: &BlockGeometry, blocks: u32) -> CpuKvPool {
    let mut p = CpuKvPool::zeroed(g, blocks);
    for r in &mut p.data {
        rng.fill_bytes(r);
    }
    p
}

/// A device pool and a host tier filled with the same random bytes as their
/// CPU twins, attached as one pool.
struct Twins {
    cpu_dev: CpuKvPool,
    cpu_host: CpuKvPool,
    dev_buf: std::sync::Arc<cudarc::driver::CudaSlice<u8>>,
    tier: std::sync::Arc<kvcore::gpu::HostTier>,
    engine: kvcore::gpu::AttachedPool,
}

fn twins(gpu: &kvcore::gpu::Gpu, rng: &mut StdRng, g: BlockGeometry, dev_n: u32, host_n: u32) -> Twins {
    twins_in(gpu, rng, g, dev_n, host_n, kvcore::gpu::HostLayout::default())
}

/// As [`twins`], with the host tier in `layout`.
fn twins_in(
    gpu: &kvcore::gpu::Gpu,
    rng: &mut StdRng,
    g: BlockGeometry,
    dev_n: u32,
    host_n: u32,
    layout: kvcore::gpu::HostLayout,
) -> Twins {
    use std::sync::Arc;
    let cpu_dev = random_pool(rng, &g, dev_n);
    let cpu_host = random_pool(rng, &g, host_n);
    let dev_buf = Arc::new(gpu.stream().clone_htod(&cpu_dev.data.concat()).unwrap());
    let mut tier = kvcore::gpu::HostTier::with_layout(gpu, g, host_n, layout).unwrap();
    tier.fill_from_regions(&cpu_host.data).unwrap();
    let tier = Arc::new(tier);
    let engine = gpu.attach_in(Arc::clone(&dev_buf), g, dev_n, Some(Arc::clone(&tier))).unwrap();
    Twins { cpu_dev, cpu_host, dev_buf, tier, engine }
}

/// Waits for the stream, then checks that the device pool and the host tier
/// hold exactly what the CPU twin's pools hold (`what` names the case).
fn assert_pools_agree(
    gpu: &kvcore::gpu::Gpu,
    dev_buf: &cudarc::driver::CudaSlice<u8>,
    tier: &kvcore::gpu::HostTier,
    cpu_dev: &CpuKvPool,
    cpu_host: &CpuKvPool,
    what: &str,
) {
    gpu.synchronize().unwrap();
    let got_dev = gpu.stream().clone_dtoh(dev_buf).unwrap();
    gpu.synchronize().unwrap();
    assert!(got_dev == cpu_dev.data.concat(), "device pool differs from the CPU twin ({what})");
    assert!(tier.to_regions().unwrap() == cpu_host.data, "host tier differs from the CPU twin ({what})");
}

/// Random copies between the two tiers, full and prefix, with pages reused
/// so that chains through a page occur.
fn random_copies(rng: &mut StdRng, g: &BlockGeometry, dev: u32, host: u32, n: usize) -> Vec<BlockCopy> {
    (0..n)
        .map(|_| {
            let pick = |rng: &mut StdRng| {
                if rng.random_bool(0.5) {
                    page(Tier::Device, rng.random_range(0..dev))
                } else {
                    page(Tier::Host, rng.random_range(0..host))
                }
            };
            let tokens =
                if rng.random_bool(0.6) { g.tokens_per_block } else { rng.random_range(1..=g.tokens_per_block) };
            BlockCopy { src: pick(rng), dst: pick(rng), tokens, group: 0 }
        })
        .collect()
}

/// The straightforward meaning of a copy list: one copy after another.
fn sequential_reference(g: &BlockGeometry, dev: &mut CpuKvPool, host: &mut CpuKvPool, copies: &[BlockCopy]) {
    let bb = g.block_bytes as usize;
    let plane = g.plane_bytes() as usize;
    for c in copies {
        for r in 0..g.regions as usize {
            let src_pool = if c.src.medium == Tier::Device { &*dev } else { &*host };
            let s = c.src.page as usize * bb;
            let block = src_pool.data[r][s..s + bb].to_vec();
            let dst_pool = if c.dst.medium == Tier::Device { &mut *dev } else { &mut *host };
            let d = c.dst.page as usize * bb;
            for p in 0..g.planes as usize {
                let n =
                    if c.tokens >= g.tokens_per_block { plane } else { c.tokens as usize * g.token_bytes() as usize };
                dst_pool.data[r][d + p * plane..d + p * plane + n].copy_from_slice(&block[p * plane..p * plane + n]);
            }
        }
    }
}

/// The CPU twin (waves, each read-all-then-write-all) must give the sequential
/// meaning of any copy list, including lists that chain through pages: this
/// is what makes the wave planning safe for a concurrent kernel.
#[test]
fn copy_twin_equals_sequential_meaning() {
    let mut rng = StdRng::seed_from_u64(11);
    let g = BlockGeometry { regions: 3, block_bytes: 256, planes: 2, tokens_per_block: 8 };
    for round in 0..200 {
        let (dev_n, host_n) = (rng.random_range(2..10), rng.random_range(2..10));
        let mut dev = random_pool(&mut rng, &g, dev_n);
        let mut host = random_pool(&mut rng, &g, host_n);
        let n = rng.random_range(0..30);
        let copies = random_copies(&mut rng, &g, dev_n, host_n, n);
        let (mut dev_ref, mut host_ref) = (dev.clone(), host.clone());
        sequential_reference(&g, &mut dev_ref, &mut host_ref, &copies);
        copy_blocks_cpu(&g, &mut dev, Some(&mut host), &copies).unwrap();
        assert_eq!(dev, dev_ref, "round {round}: device pool");
        assert_eq!(host, host_ref, "round {round}: host pool");
    }
}

/// Waves never hold a page that one copy writes and another reads or writes,
/// and bad copies are refused with an error, not a panic.
#[test]
fn waves_are_conflict_free_and_bad_copies_are_refused() {
    let mut rng = StdRng::seed_from_u64(5);
    let g = BlockGeometry { regions: 1, block_bytes: 64, planes: 1, tokens_per_block: 4 };
    for _ in 0..200 {
        let copies = random_copies(&mut rng, &g, 6, 6, 40);
        let waves = plan_copy_waves(&copies, &g, 6, Some(6)).unwrap();
        for w in &waves {
            let mut written = std::collections::HashSet::new();
            let reads: std::collections::HashSet<_> = w.iter().map(|o| (o.media & 1, o.src_page)).collect();
            for o in w {
                assert!(written.insert((o.media >> 1, o.dst_page)), "a page written twice in a wave");
                assert!(!reads.contains(&(o.media >> 1, o.dst_page)), "a page read and written in a wave");
            }
        }
    }
    let full = |src, dst| BlockCopy { src, dst, tokens: 4, group: 0 };
    let g_copy = full(page(Tier::Device, 0), page(Tier::Host, 0));
    assert!(plan_copy_waves(&[g_copy], &g, 6, None).is_err(), "host copy without a host tier");
    assert!(
        plan_copy_waves(&[full(page(Tier::Device, 6), page(Tier::Device, 0))], &g, 6, None).is_err(),
        "page past the pool"
    );
    let too_many = BlockCopy { tokens: 5, ..full(page(Tier::Device, 1), page(Tier::Device, 0)) };
    assert!(plan_copy_waves(&[too_many], &g, 6, None).is_err(), "more tokens than a block");
    let bad = BlockGeometry { planes: 3, ..g };
    assert!(bad.validate().is_err(), "planes must divide the block");
}

/// An engine's GPU side with no device open refuses every GPU call with its
/// typed error and changes nothing: no pool gets attached, the step's copies
/// stay pending (and a new step's replace them), digests of no items are
/// none. Runs on any machine, with or without CUDA; the C API's statuses for
/// the same refusals are checked in src/ffi/tests.rs and ffi-tests/c/gpu.c.
#[test]
fn engine_gpu_refuses_without_an_open_gpu() {
    use kvcore::gpu::{DeviceBytes, DevicePool, EngineGpu, GpuError};
    use kvcore::{Engine, EngineConfig};
    let engine =
        Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 8, blocks_host: 4, ..Default::default() })
            .unwrap();
    let mut g = EngineGpu::new();
    let not_open = |e: &GpuError| {
        if cfg!(feature = "cuda") { matches!(e, GpuError::NotOpen) } else { matches!(e, GpuError::Unavailable(_)) }
    };
    assert!(matches!(g.copy_pending(), Err(GpuError::NotAttached)));
    // SAFETY: no item, nothing to read.
    assert!(unsafe { g.digest_device(&[]) }.unwrap().is_empty(), "no items, no digests, no device needed");
    let items = [DeviceBytes { ptr: 0x7f00_0000_1000, len: 64 }];
    // SAFETY: no device is open, so the call is refused before any address is used.
    let e = unsafe { g.digest_device(&items) }.unwrap_err();
    assert!(not_open(&e), "{e}");
    let bases = [0x7f00_0000_0000u64];
    let pool = DevicePool { region_bases: &bases, planes: 1, block_bytes: 64, blocks: 8 };
    // SAFETY: as above: refused before any address is used.
    let e = unsafe { g.attach(&engine, pool) }.unwrap_err();
    assert!(not_open(&e), "{e}");
    let copies = [
        BlockCopy { src: page(Tier::Device, 1), dst: page(Tier::Host, 0), tokens: 4, group: 0 },
        BlockCopy { src: page(Tier::Host, 2), dst: page(Tier::Device, 3), tokens: 2, group: 0 },
    ];
    g.set_pending(&copies);
    assert!(matches!(g.copy_pending(), Err(GpuError::NotAttached)));
    assert_eq!(g.pending(), &copies, "refused copies stay pending");
    g.set_pending(&copies[1..]);
    assert_eq!(g.pending(), &copies[1..], "a new step's copies replace those not performed");
    #[cfg(feature = "cuda")]
    assert!(g.gpu().is_none() && g.pool().is_none());
}

/// `EngineGpu::open` opens the device or says why not; once one is open,
/// opening it again does nothing and another ordinal is refused, and attach
/// refuses a pool whose pages are not the engine's device blocks, a region
/// at an address CUDA never allocated, and any pool once the engine has
/// admitted a request. (Without a device only the first branch runs; the C
/// API test in `c_api` covers a real pool.)
#[test]
fn engine_gpu_opens_or_says_why() {
    use kvcore::gpu::{DevicePool, EngineGpu, GpuError};
    use kvcore::{Engine, EngineConfig, RequestSpec};
    let mut engine =
        Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 8, ..Default::default() }).unwrap();
    let mut g = EngineGpu::new();
    match g.open(0) {
        Err(e) => assert!(matches!(e, GpuError::Unavailable(_)), "{e}"),
        Ok(()) => {
            g.open(0).unwrap();
            assert!(matches!(g.open(1), Err(GpuError::InvalidArgument(_))));
            let bases = [0x10u64];
            let wrong_blocks = DevicePool { region_bases: &bases, planes: 1, block_bytes: 64, blocks: 9 };
            // SAFETY: refused by the checks before any address is used.
            let e = unsafe { g.attach(&engine, wrong_blocks) }.unwrap_err();
            assert!(e.to_string().contains("device blocks"), "{e}");
            let wild = DevicePool { blocks: 8, ..wrong_blocks };
            // SAFETY: as above (the address is checked against CUDA's records).
            let e = unsafe { g.attach(&engine, wild) }.unwrap_err();
            assert!(e.to_string().contains("not in memory CUDA has allocated"), "{e}");
            engine.add_request(&RequestSpec { tokens: &[1, 2, 3, 4, 5], ..Default::default() }).unwrap();
            // SAFETY: as above.
            let e = unsafe { g.attach(&engine, wild) }.unwrap_err();
            assert!(e.to_string().contains("before the first request"), "{e}");
            #[cfg(feature = "cuda")]
            assert!(g.pool().is_none(), "a refused attach changes nothing");
        }
    }
}

/// The GPU, or `None` (and a line saying so) where there is none: the
/// device tests then pass without running.
#[cfg(feature = "cuda")]
fn gpu() -> Option<std::sync::Arc<kvcore::gpu::Gpu>> {
    match kvcore::gpu::Gpu::probe(0) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipping: no GPU ({e})");
            None
        }
    }
}

#[cfg(feature = "cuda")]
mod device {
    use super::*;
    use kvcore::gpu::{
        CopyOp, DeviceBytes, Gpu, HostCopyPath, HostLayout, HostTier, KernelId, KernelOptions, ModuleId, OneItemPath,
        StagingConfig, compile, launch_copy_wave, nvrtc_available,
    };
    use std::sync::Arc;

    /// Every kernel source compiles with NVRTC for Hopper (needs libnvrtc,
    /// not a device); skipped where libnvrtc is absent.
    #[test]
    fn kernels_compile_with_nvrtc() {
        if !nvrtc_available() {
            eprintln!("skipping: libnvrtc not found");
            return;
        }
        for m in ModuleId::ALL {
            for copy_unroll in [4, 8, 16] {
                let options = KernelOptions { copy_unroll, ..KernelOptions::default() };
                if let Err(e) = compile(m, Some("compute_90"), &options) {
                    panic!("{e}");
                }
            }
        }
        let bad = KernelOptions { copy_unroll: 0, ..KernelOptions::default() };
        assert!(compile(ModuleId::Blake3, None, &bad).is_err(), "unsupported options are refused");
        let bad = KernelOptions { copy_write_share: 16, ..KernelOptions::default() };
        assert!(
            compile(ModuleId::BlockCopy, None, &bad).is_err(),
            "a write share that leaves no read block is refused"
        );
    }

    /// BLAKE3 on the GPU equals the `blake3` crate for lengths around block,
    /// chunk, group and tree boundaries and for large random inputs, at aligned
    /// and unaligned addresses, all in one batch and one item at a time, with
    /// every BLAKE3 kernel (the four-groups-per-block one with blocks that
    /// straddle items) and every one-item path.
    #[test]
    fn digest_matches_blake3_crate() {
        let Some(gpu) = gpu() else { return };
        digest_check(&gpu, 300 << 20);
    }

    fn digest_check(gpu: &Arc<Gpu>, big: usize) {
        let mut rng = StdRng::seed_from_u64(3);
        let mut data = vec![0u8; big + 64];
        rng.fill_bytes(&mut data);
        let dev = Arc::new(gpu.stream().clone_htod(&data).unwrap());
        let mut lengths = vec![0u64, 1, 31, 32, 63, 64, 65, 127, 128, 129, 1000];
        for b in [
            1u64 << 10,
            2 << 10,
            3 << 10,
            31 << 10,
            32 << 10,
            33 << 10,
            63 << 10,
            64 << 10,
            65 << 10,
            127 << 10,
            128 << 10,
            129 << 10,
            192 << 10,
            1 << 20,
            3 << 20,
            4 << 20,
            (4 << 20) + (64 << 10),
            8 << 20,
            64 << 20,
            256 << 20,
        ] {
            lengths.extend([b - 1, b, b + 1, b + 64]);
        }
        for _ in 0..40 {
            lengths.push(rng.random_range(0..(8u64 << 20)));
        }
        lengths.retain(|l| *l <= big as u64);
        lengths.extend([(big as u64) / 3 + 5, (big as u64) - 7]);
        if big >= 256 << 20 {
            lengths.extend([256 << 20, (256 << 20) + 1]);
        }
        // Every third item starts at an odd offset, which takes the kernel's unaligned path.
        let items: Vec<(u64, u64)> = lengths
            .iter()
            .enumerate()
            .map(|(i, &len)| (if i % 3 == 0 { (i as u64 * 7) % 61 } else { 0 }, len))
            .collect();
        let mut batch = gpu.prepare_digests_in(Arc::clone(&dev), &items).unwrap();
        for variant in KernelId::BLAKE3 {
            // Launching the same batch again must work too: the kernel resets
            // its counters. The digests are zeroed first, so that a kernel
            // cannot pass on the digests of the one before.
            gpu.clear_digests(&mut batch).unwrap();
            gpu.launch_digests_with(&batch, variant).unwrap();
            let got = gpu.read_digests(&batch).unwrap();
            for ((off, len), d) in items.iter().zip(&got) {
                let want = blake3::hash(&data[*off as usize..(off + len) as usize]);
                assert_eq!(d, want.as_bytes(), "{variant:?}, batched, length {len} offset {off}");
            }
        }
        for (off, len) in items.iter().filter(|(_, len)| *len < (8 << 20)).step_by(5) {
            let one = gpu.digest_views(&[dev.slice(*off as usize..(off + len) as usize)]).unwrap();
            assert_eq!(
                &one[0],
                blake3::hash(&data[*off as usize..(off + len) as usize]).as_bytes(),
                "alone, length {len}"
            );
        }
        // Every one-item path of the one-call digest (table, by value, by
        // value with the completion flag launched directly or as a graph
        // whose grid changes with the length), aligned and not, around chunk
        // and group boundaries.
        let base = {
            use cudarc::driver::DevicePtr;
            dev.device_ptr(gpu.stream()).0
        };
        for len in [0u64, 1, 1023, 1024, 1025, 2048, 65535, 65536, 65537, (3 << 20) - 5, 3 << 20, (4 << 20) + 1024] {
            for off in [0u64, 16, 3] {
                if off + len > data.len() as u64 {
                    continue;
                }
                let want = blake3::hash(&data[off as usize..(off + len) as usize]);
                for path in
                    [OneItemPath::Table, OneItemPath::ByValue, OneItemPath::ByValueFlagLaunch, OneItemPath::ByValueFlag]
                {
                    // SAFETY: the range lies inside `dev`, alive for the call.
                    let got = unsafe { gpu.digest_device_via(&[DeviceBytes { ptr: base + off, len }], path) }.unwrap();
                    assert_eq!(&got[0], want.as_bytes(), "{path:?}, length {len} offset {off}");
                }
            }
        }
        // Several items through the reusable buffers of the one-call path,
        // after smaller and larger calls used them; then enough groups for
        // the four-groups-per-block kernel and its fold launch.
        let spans = [(0usize, 5 << 20), (7, 3000), (1 << 20, 129 << 10)];
        let views: Vec<_> = spans.iter().map(|(o, l)| dev.slice(*o..o + l)).collect();
        let several = gpu.digest_views(&views).unwrap();
        for ((o, l), d) in spans.iter().zip(&several) {
            assert_eq!(d, blake3::hash(&data[*o..o + l]).as_bytes(), "one call of several, length {l}");
        }
        let spans = [(3usize, 20 << 20), (0, 64 << 10), (5, (4 << 20) + 1), (0, 1 << 20)];
        if spans.iter().all(|(o, l)| o + l <= data.len()) {
            let views: Vec<_> = spans.iter().map(|(o, l)| dev.slice(*o..o + l)).collect();
            let many = gpu.digest_views(&views).unwrap();
            for ((o, l), d) in spans.iter().zip(&many) {
                assert_eq!(d, blake3::hash(&data[*o..o + l]).as_bytes(), "one call of several, large, length {l}");
            }
        }
        let past = gpu.prepare_digests_in(Arc::clone(&dev), &[(data.len() as u64 - 10, 11)]);
        assert!(past.is_err(), "a range past the buffer is refused");
    }

    /// Batched block copies on the GPU (full and prefix, both tiers, chained
    /// pages) leave exactly the bytes the CPU twin leaves, whichever of the
    /// kernel and the copy engines moves the host tier's bytes, with the host
    /// tier block-major (the default) or region-major.
    #[test]
    fn block_copy_matches_cpu_twin() {
        let Some(gpu) = gpu() else { return };
        let mut rng = StdRng::seed_from_u64(9);
        let geometries = [
            BlockGeometry { regions: 4, block_bytes: 8192, planes: 2, tokens_per_block: 16 },
            BlockGeometry { regions: 2, block_bytes: 96 * 3, planes: 3, tokens_per_block: 4 },
        ];
        let paths = [
            HostCopyPath::Kernel,
            HostCopyPath::CopyEngines,
            HostCopyPath::Split,
            HostCopyPath::Staged,
            HostCopyPath::Auto,
        ];
        let layouts = [HostLayout::BlockMajor, HostLayout::RegionMajor];
        let cases = geometries.iter().flat_map(|g| paths.iter().flat_map(move |p| layouts.map(|l| (*g, *p, l))));
        for (g, path, layout) in cases {
            let (dev_n, host_n) = (64u32, 48u32);
            let Twins { mut cpu_dev, mut cpu_host, dev_buf, tier, mut engine } =
                twins_in(&gpu, &mut rng, g, dev_n, host_n, layout);
            engine.set_host_path(path);
            if path == HostCopyPath::Staged {
                // Small slots: many pieces per wave, each slot reused, the
                // slots' copies on two copy-engine streams a direction.
                let cfg = StagingConfig {
                    slot_bytes: 5 * g.block_bytes,
                    slots: 3,
                    blocks: 2,
                    copy_streams: 2,
                    whole_blocks: true,
                };
                engine.set_staging(&gpu, cfg).unwrap();
            }
            for _ in 0..5 {
                let copies = random_copies(&mut rng, &g, dev_n, host_n, 300);
                gpu.copy_blocks(&engine, &copies).unwrap();
                copy_blocks_cpu(&g, &mut cpu_dev, Some(&mut cpu_host), &copies).unwrap();
            }
            assert_pools_agree(&gpu, &dev_buf, &tier, &cpu_dev, &cpu_host, &format!("{g:?}, {path:?}, {layout:?}"));
        }
    }

    /// A two-way wave of 16 MiB each way with device and host pages in
    /// random order and 256 KiB blocks (4 regions of 64 KiB): with a
    /// block-major tier every block is one host run, so `Auto` stages both
    /// directions (one copy-engine run per block, pieces of 8 MiB); with a
    /// region-major tier each (block, region) is a 64 KiB run of its own and
    /// the wave stays on the kernel. Half the size each way stays on the
    /// kernel either way. The pools end as the CPU twin leaves them.
    #[test]
    fn auto_stages_large_two_way_waves_of_a_block_major_tier() {
        let Some(gpu) = gpu() else { return };
        let mut rng = StdRng::seed_from_u64(22);
        let g = BlockGeometry { regions: 4, block_bytes: 65536, planes: 2, tokens_per_block: 16 };
        let (dev_n, host_n) = (160u32, 160u32);
        for layout in [HostLayout::BlockMajor, HostLayout::RegionMajor] {
            let Twins { mut cpu_dev, mut cpu_host, dev_buf, tier, engine } =
                twins_in(&gpu, &mut rng, g, dev_n, host_n, layout);
            use rand::seq::SliceRandom;
            let mut dev: Vec<u32> = (0..dev_n).collect();
            dev.shuffle(&mut rng);
            // Offloads into even host pages, onboards from odd ones, each in
            // random order: no two pages of a direction are neighbours.
            let mut even: Vec<u32> = (0..host_n).step_by(2).collect();
            let mut odd: Vec<u32> = (1..host_n).step_by(2).collect();
            even.shuffle(&mut rng);
            odd.shuffle(&mut rng);
            for per_way in [64usize, 32] {
                let mut copies = Vec::new();
                for i in 0..per_way {
                    copies.push(BlockCopy {
                        src: page(Tier::Device, dev[i]),
                        dst: page(Tier::Host, even[i]),
                        tokens: 16,
                        group: 0,
                    });
                    copies.push(BlockCopy {
                        src: page(Tier::Host, odd[i]),
                        dst: page(Tier::Device, dev[80 + i]),
                        tokens: 16,
                        group: 0,
                    });
                }
                let waves = plan_copy_waves(&copies, &g, dev_n, Some(host_n)).unwrap();
                assert_eq!(waves.len(), 1);
                let wave = gpu.prepare_wave(&engine, waves[0].clone()).unwrap();
                let want = if layout == HostLayout::BlockMajor && per_way == 64 { (64, 64) } else { (0, 0) };
                assert_eq!(wave.staged_runs(), want, "{layout:?}, {per_way} blocks each way");
                assert_eq!(wave.dma_runs(), (0, 0));
                launch_copy_wave(&gpu, &engine, &wave, None).unwrap();
                copy_blocks_cpu(&g, &mut cpu_dev, Some(&mut cpu_host), &copies).unwrap();
                let what = format!("{layout:?}, {per_way} each way");
                assert_pools_agree(&gpu, &dev_buf, &tier, &cpu_dev, &cpu_host, &what);
                dev.rotate_left(7);
            }
        }
    }

    /// Both ways at once with device and host pages in random order (the
    /// fully scattered wave that the automatic path leaves on the kernel):
    /// the split kernel with its default loads in flight and write share,
    /// with the even split of before, and with odd settings (one write block
    /// of 16, one read block, unrolls that divide nothing), full and prefix
    /// copies, leaves exactly the bytes the CPU twin leaves.
    #[test]
    fn split_kernel_options_match_cpu_twin() {
        use rand::seq::SliceRandom;
        if gpu().is_none() {
            return;
        }
        let mut rng = StdRng::seed_from_u64(41);
        let g = BlockGeometry { regions: 3, block_bytes: 8192, planes: 2, tokens_per_block: 16 };
        let (dev_n, host_n) = (256u32, 128u32);
        let odd = |w, r, share| KernelOptions {
            copy_unroll_write: w,
            copy_unroll_read: r,
            copy_write_share: share,
            ..KernelOptions::default()
        };
        for options in [KernelOptions::default(), KernelOptions::even_split(), odd(3, 5, 1), odd(1, 16, 15)] {
            let gpu = Gpu::probe_with(0, options).unwrap();
            let Twins { mut cpu_dev, mut cpu_host, dev_buf, tier, engine } = twins(&gpu, &mut rng, g, dev_n, host_n);
            assert_eq!(engine.host_path(), HostCopyPath::Auto);
            let mut dperm: Vec<u32> = (0..dev_n).collect();
            let mut hperm: Vec<u32> = (0..host_n).collect();
            dperm.shuffle(&mut rng);
            hperm.shuffle(&mut rng);
            let mut copies = Vec::new();
            for i in 0..64usize {
                let tokens = |rng: &mut StdRng| if rng.random_bool(0.7) { 16 } else { rng.random_range(1..16) };
                copies.push(BlockCopy {
                    src: page(Tier::Device, dperm[i]),
                    dst: page(Tier::Host, hperm[i]),
                    tokens: tokens(&mut rng),
                    group: 0,
                });
                copies.push(BlockCopy {
                    src: page(Tier::Host, hperm[64 + i]),
                    dst: page(Tier::Device, dperm[64 + i]),
                    tokens: tokens(&mut rng),
                    group: 0,
                });
            }
            let waves = kvcore::gpu::plan_copy_waves(&copies, &g, dev_n, Some(host_n)).unwrap();
            assert_eq!(waves.len(), 1, "no page is both read and written");
            let wave = gpu.prepare_wave(&engine, waves[0].clone()).unwrap();
            assert_eq!((wave.dma_runs(), wave.staged_runs()), ((0, 0), (0, 0)), "scattered pages stay on the kernel");
            launch_copy_wave(&gpu, &engine, &wave, None).unwrap();
            copy_blocks_cpu(&g, &mut cpu_dev, Some(&mut cpu_host), &copies).unwrap();
            assert_pools_agree(&gpu, &dev_buf, &tier, &cpu_dev, &cpu_host, &format!("{options:?}"));
        }
    }

    /// The automatic host path hands long in-order runs to the copy engines
    /// and short scattered ones to the kernel, and both leave the right bytes
    /// where the layout says: with a region-major tier, 40 consecutive 8 KiB
    /// pages offloaded merge into one 320 KiB run per region for the copy
    /// engine; with a block-major tier no direct run exists and the one-way
    /// wave stays on the kernel; 3 scattered pages stay on the kernel either
    /// way.
    #[test]
    fn auto_host_path_picks_by_run_length() {
        let Some(gpu) = gpu() else { return };
        let mut rng = StdRng::seed_from_u64(21);
        let g = BlockGeometry { regions: 4, block_bytes: 8192, planes: 2, tokens_per_block: 16 };
        let (dev_n, host_n) = (64u32, 48u32);
        let cpu_dev = random_pool(&mut rng, &g, dev_n);
        let dev_buf = Arc::new(gpu.stream().clone_htod(&cpu_dev.data.concat()).unwrap());
        let long: Vec<CopyOp> = (0..40).map(|i| CopyOp { src_page: i, dst_page: i, tokens: 16, media: 2 }).collect();
        let short: Vec<CopyOp> = [(50, 41), (45, 44), (60, 47)]
            .map(|(s, d)| CopyOp { src_page: s, dst_page: d, tokens: 16, media: 2 })
            .to_vec();
        for layout in [HostLayout::RegionMajor, HostLayout::BlockMajor] {
            let tier = Arc::new(HostTier::with_layout(&gpu, g, host_n, layout).unwrap());
            let engine = gpu.attach_in(Arc::clone(&dev_buf), g, dev_n, Some(Arc::clone(&tier))).unwrap();
            assert_eq!(engine.host_path(), HostCopyPath::Auto, "the automatic path is the default");
            let long_wave = gpu.prepare_wave(&engine, long.clone()).unwrap();
            let short_wave = gpu.prepare_wave(&engine, short.clone()).unwrap();
            if layout == HostLayout::RegionMajor {
                assert_eq!(long_wave.dma_runs(), (4, 0), "one merged run per region for the copy engine");
                assert_eq!(long_wave.staged_runs(), (0, 0));
            } else {
                // A block's regions are not consecutive on the device, so no
                // direct run; a one-way wave stays on the kernel.
                assert_eq!(long_wave.dma_runs(), (0, 0));
                assert_eq!(long_wave.staged_runs(), (0, 0), "one way: the kernel");
            }
            assert_eq!(short_wave.dma_runs(), (0, 0), "short runs stay on the kernel");
            assert_eq!(short_wave.staged_runs(), (0, 0), "32 KiB blocks alone stay on the kernel");
            launch_copy_wave(&gpu, &engine, &long_wave, None).unwrap();
            launch_copy_wave(&gpu, &engine, &short_wave, None).unwrap();
            gpu.synchronize().unwrap();
            let host = tier.bytes().unwrap();
            let bb = g.block_bytes as usize;
            for op in long.iter().chain(&short) {
                for r in 0..g.regions as usize {
                    let h = tier.offset(r, op.dst_page);
                    let want = match layout {
                        HostLayout::RegionMajor => r * host_n as usize * bb + op.dst_page as usize * bb,
                        HostLayout::BlockMajor => (op.dst_page as usize * g.regions as usize + r) * bb,
                    };
                    assert_eq!(h, want, "{layout:?}: where page {} of region {r} lives", op.dst_page);
                    let d = op.src_page as usize * bb;
                    assert!(
                        host[h..h + bb] == cpu_dev.data[r][d..d + bb],
                        "{layout:?}: page {} region {r}",
                        op.src_page
                    );
                }
            }
        }
    }
}

#[cfg(feature = "cuda")]
mod staged {
    use super::*;
    use kvcore::gpu::{CopyOp, HostCopyPath, HostLayout, StagingConfig, launch_copy_wave};
    use rand::seq::SliceRandom;

    /// Offload and onboard at once with device pages in random order and
    /// host pages in order: the automatic path takes the staged copy engines
    /// (one host run per region and direction with a region-major tier, one
    /// per direction with a block-major one), and both pools end exactly as
    /// the CPU twin leaves them; the same kind of wave forced through small
    /// slots (many pieces, slots reused) agrees too.
    #[test]
    fn staged_path_scatters_device_pages_bit_exactly() {
        let Some(gpu) = gpu() else { return };
        let mut rng = StdRng::seed_from_u64(31);
        let g = BlockGeometry { regions: 3, block_bytes: 16384, planes: 2, tokens_per_block: 16 };
        let (dev_n, host_n) = (256u32, 128u32);
        let cases = [8u64 << 20, 7 * 16384]
            .into_iter()
            .flat_map(|s| [HostLayout::RegionMajor, HostLayout::BlockMajor].map(|l| (s, l)));
        for (slot_bytes, layout) in cases {
            let Twins { mut cpu_dev, mut cpu_host, dev_buf, tier, mut engine } =
                twins_in(&gpu, &mut rng, g, dev_n, host_n, layout);
            for copy_streams in [0, 5] {
                let bad = StagingConfig { copy_streams, ..StagingConfig::default() };
                assert!(engine.set_staging(&gpu, bad).is_err(), "{copy_streams} copy streams are refused");
                assert_eq!(engine.staging(), Some(StagingConfig::default()), "a refused configuration changes nothing");
            }
            let copy_streams = if slot_bytes == 8 << 20 { 1 } else { 3 };
            engine
                .set_staging(&gpu, StagingConfig { slot_bytes, slots: 2, blocks: 4, copy_streams, whole_blocks: true })
                .unwrap();
            // 3 MiB each way is below `Auto`'s size for the staged path.
            let auto = slot_bytes == 8 << 20;
            engine.set_host_path(HostCopyPath::Staged);
            let mut perm: Vec<u32> = (0..dev_n).collect();
            perm.shuffle(&mut rng);
            // Offload 64 device pages to host pages 0..64; onboard host pages 64..128 to 64 others.
            let mut copies = Vec::new();
            for i in 0..64u32 {
                copies.push(BlockCopy {
                    src: page(Tier::Device, perm[i as usize]),
                    dst: page(Tier::Host, i),
                    tokens: 16,
                    group: 0,
                });
                copies.push(BlockCopy {
                    src: page(Tier::Host, 64 + i),
                    dst: page(Tier::Device, perm[64 + i as usize]),
                    tokens: 16,
                    group: 0,
                });
            }
            let waves = kvcore::gpu::plan_copy_waves(&copies, &g, dev_n, Some(host_n)).unwrap();
            assert_eq!(waves.len(), 1, "no page is both read and written");
            let ops: Vec<CopyOp> = waves[0].clone();
            let wave = gpu.prepare_wave(&engine, ops).unwrap();
            let (o, i) = wave.staged_runs();
            assert!(o > 0 && i > 0, "the staged copy engines move both directions ({o}, {i})");
            assert_eq!(wave.dma_runs(), (0, 0), "no direct copy-engine runs");
            match (auto, layout) {
                (true, HostLayout::RegionMajor) => {
                    assert_eq!((o, i), (3, 3), "one run of 64 host pages per region and direction");
                }
                (true, HostLayout::BlockMajor) => {
                    assert_eq!((o, i), (1, 1), "one run of 64 host pages (all regions) per direction");
                }
                (false, HostLayout::RegionMajor) => assert!(o >= 3 * 64 / 7, "pieces of 7 pages ({o} runs)"),
                (false, HostLayout::BlockMajor) => {
                    // Whole blocks of 3 x 16 KiB: two fit in a slot of 112 KiB.
                    assert_eq!((o, i), (32, 32), "pieces of 2 whole blocks, one host run each");
                }
            }
            launch_copy_wave(&gpu, &engine, &wave, None).unwrap();
            copy_blocks_cpu(&g, &mut cpu_dev, Some(&mut cpu_host), &copies).unwrap();
            assert_pools_agree(&gpu, &dev_buf, &tier, &cpu_dev, &cpu_host, &format!("slot {slot_bytes}, {layout:?}"));
        }
    }

    /// Waves whose directions have different host runs: offloads into
    /// consecutive host pages with onboards from scattered ones (every other
    /// page, whole 64 KiB blocks), the reverse, and the scattered onboards
    /// alone. With a region-major tier `Auto` keeps all three on the kernel;
    /// the staged path, forced, moves the first with one run a region out
    /// and one a page and region in, on two copy-engine streams a direction.
    /// With a block-major tier a scattered page is one 192 KiB run, and the
    /// forced staged path moves one run per page (or one for all the
    /// consecutive ones); `Auto` keeps these 6 MiB waves on the kernel with
    /// either layout. Both pools end exactly as the CPU twin leaves them
    /// every time.
    #[test]
    fn mixed_run_waves_agree_on_every_path() {
        let Some(gpu) = gpu() else { return };
        let mut rng = StdRng::seed_from_u64(33);
        let g = BlockGeometry { regions: 3, block_bytes: 65536, planes: 2, tokens_per_block: 16 };
        let (dev_n, host_n) = (128u32, 128u32);
        // (long offloads, with offloads): the wave's shape.
        let shapes = [(true, true), (false, true), (true, false)];
        let layouts = [HostLayout::RegionMajor, HostLayout::BlockMajor];
        let cases = shapes.into_iter().flat_map(|s| {
            [HostCopyPath::Auto, HostCopyPath::Staged].into_iter().flat_map(move |p| layouts.map(|l| (s, p, l)))
        });
        for ((long_offload, with_offloads), path, layout) in cases {
            let Twins { mut cpu_dev, mut cpu_host, dev_buf, tier, mut engine } =
                twins_in(&gpu, &mut rng, g, dev_n, host_n, layout);
            engine.set_host_path(path);
            if path == HostCopyPath::Staged {
                let cfg = StagingConfig { slots: 4, copy_streams: 2, ..StagingConfig::default() };
                engine.set_staging(&gpu, cfg).unwrap();
            }
            let mut perm: Vec<u32> = (0..dev_n).collect();
            perm.shuffle(&mut rng);
            // 32 consecutive host pages (one 2 MiB run a region) and 32
            // scattered ones (64 KiB runs).
            let consecutive: Vec<u32> = (0..32).collect();
            let mut scattered: Vec<u32> = (0..32).map(|i| 40 + 2 * i).collect();
            scattered.shuffle(&mut rng);
            let (out_pages, in_pages) =
                if long_offload { (&consecutive, &scattered) } else { (&scattered, &consecutive) };
            let mut copies = Vec::new();
            for i in 0..32usize {
                if with_offloads {
                    copies.push(BlockCopy {
                        src: page(Tier::Device, perm[i]),
                        dst: page(Tier::Host, out_pages[i]),
                        tokens: 16,
                        group: 0,
                    });
                }
                copies.push(BlockCopy {
                    src: page(Tier::Host, in_pages[i]),
                    dst: page(Tier::Device, perm[64 + i]),
                    tokens: 16,
                    group: 0,
                });
            }
            let waves = kvcore::gpu::plan_copy_waves(&copies, &g, dev_n, Some(host_n)).unwrap();
            assert_eq!(waves.len(), 1, "no page is both read and written");
            let wave = gpu.prepare_wave(&engine, waves[0].clone()).unwrap();
            let want = match (layout, path, long_offload, with_offloads) {
                // 6 MiB a direction: below `Auto`'s size for the staged path.
                (_, HostCopyPath::Auto, ..) => (0, 0),
                (HostLayout::RegionMajor, _, true, true) => (3, 96),
                (HostLayout::RegionMajor, _, false, true) => (96, 3),
                (HostLayout::RegionMajor, ..) => (0, 3 * 32),
                (HostLayout::BlockMajor, _, true, true) => (1, 32),
                (HostLayout::BlockMajor, _, false, true) => (32, 1),
                (HostLayout::BlockMajor, ..) => (0, 32),
            };
            let what = format!("{path:?}, {layout:?}, long offloads {long_offload}, offloads {with_offloads}");
            assert_eq!(wave.staged_runs(), want, "staged runs ({what})");
            assert_eq!(wave.dma_runs(), (0, 0), "no direct copy-engine runs");
            launch_copy_wave(&gpu, &engine, &wave, None).unwrap();
            copy_blocks_cpu(&g, &mut cpu_dev, Some(&mut cpu_host), &copies).unwrap();
            assert_pools_agree(&gpu, &dev_buf, &tier, &cpu_dev, &cpu_host, &what);
        }
    }
}

/// The GPU path through the C API, as a C++ serving stack drives it: open
/// the device, attach a pool the test allocates, serve prompts so that
/// blocks are offloaded, onboarded and partly reused, with
/// `kvc_engine_copy_blocks` doing the copies; hash device-resident images.
#[cfg(feature = "cuda")]
mod c_api {
    use super::*;
    use kvcore::ffi::*;
    use std::mem::MaybeUninit;
    use std::ptr;

    const TOKENS: u32 = 16;
    const PLANES: u32 = 2;
    const TOKEN_BYTES: usize = 32;
    const REGIONS: u32 = 4;
    const DEV_BLOCKS: u32 = 8;
    const BLOCK_BYTES: usize = PLANES as usize * TOKENS as usize * TOKEN_BYTES;

    fn engine(blocks_host: u32) -> *mut kvc_engine {
        let mut c = MaybeUninit::<kvc_config>::uninit();
        // SAFETY: `c` is writable; it is read only after the successful call.
        let mut c = unsafe {
            assert_eq!(kvc_config_default(c.as_mut_ptr()), kvc_status::Ok);
            c.assume_init()
        };
        c.block_size_tokens = TOKENS;
        c.blocks_device = DEV_BLOCKS;
        c.blocks_host = blocks_host;
        c.partial_reuse = true;
        let mut e = ptr::null_mut();
        // SAFETY: a valid config with NULL strings; `e` writable.
        assert_eq!(unsafe { kvc_engine_new(&c, &mut e) }, kvc_status::Ok);
        e
    }

    fn message(e: *mut kvc_engine) -> String {
        let mut buf = [0 as std::ffi::c_char; 512];
        let mut n = 0usize;
        // SAFETY: live engine, 512 writable bytes, `n` writable.
        unsafe { kvc_engine_last_error(e, buf.as_mut_ptr(), buf.len(), &mut n) };
        buf[..n].iter().map(|c| *c as u8 as char).collect()
    }

    fn request(tokens: &[u32], items: &[kvc_image_item], uuids: &[kvc_bytes]) -> kvc_request {
        kvc_request {
            tokens: tokens.as_ptr(),
            tokens_len: tokens.len(),
            lora_id: 0,
            has_lora_id: false,
            dummy: false,
            lora_name: kvc_bytes { ptr: ptr::null(), len: 0 },
            cache_salt: kvc_bytes { ptr: ptr::null(), len: 0 },
            items: items.as_ptr(),
            items_len: items.len(),
            uuids: if uuids.is_empty() { ptr::null() } else { uuids.as_ptr() },
            uuids_len: uuids.len(),
        }
    }

    /// The KV a forward pass would write for the last token of `prefix` in
    /// one plane of one region: a function of the whole prefix, so that a
    /// page holds the right bytes only if it came from the same prefix.
    fn token_kv(prefix: &[u32], region: u32, plane: u32) -> [u8; TOKEN_BYTES] {
        let mut h = blake3::Hasher::new();
        h.update(bytemuck::cast_slice(prefix));
        h.update(&[region as u8, plane as u8]);
        *h.finalize().as_bytes()
    }

    fn token_at(pool: &mut [u8], page: u32, pos: usize, region: u32, plane: u32) -> &mut [u8] {
        let region_bytes = DEV_BLOCKS as usize * BLOCK_BYTES;
        let at = region as usize * region_bytes
            + page as usize * BLOCK_BYTES
            + plane as usize * (TOKENS as usize * TOKEN_BYTES)
            + (pos % TOKENS as usize) * TOKEN_BYTES;
        &mut pool[at..at + TOKEN_BYTES]
    }

    /// Serves 60 prompts one after another (fresh documents, repeats, and
    /// shared prefixes that end inside a block) on an engine of 8 device
    /// and 16 host blocks with a pool attached. After each step's
    /// `kvc_engine_copy_blocks`, every token the engine reports as cached
    /// must hold, in every region and plane, the KV its own prefix
    /// produced: whether the block stayed, came back from the host tier
    /// (offload then onboard, by kvcore's copies) or had its leading tokens
    /// copied in (partial reuse). The "forward pass" writes the rest.
    #[test]
    fn pool_serves_prefixes_through_offload_onboard_and_partial_reuse() {
        let Some(gpu) = gpu() else { return };
        let e = engine(16);
        let pool_buf = gpu.stream().alloc_zeros::<u8>(REGIONS as usize * DEV_BLOCKS as usize * BLOCK_BYTES).unwrap();
        let base = {
            use cudarc::driver::DevicePtr;
            pool_buf.device_ptr(gpu.stream()).0
        };
        let bases: Vec<u64> =
            (0..REGIONS as u64).map(|r| base + r * (DEV_BLOCKS as u64 * BLOCK_BYTES as u64)).collect();
        let pool = kvc_kv_pool {
            region_bases: bases.as_ptr(),
            regions: REGIONS,
            planes: PLANES,
            block_bytes: BLOCK_BYTES as u64,
            blocks: DEV_BLOCKS,
            reserved: 0,
        };
        let mut pool_buf = pool_buf;
        let mut rng = StdRng::seed_from_u64(61);
        let docs: Vec<Vec<u32>> = (0..6).map(|_| (0..48).map(|_| rng.random_range(1..5000)).collect()).collect();
        let mut launches_total = 0usize;
        let mut cached_checked = 0usize;
        // SAFETY: live engine; every pointer passed is valid for its call;
        // the pool buffer outlives the engine (freed at the end, after it).
        unsafe {
            let bad = kvc_kv_pool { blocks: DEV_BLOCKS + 1, ..pool };
            assert_eq!(kvc_engine_attach_kv_pool(e, &pool), kvc_status::GpuUnavailable, "no GPU open yet");
            assert_eq!(kvc_engine_gpu_open(e, 0), kvc_status::Ok, "{}", message(e));
            assert_eq!(kvc_engine_attach_kv_pool(e, &bad), kvc_status::InvalidArgument);
            let wild = [0x10u64, base, base + 8192, base + 16384];
            let off = kvc_kv_pool { region_bases: wild.as_ptr(), ..pool };
            assert_eq!(kvc_engine_attach_kv_pool(e, &off), kvc_status::InvalidArgument, "a region at 0x10");
            let past = [base, base + 8192, base + 16384, base + 24576 + 64];
            let off = kvc_kv_pool { region_bases: past.as_ptr(), ..pool };
            assert_eq!(kvc_engine_attach_kv_pool(e, &off), kvc_status::InvalidArgument, "past the allocation");
            assert!(message(e).contains("pass the end"), "{}", message(e));
            let overlap = [base, base + 4096, base + 16384, base + 24576];
            let off = kvc_kv_pool { region_bases: overlap.as_ptr(), ..pool };
            assert_eq!(kvc_engine_attach_kv_pool(e, &off), kvc_status::InvalidArgument, "overlapping regions");
            assert_eq!(kvc_engine_attach_kv_pool(e, &pool), kvc_status::Ok, "{}", message(e));
            assert_eq!(kvc_engine_attach_kv_pool(e, &pool), kvc_status::InvalidArgument, "attached twice");
            for i in 0..60 {
                let doc = &docs[rng.random_range(0..docs.len())];
                let tokens: Vec<u32> = match i % 3 {
                    0 => doc.clone(),
                    // A shared prefix that ends inside a block, then a new tail.
                    1 => {
                        let keep = rng.random_range(17..40);
                        doc[..keep].iter().copied().chain((0..20).map(|_| rng.random_range(1..5000))).collect()
                    }
                    _ => doc[..rng.random_range(20..48)].to_vec(),
                };
                let mut adm = MaybeUninit::<kvc_admission>::uninit();
                let st = kvc_engine_add_request(e, &request(&tokens, &[], &[]), adm.as_mut_ptr());
                assert_eq!(st, kvc_status::Ok, "request {i}: {}", message(e));
                let adm = adm.assume_init();
                let (mut n, mut launches) = (0usize, 0usize);
                assert_eq!(kvc_engine_step(e, &mut n), kvc_status::Ok);
                assert_eq!(kvc_engine_copy_blocks(e, &mut launches), kvc_status::Ok, "{}", message(e));
                launches_total += launches;
                let mut again = 7usize;
                assert_eq!(kvc_engine_copy_blocks(e, &mut again), kvc_status::Ok);
                assert_eq!(again, 0, "a step's copies run once");
                let mut pages = vec![0u32; 8];
                assert_eq!(
                    kvc_engine_block_table(e, adm.request_id, pages.as_mut_ptr(), pages.len(), &mut n),
                    kvc_status::Ok
                );
                pages.truncate(n);
                let mut host = gpu.stream().clone_dtoh(&pool_buf).unwrap();
                gpu.synchronize().unwrap();
                for pos in 0..tokens.len() {
                    let page = pages[pos / TOKENS as usize];
                    for r in 0..REGIONS {
                        for p in 0..PLANES {
                            let want = token_kv(&tokens[..=pos], r, p);
                            let slot = token_at(&mut host, page, pos, r, p);
                            if pos < adm.tokens_cached as usize {
                                assert!(
                                    slot == want,
                                    "request {i}: cached token {pos} (page {page}, region {r}, plane {p})"
                                );
                                cached_checked += 1;
                            } else {
                                slot.copy_from_slice(&want);
                            }
                        }
                    }
                }
                gpu.stream().memcpy_htod(&host, &mut pool_buf).unwrap();
                gpu.synchronize().unwrap();
                assert_eq!(kvc_engine_commit(e, adm.request_id, tokens.len() as u64), kvc_status::Ok);
                assert_eq!(kvc_engine_finish(e, adm.request_id), kvc_status::Ok);
            }
            let mut c = MaybeUninit::<kvc_counters>::uninit();
            assert_eq!(kvc_engine_counters(e, c.as_mut_ptr()), kvc_status::Ok);
            let c = c.assume_init();
            eprintln!(
                "offloaded {}, onboarded {}, partially reused {}, launches {launches_total}, cached token slots checked {cached_checked}",
                c.blocks_offloaded, c.blocks_onboarded, c.blocks_partially_reused
            );
            assert!(c.blocks_offloaded > 0 && c.blocks_onboarded > 0 && c.blocks_partially_reused > 0, "{c:?}");
            assert!(launches_total > 0 && cached_checked > 0);
            kvc_engine_free(e);
        }
    }

    /// `kvc_engine_digest_device` equals the `blake3` crate for lengths
    /// around chunk boundaries at odd offsets, refuses ranges outside CUDA's
    /// allocations and mapped host memory without harming the context, and an image item given by
    /// device address keys blocks exactly as the same bytes given from host
    /// memory do, while other pixels under the same UUID reuse nothing.
    #[test]
    fn device_images_hash_like_host_bytes() {
        let Some(gpu) = gpu() else { return };
        let mut rng = StdRng::seed_from_u64(62);
        let mut data = vec![0u8; 5 << 20];
        rng.fill_bytes(&mut data);
        let buf = gpu.stream().clone_htod(&data).unwrap();
        gpu.synchronize().unwrap();
        let base = {
            use cudarc::driver::DevicePtr;
            buf.device_ptr(gpu.stream()).0
        };
        let spans: [(u64, u64); 6] = [(0, 0), (1, 1023), (5, 1024), (16, 1025), (4096, 3 << 20), (7, (5 << 20) - 7)];
        let items: Vec<kvc_device_bytes> =
            spans.iter().map(|(o, l)| kvc_device_bytes { ptr: base + o, len: *l }).collect();
        let e = engine(0);
        let mut out = vec![0u8; 32 * items.len()];
        // SAFETY: live engine; `items` and `out` valid for their lengths; the
        // device buffer lives past every call.
        unsafe {
            assert_eq!(kvc_engine_gpu_open(e, 0), kvc_status::Ok, "{}", message(e));
            let st = kvc_engine_digest_device(e, items.as_ptr(), items.len(), out.as_mut_ptr(), out.len());
            assert_eq!(st, kvc_status::Ok, "{}", message(e));
            for (k, (o, l)) in spans.iter().enumerate() {
                let want = blake3::hash(&data[*o as usize..(*o + *l) as usize]);
                assert_eq!(&out[32 * k..32 * k + 32], want.as_bytes(), "offset {o} length {l}");
            }
            for bad in
                [kvc_device_bytes { ptr: 0x10, len: 16 }, kvc_device_bytes { ptr: base + (5 << 20) - 8, len: 16 }]
            {
                let mut d = [0xEEu8; 32];
                assert_eq!(kvc_engine_digest_device(e, &bad, 1, d.as_mut_ptr(), 32), kvc_status::InvalidArgument);
                assert!(d.iter().all(|b| *b == 0xEE));
            }
            // Mapped pinned host memory is CUDA's too, but not device memory.
            let g1 = BlockGeometry { regions: 1, block_bytes: 4096, planes: 1, tokens_per_block: 1 };
            let pinned = kvcore::gpu::HostTier::new(&gpu, g1, 4).unwrap();
            let host_mapped = kvc_device_bytes { ptr: pinned.pool().region_bases[0], len: 64 };
            let mut d = [0u8; 32];
            assert_eq!(kvc_engine_digest_device(e, &host_mapped, 1, d.as_mut_ptr(), 32), kvc_status::InvalidArgument);
            assert!(message(e).contains("not device memory"), "{}", message(e));
            let st = kvc_engine_digest_device(e, items.as_ptr(), 2, out.as_mut_ptr(), 64);
            assert_eq!(st, kvc_status::Ok, "the context survives refused ranges: {}", message(e));
        }
        // One image at tokens 4..36 of a 64-token prompt (blocks of 16).
        let placeholder = 151_655u32;
        let tokens: Vec<u32> = (0..64).map(|i| if (4..36).contains(&i) { placeholder } else { 100 + i }).collect();
        let runs = [kvc_token_run { start: 4, len: 32 }];
        let uuid = b"img-1";
        let uuids = [kvc_bytes { ptr: uuid.as_ptr(), len: uuid.len() }];
        let pixels = &data[4096..4096 + (3 << 20)];
        let item = |kind: kvc_image_content, content: *const u8| kvc_image_item {
            content_kind: kind as u32,
            content,
            content_len: pixels.len(),
            runs: runs.as_ptr(),
            runs_len: 1,
        };
        let serve = |e: *mut kvc_engine, it: kvc_image_item| -> (u32, Vec<[u8; 32]>) {
            let mut adm = MaybeUninit::<kvc_admission>::uninit();
            let mut records = vec![bytemuck::Zeroable::zeroed(); 16];
            let (mut n, mut copies) = (0usize, 0usize);
            // SAFETY: live engine; the request's pointers live for the call.
            unsafe {
                let st = kvc_engine_add_request(e, &request(&tokens, &[it], &uuids), adm.as_mut_ptr());
                assert_eq!(st, kvc_status::Ok, "{}", message(e));
                let adm = adm.assume_init();
                assert_eq!(kvc_engine_commit(e, adm.request_id, tokens.len() as u64), kvc_status::Ok);
                assert_eq!(kvc_engine_finish(e, adm.request_id), kvc_status::Ok);
                assert_eq!(kvc_engine_step(e, &mut copies), kvc_status::Ok);
                let st = kvc_engine_drain_events(e, records.as_mut_ptr(), records.len(), &mut n);
                assert_eq!(st, kvc_status::Ok);
                let records: &[kvc_event] = &records[..n];
                let stored = records.iter().filter(|r| r.kind == kvc_event_kind::BlockStored as u32);
                (adm.tokens_cached, stored.map(|r| r.block_key).collect())
            }
        };
        let host_engine = engine(0);
        let (_, host_keys) = serve(host_engine, item(kvc_image_content::Bytes, pixels.as_ptr()));
        let (cached, device_keys) = serve(e, item(kvc_image_content::Device, (base + 4096) as usize as *const u8));
        assert_eq!(cached, 0);
        assert_eq!(host_keys.len(), 4);
        assert_eq!(device_keys, host_keys, "a device item keys blocks like its bytes from host memory");
        let (cached, _) = serve(e, item(kvc_image_content::Device, (base + 4096) as usize as *const u8));
        // Three whole blocks, and 15 tokens of the last by partial reuse (at
        // least one prompt token is always computed).
        assert_eq!(cached, 63, "the same pixels again: every prompt token but the last is reused");
        let (cached, other_keys) = serve(e, item(kvc_image_content::Device, (base + 4097) as usize as *const u8));
        assert_eq!(cached, 4, "other pixels under the same UUID: only the 4 text tokens before the image are reused");
        assert!(other_keys.iter().all(|k| !host_keys.contains(k)));
        // SAFETY: both from kvc_engine_new, freed once.
        unsafe {
            kvc_engine_free(e);
            kvc_engine_free(host_engine);
        }
    }
}
