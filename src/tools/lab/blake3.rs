//! The BLAKE3 kernels' lab variants (`cuda/lab/blake3_x.cu`) next to the
//! library's kernels, on the same batches: table kernels with other
//! template arguments or a per-block trace, one-item kernels with a trace or
//! another chunk loop, an empty one-item kernel (what launch and completion
//! cost alone), the fold launch with and without programmatic stream
//! serialization, and the whole one-call path (launch, completion flag,
//! digest in mapped host memory) with a lab kernel in place of the
//! library's.
//!
//! The lab sources are appended to the library's own source of each module
//! ([`ModuleId::source`]) and compiled as kvcore compiles it
//! ([`nvrtc_options`]), so the variants instantiate the production device
//! code; the library's modules never contain them.

use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice, PushKernelArg, sys,
};
use kvcore::gpu::{DigestBatch, Gpu, GpuError, KernelId, ModuleId, nvrtc_options};

/// The lab's source, appended to a module's.
const LAB_SOURCE: &str = include_str!("../../../cuda/lab/blake3_x.cu");

/// Where the completion flag and the digest lie in the one-call path's
/// mapped host buffer (as in the library's one-call digest).
const CALL_OUT_OFF: usize = 256;

/// The lab modules of one device, their functions loaded on first use (so
/// that a timed call pays no lookup), and the one-call path's buffers. For
/// one thread (the bench's).
pub struct Blake3Lab {
    /// The one-call path's buffers and graphs (declared first: the graphs
    /// name functions of the modules below, so they are destroyed first).
    call: RefCell<Option<CallBuffers>>,
    functions: RefCell<Vec<(String, CudaFunction)>>,
    /// `cuda/blake3.cu` with `B3_PAIR`, then the lab source: the `b3x_multi_*` kernels.
    pair: Arc<CudaModule>,
    /// `cuda/blake3.cu` with `B3_ONE`, then the lab source: the `b3x_one_*` kernels.
    one: Arc<CudaModule>,
}

/// The one-call path's mapped pinned buffer (flag word at 0, digest at
/// [`CALL_OUT_OFF`]), its device address, the last completion value, and a
/// one-node graph per kernel launched as a graph.
struct CallBuffers {
    _host: PinnedHostSlice<u8>,
    host_ptr: usize,
    host_dev: u64,
    seq: u32,
    graphs: Vec<OneGraph>,
}

/// Compiles `module`'s source as kvcore compiles it, followed by the lab
/// source, for `gpu`'s device, and loads it.
fn compile(gpu: &Gpu, module: ModuleId) -> Result<Arc<CudaModule>, GpuError> {
    let src = format!("{}\n{LAB_SOURCE}", module.source(&gpu.modules().options()));
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, nvrtc_options(gpu.arch(), "blake3_x.cu"))
        .map_err(|e| GpuError::Compile { kernel: "blake3_x.cu", log: format!("{e:?}") })?;
    Ok(gpu.context().load_module(ptx)?)
}

/// Whether `name` is a lab one-item kernel: `blake3_digest_one_flag`'s
/// signature plus a trace pointer (null: no trace).
pub fn one_flag_lab(name: &str) -> bool {
    name.starts_with("b3x_one_")
}

impl Blake3Lab {
    /// Compiles and loads the lab modules on `gpu`'s device.
    pub fn new(gpu: &Gpu) -> Result<Blake3Lab, GpuError> {
        Ok(Blake3Lab {
            pair: compile(gpu, ModuleId::Blake3Pair)?,
            one: compile(gpu, ModuleId::Blake3One)?,
            functions: RefCell::new(Vec::new()),
            call: RefCell::new(None),
        })
    }

    /// The lab kernel `name` (`b3x_one_*` from the one-item module, other
    /// `b3x_*` from the pair module), loaded on first use.
    fn function(&self, name: &str) -> Result<CudaFunction, GpuError> {
        assert!(name.starts_with("b3x_"), "lab kernels are named b3x_*");
        let mut functions = self.functions.borrow_mut();
        if let Some((_, f)) = functions.iter().find(|(n, _)| n == name) {
            return Ok(f.clone());
        }
        let module = if one_flag_lab(name) { &self.one } else { &self.pair };
        let f = module.load_function(name)?;
        functions.push((name.to_owned(), f.clone()));
        Ok(f)
    }

