//! The hash profile: every rule a router must share with the engine for its
//! request hashes to meet the engine's blocks.
//!
//! A router that hashes requests with another block size, another image
//! placeholder id, another `mm_hash` rule or another scope rule matches
//! nothing, and nothing on the stream says so. The profile names each rule,
//! so a consumer can compare it with its own configuration and refuse a
//! stream it would misread. It is published in `model_info` (`hash_profile`)
//! and, on request, in replay and snapshot replies (docs/wire-format.md).

use serde::{Deserialize, Serialize};

use crate::events::wire::IMAGE_ROUTING_VERSION;
use crate::group::KvGroup;
use crate::keys::BLOCK_KEY_ALGORITHM;

/// The version of the profile document itself.
pub const HASH_PROFILE_VERSION: u32 = 1;

/// The name of the wire hash recipe: the first 8 bytes of the 32-byte block
/// key read big-endian as a signed 64-bit integer.
pub const WIRE_HASH_RECIPE: &str = "block-key-first-8-bytes-be-i64";

/// The name of the `mm_hash` recipe (`kvcore::mm_hash`): an identifier of 64
/// hex digits maps to its first 16 digits as a u64, any other identifier to
/// XXH3-64 of its bytes with seed 0; the identifier is the item's UUID hint
/// when one is known and unambiguous, else its 64-hex BLAKE3 content digest.
pub const MM_HASH_RECIPE: &str = "dynamo-hex16-else-xxh3-64-seed0";

/// The name of the scope rule: block keys are scoped by the LoRA adapter
/// (whose id always comes with its name) and the cache salt; routers key on
/// `lora_name` and `cache_salt`.
pub const SCOPE_RULE: &str = "lora-name-and-cache-salt";

/// The rules that decide whether a router's hashes meet this engine's blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashProfile {
    /// [`HASH_PROFILE_VERSION`].
    pub v: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// The block key recipe ([`BLOCK_KEY_ALGORITHM`]).
    pub block_key_algorithm: String,
    /// The wire hash recipe ([`WIRE_HASH_RECIPE`]).
    pub wire_hash: String,
    /// The `mm_hash` recipe ([`MM_HASH_RECIPE`]).
    pub mm_hash: String,
    /// The token ids that stand at image positions in `token_ids`.
    pub image_placeholder_token_ids: Vec<u32>,
    /// The scope rule ([`SCOPE_RULE`]).
    pub scope: String,
    /// The version of the routing metadata on the stream (`image_routing`
    /// `v`). Named apart from `model_info`'s `extra.image_routing_version`,
    /// which says whether image routing is advertised at all.
    pub routing_metadata_version: u64,
    /// A hybrid engine's KV cache groups, so that a consumer knows every
    /// group before any block of it arrives (a group holding nothing would
    /// otherwise never be named, and a prefix it cannot serve would look
    /// reusable). Empty, and absent from the JSON, for a single-group
    /// engine. Not a hashing rule: [`HashProfile::first_difference`] does
    /// not compare it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kv_cache_groups: Vec<ProfileGroup>,
}

/// One KV cache group of a [`HashProfile`], named as the events name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileGroup {
    /// The group's index (`group_idx`).
    pub group_idx: u32,
    /// Its kind (`kv_cache_spec_kind`): `"full_attention"` or
    /// `"sliding_window"` from kvcore, another name from another engine.
    pub kv_cache_spec_kind: String,
    /// A sliding-window group's window in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_spec_sliding_window: Option<u32>,
}

impl From<KvGroup> for ProfileGroup {
    fn from(g: KvGroup) -> Self {
        Self {
            group_idx: g.index,
            kv_cache_spec_kind: g.kind.as_str().to_owned(),
            kv_cache_spec_sliding_window: g.kind.window_tokens(),
        }
    }
}

impl HashProfile {
    /// This build's profile for `block_size` tokens per block and the given
    /// image placeholder ids.
    pub fn new(block_size: u32, image_placeholder_token_ids: Vec<u32>) -> Self {
        Self {
            v: HASH_PROFILE_VERSION,
            block_size,
            block_key_algorithm: BLOCK_KEY_ALGORITHM.into(),
            wire_hash: WIRE_HASH_RECIPE.into(),
            mm_hash: MM_HASH_RECIPE.into(),
            image_placeholder_token_ids,
            scope: SCOPE_RULE.into(),
            routing_metadata_version: IMAGE_ROUTING_VERSION,
            kv_cache_groups: Vec::new(),
        }
    }

    /// The same profile listing a hybrid engine's groups (none for a
    /// single-group engine).
    pub fn with_groups(mut self, groups: impl IntoIterator<Item = KvGroup>) -> Self {
        self.kv_cache_groups = groups.into_iter().map(ProfileGroup::from).collect();
        self
    }

    /// The first field in which `other` differs from `self`, as
    /// `(name, ours, theirs)`; `None` when they agree.
    pub fn first_difference(&self, other: &HashProfile) -> Option<(&'static str, String, String)> {
        let pairs: [(&'static str, String, String); 8] = [
            ("v", self.v.to_string(), other.v.to_string()),
            ("block_size", self.block_size.to_string(), other.block_size.to_string()),
            ("block_key_algorithm", self.block_key_algorithm.clone(), other.block_key_algorithm.clone()),
            ("wire_hash", self.wire_hash.clone(), other.wire_hash.clone()),
            ("mm_hash", self.mm_hash.clone(), other.mm_hash.clone()),
            (
                "image_placeholder_token_ids",
                format!("{:?}", self.image_placeholder_token_ids),
                format!("{:?}", other.image_placeholder_token_ids),
            ),
            ("scope", self.scope.clone(), other.scope.clone()),
            (
                "routing_metadata_version",
                self.routing_metadata_version.to_string(),
                other.routing_metadata_version.to_string(),
            ),
        ];
        pairs.into_iter().find(|(_, a, b)| a != b)
    }

    /// The profile as the JSON bytes a reply carries.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("invariant: a profile of strings and integers serialises")
    }

    /// A profile from a reply's JSON bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile survives its JSON, and each differing field is named.
    #[test]
    fn differences_are_named() {
        let a = HashProfile::new(32, vec![151_655]);
        assert_eq!(HashProfile::from_json(&a.to_json()).unwrap(), a);
        assert_eq!(a.first_difference(&a), None);
        let b = HashProfile::new(16, vec![151_655]);
        assert_eq!(a.first_difference(&b), Some(("block_size", "32".into(), "16".into())));
        let c = HashProfile { mm_hash: "other".into(), ..a.clone() };
        assert_eq!(a.first_difference(&c).map(|d| d.0), Some("mm_hash"));
        let d = HashProfile::new(32, vec![32_000]);
        assert_eq!(a.first_difference(&d).map(|d| d.0), Some("image_placeholder_token_ids"));
    }
}
