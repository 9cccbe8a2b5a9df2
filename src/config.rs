//! Engine configuration. Every capacity is reserved when the engine is built,
//! so a running engine never grows its tables (TigerStyle static allocation).
//! Each field has an upper bound (the `*_LIMIT` constants, mirrored in the C
//! header as `KVC_CONFIG_*_LIMIT`), so that no accepted value asks for more
//! than a machine can be expected to reserve; the reservations themselves are
//! fallible, so a valid config that this machine cannot hold is refused with
//! an error instead of ending the process.

use crate::error::ConfigError;
use crate::group::GroupKind;

/// Qwen2-VL / Qwen3-VL image placeholder token (`<|image_pad|>`).
pub const QWEN_IMAGE_PAD_TOKEN: u32 = 151_655;

/// Configuration of one engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Tokens per KV block. Any value in `1..=1024`; 16, 32 and 64 are usual.
    pub block_size_tokens: u32,
    /// Number of KV blocks on the device (GPU pages).
    pub blocks_device: u32,
    /// Number of KV blocks in the pinned host tier; 0 turns the tier off.
    pub blocks_host: u32,
    /// Whether finished requests leave their blocks matchable (prefix reuse).
    /// Off: blocks are never indexed and no events are produced.
    pub block_reuse: bool,
    /// Partial reuse: a prompt that shares `k` tokens (0 < k < block size)
    /// with a cached block gets a fresh block with those tokens copied in (a
    /// [`crate::resources::BlockCopy`] of `k` tokens) instead of recomputing
    /// them. Off by default, because the caller must then perform the copies
    /// that `Engine::step` returns before the forward pass (the GPU system
    /// does when a KV pool is attached).
    pub partial_reuse: bool,
    /// Tier moves in few copy waves: when a request (or a growth) needs
    /// device pages, every device block it takes the place of is evicted
    /// (offloaded) before any host block is onboarded, even when the host
    /// tier has to drop blocks for it that the onboards would have made room
    /// for. A step's copies then form one or two waves (one launch each,
    /// offloads and onboards side by side when the device has free pages)
    /// instead of one per move when both tiers are full, for a lower hit
    /// rate (docs/architecture.md, "Tier moves"). Off by default: offloads
    /// go up front only while the host tier has free pages for them.
    pub offload_first: bool,
    /// Whether KV-cache events are produced at all.
    pub kv_events: bool,
    /// The model's image placeholder token id, written at image positions in
    /// block keys and on the wire.
    pub image_placeholder_token_id: u32,
    /// Most requests alive at once.
    pub requests_max: u32,
    /// Most tokens in one request (prompt plus generated).
    pub tokens_per_request_max: u32,
    /// Most image items alive at once, over all requests.
    pub mm_items_max: u32,
    /// Most image items in one request.
    pub mm_items_per_request_max: u32,
    /// Most runs per image item (text may split an item).
    pub runs_per_item_max: u32,
    /// Capacity of the digest-to-UUID routing-hint table.
    pub routing_hints_max: u32,
    /// Most closed event batches kept for `drain_*`. When a step closes with
    /// this many undrained, the oldest is dropped and counted
    /// (`Counters::event_batches_dropped`), so a caller that never drains
    /// (one that only publishes) holds bounded memory. With a publisher
    /// attached, 0 keeps nothing and hands each batch to the publisher
    /// without a copy. The same bound applies to the batches closed early
    /// by [`EngineConfig::events_per_step_max`].
    pub event_batches_max: u32,
    /// The KV cache groups of a hybrid model, in group order (the index of
    /// each is its `group_idx` on the wire). Empty: one full-attention group
    /// with `blocks_device` and `blocks_host` pages, the engine of a model
    /// that is not hybrid, which names no group anywhere (events, copies and
    /// pages exactly as before groups existed). Otherwise group 0 is the one
    /// full-attention group, every other group a sliding window, and
    /// `blocks_device` / `blocks_host` are the sums of the groups' pages
    /// (see [`EngineConfig::validate`]).
    pub groups: Vec<GroupConfig>,
}

