//! The subscriber: one ZMQ `SUB` per worker, sequence checking, and recovery
//! through the worker's replay socket, feeding one [`Indexer`].
//!
//! ```text
//!  live batch seq s, expected e
//!    s == e ──────────────► apply, e = s + 1
//!    s >  e  (gap) ───────► buffer s; ask replay from e ──► replayed e.. applied in order,
//!                                                        then the buffer (s < e skipped)
//!           replay answered with the snapshot (starts with AllBlocksCleared at s' > e)
//!                         └► clear the worker, apply it, e = s' + 1, then the buffer
//!           replay starts above e otherwise (ring no longer covers e) or times out
//!                         └► ask a snapshot (seq S = "state before batch S")
//!                            ──► clear the worker, apply it, e = S, then the buffer
//!    s <  e  ─────────────► skip (a replay or snapshot already covered it)
//!    s <= last live s ────► a restart: drop the buffer, keep s, ask a snapshot
//! ```
//!
//! Why this shape:
//! - Every batch is applied in sequence order, and live batches that arrive
//!   during a recovery wait in a buffer until the recovery has caught up to
//!   them. So a replayed `Stored(A)` can never land after a live `Removed(A)`
//!   (kvcache-ai/Mooncake#4159): it is applied first, or skipped as already
//!   seen.
//! - Each recovery request goes out on a fresh `DEALER` socket. The replay
//!   protocol has no request id, so answers to an abandoned request (a replay
//!   that turned out not to cover the gap) must never be read as answers to
//!   the next one; a new socket identity guarantees that.
//! - Expected sequence starts at 0: a subscriber that joins late, or misses
//!   the first batches while its `SUB` connects (ZMQ's slow joiner), sees a
//!   gap from 0 and recovers by replay or snapshot like any other gap.
//! - The caller drives it ([`Subscriber::poll`]), so there is no thread and no
//!   lock around the indexer; a server wraps it in its own loop.
//! - A loss of the very last batches is only visible when a later batch
//!   arrives (or after [`Subscriber::resync`]); engines publishing every step
//!   make that wait one step.
//!
//! Without a replay endpoint a gap is applied through (counted as lost
//! batches) and a restart clears the worker.
//!
//! Every recovery request asks for the publisher's hash profile (block size,
//! key and `mm_hash` recipes, image placeholder ids, scope rule, routing
//! metadata version). A profile that differs from this subscriber's
//! configuration would make every lookup miss in silence, so the worker is
//! refused instead: [`Subscriber::poll`] returns
//! [`SubscribeError::ProfileMismatch`] naming the field, the worker's view is
//! cleared and its batches are ignored from then on (counted).

use std::time::{Duration, Instant};

use crate::groups::GroupViews;
use crate::indexer::{Indexer, IndexerConfig, Overlap, WorkerId};
use kvcore::wire::decode_message;
use kvcore::wire::{END_SEQ, HashProfile, PROFILE_REQUEST, SNAPSHOT_REQUEST};
use kvcore::wire::{WireBatch, WireEvent};

/// Settings of a [`Subscriber`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberConfig {
    /// The indexer's configuration.
    pub indexer: IndexerConfig,
    /// How long a replay or snapshot may take before it is asked again.
    pub recovery_timeout: Duration,
    /// Most live batches buffered per worker during a recovery; past that,
    /// the buffer is dropped and a snapshot asked instead.
    pub buffer_max: usize,
    /// The hash profile workers must publish. `None`: the indexer's block
    /// size and this build's recipes, with any image placeholder id; a
    /// worker whose profile differs is refused.
    pub profile: Option<HashProfile>,
}

impl Default for SubscriberConfig {
    fn default() -> Self {
        Self {
            indexer: IndexerConfig::default(),
            recovery_timeout: Duration::from_secs(2),
            buffer_max: 100_000,
            profile: None,
        }
    }
}

