//! The GPU lab: measurements and kernel variants that `kvcore gpu-bench`
//! compares the library with, kept out of the library itself.
//!
//! | module | what |
//! |---|---|
//! | [`measure`] | the device's copy limits (device copy, pinned copies each way and both ways), event timing |
//! | [`blake3`] | the BLAKE3 kernels' lab variants (`cuda/lab/blake3_x.cu`) on the library's batches |
//! | [`host_explore`] | both-ways host-tier copies of fully scattered blocks: the library's kernel and paths against the lab kernels of `cuda/lab/host_copy_x.cu` and the copy engines |
//! | [`host_bounce`] | CPU threads gathering and scattering host pages through pinned bounce buffers for the copy engines |
//!
//! Everything here drives kvcore through its public `kvcore::gpu` API: the
//! lab compiles its own CUDA sources with NVRTC on the context of an open
//! [`Gpu`](kvcore::gpu::Gpu), with the options kvcore uses
//! ([`kvcore::gpu::nvrtc_options`]), and launches them on the library's
//! buffers through [`DigestBatch::launch_args`](kvcore::gpu::DigestBatch::launch_args).

pub mod blake3;
pub mod host_bounce;
pub mod host_explore;
pub mod measure;
