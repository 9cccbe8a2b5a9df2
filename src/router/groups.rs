//! KV cache groups: what a hybrid model's workers hold beyond their main
//! attention group, and the prefix they can reuse given every group.
//!
//! A hybrid engine keeps one pool per KV cache group and names the group in
//! each `BlockStored` and `BlockRemoved` (`group_idx`, `kv_cache_spec_kind`,
//! `kv_cache_spec_sliding_window`). A prefix of `k` blocks is reusable on a
//! worker only when every group holds what the next token needs:
//!
//! ```text
//! full attention        blocks 0 .. k                       (all of them)
//! sliding window W      blocks (k·B + 1 − W) / B .. k        (the W − 1 tokens before token k·B)
//! ```
//!
//! with `B` the block size and the division rounding down (a window that
//! starts inside a block needs that whole block). Token `k·B`, the first one
//! computed after the match, attends to itself and the `W − 1` tokens before
//! it: vLLM's rule, and the engine's admission rule (`window_first_block`),
//! so that the router scores what the engine will reuse.
//!
//! Why this shape:
//! - The main group (the first full-attention group a worker names, or the
//!   only group of an engine that names none) goes to the [`Indexer`]
//!   unchanged: it is what Dynamo indexes, and a single-group stream costs
//!   nothing more than before.
//! - Every other group is a [`GroupViews`] entry keyed by engine hash: which
//!   hashes each worker holds in which tier. Every group of an engine shares
//!   the block keys, so a block's router key is the one the main group's view
//!   gave the same engine hash ([`Indexer::router_key_of`]). That keeps a
//!   sliding-window group exact even when it holds a chain whose start it
//!   released long ago (a snapshot sends such blocks with parents the group
//!   does not hold; chaining keys inside the group would never key them).
//!   A block the main view has not keyed yet is kept unresolved and keyed
//!   when the main view keys it; until then it does not count, so the router
//!   never scores more than a worker holds.
//! - A group's kind is learned per worker from the hash profile a kvcore
//!   engine sends with its replay and snapshot replies (which lists every
//!   group, even one holding nothing yet, so that an empty window still
//!   stops a prefix), and from the stores that name it, as Dynamo learns it:
//!   a removal in the positional form names only `group_idx`. A group the
//!   router has never heard of cannot constrain a score. An event of a group whose kind is not known yet is
//!   ignored and counted, except group 0, which is the main group (Dynamo's
//!   rule for an unlearned group 0).
//! - Kinds the rule has no place for (Mamba state, chunked local attention,
//!   an unknown name) are ignored and counted: their blocks are not indexed
//!   and do not constrain the score. `mla_attention` and
//!   `sink_full_attention` count as full attention, `sliding_window_mla` as
//!   a sliding window, as in Dynamo 1.6.1.
//! - A full-attention group other than the main one is a window of every
//!   token: it must hold all `k` blocks.

use std::collections::HashMap;

use kvcore::Tier;
use kvcore::wire::{ProfileGroup, WireEvent};

use crate::hashing::RouterKey;
use crate::indexer::{Indexer, Overlap, WorkerId};

/// What the router makes of a group's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum GroupRole {
    /// Full attention: every earlier token.
    Full,
    /// Sliding window of this many tokens.
    Window(u32),
    /// A kind the prefix rule does not cover: not indexed.
    Ignored,
}

impl GroupRole {
    /// The role of a wire `kv_cache_spec_kind` with its window: a sliding
    /// window without a window is not understood, so it is ignored.
    pub fn of_kind(kind: &str, window: Option<u32>) -> Self {
        match kind {
            "full_attention" | "mla_attention" | "sink_full_attention" => GroupRole::Full,
            "sliding_window" | "sliding_window_mla" => window.map_or(GroupRole::Ignored, GroupRole::Window),
            _ => GroupRole::Ignored,
        }
    }

    /// Tokens before the match point the group must hold; `None` for all.
    fn window_tokens(self) -> Option<u32> {
        match self {
            GroupRole::Window(w) => Some(w),
            _ => None,
        }
    }
}

/// Where `GroupViews::route` sends an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GroupRoute {
    /// To the main group's [`Indexer`].
    Main,
    /// To the view of group `index`.
    Group(u32),
    /// To every view of the worker (`AllBlocksCleared`).
    All,
    /// Nowhere (a kind the rule does not cover, or a group not learned yet).
    Nowhere,
}

