// Lab kernels for the host tier both ways at once with fully scattered
// blocks: segment copies with the grid split between the directions at a
// chosen point, and a bulk-copy (TMA) variant that moves each segment
// through shared memory with `cp.async.bulk`. Only `kvcore gpu-bench` loads
// this module (src/tools/lab/host_explore.rs compiles it after
// cuda/common.cuh); kvcore never does.

struct Seg {
    u64 dst;
    u64 src;
    u64 len;
};

__device__ __forceinline__ u64 hx_now() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// This block's share of segments [0, n) when blocks [0, first_blocks) take
// [0, split) and the other blocks the rest (unless both ranges and both sets
// of blocks are non-empty, every block shares all segments, as the first
// range when `split` or `first_blocks` is non-zero): segments [begin, end),
// this block's index among the blocks sharing them and their count, and
// whether they are the first range (the host writes).
struct HxRange {
    u32 begin, end, block, grid;
    bool first;
};

__device__ __forceinline__ HxRange hx_range(u32 n, u32 split, u32 first_blocks) {
    HxRange r = {0, n, blockIdx.x, gridDim.x, !(split == 0 && first_blocks == 0)};
    if (split > 0 && split < n && first_blocks > 0 && first_blocks < gridDim.x) {
        if (blockIdx.x < first_blocks) {
            r.end = split;
            r.grid = first_blocks;
        } else {
            r.begin = split;
            r.block = blockIdx.x - first_blocks;
            r.grid = gridDim.x - first_blocks;
            r.first = false;
        }
    }
    return r;
}

// Read-side variants: MODE 1 loads with an L2 fetch-size hint of 256 bytes;
// MODE 2 first asks the bulk engine to prefetch the whole segment into L2;
// MODE 3 prefetches the warp's next segment into L2 while copying this one.
__device__ __forceinline__ uint4 hx_ld256(const uint4* p) {
    uint4 v;
    asm("ld.global.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ void hx_prefetch(u64 src, u64 len) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"((u32)len) : "memory");
}

// copy_run_vec's load for MODE 1.
struct LdL2x256 {
    static __device__ __forceinline__ uint4 load(const uint4* p) { return hx_ld256(p); }
};

template <int UW, int UR, int MODE>
__device__ __forceinline__ void hx_split2(const Seg* __restrict__ segs, u32 n, u32 split, u32 first_blocks, u64* trace) {
    if (trace && threadIdx.x == 0) trace[2 * blockIdx.x] = hx_now();
    const u32 lane = threadIdx.x & 31;
    const HxRange r = hx_range(n, split, first_blocks);
    const u32 begin = r.begin, end = r.end, block = r.block, grid = r.grid;
    const bool first = r.first;
    const u64 warp = ((u64)block * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)grid * blockDim.x) >> 5;
    if (!first && MODE == 3 && lane == 0 && begin + warp < end) hx_prefetch(segs[begin + warp].src, segs[begin + warp].len);
    for (u64 w = begin + warp; w < end; w += warps) {
        const Seg s = segs[w];
        if (first) {
            copy_run_vec<UW>((uint4*)s.dst, (const uint4*)s.src, s.len / 16, lane);
        } else {
            if (MODE == 2 && lane == 0) hx_prefetch(s.src, s.len);
            if (MODE == 3 && lane == 0 && w + warps < end) hx_prefetch(segs[w + warps].src, segs[w + warps].len);
            if (MODE != 0) __syncwarp();
            if (MODE == 1) {
                copy_run_vec<UR, LdL2x256>((uint4*)s.dst, (const uint4*)s.src, s.len / 16, lane);
            } else {
                copy_run_vec<UR>((uint4*)s.dst, (const uint4*)s.src, s.len / 16, lane);
            }
        }
    }
    if (trace) {
        __syncthreads();
        if (threadIdx.x == 0) trace[2 * blockIdx.x + 1] = hx_now();
    }
}

// Segments [0, split) by blocks [0, first_blocks), the rest by the other
// blocks; one warp per segment at a time; W and R loads in flight per lane
// for the two ranges. Every address and length is a multiple of 16. With
// `trace`, each block's first thread records the block's start and end
// (globaltimer, ns) at trace[2b], trace[2b + 1].
#define HX_SPLIT(W, R) \
    extern "C" __global__ void __launch_bounds__(1024) hx_split_##W##_##R(const Seg* segs, u32 n, u32 split, u32 fb, u64* trace) { \
        hx_split2<W, R, 0>(segs, n, split, fb, trace); \
    }
HX_SPLIT(8, 1)
HX_SPLIT(8, 2)
HX_SPLIT(8, 4)
HX_SPLIT(8, 8)
HX_SPLIT(16, 1)
HX_SPLIT(16, 2)
HX_SPLIT(16, 4)
HX_SPLIT(16, 8)
HX_SPLIT(4, 4)

#define HX_SPLIT2(W, R, M) \
    extern "C" __global__ void __launch_bounds__(1024) hx_split_##W##_##R##_m##M(const Seg* segs, u32 n, u32 split, u32 fb, u64* trace) { \
        hx_split2<W, R, M>(segs, n, split, fb, trace); \
    }
