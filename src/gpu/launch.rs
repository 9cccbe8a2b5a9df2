//! One typed wrapper per kernel. Each checks, with asserts, everything the
//! kernel relies on that the host can see, then makes the single `unsafe`
//! launch; its `SAFETY` comment argues from those asserts and from the
//! invariant of the structure it takes (established by an `unsafe`
//! constructor whose contract covers what the host cannot check: that caller
//! addresses name live device memory).

use cudarc::driver::{CudaStream, DevicePtr, LaunchConfig, PushKernelArg};

use super::attached_pool::AttachedPool;
use super::device::Gpu;
use super::digest::groups_of_len;
use super::digest_batch::{DigestBatch, assert_whole};
use super::error::GpuError;
use super::kernels::KernelId;
use super::one_item::{OneArgs, OneGraph, launch_one};
use super::wave::CopyWave;

/// `blake3_digest_latency` / `_throughput` / `_pair` / `_multi`
/// `(const Blake3Item* items, u32 n_items, u32* cvs, u32* counters, u32
/// one)`: a whole digest batch in one launch (two for `_multi`, see
/// below), one block per group of 64
/// chunks (64 threads, or 32 for the pair kernel, two chunks each) or per
/// four groups (`_multi`: 128 threads, two chunks each, followed, when some
/// item has several groups, by the fold launch `blake3_fold_sets`);
/// `variant` is one of the BLAKE3 kernels.
///
/// Preconditions: the device table equals the host table, groups are
/// numbered consecutively, outputs and scratch ranges (values and counters,
/// counters zero) lie inside the batch's buffers (asserted by
/// `check_digest_batch` when the batch was made; the sizes are asserted
/// again here). The kernel leaves the counters zero again, so a batch can be
/// launched repeatedly.
pub(super) fn blake3_digest(gpu: &Gpu, batch: &DigestBatch, variant: KernelId) -> Result<(), GpuError> {
    assert_whole(batch);
    assert!(KernelId::BLAKE3.contains(&variant), "a BLAKE3 kernel has the BLAKE3 signature");
    let f = gpu.function(variant)?;
    let stream = gpu.stream();
    let n_items = batch.table.len() as u32;
    let one = 1u32;
    let grid = batch.groups.div_ceil(variant.blake3_groups_per_block());
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (variant.blake3_block(), 1, 1), shared_mem_bytes: 0 };
    let mut b = stream.launch_builder(&f);
    b.arg(&batch.table_dev).arg(&n_items).arg(&batch.cvs).arg(&batch.counters).arg(&one);
    // SAFETY: the argument list matches the .cu signature (pointer, u32,
    // pointer, pointer, u32). The batch invariant shows every group finds its
    // item (a four-group block skips groups past the table's last one),
    // reads the item's chunks only below its `len` (kernel bounds), and
    // writes only its own 32 output bytes and its item's scratch ranges, all
    // inside buffers the batch owns. Item addresses are valid device memory by
    // the contract of `Gpu::prepare_digests`, the only constructor of a batch.
    unsafe { b.launch(cfg) }?;
    if variant == KernelId::Blake3Multi && batch.sets {
        let stream = gpu.stream();
        let (table, _t) = batch.table_dev.device_ptr(stream);
        let (values, _v) = batch.cvs.device_ptr(stream);
        let (counters, _c) = batch.counters.device_ptr(stream);
        // SAFETY: the batch's own table and scratch (its invariant, as
        // argued above), and the chunk launch of them was just enqueued
        // before it on the stream.
        unsafe { fold_sets_raw(gpu, table, n_items, values, counters, batch.groups, true) }?;
    }
    Ok(())
}

