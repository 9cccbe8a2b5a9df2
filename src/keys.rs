//! Content identities: image digests, block keys, wire hashes and `mm_hash`.
//!
//! Everything here goes onto the wire or into a cache key, so every function is
//! a documented, stable algorithm (docs/hashing.md holds the byte recipe and
//! test vectors). Nothing here uses `ahash`, whose output changes between
//! processes.
//!
//! | identity | algorithm | where it is used |
//! |---|---|---|
//! | [`ImageDigest`] | BLAKE3-256 of the item's content bytes | cache identity of an image |
//! | [`BlockKey`] | SHA-256 chain over parent, tokens, image runs | prefix index, block identity |
//! | [`WireHash`] | first 8 bytes of the key, big-endian, as `i64` | `block_hashes` on the wire |
//! | `mm_hash` | Dynamo's identifier rule (64-hex prefix or XXH3-64) | `block_mm_infos` on the wire |
//! | [`block_content_hash`] | two-fold NH and a 64-bit finalizer ([`block_hash`]) | the router's per-block hash |

use sha2::{Digest as _, Sha256};

// Runtime dispatch to AVX2 and AVX-512 calls `#[target_feature]` functions,
// which needs `unsafe`; each block has a SAFETY comment.
#[allow(unsafe_code, reason = "calls into the CPU feature paths the hash detects at run time")]
pub mod block_hash;
pub use block_hash::{
    block_content_hash, block_content_hashes, block_content_hashes_extend, block_content_hashes_fold,
};

/// BLAKE3-256 digest of an image item's content bytes: the image's cache identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct ImageDigest(pub [u8; 32]);

impl ImageDigest {
    /// Digest of content bytes with the `blake3` crate (the CPU path; the GPU
    /// path in `gpu` is bit-identical).
    pub fn of_content(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// The digest as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(char::from_digit((b >> 4) as u32, 16).expect("nibble < 16"));
            s.push(char::from_digit((b & 15) as u32, 16).expect("nibble < 16"));
        }
        s
    }
}

/// A block's 32-byte cryptographic key: the SHA-256 chain in docs/hashing.md.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default)]
pub struct BlockKey(pub [u8; 32]);

/// In-memory maps hash a key's first 8 bytes only: the key is already a
/// uniformly distributed SHA-256 output that callers cannot steer, so the
/// other 24 bytes add no spread, and the map's own keyed hasher still mixes
/// what it is given. Equal keys hash equally, as `Eq` requires. This never
/// reaches the wire (that is [`BlockKey::wire_hash`]).
impl std::hash::Hash for BlockKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut head = [0u8; 8];
        head.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_ne_bytes(head));
    }
}

/// The 64-bit block hash that goes on the wire: the first 8 bytes of the
/// [`BlockKey`], big-endian, as a signed integer (TensorRT-LLM's
/// `v2_sha256_64`, which subscribers decode as i64).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct WireHash(pub i64);

impl BlockKey {
    /// This key's wire hash.
    pub fn wire_hash(&self) -> WireHash {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        WireHash(i64::from_be_bytes(first))
    }
}

/// The name under which the key algorithm is advertised (in `model_info`).
pub const BLOCK_KEY_ALGORITHM: &str = "kvcore-sha256-v1";

/// Domain tag that starts every root key.
const ROOT_TAG: &[u8; 16] = b"kvcore/root/v1\0\0";

/// The scope of a request's chain: what makes two equal token sequences
/// belong to different caches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeyScope {
    /// Block size in tokens.
    pub block_size_tokens: u32,
    /// LoRA adapter id, when the request runs under one.
    pub lora_id: Option<u32>,
    /// Cache salt: requests with different salts never share blocks.
    pub cache_salt: Option<Vec<u8>>,
}

