//! The block pool: the free pages and the eviction order (LRU) of each tier,
//! and the types of the copies between pages ([`PageRef`], [`BlockCopy`],
//! [`copy_waves`]).
//!
//! Only [`KvCache`](super::KvCache) holds a pool: which page is free and
//! which block is next to evict must change together with the block rows
//! and the prefix index, so the pool's types are visible to the resources
//! module alone (`pub(super)`) and every change goes through a cache verb.

use crate::ids::BlockId;
use crate::tables::{KvBlock, LruLinks};
use crate::tier::Tier;
use slotmap::SlotMap;

/// A page in one tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageRef {
    /// The tier.
    pub medium: Tier,
    /// The page index within the tier.
    pub page: u32,
}

/// A copy of KV data between two pages that the step's copy system performs
/// in one batched launch (offload, onboard, partial reuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    /// Source page.
    pub src: PageRef,
    /// Destination page.
    pub dst: PageRef,
    /// Leading tokens to copy: the whole block, or a prefix for partial reuse.
    pub tokens: u32,
    /// The KV cache group whose pages these are (0 for an engine that is not
    /// hybrid): each group has its own pages, so page `p` of two groups are
    /// two pages.
    pub group: u32,
}

/// Splits an ordered list of copies into waves that may each run as one
/// batched launch: a new wave starts whenever a copy would read or write a
/// page that an earlier copy of the current wave writes, or write a page that
/// it reads. Running the waves in order gives the same result as running the
/// copies one by one (an offload that frees a device page and an onboard that
/// fills it in the same step stay ordered). Returns the end index of each wave.
pub fn copy_waves(copies: &[BlockCopy]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut reads = ahash::AHashSet::new();
    let mut writes = ahash::AHashSet::new();
    for (i, c) in copies.iter().enumerate() {
        let (src, dst) = ((c.group, c.src), (c.group, c.dst));
        if writes.contains(&src) || writes.contains(&dst) || reads.contains(&dst) {
            ends.push(i);
            reads.clear();
            writes.clear();
        }
        reads.insert(src);
        writes.insert(dst);
    }
    if !copies.is_empty() {
        ends.push(copies.len());
    }
    ends
}

/// An LRU list of blocks threaded through the block table's rows
/// ([`LruLinks`]): O(1) push, removal and pop, touching only the rows
/// involved. Each tier has one; a row's tier says which list it is in.
#[derive(Debug, Default)]
pub(super) struct BlockLru {
    head: Option<BlockId>,
    tail: Option<BlockId>,
    len: usize,
}

impl BlockLru {
    /// Blocks listed.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Appends `id` as the most recently used.
    #[inline]
    pub(super) fn push_back(&mut self, rows: &mut SlotMap<BlockId, KvBlock>, id: BlockId) {
        debug_assert!(!rows[id].lru.linked, "a block is listed at most once");
        rows[id].lru = LruLinks { prev: self.tail, next: None, linked: true };
        match self.tail {
            Some(t) => rows[t].lru.next = Some(id),
            None => self.head = Some(id),
        }
        self.tail = Some(id);
        self.len += 1;
    }

    /// Unlinks `id`; returns whether it was listed.
    pub(super) fn remove(&mut self, rows: &mut SlotMap<BlockId, KvBlock>, id: BlockId) -> bool {
        let Some(b) = rows.get_mut(id) else { return false };
        if !b.lru.linked {
            return false;
        }
        let l = std::mem::take(&mut b.lru);
        self.unlink(rows, l);
        true
    }

    /// Joins the neighbours of a block whose links are `l` (its row already
    /// taken out of `rows`, or its links already cleared).
    pub(super) fn unlink(&mut self, rows: &mut SlotMap<BlockId, KvBlock>, l: LruLinks) {
        debug_assert!(l.linked, "only a listed block is unlinked");
        match l.prev {
            Some(p) => rows[p].lru.next = l.next,
            None => self.head = l.next,
        }
        match l.next {
            Some(n) => rows[n].lru.prev = l.prev,
            None => self.tail = l.prev,
        }
        self.len -= 1;
    }

