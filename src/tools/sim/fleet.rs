//! One pass of the simulation: a fleet of fresh engines, one policy, every
//! arrival of the workload.
//!
//! For each request, in arrival order:
//!
//! 1. the policy picks a worker (KV-aware ones from their [`CacheView`]);
//! 2. the worker's engine admits it (`tokens_cached` is the truth a belief is
//!    checked against), the prompt and the generated tokens are committed and
//!    the request finishes, then the engine closes its step;
//! 3. the step's events go to the view (for `kv-ours`, out of the engine's
//!    publisher over loopback ZMQ to the router), and their wire size is
//!    measured with the stream's codec;
//! 4. the timing model places the work on the worker's queue.

use std::time::Instant;

use indicatif::ProgressBar;

use kvcore::BlockCopy;
use kvcore::EngineConfig;
use kvcore::KvEvent;
use kvcore::TokenRun;
use kvcore::wire::{EncodeOptions, encode_events};
use kvcore::{Engine, MmContent, MmItemSpec, RequestSpec};
use kvcore::{Publisher, PublisherConfig};

use super::copies::CopyCounts;
use super::policy::{PolicyKind, decide};
use super::router_view::RouterView;
use super::timing::WorkerClock;
use super::view::{CacheView, OracleView, TextOnlyView, ViewRequest, engine_keys};
use super::workload::Workload;
use super::{SimConfig, SimError};

/// What happened to one request under one policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct RequestOutcome {
    /// The worker chosen.
    pub worker: u32,
    /// Prompt tokens the engine found cached.
    pub tokens_cached: u32,
    /// Of those, tokens onboarded from the host tier.
    pub tokens_onboarded: u32,
    /// Blocks the policy believed the worker held (KV-aware policies only).
    pub blocks_predicted: Option<u32>,
    /// Simulated time to first token, in milliseconds.
    pub ttft_ms: f64,
    /// Whether the engine rejected the request (it then counts as uncached).
    pub rejected: bool,
}

/// Event counts of a pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct EventCounts {
    /// Typed events produced by all engines.
    pub events: u64,
    /// `BlockStored` events.
    pub stored_events: u64,
    /// Blocks in them.
    pub stored_blocks: u64,
    /// `BlockRemoved` events.
    pub removed_events: u64,
    /// Blocks in them.
    pub removed_blocks: u64,
    /// Bytes of the encoded wire payloads, when measured.
    pub wire_bytes: Option<u64>,
}

/// The raw result of one pass.
#[derive(Clone, Debug)]
pub struct PolicyRun {
    /// The policy.
    pub policy: PolicyKind,
    /// One outcome per request, in workload order.
    pub outcomes: Vec<RequestOutcome>,
    /// Events.
    pub events: EventCounts,
    /// The host-tier copies' shape.
    pub copies: CopyCounts,
    /// Worker 0's block copies, one list per step it served, in order (with
    /// `SimConfig::record_copies`; empty otherwise): what a GPU would have
    /// performed, for `kvcore gpu-bench` to replay.
    pub copy_log: Vec<Vec<BlockCopy>>,
    /// Blocks the view could not use (text-only: stored blocks whose parent it
    /// did not know).
    pub view_unusable_blocks: u64,
    /// The view's own counters (the router's subscriber and indexer for
    /// `kv-ours`).
    pub view_stats: Option<serde_json::Value>,
    /// The engines' publisher endpoints, in worker order (`kv-ours` only).
    pub publishers: Vec<String>,
    /// When the last worker went idle, in simulated seconds.
    pub makespan_s: f64,
    /// Simulated seconds the workers were busy, summed over workers.
    pub busy_s: f64,
    /// Wall-clock seconds the pass took.
    pub wall_s: f64,
}

/// The engine configuration of every simulated worker.
pub fn worker_engine_config(config: &SimConfig) -> EngineConfig {
    EngineConfig {
        block_size_tokens: config.block_size_tokens,
        blocks_device: config.blocks_device,
        blocks_host: config.blocks_host,
        image_placeholder_token_id: config.placeholder_token,
        requests_max: 16,
        offload_first: config.offload_first,
        ..Default::default()
    }
}

