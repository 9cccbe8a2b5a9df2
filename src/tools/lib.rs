//! kvcore's tools: the fleet simulation that `cargo run --release` runs
//! ([`sim`], docs/simulation.md), the benchmark workloads shared by the
//! criterion benches and `kvcore core-bench` ([`bench`](mod@bench)), and the GPU lab
//! that `kvcore gpu-bench` compares the library's kernels with (`lab`, with
//! the `cuda` feature).
//!
//! The command-line tool (`cli/`) is this package's binary. Everything here
//! drives kvcore and kvcore-router through their public APIs only.

#![deny(unsafe_code)]

pub mod bench;
// The experiments launch their own kernels and hand device addresses to the
// driver; every unsafe block there names its invariant.
#[cfg(feature = "cuda")]
#[allow(unsafe_code, reason = "the GPU lab launches kernels and calls the driver; each block has a SAFETY comment")]
pub mod lab;
pub mod sim;