    /// Forgets the first `count` blocks of the list, whose rows the caller
    /// took out of `rows`: `next`, the block that followed them (`None`
    /// when none did), becomes the front.
    pub(super) fn cut_front(&mut self, rows: &mut SlotMap<BlockId, KvBlock>, next: Option<BlockId>, count: usize) {
        if count == 0 {
            return;
        }
        self.len -= count;
        self.head = next;
        match next {
            Some(n) => rows[n].lru.prev = None,
            None => self.tail = None,
        }
    }

    /// The least recently used block, left listed.
    pub(super) fn front(&self) -> Option<BlockId> {
        self.head
    }
}

/// The free pages of one tier.
///
/// A page that a copy queued this step reads or writes (the device page of an
/// offload, the host page of an onboard, ...) is *cooling* once freed: it is
/// free, but it is handed out only once no other page is, and it joins the
/// other free pages when the step closes ([`FreePages::settle`]). Writing
/// into it in the same step would make the copy waves ([`copy_waves`]) cut
/// the step's copies in two launches; keeping clear of it lets a step's
/// offloads and onboards go in one launch, both directions of PCIe at once.
/// Fresh blocks, which only the forward pass writes (after every copy), take
/// cooling pages first ([`FreePages::pop_for_compute`]), leaving the others
/// to copies.
#[derive(Debug)]
pub(super) struct FreePages {
    /// Free pages no queued copy touches.
    ready: Ready,
    /// Free pages a queued copy touches.
    cooling: Vec<u32>,
    /// Bit `p` set: a copy queued this step touches page `p`.
    touched: Vec<u64>,
    /// The pages whose bit is set, to clear them when the step closes.
    touched_list: Vec<u32>,
}

/// The order in which ready pages are handed out.
#[derive(Debug)]
enum Ready {
    /// The most recently freed first (device pages: warm in caches, and
    /// their order does not matter to copies).
    Stack(Vec<u32>),
    /// The next free page at or after the last one handed out, wrapping
    /// around (host pages: consecutive offloads take consecutive pages while
    /// the tier has runs of free ones, so the copy engines move long runs).
    Ring {
        /// Bit `p` set: page `p` is free.
        bits: Vec<u64>,
        /// Where the next search starts.
        cursor: u32,
        /// Pages free.
        count: usize,
    },
}

impl Ready {
    fn len(&self) -> usize {
        match self {
            Ready::Stack(v) => v.len(),
            Ready::Ring { count, .. } => *count,
        }
    }

    fn push(&mut self, page: u32) {
        match self {
            Ready::Stack(v) => v.push(page),
            Ready::Ring { bits, count, .. } => {
                let (w, b) = (page as usize / 64, page % 64);
                debug_assert!(bits[w] & (1 << b) == 0, "page {page} freed twice");
                bits[w] |= 1 << b;
                *count += 1;
            }
        }
    }

    fn pop(&mut self) -> Option<u32> {
        match self {
            Ready::Stack(v) => v.pop(),
            Ready::Ring { bits, cursor, count } => {
                if *count == 0 {
                    return None;
                }
                let words = bits.len();
                let start = (*cursor as usize / 64) % words;
                // The start word masked to bits at or after the cursor, then
                // every word once around, then the start word's low bits.
                let first = bits[start] & (!0u64 << (*cursor % 64));
                let found = std::iter::once((start, first))
                    .chain((1..words).map(|i| ((start + i) % words, bits[(start + i) % words])))
                    .chain(std::iter::once((start, bits[start])))
                    .find(|&(_, w)| w != 0)
                    .map(|(i, w)| i * 64 + w.trailing_zeros() as usize)
                    .expect("count > 0, so a bit is set");
                bits[found / 64] &= !(1u64 << (found % 64));
                *count -= 1;
                *cursor = found as u32 + 1;
                Some(found as u32)
            }
        }
    }