/// What the subscriber saw and did, over all workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SubscriberCounters {
    /// Live batches applied in order.
    pub batches_applied: u64,
    /// Messages that did not decode (skipped; the next batch shows a gap).
    pub batches_undecodable: u64,
    /// Gaps detected (a batch numbered above the expected one).
    pub gaps: u64,
    /// Publisher restarts detected (a live batch numbered at or below the
    /// previous live one).
    pub restarts: u64,
    /// Replays asked.
    pub replays: u64,
    /// Batches applied from replays.
    pub batches_replayed: u64,
    /// Replays that did not cover the gap (the ring had moved on).
    pub replays_short: u64,
    /// Replays the publisher answered with its snapshot (the ring had moved
    /// on), applied as one.
    pub replays_answered_by_snapshot: u64,
    /// Snapshots asked.
    pub snapshots: u64,
    /// Snapshots applied.
    pub snapshots_applied: u64,
    /// Recoveries that timed out and were asked again.
    pub recovery_timeouts: u64,
    /// Live batches buffered during recoveries.
    pub batches_buffered: u64,
    /// Buffered batches skipped as already covered by a replay or snapshot.
    pub batches_skipped: u64,
    /// Buffers dropped for exceeding `buffer_max`.
    pub buffer_overflows: u64,
    /// Batches known lost for good (gaps with no replay endpoint).
    pub batches_lost: u64,
    /// Batches dropped on purpose by the loss simulation ([`Subscriber::simulate_loss`]).
    pub batches_dropped_simulated: u64,
    /// Profiles received from workers and checked.
    pub profiles_checked: u64,
    /// Workers refused because their profile differs from the configuration.
    pub profile_mismatches: u64,
    /// Batches ignored because their worker was refused.
    pub batches_refused: u64,
}

/// Why the subscriber could not connect or poll.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// ZMQ refused an operation.
    #[error("zmq: {0}")]
    Zmq(#[from] zmq::Error),
    /// A worker publishes with another hash profile than this subscriber's
    /// configuration: its blocks could never match a lookup. The worker is
    /// refused (its view cleared, its batches ignored).
    #[error(
        "worker {worker:?} publishes another hash profile: {field} is {theirs} there and {ours} here; its stream is \
         refused (configure the router with the engine's profile, see model_info.hash_profile)"
    )]
    ProfileMismatch {
        /// The worker's name.
        worker: String,
        /// The first field that differs.
        field: &'static str,
        /// This subscriber's value.
        ours: String,
        /// The worker's value.
        theirs: String,
    },
    /// A worker's profile reply did not parse.
    #[error("worker {worker:?} sent a hash profile that does not parse: {reason}")]
    BadProfile {
        /// The worker's name.
        worker: String,
        /// Why.
        reason: String,
    },
}

#[derive(Debug)]
enum Recovery {
    Replay,
    Snapshot,
}

struct Pending {
    kind: Recovery,
    dealer: zmq::Socket,
    deadline: Instant,
}

struct WorkerConn {
    id: WorkerId,
    name: String,
    /// Set once the worker's profile was found to differ: nothing of it is applied.
    refused: bool,
    /// The hash profile the worker last sent with a recovery reply.
    profile: Option<HashProfile>,
    sub: zmq::Socket,
    replay_endpoint: Option<String>,
    /// The next batch number to apply.
    expected: u64,
    /// The last live batch number received (decoded), to tell restarts.
    last_live: Option<u64>,
    pending: Option<Pending>,
    /// Live batches waiting for the recovery, in arrival order.
    buffer: Vec<(u64, WireBatch)>,
}

/// A worker's place in its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkerSync {
    /// The next batch number it will apply.
    pub expected_seq: u64,
    /// Whether a replay or snapshot is in flight.
    pub recovering: bool,
    /// Live batches waiting for it.
    pub buffered: usize,
}

/// Subscribes to N workers' streams and keeps an [`Indexer`] up to date.
pub struct Subscriber {
    config: SubscriberConfig,
    ctx: zmq::Context,
    conns: Vec<WorkerConn>,
    indexer: Indexer,
    /// The KV cache groups beside the main one, for hybrid models.
    groups: GroupViews,
    counters: SubscriberCounters,
    loss: Option<(u64, u32)>,
    /// What was applied, in order, while [`Subscriber::record_applied`] is on.
    applied: Option<Vec<Applied>>,
}

/// One step the subscriber applied to its indexer, as
/// [`Subscriber::take_applied`] hands it out: a consumer that follows every
/// worker's stream in applied order (the relay) sees exactly what the indexer
/// saw, replays and snapshots included.
#[derive(Clone, Debug, PartialEq)]
pub enum Applied {
    /// The worker's view was cleared (before a snapshot, or at a restart
    /// without a replay socket).
    Cleared(WorkerId),
    /// A batch of the worker was applied.
    Batch(WorkerId, WireBatch),
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber").field("workers", &self.conns.len()).field("counters", &self.counters).finish()
    }
}

