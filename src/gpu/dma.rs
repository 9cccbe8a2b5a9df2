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

use super::GpuError;
use super::pool::{BlockGeometry, CopyOp};

/// Byte runs for one direction, merged where they continue each other.
#[derive(Debug, Default, Clone)]
pub struct RunList {
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

    fn push(&mut self, dst: u64, src: u64, n: u64) {
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

/// Builds the runs of `ops` (region after region, copies in order, so that
/// consecutive pages merge). Bases are device addresses; the host tier's are
/// its device-mapped addresses, which unified addressing makes valid for the
/// copy engines too.
pub(super) fn runs(g: &BlockGeometry, ops: &[CopyOp], device_bases: &[u64], host_bases: &[u64]) -> RunList {
    let mut list = RunList::default();
    let plane = g.plane_bytes();
    for r in 0..g.regions as usize {
        for op in ops {
            let sb = if op.media & 1 != 0 { host_bases[r] } else { device_bases[r] };
            let db = if op.media & 2 != 0 { host_bases[r] } else { device_bases[r] };
            let src = sb + op.src_page as u64 * g.block_bytes;
            let dst = db + op.dst_page as u64 * g.block_bytes;
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
        let l = runs(&g, &ops, &dev, &host);
        // Per region: one merged run of two pages, then two plane runs of 8 bytes.
        assert_eq!(l.sizes, vec![128, 8, 8, 128, 8, 8]);
        assert_eq!(l.dsts[0], 0x9000 + 3 * 64);
        assert_eq!(l.srcs[0], 0x1000);
        assert_eq!((l.dsts[2], l.srcs[2]), (0x1000 + 32, 0x9000 + 5 * 64 + 32));
        assert_eq!(l.bytes(), 2 * (128 + 16));
    }
}
