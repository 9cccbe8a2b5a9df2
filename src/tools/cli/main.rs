//! The kvcore command-line tool.

use clap::{Parser, Subcommand};

mod core_bench;
mod demo;
mod events;
mod gpu_bench;
mod route;
mod sim;

/// kvcore: a KV-cache engine core for LLM serving.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Issue 2's engine benchmark: admit + commit + finish of a 4096-token
    /// prompt, cold, cold under eviction and warm, interleaved with the bare
    /// SHA-256 chain and reported as ratios to it.
    CoreBench {
        /// Repetitions of each case.
        #[arg(long, default_value_t = 2000)]
        reps: usize,
    },
    /// A short demonstration of the engine that prints its events.
    Demo,
    /// Tail, record or replay a KV event stream.
    Events(events::EventsArgs),
    /// Measures the GPU kernels against the device's copy limits (JSON report).
    ///
    /// Environment: `KVCORE_GPU_BENCH_ONLY=blake3` runs the digests alone,
    /// `host` the host tier's both-ways variants for fully scattered blocks
    /// and `host-explore` every experiment of them, `host-runs` both ways
    /// with host pages in runs of 1 to 64 consecutive pages, then with the
    /// offloads' host pages in long runs and the onboards' scattered and the
    /// reverse (`KVCORE_GPU_BENCH_RUNS=mixed`: more of these), `replay` the
    /// `kvcore sim --record-copies` logs named in `KVCORE_GPU_BENCH_REPLAY`
    /// (comma-separated; `KVCORE_GPU_BENCH_REPLAY_BLOCK_KIB`, default 128;
    /// `KVCORE_GPU_BENCH_REPLAY_PATHS`, default `auto`, also `kernel`,
    /// `staged`, `copy-engines`), `host-bounce` CPU threads gathering and
    /// scattering host pages through pinned bounce slots for the copy engines;
    /// `KVCORE_GPU_BENCH_BLOCKS` sets their block sizes in KiB (default
    /// `8,16`; `8,16,64` for `host-runs` and `host-bounce`);
    /// `KVCORE_GPU_BENCH_DIGEST_MIB` sets the digest data (default 288).
    GpuBench {
        /// Where to write the JSON report (stdout when absent).
        #[arg(long)]
        out: Option<String>,
        /// Smaller sizes, for a smoke run.
        #[arg(long)]
        quick: bool,
    },
    /// Hash a request and print each worker's overlap and the routing decision.
    Route(route::RouteArgs),
    /// Benchmark the router's indexer, side by side with Dynamo's (`--dynamo`).
    RouteBench(route::BenchArgs),
    /// The fleet simulation: routing policies compared on real engines (the default).
    Sim(sim::SimArgs),
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Demo) => demo::run(),
        Some(Command::CoreBench { reps }) => std::process::exit(core_bench::run(reps)),
        Some(Command::Sim(args)) => std::process::exit(sim::run(&args)),
        None => std::process::exit(sim::run(&sim::SimArgs::default())),
        Some(Command::Events(args)) => {
            if let Err(e) = events::run(args) {
                eprintln!("kvcore events: {e}");
                std::process::exit(1);
            }
        }
        Some(Command::GpuBench { out, quick }) => std::process::exit(gpu_bench::run_cli(out.as_deref(), quick)),
        Some(Command::Route(args)) => {
            if let Err(e) = route::run(args) {
                eprintln!("kvcore route: {e}");
                std::process::exit(1);
            }
        }
        Some(Command::RouteBench(args)) => {
            if let Err(e) = route::bench(args) {
                eprintln!("kvcore route-bench: {e}");
                std::process::exit(1);
            }
        }
    }
}
