//! KV cache groups: the sets of layers that share one paged pool.
//!
//! A hybrid model mixes full-attention layers with sliding-window layers, and
//! an engine keeps one pool per group of layers with the same attention
//! pattern, because the two kinds need different blocks kept: a
//! full-attention layer reads every earlier token, a sliding-window layer only
//! the last `window_tokens`. Every group shares the block size and the
//! content-addressed block keys, so a block is named by `(group, key)`.
//!
//! An engine with one group (every engine before groups existed) names none
//! on the wire: its events carry no group, byte for byte as before.

/// What the layers of a KV cache group attend to, hence which blocks of a
/// request the group must keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    /// Every layer reads every earlier token: a prefix of `k` blocks is
    /// reusable only when the group holds all `k`.
    FullAttention,
    /// Every layer reads the last `window_tokens` tokens only: a prefix is
    /// reusable when the group holds the blocks that cover the last
    /// `window_tokens` before the match point.
    SlidingWindow {
        /// The attention window, in tokens (vLLM's `sliding_window`).
        window_tokens: u32,
    },
}

/// vLLM's `kv_cache_spec_kind` of a full-attention group.
pub const KIND_FULL_ATTENTION: &str = "full_attention";
/// vLLM's `kv_cache_spec_kind` of a sliding-window group.
pub const KIND_SLIDING_WINDOW: &str = "sliding_window";

impl GroupKind {
    /// The kind's name on the wire (vLLM's `kv_cache_spec_kind`):
    /// `"full_attention"` or `"sliding_window"`.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupKind::FullAttention => KIND_FULL_ATTENTION,
            GroupKind::SlidingWindow { .. } => KIND_SLIDING_WINDOW,
        }
    }

    /// The window in tokens of a sliding-window group, `None` for full
    /// attention (vLLM's `kv_cache_spec_sliding_window`).
    pub fn window_tokens(self) -> Option<u32> {
        match self {
            GroupKind::FullAttention => None,
            GroupKind::SlidingWindow { window_tokens } => Some(window_tokens),
        }
    }
}

/// A KV cache group as an event names it: its index in the engine's list of
/// groups and its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KvGroup {
    /// The group's index in the engine configuration (vLLM's `group_idx`).
    pub index: u32,
    /// The group's kind.
    pub kind: GroupKind,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire names are vLLM's strings; a sliding window reports its
    /// window and full attention none.
    #[test]
    fn kinds_name_themselves_as_vllm_does() {
        assert_eq!(GroupKind::FullAttention.as_str(), "full_attention");
        assert_eq!(GroupKind::SlidingWindow { window_tokens: 128 }.as_str(), "sliding_window");
        assert_eq!(GroupKind::FullAttention.window_tokens(), None);
        assert_eq!(GroupKind::SlidingWindow { window_tokens: 128 }.window_tokens(), Some(128));
    }
}
