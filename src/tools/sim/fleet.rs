//! One pass of the simulation: a fleet of fresh engines, one policy, every
//! arrival of the workload, on a virtual clock.
//!
//! For each request, in arrival order:
//!
//! 1. a router that must hash pixels does so first (the BLAKE3 cost per image
//!    of the timing model), then every published batch whose propagation
//!    delay has passed is handed to its view, in order;
//! 2. the policy picks a worker (KV-aware ones from their [`CacheView`],
//!    plus, when predictions are on, the blocks of their own earlier
//!    decisions that have not expired);
//! 3. the worker's engine admits it (`tokens_cached` is the truth a belief is
//!    checked against), the prompt and the generated tokens are committed and
//!    the request finishes, then the engine closes its step;
//! 4. the timing model places the work on the worker's queue; the step's
//!    blocks exist once its prefill is done, so its batch leaves then and
//!    reaches the router `delay` later. Wire-fed views (`dynamo`, `kv-uuid`,
//!    `kv-pixels`) get the payload bytes each engine's publisher sent over
//!    loopback ZMQ ([`Taps`]); `kv-text-only` gets the typed events.
//!
//! Requests overlap: one arriving while earlier ones are still queued or
//! prefilling is routed before their events arrive, which is where a router
//! without predictions goes wrong.

use std::time::Instant;

use indicatif::ProgressBar;

use kvcore::BlockCopy;
use kvcore::EngineConfig;
use kvcore::KvEvent;
use kvcore::TokenRun;
use kvcore::wire::{EncodeOptions, encode_events};
use kvcore::{Engine, MmContent, MmItemSpec, RequestSpec};
use kvcore::{GroupConfig, GroupKind};
use kvcore::{Publisher, PublisherConfig};

use super::copies::CopyCounts;
use super::dynamo_view::DynamoView;
use super::policy::{PolicyKind, decide};
use super::router_view::{ImageNaming, RouterView};
use super::tap::Taps;
use super::timing::WorkerClock;
use super::view::{CacheView, OracleView, Predictions, TextOnlyView, ViewRequest, engine_keys};
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
    /// The event delay and predictions of the pass.
    pub options: PassOptions,
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
    /// The view's own counters (the routers' decoders and indexers).
    pub view_stats: Option<serde_json::Value>,
    /// Published batches the taps never received (wire-fed policies).
    pub batches_lost: u64,
    /// Images whose pixels the router hashed (and paid for).
    pub hashed_images: u64,
    /// Blocks believed held only because of the router's own predictions.
    pub predicted_blocks_used: u64,
    /// The engines' publisher endpoints, in worker order (wire-fed policies only).
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
    let groups = match config.hybrid {
        None => Vec::new(),
        Some(window_tokens) => {
            let ((main_device, main_host), (window_device, window_host)) = hybrid_split(config, window_tokens);
            vec![
                GroupConfig { kind: GroupKind::FullAttention, blocks_device: main_device, blocks_host: main_host },
                GroupConfig {
                    kind: GroupKind::SlidingWindow { window_tokens },
                    blocks_device: window_device,
                    blocks_host: window_host,
                },
            ]
        }
    };
    EngineConfig {
        block_size_tokens: config.block_size_tokens,
        blocks_device: config.blocks_device,
        blocks_host: config.blocks_host,
        image_placeholder_token_id: config.placeholder_token,
        requests_max: WORKER_REQUESTS_MAX,
        offload_first: config.offload_first,
        groups,
        ..Default::default()
    }
}

/// Live requests an engine of the fleet takes at once.
pub const WORKER_REQUESTS_MAX: u32 = 16;

