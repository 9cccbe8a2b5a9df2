//! The ZMQ publisher: one batch per step on a `PUB` socket, a replay ring on a
//! `ROUTER` socket, and full-state snapshots.
//!
//! ```text
//!  step thread                publisher thread                 replay thread
//!  publish(events) --try_send--> mirror.apply, encode, PUB send   ROUTER: replay / snapshot
//!   (seq reserved;  bounded      ring.push(seq, payload)  <--lock-->  reads ring and mirror
//!    never blocks)  queue
//! ```
//!
//! Why this shape:
//! - the step never blocks: [`Publisher::publish`] reserves the sequence
//!   number and hands the typed events to a bounded queue with `try_send`;
//!   encoding happens on the publisher thread. When the queue is full the
//!   batch is dropped, its number stays a gap (consumers resync on gaps) and
//!   [`PublisherStats::dropped_queue_full`] counts it;
//! - a dropped batch still changed the engine's state, so its events are kept
//!   on the step side and handed over with the next batch that gets through,
//!   for the mirror only: snapshots stay exact even after drops;
//! - the replay socket serves the last `buffer_steps` published batches by the
//!   vLLM protocol (docs/wire-format.md) on its own thread, so a slow replay
//!   client never delays live publishing;
//! - a snapshot is asked for on the replay socket with the request frame
//!   [`SNAPSHOT_REQUEST`] instead of an 8-byte start sequence. The answer is
//!   one batch, `AllBlocksCleared` then one `BlockStored` per advertised block,
//!   whose seq frame `S` means: "this is the state after every batch numbered
//!   below `S`; apply live batches from `S` on". Then the END sentinel.
//!
//! - a replay asked from a start the ring no longer holds is answered with
//!   the snapshot instead (the replay protocol itself: no new request), so a
//!   consumer that applies every batch of a replay reply, like NVIDIA Dynamo
//!   1.6.1, reaches the exact state. Its seq frame is the last batch the
//!   snapshot covers, so the next live batch is contiguous with it;
//! - while nothing was handed to the socket for `heartbeat_ms`, an empty batch
//!   goes out with the next sequence number, so a subscriber that joined an
//!   idle engine sees its gap within one heartbeat and replays. The number is
//!   reserved under the same lock as the step's, and only when no batch is
//!   queued, so numbers stay in order on the wire;
//! - a reply carries the engine's [`HashProfile`] first when the request asks
//!   for it (a trailing [`PROFILE_REQUEST`] frame), so other consumers see
//!   the vLLM protocol unchanged.
//!
//! PUB sockets drop messages silently at the high-water mark (libzmq reports
//! no error), so a stalled subscriber loses batches without a count here: the
//! counter says what it knows, [`PublisherStats::batches_handed_to_socket`],
//! and the subscriber sees the loss as a gap that it heals by replay.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::events::KvEvent;
use crate::events::codec::{EncodeOptions, encode_events, seq_frame};
use crate::events::mirror::Mirror;
use crate::events::profile::HashProfile;

/// The request frame that asks the replay socket for a snapshot (any length
/// other than 8 bytes cannot be taken for a start sequence).
pub const SNAPSHOT_REQUEST: &[u8] = b"kvcore.snapshot.v1";

/// The sequence frame of the END sentinel that closes a replay or snapshot.
pub const END_SEQ: [u8; 8] = [0xff; 8];

/// A trailing request frame (after the start sequence or [`SNAPSHOT_REQUEST`])
/// that asks for the publisher's [`HashProfile`]; the reply then starts with
/// the two-frame message `[PROFILE_REQUEST, profile JSON]`.
pub const PROFILE_REQUEST: &[u8] = b"kvcore.profile.v1";

/// The default heartbeat period, in milliseconds.
pub const HEARTBEAT_MS_DEFAULT: u32 = 1000;

