//! Host-tier copies by the copy engines (DMA) instead of thread blocks.
//!
//! A wave's copies that touch the host tier become lists of byte runs
//! (destination, source, length), one per (copy, region, plane), with runs
//! that continue each other merged. Each direction is then one call of the
//! driver's batched copy (`cuMemcpyBatchAsync`, CUDA 12.8 and later) on its
//! own stream, so offload and onboard run on the two copy engines at once and
//! use no SM at all: inference keeps the whole GPU.
//!
//! Where the driver lacks the batched call, each run is one `cuMemcpyAsync`
//! on the same stream (slower for many small runs, same result).

use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{CudaStream, sys};

use super::error::GpuError;
use super::pool::{BlockGeometry, CopyOp};

/// Byte runs for one direction, merged where they continue each other.
#[derive(Debug, Default, Clone)]
pub(super) struct RunList {
    pub(super) dsts: Vec<u64>,
    pub(super) srcs: Vec<u64>,
    pub(super) sizes: Vec<usize>,
}

impl RunList {
    /// Runs after merging.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// Bytes the list moves.
    pub fn bytes(&self) -> u64 {
        self.sizes.iter().map(|s| *s as u64).sum()
    }

    pub(super) fn push(&mut self, dst: u64, src: u64, n: u64) {
        if n == 0 {
            return;
        }
        if let (Some(d), Some(s), Some(z)) = (self.dsts.last(), self.srcs.last(), self.sizes.last_mut())
            && *d + *z as u64 == dst
            && *s + *z as u64 == src
        {
            *z += n as usize;
            return;
        }
        self.dsts.push(dst);
        self.srcs.push(src);
        self.sizes.push(n as usize);
    }
}

/// Where pages are: each end's region bases and page stride. Bases are
/// device addresses; the host tier's are its device-mapped addresses, which
/// unified addressing makes valid for the copy engines too.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ends<'a> {
    pub(super) device_bases: &'a [u64],
    pub(super) device_stride: u64,
    pub(super) host_bases: &'a [u64],
    pub(super) host_stride: u64,
}

impl Ends<'_> {
    /// The address of `page` of `region` in the host tier (`host`) or the device pool.
    fn addr(&self, host: bool, region: usize, page: u32) -> u64 {
        if host {
            self.host_bases[region] + page as u64 * self.host_stride
        } else {
            self.device_bases[region] + page as u64 * self.device_stride
        }
    }
}

/// Builds the runs of `ops` (region after region, copies in order, so that
/// consecutive pages merge).
pub(super) fn runs(g: &BlockGeometry, ops: &[CopyOp], ends: &Ends<'_>) -> RunList {
    let mut list = RunList::default();
    let plane = g.plane_bytes();
    for r in 0..g.regions as usize {
        for op in ops {
            let src = ends.addr(op.media & 1 != 0, r, op.src_page);
            let dst = ends.addr(op.media & 2 != 0, r, op.dst_page);
            if op.tokens >= g.tokens_per_block {
                list.push(dst, src, g.block_bytes);
            } else {
                let n = op.tokens as u64 * g.token_bytes();
                for p in 0..g.planes as u64 {
                    list.push(dst + p * plane, src + p * plane, n);
                }
            }
        }
    }
    list
}

/// A device-side segment of the staged path (`Seg` in `cuda/block_copy.cu`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct Seg {
    pub(super) dst: u64,
    pub(super) src: u64,
    pub(super) len: u64,
}

/// A whole block of the staged path (`BlockSeg` in `cuda/block_copy.cu`):
/// the staging address of its first region (the others follow, block_bytes
/// apart) and its device page.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct BlockSeg {
    pub(super) slot: u64,
    pub(super) page: u32,
    pub(super) pad: u32,
}

/// One piece of a staged direction: the segments (or whole blocks) that
/// fill (offload) or empty (onboard) one staging slot, and the copy engine's
/// runs between that slot and the host tier.
#[derive(Debug, Clone)]
pub(super) struct StagedPiece {
    pub(super) seg_first: usize,
    pub(super) seg_count: usize,
    pub(super) runs: RunList,
}

/// One direction of a wave on the staged path: the copies sorted by host
/// address, laid out back to back in staging slots (piece i in slot i mod
/// slots), so that the copy engine moves runs of consecutive host pages
/// whatever the device pages are, and a gather (offload) or scatter
/// (onboard) kernel moves the scattered device pages to or from the slot.
///
/// When every copy of the direction is a whole block and the host tier is
/// block-major, the plan is one `BlockSeg` per block (`blocks`, with
/// `block_span` bytes each) instead of a segment per block and region: a
/// 512 MiB direction of 8 KiB blocks over 32 regions is 2 048 records to
/// build and upload instead of 65 536.
#[derive(Debug, Clone, Default)]
pub(super) struct StagedList {
    pub(super) segs: Vec<Seg>,
    pub(super) blocks: Vec<BlockSeg>,
    pub(super) block_span: u64,
    pub(super) pieces: Vec<StagedPiece>,
}

