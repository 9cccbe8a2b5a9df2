//! The content hash of a text block of token ids: the router's per-block
//! hash (router keys version 4, docs/router.md "Router keys").
//!
//! A block of `n` tokens (`n` at most [`NH_MAX_TOKENS`]) hashes in two
//! stages: a carry-less NH over the tokens taken as 64-bit words, then a
//! 128-to-64-bit finalizer.
//!
//! ```text
//! t_0 … t_{m-1}  = the tokens, then zeros up to m = n rounded up to a multiple of 4
//! w_j            = t_2j + 2³² · t_2j+1                     (j < m/2, 64-bit words)
//! K_0 … K_127    = the secret: the outputs of SplitMix64 from 0x6B76_636F_7265_434C ("kvcoreCL")
//! H = ⊕_{i < m/4} (w_2i ⊕ K_2i) ⊗ (w_2i+1 ⊕ K_2i+1)       ⊗: carry-less product, 128 bits
//! p = (lo64(H) ⊕ F_A) · (hi64(H) ⊕ F_B) as a 128-bit integer product
//! h = avalanche(lo64(p) ⊕ hi64(p) + n · N_MUL mod 2⁶⁴)
//! avalanche(x) = x ⊕= x ≫ 37; x ·= 0x1656_6791_9E37_79F9; x ⊕= x ≫ 32
//! F_A = 0x9E37_79B9_7F4A_7C15, F_B = 0xC2B2_AE3D_27D4_EB4F, N_MUL = 0x27D4_EB2F_1656_67C5
//! ```
//!
//! The carry-less product multiplies the two words as polynomials over
//! GF(2) (what `PCLMULQDQ` computes). A block of more than
//! [`NH_MAX_TOKENS`] tokens hashes with XXH3-64 over its tokens as u32
//! little-endian bytes: the secret covers 256 tokens, and such blocks are
//! rare enough not to need the fast path. All blocks of one router scope
//! have one size, so the two functions never meet in a chain.
//!
//! **Why the collision chance stays near 2⁻⁶⁴.** `H` is CLNH (Lemire and
//! Kaser, "Faster 64-bit universal hashing using carry-less
//! multiplications", 2015): for two different token sequences of the same
//! padded length and a uniformly random key, `H ⊕ H'` equals any given
//! value with probability at most 2⁻⁶⁴. In short: take a pair `i` where the
//! words differ, and fix every other pair's key; with `u = w_2i ⊕ K_2i` and
//! `v = w_2i+1 ⊕ K_2i+1`, the two sequences' terms differ by
//! `u ⊗ d ⊕ c ⊗ v ⊕ c ⊗ d` (`c`, `d` the words' differences). If `c ≠ 0`,
//! for each `u` at most one `v` makes that difference a given value (the
//! polynomials over GF(2) have no zero divisors); if `c = 0`, then `d ≠ 0`
//! and at most one `u` does. The zero padding is the same for every block
//! of a length, so distinct blocks of one length stay distinct after it.
//! The finalizer maps the 128-bit `H` to 64 bits: a multiply whose both
//! factors depend on all of `H`, folded, then the bijective avalanche of
//! XXH3; distinct values of `H` meet in it with the chance of a random
//! 64-bit function, about 2⁻⁶⁴. The length enters the finalizer, so blocks
//! of different lengths with equal padded tokens (`[x]` and `[x, 0]`) differ
//! too. Two different blocks of one length therefore share a hash with a
//! chance of about 2⁻⁶³ in all. The secret is fixed and public, not a random
//! key: the bounds hold for inputs chosen without regard to it (prompts),
//! not for inputs crafted against it, which is also true of XXH3. A router
//! key collision only misroutes a request (docs/router.md).
//!
//! Speed: one carry-less multiply covers four tokens. With AVX-512 and
//! `VPCLMULQDQ` a 32-token block is two 64-byte loads, two XORs with the
//! secret, two `vpclmulqdq` (four products each) and one XOR, and four
//! blocks' 128-bit lanes are folded together by one transpose (three
//! shuffle pairs and three XORs for the four); then one 64×64→128 multiply
//! a block. That is about a third of the vector work of the two-fold
//! integer NH of version 3 (two multiplies per pair of tokens, plus the
//! shifts), whose loop was bound by the vector ports. With AVX2 and
//! `VPCLMULQDQ` but no AVX-512 (AMD Zen 3, Intel client cores) the vectors
//! are 32 bytes (two products an instruction) and two blocks are folded
//! together at a time. With `PCLMULQDQ`
//! alone the same products run one per instruction on 16-byte vectors, as
//! they do with Arm's `PMULL`; the portable form multiplies in software,
//! four bits at a time. Every path
//! gives bit-identical hashes, and the CPU's features are detected once per
//! process and cached.

