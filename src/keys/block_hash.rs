//! The content hash of a text block of token ids: the router's per-block
//! hash (router keys version 3, docs/router.md "Router keys").
//!
//! A block of `n` tokens (`n` at most [`NH_MAX_TOKENS`]) hashes in two
//! stages: a two-fold NH over the tokens, then a 128-to-64-bit finalizer.
//!
//! ```text
//! t_0 … t_{m-1}  = the tokens, then zeros up to m = n rounded up to a multiple of 8
//! K_0 … K_263    = the secret: u32 words, the low then high half of each output of
//!                  SplitMix64 from 0x6B76_636F_7265_4E48 ("kvcoreNH")
//! a = Σ_{i < m/2} ((t_2i + K_2i) mod 2³²) · ((t_2i+1 + K_2i+1) mod 2³²)   mod 2⁶⁴
//! b = Σ_{i < m/2} ((t_2i + K_2i+2) mod 2³²) · ((t_2i+1 + K_2i+3) mod 2³²) mod 2⁶⁴
//! p = (a ⊕ F_A) · (b ⊕ F_B) as a 128-bit product
//! h = avalanche(lo64(p) ⊕ hi64(p) + n · N_MUL mod 2⁶⁴)
//! avalanche(x) = x ⊕= x ≫ 37; x ·= 0x1656_6791_9E37_79F9; x ⊕= x ≫ 32
//! F_A = 0x9E37_79B9_7F4A_7C15, F_B = 0xC2B2_AE3D_27D4_EB4F, N_MUL = 0x27D4_EB2F_1656_67C5
//! ```
//!
//! A block of more than [`NH_MAX_TOKENS`] tokens hashes with XXH3-64 over
//! its tokens as u32 little-endian bytes: the secret covers 256 tokens, and
//! such blocks are rare enough not to need the fast path. All blocks of one
//! router scope have one size, so the two functions never meet in a chain.
//!
//! **Why the collision chance stays near 2⁻⁶⁴.** `a` is NH (the hash of
//! UMAC, Black, Halevi, Krawczyk, Krovetz and Rogaway, 1999) with 32-bit
//! words: for two different token sequences of the same padded length and a
//! uniformly random key, `a` collides with probability at most 2⁻³². `b` is
//! the same NH under the key shifted by two words, the Toeplitz
//! construction of the same paper, and the pair `(a, b)` collides with
//! probability at most 2⁻⁶⁴. The zero padding is the same for every block of
//! a length, so distinct blocks of one length stay distinct after it. The
//! finalizer maps the 128-bit pair to 64 bits: a multiply whose both factors
//! depend on all of `(a, b)`, folded, then the bijective avalanche of XXH3;
//! distinct pairs meet in it with the chance of a random 64-bit function,
//! about 2⁻⁶⁴. The length enters the finalizer, so blocks of different
//! lengths with equal padded tokens (`[x]` and `[x, 0]`) differ too. Two
//! different blocks of one length therefore share a hash with a chance of
//! about 2⁻⁶³ in all. The secret is fixed and public, not a random key: the
//! bounds hold for inputs chosen without regard to it (prompts), not for
//! inputs crafted against it, which is also true of XXH3. A router key
//! collision only misroutes a request (docs/router.md).
//!
//! Speed: with AVX2 one 32-token block is four 32-byte loads, eight 32-bit
//! adds, eight shifts and eight `vpmuludq`, then one 64×64→128 multiply;
//! with AVX-512 the same work in half the instructions, and four blocks'
//! lane sums reduced together (one transpose of their eight sum vectors,
//! five vector operations a block instead of thirteen), since the two
//! vector ports, not the multiplies' latency, bound the loop. The scalar form
//! computes the same sums in another order (addition mod 2⁶⁴ commutes), so
//! every path gives bit-identical hashes. The CPU's features are detected
//! once per process and cached.

use std::sync::atomic::{AtomicU8, Ordering};

/// The longest text block the NH path covers; longer blocks hash with
/// XXH3-64 (see the module docs).
pub const NH_MAX_TOKENS: usize = 256;

/// Words of the secret: `NH_MAX_TOKENS` plus the Toeplitz shift of two,
/// rounded up to whole 8-word groups.
const SECRET_WORDS: usize = NH_MAX_TOKENS + 8;

const F_A: u64 = 0x9E37_79B9_7F4A_7C15;
const F_B: u64 = 0xC2B2_AE3D_27D4_EB4F;
const N_MUL: u64 = 0x27D4_EB2F_1656_67C5;
const AVALANCHE_MUL: u64 = 0x1656_6791_9E37_79F9;
const SECRET_SEED: u64 = 0x6B76_636F_7265_4E48;

/// The secret, aligned for vector loads.
#[repr(C, align(64))]
struct Secret([u32; SECRET_WORDS]);

