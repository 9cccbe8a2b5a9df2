//! A long random call sequence for the determinism and call-log tests:
//! admissions with images (content and digests, UUIDs that collide), LoRA
//! adapters and salts, growth, chunked commits, finishes, cancels, explicit
//! evictions, clears, tier moves (a small device pool over a host tier),
//! partial reuse, drains, snapshots and calls that fail. [`Driver::apply`]
//! makes one call and writes every output the engine exposes afterwards as
//! one line of text, so two drivers given the same calls can be compared
//! line by line.

#![allow(dead_code, reason = "each test file uses part of the support module")]

use std::fmt::Write as _;

use kvcore::{Engine, EngineConfig, MmContent, MmItemSpec, RequestId, RequestSpec, TokenRun, copy_waves};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Tokens per block.
pub const BS: u32 = 4;

/// The configuration every driver uses: both tiers small so that eviction,
/// offload, onboard and host drops happen often; partial reuse on; a small
/// hint table and few retained batches so that their bounds act.
pub fn config(offload_first: bool) -> EngineConfig {
    EngineConfig {
        block_size_tokens: BS,
        blocks_device: 40,
        blocks_host: 24,
        partial_reuse: true,
        offload_first,
        requests_max: 10,
        tokens_per_request_max: 96,
        mm_items_max: 24,
        mm_items_per_request_max: 3,
        routing_hints_max: 5,
        event_batches_max: 3,
        ..Default::default()
    }
}

/// One image item as generated.
#[derive(Clone, Debug)]
pub struct Item {
    /// Pixels (given as bytes) or a digest (given as one).
    pub bytes: Vec<u8>,
    /// Whether `bytes` is a digest.
    pub is_digest: bool,
    /// Placement.
    pub runs: Vec<TokenRun>,
}

/// An admission's arguments, owned.
#[derive(Clone, Debug, Default)]
pub struct Admit {
    pub tokens: Vec<u32>,
    pub lora: Option<(u32, String)>,
    pub salt: Option<String>,
    pub items: Vec<Item>,
    pub uuids: Option<Vec<Option<String>>>,
    pub dummy: bool,
}

/// One call. `pick` chooses among the live requests (modulo their count), so
/// the same call means the same request for every driver whose engine has
/// agreed so far.
#[derive(Clone, Debug)]
pub enum Op {
    Admit(Admit),
    Grow {
        pick: usize,
        tokens: Vec<u32>,
    },
    Commit {
        pick: usize,
        part: u32,
    },
    Finish {
        pick: usize,
    },
    Cancel {
        pick: usize,
    },
    Evict(usize),
    Clear,
    Step,
    Drain,
    Snapshot,
    /// A commit on a request that has ended.
    Stale,
}

/// Generates calls from a seed.
pub struct Workload {
    rng: StdRng,
    bases: Vec<Vec<u32>>,
}

impl Workload {
    pub fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let bases = (0..4).map(|_| (0..40).map(|_| rng.random_range(1..50)).collect()).collect();
        Self { rng, bases }
    }

    fn admit(&mut self) -> Admit {
        let r = &mut self.rng;
        let base = &self.bases[r.random_range(0..self.bases.len())];
        let keep = r.random_range(1..=base.len());
        let mut tokens: Vec<u32> = base[..keep].to_vec();
        // A short tail from a small alphabet: partial matches are common.
        for _ in 0..r.random_range(0..10) {
            tokens.push(r.random_range(1..6));
        }
        let mut a = Admit { ..Default::default() };
        if r.random_bool(0.3) {
            let n = r.random_range(1..=2usize);
            let mut at = r.random_range(0..tokens.len() as u32);
            for _ in 0..n {
                let len = r.random_range(1..=6u32);
                if at + len > tokens.len() as u32 {
                    break;
                }
                for t in &mut tokens[at as usize..(at + len) as usize] {
                    *t = kvcore::QWEN_IMAGE_PAD_TOKEN;
                }
                // Image 5 has image 0's UUID but other pixels.
                let image = r.random_range(0..6u8);
                let is_digest = r.random_bool(0.2);
                let bytes = if is_digest { vec![image ^ 0x5a; 32] } else { vec![image; 24] };
                a.items.push(Item { bytes, is_digest, runs: vec![TokenRun { start: at, len }] });
                at += len + r.random_range(0..4);
            }
            if r.random_bool(0.6) {
                a.uuids = Some(
                    a.items
                        .iter()
                        .map(|it| {
                            let image = it.bytes[0] % 5;
                            r.random_bool(0.8).then(|| format!("img-{image}"))
                        })
                        .collect(),
                );
            }
        }
        if r.random_bool(0.25) {
            let id = r.random_range(1..=2u32);
            a.lora = Some((id, format!("adapter-{id}")));
        }
        if r.random_bool(0.1) {
            a.salt = Some("salt".to_owned());
        }
        a.dummy = r.random_bool(0.03);
        if r.random_bool(0.02) {
            a.tokens = Vec::new(); // rejected: empty prompt
        } else {
            a.tokens = tokens;
        }
        a
    }

    /// The next call.
    pub fn next_op(&mut self) -> Op {
        let roll = self.rng.random_range(0..100u32);
        let pick = self.rng.random_range(0..1000usize);
        match roll {
            0..20 => Op::Admit(self.admit()),
            20..30 => {
                let n = self.rng.random_range(1..7);
                Op::Grow { pick, tokens: (0..n).map(|_| self.rng.random_range(1..50)).collect() }
            }
            30..52 => Op::Commit { pick, part: self.rng.random_range(0..4) },
            52..62 => Op::Finish { pick },
            62..66 => Op::Cancel { pick },
            66..69 => Op::Evict(self.rng.random_range(1..5)),
            69..70 => Op::Clear,
            70..93 => Op::Step,
            93..97 => Op::Drain,
            97..98 => Op::Snapshot,
            _ => Op::Stale,
        }
    }
}

