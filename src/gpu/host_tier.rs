//! The pinned host tier: the engine's `Tier::Host` pages, in page-locked
//! host memory mapped into the device's address space, so that the copy
//! kernel reads and writes them over PCIe directly and the copy engines can
//! reach them too.
//!
//! ```text
//! block-major (default)                        region-major
//! page p, region r at (p * regions + r) * bb   page p, region r at (r * blocks + p) * bb
//! | p0 r0 | p0 r1 | ... | p1 r0 | p1 r1 | ...  | r0 p0 | r0 p1 | ... | r1 p0 | ...
//! ```

use cudarc::driver::{PinnedHostSlice, sys};

use super::device::Gpu;
use super::error::GpuError;
use super::pool::{BlockGeometry, KvPool};

/// How the host tier lays out its pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostLayout {
    /// A page's regions side by side (page p, region r at byte
    /// `(p * regions + r) * block_bytes`): a whole-block copy is one run of
    /// host memory, so the staged path moves even fully scattered blocks in
    /// runs of `regions * block_bytes` (fully scattered blocks reach
    /// 90-96 GB/s both ways that way on an H200, where the kernel stops
    /// near 80).
    #[default]
    BlockMajor,
    /// Each region's pages back to back, like the device pool (page p,
    /// region r at `(r * blocks + p) * block_bytes`): a block is `regions`
    /// separate runs.
    RegionMajor,
}

/// The pinned host tier: one page-locked allocation, device-mapped so that the
/// copy kernel reads and writes it over PCIe directly. Allocated without the
/// write-combined flag, because the CPU may read it (write-combined memory is
/// very slow to read from the host).
#[derive(Debug)]
pub struct HostTier {
    buf: PinnedHostSlice<u8>,
    pool: KvPool,
    layout: HostLayout,
}

impl HostTier {
    /// Allocates `blocks` host pages of `geometry` in every region, laid out
    /// block-major ([`HostLayout::BlockMajor`]). Wrap it in an `Arc` to
    /// attach it.
    pub fn new(gpu: &Gpu, geometry: BlockGeometry, blocks: u32) -> Result<HostTier, GpuError> {
        Self::with_layout(gpu, geometry, blocks, HostLayout::default())
    }

    /// As [`HostTier::new`], with the layout chosen.
    pub fn with_layout(
        gpu: &Gpu,
        geometry: BlockGeometry,
        blocks: u32,
        layout: HostLayout,
    ) -> Result<HostTier, GpuError> {
        geometry.validate()?;
        let region_bytes = geometry
            .block_bytes
            .checked_mul(blocks as u64)
            .ok_or_else(|| GpuError::InvalidArgument("host tier size overflows".to_owned()))?;
        let total = region_bytes
            .checked_mul(geometry.regions as u64)
            .filter(|t| *t > 0 && *t < isize::MAX as u64)
            .ok_or_else(|| GpuError::InvalidArgument("host tier size is zero or overflows".to_owned()))?;
        // SAFETY: the memory is uninitialised bytes, which is fine for u8 and
        // never read as anything else; PORTABLE | DEVICEMAP makes it usable
        // from kernels of any context, and no WRITECOMBINED flag keeps host
        // reads fast.
        let mut buf = unsafe {
            gpu.ctx.alloc_pinned_with_flags::<u8>(
                total as usize,
                sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )?
        };
        let host_ptr = buf.as_mut_ptr()?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: host_ptr is the start of a live DEVICEMAP pinned allocation
        // (just made), and dev is a valid out-pointer.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host_ptr.cast(), 0) }.result()?;
        let bb = geometry.block_bytes;
        let pool = match layout {
            HostLayout::BlockMajor => KvPool {
                region_bases: (0..geometry.regions as u64).map(|r| dev + r * bb).collect(),
                blocks,
                geometry,
                page_stride: bb * geometry.regions as u64,
            },
            HostLayout::RegionMajor => KvPool::region_major(
                (0..geometry.regions as u64).map(|r| dev + r * region_bytes).collect(),
                blocks,
                geometry,
            ),
        };
        Ok(HostTier { buf, pool, layout })
    }

    /// The tier as a pool (device-mapped addresses).
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// The tier's layout.
    pub fn layout(&self) -> HostLayout {
        self.layout
    }

    /// The offset in [`HostTier::bytes`] of page `page` of region `region`.
    pub fn offset(&self, region: usize, page: u32) -> usize {
        // Region 0 starts at the allocation's first byte in both layouts.
        (self.pool.page_addr(region, page) - self.pool.region_bases[0]) as usize
    }

    /// The tier's bytes in its layout. Kernels write it without the slice
    /// knowing: synchronize the stream first.
    pub fn bytes(&self) -> Result<&[u8], GpuError> {
        Ok(self.buf.as_slice()?)
    }

    /// The tier's bytes for writing, before it is shared with an engine.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], GpuError> {
        Ok(self.buf.as_mut_slice()?)
    }

    /// The tier's bytes region after region (each region's pages back to
    /// back, as [`CpuKvPool`](super::CpuKvPool) holds them), whatever the
    /// layout. Synchronize the stream first.
    pub fn to_regions(&self) -> Result<Vec<Vec<u8>>, GpuError> {
        let bytes = self.bytes()?;
        let (g, bb) = (&self.pool.geometry, self.pool.geometry.block_bytes as usize);
        Ok((0..g.regions as usize)
            .map(|r| {
                (0..self.pool.blocks).flat_map(|p| &bytes[self.offset(r, p)..self.offset(r, p) + bb]).copied().collect()
            })
            .collect())
    }

    /// Writes the tier from bytes region after region (the inverse of
    /// [`HostTier::to_regions`]), before it is shared with an engine.
    pub fn fill_from_regions(&mut self, regions: &[Vec<u8>]) -> Result<(), GpuError> {
        let (g, bb) = (self.pool.geometry, self.pool.geometry.block_bytes as usize);
        if regions.len() != g.regions as usize || regions.iter().any(|r| r.len() != bb * self.pool.blocks as usize) {
            return Err(GpuError::InvalidArgument("region bytes do not match the tier's size".to_owned()));
        }
        let offsets: Vec<Vec<usize>> =
            (0..g.regions as usize).map(|r| (0..self.pool.blocks).map(|p| self.offset(r, p)).collect()).collect();
        let bytes = self.bytes_mut()?;
        for (r, data) in regions.iter().enumerate() {
            for (p, at) in offsets[r].iter().enumerate() {
                bytes[*at..*at + bb].copy_from_slice(&data[p * bb..(p + 1) * bb]);
            }
        }
        Ok(())
    }
}