const fn make_secret() -> Secret {
    let mut words = [0u32; SECRET_WORDS];
    let mut state = SECRET_SEED;
    let mut i = 0;
    while i < SECRET_WORDS {
        // SplitMix64.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        words[i] = z as u32;
        words[i + 1] = (z >> 32) as u32;
        i += 2;
    }
    Secret(words)
}

static SECRET: Secret = make_secret();

/// The 128-to-64-bit finalizer over the two NH sums and the length.
#[inline(always)]
fn finish(a: u64, b: u64, n: usize) -> u64 {
    finish_masked(a ^ F_A, b ^ F_B, n)
}

/// [`finish`] from the two sums already XORed with `F_A` and `F_B`.
#[inline(always)]
fn finish_masked(a: u64, b: u64, n: usize) -> u64 {
    let p = u128::from(a) * u128::from(b);
    let mut x = ((p as u64) ^ ((p >> 64) as u64)).wrapping_add((n as u64).wrapping_mul(N_MUL));
    x ^= x >> 37;
    x = x.wrapping_mul(AVALANCHE_MUL);
    x ^ (x >> 32)
}

/// One NH term: the product of the two keyed 32-bit halves.
#[inline(always)]
fn nh_term(lo: u32, hi: u32, k_lo: u32, k_hi: u32) -> u64 {
    u64::from(lo.wrapping_add(k_lo)) * u64::from(hi.wrapping_add(k_hi))
}

/// Both NH sums of at most `NH_MAX_TOKENS` tokens, zero-padded to a
/// multiple of 8, one pair at a time.
fn nh_scalar(tokens: &[u32]) -> (u64, u64) {
    let k = &SECRET.0;
    let padded = tokens.len().div_ceil(8) * 8;
    let (mut a, mut b) = (0u64, 0u64);
    let mut i = 0;
    while 2 * i < padded {
        let lo = tokens.get(2 * i).copied().unwrap_or(0);
        let hi = tokens.get(2 * i + 1).copied().unwrap_or(0);
        a = a.wrapping_add(nh_term(lo, hi, k[2 * i], k[2 * i + 1]));
        b = b.wrapping_add(nh_term(lo, hi, k[2 * i + 2], k[2 * i + 3]));
        i += 1;
    }
    (a, b)
}

/// One block's hash on the portable path.
fn hash_scalar(tokens: &[u32]) -> u64 {
    if tokens.len() > NH_MAX_TOKENS {
        return hash_long(tokens);
    }
    let (a, b) = nh_scalar(tokens);
    finish(a, b, tokens.len())
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

/// The vector units this process hashes with.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Level {
    Scalar = 1,
    #[cfg(target_arch = "x86_64")]
    Avx2 = 2,
    #[cfg(target_arch = "x86_64")]
    Avx512 = 3,
}

/// 0 until detected, then a `Level` as u8.
static LEVEL: AtomicU8 = AtomicU8::new(0);