/// Binds one publisher per engine on loopback and attaches it: on
/// `base_port + w` (replay socket on `base_port + workers + w`), or on ports
/// the system picks. Returns each worker's `PUB` and replay endpoints.
pub fn attach_publishers(
    engines: &mut [Engine],
    base_port: Option<u16>,
) -> Result<Vec<(String, Option<String>)>, SimError> {
    let n = engines.len();
    let mut endpoints = Vec::with_capacity(n);
    for (w, engine) in engines.iter_mut().enumerate() {
        let (pub_ep, replay_ep) = match base_port {
            Some(p) => {
                (format!("tcp://127.0.0.1:{}", p as usize + w), format!("tcp://127.0.0.1:{}", p as usize + n + w))
            }
            None => ("tcp://127.0.0.1:*".to_owned(), "tcp://127.0.0.1:*".to_owned()),
        };
        let publisher = Publisher::bind(PublisherConfig {
            endpoint: pub_ep.clone(),
            replay_endpoint: Some(replay_ep),
            ..Default::default()
        })
        .map_err(|e| SimError::Zmq(format!("worker {w}: binding {pub_ep}: {e}")))?;
        endpoints.push((publisher.endpoint().to_owned(), publisher.replay_endpoint().map(str::to_owned)));
        engine.attach_publisher(publisher);
    }
    Ok(endpoints)
}