/// How a hybrid engine (`--hybrid WINDOW`) splits the worker's pages:
/// `((full device, full host), (window device, window host))`.
///
/// The sliding-window group gets the device pages its live windows can
/// span, `ceil((W - 1) / B) + 1` per request for [`WORKER_REQUESTS_MAX`]
/// requests, plus its null page, and at most half the budget; the
/// full-attention group gets the rest, so that the prefix cache stays as
/// large as the window allows. The host pages split in the same proportion.
/// The sums are `blocks_device` and `blocks_host`, so a hybrid run uses the
/// same memory as the plain one.
pub fn hybrid_split(config: &SimConfig, window_tokens: u32) -> ((u32, u32), (u32, u32)) {
    let per_request = window_tokens.saturating_sub(1).div_ceil(config.block_size_tokens.max(1)) + 1;
    let needed = per_request.saturating_mul(WORKER_REQUESTS_MAX).saturating_add(1);
    let window_device = needed.min(config.blocks_device / 2);
    let window_host =
        (u64::from(config.blocks_host) * u64::from(window_device) / u64::from(config.blocks_device.max(1))) as u32;
    ((config.blocks_device - window_device, config.blocks_host - window_host), (window_device, window_host))
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

/// How one pass sees the events: their propagation delay and whether the
/// router records its own decisions as predicted blocks.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PassOptions {
    /// Simulated time from an engine's step to its events reaching a router,
    /// in microseconds.
    pub delay_us: f64,
    /// Whether event-fed routers record their decisions as predicted blocks.
    pub predict: bool,
}

/// A published batch on its way to the router.
struct InFlight {
    deliver_us: f64,
    order: u64,
    worker: usize,
    payload: Vec<u8>,
    typed: Vec<KvEvent>,
}

/// A policy's view, when it has one.
type ViewBox = Box<dyn CacheView>;

fn make_view(
    policy: PolicyKind,
    config: &SimConfig,
    engines: &mut [Engine],
    publishers: &mut Vec<String>,
) -> Result<(Option<ViewBox>, Option<Taps>), SimError> {
    let n = engines.len();
    let (bs, pad) = (config.block_size_tokens, config.placeholder_token);
    let mut wire_fed = |engines: &mut [Engine]| -> Result<Taps, SimError> {
        let endpoints = attach_publishers(engines, config.base_port)?;
        *publishers = endpoints.iter().map(|(e, _)| e.clone()).collect();
        let mut taps = Taps::connect(publishers)?;
        taps.set_replay(endpoints.into_iter().map(|(_, r)| r).collect());
        Ok(taps)
    };
    Ok(match policy {
        PolicyKind::RoundRobin | PolicyKind::LeastLoaded => (None, None),
        PolicyKind::KvTextOnly => (Some(Box::new(TextOnlyView::new(n))), None),
        PolicyKind::Dynamo => {
            let taps = wire_fed(engines)?;
            (Some(Box::new(DynamoView::new(n, bs))), Some(taps))
        }
        PolicyKind::KvUuid | PolicyKind::KvPixels => {
            let taps = wire_fed(engines)?;
            let naming = if policy == PolicyKind::KvUuid { ImageNaming::Uuid } else { ImageNaming::Pixels };
            let per_worker = (config.blocks_device + config.blocks_host) as usize;
            (Some(Box::new(RouterView::new(n, bs, pad, naming, per_worker))), Some(taps))
        }
        PolicyKind::Oracle => (Some(Box::new(OracleView)), None),
    })
}

