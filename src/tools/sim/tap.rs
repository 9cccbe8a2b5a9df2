//! The taps: one plain ZMQ `SUB` socket per engine publisher, collecting the
//! payload frames exactly as they went out, so that the simulation can hand
//! them to the routers after a simulated propagation delay.
//!
//! A message is three frames (topic, 8-byte big-endian sequence number,
//! msgpack payload; docs/wire-format.md). After each engine step the fleet
//! waits until the tap has received every batch the publisher has numbered.
//! A `SUB` socket misses what is published before its subscription reaches
//! the publisher (longer on a loaded machine), so a tap that sees a gap, or
//! waits in vain, asks the publisher's replay socket for the missing batches
//! from the first one it lacks, as a router does (docs/wire-format.md,
//! "Replay and snapshot"). A batch that neither path brings within
//! [`RECV_TIMEOUT`] is counted as lost and the run goes on.

use std::time::{Duration, Instant};

use super::SimError;

/// How long a tap waits for a batch the publisher numbered.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a tap waits for a numbered batch on its `SUB` socket before it
/// asks the publisher's replay socket instead.
const REPLAY_AFTER: Duration = Duration::from_millis(200);

/// How long the taps wait, once connected, for the subscriptions to reach the
/// publishers (a `PUB` socket drops what it sends before then).
const JOIN_WAIT: Duration = Duration::from_millis(150);

/// One `SUB` socket per worker.
pub struct Taps {
    _context: zmq::Context,
    sockets: Vec<zmq::Socket>,
    next: Vec<u64>,
    /// Each worker's replay endpoint, when its publisher binds one.
    replay: Vec<Option<String>>,
    lost: u64,
    payload_bytes: u64,
}

impl std::fmt::Debug for Taps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taps").field("workers", &self.sockets.len()).field("lost", &self.lost).finish()
    }
}

impl Taps {
    /// Connects one `SUB` per endpoint, in worker order.
    pub fn connect(endpoints: &[String]) -> Result<Self, SimError> {
        let context = zmq::Context::new();
        let mut sockets = Vec::with_capacity(endpoints.len());
        for (w, ep) in endpoints.iter().enumerate() {
            let s = context.socket(zmq::SUB).map_err(|e| SimError::Zmq(format!("worker {w}: {e}")))?;
            s.set_subscribe(b"").map_err(|e| SimError::Zmq(format!("worker {w}: {e}")))?;
            s.set_rcvhwm(0).map_err(|e| SimError::Zmq(format!("worker {w}: {e}")))?;
            s.connect(ep).map_err(|e| SimError::Zmq(format!("worker {w}: connecting to {ep}: {e}")))?;
            sockets.push(s);
        }
        std::thread::sleep(JOIN_WAIT);
        let n = sockets.len();
        Ok(Self { _context: context, sockets, next: vec![0; n], replay: vec![None; n], lost: 0, payload_bytes: 0 })
    }

    /// Gives the taps the publishers' replay endpoints, in worker order, so
    /// that a batch the `SUB` socket missed is fetched from there.
    pub fn set_replay(&mut self, endpoints: Vec<Option<String>>) {
        self.replay = endpoints;
        self.replay.resize(self.sockets.len(), None);
    }

    /// Asks `worker`'s replay socket for every retained batch from the first
    /// one the tap lacks, and appends those below `target` to `out`.
    fn replay_into(&mut self, worker: usize, target: u64, out: &mut Vec<Vec<u8>>) {
        let Some(endpoint) = self.replay.get(worker).cloned().flatten() else { return };
        let Ok(dealer) = self._context.socket(zmq::DEALER) else { return };
        let _ = dealer.set_linger(0);
        if dealer.connect(&endpoint).is_err() {
            return;
        }
        let start = self.next[worker].to_be_bytes();
        if dealer.send_multipart([&b""[..], &start[..]], 0).is_err() {
            return;
        }
        let deadline = Instant::now() + RECV_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !matches!(dealer.poll(zmq::POLLIN, left.as_millis().max(1) as i64), Ok(n) if n > 0) {
                return;
            }
            let Ok(frames) = dealer.recv_multipart(0) else { return };
            // `[b"", topic, seq, payload]`; the end is `[b"", b"", END_SEQ, b""]`.
            let [_, _, seq, payload] = frames.as_slice() else { continue };
            if seq.as_slice() == kvcore::wire::END_SEQ {
                return;
            }
            let Ok(seq) = <[u8; 8]>::try_from(seq.as_slice()).map(u64::from_be_bytes) else { continue };
            if seq < self.next[worker] || seq >= target {
                continue;
            }
            self.next[worker] = seq + 1;
            self.payload_bytes += payload.len() as u64 + 8;
            out.push(payload.clone());
        }
    }

    /// The payloads of `worker`'s batches numbered below `target`, in order.
    pub fn collect(&mut self, worker: usize, target: u64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let deadline = Instant::now() + RECV_TIMEOUT;
        let mut replayed = false;
        while self.next[worker] < target {
            let left = deadline.saturating_duration_since(Instant::now());
            // Wait for live batches a little, then ask for a replay once.
            let wait = if replayed { left } else { left.min(REPLAY_AFTER) };
            let socket = &self.sockets[worker];
            if wait.is_zero() || !matches!(socket.poll(zmq::POLLIN, wait.as_millis().max(1) as i64), Ok(n) if n > 0) {
                if !replayed && !left.is_zero() {
                    replayed = true;
                    self.replay_into(worker, target, &mut out);
                    continue;
                }
                self.lost += target - self.next[worker];
                self.next[worker] = target;
                break;
            }
            let Ok(frames) = socket.recv_multipart(0) else { continue };
            let [_, seq, payload] = frames.as_slice() else { continue };
            let Ok(seq) = <[u8; 8]>::try_from(seq.as_slice()).map(u64::from_be_bytes) else { continue };
            if seq < self.next[worker] {
                continue;
            }
            if seq > self.next[worker] && !replayed && self.replay.get(worker).is_some_and(Option::is_some) {
                // A gap: fetch what is missing (this batch included) by replay.
                replayed = true;
                self.replay_into(worker, target, &mut out);
                if seq < self.next[worker] {
                    continue;
                }
            }
            self.lost += seq - self.next[worker];
            self.next[worker] = seq + 1;
            self.payload_bytes += payload.len() as u64 + 8;
            out.push(payload.clone());
        }
        out
    }

    /// Batches that never arrived.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Bytes received (payload and sequence frames).
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }
}