use std::sync::atomic::{AtomicU8, Ordering};

/// The longest text block the NH path covers; longer blocks hash with
/// XXH3-64 (see the module docs).
pub const NH_MAX_TOKENS: usize = 256;

/// Words of the secret: one 64-bit word for each two tokens.
const SECRET_WORDS: usize = NH_MAX_TOKENS / 2;

const F_A: u64 = 0x9E37_79B9_7F4A_7C15;
const F_B: u64 = 0xC2B2_AE3D_27D4_EB4F;
const N_MUL: u64 = 0x27D4_EB2F_1656_67C5;
const AVALANCHE_MUL: u64 = 0x1656_6791_9E37_79F9;
const SECRET_SEED: u64 = 0x6B76_636F_7265_434C;

/// The secret, aligned for vector loads.
#[repr(C, align(64))]
struct Secret([u64; SECRET_WORDS]);

const fn make_secret() -> Secret {
    let mut words = [0u64; SECRET_WORDS];
    let mut state = SECRET_SEED;
    let mut i = 0;
    while i < SECRET_WORDS {
        // SplitMix64.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        words[i] = z ^ (z >> 31);
        i += 1;
    }
    Secret(words)
}

static SECRET: Secret = make_secret();

/// The 128-to-64-bit finalizer over the two halves of `H` and the length.
#[inline(always)]
fn finish(lo: u64, hi: u64, n: usize) -> u64 {
    let p = u128::from(lo ^ F_A) * u128::from(hi ^ F_B);
    let mut x = ((p as u64) ^ ((p >> 64) as u64)).wrapping_add((n as u64).wrapping_mul(N_MUL));
    x ^= x >> 37;
    x = x.wrapping_mul(AVALANCHE_MUL);
    x ^ (x >> 32)
}

/// The carry-less product of two 64-bit words, in software: `b` taken four
/// bits at a time against a table of `a`'s products with every 4-bit value.
fn clmul_soft(a: u64, b: u64) -> u128 {
    let mut table = [0u128; 16];
    for i in 1..16 {
        // Each entry from an earlier one: a doubling (i even) or one XOR.
        table[i] = if i % 2 == 0 { table[i / 2] << 1 } else { table[i - 1] ^ u128::from(a) };
    }
    let mut r = 0u128;
    for nibble in (0..16).rev() {
        r = (r << 4) ^ table[((b >> (4 * nibble)) & 0xF) as usize];
    }
    r
}

/// The word of tokens `2j` and `2j + 1` of a block, zeros past its end.
#[inline(always)]
fn word(tokens: &[u32], j: usize) -> u64 {
    let lo = tokens.get(2 * j).copied().unwrap_or(0);
    let hi = tokens.get(2 * j + 1).copied().unwrap_or(0);
    u64::from(lo) | (u64::from(hi) << 32)
}

/// One block's hash on the portable path.
fn hash_scalar(tokens: &[u32]) -> u64 {
    if tokens.len() > NH_MAX_TOKENS {
        return hash_long(tokens);
    }
    clnh(tokens, clmul_soft)
}

/// One block's hash with `mul` as the carry-less multiply, one pair of words
/// at a time: the software path, and Arm's with its instruction.
#[inline(always)]
fn clnh(tokens: &[u32], mul: impl Fn(u64, u64) -> u128) -> u64 {
    let k = &SECRET.0;
    let mut h = 0u128;
    for i in 0..tokens.len().div_ceil(4) {
        h ^= mul(word(tokens, 2 * i) ^ k[2 * i], word(tokens, 2 * i + 1) ^ k[2 * i + 1]);
    }
    finish(h as u64, (h >> 64) as u64, tokens.len())
}

/// A block longer than the secret: XXH3-64 over its little-endian bytes.
fn hash_long(tokens: &[u32]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    if cfg!(target_endian = "little") {
        hasher.update(bytemuck::cast_slice(tokens));
    } else {
        for t in tokens {
            hasher.update(&t.to_le_bytes());
        }
    }
    hasher.digest()
}

