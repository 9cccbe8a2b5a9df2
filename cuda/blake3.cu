// BLAKE3-256 of many device-resident byte strings in one launch.
//
// One thread per 1 KiB chunk, one thread block per group of 64 consecutive
// chunks of one item. Each thread compresses its chunk (16 blocks, sequential
// by definition of BLAKE3), then the block folds its 64 chaining values
// pairwise into the group's value in shared memory. Above that, values are
// folded 64 at a time, level by level, by whichever block finishes a set last
// (an atomic counter per set, after a fence: the classic last-block
// reduction), so no second launch and no idle tree stage are needed. The top
// fold carries the root flag; an item of one chunk sets it on its last block.
//
// Why folding sets of 64 is the BLAKE3 tree: the tree is what merging values
// level by level gives, pairing left to right and carrying an odd last value
// up unchanged. An aligned set of 64 values is then a complete subtree, and a
// trailing partial set folds to the node the whole-tree fold gives it.
//
// Byte order: BLAKE3 words are little-endian, as is the GPU, so 16-byte loads
// give message words directly.
//
// Two entry points differ only in how additions are issued. In
// blake3_digest_throughput some go through multiply-add by a run-time 1
// (`one`, a kernel argument the compiler cannot fold), moving them from the
// integer ALU pipe, where the XORs and rotates already queue, to the FMA pipe:
// more hashes per second when every SM is full. blake3_digest_latency leaves
// them as plain additions, whose latency is shorter: a faster single image,
// where a few warps per SM wait on their own dependency chains.

#define B3_CHUNK_START 1u
#define B3_CHUNK_END 2u
#define B3_PARENT 4u
#define B3_ROOT 8u
#define B3_GROUP_LOG2 6
#define B3_GROUP (1u << B3_GROUP_LOG2)

// Must match `Blake3Item` in src/gpu/launch.rs (48 bytes, 8-byte aligned).
struct Blake3Item {
    u64 data;        // device address of the item's bytes
    u64 len;         // bytes
    u64 out;         // device address of its 32-byte digest
    u64 cv_first;    // first of its values (8 words each) in the scratch, all levels
    u64 ctr_first;   // first of its set counters (all levels)
    u32 group_first; // global index of its first group
    u32 groups;      // number of groups (at least 1)
};

__device__ __constant__ u32 B3_IV[8] = {
    0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
    0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u,
};

__device__ __forceinline__ u32 rotr16(u32 x) { return __byte_perm(x, 0, 0x1032); }
__device__ __forceinline__ u32 rotr8(u32 x) { return __byte_perm(x, 0, 0x0321); }
__device__ __forceinline__ u32 rotr12(u32 x) { return __funnelshift_r(x, x, 12); }
__device__ __forceinline__ u32 rotr7(u32 x) { return __funnelshift_r(x, x, 7); }

// MODE 0: plain additions; MODE 1: additions as multiply-adds by `one`.
#define B3_ADD3(a, b, x) (MODE == 0 ? (a + b + (x)) : ((x) * one + (b * one + a)))
#define B3_ADD2(c, d) (MODE == 0 ? (c + d) : (d * one + c))

#define B3_G(a, b, c, d, x, y)          \
    do {                                \
        a = B3_ADD3(a, b, x);           \
        d = rotr16(d ^ a);              \
        c = B3_ADD2(c, d);              \
        b = rotr12(b ^ c);              \
        a = B3_ADD3(a, b, y);           \
        d = rotr8(d ^ a);               \
        c = B3_ADD2(c, d);              \
        b = rotr7(b ^ c);               \
    } while (0)

// One round with the message schedule s0..s15 (indices into m).
#define B3_ROUND(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15) \
    do {                                                   \
        B3_G(v0, v4, v8, v12, m[s0], m[s1]);               \
        B3_G(v1, v5, v9, v13, m[s2], m[s3]);               \
        B3_G(v2, v6, v10, v14, m[s4], m[s5]);              \
        B3_G(v3, v7, v11, v15, m[s6], m[s7]);              \
        B3_G(v0, v5, v10, v15, m[s8], m[s9]);              \
        B3_G(v1, v6, v11, v12, m[s10], m[s11]);            \
        B3_G(v2, v7, v8, v13, m[s12], m[s13]);             \
        B3_G(v3, v4, v9, v14, m[s14], m[s15]);             \
    } while (0)