/// What the group views did with the events they were given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GroupCounters {
    /// Events of a group other than the main one, applied to its view.
    pub group_events: u64,
    /// Events of a kind the prefix rule does not cover, ignored.
    pub events_ignored_kind: u64,
    /// Events of a group whose kind no store had named yet, ignored.
    pub events_unlearned_group: u64,
    /// Blocks dropped because a worker's group was at
    /// `blocks_per_worker_max`.
    pub blocks_dropped_full: u64,
    /// Blocks keyed after they were stored, once the main view keyed them.
    pub blocks_resolved_late: u64,
}

/// One block of a group view.
#[derive(Clone, Copy, Debug)]
struct GroupBlock {
    /// Tier bits: 1 the device, 2 a lower tier.
    tiers: u8,
    /// The router key, once the main view has keyed the same engine hash.
    key: Option<u64>,
}

/// One worker's blocks in one group.
#[derive(Debug, Default)]
struct WorkerGroup {
    /// The group's role on this worker.
    role: Option<GroupRole>,
    /// Engine hash to block.
    blocks: HashMap<i64, GroupBlock, ahash::RandomState>,
    /// Router key to tier bits, for the blocks keyed.
    keyed: HashMap<u64, u8, ahash::RandomState>,
    /// Engine hashes stored before the main view keyed them.
    unresolved: Vec<i64>,
}

impl WorkerGroup {
    fn clear(&mut self) {
        self.blocks.clear();
        self.keyed.clear();
        self.unresolved.clear();
    }

    fn tiers_of(&self, key: RouterKey) -> u8 {
        self.keyed.get(&key.0).copied().unwrap_or(0)
    }
}

/// One worker's groups.
#[derive(Debug, Default)]
struct WorkerGroups {
    /// The index of the worker's main group, once learned.
    main: Option<u32>,
    /// Every group other than the main one, by index.
    groups: HashMap<u32, WorkerGroup, ahash::RandomState>,
    /// Whether the worker is live (not removed).
    live: bool,
}

/// The groups of every worker beside the main group's [`Indexer`] (see the
/// module docs). Worker ids are the indexer's.
#[derive(Debug)]
pub struct GroupViews {
    block_size: u32,
    blocks_per_worker_max: usize,
    workers: Vec<WorkerGroups>,
    counters: GroupCounters,
    /// The main view's late-keyed count when unresolved blocks were last
    /// retried.
    main_resolved_late: u64,
}

impl GroupViews {
    /// Empty views for a model of `block_size` tokens per block, each
    /// worker's group bounded to `blocks_per_worker_max` blocks.
    pub fn new(block_size: u32, blocks_per_worker_max: usize) -> Self {
        Self {
            block_size,
            blocks_per_worker_max,
            workers: Vec::new(),
            counters: GroupCounters::default(),
            main_resolved_late: 0,
        }
    }

    /// The counters.
    pub fn counters(&self) -> GroupCounters {
        self.counters
    }

    fn worker_mut(&mut self, worker: WorkerId) -> &mut WorkerGroups {
        let w = worker.0 as usize;
        if self.workers.len() <= w {
            self.workers.resize_with(w + 1, || WorkerGroups { live: true, ..Default::default() });
        }
        &mut self.workers[w]
    }

    /// Whether any worker has named a group other than its main one.
    pub fn is_empty(&self) -> bool {
        self.workers.iter().all(|w| w.groups.is_empty())
    }

    /// The groups a worker has named besides its main one, with their roles,
    /// sorted by index; and its main group's index when learned.
    pub fn worker_groups(&self, worker: WorkerId) -> (Option<u32>, Vec<(u32, GroupRole)>) {
        let Some(w) = self.workers.get(worker.0 as usize) else { return (None, Vec::new()) };
        let mut v: Vec<(u32, GroupRole)> = w.groups.iter().filter_map(|(i, g)| Some((*i, g.role?))).collect();
        v.sort_unstable_by_key(|(i, _)| *i);
        (w.main, v)
    }

    /// The engine hashes a worker's group holds in a tier, sorted.
    pub fn group_blocks(&self, worker: WorkerId, group: u32, tier: Tier) -> Vec<i64> {
        let bit = tier_bit(tier);
        let Some(g) = self.workers.get(worker.0 as usize).and_then(|w| w.groups.get(&group)) else {
            return Vec::new();
        };
        let mut v: Vec<i64> = g.blocks.iter().filter(|(_, b)| b.tiers & bit != 0).map(|(h, _)| *h).collect();
        v.sort_unstable();
        v
    }

