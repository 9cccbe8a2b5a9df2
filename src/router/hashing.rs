//! Router keys: what the router files each advertised block under, and how a
//! request computes the same keys for its own blocks.
//!
//! A router key is a 64-bit value chained through parents, computed from
//! what a `BlockStored` event carries and nothing else:
//!
//! ```text
//! seed      = XXH3-64("kvcore-router/v4" ‖ block_size u32 LE ‖ tag(lora) ‖ tag(cache_salt))
//! content_i = CLNH64(tokens_i)                     for a text block (no image runs)
//!           = XXH3-64(tokens_i as u32 LE ‖ for each image run of block i:
//!                     digest[32] ‖ item_offset u32 LE ‖ block_offset u32 LE ‖ len u32 LE)
//!                                                  for a block with image runs
//! key_i     = key_{i-1} · CHAIN_MUL + content_i  (mod 2⁶⁴)        key_{-1} = seed
//! CHAIN_MUL = 0xD6E8_FEB8_6659_FD93 (odd)
//! tag(x)    = 0u8 when absent, else 1u8 ‖ len u32 LE ‖ bytes
//! CLNH64    = kvcore::block_content_hash: a carry-less NH over the tokens
//!             as 64-bit words and a 64-bit finalizer; XXH3-64 of the bytes
//!             past 256 tokens
//! ```
//!
//! Why this shape:
//! - **Chained**, so one key names a whole prefix and a lookup is a walk over
//!   a flat map, with no tree to maintain (Dynamo keys blocks unchained and
//!   rebuilds the prefix from parent links in a radix tree).
//! - **Two stages** (`content`, then `key`), so that a block whose parent the
//!   router does not know yet can keep its 8-byte content hash and be keyed
//!   later, when the parent arrives, without keeping its tokens.
//! - **One content hash per block.** The chain step is a multiply and an
//!   add: a polynomial (Karp-Rabin) hash over the blocks' content hashes.
//!   Since `CHAIN_MUL` is odd, both `parent ↦ key` (content fixed) and
//!   `content ↦ key` (parent fixed) are bijections of the 64-bit values: two
//!   blocks of different content hashes under one parent, or one block under
//!   two different parents, never get the same key. Two chains of different
//!   contents meet only when their sums agree, which for content hashes
//!   that behave as random 64-bit values has a chance of 2⁻⁶⁴ a pair. The
//!   step costs 4 cycles of latency, so the blocks' content hashes,
//!   independent of each other, overlap in the CPU; the request hash runs at
//!   the speed of the content hash over the tokens.
//! - **A vector hash for text blocks.** `CLNH64` (its recipe and its collision
//!   argument, about 2⁻⁶³ for two different blocks of one length, are in
//!   [`kvcore::block_hash`]) runs on the CPU's carry-less multiply
//!   (`VPCLMULQDQ` with AVX-512, or `PCLMULQDQ`) where it has one, detected
//!   once per process, and in a bit-identical software form elsewhere. Blocks with image runs keep XXH3-64 over their bytes: they
//!   are rare, and their bytes are not all tokens. Both sides of the router
//!   (the indexer applying `BlockStored`, and request hashing) take a
//!   block's content hash from the one function [`content_hash`], so they
//!   agree by construction.
//! - **History.** Version 1 (`kvcore-router/v1`) chained with a second
//!   XXH3 call over the parent key and the content hash, and took about 1.7
//!   times as long per block. Version 2 (`kvcore-router/v2`) hashed every
//!   block's content with XXH3-64; version 3 hashed text blocks with a
//!   two-fold integer NH; version 4 hashes them with CLNH64, about a third
//!   of the vector work.
//! - **Images by content digest**: a UUID never enters a key. A request that
//!   names an image only by UUID is resolved through a UUID-to-digest view the
//!   router learns from events ([`UuidResolver`]), and only while the whole
//!   fleet holds that UUID under one digest; the same UUID on other pixels
//!   therefore never matches by cache, and an image nobody advertised never
//!   matches at all.
//! - **Not cryptographic, and it need not be.** Router keys never leave the
//!   router: they are not on the wire, not in the engine, not in any cache.
//!   The engine's own SHA-256 block keys stay the cache identity, so a
//!   collision here (or one crafted on purpose, the hashes being unkeyed) can only
//!   misroute a request to a worker that then computes what it lacks, never
//!   corrupt a cache or make an engine reuse a block. With n blocks held in
//!   all, the chance of any collision is about n² / 2⁶⁴ (5·10⁻⁶ for 10
//!   million). The recipe is fixed and pinned by test vectors; a change to
//!   it changes the seed's tag.
//!
//! The LoRA identity in the seed is the event's `lora_name` when present,
//! otherwise its `lora_id` in decimal (see [`lora_identity`]).