// Compresses one 64-byte block into the chaining value cv (first 8 output words).
template <int MODE>
__device__ __forceinline__ void b3_compress(u32 cv[8], const u32 m[16], u64 counter, u32 block_len, u32 flags, u32 one) {
    u32 v0 = cv[0], v1 = cv[1], v2 = cv[2], v3 = cv[3];
    u32 v4 = cv[4], v5 = cv[5], v6 = cv[6], v7 = cv[7];
    u32 v8 = B3_IV[0], v9 = B3_IV[1], v10 = B3_IV[2], v11 = B3_IV[3];
    u32 v12 = (u32)counter, v13 = (u32)(counter >> 32), v14 = block_len, v15 = flags;
    // The schedule of each round is the message permutation applied r times.
    B3_ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    B3_ROUND(2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8);
    B3_ROUND(3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1);
    B3_ROUND(10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6);
    B3_ROUND(12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4);
    B3_ROUND(9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7);
    B3_ROUND(11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13);
    cv[0] = v0 ^ v8; cv[1] = v1 ^ v9; cv[2] = v2 ^ v10; cv[3] = v3 ^ v11;
    cv[4] = v4 ^ v12; cv[5] = v5 ^ v13; cv[6] = v6 ^ v14; cv[7] = v7 ^ v15;
}

// Parent node: cv = compress(IV, left || right, 0, 64, PARENT | extra).
template <int MODE>
__device__ __forceinline__ void b3_parent(u32 out[8], const u32 left[8], const u32 right[8], u32 extra_flags, u32 one) {
    u32 m[16];
#pragma unroll
    for (int i = 0; i < 8; i++) { m[i] = left[i]; m[8 + i] = right[i]; }
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = B3_IV[i];
    b3_compress<MODE>(out, m, 0, 64, B3_PARENT | extra_flags, one);
}

__device__ __forceinline__ void b3_load_full(u32 m[16], const u8* p, bool aligned) {
    if (aligned) {
        const uint4* q = (const uint4*)p;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 w = __ldg(q + i);
            m[4 * i] = w.x; m[4 * i + 1] = w.y; m[4 * i + 2] = w.z; m[4 * i + 3] = w.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++) {
            m[i] = (u32)p[4 * i] | ((u32)p[4 * i + 1] << 8) | ((u32)p[4 * i + 2] << 16) | ((u32)p[4 * i + 3] << 24);
        }
    }
}

// A partial (or empty) last block, zero padded.
__device__ __forceinline__ void b3_load_partial(u32 m[16], const u8* p, u32 n) {
#pragma unroll
    for (int i = 0; i < 16; i++) {
        u32 w = 0;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            u32 k = 4 * i + b;
            if (k < n) w |= (u32)p[k] << (8 * b);
        }
        m[i] = w;
    }
}

// The chaining value of chunk `chunk` (of `chunk_len` bytes, 1..=1024, or 0 for
// the empty input) at p. With `root`, the last block carries the root flag and
// the result is the digest.
template <int MODE>
__device__ void b3_chunk(u32 cv[8], const u8* p, u32 chunk_len, u64 chunk, bool aligned, bool root, u32 one) {
#pragma unroll
    for (int i = 0; i < 8; i++) cv[i] = B3_IV[i];
    u32 blocks = chunk_len == 0 ? 1 : (chunk_len + 63) / 64;
    u32 last_len = chunk_len - 64 * (blocks - 1);
    u32 m[16];
    // The next full block is loaded before the current one is compressed so
    // that its memory latency overlaps the arithmetic.
    u32 full = last_len == 64 ? blocks : blocks - 1;
    if (full > 0) b3_load_full(m, p, aligned);
    for (u32 j = 0; j < blocks; j++) {
        u32 flags = (j == 0 ? B3_CHUNK_START : 0u);
        u32 len = 64;
        if (j == blocks - 1) {
            flags |= B3_CHUNK_END | (root ? B3_ROOT : 0u);
            len = last_len;
            if (last_len != 64) b3_load_partial(m, p + 64 * j, last_len);
        }
        u32 cur[16];
#pragma unroll
        for (int i = 0; i < 16; i++) cur[i] = m[i];
        if (j + 1 < full) b3_load_full(m, p + 64 * (j + 1), aligned);
        b3_compress<MODE>(cv, cur, chunk, len, flags, one);
    }
}

// Index of the item that owns global group g: the last item whose group_first <= g.
__device__ __forceinline__ u32 b3_find_item(const Blake3Item* items, u32 n_items, u32 g) {
    u32 lo = 0, hi = n_items;  // invariant: items[lo].group_first <= g < items[hi].group_first
    while (hi - lo > 1) {
        u32 mid = (lo + hi) / 2;
        if (items[mid].group_first <= g) lo = mid; else hi = mid;
    }
    return lo;
}