    /// Where an event of `worker` goes, learning the group's role from the
    /// event when it names a kind.
    fn route(&mut self, worker: WorkerId, event: &WireEvent) -> GroupRoute {
        let (group_idx, kind, window) = match event {
            WireEvent::BlockStored(s) => (s.group_idx, s.kv_cache_spec_kind.as_deref(), s.kv_cache_spec_sliding_window),
            WireEvent::BlockRemoved(r) => {
                (r.group_idx, r.kv_cache_spec_kind.as_deref(), r.kv_cache_spec_sliding_window)
            }
            WireEvent::AllBlocksCleared => return GroupRoute::All,
            WireEvent::Unknown { .. } => return GroupRoute::Main,
        };
        let Some(index) = group_idx else {
            // No group: a single-group engine, or a kind alone.
            return match kind.map(|k| GroupRole::of_kind(k, window)) {
                None | Some(GroupRole::Full) => GroupRoute::Main,
                Some(_) => {
                    self.counters.events_ignored_kind += 1;
                    GroupRoute::Nowhere
                }
            };
        };
        let w = self.worker_mut(worker);
        let role = match kind {
            Some(_) if w.main == Some(index) => return GroupRoute::Main,
            Some(k) => {
                let role = GroupRole::of_kind(k, window);
                if w.main.is_none() && role == GroupRole::Full {
                    w.main = Some(index);
                    return GroupRoute::Main;
                }
                w.groups.entry(index).or_default().role = Some(role);
                role
            }
            None if w.main == Some(index) => return GroupRoute::Main,
            None => match w.groups.get(&index).and_then(|g| g.role) {
                Some(role) => role,
                None if index == 0 && w.main.is_none() => {
                    w.main = Some(0);
                    return GroupRoute::Main;
                }
                None => {
                    self.counters.events_unlearned_group += 1;
                    return GroupRoute::Nowhere;
                }
            },
        };
        if role == GroupRole::Ignored {
            self.counters.events_ignored_kind += 1;
            return GroupRoute::Nowhere;
        }
        GroupRoute::Group(index)
    }

    /// Learns a worker's groups from its hash profile
    /// ([`kvcore::wire::HashProfile::kv_cache_groups`]): the first
    /// full-attention group is its main one, every other group gets its
    /// role, so that a group holding no block yet still constrains the
    /// worker's score. Stores that name a kind later still update it.
    /// `worker` is an id of the indexer these views stand beside.
    pub fn learn_groups(&mut self, worker: WorkerId, groups: &[ProfileGroup]) {
        let w = self.worker_mut(worker);
        for g in groups {
            let role = GroupRole::of_kind(&g.kv_cache_spec_kind, g.kv_cache_spec_sliding_window);
            if w.main == Some(g.group_idx) || (w.main.is_none() && role == GroupRole::Full) {
                w.main = Some(g.group_idx);
                continue;
            }
            w.groups.entry(g.group_idx).or_default().role = Some(role);
        }
    }

    /// Whether an event of `worker` belongs to its main group (or names no
    /// group, or is not a block event), given what has been learned so far;
    /// it does not learn.
    pub fn is_main_event(&self, worker: WorkerId, event: &WireEvent) -> bool {
        let (group_idx, kind, window) = match event {
            WireEvent::BlockStored(s) => (s.group_idx, s.kv_cache_spec_kind.as_deref(), s.kv_cache_spec_sliding_window),
            WireEvent::BlockRemoved(r) => {
                (r.group_idx, r.kv_cache_spec_kind.as_deref(), r.kv_cache_spec_sliding_window)
            }
            _ => return true,
        };
        match group_idx {
            None => kind.is_none_or(|k| GroupRole::of_kind(k, window) == GroupRole::Full),
            Some(i) => {
                let main = self.workers.get(worker.0 as usize).and_then(|w| w.main);
                main == Some(i) || (main.is_none() && i == 0)
            }
        }
    }

    /// Applies one event of `worker`: the main group's to `main`, another
    /// group's to its view, a clear to both. Events of unknown or removed
    /// workers are ignored, as the indexer ignores them.
    pub fn apply(&mut self, main: &mut Indexer, worker: WorkerId, event: &WireEvent) {
        if !main.is_live(worker) {
            return;
        }
        match self.route(worker, event) {
            GroupRoute::Main => {
                main.apply(worker, event);
                if let WireEvent::BlockStored(s) = event {
                    self.resolve(main, worker, &s.block_hashes);
                }
            }
            GroupRoute::All => {
                main.apply(worker, event);
                self.clear_worker(worker);
            }
            GroupRoute::Group(index) => {
                self.counters.group_events += 1;
                self.apply_group(main, worker, index, event);
            }
            GroupRoute::Nowhere => {}
        }
    }