/// The root key of a scope: the parent of every chain's first block.
///
/// `SHA-256(ROOT_TAG ‖ block_size u32 LE ‖ lora flag u8 ‖ [lora_id u32 LE]
/// ‖ salt flag u8 ‖ [salt length u32 LE ‖ salt bytes])`.
pub fn root_key(scope: &KeyScope) -> BlockKey {
    let mut h = Sha256::new();
    h.update(ROOT_TAG);
    h.update(scope.block_size_tokens.to_le_bytes());
    match scope.lora_id {
        Some(id) => {
            h.update([1u8]);
            h.update(id.to_le_bytes());
        }
        None => h.update([0u8]),
    }
    match &scope.cache_salt {
        Some(salt) => {
            h.update([1u8]);
            h.update((salt.len() as u32).to_le_bytes());
            h.update(salt);
        }
        None => h.update([0u8]),
    }
    BlockKey(h.finalize().into())
}

/// One maximal run of an image item's tokens inside one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageRun {
    /// The item's content digest.
    pub digest: ImageDigest,
    /// Offset of the run's first token within the item (item-local).
    pub item_offset: u32,
    /// Offset of the run's first token within the block.
    pub block_offset: u32,
    /// Number of tokens in the run.
    pub len: u32,
}

/// The key of one full block.
///
/// `SHA-256(parent ‖ tokens as u32 LE ‖ run count u32 LE ‖ for each run:
/// digest ‖ item_offset u32 LE ‖ block_offset u32 LE ‖ len u32 LE)`.
///
/// `tokens` are the block's tokens with the image placeholder id at image
/// positions (as [`key_of_block`] builds them); `runs` are in block order. The
/// UUID hint of an item never enters a key.
#[inline]
pub fn block_key(parent: &BlockKey, tokens: &[u32], runs: &[ImageRun]) -> BlockKey {
    let mut key = StagedKey::default();
    key.begin(parent, tokens);
    key.second(tokens);
    key.finish(tokens, runs)
}

/// [`block_key`] in three stages, so that a caller can place other work
/// between them in program order: [`StagedKey::begin`] (the parent and the
/// first tokens: one 64-byte block of the hash), [`StagedKey::second`] (the
/// next 64 bytes of tokens) and [`StagedKey::finish`] (the rest and the
/// image runs). One value hashes key after key, each stage given the same
/// block's tokens.
///
/// The SHA-256 of a chain is one long dependency: each round waits for the
/// previous one, and the CPU has idle units meanwhile. Work placed between
/// the stages (the engine's bookkeeping of the previous block, which needs
/// no part of this key) runs on those units while the rounds go on,
/// instead of after them. Work split in two, a part after each of the
/// first two compressions, leaves less between them, so that the second
/// enters the CPU's window of instructions in flight sooner. The stages
/// inline into the caller's loop: the work between them is plain code
/// there, not a call, and the hash's state stays in place. [`block_key`]
/// runs the same stages with nothing between them, so both compute every
/// key by the same code.
///
/// The stages drive SHA-256's compression function
/// (`sha2::block_api::compress256`) themselves, because the key's layout
/// is known: the first 64-byte block is the parent and the first 32 bytes
/// of tokens, assembled in place; whole blocks of tokens after it are
/// compressed straight from the caller's slice, without a copy; only the
/// tail (the last tokens, the run count, the runs, the padding and the
/// length) goes through a buffer. That is the same digest as a streaming
/// `Sha256` over the layout (a test compares them for every shape), without
/// the streaming hasher's general buffering (docs/benchmarks.md has what it
/// saves). A block of fewer than 8 tokens, which cannot fill the first
/// 64-byte block, goes whole through the tail buffer.
#[derive(Clone)]
pub(crate) struct StagedKey {
    /// The chaining state.
    state: [u32; 8],
    /// The tail: bytes not compressed yet, at most 127.
    tail: [u8; 128],
    /// Bytes in `tail`.
    fill: usize,
}

impl Default for StagedKey {
    fn default() -> Self {
        Self { state: SHA256_IV, tail: [0; 128], fill: 0 }
    }
}

