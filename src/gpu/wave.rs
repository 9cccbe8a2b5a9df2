//! Copy waves: a conflict-free set of copies checked against one attached
//! pool and split between who moves it (the copy kernel, the copy engines
//! directly, or the copy engines through the staging slots), each part
//! uploaded or planned, ready to launch.
//!
//! ```text
//! ops ── check_wave ── host copies ── HostCopyPath ──┬── direct runs (dma::runs)       -> copy engines
//!                                                     ├── staged plan (dma::staged)     -> gather/scatter + copy engines
//!                                                     └── the rest                      -> kv_block_copy
//! ```

use cudarc::driver::CudaSlice;

use super::attached_pool::{AttachedPool, HostCopyPath};
use super::device::Gpu;
use super::dma::{self, RunList, StagedList};
use super::error::GpuError;
use super::pool::CopyOp;

/// A checked, uploaded wave of copies for one [`AttachedPool`]: no page is
/// written twice or both read and written, every page is inside its pool.
#[derive(Debug)]
pub struct CopyWave {
    /// The id of the pool the wave was checked against.
    pub(super) pool_id: u64,
    /// The copies the kernel does (all of them on the kernel path).
    pub(super) ops: Vec<CopyOp>,
    /// Runs the copy engine writes to the host tier.
    pub(super) dma_out: RunList,
    /// Runs the other copy engine reads from the host tier.
    pub(super) dma_in: RunList,
    /// The staged path's offload and onboard, each with its segments on the
    /// device (`None` when the direction is empty).
    pub(super) staged: [(Option<CudaSlice<u8>>, StagedList); 2],
    /// The pool's staging generation the staged lists were built for.
    pub(super) staging_gen: u64,
    /// Copies in the wave, both paths.
    pub(super) total: usize,
    pub(super) ops_dev: CudaSlice<u8>,
    pub(super) touches_host: bool,
    /// Ops before this index write the host tier and get their own half of
    /// the grid; 0 when the wave is not split.
    pub(super) split_at: u32,
}

impl CopyWave {
    /// Copies in the wave.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether the wave is empty.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Byte runs given to the copy engines, to the host tier and from it
    /// (after merging runs that continue each other).
    pub fn dma_runs(&self) -> (usize, usize) {
        (self.dma_out.len(), self.dma_in.len())
    }

    /// Copy-engine runs of the staged path, to the host tier and from it
    /// (after sorting by host page and merging).
    pub fn staged_runs(&self) -> (usize, usize) {
        (self.staged[0].1.host_runs(), self.staged[1].1.host_runs())
    }
}