    fn apply_group(&mut self, main: &Indexer, worker: WorkerId, index: u32, event: &WireEvent) {
        let (max, block_size) = (self.blocks_per_worker_max, self.block_size);
        let g = self.worker_mut(worker).groups.entry(index).or_default();
        match event {
            WireEvent::BlockStored(s) => {
                if s.block_size != block_size {
                    return;
                }
                let bit = tier_bit(Tier::from_medium(s.medium.as_deref()));
                let mut dropped = 0;
                for &h in &s.block_hashes {
                    if !g.blocks.contains_key(&h) {
                        if g.blocks.len() >= max {
                            dropped += 1;
                            continue;
                        }
                        let key = main.router_key_of(worker, h).map(|k| k.0);
                        if key.is_none() {
                            g.unresolved.push(h);
                        }
                        g.blocks.insert(h, GroupBlock { tiers: 0, key });
                    }
                    let b = g.blocks.get_mut(&h).expect("inserted above");
                    b.tiers |= bit;
                    if let Some(k) = b.key {
                        *g.keyed.entry(k).or_insert(0) |= bit;
                    }
                }
                self.counters.blocks_dropped_full += dropped;
            }
            WireEvent::BlockRemoved(r) => {
                let bit = tier_bit(Tier::from_medium(r.medium.as_deref()));
                for h in &r.block_hashes {
                    let Some(b) = g.blocks.get_mut(h) else { continue };
                    b.tiers &= !bit;
                    let (tiers, key) = (b.tiers, b.key);
                    if tiers == 0 {
                        g.blocks.remove(h);
                    }
                    if let Some(k) = key {
                        if tiers == 0 {
                            g.keyed.remove(&k);
                        } else {
                            g.keyed.insert(k, tiers);
                        }
                    }
                }
            }
            WireEvent::AllBlocksCleared | WireEvent::Unknown { .. } => {}
        }
    }

    /// Keys the worker's unresolved group blocks the main view has keyed
    /// now: those among `hashes` (the main store just applied), and every
    /// one when that store keyed pending blocks late.
    fn resolve(&mut self, main: &Indexer, worker: WorkerId, hashes: &[i64]) {
        let late = main.counters().blocks_resolved_late;
        let retry_all = late != self.main_resolved_late;
        self.main_resolved_late = late;
        let Some(w) = self.workers.get_mut(worker.0 as usize) else { return };
        let mut resolved = 0;
        for g in w.groups.values_mut() {
            if g.unresolved.is_empty() {
                continue;
            }
            let GroupBlocksMut { blocks, keyed, unresolved } = g.split();
            unresolved.retain(|h| {
                let Some(b) = blocks.get_mut(h) else { return false };
                if b.key.is_some() {
                    return false;
                }
                if !retry_all && !hashes.contains(h) {
                    return true;
                }
                match main.router_key_of(worker, *h) {
                    Some(k) => {
                        b.key = Some(k.0);
                        *keyed.entry(k.0).or_insert(0) |= b.tiers;
                        resolved += 1;
                        false
                    }
                    None => true,
                }
            });
        }
        self.counters.blocks_resolved_late += resolved;
    }

    /// Forgets every group block of one worker (its `AllBlocksCleared`, or
    /// a resync); the learned roles stay.
    pub fn clear_worker(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(worker.0 as usize) {
            for g in w.groups.values_mut() {
                g.clear();
            }
        }
    }

    /// Forgets a worker altogether, roles included.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(worker.0 as usize) {
            *w = WorkerGroups { live: false, ..Default::default() };
        }
    }

    /// For each worker holding the request's first key in its main group,
    /// the longest prefix of `keys` reusable given every group (the module
    /// docs' rule), per tier; workers left with nothing are left out. With
    /// no group named besides the main ones, this is exactly
    /// [`Indexer::find_matches`].
    pub fn find_matches(&self, main: &Indexer, keys: &[RouterKey]) -> Vec<Overlap> {
        let mut out = main.find_matches(keys);
        if self.is_empty() {
            return out;
        }
        let (mut held_device, mut held_any) = (Vec::new(), Vec::new());
        let (mut ok_device, mut ok_any) = (Vec::new(), Vec::new());
        for o in &mut out {
            let Some(w) = self.workers.get(o.worker.0 as usize).filter(|w| w.live) else { continue };
            // The largest k valid in every group at once: a window's rule is
            // not monotone in k (a window holding only the last blocks serves
            // k = 8 but not k = 5), so each group marks the k it allows and
            // the score is the largest k every group allowed.
            let k_any = (o.any_tier_blocks as usize).min(keys.len());
            let k_device = (o.device_blocks as usize).min(k_any);
            ok_device.clear();
            ok_device.resize(k_device + 1, true);
            ok_any.clear();
            ok_any.resize(k_any + 1, true);
            for g in w.groups.values() {
                let Some(role) = g.role.filter(|r| *r != GroupRole::Ignored) else { continue };
                held_device.clear();
                held_any.clear();
                for key in &keys[..k_any] {
                    let t = g.tiers_of(*key);
                    held_device.push(t & tier_bit(Tier::Device) != 0);
                    held_any.push(t != 0);
                }
                let window = role.window_tokens();
                allow(&mut ok_device, &held_device, self.block_size, window);
                allow(&mut ok_any, &held_any, self.block_size, window);
            }
            o.device_blocks = ok_device.iter().rposition(|&ok| ok).unwrap_or(0) as u32;
            o.any_tier_blocks = ok_any.iter().rposition(|&ok| ok).unwrap_or(0) as u32;
        }
        out.retain(|o| o.any_tier_blocks > 0);
        out
    }
}

