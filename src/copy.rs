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
//!
//! One block's ids (128 bytes at 32 tokens a block) are copied at every
//! committed block, twice: into the page's stored tokens and into the
//! block's event. At the usual block sizes (16 and 32) the length is made a
//! constant first, so that the copy compiles to a few vector moves instead of
//! a call into `memcpy` with its length dispatch.

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

/// Copies one block's ids into `dst` (of the same length), inline at 16 and
/// 32 ids.
#[inline(always)]
pub(crate) fn copy_block(dst: &mut [u32], src: &[u32]) {
    if let (Ok(d), Ok(s)) = (<&mut [u32; 32]>::try_from(&mut *dst), <&[u32; 32]>::try_from(src)) {
        // Two halves: a 128-byte copy compiles to a call on x86-64, 64 bytes
        // to four vector moves.
        for (d, s) in d.as_chunks_mut::<16>().0.iter_mut().zip(s.as_chunks::<16>().0) {
            *d = *s;
        }
    } else if let (Ok(d), Ok(s)) = (<&mut [u32; 16]>::try_from(&mut *dst), <&[u32; 16]>::try_from(src)) {
        *d = *s;
    } else {
        dst.copy_from_slice(src);
    }
}

/// Appends one block's ids to `dst`, inline at 16 and 32 ids.
#[inline(always)]
pub(crate) fn extend_block(dst: &mut Vec<u32>, src: &[u32]) {
    if let Ok(s) = <&[u32; 32]>::try_from(src) {
        dst.extend_from_slice(s);
    } else if let Ok(s) = <&[u32; 16]>::try_from(src) {
        dst.extend_from_slice(s);
    } else {
        dst.extend_from_slice(src);
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

    /// A block of any length, the inlined ones and others, is copied and
    /// appended exactly.
    #[test]
    fn blocks_copy_exactly() {
        for len in [0, 1, 8, 15, 16, 17, 31, 32, 33, 64] {
            let src: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(2_654_435_761) ^ 5).collect();
            let mut dst = vec![9; len];
            copy_block(&mut dst, &src);
            assert_eq!(dst, src, "{len}");
            let mut v = vec![1, 2, 3];
            extend_block(&mut v, &src);
            assert_eq!(&v[..3], &[1, 2, 3]);
            assert_eq!(&v[3..], &src[..], "{len}");
        }
    }
}
