//! The projection of typed events onto wire events: block keys become wire
//! hashes, image items become `mm_hash` values and routing metadata. What it
//! returns is exactly what a consumer decodes.

use super::layout::{EncodeOptions, EventForm};
use crate::events::wire::{
    ImageRoutingV1, WireBlockRemoved, WireBlockStored, WireEvent, WireImageItem, WireImageRef, WireMmInfo, WireMmObject,
};
use crate::events::{BlockStored, KvEvent};
use crate::keys::mm_hash;

/// The wire view of a typed event under `opts`: what a consumer decodes.
pub fn wire_event(event: &KvEvent, opts: &EncodeOptions) -> WireEvent {
    match event {
        KvEvent::BlockStored(e) => WireEvent::BlockStored(wire_stored(e, opts)),
        KvEvent::BlockRemoved(e) => WireEvent::BlockRemoved(WireBlockRemoved {
            block_hashes: e.keys.iter().map(|k| k.wire_hash().0).collect(),
            medium: Some(e.medium.as_str().to_owned()),
            group_idx: e.group.map(|g| g.index),
            // The array form has no slot for a removal's kind (layout.rs).
            kv_cache_spec_kind: e.group.filter(|_| opts.form == EventForm::Map).map(|g| g.kind.as_str().to_owned()),
            kv_cache_spec_sliding_window: e
                .group
                .filter(|_| opts.form == EventForm::Map)
                .and_then(|g| g.kind.window_tokens()),
        }),
        KvEvent::AllBlocksCleared(_) => WireEvent::AllBlocksCleared,
    }
}

fn wire_stored(e: &BlockStored, opts: &EncodeOptions) -> WireBlockStored {
    let has_images = e.block_images.iter().any(|runs| !runs.is_empty());
    let block_mm_infos = (has_images && opts.token_ids).then(|| {
        e.block_images
            .iter()
            .map(|runs| {
                if runs.is_empty() {
                    return None;
                }
                let mut objects: Vec<(u32, WireMmObject)> = Vec::new();
                for r in runs {
                    let range = [r.block_offset, r.block_offset.saturating_add(r.len)];
                    // The array form carries one start offset per object in
                    // `extra_keys`, not the ranges (Dynamo hashes neither).
                    let array = opts.form == EventForm::Array;
                    match objects.iter_mut().find(|(i, _)| *i == r.image) {
                        Some((_, o)) => {
                            if !array {
                                o.offsets.push(range);
                            }
                        }
                        None => {
                            let hash = e
                                .images
                                .get(r.image as usize)
                                .map(|img| mm_hash(&img.digest, img.uuid.as_deref()))
                                .unwrap_or(0);
                            let offsets = if array { Vec::new() } else { vec![range] };
                            objects.push((r.image, WireMmObject { mm_hash: hash, offsets }));
                        }
                    }
                }
                Some(WireMmInfo { mm_objects: objects.into_iter().map(|(_, o)| o).collect() })
            })
            .collect()
    });
    let image_routing = has_images.then(|| ImageRoutingV1 {
        items: e
            .images
            .iter()
            .map(|i| WireImageItem { digest: i.digest.0, uuid: i.uuid.as_deref().map(str::to_owned) })
            .collect(),
        blocks: e
            .block_images
            .iter()
            .map(|runs| {
                runs.iter()
                    .map(|r| WireImageRef {
                        item: r.image,
                        item_offset: r.item_offset,
                        block_offset: r.block_offset,
                        len: r.len,
                    })
                    .collect()
            })
            .collect(),
    });
    WireBlockStored {
        block_hashes: e.keys.iter().map(|k| k.wire_hash().0).collect(),
        parent_block_hash: e.parent.map(|p| p.wire_hash().0),
        token_ids: opts.token_ids.then(|| e.token_ids.clone()),
        block_size: e.block_size,
        lora_id: e.lora_id.map(i64::from),
        medium: Some(e.medium.as_str().to_owned()),
        lora_name: e.lora_name.as_deref().map(str::to_owned),
        cache_salt: e.cache_salt.as_deref().map(str::to_owned),
        block_mm_infos,
        image_routing,
        group_idx: e.group.map(|g| g.index),
        kv_cache_spec_kind: e.group.map(|g| g.kind.as_str().to_owned()),
        kv_cache_spec_sliding_window: e.group.and_then(|g| g.kind.window_tokens()),
    }
}
