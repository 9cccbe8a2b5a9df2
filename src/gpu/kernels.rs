//! Kernel identities, their embedded sources, and the per-context module cache.
//!
//! Sources are embedded with `include_str!` and compiled by NVRTC the first
//! time a context needs them (about 140 ms per module), for the device's own
//! compute capability. Each [`Gpu`](super::Gpu) holds one [`ModuleCache`], so
//! a module is compiled and loaded once per context, and two contexts never
//! share a loaded module (a module belongs to the context that loaded it).

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use super::error::GpuError;

/// A CUDA source file: one NVRTC compilation, one loaded module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModuleId {
    /// `cuda/blake3.cu`.
    Blake3,
    /// `cuda/block_copy.cu`.
    BlockCopy,
    /// `cuda/blake3.cu` with the two-chunks-per-thread kernels (`B3_PAIR`):
    /// one group per warp, or four per block folded side by side.
    Blake3Pair,
    /// `cuda/blake3.cu` with the one-image kernel (`B3_ONE`).
    Blake3One,
}

impl ModuleId {
    /// Every module.
    pub const ALL: [ModuleId; 4] = [ModuleId::Blake3, ModuleId::BlockCopy, ModuleId::Blake3Pair, ModuleId::Blake3One];

    /// The full source NVRTC compiles: the tuning defines, the shared
    /// header, then the file.
    pub fn source(self, options: &KernelOptions) -> String {
        let common = include_str!("../../cuda/common.cuh");
        let (defines, body) = match self {
            ModuleId::Blake3 => (String::new(), include_str!("../../cuda/blake3.cu")),
            ModuleId::Blake3Pair => (
                format!("#define B3_PAIR 1\n#define B3_MULTI {BLAKE3_MULTI_GROUPS}\n"),
                include_str!("../../cuda/blake3.cu"),
            ),
            ModuleId::Blake3One => ("#define B3_ONE 1\n".to_owned(), include_str!("../../cuda/blake3.cu")),
            ModuleId::BlockCopy => (
                format!(
                    "#define COPY_UNROLL {}\n#define COPY_UNROLL_WRITE {}\n#define COPY_UNROLL_READ {}\n#define COPY_WRITE_SHARE {}\n",
                    options.copy_unroll, options.copy_unroll_write, options.copy_unroll_read, options.copy_write_share
                ),
                include_str!("../../cuda/block_copy.cu"),
            ),
        };
        format!("{defines}{common}\n{body}")
    }

    /// The file name, for error messages and NVRTC's program name.
    pub fn file_name(self) -> &'static str {
        match self {
            ModuleId::Blake3 | ModuleId::Blake3Pair | ModuleId::Blake3One => "blake3.cu",
            ModuleId::BlockCopy => "block_copy.cu",
        }
    }
}

/// Compile-time tuning of the kernels (benchmarks sweep them; the defaults
/// are the measured best on an H200, see docs/benchmarks.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOptions {
    /// 16-byte loads each lane keeps in flight in the copy kernel (device
    /// copies, and host copies of waves that go one way).
    pub copy_unroll: u32,
    /// The same for host writes (offload) of a wave that also reads the
    /// host tier.
    pub copy_unroll_write: u32,
    /// The same for host reads (onboard) of such a wave: fewer read
    /// requests in flight leave PCIe room for the writes.
    pub copy_unroll_read: u32,
    /// Sixteenths of the thread blocks that do the host writes of such a
    /// wave (the rest do the reads); 8 is half.
    pub copy_write_share: u32,
}

impl Default for KernelOptions {
    /// Measured on an H200: 8 loads in flight for one-way waves; for both
    /// ways at once 16 for writes, 4 for reads, and 10 of 16 blocks writing,
    /// so that the two directions end together (fully scattered blocks
    /// both ways: 76-81 GB/s, against 66-69 with
    /// [`KernelOptions::even_split`]).
    fn default() -> Self {
        Self { copy_unroll: 8, copy_unroll_write: 16, copy_unroll_read: 4, copy_write_share: 10 }
    }
}

impl KernelOptions {
    /// The even split: 8 loads in flight both ways and half of the blocks
    /// each way, the baseline the defaults were measured against (tests and
    /// benchmarks compare with it).
    pub fn even_split() -> Self {
        Self { copy_unroll_write: 8, copy_unroll_read: 8, copy_write_share: 8, ..Self::default() }
    }

    /// Checks the values the sources accept.
    pub fn validate(&self) -> Result<(), GpuError> {
        let unrolls = [self.copy_unroll, self.copy_unroll_write, self.copy_unroll_read];
        if unrolls.iter().any(|u| !(1..=16).contains(u)) || !(1..=15).contains(&self.copy_write_share) {
            return Err(GpuError::InvalidArgument(format!("unsupported kernel options {self:?}")));
        }
        Ok(())
    }
}