impl Subscriber {
    /// A subscriber with no worker yet.
    pub fn new(config: SubscriberConfig) -> Self {
        Self {
            indexer: Indexer::new(config.indexer.clone()),
            groups: GroupViews::new(config.indexer.block_size, config.indexer.blocks_per_worker_max),
            config,
            ctx: zmq::Context::new(),
            conns: Vec::new(),
            counters: SubscriberCounters::default(),
            loss: None,
            applied: None,
        }
    }

    /// Starts (or stops) recording what is applied, for
    /// [`Subscriber::take_applied`].
    pub fn record_applied(&mut self, on: bool) {
        self.applied = on.then(Vec::new);
    }

    /// What was applied since the last call, in order (empty unless
    /// [`Subscriber::record_applied`] is on).
    pub fn take_applied(&mut self) -> Vec<Applied> {
        self.applied.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn clear_worker(&mut self, worker: WorkerId) {
        self.indexer.clear_worker(worker);
        self.groups.clear_worker(worker);
        if let Some(a) = &mut self.applied {
            a.push(Applied::Cleared(worker));
        }
    }

    /// Connects to a worker's `PUB` endpoint (and its replay endpoint, when it
    /// has one) and adds it to the indexer under `name`.
    pub fn connect(
        &mut self,
        name: &str,
        endpoint: &str,
        replay_endpoint: Option<&str>,
    ) -> Result<WorkerId, SubscribeError> {
        let sub = self.ctx.socket(zmq::SUB)?;
        sub.set_subscribe(b"")?;
        sub.set_rcvhwm(0)?;
        sub.set_linger(0)?;
        sub.connect(endpoint)?;
        let id = self.indexer.add_worker(name);
        self.conns.push(WorkerConn {
            id,
            name: name.to_owned(),
            refused: false,
            profile: None,
            sub,
            replay_endpoint: replay_endpoint.map(str::to_owned),
            expected: 0,
            last_live: None,
            pending: None,
            buffer: Vec::new(),
        });
        Ok(id)
    }

    /// The indexer of every worker's main group (its only group, for an
    /// engine that names none): what Dynamo indexes.
    pub fn indexer(&self) -> &Indexer {
        &self.indexer
    }

    /// The KV cache groups beside the main one.
    pub fn groups(&self) -> &GroupViews {
        &self.groups
    }

    /// Per worker, the longest prefix of `keys` reusable in every KV cache
    /// group ([`GroupViews::find_matches`]); for single-group workers the
    /// same as `self.indexer().find_matches(keys)`.
    pub fn find_matches(&self, keys: &[crate::RouterKey]) -> Vec<Overlap> {
        self.groups.find_matches(&self.indexer, keys)
    }

    /// The counters.
    pub fn counters(&self) -> SubscriberCounters {
        self.counters
    }

    /// Where a worker stands in its stream.
    pub fn sync_state(&self, worker: WorkerId) -> Option<WorkerSync> {
        self.conns.iter().find(|c| c.id == worker).map(|c| WorkerSync {
            expected_seq: c.expected,
            recovering: c.pending.is_some(),
            buffered: c.buffer.len(),
        })
    }

    /// The hash profile `worker` sent with its last recovery reply, if any
    /// (a relay republishes it to its own consumers).
    pub fn worker_profile(&self, worker: WorkerId) -> Option<&HashProfile> {
        self.conns.iter().find(|c| c.id == worker).and_then(|c| c.profile.as_ref())
    }

    /// Drops about one live batch in `one_in` before it is looked at, from a
    /// seeded generator: a stand-in for the losses of a real network or a
    /// publisher at its high-water mark, for tests. 0 turns it off.
    pub fn simulate_loss(&mut self, one_in: u32, seed: u64) {
        self.loss = (one_in > 0).then_some((seed | 1, one_in));
    }

    fn lose_this_one(&mut self) -> bool {
        let Some((state, one_in)) = &mut self.loss else { return false };
        // xorshift64: deterministic and enough for a test's coin.
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state % *one_in as u64) == 0
    }

    /// Asks a worker for a snapshot now (clearing its view when it arrives),
    /// e.g. at start-up to learn the current state without waiting for a
    /// batch. No-op without a replay endpoint.
    pub fn resync(&mut self, worker: WorkerId) -> Result<(), SubscribeError> {
        let Some(i) = self.conns.iter().position(|c| c.id == worker) else { return Ok(()) };
        self.start_recovery(i, Recovery::Snapshot)
    }

