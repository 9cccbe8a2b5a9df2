// Lab variants of the BLAKE3 kernels, for `kvcore gpu-bench` only: the
// tools (src/tools/lab/blake3.rs) append this file to the source of
// cuda/blake3.cu as kvcore compiles it (the same defines, through
// kvcore::gpu::ModuleId::source), so every variant below instantiates the
// production device code with other template arguments or adds a trace.
// kvcore's own modules never contain these entry points.

#ifdef B3_PAIR
// Programmatic dependent launch's early trigger (sm_90 and later; a no-op
// where the launch did not ask for it).
__device__ __forceinline__ void b3x_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The chunk launch triggering its dependents at the start of every block,
// so that the fold launch's blocks become resident while the chunk launch
// drains (measured on an H200: no faster than the library's launch, which
// does not trigger early).
extern "C" __global__ void __launch_bounds__(32 * B3_MULTI) b3x_multi_trigger(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3x_launch_dependents();
    b3_digest_multi<1, 1, false>(items, n_items, cvs, counters, one);
}

// The chunk launch with the plain table search (b3_find_item) instead of
// the proportional guess.
extern "C" __global__ void __launch_bounds__(32 * B3_MULTI) b3x_multi_store(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3_digest_multi<1, 1, false, false>(items, n_items, cvs, counters, one);
}

// One launch whose warps climb (the warp that hands over a set's value last
// folds the set), with the plain table search: the single-launch scheme that
// the two launches replaced (256 MiB: 181-183 us against 169.5-175).
extern "C" __global__ void __launch_bounds__(32 * B3_MULTI) b3x_multi_climb(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3_digest_multi<1, 1, true, false>(items, n_items, cvs, counters, one);
}

// blake3_digest_multi's chunk launch with, per block, its start and end
// (globaltimer ns), the cycles (clock64) in between, and the SM it ran on
// (high word) with the set folds its warps did while climbing (low word).
extern "C" __global__ void __launch_bounds__(32 * B3_MULTI) b3x_multi_trace(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one, u64* trace) {
    __shared__ u32 s_folds;
    u64 t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const u64 c0 = clock64();
    if (threadIdx.x == 0) s_folds = 0;
    __syncthreads();
    b3_digest_multi<1, 1, false>(items, n_items, cvs, counters, one, &s_folds);
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        u64* r = trace + 4 * (u64)blockIdx.x;
        r[0] = t0; r[1] = t1; r[2] = clock64() - c0; r[3] = ((u64)smid << 32) | s_folds;
    }
}

// One climbing launch whose chunk loop tests the alignment at each load
// (AL 0), against the two fixed loops of blake3_digest_multi (AL 1, measured
// 2.0-3.9 % more throughput on 288 MiB).
extern "C" __global__ void __launch_bounds__(32 * B3_MULTI) b3x_multi_branchy(
    const Blake3Item* __restrict__ items, u32 n_items, u32* cvs, u32* counters, u32 one) {
    b3_digest_multi<1, 0, true, false>(items, n_items, cvs, counters, one);
}
#endif  // B3_PAIR

#ifdef B3_ONE
// With the signature of blake3_digest_one_flag plus a trace (null: none, 8
// words per block otherwise, see b3_digest_one): the one-image kernel with
// the trace; its chunk loop unrolled twice over two buffers (CV 2); and
// b3_chunk's loop for every chunk (CV 0: the chunk phase takes 12.1 us on
// 3 MiB against 10.4-10.6 with b3_chunk_whole's loop).
extern "C" __global__ void __launch_bounds__(B3_GROUP) b3x_one_trace(u64 data, u64 len, u64 out, u32 groups, u32* cvs,
                                                                    u32* counters, u32 one, u32* flag, u32 seq,
                                                                    u64* trace) {
    b3_digest_one<1>(b3_item(data, len, out, groups), blockIdx.x, cvs, counters, one, trace, flag, seq);
}
extern "C" __global__ void __launch_bounds__(B3_GROUP) b3x_one_whole2(u64 data, u64 len, u64 out, u32 groups, u32* cvs,
                                                                     u32* counters, u32 one, u32* flag, u32 seq,
                                                                     u64* trace) {
    b3_digest_one<2>(b3_item(data, len, out, groups), blockIdx.x, cvs, counters, one, trace, flag, seq);
}
extern "C" __global__ void __launch_bounds__(B3_GROUP) b3x_one_generic(u64 data, u64 len, u64 out, u32 groups, u32* cvs,
                                                                      u32* counters, u32 one, u32* flag, u32 seq,
                                                                      u64* trace) {
    b3_digest_one<0>(b3_item(data, len, out, groups), blockIdx.x, cvs, counters, one, trace, flag, seq);
}

// An empty kernel whose block 0 only raises the flag: what launch and
// completion cost alone (no digest is computed).
extern "C" __global__ void __launch_bounds__(B3_GROUP) b3x_one_empty(u64 data, u64 len, u64 out, u32 groups, u32* cvs,
                                                                    u32* counters, u32 one, u32* flag, u32 seq,
                                                                    u64* trace) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && flag != nullptr) {
        __threadfence_system();
        *(volatile u32*)flag = seq;
    }
}
#endif  // B3_ONE
