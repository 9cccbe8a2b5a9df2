//! Entry points of the fuzz targets in `fuzz/`, kept in the library so that
//! their checked-in seeds also run as ordinary tests (tests/wire_fuzz_seeds.rs)
//! and so that each target stays a one-liner.
//!
//! The round-trip target builds typed events from raw bytes with a small
//! deterministic reader ([`ByteSource`]) rather than `arbitrary`: that keeps the
//! module free of optional dependencies, so `cargo test` runs the seeds with
//! default features, and libFuzzer explores the same space either way.

use std::sync::Arc;

use crate::events::codec::{
    EncodeOptions, EventForm, decode_message, decode_payload, encode_events, encode_payload, wire_event,
};
use crate::events::mirror::{Mirror, split_stored};
use crate::events::wire::{WireBatch, WireEvent, WireMmInfo, WireMmObject};
use crate::events::{AllBlocksCleared, BlockRemoved, BlockStored, EventImage, EventImageRun, KvEvent, Tier};
use crate::group::{GroupKind, KvGroup};
use crate::keys::{BlockKey, ImageDigest};

/// Decode target: arbitrary bytes as a payload (and as a three-frame message).
/// Whatever decodes must encode again, in both forms, to bytes that decode to
/// the same batch. Returns whether the bytes decoded as a payload.
pub fn decode(data: &[u8]) -> bool {
    // Also as a message: the first two bytes give the topic and seq lengths.
    if data.len() >= 2 {
        let (t, s) = (data[0] as usize, data[1] as usize);
        let rest = &data[2..];
        if t + s <= rest.len() {
            let _ = decode_message(&[&rest[..t], &rest[t..t + s], &rest[t + s..]]);
        }
    }
    let Ok(batch) = decode_payload(data) else { return false };
    for form in [EventForm::Map, EventForm::Array] {
        let mut bytes = Vec::new();
        encode_payload(&batch, form, &mut bytes);
        let again = decode_payload(&bytes).expect("an encoded batch decodes");
        assert!(same_batch(&again, &carried(&batch, form)), "re-encoded batch differs in {form:?} form");
    }
    true
}

/// Round-trip target: typed events built from the bytes, encoded under every
/// option, must decode to exactly their wire projection; the snapshot mirror
/// must accept them without panicking.
pub fn roundtrip(data: &[u8]) {
    let mut src = ByteSource::new(data);
    let events = src.events();
    let ts = f64::from(src.u32()) / 8.0;
    let rank = if src.bool() { Some(i64::from(src.u8())) } else { None };
    for form in [EventForm::Map, EventForm::Array] {
        for token_ids in [true, false] {
            let opts = EncodeOptions { form, token_ids };
            let mut bytes = Vec::new();
            encode_events(&events, ts, rank, &opts, &mut bytes);
            let batch = decode_payload(&bytes).expect("encoded events decode");
            let want: Vec<_> = events.iter().map(|e| wire_event(e, &opts)).collect();
            assert_eq!(batch.events, want, "{opts:?}");
            assert_eq!((batch.ts, batch.data_parallel_rank), (ts, rank));
        }
    }
    for e in &events {
        if let KvEvent::BlockStored(s) = e {
            let parts = split_stored(s);
            assert_eq!(parts.len(), s.keys.len());
        }
    }
    let mut mirror = Mirror::new();
    mirror.apply(&events);
    let snap = mirror.snapshot();
    assert_eq!(snap.len(), mirror.len() + 1);
}

/// What `form` carries of a batch. The array form has no slot for a
/// removal's group kind and window. It writes image identity into
/// vLLM's `extra_keys`: one entry per block, the `mm_hash` of each object
/// without its ranges, so ranges are dropped, the list is cut or padded to
/// the blocks, a block without objects has none, and no object at all is no
/// list. The map form carries everything.
fn carried(batch: &WireBatch, form: EventForm) -> WireBatch {
    let mut out = batch.clone();
    if form == EventForm::Map {
        return out;
    }
    for e in &mut out.events {
        if let WireEvent::BlockRemoved(r) = e {
            // A removal's kind and window have no slot in the array form.
            r.kv_cache_spec_kind = None;
            r.kv_cache_spec_sliding_window = None;
        }
        let WireEvent::BlockStored(s) = e else { continue };
        let Some(infos) = s.block_mm_infos.take() else { continue };
        let mut v: Vec<Option<WireMmInfo>> = infos
            .into_iter()
            .map(|info| {
                info.filter(|i| !i.mm_objects.is_empty()).map(|i| WireMmInfo {
                    mm_objects: i.mm_objects.into_iter().map(|o| WireMmObject { offsets: Vec::new(), ..o }).collect(),
                })
            })
            .collect();
        v.resize(s.block_hashes.len(), None);
        s.block_mm_infos = v.iter().any(Option::is_some).then_some(v);
    }
    out
}