/// Groups per block of `blake3_digest_multi`: the module is compiled with
/// `B3_MULTI` set to it, and launches size their grid by it (4 measured
/// best on an H200: 2 and 8 were slower, docs/benchmarks.md).
pub const BLAKE3_MULTI_GROUPS: u32 = 4;

/// A kernel entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    /// A whole digest batch (chunk values, group folds, the tree above),
    /// additions as plain adds: shortest latency, for batches that leave SMs idle.
    Blake3Latency,
    /// The same with additions spread over the ALU and FMA pipes: highest
    /// throughput when every SM is full.
    Blake3Throughput,
    /// As `Blake3Throughput`, one warp per group and two whole chunks per
    /// thread hashed side by side (twice the independent work per thread).
    Blake3Pair,
    /// As `Blake3Pair`, four groups (warps) per block whose folds share the
    /// block's lanes: the fold of a group costs 2.5 warp compressions
    /// instead of 6. The default for large batches. Its warps do not climb:
    /// they store their groups' values, and `Blake3FoldSets`, launched after
    /// it when some item has several groups, folds the levels above.
    Blake3Multi,
    /// A wave of block copies.
    KvBlockCopy,
    /// One item passed by value (no table read before the first load), one
    /// thread per chunk, plain additions, with a completion flag in host
    /// memory: the one-image call (its own signature).
    Blake3One,
    /// Segment copies between the device pool and a staging buffer (the
    /// staged host path's gather and scatter).
    KvSegCopy,
    /// A wave of block copies that both writes and reads the host tier,
    /// each direction with its own loads in flight and share of the blocks
    /// ([`KernelOptions`]); its own entry point so that its registers do not
    /// weigh on `KvBlockCopy`.
    KvBlockCopySplit,
    /// The second launch of `Blake3Multi` (same signature): the folds of
    /// every item's sets of 64 values, level by level, up to the digests.
    Blake3FoldSets,
    /// Whole blocks between the device pool and a staging slot laid out
    /// like the block-major host tier (the staged path's gather and scatter
    /// when every copy of a direction is a whole block): one 16-byte
    /// record per block instead of a segment per block and region.
    KvBlockSegCopy,
}

impl KernelId {
    /// Every kernel.
    pub const ALL: [KernelId; 10] = [
        KernelId::Blake3Latency,
        KernelId::Blake3Throughput,
        KernelId::Blake3Pair,
        KernelId::Blake3Multi,
        KernelId::KvBlockCopy,
        KernelId::Blake3One,
        KernelId::KvSegCopy,
        KernelId::KvBlockCopySplit,
        KernelId::Blake3FoldSets,
        KernelId::KvBlockSegCopy,
    ];

    /// The kernels the default paths launch.
    pub const USED: [KernelId; 8] = [
        KernelId::Blake3Latency,
        KernelId::Blake3One,
        KernelId::Blake3Multi,
        KernelId::KvBlockCopy,
        KernelId::KvSegCopy,
        KernelId::KvBlockCopySplit,
        KernelId::Blake3FoldSets,
        KernelId::KvBlockSegCopy,
    ];

    /// The BLAKE3 kernels that take an item table (one signature, one table layout).
    pub const BLAKE3: [KernelId; 4] =
        [KernelId::Blake3Latency, KernelId::Blake3Throughput, KernelId::Blake3Pair, KernelId::Blake3Multi];

    /// Threads per block a BLAKE3 kernel is launched with.
    pub fn blake3_block(self) -> u32 {
        match self {
            KernelId::Blake3Pair => 32,
            KernelId::Blake3Multi | KernelId::Blake3FoldSets => 32 * BLAKE3_MULTI_GROUPS,
            _ => 64,
        }
    }

    /// Groups of 64 chunks one block of a BLAKE3 kernel hashes (the grid is
    /// the batch's groups divided by it, rounded up).
    pub fn blake3_groups_per_block(self) -> u32 {
        match self {
            KernelId::Blake3Multi => BLAKE3_MULTI_GROUPS,
            _ => 1,
        }
    }

    /// The module that holds the kernel.
    pub fn module(self) -> ModuleId {
        match self {
            KernelId::Blake3Latency | KernelId::Blake3Throughput => ModuleId::Blake3,
            KernelId::Blake3Pair | KernelId::Blake3Multi | KernelId::Blake3FoldSets => ModuleId::Blake3Pair,
            KernelId::KvBlockCopy | KernelId::KvSegCopy | KernelId::KvBlockCopySplit | KernelId::KvBlockSegCopy => {
                ModuleId::BlockCopy
            }
            KernelId::Blake3One => ModuleId::Blake3One,
        }
    }

