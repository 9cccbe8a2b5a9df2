//! kvcore's tools: the fleet simulation that `cargo run --release` runs
//! ([`sim`], docs/simulation.md), the benchmark workloads shared by the
//! criterion benches and `kvcore core-bench` ([`bench`](mod@bench)), and the GPU lab
//! that `kvcore gpu-bench` compares the library's kernels with (`lab`, with
//! the `cuda` feature).
//!
//! The command-line tool (`cli/`) is this package's binary. Everything here
//! drives kvcore and kvcore-router through their public APIs only.

pub mod bench;
#[cfg(feature = "cuda")]
pub mod lab;
pub mod sim;