/// The carry-less multiply units this process hashes with.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Level {
    Scalar = 1,
    /// `PCLMULQDQ` on 16-byte vectors.
    #[cfg(target_arch = "x86_64")]
    Pclmul = 2,
    /// AVX-512F and `VPCLMULQDQ` on 64-byte vectors.
    #[cfg(target_arch = "x86_64")]
    Avx512 = 3,
    /// Arm's `PMULL` (64×64→128), one product an instruction.
    #[cfg(target_arch = "aarch64")]
    Pmull = 4,
    /// AVX2 and `VPCLMULQDQ` on 32-byte vectors: CPUs with the wide
    /// carry-less multiply but no AVX-512 (AMD Zen 3, Intel client cores
    /// since Alder Lake).
    #[cfg(target_arch = "x86_64")]
    Avx2 = 5,
}

/// 0 until detected, then a `Level` as u8.
static LEVEL: AtomicU8 = AtomicU8::new(0);

fn level() -> Level {
    let cached = LEVEL.load(Ordering::Relaxed);
    let level = match cached {
        1 => return Level::Scalar,
        #[cfg(target_arch = "x86_64")]
        2 => return Level::Pclmul,
        #[cfg(target_arch = "x86_64")]
        3 => return Level::Avx512,
        #[cfg(target_arch = "aarch64")]
        4 => return Level::Pmull,
        #[cfg(target_arch = "x86_64")]
        5 => return Level::Avx2,
        _ => detect(),
    };
    LEVEL.store(level as u8, Ordering::Relaxed);
    level
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        let pclmul = std::arch::is_x86_feature_detected!("pclmulqdq") && std::arch::is_x86_feature_detected!("sse2");
        if pclmul && std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("vpclmulqdq")
        {
            return Level::Avx512;
        }
        if pclmul && std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("vpclmulqdq") {
            return Level::Avx2;
        }
        if pclmul {
            return Level::Pclmul;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("pmull") {
            return Level::Pmull;
        }
    }
    Level::Scalar
}

/// The content hash of one text block of token ids (the recipe is in the
/// module docs). Any length works; 16, 32 and 64 tokens are the fast cases.
/// To hash many blocks, [`block_content_hashes`] dispatches once for all.
pub fn block_content_hash(tokens: &[u32]) -> u64 {
    let mut out = 0;
    block_content_hashes(tokens, tokens.len().max(1), |h| out = h);
    if tokens.is_empty() { hash_scalar(tokens) } else { out }
}

/// Calls `each` with [`block_content_hash`] of every full block of
/// `block_size` tokens of `tokens`, in order; a trailing partial block is
/// not hashed, and a block size of zero hashes nothing.
pub fn block_content_hashes(tokens: &[u32], block_size: usize, mut each: impl FnMut(u64)) {
    block_content_hashes_fold(tokens, block_size, (), |(), h| each(h));
}