use kvcore::{ImageDigest, ImageRun};

/// A block's router key (see the module docs for the recipe).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RouterKey(pub u64);

/// Domain tag at the start of every scope seed.
const SEED_TAG: &[u8; 16] = b"kvcore-router/v4";

/// The odd multiplier of the chain step (see the module docs).
const CHAIN_MUL: u64 = 0xD6E8_FEB8_6659_FD93;

/// The scope of a chain: block size, LoRA identity and cache salt. Requests
/// in different scopes never share keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RouterScope {
    /// Tokens per block.
    pub block_size: u32,
    /// LoRA identity (see [`lora_identity`]); `None` for the base model.
    pub lora: Option<String>,
    /// Cache salt; `None` when the request has none.
    pub cache_salt: Option<String>,
}

/// The LoRA identity that enters the seed: the adapter's name when the event
/// gives one, else its numeric id in decimal, else none. A request must name
/// its adapter the same way the engine advertises it.
pub fn lora_identity(lora_name: Option<&str>, lora_id: Option<u32>) -> Option<String> {
    match (lora_name, lora_id) {
        (Some(name), _) => Some(name.to_owned()),
        (None, Some(id)) => Some(id.to_string()),
        (None, None) => None,
    }
}

fn push_tag(buf: &mut Vec<u8>, value: Option<&str>) {
    match value {
        None => buf.push(0),
        Some(v) => {
            buf.push(1);
            buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
            buf.extend_from_slice(v.as_bytes());
        }
    }
}

/// The hashed bytes of the common scope's seed (no adapter, no salt): the
/// tag, the block size, two absent tags.
const fn common_seed_bytes(block_size: u32) -> [u8; 22] {
    let mut buf = [0u8; 22];
    let mut i = 0;
    while i < 16 {
        buf[i] = SEED_TAG[i];
        i += 1;
    }
    let size = block_size.to_le_bytes();
    let mut j = 0;
    while j < 4 {
        buf[16 + j] = size[j];
        j += 1;
    }
    buf
}

/// The common scope's seed, computed at compile time.
const fn common_seed(block_size: u32) -> u64 {
    xxhash_rust::const_xxh3::xxh3_64(&common_seed_bytes(block_size))
}

/// The common scope's seeds of the usual block sizes, made once at compile
/// time: a request hash of a short prompt spends a few percent of its time
/// on its seed otherwise.
const COMMON_SEEDS: [(u32, u64); 4] =
    [(16, common_seed(16)), (32, common_seed(32)), (64, common_seed(64)), (128, common_seed(128))];

/// The seed of a scope: the parent key of every chain's first block.
pub(crate) fn scope_seed(block_size: u32, lora: Option<&str>, cache_salt: Option<&str>) -> RouterKey {
    if lora.is_none() && cache_salt.is_none() {
        if let Some(&(_, seed)) = COMMON_SEEDS.iter().find(|(bs, _)| *bs == block_size) {
            return RouterKey(seed);
        }
        // The common scope, without a heap buffer.
        return RouterKey(xxhash_rust::xxh3::xxh3_64(&common_seed_bytes(block_size)));
    }
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(SEED_TAG);
    buf.extend_from_slice(&block_size.to_le_bytes());
    push_tag(&mut buf, lora);
    push_tag(&mut buf, cache_salt);
    RouterKey(xxhash_rust::xxh3::xxh3_64(&buf))
}

