//! The fleet simulation: what KV- and image-aware routing buys.
//!
//! ```text
//!  workload ──► arrivals ──► policy ──► worker w ──► Engine w (real kvcore)
//!                              ▲                        │ events
//!                              └────── cache view ◄─────┘
//! ```
//!
//! N workers, each a real [`Engine`](kvcore::Engine), serve the same arrivals
//! once per policy, on fresh engines each time, so that every policy faces
//! identical requests. A simple timing model ([`timing`]) turns what each
//! engine found in its cache into simulated time to first token, with a queue
//! per worker so that load matters. The policies ([`policy`]) range from
//! round-robin to an oracle that reads every engine's prefix index; the
//! KV-aware ones share one cost and differ only in what they know
//! ([`view`]). A belief is checked against the engine's own answer at
//! admission: a *false hit* is a request routed to a worker believed to hold
//! more leading blocks than its engine then matched.
//!
//! With [`SimConfig::hybrid`], every engine is a hybrid model's: a
//! full-attention group and a sliding-window group in the same pages; a
//! prefix is then reused only where both groups hold what the next token
//! reads, and the views that know of groups (the oracle, kvcore's router,
//! the text-only view) score by that rule while Dynamo indexes the
//! full-attention group alone.
//!
//! | module | what |
//! |---|---|
//! | [`workload`] | the seeded multimodal chat generator and the Mooncake trace replay |
//! | [`timing`] | the cost of a request and the worker queue |
//! | [`view`] | [`view::CacheView`]: oracle, text-only, content-keyed; [`view::Predictions`] |
//! | [`router_view`] | `kv-uuid`, `kv-pixels`: kvcore's router fed by wire payloads |
//! | [`dynamo_view`] | `dynamo`: Dynamo 1.6.1's decoder, indexer and default logit |
//! | [`tap`] | the `SUB` sockets that take each engine's batches off the wire |
//! | [`policy`] | the policies and the KV-aware decision |
//! | [`fleet`] | one pass: engines, routing, events, timing |
//! | [`copies`] | the shape of the host-tier copies the engines hand out |
//! | [`report`] | figures, terminal table, JSON, JSON lines, SVG |
//!
//! See docs/simulation.md for the model, the default workload and the figures.

pub mod copies;
pub mod dynamo_view;
pub mod fleet;
pub mod policy;
pub mod report;
pub mod router_view;
pub mod tap;
pub mod timing;
pub mod view;
pub mod workload;

use indicatif::ProgressBar;

pub use fleet::{PassOptions, PolicyRun, RequestOutcome};
pub use policy::{PolicyKind, Scoring};
pub use report::{PolicySummary, Report, SweepPoint};
pub use timing::TimingModel;
pub use workload::{ChatConfig, Workload, chat_workload, mooncake_workload};

/// The fleet and what runs on it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SimConfig {
    /// Workers (engines).
    pub workers: u32,
    /// Tokens per KV block.
    pub block_size_tokens: u32,
    /// Device blocks per worker.
    pub blocks_device: u32,
    /// Host-tier blocks per worker (0: no host tier).
    pub blocks_host: u32,
    /// The image placeholder token id.
    pub placeholder_token: u32,
    /// The engines' `offload_first` (few copy waves, lower hit rate).
    pub offload_first: bool,
    /// A hybrid model: every engine runs two KV cache groups, full attention
    /// and a sliding window of this many tokens, splitting the same block
    /// budget ([`fleet::hybrid_split`]). `None`: one full-attention group.
    pub hybrid: Option<u32>,
    /// Keep worker 0's block copies, step by step ([`fleet::PolicyRun::copy_log`]).
    pub record_copies: bool,
    /// The timing model.
    pub timing: TimingModel,
    /// The KV-aware cost's weights.
    pub scoring: Scoring,
    /// The policies to compare, in report order.
    pub policies: Vec<PolicyKind>,
    /// Simulated propagation delay of events from an engine to a router, in
    /// milliseconds.
    pub delay_ms: f64,
    /// How long a router's own decision stays a predicted block, in
    /// milliseconds.
    pub prediction_ttl_ms: f64,
    /// The delays of the sweep, in milliseconds (empty: no sweep).
    pub sweep_delays_ms: Vec<f64>,
    /// Also run every event-fed policy with predicted blocks.
    pub with_predictions: bool,
    /// Passes run at once (0: one per available core).
    pub threads: usize,
    /// First TCP port of the engines' publishers (wire-fed passes): worker
    /// `w` publishes on `base_port + w` and answers replays on `base_port +
    /// workers + w`. `None`: ports the system picks.
    pub base_port: Option<u16>,
    /// How `timing.hash_ns_per_byte` was measured on this CPU at start-up
    /// (`None`: the cost was given).
    pub hash_measurement: Option<timing::HashMeasurement>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            workers: 4,
            block_size_tokens: 32,
            blocks_device: 1024,
            blocks_host: 1024,
            placeholder_token: kvcore::QWEN_IMAGE_PAD_TOKEN,
            offload_first: false,
            hybrid: None,
            record_copies: false,
            timing: TimingModel::default(),
            scoring: Scoring::default(),
            policies: PolicyKind::ALL.to_vec(),
            delay_ms: 5.0,
            prediction_ttl_ms: 10_000.0,
            sweep_delays_ms: vec![0.0, 50.0, 100.0],
            with_predictions: true,
            threads: 0,
            base_port: None,
            hash_measurement: None,
        }
    }
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The workload could not be built.
    #[error(transparent)]
    Workload(#[from] workload::WorkloadError),
    /// The engine configuration is invalid.
    #[error("{0}")]
    Config(kvcore::ConfigError),
    /// The simulation configuration is invalid.
    #[error("invalid simulation: {0}")]
    Invalid(String),
    /// A publisher or the router's subscriber could not start.
    #[error("event stream: {0}")]
    Zmq(String),
    /// An engine call failed where it cannot (a bug worth reporting).
    #[error("engine call failed: {0}")]
    Engine(String),
}

