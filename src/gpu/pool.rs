//! The KV pool as the copy kernel sees it, copy planning, and the CPU twin of
//! the copy kernel.
//!
//! ```text
//! region r (a layer, or a layer's K or V tensor), base address B[r]
//! page p:  B[r] + p * block_bytes
//!          +-------- plane 0 --------+-------- plane 1 --------+ ...
//!          | tok 0 | tok 1 | ... | tok n-1 | tok 0 | ...          (token_bytes each)
//! ```
//!
//! A full copy moves a page of every region; a prefix copy of k tokens (partial
//! reuse) moves the first k tokens of every plane. The host tier has the same
//! geometry with its own bases and page count, and by default its own layout:
//! block-major, a page's regions side by side (`page_stride` = regions *
//! block_bytes), so that one host block is one run of host memory whatever
//! block order a wave has ([`KvPool::page_stride`]).
//!
//! ```text
//! device pool (the caller's, region-major)   host tier (block-major)
//! B[r] = base + r * blocks * block_bytes     B[r] = base + r * block_bytes
//! page p of region r: B[r] + p * block_bytes  page p of region r: B[r] + p * regions * block_bytes
//! ```
//!
//! Why waves: the engine queues copies in the order its decisions were made,
//! and one step's list can chain through a page (offload block A out of page 7,
//! then onboard block B into page 7; or onboard from a host page that a later
//! offload reuses). One launch runs its copies concurrently, so
//! [`plan_copy_waves`] cuts the list with the engine's `copy_waves` into waves
//! in which no page is written that another copy of the wave reads or writes.
//! Waves run in order, giving exactly the sequential meaning of the list; a
//! step usually needs one.

use crate::resources::{BlockCopy, copy_waves};
use crate::tier::Tier;

use super::error::GpuError;

/// How a block is laid out, shared by the device pool and the host tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockGeometry {
    /// Number of regions (base pointers): layers, or K and V tensors of each layer.
    pub regions: u32,
    /// Bytes of one block in one region.
    pub block_bytes: u64,
    /// Equal planes a block is made of (for example 2 for K and V interleaved
    /// per block, or the number of KV heads in a head-major layout).
    pub planes: u32,
    /// Tokens per block (the engine's `block_size_tokens`).
    pub tokens_per_block: u32,
}

impl BlockGeometry {
    /// Checks that planes and tokens divide the block evenly.
    pub fn validate(&self) -> Result<(), GpuError> {
        let bad = |m: &str| Err(GpuError::InvalidArgument(m.to_owned()));
        if self.regions == 0 || self.block_bytes == 0 || self.planes == 0 || self.tokens_per_block == 0 {
            return bad("regions, block_bytes, planes and tokens_per_block must be non-zero");
        }
        if !self.block_bytes.is_multiple_of(self.planes as u64) {
            return bad("block_bytes must be a multiple of planes");
        }
        if !self.plane_bytes().is_multiple_of(self.tokens_per_block as u64) {
            return bad("a plane's bytes must be a multiple of tokens_per_block");
        }
        Ok(())
    }

    /// Bytes of one plane.
    pub fn plane_bytes(&self) -> u64 {
        self.block_bytes / self.planes as u64
    }

    /// Bytes of one token in one plane.
    pub fn token_bytes(&self) -> u64 {
        self.plane_bytes() / self.tokens_per_block as u64
    }

    /// Bytes a copy of `tokens` leading tokens moves in one region.
    pub fn copy_bytes(&self, tokens: u32) -> u64 {
        if tokens >= self.tokens_per_block {
            self.block_bytes
        } else {
            tokens as u64 * self.token_bytes() * self.planes as u64
        }
    }
}

/// A paged KV pool the caller owns and attaches: one base address per region
/// (device addresses, or device-mapped addresses of pinned host memory), the
/// block geometry, the number of blocks (pages) in each region and the
/// distance between consecutive pages of a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvPool {
    /// Base address of each region; `geometry.regions` entries.
    pub region_bases: Vec<u64>,
    /// Pages in each region.
    pub blocks: u32,
    /// The block layout.
    pub geometry: BlockGeometry,
    /// Bytes from a page of a region to the next page of the same region:
    /// `block_bytes` when each region's pages are back to back (the usual
    /// paged KV tensor), `regions * block_bytes` when a page's regions are
    /// side by side (the block-major host tier).
    pub page_stride: u64,
}

impl KvPool {
    /// A pool whose regions each hold their pages back to back.
    pub fn region_major(region_bases: Vec<u64>, blocks: u32, geometry: BlockGeometry) -> Self {
        Self { region_bases, blocks, page_stride: geometry.block_bytes, geometry }
    }

    /// The address of page `page` of region `region`.
    pub fn page_addr(&self, region: usize, page: u32) -> u64 {
        self.region_bases[region] + page as u64 * self.page_stride
    }

    /// Checks the geometry, that there is one base per region and that a
    /// page fits in its stride.
    pub fn validate(&self) -> Result<(), GpuError> {
        self.geometry.validate()?;
        if self.page_stride < self.geometry.block_bytes {
            return Err(GpuError::InvalidArgument(format!(
                "page_stride {} is less than block_bytes {}",
                self.page_stride, self.geometry.block_bytes
            )));
        }
        if self.region_bases.len() != self.geometry.regions as usize {
            return Err(GpuError::InvalidArgument(format!(
                "{} region bases given for {} regions",
                self.region_bases.len(),
                self.geometry.regions
            )));
        }
        if self.blocks == 0 {
            return Err(GpuError::InvalidArgument("a pool needs at least one block".to_owned()));
        }
        Ok(())
    }
}

