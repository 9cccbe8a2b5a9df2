//! How the one-image kernel (`blake3_digest_one_flag`) is launched: its
//! argument block, a direct `cuLaunchKernel` with a fixed parameter array,
//! and a one-node CUDA graph that is made once and relaunched with new
//! parameters.
//!
//! Why not cudarc's launch builder: on the critical path of a one-image
//! digest it costs 0.05-0.35 µs more per call than a fixed parameter array,
//! and a graph launch takes another 1.7-1.9 µs less from the call to the
//! completion flag (measured on H200 hosts: an empty kernel through the
//! whole call in 5.6 against 7.4 µs).

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream};

use super::error::GpuError;
use super::kernels::KernelId;

/// The arguments of `blake3_digest_one_flag`, in parameter order.
pub(super) struct OneArgs {
    pub(super) data: u64,
    pub(super) len: u64,
    pub(super) out: u64,
    pub(super) groups: u32,
    pub(super) values: u64,
    pub(super) counters: u64,
    pub(super) one: u32,
    pub(super) flag: u64,
    pub(super) seq: u32,
}

impl OneArgs {
    /// Pointers to each field, in parameter order (`cuLaunchKernel`'s
    /// `kernelParams`).
    fn pointers(&self) -> [*mut std::ffi::c_void; 9] {
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
        ]
    }
}

/// Launches `f` with `args` through `cuLaunchKernel` directly, one block of
/// `blake3_block()` threads per group, on `stream`.
///
/// # Safety
/// `f` has `blake3_digest_one_flag`'s signature; `f` and `stream` belong to
/// the context bound to this thread; the addresses in `args` satisfy
/// `launch::blake3_digest_one_raw`'s contract.
pub(super) unsafe fn launch_one(f: &CudaFunction, stream: &CudaStream, args: &OneArgs) -> Result<(), GpuError> {
    let mut params = args.pointers();
    // SAFETY: each entry points to a field of `args`, alive for the call,
    // of the type of the kernel parameter at its position (this function's
    // contract), and the driver copies the values during the call; the rest
    // is this function's contract.
    unsafe {
        sys::cuLaunchKernel(
            f.cu_function(),
            args.groups,
            1,
            1,
            KernelId::Blake3One.blake3_block(),
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

/// A one-node CUDA graph of the one-item kernel, instantiated once; each
/// launch sets the node's parameters and launches the executable graph.
#[derive(Debug)]
pub(super) struct OneGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    func: sys::CUfunction,
}

// SAFETY: the handles are plain driver objects, usable from any thread; the
// digest arena that owns the graph is only touched under its lock, so no
// two threads use one at once.
unsafe impl Send for OneGraph {}

impl OneGraph {
    /// The node's parameters for `args` (grid from `args.groups`).
    fn node_params(
        func: sys::CUfunction,
        args: &OneArgs,
        params: &mut [*mut std::ffi::c_void; 9],
    ) -> sys::CUDA_KERNEL_NODE_PARAMS {
        *params = args.pointers();
        sys::CUDA_KERNEL_NODE_PARAMS {
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

    /// Whether the graph launches `f`.
    pub(super) fn launches(&self, f: &CudaFunction) -> bool {
        self.func == f.cu_function()
    }

    /// # Safety
    /// As [`launch_one`] for `f` and `args` (the graph is only made here,
    /// not launched).
    pub(super) unsafe fn new(f: &CudaFunction, args: &OneArgs) -> Result<OneGraph, GpuError> {
        let mut params = [std::ptr::null_mut(); 9];
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
    pub(super) unsafe fn launch(&self, stream: &CudaStream, args: &OneArgs) -> Result<(), GpuError> {
        let mut params = [std::ptr::null_mut(); 9];
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