/// Runs `policy` over every request of `workload` on fresh engines, events
/// delayed and predictions made as `options` says.
pub fn run_policy(
    workload: &Workload,
    policy: PolicyKind,
    options: PassOptions,
    config: &SimConfig,
    progress: &ProgressBar,
) -> Result<PolicyRun, SimError> {
    let started = Instant::now();
    let n = config.workers as usize;
    let engine_config = worker_engine_config(config);
    let mut engines: Vec<Engine> =
        (0..n).map(|_| Engine::new(engine_config.clone())).collect::<Result<_, _>>().map_err(SimError::Config)?;
    let mut publishers = Vec::new();
    let (mut view, mut taps) = make_view(policy, config, &mut engines, &mut publishers)?;
    let mut predictions =
        (options.predict && policy.is_event_fed()).then(|| Predictions::new(n, config.prediction_ttl_ms * 1000.0));
    let delay_us = if policy.is_event_fed() { options.delay_us } else { 0.0 };
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut order = 0u64;
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
    let mut hashed_images = 0u64;
    let mut predicted_blocks_used = 0u64;
    let encode = EncodeOptions::default();

    for request in &workload.requests {
        // The router first hashes what it must (the pixels it pays for), then decides.
        let hashed = policy.images_hashed(request.images.iter().map(|i| i.uuid.is_some()));
        hashed_images += hashed as u64;
        let hash_us: f64 = request
            .images
            .iter()
            .filter(|i| policy.hashes_image(i.uuid.is_some()))
            .map(|i| config.timing.hash_us(i.len))
            .sum();
        let now = request.arrival_us as f64 + hash_us;
        // Deliver every batch whose propagation delay has passed, in order.
        if let Some(view) = &mut view
            && !in_flight.is_empty()
        {
            in_flight.sort_by(|a, b| a.deliver_us.total_cmp(&b.deliver_us).then(a.order.cmp(&b.order)));
            let due = in_flight.partition_point(|f| f.deliver_us <= now);
            for f in in_flight.drain(..due) {
                if f.payload.is_empty() {
                    view.observe(f.worker, &f.typed);
                } else {
                    view.apply_payload(f.worker, &f.payload);
                }
            }
        }
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
                let mut overlaps = view.overlaps(&vr, &engines);
                if let Some(p) = &predictions {
                    let pk = view.prediction_keys();
                    for (w, o) in overlaps.iter_mut().enumerate() {
                        let ahead = p.prefix(w, &pk, now);
                        if ahead > o.any_tier_blocks {
                            predicted_blocks_used += (ahead - o.any_tier_blocks) as u64;
                        }
                        o.device_blocks = o.device_blocks.max(ahead);
                        o.any_tier_blocks = o.any_tier_blocks.max(ahead);
                    }
                }
                let w = match view.select(&overlaps, &vr, now) {
                    Some(w) => w,
                    None => {
                        let spread = keys.first().map_or(request.id, |k| {
                            u64::from_le_bytes(k.0[..8].try_into().expect("a key has 32 bytes"))
                        });
                        decide(&config.scoring, tokens.len() as u32 / bs, &overlaps, &loads, spread)
                    }
                };
                if let Some(p) = &mut predictions {
                    p.record(w, &view.prediction_keys(), now);
                }
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

        let computed = tokens.len() as u32 - outcome.tokens_cached;
        let served = clocks[worker].serve(&config.timing, now, computed, outcome.tokens_onboarded, request.output_len);
        outcome.ttft_ms = (served.ttft_us + hash_us) / 1000.0;
        busy_us += served.service_us;
        let first_token_us = now + served.ttft_us;
        if let Some(view) = &mut view {
            view.routed(worker, first_token_us, served.done_us);
            // The step's blocks exist once its prefill is done; their events
            // leave then and reach the router `delay` later.
            let deliver_us = first_token_us + delay_us;
            match &mut taps {
                Some(taps) => {
                    let target = engines[worker].publisher().map_or(0, |p| p.next_seq());
                    for payload in taps.collect(worker, target) {
                        order += 1;
                        in_flight.push(InFlight { deliver_us, order, worker, payload, typed: Vec::new() });
                    }
                }
                None if !step_events.is_empty() => {
                    order += 1;
                    in_flight.push(InFlight { deliver_us, order, worker, payload: Vec::new(), typed: step_events });
                }
                None => {}
            }
        }
        outcomes.push(outcome);
        progress.inc(1);
    }
    events.wire_bytes = Some(taps.as_ref().map_or(wire_bytes, |t| t.payload_bytes()));
    let makespan_s = clocks.iter().map(|c| c.busy_until_us).fold(0.0, f64::max) / 1e6;
    Ok(PolicyRun {
        policy,
        options,
        outcomes,
        events,
        copies,
        copy_log,
        view_unusable_blocks: view.as_ref().map_or(0, |v| v.events_unusable()),
        view_stats: view.as_ref().and_then(|v| v.stats()),
        batches_lost: taps.as_ref().map_or(0, |t| t.lost()),
        hashed_images,
        predicted_blocks_used,
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