/// Configuration of a [`Publisher`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublisherConfig {
    /// Where the `PUB` socket binds, e.g. `tcp://*:5557`. With a data-parallel
    /// rank the TCP port becomes `port + rank`. A `*` port picks a free one
    /// (see [`Publisher::endpoint`]).
    pub endpoint: String,
    /// Where the replay `ROUTER` socket binds, with the same rank rule; `None`
    /// turns replay and snapshots off.
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message.
    pub topic: Vec<u8>,
    /// The data-parallel rank written into every batch.
    pub data_parallel_rank: Option<u32>,
    /// Published batches retained for replay.
    pub buffer_steps: usize,
    /// Batches that may wait for the publisher thread before new ones are
    /// dropped (default 1024). The thread only encodes a batch and hands it to
    /// a socket that never blocks, so it keeps up with any step rate; a queue
    /// only builds while it is starved of CPU, and 1024 steps of backlog (tens
    /// of seconds of serving) is more than such a stall lasts. Past it a
    /// subscriber sees a sequence gap and recovers by replay, instead of the
    /// queue holding an unbounded share of memory.
    pub queue_capacity: usize,
    /// The `PUB` socket's send high-water mark, in messages.
    pub send_hwm: i32,
    /// How events are encoded.
    pub encode: EncodeOptions,
    /// After this many milliseconds with nothing handed to the socket, an
    /// empty batch goes out with the next sequence number; 0 turns heartbeats
    /// off. Default [`HEARTBEAT_MS_DEFAULT`].
    pub heartbeat_ms: u32,
    /// The hash profile that replies carry when asked; the engine fills it
    /// from its configuration when a publisher is started through it.
    pub profile: Option<HashProfile>,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            topic: Vec::new(),
            data_parallel_rank: None,
            buffer_steps: 10_000,
            queue_capacity: 1024,
            send_hwm: 100_000,
            encode: EncodeOptions::default(),
            heartbeat_ms: HEARTBEAT_MS_DEFAULT,
            profile: None,
        }
    }
}

/// Why a publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// ZMQ refused a socket operation (bind, option).
    #[error("zmq: {0}")]
    Zmq(#[from] zmq::Error),
    /// An endpoint whose port cannot be offset by the rank.
    #[error("endpoint {0:?}: a data-parallel rank needs a tcp endpoint with a numeric port")]
    Endpoint(String),
    /// The publisher thread could not be spawned.
    #[error("spawning the publisher thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Counters of a publisher, readable at any time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Sequence numbers reserved: batches handed to [`Publisher::publish`]
    /// and heartbeats. Always `batches_handed_to_socket + dropped_queue_full
    /// + dropped_send_failed` once the queue is flushed.
    pub batches_reserved: u64,
    /// Batches handed to the `PUB` socket (heartbeats included). libzmq
    /// accepts a message and then drops it, silently, for each subscriber at
    /// its high-water mark, so this counts what the socket took, not what
    /// every subscriber received: a subscriber sees such a loss as a gap.
    pub batches_handed_to_socket: u64,
    /// Empty heartbeat batches handed to the socket.
    pub heartbeats: u64,
    /// Batches dropped because the queue to the publisher thread was full.
    pub dropped_queue_full: u64,
    /// Batches dropped because the socket refused them.
    pub dropped_send_failed: u64,
    /// Replay requests answered.
    pub replays_served: u64,
    /// Replay requests whose start the ring no longer held, answered with
    /// the snapshot.
    pub replays_answered_by_snapshot: u64,
    /// Snapshot requests answered.
    pub snapshots_served: u64,
    /// Malformed requests on the replay socket (answered with END only).
    pub bad_requests: u64,
}

#[derive(Debug, Default)]
struct AtomicStats {
    batches_reserved: AtomicU64,
    batches_handed_to_socket: AtomicU64,
    heartbeats: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_send_failed: AtomicU64,
    replays_served: AtomicU64,
    replays_answered_by_snapshot: AtomicU64,
    snapshots_served: AtomicU64,
    bad_requests: AtomicU64,
}

