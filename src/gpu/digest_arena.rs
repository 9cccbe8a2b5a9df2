//! The buffers one-call digests reuse ([`Gpu::digest_device`](super::Gpu::digest_device)).
//!
//! A call of one image is one launch and one wait on a completion flag, with
//! no allocation, no memset and no copy: set counters (left zero by every
//! kernel), the device table and values, and a mapped pinned host buffer
//! that receives the digests from the kernel directly and holds the table
//! (read by the kernel in place for a few items, else uploaded). The buffers
//! grow when a call needs more and are kept by the [`Gpu`](super::Gpu).
//!
//! ```text
//! host buffer (mapped):  | flag | ... | digests (32 n) @ ARENA_OUT_OFF | table (48 n) @ table_off |
//! device buffer:         |   (unused up to table_off)  | table copy @ table_off | values @ values_off |
//! ```

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice, sys};

use super::error::GpuError;
use super::one_item::OneGraph;

/// Items up to which the one-call digest's kernel reads the table from
/// mapped host memory instead of a device copy.
pub(super) const MAPPED_TABLE_ITEMS: usize = 4;

/// Where the completion flag and the outputs start in a digest arena's host
/// buffer: the flag word at 0, the outputs at 256.
pub(super) const ARENA_OUT_OFF: usize = 256;

/// Byte offsets in a digest arena for `n` items and `values` scratch values:
/// the completion flag at 0 and outputs at [`ARENA_OUT_OFF`] (host buffer),
/// the table after them (both buffers), the values after that (device
/// buffer); the device buffer's total.
pub(super) fn arena_layout(n: usize, values: u64) -> (usize, usize, usize) {
    let up = |x: usize| x.div_ceil(256) * 256;
    let table_off = up(ARENA_OUT_OFF + 32 * n);
    let values_off = up(table_off + 48 * n);
    (table_off, values_off, values_off + 32 * values.max(1) as usize)
}

/// Buffers one digest call reuses (see the module docs).
#[derive(Debug)]
pub(super) struct DigestArena {
    pub(super) counters: CudaSlice<u32>,
    pub(super) counters_ptr: u64,
    pub(super) work: CudaSlice<u8>,
    pub(super) work_ptr: u64,
    pub(super) host: PinnedHostSlice<u8>,
    pub(super) host_ptr: usize,
    /// The device-mapped address of `host`.
    pub(super) host_dev: u64,
    /// The last completion value the one-item kernel was given (the flag
    /// word at the start of `host` holds it once that kernel is done).
    pub(super) seq: u32,
    /// The one-node graph of the one-item kernel
    /// ([`OneItemPath::ByValueFlag`](super::OneItemPath::ByValueFlag)),
    /// made on first use.
    pub(super) graph: Option<OneGraph>,
}

impl DigestArena {
    /// Whether the arena holds `counters` set counters, `work_bytes` device
    /// bytes and `host_bytes` host bytes.
    pub(super) fn fits(&self, counters: u64, work_bytes: usize, host_bytes: usize) -> bool {
        self.work.len() >= work_bytes && self.counters.len() as u64 >= counters.max(1) && self.host.len() >= host_bytes
    }

    /// Allocates an arena of at least the given sizes (rounded up to powers
    /// of two, 64 KiB at least) on `ctx` for `stream`, counters zeroed and
    /// the flag word 0. The caller drops any older arena only after its
    /// stream is idle.
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        counters: u64,
        work_bytes: usize,
        host_bytes: usize,
    ) -> Result<DigestArena, GpuError> {
        let cap = |x: usize| x.next_power_of_two().max(1 << 16);
        let counters_buf: CudaSlice<u32> = stream.alloc_zeros(cap(counters.max(1) as usize))?;
        let work: CudaSlice<u8> = stream.alloc_zeros(cap(work_bytes))?;
        // SAFETY: plain bytes, written before they are read; DEVICEMAP
        // lets the kernel read the table from it and write the digests
        // into it directly (no copy each way for small calls).
        let mut host = unsafe {
            ctx.alloc_pinned_with_flags::<u8>(
                cap(host_bytes),
                sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )?
        };
        let counters_ptr = counters_buf.device_ptr(stream).0;
        let work_ptr = work.device_ptr(stream).0;
        let host_ptr = host.as_mut_ptr()? as usize;
        let mut host_dev: sys::CUdeviceptr = 0;
        // SAFETY: host_ptr starts a live DEVICEMAP pinned allocation (just
        // made) and host_dev is a valid out-pointer.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut host_dev, host_ptr as *mut std::ffi::c_void, 0) }.result()?;
        // SAFETY: the buffer holds at least 256 bytes (cap), and no kernel uses it yet.
        unsafe { std::ptr::write_volatile(host_ptr as *mut u32, 0) };
        stream.synchronize()?;
        Ok(DigestArena {
            counters: counters_buf,
            counters_ptr,
            work,
            work_ptr,
            host,
            host_ptr,
            host_dev,
            seq: 0,
            graph: None,
        })
    }
}