impl RouterScope {
    /// This scope's seed.
    pub fn seed(&self) -> RouterKey {
        scope_seed(self.block_size, self.lora.as_deref(), self.cache_salt.as_deref())
    }

    /// The router keys of a text-only prompt's full blocks in this scope:
    /// what [`hash_request`] gives for a [`TokenRequest`] without images,
    /// from borrowed tokens. A trailing partial block has no key; a block
    /// size of zero gives none.
    pub fn text_keys(&self, tokens: &[u32]) -> Vec<RouterKey> {
        let mut keys = Vec::new();
        if self.block_size > 0 {
            text_keys_into(self.seed(), tokens, self.block_size as usize, &mut keys);
        }
        keys
    }
}

/// A prompt's text keys, hashed a chunk of blocks at a time as a lookup's
/// walk reaches the end of those made so far
/// ([`crate::Indexer::find_matches_text`]).
#[derive(Debug)]
pub(crate) struct TextKeys<'a> {
    /// Tokens not hashed yet (whole blocks only count).
    rest: &'a [u32],
    /// Tokens per block (at least 1 while any block is left).
    block_size: usize,
    /// Blocks hashed per chunk.
    chunk_blocks: usize,
    /// The keys made so far.
    pub(crate) keys: Vec<RouterKey>,
    /// The parent of the next key.
    parent: RouterKey,
}

impl<'a> TextKeys<'a> {
    /// The keys of `tokens` in `scope`, `chunk_blocks` blocks (at least 1)
    /// a chunk, none made yet.
    pub(crate) fn new(scope: &RouterScope, tokens: &'a [u32], chunk_blocks: usize) -> Self {
        let block_size = scope.block_size as usize;
        Self {
            rest: if block_size == 0 { &[] } else { tokens },
            block_size: block_size.max(1),
            chunk_blocks: chunk_blocks.max(1),
            // Room for every key: regrowing chunk by chunk measured some 15 %
            // slower on a 2352-block prompt held whole.
            keys: Vec::with_capacity(tokens.len().checked_div(block_size).unwrap_or(0)),
            parent: scope.seed(),
        }
    }

    /// Hashes the next chunk; false when no full block is left.
    pub(crate) fn more(&mut self) -> bool {
        let take = self.rest.len().min(self.block_size * self.chunk_blocks);
        let (chunk, rest) = self.rest.split_at(take);
        self.rest = rest;
        let at = self.keys.len();
        text_keys_into(self.parent, chunk, self.block_size, &mut self.keys);
        match self.keys.last() {
            Some(&last) if self.keys.len() > at => {
                self.parent = last;
                true
            }
            _ => false,
        }
    }
}

/// Appends the chained keys of `tokens`' full blocks of `block_size`
/// (at least 1), from `seed`.
fn text_keys_into(seed: RouterKey, tokens: &[u32], block_size: usize, keys: &mut Vec<RouterKey>) {
    // One feature dispatch for all blocks; the chain step runs inside the
    // hash's vector loop, the parent passed by value (held in a register,
    // not reloaded from memory after every key's store), each key written
    // into room reserved in `keys` (a zeroing pass ahead of the hash cost
    // some 9 % of a 4096-token request).
    kvcore::block_content_hashes_extend(tokens, block_size, seed, keys, |parent, content| {
        let key = chain(parent, content);
        (key, key)
    });
}

