// BLAKE3-256 of many device-resident byte strings in one launch (two for
// the default large-batch path, blake3_digest_multi; see below).
//
// One thread per 1 KiB chunk, one thread block per group of 64 consecutive
// chunks of one item. Each thread compresses its chunk (16 blocks, sequential
// by definition of BLAKE3), then the block folds its 64 chaining values
// pairwise into the group's value in shared memory. Above that, values are
// folded 64 at a time, level by level, by whichever block finishes a set last
// (an atomic counter per set, after a fence: the classic last-block
// reduction), so no idle tree stage is needed. The top fold carries the root
// flag; an item of one chunk sets it on its last block.
//
// blake3_digest_multi, the default for large batches, does not climb: its
// warps store their groups' values, and a second, small launch
// (blake3_fold_sets, with programmatic dependent launch) folds every set
// above them with the same last-warp reduction. A block whose warp folded a
// set under full load held its slot 15-30 us longer with three warps idle,
// and the last sets' folds ran while the GPU drained: measured on an H200,
// 256 MiB as 85 images of 3 MiB or one item take 169.5-175 us in the two
// launches against 181-183 us in one.
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
//
// Compiled with B3_PAIR defined (a module of its own, so that the kernels
// above never depend on it), the kernels that hash two whole chunks per
// thread side by side, one warp per group: twice the independent
// instructions per thread, half the warps. blake3_digest_multi, the
// default for large batches, puts four such warps in a block and folds
// their four groups side by side (see its section). With B3_ONE defined,
// the one-image kernel (one item by value, a completion flag; see its
// section).

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

// One warp's hand-over of a value to its level's set of 64: lane `lane` 0
// stores `v` at slot `idx` of the level (`vals`) and counts it in the set's
// counter with one acquire-release atomic add (the release orders its own
// stores before the count; in the warp that counts last, the acquire, then a
// __syncwarp by the caller, order every lane's loads of the siblings after
// all their stores). Returns, in every lane, whether this warp counted last;
// that warp resets the counter for the next use of the scratch (every
// sibling has counted).
__device__ __forceinline__ bool b3_hand_over(u32* vals, u32* ctrs, u32 idx, u32 parent, u32 siblings, const u32* v,
                                             u32 lane) {
    u32 last = 0;
    if (lane == 0) {
        uint4* p = (uint4*)&vals[(u64)idx * 8];
        __stcg(p, make_uint4(v[0], v[1], v[2], v[3]));
        __stcg(p + 1, make_uint4(v[4], v[5], v[6], v[7]));
        u32 old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(&ctrs[parent]), "r"(1u) : "memory");
        last = old == siblings - 1;
        if (last) ctrs[parent] = 0;
    }
    return __shfl_sync(0xffffffffu, last, 0) != 0;
}

// Value `lane` of k (k <= 32) held by the lanes in v: folds them into lane
// 0's v; the last merge carries ROOT when `root`. Every lane of the warp
// calls it (lanes past the values compute and drop garbage).
__device__ __forceinline__ void b3_fold_lanes(u32 v[8], u32 k, bool root, u32 one) {
    const u32 lane = threadIdx.x % 32;
    while (k > 1) {
        u32 l[8], r[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            l[i] = __shfl_sync(0xffffffffu, v[i], (2 * lane) & 31);
            r[i] = __shfl_sync(0xffffffffu, v[i], (2 * lane + 1) & 31);
        }
        u32 out[8];
        b3_parent<0>(out, l, r, (root && k == 2) ? B3_ROOT : 0u, one);
        const bool merged = lane < k / 2;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = merged ? out[i] : l[i];
        k = (k + 1) / 2;
    }
}

// The first level over k values (k <= 64), lane l given values 2l (in l)
// and 2l + 1 (in r): merges them, or keeps the left one when it is the odd
// last value, into v. Returns the number of values left.
__device__ __forceinline__ u32 b3_fold_first(u32 v[8], const u32 l[8], const u32 r[8], u32 k, bool root, u32 one) {
    const u32 lane = threadIdx.x % 32;
    u32 out[8];
    b3_parent<0>(out, l, r, (root && k == 2) ? B3_ROOT : 0u, one);
    const bool merged = lane < k / 2;
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = merged ? out[i] : l[i];
    return (k + 1) / 2;
}

