//! Workloads: the arrivals every policy is run on.
//!
//! Two sources, one shape ([`Workload`], a list of [`SimRequest`] sorted by
//! arrival):
//!
//! - [`chat_workload`]: a seeded generator of multimodal chat sessions. Each
//!   session starts with one of a few shared system prompts, often followed
//!   by an image (as in "look at this picture"), and every later turn extends
//!   the previous prompt with the assistant's answer and a new user message,
//!   sometimes with another image. Images come from a catalog drawn with Zipf
//!   popularity, all at one of a few fixed token sizes (a vision encoder emits
//!   a fixed count per resolution), so two different images often occupy the
//!   same placeholder positions: exactly where a router that keys blocks by
//!   token ids alone is fooled. Half the catalog carries a UUID; a few
//!   requests send a known UUID with other pixels.
//! - [`mooncake_workload`]: replay of the Mooncake trace (see
//!   `../shared/data/traces/README.md`): each 512-token `hash_id` block is
//!   expanded into 512 token ids derived from the id alone, so equal ids give
//!   equal tokens, and prompts are built lazily (the full trace holds 145
//!   million prompt tokens).

use std::borrow::Cow;
use std::io::BufRead as _;
use std::path::Path;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use kvcore::ImageDigest;

/// One image item of a request.
#[derive(Clone, Debug)]
pub struct SimImage {
    /// The content bytes (small synthetic "pixels"; only their digest matters).
    pub pixels: Arc<[u8]>,
    /// BLAKE3-256 of `pixels`: the image's cache identity.
    pub digest: ImageDigest,
    /// The caller's UUID, when the client sent one (a routing hint only).
    pub uuid: Option<Arc<str>>,
    /// First prompt position of the image's placeholder tokens.
    pub start: u32,
    /// Number of placeholder tokens.
    pub len: u32,
}

/// A prompt, given as token ids or as Mooncake block ids to expand.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Token ids.
    Tokens(Vec<u32>),
    /// Mooncake `hash_ids` (512 tokens each, the last one cut to fit) and the
    /// prompt length.
    HashBlocks {
        /// The trace's block ids.
        hash_ids: Vec<u64>,
        /// Tokens in the prompt.
        len: u32,
    },
}

/// Tokens per Mooncake `hash_id` block.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

impl Prompt {
    /// Tokens in the prompt.
    pub fn len(&self) -> u32 {
        match self {
            Prompt::Tokens(t) => t.len() as u32,
            Prompt::HashBlocks { len, .. } => *len,
        }
    }

    /// Whether the prompt is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The prompt's token ids (expanded on demand for trace prompts).
    pub fn tokens(&self) -> Cow<'_, [u32]> {
        match self {
            Prompt::Tokens(t) => Cow::Borrowed(t),
            Prompt::HashBlocks { hash_ids, len } => {
                let mut out = Vec::with_capacity(*len as usize);
                for &h in hash_ids {
                    let take = (*len as usize - out.len()).min(MOONCAKE_BLOCK_TOKENS as usize);
                    out.extend((0..take as u64).map(|j| text_token(h.wrapping_mul(MOONCAKE_BLOCK_TOKENS as u64) ^ j)));
                }
                Cow::Owned(out)
            }
        }
    }
}

/// One request of a workload.
#[derive(Clone, Debug)]
pub struct SimRequest {
    /// Position in the workload (0-based, in arrival order).
    pub id: u64,
    /// Arrival time in simulated microseconds.
    pub arrival_us: u64,
    /// The chat session (or trace line) it belongs to.
    pub session: u64,
    /// The prompt.
    pub prompt: Prompt,
    /// Image items, sorted by position, disjoint.
    pub images: Vec<SimImage>,
    /// Tokens the request generates (for the timing model).
    pub output_len: u32,
    /// The generated token ids when the next turn of the session repeats them
    /// (the engine then caches them too); empty for trace requests, whose
    /// outputs are not part of later prompts' block ids.
    pub generated: Vec<u32>,
}

/// A named list of requests, sorted by arrival.
#[derive(Clone, Debug)]
pub struct Workload {
    /// What it is (for the report).
    pub name: String,
    /// The requests, sorted by `arrival_us`.
    pub requests: Vec<SimRequest>,
    /// The trace's own ideal hit ratio (infinite cache, one pool), token
    /// weighted, when the source states one.
    pub ideal_hit_ratio: Option<f64>,
}

impl Workload {
    /// Prompt tokens over all requests.
    pub fn prompt_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.prompt.len() as u64).sum()
    }
}

/// A text token id derived from a 64-bit value: splitmix64, folded into
/// `[1000, 101000)`, far below any image placeholder id.
pub fn text_token(x: u64) -> u32 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    1000 + (z % 100_000) as u32
}

