//! The engine: the world that owns every table and resource.
//!
//! Methods here are thin: each validates ids, then calls one system with
//! exactly the data it needs. A serving loop calls them in this order each
//! step:
//!
//! 1. `add_request` / `grow` for the requests the scheduler runs this step
//!    (allocations; may queue tier copies);
//! 2. `step` (performs or hands out the queued copies, closes the event batch);
//! 3. the forward pass, outside kvcore;
//! 4. `commit` with the tokens the pass computed; `finish` / `cancel` for
//!    requests that ended.
//!
//! Queries (`request_info`, `block_table`, `blocks_cached`, `cached_medium`,
//! `cached_blocks`, ...) are read-only views in exported types; the block
//! side itself (`KvCache`, its pool and index) is no part of the API, so that
//! only its verbs change it.
//!
//! Every output is a function of the configuration and the calls alone
//! (docs/architecture.md, "Determinism"). While a call log is recorded
//! ([`Engine::record_calls`]), each method that changes state also writes its
//! record: its arguments, then digests of what it answered and of the
//! counters after it.

use std::io::Write;
use std::path::Path;

use crate::call_log::{CallKind, CallLog, CallLogError, Gauges};
use crate::config::EngineConfig;
use crate::error::{AdmitError, ConfigError, RequestError};
use crate::events::publisher::Publisher;
use crate::events::{EventBatch, EventQueue, KvEvent};
use crate::ids::FfiId;
use crate::ids::{BlockId, RequestId, ScopeId};
use crate::keys::BlockKey;
use crate::resources::{BlockCopy, Counters, KvCache, KvGroups, PageRef, RoutingHints, Scratch};
use crate::systems::{self, admit, allocate, clear, commit, evict, release, snapshot};
use crate::tables::{MmItems, Requests};
use crate::tier::Tier;

pub use crate::systems::admit::{Admission, MmContent, MmItemSpec, RequestSpec};

/// A read-only view of a request's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    /// Tokens in the request (prompt and generated).
    pub tokens: u32,
    /// Tokens in the prompt.
    pub prompt_len: u32,
    /// Tokens reported as computed (cached ones included).
    pub tokens_computed: u32,
    /// Prompt tokens matched in the cache at admission.
    pub tokens_cached: u32,
    /// Blocks held.
    pub blocks: u32,
}

/// One cached block as [`Engine::cached_blocks`] reports it: a key the
/// engine advertises and the page that holds its KV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedBlock {
    /// The block's key.
    pub key: BlockKey,
    /// Its tier and page: a device page until it is offloaded, then a host
    /// page (the page a KV pool reads the block's data from).
    pub page: PageRef,
}

/// What one KV cache group holds ([`Engine::group_usage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupUsage {
    /// Device pages that blocks may take (a sliding-window group's null page
    /// not counted).
    pub pages_device: u32,
    /// Device pages in use: referenced blocks and cached ones.
    pub blocks_used_device: u32,
    /// Device blocks that running requests hold: what the group needs now;
    /// the rest of `blocks_used_device` is cache, evictable at any time.
    pub blocks_referenced: u32,
    /// Cached (indexed) blocks on the device.
    pub blocks_cached_device: u32,
    /// Cached blocks on the host tier.
    pub blocks_cached_host: u32,
}

/// The pages of a sliding-window table: the group's null page where a block
/// was released.
fn window_pages<'a>(cache: &'a KvCache, blocks: &'a [Option<BlockId>]) -> impl Iterator<Item = u32> + 'a {
    let null = cache.null_page().expect("a sliding-window group has a null page");
    blocks.iter().map(move |b| b.map_or(null, |b| cache.block(b).page))
}

/// One KV-cache engine: requests, blocks, items, and the events they produce.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    requests: Requests,
    items: MmItems,
    /// One block cache per KV cache group (one for an engine that is not
    /// hybrid).
    groups: KvGroups,
    hints: RoutingHints,
    events: EventQueue,
    counters: Counters,
    step_index: u64,
    /// Optional out-of-process stream: fed one batch per step.
    publisher: Option<Publisher>,
    /// Calls that changed (or could change) state so far: a call log starts
    /// only at 0.
    calls_taken: u64,
    /// The call log, while recording (`record_calls`).
    call_log: Option<CallLog>,
    /// The systems' reusable buffers (allocation-free steady state).
    scratch: Scratch,
}