impl StagedList {
    /// Whether the direction has nothing to move.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty() && self.blocks.is_empty()
    }

    /// Whether the plan is in whole blocks (`blocks`) rather than segments.
    pub fn whole_blocks(&self) -> bool {
        !self.blocks.is_empty()
    }

    /// Runs the copy engine moves, over all pieces.
    pub fn host_runs(&self) -> usize {
        self.pieces.iter().map(|p| p.runs.len()).sum()
    }

    /// Pieces (staging slot fills).
    #[cfg(test)]
    pub fn pieces(&self) -> usize {
        self.pieces.len()
    }

    /// Bytes moved.
    pub fn bytes(&self) -> u64 {
        self.segs.iter().map(|s| s.len).sum::<u64>() + self.blocks.len() as u64 * self.block_span
    }
}

/// Builds the staged plan of one direction: `to_host` for offload (ops of
/// media 2), else onboard (media 1). `slots` are the staging slots' device
/// addresses, each `slot_bytes` long. `None` when a single segment does not
/// fit in a slot.
pub(super) fn staged(
    g: &BlockGeometry,
    ops: &[CopyOp],
    ends: &Ends<'_>,
    to_host: bool,
    slots: &[u64],
    slot_bytes: u64,
    whole_blocks: bool,
) -> Option<StagedList> {
    // (host address, device address, length), one per (copy, region, plane
    // run), wanted in host address order. Sorting the copies by host page
    // and walking them page-major (a block-major tier: a page's regions lie
    // within one page stride) or region-major (each region's pages apart)
    // gives that order without sorting every entry (a 1 GiB wave of 8 KiB
    // blocks has 65 536); a final check sorts only if a layout fits neither.
    let plane = g.plane_bytes();
    let host_page = |op: &CopyOp| if to_host { op.dst_page } else { op.src_page };
    let mut sorted: Vec<CopyOp> = ops.to_vec();
    sorted.sort_by_key(host_page);
    let mut regions: Vec<usize> = (0..g.regions as usize).collect();
    regions.sort_by_key(|r| ends.host_bases[*r]);
    let (lo, hi) = (ends.host_bases[regions[0]], ends.host_bases[*regions.last().expect("at least one region")]);
    let page_major = hi - lo + g.block_bytes <= ends.host_stride;
    let span = g.block_bytes * g.regions as u64;
    let block_major = (0..g.regions as usize).all(|r| ends.host_bases[r] == lo + r as u64 * g.block_bytes);
    if whole_blocks
        && block_major
        && ends.host_stride == span
        && sorted.iter().all(|op| op.tokens >= g.tokens_per_block)
    {
        if span > slot_bytes || slots.is_empty() {
            return None;
        }
        let mut list = StagedList { block_span: span, ..StagedList::default() };
        let mut slot = SlotFill::new(slots, slot_bytes, to_host);
        for op in &sorted {
            let (hp, dp) = if to_host { (op.dst_page, op.src_page) } else { (op.src_page, op.dst_page) };
            let at = slot.place(&mut list.pieces, list.blocks.len(), ends.addr(true, 0, hp), span);
            list.blocks.push(BlockSeg { slot: at, page: dp, pad: 0 });
        }
        return Some(list);
    }
    let mut entries: Vec<(u64, u64, u64)> = Vec::with_capacity(ops.len() * g.regions as usize);
    let mut push = |op: &CopyOp, r: usize| {
        let (hp, dp) = if to_host { (op.dst_page, op.src_page) } else { (op.src_page, op.dst_page) };
        let (h, d) = (ends.addr(true, r, hp), ends.addr(false, r, dp));
        if op.tokens >= g.tokens_per_block {
            entries.push((h, d, g.block_bytes));
        } else {
            let n = op.tokens as u64 * g.token_bytes();
            if n > 0 {
                for p in 0..g.planes as u64 {
                    entries.push((h + p * plane, d + p * plane, n));
                }
            }
        }
    };
    if page_major {
        for op in &sorted {
            for r in &regions {
                push(op, *r);
            }
        }
    } else {
        for r in &regions {
            for op in &sorted {
                push(op, *r);
            }
        }
    }
    if entries.iter().any(|e| e.2 > slot_bytes) || slots.is_empty() {
        return None;
    }
    if !entries.is_sorted_by_key(|e| e.0) {
        entries.sort_unstable_by_key(|e| e.0);
    }
    let mut list = StagedList::default();
    let mut slot = SlotFill::new(slots, slot_bytes, to_host);
    for (h, d, len) in entries {
        let at = slot.place(&mut list.pieces, list.segs.len(), h, len);
        list.segs.push(if to_host { Seg { dst: at, src: d, len } } else { Seg { dst: d, src: at, len } });
    }
    Some(list)
}

