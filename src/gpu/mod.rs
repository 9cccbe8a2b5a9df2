//! GPU kernels and their bit-exact CPU twins.
//!
//! CUDA sources under `cuda/`, compiled at run time by NVRTC (no `nvcc`
//! is needed to build the crate):
//!
//! | kernel | what | CPU twin |
//! |---|---|---|
//! | `blake3_digest_*` | BLAKE3-256 of many device-resident byte strings, one launch (`_multi`, the default for large batches: hashes and group values) | [`digest_grouped_cpu`] |
//! | `blake3_fold_sets` | the tree above the groups, for `_multi` batches with an item of several groups (the second of at most two launches) | the same |
//! | `blake3_digest_one_flag` | the same for one item passed by value, with a completion flag (the one-image call) | the same |
//! | `kv_block_copy` | a batch of block copies (offload, onboard, prefix reuse), one launch per conflict-free wave | [`copy_blocks_cpu`] |
//! | `kv_block_copy_split` | the same for a wave that offloads and onboards at once, each direction with its own blocks and loads in flight | the same |
//! | `kv_seg_copy` | gather and scatter between the device pool and a staging buffer (staged host path) | the same |
//! | `kv_block_seg_copy` | the same for whole blocks of a block-major host tier, one record per block | the same |
//!
//! Host-tier copies can also go to the copy engines instead of the kernel
//! (chosen per wave by [`HostCopyPath`]): directly when both ends form long
//! runs, or through a device staging buffer for two-way waves of at least
//! [`STAGED_MIN_BYTES`] each way whose host pages form long runs; the SMs
//! then only gather and scatter on the device, and long runs reach the full
//! PCIe rate both ways at once. The host tier is block-major by default
//! ([`HostLayout`]): a block's regions are one run of host memory, so even
//! blocks in random order reach 90-96 GB/s both ways through the staging
//! buffer, where the kernel stops near 80.
//!
//! [`EngineGpu`] is the GPU side of one engine (open device, attached pool,
//! the step's pending copies); the C API's GPU calls are thin wrappers of
//! its methods. The types below it ([`Gpu`], [`AttachedPool`], [`HostTier`],
//! [`CopyWave`], [`DigestBatch`]) are for tests and benchmarks that drive
//! the kernels directly.
//!
//! Why twins: the crate must build and pass every test where no CUDA exists,
//! and a kernel is only trusted when it agrees bit for bit with a CPU
//! computation that follows the same decomposition. The twins are also what
//! the engine uses when no GPU is present.
//!
//! `libcuda` and `libnvrtc` are loaded when first used ([`Gpu::probe`]), so a
//! machine without them gets an error value, never a panic, and callers fall
//! back to the CPU path.
//!
//! Code outside the library may run kernels of its own next to kvcore's (the
//! tools' lab variants, `cuda/lab/`): [`Gpu::context`], [`Gpu::stream`] and
//! [`Gpu::arch`] give the device, [`nvrtc_options`] and [`ModuleId::source`]
//! compile a source as kvcore compiles its own, and
//! [`DigestBatch::launch_args`] hands a batch's buffers to a kernel of the
//! BLAKE3 table signature.
//!
//! Files, each using only those above it: `error`; `digest` and `pool` (CPU
//! twins, no CUDA); `kernels` (sources, module cache); `one_item`,
//! `digest_arena`, `digest_batch`, `dma` (launch arguments, buffers, run
//! lists); `device` ([`Gpu`]); `host_tier`; `attached_pool`; `wave`;
//! `launch` (one typed wrapper per kernel); `copy` and `device_digest` (what
//! a [`Gpu`] does with them); `engine_gpu`.

mod digest;
mod engine_gpu;
mod error;
mod pool;

#[cfg(feature = "cuda")]
mod attached_pool;
#[cfg(feature = "cuda")]
mod copy;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod device_digest;
#[cfg(feature = "cuda")]
mod digest_arena;
#[cfg(feature = "cuda")]
mod digest_batch;
#[cfg(feature = "cuda")]
mod dma;
#[cfg(feature = "cuda")]
mod host_tier;
#[cfg(feature = "cuda")]
mod kernels;
#[cfg(feature = "cuda")]
mod launch;
#[cfg(feature = "cuda")]
mod one_item;
#[cfg(feature = "cuda")]
mod wave;

pub use digest::{DeviceBytes, digest_grouped_cpu};
pub use engine_gpu::{DevicePool, EngineGpu};
pub use error::GpuError;
pub use pool::{BlockGeometry, CopyOp, CpuKvPool, KvPool, copy_blocks_cpu, plan_copy_waves};

#[cfg(feature = "cuda")]
pub use {
    attached_pool::{AttachedPool, HostCopyPath, StagingConfig},
    copy::launch_copy_wave,
    device::Gpu,
    device_digest::OneItemPath,
    digest_batch::{Blake3Item, DigestBatch, DigestLaunchArgs},
    dma::{LONG_RUN, STAGED_LONG_RUN, STAGED_MIN_BYTES, batch_api_in_use},
    host_tier::{HostLayout, HostTier},
    kernels::{KernelId, KernelOptions, ModuleCache, ModuleId, compile, nvrtc_available, nvrtc_options},
    wave::CopyWave,
};