impl Gpu {
    /// Checks a wave against `pool` (see `check_wave`), hands the
    /// host copies that the pool's [`HostCopyPath`] gives the copy engines
    /// to them as lists of byte runs, and uploads the rest for the kernel,
    /// host writes first so that the kernel can give each direction its own
    /// thread blocks (copies of a wave are independent, so their order is
    /// free).
    pub fn prepare_wave(&self, pool: &AttachedPool, all: Vec<CopyOp>) -> Result<CopyWave, GpuError> {
        check_wave(pool, &all)?;
        let total = all.len();
        let g = &pool.device.geometry;
        let ends = pool.ends();
        let runs_of = |ops: &[CopyOp]| dma::runs(g, ops, &ends);
        let (writes, reads): (Vec<CopyOp>, Vec<CopyOp>) =
            all.iter().filter(|op| op.touches_host()).partition(|op| op.media & 2 != 0);
        let offload: Vec<CopyOp> = writes.iter().copied().filter(|op| op.media == 2).collect();
        let onboard: Vec<CopyOp> = reads.iter().copied().filter(|op| op.media == 1).collect();
        let staged_of = |ops: &[CopyOp], to_host: bool| -> Option<StagedList> {
            let st = pool.staging.as_ref()?;
            let slots = if to_host { &st.out_slots } else { &st.in_slots };
            dma::staged(g, ops, &ends, to_host, slots, st.config.slot_bytes, st.config.whole_blocks)
        };
        let none = || (RunList::default(), RunList::default(), StagedList::default(), StagedList::default());
        let (dma_out, dma_in, st_out, st_in) = match pool.host_path {
            HostCopyPath::Kernel => none(),
            HostCopyPath::CopyEngines => {
                (runs_of(&writes), runs_of(&reads), StagedList::default(), StagedList::default())
            }
            HostCopyPath::Split => (runs_of(&writes), RunList::default(), StagedList::default(), StagedList::default()),
            HostCopyPath::Staged => match (staged_of(&offload, true), staged_of(&onboard, false)) {
                (Some(o), Some(i)) => (RunList::default(), RunList::default(), o, i),
                _ => none(),
            },
            HostCopyPath::Auto => {
                // The copy engines pay about a microsecond per run (measured:
                // 64 KiB runs reach 0.81 of their rate, 16 KiB runs 0.07), and
                // one direction on them with the other on the kernel is slower
                // than both on the kernel: they take a wave's host copies only
                // when every direction present merges into long runs, directly
                // (both ends consecutive) or through the staging buffer (host
                // pages consecutive, device pages anywhere).
                // With a block-major host tier and a region-major device pool
                // (different page strides, several regions) no two (page,
                // region) pieces continue each other at both ends, so a
                // direct run is one piece, long only if a piece is: else
                // skip building the lists.
                let direct_possible =
                    pool.device.page_stride == pool.host_stride || g.regions == 1 || g.block_bytes >= dma::LONG_RUN;
                let (o, i) = if direct_possible {
                    (runs_of(&writes), runs_of(&reads))
                } else {
                    (RunList::default(), RunList::default())
                };
                let long = |l: &RunList| l.is_empty() || l.bytes() >= dma::LONG_RUN * l.len() as u64;
                let staged_long = |l: &Option<StagedList>| {
                    l.as_ref()
                        .is_some_and(|l| !l.is_empty() && l.bytes() >= dma::STAGED_LONG_RUN * l.host_runs() as u64)
                };
                if direct_possible && long(&o) && long(&i) {
                    (o, i, StagedList::default(), StagedList::default())
                } else {
                    // Host-to-host copies (media 3) have no staged form.
                    let no_host_to_host = writes.iter().all(|op| op.media == 2);
                    // The staged path pays a fixed cost a wave (planning on
                    // the CPU, the gather or scatter launch, events) and
                    // gains only when both directions share PCIe: one way,
                    // the kernel is within 5 % of the copy engines, and in
                    // the replay of the engine's own copies (waves of about
                    // 2 MiB) every staged one-way or small wave cost time,
                    // measured on an H200. So it takes two-way waves of
                    // at least `dma::STAGED_MIN_BYTES` each way whose host
                    // runs are long.
                    let bytes = |ops: &[CopyOp]| -> u64 {
                        ops.iter().map(|op| g.copy_bytes(op.tokens) * g.regions as u64).sum()
                    };
                    let big = !offload.is_empty()
                        && !onboard.is_empty()
                        && bytes(&offload) >= dma::STAGED_MIN_BYTES
                        && bytes(&onboard) >= dma::STAGED_MIN_BYTES;
                    let (so, si) = if no_host_to_host && big {
                        (staged_of(&offload, true), staged_of(&onboard, false))
                    } else {
                        (None, None)
                    };
                    if staged_long(&so) && staged_long(&si) {
                        (RunList::default(), RunList::default(), so.unwrap_or_default(), si.unwrap_or_default())
                    } else {
                        none()
                    }
                }
            }
        };
        let by_dma = |op: &CopyOp| {
            (op.media & 2 != 0 && !dma_out.is_empty())
                || (op.media == 1 && !dma_in.is_empty())
                || (op.media == 2 && !st_out.is_empty())
                || (op.media == 1 && !st_in.is_empty())
        };
        let mut ops: Vec<CopyOp> = all.iter().copied().filter(|op| !by_dma(op)).collect();
        ops.sort_by_key(|op| op.media & 2 == 0);
        let host_writes = ops.iter().take_while(|op| op.media & 2 != 0).count();
        let reads_host = ops.iter().any(|op| op.media & 1 != 0);
        let split_at = if host_writes > 0 && host_writes < ops.len() && reads_host { host_writes as u32 } else { 0 };
        let ops_dev = if ops.is_empty() {
            self.stream.alloc_zeros(16)?
        } else {
            self.stream.clone_htod(bytemuck::cast_slice::<CopyOp, u8>(&ops))?
        };
        let touches_host = ops.iter().any(CopyOp::touches_host);
        let upload = |l: &StagedList| -> Result<Option<CudaSlice<u8>>, GpuError> {
            if l.is_empty() {
                return Ok(None);
            }
            let bytes = if l.whole_blocks() {
                bytemuck::cast_slice::<dma::BlockSeg, u8>(&l.blocks)
            } else {
                bytemuck::cast_slice::<dma::Seg, u8>(&l.segs)
            };
            Ok(Some(self.stream.clone_htod(bytes)?))
        };
        let staged = [(upload(&st_out)?, st_out), (upload(&st_in)?, st_in)];
        let staging_gen = pool.staging.as_ref().map_or(0, |s| s.generation);
        Ok(CopyWave {
            pool_id: pool.id,
            ops_dev,
            touches_host,
            split_at,
            ops,
            dma_out,
            dma_in,
            staged,
            staging_gen,
            total,
        })
    }
}

/// Checks a wave against its pool: pages inside their pools, host pages
/// only with a host tier, tokens within a block, and no page written twice or
/// both read and written. Run once by `Gpu::prepare_wave`, the only
/// constructor of a [`CopyWave`].
fn check_wave(pool: &AttachedPool, wave: &[CopyOp]) -> Result<(), GpuError> {
    let bad = |m: String| Err(GpuError::InvalidArgument(m));
    let g = pool.device.geometry;
    let blocks_host = pool.host.as_ref().map(|h| h.pool().blocks);
    let mut read = ahash::AHashSet::new();
    let mut written = ahash::AHashSet::new();
    for (i, op) in wave.iter().enumerate() {
        if op.media >= 4 {
            return bad(format!("op {i}: media has two bits"));
        }
        let (src_host, dst_host) = (op.media & 1 != 0, op.media & 2 != 0);
        for (host, page) in [(src_host, op.src_page), (dst_host, op.dst_page)] {
            let limit = if host { blocks_host } else { Some(pool.device.blocks) };
            match limit {
                None => return bad(format!("op {i}: host page without a host tier")),
                Some(n) if page >= n => return bad(format!("op {i}: page {page} past the pool of {n}")),
                Some(_) => {}
            }
        }
        if op.tokens == 0 || op.tokens > g.tokens_per_block {
            return bad(format!("op {i}: {} tokens; a block holds {}", op.tokens, g.tokens_per_block));
        }
        if !written.insert((dst_host, op.dst_page)) {
            return bad(format!("op {i}: page {} written twice in one wave", op.dst_page));
        }
        read.insert((src_host, op.src_page));
    }
    if !read.is_disjoint(&written) {
        return bad("a page is both read and written in one wave".to_owned());
    }
    Ok(())
}
