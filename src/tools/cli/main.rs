//! The kvcore command-line tool.

#![deny(unsafe_code)]

use clap::{Parser, Subcommand};

/// Counts the bytes live, for the memory rows of `route-bench --native`: one
/// relaxed atomic add per allocation and free.
#[global_allocator]
static ALLOC: kvcore_tools::bench::alloc::CountingAlloc = kvcore_tools::bench::alloc::CountingAlloc;

mod core_bench;
mod demo;
mod events;
mod fleet;
// The GPU benchmark hands device addresses to the library's digest calls.
#[allow(
    unsafe_code,
    reason = "gpu-bench passes device ranges it allocated to unsafe digest calls; each block has a SAFETY comment"
)]
mod gpu_bench;
mod hybrid_memory;
mod relay;
mod replay_calls;
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
    /// The engine's own cost per prompt: admit, commit and finish of a
    /// 4096-token prompt (128 blocks of 32 tokens, one 1024-token image
    /// given by its digest), cold, cold under eviction and warm, interleaved
    /// with the bare SHA-256 chain that the block keys compute over the same
    /// bytes and with the floor of the cold case (the least bookkeeping a
    /// cold prompt needs, written plainly), and reported as ratios to the
    /// chain, per round too, split by a probe of whether another hardware
    /// thread shared the core.
    CoreBench {
        /// Repetitions of each case.
        #[arg(long, default_value_t = 2000)]
        reps: usize,
        /// Every engine records a call log (discarded), to measure its cost.
        #[arg(long)]
        record_calls: bool,
    },
    /// A short demonstration of the engine that prints its events.
    Demo,
    /// Tail, record or replay a KV event stream.
    Events(events::EventsArgs),
    /// One engine as a fleet member: its event publisher and a JSON control
    /// socket that a serving front end hands routed requests to.
    FleetEngine(fleet::FleetEngineArgs),
    /// Measures the GPU kernels against the device's copy limits (JSON report).
    ///
    /// By default every part runs: the copy limits, the digests (every
    /// BLAKE3 kernel and lab variant), device copies and the host-tier
    /// paths. `--only PART` runs one part alone.
    GpuBench(gpu_bench::GpuBenchArgs),
    /// The memory a sliding window saves: the chat workload on one engine of
    /// two KV cache groups, the second full attention or a sliding window,
    /// and the blocks each group holds (peak and mean).
    HybridMemory(hybrid_memory::HybridMemoryArgs),
    /// Republish N engines' event streams with image identities the whole
    /// fleet agrees on: an image whose UUID two workers hold for different
    /// pixels goes out under its content's `mm_hash`, so that a router
    /// reading only `block_mm_infos` (Dynamo) never matches it by UUID.
    /// Prints one JSON line with the republished endpoints, then runs until
    /// killed.
    Relay(relay::RelayArgs),
    /// Measures the relay: latency of engines' batches read directly and
    /// through a relay, and the relay's CPU time per batch (JSON report).
    RelayBench(relay::BenchArgs),
    /// Hash a request and print each worker's overlap and the routing decision.
    Route(route::RouteArgs),
    /// Benchmark the router's indexer, side by side with Dynamo's (`--dynamo`).
    RouteBench(route::BenchArgs),
    /// Replay a call log into a fresh engine and report the first call whose
    /// output differs from the log (exit 1), or that every call matched (exit 0).
    ReplayCalls(replay_calls::ReplayCallsArgs),
    /// The fleet simulation: routing policies compared on real engines (the default).
    Sim(sim::SimArgs),
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Demo) => demo::run(),
        Some(Command::CoreBench { reps, record_calls }) => std::process::exit(core_bench::run(reps, record_calls)),
        Some(Command::Sim(args)) => std::process::exit(sim::run(&args)),
        Some(Command::ReplayCalls(args)) => std::process::exit(replay_calls::run(&args)),
        None => std::process::exit(sim::run(&sim::SimArgs::default())),
        Some(Command::Events(args)) => {
            if let Err(e) = events::run(args) {
                eprintln!("kvcore events: {e}");
                std::process::exit(1);
            }
        }
        Some(Command::FleetEngine(args)) => {
            if let Err(e) = fleet::run(args) {
                eprintln!("kvcore fleet-engine: {e}");
                std::process::exit(1);
            }
        }
        Some(Command::GpuBench(args)) => std::process::exit(gpu_bench::run_cli(&args)),
        Some(Command::HybridMemory(args)) => std::process::exit(hybrid_memory::run(&args)),
        Some(Command::Relay(args)) => {
            if let Err(e) = relay::run(args) {
                eprintln!("kvcore relay: {e}");
                std::process::exit(1);
            }
        }
        Some(Command::RelayBench(args)) => {
            if let Err(e) = relay::bench(args) {
                eprintln!("kvcore relay-bench: {e}");
                std::process::exit(1);
            }
        }
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
