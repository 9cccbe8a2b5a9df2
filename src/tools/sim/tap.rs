//! The taps: one plain ZMQ `SUB` socket per engine publisher, collecting the
//! payload frames exactly as they went out, so that the simulation can hand
//! them to the routers after a simulated propagation delay.
//!
//! A message is three frames (topic, 8-byte big-endian sequence number,
//! msgpack payload; docs/wire-format.md). After each engine step the fleet
//! waits until the tap has received every batch the publisher has numbered;
//! a batch that does not arrive within [`RECV_TIMEOUT`] is counted as lost
//! and the run goes on.

use std::time::{Duration, Instant};

use super::SimError;

/// How long a tap waits for a batch the publisher numbered.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the taps wait, once connected, for the subscriptions to reach the
/// publishers (a `PUB` socket drops what it sends before then).
const JOIN_WAIT: Duration = Duration::from_millis(150);

/// One `SUB` socket per worker.
pub struct Taps {
    _context: zmq::Context,
    sockets: Vec<zmq::Socket>,
    next: Vec<u64>,
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
        Ok(Self { _context: context, sockets, next: vec![0; n], lost: 0, payload_bytes: 0 })
    }

    /// The payloads of `worker`'s batches numbered below `target`, in order.
    pub fn collect(&mut self, worker: usize, target: u64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let socket = &self.sockets[worker];
        let deadline = Instant::now() + RECV_TIMEOUT;
        while self.next[worker] < target {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !matches!(socket.poll(zmq::POLLIN, left.as_millis().max(1) as i64), Ok(n) if n > 0) {
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
