//! A prepared digest batch: the item table the BLAKE3 kernels read, the
//! scratch above the groups, and the digests' output, with the table
//! invariants every launch relies on.
//!
//! ```text
//! item i: data, len -> out = out_base + 32 i
//!         groups of 64 chunks, numbered group_first .. group_first + groups (consecutive over the batch)
//!         scratch: values cv_first.., set counters ctr_first.. (consecutive; none for one group)
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr};

use super::digest::{CHUNK_BYTES, DeviceBytes, GROUP_CHUNKS, groups_of_len, scratch_of_len};
use super::error::GpuError;

/// One item of a digest batch as the kernel reads it (`Blake3Item` in
/// `cuda/blake3.cu`: 48 bytes, 8-byte aligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Blake3Item {
    /// Device address of the item's bytes.
    pub data: u64,
    /// Length in bytes.
    pub len: u64,
    /// Device address of its 32-byte digest.
    pub out: u64,
    /// Index of its first value in the scratch, all levels (items of one group use none).
    pub cv_first: u64,
    /// Index of its first set counter in the scratch, all levels.
    pub ctr_first: u64,
    /// Global index of its first group (the first thread block of the chunk launch).
    pub group_first: u32,
    /// Groups of 64 chunks (at least 1).
    pub groups: u32,
}

const _: () = assert!(std::mem::size_of::<Blake3Item>() == 48);

/// A prepared digest batch: the item table (host and device copies), the
/// scratch for values and set counters above the groups, and the digests'
/// output. Built by [`Gpu::prepare_digests`](super::Gpu::prepare_digests),
/// whose contract makes every item address valid.
#[derive(Debug)]
pub struct DigestBatch {
    pub(super) table: Vec<Blake3Item>,
    pub(super) table_dev: CudaSlice<u8>,
    pub(super) cvs: CudaSlice<u32>,
    pub(super) counters: CudaSlice<u32>,
    pub(super) out: CudaSlice<u8>,
    pub(super) groups: u32,
    /// Whether some item has several groups (sets of values to fold above them).
    pub(super) sets: bool,
    /// The buffer the items live in, when the batch owns a reference to it.
    pub(super) keep: Option<Arc<CudaSlice<u8>>>,
}

/// The device addresses a BLAKE3 table kernel of a batch is launched with,
/// in the order of the kernels' signature `(const Blake3Item* items, u32
/// n_items, u32* cvs, u32* counters, u32 one)`: the hook for kernels outside
/// the library with that signature (the tools' lab variants), which write
/// only where the library's kernels write. Valid while the batch lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DigestLaunchArgs {
    /// The device copy of the item table.
    pub table: u64,
    /// Items in the table.
    pub items: u32,
    /// The scratch values (32 bytes each).
    pub values: u64,
    /// The set counters (zero between launches).
    pub counters: u64,
    /// Groups of 64 chunks in the batch (one thread block each, or one per
    /// four for `blake3_digest_multi`).
    pub groups: u32,
}

impl DigestBatch {
    /// Items in the batch.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the batch is empty (never: preparation refuses that).
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Bytes hashed by the batch.
    pub fn bytes(&self) -> u64 {
        self.table.iter().map(|t| t.len).sum()
    }

    /// Thread blocks of the launch (groups of 64 chunks).
    pub fn groups(&self) -> u32 {
        self.groups
    }

    /// Chunk count of the batch's largest item, for reports.
    pub fn chunks_max(&self) -> u64 {
        self.table.iter().map(|t| t.len.div_ceil(CHUNK_BYTES).max(1)).max().unwrap_or(0)
    }

    /// Chunks per group (the block size of the launch).
    pub const GROUP_CHUNKS: u64 = GROUP_CHUNKS;

    /// The item table as the kernels read it.
    pub fn items(&self) -> &[Blake3Item] {
        &self.table
    }

    /// The device addresses the batch's kernels are launched with.
    pub fn launch_args(&self) -> DigestLaunchArgs {
        let stream = self.table_dev.stream();
        DigestLaunchArgs {
            table: self.table_dev.device_ptr(stream).0,
            items: self.table.len() as u32,
            values: self.cvs.device_ptr(stream).0,
            counters: self.counters.device_ptr(stream).0,
            groups: self.groups,
        }
    }
}

