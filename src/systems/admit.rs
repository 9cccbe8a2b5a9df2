//! Admission: validate a request, match its longest cached prefix, take
//! references and allocate the rest, all or nothing.
//!
//! The policy lives here (what matches, which partial source to copy, what
//! capacity a request needs, in which order blocks are pinned, onboarded and
//! allocated); every change to the block side goes through a [`KvCache`]
//! verb, which keeps the pool, index, LRUs and references in step.

use std::sync::Arc;

use crate::config::{EngineConfig, UUID_HINT_BYTES_MAX};
use crate::error::AdmitError;
use crate::events::EventQueue;
use crate::ids::{BlockId, RequestId};
use crate::keys::{BlockKey, FlatRun, ImageDigest, KeyScope, key_of_block};
use crate::resources::{
    Counters, HintInsert, KvCache, KvGroups, RoutingHints, RowBuffers, Scratch, WindowCache, window_first_block,
};
use crate::tables::{MmItem, MmItems, Request, RequestScope, Requests, TokenRun, WindowTable};
use crate::tier::Tier;

/// The content of an image item as the caller gives it.
#[derive(Clone, Copy, Debug)]
pub enum MmContent<'a> {
    /// The content bytes; kvcore computes their BLAKE3-256 digest.
    Bytes(&'a [u8]),
    /// A BLAKE3-256 digest computed by the caller; must be 32 bytes.
    Digest(&'a [u8]),
}

/// An image item of a request.
#[derive(Clone, Debug)]
pub struct MmItemSpec<'a> {
    /// Content or digest.
    pub content: MmContent<'a>,
    /// Where the item's tokens sit in the prompt: one or more runs, in order.
    pub runs: Vec<TokenRun>,
}

/// A request as the caller submits it.
#[derive(Clone, Debug, Default)]
pub struct RequestSpec<'a> {
    /// Prompt token ids.
    pub tokens: &'a [u32],
    /// LoRA adapter id.
    pub lora_id: Option<u32>,
    /// LoRA adapter name.
    pub lora_name: Option<&'a str>,
    /// Cache salt.
    pub cache_salt: Option<&'a str>,
    /// Image items.
    pub items: Vec<MmItemSpec<'a>>,
    /// UUIDs, one entry per item when given (entries may be absent). Bytes,
    /// because they come from callers that may pass anything; they must be UTF-8.
    pub uuids: Option<Vec<Option<&'a [u8]>>>,
    /// A warm-up request: allocates, never indexed, no events.
    pub dummy: bool,
}

/// The outcome of a successful admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// The new request.
    pub id: RequestId,
    /// Prompt tokens found in the prefix cache (their KV is already there).
    pub tokens_cached: u32,
    /// Of those, tokens onboarded from the host tier.
    pub tokens_onboarded: u32,
}

/// A request that passed validation: digests computed (in the scratch's
/// `digests`), runs flattened (in its row's `runs`).
#[derive(Debug)]
pub struct ValidRequest<'a> {
    spec: &'a RequestSpec<'a>,
    /// The new row's vectors, `runs` filled, the rest empty.
    row: RowBuffers,
    uuids: Option<Vec<Option<String>>>,
}

