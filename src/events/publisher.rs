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
//! PUB sockets drop messages silently at the high-water mark (libzmq reports
//! no error), so a stalled subscriber loses batches without a count here; its
//! own gap detection is what tells it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::events::KvEvent;
use crate::events::codec::{EncodeOptions, encode_events, seq_frame};
use crate::events::mirror::Mirror;

/// The request frame that asks the replay socket for a snapshot (any length
/// other than 8 bytes cannot be taken for a start sequence).
pub const SNAPSHOT_REQUEST: &[u8] = b"kvcore.snapshot.v1";

/// The sequence frame of the END sentinel that closes a replay or snapshot.
pub const END_SEQ: [u8; 8] = [0xff; 8];

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
    /// Sequence numbers reserved (batches handed to [`Publisher::publish`]).
    pub batches_reserved: u64,
    /// Batches sent on the `PUB` socket.
    pub batches_sent: u64,
    /// Batches dropped because the queue to the publisher thread was full.
    pub dropped_queue_full: u64,
    /// Batches dropped because the socket refused them.
    pub dropped_send_failed: u64,
    /// Replay requests answered.
    pub replays_served: u64,
    /// Snapshot requests answered.
    pub snapshots_served: u64,
    /// Malformed requests on the replay socket (answered with END only).
    pub bad_requests: u64,
}

#[derive(Debug, Default)]
struct AtomicStats {
    batches_reserved: AtomicU64,
    batches_sent: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_send_failed: AtomicU64,
    replays_served: AtomicU64,
    snapshots_served: AtomicU64,
    bad_requests: AtomicU64,
}

impl AtomicStats {
    fn load(&self) -> PublisherStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PublisherStats {
            batches_reserved: l(&self.batches_reserved),
            batches_sent: l(&self.batches_sent),
            dropped_queue_full: l(&self.dropped_queue_full),
            dropped_send_failed: l(&self.dropped_send_failed),
            replays_served: l(&self.replays_served),
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
    next_seq: u64,
    backlog: Vec<Vec<KvEvent>>,
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
            .field("next_seq", &self.next_seq)
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
        let mut threads = Vec::new();
        {
            let (stats, shared, config) = (Arc::clone(&stats), Arc::clone(&shared), config.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("kvcore-publisher".into())
                    .spawn(move || publisher_loop(rx, pub_socket, &config, &shared, &stats))?,
            );
        }
        if let Some(socket) = replay {
            let (stats, shared, shutdown) = (Arc::clone(&stats), Arc::clone(&shared), Arc::clone(&shutdown));
            let (topic, rank, encode) = (config.topic.clone(), config.data_parallel_rank, config.encode);
            threads.push(std::thread::Builder::new().name("kvcore-replay".into()).spawn(move || {
                replay_loop(&socket, &topic, rank, &encode, &shared, &stats, &shutdown);
            })?);
        }
        Ok(Self { tx: Some(tx), next_seq: 0, backlog: Vec::new(), stats, endpoint, replay_endpoint, shutdown, threads })
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
        self.next_seq
    }

    /// The counters.
    pub fn stats(&self) -> PublisherStats {
        self.stats.load()
    }

    /// Publishes one batch (one step's events) without ever blocking. Returns
    /// the sequence number reserved for it, which is a gap on the wire when
    /// the batch had to be dropped.
    pub fn publish(&mut self, events: Vec<KvEvent>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        bump(&self.stats.batches_reserved);
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let dropped = std::mem::take(&mut self.backlog);
        let Some(tx) = &self.tx else { return seq };
        match tx.try_send(Command::Batch { seq, ts, events, dropped }) {
            Ok(()) => {}
            Err(TrySendError::Full(Command::Batch { events, mut dropped, .. }))
            | Err(TrySendError::Disconnected(Command::Batch { events, mut dropped, .. })) => {
                bump(&self.stats.dropped_queue_full);
                dropped.push(events);
                self.backlog = dropped;
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

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    // A poisoned lock means the other thread panicked mid-update; the ring and
    // the mirror are still structurally valid, so keep serving.
    shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn publisher_loop(
    rx: Receiver<Command>,
    socket: zmq::Socket,
    config: &PublisherConfig,
    shared: &Mutex<Shared>,
    stats: &AtomicStats,
) {
    let rank = config.data_parallel_rank.map(i64::from);
    let mut payload = Vec::new();
    while let Ok(cmd) = rx.recv() {
        match cmd {
            Command::Prime(events) => lock(shared).mirror.apply(&events),
            Command::Flush(done) => {
                let _ = done.send(());
            }
            Command::Batch { seq, ts, events, dropped } => {
                payload.clear();
                encode_events(&events, ts, rank, &config.encode, &mut payload);
                let sent = socket
                    .send(&config.topic[..], zmq::SNDMORE | zmq::DONTWAIT)
                    .and_then(|()| socket.send(&seq_frame(seq)[..], zmq::SNDMORE | zmq::DONTWAIT))
                    .and_then(|()| socket.send(&payload[..], zmq::DONTWAIT));
                let mut s = lock(shared);
                for d in &dropped {
                    s.mirror.apply(d);
                }
                s.mirror.apply(&events);
                s.next_seq = seq + 1;
                match sent {
                    Ok(()) => {
                        bump(&stats.batches_sent);
                        if config.buffer_steps > 0 {
                            if s.ring.len() == config.buffer_steps {
                                s.ring.pop_front();
                            }
                            s.ring.push_back((seq, Arc::from(&payload[..])));
                        }
                    }
                    Err(_) => bump(&stats.dropped_send_failed),
                }
            }
        }
    }
}

fn replay_loop(
    socket: &zmq::Socket,
    topic: &[u8],
    rank: Option<u32>,
    encode: &EncodeOptions,
    shared: &Mutex<Shared>,
    stats: &AtomicStats,
    shutdown: &AtomicBool,
) {
    while !shutdown.load(Ordering::Relaxed) {
        match socket.poll(zmq::POLLIN, 50) {
            Ok(n) if n > 0 => {}
            _ => continue,
        }
        let Ok(frames) = socket.recv_multipart(zmq::DONTWAIT) else { continue };
        // [identity, "", request] from a DEALER; [identity, request] without the delimiter.
        let (id, delimited, request) = match frames.as_slice() {
            [id, empty, req] if empty.is_empty() => (id.clone(), true, req.as_slice()),
            [id, req] => (id.clone(), false, req.as_slice()),
            [id, ..] => (id.clone(), true, &[][..]),
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
        if let Ok(start) = <[u8; 8]>::try_from(request) {
            let start = u64::from_be_bytes(start);
            let retained: Vec<(u64, Arc<[u8]>)> =
                lock(shared).ring.iter().filter(|(s, _)| *s >= start).cloned().collect();
            for (seq, payload) in retained {
                send(&[topic, &seq_frame(seq), &payload]);
            }
            bump(&stats.replays_served);
        } else if request == SNAPSHOT_REQUEST {
            let (events, tag) = {
                let s = lock(shared);
                (s.mirror.snapshot(), s.next_seq)
            };
            let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let mut payload = Vec::new();
            encode_events(&events, ts, rank.map(i64::from), encode, &mut payload);
            send(&[topic, &seq_frame(tag), &payload]);
            bump(&stats.snapshots_served);
        } else {
            bump(&stats.bad_requests);
        }
        send(&[b"", &END_SEQ, b""]);
    }
}
