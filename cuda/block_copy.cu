// Batched KV block copy: one launch moves a batch of blocks between pages of
// the device pool and the pinned host tier (offload, onboard) or within the
// device pool (partial reuse copies a leading-token prefix).
//
// Layout (see KvPool in src/gpu/pool.rs): each region (a layer, or a
// layer's K or V tensor) has a base address; page p of a region starts at
// base + p * stride, where the stride is the pool's: block_bytes for the
// device pool (region-major), regions * block_bytes for a block-major host
// tier. A block is `planes` equal planes, each holding the
// block's tokens in order, token_bytes each. A full copy moves block_bytes in
// one run; a prefix copy of k tokens moves the first k * token_bytes bytes of
// every plane.
//
// One warp moves one (copy, region) pair at a time, lanes striding over
// 16-byte words with UNROLL loads in flight before the stores, so that a few
// thread blocks keep enough requests outstanding over PCIe. The host tier is
// mapped pinned memory, addressed directly. Copies in one launch must not
// overlap (the Rust side splits a batch into conflict-free waves).
//
// A wave that writes the host tier and also reads it is sorted with the host
// writes first (ops [0, split_at)), and the grid is split: the first
// COPY_WRITE_SHARE sixteenths of the blocks do those, the others the rest.
// Measured on an H200, one direction saturates PCIe from 4 thread blocks,
// but mixing both directions on the same SMs loses a quarter of the two-way
// rate. In such a split wave the host writes keep COPY_UNROLL_WRITE loads in
// flight per lane and the host reads COPY_UNROLL_READ: both directions share
// PCIe, and reads with many requests in flight crowd the writes out (fewer
// read requests, more write blocks: both directions end together, 76-81
// GB/s against 66-69 with 8/8 and half the blocks each, measured on an
// H200). Single-direction and device-only waves use COPY_UNROLL
// (`kv_block_copy`); split waves launch `kv_block_copy_split`.

#ifndef COPY_UNROLL
#define COPY_UNROLL 8
#endif
#ifndef COPY_UNROLL_WRITE
#define COPY_UNROLL_WRITE 16
#endif
#ifndef COPY_UNROLL_READ
#define COPY_UNROLL_READ 4
#endif
#ifndef COPY_WRITE_SHARE
#define COPY_WRITE_SHARE 10
#endif

// Must match `CopyOp` in src/gpu/pool.rs.
struct CopyOp {
    u32 src_page;
    u32 dst_page;
    u32 tokens;   // leading tokens to copy (tokens_per_block = whole block)
    u32 media;    // bit 0: source in the host tier; bit 1: destination in the host tier
};

__device__ __forceinline__ void copy_run_bytes(u8* __restrict__ dst, const u8* __restrict__ src, u64 n, u32 lane) {
    for (u64 i = lane; i < n; i += 32) dst[i] = src[i];
}

// Blocks of a split wave's grid that do the host writes: COPY_WRITE_SHARE
// sixteenths, at least one, leaving at least one.
__device__ __forceinline__ u32 write_blocks(u32 grid) {
    const u32 first = (grid * COPY_WRITE_SHARE + 8) / 16;
    return first < 1 ? 1 : (first > grid - 1 ? grid - 1 : first);
}

// The copies [op_begin, op_end) of a wave, by `grid` blocks of which this is
// `block`, with U loads in flight per lane (one instantiation per U, so that
// each keeps its own registers).
template <int U>
__device__ __forceinline__ void copy_ops(
    const CopyOp* __restrict__ ops, u32 op_begin, u32 op_end, u32 block, u32 grid,
    const u64* __restrict__ device_bases, const u64* __restrict__ host_bases, u32 regions,
    u64 block_bytes, u32 planes, u64 token_bytes, u32 tokens_per_block, u32 vec16, u64 device_stride,
    u64 host_stride) {
    const u32 lane = threadIdx.x & 31;
    const u64 warp = ((u64)block * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)grid * blockDim.x) >> 5;
    const u64 work = (u64)(op_end - op_begin) * regions;
    const u64 plane_bytes = block_bytes / planes;
    for (u64 w = warp; w < work; w += warps) {
        const u32 op_index = op_begin + (u32)(w / regions);
        const u32 region = (u32)(w - (u64)(op_index - op_begin) * regions);
        const CopyOp op = ops[op_index];
        const u64 sb = (op.media & 1) ? host_bases[region] : device_bases[region];
        const u64 db = (op.media & 2) ? host_bases[region] : device_bases[region];
        const u8* src = (const u8*)(sb + (u64)op.src_page * ((op.media & 1) ? host_stride : device_stride));
        u8* dst = (u8*)(db + (u64)op.dst_page * ((op.media & 2) ? host_stride : device_stride));
        if (op.tokens >= tokens_per_block) {
            if (vec16) copy_run_vec<U>((uint4*)dst, (const uint4*)src, block_bytes / 16, lane);
            else copy_run_bytes(dst, src, block_bytes, lane);
        } else {
            const u64 n = (u64)op.tokens * token_bytes;
            for (u32 p = 0; p < planes; p++) {
                const u64 off = (u64)p * plane_bytes;
                if (vec16) copy_run_vec<U>((uint4*)(dst + off), (const uint4*)(src + off), n / 16, lane);
                else copy_run_bytes(dst + off, src + off, n, lane);
            }
        }
    }
}