    /// Handles whatever arrives within `timeout` (returning early once
    /// something was handled and nothing more is waiting). Returns the number
    /// of messages handled.
    pub fn poll(&mut self, timeout: Duration) -> Result<usize, SubscribeError> {
        self.check_deadlines()?;
        let mut handled = 0;
        let deadline = Instant::now() + timeout;
        loop {
            let ready = {
                let mut items: Vec<zmq::PollItem<'_>> = Vec::with_capacity(self.conns.len() * 2);
                for c in &self.conns {
                    items.push(c.sub.as_poll_item(zmq::POLLIN));
                }
                for c in &self.conns {
                    if let Some(p) = &c.pending {
                        items.push(p.dealer.as_poll_item(zmq::POLLIN));
                    }
                }
                let wait = if handled > 0 { 0 } else { deadline.saturating_duration_since(Instant::now()).as_millis() };
                let n = zmq::poll(&mut items, wait.min(i64::MAX as u128) as i64)?;
                if n == 0 {
                    Vec::new()
                } else {
                    let subs = self.conns.len();
                    let mut ready: Vec<(usize, bool)> = Vec::new();
                    let mut k = subs;
                    for (i, c) in self.conns.iter().enumerate() {
                        if items[i].is_readable() {
                            ready.push((i, false));
                        }
                        if c.pending.is_some() {
                            if items[k].is_readable() {
                                ready.push((i, true));
                            }
                            k += 1;
                        }
                    }
                    ready
                }
            };
            if ready.is_empty() {
                if handled > 0 || Instant::now() >= deadline {
                    break;
                }
                self.check_deadlines()?;
                continue;
            }
            for (i, is_dealer) in ready {
                handled += if is_dealer { self.read_dealer(i)? } else { self.read_sub(i)? };
            }
        }
        Ok(handled)
    }