fn same_batch(a: &WireBatch, b: &WireBatch) -> bool {
    a.ts.to_bits() == b.ts.to_bits() && a.events == b.events && a.data_parallel_rank == b.data_parallel_rank
}

/// Reads values from fuzz bytes; past the end every read is zero, so any input
/// builds some events.
#[derive(Debug)]
pub struct ByteSource<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> ByteSource<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    /// The next byte, or 0 past the end.
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// A boolean from one byte.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// Four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A value that is small most of the time and anything otherwise, so that
    /// every integer encoding width is reached.
    pub fn varied_u32(&mut self) -> u32 {
        match self.u8() % 4 {
            0 => self.u8().into(),
            1 => u32::from(self.u8()) << 8 | u32::from(self.u8()),
            2 => self.u32(),
            _ => u32::from(self.u8() % 32),
        }
    }

    fn key(&mut self) -> BlockKey {
        let mut k = [0u8; 32];
        for b in &mut k[..8] {
            *b = self.u8();
        }
        k[8] = self.u8();
        BlockKey(k)
    }

    fn text(&mut self) -> Arc<str> {
        let n = (self.u8() % 40) as usize;
        let bytes: Vec<u8> = (0..n).map(|_| self.u8()).collect();
        Arc::from(String::from_utf8_lossy(&bytes).as_ref())
    }

    /// No group most of the time (a zero byte, so past the end too), else a
    /// full-attention or a sliding-window group.
    fn group(&mut self) -> Option<KvGroup> {
        let kind = match self.u8() % 4 {
            0 => return None,
            1 => GroupKind::FullAttention,
            _ => GroupKind::SlidingWindow { window_tokens: self.varied_u32() },
        };
        Some(KvGroup { index: self.varied_u32(), kind })
    }

    fn medium(&mut self) -> Tier {
        if self.bool() { Tier::Host } else { Tier::Device }
    }

    /// Up to 8 events of any kind.
    pub fn events(&mut self) -> Vec<KvEvent> {
        let n = self.u8() % 8;
        (0..n).map(|seq| self.event(seq.into())).collect()
    }

    fn event(&mut self, event_seq: u64) -> KvEvent {
        match self.u8() % 4 {
            0 => KvEvent::AllBlocksCleared(AllBlocksCleared { event_seq }),
            1 => {
                let n = 1 + self.u8() % 4;
                let keys = (0..n).map(|_| self.key()).collect();
                let medium = self.medium();
                KvEvent::BlockRemoved(BlockRemoved { event_seq, keys, medium, group: self.group() })
            }
            _ => KvEvent::BlockStored(self.stored(event_seq)),
        }
    }

    fn stored(&mut self, event_seq: u64) -> BlockStored {
        let blocks = 1 + (self.u8() % 4) as usize;
        let block_size = 1 + u32::from(self.u8() % 40);
        let keys = (0..blocks).map(|_| self.key()).collect();
        let parent = if self.bool() { Some(self.key()) } else { None };
        let token_ids = (0..blocks * block_size as usize).map(|_| self.varied_u32()).collect();
        let lora_id = if self.bool() { Some(self.varied_u32()) } else { None };
        let lora_name = if self.bool() { Some(self.text()) } else { None };
        let cache_salt = if self.bool() { Some(self.text()) } else { None };
        let n_images = self.u8() % 3;
        let images: Vec<EventImage> = (0..n_images)
            .map(|_| {
                let mut d = [0u8; 32];
                for b in &mut d {
                    *b = self.u8();
                }
                EventImage { digest: ImageDigest(d), uuid: if self.bool() { Some(self.text()) } else { None } }
            })
            .collect();
        let mut block_images = Vec::new();
        if n_images > 0 {
            block_images = (0..blocks)
                .map(|_| {
                    (0..self.u8() % 3)
                        .map(|_| EventImageRun {
                            image: u32::from(self.u8() % n_images),
                            item_offset: self.varied_u32(),
                            block_offset: self.u8().into(),
                            len: self.varied_u32(),
                        })
                        .collect()
                })
                .collect();
        }
        let medium = self.medium();
        BlockStored {
            event_seq,
            keys,
            parent,
            token_ids,
            block_size,
            lora_id,
            lora_name,
            cache_salt,
            medium,
            images,
            block_images: block_images.into(),
            group: self.group(),
        }
    }
}
