//! The relay: a fleet-consistent event stream for routers that read only
//! `block_mm_infos` (Dynamo), republished per worker.
//!
//! ```text
//!   engine 1 PUB(+replay) ─┐                                 ┌─► PUB 1 (+replay) ─► Dynamo worker 1
//!   engine 2 PUB(+replay) ─┼─► Subscriber ─► fleet UUID view ─┼─► PUB 2 (+replay) ─► Dynamo worker 2
//!   engine N PUB(+replay) ─┘   (gaps, replay, snapshots)      └─► PUB N (+replay) ─► Dynamo worker N
//! ```
//!
//! An engine derives an image's `mm_hash` from its caller's UUID when its own
//! table knows the UUID unambiguously, so two engines may advertise one
//! `mm_hash` for different pixels, and a router that hashes a request by UUID
//! matches both. The relay keeps the fleet-wide view of the kvcore router
//! ([`Indexer`]'s UUID view) and republishes every worker's stream with one
//! change: an image item whose UUID the fleet does not hold under a single
//! digest goes out with the `mm_hash` of its content digest instead (the one
//! the engine itself uses when it has no usable UUID). A request hashed by
//! that UUID then matches no worker's image blocks, exactly as kvcore's own
//! router decides; one hashed by content still matches the true holders.
//!
//! Why this shape:
//! - Identities change after blocks were advertised: a UUID becomes ambiguous
//!   when a second digest appears, and resolves again when the last
//!   conflicting copy goes. Dynamo places a block in its tree by the hash of
//!   its tokens and `mm_hash`, under its parent, so a block whose identity
//!   changes, and every descendant the worker holds under it, is removed and
//!   stored again with the new identities (parents first, one block per
//!   event, per tier), in the worker's republished stream. Each republished
//!   stream therefore holds what its worker holds, under identities the whole
//!   fleet agrees on.
//! - One republished batch per batch applied upstream (live, replayed or a
//!   snapshot; a clear becomes `AllBlocksCleared`), plus one batch of
//!   re-stores where identities changed: sequence numbers of a republished
//!   stream are contiguous from 0 whatever the upstream gaps, and the relay
//!   serves replay (and kvcore's snapshot) from its own ring and mirror.
//! - A hybrid engine's groups other than the main one are not republished:
//!   Dynamo indexes the main group alone, and the relay's mirror, keyed by
//!   engine hash, holds one group.
//! - The relay decides after each poll of the upstream sockets, on the view
//!   as it stands then: every block stored in that poll goes out with the
//!   identities of that moment, and only older blocks are re-stored.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use kvcore::wire::{
    END_SEQ, EventForm, ImageRoutingV1, PROFILE_REQUEST, SNAPSHOT_REQUEST, WireBatch, WireBlockRemoved,
    WireBlockStored, WireEvent, WireImageItem, WireImageRef, WireMmInfo, WireMmObject, encode_payload,
};
use kvcore::{ImageDigest, Tier, mm_hash, mm_hash_of_identifier};

use crate::hashing::{UuidLookup, UuidResolver};
use crate::indexer::{Indexer, WorkerId};
use crate::subscriber::{Applied, SubscribeError, Subscriber, SubscriberConfig};

/// Settings of a [`Relay`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayConfig {
    /// The upstream subscriber (and its indexer's bounds and block size).
    pub subscriber: SubscriberConfig,
    /// Batches each republished stream keeps for replay.
    pub buffer_steps: usize,
    /// The form republished events are written in.
    pub form: EventForm,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self { subscriber: SubscriberConfig::default(), buffer_steps: 10_000, form: EventForm::Map }
    }
}

/// One worker as the relay sees it: where its engine publishes, and where
/// the relay republishes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayWorker {
    /// A name for reports.
    pub name: String,
    /// The engine's `PUB` endpoint.
    pub upstream: String,
    /// The engine's replay endpoint, if it has one.
    pub upstream_replay: Option<String>,
    /// Where the relay binds this worker's `PUB` (`tcp://127.0.0.1:*` picks a port).
    pub bind: String,
    /// Where the relay binds this worker's replay `ROUTER`, if anywhere.
    pub bind_replay: Option<String>,
}

