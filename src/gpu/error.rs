//! The GPU path's error type.

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
    /// host copy without a host tier, mismatched geometry, a device range
    /// outside CUDA's allocations, a pool attached twice...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An [`EngineGpu`](super::EngineGpu) call needs an open device and none
    /// is open.
    #[error("no GPU is open")]
    NotOpen,
    /// An [`EngineGpu`](super::EngineGpu) call needs an attached KV pool and
    /// none is attached.
    #[error("no KV pool is attached")]
    NotAttached,
}