impl AtomicStats {
    fn load(&self) -> PublisherStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PublisherStats {
            batches_reserved: l(&self.batches_reserved),
            batches_handed_to_socket: l(&self.batches_handed_to_socket),
            heartbeats: l(&self.heartbeats),
            dropped_queue_full: l(&self.dropped_queue_full),
            dropped_send_failed: l(&self.dropped_send_failed),
            replays_served: l(&self.replays_served),
            replays_answered_by_snapshot: l(&self.replays_answered_by_snapshot),
            snapshots_served: l(&self.snapshots_served),
            bad_requests: l(&self.bad_requests),
        }
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

enum Command {
    Batch { seq: u64, ts: f64, events: Vec<KvEvent>, dropped: Vec<Vec<KvEvent>> },
    Prime(Vec<KvEvent>),
    Flush(SyncSender<()>),
}

/// Numbering, shared by the step side and the publisher thread's heartbeat.
#[derive(Debug, Default)]
struct Sequencer {
    /// The number the next batch gets.
    next: u64,
    /// The events of batches dropped since the last one that got through:
    /// they changed the engine's state, so the next batch or heartbeat
    /// carries them to the mirror.
    backlog: Vec<Vec<KvEvent>>,
}

/// What the publisher thread shares with the replay thread.
#[derive(Debug, Default)]
struct Shared {
    ring: VecDeque<(u64, Arc<[u8]>)>,
    mirror: Mirror,
    /// Every batch below this number has been applied to the mirror.
    next_seq: u64,
}

/// A running publisher. Dropping it stops both threads (pending batches are
/// sent first).
pub struct Publisher {
    tx: Option<SyncSender<Command>>,
    /// The next sequence number and the events of dropped batches; batches
    /// are queued under this lock, so the publisher thread can reserve a
    /// heartbeat's number in order and carry the dropped events with it.
    seq: Arc<Mutex<Sequencer>>,
    stats: Arc<AtomicStats>,
    endpoint: String,
    replay_endpoint: Option<String>,
    shutdown: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("next_seq", &self.next_seq())
            .field("stats", &self.stats.load())
            .finish()
    }
}

/// `endpoint` with its TCP port moved up by `rank` (vLLM's data-parallel rule).
pub fn endpoint_for_rank(endpoint: &str, rank: Option<u32>) -> Result<String, PublishError> {
    let rank = match rank {
        None | Some(0) => return Ok(endpoint.to_owned()),
        Some(r) => r,
    };
    let bad = || PublishError::Endpoint(endpoint.to_owned());
    let (head, port) = endpoint.rsplit_once(':').ok_or_else(bad)?;
    if !endpoint.starts_with("tcp://") {
        return Err(bad());
    }
    let port: u32 = port.parse().map_err(|_| bad())?;
    let port = port.checked_add(rank).filter(|p| *p <= 65_535).ok_or_else(bad)?;
    Ok(format!("{head}:{port}"))
}