/// What the relay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RelayCounters {
    /// Upstream batches applied (live, replayed and snapshots).
    pub batches_in: u64,
    /// Batches republished.
    pub batches_out: u64,
    /// Image objects republished with another `mm_hash` than the engine's.
    pub mm_hashes_rewritten: u64,
    /// Blocks removed and stored again because their identity changed.
    pub blocks_restored: u64,
    /// Upstream events of a type the relay does not know (not republished).
    pub events_unknown: u64,
    /// Upstream events of a KV cache group other than the worker's main one
    /// (a hybrid engine's sliding-window groups): not republished, as
    /// Dynamo indexes the main group alone.
    pub events_other_groups: u64,
    /// Replay requests answered.
    pub replays_served: u64,
    /// Replay requests older than the ring, answered with the snapshot.
    pub replays_answered_by_snapshot: u64,
    /// Snapshot requests answered.
    pub snapshots_served: u64,
}

/// One block as the relay republished it.
#[derive(Clone, Debug)]
struct Block {
    parent: Option<i64>,
    tokens: Option<Vec<u32>>,
    block_size: u32,
    lora_id: Option<i64>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
    /// Tier bits (1 device, 2 host).
    tiers: u8,
    /// The engine's `block_mm_infos` entry.
    mm: Option<WireMmInfo>,
    /// The items this block names, and its runs (indexing `items`).
    items: Vec<WireImageItem>,
    refs: Vec<WireImageRef>,
    /// For each object of `mm`, the index in `items` it stands for.
    mm_items: Vec<Option<usize>>,
    /// The `mm_hash` of each object of `mm` as last republished.
    published: Vec<u64>,
}

/// One republished stream.
struct Out {
    id: WorkerId,
    name: String,
    publisher: zmq::Socket,
    replay: Option<zmq::Socket>,
    endpoint: String,
    replay_endpoint: Option<String>,
    next_seq: u64,
    ring: VecDeque<(u64, Vec<u8>)>,
    blocks: HashMap<i64, Block>,
    children: HashMap<i64, Vec<i64>>,
    /// UUID to the blocks naming it.
    by_uuid: HashMap<String, HashSet<i64>>,
    data_parallel_rank: Option<i64>,
}

/// The relay (see the module docs). The caller drives it with
/// [`Relay::poll`].
pub struct Relay {
    config: RelayConfig,
    subscriber: Subscriber,
    _ctx: zmq::Context,
    outs: Vec<Out>,
    counters: RelayCounters,
    scratch: Vec<u8>,
    /// Per UUID named by a republished block: whether its items went out
    /// under the UUID's `mm_hash` (`true`) or their content's. Every
    /// republished block naming the UUID agrees with it, so only a UUID whose
    /// mode changes needs its blocks checked.
    modes: HashMap<String, bool>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").field("workers", &self.outs.len()).field("counters", &self.counters).finish()
    }
}

fn tier_bit(medium: Option<&str>) -> u8 {
    1 << Tier::from_medium(medium) as u8
}

fn medium_of(bit: u8) -> &'static str {
    if bit == 1 { "GPU" } else { "CPU" }
}

impl Relay {
    /// Binds every worker's republished sockets and connects to the engines.
    pub fn new(config: RelayConfig, workers: &[RelayWorker]) -> Result<Self, SubscribeError> {
        let mut subscriber = Subscriber::new(config.subscriber.clone());
        subscriber.record_applied(true);
        let ctx = zmq::Context::new();
        let mut outs = Vec::new();
        for w in workers {
            let publisher = ctx.socket(zmq::PUB)?;
            publisher.set_sndhwm(0)?;
            publisher.set_linger(0)?;
            publisher.bind(&w.bind)?;
            let endpoint = publisher.get_last_endpoint()?.unwrap_or_default();
            let (replay, replay_endpoint) = match &w.bind_replay {
                Some(b) => {
                    let s = ctx.socket(zmq::ROUTER)?;
                    s.set_linger(0)?;
                    s.bind(b)?;
                    let e = s.get_last_endpoint()?.unwrap_or_default();
                    (Some(s), Some(e))
                }
                None => (None, None),
            };
            let id = subscriber.connect(&w.name, &w.upstream, w.upstream_replay.as_deref())?;
            outs.push(Out {
                id,
                name: w.name.clone(),
                publisher,
                replay,
                endpoint,
                replay_endpoint,
                next_seq: 0,
                ring: VecDeque::new(),
                blocks: HashMap::new(),
                children: HashMap::new(),
                by_uuid: HashMap::new(),
                data_parallel_rank: None,
            });
        }
        Ok(Self {
            config,
            subscriber,
            _ctx: ctx,
            outs,
            counters: RelayCounters::default(),
            scratch: Vec::new(),
            modes: HashMap::new(),
        })
    }

