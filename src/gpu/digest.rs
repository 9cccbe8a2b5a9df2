//! BLAKE3-256 in the GPU's decomposition, on the CPU.
//!
//! The GPU computes a digest in two stages: chaining values of 1 KiB chunks,
//! folded into one value per group of [`GROUP_CHUNKS`] chunks (launch 1), then
//! the group values folded into the root (launch 2). [`digest_grouped_cpu`]
//! does exactly that, with the same compression function and the same fold
//! order, so that a test can check the decomposition against the `blake3`
//! crate on any machine, and the GPU against this function on a GPU machine.
//!
//! Why the fold is right: BLAKE3's tree is what merging chaining values level
//! by level gives, pairing left to right and carrying an odd last value up
//! unchanged. An aligned set of 64 values is then a complete subtree, and a
//! trailing partial set folds to the same node the whole-tree fold gives it.
//!
//! The tree's shape ([`groups_of_len`], [`scratch_of_len`]) sizes the GPU's
//! launches and scratch, and [`DeviceBytes`] names what they hash, so both
//! live here, with no CUDA dependency.

/// A device-resident byte string, what the GPU digests hash: a device
/// address and a length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBytes {
    /// Device address of the first byte (any alignment; 16-byte aligned is fastest).
    pub ptr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Chunks per group: the threads of one block of the BLAKE3 kernels.
pub const GROUP_CHUNKS: u64 = 64;
/// BLAKE3 chunk length in bytes.
pub const CHUNK_BYTES: u64 = 1024;

const IV: [u32; 8] =
    [0x6A09_E667, 0xBB67_AE85, 0x3C6E_F372, 0xA54F_F53A, 0x510E_527F, 0x9B05_688C, 0x1F83_D9AB, 0x5BE0_CD19];
const MSG_PERMUTATION: [usize; 16] = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8];
const CHUNK_START: u32 = 1;
const CHUNK_END: u32 = 2;
const PARENT: u32 = 4;
const ROOT: u32 = 8;

fn g(v: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize, x: u32, y: u32) {
    v[a] = v[a].wrapping_add(v[b]).wrapping_add(x);
    v[d] = (v[d] ^ v[a]).rotate_right(16);
    v[c] = v[c].wrapping_add(v[d]);
    v[b] = (v[b] ^ v[c]).rotate_right(12);
    v[a] = v[a].wrapping_add(v[b]).wrapping_add(y);
    v[d] = (v[d] ^ v[a]).rotate_right(8);
    v[c] = v[c].wrapping_add(v[d]);
    v[b] = (v[b] ^ v[c]).rotate_right(7);
}

/// The compression function, first 8 output words (all a 32-byte digest needs).
fn compress(cv: &[u32; 8], block: &[u32; 16], counter: u64, block_len: u32, flags: u32) -> [u32; 8] {
    let mut v = [0u32; 16];
    v[..8].copy_from_slice(cv);
    v[8..12].copy_from_slice(&IV[..4]);
    v[12] = counter as u32;
    v[13] = (counter >> 32) as u32;
    v[14] = block_len;
    v[15] = flags;
    let mut m = *block;
    for round in 0..7 {
        g(&mut v, 0, 4, 8, 12, m[0], m[1]);
        g(&mut v, 1, 5, 9, 13, m[2], m[3]);
        g(&mut v, 2, 6, 10, 14, m[4], m[5]);
        g(&mut v, 3, 7, 11, 15, m[6], m[7]);
        g(&mut v, 0, 5, 10, 15, m[8], m[9]);
        g(&mut v, 1, 6, 11, 12, m[10], m[11]);
        g(&mut v, 2, 7, 8, 13, m[12], m[13]);
        g(&mut v, 3, 4, 9, 14, m[14], m[15]);
        if round < 6 {
            m = std::array::from_fn(|i| m[MSG_PERMUTATION[i]]);
        }
    }
    std::array::from_fn(|i| v[i] ^ v[i + 8])
}

fn words(bytes: &[u8]) -> [u32; 16] {
    let mut block = [0u8; 64];
    block[..bytes.len()].copy_from_slice(bytes);
    std::array::from_fn(|i| u32::from_le_bytes(block[4 * i..4 * i + 4].try_into().expect("4 bytes")))
}

/// Chaining value of one chunk (0..=1024 bytes; 0 only for the empty input).
fn chunk_cv(chunk: &[u8], index: u64, root: bool) -> [u32; 8] {
    let blocks = chunk.len().div_ceil(64).max(1);
    let mut cv = IV;
    for j in 0..blocks {
        let block = &chunk[64 * j..(64 * j + 64).min(chunk.len())];
        let mut flags = if j == 0 { CHUNK_START } else { 0 };
        if j == blocks - 1 {
            flags |= CHUNK_END | if root { ROOT } else { 0 };
        }
        cv = compress(&cv, &words(block), index, block.len() as u32, flags);
    }
    cv
}