impl Publisher {
    /// Binds the sockets and starts the threads. Errors (a port in use, a bad
    /// endpoint) come back here, before anything runs.
    pub fn bind(config: PublisherConfig) -> Result<Self, PublishError> {
        let ctx = zmq::Context::new();
        let pub_socket = ctx.socket(zmq::PUB)?;
        pub_socket.set_sndhwm(config.send_hwm)?;
        pub_socket.set_linger(1000)?;
        pub_socket.bind(&endpoint_for_rank(&config.endpoint, config.data_parallel_rank)?)?;
        let endpoint = last_endpoint(&pub_socket)?;
        let replay = match &config.replay_endpoint {
            Some(e) => {
                let s = ctx.socket(zmq::ROUTER)?;
                s.set_linger(1000)?;
                // A ROUTER drops what it cannot queue: a replay of the whole
                // ring must reach its client, so no high-water mark here (the
                // ring bounds what one reply holds).
                s.set_sndhwm(0)?;
                s.bind(&endpoint_for_rank(e, config.data_parallel_rank)?)?;
                Some(s)
            }
            None => None,
        };
        let replay_endpoint = replay.as_ref().map(last_endpoint).transpose()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(config.queue_capacity.max(1));
        let stats = Arc::new(AtomicStats::default());
        let shared = Arc::new(Mutex::new(Shared::default()));
        let shutdown = Arc::new(AtomicBool::new(false));
        let seq = Arc::new(Mutex::new(Sequencer::default()));
        let mut threads = Vec::new();
        {
            let (stats, shared, config) = (Arc::clone(&stats), Arc::clone(&shared), config.clone());
            let seq = Arc::clone(&seq);
            threads.push(std::thread::Builder::new().name("kvcore-publisher".into()).spawn(move || {
                publisher_loop(&rx, &pub_socket, &config, &shared, &stats, &seq);
            })?);
        }
        if let Some(socket) = replay {
            let (stats, shared, shutdown) = (Arc::clone(&stats), Arc::clone(&shared), Arc::clone(&shutdown));
            let config = config.clone();
            threads.push(std::thread::Builder::new().name("kvcore-replay".into()).spawn(move || {
                replay_loop(&socket, &config, &shared, &stats, &shutdown);
            })?);
        }
        Ok(Self { tx: Some(tx), seq, stats, endpoint, replay_endpoint, shutdown, threads })
    }

    /// The endpoint the `PUB` socket is bound to (with the real port when `*` was asked).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The endpoint of the replay socket, when there is one.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// The sequence number the next batch will get.
    pub fn next_seq(&self) -> u64 {
        lock_seq(&self.seq).next
    }

    /// The counters.
    pub fn stats(&self) -> PublisherStats {
        self.stats.load()
    }

    /// Publishes one batch (one step's events) without ever blocking. Returns
    /// the sequence number reserved for it, which is a gap on the wire when
    /// the batch had to be dropped.
    pub fn publish(&mut self, events: Vec<KvEvent>) -> u64 {
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        // Held for the reservation and the `try_send` only (neither blocks):
        // the heartbeat reserves its number under it when the queue is empty.
        let mut sequencer = lock_seq(&self.seq);
        let dropped = std::mem::take(&mut sequencer.backlog);
        let seq = sequencer.next;
        sequencer.next += 1;
        bump(&self.stats.batches_reserved);
        let Some(tx) = &self.tx else { return seq };
        match tx.try_send(Command::Batch { seq, ts, events, dropped }) {
            Ok(()) => {}
            Err(TrySendError::Full(Command::Batch { events, mut dropped, .. }))
            | Err(TrySendError::Disconnected(Command::Batch { events, mut dropped, .. })) => {
                bump(&self.stats.dropped_queue_full);
                dropped.push(events);
                sequencer.backlog = dropped;
            }
            Err(_) => unreachable!("the command sent was a batch"),
        }
        seq
    }

