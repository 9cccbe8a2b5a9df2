//! One open CUDA device: its primary context, the stream kvcore's kernels run
//! on, the module cache, and the checks of caller-given device addresses.
//!
//! What the device does lives in the modules above this one: digests
//! (`device_digest`), the attached pool (`attached_pool`), copy waves
//! (`wave`, `copy`). They extend [`Gpu`] with `impl` blocks of their own, so
//! that this file holds only what every one of them needs.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, sys};

use super::digest_arena::DigestArena;
use super::error::GpuError;
use super::kernels::{KernelId, KernelOptions, ModuleCache, arch_for};

/// One CUDA device as kvcore uses it: its primary context, one stream on
/// which every kernel of this handle runs in order, and the module cache.
#[derive(Debug)]
pub struct Gpu {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    modules: ModuleCache,
    sm_count: u32,
    name: String,
    /// Reusable buffers of [`Gpu::digest_device`], grown when a call needs
    /// more (`device_digest` owns what is inside).
    pub(super) arena: Mutex<Option<DigestArena>>,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // The digest arena's graph names a function of the module cache:
        // destroy it, and free the arena's buffers, while the modules are
        // loaded and the stream lives (fields drop in declaration order,
        // the arena last).
        let _ = self.stream.synchronize();
        if let Ok(mut a) = self.arena.lock() {
            *a = None;
        }
    }
}

impl Gpu {
    /// Opens device `ordinal`, or says why it cannot. Never panics: a missing
    /// `libcuda` or `libnvrtc` (which cudarc's dynamic loading reports by
    /// panicking) and a machine without a device both become
    /// [`GpuError::Unavailable`], so callers fall back to the CPU path.
    pub fn probe(ordinal: usize) -> Result<Arc<Gpu>, GpuError> {
        Self::probe_with(ordinal, KernelOptions::default())
    }

    /// As [`Gpu::probe`], compiling the kernels with `options` (benchmarks
    /// compare variants with one handle each).
    pub fn probe_with(ordinal: usize, options: KernelOptions) -> Result<Arc<Gpu>, GpuError> {
        options.validate()?;
        let opened = std::panic::catch_unwind(|| -> Result<Gpu, GpuError> {
            // SAFETY: `is_culib_present` only tries to dlopen the library by its
            // usual names and drops the handle; it touches no CUDA state.
            if !unsafe { sys::is_culib_present() } {
                return Err(GpuError::Unavailable("libcuda was not found".to_owned()));
            }
            // SAFETY: as above, for libnvrtc.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err(GpuError::Unavailable("libnvrtc was not found".to_owned()));
            }
            let ctx = CudaContext::new(ordinal)?;
            let (major, minor) = ctx.compute_capability()?;
            let sm_count =
                ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
            let name = ctx.name()?;
            let stream = ctx.new_stream()?;
            let modules = ModuleCache::new(Arc::clone(&ctx), arch_for(major, minor), options);
            Ok(Gpu { ctx, stream, modules, sm_count, name, arena: Mutex::new(None) })
        });
        match opened {
            Ok(Ok(gpu)) => Ok(Arc::new(gpu)),
            Ok(Err(GpuError::Driver(e))) => Err(GpuError::Unavailable(format!("{e}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(GpuError::Unavailable("loading the CUDA libraries panicked".to_owned())),
        }
    }

    /// The context (the device's primary context): with [`Gpu::stream`] and
    /// [`Gpu::arch`], what code outside the library needs to load and
    /// launch kernels of its own next to kvcore's.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every kernel of this handle runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The NVRTC target kvcore's modules are compiled for on this device
    /// (see [`nvrtc_options`](super::nvrtc_options)).
    pub fn arch(&self) -> Option<&'static str> {
        self.modules.arch()
    }

    /// Multiprocessors on the device.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compiles and loads every kernel now (otherwise the first use does).
    pub fn warm(&self) -> Result<(), GpuError> {
        self.modules.warm()
    }

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        Ok(self.stream.synchronize()?)
    }

    /// Checks that `[ptr, ptr + len)` lies inside one live allocation of
    /// device memory on this handle's device, so that a kernel given it
    /// cannot fault on a made-up or freed address or on another GPU's
    /// memory. [`EngineGpu`](super::EngineGpu) checks every device address
    /// it is given with this. An empty range passes whatever `ptr` is. What
    /// it cannot see: memory freed after the check.
    pub fn check_device_range(&self, ptr: u64, len: u64, what: &str) -> Result<(), GpuError> {
        if len == 0 {
            return Ok(());
        }
        let bad = |why: String| Err(GpuError::InvalidArgument(format!("{what}: {why}")));
        let Some(end) = ptr.checked_add(len) else {
            return bad(format!("{len} bytes from {ptr:#x} pass the end of the address space"));
        };
        self.ctx.bind_to_thread()?;
        let (mut start, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        let (mut kind, mut ordinal): (u32, i32) = (0, -1);
        let attr = |out: *mut std::ffi::c_void, a: sys::CUpointer_attribute| {
            // SAFETY: each call below passes an out-pointer to a value of the
            // attribute's type (CUdeviceptr for RANGE_START_ADDR, size_t for
            // RANGE_SIZE, an unsigned int CUmemorytype for MEMORY_TYPE, an
            // int for DEVICE_ORDINAL), and `ptr` is only read as a number:
            // an address no allocation holds gets an error code, not a fault.
            unsafe { sys::cuPointerGetAttribute(out, a, ptr) }.result()
        };
        use sys::CUpointer_attribute as A;
        let found = attr((&mut kind as *mut u32).cast(), A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
            .and_then(|()| attr((&mut ordinal as *mut i32).cast(), A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL))
            .and_then(|()| attr((&mut start as *mut sys::CUdeviceptr).cast(), A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR))
            .and_then(|()| attr((&mut size as *mut usize).cast(), A::CU_POINTER_ATTRIBUTE_RANGE_SIZE));
        if let Err(e) = found {
            return bad(format!("{ptr:#x} is not in memory CUDA has allocated ({e})"));
        }
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return bad(format!("{ptr:#x} is not device memory (CUmemorytype {kind})"));
        }
        if ordinal != self.ctx.ordinal() as i32 {
            return bad(format!(
                "{ptr:#x} is memory of device {ordinal}, not of the open device {}",
                self.ctx.ordinal()
            ));
        }
        if end > start + size as u64 {
            return bad(format!(
                "{len} bytes from {ptr:#x} pass the end of their allocation ({size} bytes from {start:#x})"
            ));
        }
        Ok(())
    }

    /// The module cache of this context.
    pub fn modules(&self) -> &ModuleCache {
        &self.modules
    }

    /// A kernel's function, compiled and loaded on first use.
    pub(super) fn function(&self, id: KernelId) -> Result<CudaFunction, GpuError> {
        self.modules.function(id)
    }
}