fn parent_cv(left: &[u32; 8], right: &[u32; 8], root: bool) -> [u32; 8] {
    let mut m = [0u32; 16];
    m[..8].copy_from_slice(left);
    m[8..].copy_from_slice(right);
    compress(&IV, &m, 0, 64, PARENT | if root { ROOT } else { 0 })
}

/// Folds values level by level (pairs left to right, an odd last one carried
/// up); the last merge carries the root flag when `root`.
fn fold(mut level: Vec<[u32; 8]>, root: bool) -> [u32; 8] {
    while level.len() > 1 {
        let last = level.len() == 2;
        let mut next: Vec<[u32; 8]> = level.chunks_exact(2).map(|p| parent_cv(&p[0], &p[1], root && last)).collect();
        if level.len() % 2 == 1 {
            next.push(*level.last().expect("odd length is non-zero"));
        }
        level = next;
    }
    level[0]
}

/// Number of groups of an input of `len` bytes (at least one, for the empty input).
pub fn groups_of_len(len: u64) -> u64 {
    len.div_ceil(CHUNK_BYTES).max(1).div_ceil(GROUP_CHUNKS)
}

/// Scratch an item of `len` bytes needs on the GPU above its groups: values
/// of every level that has more than one (8 words each), and one counter per
/// set of 64 of them. Items of one group need none.
#[cfg_attr(not(feature = "cuda"), allow(dead_code, reason = "only the GPU path and the tests size scratch"))]
pub fn scratch_of_len(len: u64) -> (u64, u64) {
    let mut count = groups_of_len(len);
    let (mut values, mut counters) = (0, 0);
    while count > 1 {
        values += count;
        count = count.div_ceil(GROUP_CHUNKS);
        counters += count;
    }
    (values, counters)
}

/// BLAKE3-256 of `input`, computed in the GPU kernel's order: chunk values,
/// one fold per group of 64 chunks, then folds of 64 values at a time, level
/// by level.
pub fn digest_grouped_cpu(input: &[u8]) -> [u8; 32] {
    let len = input.len() as u64;
    let chunks = len.div_ceil(CHUNK_BYTES).max(1);
    let single_group = chunks <= GROUP_CHUNKS;
    let mut group_values = Vec::with_capacity(groups_of_len(len) as usize);
    for group_first in (0..chunks).step_by(GROUP_CHUNKS as usize) {
        let group_end = (group_first + GROUP_CHUNKS).min(chunks);
        let cvs = (group_first..group_end)
            .map(|c| {
                let start = (c * CHUNK_BYTES) as usize;
                let end = ((c + 1) * CHUNK_BYTES).min(len) as usize;
                chunk_cv(&input[start..end], c, chunks == 1)
            })
            .collect();
        group_values.push(fold(cvs, single_group));
    }
    let mut level = group_values;
    while level.len() > 1 {
        let top = level.len() as u64 <= GROUP_CHUNKS;
        level = level.chunks(GROUP_CHUNKS as usize).map(|set| fold(set.to_vec(), top)).collect();
    }
    let root = level[0];
    let mut out = [0u8; 32];
    for (i, w) in root.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The grouped decomposition equals the `blake3` crate at every length
    /// around block, chunk, group and tree boundaries, on random bytes.
    #[test]
    fn grouped_cpu_matches_blake3_crate() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let max = (4 << 20) + 70 * 1024;
        let data: Vec<u8> = (0..max).map(|_| rng.random()).collect();
        let mut lengths = vec![0usize, 1, 63, 64, 65, 127, 128, 1000];
        for base in [1024usize, 2048, 3072, 4096, 31 * 1024, 32 * 1024, 63 * 1024, 64 * 1024, 65 * 1024] {
            lengths.extend([base - 1, base, base + 1]);
        }
        for base in [128 * 1024usize, 129 * 1024, 192 * 1024, 4 << 20, (4 << 20) + 1024] {
            lengths.extend([base - 1, base, base + 1, base + 64]);
        }
        for _ in 0..20 {
            lengths.push(rng.random_range(0..300 * 1024));
        }
        for len in lengths {
            assert_eq!(digest_grouped_cpu(&data[..len]), *blake3::hash(&data[..len]).as_bytes(), "length {len}");
        }
    }

    /// Scratch sizes follow the level counts: 4096 groups need 4096 + 64
    /// values and 64 + 1 counters; one group needs none.
    #[test]
    fn scratch_sizes() {
        assert_eq!(scratch_of_len(64 * 1024), (0, 0));
        assert_eq!(scratch_of_len(64 * 1024 + 1), (2, 1));
        assert_eq!(scratch_of_len(256 << 20), (4096 + 64, 64 + 1));
    }
}