    /// Seeds the snapshot mirror with state that existed before this publisher
    /// (an `Engine::snapshot()`), so that snapshots are complete when a
    /// publisher is attached to a warm engine. Blocks until queued.
    pub fn prime(&mut self, snapshot: Vec<KvEvent>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Command::Prime(snapshot));
        }
    }

    /// Waits until every batch queued so far has been handled by the publisher
    /// thread (sent or dropped), or `timeout` passed. Returns whether it did.
    /// For tests and orderly shutdown; never call it from the step.
    pub fn flush(&self, timeout: Duration) -> bool {
        let Some(tx) = &self.tx else { return true };
        let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
        if tx.send(Command::Flush(done_tx)).is_err() {
            return false;
        }
        done_rx.recv_timeout(timeout).is_ok()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.tx = None;
        self.shutdown.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn last_endpoint(s: &zmq::Socket) -> Result<String, PublishError> {
    Ok(s.get_last_endpoint()?.unwrap_or_default())
}

fn lock_seq(seq: &Mutex<Sequencer>) -> std::sync::MutexGuard<'_, Sequencer> {
    // Only a counter and a list are updated under this lock, each in one
    // step: poisoned or not, it is valid.
    seq.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    // A poisoned lock means the other thread panicked mid-update; the ring and
    // the mirror are still structurally valid, so keep serving.
    shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn publisher_loop(
    rx: &Receiver<Command>,
    socket: &zmq::Socket,
    config: &PublisherConfig,
    shared: &Mutex<Shared>,
    stats: &AtomicStats,
    seq: &Mutex<Sequencer>,
) {
    let rank = config.data_parallel_rank.map(i64::from);
    let heartbeat = (config.heartbeat_ms > 0).then(|| Duration::from_millis(config.heartbeat_ms.into()));
    let mut payload = Vec::new();
    let mut last_handed = Instant::now();
    let outlet = Outlet { socket, config, shared, stats, rank };
    loop {
        let cmd = match heartbeat {
            None => match rx.recv() {
                Ok(cmd) => cmd,
                Err(_) => return,
            },
            Some(period) => match rx.recv_timeout(period.saturating_sub(last_handed.elapsed())) {
                Ok(cmd) => cmd,
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    // Reserve the heartbeat's number only while no batch is
                    // queued: the step queues under the same lock, so nothing
                    // numbered below it can still be on its way.
                    let reserved = {
                        let mut sequencer = lock_seq(seq);
                        match rx.try_recv() {
                            Ok(cmd) => Err(cmd),
                            Err(TryRecvError::Disconnected) => return,
                            Err(TryRecvError::Empty) => {
                                let number = sequencer.next;
                                sequencer.next += 1;
                                bump(&stats.batches_reserved);
                                Ok((number, std::mem::take(&mut sequencer.backlog)))
                            }
                        }
                    };
                    match reserved {
                        Err(cmd) => cmd,
                        Ok((number, dropped)) => {
                            // A heartbeat carries the events of dropped
                            // batches to the mirror like any batch, so a
                            // snapshot tagged past them includes them.
                            let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
                            if hand_over(&outlet, (number, ts), &[], &dropped, &mut payload) {
                                bump(&stats.heartbeats);
                            }
                            last_handed = Instant::now();
                            continue;
                        }
                    }
                }
            },
        };
        match cmd {
            Command::Prime(events) => lock(shared).mirror.apply(&events),
            Command::Flush(done) => {
                let _ = done.send(());
            }
            Command::Batch { seq, ts, events, dropped } => {
                hand_over(&outlet, (seq, ts), &events, &dropped, &mut payload);
                last_handed = Instant::now();
            }
        }
    }
}

/// What the publisher thread hands batches over with.
struct Outlet<'a> {
    socket: &'a zmq::Socket,
    config: &'a PublisherConfig,
    shared: &'a Mutex<Shared>,
    stats: &'a AtomicStats,
    rank: Option<i64>,
}

/// Encodes and sends one batch, applies it (and the batches dropped before
/// it) to the mirror and retains it for replay. Returns whether the socket
/// took it.
fn hand_over(
    out: &Outlet<'_>,
    (seq, ts): (u64, f64),
    events: &[KvEvent],
    dropped: &[Vec<KvEvent>],
    payload: &mut Vec<u8>,
) -> bool {
    let Outlet { socket, config, shared, stats, rank } = *out;
    payload.clear();
    encode_events(events, ts, rank, &config.encode, payload);
    let sent = socket
        .send(&config.topic[..], zmq::SNDMORE | zmq::DONTWAIT)
        .and_then(|()| socket.send(&seq_frame(seq)[..], zmq::SNDMORE | zmq::DONTWAIT))
        .and_then(|()| socket.send(&payload[..], zmq::DONTWAIT));
    let mut s = lock(shared);
    for d in dropped {
        s.mirror.apply(d);
    }
    s.mirror.apply(events);
    s.next_seq = seq + 1;
    match sent {
        Ok(()) => {
            bump(&stats.batches_handed_to_socket);
            if config.buffer_steps > 0 {
                if s.ring.len() == config.buffer_steps {
                    s.ring.pop_front();
                }
                s.ring.push_back((seq, Arc::from(&payload[..])));
            }
            true
        }
        Err(_) => {
            bump(&stats.dropped_send_failed);
            false
        }
    }
}