/// The fold launch after `blake3_digest_multi` (`blake3_fold_sets`, same
/// signature): one warp per 32 groups, in blocks of 128 threads. With
/// `programmatic`, launched with programmatic stream serialization (the
/// kernel waits for the chunk launch itself, after searching the table), so
/// that its blocks can be scheduled while the chunk launch drains.
///
/// # Safety
/// As [`blake3_digest_raw`], and the chunk launch of the same table and
/// scratch (`blake3_digest_multi`) must be the work before it on the stream.
pub(super) unsafe fn fold_sets_raw(
    gpu: &Gpu,
    table: u64,
    n_items: u32,
    values: u64,
    counters: u64,
    groups: u32,
    programmatic: bool,
) -> Result<(), GpuError> {
    use cudarc::driver::sys;
    assert!(n_items > 0 && groups >= 1 && groups <= i32::MAX as u32, "a batch has items and its grid fits");
    let f = gpu.function(KernelId::Blake3FoldSets)?;
    let block = KernelId::Blake3FoldSets.blake3_block();
    let grid = groups.div_ceil(block);
    let one = 1u32;
    let (mut t, mut n, mut v, mut c, mut o) = (table, n_items, values, counters, one);
    let mut params: [*mut std::ffi::c_void; 5] = [
        (&mut t as *mut u64).cast(),
        (&mut n as *mut u32).cast(),
        (&mut v as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut o as *mut u32).cast(),
    ];
    // SAFETY: a plain-old-data C struct, all zeroes a valid value.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: gpu.stream().cu_stream(),
        attrs: &mut attr,
        numAttrs: u32::from(programmatic),
    };
    // SAFETY: each parameter points to a local of the type of the kernel
    // parameter at its position (pointers as 64-bit values), alive for the
    // call (the driver copies them); the attribute outlives the call; what
    // the pointers name is valid by this function's contract, and the kernel
    // reads the table, reads and writes its items' scratch ranges and writes
    // their 32 output bytes only.
    unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }.result()?;
    Ok(())
}

/// The launch of [`blake3_digest`] on raw device addresses (the reusable
/// arena of `Gpu::digest_device`).
///
/// # Safety
/// `table` must hold `n_items` items, built by `build_table` for outputs
/// inside live device memory and checked by `check_table` against the
/// `values` and `counters` buffers (`counters` zero), with every item's
/// bytes readable device memory; all of it must stay valid until the launch
/// completes. `sets` says whether some item has several groups: then
/// `blake3_digest_multi` is followed by the fold launch ([`fold_sets_raw`]).
#[allow(clippy::too_many_arguments, reason = "raw addresses of one batch, as the kernel takes them")]
pub(super) unsafe fn blake3_digest_raw(
    gpu: &Gpu,
    table: u64,
    n_items: u32,
    values: u64,
    counters: u64,
    groups: u32,
    variant: KernelId,
    sets: bool,
) -> Result<(), GpuError> {
    assert!(n_items > 0 && groups >= 1 && groups <= i32::MAX as u32, "a batch has items and its grid fits");
    assert!(KernelId::BLAKE3.contains(&variant), "a BLAKE3 kernel has the BLAKE3 signature");
    let f = gpu.function(variant)?;
    let one = 1u32;
    let grid = groups.div_ceil(variant.blake3_groups_per_block());
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (variant.blake3_block(), 1, 1), shared_mem_bytes: 0 };
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&table).arg(&n_items).arg(&values).arg(&counters).arg(&one);
    // SAFETY: pointers are passed as 64-bit values, which is how the kernel
    // receives its pointer parameters; what they point to is valid by this
    // function's contract, and the kernel stays inside it as argued in
    // `blake3_digest`.
    unsafe { b.launch(cfg) }?;
    if variant == KernelId::Blake3Multi && sets {
        // SAFETY: this function's contract, and the chunk launch of the same
        // table and scratch was just enqueued before it on the stream.
        unsafe { fold_sets_raw(gpu, table, n_items, values, counters, groups, true) }?;
    }
    Ok(())
}

