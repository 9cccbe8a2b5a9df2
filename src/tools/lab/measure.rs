//! The physical limits the kernels are compared with, measured on the same
//! device in the same run: the driver's device-to-device copy, and pinned
//! host copies by the copy engines each way and both ways at once.
//!
//! Every buffer is owned here, so the measurements are safe to call.

use cudarc::driver::{CudaSlice, DevicePtr, sys};

use kvcore::gpu::{BlockGeometry, Gpu, GpuError, HostTier};

/// Measured copy rates in GB/s (10^9 bytes per second).
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct CopyLimits {
    /// Device-to-device copy, bytes read plus bytes written.
    pub device_copy: f64,
    /// Pinned host to device.
    pub pinned_h2d: f64,
    /// Device to pinned host.
    pub pinned_d2h: f64,
    /// Both directions at once on two streams, bytes of both counted.
    pub pinned_both: f64,
    /// Bytes of the device copy.
    pub device_bytes: u64,
    /// Bytes of each pinned copy.
    pub pinned_bytes: u64,
}

/// The median of `v` (the upper one of an even count; 0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("timings are finite"));
    v[v.len() / 2]
}

/// Times `f` with events on `gpu`'s stream: `warm` untimed runs, then the
/// median of `reps` timed ones, in milliseconds.
pub fn time_ms(
    gpu: &Gpu,
    warm: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    let ctx = gpu.context();
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
    for _ in 0..warm {
        f()?;
    }
    gpu.synchronize()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        a.record(gpu.stream())?;
        f()?;
        b.record(gpu.stream())?;
        b.synchronize()?;
        t.push(a.elapsed_ms(&b)? as f64);
    }
    Ok(median(t))
}

/// Copies `n` bytes between two addresses of live allocations on `stream`
/// (UVA tells the driver the direction).
fn copy_async(dst: u64, src: u64, n: usize, stream: &cudarc::driver::CudaStream) -> Result<(), GpuError> {
    // SAFETY: the callers below pass addresses of allocations they own for
    // the whole call (device buffers or mapped pinned host tiers) of at least
    // n bytes each.
    unsafe { sys::cuMemcpyAsync(dst, src, n, stream.cu_stream()) }.result()?;
    Ok(())
}

/// Measures the copy limits with a device copy of `device_bytes` and pinned
/// copies of `pinned_bytes`.
pub fn copy_limits(gpu: &Gpu, device_bytes: usize, pinned_bytes: usize) -> Result<CopyLimits, GpuError> {
    let s = gpu.stream();
    let a: CudaSlice<u8> = s.alloc_zeros(device_bytes)?;
    let b: CudaSlice<u8> = s.alloc_zeros(device_bytes)?;
    let pa = a.device_ptr(s).0;
    let pb = b.device_ptr(s).0;
    let t_dev = time_ms(gpu, 2, 10, || copy_async(pb, pa, device_bytes, s))?;
    let m = pinned_bytes.min(device_bytes);
    let g = BlockGeometry { regions: 1, block_bytes: m as u64, planes: 1, tokens_per_block: 1 };
    let (h1, h2) = (HostTier::new(gpu, g, 1)?, HostTier::new(gpu, g, 1)?);
    let (hp1, hp2) = (h1.pool().region_bases[0], h2.pool().region_bases[0]);
    let t_h2d = time_ms(gpu, 2, 10, || copy_async(pa, hp1, m, s))?;
    let t_d2h = time_ms(gpu, 2, 10, || copy_async(hp2, pb, m, s))?;
    let s2 = gpu.context().new_stream()?;
    let t_both = time_ms(gpu, 2, 10, || {
        let fork = gpu.context().new_event(None)?;
        fork.record(s)?;
        s2.wait(&fork)?;
        copy_async(pa, hp1, m, s)?;
        copy_async(hp2, pb, m, &s2)?;
        let join = gpu.context().new_event(None)?;
        join.record(&s2)?;
        s.wait(&join)?;
        Ok(())
    })?;
    gpu.synchronize()?;
    let rate = |bytes: f64, ms: f64| bytes / (ms * 1e-3) / 1e9;
    Ok(CopyLimits {
        device_copy: rate(2.0 * device_bytes as f64, t_dev),
        pinned_h2d: rate(m as f64, t_h2d),
        pinned_d2h: rate(m as f64, t_d2h),
        pinned_both: rate(2.0 * m as f64, t_both),
        device_bytes: device_bytes as u64,
        pinned_bytes: m as u64,
    })
}