impl SimConfig {
    /// Checks the fleet's parameters.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.workers == 0 || self.workers > 256 {
            return Err(SimError::Invalid("workers must be in 1..=256".into()));
        }
        if self.policies.is_empty() {
            return Err(SimError::Invalid("no policy to run".into()));
        }
        // Publishers take `base_port + w`, their replay sockets `base_port + workers + w`.
        if let Some(p) = self.base_port
            && p as u32 + 2 * self.workers > 65_536
        {
            return Err(SimError::Invalid(format!(
                "ports {p}..{} (publishers and their replay sockets) do not fit below 65536",
                p as u32 + 2 * self.workers
            )));
        }
        let t = &self.timing;
        if [
            t.request_overhead_us,
            t.prefill_us_per_token,
            t.onboard_us_per_token,
            t.decode_us_per_token,
            t.hash_ns_per_byte,
        ]
        .iter()
        .any(|c| !c.is_finite() || *c < 0.0)
            || t.prefill_us_per_token <= 0.0
        {
            return Err(SimError::Invalid("timing costs must be finite and non-negative, prefill positive".into()));
        }
        if [self.delay_ms, self.prediction_ttl_ms]
            .iter()
            .chain(&self.sweep_delays_ms)
            .any(|d| !d.is_finite() || *d < 0.0)
        {
            return Err(SimError::Invalid("delays and the prediction expiry must be finite and non-negative".into()));
        }
        if self.base_port.is_some() && self.passes().len() > 1 {
            // One set of fixed ports serves one pass at a time.
            return Err(SimError::Invalid(
                "a fixed base port needs one pass: one policy, no sweep, no predictions".into(),
            ));
        }
        fleet::worker_engine_config(self).validate().map_err(SimError::Config)
    }
}

/// What one pass runs: a policy and how it sees the events.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pass {
    /// The policy.
    pub policy: PolicyKind,
    /// Its event delay and predictions.
    pub options: PassOptions,
}

impl SimConfig {
    /// Every pass of the run, in report order: each policy at the default
    /// delay without predictions (the main table), then each event-fed one
    /// with predictions, then the sweep (each event-fed policy at each delay,
    /// with and without predictions).
    pub fn passes(&self) -> Vec<Pass> {
        let at = |policy, delay_ms: f64, predict| Pass {
            policy,
            options: PassOptions { delay_us: delay_ms * 1000.0, predict },
        };
        let mut out: Vec<Pass> = self.policies.iter().map(|&p| at(p, self.delay_ms, false)).collect();
        let fed: Vec<PolicyKind> = self.policies.iter().copied().filter(|p| p.is_event_fed()).collect();
        if self.with_predictions {
            out.extend(fed.iter().map(|&p| at(p, self.delay_ms, true)));
        }
        for &d in &self.sweep_delays_ms {
            for predict in [false, true] {
                if predict && !self.with_predictions {
                    continue;
                }
                for &p in &fed {
                    let pass = at(p, d, predict);
                    if !out.contains(&pass) {
                        out.push(pass);
                    }
                }
            }
        }
        out
    }
}

/// Runs every pass of `config` over `workload` (several at once, on fresh
/// engines each) and returns the report and the raw passes of the main table
/// (for `requests.jsonl`). `progress` advances by one per request per pass.
pub fn simulate(
    workload: &Workload,
    config: &SimConfig,
    progress: &ProgressBar,
) -> Result<(Report, Vec<PolicyRun>), SimError> {
    config.validate()?;
    let passes = config.passes();
    let threads = match config.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        t => t,
    }
    .min(passes.len())
    .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<PolicyRun, SimError>>>> =
        passes.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(pass) = passes.get(i) else { break };
                    let run = fleet::run_policy(workload, pass.policy, pass.options, config, progress);
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(run);
                }
            });
        }
    });
    let mut runs = Vec::with_capacity(passes.len());
    for r in results {
        runs.push(r.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every pass ran")?);
    }
    let summary = |r: &PolicyRun| PolicySummary::of(r, workload, config.workers, config.block_size_tokens);
    let main = config.policies.len();
    let policies = runs[..main].iter().map(summary).collect();
    let predicted = runs[main..]
        .iter()
        .filter(|r| r.options.predict && r.options.delay_us == config.delay_ms * 1000.0)
        .map(summary)
        .collect();
    let mut sweep: Vec<SweepPoint> = runs
        .iter()
        .filter(|r| r.policy.is_event_fed())
        .filter(|r| {
            // The default delay's passes are points of the sweep too.
            !config.sweep_delays_ms.is_empty()
                && config.sweep_delays_ms.iter().chain([&config.delay_ms]).any(|d| d * 1000.0 == r.options.delay_us)
        })
        .map(|r| SweepPoint::of(&summary(r), r))
        .collect();
    sweep.sort_by(|a, b| (a.predict, &a.policy).cmp(&(b.predict, &b.policy)).then(a.delay_ms.total_cmp(&b.delay_ms)));
    runs.truncate(main);
    Ok((
        Report {
            workload: workload.name.clone(),
            requests: workload.requests.len() as u64,
            prompt_tokens: workload.prompt_tokens(),
            ideal_hit_ratio: workload.ideal_hit_ratio,
            config: config.clone(),
            policies,
            predicted,
            sweep,
        },
        runs,
    ))
}
