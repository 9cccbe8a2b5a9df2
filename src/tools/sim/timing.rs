//! The timing model: what a request costs a worker, and the worker's queue.
//!
//! A worker serves its requests one after another, in arrival order. A
//! request that arrives while the worker is busy waits. Its service time is
//!
//! ```text
//! service = overhead + computed · prefill + onboarded · onboard + output · decode
//! ttft    = wait + overhead + computed · prefill + onboarded · onboard
//! ```
//!
//! where `computed` are the prompt tokens not found in the cache, `onboarded`
//! the cached tokens copied back from the host tier, and `output` the tokens
//! generated. A token found on the device costs nothing. `decode` is the
//! amortized share of a batched decode step per generated token, so decode
//! keeps a worker busy (load matters) without dominating. The defaults are of
//! the order of a 70B-class model on one H100-class GPU: about 8,000 prefill
//! tokens per second, host-to-device copies about 40 times faster than
//! recomputing, a few hundred decode tokens per second of a worker's share.
//!
//! A router that names images by content must hash their pixels first:
//! `hash_us_per_image` (1.5 ms by default) is BLAKE3 over a decoded image of
//! about 1 megapixel (3 MiB of RGB) at about 2 GiB/s, half of what one thread
//! reaches on a 16 MiB input (about 4 GB/s), for a frontend core that is
//! shared; decoding the image first, which a frontend must also do, is not
//! counted. It is added to the request's time to first token before it is
//! routed.
//!
//! Because a worker serves in order, a block computed by an earlier request
//! is in place when a later request on the same worker starts; the simulation
//! therefore admits and commits a request in the engine at routing time and
//! places its work on the worker's timeline here.

/// Costs of the timing model (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct TimingModel {
    /// Fixed cost per request (scheduling, sampling), in microseconds.
    pub request_overhead_us: f64,
    /// Cost per prompt token computed, in microseconds.
    pub prefill_us_per_token: f64,
    /// Cost per cached token onboarded from the host tier, in microseconds.
    pub onboard_us_per_token: f64,
    /// Cost per generated token, in microseconds.
    pub decode_us_per_token: f64,
    /// What a router pays to hash one image's pixels before it can route by
    /// content, in microseconds (BLAKE3 on one CPU core, see the module docs).
    pub hash_us_per_image: f64,
}

impl Default for TimingModel {
    fn default() -> Self {
        Self {
            request_overhead_us: 2_000.0,
            prefill_us_per_token: 125.0,
            onboard_us_per_token: 3.0,
            decode_us_per_token: 40.0,
            hash_us_per_image: 1_500.0,
        }
    }
}

/// What serving one request on a worker took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Served {
    /// Time to first token, in microseconds, from arrival.
    pub ttft_us: f64,
    /// When the worker becomes free again.
    pub done_us: f64,
    /// How long the request kept the worker busy.
    pub service_us: f64,
}

/// One worker's timeline.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerClock {
    /// When the worker finishes its queued work, in microseconds.
    pub busy_until_us: f64,
}

impl WorkerClock {
    /// Queued work left at `now_us`, in microseconds.
    pub fn backlog_us(&self, now_us: f64) -> f64 {
        (self.busy_until_us - now_us).max(0.0)
    }

    /// Queues a request arriving at `now_us` and returns its timing.
    pub fn serve(&mut self, model: &TimingModel, now_us: f64, computed: u32, onboarded: u32, output: u32) -> Served {
        let start = self.busy_until_us.max(now_us);
        let prefill = model.request_overhead_us
            + computed as f64 * model.prefill_us_per_token
            + onboarded as f64 * model.onboard_us_per_token;
        let done = start + prefill + output as f64 * model.decode_us_per_token;
        self.busy_until_us = done;
        Served { ttft_us: start + prefill - now_us, done_us: done, service_us: done - start }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request queued behind another waits for it; cached tokens cost nothing.
    #[test]
    fn queueing_and_cached_tokens() {
        let m = TimingModel {
            request_overhead_us: 0.0,
            prefill_us_per_token: 1.0,
            onboard_us_per_token: 0.5,
            decode_us_per_token: 2.0,
            hash_us_per_image: 0.0,
        };
        let mut w = WorkerClock::default();
        let a = w.serve(&m, 0.0, 100, 0, 10);
        assert_eq!(a.ttft_us, 100.0);
        assert_eq!(a.done_us, 120.0);
        let b = w.serve(&m, 20.0, 0, 40, 0);
        assert_eq!(b.ttft_us, 120.0 - 20.0 + 20.0);
        assert_eq!(w.backlog_us(130.0), 10.0);
    }
}
