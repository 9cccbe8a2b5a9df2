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
//! | module | what |
//! |---|---|
//! | [`workload`] | the seeded multimodal chat generator and the Mooncake trace replay |
//! | [`timing`] | the cost of a request and the worker queue |
//! | [`view`] | [`view::CacheView`]: oracle, text-only, content-keyed |
//! | [`router_view`] | `kv-ours`: the real router over loopback ZMQ |
//! | [`policy`] | the policies and the KV-aware decision |
//! | [`fleet`] | one pass: engines, routing, events, timing |
//! | [`copies`] | the shape of the host-tier copies the engines hand out |
//! | [`report`] | figures, terminal table, JSON, JSON lines, SVG |
//!
//! See docs/simulation.md for the model, the default workload and the figures.

pub mod copies;
pub mod fleet;
pub mod policy;
pub mod report;
pub mod router_view;
pub mod timing;
pub mod view;
pub mod workload;

use indicatif::ProgressBar;

pub use fleet::{PolicyRun, RequestOutcome};
pub use policy::{PolicyKind, Scoring};
pub use report::{PolicySummary, Report};
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
    /// Keep worker 0's block copies, step by step ([`fleet::PolicyRun::copy_log`]).
    pub record_copies: bool,
    /// The timing model.
    pub timing: TimingModel,
    /// The KV-aware cost's weights.
    pub scoring: Scoring,
    /// The policies to compare, in report order.
    pub policies: Vec<PolicyKind>,
    /// First TCP port of the engines' publishers (`kv-ours` pass): worker
    /// `w` publishes on `base_port + w` and answers replays on `base_port +
    /// workers + w`. `None`: ports the system picks.
    pub base_port: Option<u16>,
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
            record_copies: false,
            timing: TimingModel::default(),
            scoring: Scoring::default(),
            policies: PolicyKind::ALL.to_vec(),
            base_port: None,
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
        if [t.request_overhead_us, t.prefill_us_per_token, t.onboard_us_per_token, t.decode_us_per_token]
            .iter()
            .any(|c| !c.is_finite() || *c < 0.0)
            || t.prefill_us_per_token <= 0.0
        {
            return Err(SimError::Invalid("timing costs must be finite and non-negative, prefill positive".into()));
        }
        fleet::worker_engine_config(self).validate().map_err(SimError::Config)
    }
}

/// Runs every configured policy over `workload` and returns the report and
/// the raw passes (for `requests.jsonl`). `progress` advances by one per
/// request per policy.
pub fn simulate(
    workload: &Workload,
    config: &SimConfig,
    progress: &ProgressBar,
) -> Result<(Report, Vec<PolicyRun>), SimError> {
    config.validate()?;
    let mut runs = Vec::with_capacity(config.policies.len());
    for &policy in &config.policies {
        progress.set_message(policy.name());
        runs.push(fleet::run_policy(workload, policy, config, progress)?);
    }
    let policies =
        runs.iter().map(|r| PolicySummary::of(r, workload, config.workers, config.block_size_tokens)).collect();
    Ok((
        Report {
            workload: workload.name.clone(),
            requests: workload.requests.len() as u64,
            prompt_tokens: workload.prompt_tokens(),
            ideal_hit_ratio: workload.ideal_hit_ratio,
            config: config.clone(),
            policies,
        },
        runs,
    ))
}
