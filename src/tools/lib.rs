//! kvcore's tools: the fleet simulation that `cargo run --release` runs
//! ([`sim`], docs/simulation.md) and the benchmark workloads shared by the
//! criterion benches and `kvcore core-bench` ([`mod@bench`]).
//!
//! The command-line tool (`cli/`) is this package's binary. Everything here
//! drives kvcore and kvcore-router through their public APIs only.

pub mod bench;
pub mod sim;