/// `blake3_digest_one_flag(u64 data, u64 len, u64 out, u32 groups, u32* cvs,
/// u32* counters, u32 one, u32* flag, u32 seq)`: the digest of one item
/// passed by value (no table), written to `out`; with `completion` = (flag,
/// seq) and the flag not 0, the block that wrote the digest then writes
/// `seq` to it.
///
/// With `graph`, the kernel goes as a one-node CUDA graph, made on the first
/// call and kept there; each call sets the node's parameters and launches
/// the graph (1.7-1.9 µs less from the call to the flag than
/// `cuLaunchKernel`, see `one_item`). Without, the launch calls
/// `cuLaunchKernel` directly with a fixed parameter array.
///
/// # Safety
/// `data` must name `len` readable bytes of device memory; `out` 32
/// writable bytes and `flag` (when not 0) 4 writable bytes, both reachable
/// from the device (device memory or mapped pinned host memory); `values`
/// must hold `scratch_of_len(len).0` values of 32 bytes and `counters` as
/// many zero counters as `scratch_of_len(len).1`; all of it must stay valid
/// until the launch completes.
pub(super) unsafe fn blake3_digest_one_raw(
    gpu: &Gpu,
    item: (u64, u64),
    out: u64,
    scratch: (u64, u64),
    completion: (u64, u32),
    graph: Option<&mut Option<OneGraph>>,
) -> Result<(), GpuError> {
    let (data, len) = item;
    let (values, counters) = scratch;
    let (flag, seq) = completion;
    let groups = groups_of_len(len);
    assert!(groups >= 1 && groups <= i32::MAX as u64, "the grid fits");
    let groups = groups as u32;
    let f = gpu.function(KernelId::Blake3One)?;
    let args = OneArgs { data, len, out, groups, values, counters, one: 1, flag, seq };
    let stream = gpu.stream();
    stream.context().bind_to_thread()?;
    // Every launch below is sound for the same reasons: `f` is
    // `blake3_digest_one_flag`, whose signature `OneArgs` follows; its
    // function and the stream belong to this handle's context, bound to the
    // thread above. The kernel reads the item's bytes below `len`, writes
    // its 32 output bytes, the flag, and the scratch that `scratch_of_len`
    // sizes (values, then counters), all valid by this function's contract.
    match graph {
        // SAFETY: as said above.
        None => unsafe { launch_one(&f, stream, &args) },
        Some(slot) => {
            if slot.as_ref().is_none_or(|g| !g.launches(&f)) {
                // SAFETY: `new` only makes the graph (its contract is `launch_one`'s, as above).
                match unsafe { OneGraph::new(&f, &args) } {
                    Ok(g) => *slot = Some(g),
                    // A driver that cannot make the graph still launches the kernel.
                    // SAFETY: as said above.
                    Err(_) => return unsafe { launch_one(&f, stream, &args) },
                }
            }
            let g = slot.as_ref().expect("made above");
            // SAFETY: the graph was made for this function (checked or made
            // above), and its launch is `launch_one`'s, as said above.
            unsafe { g.launch(stream, &args) }
        }
    }
}

