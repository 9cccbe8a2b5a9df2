//! `kvcore core-bench`: the engine-core benchmark (admit, commit and finish a
//! 4096-token prompt with an image, cold, cold under eviction and warm) with
//! the bare SHA-256 chain and the floor of the cold case (the least
//! bookkeeping a cold prompt needs, `kvcore_tools::bench::floor`), the five
//! cases interleaved in one run so that they share the machine's conditions,
//! reported as ratios to the chain: the ratio of the run's medians, and the
//! ratio within each round (each case's batch over the chain's batch of the
//! same round) as min / median / max, for all rounds and again split by the
//! core-sharing probe: the rounds in which this thread had its core to
//! itself, and the others (in which a second hardware thread shared the
//! core's execution units).

use kvcore_tools::bench::{
    BATCH, BLOCK_SIZE, CASES, PROMPT, UNSHARED_CEILING, UNSHARED_MARGIN, min_median_max, run_core_bench_with,
};

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
        let rounds = spread(&r.round_ratios(c));
        println!("{name:<20} {:>9.1} us {:>9.1} ns {:>8.2} {rounds:>22}", m * 1e6, m * 1e9 / blocks, m / bare);
    }
    let alone = r.unshared_rounds();
    let n_alone = alone.iter().filter(|&&a| a).count();
    println!(
        "core-sharing probe: lowest index {:.3}; {n_alone} of {} rounds within {:.0}% of it and at most {UNSHARED_CEILING} (core unshared), {} not (shared)",
        r.lowest_sharing().unwrap_or(f64::NAN),
        alone.len(),
        (UNSHARED_MARGIN - 1.0) * 100.0,
        alone.len() - n_alone,
    );
    println!("{:<20} {:>24} {:>24}", "ratio per round", "unshared (min/med/max)", "shared (min/med/max)");
    for (c, name) in CASES.iter().enumerate().skip(1) {
        let (unshared, shared) = r.round_ratios_by_sharing(c);
        println!("{name:<20} {:>24} {:>24}", spread(&unshared), spread(&shared));
    }
    0
}

/// Min / median / max of some ratios, or `-` when there are none.
fn spread(ratios: &[f64]) -> String {
    match min_median_max(ratios) {
        Some((lo, med, hi)) => format!("{lo:.2} / {med:.2} / {hi:.2}"),
        None => "-".to_owned(),
    }
}
