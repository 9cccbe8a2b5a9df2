//! Counters: monotonic figures a person or a dashboard reads.

/// Engine counters. All are monotonic since creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Requests admitted (dummy ones included).
    pub requests_admitted: u64,
    /// Requests rejected at admission.
    pub requests_rejected: u64,
    /// Prompt tokens matched in the prefix cache.
    pub tokens_cached: u64,
    /// Prompt tokens that had to be computed.
    pub tokens_uncached: u64,
    /// Blocks evicted from the device (dropped or offloaded).
    pub blocks_evicted_device: u64,
    /// Blocks offloaded to the host tier.
    pub blocks_offloaded: u64,
    /// Blocks onboarded from the host tier.
    pub blocks_onboarded: u64,
    /// Blocks dropped from the host tier.
    pub blocks_evicted_host: u64,
    /// Blocks given fresh with a partial prefix copied in.
    pub blocks_partially_reused: u64,
    /// Routing-hint lookups that found an unambiguous UUID.
    pub hint_hits: u64,
    /// Routing-hint lookups that found none (never seen, evicted or ambiguous).
    pub hint_misses: u64,
    /// Routing hints evicted by the table's bound.
    pub hint_evictions: u64,
    /// Digest/UUID pairs that contradicted an earlier pair.
    pub hint_conflicts: u64,
    /// UUIDs ignored for being longer than 256 bytes.
    pub hint_oversized: u64,
    /// Events produced.
    pub events_emitted: u64,
    /// Closed event batches dropped undrained by `event_batches_max`.
    pub event_batches_dropped: u64,
}
