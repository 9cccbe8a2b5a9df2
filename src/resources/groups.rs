//! The KV cache groups of an engine: one [`KvCache`] per group, each with its
//! own pages, free lists, LRUs and prefix index (a block of group `g` is
//! `(g, key)`: every group uses the same block keys), and the window of each
//! sliding-window group.
//!
//! Why one cache per group rather than one cache holding every group: each
//! group's verbs keep that group's invariants exactly as a single-group
//! engine's cache does, and an engine that is not hybrid is the one-group
//! case of the same code, with the same pages, events and copies. What spans
//! groups is policy (which prefix every group can reuse, when a block falls
//! out of a window) and lives in the systems.
//!
//! ```text
//!            block 0   1   2   3   4   5   6   7      (block size 32, window 64)
//! group 0:   [ p ][ p ][ p ][ p ][ p ][ p ][ p ][ p ]  full attention: every block
//! group 1:   [nul][nul][nul][nul][nul][ p ][ p ][ p ]  sliding window: the blocks the
//!                                                     next token reads (tokens 192..255)
//! ```
//!
//! A sliding-window group's block table names its null page (page 0, never
//! handed out) for the blocks a request released early, as vLLM's null
//! block does: a kernel that reads the table whole reads a valid page, and
//! the window masks it.

use super::KvCache;
use crate::config::EngineConfig;
use crate::group::{GroupKind, KvGroup};

/// A sliding-window group's cache and window.
#[derive(Debug)]
pub struct WindowCache {
    /// The group's blocks.
    pub cache: KvCache,
    /// The window, in tokens: the token at position `p` reads the tokens
    /// `p - window_tokens + 1 ..= p`.
    pub window_tokens: u32,
}

/// Every group's cache: group 0 (full attention) and the sliding windows,
/// groups 1.. in order.
#[derive(Debug)]
pub struct KvGroups {
    /// Group 0, the full-attention group: the one a single-group engine has,
    /// and the one Dynamo indexes.
    pub main: KvCache,
    /// Groups 1.., the sliding windows, in group order.
    pub windows: Vec<WindowCache>,
}

impl KvGroups {
    /// A cache per group of `config` (one when it lists none), every page
    /// free, or `None` when that memory cannot be allocated. Each group may
    /// queue as many copies per step as it has pages.
    pub fn try_new(config: &EngineConfig) -> Option<Self> {
        let named = config.names_groups();
        let mut caches = config.effective_groups().into_iter().enumerate().map(|(index, g)| {
            let tag = named.then_some(KvGroup { index: index as u32, kind: g.kind });
            let copies_max = g.blocks_device as usize + g.blocks_host as usize;
            let cache = KvCache::try_new_group(
                config.block_size_tokens,
                g.blocks_device,
                g.blocks_host,
                copies_max,
                tag,
                g.kind,
            );
            cache.map(|c| (c, g.kind))
        });
        let (main, _) = caches.next()??;
        let mut windows = Vec::new();
        for c in caches {
            let (cache, kind) = c?;
            let GroupKind::SlidingWindow { window_tokens } = kind else {
                unreachable!("validation keeps full attention to group 0")
            };
            windows.push(WindowCache { cache, window_tokens });
        }
        Some(Self { main, windows })
    }

    /// Groups in all (1 for an engine that is not hybrid).
    pub fn count(&self) -> usize {
        1 + self.windows.len()
    }

    /// Group `g`'s cache, if there is such a group.
    pub fn get(&self, g: usize) -> Option<&KvCache> {
        match g {
            0 => Some(&self.main),
            _ => self.windows.get(g - 1).map(|w| &w.cache),
        }
    }

    /// Every group's cache, in group order.
    pub fn iter(&self) -> impl Iterator<Item = &KvCache> + '_ {
        std::iter::once(&self.main).chain(self.windows.iter().map(|w| &w.cache))
    }

    /// Every group's cache, in group order, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut KvCache> + '_ {
        std::iter::once(&mut self.main).chain(self.windows.iter_mut().map(|w| &mut w.cache))
    }

    /// Copies queued this step, over every group.
    pub fn copies_queued(&self) -> usize {
        self.iter().map(KvCache::copies_queued).sum()
    }
}

/// The first block a sliding window of `window_tokens` still needs once
/// `tokens_computed` tokens are computed: the next token (at position
/// `tokens_computed`) reads the `window_tokens - 1` tokens before it, so
/// the blocks wholly before token `tokens_computed - window_tokens + 1` are
/// out of the window (vLLM's `num_skipped_tokens`).
pub fn window_first_block(window_tokens: u32, tokens_computed: u32, block_size: u32) -> u32 {
    (tokens_computed + 1).saturating_sub(window_tokens) / block_size
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The window's first block follows vLLM's rule: with a window of 64
    /// tokens and blocks of 32, the next token after 128 computed reads
    /// tokens 65..=128, so block 2 (tokens 64..95) is the first needed.
    #[test]
    fn window_first_block_keeps_what_the_next_token_reads() {
        assert_eq!(window_first_block(64, 0, 32), 0);
        assert_eq!(window_first_block(64, 63, 32), 0);
        assert_eq!(window_first_block(64, 96, 32), 1);
        assert_eq!(window_first_block(64, 128, 32), 2);
        assert_eq!(window_first_block(64, 127, 32), 2);
        assert_eq!(window_first_block(64, 126, 32), 1);
        assert_eq!(window_first_block(1, 128, 32), 4);
    }
}