/// The item table of a batch whose outputs start at `out_base`: items,
/// groups, scratch values and set counters in total.
pub(super) fn build_table(items: &[DeviceBytes], out_base: u64) -> Result<(Vec<Blake3Item>, u32, u64, u64), GpuError> {
    let mut table = Vec::with_capacity(items.len());
    let (mut group_next, mut cv_next, mut ctr_next) = (0u64, 0u64, 0u64);
    for (i, it) in items.iter().enumerate() {
        let groups = groups_of_len(it.len);
        let (values, counters) = scratch_of_len(it.len);
        table.push(Blake3Item {
            data: it.ptr,
            len: it.len,
            out: out_base + 32 * i as u64,
            cv_first: cv_next,
            ctr_first: ctr_next,
            group_first: u32::try_from(group_next)
                .map_err(|_| GpuError::InvalidArgument("a digest batch has more than 2^32 groups".to_owned()))?,
            groups: groups as u32,
        });
        group_next += groups;
        cv_next += values;
        ctr_next += counters;
    }
    if group_next > i32::MAX as u64 {
        return Err(GpuError::InvalidArgument("a digest batch is limited to 2^31 - 1 groups (128 TiB)".to_owned()));
    }
    Ok((table, group_next as u32, cv_next, ctr_next))
}

/// Checks the table invariants both digest kernels rely on. Run once by
/// `Gpu::prepare_digests`, the only constructor of a batch; a batch is
/// immutable afterwards, so the launches need only check that it is whole.
pub(super) fn check_digest_batch(batch: &DigestBatch) {
    let t = &batch.table;
    assert_eq!(batch.table_dev.len(), t.len() * 48, "the device table holds the host table");
    let (out_base, _s) = batch.out.device_ptr(batch.out.stream());
    assert_eq!(batch.out.len(), 32 * t.len(), "one 32-byte output per item");
    check_table(t, out_base, batch.cvs.len() as u64 / 8, batch.counters.len() as u64, batch.groups);
}

/// Checks an item table against the buffers it will be launched with:
/// outputs consecutive from `out_base`, groups consecutive from 0 and
/// totalling `groups`, scratch ranges consecutive and inside `values`
/// values and `counters` counters.
pub(super) fn check_table(t: &[Blake3Item], out_base: u64, values: u64, counters: u64, groups: u32) {
    assert!(!t.is_empty(), "a batch has items");
    let (mut group, mut cv, mut ctr) = (0u64, 0u64, 0u64);
    for (i, it) in t.iter().enumerate() {
        assert_eq!(it.groups as u64, groups_of_len(it.len), "item {i}: group count matches its length");
        assert_eq!(it.group_first as u64, group, "item {i}: groups are consecutive from 0");
        assert_eq!(it.out, out_base + 32 * i as u64, "item {i}: output inside the batch's buffer");
        let (v, c) = scratch_of_len(it.len);
        if v > 0 {
            assert_eq!((it.cv_first, it.ctr_first), (cv, ctr), "item {i}: scratch ranges are consecutive");
        }
        cv += v;
        ctr += c;
        group += it.groups as u64;
    }
    assert_eq!(group, groups as u64, "total groups");
    assert!(values >= cv, "scratch holds every value of every level");
    assert!(counters >= ctr, "scratch holds every set counter");
    assert!(groups <= i32::MAX as u32, "grid fits");
}

/// The O(1) part of the batch invariant, checked at every launch.
pub(super) fn assert_whole(batch: &DigestBatch) {
    let n = batch.table.len();
    assert!(n > 0, "a batch has items");
    assert_eq!(batch.table_dev.len(), n * 48, "the device table holds the host table");
    assert_eq!(batch.out.len(), 32 * n, "one 32-byte output per item");
    let last = batch.table[n - 1];
    assert_eq!(last.group_first as u64 + last.groups as u64, batch.groups as u64, "groups cover the grid");
    assert!(batch.groups >= 1 && batch.groups <= i32::MAX as u32, "grid fits");
}
