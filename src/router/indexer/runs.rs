//! Key runs: every router key held by some worker, with its holder value,
//! laid out in the order its blocks were stored, so that a lookup walks a
//! stored prefix by comparing the request's keys against consecutive slots
//! instead of probing the holder index once per key.
//!
//! ```text
//!   chunk 0                      chunk 1
//!   keys    [k0 k1 k2 k3 … ]     [q0 q1 … ]       one stream per worker:
//!   holders [h  h  h  h' … ]     [g  g  … ]       its new keys go to its open chunk
//! ```
//!
//! Why this shape:
//! - A worker's consecutive `BlockStored` events of one sequence give keys
//!   that follow each other, so they land in consecutive slots of the
//!   worker's open chunk. A request's walk down a held prefix is then a
//!   comparison loop over two arrays, with a probe only where the run breaks
//!   (a branch point, another worker's layout, a chunk boundary).
//! - A slot belongs to its key for the key's whole life in the index (until
//!   a compaction moves it): the workers' tables name a block's key by its
//!   slot, and the holder value lives here alone. A dead slot has holder
//!   value 0, which no live key has, so a walk never runs through one.
//! - A key sits either in the slot just after its parent's (it is
//!   *chained*) or in the holder index's map of run heads, which a bit per
//!   slot marks (`mapped`); `holders.rs` keeps that true as slots die and
//!   move.
//! - Keys and holders are separate arrays (12 bytes a key), so the loop reads
//!   two sequential streams.
//! - Memory stays bounded by the live keys: a chunk whose last key dies is
//!   reused, and when the chunks in use hold less than half their slots
//!   live (beyond a few chunks of slack), the sparse ones are compacted into
//!   a stream of their own (each moved key's slot is updated in the holder
//!   index; its order, and so its runs, kept).

/// Slots per chunk.
pub(super) const CHUNK: usize = 1024;

/// No chunk, or no stream owning a chunk.
const NONE: u32 = u32::MAX;

/// The stream that compaction moves keys into (worker `w` writes stream
/// `w + 1`).
pub(super) const COMPACTION: usize = 0;

/// Where a stream's next key goes.
#[derive(Clone, Copy, Debug)]
struct Open {
    /// The open chunk, or [`NONE`].
    chunk: u32,
    /// The next free slot in it.
    next: u32,
}

impl Default for Open {
    fn default() -> Self {
        Self { chunk: NONE, next: CHUNK as u32 }
    }
}

/// The key and holder arrays, in chunks (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Runs {
    /// Each slot's key (stale in dead slots).
    pub(super) keys: Vec<u64>,
    /// Each slot's holder value, 0 in dead slots.
    pub(super) holders: Vec<u32>,
    /// A bit a slot: its key is in the holder index's map of run heads
    /// (never set in a dead slot).
    mapped: Vec<u64>,
    /// Live slots per chunk.
    live: Vec<u32>,
    /// The stream each chunk is the open chunk of, or [`NONE`].
    owner: Vec<u32>,
    /// Chunks with no live slot and no owner, for reuse.
    free: Vec<u32>,
    /// Open chunks by stream: the compaction's, then one per worker.
    open: Vec<Open>,
    /// Live slots in all.
    live_total: usize,
}

impl Runs {
    /// Makes the streams `0..=stream` (the compaction's and worker
    /// `stream - 1`'s), so that the store path indexes them unchecked of
    /// growth.
    pub(super) fn add_stream(&mut self, stream: usize) {
        if stream >= self.open.len() {
            self.open.resize(stream + 1, Open::default());
        }
    }

    /// The slot `stream`'s next key will take (a worker's stream is its
    /// index plus one), opening a chunk when its open one is full;
    /// [`Runs::fill`] then takes it.
    #[inline(always)]
    pub(super) fn next_slot(&mut self, stream: usize) -> u32 {
        let o = self.open[stream];
        if o.next as usize != CHUNK {
            return o.chunk * CHUNK as u32 + o.next;
        }
        self.open_chunk(stream)
    }