impl Engine {
    /// Builds an engine, reserving every table's capacity now: an invalid
    /// config is [`ConfigError::Invalid`], one whose tables this machine
    /// cannot allocate is [`ConfigError::OutOfMemory`] (the process goes on).
    pub fn new(config: EngineConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let oom = ConfigError::OutOfMemory;
        Ok(Self {
            requests: Requests::try_with_capacity(config.requests_max as usize).ok_or(oom("request table"))?,
            items: MmItems::try_with_capacity(config.mm_items_max as usize).ok_or(oom("image item table"))?,
            groups: KvGroups::try_new(&config).ok_or(oom("block tables"))?,
            hints: RoutingHints::try_with_capacity(config.routing_hints_max as usize)
                .ok_or(oom("routing-hint table"))?,
            events: EventQueue::new(
                config.kv_events && config.block_reuse,
                config.event_batches_max as usize,
                config.events_per_step_max(),
            ),
            counters: Counters::default(),
            step_index: 0,
            publisher: None,
            calls_taken: 0,
            call_log: None,
            scratch: Scratch::default(),
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Validates and admits a request: matches its longest cached prefix and
    /// allocates the rest of its prompt. On error nothing changed.
    pub fn add_request(&mut self, spec: &RequestSpec<'_>) -> Result<Admission, AdmitError> {
        let result = self.admit(spec);
        self.log_call(CallKind::AddRequest, |log, e| {
            log.arg_request(spec);
            match &result {
                Ok(a) => {
                    log.out_result::<AdmitError>(Ok(&[
                        a.id.to_ffi(),
                        a.tokens_cached as u64,
                        a.tokens_onboarded as u64,
                    ]));
                    e.log_block_table(log, a.id);
                }
                Err(err) => log.out_result(Err(err)),
            }
        });
        result
    }

    fn admit(&mut self, spec: &RequestSpec<'_>) -> Result<Admission, AdmitError> {
        let valid = match admit::validate_request(spec, &self.config, &mut self.scratch) {
            Ok(v) => v,
            Err(e) => {
                self.counters.requests_rejected += 1;
                return Err(e);
            }
        };
        let admission = admit::admit_request(
            valid,
            &self.config,
            &mut self.requests,
            &mut self.items,
            &mut self.groups,
            &mut self.events,
            &mut self.counters,
            &mut self.scratch,
        )?;
        admit::record_routing_hints(&self.requests, &self.items, admission.id, &mut self.hints, &mut self.counters);
        Ok(admission)
    }

    /// Counts a request that its caller could not describe (a malformed C
    /// description, device images that could not be hashed) and that so
    /// never reached [`Engine::add_request`]: `requests_rejected` then counts
    /// every refused admission.
    pub fn count_rejected(&mut self) {
        self.counters.requests_rejected += 1;
    }

    /// Appends generated tokens and allocates the blocks they need.
    pub fn grow(&mut self, id: RequestId, tokens: &[u32]) -> Result<(), RequestError> {
        let result = allocate::grow_request(
            &mut self.requests,
            id,
            tokens,
            &self.config,
            &mut self.groups,
            &mut self.events,
            &mut self.counters,
        );
        self.log_call(CallKind::Grow, |log, e| {
            log.arg(id.to_ffi());
            log.arg_tokens(tokens);
            log.out_result(result.as_ref().map(|()| &[][..]));
            e.log_block_table(log, id);
        });
        result
    }

    /// Reports that the request's first `tokens_computed` tokens have their KV
    /// written (chunked prefill reports a prompt over several calls).
    pub fn commit(&mut self, id: RequestId, tokens_computed: u64) -> Result<(), RequestError> {
        let result = commit::commit_computed(
            &mut self.requests,
            id,
            tokens_computed,
            &self.config,
            &mut self.groups,
            &mut self.events,
            &mut self.scratch,
        );
        self.log_call(CallKind::Commit, |log, _| {
            log.arg(id.to_ffi());
            log.arg(tokens_computed);
            log.out_result(result.as_ref().map(|()| &[][..]));
        });
        result
    }

    /// Ends a request normally, releasing its blocks (cached ones stay matchable).
    pub fn finish(&mut self, id: RequestId) -> Result<(), RequestError> {
        let result =
            release::release_request(&mut self.requests, &mut self.items, id, &mut self.groups, &mut self.scratch);
        self.log_call(CallKind::Finish, |log, _| {
            log.arg(id.to_ffi());
            log.out_result(result.as_ref().map(|()| &[][..]));
        });
        result
    }

    /// Ends a request early. Blocks it fully computed stay cached; the rest are freed.
    pub fn cancel(&mut self, id: RequestId) -> Result<(), RequestError> {
        let result =
            release::release_request(&mut self.requests, &mut self.items, id, &mut self.groups, &mut self.scratch);
        self.log_call(CallKind::Cancel, |log, _| {
            log.arg(id.to_ffi());
            log.out_result(result.as_ref().map(|()| &[][..]));
        });
        result
    }

    /// Evicts up to `n` unreferenced cached device blocks; returns how many.
    pub fn evict(&mut self, n: usize) -> usize {
        let evicted = evict::evict_device_blocks(&mut self.groups, n, &mut self.events, &mut self.counters);
        self.log_call(CallKind::Evict, |log, _| {
            log.arg(n as u64);
            log.out_result::<CallLogError>(Ok(&[evicted as u64]));
        });
        evicted
    }

    /// Resets the prefix cache (`AllBlocksCleared`).
    pub fn clear(&mut self) {
        clear::clear_cache(&mut self.groups, &mut self.events);
        self.log_call(CallKind::Clear, |_, _| {});
    }

    /// Closes the step: returns the block copies to perform before the next
    /// forward pass and makes the step's events drainable.
    pub fn step(&mut self) -> Vec<BlockCopy> {
        let (copies, batch) =
            systems::run_step(self.step_index, &mut self.groups, &mut self.hints, &mut self.events, &mut self.counters);
        if let Some(log) = &mut self.call_log {
            log.begin(CallKind::Step);
            log.out_copies(&copies);
            match &batch {
                Some(b) => log.out_events(Some(b.step_index), &b.events),
                None => log.out_events(None, &[]),
            }
        }
        if let Some(batch) = batch {
            self.deliver(batch);
        }
        self.step_index += 1;
        self.calls_taken += 1;
        if let Some(mut log) = self.call_log.take() {
            log.out_counters(&self.counters, self.gauges());
            log.end(true);
            self.call_log = Some(log);
        }
        #[cfg(any(debug_assertions, kvc_paranoid))]
        self.check_invariants();
        copies
    }

    /// Hands a closed batch on: to the publisher when one is attached, and
    /// to the drains (kept, within `event_batches_max`).
    fn deliver(&mut self, batch: EventBatch) {
        // Publishing never blocks: the publisher queues and drops (counting
        // a gap) when full. The batch is copied only when it is also kept
        // for draining.
        match &mut self.publisher {
            Some(publisher) if self.events.retain_max() == 0 => {
                publisher.publish(batch.events);
            }
            Some(publisher) => {
                publisher.publish(batch.events.clone());
                self.counters.event_batches_dropped += self.events.retain(batch);
            }
            None => self.counters.event_batches_dropped += self.events.retain(batch),
        }
    }

    /// Closes the open step's events early when they reached
    /// [`EngineConfig::events_per_step_max`]: a batch of their own, with the
    /// open step's index, delivered as a step delivers its batch. A caller
    /// that makes many calls between two steps then holds bounded events; a
    /// router sees one more batch boundary and nothing else.
    fn close_events_if_full(&mut self) {
        if !self.events.open_full() {
            return;
        }
        let batch = systems::close_events(self.step_index, &mut self.hints, &mut self.events, &mut self.counters);
        if let Some(batch) = batch {
            self.deliver(batch);
        }
    }

    /// Attaches a publisher: from now on each closed batch is also published
    /// (it stays drainable too). The publisher's snapshot mirror is seeded
    /// with the current cache state, so snapshots are complete at once.
    pub fn attach_publisher(&mut self, mut publisher: Publisher) {
        let snapshot = snapshot::snapshot_events(&self.groups, &mut self.hints, &mut self.counters);
        self.log_call(CallKind::AttachPublisher, |log, _| log.out_events(None, &snapshot));
        publisher.prime(snapshot);
        self.publisher = Some(publisher);
    }

    /// Detaches and returns the publisher, if any.
    pub fn detach_publisher(&mut self) -> Option<Publisher> {
        let publisher = self.publisher.take();
        if publisher.is_some() {
            self.log_call(CallKind::DetachPublisher, |_, _| {});
        }
        publisher
    }

    /// The attached publisher, if any (for its endpoint and counters).
    pub fn publisher(&self) -> Option<&Publisher> {
        self.publisher.as_ref()
    }

    /// The index of the next step to close.
    pub fn step_index(&self) -> u64 {
        self.step_index
    }

    /// Block entries in the open step's events (a key stored or removed
    /// counts one, a clear one): below [`EngineConfig::events_per_step_max`]
    /// after every call.
    pub fn open_event_entries(&self) -> usize {
        self.events.open_entries()
    }

    /// Block copies queued for the next step: at most
    /// [`EngineConfig::copies_per_step_max`].
    pub fn copies_queued(&self) -> usize {
        self.groups.copies_queued()
    }

    /// Closed batches waiting for a drain: at most `event_batches_max`.
    pub fn batches_waiting(&self) -> usize {
        self.events.closed_len()
    }

    /// Takes the closed batches of events, oldest first.
    pub fn drain_batches(&mut self) -> Vec<EventBatch> {
        let batches = self.events.drain();
        self.log_call(CallKind::Drain, |log, _| {
            log.out_drained(batches.iter().map(|b| (b.step_index, b.events.as_slice())));
        });
        batches
    }

    /// Takes the closed events, oldest first.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        if self.call_log.is_none() {
            return self.events.drain_events();
        }
        self.drain_batches().into_iter().flat_map(|b| b.events).collect()
    }

    /// The full cache state as events, for a consumer that fell behind the
    /// replay ring: `AllBlocksCleared`, then one `BlockStored` per cached
    /// block, parents before children (by chain depth), device tier first,
    /// with UUID hints resolved now. Every `event_seq` is 0: a snapshot is
    /// tagged with the batch sequence number it is consistent with.
    pub fn snapshot(&mut self) -> Vec<KvEvent> {
        let events = snapshot::snapshot_events(&self.groups, &mut self.hints, &mut self.counters);
        self.log_call(CallKind::Snapshot, |log, _| log.out_events(None, &events));
        events
    }

    /// Starts recording every call into `sink` as a call log (the format is
    /// in docs/c-api.md, "Reproducing an incident"): each call's arguments
    /// and digests of what it answered, streamed through a 64 KiB buffer
    /// that is flushed at every step. Only a fresh engine records (one that
    /// has taken no call that changes state), so that the log replays from
    /// the state it started in; [`crate::replay_calls`] replays it.
    pub fn record_calls(&mut self, sink: Box<dyn Write + Send>) -> Result<(), CallLogError> {
        if self.call_log.is_some() {
            return Err(CallLogError::AlreadyRecording);
        }
        if self.calls_taken != 0 {
            return Err(CallLogError::NotFresh);
        }
        self.call_log = Some(CallLog::start(sink, &self.config)?);
        Ok(())
    }

    /// [`Engine::record_calls`] into a file created (or truncated) at `path`.
    pub fn record_calls_to_file(&mut self, path: &Path) -> Result<(), CallLogError> {
        if self.call_log.is_some() {
            return Err(CallLogError::AlreadyRecording);
        }
        if self.calls_taken != 0 {
            return Err(CallLogError::NotFresh);
        }
        let file = std::fs::File::create(path)?;
        self.record_calls(Box::new(file))
    }

    /// Stops recording: flushes the log and returns how many calls it holds,
    /// or the first write error (after which nothing more was written).
    pub fn stop_recording(&mut self) -> Result<u64, CallLogError> {
        self.call_log.take().ok_or(CallLogError::NotRecording)?.finish()
    }

    /// Whether the engine records its calls, and how many so far.
    pub fn calls_recorded(&self) -> Option<u64> {
        self.call_log.as_ref().map(CallLog::calls)
    }

    /// The output digests of the last call recorded (for the replay).
    pub(crate) fn last_call_outputs(&self) -> &[(crate::call_log::OutputKind, u64)] {
        self.call_log.as_ref().map_or(&[], |l| l.last_outputs())
    }

    /// Counts a call that changes state and, while recording, logs it: `f`
    /// writes its arguments and output digests; the counters follow.
    fn log_call(&mut self, kind: CallKind, f: impl FnOnce(&mut CallLog, &Engine)) {
        self.calls_taken += 1;
        self.close_events_if_full();
        let Some(mut log) = self.call_log.take() else { return };
        log.begin(kind);
        f(&mut log, self);
        log.out_counters(&self.counters, self.gauges());
        log.end(false);
        self.call_log = Some(log);
    }

    fn log_block_table(&self, log: &mut CallLog, id: RequestId) {
        match self.requests.rows.get(id) {
            Some(r) => {
                log.out_block_table(r.blocks.iter().map(|b| self.groups.main.block(*b).page));
                for (w, table) in self.groups.windows.iter().zip(&r.windows) {
                    log.out_block_table(window_pages(&w.cache, &table.blocks));
                }
            }
            None => log.out_block_table(std::iter::empty()),
        }
    }

    fn gauges(&self) -> Gauges {
        let (blocks_cached_device, blocks_cached_host) = self.blocks_cached();
        Gauges {
            requests_live: self.requests.rows.len() as u64,
            blocks_free_device: self.groups.main.free_pages(Tier::Device) as u64,
            blocks_cached_device: blocks_cached_device as u64,
            blocks_cached_host: blocks_cached_host as u64,
            step_index: self.step_index,
        }
    }

    /// The request's UUID list: `None` when it was given none, a copy otherwise.
    pub fn request_uuids(&self, id: RequestId) -> Result<Option<Vec<Option<String>>>, RequestError> {
        Ok(self.requests.rows.get(id).ok_or(RequestError::UnknownRequest)?.uuids.clone())
    }

    /// A request's token and block counts.
    pub fn request_info(&self, id: RequestId) -> Result<RequestInfo, RequestError> {
        let r = self.requests.rows.get(id).ok_or(RequestError::UnknownRequest)?;
        Ok(RequestInfo {
            tokens: r.tokens.len() as u32,
            prompt_len: r.prompt_len,
            tokens_computed: r.tokens_computed,
            tokens_cached: r.tokens_cached,
            blocks: r.blocks.len() as u32,
        })
    }

    /// Device pages of a request's blocks, in order (its block table), in
    /// group 0 (the only group of an engine that is not hybrid).
    pub fn block_table(&self, id: RequestId) -> Result<Vec<u32>, RequestError> {
        let r = self.requests.rows.get(id).ok_or(RequestError::UnknownRequest)?;
        Ok(r.blocks.iter().map(|b| self.groups.main.block(*b).page).collect())
    }

    /// A request's block table in group `group`: one device page per block,
    /// as long as [`Engine::block_table`]. A sliding-window group names its
    /// null page (page 0, which it never hands out, as vLLM's null block) for
    /// the blocks that fell out of the window and were released.
    pub fn block_table_group(&self, id: RequestId, group: usize) -> Result<Vec<u32>, RequestError> {
        let r = self.requests.rows.get(id).ok_or(RequestError::UnknownRequest)?;
        match group {
            0 => Ok(r.blocks.iter().map(|b| self.groups.main.block(*b).page).collect()),
            g => {
                let groups = self.groups.count();
                let w = self.groups.windows.get(g - 1).ok_or(RequestError::UnknownGroup { group, groups })?;
                Ok(window_pages(&w.cache, &r.windows[g - 1].blocks).collect())
            }
        }
    }

    /// KV cache groups (1 for an engine that is not hybrid).
    pub fn groups(&self) -> usize {
        self.groups.count()
    }

    /// What group `group` holds now, or `None` past the last group.
    pub fn group_usage(&self, group: usize) -> Option<GroupUsage> {
        let cache = self.groups.get(group)?;
        let pages_device = cache.pages_device() - u32::from(cache.null_page().is_some());
        let used = pages_device as usize - cache.free_pages(Tier::Device);
        let cached_device = cache.indexed().len() - cache.lru_len(Tier::Host);
        Some(GroupUsage {
            pages_device,
            blocks_used_device: used as u32,
            blocks_referenced: (used - cache.lru_len(Tier::Device)) as u32,
            blocks_cached_device: cached_device as u32,
            blocks_cached_host: cache.lru_len(Tier::Host) as u32,
        })
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Requests alive.
    pub fn requests_live(&self) -> usize {
        self.requests.rows.len()
    }

    /// Free device pages of group 0.
    pub fn blocks_free_device(&self) -> usize {
        self.groups.main.free_pages(Tier::Device)
    }

    /// Cached (indexed) blocks per tier of group 0: (device, host).
    pub fn blocks_cached(&self) -> (usize, usize) {
        // Every cached host block is in the host LRU (host blocks are never
        // referenced between steps).
        let host = self.groups.main.lru_len(Tier::Host);
        (self.groups.main.indexed().len() - host, host)
    }

    /// Whether `key` is cached in group 0, and in which tier.
    pub fn cached_medium(&self, key: &BlockKey) -> Option<Tier> {
        self.cached_medium_group(key, 0)
    }

    /// Whether `key` is cached in group `group`, and in which tier (`None`
    /// also past the last group).
    pub fn cached_medium_group(&self, key: &BlockKey, group: usize) -> Option<Tier> {
        let cache = self.groups.get(group)?;
        cache.lookup(key).map(|b| cache.block(b).medium)
    }

    /// Every cached block (each key the engine advertises, once) with the
    /// page that holds its KV, device tier first, each tier in page order;
    /// its length is the number of cached blocks. This is what a router that
    /// replays the engine's events holds, tier included, and what a KV pool
    /// must keep intact: tests check both through it. The order is the
    /// pages', never the index's hash order, so two engines given the same
    /// calls list the same blocks in the same order.
    pub fn cached_blocks(&self) -> impl ExactSizeIterator<Item = CachedBlock> + '_ {
        self.cached_blocks_group(0)
    }

    /// [`Engine::cached_blocks`] of group `group` (nothing past the last
    /// group).
    pub fn cached_blocks_group(&self, group: usize) -> impl ExactSizeIterator<Item = CachedBlock> + '_ {
        let Some(cache) = self.groups.get(group) else { return Vec::new().into_iter() };
        let mut blocks: Vec<CachedBlock> = cache
            .indexed()
            .map(|(key, id)| {
                let b = cache.block(id);
                CachedBlock { key: *key, page: PageRef { medium: b.medium, page: b.page } }
            })
            .collect();
        blocks.sort_unstable_by_key(|b| (b.page.medium, b.page.page));
        blocks.into_iter()
    }

