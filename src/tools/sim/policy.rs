//! Routing policies and the decision every KV-aware one makes.
//!
//! | policy | knows | picks |
//! |---|---|---|
//! | `round-robin` | nothing | the next worker in turn |
//! | `least-loaded` | queued work | the worker with the least backlog |
//! | `kv-text-only` | delayed events, token ids only | least cost, overlap from [`TextOnlyView`](super::view::TextOnlyView) |
//! | `dynamo` | delayed wire payloads, images by `mm_hash` | Dynamo 1.6.1's own decoder, indexer and default logit ([`DynamoView`](super::dynamo_view::DynamoView)) |
//! | `kv-uuid` | delayed wire payloads, images by UUID (fleet-wide view) | least cost, overlap from kvcore's router |
//! | `kv-pixels` | delayed wire payloads, images by hashed pixels | least cost, overlap from kvcore's router, pays BLAKE3 per image |
//! | `oracle` | every engine's index, now | least cost, exact overlap |
//!
//! The kvcore-side KV-aware policies share one cost (the router's, see
//! [`decide`]), so the comparison isolates what each one knows; `dynamo`
//! applies Dynamo's own rule.

use kvcore_router::{Overlap as RouterOverlap, RouterKey, ScoringConfig, WorkerId};

use super::view::Overlap;

/// A routing policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum PolicyKind {
    /// Workers in turn.
    RoundRobin,
    /// The worker with the least queued work.
    LeastLoaded,
    /// KV-aware, image blocks keyed by placeholder tokens alone.
    KvTextOnly,
    /// Dynamo's router (native crate 1.6.1): images by `mm_hash`.
    Dynamo,
    /// kvcore's router, images by UUID when the client sent one.
    KvUuid,
    /// kvcore's router, every image's pixels hashed.
    KvPixels,
    /// KV-aware with exact knowledge of every engine's cache.
    Oracle,
}

impl PolicyKind {
    /// Every policy, in report order.
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::RoundRobin,
        PolicyKind::LeastLoaded,
        PolicyKind::KvTextOnly,
        PolicyKind::Dynamo,
        PolicyKind::KvUuid,
        PolicyKind::KvPixels,
        PolicyKind::Oracle,
    ];

    /// The policies fed by (delayed) events, which the delay sweep and the
    /// predicted-blocks comparison cover.
    pub const EVENT_FED: [PolicyKind; 4] =
        [PolicyKind::KvTextOnly, PolicyKind::Dynamo, PolicyKind::KvUuid, PolicyKind::KvPixels];

    /// The policy's name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::LeastLoaded => "least-loaded",
            PolicyKind::KvTextOnly => "kv-text-only",
            PolicyKind::Dynamo => "dynamo",
            PolicyKind::KvUuid => "kv-uuid",
            PolicyKind::KvPixels => "kv-pixels",
            PolicyKind::Oracle => "oracle",
        }
    }

    /// The policy named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether the policy forms beliefs about caches (and so can be wrong).
    pub fn is_kv_aware(self) -> bool {
        !matches!(self, PolicyKind::RoundRobin | PolicyKind::LeastLoaded)
    }

    /// Whether the policy learns from the event stream (and so sees it late).
    pub fn is_event_fed(self) -> bool {
        Self::EVENT_FED.contains(&self)
    }

    /// Images whose pixels the policy hashes before routing `images` (each
    /// given with whether the client sent a UUID): all for `kv-pixels`, those
    /// without a UUID for `kv-uuid` and `dynamo`, none otherwise.
    pub fn images_hashed(self, uuids: impl Iterator<Item = bool>) -> u32 {
        uuids.filter(|&has| self.hashes_image(has)).count() as u32
    }

    /// Whether the router hashes the pixels of an image that came with a
    /// UUID (`has_uuid`) or without one.
    pub fn hashes_image(self, has_uuid: bool) -> bool {
        match self {
            PolicyKind::KvPixels => true,
            PolicyKind::KvUuid | PolicyKind::Dynamo => !has_uuid,
            _ => false,
        }
    }
}

/// The weights of the KV-aware cost (the router's defaults).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Scoring {
    /// Weight of the blocks still to prefill.
    pub prefill_weight: f64,
    /// Weight of the worker's backlog, in blocks of prefill work.
    pub load_weight: f64,
    /// Fraction of a device hit that a host-tier hit is worth.
    pub host_reuse: f64,
}

impl Default for Scoring {
    fn default() -> Self {
        Self { prefill_weight: 1.0, load_weight: 1.0, host_reuse: 0.8 }
    }
}

/// Picks the worker of least cost for a request of `request_blocks` full
/// blocks:
///
/// ```text
/// cost_w = prefill_weight · (n - d_w - host_reuse · (a_w - d_w)) + load_weight · load_w
/// ```
///
/// with `d_w`, `a_w` the device and any-tier overlaps and `load_w` the
/// backlog in blocks. Ties go to the lower load, then to the worker that
/// `spread` picks among the tied ones, so that equal workers share traffic.
///
/// This is the router's own decision ([`kvcore_router::decide`]), so that the
/// three KV-aware policies differ only in their beliefs.
pub fn decide(scoring: &Scoring, request_blocks: u32, overlaps: &[Overlap], loads: &[f64], spread: u64) -> usize {
    let config = ScoringConfig {
        prefill_weight: scoring.prefill_weight,
        load_weight: scoring.load_weight,
        host_reuse: scoring.host_reuse,
    };
    let router_overlaps: Vec<RouterOverlap> = overlaps
        .iter()
        .enumerate()
        .map(|(w, o)| RouterOverlap {
            worker: WorkerId(w as u32),
            device_blocks: o.device_blocks,
            any_tier_blocks: o.any_tier_blocks,
        })
        .collect();
    let workers: Vec<(WorkerId, f64)> = loads.iter().enumerate().map(|(w, l)| (WorkerId(w as u32), *l)).collect();
    let decision = kvcore_router::decide(&config, request_blocks, Some(RouterKey(spread)), &router_overlaps, &workers);
    decision.worker.map_or(0, |w| w as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(d: u32, a: u32) -> Overlap {
        Overlap { device_blocks: d, any_tier_blocks: a }
    }

    /// Overlap wins at equal load, enough load outweighs it, and a tie is
    /// spread over the tied workers.
    #[test]
    fn overlap_against_load() {
        let s = Scoring::default();
        assert_eq!(decide(&s, 10, &[o(0, 0), o(8, 8)], &[0.0, 0.0], 0), 1);
        assert_eq!(decide(&s, 10, &[o(0, 0), o(8, 8)], &[0.0, 9.0], 0), 0);
        assert_eq!(decide(&s, 10, &[o(0, 6), o(5, 5)], &[0.0, 0.0], 0), 1);
        let picks: std::collections::BTreeSet<usize> =
            (0..8).map(|k| decide(&s, 10, &[o(4, 4), o(4, 4)], &[0.0, 0.0], k)).collect();
        assert_eq!(picks.len(), 2);
    }
}