fn level() -> Level {
    let cached = LEVEL.load(Ordering::Relaxed);
    let level = match cached {
        1 => return Level::Scalar,
        #[cfg(target_arch = "x86_64")]
        2 => return Level::Avx2,
        #[cfg(target_arch = "x86_64")]
        3 => return Level::Avx512,
        _ => detect(),
    };
    LEVEL.store(level as u8, Ordering::Relaxed);
    level
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx2") {
            return Level::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return Level::Avx2;
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
        // SAFETY: `level` returns `Avx512` only when the CPU has AVX-512F
        // and AVX2, detected at run time.
        Level::Avx512 => unsafe { x86::blocks_avx512(tokens, block_size, init, &mut f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `level` returns `Avx2` only when the CPU has AVX2,
        // detected at run time.
        Level::Avx2 => unsafe { x86::blocks_avx2(tokens, block_size, init, &mut f) },
        Level::Scalar => tokens.chunks_exact(block_size).fold(init, |s, b| f(s, hash_scalar(b))),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{F_A, F_B, SECRET, finish, finish_masked};

    /// Loads 8 tokens from the start of `group` (at least 8 long).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load8(group: &[u32]) -> __m256i {
        assert!(group.len() >= 8);
        // SAFETY: `group` holds at least 8 u32 (checked above), 32 readable
        // bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(group.as_ptr().cast()) }
    }

    /// Loads the 8 secret words from word `at` (at most `SECRET_WORDS - 8`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn key8(at: usize) -> __m256i {
        load8(&SECRET.0[at..])
    }

    /// Adds group `g`'s NH terms of the 8 tokens `x` to `a` and `b`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn nh8(x: __m256i, g: usize, a: &mut __m256i, b: &mut __m256i) {
        let xa = _mm256_add_epi32(x, key8(8 * g));
        let xb = _mm256_add_epi32(x, key8(8 * g + 2));
        *a = _mm256_add_epi64(*a, _mm256_mul_epu32(xa, _mm256_srli_epi64::<32>(xa)));
        *b = _mm256_add_epi64(*b, _mm256_mul_epu32(xb, _mm256_srli_epi64::<32>(xb)));
    }

    /// Sums the lanes of `a` and of `b` and finishes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn finish2(a: __m256i, b: __m256i, n: usize) -> u64 {
        let t = _mm256_add_epi64(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
        let s = _mm_add_epi64(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        finish(_mm_cvtsi128_si64(s) as u64, _mm_extract_epi64::<1>(s) as u64, n)
    }

    /// A block of `G` whole 8-token groups.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn groups_avx2<const G: usize>(block: &[u32]) -> u64 {
        let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for g in 0..G {
            nh8(load8(&block[8 * g..]), g, &mut a, &mut b);
        }
        finish2(a, b, 8 * G)
    }

    /// A block of any length up to `NH_MAX_TOKENS`, the tail zero-padded.
    #[target_feature(enable = "avx2")]
    fn any_avx2(block: &[u32]) -> u64 {
        let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let mut groups = block.chunks_exact(8);
        let mut g = 0;
        for group in &mut groups {
            nh8(load8(group), g, &mut a, &mut b);
            g += 1;
        }
        let tail = groups.remainder();
        if !tail.is_empty() {
            let mut padded = [0u32; 8];
            padded[..tail.len()].copy_from_slice(tail);
            nh8(load8(&padded), g, &mut a, &mut b);
        }
        finish2(a, b, block.len())
    }

    /// Every full block of `block_size` (1 to `NH_MAX_TOKENS`) with AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) fn blocks_avx2<S>(tokens: &[u32], block_size: usize, init: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        // Plain loops: a closure of an iterator adapter would be compiled
        // without this function's target features and not inlined.
        let mut s = init;
        let blocks = tokens.chunks_exact(block_size);
        match block_size {
            16 => {
                for b in blocks {
                    s = f(s, groups_avx2::<2>(b));
                }
            }
            32 => {
                for b in blocks {
                    s = f(s, groups_avx2::<4>(b));
                }
            }
            64 => {
                for b in blocks {
                    s = f(s, groups_avx2::<8>(b));
                }
            }
            _ => {
                for b in blocks {
                    s = f(s, any_avx2(b));
                }
            }
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

    /// The two NH sums of a block of `P` whole 16-token groups with
    /// AVX-512, each spread over eight 64-bit lanes: lanes 0-3 hold group
    /// `2p`'s terms and lanes 4-7 group `2p + 1`'s.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sums_avx512<const P: usize>(block: &[u32]) -> (__m512i, __m512i) {
        let (mut a, mut b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for p in 0..P {
            let x = load16(&block[16 * p..]);
            let xa = _mm512_add_epi32(x, load16(&SECRET.0[16 * p..]));
            let xb = _mm512_add_epi32(x, load16(&SECRET.0[16 * p + 2..]));
            a = _mm512_add_epi64(a, _mm512_mul_epu32(xa, _mm512_srli_epi64::<32>(xa)));
            b = _mm512_add_epi64(b, _mm512_mul_epu32(xb, _mm512_srli_epi64::<32>(xb)));
        }
        (a, b)
    }

    /// One block of `P` whole 16-token groups, its lanes summed alone: the
    /// same sums as the AVX2 form.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn groups_avx512<const P: usize>(block: &[u32]) -> u64 {
        let (a, b) = sums_avx512::<P>(block);
        let a4 = _mm256_add_epi64(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64::<1>(a));
        let b4 = _mm256_add_epi64(_mm512_castsi512_si256(b), _mm512_extracti64x4_epi64::<1>(b));
        finish2(a4, b4, 16 * P)
    }

    /// Sums the lanes of `a` and of `b` pairwise within each 128-bit
    /// chunk: chunk `c` of the result is `(a[2c] + a[2c+1], b[2c] + b[2c+1])`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn pair_sums(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi64(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
    }

    /// Adds chunks 0 and 1, and 2 and 3, of `x` and of `y`: the result's
    /// chunks are `x0 + x1, x2 + x3, y0 + y1, y2 + y3`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn chunk_sums(x: __m512i, y: __m512i) -> __m512i {
        _mm512_add_epi64(_mm512_shuffle_i64x2::<0b10_00_10_00>(x, y), _mm512_shuffle_i64x2::<0b11_01_11_01>(x, y))
    }

    /// Four consecutive blocks of `P` whole 16-token groups (`quad` is
    /// `64 * P` tokens), their lanes summed together by one transpose: one
    /// vector add reduces two blocks' lanes where [`groups_avx512`] spends
    /// one on each, which keeps the vector ports free for the next blocks.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn quad_avx512<const P: usize, S>(quad: &[u32], mut s: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        let n = 16 * P;
        let (a0, b0) = sums_avx512::<P>(&quad[..n]);
        let (a1, b1) = sums_avx512::<P>(&quad[n..2 * n]);
        let (a2, b2) = sums_avx512::<P>(&quad[2 * n..3 * n]);
        let (a3, b3) = sums_avx512::<P>(&quad[3 * n..4 * n]);
        let low = chunk_sums(pair_sums(a0, b0), pair_sums(a1, b1));
        let high = chunk_sums(pair_sums(a2, b2), pair_sums(a3, b3));
        // Chunk j of `sums` is block j's `(a, b)`, masked for the finalizer.
        let masks = _mm512_set_epi64(
            F_B as i64, F_A as i64, F_B as i64, F_A as i64, F_B as i64, F_A as i64, F_B as i64, F_A as i64,
        );
        let sums = _mm512_xor_si512(chunk_sums(low, high), masks);
        let mut lanes = [0u64; 8];
        // SAFETY: `lanes` is 64 writable bytes; the store is unaligned.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), sums) };
        for j in 0..4 {
            s = f(s, finish_masked(lanes[2 * j], lanes[2 * j + 1], n));
        }
        s
    }

    /// Every block of `tokens` (a whole number of `16 * P`-token blocks),
    /// four at a time, then the rest one at a time.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    fn all_avx512<const P: usize, S>(tokens: &[u32], init: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        let mut quads = tokens.chunks_exact(64 * P);
        let mut s = init;
        for quad in &mut quads {
            s = quad_avx512::<P, S>(quad, s, f);
        }
        for b in quads.remainder().chunks_exact(16 * P) {
            s = f(s, groups_avx512::<P>(b));
        }
        s
    }

    /// Every full block of `block_size` (1 to `NH_MAX_TOKENS`) with
    /// AVX-512 where the size is a multiple of 16 of the fast cases, AVX2
    /// otherwise.
    #[target_feature(enable = "avx512f,avx2")]
    pub(super) fn blocks_avx512<S>(tokens: &[u32], block_size: usize, init: S, f: &mut impl FnMut(S, u64) -> S) -> S {
        let whole = &tokens[..tokens.len() - tokens.len() % block_size];
        match block_size {
            16 => all_avx512::<1, S>(whole, init, f),
            32 => all_avx512::<2, S>(whole, init, f),
            64 => all_avx512::<4, S>(whole, init, f),
            _ => blocks_avx2(tokens, block_size, init, f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng as _, SeedableRng as _, rngs::StdRng};

    /// The recipe from the module docs, word by word, with no padding
    /// shortcut: the reference the fast paths are held to.
    fn reference(tokens: &[u32]) -> u64 {
        if tokens.len() > NH_MAX_TOKENS {
            let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
            return xxhash_rust::xxh3::xxh3_64(&bytes);
        }
        let mut t = tokens.to_vec();
        t.resize(tokens.len().div_ceil(8) * 8, 0);
        let k = &SECRET.0;
        let (mut a, mut b) = (0u64, 0u64);
        for i in 0..t.len() / 2 {
            let term =
                |k0: u32, k1: u32| u64::from(t[2 * i].wrapping_add(k0)) * u64::from(t[2 * i + 1].wrapping_add(k1));
            a = a.wrapping_add(term(k[2 * i], k[2 * i + 1]));
            b = b.wrapping_add(term(k[2 * i + 2], k[2 * i + 3]));
        }
        let p = u128::from(a ^ F_A) * u128::from(b ^ F_B);
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

    /// Every path (this CPU's vector path, AVX2 and the scalar form) gives
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
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") && block_size <= NH_MAX_TOKENS {
                    let mut avx2 = Vec::new();
                    // SAFETY: AVX2 was detected just above.
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
        let got: Vec<u64> =
            [0usize, 1, 7, 8, 16, 32, 33, 64, 256, 257].iter().map(|&n| block_content_hash(&t[..n])).collect();
        let want = [
            0xbbbb_b152_2724_6c6b,
            0x8e54_4e41_888f_69e1,
            0x631a_89a5_b6b7_8b56,
            0xa46e_5fa5_20f5_995e,
            0x608a_94e8_747d_0af2,
            0x104d_dd4a_5514_5593,
            0xe8f0_8cfe_33ec_4df8,
            0x7e04_84ce_0d43_3efd,
            0x7130_0b5e_5dae_c58b,
            0x8441_8ea0_2c19_7be9,
        ];
        assert_eq!(got, want, "{got:#018x?}");
        let scalar: Vec<u64> =
            [0usize, 1, 7, 8, 16, 32, 33, 64, 256, 257].iter().map(|&n| hash_scalar(&t[..n])).collect();
        assert_eq!(scalar, want);
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