/// One KV cache group: the layers that share one paged pool, what they
/// attend to, and the group's share of the block budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    /// Full attention, or a sliding window of `window_tokens`.
    pub kind: GroupKind,
    /// The group's device pages. A sliding-window group keeps its page 0 as
    /// its null page (never handed out; its block tables name it for blocks
    /// released early), so it needs at least 2.
    pub blocks_device: u32,
    /// The group's pinned host pages; 0 gives the group no host tier.
    pub blocks_host: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size_tokens: 32,
            blocks_device: 4096,
            blocks_host: 0,
            block_reuse: true,
            partial_reuse: false,
            offload_first: false,
            kv_events: true,
            image_placeholder_token_id: QWEN_IMAGE_PAD_TOKEN,
            requests_max: 1024,
            tokens_per_request_max: 131_072,
            mm_items_max: 4096,
            mm_items_per_request_max: 64,
            runs_per_item_max: 64,
            routing_hints_max: 4096,
            event_batches_max: 1024,
            groups: Vec::new(),
        }
    }
}

/// Longest UUID, in UTF-8 bytes, that is kept as a routing hint. Longer ones
/// are ignored (and counted), as in the seed pull request.
pub const UUID_HINT_BYTES_MAX: usize = 256;

/// Largest `block_size_tokens`.
pub const BLOCK_SIZE_TOKENS_LIMIT: u32 = 1024;
/// Largest `blocks_device` (4 Mi pages: far more than any device holds at
/// any block size, and a table of a few hundred MiB).
pub const BLOCKS_DEVICE_LIMIT: u32 = 1 << 22;
/// Largest `blocks_host`.
pub const BLOCKS_HOST_LIMIT: u32 = 1 << 22;
/// Largest `(blocks_device + blocks_host) * block_size_tokens`: the token
/// ids of every page are kept (4 bytes each), so this bounds that table to
/// 4 GiB of address space (allocated zeroed, so pages never written cost
/// no memory).
pub const TOKEN_SLOTS_LIMIT: u64 = 1 << 30;
/// Largest `requests_max` (every request row is reserved up front).
pub const REQUESTS_LIMIT: u32 = 1 << 20;
/// Largest `mm_items_max` (every item row is reserved up front).
pub const MM_ITEMS_LIMIT: u32 = 1 << 20;
/// Largest `routing_hints_max` (the hint table is reserved up front).
pub const ROUTING_HINTS_LIMIT: u32 = 1 << 20;
/// Most KV cache groups in one configuration.
pub const GROUPS_LIMIT: usize = 16;
/// Largest sliding window, in tokens.
pub const WINDOW_TOKENS_LIMIT: u32 = 1 << 24;
/// Largest `event_batches_max`.
pub const EVENT_BATCHES_LIMIT: u32 = 1 << 16;
/// Fewest block entries the open step's events may hold before the engine
/// closes them early ([`EngineConfig::events_per_step_max`]).
pub const EVENTS_PER_STEP_MIN: usize = 4096;

/// Bounds derived from the configuration rather than set in it.
impl EngineConfig {
    /// The groups the engine runs: the configured list, or one
    /// full-attention group with every page when the list is empty.
    pub fn effective_groups(&self) -> Vec<GroupConfig> {
        if self.groups.is_empty() {
            vec![GroupConfig {
                kind: GroupKind::FullAttention,
                blocks_device: self.blocks_device,
                blocks_host: self.blocks_host,
            }]
        } else {
            self.groups.clone()
        }
    }

    /// Whether the engine names its groups (in events and copies): a
    /// configuration that lists groups does, an empty list does not.
    pub fn names_groups(&self) -> bool {
        !self.groups.is_empty()
    }

    /// Most block entries (a key stored or removed counts one, a clear one)
    /// that the open step's events hold after any call:
    /// `max(4096, 2 * (blocks_device + blocks_host))`, twice what a step
    /// that moves every page once produces. When a call leaves this many or
    /// more, the engine closes them into a batch of their own at once, with
    /// the open step's index, as a step closes its batch (counted, published,
    /// kept for the drains); the step then closes what follows. One call adds
    /// at most a bounded amount on top: three entries per block it evicts or
    /// moves (a host block dropped for an offload, the removal, the store in
    /// the other tier) and one commit's blocks.
    pub fn events_per_step_max(&self) -> usize {
        EVENTS_PER_STEP_MIN.max(2 * (self.blocks_device as usize + self.blocks_host as usize))
    }

