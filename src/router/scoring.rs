//! The routing decision: overlap against load.
//!
//! For a request of `n` full blocks and each live worker `w` with device
//! overlap `d_w` and any-tier overlap `a_w` (blocks, from
//! [`crate::Indexer::find_matches`]) and load `l_w` (blocks of work
//! already queued or running there, reported by the caller), the cost is
//!
//! ```text
//! prefill_w = n - d_w - host_reuse · (a_w - d_w)      blocks still to compute
//! cost_w    = prefill_weight · prefill_w + load_weight · l_w
//! ```
//!
//! and the decision is the worker of least cost. Ties go to the lower load,
//! then to a worker picked by the request's first key, so that equal workers
//! share equal traffic instead of the first one taking it all.
//!
//! Defaults and why: `prefill_weight = 1`, `load_weight = 1` put a cached
//! block and a queued block on one scale (each is one block of compute,
//! saved or waited for); `host_reuse = 0.8` counts a host-tier block as most
//! of a device hit, because it costs a copy over PCIe (about 55 GB/s) instead
//! of a recompute. All three are fields of [`ScoringConfig`].

use crate::hashing::RouterKey;
use crate::indexer::{Overlap, WorkerId};

/// The weights of the decision formula (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScoringConfig {
    /// Weight of the blocks still to prefill.
    pub prefill_weight: f64,
    /// Weight of the worker's load.
    pub load_weight: f64,
    /// Fraction of a device hit that a host-tier hit is worth, in `[0, 1]`.
    pub host_reuse: f64,
}

impl Default for ScoringConfig {
    fn default() -> Self {
        Self { prefill_weight: 1.0, load_weight: 1.0, host_reuse: 0.8 }
    }
}

/// One worker's line of a decision.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct WorkerScore {
    /// The worker.
    pub worker: u32,
    /// Leading blocks on the device.
    pub device_blocks: u32,
    /// Leading blocks in any tier.
    pub any_tier_blocks: u32,
    /// The load given for it.
    pub load_blocks: f64,
    /// Its cost (lower is better).
    pub cost: f64,
}

/// A routing decision and how it was reached.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Decision {
    /// The chosen worker; `None` when no worker was given.
    pub worker: Option<u32>,
    /// Full blocks in the request.
    pub request_blocks: u32,
    /// Every candidate's score, in worker order.
    pub scores: Vec<WorkerScore>,
}

/// Scores every worker in `workers` (with its load) for a request of
/// `request_blocks` full blocks whose first key is `first_key`, given the
/// overlaps found, and picks one.
pub fn decide(
    config: &ScoringConfig,
    request_blocks: u32,
    first_key: Option<RouterKey>,
    overlaps: &[Overlap],
    workers: &[(WorkerId, f64)],
) -> Decision {
    let host = config.host_reuse.clamp(0.0, 1.0);
    let mut scores: Vec<WorkerScore> = workers
        .iter()
        .map(|&(w, load)| {
            let o = overlaps.iter().find(|o| o.worker == w);
            let (d, a) = o.map_or((0, 0), |o| (o.device_blocks, o.any_tier_blocks));
            let prefill = request_blocks as f64 - d as f64 - host * (a - d) as f64;
            let load = load.max(0.0);
            WorkerScore {
                worker: w.0,
                device_blocks: d,
                any_tier_blocks: a,
                load_blocks: load,
                cost: config.prefill_weight * prefill.max(0.0) + config.load_weight * load,
            }
        })
        .collect();
    scores.sort_by_key(|s| s.worker);
    let best = scores.iter().map(|s| s.cost).fold(f64::INFINITY, f64::min);
    let tied: Vec<&WorkerScore> = scores.iter().filter(|s| s.cost <= best + 1e-9).collect();
    let least_load = tied.iter().map(|s| s.load_blocks).fold(f64::INFINITY, f64::min);
    let tied: Vec<&&WorkerScore> = tied.iter().filter(|s| s.load_blocks <= least_load + 1e-9).collect();
    let worker = match tied.len() {
        0 => None,
        n => {
            let spread = first_key.map_or(0, |k| k.0) as usize % n;
            Some(tied[spread].worker)
        }
    };
    Decision { worker, request_blocks, scores }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(w: u32, d: u32, a: u32) -> Overlap {
        Overlap { worker: WorkerId(w), device_blocks: d, any_tier_blocks: a }
    }

    /// Overlap wins at equal load; enough load outweighs overlap; host hits
    /// count for less than device hits; a tie spreads by the request key.
    #[test]
    fn overlap_against_load() {
        let c = ScoringConfig::default();
        let ws = [(WorkerId(0), 0.0), (WorkerId(1), 0.0)];
        assert_eq!(decide(&c, 10, None, &[o(1, 8, 8)], &ws).worker, Some(1));
        let loaded = [(WorkerId(0), 0.0), (WorkerId(1), 9.0)];
        assert_eq!(decide(&c, 10, None, &[o(1, 8, 8)], &loaded).worker, Some(0));
        // Device 5 beats host 6 (6 · 0.8 = 4.8 < 5).
        assert_eq!(decide(&c, 10, None, &[o(0, 0, 6), o(1, 5, 5)], &ws).worker, Some(1));
        let picks: std::collections::BTreeSet<_> = (0..16u64)
            .filter_map(|k| decide(&c, 10, Some(RouterKey(k)), &[o(0, 4, 4), o(1, 4, 4)], &ws).worker)
            .collect();
        assert_eq!(picks.len(), 2, "equal workers share traffic");
        assert_eq!(decide(&c, 10, None, &[], &[]).worker, None);
    }
}
