//! Bulk copies of token ids.
//!
//! A prompt is copied into its request row at admission (tens of KB for a long
//! prompt). Handed to `memcpy` in one piece, a copy that large takes glibc's
//! string-move path (`rep movsb`). On an AMD EPYC (Zen 3) with glibc 2.36 that
//! path runs about 25 times slower (5-6 µs instead of 0.2 µs for 16 KB) when
//! the destination lies 1 to 31 bytes past the source modulo 4096, and two
//! heap vectors of the same size land in that window often, so the engine's
//! speed came and went with heap layout. (An Intel Xeon with glibc 2.39
//! showed no such window.)
//!
//! Copying in pieces of [`PIECE`] ids keeps every call below glibc's
//! string-move threshold, on its vector loop, whose speed does not depend on
//! the addresses (docs/benchmarks.md, "Engine core", has the measurement).

/// Token ids per piece: 2 KB, below the smallest string-move threshold glibc
/// picks (4 KB with 32-byte vectors).
pub(crate) const PIECE: usize = 512;

/// Appends `src` to `dst`, in pieces of [`PIECE`] ids.
pub(crate) fn extend_tokens(dst: &mut Vec<u32>, src: &[u32]) {
    dst.reserve(src.len());
    for piece in src.chunks(PIECE) {
        dst.extend_from_slice(piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the piece size appends exactly the source, after
    /// what the destination held.
    #[test]
    fn appends_exactly_the_source() {
        for len in [0, 1, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 7] {
            let src: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
            let mut dst = vec![7, 8];
            extend_tokens(&mut dst, &src);
            assert_eq!(dst.len(), len + 2);
            assert_eq!(&dst[..2], &[7, 8]);
            assert_eq!(&dst[2..], &src[..]);
        }
    }
}
