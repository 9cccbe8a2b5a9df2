//! `kvcore sim` (the default command): the fleet simulation of
//! `kvcore::sim`, on the built-in chat workload or a Mooncake trace.

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvcore_tools::sim::{ChatConfig, PolicyKind, SimConfig, Workload, chat_workload, mooncake_workload, simulate};

/// The Mooncake trace's path relative to the repository root.
const DEFAULT_TRACE: &str = "../shared/data/traces/mooncake_conversation_trace.jsonl";

/// Options of `kvcore sim`.
#[derive(Args, Debug, Default)]
pub struct SimArgs {
    /// Replay a Mooncake trace (JSON lines) instead of the chat workload; with
    /// no value, the conversation trace under ../shared/data/traces/.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = DEFAULT_TRACE)]
    trace: Option<PathBuf>,
    /// Keep only the first N requests of the trace.
    #[arg(long, value_name = "N")]
    requests: Option<usize>,
    /// Chat sessions of the built-in workload.
    #[arg(long, value_name = "N")]
    sessions: Option<u32>,
    /// Seed of the built-in workload.
    #[arg(long)]
    seed: Option<u64>,
    /// Mean think time between turns of a chat session, in milliseconds.
    #[arg(long, value_name = "MS")]
    think_time_ms: Option<f64>,
    /// Mean time between chat session starts, in milliseconds.
    #[arg(long, value_name = "MS")]
    session_interarrival_ms: Option<f64>,
    /// Workers in the fleet (default: 4).
    #[arg(long)]
    workers: Option<u32>,
    /// Tokens per KV block (default: 32; 64 with --trace).
    #[arg(long)]
    block_size: Option<u32>,
    /// Device blocks per worker (default: 1024; 16384 with --trace).
    #[arg(long)]
    blocks_device: Option<u32>,
    /// Host-tier blocks per worker (default: 1024; 16384 with --trace).
    #[arg(long)]
    blocks_host: Option<u32>,
    /// Prefill cost per computed prompt token, in microseconds (default: 125;
    /// 40 with --trace, whose prompts are ten times longer).
    #[arg(long, value_name = "US")]
    prefill_us_per_token: Option<f64>,
    /// Decode cost per generated token, in microseconds (default: 40).
    #[arg(long, value_name = "US")]
    decode_us_per_token: Option<f64>,
    /// Engines offload every device block a request takes the place of
    /// before onboarding (`EngineConfig::offload_first`): fewer copy waves,
    /// lower hit rate.
    #[arg(long)]
    offload_first: bool,
    /// Write worker 0's block copies under the first policy, step by step,
    /// to FILE (JSON), for `kvcore gpu-bench` to replay
    /// (`kvcore gpu-bench --only replay --replay FILE`).
    #[arg(long, value_name = "FILE")]
    record_copies: Option<PathBuf>,
    /// A hybrid model: every engine runs two KV cache groups, full attention
    /// and a sliding window of WINDOW tokens, splitting the same per-worker
    /// blocks (the window group gets the pages 16 live windows span, at most
    /// half; see docs/simulation.md). Default: one full-attention group.
    #[arg(long, value_name = "WINDOW_TOKENS")]
    hybrid: Option<u32>,
    /// Simulated delay from an engine's step to its events reaching a
    /// router, in milliseconds (default: 5).
    #[arg(long, value_name = "MS")]
    delay_ms: Option<f64>,
    /// Comma-separated delays of the sweep, in milliseconds (default:
    /// 0,50,100; the default delay is a point too); `--sweep-delays-ms ''` for none.
    #[arg(long, value_name = "MS", value_delimiter = ',')]
    sweep_delays_ms: Option<Vec<String>>,
    /// Do not run the event-fed policies again with predicted blocks.
    #[arg(long)]
    no_predictions: bool,
    /// How long a router's own decision stays a predicted block, in
    /// milliseconds (default: 10000).
    #[arg(long, value_name = "MS")]
    prediction_ttl_ms: Option<f64>,
    /// What a router pays per byte of decoded pixels to hash an image with
    /// BLAKE3, in nanoseconds (default: measured on this CPU at start-up,
    /// the median of 15 hashes at each image size of the workload).
    #[arg(long, value_name = "NS")]
    hash_ns_per_byte: Option<f64>,
    /// Probability that a request naming a UUID sends other pixels under it
    /// (default: 0.05).
    #[arg(long, value_name = "P")]
    uuid_reuse: Option<f64>,
    /// Passes run at once (default: one per core).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Comma-separated policies to run (default: all).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Put the engines' publishers on PORT, PORT+1, ... (replay sockets on
    /// PORT+N, PORT+N+1, ... for N workers) instead of free ports; needs a
    /// run of one pass (one wire-fed policy, `--sweep-delays-ms ''`,
    /// `--no-predictions`).
    #[arg(long, value_name = "PORT")]
    base_port: Option<u16>,
    /// Write summary.json, requests.jsonl, plot.svg and sweep.svg into DIR.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn build(args: &SimArgs) -> Result<(Workload, SimConfig), String> {
    let mut config = SimConfig {
        base_port: args.base_port,
        offload_first: args.offload_first,
        record_copies: args.record_copies.is_some(),
        ..Default::default()
    };
    if let Some(w) = args.workers {
        config.workers = w;
    }
    let workload = match &args.trace {
        Some(path) => {
            let path = if path.is_relative() && !path.exists() {
                // Relative defaults are relative to the repository root.
                PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(path)
            } else {
                path.clone()
            };
            config.block_size_tokens = 64;
            config.blocks_device = 16_384;
            config.blocks_host = 16_384;
            config.timing.prefill_us_per_token = 40.0;
            mooncake_workload(&path, args.requests).map_err(|e| e.to_string())?
        }
        None => {
            let mut chat = ChatConfig::default();
            if let Some(s) = args.sessions {
                chat.sessions = s;
            }
            if let Some(s) = args.seed {
                chat.seed = s;
            }
            if let Some(t) = args.think_time_ms {
                chat.think_time_ms = t;
            }
            if let Some(t) = args.session_interarrival_ms {
                chat.session_interarrival_ms = t;
            }
            if let Some(p) = args.uuid_reuse {
                if !(0.0..=1.0).contains(&p) {
                    return Err(format!("--uuid-reuse must be in 0..=1, not {p}"));
                }
                chat.uuid_pixel_swap = p;
            }
            chat_workload(&chat).map_err(|e| e.to_string())?
        }
    };
    if let Some(b) = args.block_size {
        config.block_size_tokens = b;
    }
    if let Some(b) = args.blocks_device {
        config.blocks_device = b;
    }
    if let Some(b) = args.blocks_host {
        config.blocks_host = b;
    }
    if let Some(c) = args.prefill_us_per_token {
        config.timing.prefill_us_per_token = c;
    }
    if let Some(c) = args.decode_us_per_token {
        config.timing.decode_us_per_token = c;
    }
    if let Some(c) = args.hash_ns_per_byte {
        config.timing.hash_ns_per_byte = c;
    } else {
        let sizes: Vec<u32> = workload.requests.iter().flat_map(|r| r.images.iter().map(|i| i.len)).collect();
        if !sizes.is_empty() {
            let m = kvcore_tools::sim::timing::measure_hash(&sizes, kvcore_tools::sim::timing::HASH_SAMPLES);
            config.timing.hash_ns_per_byte = m.ns_per_byte;
            config.hash_measurement = Some(m);
        }
    }
    config.hybrid = args.hybrid;
    if let Some(d) = args.delay_ms {
        config.delay_ms = d;
    }
    if let Some(t) = args.prediction_ttl_ms {
        config.prediction_ttl_ms = t;
    }
    if let Some(t) = args.threads {
        config.threads = t;
    }
    config.with_predictions = !args.no_predictions;
    if let Some(list) = &args.sweep_delays_ms {
        config.sweep_delays_ms = list
            .iter()
            .filter(|d| !d.trim().is_empty())
            .map(|d| d.trim().parse::<f64>().map_err(|_| format!("--sweep-delays-ms: {d:?} is not a number")))
            .collect::<Result<_, _>>()?;
    }
    if !args.policies.is_empty() {
        config.policies = args
            .policies
            .iter()
            .map(|name| {
                PolicyKind::from_name(name.trim()).ok_or_else(|| {
                    let known: Vec<&str> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
                    format!("unknown policy {name:?}; known: {}", known.join(", "))
                })
            })
            .collect::<Result<_, _>>()?;
    }
    Ok((workload, config))
}