/// The content hash of one block: its tokens (with the image placeholder id
/// at image positions) and its image runs in block order. A text block
/// hashes with [`kvcore::block_content_hash`]; a block with image runs with
/// XXH3-64 over its bytes. `scratch` is reused between calls so that image
/// blocks do not allocate.
pub(crate) fn content_hash(tokens: &[u32], runs: &[ImageRun], scratch: &mut Vec<u8>) -> u64 {
    if runs.is_empty() {
        return kvcore::block_content_hash(tokens);
    }
    let mut buf = std::mem::take(scratch);
    buf.clear();
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    for r in runs {
        buf.extend_from_slice(&r.digest.0);
        buf.extend_from_slice(&r.item_offset.to_le_bytes());
        buf.extend_from_slice(&r.block_offset.to_le_bytes());
        buf.extend_from_slice(&r.len.to_le_bytes());
    }
    let h = xxhash_rust::xxh3::xxh3_64(&buf);
    *scratch = buf;
    h
}

/// Chains a block's content hash onto its parent's key.
#[inline]
pub(crate) fn chain(parent: RouterKey, content: u64) -> RouterKey {
    RouterKey(parent.0.wrapping_mul(CHAIN_MUL).wrapping_add(content))
}

/// How a request names one of its images.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageRef {
    /// The content bytes: the router computes their BLAKE3-256 digest.
    Bytes(Vec<u8>),
    /// A BLAKE3-256 content digest computed by the caller.
    Digest(ImageDigest),
    /// Only the caller's UUID: resolved through what the router has learned
    /// from events (see [`UuidResolver`]).
    Uuid(String),
}

/// What the router knows about a UUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UuidLookup {
    /// Every event that named the UUID gave this digest.
    Digest(ImageDigest),
    /// Workers hold the UUID under two different digests now: it identifies
    /// nothing until the conflicting copies are gone.
    Ambiguous,
    /// The router's bounded view forgot, or could not record, some worker's
    /// copy of the UUID (or of another UUID sharing its slot): it cannot
    /// prove the fleet agrees on one digest, so the UUID identifies nothing
    /// until those workers clear.
    Unsure,
    /// No event named the UUID (or it was forgotten under the memory bound).
    Unknown,
}

/// Resolves a UUID to the content digest that events paired it with.
pub trait UuidResolver {
    /// What is known about `uuid`.
    fn resolve(&self, uuid: &str) -> UuidLookup;
}

/// A resolver that knows no UUID: requests with UUID-only images then match
/// up to the first block holding such an image.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoUuids;

impl UuidResolver for NoUuids {
    fn resolve(&self, _uuid: &str) -> UuidLookup {
        UuidLookup::Unknown
    }
}

/// One image of a request given as token ids, and where its tokens sit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImagePlacement {
    /// The image's identity.
    pub image: ImageRef,
    /// Its runs in request token space, `(start, len)`, in order; text may
    /// split one image into several runs.
    pub runs: Vec<(u32, u32)>,
}

/// A request as token ids plus image placements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenRequest {
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Images, each with its runs.
    pub images: Vec<ImagePlacement>,
    /// LoRA identity (see [`lora_identity`]).
    pub lora: Option<String>,
    /// Cache salt.
    pub cache_salt: Option<String>,
}

/// Why the keys of a request stop before its last full block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeysStop {
    /// The image has only a UUID that no event has paired with a digest.
    UnknownUuid {
        /// Index of the image in the request.
        image: usize,
    },
    /// The image's UUID is held under two different digests.
    AmbiguousUuid {
        /// Index of the image in the request.
        image: usize,
    },
    /// The router's bounded UUID view cannot vouch for the image's UUID
    /// ([`UuidLookup::Unsure`]).
    UnsureUuid {
        /// Index of the image in the request.
        image: usize,
    },
}

/// The router keys of a request's full blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashedRequest {
    /// Keys of the leading full blocks that could be keyed.
    pub keys: Vec<RouterKey>,
    /// Full blocks in the request.
    pub blocks_full: usize,
    /// Why `keys` is shorter than `blocks_full`, when it is.
    pub stop: Option<KeysStop>,
    /// The resolved digest of each image (`None` when unresolved).
    pub digests: Vec<Option<ImageDigest>>,
}

