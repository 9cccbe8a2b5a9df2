//! `kvcore core-bench`: the engine's cost per prompt (the workload of
//! `kvcore_tools::bench`) with the four cases interleaved in one run,
//! reported as ratios to the bare SHA-256 chain.

use kvcore_tools::bench::{BATCH, BLOCK_SIZE, CASES, PROMPT, run_core_bench};

/// Runs the bench and prints one line per case; returns the exit code.
pub fn run(reps: usize) -> i32 {
    if reps == 0 {
        eprintln!("kvcore core-bench: --reps must be at least 1");
        return 2;
    }
    let r = run_core_bench(reps);
    let blocks = (PROMPT / BLOCK_SIZE) as f64;
    let bare = r.median(0).as_secs_f64();
    println!("{reps} repetitions per case, interleaved in batches of {BATCH}; medians (wall clock, one thread)");
    println!("{:<20} {:>12} {:>12} {:>8}", "case", "per prompt", "per block", "ratio");
    for (c, name) in CASES.iter().enumerate() {
        let m = r.median(c).as_secs_f64();
        println!("{name:<20} {:>9.1} us {:>9.1} ns {:>8.2}", m * 1e6, m * 1e9 / blocks, m / bare);
    }
    0
}
