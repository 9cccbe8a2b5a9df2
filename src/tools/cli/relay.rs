//! `kvcore relay`: subscribes to N engines and republishes each worker's
//! stream with image identities the whole fleet agrees on, for a router
//! that reads only `block_mm_infos` (see docs/wire-format.md, "Fleet-wide
//! image identity").

use std::time::{Duration, Instant};

use clap::Args;
use kvcore::wire::EventForm;
use kvcore_router::{IndexerConfig, Relay, RelayConfig, RelayWorker, SubscriberConfig};
use serde_json::json;

/// Arguments of `kvcore relay`.
#[derive(Args)]
pub struct RelayArgs {
    /// The engines, comma separated: `PUB` or `PUB@REPLAY` endpoints, e.g.
    /// `tcp://10.0.0.1:5557@tcp://10.0.0.1:5567,tcp://10.0.0.2:5557`.
    #[arg(long, value_delimiter = ',', required = true)]
    upstream: Vec<String>,
    /// Where to republish each engine, in the same order: `PUB` or
    /// `PUB@REPLAY` bind addresses (`tcp://127.0.0.1:*` picks a port).
    #[arg(long, value_delimiter = ',', required = true)]
    bind: Vec<String>,
    /// Tokens per block.
    #[arg(long, default_value_t = 32)]
    block_size: u32,
    /// Batches each republished stream keeps for replay.
    #[arg(long, default_value_t = 10_000)]
    buffer_steps: usize,
    /// Most UUIDs in the fleet-wide view.
    #[arg(long, default_value_t = 1 << 20)]
    uuids_max: usize,
    /// Republish in the positional (array) form instead of the map form.
    #[arg(long)]
    array_form: bool,
    /// Ask each engine with a replay socket for a snapshot at start.
    #[arg(long)]
    resync: bool,
    /// Print the counters as one JSON line this often (0: never).
    #[arg(long, default_value_t = 0)]
    stats_ms: u64,
    /// Stop after this many milliseconds (0: run until killed).
    #[arg(long, default_value_t = 0)]
    run_ms: u64,
}

type Error = Box<dyn std::error::Error>;

/// Runs `kvcore relay`: prints one JSON line with the republished endpoints,
/// then relays until killed (or `--run-ms`).
pub fn run(args: RelayArgs) -> Result<(), Error> {
    if args.upstream.len() != args.bind.len() {
        return Err(
            format!("{} --upstream endpoints but {} --bind addresses", args.upstream.len(), args.bind.len()).into()
        );
    }
    if args.block_size == 0 {
        return Err("--block-size must be at least 1".into());
    }
    let split = |s: &str| match s.split_once('@') {
        Some((p, r)) => (p.to_owned(), Some(r.to_owned())),
        None => (s.to_owned(), None),
    };
    let workers: Vec<RelayWorker> = args
        .upstream
        .iter()
        .zip(&args.bind)
        .map(|(u, b)| {
            let (upstream, upstream_replay) = split(u);
            let (bind, bind_replay) = split(b);
            RelayWorker { name: upstream.clone(), upstream, upstream_replay, bind, bind_replay }
        })
        .collect();
    let config = RelayConfig {
        subscriber: SubscriberConfig {
            indexer: IndexerConfig { block_size: args.block_size, uuids_max: args.uuids_max, ..Default::default() },
            ..Default::default()
        },
        buffer_steps: args.buffer_steps,
        form: if args.array_form { EventForm::Array } else { EventForm::Map },
    };
    let mut relay = Relay::new(config, &workers)?;
    if args.resync {
        relay.resync_all()?;
    }
    let endpoints: Vec<_> = (0..workers.len())
        .map(|i| {
            json!({"upstream": workers[i].upstream, "endpoint": relay.endpoint(i),
                        "replay_endpoint": relay.replay_endpoint(i)})
        })
        .collect();
    println!("{}", json!({"ready": true, "workers": endpoints}));
    let start = Instant::now();
    let mut last_stats = Instant::now();
    loop {
        relay.poll(Duration::from_millis(5))?;
        if args.stats_ms > 0 && last_stats.elapsed() >= Duration::from_millis(args.stats_ms) {
            last_stats = Instant::now();
            println!(
                "{}",
                json!({"relay": relay.counters(), "subscriber": relay.subscriber().counters(),
                       "indexer": relay.subscriber().indexer().counters(),
                       "memory": relay.subscriber().indexer().memory()})
            );
        }
        if args.run_ms > 0 && start.elapsed() >= Duration::from_millis(args.run_ms) {
            return Ok(());
        }
    }
}