/// SHA-256's initial chaining state (FIPS 180-4, 5.3.3).
const SHA256_IV: [u32; 8] =
    [0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a, 0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19];

/// Compresses whole 64-byte blocks of `bytes` (its length a multiple of 64)
/// into `state`.
#[inline(always)]
fn compress_blocks(state: &mut [u32; 8], bytes: &[u8]) {
    let (blocks, rest) = bytes.as_chunks::<64>();
    debug_assert!(rest.is_empty(), "whole blocks only");
    sha2::block_api::compress256(state, blocks);
}

impl StagedKey {
    /// Bytes of tokens in the first 64-byte block, after the parent's 32.
    const FIRST: usize = 32;
    /// Bytes of tokens in the second 64-byte block.
    const SECOND: usize = 64;

    /// Bytes of a block's `n` bytes of tokens that [`StagedKey::begin`]
    /// and [`StagedKey::second`] compress: what fills the first block and,
    /// after it, the second (every stage is given the same tokens, so this
    /// follows from their length).
    #[inline(always)]
    fn staged_bytes(n: usize) -> usize {
        if n >= Self::FIRST + Self::SECOND {
            Self::FIRST + Self::SECOND
        } else if n >= Self::FIRST {
            Self::FIRST
        } else {
            0
        }
    }

    /// The parent's 32 bytes and the first 32 bytes of `tokens`: one
    /// compression, when the tokens fill the block. The value must be fresh
    /// (new, or its last key finished).
    #[inline(always)]
    pub(crate) fn begin(&mut self, parent: &BlockKey, tokens: &[u32]) {
        let tokens = tokens_le(tokens);
        let bytes = bytemuck::cast_slice::<u32, u8>(tokens.as_ref());
        debug_assert!(self.fill == 0 && self.state == SHA256_IV, "a fresh value");
        if bytes.len() >= Self::FIRST {
            let mut block = [0u8; 64];
            block[..32].copy_from_slice(&parent.0);
            block[32..].copy_from_slice(&bytes[..Self::FIRST]);
            compress_blocks(&mut self.state, &block);
        } else {
            self.push(&parent.0);
        }
    }

    /// The next 64 bytes of the same `tokens`: one compression, when there
    /// are that many, straight from the slice.
    #[inline(always)]
    pub(crate) fn second(&mut self, tokens: &[u32]) {
        let tokens = tokens_le(tokens);
        let bytes = bytemuck::cast_slice::<u32, u8>(tokens.as_ref());
        if bytes.len() >= Self::FIRST + Self::SECOND {
            compress_blocks(&mut self.state, &bytes[Self::FIRST..Self::FIRST + Self::SECOND]);
        }
    }

    /// The rest of the same `tokens` and the block's image runs: the key.
    /// The value is fresh again afterwards.
    #[inline(always)]
    pub(crate) fn finish(&mut self, tokens: &[u32], runs: &[ImageRun]) -> BlockKey {
        let tokens = tokens_le(tokens);
        let bytes = bytemuck::cast_slice::<u32, u8>(tokens.as_ref());
        let staged = Self::staged_bytes(bytes.len());
        let rest = &bytes[staged..];
        // Whole blocks straight from the slice, unless the parent still
        // waits in the tail (a block too short to fill the first one).
        let whole = if staged > 0 { rest.len() / 64 * 64 } else { 0 };
        if whole > 0 {
            compress_blocks(&mut self.state, &rest[..whole]);
        }
        for piece in rest[whole..].chunks(64) {
            self.push(piece);
        }
        self.push(&(runs.len() as u32).to_le_bytes());
        for run in runs {
            let mut r = [0u8; 44];
            r[..32].copy_from_slice(&run.digest.0);
            r[32..36].copy_from_slice(&run.item_offset.to_le_bytes());
            r[36..40].copy_from_slice(&run.block_offset.to_le_bytes());
            r[40..].copy_from_slice(&run.len.to_le_bytes());
            self.push(&r);
        }
        // The padding: 0x80, zeros, and the message's length in bits.
        let len = (32 + bytes.len() + 4 + 44 * runs.len()) as u64 * 8;
        let end = if self.fill < 56 { 64 } else { 128 };
        self.tail[self.fill] = 0x80;
        self.tail[self.fill + 1..end - 8].fill(0);
        self.tail[end - 8..end].copy_from_slice(&len.to_be_bytes());
        compress_blocks(&mut self.state, &self.tail[..end]);
        let mut key = [0u8; 32];
        for (out, word) in key.chunks_exact_mut(4).zip(self.state) {
            out.copy_from_slice(&word.to_be_bytes());
        }
        (self.state, self.fill) = (SHA256_IV, 0);
        BlockKey(key)
    }