/// One copy as the kernel reads it (`CopyOp` in `cuda/block_copy.cu`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CopyOp {
    /// Source page.
    pub src_page: u32,
    /// Destination page.
    pub dst_page: u32,
    /// Leading tokens to copy (`tokens_per_block` or more: the whole block).
    pub tokens: u32,
    /// Bit 0: the source is in the host tier; bit 1: the destination is.
    pub media: u32,
}

// The kernel reads 16-byte records.
const _: () = assert!(std::mem::size_of::<CopyOp>() == 16);

impl CopyOp {
    /// Whether either end is in the host tier.
    pub fn touches_host(&self) -> bool {
        self.media != 0
    }
}

/// Validates `copies` against the pools' page counts (`blocks_host` is `None`
/// when there is no host tier) and cuts them into conflict-free waves with
/// the engine's [`copy_waves`] (see the module docs). Copies of zero tokens
/// and copies of a page onto itself do nothing and are left out.
pub fn plan_copy_waves(
    copies: &[BlockCopy],
    geometry: &BlockGeometry,
    blocks_device: u32,
    blocks_host: Option<u32>,
) -> Result<Vec<Vec<CopyOp>>, GpuError> {
    for (i, c) in copies.iter().enumerate() {
        for end in [c.src, c.dst] {
            let limit = match end.medium {
                Tier::Device => Some(blocks_device),
                Tier::Host => blocks_host,
            };
            match limit {
                None => {
                    return Err(GpuError::InvalidArgument(format!(
                        "copy {i} uses the host tier, which is not attached"
                    )));
                }
                Some(n) if end.page >= n => {
                    return Err(GpuError::InvalidArgument(format!(
                        "copy {i}: page {} is past the {n} pages of the {:?} pool",
                        end.page, end.medium
                    )));
                }
                Some(_) => {}
            }
        }
        if c.tokens > geometry.tokens_per_block {
            return Err(GpuError::InvalidArgument(format!(
                "copy {i}: {} tokens, more than the block's {}",
                c.tokens, geometry.tokens_per_block
            )));
        }
    }
    let mut waves = Vec::new();
    let mut start = 0;
    for end in copy_waves(copies) {
        let wave: Vec<CopyOp> = copies[start..end]
            .iter()
            .filter(|c| c.tokens > 0 && c.src != c.dst)
            .map(|c| CopyOp {
                src_page: c.src.page,
                dst_page: c.dst.page,
                tokens: c.tokens,
                media: u32::from(c.src.medium == Tier::Host) | (u32::from(c.dst.medium == Tier::Host) << 1),
            })
            .collect();
        if !wave.is_empty() {
            waves.push(wave);
        }
        start = end;
    }
    Ok(waves)
}

/// A KV pool in host memory: the CPU twin's stand-in for device memory or the
/// pinned host tier. `data[r]` holds region r's pages back to back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuKvPool {
    /// Bytes of each region.
    pub data: Vec<Vec<u8>>,
    /// Pages per region.
    pub blocks: u32,
}

impl CpuKvPool {
    /// A zeroed pool of `blocks` pages in every region of `geometry`.
    pub fn zeroed(geometry: &BlockGeometry, blocks: u32) -> Self {
        let bytes = geometry.block_bytes as usize * blocks as usize;
        Self { data: vec![vec![0; bytes]; geometry.regions as usize], blocks }
    }
}

/// Copies one region's `copy` bytes from a source page to a destination,
/// plane by plane for prefixes, exactly as the kernel does.
fn copy_region(geometry: &BlockGeometry, src: &[u8], dst: &mut [u8], tokens: u32) {
    if tokens >= geometry.tokens_per_block {
        dst.copy_from_slice(src);
        return;
    }
    let n = tokens as usize * geometry.token_bytes() as usize;
    let plane = geometry.plane_bytes() as usize;
    for p in 0..geometry.planes as usize {
        dst[p * plane..p * plane + n].copy_from_slice(&src[p * plane..p * plane + n]);
    }
}

/// The CPU twin of the batched copy: plans the same waves, and within a wave
/// reads every source before writing any destination (a launch's copies are
/// unordered, so a wave must not depend on its own order; reading first makes
/// a planning mistake visible in tests instead of hiding it).
pub fn copy_blocks_cpu(
    geometry: &BlockGeometry,
    device: &mut CpuKvPool,
    mut host: Option<&mut CpuKvPool>,
    copies: &[BlockCopy],
) -> Result<(), GpuError> {
    geometry.validate()?;
    let waves = plan_copy_waves(copies, geometry, device.blocks, host.as_ref().map(|h| h.blocks))?;
    let bb = geometry.block_bytes as usize;
    for wave in waves {
        let mut staged = Vec::with_capacity(wave.len() * geometry.regions as usize);
        for op in &wave {
            for r in 0..geometry.regions as usize {
                let pool: &CpuKvPool = if op.media & 1 != 0 { host.as_deref().expect("planned") } else { device };
                let s = op.src_page as usize * bb;
                staged.push(pool.data[r][s..s + bb].to_vec());
            }
        }
        let mut staged = staged.into_iter();
        for op in &wave {
            for r in 0..geometry.regions as usize {
                let src = staged.next().expect("one staged block per op and region");
                let pool: &mut CpuKvPool =
                    if op.media & 2 != 0 { host.as_deref_mut().expect("planned") } else { device };
                let d = op.dst_page as usize * bb;
                copy_region(geometry, &src, &mut pool.data[r][d..d + bb], op.tokens);
            }
        }
    }
    Ok(())
}