/// Lays a staged direction's records back to back in the staging slots: a
/// piece per slot fill, piece i in slot i mod slots.
struct SlotFill<'a> {
    slots: &'a [u64],
    slot_bytes: u64,
    to_host: bool,
    fill: u64,
}

impl<'a> SlotFill<'a> {
    fn new(slots: &'a [u64], slot_bytes: u64, to_host: bool) -> Self {
        // A full slot, so that the first record starts a piece.
        Self { slots, slot_bytes, to_host, fill: slot_bytes }
    }

    /// Places `len` bytes bound for (or from) host address `host` after the
    /// current piece's, starting a new piece in the next slot when they do
    /// not fit; adds the copy engine's run and counts the record (`record`,
    /// its index in the records list) in the piece. Returns the bytes'
    /// staging address. `len` must fit in a slot.
    fn place(&mut self, pieces: &mut Vec<StagedPiece>, record: usize, host: u64, len: u64) -> u64 {
        if self.fill + len > self.slot_bytes {
            pieces.push(StagedPiece { seg_first: record, seg_count: 0, runs: RunList::default() });
            self.fill = 0;
        }
        let at = self.slots[(pieces.len() - 1) % self.slots.len()] + self.fill;
        let piece = pieces.last_mut().expect("a piece was just started");
        if self.to_host {
            piece.runs.push(host, at, len);
        } else {
            piece.runs.push(at, host, len);
        }
        piece.seg_count += 1;
        self.fill += len;
        at
    }
}

/// Average host run (bytes) from which [`HostCopyPath::Auto`](super::HostCopyPath)
/// takes the staged path for a direction whose device pages are scattered
/// (in a two-way wave of at least [`STAGED_MIN_BYTES`] each way).
/// Measured on an H200 (both ways, 1 GiB, 32 regions, host pages in runs of
/// k consecutive pages in random order, so that a direction's sorted runs
/// average about 2k pages): with 8 and 16
/// KiB blocks the kernel (78-80 GB/s whatever the runs) stays ahead up to
/// runs of about 128 KiB (staged 72-73), the two are even near 256 KiB (81
/// against 80 for 16 KiB blocks), and the staged path leads from there on
/// (86-93 at 256 KiB to 1 MiB); with 64 KiB blocks, 128 KiB runs gave 84
/// staged against 80 (and 71-78 against 78-79 in an earlier run on other
/// machines: even). The threshold sits between 128 and 256 KiB.
pub const STAGED_LONG_RUN: u64 = 192 << 10;

/// Bytes each direction of a two-way wave must move for
/// [`HostCopyPath::Auto`](super::HostCopyPath) to take the staged path.
/// Measured on an H200, the wall clock of preparing, launching and finishing fully scattered
/// two-way waves of 64 KiB blocks: the staged path 10 % behind the kernel
/// at 8 MiB each way, even from 16 MiB; and every one-way wave, and the
/// replayed engine waves of about 2 MiB, ran slower staged.
pub const STAGED_MIN_BYTES: u64 = 16 << 20;

/// Average run length (bytes) from which the copy engines beat the kernel
/// for a wave's host copies ([`HostCopyPath::Auto`](super::HostCopyPath)).
pub const LONG_RUN: u64 = 256 << 10;

/// Whether the batched call worked the last time it was tried (false once it
/// failed or was missing, after which the loop of single copies is used).
static BATCH_API_OK: AtomicBool = AtomicBool::new(true);

/// Whether the driver's batched copy is in use (for reports).
pub fn batch_api_in_use() -> bool {
    BATCH_API_OK.load(Ordering::Relaxed)
}