fn replay_loop(
    socket: &zmq::Socket,
    config: &PublisherConfig,
    shared: &Mutex<Shared>,
    stats: &AtomicStats,
    shutdown: &AtomicBool,
) {
    let topic = &config.topic[..];
    while !shutdown.load(Ordering::Relaxed) {
        match socket.poll(zmq::POLLIN, 50) {
            Ok(n) if n > 0 => {}
            _ => continue,
        }
        let Ok(frames) = socket.recv_multipart(zmq::DONTWAIT) else { continue };
        // [identity, "", request, (PROFILE_REQUEST)] from a DEALER; the same
        // without the delimiter from a ROUTER-less client.
        let (id, delimited, request, wants_profile) = match frames.as_slice() {
            [id, empty, req] if empty.is_empty() => (id.clone(), true, req.as_slice(), false),
            [id, empty, req, p] if empty.is_empty() && p == PROFILE_REQUEST => (id.clone(), true, req.as_slice(), true),
            [id, req] => (id.clone(), false, req.as_slice(), false),
            [id, ..] => (id.clone(), true, &[][..], false),
            [] => continue,
        };
        let send = |parts: &[&[u8]]| {
            let mut msg: Vec<&[u8]> = vec![&id];
            if delimited {
                msg.push(b"");
            }
            msg.extend_from_slice(parts);
            let _ = socket.send_multipart(msg, 0);
        };
        let good = <[u8; 8]>::try_from(request).is_ok() || request == SNAPSHOT_REQUEST;
        if good
            && wants_profile
            && let Some(profile) = &config.profile
        {
            send(&[PROFILE_REQUEST, &profile.to_json()]);
        }
        if let Ok(start) = <[u8; 8]>::try_from(request) {
            let start = u64::from_be_bytes(start);
            let (retained, snapshot) = {
                let s = lock(shared);
                let retained: Vec<(u64, Arc<[u8]>)> = s.ring.iter().filter(|(seq, _)| *seq >= start).cloned().collect();
                // The ring covers the request when it holds every batch from
                // `start` to the last one handed over (none, when `start` is
                // past it); otherwise only the snapshot brings the consumer
                // to the exact state.
                let covered = start >= s.next_seq
                    || (retained.first().is_some_and(|(first, _)| *first == start)
                        && retained.len() as u64 == s.next_seq - start);
                if covered { (retained, None) } else { (Vec::new(), Some((s.mirror.snapshot(), s.next_seq))) }
            };
            for (seq, payload) in retained {
                send(&[topic, &seq_frame(seq), &payload]);
            }
            if let Some((events, next)) = snapshot {
                // The state after batch `next - 1`: tagged with that number, so
                // the consumer's next live batch, `next`, follows it.
                let payload = snapshot_payload(&events, config);
                send(&[topic, &seq_frame(next - 1), &payload]);
                bump(&stats.replays_answered_by_snapshot);
            }
            bump(&stats.replays_served);
        } else if request == SNAPSHOT_REQUEST {
            let (events, tag) = {
                let s = lock(shared);
                (s.mirror.snapshot(), s.next_seq)
            };
            let payload = snapshot_payload(&events, config);
            send(&[topic, &seq_frame(tag), &payload]);
            bump(&stats.snapshots_served);
        } else {
            bump(&stats.bad_requests);
        }
        send(&[b"", &END_SEQ, b""]);
    }
}

fn snapshot_payload(events: &[KvEvent], config: &PublisherConfig) -> Vec<u8> {
    let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let mut payload = Vec::new();
    encode_events(events, ts, config.data_parallel_rank.map(i64::from), &config.encode, &mut payload);
    payload
}
