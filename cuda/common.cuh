// Shared definitions for kvcore's kernels. Prepended to every .cu source by
// src/gpu/kernels.rs before NVRTC compiles it (NVRTC has no file system here).

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;

// The plain 16-byte load, copy_run_vec's default (the tools' lab kernels,
// cuda/lab/, pass loads with cache hints).
struct LdPlain {
    static __device__ __forceinline__ uint4 load(const uint4* __restrict__ p) { return *p; }
};

// A warp copies `words` 16-byte words from `src` to `dst` (lane `lane` of
// 32), with U loads (by Ld::load) in flight per lane before their stores.
// Used by the block copy kernels and the lab kernels.
template <int U, typename Ld = LdPlain>
__device__ __forceinline__ void copy_run_vec(uint4* __restrict__ dst, const uint4* __restrict__ src, u64 words, u32 lane) {
    for (u64 i = lane; i < words; i += 32 * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 k = i + (u64)u * 32;
            if (k < words) v[u] = Ld::load(src + k);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 k = i + (u64)u * 32;
            if (k < words) dst[k] = v[u];
        }
    }
}