    /// Gives `stream` a new open chunk (a free one, or one more).
    #[cold]
    #[inline(never)]
    fn open_chunk(&mut self, stream: usize) -> u32 {
        let o = self.open[stream];
        if o.chunk != NONE {
            let c = o.chunk as usize;
            self.owner[c] = NONE;
            if self.live[c] == 0 {
                self.free.push(o.chunk);
            }
        }
        let c = match self.free.pop() {
            Some(c) => c,
            None => {
                let c = self.live.len() as u32;
                self.keys.resize(self.keys.len() + CHUNK, 0);
                self.holders.resize(self.holders.len() + CHUNK, 0);
                self.mapped.resize(self.mapped.len() + CHUNK / 64, 0);
                self.live.push(0);
                self.owner.push(NONE);
                c
            }
        };
        self.owner[c as usize] = stream as u32;
        self.open[stream] = Open { chunk: c, next: 0 };
        c * CHUNK as u32
    }

    /// Whether `slot`'s key is in the map of run heads.
    #[inline(always)]
    pub(super) fn mapped(&self, slot: usize) -> bool {
        self.mapped[slot / 64] >> (slot % 64) & 1 != 0
    }

    /// Marks `slot`'s key as in the map of run heads (a live slot).
    #[inline(always)]
    pub(super) fn set_mapped(&mut self, slot: usize) {
        self.mapped[slot / 64] |= 1 << (slot % 64);
    }

    /// Slots allocated.
    pub(super) fn slots(&self) -> usize {
        self.keys.len()
    }

    /// Reserves room for `more` slots beyond those allocated.
    pub(super) fn reserve(&mut self, more: usize) {
        self.keys.reserve(more);
        self.holders.reserve(more);
        self.mapped.reserve(more.div_ceil(64));
    }

    /// Hints the lines that `stream`'s next `n` keys will be written to.
    #[inline]
    pub(super) fn prefetch(&self, stream: usize, n: usize) {
        let o = self.open[stream];
        if o.chunk == NONE {
            return;
        }
        let s = o.chunk as usize * CHUNK + o.next as usize;
        let end = (o.chunk as usize + 1) * CHUNK;
        for i in (s..(s + n).min(end)).step_by(8) {
            crate::table::prefetch(&self.keys[i]);
        }
        if s < end {
            crate::table::prefetch(&self.holders[s]);
        }
    }

    /// Hints the line holding `slot`'s holder value.
    #[inline]
    pub(super) fn prefetch_slot(&self, slot: u32) {
        if let Some(h) = self.holders.get(slot as usize) {
            crate::table::prefetch(h);
        }
    }

    /// Takes `slot`, which [`Runs::next_slot`] just gave for `stream`, for
    /// `key` with holder value `holder` (not 0).
    #[inline(always)]
    pub(super) fn fill(&mut self, stream: usize, slot: u32, key: u64, holder: u32) {
        debug_assert!(holder != 0, "a live slot has a holder");
        debug_assert_eq!(slot, self.open[stream].chunk * CHUNK as u32 + self.open[stream].next);
        self.open[stream].next += 1;
        let s = slot as usize;
        self.keys[s] = key;
        self.holders[s] = holder;
        self.live[s / CHUNK] += 1;
        self.live_total += 1;
    }

    /// Takes the next slot of `stream` for `key` with holder value `holder`.
    #[inline]
    pub(super) fn take(&mut self, stream: usize, key: u64, holder: u32) -> u32 {
        let slot = self.next_slot(stream);
        self.fill(stream, slot, key, holder);
        slot
    }