    /// The `extern "C"` name in the source.
    pub fn name(self) -> &'static str {
        match self {
            KernelId::Blake3Latency => "blake3_digest_latency",
            KernelId::Blake3Throughput => "blake3_digest_throughput",
            KernelId::Blake3Pair => "blake3_digest_pair",
            KernelId::Blake3Multi => "blake3_digest_multi",
            KernelId::KvBlockCopy => "kv_block_copy",
            KernelId::Blake3One => "blake3_digest_one_flag",
            KernelId::KvSegCopy => "kv_seg_copy",
            KernelId::KvBlockCopySplit => "kv_block_copy_split",
            KernelId::Blake3FoldSets => "blake3_fold_sets",
            KernelId::KvBlockSegCopy => "kv_block_seg_copy",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The NVRTC target for a compute capability: the virtual architecture, so
/// that the driver finishes compilation for the exact chip.
pub fn arch_for(major: i32, minor: i32) -> Option<&'static str> {
    Some(match (major, minor) {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

/// Whether `libnvrtc` can be loaded (compilation needs it, a device does not).
pub fn nvrtc_available() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the library by its usual
    // names and drops the handle; it touches no CUDA state.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The NVRTC options kvcore compiles its modules with, for the target `arch`
/// ([`Gpu::arch`](super::Gpu::arch)) and the program name `name`: C++17, no
/// other flag. Offered so that code outside the library (the tools' lab
/// kernels) compiles its own sources exactly as kvcore compiles its own.
pub fn nvrtc_options(arch: Option<&'static str>, name: &str) -> CompileOptions {
    CompileOptions { arch, name: Some(name.to_owned()), options: vec!["--std=c++17".to_owned()], ..Default::default() }
}

/// Compiles one module to PTX. Needs `libnvrtc` but no device.
pub fn compile(module: ModuleId, arch: Option<&'static str>, options: &KernelOptions) -> Result<Ptx, GpuError> {
    options.validate()?;
    let opts = nvrtc_options(arch, module.file_name());
    cudarc::nvrtc::compile_ptx_with_opts(module.source(options), opts).map_err(|e| GpuError::Compile {
        kernel: module.file_name(),
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        },
    })
}

/// Compiled modules and loaded functions of one context.
#[derive(Debug)]
pub struct ModuleCache {
    ctx: Arc<CudaContext>,
    arch: Option<&'static str>,
    options: KernelOptions,
    modules: Mutex<[Option<Arc<CudaModule>>; ModuleId::ALL.len()]>,
    functions: Mutex<[Option<CudaFunction>; KernelId::ALL.len()]>,
}

impl ModuleCache {
    /// An empty cache for `ctx`, compiling for `arch` with `options`.
    pub fn new(ctx: Arc<CudaContext>, arch: Option<&'static str>, options: KernelOptions) -> Self {
        Self { ctx, arch, options, modules: Mutex::new(Default::default()), functions: Mutex::new(Default::default()) }
    }

    /// The options the modules are compiled with.
    pub fn options(&self) -> KernelOptions {
        self.options
    }

    /// The NVRTC target the modules are compiled for (`None`: NVRTC's
    /// default, for a compute capability `arch_for` does not know).
    pub fn arch(&self) -> Option<&'static str> {
        self.arch
    }

    /// The kernel's function, compiling and loading its module on first use.
    pub fn function(&self, id: KernelId) -> Result<CudaFunction, GpuError> {
        let mut functions = self.functions.lock().expect("module cache lock is never poisoned by a panic inside");
        if let Some(f) = &functions[id.index()] {
            return Ok(f.clone());
        }
        let module = self.module(id.module())?;
        let f = module.load_function(id.name())?;
        functions[id.index()] = Some(f.clone());
        Ok(f)
    }

    fn module(&self, id: ModuleId) -> Result<Arc<CudaModule>, GpuError> {
        let mut modules = self.modules.lock().expect("module cache lock is never poisoned by a panic inside");
        let slot = &mut modules[id as usize];
        if let Some(m) = slot {
            return Ok(Arc::clone(m));
        }
        let m = self.ctx.load_module(compile(id, self.arch, &self.options)?)?;
        *slot = Some(Arc::clone(&m));
        Ok(m)
    }

    /// Compiles and loads the modules of the kernels the default paths use
    /// ([`KernelId::USED`]) now, so that the first real call pays no
    /// compilation.
    pub fn warm(&self) -> Result<(), GpuError> {
        for k in KernelId::USED {
            self.function(k)?;
        }
        Ok(())
    }
}