/// `kv_seg_copy(const Seg* segs, u32 n, u32 vec16)` on `stream` with
/// `blocks` thread blocks of 1024 threads: copies `n` byte segments
/// (destination, source, length; 24 bytes each) read from `segs`.
///
/// # Safety
/// `segs` must hold `n` segments in device memory, each naming valid,
/// non-overlapping device memory (or mapped pinned host memory) for its
/// length, with no segment writing bytes another reads; with `vec16`, every
/// address and length a multiple of 16; all valid until the launch completes.
pub(super) unsafe fn kv_seg_copy_raw(
    gpu: &Gpu,
    stream: &CudaStream,
    segs: u64,
    n: u32,
    vec16: bool,
    blocks: u32,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    assert!((1..=16).contains(&blocks), "the staged path uses at most 16 thread blocks");
    let f = gpu.function(KernelId::KvSegCopy)?;
    let vec16 = u32::from(vec16);
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    let mut b = stream.launch_builder(&f);
    b.arg(&segs).arg(&n).arg(&vec16);
    // SAFETY: the argument list matches the .cu signature (pointer, u32,
    // u32); every address the kernel touches is inside a segment, valid by
    // this function's contract.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// `kv_block_seg_copy(const BlockSeg* segs, u32 n, const u64* device_bases,
/// u32 regions, u64 block_bytes, u64 device_stride, u32 to_slot, u32 vec16)`
/// on `stream` with `blocks` thread blocks of 1024 threads: moves `n` whole
/// blocks (16-byte records read from `segs`) between `pool`'s device pool
/// and staging addresses, gathering with `to_slot`, scattering without.
///
/// # Safety
/// `segs` must hold `n` records in device memory, each a staging address
/// with `regions * block_bytes` bytes of valid device memory from it and a
/// page inside the attached device pool; no two records may name
/// overlapping staging bytes or the same page; with the pool's `vec16`
/// every staging address a multiple of 16; all valid until the launch
/// completes.
pub(super) unsafe fn kv_block_seg_copy_raw(
    gpu: &Gpu,
    stream: &CudaStream,
    pool: &AttachedPool,
    segs: u64,
    n: u32,
    to_slot: bool,
    blocks: u32,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    assert!((1..=16).contains(&blocks), "the staged path uses at most 16 thread blocks");
    let f = gpu.function(KernelId::KvBlockSegCopy)?;
    let g = pool.device.geometry;
    let (regions, block_bytes, stride) = (g.regions, g.block_bytes, pool.device.page_stride);
    let (to_slot, vec16) = (u32::from(to_slot), u32::from(pool.vec16));
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    let mut b = stream.launch_builder(&f);
    b.arg(&segs)
        .arg(&n)
        .arg(&pool.device_bases_dev)
        .arg(&regions)
        .arg(&block_bytes)
        .arg(&stride)
        .arg(&to_slot)
        .arg(&vec16);
    // SAFETY: the argument list matches the .cu signature; every device
    // address the kernel forms is base[region] + page * stride (+ at most
    // block_bytes) with the page inside the pool, valid by attach's contract,
    // and every staging address is inside a record's bytes, valid by this
    // function's contract.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// `kv_block_copy(const CopyOp* ops, u32 n_ops, const u64* device_bases,
/// const u64* host_bases, u32 regions, u64 block_bytes, u32 planes,
/// u64 token_bytes, u32 tokens_per_block, u32 vec16, u32 split_at,
/// u64 device_stride, u64 host_stride)`: one
/// wave of copies; a wave that both writes the host tier (ops before
/// `split_at`) and reads it launches `kv_block_copy_split` instead, same
/// signature, whose blocks split [`KernelOptions`](super::kernels::KernelOptions)'
/// write share and loads in flight between the two directions.
/// `grid` overrides the number of thread blocks (1024 threads each); by
/// default a wave that touches the host tier uses 16, others 4 per SM.
///
/// Preconditions: every page is inside its pool, host pages only with a host
/// tier attached, tokens at most a block, no page written twice or both read
/// and written in the wave (checked by `check_wave` when the wave was made
/// for this pool); asserted here: the wave belongs to this pool, its
/// device copy is whole, and at most 16 thread blocks touch the host tier.
pub(super) fn kv_block_copy(
    gpu: &Gpu,
    pool: &AttachedPool,
    wave: &CopyWave,
    grid: Option<u32>,
) -> Result<(), GpuError> {
    if wave.ops.is_empty() {
        return Ok(());
    }
    let g = pool.device.geometry;
    assert_eq!(wave.pool_id, pool.id, "the wave was checked against this pool");
    assert_eq!(wave.ops_dev.len(), wave.ops.len() * 16, "device ops hold the wave");
    let touches_host = wave.touches_host;
    assert!(wave.split_at as usize <= wave.ops.len(), "the split point is inside the wave");
    let blocks = grid.unwrap_or(if touches_host { 16 } else { 4 * gpu.sm_count() });
    assert!(blocks >= 1, "at least one thread block");
    assert!(!touches_host || blocks <= 16, "host copies use at most 16 thread blocks");
    // A wave that both writes and reads the host tier takes the entry point
    // with per-direction loads in flight (which copies the whole wave with
    // every block when there are fewer than two); `kv_block_copy` ignores
    // `split_at`.
    let split = wave.split_at > 0 && (wave.split_at as usize) < wave.ops.len();
    let f = gpu.function(if split { KernelId::KvBlockCopySplit } else { KernelId::KvBlockCopy })?;
    let stream = gpu.stream();
    let n_ops = wave.ops.len() as u32;
    let (regions, planes, tpb, vec16) = (g.regions, g.planes, g.tokens_per_block, u32::from(pool.vec16));
    let (block_bytes, token_bytes) = (g.block_bytes, g.token_bytes());
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    let mut b = stream.launch_builder(&f);
    b.arg(&wave.ops_dev)
        .arg(&n_ops)
        .arg(&pool.device_bases_dev)
        .arg(&pool.host_bases_dev)
        .arg(&regions)
        .arg(&block_bytes)
        .arg(&planes)
        .arg(&token_bytes)
        .arg(&tpb)
        .arg(&vec16)
        .arg(&wave.split_at)
        .arg(&pool.device.page_stride)
        .arg(&pool.host_stride);
    // SAFETY: the argument list matches the .cu signature. Every address the
    // kernel forms is base[region] + page * stride + (at most block_bytes),
    // the stride being its pool's, with page inside its pool (checked when
    // the wave was made for this pool, whose id is asserted above), so it
    // stays inside the page that `Gpu::attach` (device pool, by its
    // contract) or `HostTier::with_layout` (pinned, owned by the pool
    // through an Arc) made valid. 16-byte accesses are used only when `vec16` proved every base and
    // size aligned. No two copies of the wave race (checked disjoint).
    unsafe { b.launch(cfg) }?;
    Ok(())
}
