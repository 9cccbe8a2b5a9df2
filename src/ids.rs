//! Typed row ids for the engine's tables.
//!
//! Every table is a `slotmap::SlotMap`, so an id is a (slot index, generation)
//! pair. When a row is removed its slot's generation moves on: an id kept by a
//! caller after that is *stale* and misses every lookup instead of aliasing the
//! row that reuses the slot. Ids cross the C boundary as `u64`: the
//! generation in the high 32 bits, the slot in the low 32 (`KeyData::as_ffi`).
//!
//! A slot's generation is odd while the slot is occupied and even while it is
//! vacant, so every id the engine hands out has an odd generation. Coming
//! back, `KeyData::from_ffi` forces the generation odd (`| 1`): a forged or
//! corrupted value with the even generation just below a live id's would
//! resolve to that live request. [`FfiId::from_ffi`] therefore refuses an
//! even generation (and 0) itself, mapping it to the null key, which misses
//! every lookup.

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
    /// A value whose generation is even was never issued (issued generations
    /// are odd) and becomes the null key instead of the odd generation that
    /// `KeyData::from_ffi` would make of it.
    fn from_ffi(value: u64) -> Self {
        let generation = value >> 32;
        if generation.is_multiple_of(2) {
            return Self::null();
        }
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

    /// Only the exact value handed out resolves: the same slot with any other
    /// generation, odd or even, misses. Method: a live row, then every
    /// generation from 0 to 64 and the extremes with its slot.
    #[test]
    fn only_issued_generations_resolve() {
        let mut map: SlotMap<RequestId, u32> = SlotMap::with_key();
        let live = map.insert(7);
        let wire = live.to_ffi();
        let slot = wire & 0xffff_ffff;
        let issued = wire >> 32;
        for generation in (0..=64).chain([u32::MAX as u64 - 1, u32::MAX as u64]) {
            let forged = (generation << 32) | slot;
            let hit = map.get(RequestId::from_ffi(forged));
            if generation == issued {
                assert_eq!(hit, Some(&7));
            } else {
                assert!(hit.is_none(), "generation {generation} (issued {issued}) resolved to the live row");
            }
        }
    }
}