    /// The `PUB` endpoint the relay republishes worker `i` on (in the order
    /// given to [`Relay::new`]).
    pub fn endpoint(&self, i: usize) -> Option<&str> {
        self.outs.get(i).map(|o| o.endpoint.as_str())
    }

    /// The replay endpoint of worker `i`'s republished stream.
    pub fn replay_endpoint(&self, i: usize) -> Option<&str> {
        self.outs.get(i).and_then(|o| o.replay_endpoint.as_deref())
    }

    /// The sequence number the next republished batch of worker `i` gets.
    pub fn next_seq(&self, i: usize) -> Option<u64> {
        self.outs.get(i).map(|o| o.next_seq)
    }

    /// The upstream subscriber (its indexer holds the fleet-wide UUID view).
    pub fn subscriber(&self) -> &Subscriber {
        &self.subscriber
    }

    /// The relay's counters.
    pub fn counters(&self) -> RelayCounters {
        self.counters
    }

    /// The name of worker `i`.
    pub fn worker_name(&self, i: usize) -> Option<&str> {
        self.outs.get(i).map(|o| o.name.as_str())
    }

    /// Asks every worker with a replay socket for a snapshot (a relay that
    /// starts after its engines).
    pub fn resync_all(&mut self) -> Result<(), SubscribeError> {
        for i in 0..self.outs.len() {
            let id = self.outs[i].id;
            self.subscriber.resync(id)?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for upstream batches, republishes what they
    /// change, and answers replay requests. Returns the batches republished.
    pub fn poll(&mut self, timeout: Duration) -> Result<usize, SubscribeError> {
        self.serve_replays()?;
        let unsure_before = self.unsure_events();
        self.subscriber.poll(timeout)?;
        let applied = self.subscriber.take_applied();
        // An eviction from the view, an unrecorded reference or a clear may
        // change how UUIDs that no event of this poll named resolve (they
        // share an unsure slot): then every UUID is checked.
        let mut check_all = self.unsure_events() != unsure_before;
        let mut out_batches: Vec<Vec<WireBatch>> = vec![Vec::new(); self.outs.len()];
        let mut dirty: HashSet<String> = HashSet::new();
        let mut touched: Vec<HashMap<i64, Vec<u64>>> = vec![HashMap::new(); self.outs.len()];
        for a in applied {
            match a {
                Applied::Cleared(id) => {
                    check_all = true;
                    let i = id.0 as usize;
                    self.clear_out(i, &mut dirty);
                    out_batches[i].push(WireBatch {
                        ts: now_ts(),
                        events: vec![WireEvent::AllBlocksCleared],
                        data_parallel_rank: self.outs[i].data_parallel_rank,
                    });
                }
                Applied::Batch(id, batch) => {
                    self.counters.batches_in += 1;
                    let i = id.0 as usize;
                    self.outs[i].data_parallel_rank = batch.data_parallel_rank;
                    let mut events = Vec::with_capacity(batch.events.len());
                    for e in batch.events {
                        if !self.subscriber.groups().is_main_event(id, &e) {
                            self.counters.events_other_groups += 1;
                            continue;
                        }
                        match e {
                            WireEvent::BlockStored(s) => {
                                self.mirror_stored(i, &s, &mut dirty, &mut touched[i]);
                                events.push(WireEvent::BlockStored(s));
                            }
                            WireEvent::BlockRemoved(r) => {
                                self.mirror_removed(i, &r, &mut dirty);
                                events.push(WireEvent::BlockRemoved(r));
                            }
                            WireEvent::AllBlocksCleared => {
                                check_all = true;
                                self.clear_out(i, &mut dirty);
                                events.push(WireEvent::AllBlocksCleared);
                            }
                            WireEvent::Unknown { .. } => self.counters.events_unknown += 1,
                        }
                    }
                    out_batches[i].push(WireBatch {
                        ts: batch.ts,
                        events,
                        data_parallel_rank: batch.data_parallel_rank,
                    });
                }
            }
        }
        // Stored events of this poll go out with the identities of now.
        for (i, batches) in out_batches.iter_mut().enumerate() {
            for b in batches.iter_mut() {
                for e in &mut b.events {
                    if let WireEvent::BlockStored(s) = e {
                        self.rewrite_stored(i, s);
                    }
                }
            }
        }
        for (i, batches) in out_batches.iter().enumerate() {
            for b in batches {
                self.note_published(i, b);
            }
        }
        if check_all {
            dirty.extend(self.modes.keys().cloned());
        }
        // Older blocks whose identity changed: removed and stored again.
        let ix = self.subscriber.indexer();
        let mut changed: Vec<&String> = Vec::new();
        for u in &dirty {
            let held = self.outs.iter().any(|o| o.by_uuid.contains_key(u));
            let now = matches!(ix.resolve(u), UuidLookup::Digest(_));
            match (held, self.modes.get(u)) {
                (false, _) => {
                    self.modes.remove(u);
                }
                (true, Some(&m)) if m == now => {}
                (true, _) => {
                    self.modes.insert(u.clone(), now);
                    changed.push(u);
                }
            }
        }
        for (i, batches) in out_batches.iter_mut().enumerate() {
            let out = &self.outs[i];
            let mut roots: HashSet<i64> = HashSet::new();
            for u in &changed {
                for h in out.by_uuid.get(*u).into_iter().flatten() {
                    if let Some(b) = out.blocks.get(h)
                        && desired(ix, b) != b.published
                    {
                        roots.insert(*h);
                    }
                }
            }
            // A block stored again in this poll while its older copies went
            // out with other identities.
            for (h, before) in &touched[i] {
                if let Some(b) = out.blocks.get(h)
                    && desired(ix, b) != *before
                {
                    roots.insert(*h);
                }
            }
            if roots.is_empty() {
                continue;
            }
            let events = restore_events(ix, out, &roots);
            let n = events.iter().filter(|e| matches!(e, WireEvent::BlockStored(_))).count() as u64;
            self.counters.blocks_restored += n;
            batches.push(WireBatch { ts: now_ts(), events, data_parallel_rank: out.data_parallel_rank });
        }
        // Record what goes out and publish it.
        let mut sent = 0;
        for (i, batches) in out_batches.into_iter().enumerate() {
            if let Some(last) = batches.last() {
                self.note_published(i, last);
            }
            for b in batches {
                self.publish(i, &b)?;
                sent += 1;
            }
        }
        self.serve_replays()?;
        Ok(sent)
    }

    /// Events of the view that mark UUIDs unsure, so far.
    fn unsure_events(&self) -> u64 {
        let c = self.subscriber.indexer().counters();
        c.uuids_forgotten + c.uuid_refs_unrecorded
    }

    /// Keeps the relay's mirror of worker `i` up to date with a stored event.
    fn mirror_stored(
        &mut self,
        i: usize,
        s: &WireBlockStored,
        dirty: &mut HashSet<String>,
        touched: &mut HashMap<i64, Vec<u64>>,
    ) {
        let out = &mut self.outs[i];
        let bit = tier_bit(s.medium.as_deref());
        let bs = s.block_size as usize;
        let mut parent = s.parent_block_hash;
        for (k, &h) in s.block_hashes.iter().enumerate() {
            let tokens = s.token_ids.as_ref().and_then(|t| t.get(k * bs..(k + 1) * bs)).map(<[u32]>::to_vec);
            let mm = s.block_mm_infos.as_ref().and_then(|m| m.get(k).cloned().flatten());
            let (items, refs) = block_items(s.image_routing.as_ref(), k, s.block_hashes.len());
            if let Some(b) = out.blocks.get_mut(&h) {
                b.tiers |= bit;
                touched.entry(h).or_insert_with(|| b.published.clone());
            } else {
                let mm_items = match &mm {
                    Some(m) => m.mm_objects.iter().map(|o| item_of(o.mm_hash, &items)).collect(),
                    None => Vec::new(),
                };
                let published =
                    mm.as_ref().map(|m| m.mm_objects.iter().map(|o| o.mm_hash).collect()).unwrap_or_default();
                for it in &items {
                    if let Some(u) = &it.uuid {
                        out.by_uuid.entry(u.clone()).or_default().insert(h);
                    }
                }
                if let Some(p) = parent {
                    out.children.entry(p).or_default().push(h);
                }
                out.blocks.insert(
                    h,
                    Block {
                        parent,
                        tokens,
                        block_size: s.block_size,
                        lora_id: s.lora_id,
                        lora_name: s.lora_name.clone(),
                        cache_salt: s.cache_salt.clone(),
                        tiers: bit,
                        mm,
                        items,
                        refs,
                        mm_items,
                        published,
                    },
                );
            }
            for it in &out.blocks[&h].items {
                if let Some(u) = &it.uuid {
                    dirty.insert(u.clone());
                }
            }
            parent = Some(h);
        }
    }

    /// Keeps the mirror of worker `i` up to date with a removal.
    fn mirror_removed(&mut self, i: usize, r: &WireBlockRemoved, dirty: &mut HashSet<String>) {
        let out = &mut self.outs[i];
        let bit = tier_bit(r.medium.as_deref());
        for h in &r.block_hashes {
            let Some(b) = out.blocks.get_mut(h) else { continue };
            b.tiers &= !bit;
            if b.tiers == 0 {
                let b = out.blocks.remove(h).expect("found above");
                forget(out, *h, &b, dirty);
            }
        }
    }

    /// Empties the mirror of worker `i`.
    fn clear_out(&mut self, i: usize, dirty: &mut HashSet<String>) {
        let out = &mut self.outs[i];
        for u in out.by_uuid.keys() {
            dirty.insert(u.clone());
        }
        out.blocks.clear();
        out.children.clear();
        out.by_uuid.clear();
    }

    /// Rewrites a stored event's `block_mm_infos` to the identities of now.
    fn rewrite_stored(&mut self, i: usize, s: &mut WireBlockStored) {
        let ix = self.subscriber.indexer();
        let out = &self.outs[i];
        let Some(infos) = &mut s.block_mm_infos else { return };
        for (k, info) in infos.iter_mut().enumerate() {
            let (Some(info), Some(b)) = (info.as_mut(), s.block_hashes.get(k).and_then(|h| out.blocks.get(h))) else {
                continue;
            };
            for (o, want) in info.mm_objects.iter_mut().zip(desired(ix, b)) {
                if o.mm_hash != want {
                    self.counters.mm_hashes_rewritten += 1;
                    o.mm_hash = want;
                }
            }
        }
    }

    /// Records the identities a batch republishes in the mirror.
    fn note_published(&mut self, i: usize, batch: &WireBatch) {
        let out = &mut self.outs[i];
        for e in &batch.events {
            let WireEvent::BlockStored(s) = e else { continue };
            let Some(infos) = &s.block_mm_infos else { continue };
            for (h, info) in s.block_hashes.iter().zip(infos) {
                if let (Some(info), Some(b)) = (info, out.blocks.get_mut(h)) {
                    b.published = info.mm_objects.iter().map(|o| o.mm_hash).collect();
                }
            }
        }
    }

    fn publish(&mut self, i: usize, batch: &WireBatch) -> Result<(), SubscribeError> {
        self.scratch.clear();
        encode_payload(batch, self.config.form, &mut self.scratch);
        let out = &mut self.outs[i];
        let seq = out.next_seq;
        out.next_seq += 1;
        out.publisher.send_multipart([&b""[..], &seq.to_be_bytes()[..], &self.scratch[..]], 0)?;
        out.ring.push_back((seq, self.scratch.clone()));
        while out.ring.len() > self.config.buffer_steps {
            out.ring.pop_front();
        }
        self.counters.batches_out += 1;
        Ok(())
    }

    /// Answers pending replay and snapshot requests on every replay socket,
    /// as an engine's publisher does: a trailing `PROFILE_REQUEST` frame asks
    /// for the upstream worker's hash profile first, and a replay whose start
    /// is older than the ring is answered with the snapshot, tagged with the
    /// last batch it covers so that the next live batch follows it.
    fn serve_replays(&mut self) -> Result<(), SubscribeError> {
        for i in 0..self.outs.len() {
            while let Some(sock) = &self.outs[i].replay {
                let frames = match sock.recv_multipart(zmq::DONTWAIT) {
                    Ok(f) => f,
                    Err(zmq::Error::EAGAIN) => break,
                    Err(e) => return Err(e.into()),
                };
                let (id, req, wants_profile) = match frames.as_slice() {
                    [id, empty, req] if empty.is_empty() => (id, req, false),
                    [id, empty, req, p] if empty.is_empty() && p == PROFILE_REQUEST => (id, req, true),
                    [id, req] => (id, req, false),
                    _ => continue,
                };
                let out = &self.outs[i];
                let sock = out.replay.as_ref().expect("checked above");
                let start = <[u8; 8]>::try_from(req.as_slice()).ok().map(u64::from_be_bytes);
                if start.is_none() && req.as_slice() != SNAPSHOT_REQUEST {
                    continue;
                }
                if wants_profile && let Some(profile) = self.subscriber.worker_profile(out.id) {
                    sock.send_multipart([&id[..], &b""[..], PROFILE_REQUEST, &profile.to_json()[..]], 0)?;
                }
                match start {
                    None => {
                        let payload = snapshot_payload(self.subscriber.indexer(), out, self.config.form);
                        sock.send_multipart(
                            [&id[..], &b""[..], &b""[..], &out.next_seq.to_be_bytes()[..], &payload[..]],
                            0,
                        )?;
                        self.counters.snapshots_served += 1;
                    }
                    Some(start) => {
                        // The ring covers the request when it holds every
                        // batch from `start` on (or `start` is past the last).
                        let covered =
                            start >= out.next_seq || out.ring.front().is_some_and(|(first, _)| *first <= start);
                        if covered {
                            for (seq, payload) in out.ring.iter().filter(|(s, _)| *s >= start) {
                                sock.send_multipart(
                                    [&id[..], &b""[..], &b""[..], &seq.to_be_bytes()[..], &payload[..]],
                                    0,
                                )?;
                            }
                        } else {
                            let payload = snapshot_payload(self.subscriber.indexer(), out, self.config.form);
                            let tag = out.next_seq - 1;
                            sock.send_multipart(
                                [&id[..], &b""[..], &b""[..], &tag.to_be_bytes()[..], &payload[..]],
                                0,
                            )?;
                            self.counters.replays_answered_by_snapshot += 1;
                        }
                        self.counters.replays_served += 1;
                    }
                }
                sock.send_multipart([&id[..], &b""[..], &b""[..], &END_SEQ[..], &b""[..]], 0)?;
            }
        }
        Ok(())
    }
}

/// The relay's snapshot of one republished stream: a clear, then every
/// block it holds, parents first.
fn snapshot_payload(ix: &Indexer, out: &Out, form: EventForm) -> Vec<u8> {
    let roots: HashSet<i64> = out
        .blocks
        .iter()
        .filter(|(_, b)| b.parent.is_none_or(|p| !out.blocks.contains_key(&p)))
        .map(|(h, _)| *h)
        .collect();
    let mut events = vec![WireEvent::AllBlocksCleared];
    events.extend(restore_events(ix, out, &roots).into_iter().filter(|e| matches!(e, WireEvent::BlockStored(_))));
    let batch = WireBatch { ts: now_ts(), events, data_parallel_rank: out.data_parallel_rank };
    let mut payload = Vec::new();
    encode_payload(&batch, form, &mut payload);
    payload
}

fn now_ts() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The items block `k` of an event names, with its runs re-indexed to them.
/// When the event does not place its items per block, every item.
fn block_items(r: Option<&ImageRoutingV1>, k: usize, n: usize) -> (Vec<WireImageItem>, Vec<WireImageRef>) {
    let Some(r) = r else { return (Vec::new(), Vec::new()) };
    if r.blocks.len() != n {
        return (r.items.clone(), Vec::new());
    }
    let mut items: Vec<WireImageItem> = Vec::new();
    let mut map: Vec<(u32, u32)> = Vec::new();
    let mut refs = Vec::new();
    for x in &r.blocks[k] {
        let Some(item) = r.items.get(x.item as usize) else { continue };
        let local = match map.iter().find(|(g, _)| *g == x.item) {
            Some((_, l)) => *l,
            None => {
                items.push(item.clone());
                map.push((x.item, items.len() as u32 - 1));
                items.len() as u32 - 1
            }
        };
        refs.push(WireImageRef { item: local, ..*x });
    }
    (items, refs)
}

/// The item an `mm_hash` stands for: the one whose UUID or content gives it.
fn item_of(h: u64, items: &[WireImageItem]) -> Option<usize> {
    items.iter().position(|it| {
        it.uuid.as_deref().is_some_and(|u| mm_hash_of_identifier(u) == h) || mm_hash(&ImageDigest(it.digest), None) == h
    })
}

/// The `mm_hash` each object of a block should go out with now: its UUID's
/// while the fleet holds that UUID under one digest, its content's otherwise.
fn desired(ix: &Indexer, b: &Block) -> Vec<u64> {
    let Some(mm) = &b.mm else { return Vec::new() };
    mm.mm_objects
        .iter()
        .zip(&b.mm_items)
        .map(|(o, it)| match it.map(|i| &b.items[i]) {
            Some(WireImageItem { digest, uuid: Some(u) }) => match ix.resolve(u) {
                UuidLookup::Digest(d) if d.0 == *digest => mm_hash_of_identifier(u),
                _ => mm_hash(&ImageDigest(*digest), None),
            },
            _ => o.mm_hash,
        })
        .collect()
}

/// Forgets a block that left its last tier.
fn forget(out: &mut Out, h: i64, b: &Block, dirty: &mut HashSet<String>) {
    if let Some(p) = b.parent
        && let Some(v) = out.children.get_mut(&p)
    {
        v.retain(|c| *c != h);
        if v.is_empty() {
            out.children.remove(&p);
        }
    }
    for it in &b.items {
        if let Some(u) = &it.uuid {
            dirty.insert(u.clone());
            if let Some(s) = out.by_uuid.get_mut(u) {
                s.remove(&h);
                if s.is_empty() {
                    out.by_uuid.remove(u);
                }
            }
        }
    }
}

/// Removes `roots` and every descendant the worker holds under them, then
/// stores them again with the identities of now, parents first, one block
/// per event and per tier.
fn restore_events(ix: &Indexer, out: &Out, roots: &HashSet<i64>) -> Vec<WireEvent> {
    let mut all: Vec<i64> = Vec::new();
    let mut seen: HashSet<i64> = HashSet::new();
    let mut stack: Vec<i64> = roots.iter().copied().collect();
    while let Some(h) = stack.pop() {
        if !seen.insert(h) {
            continue;
        }
        all.push(h);
        stack.extend(out.children.get(&h).into_iter().flatten().filter(|c| out.blocks.contains_key(c)));
    }
    // Parents first: from each top (parent not re-stored), depth first.
    let mut order = Vec::with_capacity(all.len());
    let mut done: HashSet<i64> = HashSet::new();
    let mut tops: Vec<i64> =
        all.iter().copied().filter(|h| out.blocks[h].parent.is_none_or(|p| !seen.contains(&p))).collect();
    tops.sort_unstable();
    for t in tops {
        let mut stack = vec![t];
        while let Some(h) = stack.pop() {
            if !done.insert(h) {
                continue;
            }
            order.push(h);
            let mut kids: Vec<i64> =
                out.children.get(&h).into_iter().flatten().copied().filter(|c| seen.contains(c)).collect();
            kids.sort_unstable();
            stack.extend(kids.into_iter().rev());
        }
    }
    let mut events = Vec::new();
    for bit in [1u8, 2] {
        let hashes: Vec<i64> = order.iter().copied().filter(|h| out.blocks[h].tiers & bit != 0).collect();
        if !hashes.is_empty() {
            events.push(WireEvent::BlockRemoved(WireBlockRemoved {
                block_hashes: hashes,
                medium: Some(medium_of(bit).into()),
                ..Default::default()
            }));
        }
    }
    for h in &order {
        let b = &out.blocks[h];
        let want = desired(ix, b);
        let mm = b.mm.as_ref().map(|m| WireMmInfo {
            mm_objects: m
                .mm_objects
                .iter()
                .zip(&want)
                .map(|(o, w)| WireMmObject { mm_hash: *w, offsets: o.offsets.clone() })
                .collect(),
        });
        let routing = (!b.items.is_empty()).then(|| ImageRoutingV1 {
            items: b.items.clone(),
            blocks: if b.refs.is_empty() { Vec::new() } else { vec![b.refs.clone()] },
        });
        for bit in [1u8, 2] {
            if b.tiers & bit == 0 {
                continue;
            }
            events.push(WireEvent::BlockStored(WireBlockStored {
                block_hashes: vec![*h],
                parent_block_hash: b.parent,
                token_ids: b.tokens.clone(),
                block_size: b.block_size,
                lora_id: b.lora_id,
                medium: Some(medium_of(bit).into()),
                lora_name: b.lora_name.clone(),
                cache_salt: b.cache_salt.clone(),
                block_mm_infos: mm.clone().map(|m| vec![Some(m)]),
                image_routing: routing.clone(),
                ..Default::default()
            }));
        }
    }
    events
}
