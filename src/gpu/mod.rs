//! GPU kernels and their bit-exact CPU twins.
//!
//! CUDA sources under `cuda/`, compiled at run time by NVRTC (no `nvcc`
//! is needed to build the crate):
//!
//! | kernel | what | CPU twin |
//! |---|---|---|
//! | `blake3_digest_*` | BLAKE3-256 of many device-resident byte strings, one launch (`_multi`, the default for large batches: hashes and group values) | [`digest::digest_grouped_cpu`] |
//! | `blake3_fold_sets` | the tree above the groups, for `_multi` batches with an item of several groups (the second of at most two launches) | the same |
//! | `blake3_digest_one_flag` | the same for one item passed by value, with a completion flag (the one-image call) | the same |
//! | `kv_block_copy` | a batch of block copies (offload, onboard, prefix reuse), one launch per conflict-free wave | [`pool::copy_blocks_cpu`] |
//! | `kv_block_copy_split` | the same for a wave that offloads and onboards at once, each direction with its own blocks and loads in flight | the same |
//! | `kv_seg_copy` | gather and scatter between the device pool and a staging buffer (staged host path) | the same |
//! | `kv_block_seg_copy` | the same for whole blocks of a block-major host tier, one record per block | the same |
//!
//! Host-tier copies can also go to the copy engines instead of the kernel
//! ([`dma`], chosen per wave by [`HostCopyPath`]): directly when both ends
//! form long runs, or through a device staging buffer for two-way waves of
//! at least [`dma::STAGED_MIN_BYTES`] each way whose host pages form long
//! runs; the SMs then only gather and scatter on the device, and long runs
//! reach the full PCIe rate both ways at once. The host tier is block-major by default
//! ([`HostLayout`]): a block's regions are one run of host memory, so even
//! blocks in random order reach 90-96 GB/s both ways through the staging
//! buffer, where the kernel stops near 80.
//!
//! Benchmark-only modules measure paths the library does not take:
//! [`host_explore`] (kernel and copy-engine variants for fully scattered
//! blocks) and [`host_bounce`] (CPU threads gathering scattered host pages
//! into pinned bounce slots for the copy engines).
//!
//! Why twins: the crate must build and pass every test where no CUDA exists,
//! and a kernel is only trusted when it agrees bit for bit with a CPU
//! computation that follows the same decomposition. The twins are also what
//! the engine uses when no GPU is present.
//!
//! `libcuda` and `libnvrtc` are loaded when first used ([`Gpu::probe`]), so a
//! machine without them gets an error value, never a panic, and callers fall
//! back to the CPU path.

pub mod digest;
pub mod pool;

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub mod dma;
#[cfg(feature = "cuda")]
pub mod host_bounce;
#[cfg(feature = "cuda")]
pub mod host_explore;
#[cfg(feature = "cuda")]
pub mod kernels;
#[cfg(feature = "cuda")]
pub mod launch;
#[cfg(feature = "cuda")]
pub mod measure;

#[cfg(feature = "cuda")]
pub use device::{
    CopyEngine, CopyWave, DeviceBytes, DigestBatch, Gpu, HostCopyPath, HostLayout, HostTier, OneItemPath,
    StagingConfig, launch_copy_wave,
};
pub use digest::digest_grouped_cpu;
pub use pool::{BlockGeometry, CopyOp, CpuKvPool, KvPool, copy_blocks_cpu, plan_copy_waves};

use thiserror::Error;

/// Why a GPU operation failed. Every variant leaves the caller free to fall
/// back to the CPU path.
#[derive(Debug, Error)]
pub enum GpuError {
    /// No usable CUDA driver or device (library missing, no device, or the
    /// crate was built without the `cuda` feature).
    #[error("no CUDA device available: {0}")]
    Unavailable(String),
    /// A driver call failed.
    #[cfg(feature = "cuda")]
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// NVRTC rejected a kernel source (the message holds its log).
    #[error("kernel compilation failed for {kernel}: {log}")]
    Compile {
        /// The module that failed.
        kernel: &'static str,
        /// The compiler's log.
        log: String,
    },
    /// An argument is out of range or inconsistent (a page past the pool, a
    /// host copy without a host tier, mismatched geometry...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}