    /// Checks every invariant across tables and resources; panics naming the
    /// one broken.
    ///
    /// 1. Each block's reference count equals the number of live requests
    ///    holding it, in every group.
    /// 2. The block side's own invariants in every group
    ///    (`KvCache::check_invariants`: pages, LRUs, index, content, sibling
    ///    lists, marked copy pages).
    /// 3. The request table's invariants.
    /// 4. Every item row belongs to a live request that lists it.
    /// 5. The routing-hint table's invariants.
    /// 6. Each scope's reference count equals the requests and advertised
    ///    blocks that name it, and no scope outlives its last reference.
    /// 7. The open step's events are below their bound.
    /// 8. Every request has a table per sliding window, and has released
    ///    exactly the blocks before the first one its next token reads.
    pub fn check_invariants(&self) {
        for (g, cache) in self.groups.iter().enumerate() {
            let mut refs: ahash::AHashMap<BlockId, u32> = ahash::AHashMap::new();
            for r in self.requests.rows.values() {
                if g == 0 {
                    for b in &r.blocks {
                        *refs.entry(*b).or_default() += 1;
                    }
                } else {
                    for b in r.windows[g - 1].blocks.iter().flatten() {
                        *refs.entry(*b).or_default() += 1;
                    }
                }
            }
            for (id, b) in cache.blocks() {
                assert_eq!(b.ref_count, refs.get(&id).copied().unwrap_or(0), "invariant 1: ref count of {id:?}");
            }
            cache.check_invariants();
        }
        for (id, r) in &self.requests.rows {
            assert_eq!(r.windows.len(), self.groups.windows.len(), "invariant 8: {id:?} has a table per window");
            for (w, table) in self.groups.windows.iter().zip(&r.windows) {
                let first = crate::resources::window_first_block(
                    w.window_tokens,
                    r.tokens_computed,
                    self.config.block_size_tokens,
                );
                assert_eq!(table.released, first, "invariant 8: {id:?} holds exactly its window's blocks");
            }
        }
        self.requests.check_invariants(self.config.block_size_tokens, self.config.block_reuse);
        for (id, item) in &self.items.rows {
            let owner = self.requests.rows.get(item.request).expect("invariant 4: item owner is live");
            assert!(owner.items.contains(&id), "invariant 4: owner lists its item");
        }
        self.hints.check_invariants();
        for (g, cache) in self.groups.iter().enumerate() {
            let mut scope_refs: ahash::AHashMap<ScopeId, u32> = ahash::AHashMap::new();
            for r in self.requests.rows.values() {
                let scope = if g == 0 { r.scope } else { r.windows[g - 1].scope };
                *scope_refs.entry(scope).or_default() += 1;
            }
            for (_, c) in cache.contents() {
                *scope_refs.entry(c.scope).or_default() += 1;
            }
            for id in cache.scopes().ids() {
                assert_eq!(
                    cache.scopes().refs(id),
                    scope_refs.get(&id).copied().unwrap_or(0),
                    "invariant 6: scope refs"
                );
            }
            assert_eq!(cache.scopes().len(), scope_refs.len(), "invariant 6: no orphan scope");
        }
        assert!(
            self.events.open_entries() < self.config.events_per_step_max(),
            "invariant 7: {} entries in the open step",
            self.events.open_entries()
        );
    }
}