// Folds s_cv[0..k) in place into s_cv[0] (pairs left to right, an odd last
// value carried up); the last merge carries the root flag when `root`.
// Every thread of the block calls it.
template <int MODE>
__device__ void b3_fold(u32 (*s_cv)[9], u32 k, bool root, u32 one) {
    const u32 t = threadIdx.x;
    while (k > 1) {
        u32 pairs = k / 2;
        u32 out[8];
        if (t < pairs) {
            u32 l[8], r[8];
#pragma unroll
            for (int i = 0; i < 8; i++) { l[i] = s_cv[2 * t][i]; r[i] = s_cv[2 * t + 1][i]; }
            b3_parent<MODE>(out, l, r, (root && k == 2) ? B3_ROOT : 0u, one);
        }
        u32 carry[8];
        if (t == 0 && (k & 1)) {
#pragma unroll
            for (int i = 0; i < 8; i++) carry[i] = s_cv[k - 1][i];
        }
        __syncthreads();
        if (t < pairs) {
#pragma unroll
            for (int i = 0; i < 8; i++) s_cv[t][i] = out[i];
        }
        if (t == 0 && (k & 1)) {
#pragma unroll
            for (int i = 0; i < 8; i++) s_cv[pairs][i] = carry[i];
        }
        __syncthreads();
        k = pairs + (k & 1);
    }
}

template <int MODE>
__device__ __forceinline__ void b3_digest(const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    __shared__ u32 s_cv[B3_GROUP][9];  // padded against bank conflicts
    __shared__ u32 s_item;
    __shared__ u32 s_last;
    const u32 g = blockIdx.x;
    const u32 t = threadIdx.x;
    if (t == 0) s_item = b3_find_item(items, n_items, g);
    __syncthreads();
    const Blake3Item it = items[s_item];
    const u32 local_group = g - it.group_first;
    const u64 chunks = it.len == 0 ? 1 : (it.len + 1023) / 1024;
    const u64 first_chunk = (u64)local_group * B3_GROUP;
    const u32 n = (u32)min((u64)B3_GROUP, chunks - first_chunk);
    const bool single = it.groups == 1;
    const u8* base = (const u8*)it.data;
    const bool aligned = (it.data & 15) == 0;
    if (t < n) {
        u64 c = first_chunk + t;
        u64 off = c * 1024;
        u32 len = it.len == 0 ? 0u : (u32)min((u64)1024, it.len - off);
        u32 cv[8];
        b3_chunk<MODE>(cv, base + off, len, c, aligned, chunks == 1, one);
#pragma unroll
        for (int i = 0; i < 8; i++) s_cv[t][i] = cv[i];
    }
    __syncthreads();
    b3_fold<MODE>(s_cv, n, single, one);
    if (single) {
        if (t < 8) ((u32*)it.out)[t] = s_cv[0][t];
        return;
    }
    // Climb: publish this value; the last of its set of 64 folds the set.
    u32* vals = cvs + it.cv_first * 8;
    u32* ctrs = counters + it.ctr_first;
    u32 idx = local_group;
    u32 count = it.groups;
    while (true) {
        if (t < 8) vals[(u64)idx * 8 + t] = s_cv[0][t];
        __threadfence();
        __syncthreads();
        const u32 parent = idx / B3_GROUP;
        const u32 siblings = min(B3_GROUP, count - parent * B3_GROUP);
        const u32 parents = (count + B3_GROUP - 1) / B3_GROUP;
        if (t == 0) {
            u32 old = atomicAdd(&ctrs[parent], 1u);
            s_last = old == siblings - 1;
            // Reset for the next use of the scratch: every sibling has counted.
            if (s_last) ctrs[parent] = 0;
        }
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        if (t < siblings) {
#pragma unroll
            for (int i = 0; i < 8; i++) s_cv[t][i] = __ldcg(&vals[((u64)parent * B3_GROUP + t) * 8 + i]);
        }
        __syncthreads();
        b3_fold<MODE>(s_cv, siblings, parents == 1, one);
        if (parents == 1) {
            if (t < 8) ((u32*)it.out)[t] = s_cv[0][t];
            return;
        }
        vals += (u64)count * 8;
        ctrs += parents;
        idx = parent;
        count = parents;
    }
}

extern "C" __global__ void __launch_bounds__(B3_GROUP) blake3_digest_latency(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3_digest<0>(items, n_items, cvs, counters, one);
}

extern "C" __global__ void __launch_bounds__(B3_GROUP) blake3_digest_throughput(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3_digest<1>(items, n_items, cvs, counters, one);
}