/// Folds [`block_content_hash`] of every full block of `block_size` tokens
/// of `tokens`, in order, into `init`: what [`block_content_hashes`] does,
/// with the caller's state passed by value from block to block, so that a
/// state such as a chained key stays in registers instead of going through
/// memory on every block.
pub fn block_content_hashes_fold<S>(tokens: &[u32], block_size: usize, init: S, mut f: impl FnMut(S, u64) -> S) -> S {
    if block_size == 0 {
        return init;
    }
    if block_size > NH_MAX_TOKENS {
        return tokens.chunks_exact(block_size).fold(init, |s, b| f(s, hash_long(b)));
    }
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` returns `Avx512` only when the CPU has AVX-512F,
        // VPCLMULQDQ, PCLMULQDQ and SSE2, detected at run time.
        Level::Avx512 => unsafe { x86::blocks_avx512(tokens, block_size, init, &mut f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` returns `Avx2` only when the CPU has AVX2,
        // VPCLMULQDQ, PCLMULQDQ and SSE2, detected at run time.
        Level::Avx2 => unsafe { x86::blocks_avx2(tokens, block_size, init, &mut f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` returns `Pclmul` only when the CPU has PCLMULQDQ
        // and SSE2, detected at run time.
        Level::Pclmul => unsafe { x86::blocks_pclmul(tokens, block_size, init, &mut f) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `level` returns `Pmull` only when the CPU has PMULL (and
        // so the AES extension), detected at run time.
        Level::Pmull => unsafe { arm::blocks_pmull(tokens, block_size, init, &mut f) },
        Level::Scalar => tokens.chunks_exact(block_size).fold(init, |s, b| f(s, hash_scalar(b))),
    }
}

/// Appends one value for each full block of `block_size` tokens of `tokens`
/// to `out`, in order: `f` takes the state and the block's
/// [`block_content_hash`] and returns the next state and the block's value,
/// as in [`block_content_hashes_fold`]; returns the last state. The values
/// are written straight into room reserved in `out` (no zeroing pass, no
/// length update per block), the cheap way to collect a chain of keys.
pub fn block_content_hashes_extend<S, T>(
    tokens: &[u32],
    block_size: usize,
    init: S,
    out: &mut Vec<T>,
    mut f: impl FnMut(S, u64) -> (S, T),
) -> S {
    let n = tokens.len().checked_div(block_size).unwrap_or(0);
    out.reserve(n);
    let room = &mut out.spare_capacity_mut()[..n];
    let (state, written) = block_content_hashes_fold(tokens, block_size, (init, 0usize), |(s, i), h| {
        let (s, v) = f(s, h);
        room[i].write(v);
        (s, i + 1)
    });
    assert_eq!(written, n, "one value a full block");
    // SAFETY: the fold called the closure once for each of the `n` full
    // blocks (checked above), which wrote the first `n` spare slots, all of
    // them within the room `reserve` made.
    unsafe { out.set_len(out.len() + n) };
    state
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{SECRET, finish};

    /// The two 64-bit halves of a 128-bit vector.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn halves(v: __m128i) -> (u64, u64) {
        (_mm_cvtsi128_si64(v) as u64, _mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v)) as u64)
    }

    /// Loads 4 tokens from the start of `group` (at least 4 long).
    #[inline]
    #[target_feature(enable = "sse2")]
    fn load4(group: &[u32]) -> __m128i {
        assert!(group.len() >= 4);
        // SAFETY: `group` holds at least 4 u32 (checked above), 16 readable
        // bytes; the load is unaligned.
        unsafe { _mm_loadu_si128(group.as_ptr().cast()) }
    }

    /// Pair `i`'s term: the carry-less product of the low and the high word
    /// of the 4 tokens `x`, each XORed with its secret word.
    #[inline]
    #[target_feature(enable = "sse2,pclmulqdq")]
    fn term(x: __m128i, i: usize) -> __m128i {
        let k = load_secret2(i);
        let y = _mm_xor_si128(x, k);
        _mm_clmulepi64_si128::<0x10>(y, y)
    }

    /// The secret words `2i` and `2i + 1`.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn load_secret2(i: usize) -> __m128i {
        let k = &SECRET.0[2 * i..2 * i + 2];
        // SAFETY: `k` is 2 u64, 16 readable bytes; the load is unaligned.
        unsafe { _mm_loadu_si128(k.as_ptr().cast()) }
    }

    /// A block of any length up to `NH_MAX_TOKENS` with PCLMULQDQ, the tail
    /// zero-padded.
    #[inline]
    #[target_feature(enable = "sse2,pclmulqdq")]
    fn block_pclmul(block: &[u32]) -> u64 {
        let mut h = _mm_setzero_si128();
        let mut groups = block.chunks_exact(4);
        let mut i = 0;
        for group in &mut groups {
            h = _mm_xor_si128(h, term(load4(group), i));
            i += 1;
        }
        let tail = groups.remainder();
        if !tail.is_empty() {
            let mut padded = [0u32; 4];
            padded[..tail.len()].copy_from_slice(tail);
            h = _mm_xor_si128(h, term(load4(&padded), i));
        }
        let (lo, hi) = halves(h);
        finish(lo, hi, block.len())
    }

    /// A block of `G` whole 4-token groups with PCLMULQDQ, unrolled, the
    /// terms XORed into two sums so that the XORs overlap.
    #[inline]
    #[target_feature(enable = "sse2,pclmulqdq")]
    fn groups_pclmul<const G: usize>(block: &[u32]) -> u64 {
        let block = &block[..4 * G];
        let (mut h0, mut h1) = (_mm_setzero_si128(), _mm_setzero_si128());
        for i in (0..G).step_by(2) {
            h0 = _mm_xor_si128(h0, term(load4(&block[4 * i..]), i));
            if i + 1 < G {
                h1 = _mm_xor_si128(h1, term(load4(&block[4 * i + 4..]), i + 1));
            }
        }
        let (lo, hi) = halves(_mm_xor_si128(h0, h1));
        finish(lo, hi, 4 * G)
    }

    /// Every full block of `block_size` (1 to `NH_MAX_TOKENS`) with
    /// PCLMULQDQ.
    #[target_feature(enable = "sse2,pclmulqdq")]
    pub(super) fn blocks_pclmul<S>(tokens: &[u32], block_size: usize, init: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        // Plain loops: a closure of an iterator adapter would be compiled
        // without this function's target features and not inlined.
        let blocks = tokens.chunks_exact(block_size);
        match block_size {
            16 => fold_groups::<4, S>(blocks, init, f),
            32 => fold_groups::<8, S>(blocks, init, f),
            64 => fold_groups::<16, S>(blocks, init, f),
            _ => {
                let mut s = init;
                for b in blocks {
                    s = f(s, block_pclmul(b));
                }
                s
            }
        }
    }

    /// Every block of `blocks`, each `G` whole 4-token groups, by the
    /// unrolled [`groups_pclmul`].
    #[inline]
    #[target_feature(enable = "sse2,pclmulqdq")]
    fn fold_groups<const G: usize, S>(
        blocks: std::slice::ChunksExact<'_, u32>,
        init: S,
        f: &mut impl FnMut(S, u64) -> S,
    ) -> S {
        let mut s = init;
        for b in blocks {
            s = f(s, groups_pclmul::<G>(b));
        }
        s
    }

    /// Loads 16 tokens from the start of `group` (at least 16 long).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load16(group: &[u32]) -> __m512i {
        assert!(group.len() >= 16);
        // SAFETY: `group` holds at least 16 u32 (checked above), 64
        // readable bytes; the load is unaligned.
        unsafe { _mm512_loadu_si512(group.as_ptr().cast()) }
    }

    /// The terms of 16-token group `g` (pairs `4g` to `4g + 3`), one in each
    /// 128-bit lane.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn terms16(x: __m512i, g: usize) -> __m512i {
        let k = &SECRET.0[8 * g..8 * g + 8];
        // SAFETY: `k` is 8 u64, 64 readable bytes; the load is unaligned
        // (the secret is aligned to 64 bytes, so it never splits a line).
        let k = unsafe { _mm512_loadu_si512(k.as_ptr().cast()) };
        let y = _mm512_xor_si512(x, k);
        _mm512_clmulepi64_epi128::<0x10>(y, y)
    }

    /// The XOR of a block's terms, for a block of `G` whole 16-token
    /// groups, spread over the four 128-bit lanes.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn lanes_avx512<const G: usize>(block: &[u32]) -> __m512i {
        let mut h = terms16(load16(block), 0);
        for g in 1..G {
            h = _mm512_xor_si512(h, terms16(load16(&block[16 * g..]), g));
        }
        h
    }

    /// The XOR of the four 128-bit lanes of `h`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fold_lanes(h: __m512i) -> __m128i {
        let x = _mm256_xor_si256(_mm512_castsi512_si256(h), _mm512_extracti64x4_epi64::<1>(h));
        _mm_xor_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x))
    }

    /// Lanes 0 and 2 of `x`, then of `y`, XORed with lanes 1 and 3 of
    /// each: the result's lanes are `x0 ⊕ x1, x2 ⊕ x3, y0 ⊕ y1, y2 ⊕ y3`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn lane_pairs(x: __m512i, y: __m512i) -> __m512i {
        _mm512_xor_si512(_mm512_shuffle_i64x2::<0b10_00_10_00>(x, y), _mm512_shuffle_i64x2::<0b11_01_11_01>(x, y))
    }

    /// Four consecutive blocks of `G` whole 16-token groups (`quad` is
    /// `64 * G` tokens), their lanes folded together by one transpose.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn quad_avx512<const G: usize, S>(quad: &[u32], mut s: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        let n = 16 * G;
        let a = lanes_avx512::<G>(&quad[..n]);
        let b = lanes_avx512::<G>(&quad[n..2 * n]);
        let c = lanes_avx512::<G>(&quad[2 * n..3 * n]);
        let d = lanes_avx512::<G>(&quad[3 * n..4 * n]);
        // Lane j of `h` is block j's H.
        let h = lane_pairs(lane_pairs(a, b), lane_pairs(c, d));
        let mut words = [0u64; 8];
        // SAFETY: `words` is 64 writable bytes; the store is unaligned.
        unsafe { _mm512_storeu_si512(words.as_mut_ptr().cast(), h) };
        for j in 0..4 {
            s = f(s, finish(words[2 * j], words[2 * j + 1], n));
        }
        s
    }

    /// Every block of `tokens` (a whole number of `16 * G`-token blocks),
    /// four at a time, then the rest one at a time.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq,sse2")]
    fn all_avx512<const G: usize, S>(tokens: &[u32], init: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        let mut quads = tokens.chunks_exact(64 * G);
        let mut s = init;
        for quad in &mut quads {
            s = quad_avx512::<G, S>(quad, s, f);
        }
        for b in quads.remainder().chunks_exact(16 * G) {
            let (lo, hi) = halves(fold_lanes(lanes_avx512::<G>(b)));
            s = f(s, finish(lo, hi, 16 * G));
        }
        s
    }

    /// Every full block of `block_size` (1 to `NH_MAX_TOKENS`) with
    /// AVX-512 where the size is 16, 32 or 64, with PCLMULQDQ otherwise.
    #[target_feature(enable = "avx512f,vpclmulqdq,sse2,pclmulqdq")]
    pub(super) fn blocks_avx512<S>(tokens: &[u32], block_size: usize, init: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        let whole = &tokens[..tokens.len() - tokens.len() % block_size];
        match block_size {
            16 => all_avx512::<1, S>(whole, init, f),
            32 => all_avx512::<2, S>(whole, init, f),
            64 => all_avx512::<4, S>(whole, init, f),
            _ => blocks_pclmul(tokens, block_size, init, f),
        }
    }

    /// Loads 8 tokens from the start of `group` (at least 8 long).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load8(group: &[u32]) -> __m256i {
        assert!(group.len() >= 8);
        // SAFETY: `group` holds at least 8 u32 (checked above), 32 readable
        // bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(group.as_ptr().cast()) }
    }

    /// The terms of 8-token group `g` (pairs `2g` and `2g + 1`), one in
    /// each 128-bit lane.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn terms8(x: __m256i, g: usize) -> __m256i {
        let k = &SECRET.0[4 * g..4 * g + 4];
        // SAFETY: `k` is 4 u64, 32 readable bytes; the load is unaligned.
        let k = unsafe { _mm256_loadu_si256(k.as_ptr().cast()) };
        let y = _mm256_xor_si256(x, k);
        _mm256_clmulepi64_epi128::<0x10>(y, y)
    }

    /// The XOR of a block's terms, for a block of `G` whole 8-token
    /// groups, spread over the two 128-bit lanes; the terms XORed into two
    /// sums so that the XORs overlap.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn lanes_avx2<const G: usize>(block: &[u32]) -> __m256i {
        let block = &block[..8 * G];
        let (mut h0, mut h1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for g in (0..G).step_by(2) {
            h0 = _mm256_xor_si256(h0, terms8(load8(&block[8 * g..]), g));
            if g + 1 < G {
                h1 = _mm256_xor_si256(h1, terms8(load8(&block[8 * g + 8..]), g + 1));
            }
        }
        _mm256_xor_si256(h0, h1)
    }

    /// Two consecutive blocks of `G` whole 8-token groups (`pair` is
    /// `16 * G` tokens), their lanes folded together by one transpose.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn pair_avx2<const G: usize, S>(pair: &[u32], mut s: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        let n = 8 * G;
        let a = lanes_avx2::<G>(&pair[..n]);
        let b = lanes_avx2::<G>(&pair[n..2 * n]);
        // Lane 0 of `h` is block a's H, lane 1 block b's.
        let h = _mm256_xor_si256(_mm256_permute2x128_si256::<0x20>(a, b), _mm256_permute2x128_si256::<0x31>(a, b));
        let mut words = [0u64; 4];
        // SAFETY: `words` is 32 writable bytes; the store is unaligned.
        unsafe { _mm256_storeu_si256(words.as_mut_ptr().cast(), h) };
        s = f(s, finish(words[0], words[1], n));
        f(s, finish(words[2], words[3], n))
    }

    /// Every block of `tokens` (a whole number of `8 * G`-token blocks), two
    /// at a time, then the one left, if any.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq,sse2")]
    fn all_avx2<const G: usize, S>(tokens: &[u32], init: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        let mut pairs = tokens.chunks_exact(16 * G);
        let mut s = init;
        for pair in &mut pairs {
            s = pair_avx2::<G, S>(pair, s, f);
        }
        for b in pairs.remainder().chunks_exact(8 * G) {
            let h = lanes_avx2::<G>(b);
            let (lo, hi) = halves(_mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h)));
            s = f(s, finish(lo, hi, 8 * G));
        }
        s
    }

    /// Every full block of `block_size` (1 to `NH_MAX_TOKENS`) with AVX2 and
    /// VPCLMULQDQ where the size is 16, 32 or 64, with PCLMULQDQ otherwise.
    #[target_feature(enable = "avx2,vpclmulqdq,sse2,pclmulqdq")]
    pub(super) fn blocks_avx2<S>(tokens: &[u32], block_size: usize, init: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        let whole = &tokens[..tokens.len() - tokens.len() % block_size];
        match block_size {
            16 => all_avx2::<2, S>(whole, init, f),
            32 => all_avx2::<4, S>(whole, init, f),
            64 => all_avx2::<8, S>(whole, init, f),
            _ => blocks_pclmul(tokens, block_size, init, f),
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::vmull_p64;

    use super::clnh;

    /// One block of at most `NH_MAX_TOKENS` tokens with PMULL.
    #[inline]
    #[target_feature(enable = "neon,aes")]
    fn block_pmull(block: &[u32]) -> u64 {
        clnh(block, |a, b| vmull_p64(a, b))
    }

    /// Every full block of `block_size` (1 to `NH_MAX_TOKENS`) with PMULL.
    #[target_feature(enable = "neon,aes")]
    pub(super) fn blocks_pmull<S>(tokens: &[u32], block_size: usize, init: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        // A plain loop, for the target features (as on x86).
        let mut s = init;
        for b in tokens.chunks_exact(block_size) {
            s = f(s, block_pmull(b));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng as _, SeedableRng as _, rngs::StdRng};

    /// The carry-less product bit by bit: the definition.
    fn clmul_bits(a: u64, b: u64) -> u128 {
        (0..64).filter(|i| (b >> i) & 1 == 1).fold(0u128, |r, i| r ^ (u128::from(a) << i))
    }

    /// The recipe from the module docs, word by word, with the padding
    /// written out: the reference the fast paths are held to.
    fn reference(tokens: &[u32]) -> u64 {
        if tokens.len() > NH_MAX_TOKENS {
            let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
            return xxhash_rust::xxh3::xxh3_64(&bytes);
        }
        let mut t = tokens.to_vec();
        t.resize(tokens.len().div_ceil(4) * 4, 0);
        let w: Vec<u64> = t.chunks_exact(2).map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32)).collect();
        let k = &SECRET.0;
        let mut h = 0u128;
        for i in 0..w.len() / 2 {
            h ^= clmul_bits(w[2 * i] ^ k[2 * i], w[2 * i + 1] ^ k[2 * i + 1]);
        }
        let p = u128::from((h as u64) ^ F_A) * u128::from(((h >> 64) as u64) ^ F_B);
        let mut x = ((p as u64) ^ ((p >> 64) as u64)).wrapping_add((tokens.len() as u64).wrapping_mul(N_MUL));
        x ^= x >> 37;
        x = x.wrapping_mul(AVALANCHE_MUL);
        x ^ (x >> 32)
    }

    fn batch(tokens: &[u32], block_size: usize) -> Vec<u64> {
        let mut out = Vec::new();
        block_content_hashes(tokens, block_size, |h| out.push(h));
        out
    }

    /// The software carry-less multiply is the definition's, on edge values
    /// and random ones.
    #[test]
    fn software_clmul_is_the_definition() {
        assert_eq!(clmul_soft(3, 3), 5);
        assert_eq!(clmul_soft(u64::MAX, u64::MAX), 0x5555_5555_5555_5555_5555_5555_5555_5555);
        assert_eq!(clmul_soft(1 << 63, 1 << 63), 1 << 126);
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..10_000 {
            let (a, b): (u64, u64) = (rng.random(), rng.random());
            assert_eq!(clmul_soft(a, b), clmul_bits(a, b));
        }
    }

    /// Every path (this CPU's fastest, PCLMULQDQ, AVX2 with VPCLMULQDQ where
    /// the CPU has them, and the scalar form) gives
    /// the reference's hash for random blocks of every length to 300, in
    /// batches of one to nine blocks and one at a time, with token ids of
    /// every magnitude.
    #[test]
    fn all_paths_agree_with_the_reference() {
        let mut rng = StdRng::seed_from_u64(7);
        for round in 0..40 {
            for block_size in 1..=300usize {
                // Up to nine blocks: the four-block paths, their tails and single blocks.
                let blocks = 1 + round % 9;
                let tokens: Vec<u32> = (0..block_size * blocks + round % 5)
                    .map(|_| if round % 2 == 0 { rng.random_range(0..152_000) } else { rng.random() })
                    .collect();
                let want: Vec<u64> = tokens.chunks_exact(block_size).map(reference).collect();
                assert_eq!(batch(&tokens, block_size), want, "block size {block_size}");
                let scalar: Vec<u64> = tokens.chunks_exact(block_size).map(hash_scalar).collect();
                assert_eq!(scalar, want, "scalar, block size {block_size}");
                assert_eq!(block_content_hash(&tokens[..block_size]), want[0]);
                let mut extended = vec![7u64];
                block_content_hashes_extend(&tokens, block_size, (), &mut extended, |(), h| ((), h));
                assert_eq!(extended[1..], want[..], "extend, block size {block_size}");
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("pclmulqdq") && block_size <= NH_MAX_TOKENS {
                    let mut pclmul = Vec::new();
                    // SAFETY: PCLMULQDQ was detected just above; SSE2 is
                    // part of x86-64.
                    unsafe { x86::blocks_pclmul(&tokens, block_size, (), &mut |(), h| pclmul.push(h)) };
                    assert_eq!(pclmul, want, "pclmul, block size {block_size}");
                }
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("vpclmulqdq")
                    && std::arch::is_x86_feature_detected!("pclmulqdq")
                    && block_size <= NH_MAX_TOKENS
                {
                    let mut avx2 = Vec::new();
                    // SAFETY: AVX2, VPCLMULQDQ and PCLMULQDQ were detected
                    // just above; SSE2 is part of x86-64.
                    unsafe { x86::blocks_avx2(&tokens, block_size, (), &mut |(), h| avx2.push(h)) };
                    assert_eq!(avx2, want, "avx2, block size {block_size}");
                }
            }
        }
        assert_eq!(block_content_hash(&[]), reference(&[]));
        assert!(batch(&[1, 2, 3], 0).is_empty());
    }

    /// The values, pinned: any change to the recipe fails here (and must
    /// change the router's seed tag).
    #[test]
    fn test_vectors() {
        let t: Vec<u32> = (0..300u32).map(|i| i.wrapping_mul(2_654_435_761) % 152_000).collect();
        let lengths = [0usize, 1, 7, 8, 16, 32, 33, 64, 256, 257];
        let got: Vec<u64> = lengths.iter().map(|&n| block_content_hash(&t[..n])).collect();
        let want = [
            0xbbbb_b152_2724_6c6b,
            0xa33d_c578_1262_f6c3,
            0x56cf_a929_2a3e_2bce,
            0x221b_a01e_c460_20ff,
            0x27eb_9e6a_f2e1_5a36,
            0xef93_3edf_e250_9141,
            0x67c8_45f1_c8af_ca80,
            0x6e21_cbe3_a1cf_254e,
            0xd097_f452_b0a1_968f,
            0x8441_8ea0_2c19_7be9,
        ];
        assert_eq!(got, want, "{got:#018x?}");
        let scalar: Vec<u64> = lengths.iter().map(|&n| hash_scalar(&t[..n])).collect();
        assert_eq!(scalar, want);
        let by_recipe: Vec<u64> = lengths.iter().map(|&n| reference(&t[..n])).collect();
        assert_eq!(by_recipe, want);
    }

    /// Blocks that differ in one token, in a swap of two tokens, or only by
    /// trailing zeros hash apart.
    #[test]
    fn near_blocks_differ() {
        let base: Vec<u32> = (0..32).map(|i| i * 17 + 3).collect();
        let h = block_content_hash(&base);
        for i in 0..32 {
            let mut m = base.clone();
            m[i] ^= 1;
            assert_ne!(block_content_hash(&m), h, "token {i}");
            let mut s = base.clone();
            s.swap(i, (i + 8) % 32);
            assert_ne!(block_content_hash(&s), h, "swap at {i}");
        }
        assert_ne!(block_content_hash(&[5]), block_content_hash(&[5, 0]));
    }
}