// Set `parent` of a level whose values lie at vals (its `siblings` values,
// 1 to 64, written by other blocks): lane l loads values 2l and 2l + 1 past
// L1 and the warp folds them into lane 0's v (the last merge carries ROOT
// when `top`); a lone value is carried up unmerged. Every lane of the warp
// calls it, after the hand-over that made the set complete.
__device__ __forceinline__ void b3_fold_stored_set(u32 v[8], const u32* vals, u32 parent, u32 siblings, bool top,
                                                   u32 lane, u32 one) {
    const u32 a = min(2 * lane, siblings - 1), b = min(2 * lane + 1, siblings - 1);
    const uint4* pa = (const uint4*)&vals[((u64)parent * B3_GROUP + a) * 8];
    const uint4* pb = (const uint4*)&vals[((u64)parent * B3_GROUP + b) * 8];
    const uint4 la = __ldcg(pa), lb = __ldcg(pa + 1), ra = __ldcg(pb), rb = __ldcg(pb + 1);
    const u32 l[8] = {la.x, la.y, la.z, la.w, lb.x, lb.y, lb.z, lb.w};
    const u32 r[8] = {ra.x, ra.y, ra.z, ra.w, rb.x, rb.y, rb.z, rb.w};
    if (siblings == 1) {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = l[i];
    } else {
        b3_fold_lanes(v, b3_fold_first(v, l, r, siblings, top, one), top, one);
    }
}