/// Runs `policy` over every request of `workload` on fresh engines.
pub fn run_policy(
    workload: &Workload,
    policy: PolicyKind,
    config: &SimConfig,
    progress: &ProgressBar,
) -> Result<PolicyRun, SimError> {
    let started = Instant::now();
    let n = config.workers as usize;
    let engine_config = worker_engine_config(config);
    let mut engines: Vec<Engine> =
        (0..n).map(|_| Engine::new(engine_config.clone())).collect::<Result<_, _>>().map_err(SimError::Config)?;
    let mut publishers = Vec::new();
    let mut view: Option<Box<dyn CacheView>> = match policy {
        PolicyKind::RoundRobin | PolicyKind::LeastLoaded => None,
        PolicyKind::KvTextOnly => Some(Box::new(TextOnlyView::new(n))),
        PolicyKind::KvOurs => {
            let endpoints = attach_publishers(&mut engines, config.base_port)?;
            publishers = endpoints.iter().map(|(e, _)| e.clone()).collect();
            Some(Box::new(RouterView::connect(&endpoints, config.block_size_tokens, config.placeholder_token)?))
        }
        PolicyKind::Oracle => Some(Box::new(OracleView)),
    };
    let mut clocks = vec![WorkerClock::default(); n];
    let mut outcomes = Vec::with_capacity(workload.requests.len());
    let mut events = EventCounts::default();
    let mut copies = CopyCounts::default();
    let mut copy_log = Vec::new();
    let bs = config.block_size_tokens;
    let block_work_us = config.timing.prefill_us_per_token * bs as f64;
    let mut next_rr = 0usize;
    let mut wire = Vec::new();
    let mut wire_bytes = 0u64;
    let mut busy_us = 0.0;
    let encode = EncodeOptions::default();

    for request in &workload.requests {
        let now = request.arrival_us as f64;
        let tokens = request.prompt.tokens();
        let loads: Vec<f64> = clocks.iter().map(|c| c.backlog_us(now) / block_work_us).collect();
        let (worker, predicted) = match &mut view {
            None if policy == PolicyKind::RoundRobin => {
                next_rr = (next_rr + 1) % n;
                ((next_rr + n - 1) % n, None)
            }
            None => {
                let least = loads.iter().copied().fold(f64::INFINITY, f64::min);
                let tied: Vec<usize> = (0..n).filter(|&w| loads[w] <= least + 1e-9).collect();
                (tied[(request.id % tied.len() as u64) as usize], None)
            }
            Some(view) => {
                let keys = engine_keys(request, &tokens, bs, config.placeholder_token);
                let vr = ViewRequest { request, tokens: &tokens, engine_keys: &keys, block_size: bs };
                let overlaps = view.overlaps(&vr, &engines);
                let spread = keys
                    .first()
                    .map_or(request.id, |k| u64::from_le_bytes(k.0[..8].try_into().expect("a key has 32 bytes")));
                let w = decide(&config.scoring, tokens.len() as u32 / bs, &overlaps, &loads, spread);
                (w, Some(overlaps[w].any_tier_blocks))
            }
        };

        let engine = &mut engines[worker];
        let items: Vec<MmItemSpec<'_>> = request
            .images
            .iter()
            .map(|i| MmItemSpec {
                content: MmContent::Bytes(&i.pixels),
                runs: vec![TokenRun { start: i.start, len: i.len }],
            })
            .collect();
        let uuids = (!request.images.is_empty())
            .then(|| request.images.iter().map(|i| i.uuid.as_deref().map(str::as_bytes)).collect());
        let spec = RequestSpec { tokens: &tokens, items, uuids, ..Default::default() };
        let mut outcome = RequestOutcome { worker: worker as u32, blocks_predicted: predicted, ..Default::default() };
        match engine.add_request(&spec) {
            Ok(a) => {
                outcome.tokens_cached = a.tokens_cached;
                outcome.tokens_onboarded = a.tokens_onboarded;
                engine.commit(a.id, tokens.len() as u64).map_err(|e| SimError::Engine(e.to_string()))?;
                // The answer's blocks stay cached for the session's next turn;
                // an answer that does not fit is simply not cached.
                if !request.generated.is_empty() && engine.grow(a.id, &request.generated).is_ok() {
                    let total = engine.request_info(a.id).map_err(|e| SimError::Engine(e.to_string()))?.tokens;
                    engine.commit(a.id, total as u64).map_err(|e| SimError::Engine(e.to_string()))?;
                }
                engine.finish(a.id).map_err(|e| SimError::Engine(e.to_string()))?;
            }
            Err(_) => outcome.rejected = true,
        }
        let step_copies = engine.step();
        copies.observe(&step_copies);
        if config.record_copies && worker == 0 {
            copy_log.push(step_copies);
        }
        let step_events = engine.drain_events();
        count_events(&step_events, &mut events);
        if !step_events.is_empty() {
            // What the stream carries for this step: the payload as the
            // publisher encodes it, plus the 8-byte sequence frame.
            wire.clear();
            encode_events(&step_events, now / 1e6, None, &encode, &mut wire);
            wire_bytes += wire.len() as u64 + 8;
        }
        if let Some(view) = &mut view {
            view.observe(worker, &step_events);
        }

        let computed = tokens.len() as u32 - outcome.tokens_cached;
        let served = clocks[worker].serve(&config.timing, now, computed, outcome.tokens_onboarded, request.output_len);
        outcome.ttft_ms = served.ttft_us / 1000.0;
        busy_us += served.service_us;
        outcomes.push(outcome);
        progress.inc(1);
    }
    events.wire_bytes = Some(wire_bytes);
    let makespan_s = clocks.iter().map(|c| c.busy_until_us).fold(0.0, f64::max) / 1e6;
    Ok(PolicyRun {
        policy,
        outcomes,
        events,
        copies,
        copy_log,
        view_unusable_blocks: view.as_ref().map_or(0, |v| v.events_unusable()),
        view_stats: view.as_ref().and_then(|v| v.stats()),
        publishers,
        makespan_s,
        busy_s: busy_us / 1e6,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

fn count_events(events: &[KvEvent], counts: &mut EventCounts) {
    for e in events {
        counts.events += 1;
        match e {
            KvEvent::BlockStored(s) => {
                counts.stored_events += 1;
                counts.stored_blocks += s.keys.len() as u64;
            }
            KvEvent::BlockRemoved(r) => {
                counts.removed_events += 1;
                counts.removed_blocks += r.keys.len() as u64;
            }
            KvEvent::AllBlocksCleared(_) => {}
        }
    }
}
