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
//! A router that names images by content must hash their pixels first, with
//! BLAKE3 as the engines do ([`kvcore::ImageDigest::of_content`]); the time
//! is added to the request's time to first token before it is routed. An
//! image of `n` placeholder tokens is `n ·` [`IMAGE_BYTES_PER_TOKEN`] bytes
//! of decoded RGB (Qwen3-VL, whose placeholder the workloads use, gives one
//! token to a 32 × 32 pixel square: 16-pixel patches merged 2 × 2), so the
//! 256- and 576-token images of the chat workload are 768 KiB (512 × 512) and
//! 1.69 MiB (768 × 768). The cost is `hash_ns_per_byte` per byte:
//! `kvcore sim` measures it at start-up ([`measure_hash`]: each image size of
//! the workload hashed [`HASH_SAMPLES`] times on this CPU, one thread, the
//! median) unless `--hash-ns-per-byte` fixes it; the library's default is a
//! figure measured that way on the development machine (docs/benchmarks.md),
//! so that runs built from [`TimingModel::default`] are deterministic.
//! Decoding the image, which a frontend must do first, is not counted.
//!
//! Because a worker serves in order, a block computed by an earlier request
//! is in place when a later request on the same worker starts; the simulation
//! therefore admits and commits a request in the engine at routing time and
//! places its work on the worker's timeline here.

/// Bytes of decoded 8-bit RGB per image placeholder token: a 32 × 32 pixel
/// square (Qwen3-VL: 16-pixel patches, merged 2 × 2).
pub const IMAGE_BYTES_PER_TOKEN: u64 = 32 * 32 * 3;

/// [`TimingModel::default`]'s BLAKE3 cost: the median of [`measure_hash`] on
/// the development machine (docs/benchmarks.md, "Simulation").
pub const DEFAULT_HASH_NS_PER_BYTE: f64 = 0.153;

/// Repetitions per image size in [`measure_hash`].
pub const HASH_SAMPLES: usize = 15;

/// What [`measure_hash`] found.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HashMeasurement {
    /// The median over every sample of every size, nanoseconds per byte.
    pub ns_per_byte: f64,
    /// Per image size in placeholder tokens: its bytes and the median time of
    /// one hash, in microseconds.
    pub sizes: Vec<HashSize>,
    /// Samples per size.
    pub samples: usize,
}

/// One image size of a [`HashMeasurement`].
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct HashSize {
    /// Placeholder tokens of the image.
    pub tokens: u32,
    /// Its decoded bytes ([`IMAGE_BYTES_PER_TOKEN`] per token).
    pub bytes: u64,
    /// Median time of one BLAKE3 hash of that many bytes, microseconds.
    pub median_us: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Measures BLAKE3 ([`kvcore::ImageDigest::of_content`], one thread) on this
/// CPU over images of each of `token_sizes` placeholder tokens, `samples`
/// times each after one warm-up hash, and returns the medians. The bytes are
/// a fixed pseudo-random fill (BLAKE3's speed does not depend on them).
pub fn measure_hash(token_sizes: &[u32], samples: usize) -> HashMeasurement {
    let mut sizes: Vec<u32> = token_sizes.iter().copied().filter(|&t| t > 0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut per_byte = Vec::new();
    let mut out = Vec::new();
    for tokens in sizes {
        let bytes = tokens as u64 * IMAGE_BYTES_PER_TOKEN;
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ tokens as u64;
        let buf: Vec<u8> = (0..bytes)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::hint::black_box(kvcore::ImageDigest::of_content(&buf));
        let mut times: Vec<f64> = (0..samples.max(1))
            .map(|_| {
                let t = std::time::Instant::now();
                std::hint::black_box(kvcore::ImageDigest::of_content(std::hint::black_box(&buf)));
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        per_byte.extend(times.iter().map(|us| us * 1000.0 / bytes as f64));
        out.push(HashSize { tokens, bytes, median_us: median(&mut times) });
    }
    HashMeasurement { ns_per_byte: median(&mut per_byte), sizes: out, samples: samples.max(1) }
}

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
    /// What a router pays per byte of decoded pixels to hash an image
    /// before it can route by content, in nanoseconds (BLAKE3 on one CPU
    /// core, see the module docs).
    pub hash_ns_per_byte: f64,
}

impl TimingModel {
    /// What hashing one image of `tokens` placeholder tokens costs a router,
    /// in microseconds.
    pub fn hash_us(&self, tokens: u32) -> f64 {
        tokens as f64 * IMAGE_BYTES_PER_TOKEN as f64 * self.hash_ns_per_byte / 1000.0
    }
}

impl Default for TimingModel {
    fn default() -> Self {
        Self {
            request_overhead_us: 2_000.0,
            prefill_us_per_token: 125.0,
            onboard_us_per_token: 3.0,
            decode_us_per_token: 40.0,
            hash_ns_per_byte: DEFAULT_HASH_NS_PER_BYTE,
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

    /// An image's hash costs its decoded bytes at the per-byte figure, and the
    /// measurement covers each image size once, with positive times.
    #[test]
    fn hash_cost_by_image_size() {
        let m = TimingModel { hash_ns_per_byte: 0.5, ..TimingModel::default() };
        assert_eq!(m.hash_us(256), 256.0 * 3072.0 * 0.5 / 1000.0);
        assert_eq!(m.hash_us(576) / m.hash_us(256), 576.0 / 256.0);
        let h = measure_hash(&[4, 2, 4, 0], 3);
        assert_eq!(h.sizes.iter().map(|z| (z.tokens, z.bytes)).collect::<Vec<_>>(), [(2, 6144), (4, 12288)]);
        assert!(h.ns_per_byte > 0.0 && h.sizes.iter().all(|z| z.median_us > 0.0), "{h:?}");
        assert_eq!(h.samples, 3);
    }

    /// A request queued behind another waits for it; cached tokens cost nothing.
    #[test]
    fn queueing_and_cached_tokens() {
        let m = TimingModel {
            request_overhead_us: 0.0,
            prefill_us_per_token: 1.0,
            onboard_us_per_token: 0.5,
            decode_us_per_token: 2.0,
            hash_ns_per_byte: 0.0,
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
