//! Capabilities: what a deployment of kvcore can promise to a router, and the
//! `model_info` document that says so.
//!
//! A router that routes image requests by content (digest-keyed blocks, UUID
//! hints on the wire) must only do so when every link of the chain holds. If
//! one link is missing the router would route on keys that no worker ever
//! advertises, which is worse than routing on text alone. So the field
//! `extra.image_routing_version` is written only when **every** gate holds:
//!
//! | gate | why it is needed |
//! |---|---|
//! | the model is image-capable | a text-only engine never sees image items |
//! | its family is in [`VALIDATED_FAMILIES`] and the engine's placeholder token matches the table | block keys write the family's placeholder id at image positions; another id gives keys no router can reproduce |
//! | block reuse is on | without reuse no block is ever advertised |
//! | KV events are on | without events the router learns nothing |
//! | a ZMQ publisher is configured | the events need a way out of the process |
//! | serving is aggregated | with a disaggregated KV transfer the blocks a prefill worker advertises are not where decode runs |
//!
//! The table and the gate live here, outside `ffi`, so that the command-line
//! tool and the router can ask the same question.

use serde_json::json;

use crate::config::{EngineConfig, QWEN_IMAGE_PAD_TOKEN};
use crate::events::profile::HashProfile;
use crate::group::KvGroup;
use crate::keys::BLOCK_KEY_ALGORITHM;

/// The version of image routing this crate implements (the value of
/// `extra.image_routing_version` when every gate holds): the version of the
/// `image_routing` metadata the codec writes on the wire.
pub use crate::events::wire::IMAGE_ROUTING_VERSION;

/// A model family whose image-token layout has been validated against kvcore's
/// block keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelFamily {
    /// The family as Hugging Face `config.json` names it in `model_type`.
    pub model_type: &'static str,
    /// The image placeholder token id the family's processor writes at image positions.
    pub image_placeholder_token_id: u32,
}

/// Families validated for image routing, most important first. A family is
/// added here only after its placeholder layout was checked end to end.
pub const VALIDATED_FAMILIES: &[ModelFamily] =
    &[ModelFamily { model_type: "qwen3_vl", image_placeholder_token_id: QWEN_IMAGE_PAD_TOKEN }];

/// Looks a family up by its `model_type` (exact, case-sensitive, as in `config.json`).
pub fn validated_family(model_type: &str) -> Option<&'static ModelFamily> {
    VALIDATED_FAMILIES.iter().find(|f| f.model_type == model_type)
}

/// How KV data moves between workers. Only [`KvTransfer::None`] is aggregated serving.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvTransfer {
    /// Aggregated serving: prefill and decode run on the worker that holds the blocks.
    #[default]
    None,
    /// This worker prefills and sends KV to decode workers.
    Producer,
    /// This worker receives KV from prefill workers.
    Consumer,
    /// This worker does both.
    Both,
}

/// What the deployment around the engine looks like: facts that are not the
/// engine's business but decide what a router may rely on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deployment {
    /// The model's `model_type` (e.g. `qwen3_vl`), when known.
    pub model_type: Option<String>,
    /// Whether the model takes image inputs.
    pub model_image_capable: bool,
    /// The ZMQ endpoint the KV-event publisher binds (or will bind), when one is configured.
    pub kv_events_endpoint: Option<String>,
    /// The KV transfer role; anything but [`KvTransfer::None`] is disaggregated serving.
    pub kv_transfer: KvTransfer,
}

/// The gates of image routing, each `true` when it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageRoutingGates {
    /// The model takes images.
    pub model_image_capable: bool,
    /// The family is validated and the engine uses its placeholder token.
    pub family_validated: bool,
    /// Prefix reuse is on.
    pub block_reuse: bool,
    /// KV events are on.
    pub kv_events: bool,
    /// A ZMQ publisher is configured.
    pub publisher_configured: bool,
    /// Serving is aggregated.
    pub aggregated: bool,
}

