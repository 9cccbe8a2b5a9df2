//! One typed wrapper per kernel. Each checks, with asserts, everything the
//! kernel relies on that the host can see, then makes the single `unsafe`
//! launch; its `SAFETY` comment argues from those asserts and from the
//! invariant of the structure it takes (established by an `unsafe`
//! constructor whose contract covers what the host cannot check: that caller
//! addresses name live device memory).

use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};

use super::GpuError;
use super::device::{CopyEngine, CopyWave, DigestBatch, Gpu};
use super::digest::{groups_of_len, scratch_of_len};
use super::kernels::KernelId;
use super::pool::CopyOp;

/// One item of a digest batch as the kernel reads it (`Blake3Item` in
/// `cuda/blake3.cu`: 48 bytes, 8-byte aligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Blake3Item {
    /// Device address of the item's bytes.
    pub data: u64,
    /// Length in bytes.
    pub len: u64,
    /// Device address of its 32-byte digest.
    pub out: u64,
    /// Index of its first value in the scratch, all levels (items of one group use none).
    pub cv_first: u64,
    /// Index of its first set counter in the scratch, all levels.
    pub ctr_first: u64,
    /// Global index of its first group (the first thread block of launch 1).
    pub group_first: u32,
    /// Groups of 64 chunks (at least 1).
    pub groups: u32,
}

const _: () = assert!(std::mem::size_of::<Blake3Item>() == 48);
const _: () = assert!(std::mem::size_of::<CopyOp>() == 16);

/// Checks the table invariants both digest kernels rely on. Run once by
/// `Gpu::prepare_digests`, the only constructor of a batch; a batch is
/// immutable afterwards, so the launches need only check that it is whole.
pub(super) fn check_digest_batch(batch: &DigestBatch) {
    let t = &batch.table;
    assert_eq!(batch.table_dev.len(), t.len() * 48, "the device table holds the host table");
    let (out_base, _s) = batch.out.device_ptr(batch.out.stream());
    assert_eq!(batch.out.len(), 32 * t.len(), "one 32-byte output per item");
    check_table(t, out_base, batch.cvs.len() as u64 / 8, batch.counters.len() as u64, batch.groups);
}

/// Checks an item table against the buffers it will be launched with:
/// outputs consecutive from `out_base`, groups consecutive from 0 and
/// totalling `groups`, scratch ranges consecutive and inside `values`
/// values and `counters` counters.
pub(super) fn check_table(t: &[Blake3Item], out_base: u64, values: u64, counters: u64, groups: u32) {
    assert!(!t.is_empty(), "a batch has items");
    let (mut group, mut cv, mut ctr) = (0u64, 0u64, 0u64);
    for (i, it) in t.iter().enumerate() {
        assert_eq!(it.groups as u64, groups_of_len(it.len), "item {i}: group count matches its length");
        assert_eq!(it.group_first as u64, group, "item {i}: groups are consecutive from 0");
        assert_eq!(it.out, out_base + 32 * i as u64, "item {i}: output inside the batch's buffer");
        let (v, c) = scratch_of_len(it.len);
        if v > 0 {
            assert_eq!((it.cv_first, it.ctr_first), (cv, ctr), "item {i}: scratch ranges are consecutive");
        }
        cv += v;
        ctr += c;
        group += it.groups as u64;
    }
    assert_eq!(group, groups as u64, "total groups");
    assert!(values >= cv, "scratch holds every value of every level");
    assert!(counters >= ctr, "scratch holds every set counter");
    assert!(groups <= i32::MAX as u32, "grid fits");
}