/// Checks a request against the config and computes its item digests into
/// `scratch.digests`. Touches no engine state but the scratch buffers.
pub fn validate_request<'a>(
    spec: &'a RequestSpec<'a>,
    config: &EngineConfig,
    scratch: &mut Scratch,
) -> Result<ValidRequest<'a>, AdmitError> {
    let prompt_len = spec.tokens.len();
    if prompt_len == 0 {
        return Err(AdmitError::EmptyPrompt);
    }
    if prompt_len > config.tokens_per_request_max as usize {
        return Err(AdmitError::PromptTooLong { tokens: prompt_len, max: config.tokens_per_request_max });
    }
    if let Some(lora_id) = spec.lora_id
        && spec.lora_name.is_none_or(str::is_empty)
    {
        return Err(AdmitError::LoraNameRequired { lora_id });
    }
    if spec.items.len() > config.mm_items_per_request_max as usize {
        return Err(AdmitError::TooManyItems { items: spec.items.len(), max: config.mm_items_per_request_max });
    }
    if let Some(u) = &spec.uuids
        && u.len() != spec.items.len()
    {
        return Err(AdmitError::UuidCountMismatch { uuids: u.len(), items: spec.items.len() });
    }
    let uuids = match &spec.uuids {
        None => None,
        Some(list) => Some(
            list.iter()
                .enumerate()
                .map(|(item, u)| match u {
                    None => Ok(None),
                    Some(bytes) => std::str::from_utf8(bytes)
                        .map(|s| Some(s.to_owned()))
                        .map_err(|_| AdmitError::InvalidUtf8Uuid { item }),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let runs = &mut scratch.flat;
    let digests = &mut scratch.digests;
    runs.clear();
    digests.clear();
    for (item, it) in spec.items.iter().enumerate() {
        if it.runs.is_empty() || it.runs.len() > config.runs_per_item_max as usize {
            return Err(AdmitError::BadRunCount { item, runs: it.runs.len(), max: config.runs_per_item_max });
        }
        let mut item_offset = 0u32;
        let mut prev_end = 0u64;
        for (k, r) in it.runs.iter().enumerate() {
            if r.len == 0 {
                return Err(AdmitError::ZeroLengthRun { item });
            }
            let (start, end) = (r.start as u64, r.start as u64 + r.len as u64);
            if end > prompt_len as u64 {
                return Err(AdmitError::RunOutOfRange { item, start, end, prompt_len });
            }
            if k > 0 && start < prev_end {
                return Err(AdmitError::OverlappingRuns { item, at: start });
            }
            prev_end = end;
            runs.push((r.start, r.len, item_offset, item));
            item_offset += r.len;
        }
        digests.push(match it.content {
            MmContent::Bytes(b) => ImageDigest::of_content(b),
            MmContent::Digest(d) => {
                let d: [u8; 32] = d.try_into().map_err(|_| AdmitError::BadDigestLength { item, len: d.len() })?;
                ImageDigest(d)
            }
        });
    }
    runs.sort_unstable_by_key(|r| r.0);
    for w in runs.windows(2) {
        if (w[0].0 as u64 + w[0].1 as u64) > w[1].0 as u64 {
            return Err(AdmitError::OverlappingRuns { item: w[1].3, at: w[1].0 as u64 });
        }
    }
    let mut row = scratch.take_row();
    let digests = &scratch.digests;
    row.runs.extend(scratch.flat.iter().map(|&(start, len, item_offset, item)| FlatRun {
        start,
        len,
        item_offset,
        digest: digests[item],
    }));
    Ok(ValidRequest { spec, row, uuids })
}

/// Admits a validated request: matches the longest cached prefix of full
/// blocks (at most `prompt_len - 1` tokens, so that at least one token is
/// computed and yields logits), takes references on the matched blocks
/// (onboarding host blocks), and allocates the rest of the prompt. Either all
/// of it happens or nothing does.
///
/// With sliding-window groups, a prefix of `k` blocks is reused only when
/// every group holds what the next token reads: group 0 all `k` blocks,
/// each window the blocks from [`window_first_block`] of `k * B` tokens to
/// `k`. Each window's table holds nothing before that block (its null
/// page), and every group allocates the rest of the prompt in its own pool.
#[allow(clippy::too_many_arguments, reason = "a system names every table and resource it touches")]
pub fn admit_request(
    valid: ValidRequest<'_>,
    config: &EngineConfig,
    requests: &mut Requests,
    items: &mut MmItems,
    groups: &mut KvGroups,
    events: &mut EventQueue,
    counters: &mut Counters,
    scratch: &mut Scratch,
) -> Result<Admission, AdmitError> {
    let KvGroups { main: cache, windows } = groups;
    let ValidRequest { spec, row, uuids } = valid;
    let RowBuffers { tokens: mut row_tokens, items: mut row_items, runs, mut blocks, mut keys } = row;
    let bs = config.block_size_tokens;
    let prompt_len = spec.tokens.len() as u32;
    let reject = |counters: &mut Counters, scratch: &mut Scratch, row: RowBuffers, e: AdmitError| {
        counters.requests_rejected += 1;
        scratch.give_buffers(row);
        Err(e)
    };
    if requests.rows.len() >= config.requests_max as usize {
        let row = RowBuffers { tokens: row_tokens, items: row_items, runs, blocks, keys };
        return reject(counters, scratch, row, AdmitError::TooManyRequests { max: config.requests_max });
    }
    if items.rows.len() + spec.items.len() > config.mm_items_max as usize {
        let row = RowBuffers { tokens: row_tokens, items: row_items, runs, blocks, keys };
        return reject(counters, scratch, row, AdmitError::TooManyLiveItems { max: config.mm_items_max });
    }
    let root = scratch.root_key(&KeyScope {
        block_size_tokens: bs,
        lora_id: spec.lora_id,
        cache_salt: spec.cache_salt.map(|s| s.as_bytes().to_vec()),
    });

    // Match: walk full blocks while the index has their keys.
    keys.reserve(prompt_len.div_ceil(bs) as usize);
    let mut matched = std::mem::take(&mut scratch.matched);
    matched.clear();
    let copy_room = cache.copy_room();
    let mut host_matched = 0;
    if config.block_reuse && !spec.dummy {
        let max_blocks = (prompt_len - 1) / bs;
        for i in 0..max_blocks {
            let parent = keys.last().copied().unwrap_or(root);
            let key = key_of_block(
                &parent,
                &spec.tokens[(i * bs) as usize..((i + 1) * bs) as usize],
                &runs,
                i * bs,
                config.image_placeholder_token_id,
                &mut scratch.tokens,
                &mut scratch.block_runs,
            );
            keys.push(key);
            match cache.lookup(&key) {
                // A host block needs a copy to onboard: the match stops at
                // one that the step's copies have no room left for (the
                // caller made many calls without a step), and its tokens
                // are computed instead.
                Some(b) if cache.block(b).medium == Tier::Host && host_matched >= copy_room => break,
                Some(b) => {
                    host_matched += usize::from(cache.block(b).medium == Tier::Host);
                    matched.push(b);
                }
                None => break,
            }
        }
    }

    // Every sliding window must hold the blocks the next token reads: the
    // match shrinks to the longest prefix they all hold.
    if !windows.is_empty() && !matched.is_empty() {
        let k = windowed_match(&keys[..matched.len()], windows, bs);
        matched.truncate(k);
    }
    let k = matched.len() as u32;
    let window_matched: Vec<(u32, Vec<BlockId>)> = windows
        .iter()
        .map(|w| {
            let first = window_first_block(w.window_tokens, k * bs, bs);
            let blocks = keys[first as usize..k as usize]
                .iter()
                .map(|key| w.cache.lookup(key).expect("windowed_match checked the window's blocks"))
                .collect();
            (first, blocks)
        })
        .collect();

    // Partial reuse of the next block: a cached device sibling that shares a
    // leading run of text tokens with it.
    let partial = if config.partial_reuse && config.block_reuse && !spec.dummy && host_matched < copy_room {
        find_partial(cache, &runs, spec, &matched, bs)
    } else {
        None
    };

    // Capacity: every new block and every onboarded block needs a device page.
    let blocks_total = prompt_len.div_ceil(bs) as usize;
    let on_host = matched.iter().filter(|b| cache.block(**b).medium == Tier::Host).count();
    let pinned_from_lru = matched
        .iter()
        .chain(partial.as_ref().map(|p| &p.0))
        .filter(|b| {
            let row = cache.block(**b);
            row.medium == Tier::Device && row.lru.linked
        })
        .count();
    let needed = blocks_total - matched.len() + on_host;
    let available = cache.device_blocks_available() - pinned_from_lru;
    if needed > available {
        scratch.matched = matched;
        let row = RowBuffers { tokens: row_tokens, items: row_items, runs, blocks, keys };
        return reject(counters, scratch, row, AdmitError::OutOfBlocks { needed, available });
    }
    let fresh = blocks_total - matched.len();
    for (w, (_, wm)) in windows.iter().zip(&window_matched) {
        let on_host = wm.iter().filter(|b| w.cache.block(**b).medium == Tier::Host).count();
        let pinned = wm
            .iter()
            .filter(|b| {
                let row = w.cache.block(**b);
                row.medium == Tier::Device && row.lru.linked
            })
            .count();
        let (needed, available) = (fresh + on_host, w.cache.device_blocks_available() - pinned);
        if needed > available {
            scratch.matched = matched;
            let row = RowBuffers { tokens: row_tokens, items: row_items, runs, blocks, keys };
            return reject(counters, scratch, row, AdmitError::OutOfBlocks { needed, available });
        }
    }

    // From here on nothing can fail.
    let scope = cache.acquire_scope(RequestScope {
        lora_id: spec.lora_id,
        lora_name: spec.lora_name.map(Arc::from),
        cache_salt: spec.cache_salt.map(Arc::from),
    });
    // The request's references, taken first: they take the matched blocks
    // out of their LRUs, so that the evictions and offloads made room for
    // below cannot pick them (a host block holds its reference through its
    // onboard).
    for &b in &matched {
        cache.acquire(b);
    }
    // The partial source is pinned too (a reference no request holds, given
    // back below), while onboarding and allocation may evict.
    if let Some((source, _)) = partial {
        cache.acquire(source);
    }
    // Room for the onboards and the partial copy, set aside before any
    // eviction can offload into it.
    cache.reserve_copies(on_host + usize::from(partial.is_some()));
    cache.make_room(needed, config.offload_first, events, counters);
    blocks.reserve(blocks_total);
    for &b in &matched {
        if cache.block(b).medium == Tier::Host {
            cache.onboard(b, events, counters);
        }
        blocks.push(b);
    }
    cache.allocate_device_blocks(fresh, partial.is_some(), &mut blocks, events, counters);
    let mut tables = Vec::with_capacity(windows.len());
    for (w, (first, wm)) in windows.iter_mut().zip(window_matched) {
        let cache = &mut w.cache;
        for &b in &wm {
            cache.acquire(b);
        }
        let on_host = wm.iter().filter(|b| cache.block(**b).medium == Tier::Host).count();
        cache.reserve_copies(on_host);
        cache.make_room(fresh + on_host, config.offload_first, events, counters);
        let mut taken = Vec::with_capacity(wm.len() + fresh);
        for &b in &wm {
            if cache.block(b).medium == Tier::Host {
                cache.onboard(b, events, counters);
            }
            taken.push(b);
        }
        cache.allocate_device_blocks(fresh, false, &mut taken, events, counters);
        let mut table = vec![None; first as usize];
        table.extend(taken.into_iter().map(Some));
        let scope = cache.acquire_scope(RequestScope {
            lora_id: spec.lora_id,
            lora_name: spec.lora_name.map(Arc::from),
            cache_salt: spec.cache_salt.map(Arc::from),
        });
        tables.push(WindowTable { blocks: table, released: first, scope });
    }
    let mut tokens_cached = matched.len() as u32 * bs;
    if let Some((source, k)) = partial {
        cache.queue_prefix_copy(source, blocks[matched.len()], k);
        cache.release(source);
        tokens_cached += k;
        counters.blocks_partially_reused += 1;
    }

    let blocks_committed = matched.len() as u32;
    scratch.matched = matched;
    crate::copy::extend_tokens(&mut row_tokens, spec.tokens);
    row_items.reserve(spec.items.len());
    let id = requests.rows.insert(Request {
        tokens: row_tokens,
        prompt_len,
        scope,
        root,
        items: row_items,
        runs,
        uuids,
        blocks,
        windows: tables,
        keys,
        tokens_computed: tokens_cached,
        tokens_cached,
        blocks_committed,
        dummy: spec.dummy,
    });
    let request = &mut requests.rows[id];
    for k in 0..spec.items.len() {
        let uuid = request
            .uuids
            .as_ref()
            .and_then(|u| u[k].as_deref())
            .filter(|u| u.len() <= UUID_HINT_BYTES_MAX)
            .map(Arc::from);
        request.items.push(items.rows.insert(MmItem { request: id, digest: scratch.digests[k], uuid }));
    }
    counters.requests_admitted += 1;
    counters.tokens_cached += tokens_cached as u64;
    counters.tokens_uncached += (prompt_len - tokens_cached) as u64;
    Ok(Admission { id, tokens_cached, tokens_onboarded: on_host as u32 * bs })
}

/// The longest prefix of `keys` (each matched in group 0) that every sliding
/// window can reuse: `k` such that each window holds the blocks from its
/// [`window_first_block`] of `k * block_size` tokens to `k`, with room this
/// step to onboard those of them on its host tier. O(keys) per window: a
/// run length of held blocks ending at each place and a running count of
/// host blocks say at once whether a `k` fits.
fn windowed_match(keys: &[BlockKey], windows: &[WindowCache], block_size: u32) -> usize {
    let per_window: Vec<(Vec<u32>, Vec<u32>)> = windows
        .iter()
        .map(|w| {
            let (mut run, mut host) = (Vec::with_capacity(keys.len()), Vec::with_capacity(keys.len() + 1));
            let (mut r, mut h) = (0u32, 0u32);
            host.push(0);
            for key in keys {
                match w.cache.lookup(key) {
                    Some(b) => {
                        r += 1;
                        h += u32::from(w.cache.block(b).medium == Tier::Host);
                    }
                    None => r = 0,
                }
                run.push(r);
                host.push(h);
            }
            (run, host)
        })
        .collect();
    (1..=keys.len())
        .rev()
        .find(|&k| {
            windows.iter().zip(&per_window).all(|(w, (run, host))| {
                let first = window_first_block(w.window_tokens, k as u32 * block_size, block_size) as usize;
                let held = first >= k || run[k - 1] as usize >= k - first;
                held && (host[k] - host[first.min(k)]) as usize <= w.cache.copy_room()
            })
        })
        .unwrap_or(0)
}

/// Siblings scanned for partial reuse, so admission stays O(1) per block.
const PARTIAL_CANDIDATES_MAX: usize = 32;

/// Finds the cached device block that shares the longest leading run of text
/// tokens with the request's first unmatched block, among the indexed
/// children of the last matched block (or the scope's first blocks). Leaves at
/// least one prompt token to compute, stops at the first image position on
/// either side (image content is compared only through full-block keys), and
/// returns the source block and the shared token count.
fn find_partial(
    cache: &KvCache,
    runs: &[FlatRun],
    spec: &RequestSpec<'_>,
    matched: &[BlockId],
    bs: u32,
) -> Option<(BlockId, u32)> {
    let start = matched.len() as u32 * bs;
    let prompt_len = spec.tokens.len() as u32;
    let mut limit = (bs - 1).min(prompt_len.saturating_sub(start + 1));
    let first_run = runs.iter().find(|r| r.start + r.len > start).map(|r| r.start.saturating_sub(start));
    if let Some(offset) = first_run {
        limit = limit.min(offset);
    }
    if limit == 0 {
        return None;
    }
    let head = match matched.last() {
        Some(&parent) => cache.siblings(parent)?.first_child,
        None => {
            let scope = cache.scopes().find(&RequestScope {
                lora_id: spec.lora_id,
                lora_name: spec.lora_name.map(Arc::from),
                cache_salt: spec.cache_salt.map(Arc::from),
            })?;
            *cache.scopes().root_children(scope)
        }
    };
    let want = &spec.tokens[start as usize..(start + limit) as usize];
    let mut best: Option<(BlockId, u32)> = None;
    for id in cache.children(head, PARTIAL_CANDIDATES_MAX) {
        let row = cache.block(id);
        if row.medium != Tier::Device {
            continue;
        }
        let content = cache.content_of(id);
        let cap = content.images.as_slice().first().map_or(limit, |r| r.block_offset.min(limit));
        let have = cache.tokens(row);
        let k = want[..cap as usize].iter().zip(have).take_while(|(a, b)| a == b).count() as u32;
        if k > best.map_or(0, |b| b.1) {
            best = Some((id, k));
        }
    }
    best
}

/// Pairs each item's digest with its UUID in the routing-hint table. Items
/// without a UUID are skipped; UUIDs over 256 bytes are ignored and counted.
/// Dummy requests record nothing, since they never produce events.
pub fn record_routing_hints(
    requests: &Requests,
    items: &MmItems,
    id: RequestId,
    hints: &mut RoutingHints,
    counters: &mut Counters,
) {
    let request = &requests.rows[id];
    if request.dummy {
        return;
    }
    let Some(uuids) = &request.uuids else { return };
    for (k, item_id) in request.items.iter().enumerate() {
        let item = &items.rows[*item_id];
        match (&item.uuid, &uuids[k]) {
            (Some(uuid), _) => {
                let _: HintInsert = hints.insert(item.digest, uuid, counters);
            }
            (None, Some(_)) => counters.hint_oversized += 1,
            (None, None) => {}
        }
    }
}