    /// Frees a slot whose key left the index. Whether the chunks then
    /// waste enough to compact is [`Runs::wasteful`], asked once a settle.
    #[inline]
    pub(super) fn release(&mut self, slot: u32) {
        let (s, c) = (slot as usize, slot as usize / CHUNK);
        self.holders[s] = 0;
        self.mapped[s / 64] &= !(1 << (s % 64));
        self.live[c] -= 1;
        self.live_total -= 1;
        if self.live[c] == 0 {
            match self.owner[c] {
                NONE => self.free.push(c as u32),
                // The open chunk emptied: its stream starts it over.
                stream => self.open[stream as usize].next = 0,
            }
        }
    }

    /// Whether the chunks in use hold less than half their slots live,
    /// beyond one chunk per stream and two more of slack.
    pub(super) fn wasteful(&self) -> bool {
        let used = self.live.len() - self.free.len();
        used * CHUNK > 2 * self.live_total + (self.open.len() + 2) * CHUNK
    }

    /// The live slots of every chunk not open for a stream and at most half
    /// full, chunk by chunk in order: what [`Runs::relocate`] moves.
    pub(super) fn sparse_chunks(&self) -> Vec<u32> {
        (0..self.live.len() as u32)
            .filter(|&c| {
                let c = c as usize;
                self.owner[c] == NONE && self.live[c] > 0 && self.live[c] as usize <= CHUNK / 2
            })
            .collect()
    }

    /// Moves the live slots of chunk `c` into the compaction stream, in
    /// order, calling `moved(old slot, key, holder value, new slot,
    /// mapped)` for each, which says whether the key is in the map at its
    /// new slot; the chunk is freed.
    pub(super) fn relocate(&mut self, c: u32, mut moved: impl FnMut(u32, u64, u32, u32, bool) -> bool) {
        let base = c as usize * CHUNK;
        for s in base..base + CHUNK {
            let h = self.holders[s];
            if h == 0 {
                continue;
            }
            let key = self.keys[s];
            let was = self.mapped(s);
            self.holders[s] = 0;
            self.mapped[s / 64] &= !(1 << (s % 64));
            self.live[c as usize] -= 1;
            self.live_total -= 1;
            let new = self.take(COMPACTION, key, h);
            if moved(s as u32, key, h, new, was) {
                self.set_mapped(new as usize);
            }
        }
        debug_assert_eq!(self.live[c as usize], 0);
        if self.owner[c as usize] == NONE {
            self.free.push(c);
        }
    }

    /// Streams that have had an open chunk.
    pub(super) fn streams(&self) -> usize {
        self.open.len()
    }

    /// Live slots.
    pub(super) fn live(&self) -> usize {
        self.live_total
    }

    /// Slots in chunks in use (open or holding a live key).
    pub(super) fn slots_used(&self) -> usize {
        (self.live.len() - self.free.len()) * CHUNK
    }

    /// Checks the chunks' counts against the slots; panics naming the
    /// count that is wrong.
    pub(super) fn check(&self) {
        let mut live = vec![0u32; self.live.len()];
        for (s, &h) in self.holders.iter().enumerate() {
            if h != 0 {
                live[s / CHUNK] += 1;
            }
        }
        assert_eq!(live, self.live, "runs: live counts per chunk");
        for (s, &h) in self.holders.iter().enumerate() {
            assert!(h != 0 || !self.mapped(s), "runs: dead slot {s} is not mapped");
        }
        assert_eq!(self.live_total, live.iter().map(|&l| l as usize).sum::<usize>(), "runs: live total");
        for &c in &self.free {
            assert_eq!(self.live[c as usize], 0, "runs: a free chunk is empty");
            assert_eq!(self.owner[c as usize], NONE, "runs: a free chunk has no owner");
        }
    }

    /// Bytes allocated.
    pub(super) fn bytes(&self) -> usize {
        self.keys.capacity() * 8
            + self.holders.capacity() * 4
            + self.mapped.capacity() * 8
            + self.live.capacity() * 4
            + self.owner.capacity() * 4
            + self.free.capacity() * 4
            + self.open.capacity() * std::mem::size_of::<Open>()
    }
}