    /// Polls until every worker is in sync with `targets` (worker, the
    /// publisher's next seq) or `timeout` passes. Returns whether they are.
    pub fn poll_until_synced(
        &mut self,
        targets: &[(WorkerId, u64)],
        timeout: Duration,
    ) -> Result<bool, SubscribeError> {
        let deadline = Instant::now() + timeout;
        loop {
            let synced = targets.iter().all(|(w, next)| {
                self.sync_state(*w).is_some_and(|s| s.expected_seq == *next && !s.recovering && s.buffered == 0)
            });
            if synced {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            self.poll(Duration::from_millis(20))?;
        }
    }

    fn check_deadlines(&mut self) -> Result<(), SubscribeError> {
        let now = Instant::now();
        for i in 0..self.conns.len() {
            if self.conns[i].pending.as_ref().is_some_and(|p| now >= p.deadline) {
                self.counters.recovery_timeouts += 1;
                self.start_recovery(i, Recovery::Snapshot)?;
            }
        }
        Ok(())
    }

    fn read_sub(&mut self, i: usize) -> Result<usize, SubscribeError> {
        let mut handled = 0;
        loop {
            let frames = match self.conns[i].sub.recv_multipart(zmq::DONTWAIT) {
                Ok(f) => f,
                Err(zmq::Error::EAGAIN) => return Ok(handled),
                Err(e) => return Err(e.into()),
            };
            handled += 1;
            if self.lose_this_one() {
                self.counters.batches_dropped_simulated += 1;
                continue;
            }
            if self.conns[i].refused {
                self.counters.batches_refused += 1;
                continue;
            }
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            let Ok(msg) = decode_message(&refs) else {
                self.counters.batches_undecodable += 1;
                continue;
            };
            self.on_live(i, msg.seq, msg.batch)?;
        }
    }

    fn on_live(&mut self, i: usize, seq: u64, batch: WireBatch) -> Result<(), SubscribeError> {
        let c = &mut self.conns[i];
        // Live numbers only go up per publisher: a number at or below the
        // last live one is a new publisher (a restart), whatever `expected`.
        let restarted = c.last_live.is_some_and(|l| seq <= l);
        c.last_live = Some(seq);
        let has_replay = c.replay_endpoint.is_some();
        let id = c.id;
        if restarted {
            self.counters.restarts += 1;
            if !has_replay {
                c.buffer.clear();
                c.expected = seq + 1;
                self.counters.batches_lost += seq;
                self.clear_worker(id);
                self.apply_batch(id, &batch);
                self.counters.batches_applied += 1;
                return Ok(());
            }
            // What the old publisher sent is superseded by the snapshot.
            c.buffer.clear();
            c.buffer.push((seq, batch));
            self.counters.batches_buffered += 1;
            return self.start_recovery(i, Recovery::Snapshot);
        }
        if c.pending.is_some() {
            if c.buffer.len() >= self.config.buffer_max {
                self.counters.buffer_overflows += 1;
                c.buffer.clear();
                c.buffer.push((seq, batch));
                self.counters.batches_buffered += 1;
                return self.start_recovery(i, Recovery::Snapshot);
            }
            c.buffer.push((seq, batch));
            self.counters.batches_buffered += 1;
            return Ok(());
        }
        if seq < c.expected {
            // Sent before a snapshot or replay that already covered it.
            self.counters.batches_skipped += 1;
            return Ok(());
        }
        if seq == c.expected {
            c.expected = seq + 1;
            self.apply_batch(id, &batch);
            self.counters.batches_applied += 1;
            return Ok(());
        }
        self.counters.gaps += 1;
        if !has_replay {
            self.counters.batches_lost += seq - c.expected;
            c.expected = seq + 1;
            self.apply_batch(id, &batch);
            self.counters.batches_applied += 1;
            return Ok(());
        }
        c.buffer.push((seq, batch));
        self.counters.batches_buffered += 1;
        self.start_recovery(i, Recovery::Replay)
    }

    fn apply_batch(&mut self, worker: WorkerId, batch: &WireBatch) {
        let grouped = batch.events.iter().any(|e| match e {
            WireEvent::BlockStored(s) => s.group_idx.is_some() || s.kv_cache_spec_kind.is_some(),
            WireEvent::BlockRemoved(r) => r.group_idx.is_some() || r.kv_cache_spec_kind.is_some(),
            _ => false,
        });
        if grouped || !self.groups.is_empty() {
            for e in &batch.events {
                self.groups.apply(&mut self.indexer, worker, e);
            }
        } else {
            // A single-group stream: the indexer's read-ahead path.
            self.indexer.apply_all(batch.events.iter().map(|e| (worker, e)));
        }
        if let Some(a) = &mut self.applied {
            a.push(Applied::Batch(worker, batch.clone()));
        }
    }

    fn start_recovery(&mut self, i: usize, kind: Recovery) -> Result<(), SubscribeError> {
        let c = &mut self.conns[i];
        let Some(endpoint) = c.replay_endpoint.clone() else { return Ok(()) };
        // A fresh socket per request: answers to an abandoned request go to a
        // dead identity instead of being taken for this one's.
        let dealer = self.ctx.socket(zmq::DEALER)?;
        dealer.set_linger(0)?;
        dealer.set_rcvhwm(0)?;
        dealer.connect(&endpoint)?;
        match kind {
            Recovery::Replay => {
                dealer.send_multipart([&b""[..], &c.expected.to_be_bytes()[..], PROFILE_REQUEST], 0)?;
                self.counters.replays += 1;
            }
            Recovery::Snapshot => {
                dealer.send_multipart([&b""[..], SNAPSHOT_REQUEST, PROFILE_REQUEST], 0)?;
                self.counters.snapshots += 1;
            }
        }
        c.pending = Some(Pending { kind, dealer, deadline: Instant::now() + self.config.recovery_timeout });
        Ok(())
    }

    fn read_dealer(&mut self, i: usize) -> Result<usize, SubscribeError> {
        let mut handled = 0;
        loop {
            let Some(p) = &self.conns[i].pending else { return Ok(handled) };
            let frames = match p.dealer.recv_multipart(zmq::DONTWAIT) {
                Ok(f) => f,
                Err(zmq::Error::EAGAIN) => return Ok(handled),
                Err(e) => return Err(e.into()),
            };
            handled += 1;
            // [b"", topic, seq, payload]; END is [b"", b"", 0xFF*8, b""];
            // the profile, first when asked, [b"", PROFILE_REQUEST, json].
            let body: Vec<&[u8]> = frames.iter().skip(1).map(Vec::as_slice).collect();
            if body.len() == 3 && body[1] == END_SEQ {
                self.finish_recovery(i)?;
                continue;
            }
            if body.len() == 2 && body[0] == PROFILE_REQUEST {
                self.check_profile(i, body[1])?;
                continue;
            }
            if self.conns[i].refused {
                self.counters.batches_refused += 1;
                continue;
            }
            let Ok(msg) = decode_message(&body) else {
                self.counters.batches_undecodable += 1;
                continue;
            };
            let c = &mut self.conns[i];
            let id = c.id;
            match c.pending.as_ref().map(|p| &p.kind) {
                Some(Recovery::Replay) => {
                    if msg.seq < c.expected {
                        continue;
                    }
                    if msg.seq > c.expected {
                        if matches!(msg.batch.events.first(), Some(WireEvent::AllBlocksCleared)) {
                            // The publisher answered with its snapshot (the
                            // ring moved on): the state after batch `seq`, and
                            // a batch that starts by clearing everything needs
                            // nothing before it.
                            c.expected = msg.seq + 1;
                            self.indexer.clear_worker(id);
                            self.groups.clear_worker(id);
                            self.apply_batch(id, &msg.batch);
                            self.counters.replays_answered_by_snapshot += 1;
                            self.counters.snapshots_applied += 1;
                            continue;
                        }
                        // The ring starts past what we miss: only a snapshot helps.
                        self.counters.replays_short += 1;
                        self.start_recovery(i, Recovery::Snapshot)?;
                        continue;
                    }
                    c.expected += 1;
                    self.apply_batch(id, &msg.batch);
                    self.counters.batches_replayed += 1;
                }
                Some(Recovery::Snapshot) => {
                    c.expected = msg.seq;
                    self.clear_worker(id);
                    self.apply_batch(id, &msg.batch);
                    self.counters.snapshots_applied += 1;
                }
                None => {}
            }
        }
    }

    /// Compares a worker's profile with the configuration; on a difference
    /// the worker is refused and the error names the field.
    fn check_profile(&mut self, i: usize, json: &[u8]) -> Result<(), SubscribeError> {
        self.counters.profiles_checked += 1;
        let c = &mut self.conns[i];
        let theirs = HashProfile::from_json(json)
            .map_err(|e| SubscribeError::BadProfile { worker: c.name.clone(), reason: e.to_string() })?;
        let ours = self.config.profile.clone().unwrap_or_else(|| {
            HashProfile::new(self.config.indexer.block_size, theirs.image_placeholder_token_ids.clone())
        });
        let difference = ours.first_difference(&theirs);
        let id = c.id;
        // A hybrid engine lists its groups: learnt before its blocks arrive,
        // so that a group holding nothing still constrains the score.
        self.groups.learn_groups(id, &theirs.kv_cache_groups);
        let c = &mut self.conns[i];
        c.profile = Some(theirs);
        let Some((field, ours, theirs)) = difference else {
            // A worker reconfigured to agree is taken back.
            c.refused = false;
            return Ok(());
        };
        c.refused = true;
        c.pending = None;
        c.buffer.clear();
        let (id, worker) = (c.id, c.name.clone());
        self.indexer.clear_worker(id);
        self.groups.clear_worker(id);
        self.counters.profile_mismatches += 1;
        Err(SubscribeError::ProfileMismatch { worker, field, ours, theirs })
    }

    /// The recovery's END arrived: apply the buffer in order, asking a replay
    /// again if it still has a gap.
    fn finish_recovery(&mut self, i: usize) -> Result<(), SubscribeError> {
        let c = &mut self.conns[i];
        let id = c.id;
        let was_replay = matches!(c.pending.take().map(|p| p.kind), Some(Recovery::Replay));
        let mut buffer = std::mem::take(&mut c.buffer);
        buffer.sort_by_key(|(s, _)| *s);
        let mut rest = Vec::new();
        for (seq, batch) in buffer {
            let c = &mut self.conns[i];
            if !rest.is_empty() || seq > c.expected {
                rest.push((seq, batch));
            } else if seq < c.expected {
                self.counters.batches_skipped += 1;
            } else {
                c.expected += 1;
                self.apply_batch(id, &batch);
                self.counters.batches_applied += 1;
            }
        }
        if !rest.is_empty() {
            self.conns[i].buffer = rest;
            // A replay that ended short of the buffer did not cover the gap:
            // only a snapshot helps. After a snapshot, the gap is new (a live
            // batch lost meanwhile) and a replay may cover it.
            if was_replay {
                self.counters.replays_short += 1;
                return self.start_recovery(i, Recovery::Snapshot);
            }
            self.counters.gaps += 1;
            return self.start_recovery(i, Recovery::Replay);
        }
        Ok(())
    }
}