    fn append(&mut self, pages: &mut Vec<u32>) {
        for p in pages.drain(..) {
            self.push(p);
        }
    }
}

impl FreePages {
    /// Every page of `0..pages` free, handed out most recently freed first
    /// (page 0 first while none was freed).
    pub(super) fn stack(pages: u32) -> Self {
        Self::with_ready(pages, Ready::Stack((0..pages).rev().collect()))
    }

    fn with_ready(pages: u32, ready: Ready) -> Self {
        let words = (pages as usize).div_ceil(64);
        Self { ready, cooling: Vec::new(), touched: vec![0; words], touched_list: Vec::new() }
    }

    /// Every page of `0..pages` free, handed out in address order from where
    /// the last one was taken, wrapping around (page 0 first).
    pub(super) fn ring(pages: u32) -> Self {
        let words = (pages as usize).div_ceil(64).max(1);
        let mut bits = vec![!0u64; words];
        let tail = pages as usize % 64;
        if tail != 0 {
            bits[words - 1] = (1u64 << tail) - 1;
        }
        if pages == 0 {
            bits[0] = 0;
        }
        Self::with_ready(pages, Ready::Ring { bits, cursor: 0, count: pages as usize })
    }

    /// Free pages, cooling ones included.
    pub(super) fn len(&self) -> usize {
        self.ready.len() + self.cooling.len()
    }

    /// A free page for a copy to write: one no queued copy touches, if any.
    pub(super) fn pop(&mut self) -> Option<u32> {
        self.ready.pop().or_else(|| self.cooling.pop())
    }

    /// A free page for a fresh block, which no copy writes: a cooling page
    /// first, keeping the others for copies.
    pub(super) fn pop_for_compute(&mut self) -> Option<u32> {
        self.cooling.pop().or_else(|| self.ready.pop())
    }

    /// [`FreePages::pop_for_compute`] `n` times, handing each page to `take`
    /// in the order those calls would have returned them, in one pass:
    /// cooling pages first, then ready ones (a stack's in bulk). The tier
    /// has `n` free pages.
    pub(super) fn pop_many_for_compute(&mut self, n: usize, mut take: impl FnMut(u32)) {
        let cooled = self.cooling.len().min(n);
        let from = self.cooling.len() - cooled;
        self.cooling.drain(from..).rev().for_each(&mut take);
        let rest = n - cooled;
        match &mut self.ready {
            Ready::Stack(v) => {
                let from = v.len().checked_sub(rest).expect("the caller counted the free pages");
                v.drain(from..).rev().for_each(take);
            }
            ring => {
                for _ in 0..rest {
                    take(ring.pop().expect("the caller counted the free pages"));
                }
            }
        }
    }

    /// Notes that a copy queued this step reads or writes `page`.
    pub(super) fn touch(&mut self, page: u32) {
        let (w, b) = (page as usize / 64, page % 64);
        if self.touched[w] & (1 << b) == 0 {
            self.touched[w] |= 1 << b;
            self.touched_list.push(page);
        }
    }

    /// Whether a copy queued this step reads or writes `page`.
    #[inline]
    pub(super) fn is_touched(&self, page: u32) -> bool {
        self.touched[page as usize / 64] & (1 << (page % 64)) != 0
    }

    /// Frees a page: cooling when a copy queued this step touches it.
    #[inline]
    pub(super) fn release(&mut self, page: u32) {
        if self.is_touched(page) {
            self.cooling.push(page);
        } else {
            self.ready.push(page);
        }
    }

    /// Closes the step: its copies are handed out and run before the next
    /// step's, so no page is touched any more and every cooling page is an
    /// ordinary free page again.
    pub(super) fn settle(&mut self) {
        for p in self.touched_list.drain(..) {
            self.touched[p as usize / 64] = 0;
        }
        self.ready.append(&mut self.cooling);
    }
}