// Every copy of the wave with COPY_UNROLL loads in flight, over the whole
// grid. `split_at` is not read: the launch sends a wave that both writes and
// reads the host tier to `kv_block_copy_split` (same signature).
extern "C" __global__ void __launch_bounds__(1024) kv_block_copy(
    const CopyOp* __restrict__ ops, u32 n_ops,
    const u64* __restrict__ device_bases, const u64* __restrict__ host_bases, u32 regions,
    u64 block_bytes, u32 planes, u64 token_bytes, u32 tokens_per_block, u32 vec16, u32 split_at,
    u64 device_stride, u64 host_stride) {
    (void)split_at;
    copy_ops<COPY_UNROLL>(ops, 0, n_ops, blockIdx.x, gridDim.x, device_bases, host_bases, regions, block_bytes, planes,
                          token_bytes, tokens_per_block, vec16, device_stride, host_stride);
}

// A split wave (host writes in [0, split_at), the rest reading the host tier)
// with each direction's own loads in flight. Its own entry point, so that the
// registers the writes' deep unroll needs (it spills at 64 per thread) never
// cost the device-to-device copies of `kv_block_copy` anything.
extern "C" __global__ void __launch_bounds__(1024) kv_block_copy_split(
    const CopyOp* __restrict__ ops, u32 n_ops,
    const u64* __restrict__ device_bases, const u64* __restrict__ host_bases, u32 regions,
    u64 block_bytes, u32 planes, u64 token_bytes, u32 tokens_per_block, u32 vec16, u32 split_at,
    u64 device_stride, u64 host_stride) {
    if (!(split_at > 0 && split_at < n_ops && gridDim.x >= 2)) {
        copy_ops<COPY_UNROLL>(ops, 0, n_ops, blockIdx.x, gridDim.x, device_bases, host_bases, regions, block_bytes,
                              planes, token_bytes, tokens_per_block, vec16, device_stride, host_stride);
        return;
    }
    const u32 first = write_blocks(gridDim.x);
    if (blockIdx.x < first) {
        copy_ops<COPY_UNROLL_WRITE>(ops, 0, split_at, blockIdx.x, first, device_bases, host_bases, regions,
                                    block_bytes, planes, token_bytes, tokens_per_block, vec16, device_stride, host_stride);
    } else {
        copy_ops<COPY_UNROLL_READ>(ops, split_at, n_ops, blockIdx.x - first, gridDim.x - first, device_bases,
                                   host_bases, regions, block_bytes, planes, token_bytes, tokens_per_block, vec16, device_stride, host_stride);
    }
}

// Gather and scatter for the staged host path: a list of byte segments
// (destination, source, length), one warp per segment, between the device
// pool and a contiguous device staging buffer that the copy engines move to
// or from the host tier in long runs. `vec16`: every address and length is a
// multiple of 16.
struct Seg {
    u64 dst;
    u64 src;
    u64 len;
};

extern "C" __global__ void __launch_bounds__(1024) kv_seg_copy(const Seg* __restrict__ segs, u32 n, u32 vec16) {
    const u32 lane = threadIdx.x & 31;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 w = warp; w < n; w += warps) {
        const Seg s = segs[w];
        if (vec16) copy_run_vec<COPY_UNROLL>((uint4*)s.dst, (const uint4*)s.src, s.len / 16, lane);
        else copy_run_bytes((u8*)s.dst, (const u8*)s.src, s.len, lane);
    }
}

// The staged path's gather and scatter for whole blocks: record i names a
// staging address and a device page, and the block's regions sit back to
// back at the staging address (r * block_bytes), as in the block-major host
// tier, so the copy engine moves the slot to the tier in block-sized runs.
// One warp per (block, region); `to_slot` 1 gathers, 0 scatters.
struct BlockSeg {
    u64 slot;
    u32 page;
    u32 pad;
};

extern "C" __global__ void __launch_bounds__(1024) kv_block_seg_copy(
    const BlockSeg* __restrict__ segs, u32 n, const u64* __restrict__ device_bases, u32 regions, u64 block_bytes,
    u64 device_stride, u32 to_slot, u32 vec16) {
    const u32 lane = threadIdx.x & 31;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    const u64 work = (u64)n * regions;
    for (u64 w = warp; w < work; w += warps) {
        const u32 i = (u32)(w / regions);
        const u32 r = (u32)(w - (u64)i * regions);
        const BlockSeg s = segs[i];
        u8* dev = (u8*)(device_bases[r] + (u64)s.page * device_stride);
        u8* slot = (u8*)(s.slot + (u64)r * block_bytes);
        u8* dst = to_slot ? slot : dev;
        const u8* src = to_slot ? dev : slot;
        if (vec16) copy_run_vec<COPY_UNROLL>((uint4*)dst, (const uint4*)src, block_bytes / 16, lane);
        else copy_run_bytes(dst, src, block_bytes, lane);
    }
}