impl ImageRoutingGates {
    /// Evaluates every gate.
    pub fn evaluate(config: &EngineConfig, deployment: &Deployment) -> Self {
        let family = deployment.model_type.as_deref().and_then(validated_family);
        Self {
            model_image_capable: deployment.model_image_capable,
            family_validated: family.is_some_and(|f| f.image_placeholder_token_id == config.image_placeholder_token_id),
            block_reuse: config.block_reuse,
            kv_events: config.kv_events,
            publisher_configured: deployment.kv_events_endpoint.as_deref().is_some_and(|e| !e.is_empty()),
            aggregated: deployment.kv_transfer == KvTransfer::None,
        }
    }

    /// Whether image routing can be advertised.
    pub fn all(&self) -> bool {
        self.model_image_capable
            && self.family_validated
            && self.block_reuse
            && self.kv_events
            && self.publisher_configured
            && self.aggregated
    }
}

/// The `model_info` document: the figures a router needs to reproduce this
/// engine's keys, plus `extra.image_routing_version` when every gate holds.
pub fn model_info(config: &EngineConfig, deployment: &Deployment) -> serde_json::Value {
    let gates = ImageRoutingGates::evaluate(config, deployment);
    let mut extra = serde_json::Map::new();
    if gates.all() {
        extra.insert("image_routing_version".into(), json!(IMAGE_ROUTING_VERSION));
    }
    json!({
        "kvcore_version": env!("CARGO_PKG_VERSION"),
        "model_type": deployment.model_type,
        "block_size": config.block_size_tokens,
        "block_key_algorithm": BLOCK_KEY_ALGORITHM,
        "image_placeholder_token_id": config.image_placeholder_token_id,
        "block_reuse": config.block_reuse,
        "kv_events": config.kv_events,
        "hash_profile": profile_of(config),
        "extra": extra,
    })
}

/// The hash profile of an engine of `config`: its block size and image
/// placeholder id with this build's recipes, and the KV cache groups of an
/// engine that names them (what `model_info` advertises and replies carry).
pub(crate) fn profile_of(config: &EngineConfig) -> HashProfile {
    let groups: Vec<KvGroup> = if config.names_groups() {
        let groups = config.effective_groups().into_iter().enumerate();
        groups.map(|(index, g)| KvGroup { index: index as u32, kind: g.kind }).collect()
    } else {
        Vec::new()
    };
    HashProfile::new(config.block_size_tokens, vec![config.image_placeholder_token_id]).with_groups(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_on() -> (EngineConfig, Deployment) {
        let deployment = Deployment {
            model_type: Some("qwen3_vl".into()),
            model_image_capable: true,
            kv_events_endpoint: Some("tcp://127.0.0.1:5557".into()),
            kv_transfer: KvTransfer::None,
        };
        (EngineConfig::default(), deployment)
    }

    fn version(config: &EngineConfig, deployment: &Deployment) -> Option<u64> {
        model_info(config, deployment)["extra"].get("image_routing_version").map(|v| v.as_u64().unwrap())
    }

    /// With every gate on the field is present; turning each gate off alone removes it.
    #[test]
    fn each_gate_alone_removes_the_field() {
        let (c, d) = all_on();
        assert_eq!(version(&c, &d), Some(1));
        let mut cases: Vec<(&str, EngineConfig, Deployment)> = Vec::new();
        let (mut c1, d1) = all_on();
        c1.block_reuse = false;
        cases.push(("reuse", c1, d1));
        let (mut c2, d2) = all_on();
        c2.kv_events = false;
        cases.push(("events", c2, d2));
        let (c3, mut d3) = all_on();
        d3.model_image_capable = false;
        cases.push(("image", c3, d3));
        let (c4, mut d4) = all_on();
        d4.model_type = Some("llava".into());
        cases.push(("family", c4, d4));
        let (mut c5, d5) = all_on();
        c5.image_placeholder_token_id = 32_000;
        cases.push(("placeholder", c5, d5));
        let (c6, mut d6) = all_on();
        d6.kv_events_endpoint = None;
        cases.push(("publisher", c6, d6));
        let (c7, mut d7) = all_on();
        d7.kv_transfer = KvTransfer::Producer;
        cases.push(("disagg", c7, d7));
        for (name, c, d) in cases {
            assert_eq!(version(&c, &d), None, "gate {name}");
        }
    }
}