#ifdef B3_PAIR
// Two compressions side by side (states a and b), for ILP: the same
// schedule as b3_compress, written once per state so that the compiler can
// interleave the two independent dependency chains.
#define B3_ROUND_P(P, M, s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15) \
    do {                                                        \
        B3_G(P##0, P##4, P##8, P##12, M[s0], M[s1]);        \
        B3_G(P##1, P##5, P##9, P##13, M[s2], M[s3]);        \
        B3_G(P##2, P##6, P##10, P##14, M[s4], M[s5]);       \
        B3_G(P##3, P##7, P##11, P##15, M[s6], M[s7]);       \
        B3_G(P##0, P##5, P##10, P##15, M[s8], M[s9]);       \
        B3_G(P##1, P##6, P##11, P##12, M[s10], M[s11]);     \
        B3_G(P##2, P##7, P##8, P##13, M[s12], M[s13]);      \
        B3_G(P##3, P##4, P##9, P##14, M[s14], M[s15]);      \
    } while (0)
#define B3_ROUND2(...)                    \
    do {                                  \
        B3_ROUND_P(a, ma, __VA_ARGS__);   \
        B3_ROUND_P(b, mb, __VA_ARGS__);   \
    } while (0)

template <int MODE>
__device__ __forceinline__ void b3_compress2(u32 cva[8], const u32 ma[16], u64 ctra, u32 cvb[8], const u32 mb[16], u64 ctrb,
                                             u32 flags, u32 one) {
    u32 a0 = cva[0], a1 = cva[1], a2 = cva[2], a3 = cva[3], a4 = cva[4], a5 = cva[5], a6 = cva[6], a7 = cva[7];
    u32 a8 = B3_IV[0], a9 = B3_IV[1], a10 = B3_IV[2], a11 = B3_IV[3];
    u32 a12 = (u32)ctra, a13 = (u32)(ctra >> 32), a14 = 64u, a15 = flags;
    u32 b0 = cvb[0], b1 = cvb[1], b2 = cvb[2], b3 = cvb[3], b4 = cvb[4], b5 = cvb[5], b6 = cvb[6], b7 = cvb[7];
    u32 b8 = B3_IV[0], b9 = B3_IV[1], b10 = B3_IV[2], b11 = B3_IV[3];
    u32 b12 = (u32)ctrb, b13 = (u32)(ctrb >> 32), b14 = 64u, b15 = flags;
    B3_ROUND2(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    B3_ROUND2(2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8);
    B3_ROUND2(3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1);
    B3_ROUND2(10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6);
    B3_ROUND2(12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4);
    B3_ROUND2(9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7);
    B3_ROUND2(11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13);
    cva[0] = a0 ^ a8; cva[1] = a1 ^ a9; cva[2] = a2 ^ a10; cva[3] = a3 ^ a11;
    cva[4] = a4 ^ a12; cva[5] = a5 ^ a13; cva[6] = a6 ^ a14; cva[7] = a7 ^ a15;
    cvb[0] = b0 ^ b8; cvb[1] = b1 ^ b9; cvb[2] = b2 ^ b10; cvb[3] = b3 ^ b11;
    cvb[4] = b4 ^ b12; cvb[5] = b5 ^ b13; cvb[6] = b6 ^ b14; cvb[7] = b7 ^ b15;
}

// Chaining values of two whole (1024-byte), non-root chunks: chunk `ca` at
// pa and chunk `ca + 32` at pb, side by side.
// AL 1 (blake3_digest_multi's) picks one of two loops by `aligned`, each
// with its loads fixed (the aligned one then holds no branch and no byte
// loads: 1639 instructions instead of 1868 in the loop body); AL 0 (the
// other kernels) tests `aligned` at each load inside the loop. Measured on
// an H200: 2.0-3.9 % more throughput on 288 MiB with AL 1.
template <int MODE, int AL = 0>
__device__ void b3_chunk2(u32 cva[8], u32 cvb[8], const u8* pa, const u8* pb, u64 ca, bool aligned, u32 one) {
    if (AL == 1) {
        if (aligned) {
            b3_chunk2<MODE, 2>(cva, cvb, pa, pb, ca, true, one);
        } else {
            b3_chunk2<MODE, 3>(cva, cvb, pa, pb, ca, false, one);
        }
        return;
    }
    if (AL == 2) aligned = true;
    if (AL == 3) aligned = false;
#pragma unroll
    for (int i = 0; i < 8; i++) { cva[i] = B3_IV[i]; cvb[i] = B3_IV[i]; }
    u32 ma[16], mb[16];
    b3_load_full(ma, pa, aligned);
    b3_load_full(mb, pb, aligned);
    for (u32 j = 0; j < 16; j++) {
        u32 xa[16], xb[16];
#pragma unroll
        for (int i = 0; i < 16; i++) { xa[i] = ma[i]; xb[i] = mb[i]; }
        if (j + 1 < 16) {
            b3_load_full(ma, pa + 64 * (j + 1), aligned);
            b3_load_full(mb, pb + 64 * (j + 1), aligned);
        }
        u32 flags = (j == 0 ? B3_CHUNK_START : 0u) | (j == 15 ? B3_CHUNK_END : 0u);
        b3_compress2<MODE>(cva, xa, ca, cvb, xb, ca + B3_GROUP / 2, flags, one);
    }
}

// The chunk values of the group's n chunks from first_chunk into s_cv, by
// one warp (lane t): two chunks per thread (t and t + 32), hashed side by
// side when both are whole: twice the independent instructions per thread.
template <int MODE, int AL = 0>
__device__ __forceinline__ void b3_pair_chunks(const Blake3Item& it, u64 first_chunk, u32 n, u32 t, u32 (*s_cv)[9], u32 one) {
    const u64 chunks = it.len == 0 ? 1 : (it.len + 1023) / 1024;
    const u8* base = (const u8*)it.data;
    const bool aligned = (it.data & 15) == 0;
    const u64 ca = first_chunk + t, cb = ca + B3_GROUP / 2;
    if (t + B3_GROUP / 2 < n && (cb + 1) * 1024 <= it.len) {
        u32 cva[8], cvb[8];
        b3_chunk2<MODE, AL>(cva, cvb, base + ca * 1024, base + cb * 1024, ca, aligned, one);
#pragma unroll
        for (int i = 0; i < 8; i++) { s_cv[t][i] = cva[i]; s_cv[t + B3_GROUP / 2][i] = cvb[i]; }
    } else {
        for (u32 k = t; k < n; k += B3_GROUP / 2) {
            u64 c = first_chunk + k;
            u64 off = c * 1024;
            u32 len = it.len == 0 ? 0u : (u32)min((u64)1024, it.len - off);
            u32 cv[8];
            b3_chunk<MODE>(cv, base + off, len, c, aligned, chunks == 1, one);
#pragma unroll
            for (int i = 0; i < 8; i++) s_cv[k][i] = cv[i];
        }
    }
}

#endif  // B3_PAIR

// Index of the item that owns global group g: the last item whose group_first <= g.
__device__ __forceinline__ u32 b3_find_item(const Blake3Item* items, u32 n_items, u32 g) {
    u32 lo = 0, hi = n_items;  // invariant: items[lo].group_first <= g < items[hi].group_first
    while (hi - lo > 1) {
        u32 mid = (lo + hi) / 2;
        if (items[mid].group_first <= g) lo = mid; else hi = mid;
    }
    return lo;
}

// b3_find_item for a kernel that knows the batch's group count: first the
// proportional guess g * n_items / total_groups, which is the item when all
// items have one size (one round trip for the guess and its successor
// instead of log2(n_items) dependent loads), then the binary search in what
// the guess leaves.
__device__ __forceinline__ u32 b3_find_item_near(const Blake3Item* items, u32 n_items, u32 g, u32 total_groups) {
    const u32 guess = (u32)((u64)g * n_items / total_groups);
    const u32 f0 = items[guess].group_first;
    const u32 f1 = guess + 1 < n_items ? items[guess + 1].group_first : total_groups;
    if (f0 <= g && g < f1) return guess;
    // invariant: items[lo].group_first <= g < items[hi].group_first (hi = n_items: none)
    u32 lo = f0 <= g ? guess + 1 : 0, hi = f0 <= g ? n_items : guess;
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

// After a group's chunk values are in s_cv[0..n): folds them into the
// group's value, then climbs the tree (the last block of each set of 64
// folds the set). Returns true in the block that wrote the item's digest
// (the same value in every thread of the block).
template <int MODE>
__device__ __forceinline__ bool b3_finish(const Blake3Item& it, u32 local_group, u32 n, u32 (*s_cv)[9], u32* s_last,
                                          u32* cvs, u32* counters, u32 one) {
    const u32 t = threadIdx.x;
    const bool single = it.groups == 1;
    b3_fold<MODE>(s_cv, n, single, one);
    if (single) {
        if (t < 8) ((u32*)it.out)[t] = s_cv[0][t];
        return true;
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
            *s_last = old == siblings - 1;
            // Reset for the next use of the scratch: every sibling has counted.
            if (*s_last) ctrs[parent] = 0;
        }
        __syncthreads();
        if (!*s_last) return false;
        __threadfence();
        for (u32 k = t; k < siblings; k += blockDim.x) {
#pragma unroll
            for (int i = 0; i < 8; i++) s_cv[k][i] = __ldcg(&vals[((u64)parent * B3_GROUP + k) * 8 + i]);
        }
        __syncthreads();
        b3_fold<MODE>(s_cv, siblings, parents == 1, one);
        if (parents == 1) {
            if (t < 8) ((u32*)it.out)[t] = s_cv[0][t];
            return true;
        }
        vals += (u64)count * 8;
        ctrs += parents;
        idx = parent;
        count = parents;
    }
}

template <int MODE, int PAIR>
__device__ __forceinline__ void b3_digest(const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one,
                                          u32 g) {
    __shared__ u32 s_cv[B3_GROUP][9];  // padded against bank conflicts
    __shared__ u32 s_item;
    __shared__ u32 s_last;
    const u32 t = threadIdx.x;
    if (t == 0) s_item = b3_find_item(items, n_items, g);
    __syncthreads();
    const Blake3Item it = items[s_item];
    const u32 local_group = g - it.group_first;
    const u64 chunks = it.len == 0 ? 1 : (it.len + 1023) / 1024;
    const u64 first_chunk = (u64)local_group * B3_GROUP;
    const u32 n = (u32)min((u64)B3_GROUP, chunks - first_chunk);
    const u8* base = (const u8*)it.data;
    const bool aligned = (it.data & 15) == 0;
#ifdef B3_PAIR
    if (PAIR) {
        b3_pair_chunks<MODE>(it, first_chunk, n, t, s_cv, one);
    } else
#endif
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
    b3_finish<MODE>(it, local_group, n, s_cv, &s_last, cvs, counters, one);
}

extern "C" __global__ void __launch_bounds__(B3_GROUP) blake3_digest_latency(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3_digest<0, 0>(items, n_items, cvs, counters, one, blockIdx.x);
}

extern "C" __global__ void __launch_bounds__(B3_GROUP) blake3_digest_throughput(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3_digest<1, 0>(items, n_items, cvs, counters, one, blockIdx.x);
}

#ifdef B3_PAIR
// Four groups per block, their folds side by side: blake3_digest_multi.
//
// Why: a group's own fold is 6 levels of 32, 16, 8, 4, 2, 1 parents; with
// one warp per group (blake3_digest_pair) each level costs a whole warp's
// compression, so the fold of a group costs 6 compressions of issue where 2
// would carry its 63 parents: 16 % of that kernel's instructions. With W
// groups in one block the levels of all W groups are spread over all lanes
// of the block; W = 4 needs 4 + 2 + 1 + 1 + 1 + 1 warp compressions for 4
// groups, 2.5 per group instead of 6 (measured on an H200: 1.44-1.49
// against 1.30-1.35 TB/s on 288 MiB; W = 2 gave 1.38, W = 8 1.41-1.45).

// Folds groups of values in place, side by side: group w's k[w] values
// start at row w * 64 of s_cv; at each level its value j sits at row
// j * stride, so a value carried up (odd count) never moves and no two
// threads write a row another reads (one barrier per level, none between
// the reads and the writes). Group w's last merge carries the root flag
// when bit w of rootmask is set. Every thread of the block (WARP: of the
// warp, with s_cv its own rows) calls it; on return row w * 64 holds group
// w's value.
template <int MODE, int W, bool WARP>
__device__ __forceinline__ void b3_fold_strided(u32 (*s_cv)[9], u32 (&k)[W], u32 rootmask, u32 one) {
    const u32 t = WARP ? threadIdx.x % 32 : threadIdx.x;
    u32 stride = 1;
    while (true) {
        // This thread's merge: the p_sel-th pair of group w_sel, numbering
        // the pairs of all groups one after another.
        u32 total = 0, w_sel = W, p_sel = 0, k_sel = 0;
#pragma unroll
        for (int w = 0; w < W; w++) {
            const u32 pw = k[w] / 2;
            if (w_sel == W && t >= total && t < total + pw) { w_sel = w; p_sel = t - total; k_sel = k[w]; }
            total += pw;
        }
        if (total == 0) break;
        if (w_sel < W) {
            u32 l[8], r[8], out[8];
            const u32 a = w_sel * B3_GROUP + 2 * p_sel * stride;
#pragma unroll
            for (int i = 0; i < 8; i++) { l[i] = s_cv[a][i]; r[i] = s_cv[a + stride][i]; }
            b3_parent<MODE>(out, l, r, (((rootmask >> w_sel) & 1u) && k_sel == 2) ? B3_ROOT : 0u, one);
#pragma unroll
            for (int i = 0; i < 8; i++) s_cv[a][i] = out[i];
        }
        if (WARP) __syncwarp(); else __syncthreads();
#pragma unroll
        for (int w = 0; w < W; w++) k[w] = (k[w] + 1) / 2;
        stride *= 2;
    }
}

// b3_finish's climb for one warp (lanes of threadIdx.x % 32), after its
// group's value is in s_cv[0] (its own 64 rows), so that the warps of a
// block climb independently, each level's value handed over by
// b3_hand_over (one acquire-release atomic add instead of a fence and an
// atomic; measured: 0.3 µs less per hand-over than a fence,
// docs/benchmarks.md).
template <int MODE>
__device__ __forceinline__ void b3_climb_warp(const Blake3Item& it, u32 local_group, u32 (*s_cv)[9], u32* cvs,
                                              u32* counters, u32 one, u32* folds = nullptr) {
    const u32 lane = threadIdx.x % 32;
    u32* vals = cvs + it.cv_first * 8;
    u32* ctrs = counters + it.ctr_first;
    u32 idx = local_group;
    u32 count = it.groups;
    while (true) {
        const u32 parent = idx / B3_GROUP;
        const u32 siblings = min(B3_GROUP, count - parent * B3_GROUP);
        const u32 parents = (count + B3_GROUP - 1) / B3_GROUP;
        if (!b3_hand_over(vals, ctrs, idx, parent, siblings, s_cv[0], lane)) return;
        __syncwarp();
        if (folds != nullptr && lane == 0) atomicAdd(folds, 1u);
        for (u32 k = lane; k < siblings; k += 32) {
#pragma unroll
            for (int i = 0; i < 8; i++) s_cv[k][i] = __ldcg(&vals[((u64)parent * B3_GROUP + k) * 8 + i]);
        }
        __syncwarp();
        u32 kk[1] = {siblings};
        b3_fold_strided<MODE, 1, true>(s_cv, kk, parents == 1 ? 1u : 0u, one);
        if (parents == 1) {
            if (lane < 8) ((u32*)it.out)[lane] = s_cv[0][lane];
            return;
        }
        vals += (u64)count * 8;
        ctrs += parents;
        idx = parent;
        count = parents;
    }
}

// Groups (warps) per block of blake3_digest_multi; src/gpu/kernels.rs
// defines it from BLAKE3_MULTI_GROUPS, which sizes the launch.
#ifndef B3_MULTI
#define B3_MULTI 4
#endif

// B3_MULTI groups per block of as many warps: warp w hashes group
// blockIdx.x * B3_MULTI + w (two chunks per thread, as blake3_digest_pair),
// then the block folds its groups side by side, then each warp climbs on
// its own (CLIMB) or stores its group's value for b3_fold_sets (a later
// launch; blake3_digest_multi). Launch with ceil(groups / B3_MULTI) blocks
// of 32 B3_MULTI threads; warps past the last group only take part in the
// fold's barriers. NEAR: the item search starts from the proportional
// guess (b3_find_item_near).
template <int MODE, int AL = 0, bool CLIMB = true, bool NEAR = true>
__device__ __forceinline__ void b3_digest_multi(const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters,
                                                u32 one, u32* folds = nullptr) {
    constexpr int W = B3_MULTI;
    __shared__ u32 s_cv[W * B3_GROUP][9];
    __shared__ u32 s_n[W];
    const u32 w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Blake3Item& last_item = items[n_items - 1];
    const u32 total_groups = last_item.group_first + last_item.groups;
    const u32 g = blockIdx.x * W + w;
    const bool valid = g < total_groups;
    u32 item = 0;
    if (valid && lane == 0) {
        item = NEAR ? b3_find_item_near(items, n_items, g, total_groups) : b3_find_item(items, n_items, g);
    }
    item = __shfl_sync(0xffffffffu, item, 0);
    const Blake3Item it = items[item];
    const u32 local_group = g - it.group_first;
    u32 n = 0;
    if (valid) {
        const u64 chunks = it.len == 0 ? 1 : (it.len + 1023) / 1024;
        const u64 first_chunk = (u64)local_group * B3_GROUP;
        n = (u32)min((u64)B3_GROUP, chunks - first_chunk);
        b3_pair_chunks<MODE, AL>(it, first_chunk, n, lane, s_cv + w * B3_GROUP, one);
    }
    // Each warp's count of values; bit 31 marks a group that is its item's
    // whole tree (root flag on its last merge).
    if (lane == 0) s_n[w] = n | (valid && it.groups == 1 ? 0x80000000u : 0u);
    __syncthreads();
    u32 k[W];
    u32 rootmask = 0;
#pragma unroll
    for (int j = 0; j < W; j++) {
        const u32 v = s_n[j];
        k[j] = v & 0x7fffffffu;
        rootmask |= (v >> 31) << j;
    }
    b3_fold_strided<MODE, W, false>(s_cv, k, rootmask, one);
    if (!valid) return;
    u32 (*mine)[9] = s_cv + w * B3_GROUP;
    if (it.groups == 1) {
        if (lane < 8) ((u32*)it.out)[lane] = mine[0][lane];
        return;
    }
    if (!CLIMB) {
        // The group's value for b3_fold_sets (a later launch).
        if (lane < 8) cvs[(it.cv_first + local_group) * 8 + lane] = mine[0][lane];
        return;
    }
    b3_climb_warp<MODE>(it, local_group, mine, cvs, counters, one, folds);
}

// Programmatic dependent launch (sm_90 and later; no-ops where the launch
// did not ask for it): the fold launch waits for the chunk launch's
// completion (and its stores) only after the part of its work that reads
// nothing the chunk launch writes. The chunk launch does not trigger its
// dependents early (a chunk launch that triggers them at the start of every
// block was measured no faster), so the fold launch starts as its last
// block exits, without a launch gap.
__device__ __forceinline__ void b3_wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The folds above the groups, as a launch of their own after the chunk
// launch (b3_digest_multi with CLIMB false), which stored every group's
// value: warp j looks at global groups 32j .. 32j + 31 and, for each that
// starts a set of 64 values of an item of several groups, folds that set in
// registers (lane l merges values 2l and 2l + 1, then shuffles, as the
// one-image kernel), then hands the result over to the next level as
// b3_climb_warp does; the warp that counts a set last folds it, up to the
// root. Plain additions (MODE 0): few warps, each on its own chain.
// Launch with ceil(groups / 32) warps in blocks of 128 threads.
//
// Finding the sets: the items that can start one in the warp's 32 groups
// are the item of group 32j and the (at most) 31 after it, one per lane;
// an item's sets start 64 groups apart, so at most one of them falls in
// the window. One table search per warp, then one load per lane.
__device__ __forceinline__ void b3_fold_sets(const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters,
                                             u32 one) {
    const u32 lane = threadIdx.x % 32;
    const u32 warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const Blake3Item& last_item = items[n_items - 1];
    const u32 total_groups = last_item.group_first + last_item.groups;
    const u32 g0 = warp * 32;
    u32 first = 0, start = 0;
    bool leader = false;
    if (g0 < total_groups) {
        first = b3_find_item_near(items, n_items, g0, total_groups);
        if (first + lane < n_items) {
            const u32 gf = items[first + lane].group_first, n = items[first + lane].groups;
            if (n > 1 && gf < g0 + 32) {
                start = gf >= g0 ? gf : gf + (g0 - gf + B3_GROUP - 1) / B3_GROUP * B3_GROUP;
                leader = start < g0 + 32 && start - gf < n;
            }
        }
    }
    b3_wait_prerequisites();
    u32 mask = __ballot_sync(0xffffffffu, leader);
    while (mask != 0) {
        const u32 src = __ffs(mask) - 1;
        mask &= mask - 1;
        const Blake3Item it = items[first + src];
        u32* vals = cvs + it.cv_first * 8;
        u32* ctrs = counters + it.ctr_first;
        u32 count = it.groups;
        u32 parent = (__shfl_sync(0xffffffffu, start, src) - it.group_first) / B3_GROUP;
        while (true) {
            // This warp owns set `parent` of the level of `count` values at vals.
            const u32 siblings = min(B3_GROUP, count - parent * B3_GROUP);
            const u32 parents = (count + B3_GROUP - 1) / B3_GROUP;
            const bool top = parents == 1;
            u32 v[8];
            b3_fold_stored_set(v, vals, parent, siblings, top, lane, one);
            if (top) {
                if (lane == 0) {
                    uint4* o = (uint4*)it.out;
                    o[0] = make_uint4(v[0], v[1], v[2], v[3]);
                    o[1] = make_uint4(v[4], v[5], v[6], v[7]);
                }
                break;
            }
            vals += (u64)count * 8;
            ctrs += parents;
            const u32 idx = parent;
            count = parents;
            parent = idx / B3_GROUP;
            if (!b3_hand_over(vals, ctrs, idx, parent, min(B3_GROUP, count - parent * B3_GROUP), v, lane)) break;
            // Orders the lanes' loads after lane 0's acquire.
            __syncwarp();
        }
    }
}

// The chunk launch of the default for large batches: every group's value
// into the scratch (or the digest, for an item of one group), no climb.
// (The digest needs both launches; the fold launch waits for this one.)
// blake3_fold_sets, launched after it when some item has several groups,
// folds the rest.
extern "C" __global__ void __launch_bounds__(32 * B3_MULTI) blake3_digest_multi(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3_digest_multi<1, 1, false>(items, n_items, cvs, counters, one);
}

// The fold launch (see b3_fold_sets), with blake3_digest_multi's signature.
extern "C" __global__ void __launch_bounds__(128) blake3_fold_sets(const Blake3Item* __restrict__ items, u32 n_items,
                                                                  u32* cvs, u32* counters, u32 one) {
    b3_fold_sets(items, n_items, cvs, counters, one);
}

// One warp per group, two chunks per thread (launch with 32 threads per
// block): the default for large batches before blake3_digest_multi, kept as
// a variant that the bench and the tests compare.
extern "C" __global__ void __launch_bounds__(B3_GROUP / 2) blake3_digest_pair(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3_digest<1, 1>(items, n_items, cvs, counters, one, blockIdx.x);
}
#endif  // B3_PAIR

#ifdef B3_ONE
// The one-image call (a module of its own, B3_ONE): the item comes by value
// (no table to read, over PCIe from mapped memory or from device memory,
// before the first load can start), one thread per chunk from global memory,
// plain additions, and a completion flag in host memory that the host spins
// on instead of synchronizing the stream.
//
// The tree above the chunks runs in one warp, in registers: after the chunk
// phase only warp 0 continues. Lane l merges the values 2l and 2l + 1 from
// shared memory, then each level takes the two values it merges from lanes
// 2l and 2l + 1 by shuffles (an odd last value comes along as the left one
// and is kept unmerged): no block barrier and no shared-memory round trip
// per level. Blocks hand over with one acquire-release atomic add (no
// fence), and the block that counts last reads its siblings straight into
// registers, two per lane.
//
// Measured on an H200 (globaltimer inside the kernel, 3 MiB, 48 blocks): the
// chunk phase takes 10.6 us (16 compressions of about 0.65 us: one warp
// issues the ALU instructions of a G layer at 2 cycles each; 12.1 us with
// b3_chunk's loop, see b3_chunk_whole), the group's 6 levels 4.5 us, the
// hand-over 0.6-0.7 us, the last block's 6 levels 4.8 us: the digest is
// written 20.7-21.1 us after the first block starts. The rest of the call
// is launch and completion (5.6-7.3 us for an empty kernel launched as a
// graph, as the call does; 7.4-9.2 by cuLaunchKernel). Tried and slower: staging
// each group's 64 KiB into shared memory first (cp.async), 16 or 8 active
// lanes per warp over more warps, additions on the FMA pipe (longer
// chains), four threads per chunk with the state diagonalised by shuffles,
// an L2 prefetch of each chunk.

__device__ __forceinline__ u64 b3_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The value of a whole (1024-byte), aligned, non-root chunk, by a loop
// that has no partial-block branch: CV 1 (the one-image kernel's) loads
// block j + 1 into a second buffer while block j is compressed (16 moves
// per block); CV 2 (a lab variant, cuda/lab/blake3_x.cu) is unrolled twice over two buffers (no
// moves, twice the loop code, and ptxas may issue the loads late).
// b3_chunk's loop, which also serves partial blocks, compiles to 32 moves
// per block and branches around that path: measured on an H200, the one-image chunk
// phase takes 12.1 us with it and 10.4-10.6 with either loop here.
template <int CV>
__device__ __forceinline__ void b3_chunk_whole(u32 cv[8], const u8* p, u64 chunk, u32 one) {
#pragma unroll
    for (int i = 0; i < 8; i++) cv[i] = B3_IV[i];
    if (CV == 1) {
        u32 m[16];
        b3_load_full(m, p, true);
#pragma unroll 1
        for (u32 j = 0; j < 16; j++) {
            u32 cur[16];
#pragma unroll
            for (int i = 0; i < 16; i++) cur[i] = m[i];
            if (j + 1 < 16) b3_load_full(m, p + 64 * (j + 1), true);
            const u32 flags = (j == 0 ? B3_CHUNK_START : 0u) | (j == 15 ? B3_CHUNK_END : 0u);
            b3_compress<0>(cv, cur, chunk, 64, flags, one);
        }
    } else {
        u32 ma[16], mb[16];
        b3_load_full(ma, p, true);
#pragma unroll 1
        for (u32 j = 0; j < 16; j += 2) {
            b3_load_full(mb, p + 64 * (j + 1), true);
            b3_compress<0>(cv, ma, chunk, 64, j == 0 ? B3_CHUNK_START : 0u, one);
            if (j + 2 < 16) b3_load_full(ma, p + 64 * (j + 2), true);
            b3_compress<0>(cv, mb, chunk, 64, j == 14 ? B3_CHUNK_END : 0u, one);
        }
    }
}

// One group of `it` (64 threads, 64 chunks). With `trace`, lane 0 of warp 0
// records (ns) its start, the end of its chunk, all chunks in, its end, its
// chunk's cycles, whether the block wrote the digest, the end of the
// group's own fold, and when the block learned that it was last of its set
// (0 if never): 8 words per group. With `flag`, the block that wrote the
// digest then raises *flag to `seq` after a system fence.
// CV 1 (the one-image kernel) takes b3_chunk_whole's loop for whole,
// aligned, non-root chunks; the lab's variants (cuda/lab/blake3_x.cu) take
// 2 (its other loop) and 0 (b3_chunk for every chunk).
template <int CV>
__device__ __forceinline__ void b3_digest_one(const Blake3Item& it, u32 local_group, u32* cvs, u32* counters, u32 one,
                                              u64* trace, u32* flag, u32 seq) {
    const u64 t0 = b3_ns(), c0 = clock64();
    __shared__ u32 s_cv[B3_GROUP][9];
    const u32 t = threadIdx.x;
    const u64 chunks = it.len == 0 ? 1 : (it.len + 1023) / 1024;
    const u64 first_chunk = (u64)local_group * B3_GROUP;
    const u32 n = (u32)min((u64)B3_GROUP, chunks - first_chunk);
    const u8* base = (const u8*)it.data;
    const bool aligned = (it.data & 15) == 0;
    if (t < n) {
        u64 c = first_chunk + t;
        u64 off = c * 1024;
        u32 len = it.len == 0 ? 0u : (u32)min((u64)1024, it.len - off);
        u32 cv[8];
        if (CV != 0 && len == 1024 && aligned && chunks > 1) {
            b3_chunk_whole<CV>(cv, base + off, c, one);
        } else {
            b3_chunk<0>(cv, base + off, len, c, aligned, chunks == 1, one);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) s_cv[t][i] = cv[i];
    }
    const u64 t1 = b3_ns(), c1 = clock64();
    __syncthreads();
    if (t >= 32) return;
    const u64 t2 = b3_ns();
    const bool single = it.groups == 1;
    u32 v[8];
    if (n == 1) {
        // One chunk in the group: its value (the digest, for a one-chunk item).
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = s_cv[0][i];
    } else {
        u32 l[8], r[8];
        const u32 a = min(2 * t, n - 1), b = min(2 * t + 1, n - 1);
#pragma unroll
        for (int i = 0; i < 8; i++) { l[i] = s_cv[a][i]; r[i] = s_cv[b][i]; }
        b3_fold_lanes(v, b3_fold_first(v, l, r, n, single, one), single, one);
    }
    const u64 t3 = b3_ns();
    u64 t4 = 0;
    bool done = single;
    if (!single) {
        // Climb: lane 0 publishes the value; the last of its set of 64 folds the set.
        u32* vals = cvs + it.cv_first * 8;
        u32* ctrs = counters + it.ctr_first;
        u32 idx = local_group;
        u32 count = it.groups;
        while (true) {
            const u32 parent = idx / B3_GROUP;
            const u32 siblings = min(B3_GROUP, count - parent * B3_GROUP);
            const u32 parents = (count + B3_GROUP - 1) / B3_GROUP;
            if (!b3_hand_over(vals, ctrs, idx, parent, siblings, v, t)) break;
            // Orders the lanes' loads after lane 0's acquire.
            __syncwarp();
            t4 = b3_ns();
            const bool top = parents == 1;
            b3_fold_stored_set(v, vals, parent, siblings, top, t, one);
            if (top) {
                done = true;
                break;
            }
            vals += (u64)count * 8;
            ctrs += parents;
            idx = parent;
            count = parents;
        }
    }
    if (done && t == 0) {
        uint4* o = (uint4*)it.out;
        o[0] = make_uint4(v[0], v[1], v[2], v[3]);
        o[1] = make_uint4(v[4], v[5], v[6], v[7]);
    }
    if (trace != nullptr && t == 0) {
        u64* rr = trace + 8 * (u64)local_group;
        rr[0] = t0; rr[1] = t1; rr[2] = t2; rr[3] = b3_ns(); rr[4] = c1 - c0; rr[5] = done; rr[6] = t3; rr[7] = t4;
    }
    if (done && flag != nullptr && t == 0) {
        __threadfence_system();
        *(volatile u32*)flag = seq;
    }
}

__device__ __forceinline__ Blake3Item b3_item(u64 data, u64 len, u64 out, u32 groups) {
    Blake3Item it;
    it.data = data;
    it.len = len;
    it.out = out;
    it.cv_first = 0;
    it.ctr_first = 0;
    it.group_first = 0;
    it.groups = groups;
    return it;
}

extern "C" __global__ void __launch_bounds__(B3_GROUP) blake3_digest_one_flag(
    u64 data, u64 len, u64 out, u32 groups, u32* cvs, u32* counters, u32 one, u32* flag, u32 seq) {
    b3_digest_one<1>(b3_item(data, len, out, groups), blockIdx.x, cvs, counters, one, nullptr, flag, seq);
}

#endif  // B3_ONE