/// Enqueues `list` on `stream`.
///
/// # Safety
/// Every run must lie inside live allocations (device memory of the
/// stream's context, or mapped pinned host memory) that stay allocated
/// until the stream has passed this point, and no two runs of the list may
/// write overlapping bytes or write bytes another run reads.
pub(super) unsafe fn enqueue(list: &RunList, stream: &CudaStream) -> Result<(), GpuError> {
    if list.is_empty() {
        return Ok(());
    }
    if BATCH_API_OK.load(Ordering::Relaxed) {
        let mut attrs = [sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID, id: 0 },
            dstLocHint: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_INVALID, id: 0 },
            flags: 0,
        }];
        let mut idx = [0usize];
        let count = list.len();
        let cu_stream = stream.cu_stream();
        // The driver only reads the three arrays (inputs, declared without
        // const in the C header).
        let (dsts, srcs, sizes) =
            (list.dsts.as_ptr().cast_mut(), list.srcs.as_ptr().cast_mut(), list.sizes.as_ptr().cast_mut());
        // cudarc resolves the symbol on first use and panics if the driver
        // lacks it; that becomes "not available" here.
        let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the three arrays hold `count` entries each and live for
            // the call (the driver reads them before returning and never
            // writes them, so the const-to-mut casts are sound); one
            // attribute applies to every run (index 0); the runs' memory is
            // valid by this function's contract; the stream is a created
            // (non-legacy) stream of the current context.
            unsafe {
                sys::cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, attrs.as_mut_ptr(), idx.as_mut_ptr(), 1, cu_stream)
            }
        }));
        match called {
            Ok(sys::CUresult::CUDA_SUCCESS) => return Ok(()),
            _ => BATCH_API_OK.store(false, Ordering::Relaxed),
        }
    }
    for i in 0..list.len() {
        // SAFETY: as above, for one run.
        unsafe { sys::cuMemcpyAsync(list.dsts[i], list.srcs[i], list.sizes[i], stream.cu_stream()) }.result()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of consecutive pages merge, prefix copies give one run per plane,
    /// and every byte of every copy is covered exactly once.
    #[test]
    fn runs_merge_and_cover() {
        let g = BlockGeometry { regions: 2, block_bytes: 64, planes: 2, tokens_per_block: 4 };
        let dev = [0x1000u64, 0x2000];
        let host = [0x9000u64, 0xA000];
        let ops = [
            CopyOp { src_page: 0, dst_page: 3, tokens: 4, media: 2 },
            CopyOp { src_page: 1, dst_page: 4, tokens: 4, media: 2 },
            CopyOp { src_page: 5, dst_page: 0, tokens: 1, media: 1 },
        ];
        let ends = Ends { device_bases: &dev, device_stride: 64, host_bases: &host, host_stride: 64 };
        let l = runs(&g, &ops, &ends);
        // Per region: one merged run of two pages, then two plane runs of 8 bytes.
        assert_eq!(l.sizes, vec![128, 8, 8, 128, 8, 8]);
        assert_eq!(l.dsts[0], 0x9000 + 3 * 64);
        assert_eq!(l.srcs[0], 0x1000);
        assert_eq!((l.dsts[2], l.srcs[2]), (0x1000 + 32, 0x9000 + 5 * 64 + 32));
        assert_eq!(l.bytes(), 2 * (128 + 16));
    }

    /// The staged plan sorts copies by host page, so consecutive host pages
    /// form one run whatever the device pages are; pieces never overflow a
    /// slot, alternate between slots, and every copy's bytes appear once.
    #[test]
    fn staged_runs_follow_host_pages() {
        let g = BlockGeometry { regions: 1, block_bytes: 64, planes: 1, tokens_per_block: 4 };
        let (dev, host) = ([0x1000u64], [0x9000u64]);
        let ends = Ends { device_bases: &dev, device_stride: 64, host_bases: &host, host_stride: 64 };
        // Offload device pages 7, 2, 5, 0 to host pages 3, 1, 2, 0 (in host order: 0..=3).
        let ops: Vec<CopyOp> = [(7, 3), (2, 1), (5, 2), (0, 0)]
            .map(|(s, d)| CopyOp { src_page: s, dst_page: d, tokens: 4, media: 2 })
            .to_vec();
        let slots = [0x100000u64, 0x200000];
        let l = staged(&g, &ops, &ends, true, &slots, 192, true).unwrap();
        assert_eq!(l.pieces(), 2, "three blocks fill a slot of 192 bytes");
        assert_eq!(l.host_runs(), 2, "one run per piece");
        let p0 = &l.pieces[0];
        assert_eq!((p0.runs.dsts[0], p0.runs.srcs[0], p0.runs.sizes[0]), (0x9000, 0x100000, 192));
        assert_eq!(l.pieces[1].runs.srcs[0], 0x200000, "the second piece goes to the second slot");
        // One region: every copy is a whole block, one record each.
        let gathered: Vec<u32> = l.blocks.iter().map(|b| b.page).collect();
        assert_eq!(gathered, vec![0, 2, 5, 7]);
        assert_eq!(l.bytes(), 4 * 64);
        // Onboard: the segments scatter from the slot into the device pages.
        let on: Vec<CopyOp> = ops.iter().map(|o| CopyOp { src_page: o.dst_page, dst_page: o.src_page, ..*o }).collect();
        let l = staged(&g, &on, &ends, false, &slots, 4096, true).unwrap();
        assert_eq!((l.pieces(), l.host_runs()), (1, 1));
        assert_eq!(l.blocks[3], BlockSeg { slot: 0x100000 + 3 * 64, page: 7, pad: 0 });
        assert!(staged(&g, &ops, &ends, true, &slots, 32, true).is_none(), "a block larger than a slot");
    }

    /// With a block-major host tier (page stride = regions * block_bytes), a
    /// block's regions are adjacent in host memory: the staged plan of fully
    /// scattered blocks merges each block's regions into one copy-engine run
    /// of regions * block_bytes, while a region-major tier gives one run per
    /// region and block.
    #[test]
    fn block_major_host_pages_are_one_run_each() {
        let g = BlockGeometry { regions: 4, block_bytes: 64, planes: 1, tokens_per_block: 4 };
        let dev: Vec<u64> = (0..4).map(|r| 0x10_0000 + r * 64 * 16).collect();
        let block_major: Vec<u64> = (0..4).map(|r| 0x90_0000 + r * 64).collect();
        let region_major: Vec<u64> = (0..4).map(|r| 0x90_0000 + r * 64 * 16).collect();
        // Offload device pages 3, 9, 0 to host pages 11, 2, 7: no two consecutive.
        let ops: Vec<CopyOp> =
            [(3, 11), (9, 2), (0, 7)].map(|(s, d)| CopyOp { src_page: s, dst_page: d, tokens: 4, media: 2 }).to_vec();
        let slots = [0x500_0000u64];
        let bm = Ends { device_bases: &dev, device_stride: 64, host_bases: &block_major, host_stride: 256 };
        let l = staged(&g, &ops, &bm, true, &slots, 1 << 20, true).unwrap();
        assert_eq!(l.host_runs(), 3, "one run per block");
        assert!(l.pieces[0].runs.sizes.iter().all(|s| *s == 256));
        assert_eq!(l.pieces[0].runs.dsts, vec![0x90_0000 + 2 * 256, 0x90_0000 + 7 * 256, 0x90_0000 + 11 * 256]);
        // Whole blocks: one record per block, in host order, its regions
        // back to back in the slot.
        assert!(l.whole_blocks() && l.segs.is_empty());
        let want = [(0x500_0000, 9), (0x500_0000 + 256, 0), (0x500_0000 + 512, 3)];
        assert_eq!(l.blocks, want.map(|(slot, page)| BlockSeg { slot, page, pad: 0 }).to_vec());
        assert_eq!(l.bytes(), 3 * 256);
        // Asked not to, the planner keeps one segment per block and region.
        let segs = staged(&g, &ops, &bm, true, &slots, 1 << 20, false).unwrap();
        assert!(!segs.whole_blocks());
        assert_eq!((segs.segs.len(), segs.host_runs()), (12, 3));
        // A slot of two blocks: two pieces, the second in the next slot.
        let two = staged(&g, &ops, &bm, true, &[0x500_0000, 0x600_0000], 512, true).unwrap();
        assert_eq!(two.pieces.len(), 2);
        assert_eq!(two.blocks[2].slot, 0x600_0000);
        // With a prefix copy among them the plan is per (block, region):
        // the gather reads each region of each device page once.
        let mut mixed = ops.clone();
        mixed[1].tokens = 2;
        let l = staged(&g, &mixed, &bm, true, &slots, 1 << 20, true).unwrap();
        assert!(!l.whole_blocks());
        assert_eq!(l.segs.len(), 12);
        assert_eq!(l.segs[1], Seg { dst: 0x500_0000 + 32, src: dev[1] + 9 * 64, len: 32 });
        assert_eq!(l.bytes(), 2 * 256 + 4 * 32);
        let rm = Ends { device_bases: &dev, device_stride: 64, host_bases: &region_major, host_stride: 64 };
        assert_eq!(
            staged(&g, &ops, &rm, true, &slots, 1 << 20, true).unwrap().host_runs(),
            12,
            "one run per region and block"
        );
        // Direct runs need both ends consecutive: scattered device pages
        // merge nothing whatever the host layout.
        assert_eq!(runs(&g, &ops, &bm).len(), 12);
    }
}