/// Runs the simulation; returns the process exit code.
pub fn run(args: &SimArgs) -> i32 {
    let (workload, config) = match build(args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("kvcore sim: {e}");
            return 2;
        }
    };
    let total = workload.requests.len() as u64 * config.passes().len() as u64;
    let progress = if args.quiet { ProgressBar::hidden() } else { ProgressBar::new(total) };
    progress.set_draw_target(if args.quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() });
    progress.set_style(
        ProgressStyle::with_template("[{bar:40}] {pos}/{len} requests ({elapsed} elapsed, about {eta} left)")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    let outcome = simulate(&workload, &config, &progress);
    progress.finish_and_clear();
    let (report, runs) = match outcome {
        Ok(x) => x,
        Err(e) => {
            eprintln!("kvcore sim: {e}");
            return 1;
        }
    };
    print!("{}", report.table());
    if let Some(dir) = &args.out {
        if let Err(e) = report.write(dir, &workload, &runs) {
            eprintln!("kvcore sim: cannot write {}: {e}", dir.display());
            return 1;
        }
        println!("wrote {}/summary.json, requests.jsonl, plot.svg, sweep.svg", dir.display());
    }
    if let (Some(path), Some(run)) = (&args.record_copies, runs.first()) {
        if let Err(e) = write_copy_log(path, &config, run) {
            eprintln!("kvcore sim: cannot write {}: {e}", path.display());
            return 1;
        }
        let n: usize = run.copy_log.iter().map(Vec::len).sum();
        println!(
            "wrote {} ({} steps, {n} copies of worker 0 under {})",
            path.display(),
            run.copy_log.len(),
            run.policy.name()
        );
    }
    0
}

/// The copy log as JSON: the pool's shape, then one array per step of
/// `[src_medium, src_page, dst_medium, dst_page, tokens]` (medium 0: device,
/// 1: host).
fn write_copy_log(
    path: &std::path::Path,
    config: &SimConfig,
    run: &kvcore_tools::sim::PolicyRun,
) -> std::io::Result<()> {
    let medium = |m: kvcore::Tier| u32::from(m == kvcore::Tier::Host);
    let steps: Vec<Vec<[u32; 5]>> = run
        .copy_log
        .iter()
        .map(|step| {
            step.iter()
                .map(|c| [medium(c.src.medium), c.src.page, medium(c.dst.medium), c.dst.page, c.tokens])
                .collect()
        })
        .collect();
    let doc = serde_json::json!({
        "policy": run.policy.name(),
        "offload_first": config.offload_first,
        "block_size_tokens": config.block_size_tokens,
        "blocks_device": config.blocks_device,
        "blocks_host": config.blocks_host,
        "steps": steps,
    });
    std::fs::write(path, serde_json::to_vec(&doc).map_err(std::io::Error::other)?)
}
