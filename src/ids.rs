//! Typed row ids for the engine's tables.
//!
//! Every table is a `slotmap::SlotMap`, so an id is a (slot index, generation)
//! pair. When a row is removed its slot's generation moves on: an id kept by a
//! caller after that is *stale* and misses every lookup instead of aliasing the
//! row that reuses the slot. Ids cross the C boundary as `u64` through
//! `KeyData::as_ffi` / `KeyData::from_ffi`, which keep that property.

use slotmap::{Key, KeyData};

slotmap::new_key_type! {
    /// A request row in [`crate::tables::Requests`].
    pub struct RequestId;
    /// A KV block row in [`crate::tables::KvBlocks`]. A block id names one
    /// allocation of a physical page: it goes stale when the block is evicted or
    /// freed, even though the page itself is reused.
    pub struct BlockId;
    /// A multimodal (image) item row in [`crate::tables::MmItems`].
    pub struct MmItemId;
    /// An interned request scope (LoRA and cache salt) in
    /// [`crate::resources::Scopes`]. It lives here, below the tables, because
    /// request rows and block contents name it and tables never import
    /// resources.
    pub struct ScopeId;
}

/// Conversion of typed ids to and from the `u64` that crosses the C ABI.
pub trait FfiId: Key {
    /// The id as an opaque `u64`. Never 0 for a live id.
    fn to_ffi(self) -> u64 {
        self.data().as_ffi()
    }
    /// Rebuilds an id from a `u64`. Any value is accepted: a value that never
    /// came from [`FfiId::to_ffi`] or that went stale simply misses on lookup.
    fn from_ffi(value: u64) -> Self {
        KeyData::from_ffi(value).into()
    }
}

impl FfiId for RequestId {}
impl FfiId for BlockId {}
impl FfiId for MmItemId {}

#[cfg(test)]
mod tests {
    use super::*;
    use slotmap::SlotMap;

    /// A stale id must miss after its row is removed and the slot reused,
    /// including after a round trip through the C representation.
    #[test]
    fn stale_id_misses_after_slot_reuse() {
        let mut map: SlotMap<RequestId, u32> = SlotMap::with_key();
        let old = map.insert(1);
        let wire = old.to_ffi();
        map.remove(old);
        let new = map.insert(2);
        assert_ne!(old, new);
        assert!(map.get(RequestId::from_ffi(wire)).is_none());
        assert_eq!(map.get(RequestId::from_ffi(new.to_ffi())), Some(&2));
        assert!(map.get(RequestId::from_ffi(0)).is_none());
        assert!(map.get(RequestId::from_ffi(u64::MAX)).is_none());
    }
}