/// Parameters of the chat generator. The defaults are the workload of
/// `kvcore sim` with no arguments (see docs/simulation.md for why each is so).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ChatConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Chat sessions.
    pub sessions: u32,
    /// Turns per session, drawn uniformly in this inclusive range.
    pub turns_min: u32,
    /// See `turns_min`.
    pub turns_max: u32,
    /// Distinct shared system prompts.
    pub system_prompts: u32,
    /// Tokens of a system prompt, drawn uniformly in this inclusive range.
    pub system_tokens_min: u32,
    /// See `system_tokens_min`.
    pub system_tokens_max: u32,
    /// Tokens of a user message, drawn uniformly in this inclusive range.
    pub user_tokens_min: u32,
    /// See `user_tokens_min`.
    pub user_tokens_max: u32,
    /// Tokens of an assistant answer, drawn uniformly in this inclusive range.
    pub answer_tokens_min: u32,
    /// See `answer_tokens_min`.
    pub answer_tokens_max: u32,
    /// Probability that a session's first turn opens with an image.
    pub first_turn_image: f64,
    /// Probability that a later turn carries an image.
    pub later_turn_image: f64,
    /// Images in the catalog.
    pub catalog_images: u32,
    /// Zipf exponent of image popularity.
    pub zipf_exponent: f64,
    /// Placeholder tokens per image, one value per resolution.
    pub image_token_sizes: Vec<u32>,
    /// Fraction of catalog images that carry a UUID.
    pub uuid_fraction: f64,
    /// Probability that a request naming a UUID sends other pixels under it.
    pub uuid_pixel_swap: f64,
    /// Mean time between session starts, in milliseconds (Poisson arrivals).
    pub session_interarrival_ms: f64,
    /// Mean think time between turns of a session, in milliseconds; each one
    /// is drawn uniformly within 25 % of the mean.
    pub think_time_ms: f64,
    /// The image placeholder token id written at image positions.
    pub placeholder_token: u32,
}

impl Default for ChatConfig {
    fn default() -> Self {
        Self {
            seed: 7,
            sessions: 400,
            turns_min: 3,
            turns_max: 10,
            system_prompts: 4,
            system_tokens_min: 96,
            system_tokens_max: 224,
            user_tokens_min: 32,
            user_tokens_max: 384,
            answer_tokens_min: 128,
            answer_tokens_max: 512,
            first_turn_image: 0.5,
            later_turn_image: 0.3,
            catalog_images: 400,
            zipf_exponent: 0.6,
            image_token_sizes: vec![256, 576],
            uuid_fraction: 0.5,
            uuid_pixel_swap: 0.05,
            session_interarrival_ms: 700.0,
            think_time_ms: 9_000.0,
            placeholder_token: kvcore::QWEN_IMAGE_PAD_TOKEN,
        }
    }
}

/// Samples ranks `0..n` with probability proportional to `1 / (rank + 1)^s`.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u32, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf = Vec::with_capacity(n as usize);
        for k in 0..n {
            acc += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(acc);
        }
        Self { cdf }
    }

    fn sample(&self, rng: &mut StdRng) -> u32 {
        let total = *self.cdf.last().unwrap_or(&1.0);
        let x = rng.random::<f64>() * total;
        (self.cdf.partition_point(|c| *c < x) as u32).min(self.cdf.len().saturating_sub(1) as u32)
    }
}

/// Exponential sample with the given mean.
fn exponential(rng: &mut StdRng, mean: f64) -> f64 {
    -mean * (1.0 - rng.random::<f64>()).ln()
}

/// Why a workload could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A parameter is out of range.
    #[error("invalid chat workload: {0}")]
    Invalid(&'static str),
    /// The trace file could not be read.
    #[error(
        "cannot read the trace {path}: {source} (the Mooncake trace is expected at ../shared/data/traces/ beside the repository; pass --trace FILE)"
    )]
    Io {
        /// The path tried.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A trace line is not valid.
    #[error("{path}:{line}: {what}")]
    BadLine {
        /// The file.
        path: String,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        what: String,
    },
}

impl ChatConfig {
    fn validate(&self) -> Result<(), WorkloadError> {
        let check = |ok: bool, what| if ok { Ok(()) } else { Err(WorkloadError::Invalid(what)) };
        check(self.sessions >= 1, "sessions must be at least 1")?;
        check(self.turns_min >= 1 && self.turns_min <= self.turns_max, "turns must satisfy 1 <= min <= max")?;
        check(self.system_prompts >= 1, "system_prompts must be at least 1")?;
        check(self.system_tokens_min >= 1 && self.system_tokens_min <= self.system_tokens_max, "system tokens range")?;
        check(self.user_tokens_min >= 1 && self.user_tokens_min <= self.user_tokens_max, "user tokens range")?;
        check(self.answer_tokens_min <= self.answer_tokens_max, "answer tokens range")?;
        check(self.catalog_images >= 1, "catalog_images must be at least 1")?;
        check(!self.image_token_sizes.is_empty() && self.image_token_sizes.iter().all(|s| *s >= 1), "image sizes")?;
        for p in [self.first_turn_image, self.later_turn_image, self.uuid_fraction, self.uuid_pixel_swap] {
            check((0.0..=1.0).contains(&p), "probabilities must be in [0, 1]")?;
        }
        check(self.session_interarrival_ms > 0.0 && self.think_time_ms >= 0.0, "times must be positive")?;
        Ok(())
    }
}