    /// Launches the lab table kernel `name` (the library's table signature
    /// and layout) on `batch`, with `block` threads per block and `grid`
    /// blocks (`None`: one block per group); a traced kernel (`trace`)
    /// writes 4 words per block.
    pub fn table_kernel(
        &self,
        gpu: &Gpu,
        batch: &DigestBatch,
        name: &str,
        block: u32,
        grid: Option<u32>,
        trace: Option<&mut CudaSlice<u64>>,
    ) -> Result<(), GpuError> {
        assert!([32, 64, 128, 256].contains(&block), "the BLAKE3 kernels use 32 to 256 threads per block");
        let f = self.function(name)?;
        let a = batch.launch_args();
        let one = 1u32;
        let grid = grid.unwrap_or(a.groups).clamp(1, a.groups);
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        let mut b = gpu.stream().launch_builder(&f);
        b.arg(&a.table).arg(&a.items).arg(&a.values).arg(&a.counters).arg(&one);
        if let Some(t) = trace {
            assert!(t.len() >= 4 * grid as usize, "a trace holds 4 words per block");
            b.arg(t);
        }
        // SAFETY: the lab kernels share the library's table signature and
        // layout, and the addresses are the batch's own table and scratch
        // (`launch_args`), valid while the batch lives and written only
        // where the library's kernels write; a block count below the groups
        // is what they expect (a kernel of several groups per block skips
        // groups past the table's last one); a traced kernel writes 4 words
        // per block into the trace (its extra argument, sized above).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Launches the one-item kernel `name` (the library's
    /// `blake3_digest_one_flag`, or a lab `b3x_one_*` kernel with a trace,
    /// null when `trace` is `None`) on the single item of `batch`, its
    /// digest into the batch's output, with no completion flag.
    pub fn one_kernel(
        &self,
        gpu: &Gpu,
        batch: &DigestBatch,
        name: &str,
        trace: Option<&mut CudaSlice<u64>>,
    ) -> Result<(), GpuError> {
        assert_eq!(batch.len(), 1, "one item");
        let f = if name == KernelId::Blake3One.name() {
            gpu.modules().function(KernelId::Blake3One)?
        } else {
            assert!(one_flag_lab(name), "lab one-item kernels are named b3x_one_*");
            self.function(name)?
        };
        let it = batch.items()[0];
        let a = batch.launch_args();
        let one = 1u32;
        let cfg = LaunchConfig { grid_dim: (a.groups, 1, 1), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
        let mut b = gpu.stream().launch_builder(&f);
        b.arg(&it.data).arg(&it.len).arg(&it.out).arg(&it.groups).arg(&a.values).arg(&a.counters).arg(&one);
        let (no_flag, no_seq, no_trace) = (0u64, 0u32, 0u64);
        b.arg(&no_flag).arg(&no_seq);
        if let Some(t) = trace {
            assert!(t.len() >= 8 * a.groups as usize, "a trace holds 8 words per block");
            b.arg(t);
        } else if one_flag_lab(name) {
            b.arg(&no_trace);
        }
        // SAFETY: the signature matches (checked by name above); the item's
        // bytes are valid by the batch's contract, its output and scratch
        // (from 0, as its table entry says) lie in buffers the batch owns; a
        // traced kernel writes 8 words per block into the trace (sized
        // above).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Host-side cost of a launch, as medians over `rounds` launches of the
    /// lab one-item kernel `name` (no flag, no trace) on the single item of
    /// `batch`, with the stream idle before each: through cudarc's launch
    /// builder, through `cuLaunchKernel` directly, and `cuCtxGetCurrent`
    /// alone (which the builder calls), in µs. Every launch has the item's
    /// whole grid, so the set counters end at zero as after any digest.
    pub fn launch_call_probe(
        &self,
        gpu: &Gpu,
        batch: &DigestBatch,
        name: &str,
        rounds: usize,
    ) -> Result<[(&'static str, f64); 3], GpuError> {
        use std::time::Instant;
        assert_eq!(batch.len(), 1, "one item");
        assert!(one_flag_lab(name), "a kernel with the one-item signature and a trace");
        let f = self.function(name)?;
        let it = batch.items()[0];
        let a = batch.launch_args();
        let args = OneArgs {
            data: it.data,
            len: it.len,
            out: it.out,
            groups: it.groups,
            values: a.values,
            counters: a.counters,
            one: 1,
            flag: 0,
            seq: 0,
            trace: 0,
        };
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
            b.arg(&args.data)
                .arg(&args.len)
                .arg(&args.out)
                .arg(&args.groups)
                .arg(&args.values)
                .arg(&args.counters)
                .arg(&args.one)
                .arg(&args.flag)
                .arg(&args.seq)
                .arg(&args.trace);
            let cfg = LaunchConfig { grid_dim: (args.groups, 1, 1), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: as in `one_kernel` (the same arguments, the batch's own
            // item, output and scratch; no flag, no trace).
            unsafe { b.launch(cfg) }?;
            builder.push(t0.elapsed().as_secs_f64() * 1e6);
            stream.synchronize()?;
            let t0 = Instant::now();
            // SAFETY: the arguments and the grid are those of the builder
            // launch above (the batch's own item, output and scratch; no
            // flag, no trace), `f` has the one-item signature with a trace
            // (asserted above), and the context is bound above.
            unsafe { launch_one(&f, stream, &args) }?;
            raw.push(t0.elapsed().as_secs_f64() * 1e6);
            stream.synchronize()?;
            let t0 = Instant::now();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            unsafe { sys::cuCtxGetCurrent(&mut ctx) }.result()?;
            current.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        Ok([("builder", median(builder)), ("raw", median(raw)), ("cuCtxGetCurrent", median(current))])
    }

    /// The library's one-call path for one item (as
    /// [`Gpu::digest_device`](kvcore::gpu::Gpu::digest_device) takes it
    /// with `OneItemPath::ByValueFlagLaunch`, or `ByValueFlag` when `graph`)
    /// with the lab one-item kernel `name` in place of the library's: the
    /// single item of `batch` by value, the digest and a completion flag in
    /// mapped pinned memory, the host spinning on the flag. Returns the
    /// digest (not computed by `b3x_one_empty`).
    pub fn one_call(&self, gpu: &Gpu, batch: &DigestBatch, name: &str, graph: bool) -> Result<[u8; 32], GpuError> {
        assert_eq!(batch.len(), 1, "one item");
        assert!(one_flag_lab(name), "a kernel with the one-item signature and a trace");
        let f = self.function(name)?;
        let mut guard = self.call.borrow_mut();
        if guard.is_none() {
            // SAFETY: plain bytes, written before they are read; DEVICEMAP
            // lets the kernel write the flag and the digest into it directly.
            let mut host = unsafe {
                gpu.context().alloc_pinned_with_flags::<u8>(
                    4096,
                    sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
                )?
            };
            let host_ptr = host.as_mut_ptr()? as usize;
            let mut host_dev: sys::CUdeviceptr = 0;
            // SAFETY: host_ptr starts a live DEVICEMAP pinned allocation (just
            // made) and host_dev is a valid out-pointer.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut host_dev, host_ptr as *mut std::ffi::c_void, 0) }
                .result()?;
            // SAFETY: the buffer holds 4096 bytes, and no kernel uses it yet.
            unsafe { std::ptr::write_volatile(host_ptr as *mut u32, 0) };
            *guard = Some(CallBuffers { _host: host, host_ptr, host_dev, seq: 0, graphs: Vec::new() });
        }
        let c = guard.as_mut().expect("just made");
        c.seq = c.seq.wrapping_add(1).max(1);
        let it = batch.items()[0];
        let a = batch.launch_args();
        let args = OneArgs {
            data: it.data,
            len: it.len,
            out: c.host_dev + CALL_OUT_OFF as u64,
            groups: it.groups,
            values: a.values,
            counters: a.counters,
            one: 1,
            flag: c.host_dev,
            seq: c.seq,
            trace: 0,
        };
        let stream = gpu.stream();
        gpu.context().bind_to_thread()?;
        // Every launch below is sound for the same reasons: `f` has the
        // one-item signature with a trace (asserted above, left null); its
        // function and the stream belong to the context bound above; the
        // kernel reads the batch's item below its length, writes 32 output
        // bytes and the flag in the mapped buffer (4096 bytes), and the
        // batch's scratch sized for that item.
        if graph {
            let made = match c.graphs.iter().position(|g| g.func == f.cu_function()) {
                Some(i) => Some(i),
                // SAFETY: `new` only makes the graph (as said above).
                None => match unsafe { OneGraph::new(&f, &args) } {
                    Ok(g) => {
                        c.graphs.push(g);
                        Some(c.graphs.len() - 1)
                    }
                    // A driver that cannot make the graph still launches the
                    // kernel, as the library does.
                    Err(_) => None,
                },
            };
            match made {
                // SAFETY: graph i was made for this function, and its launch
                // is `launch_one`'s, as said above.
                Some(i) => unsafe { c.graphs[i].launch(stream, &args) }?,
                // SAFETY: as said above.
                None => unsafe { launch_one(&f, stream, &args) }?,
            }
        } else {
            // SAFETY: as said above.
            unsafe { launch_one(&f, stream, &args) }?;
        }
        wait_flag(stream, c.host_ptr as *const u32, c.seq)?;
        // SAFETY: the kernel raised the flag after writing the digest (system
        // fence); 32 bytes at CALL_OUT_OFF lie inside the 4096-byte buffer,
        // which lives while we hold the borrow.
        let out = unsafe { std::slice::from_raw_parts((c.host_ptr + CALL_OUT_OFF) as *const u8, 32) };
        Ok(out.try_into().expect("32 bytes"))
    }
}

/// Waits until the word at `flag` (mapped pinned host memory) equals `seq`,
/// checking the stream every few hundred reads so that a failed kernel
/// becomes an error instead of a hang.
fn wait_flag(stream: &CudaStream, flag: *const u32, seq: u32) -> Result<(), GpuError> {
    let mut spins = 0u32;
    loop {
        // SAFETY: `flag` points into the lab's pinned buffer, held by the
        // caller's borrow; the device writes it, hence the volatile read.
        if unsafe { std::ptr::read_volatile(flag) } == seq {
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            return Ok(());
        }
        spins += 1;
        if spins.is_multiple_of(512) {
            // SAFETY: the stream is a live stream of the bound context.
            match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                sys::CUresult::CUDA_SUCCESS => {
                    // SAFETY: as above.
                    if unsafe { std::ptr::read_volatile(flag) } == seq {
                        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                        return Ok(());
                    }
                    return Err(GpuError::InvalidArgument(
                        "the kernel finished without raising its completion flag".to_owned(),
                    ));
                }
                e => return Err(GpuError::Driver(cudarc::driver::DriverError(e))),
            }
        }
        std::hint::spin_loop();
    }
}

/// The arguments of a lab one-item kernel (`blake3_digest_one_flag`'s and a
/// trace pointer), in parameter order.
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

/// Launches `f` with `args` through `cuLaunchKernel` directly (a fixed
/// parameter array, as the library launches its one-item kernel), one block
/// of 64 threads per group, on `stream`.
///
/// # Safety
/// `f` takes exactly the fields of `OneArgs`, in order and of those types;
/// `f` and `stream` belong to the context bound to this thread; the
/// addresses in `args` name memory the kernel may read and write as its
/// signature says, valid until the launch completes.
unsafe fn launch_one(f: &CudaFunction, stream: &CudaStream, args: &OneArgs) -> Result<(), GpuError> {
    let mut params = args.pointers();
    // SAFETY: each entry points to a field of `args`, alive for the call,
    // of the type of the kernel parameter at its position (this function's
    // contract), and the driver copies the values during the call.
    unsafe {
        sys::cuLaunchKernel(
            f.cu_function(),
            args.groups,
            1,
            1,
            64,
            1,
            1,
            0,
            stream.cu_stream(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()?;
    Ok(())
}

/// A one-node CUDA graph of a lab one-item kernel, as the library launches
/// its own with `OneItemPath::ByValueFlag`: instantiated once; each launch
/// sets the node's parameters and launches the executable graph.
struct OneGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    func: sys::CUfunction,
}

impl OneGraph {
    /// The node's parameters for `args` (grid from `args.groups`).
    fn node_params(
        func: sys::CUfunction,
        args: &OneArgs,
        params: &mut [*mut std::ffi::c_void; 10],
    ) -> sys::CUDA_KERNEL_NODE_PARAMS {
        *params = args.pointers();
        sys::CUDA_KERNEL_NODE_PARAMS {
            func,
            gridDimX: args.groups,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 64,
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
    /// As [`launch_one`] for `f` and `args` (the graph is only made here,
    /// not launched).
    unsafe fn new(f: &CudaFunction, args: &OneArgs) -> Result<OneGraph, GpuError> {
        let mut params = [std::ptr::null_mut(); 10];
        let p = Self::node_params(f.cu_function(), args, &mut params);
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: valid out-pointers; the node parameters point to `args`,
        // alive for the calls, which copy them.
        unsafe { sys::cuGraphCreate(&mut graph, 0) }.result()?;
        let mut me = OneGraph { graph, exec: std::ptr::null_mut(), node: std::ptr::null_mut(), func: p.func };
        // SAFETY: as above; `me` destroys what was made if a later call fails.
        unsafe { sys::cuGraphAddKernelNode_v2(&mut me.node, me.graph, std::ptr::null(), 0, &p) }.result()?;
        // SAFETY: as above.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut me.exec, me.graph, 0) }.result()?;
        Ok(me)
    }

    /// # Safety
    /// As [`launch_one`] for this graph's function and `args`.
    unsafe fn launch(&self, stream: &CudaStream, args: &OneArgs) -> Result<(), GpuError> {
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
