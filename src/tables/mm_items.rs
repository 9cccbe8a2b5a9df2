//! The multimodal item table.

use std::sync::Arc;

use slotmap::SlotMap;

use crate::ids::{MmItemId, RequestId};
use crate::keys::ImageDigest;

/// A run of consecutive token positions in a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenRun {
    /// First token position.
    pub start: u32,
    /// Number of tokens.
    pub len: u32,
}

/// An image item row.
#[derive(Clone, Debug)]
pub struct MmItem {
    /// The request that owns the item.
    pub request: RequestId,
    /// BLAKE3-256 of the item's content: its cache identity.
    pub digest: ImageDigest,
    /// The caller's UUID when valid UTF-8 of at most 256 bytes (a routing hint only).
    pub uuid: Option<Arc<str>>,
}

/// The image item table.
#[derive(Debug, Default)]
pub struct MmItems {
    /// Rows.
    pub rows: SlotMap<MmItemId, MmItem>,
}

impl MmItems {
    /// An empty table with room for `capacity` rows, or `None` when that
    /// memory cannot be allocated.
    pub fn try_with_capacity(capacity: usize) -> Option<Self> {
        let mut rows = SlotMap::with_key();
        rows.try_reserve(capacity).ok()?;
        Some(Self { rows })
    }
}