/// A catalog image: pixels, digest, size and optional UUID.
struct CatalogImage {
    pixels: Arc<[u8]>,
    digest: ImageDigest,
    len: u32,
    uuid: Option<Arc<str>>,
    /// Other pixels of the same size, sent under this image's UUID by the
    /// "same UUID, different pixels" requests.
    swapped: Arc<[u8]>,
    swapped_digest: ImageDigest,
}

fn pixels(seed: u64, image: u32, variant: u64) -> Arc<[u8]> {
    let mut bytes = Vec::with_capacity(256);
    for i in 0..32u64 {
        let v = text_token(seed ^ ((image as u64) << 20) ^ (variant << 40) ^ i) as u64;
        bytes.extend_from_slice(&v.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    }
    bytes.into()
}

/// Generates the seeded multimodal chat workload (see the module docs).
pub fn chat_workload(config: &ChatConfig) -> Result<Workload, WorkloadError> {
    config.validate()?;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut fresh = config.seed.wrapping_mul(1_000_003) << 8;
    let mut next_text = |n: u32, out: &mut Vec<u32>| {
        for _ in 0..n {
            fresh = fresh.wrapping_add(1);
            out.push(text_token(fresh));
        }
    };
    let systems: Vec<Vec<u32>> = (0..config.system_prompts)
        .map(|_| {
            let n = rng.random_range(config.system_tokens_min..=config.system_tokens_max);
            let mut t = Vec::new();
            next_text(n, &mut t);
            t
        })
        .collect();
    let catalog: Vec<CatalogImage> = (0..config.catalog_images)
        .map(|k| {
            let p = pixels(config.seed, k, 0);
            let s = pixels(config.seed, k, 1);
            CatalogImage {
                digest: ImageDigest::of_content(&p),
                pixels: p,
                len: config.image_token_sizes[rng.random_range(0..config.image_token_sizes.len())],
                uuid: (rng.random::<f64>() < config.uuid_fraction).then(|| Arc::from(format!("img-{k:05}"))),
                swapped_digest: ImageDigest::of_content(&s),
                swapped: s,
            }
        })
        .collect();
    let zipf = Zipf::new(config.catalog_images, config.zipf_exponent);
    let pick_image = |rng: &mut StdRng, start: u32| -> SimImage {
        let img = &catalog[zipf.sample(rng) as usize];
        let swap = img.uuid.is_some() && rng.random::<f64>() < config.uuid_pixel_swap;
        let (pixels, digest) =
            if swap { (img.swapped.clone(), img.swapped_digest) } else { (img.pixels.clone(), img.digest) };
        SimImage { pixels, digest, uuid: img.uuid.clone(), start, len: img.len }
    };

    let mut requests = Vec::new();
    let mut session_start_ms = 0.0;
    for session in 0..config.sessions as u64 {
        session_start_ms += exponential(&mut rng, config.session_interarrival_ms);
        let turns = rng.random_range(config.turns_min..=config.turns_max);
        let mut prompt: Vec<u32> = systems[rng.random_range(0..systems.len())].clone();
        let mut images: Vec<SimImage> = Vec::new();
        let mut at_ms = session_start_ms;
        for turn in 0..turns {
            let p_image = if turn == 0 { config.first_turn_image } else { config.later_turn_image };
            if rng.random::<f64>() < p_image {
                let img = pick_image(&mut rng, prompt.len() as u32);
                prompt.extend(std::iter::repeat_n(config.placeholder_token, img.len as usize));
                images.push(img);
            }
            let user = rng.random_range(config.user_tokens_min..=config.user_tokens_max);
            next_text(user, &mut prompt);
            let answer = rng.random_range(config.answer_tokens_min..=config.answer_tokens_max);
            let mut generated = Vec::with_capacity(answer as usize);
            next_text(answer, &mut generated);
            requests.push(SimRequest {
                id: 0,
                arrival_us: (at_ms * 1000.0) as u64,
                session,
                prompt: Prompt::Tokens(prompt.clone()),
                images: images.clone(),
                output_len: answer,
                generated: generated.clone(),
            });
            prompt.extend_from_slice(&generated);
            at_ms += config.think_time_ms * rng.random_range(0.75..1.25);
        }
    }
    requests.sort_by_key(|r| (r.arrival_us, r.session));
    for (i, r) in requests.iter_mut().enumerate() {
        r.id = i as u64;
    }
    Ok(Workload {
        name: format!("chat (seed {}, {} sessions)", config.seed, config.sessions),
        requests,
        ideal_hit_ratio: None,
    })
}

/// The token-weighted ideal hit ratio the trace README states for the full
/// Mooncake conversation trace (infinite cache, one pool).
pub const MOONCAKE_IDEAL_HIT_RATIO: f64 = 0.3736;

#[derive(serde::Deserialize)]
struct TraceLine {
    timestamp: u64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// Reads a Mooncake trace (JSON lines: `timestamp` in ms, `input_length`,
/// `output_length`, `hash_ids`), keeping at most `limit` requests.
///
/// The ideal ratio is computed from the requests read, token weighted, from
/// block ids: a block's tokens count as reusable when its id was seen before
/// (for the whole conversation trace this is the README's 0.3736).
pub fn mooncake_workload(path: &Path, limit: Option<usize>) -> Result<Workload, WorkloadError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| WorkloadError::Io { path: shown.clone(), source })?;
    let mut requests = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let (mut reusable, mut total) = (0u64, 0u64);
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        if limit.is_some_and(|l| requests.len() >= l) {
            break;
        }
        let line = line.map_err(|source| WorkloadError::Io { path: shown.clone(), source })?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |what: String| WorkloadError::BadLine { path: shown.clone(), line: i + 1, what };
        let t: TraceLine = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        let blocks = t.input_length.div_ceil(MOONCAKE_BLOCK_TOKENS) as usize;
        if t.input_length == 0 || t.hash_ids.len() != blocks {
            return Err(bad(format!(
                "{} hash_ids for input_length {} (expected {blocks}, and a non-empty prompt)",
                t.hash_ids.len(),
                t.input_length
            )));
        }
        for (k, h) in t.hash_ids.iter().enumerate() {
            let tokens = if k + 1 == blocks { t.input_length - k as u32 * MOONCAKE_BLOCK_TOKENS } else { 512 };
            total += tokens as u64;
            if !seen.insert(*h) {
                reusable += tokens as u64;
            }
        }
        requests.push(SimRequest {
            id: requests.len() as u64,
            arrival_us: t.timestamp * 1000,
            session: i as u64,
            prompt: Prompt::HashBlocks { hash_ids: t.hash_ids, len: t.input_length },
            images: Vec::new(),
            output_len: t.output_length,
            generated: Vec::new(),
        });
    }
    if requests.is_empty() {
        return Err(WorkloadError::BadLine { path: shown, line: 0, what: "the trace holds no request".into() });
    }
    requests.sort_by_key(|r| r.arrival_us);
    for (i, r) in requests.iter_mut().enumerate() {
        r.id = i as u64;
    }
    let computed = reusable as f64 / total.max(1) as f64;
    let name = path.file_name().map_or(shown.clone(), |n| n.to_string_lossy().into_owned());
    Ok(Workload { name: format!("{name} ({} requests)", requests.len()), requests, ideal_hit_ratio: Some(computed) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generator must be deterministic for a seed, extend prompts turn by
    /// turn within a session, and keep image runs inside the prompt.
    #[test]
    fn chat_is_seeded_and_multi_turn() {
        let c = ChatConfig { sessions: 20, ..Default::default() };
        let a = chat_workload(&c).unwrap();
        let b = chat_workload(&c).unwrap();
        assert_eq!(a.requests.len(), b.requests.len());
        assert!(a.requests.iter().zip(&b.requests).all(|(x, y)| x.prompt.tokens() == y.prompt.tokens()));
        let s0: Vec<&SimRequest> = a.requests.iter().filter(|r| r.session == 0).collect();
        assert!(s0.len() >= 2);
        let (t0, t1) = (s0[0].prompt.tokens(), s0[1].prompt.tokens());
        assert!(t1.starts_with(&t0), "a turn extends the previous prompt");
        for r in &a.requests {
            for img in &r.images {
                assert!(img.start + img.len <= r.prompt.len());
            }
        }
    }

    /// Trace prompts expand to exactly `input_length` tokens, equal ids giving
    /// equal tokens.
    #[test]
    fn hash_blocks_expand_deterministically() {
        let a = Prompt::HashBlocks { hash_ids: vec![0, 5], len: 700 }.tokens().into_owned();
        let b = Prompt::HashBlocks { hash_ids: vec![0, 6], len: 600 }.tokens().into_owned();
        assert_eq!(a.len(), 700);
        assert_eq!(a[..512], b[..512]);
        assert_ne!(a[512..600], b[512..600]);
    }
}
