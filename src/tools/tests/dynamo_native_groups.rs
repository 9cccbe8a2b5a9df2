//! Dynamo 1.6.1's own wire parser and event filter (the `dynamo-kv-router`
//! crate from crates.io, in process) on a hybrid engine's events, in both
//! forms: every event of the full-attention group passes and converts to
//! exactly the placement event of the same block from a single-group
//! engine; every event of the sliding-window group is filtered, by its kind
//! (a store, a map-form removal) or by the kind learned for its group (a
//! positional removal, which names the index alone), never misread.

use dynamo_kv_router::protocols::WorkerWithDpRank;
use dynamo_kv_router::zmq_wire::{ZmqEventFilterReason, ZmqEventNormalizer, decode_event_batch};
use kvcore::wire::{EncodeOptions, EventForm, encode_events};
use kvcore::{BlockKey, BlockRemoved, BlockStored, GroupKind, KvEvent, KvGroup, Tier};

const BS: u32 = 16;

fn stored(chain: u8, group: Option<KvGroup>) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        event_seq: 0,
        keys: (0..3)
            .map(|i| {
                BlockKey([
                    chain, i, 7, 7, 7, 7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                    21, 22, 23, 24,
                ])
            })
            .collect(),
        parent: None,
        token_ids: (0..3 * BS).map(|t| u32::from(chain) * 1000 + t).collect(),
        block_size: BS,
        lora_id: None,
        lora_name: None,
        cache_salt: None,
        medium: Tier::Device,
        images: Vec::new(),
        block_images: Default::default(),
        group,
    })
}

fn removed(chain: u8, group: Option<KvGroup>) -> KvEvent {
    let KvEvent::BlockStored(s) = stored(chain, None) else { unreachable!() };
    KvEvent::BlockRemoved(BlockRemoved { event_seq: 0, keys: vec![s.keys[2]], medium: Tier::Device, group })
}

/// Each event through Dynamo's parser and filter: the placement event's
/// debug text when it passes, the filter's reason when it does not.
fn through_dynamo(events: &[KvEvent], form: EventForm) -> Vec<Result<String, ZmqEventFilterReason>> {
    let mut bytes = Vec::new();
    encode_events(events, 1.0, None, &EncodeOptions { form, token_ids: true }, &mut bytes);
    let batch = decode_event_batch(&bytes).expect("Dynamo decodes the batch");
    assert_eq!(batch.events.len(), events.len());
    let mut norm = ZmqEventNormalizer::new(BS);
    let worker = WorkerWithDpRank::new(1, 0);
    batch
        .events
        .into_iter()
        .enumerate()
        .map(|(id, raw)| {
            let raw = norm.preprocess_with_reason(raw, worker)?;
            let placed = norm.normalize_preprocessed(raw, id as u64, worker).expect("a main-group event converts");
            Ok(format!("{placed:?}"))
        })
        .collect()
}

/// A store of chain A in both groups, chain B in the window only, a removal
/// in each group: the window's three events are filtered, the main group's
/// two read as a single-group engine's, in each form.
#[test]
fn dynamo_filters_the_window_group_and_reads_the_main_group_as_a_single_group() {
    let full = KvGroup { index: 0, kind: GroupKind::FullAttention };
    let window = KvGroup { index: 1, kind: GroupKind::SlidingWindow { window_tokens: 32 } };
    for form in [EventForm::Map, EventForm::Array] {
        let hybrid = [
            stored(b'A', Some(full)),
            stored(b'A', Some(window)),
            stored(b'B', Some(window)),
            removed(b'A', Some(window)),
            removed(b'A', Some(full)),
        ];
        let single = [stored(b'A', None), removed(b'A', None)];
        let got = through_dynamo(&hybrid, form);
        let want = through_dynamo(&single, form);
        assert_eq!(got[0], want[0], "{form:?}: the main group's store reads as a single group's");
        assert_eq!(got[1], Err(ZmqEventFilterReason::NonMainAttentionKind), "{form:?}");
        assert_eq!(got[2], Err(ZmqEventFilterReason::NonMainAttentionKind), "{form:?}");
        let window_removal = match form {
            EventForm::Map => ZmqEventFilterReason::NonMainAttentionKind,
            EventForm::Array => ZmqEventFilterReason::NonMainAttentionGroup,
        };
        assert_eq!(got[3], Err(window_removal), "{form:?}");
        // Event ids differ (3 events filtered before it), so compare the
        // removal's content: the same block hashes, the same tier.
        let strip = |s: &str| s.split("data").nth(1).map(str::to_owned);
        let (g, w) = (got[4].clone().unwrap(), want[1].clone().unwrap());
        assert!(strip(&g).is_some(), "{g}");
        assert_eq!(strip(&g), strip(&w), "{form:?}: the main group's removal reads as a single group's");
    }
}