/// Free pages and eviction order of each tier. The fields are private: a
/// page's freedom and a block's LRU membership change only through the
/// cache's verbs, which update the block's row in the same call.
#[derive(Debug)]
pub(super) struct BlockPool {
    /// Free device pages.
    free_device: FreePages,
    /// Free host pages.
    free_host: FreePages,
    /// Unreferenced indexed device blocks, least recently used first.
    lru_device: BlockLru,
    /// Indexed host blocks, least recently used first.
    lru_host: BlockLru,
    /// Device pages in all.
    pages_device: u32,
    /// Host pages in all.
    pages_host: u32,
}

impl BlockPool {
    /// Every page of both tiers free, both LRUs empty.
    pub(super) fn new(pages_device: u32, pages_host: u32) -> Self {
        Self {
            // Page 0 is handed out first, which keeps demos readable.
            free_device: FreePages::stack(pages_device),
            free_host: FreePages::ring(pages_host),
            lru_device: BlockLru::default(),
            lru_host: BlockLru::default(),
            pages_device,
            pages_host,
        }
    }

    /// Free pages of a tier.
    pub(super) fn free(&mut self, medium: Tier) -> &mut FreePages {
        match medium {
            Tier::Device => &mut self.free_device,
            Tier::Host => &mut self.free_host,
        }
    }

    /// Free pages of a tier, read only.
    pub(super) fn free_ref(&self, medium: Tier) -> &FreePages {
        match medium {
            Tier::Device => &self.free_device,
            Tier::Host => &self.free_host,
        }
    }

    /// Closes the step for both tiers ([`FreePages::settle`]).
    pub(super) fn settle(&mut self) {
        self.free_device.settle();
        self.free_host.settle();
    }

    /// The LRU of a tier.
    pub(super) fn lru(&mut self, medium: Tier) -> &mut BlockLru {
        match medium {
            Tier::Device => &mut self.lru_device,
            Tier::Host => &mut self.lru_host,
        }
    }

    /// The LRU of a tier, read only.
    pub(super) fn lru_ref(&self, medium: Tier) -> &BlockLru {
        match medium {
            Tier::Device => &self.lru_device,
            Tier::Host => &self.lru_host,
        }
    }

    /// Pages of a tier in all.
    pub(super) fn pages(&self, medium: Tier) -> u32 {
        match medium {
            Tier::Device => self.pages_device,
            Tier::Host => self.pages_host,
        }
    }
}