/// A request that cannot be hashed as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HashError {
    /// The block size is zero.
    #[error("block size must be at least 1")]
    ZeroBlockSize,
    /// An image has no runs.
    #[error("image {image} has no token runs")]
    NoRuns {
        /// Index of the image.
        image: usize,
    },
    /// A run has zero length.
    #[error("image {image} has a run of length 0")]
    ZeroLengthRun {
        /// Index of the image.
        image: usize,
    },
    /// A run ends past the prompt.
    #[error("image {image} has a run [{start}, {end}) past the prompt of {tokens} tokens")]
    RunOutOfRange {
        /// Index of the image.
        image: usize,
        /// Start of the run.
        start: u64,
        /// End of the run.
        end: u64,
        /// Prompt length.
        tokens: usize,
    },
    /// Two runs overlap.
    #[error("image runs overlap at token {at}")]
    OverlappingRuns {
        /// First token covered twice.
        at: u32,
    },
}

/// A flattened run in request token space.
#[derive(Clone, Copy, Debug)]
struct FlatRun {
    start: u32,
    len: u32,
    item_offset: u32,
    image: usize,
}

/// Computes the router keys of a request's full blocks, exactly as the
/// router keys the blocks an engine advertises for the same content.
///
/// Tokens at image positions are replaced by `placeholder` (the engine
/// advertises the placeholder there, whatever ids the caller used). Keys stop
/// at the first block that holds an image whose identity cannot be resolved:
/// no worker can hold that block under a key the request could name.
pub fn hash_request(
    request: &TokenRequest,
    block_size: u32,
    placeholder: u32,
    uuids: &dyn UuidResolver,
) -> Result<HashedRequest, HashError> {
    if block_size == 0 {
        return Err(HashError::ZeroBlockSize);
    }
    let n = request.tokens.len();
    let bs = block_size as usize;
    let blocks_full = n / bs;
    if request.images.is_empty() {
        let seed = scope_seed(block_size, request.lora.as_deref(), request.cache_salt.as_deref());
        let mut keys = Vec::new();
        text_keys_into(seed, &request.tokens, bs, &mut keys);
        return Ok(HashedRequest { keys, blocks_full, stop: None, digests: Vec::new() });
    }
    let mut runs = Vec::new();
    let mut digests = Vec::with_capacity(request.images.len());
    let mut unresolved: Vec<Option<KeysStop>> = Vec::with_capacity(request.images.len());
    for (image, placement) in request.images.iter().enumerate() {
        if placement.runs.is_empty() {
            return Err(HashError::NoRuns { image });
        }
        let mut item_offset = 0u32;
        for &(start, len) in &placement.runs {
            if len == 0 {
                return Err(HashError::ZeroLengthRun { image });
            }
            let end = start as u64 + len as u64;
            if end > n as u64 {
                return Err(HashError::RunOutOfRange { image, start: start as u64, end, tokens: n });
            }
            runs.push(FlatRun { start, len, item_offset, image });
            item_offset += len;
        }
        let (digest, stop) = match &placement.image {
            ImageRef::Bytes(bytes) => (Some(ImageDigest::of_content(bytes)), None),
            ImageRef::Digest(d) => (Some(*d), None),
            ImageRef::Uuid(u) => match uuids.resolve(u) {
                UuidLookup::Digest(d) => (Some(d), None),
                UuidLookup::Ambiguous => (None, Some(KeysStop::AmbiguousUuid { image })),
                UuidLookup::Unsure => (None, Some(KeysStop::UnsureUuid { image })),
                UuidLookup::Unknown => (None, Some(KeysStop::UnknownUuid { image })),
            },
        };
        digests.push(digest);
        unresolved.push(stop);
    }
    runs.sort_by_key(|r| r.start);
    for pair in runs.windows(2) {
        if pair[0].start + pair[0].len > pair[1].start {
            return Err(HashError::OverlappingRuns { at: pair[1].start });
        }
    }

    let seed = scope_seed(block_size, request.lora.as_deref(), request.cache_salt.as_deref());
    let mut keys = Vec::with_capacity(blocks_full);
    let mut scratch = Vec::new();
    let mut block_tokens: Vec<u32> = Vec::with_capacity(bs);
    let mut block_runs: Vec<ImageRun> = Vec::new();
    let mut parent = seed;
    let mut stop = None;
    let mut next_run = 0usize;
    'blocks: for b in 0..blocks_full {
        let (block_start, block_end) = ((b * bs) as u32, ((b + 1) * bs) as u32);
        let tokens = &request.tokens[b * bs..(b + 1) * bs];
        // Skip runs that end before this block; runs are sorted and disjoint.
        while next_run < runs.len() && runs[next_run].start + runs[next_run].len <= block_start {
            next_run += 1;
        }
        block_runs.clear();
        for r in &runs[next_run..] {
            if r.start >= block_end {
                break;
            }
            let Some(digest) = digests[r.image] else {
                stop = unresolved[r.image].clone();
                break 'blocks;
            };
            let s = r.start.max(block_start);
            let e = (r.start + r.len).min(block_end);
            block_runs.push(ImageRun {
                digest,
                item_offset: r.item_offset + (s - r.start),
                block_offset: s - block_start,
                len: e - s,
            });
        }
        let content = if block_runs.is_empty() {
            content_hash(tokens, &[], &mut scratch)
        } else {
            block_tokens.clear();
            block_tokens.extend_from_slice(tokens);
            for r in &block_runs {
                block_tokens[r.block_offset as usize..(r.block_offset + r.len) as usize].fill(placeholder);
            }
            content_hash(&block_tokens, &block_runs, &mut scratch)
        };
        parent = chain(parent, content);
        keys.push(parent);
    }
    Ok(HashedRequest { keys, blocks_full, stop, digests })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds made at compile time are the ones hashed at run time from
    /// the same bytes, built the long way (tag, size, two absent tags), for
    /// the sizes in the table and the sizes around them.
    #[test]
    fn compile_time_seeds_match_the_hashed_bytes() {
        for bs in [1u32, 15, 16, 17, 32, 64, 100, 128, 256] {
            let mut buf = SEED_TAG.to_vec();
            buf.extend_from_slice(&bs.to_le_bytes());
            push_tag(&mut buf, None);
            push_tag(&mut buf, None);
            assert_eq!(scope_seed(bs, None, None), RouterKey(xxhash_rust::xxh3::xxh3_64(&buf)), "block size {bs}");
        }
    }

    /// Router keys of a text-only token sequence: one per full block, chained
    /// from `seed`. The trailing partial block has no key (only full blocks are
    /// ever advertised).
    fn text_keys(seed: RouterKey, tokens: &[u32], block_size: u32, out: &mut Vec<RouterKey>) {
        out.clear();
        if block_size == 0 {
            return;
        }
        let mut scratch = Vec::new();
        let mut parent = seed;
        for block in tokens.chunks_exact(block_size as usize) {
            parent = chain(parent, content_hash(block, &[], &mut scratch));
            out.push(parent);
        }
    }

    /// Text keys must be chained (a change in block 0 changes every later key)
    /// and scoped (LoRA and salt give other keys), and the general path must
    /// agree with the text fast path when no image is present.
    #[test]
    fn keys_are_chained_scoped_and_paths_agree() {
        let tokens: Vec<u32> = (0..100).collect();
        let seed = scope_seed(16, None, None);
        let mut a = Vec::new();
        text_keys(seed, &tokens, 16, &mut a);
        assert_eq!(a.len(), 6);
        let mut other = tokens.clone();
        other[0] = 999;
        let mut b = Vec::new();
        text_keys(seed, &other, 16, &mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y), "a change in block 0 reaches every key");
        let req = TokenRequest { tokens: tokens.clone(), ..Default::default() };
        let h = hash_request(&req, 16, 7, &NoUuids).unwrap();
        assert_eq!(h.keys, a);
        assert_eq!(h.blocks_full, 6);
        let lora = hash_request(&TokenRequest { lora: Some("x".into()), ..req.clone() }, 16, 7, &NoUuids).unwrap();
        let salt =
            hash_request(&TokenRequest { cache_salt: Some("x".into()), ..req.clone() }, 16, 7, &NoUuids).unwrap();
        assert_ne!(lora.keys[0], a[0]);
        assert_ne!(salt.keys[0], a[0]);
        assert_ne!(lora.keys[0], salt.keys[0]);
    }

    /// An image keyed by bytes, by digest, and by a UUID the resolver knows
    /// gives the same keys; placeholder ids are forced at image positions; an
    /// unknown UUID stops the keys at the image's first block.
    #[test]
    fn image_identities_agree_and_unknown_uuid_stops() {
        struct One(ImageDigest);
        impl UuidResolver for One {
            fn resolve(&self, uuid: &str) -> UuidLookup {
                if uuid == "cat" { UuidLookup::Digest(self.0) } else { UuidLookup::Unknown }
            }
        }
        let pixels = b"cat pixels".to_vec();
        let digest = ImageDigest::of_content(&pixels);
        let tokens: Vec<u32> = (0..64).collect();
        let place = |image| TokenRequest {
            tokens: tokens.clone(),
            images: vec![ImagePlacement { image, runs: vec![(20, 10), (34, 4)] }],
            ..Default::default()
        };
        let r = One(digest);
        let by_bytes = hash_request(&place(ImageRef::Bytes(pixels)), 16, 5, &r).unwrap();
        let by_digest = hash_request(&place(ImageRef::Digest(digest)), 16, 5, &r).unwrap();
        let by_uuid = hash_request(&place(ImageRef::Uuid("cat".into())), 16, 5, &r).unwrap();
        assert_eq!(by_bytes.keys.len(), 4);
        assert_eq!(by_bytes.keys, by_digest.keys);
        assert_eq!(by_bytes.keys, by_uuid.keys);
        // Block 0 holds no image: same key as plain text.
        let mut text = Vec::new();
        text_keys(scope_seed(16, None, None), &tokens, 16, &mut text);
        assert_eq!(by_bytes.keys[0], text[0]);
        assert_ne!(by_bytes.keys[1], text[1]);
        // Caller ids at image positions do not matter.
        let mut other_ids = place(ImageRef::Digest(digest));
        other_ids.tokens[21] = 12345;
        assert_eq!(hash_request(&other_ids, 16, 5, &r).unwrap().keys, by_digest.keys);
        // A different image changes the keys from its first block on.
        let other = hash_request(&place(ImageRef::Bytes(b"dog".to_vec())), 16, 5, &r).unwrap();
        assert_eq!(other.keys[0], by_bytes.keys[0]);
        assert_ne!(other.keys[1], by_bytes.keys[1]);
        let unknown = hash_request(&place(ImageRef::Uuid("dog".into())), 16, 5, &r).unwrap();
        assert_eq!(unknown.keys, by_bytes.keys[..1].to_vec());
        assert_eq!(unknown.stop, Some(KeysStop::UnknownUuid { image: 0 }));
    }

    /// The recipe, pinned: the seed, a text chain and an image block's key
    /// recomputed here from the module docs' formulas (XXH3 and
    /// `kvcore::block_content_hash`, pinned by its own vectors), and
    /// the same values as literals, so that any change to the recipe (which
    /// must change the seed's tag) fails here.
    #[test]
    fn recipe_test_vectors() {
        use xxhash_rust::xxh3::xxh3_64;
        let le = |v: &[u32]| v.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>();
        // seed = XXH3-64(tag ‖ block_size ‖ 0 ‖ 0)
        let mut b = b"kvcore-router/v4".to_vec();
        b.extend_from_slice(&16u32.to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        let seed = xxh3_64(&b);
        assert_eq!(scope_seed(16, None, None).0, seed);
        // With a LoRA name and a salt: 1 ‖ len ‖ bytes for each.
        let mut b2 = b"kvcore-router/v4".to_vec();
        b2.extend_from_slice(&16u32.to_le_bytes());
        for v in ["lora-a", "salt"] {
            b2.push(1);
            b2.extend_from_slice(&(v.len() as u32).to_le_bytes());
            b2.extend_from_slice(v.as_bytes());
        }
        assert_eq!(scope_seed(16, Some("lora-a"), Some("salt")).0, xxh3_64(&b2));
        // key_i = key_{i-1} · 0xD6E8_FEB8_6659_FD93 + CLNH64(tokens_i).
        let tokens: Vec<u32> = (0..40).map(|i| i * 1000 + 7).collect();
        let mut expect = Vec::new();
        let mut k = seed;
        for block in tokens.chunks_exact(16) {
            k = k.wrapping_mul(0xD6E8_FEB8_6659_FD93).wrapping_add(kvcore::block_content_hash(block));
            expect.push(RouterKey(k));
        }
        let scope = RouterScope { block_size: 16, lora: None, cache_salt: None };
        let keys = scope.text_keys(&tokens);
        assert_eq!(keys, expect);
        assert_eq!(
            hash_request(&TokenRequest { tokens: tokens.clone(), ..Default::default() }, 16, 0, &NoUuids).unwrap().keys,
            keys
        );
        // An image block: placeholder ids at the image's positions, then
        // digest ‖ item_offset ‖ block_offset ‖ len after the tokens.
        let digest = ImageDigest([0xAB; 32]);
        let req = TokenRequest {
            tokens: tokens.clone(),
            images: vec![ImagePlacement { image: ImageRef::Digest(digest), runs: vec![(20, 6)] }],
            ..Default::default()
        };
        let img = hash_request(&req, 16, 99, &NoUuids).unwrap();
        let mut block1 = tokens[16..32].to_vec();
        block1[4..10].fill(99);
        let mut bytes = le(&block1);
        bytes.extend_from_slice(&digest.0);
        for v in [0u32, 4, 6] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let k1 = expect[0].0.wrapping_mul(0xD6E8_FEB8_6659_FD93).wrapping_add(xxh3_64(&bytes));
        assert_eq!(img.keys[..2], [expect[0], RouterKey(k1)]);
        // The literals (computed once from the formulas above).
        assert_eq!(
            (seed, keys[0].0, keys[1].0, k1),
            (0x20c2_40cf_c33c_20c9, 0xfc2d_e704_ba30_3e1b, 0x08a8_0dd1_b297_196c, 0x0484_58d7_d911_a9d5),
            "the router key recipe changed: bump the seed's tag and these vectors together"
        );
    }

    /// Malformed placements are errors, never panics.
    #[test]
    fn bad_placements_are_errors() {
        let tokens: Vec<u32> = vec![0; 32];
        let mk = |runs| TokenRequest {
            tokens: tokens.clone(),
            images: vec![ImagePlacement { image: ImageRef::Digest(ImageDigest([1; 32])), runs }],
            ..Default::default()
        };
        assert_eq!(hash_request(&mk(vec![]), 8, 0, &NoUuids), Err(HashError::NoRuns { image: 0 }));
        assert_eq!(hash_request(&mk(vec![(0, 0)]), 8, 0, &NoUuids), Err(HashError::ZeroLengthRun { image: 0 }));
        assert!(matches!(hash_request(&mk(vec![(30, 5)]), 8, 0, &NoUuids), Err(HashError::RunOutOfRange { .. })));
        assert_eq!(hash_request(&mk(vec![(0, 5), (4, 2)]), 8, 0, &NoUuids), Err(HashError::OverlappingRuns { at: 4 }));
        assert_eq!(hash_request(&mk(vec![(0, 5)]), 0, 0, &NoUuids), Err(HashError::ZeroBlockSize));
    }
}