    /// Appends at most 64 bytes to the tail, compressing its first block
    /// once it holds one: the tail holds at most 63 bytes between pushes.
    #[inline(always)]
    fn push(&mut self, bytes: &[u8]) {
        debug_assert!(bytes.len() <= 64 && self.fill < 64);
        self.tail[self.fill..self.fill + bytes.len()].copy_from_slice(bytes);
        self.fill += bytes.len();
        if self.fill >= 64 {
            compress_blocks(&mut self.state, &self.tail[..64]);
            self.tail.copy_within(64..self.fill, 0);
            self.fill -= 64;
        }
    }
}

/// Tokens in little-endian order. On little-endian targets this borrows.
fn tokens_le(tokens: &[u32]) -> std::borrow::Cow<'_, [u32]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(tokens)
    } else {
        std::borrow::Cow::Owned(tokens.iter().map(|t| t.to_le()).collect())
    }
}

/// One image run of a prompt, flattened: where it sits in the prompt and
/// which part of which item it holds. A request keeps its runs sorted by
/// `start`; [`key_of_block`] cuts them at block boundaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlatRun {
    /// First token position of the run in the request.
    pub start: u32,
    /// Tokens in the run.
    pub len: u32,
    /// Offset of the run's first token within its item.
    pub item_offset: u32,
    /// The item's content digest.
    pub digest: ImageDigest,
}

impl FlatRun {
    /// The part of this run inside the block `block_start..block_end`
    /// (which it overlaps), with the item-local offset where the block cuts
    /// it.
    #[inline]
    pub fn cut(&self, block_start: u32, block_end: u32) -> ImageRun {
        let s = self.start.max(block_start);
        let e = (self.start + self.len).min(block_end);
        ImageRun {
            digest: self.digest,
            item_offset: self.item_offset + (s - self.start),
            block_offset: s - block_start,
            len: e - s,
        }
    }
}

/// The image runs of the block that starts at `block_start`, from a request's
/// flat, sorted runs. Runs that start before the block (an item the block
/// starts inside) carry the item-local offset where the block cuts them.
pub fn runs_in_block(runs: &[FlatRun], block_start: u32, block_size: u32, out: &mut Vec<ImageRun>) {
    out.clear();
    let block_end = block_start + block_size;
    let first = runs.partition_point(|r| r.start + r.len <= block_start);
    for r in &runs[first..] {
        if r.start >= block_end {
            break;
        }
        out.push(r.cut(block_start, block_end));
    }
}

/// [`runs_in_block`] for blocks visited in increasing order: `cursor` is the
/// first run that can still reach the block (0 before the first block), and
/// it moves past the runs that end before the block instead of searching
/// for them.
#[inline]
pub fn runs_in_block_from(
    runs: &[FlatRun],
    cursor: &mut usize,
    block_start: u32,
    block_size: u32,
    out: &mut Vec<ImageRun>,
) {
    out.clear();
    while runs.get(*cursor).is_some_and(|r| r.start + r.len <= block_start) {
        *cursor += 1;
    }
    let block_end = block_start + block_size;
    for r in runs.get(*cursor..).unwrap_or_default() {
        if r.start >= block_end {
            break;
        }
        out.push(r.cut(block_start, block_end));
    }
}

