//! Synthetic event workloads for benches and tests, shaped like the one
//! `tests/interop/dynamo_bench.py` feeds Dynamo: sequences of random token
//! ids, each stored by one worker (round robin) as a parent-linked chain of
//! `BlockStored` events, with content-addressed engine hashes
//! `h_i = XXH3-64(h_{i-1} u64 LE ‖ tokens u32 LE, seed 0)`, `h_{-1} = 0`.

use rand::{Rng, SeedableRng, rngs::StdRng};

use kvcore::wire::{WireBlockRemoved, WireBlockStored, WireEvent};

/// The shape of an [`EventWorkload`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventWorkloadSpec {
    /// RNG seed.
    pub seed: u64,
    /// Sequences in all.
    pub sequences: usize,
    /// Tokens per sequence (whole blocks are stored).
    pub seq_tokens: usize,
    /// Tokens per block.
    pub block_size: u32,
    /// Blocks per `BlockStored` event.
    pub blocks_per_event: usize,
    /// Workers, sequences assigned round robin.
    pub workers: usize,
}

impl Default for EventWorkloadSpec {
    fn default() -> Self {
        Self { seed: 1, sequences: 1024, seq_tokens: 4096, block_size: 32, blocks_per_event: 16, workers: 4 }
    }
}

/// A generated workload of events (see the module docs for its shape).
#[derive(Clone, Debug, Default)]
pub struct EventWorkload {
    /// `(worker index, event)` in publication order.
    pub events: Vec<(usize, WireEvent)>,
    /// `(worker index, token ids)` of each sequence.
    pub sequences: Vec<(usize, Vec<u32>)>,
    /// Blocks stored in all.
    pub blocks: usize,
}

/// The engine hash of a block given its parent's.
fn engine_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut buf = Vec::with_capacity(8 + tokens.len() * 4);
    buf.extend_from_slice(&parent.to_le_bytes());
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64(&buf)
}

impl EventWorkload {
    /// Generates the stored events of a workload.
    pub fn generate(spec: &EventWorkloadSpec) -> Self {
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let bs = spec.block_size as usize;
        let blocks_per_seq = spec.seq_tokens / bs.max(1);
        let mut out = Self::default();
        for s in 0..spec.sequences {
            let worker = s % spec.workers.max(1);
            let tokens: Vec<u32> = (0..blocks_per_seq * bs).map(|_| rng.random_range(0..152_000)).collect();
            let (mut parent, mut prev) = (None, 0u64);
            for chunk in (0..blocks_per_seq).collect::<Vec<_>>().chunks(spec.blocks_per_event.max(1)) {
                let mut hashes = Vec::with_capacity(chunk.len());
                for &b in chunk {
                    prev = engine_hash(prev, &tokens[b * bs..(b + 1) * bs]);
                    hashes.push(prev as i64);
                }
                let (b0, b1) = (chunk[0], chunk[chunk.len() - 1] + 1);
                out.blocks += hashes.len();
                let last = *hashes.last().expect("chunks are not empty");
                out.events.push((
                    worker,
                    WireEvent::BlockStored(WireBlockStored {
                        block_hashes: hashes,
                        parent_block_hash: parent,
                        token_ids: Some(tokens[b0 * bs..b1 * bs].to_vec()),
                        block_size: spec.block_size,
                        medium: Some("GPU".into()),
                        ..Default::default()
                    }),
                ));
                parent = Some(last);
            }
            out.sequences.push((worker, tokens));
        }
        out
    }

    /// One `BlockRemoved` per stored event, in reverse order (children first).
    pub fn removals(&self) -> Vec<(usize, WireEvent)> {
        removals_of(self.events.iter().map(|(w, e)| (*w, e)))
    }
}

/// One `BlockRemoved` per `BlockStored` of `events` (worker, event), in
/// reverse order, each removing its event's blocks children first: what
/// undoes a stored stream.
pub fn removals_of<'a, W: Copy + 'a>(
    events: impl DoubleEndedIterator<Item = (W, &'a WireEvent)>,
) -> Vec<(W, WireEvent)> {
    events
        .rev()
        .filter_map(|(w, e)| match e {
            WireEvent::BlockStored(s) => Some((
                w,
                WireEvent::BlockRemoved(WireBlockRemoved {
                    block_hashes: s.block_hashes.iter().rev().copied().collect(),
                    medium: s.medium.clone(),
                    group_idx: s.group_idx,
                    kv_cache_spec_kind: s.kv_cache_spec_kind.clone(),
                    kv_cache_spec_sliding_window: s.kv_cache_spec_sliding_window,
                }),
            )),
            _ => None,
        })
        .collect()
}