HX_SPLIT2(8, 4, 1)
HX_SPLIT2(8, 8, 1)
HX_SPLIT2(16, 4, 1)
HX_SPLIT2(8, 4, 2)
HX_SPLIT2(8, 8, 2)
HX_SPLIT2(8, 4, 3)
HX_SPLIT2(8, 8, 3)
HX_SPLIT2(16, 4, 3)

// Bulk copies through shared memory: one thread per block drives a ring of
// HX_STAGES buffers of HX_STAGE bytes; a segment is cut into pieces of at most
// HX_STAGE bytes; piece p is loaded into stage p mod HX_STAGES (completion
// counted on that stage's mbarrier), and once loaded it is stored from the
// stage to its destination as its own bulk group. A stage is reloaded only
// after the store of its previous piece has finished reading it.
#ifndef HX_STAGE
#define HX_STAGE 8192
#endif
#ifndef HX_STAGES
#define HX_STAGES 16
#endif

__device__ __forceinline__ u32 hx_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }

template <int N>
__device__ __forceinline__ void hx_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Waits until at most `pending` bulk store groups still read shared memory
// (more than 15: waits for all, which is safe).
__device__ __forceinline__ void hx_wait_read_dyn(u32 pending) {
    switch (pending) {
#define HX_CASE(N) case N: hx_wait_read<N>(); break;
    HX_CASE(1) HX_CASE(2) HX_CASE(3) HX_CASE(4) HX_CASE(5) HX_CASE(6) HX_CASE(7) HX_CASE(8)
    HX_CASE(9) HX_CASE(10) HX_CASE(11) HX_CASE(12) HX_CASE(13) HX_CASE(14) HX_CASE(15)
#undef HX_CASE
    default: hx_wait_read<0>(); break;
    }
}

extern "C" __global__ void __launch_bounds__(32) hx_tma(const Seg* __restrict__ segs, u32 n, u32 split, u32 first_blocks, u64* trace) {
    extern __shared__ __align__(128) u8 stage_mem[];
    __shared__ __align__(8) u64 bars[HX_STAGES];
    if (threadIdx.x != 0) return;
    if (trace) trace[2 * blockIdx.x] = hx_now();
    const HxRange r = hx_range(n, split, first_blocks);
    const u32 begin = r.begin, end = r.end, block = r.block, grid = r.grid;
    for (int s = 0; s < HX_STAGES; s++) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(hx_smem(&bars[s])) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    u64 dst_of[HX_STAGES];
    u32 len_of[HX_STAGES];
    u32 issued = 0, done = 0;
    // The piece generator: segment index k (this block's k-th), offset within it.
    u64 k = begin + block;
    u64 off = 0;
    for (;;) {
        while (issued - done < HX_STAGES && k < end) {
            const Seg s = segs[k];
            const u32 len = (u32)min((u64)HX_STAGE, s.len - off);
            const u32 st = issued % HX_STAGES;
            if (issued >= HX_STAGES) {
                // Store number issued - HX_STAGES used this stage; stores issued so far: done.
                hx_wait_read_dyn(done - (issued - HX_STAGES) - 1);
            }
            const u32 bar = hx_smem(&bars[st]);
            const u32 buf = hx_smem(stage_mem + (u64)st * HX_STAGE);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(len) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(buf),
                         "l"(s.src + off), "r"(len), "r"(bar)
                         : "memory");
            dst_of[st] = s.dst + off;
            len_of[st] = len;
            issued++;
            off += len;
            if (off >= s.len) {
                off = 0;
                k += grid;
            }
        }
        if (done == issued) break;
        const u32 st = done % HX_STAGES;
        const u32 parity = (done / HX_STAGES) & 1;
        const u32 bar = hx_smem(&bars[st]);
        u32 ready = 0;
        while (!ready) {
            asm volatile(
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                : "=r"(ready)
                : "r"(bar), "r"(parity)
                : "memory");
        }
        const u32 buf = hx_smem(stage_mem + (u64)st * HX_STAGE);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst_of[st]), "r"(buf), "r"(len_of[st])
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        done++;
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    if (trace) trace[2 * blockIdx.x + 1] = hx_now();
}

// Verification helpers (many blocks; not part of any timed figure).
extern "C" __global__ void hx_fill(const Seg* __restrict__ segs, u32 n, u32 value) {
    const u32 lane = threadIdx.x & 31;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 w = warp; w < n; w += warps) {
        const Seg s = segs[w];
        u32* d = (u32*)s.dst;
        for (u64 i = lane; i < s.len / 4; i += 32) d[i] = value;
    }
}

extern "C" __global__ void hx_compare(const Seg* __restrict__ segs, u32 n, unsigned long long* mismatches) {
    const u32 lane = threadIdx.x & 31;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    unsigned long long bad = 0;
    for (u64 w = warp; w < n; w += warps) {
        const Seg s = segs[w];
        const u32* d = (const u32*)s.dst;
        const u32* a = (const u32*)s.src;
        for (u64 i = lane; i < s.len / 4; i += 32) bad += d[i] != a[i];
    }
    if (bad) atomicAdd(mismatches, bad);
}