    /// Most block copies queued between two steps: `blocks_device +
    /// blocks_host`. At the bound an eviction drops the block instead of
    /// offloading it, and an admission matches no host block it has no room
    /// to onboard and takes no partial reuse it has no room to copy (the
    /// tokens are computed instead); nothing that the events advertise is
    /// lost.
    pub fn copies_per_step_max(&self) -> usize {
        self.blocks_device as usize + self.blocks_host as usize
    }
}

impl EngineConfig {
    /// Checks every field against its range (the `*_LIMIT` constants of this
    /// module); the engine refuses to start on an invalid config. A valid
    /// config can still be refused by [`crate::Engine::new`] with
    /// [`ConfigError::OutOfMemory`] when the machine cannot reserve it.
    ///
    /// | field | range |
    /// |---|---|
    /// | `block_size_tokens` | `1..=1024` |
    /// | `blocks_device` | `1..=2^22` |
    /// | `blocks_host` | `0..=2^22` |
    /// | `(blocks_device + blocks_host) * block_size_tokens` | at most `2^30` |
    /// | `requests_max` | `1..=2^20` |
    /// | `tokens_per_request_max` | `1..=2^32-1` |
    /// | `mm_items_max` | `0..=2^20` |
    /// | `mm_items_per_request_max` | `0..=mm_items_max` |
    /// | `runs_per_item_max` | `1..=2^32-1` |
    /// | `routing_hints_max` | `0..=2^20` |
    /// | `event_batches_max` | `0..=2^16` |
    /// | `groups` | empty, or `2..=16` groups: group 0 full attention, every other a sliding window |
    /// | a group's `blocks_device` | at least 1 (full attention), 2 (sliding window: page 0 is its null page) |
    /// | a sliding window's `window_tokens` | `1..=2^24` |
    /// | `blocks_device`, `blocks_host` with groups | the sums of the groups' pages |
    /// | `partial_reuse` with groups | off |
    ///
    /// One full-attention group, not several: Dynamo 1.6.1 takes the blocks
    /// of every full-attention group for its main index, so a second one
    /// would advertise blocks under the first one's name. A single group
    /// given explicitly is allowed and means what an empty list means,
    /// except that its events name their group.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |ok: bool, what: &'static str| if ok { Ok(()) } else { Err(ConfigError::Invalid(what)) };
        check(
            (1..=BLOCK_SIZE_TOKENS_LIMIT).contains(&self.block_size_tokens),
            "block_size_tokens must be in 1..=1024",
        )?;
        check(self.blocks_device >= 1, "blocks_device must be at least 1")?;
        check(self.blocks_device <= BLOCKS_DEVICE_LIMIT, "blocks_device must be at most 2^22")?;
        check(self.blocks_host <= BLOCKS_HOST_LIMIT, "blocks_host must be at most 2^22")?;
        let slots = (u64::from(self.blocks_device) + u64::from(self.blocks_host)) * u64::from(self.block_size_tokens);
        check(slots <= TOKEN_SLOTS_LIMIT, "(blocks_device + blocks_host) * block_size_tokens must be at most 2^30")?;
        check(self.requests_max >= 1, "requests_max must be at least 1")?;
        check(self.requests_max <= REQUESTS_LIMIT, "requests_max must be at most 2^20")?;
        check(self.tokens_per_request_max >= 1, "tokens_per_request_max must be at least 1")?;
        check(self.mm_items_max <= MM_ITEMS_LIMIT, "mm_items_max must be at most 2^20")?;
        check(
            self.mm_items_per_request_max <= self.mm_items_max,
            "mm_items_per_request_max must not exceed mm_items_max",
        )?;
        check(self.runs_per_item_max >= 1, "runs_per_item_max must be at least 1")?;
        check(self.routing_hints_max <= ROUTING_HINTS_LIMIT, "routing_hints_max must be at most 2^20")?;
        check(self.event_batches_max <= EVENT_BATCHES_LIMIT, "event_batches_max must be at most 2^16")?;
        self.validate_groups()
    }

    fn validate_groups(&self) -> Result<(), ConfigError> {
        let check = |ok: bool, what: &'static str| if ok { Ok(()) } else { Err(ConfigError::Invalid(what)) };
        let Some(first) = self.groups.first() else { return Ok(()) };
        check(self.groups.len() <= GROUPS_LIMIT, "groups: at most 16 groups")?;
        check(first.kind == GroupKind::FullAttention, "groups: group 0 must be the full-attention group")?;
        for g in &self.groups[1..] {
            check(
                matches!(g.kind, GroupKind::SlidingWindow { .. }),
                "groups: only group 0 may be full attention (Dynamo takes every full-attention group as its main index)",
            )?;
        }
        for g in &self.groups {
            match g.kind {
                GroupKind::FullAttention => {
                    check(g.blocks_device >= 1, "groups: a group's blocks_device must be at least 1")?
                }
                GroupKind::SlidingWindow { window_tokens } => {
                    check(
                        (1..=WINDOW_TOKENS_LIMIT).contains(&window_tokens),
                        "groups: window_tokens must be in 1..=2^24",
                    )?;
                    check(
                        g.blocks_device >= 2,
                        "groups: a sliding-window group's blocks_device must be at least 2 (page 0 is its null page)",
                    )?;
                }
            }
        }
        let device: u64 = self.groups.iter().map(|g| u64::from(g.blocks_device)).sum();
        let host: u64 = self.groups.iter().map(|g| u64::from(g.blocks_host)).sum();
        check(
            device == u64::from(self.blocks_device),
            "groups: blocks_device must equal the sum of the groups' blocks_device",
        )?;
        check(
            host == u64::from(self.blocks_host),
            "groups: blocks_host must equal the sum of the groups' blocks_host",
        )?;
        check(!self.partial_reuse, "groups: partial_reuse is not supported with groups")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid(groups: Vec<GroupConfig>) -> EngineConfig {
        EngineConfig {
            blocks_device: groups.iter().map(|g| g.blocks_device).sum(),
            blocks_host: groups.iter().map(|g| g.blocks_host).sum(),
            groups,
            ..EngineConfig::default()
        }
    }

    fn full(blocks_device: u32) -> GroupConfig {
        GroupConfig { kind: GroupKind::FullAttention, blocks_device, blocks_host: 0 }
    }

    fn window(window_tokens: u32, blocks_device: u32) -> GroupConfig {
        GroupConfig { kind: GroupKind::SlidingWindow { window_tokens }, blocks_device, blocks_host: 0 }
    }

    /// Each group rule refuses what it names, with a message naming it, and
    /// accepts the recommended shape; method: one config per rule.
    #[test]
    fn group_rules_are_validated() {
        let refused = |c: EngineConfig, what: &str| match c.validate() {
            Err(ConfigError::Invalid(m)) => assert!(m.contains(what), "{m:?} names {what:?}"),
            other => panic!("{c:?}: expected a refusal naming {what:?}, got {other:?}"),
        };
        assert_eq!(hybrid(vec![full(8), window(128, 4), window(4096, 4)]).validate(), Ok(()));
        assert_eq!(hybrid(vec![full(8)]).validate(), Ok(()));
        refused(hybrid(vec![window(128, 4), full(8)]), "group 0");
        refused(hybrid(vec![full(8), full(8)]), "only group 0");
        refused(hybrid(vec![full(8), window(0, 4)]), "window_tokens");
        refused(hybrid(vec![full(8), window(WINDOW_TOKENS_LIMIT + 1, 4)]), "window_tokens");
        refused(hybrid(vec![full(8), window(64, 1)]), "null page");
        refused(hybrid(vec![full(0), window(64, 4)]), "at least 1");
        refused(hybrid((0..17).map(|i| if i == 0 { full(4) } else { window(8, 2) }).collect()), "at most 16");
        refused(EngineConfig { blocks_device: 13, ..hybrid(vec![full(8), window(64, 4)]) }, "sum");
        refused(EngineConfig { blocks_host: 1, ..hybrid(vec![full(8), window(64, 4)]) }, "sum");
        refused(EngineConfig { partial_reuse: true, ..hybrid(vec![full(8), window(64, 4)]) }, "partial_reuse");
        // An empty list is one full-attention group with every page.
        let c = EngineConfig::default();
        assert_eq!(
            c.effective_groups(),
            vec![GroupConfig { kind: GroupKind::FullAttention, blocks_device: 4096, blocks_host: 0 }]
        );
        assert!(!c.names_groups());
    }
}