/// The block's tokens as keyed and advertised: the placeholder id at image
/// positions. Borrows when the block holds no image.
pub fn keyed_tokens<'a>(
    tokens: &'a [u32],
    runs: &[ImageRun],
    placeholder: u32,
    scratch: &'a mut Vec<u32>,
) -> &'a [u32] {
    if runs.is_empty() {
        return tokens;
    }
    scratch.clear();
    crate::copy::extend_block(scratch, tokens);
    for r in runs {
        scratch[r.block_offset as usize..(r.block_offset + r.len) as usize].fill(placeholder);
    }
    scratch
}

/// The key of the block holding `tokens` (exactly one block) at `block_start`.
/// Leaves the block's image runs in `block_runs`.
pub fn key_of_block(
    parent: &BlockKey,
    tokens: &[u32],
    runs: &[FlatRun],
    block_start: u32,
    placeholder: u32,
    scratch: &mut Vec<u32>,
    block_runs: &mut Vec<ImageRun>,
) -> BlockKey {
    runs_in_block(runs, block_start, tokens.len() as u32, block_runs);
    let keyed = keyed_tokens(tokens, block_runs, placeholder, scratch);
    block_key(parent, keyed, block_runs)
}

/// Dynamo's rule for turning an image identifier into a 64-bit `mm_hash`:
/// an identifier of exactly 64 hex digits maps to its first 16 hex digits read
/// as a u64; any other identifier maps to XXH3-64 of its bytes with seed 0.
pub fn mm_hash_of_identifier(identifier: &str) -> u64 {
    let bytes = identifier.as_bytes();
    if bytes.len() == 64 && bytes.iter().all(u8::is_ascii_hexdigit) {
        u64::from_str_radix(&identifier[..16], 16).expect("16 hex digits fit a u64")
    } else {
        xxhash_rust::xxh3::xxh3_64_with_seed(bytes, 0)
    }
}