/// An engine and the requests it holds, in admission order.
pub struct Driver {
    pub engine: Engine,
    live: Vec<RequestId>,
    ended: Option<RequestId>,
}

impl Driver {
    pub fn new(engine: Engine) -> Self {
        Self { engine, live: Vec::new(), ended: None }
    }

    /// Makes one call; returns the call and every output the engine exposes
    /// after it, as one line.
    pub fn apply(&mut self, op: &Op) -> String {
        let mut line = String::new();
        let e = &mut self.engine;
        match op {
            Op::Admit(a) => {
                let spec = RequestSpec {
                    tokens: &a.tokens,
                    lora_id: a.lora.as_ref().map(|l| l.0),
                    lora_name: a.lora.as_ref().map(|l| l.1.as_str()),
                    cache_salt: a.salt.as_deref(),
                    items: a
                        .items
                        .iter()
                        .map(|it| MmItemSpec {
                            content: if it.is_digest {
                                MmContent::Digest(&it.bytes)
                            } else {
                                MmContent::Bytes(&it.bytes)
                            },
                            runs: it.runs.clone(),
                        })
                        .collect(),
                    uuids: a.uuids.as_ref().map(|u| u.iter().map(|x| x.as_deref().map(str::as_bytes)).collect()),
                    dummy: a.dummy,
                };
                let r = e.add_request(&spec);
                if let Ok(adm) = &r {
                    self.live.push(adm.id);
                }
                write!(line, "admit {} tokens -> {r:?}", a.tokens.len()).unwrap();
            }
            Op::Grow { pick, tokens } => match pick_of(&self.live, *pick) {
                Some((_, id)) => write!(line, "grow {id:?} -> {:?}", e.grow(id, tokens)).unwrap(),
                None => line.push_str("grow: none live"),
            },
            Op::Commit { pick, part } => match pick_of(&self.live, *pick) {
                Some((_, id)) => {
                    let info = e.request_info(id).unwrap();
                    // Chunked prefill: a quarter, half, three quarters or all
                    // of the tokens not yet computed.
                    let left = info.tokens - info.tokens_computed;
                    let n = info.tokens_computed + left * (part + 1) / 4;
                    write!(line, "commit {id:?} {n} -> {:?}", e.commit(id, n as u64)).unwrap();
                }
                None => line.push_str("commit: none live"),
            },
            Op::Finish { pick } | Op::Cancel { pick } => match pick_of(&self.live, *pick) {
                Some((i, id)) => {
                    let finish = matches!(op, Op::Finish { .. });
                    let r = if finish { e.finish(id) } else { e.cancel(id) };
                    self.live.remove(i);
                    self.ended = Some(id);
                    write!(line, "{} {id:?} -> {r:?}", if finish { "finish" } else { "cancel" }).unwrap();
                }
                None => line.push_str("end: none live"),
            },
            Op::Evict(n) => write!(line, "evict {n} -> {}", e.evict(*n)).unwrap(),
            Op::Clear => {
                e.clear();
                line.push_str("clear");
            }
            Op::Step => {
                let copies = e.step();
                write!(line, "step -> copies {copies:?} waves {:?}", copy_waves(&copies)).unwrap();
            }
            Op::Drain => write!(line, "drain -> {:?}", e.drain_batches()).unwrap(),
            Op::Snapshot => write!(line, "snapshot -> {:?}", e.snapshot()).unwrap(),
            Op::Stale => match self.ended {
                Some(id) => write!(line, "stale commit {id:?} -> {:?}", e.commit(id, 1)).unwrap(),
                None => line.push_str("stale: none ended"),
            },
        }
        let e = &self.engine;
        write!(line, " | counters {:?}", e.counters()).unwrap();
        write!(
            line,
            " | live {} free {} cached {:?} step {}",
            e.requests_live(),
            e.blocks_free_device(),
            e.blocks_cached(),
            e.step_index()
        )
        .unwrap();
        for id in &self.live {
            write!(line, " | {id:?} {:?} {:?}", e.request_info(*id), e.block_table(*id)).unwrap();
        }
        let cached: Vec<_> = e.cached_blocks().collect();
        write!(line, " | cached blocks {cached:?}").unwrap();
        line
    }
}

fn pick_of(live: &[RequestId], pick: usize) -> Option<(usize, RequestId)> {
    (!live.is_empty()).then(|| (pick % live.len(), live[pick % live.len()]))
}

/// A stable 64-bit digest of a line (FNV-1a), for transcripts that cross
/// processes.
pub fn line_digest(line: &str) -> u64 {
    line.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}