/// A copy between (tier, page) pairs, for tests.
#[cfg(test)]
pub(crate) fn test_copy(src: (Tier, u32), dst: (Tier, u32), tokens: u32) -> BlockCopy {
    BlockCopy {
        src: PageRef { medium: src.0, page: src.1 },
        dst: PageRef { medium: dst.0, page: dst.1 },
        tokens,
        group: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(src: (Tier, u32), dst: (Tier, u32)) -> BlockCopy {
        test_copy(src, dst, 1)
    }

    /// The ring hands out host pages in address order from where it last
    /// took one, wrapping around, whatever order they were freed in; the
    /// stack hands out the most recently freed device page first.
    #[test]
    fn ring_hands_out_pages_in_address_order() {
        let mut ring = FreePages::ring(70);
        let taken: Vec<u32> = (0..68).map(|_| ring.pop().unwrap()).collect();
        assert_eq!(taken, (0..68).collect::<Vec<_>>());
        for p in [3, 66, 1, 2, 40] {
            ring.release(p);
        }
        // From page 68 on: 68, 69, then around: 1, 2, 3, 40, 66.
        let order: Vec<u32> = std::iter::from_fn(|| ring.pop()).collect();
        assert_eq!(order, vec![68, 69, 1, 2, 3, 40, 66]);
        assert_eq!(ring.len(), 0);
        let mut stack = FreePages::stack(4);
        assert_eq!((stack.pop(), stack.pop()), (Some(0), Some(1)));
        stack.release(0);
        assert_eq!(stack.pop(), Some(0));
        assert_eq!(FreePages::ring(0).pop(), None);
        assert_eq!(FreePages::ring(64).len(), 64);
    }

    /// Taking many pages for compute in one pass hands out the same pages
    /// in the same order as taking them one at a time: cooling pages first,
    /// then ready ones (a stack's most recently freed first, a ring's in
    /// address order from its cursor).
    #[test]
    fn many_pages_for_compute_come_as_one_at_a_time() {
        let fill = |f: &mut FreePages| {
            for _ in 0..6 {
                f.pop();
            }
            for p in [4, 1, 5] {
                f.touch(p);
                f.release(p);
            }
            f.release(0);
        };
        for make in [FreePages::stack as fn(u32) -> FreePages, FreePages::ring] {
            for n in [0, 2, 3, 5, 7] {
                let (mut one, mut many) = (make(10), make(10));
                fill(&mut one);
                fill(&mut many);
                let expected: Vec<u32> = (0..n).map(|_| one.pop_for_compute().unwrap()).collect();
                let mut taken = Vec::new();
                many.pop_many_for_compute(n, |p| taken.push(p));
                assert_eq!(taken, expected, "{n} pages");
                assert_eq!(many.len(), one.len());
                assert_eq!(
                    std::iter::from_fn(|| many.pop()).collect::<Vec<_>>(),
                    std::iter::from_fn(|| one.pop()).collect::<Vec<_>>()
                );
            }
        }
    }

    /// A page freed while a queued copy touches it cools: copies get the
    /// other free pages first, fresh blocks get it first, and it is an
    /// ordinary free page once the step closes.
    #[test]
    fn touched_pages_cool_until_the_step_closes() {
        for mut free in [FreePages::stack(8), FreePages::ring(8)] {
            let pages: Vec<u32> = (0..8).map(|_| free.pop().unwrap()).collect();
            free.touch(pages[5]);
            assert!(free.is_touched(pages[5]) && !free.is_touched(pages[4]));
            free.release(pages[5]);
            free.release(pages[4]);
            assert_eq!(free.len(), 2);
            assert_eq!(free.pop(), Some(pages[4]), "a copy gets the untouched page");
            assert_eq!(free.pop(), Some(pages[5]), "and the cooling one only when none is left");
            free.touch(pages[1]);
            free.release(pages[1]);
            free.release(pages[2]);
            assert_eq!(free.pop_for_compute(), Some(pages[1]), "a fresh block gets the cooling page first");
            free.touch(pages[3]);
            free.release(pages[3]);
            free.settle();
            assert!(!free.is_touched(pages[3]));
            free.release(pages[1]);
            assert_eq!(free.len(), 3);
            // Settled, page 3 is as free as any: a fresh block takes a ready page.
            assert!(free.pop_for_compute().is_some());
        }
    }

    /// Independent copies share one wave; an onboard into a page that an
    /// offload of the same step reads, or a chain through one page, splits.
    #[test]
    fn waves_split_only_at_hazards() {
        use Tier::{Device, Host};
        assert_eq!(copy_waves(&[]), Vec::<usize>::new());
        assert_eq!(copy_waves(&[copy((Device, 1), (Host, 1)), copy((Device, 2), (Host, 2))]), vec![2]);
        // Offload reads GPU page 1; onboard writes GPU page 1: write-after-read.
        assert_eq!(copy_waves(&[copy((Device, 1), (Host, 1)), copy((Host, 9), (Device, 1))]), vec![1, 2]);
        // A copy reading what the previous one wrote: read-after-write.
        assert_eq!(copy_waves(&[copy((Host, 9), (Device, 3)), copy((Device, 3), (Device, 4))]), vec![1, 2]);
        // Two writes to one page: write-after-write.
        assert_eq!(
            copy_waves(&[
                copy((Device, 1), (Device, 5)),
                copy((Device, 2), (Device, 5)),
                copy((Device, 7), (Device, 8))
            ]),
            vec![1, 3]
        );
    }
}