/// Clears `ok[k]` for every `k` (1 ..= `ok.len() - 1`) at which the group
/// lacks one of the blocks `[first(k), k)` (`held[i]`), where `first(k)` is
/// the block of token `k·block_size + 1 − window` (0 for a window of every
/// token, `None`). `ok[0]` (nothing reused) is always allowed.
fn allow(ok: &mut [bool], held: &[bool], block_size: u32, window: Option<u32>) {
    // run: consecutive held blocks ending at block k - 1.
    let mut run = 0u32;
    for (k, ok) in ok.iter_mut().enumerate().skip(1) {
        run = if held.get(k - 1).copied().unwrap_or(false) { run + 1 } else { 0 };
        let first = match window {
            None => 0,
            Some(w) => (k as u64 * u64::from(block_size) + 1).saturating_sub(u64::from(w)) / u64::from(block_size),
        };
        let need = k as u64 - first.min(k as u64);
        if u64::from(run) < need {
            *ok = false;
        }
    }
}

/// The largest `k <= k_max` one group allows ([`allow`]).
#[cfg(test)]
fn reusable(held: &[bool], k_max: u32, block_size: u32, window: Option<u32>) -> u32 {
    let mut ok = vec![true; (k_max as usize).min(held.len()) + 1];
    allow(&mut ok, held, block_size, window);
    ok.iter().rposition(|&ok| ok).unwrap_or(0) as u32
}

/// A group's tables borrowed apart, so that resolving can walk one while
/// writing the others.
struct GroupBlocksMut<'a> {
    blocks: &'a mut HashMap<i64, GroupBlock, ahash::RandomState>,
    keyed: &'a mut HashMap<u64, u8, ahash::RandomState>,
    unresolved: &'a mut Vec<i64>,
}

impl WorkerGroup {
    fn split(&mut self) -> GroupBlocksMut<'_> {
        GroupBlocksMut { blocks: &mut self.blocks, keyed: &mut self.keyed, unresolved: &mut self.unresolved }
    }
}

fn tier_bit(tier: Tier) -> u8 {
    match tier {
        Tier::Device => 1,
        Tier::Host => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::reusable;

    /// The window rule by hand, blocks of 4 tokens: token `4k` reads the
    /// `W − 1` tokens before it, so a window of 4 needs one block before
    /// the match point, a window of 9 two (tokens 8..16 for k = 4), a
    /// window of 10 three, a window of 1 none, full attention all of them.
    #[test]
    fn reusable_prefix_follows_the_window_rule() {
        let held = [false, false, true, true, false, true];
        assert_eq!(reusable(&held, 6, 4, Some(4)), 6, "block 5 alone covers the 3 tokens before 24");
        assert_eq!(reusable(&held, 5, 4, Some(4)), 4, "k=5 needs block 4, missing; k=4 needs block 3");
        assert_eq!(reusable(&held, 4, 4, Some(6)), 4, "k=4 needs blocks 2 and 3");
        assert_eq!(reusable(&held, 4, 4, Some(9)), 4, "k=4 needs tokens 8..16: blocks 2 and 3");
        assert_eq!(reusable(&held, 4, 4, Some(10)), 0, "k=4 needs blocks 1-3; every smaller k needs block 0 or 1");
        assert_eq!(reusable(&held, 6, 4, None), 0, "full attention needs block 0");
        assert_eq!(reusable(&[true, true, true], 3, 4, None), 3);
        assert_eq!(reusable(&held, 6, 4, Some(1)), 6, "a window of one token needs no block before it");
    }
}