/// The `mm_hash` of an image item: from its UUID hint when one is known and
/// unambiguous, otherwise from the 64-hex content digest (whose first 16 hex
/// digits are its first 8 bytes, big-endian).
pub fn mm_hash(digest: &ImageDigest, uuid_hint: Option<&str>) -> u64 {
    match uuid_hint {
        Some(uuid) => mm_hash_of_identifier(uuid),
        None => {
            let mut first = [0u8; 8];
            first.copy_from_slice(&digest.0[..8]);
            u64::from_be_bytes(first)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest path of `mm_hash` must equal Dynamo's rule applied to the hex
    /// string, so both sides agree without formatting hex on the hot path.
    #[test]
    fn mm_hash_of_digest_equals_rule_on_hex() {
        let d = ImageDigest::of_content(b"pixels");
        assert_eq!(mm_hash(&d, None), mm_hash_of_identifier(&d.to_hex()));
        assert_eq!(mm_hash(&d, Some("sku-001")), xxhash_rust::xxh3::xxh3_64_with_seed(b"sku-001", 0));
    }

    /// A key must change with every input it covers and not with the UUID,
    /// which is not an input at all.
    #[test]
    fn block_key_covers_every_input() {
        let root = root_key(&KeyScope { block_size_tokens: 4, ..Default::default() });
        let tokens = [1, 2, 3, 4];
        let run = ImageRun { digest: ImageDigest([7; 32]), item_offset: 0, block_offset: 1, len: 2 };
        let base = block_key(&root, &tokens, &[run]);
        assert_ne!(base, block_key(&root, &[1, 2, 3, 5], &[run]));
        assert_ne!(base, block_key(&root, &tokens, &[]));
        assert_ne!(base, block_key(&root, &tokens, &[ImageRun { digest: ImageDigest([8; 32]), ..run }]));
        assert_ne!(base, block_key(&root, &tokens, &[ImageRun { item_offset: 1, ..run }]));
        assert_ne!(base, block_key(&root, &tokens, &[ImageRun { block_offset: 0, ..run }]));
        assert_ne!(base, block_key(&BlockKey([1; 32]), &tokens, &[run]));
        let lora = root_key(&KeyScope { block_size_tokens: 4, lora_id: Some(1), cache_salt: None });
        let salt = root_key(&KeyScope { block_size_tokens: 4, lora_id: None, cache_salt: Some(b"s".to_vec()) });
        assert_ne!(root, lora);
        assert_ne!(root, salt);
        assert_ne!(lora, salt);
    }

    /// The staged key is the documented digest, one SHA-256 over the whole
    /// layout, whatever the block's length (shorter than the first 64-byte
    /// block, ending on it, past it, several blocks past it) and runs (none
    /// to enough for the tail to fill a block before the padding), and one
    /// value hashes key after key (each `finish` leaves it fresh);
    /// `block_key` is the same key.
    #[test]
    fn staged_key_is_the_one_shot_digest_key_after_key() {
        let parent = BlockKey([3; 32]);
        let run = ImageRun { digest: ImageDigest([9; 32]), item_offset: 5, block_offset: 1, len: 2 };
        let many: Vec<ImageRun> = (0..5).map(|i| ImageRun { block_offset: i, item_offset: 7 * i, ..run }).collect();
        let mut staged = StagedKey::default();
        for n in 0..=100u32 {
            let tokens: Vec<u32> = (0..n).map(|t| 0x0102_0304 ^ t.wrapping_mul(2_654_435_761)).collect();
            let shapes = [&[][..], &[run][..], &[run, ImageRun { block_offset: 3, ..run }][..], &many[..3], &many[..]];
            for runs in shapes {
                let mut bytes = parent.0.to_vec();
                tokens.iter().for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
                bytes.extend_from_slice(&(runs.len() as u32).to_le_bytes());
                for r in runs {
                    bytes.extend_from_slice(&r.digest.0);
                    for v in [r.item_offset, r.block_offset, r.len] {
                        bytes.extend_from_slice(&v.to_le_bytes());
                    }
                }
                let expected = BlockKey(Sha256::digest(&bytes).into());
                staged.begin(&parent, &tokens);
                staged.second(&tokens);
                assert_eq!(staged.finish(&tokens, runs), expected, "{n} tokens");
                assert_eq!(block_key(&parent, &tokens, runs), expected);
            }
        }
    }

    /// Walking blocks in order with a cursor gives each block the runs that
    /// the search gives it: runs that start before a block, end inside it,
    /// span several blocks, and blocks with none.
    #[test]
    fn runs_from_a_cursor_match_the_search() {
        let d = ImageDigest([4; 32]);
        let flat = [
            FlatRun { start: 3, len: 2, item_offset: 0, digest: d },
            FlatRun { start: 6, len: 9, item_offset: 0, digest: ImageDigest([5; 32]) },
            FlatRun { start: 15, len: 1, item_offset: 9, digest: d },
            FlatRun { start: 30, len: 4, item_offset: 0, digest: d },
        ];
        for bs in [1, 2, 4, 8, 16] {
            let (mut cursor, mut got, mut want) = (0, Vec::new(), Vec::new());
            for start in (0..40).step_by(bs as usize) {
                runs_in_block_from(&flat, &mut cursor, start, bs, &mut got);
                runs_in_block(&flat, start, bs, &mut want);
                assert_eq!(got, want, "block size {bs}, block at {start}");
            }
        }
    }

    /// The wire hash is the key's first 8 bytes read big-endian.
    #[test]
    fn wire_hash_is_big_endian_prefix() {
        let mut k = [0u8; 32];
        k[..8].copy_from_slice(&[0x80, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(BlockKey(k).wire_hash(), WireHash(i64::MIN + 1));
    }
}
