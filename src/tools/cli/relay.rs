//! `kvcore relay`: subscribes to N engines and republishes each worker's
//! stream with image identities the whole fleet agrees on, for a router
//! that reads only `block_mm_infos` (see docs/wire-format.md, "Fleet-wide
//! image identity").

use std::time::{Duration, Instant};

use clap::Args;
use kvcore::wire::EventForm;
use kvcore_router::{IndexerConfig, Relay, RelayConfig, RelayWorker, Subscriber, SubscriberConfig};
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

/// Arguments of `kvcore relay-bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Engines publishing.
    #[arg(long, default_value_t = 3)]
    engines: usize,
    /// Requests served (one batch each), round robin over the engines.
    #[arg(long, default_value_t = 3000)]
    requests: usize,
    /// Distinct UUIDs the requests' images carry; each engine sends its own
    /// pixels under them, so every UUID held by two engines is ambiguous.
    #[arg(long, default_value_t = 64)]
    uuids: usize,
    /// Pause between requests, in microseconds (latency is measured below
    /// saturation).
    #[arg(long, default_value_t = 500)]
    pace_us: u64,
}

/// One consumer's latencies: receive time minus the batch's `ts`.
fn receive(endpoints: Vec<String>, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Vec<f64> {
    let ctx = zmq::Context::new();
    let socks: Vec<zmq::Socket> = endpoints
        .iter()
        .map(|e| {
            let s = ctx.socket(zmq::SUB).expect("SUB");
            s.set_subscribe(b"").expect("subscribe");
            s.set_rcvhwm(0).expect("hwm");
            s.connect(e).expect("connect");
            s
        })
        .collect();
    let mut lat = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut items: Vec<zmq::PollItem> = socks.iter().map(|s| s.as_poll_item(zmq::POLLIN)).collect();
        if zmq::poll(&mut items, 20).unwrap_or(0) == 0 {
            continue;
        }
        for s in &socks {
            while let Ok(frames) = s.recv_multipart(zmq::DONTWAIT) {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
                if let Some(p) = frames.get(2)
                    && let Ok(b) = kvcore::wire::decode_payload(p)
                    && !b.events.is_empty()
                {
                    lat.push((now - b.ts) * 1e6);
                }
            }
        }
    }
    lat
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Runs `kvcore relay-bench`: real engines publish image requests whose
/// UUIDs collide across engines; one consumer reads the engines directly,
/// one reads them through a relay in this process; prints the latency of
/// both (receive time minus the batch's timestamp), the relay thread's CPU
/// time per upstream batch, and the relay's counters, as one JSON object.
pub fn bench(args: BenchArgs) -> Result<(), Error> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use kvcore::{Engine, EngineConfig, MmContent, MmItemSpec, Publisher, PublisherConfig, RequestSpec, TokenRun};
    if args.engines == 0 || args.uuids == 0 {
        return Err("--engines and --uuids must be at least 1".into());
    }
    let mut engines = Vec::new();
    let mut upstream = Vec::new();
    for _ in 0..args.engines {
        let mut e = Engine::new(EngineConfig { block_size_tokens: 32, blocks_device: 4096, ..Default::default() })?;
        let p = Publisher::bind(PublisherConfig { endpoint: "tcp://127.0.0.1:*".into(), ..Default::default() })?;
        upstream.push(p.endpoint().to_owned());
        e.attach_publisher(p);
        engines.push(e);
    }
    let workers: Vec<RelayWorker> = upstream
        .iter()
        .map(|u| RelayWorker {
            name: u.clone(),
            upstream: u.clone(),
            upstream_replay: None,
            bind: "tcp://127.0.0.1:*".into(),
            bind_replay: None,
        })
        .collect();
    let mut relay = Relay::new(
        RelayConfig {
            subscriber: SubscriberConfig {
                indexer: IndexerConfig { block_size: 32, ..Default::default() },
                ..Default::default()
            },
            ..Default::default()
        },
        &workers,
    )?;
    let relayed: Vec<String> = (0..args.engines).map(|i| relay.endpoint(i).unwrap_or_default().to_owned()).collect();
    let stop_relay = Arc::new(AtomicBool::new(false));
    let stop_rx = Arc::new(AtomicBool::new(false));
    let s = stop_relay.clone();
    let relay_thread = std::thread::spawn(move || {
        let (mut busy, mut polls) = (0.0f64, 0u64);
        while !s.load(Ordering::Relaxed) {
            let cpu0 = crate::route::thread_cpu_s().unwrap_or(0.0);
            if relay.poll(Duration::from_millis(2)).unwrap_or(0) > 0 {
                busy += crate::route::thread_cpu_s().unwrap_or(0.0) - cpu0;
                polls += 1;
            }
        }
        (relay, busy, polls)
    });
    // The baseline: kvcore's subscriber and indexer alone on the same
    // streams, timed the same way.
    let s = stop_relay.clone();
    let plain_upstream = upstream.clone();
    let plain_thread = std::thread::spawn(move || -> Result<(f64, u64), String> {
        let mut sub = Subscriber::new(SubscriberConfig {
            indexer: IndexerConfig { block_size: 32, ..Default::default() },
            ..Default::default()
        });
        for u in &plain_upstream {
            sub.connect(u, u, None).map_err(|e| e.to_string())?;
        }
        let mut busy = 0.0f64;
        while !s.load(Ordering::Relaxed) {
            let cpu0 = crate::route::thread_cpu_s().unwrap_or(0.0);
            if sub.poll(Duration::from_millis(2)).unwrap_or(0) > 0 {
                busy += crate::route::thread_cpu_s().unwrap_or(0.0) - cpu0;
            }
        }
        Ok((busy, sub.counters().batches_applied))
    });
    let (s1, s2) = (stop_rx.clone(), stop_rx.clone());
    let direct = std::thread::spawn(move || receive(upstream, s1));
    let through = std::thread::spawn(move || receive(relayed, s2));
    // Slow joiners: let every subscription settle before measuring.
    std::thread::sleep(Duration::from_millis(1500));
    let mut text = 1000u32;
    for i in 0..args.requests {
        let k = i % args.engines;
        let mut tokens: Vec<u32> = (0..64)
            .map(|_| {
                text = 1000 + (text * 7919 + 13) % 59_000;
                text
            })
            .collect();
        tokens.extend(std::iter::repeat_n(kvcore::QWEN_IMAGE_PAD_TOKEN, 64));
        tokens.extend(0..64u32);
        let u = i % args.uuids;
        let pixels = format!("pixels of image {u} on engine {k}");
        let uuid = format!("img-{u}");
        let spec = RequestSpec {
            tokens: &tokens,
            items: vec![MmItemSpec {
                content: MmContent::Bytes(pixels.as_bytes()),
                runs: vec![TokenRun { start: 64, len: 64 }],
            }],
            uuids: Some(vec![Some(uuid.as_bytes())]),
            ..Default::default()
        };
        let e = &mut engines[k];
        let a = e.add_request(&spec)?;
        e.commit(a.id, tokens.len() as u64)?;
        e.finish(a.id)?;
        e.step();
        std::thread::sleep(Duration::from_micros(args.pace_us));
    }
    std::thread::sleep(Duration::from_millis(1500));
    stop_rx.store(true, Ordering::Relaxed);
    stop_relay.store(true, Ordering::Relaxed);
    let (mut d, mut t) = (direct.join().unwrap_or_default(), through.join().unwrap_or_default());
    let (relay, busy, polls) = relay_thread.join().map_err(|_| "relay thread panicked")?;
    let (plain_busy, plain_batches) = plain_thread.join().map_err(|_| "subscriber thread panicked")??;
    let c = relay.counters();
    let report = json!({
        "engines": args.engines, "requests": args.requests, "uuids": args.uuids, "pace_us": args.pace_us,
        "direct": {"batches": d.len(), "latency_p50_us": pct(&mut d, 0.5), "latency_p99_us": pct(&mut d, 0.99)},
        "relayed": {"batches": t.len(), "latency_p50_us": pct(&mut t, 0.5), "latency_p99_us": pct(&mut t, 0.99)},
        "relay_cpu_us_per_upstream_batch": if c.batches_in > 0 { busy * 1e6 / c.batches_in as f64 } else { f64::NAN },
        "relay_busy_polls": polls,
        "subscriber_cpu_us_per_batch": if plain_batches > 0 { plain_busy * 1e6 / plain_batches as f64 } else { f64::NAN },
        "relay": c,
        "indexer": relay.subscriber().indexer().counters(),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