/// The O(1) part of the batch invariant, checked at every launch.
fn assert_whole(batch: &DigestBatch) {
    let n = batch.table.len();
    assert!(n > 0, "a batch has items");
    assert_eq!(batch.table_dev.len(), n * 48, "the device table holds the host table");
    assert_eq!(batch.out.len(), 32 * n, "one 32-byte output per item");
    let last = batch.table[n - 1];
    assert_eq!(last.group_first as u64 + last.groups as u64, batch.groups as u64, "groups cover the grid");
    assert!(batch.groups >= 1 && batch.groups <= i32::MAX as u32, "grid fits");
}

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
pub fn blake3_digest(gpu: &Gpu, batch: &DigestBatch, variant: KernelId) -> Result<(), GpuError> {
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
        blake3_fold_sets(gpu, batch, true)?;
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

/// Benchmarks only: the fold launch of `batch` alone (after a chunk launch
/// of `blake3_digest_multi` on it), with or without programmatic stream
/// serialization.
pub fn blake3_fold_sets(gpu: &Gpu, batch: &DigestBatch, programmatic: bool) -> Result<(), GpuError> {
    assert_whole(batch);
    let stream = gpu.stream();
    let (table, _t) = batch.table_dev.device_ptr(stream);
    let (values, _v) = batch.cvs.device_ptr(stream);
    let (counters, _c) = batch.counters.device_ptr(stream);
    // SAFETY: the batch's own table and scratch (its invariant, as in
    // `blake3_digest`); the caller launched the chunk kernel before it.
    unsafe { fold_sets_raw(gpu, table, batch.table.len() as u32, values, counters, batch.groups, programmatic) }
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

/// Benchmarks only: launches the experimental table kernel `name` of
/// `module` (same signature and table as [`blake3_digest`]) on `batch`,
/// with `block` threads per block and `grid` blocks (a persistent kernel
/// loops over the groups; `None`: one block per group).
pub fn blake3_experiment(
    gpu: &Gpu,
    batch: &DigestBatch,
    module: super::kernels::ModuleId,
    name: &str,
    block: u32,
    grid: Option<u32>,
    trace: Option<&mut cudarc::driver::CudaSlice<u64>>,
) -> Result<(), GpuError> {
    assert_whole(batch);
    assert!([32, 64, 128, 256].contains(&block), "the BLAKE3 kernels use 32 to 256 threads per block");
    assert!(name.starts_with("b3x_"), "experimental kernels are named b3x_*");
    let f = gpu.modules().function_named(module, name)?;
    let n_items = batch.table.len() as u32;
    let one = 1u32;
    let grid = grid.unwrap_or(batch.groups).clamp(1, batch.groups);
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&batch.table_dev).arg(&n_items).arg(&batch.cvs).arg(&batch.counters).arg(&one);
    if let Some(t) = trace {
        assert!(t.len() >= 4 * grid as usize, "a trace holds 4 words per block");
        b.arg(t);
    }
    // SAFETY: as in `blake3_digest`: the experiments share the signature
    // and the table layout, and a block count below the groups is what
    // they expect (a kernel of several groups per block skips groups past
    // the table's last one); a traced kernel writes 4 words per block into
    // the trace (its extra argument, sized above).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// Benchmarks only: launches the one-item kernel `name` of the `B3_ONE`
/// module (`(u64 data, u64 len, u64 out, u32 groups, u32* cvs, u32*
/// counters, u32 one, u32* flag, u32 seq)`, the flag left off, and for the
/// `b3x_one_*` diagnostics a trace, null when `trace` is `None`) on the
/// single item of `batch`, with `block` threads per block.
pub fn blake3_one_experiment(
    gpu: &Gpu,
    batch: &DigestBatch,
    name: &str,
    block: u32,
    trace: Option<&mut cudarc::driver::CudaSlice<u64>>,
) -> Result<(), GpuError> {
    assert_whole(batch);
    assert_eq!(batch.table.len(), 1, "one item");
    assert!(
        name == KernelId::Blake3One.name() || one_flag_experiment(name),
        "experimental one-item kernels are named b3x_one_*"
    );
    assert_eq!(block, 64, "one thread per chunk, 64 chunks per block");
    let f = gpu.modules().function_named(super::kernels::ModuleId::Blake3One, name)?;
    let it = batch.table[0];
    let one = 1u32;
    let cfg = LaunchConfig { grid_dim: (batch.groups, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
    let mut b = gpu.stream().launch_builder(&f);
    b.arg(&it.data).arg(&it.len).arg(&it.out).arg(&it.groups).arg(&batch.cvs).arg(&batch.counters).arg(&one);
    let (no_flag, no_seq, no_trace) = (0u64, 0u32, 0u64);
    b.arg(&no_flag).arg(&no_seq);
    if let Some(t) = trace {
        assert!(t.len() >= 8 * batch.groups as usize, "a trace holds 8 words per block");
        b.arg(t);
    } else if one_flag_experiment(name) {
        b.arg(&no_trace);
    }
    // SAFETY: the signature matches; the item's bytes are valid by the
    // batch's contract, its output and scratch (from 0, as its table entry
    // says) lie in buffers the batch owns; a traced kernel writes 8 words
    // per block into the trace (sized above).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// Benchmarks only: host-side cost of a launch, as medians over `rounds`
/// launches of the one-item diagnostic `name` (no flag, no trace) on the
/// single item of `batch`, with the stream idle before each: through
/// cudarc's launch builder, through `cuLaunchKernel` directly, and
/// `cuCtxGetCurrent` alone (which the builder calls), in µs. Every launch
/// has the item's whole grid, so the set counters end at zero as after any
/// digest.
pub fn launch_call_probe(
    gpu: &Gpu,
    batch: &DigestBatch,
    name: &str,
    rounds: usize,
) -> Result<[(&'static str, f64); 3], GpuError> {
    use std::time::Instant;
    assert_whole(batch);
    assert_eq!(batch.table.len(), 1, "one item");
    assert!(one_flag_experiment(name), "a kernel with the one-item signature and a trace");
    let f = gpu.modules().function_named(super::kernels::ModuleId::Blake3One, name)?;
    let it = batch.table[0];
    let (cvs, counters) = (batch.cvs.device_ptr(gpu.stream()).0, batch.counters.device_ptr(gpu.stream()).0);
    let (data, len, out, groups, one, flag, seq, trace) = (it.data, it.len, it.out, it.groups, 1u32, 0u64, 0u32, 0u64);
    let args = OneArgs { data, len, out, groups, values: cvs, counters, one, flag, seq, trace };
    let stream = gpu.stream();
    gpu.context().bind_to_thread()?;
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        v[v.len() / 2]
    };
    let (mut builder, mut raw, mut current) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let t0 = Instant::now();
        let mut b = stream.launch_builder(&f);
        b.arg(&data)
            .arg(&len)
            .arg(&out)
            .arg(&groups)
            .arg(&cvs)
            .arg(&counters)
            .arg(&one)
            .arg(&flag)
            .arg(&seq)
            .arg(&trace);
        let cfg = LaunchConfig { grid_dim: (groups, 1, 1), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: as in `blake3_one_experiment` (the same arguments, the
        // batch's own item, output and scratch; no flag, no trace).
        unsafe { b.launch(cfg) }?;
        builder.push(t0.elapsed().as_secs_f64() * 1e6);
        stream.synchronize()?;
        let t0 = Instant::now();
        // SAFETY: the arguments and the grid are those of the builder launch
        // above (the batch's own item, output and scratch; no flag, no
        // trace), `f` has the one-item signature with a trace (asserted
        // above), and the context is bound above.
        unsafe { launch_one(&f, stream, &args, 10) }?;
        raw.push(t0.elapsed().as_secs_f64() * 1e6);
        stream.synchronize()?;
        let t0 = Instant::now();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { cudarc::driver::sys::cuCtxGetCurrent(&mut ctx) }.result()?;
        current.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok([("builder", median(builder)), ("raw", median(raw)), ("cuCtxGetCurrent", median(current))])
}

/// Diagnostic one-item kernels (`b3x_one_*`): `blake3_digest_one_flag`'s
/// signature plus a trace pointer (null: no trace).
pub fn one_flag_experiment(name: &str) -> bool {
    name.starts_with("b3x_one_")
}

/// `blake3_digest_one_flag(u64 data, u64 len, u64 out, u32 groups, u32* cvs,
/// u32* counters, u32 one, u32* flag, u32 seq)`: the digest of one item
/// passed by value (no table), written to `out`; with `completion` = (flag,
/// seq) and the flag not 0, the block that wrote the digest then writes
/// `seq` to it. `experiment` names a diagnostic `b3x_one_*` kernel of the
/// same module to launch instead (benchmarks; its trace is left null).
///
/// With `graphs`, the kernel goes as a one-node CUDA graph, made once per
/// kernel and kept there; each call sets the node's parameters and launches
/// the graph. On the H200 hosts that takes 1.7-1.9 µs less from the call to
/// the flag than `cuLaunchKernel` (an empty kernel through the whole call:
/// 5.6 against 7.4 µs, docs/benchmarks.md, "Fifth pass"). Without, the
/// launch calls `cuLaunchKernel` directly with a fixed parameter array
/// instead of cudarc's builder, which costs 0.05-0.35 µs more per call
/// ("Fourth pass").
///
/// # Safety
/// `data` must name `len` readable bytes of device memory; `out` 32
/// writable bytes and `flag` (when not 0) 4 writable bytes, both reachable
/// from the device (device memory or mapped pinned host memory); `values`
/// must hold `scratch_of_len(len).0` values of 32 bytes and `counters` as
/// many zero counters as `scratch_of_len(len).1`; all of it must stay valid
/// until the launch completes.
#[allow(clippy::too_many_arguments, reason = "the kernel's own arguments, plus how to launch it")]
pub(super) unsafe fn blake3_digest_one_raw(
    gpu: &Gpu,
    item: (u64, u64),
    out: u64,
    values: u64,
    counters: u64,
    completion: (u64, u32),
    experiment: Option<&str>,
    graphs: Option<&mut Vec<OneGraph>>,
) -> Result<(), GpuError> {
    let (data, len) = item;
    let (flag, seq) = completion;
    let groups = groups_of_len(len);
    assert!(groups >= 1 && groups <= i32::MAX as u64, "the grid fits");
    let groups = groups as u32;
    let f = match experiment {
        None => gpu.function(KernelId::Blake3One)?,
        Some(name) => {
            assert!(one_flag_experiment(name), "a diagnostic with the one-item signature and a trace");
            gpu.modules().function_named(super::kernels::ModuleId::Blake3One, name)?
        }
    };
    let args = OneArgs { data, len, out, groups, values, counters, one: 1, flag, seq, trace: 0 };
    // blake3_digest_one_flag has 9 parameters, the diagnostics a 10th (the trace).
    let n_params = if experiment.is_some() { 10 } else { 9 };
    let stream = gpu.stream();
    stream.context().bind_to_thread()?;
    // Every launch below is sound for the same reasons: `f` has the
    // one-item signature (with a trace when `experiment` names a
    // diagnostic, asserted above), so `n_params` matches it; its function
    // and the stream belong to this handle's context, bound to the thread
    // above. The kernel reads the item's bytes below `len`, writes its 32
    // output bytes, the flag, and the scratch that `scratch_of_len` sizes
    // (values, then counters), all valid by this function's contract.
    match graphs {
        // SAFETY: as said above.
        None => unsafe { launch_one(&f, stream, &args, n_params) },
        Some(graphs) => {
            let i = match graphs.iter().position(|g| g.func == f.cu_function() && g.n_params == n_params) {
                Some(i) => i,
                // SAFETY: `new` only makes the graph (its contract is `launch_one`'s, as above).
                None => match unsafe { OneGraph::new(&f, &args, n_params) } {
                    Ok(g) => {
                        graphs.push(g);
                        graphs.len() - 1
                    }
                    // A driver that cannot make the graph still launches the kernel.
                    // SAFETY: as said above.
                    Err(_) => return unsafe { launch_one(&f, stream, &args, n_params) },
                },
            };
            // SAFETY: graph i was made for this function and parameter
            // count (found by both above), and its launch is `launch_one`'s,
            // as said above.
            unsafe { graphs[i].launch(stream, &args) }
        }
    }
}

/// A one-node CUDA graph of a one-item kernel, instantiated once; each
/// launch sets the node's parameters and launches the executable graph.
#[derive(Debug)]
pub(super) struct OneGraph {
    graph: cudarc::driver::sys::CUgraph,
    exec: cudarc::driver::sys::CUgraphExec,
    node: cudarc::driver::sys::CUgraphNode,
    func: cudarc::driver::sys::CUfunction,
    n_params: usize,
}

// SAFETY: the handles are plain driver objects, usable from any thread; the
// digest arena that owns the graphs is only touched under its lock, so no
// two threads use one at once.
unsafe impl Send for OneGraph {}

impl OneGraph {
    /// The node's parameters for `args` (grid from `args.groups`).
    fn node_params(
        func: cudarc::driver::sys::CUfunction,
        args: &OneArgs,
        params: &mut [*mut std::ffi::c_void; 10],
    ) -> cudarc::driver::sys::CUDA_KERNEL_NODE_PARAMS {
        *params = args.pointers();
        cudarc::driver::sys::CUDA_KERNEL_NODE_PARAMS {
            func,
            gridDimX: args.groups,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: KernelId::Blake3One.blake3_block(),
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            kernelParams: params.as_mut_ptr(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }
    }

    /// # Safety
    /// As [`launch_one`] for `f`, `args` and `n_params` (the graph is only
    /// made here, not launched).
    unsafe fn new(f: &cudarc::driver::CudaFunction, args: &OneArgs, n_params: usize) -> Result<OneGraph, GpuError> {
        use cudarc::driver::sys;
        let mut params = [std::ptr::null_mut(); 10];
        let p = Self::node_params(f.cu_function(), args, &mut params);
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointers; the node parameters point to `args`,
        // alive for the calls, which copy them.
        unsafe { sys::cuGraphCreate(&mut graph, 0) }.result()?;
        let mut me = OneGraph { graph, exec: std::ptr::null_mut(), node: std::ptr::null_mut(), func: p.func, n_params };
        // SAFETY: as above; `me` destroys what was made if a later call fails.
        unsafe { sys::cuGraphAddKernelNode_v2(&mut me.node, me.graph, std::ptr::null(), 0, &p) }.result()?;
        // SAFETY: as above.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut me.exec, me.graph, 0) }.result()?;
        Ok(me)
    }

    /// # Safety
    /// As [`launch_one`] for this graph's function and `args`.
    unsafe fn launch(&self, stream: &cudarc::driver::CudaStream, args: &OneArgs) -> Result<(), GpuError> {
        use cudarc::driver::sys;
        let mut params = [std::ptr::null_mut(); 10];
        let p = Self::node_params(self.func, args, &mut params);
        // SAFETY: the node belongs to this executable graph and keeps its
        // function; the parameters are copied during the call.
        unsafe { sys::cuGraphExecKernelNodeSetParams_v2(self.exec, self.node, &p) }.result()?;
        // SAFETY: the caller's contract (the kernel's arguments are valid).
        unsafe { sys::cuGraphLaunch(self.exec, stream.cu_stream()) }.result()?;
        Ok(())
    }
}

impl Drop for OneGraph {
    fn drop(&mut self) {
        use cudarc::driver::sys;
        // SAFETY: the handles were made by `new` and are destroyed once; a
        // launched graph may be destroyed while it runs (the driver keeps
        // what the launch needs).
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// The arguments of `blake3_digest_one_flag` (the first nine) and of its
/// `b3x_one_*` diagnostics (all ten), in parameter order.
struct OneArgs {
    data: u64,
    len: u64,
    out: u64,
    groups: u32,
    values: u64,
    counters: u64,
    one: u32,
    flag: u64,
    seq: u32,
    trace: u64,
}

impl OneArgs {
    /// Pointers to each field, in parameter order (`cuLaunchKernel`'s
    /// `kernelParams`).
    fn pointers(&self) -> [*mut std::ffi::c_void; 10] {
        [
            &self.data as *const u64 as *mut _,
            &self.len as *const u64 as *mut _,
            &self.out as *const u64 as *mut _,
            &self.groups as *const u32 as *mut _,
            &self.values as *const u64 as *mut _,
            &self.counters as *const u64 as *mut _,
            &self.one as *const u32 as *mut _,
            &self.flag as *const u64 as *mut _,
            &self.seq as *const u32 as *mut _,
            &self.trace as *const u64 as *mut _,
        ]
    }
}

/// Launches `f` with the first `n_params` of `args` through `cuLaunchKernel`
/// directly (a fixed parameter array: cudarc's builder costs 0.05-0.35 µs
/// more per call, on the critical path of a one-image digest), one block of
/// `blake3_block()` threads per group, on `stream`.
///
/// # Safety
/// `f` takes exactly the first `n_params` (9 or 10) fields of `OneArgs`, in
/// order and of those types; `f` and `stream` belong to the context bound to
/// this thread; the addresses in `args` satisfy `blake3_digest_one_raw`'s
/// contract (and `trace`, when not 0, holds 8 words per group).
unsafe fn launch_one(
    f: &cudarc::driver::CudaFunction,
    stream: &cudarc::driver::CudaStream,
    args: &OneArgs,
    n_params: usize,
) -> Result<(), GpuError> {
    assert!(n_params == 9 || n_params == 10, "the one-item signature, with or without a trace");
    let mut params = args.pointers();
    // SAFETY: each entry points to a field of `args`, alive for the call,
    // of the type of the kernel parameter at its position (this function's
    // contract), and the driver copies the values during the call; the rest
    // is this function's contract.
    unsafe {
        cudarc::driver::sys::cuLaunchKernel(
            f.cu_function(),
            args.groups,
            1,
            1,
            KernelId::Blake3One.blake3_block(),
            1,
            1,
            0,
            stream.cu_stream(),
            params[..n_params].as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()?;
    Ok(())
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
    stream: &cudarc::driver::CudaStream,
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
/// blocks (16-byte records read from `segs`) between `engine`'s device pool
/// and staging addresses, gathering with `to_slot`, scattering without.
///
/// # Safety
/// `segs` must hold `n` records in device memory, each a staging address
/// with `regions * block_bytes` bytes of valid device memory from it and a
/// page inside the engine's device pool; no two records may name
/// overlapping staging bytes or the same page; with the engine's `vec16`
/// every staging address a multiple of 16; all valid until the launch
/// completes.
pub(super) unsafe fn kv_block_seg_copy_raw(
    gpu: &Gpu,
    stream: &cudarc::driver::CudaStream,
    engine: &CopyEngine,
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
    let g = engine.device.geometry;
    let (regions, block_bytes, stride) = (g.regions, g.block_bytes, engine.device.page_stride);
    let (to_slot, vec16) = (u32::from(to_slot), u32::from(engine.vec16));
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    let mut b = stream.launch_builder(&f);
    b.arg(&segs)
        .arg(&n)
        .arg(&engine.device_bases_dev)
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

/// Checks a wave against its engine: pages inside their pools, host pages
/// only with a host tier, tokens within a block, and no page written twice or
/// both read and written. Run once by `Gpu::prepare_wave`, the only
/// constructor of a [`CopyWave`](super::CopyWave).
pub(super) fn check_wave(engine: &CopyEngine, wave: &[CopyOp]) -> Result<(), GpuError> {
    let bad = |m: String| Err(GpuError::InvalidArgument(m));
    let g = engine.device.geometry;
    let blocks_host = engine.host.as_ref().map(|h| h.pool().blocks);
    let mut read = ahash::AHashSet::new();
    let mut written = ahash::AHashSet::new();
    for (i, op) in wave.iter().enumerate() {
        if op.media >= 4 {
            return bad(format!("op {i}: media has two bits"));
        }
        let (src_host, dst_host) = (op.media & 1 != 0, op.media & 2 != 0);
        for (host, page) in [(src_host, op.src_page), (dst_host, op.dst_page)] {
            let limit = if host { blocks_host } else { Some(engine.device.blocks) };
            match limit {
                None => return bad(format!("op {i}: host page without a host tier")),
                Some(n) if page >= n => return bad(format!("op {i}: page {page} past the pool of {n}")),
                Some(_) => {}
            }
        }
        if op.tokens == 0 || op.tokens > g.tokens_per_block {
            return bad(format!("op {i}: {} tokens; a block holds {}", op.tokens, g.tokens_per_block));
        }
        if !written.insert((dst_host, op.dst_page)) {
            return bad(format!("op {i}: page {} written twice in one wave", op.dst_page));
        }
        read.insert((src_host, op.src_page));
    }
    if !read.is_disjoint(&written) {
        return bad("a page is both read and written in one wave".to_owned());
    }
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
/// for this engine); asserted here: the wave belongs to this engine, its
/// device copy is whole, and at most 16 thread blocks touch the host tier.
pub fn kv_block_copy(gpu: &Gpu, engine: &CopyEngine, wave: &CopyWave, grid: Option<u32>) -> Result<(), GpuError> {
    if wave.ops.is_empty() {
        return Ok(());
    }
    let g = engine.device.geometry;
    assert_eq!(wave.engine_id, engine.id, "the wave was checked against this engine");
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
    let (regions, planes, tpb, vec16) = (g.regions, g.planes, g.tokens_per_block, u32::from(engine.vec16));
    let (block_bytes, token_bytes) = (g.block_bytes, g.token_bytes());
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
    let mut b = stream.launch_builder(&f);
    b.arg(&wave.ops_dev)
        .arg(&n_ops)
        .arg(&engine.device_bases_dev)
        .arg(&engine.host_bases_dev)
        .arg(&regions)
        .arg(&block_bytes)
        .arg(&planes)
        .arg(&token_bytes)
        .arg(&tpb)
        .arg(&vec16)
        .arg(&wave.split_at)
        .arg(&engine.device.page_stride)
        .arg(&engine.host_stride);
    // SAFETY: the argument list matches the .cu signature. Every address the
    // kernel forms is base[region] + page * stride + (at most block_bytes),
    // the stride being its pool's, with page inside its pool (checked when
    // the wave was made for this engine, whose id is asserted above), so it
    // stays inside the page that `Gpu::attach` (device pool, by its
    // contract) or `HostTier::with_layout` (pinned, owned by the engine
    // through an Arc) made valid. 16-byte accesses are used only when `vec16` proved every base and
    // size aligned. No two copies of the wave race (checked disjoint).
    unsafe { b.launch(cfg) }?;
    Ok(())
}
