//! `kvcore core-bench`: the engine-core benchmark (admit, commit and finish a
//! 4096-token prompt with an image, cold, cold under eviction and warm) with
//! the bare SHA-256 chain, the four cases interleaved in one run so that they
//! share the machine's conditions, reported as ratios to the chain: the
//! ratio of the run's medians, and the ratio within each round (each case's
//! batch over the chain's batch of the same round) as min / median / max.

use kvcore_tools::bench::{BATCH, BLOCK_SIZE, CASES, PROMPT, min_median_max, run_core_bench_with};

/// Runs the bench and prints one line per case; returns the exit code.
/// `record_calls`: every engine records a call log (into a sink that
/// discards it), to measure what recording costs.
pub fn run(reps: usize, record_calls: bool) -> i32 {
    if reps == 0 {
        eprintln!("kvcore core-bench: --reps must be at least 1");
        return 2;
    }
    let r = run_core_bench_with(reps, record_calls);
    let blocks = (PROMPT / BLOCK_SIZE) as f64;
    let bare = r.median(0).as_secs_f64();
    let log = if record_calls { ", every engine recording its calls" } else { "" };
    println!("{reps} repetitions per case, interleaved in batches of {BATCH}{log}; medians (wall clock, one thread)");
    println!(
        "{:<20} {:>12} {:>12} {:>8} {:>22}",
        "case", "per prompt", "per block", "ratio", "per round (min/med/max)"
    );
    for (c, name) in CASES.iter().enumerate() {
        let m = r.median(c).as_secs_f64();
        let rounds = match min_median_max(&r.round_ratios(c)) {
            Some((lo, med, hi)) => format!("{lo:.2} / {med:.2} / {hi:.2}"),
            None => "-".to_owned(),
        };
        println!("{name:<20} {:>9.1} us {:>9.1} ns {:>8.2} {rounds:>22}", m * 1e6, m * 1e9 / blocks, m / bare);
    }
    0
}
