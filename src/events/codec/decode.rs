//! The decoder: messages and payloads into wire events. Unknown fields,
//! unknown event types and unknown `image_routing` versions are skipped, and
//! every claimed length is bounded by the bytes left (`MIN_*` below, through
//! [`Reader::cap`]).

use super::error::{DecodeError, Result};
use super::layout::{
    CACHE_SALT_TAG, POS_EXTRA_KEYS, POS_GROUP_IDX, POS_IMAGE_ROUTING, POS_LORA_NAME, POS_REMOVED_GROUP_IDX,
    POS_SLIDING_WINDOW, POS_SPEC_KIND, mm_of_marker,
};
use super::reader::Reader;
use crate::events::wire::{
    IMAGE_ROUTING_VERSION, ImageRoutingV1, WireBatch, WireBlockRemoved, WireBlockStored, WireEvent, WireImageItem,
    WireImageRef, WireMessage, WireMmInfo, WireMmObject,
};

/// Decodes the three frames of one message.
pub fn decode_message(frames: &[&[u8]]) -> Result<WireMessage> {
    let [topic, seq, payload] = frames else {
        return Err(DecodeError::FrameCount(frames.len()));
    };
    let seq: [u8; 8] = (*seq).try_into().map_err(|_| DecodeError::SeqLength(seq.len()))?;
    Ok(WireMessage { topic: topic.to_vec(), seq: u64::from_be_bytes(seq), batch: decode_payload(payload)? })
}

/// Decodes one payload `[ts, events, data_parallel_rank]`, or the same as a
/// map `{"ts", "events", "data_parallel_rank"}` (any order, unknown keys
/// skipped; `ts` and `events` required). Extra trailing elements of the
/// array envelope are skipped.
pub fn decode_payload(bytes: &[u8]) -> Result<WireBatch> {
    let mut r = Reader { buf: bytes, pos: 0 };
    if matches!(r.peek()?, 0x80..=0x8f | 0xde | 0xdf) {
        return decode_map_envelope(r);
    }
    let n = r.array_len("payload array")?;
    if n < 2 {
        return Err(DecodeError::Invalid("payload array has fewer than 2 elements"));
    }
    let ts = r.f64("ts")?;
    let count = r.array_len("events array")?;
    let mut events = Vec::with_capacity(r.cap(count, MIN_EVENT_BYTES));
    for _ in 0..count {
        events.push(r.event()?);
    }
    let data_parallel_rank = if n >= 3 { r.opt_i64("data_parallel_rank")? } else { None };
    for _ in 3..n {
        r.skip()?;
    }
    if r.remaining() > 0 {
        return Err(DecodeError::Trailing(r.remaining()));
    }
    Ok(WireBatch { ts, events, data_parallel_rank })
}

fn decode_map_envelope(mut r: Reader<'_>) -> Result<WireBatch> {
    let n = r.map_len("payload map")?;
    let (mut ts, mut events, mut data_parallel_rank) = (None, None, None);
    for _ in 0..n {
        match r.key()? {
            Some("ts") => ts = Some(r.f64("ts")?),
            Some("events") => {
                let count = r.array_len("events array")?;
                let mut v = Vec::with_capacity(r.cap(count, MIN_EVENT_BYTES));
                for _ in 0..count {
                    v.push(r.event()?);
                }
                events = Some(v);
            }
            Some("data_parallel_rank" | "dp_rank") => data_parallel_rank = r.opt_i64("data_parallel_rank")?,
            _ => r.skip()?,
        }
    }
    if r.remaining() > 0 {
        return Err(DecodeError::Trailing(r.remaining()));
    }
    Ok(WireBatch {
        ts: ts.ok_or(DecodeError::Missing { event: "payload", field: "ts" })?,
        events: events.ok_or(DecodeError::Missing { event: "payload", field: "events" })?,
        data_parallel_rank,
    })
}

/// Per block, its image objects (`block_mm_infos`).
type MmInfos = Vec<Option<WireMmInfo>>;

/// Every field any event type may carry, gathered before the type is known
/// (a map may name `type` last).
#[derive(Default)]
struct Fields {
    type_name: Option<String>,
    block_hashes: Option<Vec<i64>>,
    parent_block_hash: Option<i64>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<String>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
    block_mm_infos: Option<Vec<Option<WireMmInfo>>>,
    image_routing: Option<ImageRoutingV1>,
    group_idx: Option<u32>,
    kv_cache_spec_kind: Option<String>,
    kv_cache_spec_sliding_window: Option<u32>,
}

/// The fewest bytes an event can take (`[""]`, an unknown type).
const MIN_EVENT_BYTES: usize = 2;
/// The fewest bytes of an `mm_object` (`{"mm_hash": 0}`).
const MIN_MM_OBJECT_BYTES: usize = 10;
/// The fewest bytes of an image item (`[bin8 of 32 bytes, nil]`).
const MIN_IMAGE_ITEM_BYTES: usize = 36;

impl Reader<'_> {
    fn event(&mut self) -> Result<WireEvent> {
        let at = self.pos;
        match self.peek()? {
            0x80..=0x8f | 0xde | 0xdf => self.event_map(),
            0x90..=0x9f | 0xdc | 0xdd => self.event_array(),
            _ => Err(self.unexpected(at, "event (map or array)")),
        }
    }

    fn event_map(&mut self) -> Result<WireEvent> {
        let n = self.map_len("event map")?;
        let mut f = Fields::default();
        for _ in 0..n {
            let key = match self.peek()? {
                0xa0..=0xbf | 0xd9 | 0xda | 0xdb => self.str("field name")?,
                _ => {
                    self.skip()?;
                    self.skip()?;
                    continue;
                }
            };
            match key {
                "type" => f.type_name = Some(self.str("type")?.to_owned()),
                "block_hashes" => f.block_hashes = Some(self.hashes()?),
                "parent_block_hash" => f.parent_block_hash = self.opt_hash("parent_block_hash")?,
                "token_ids" => f.token_ids = self.opt_tokens()?,
                "block_size" => f.block_size = Some(self.u32("block_size")?),
                "lora_id" => f.lora_id = self.opt_i64("lora_id")?,
                "medium" => f.medium = self.opt_string("medium")?,
                "lora_name" => f.lora_name = self.opt_string("lora_name")?,
                "cache_salt" => f.cache_salt = self.opt_string("cache_salt")?,
                "block_mm_infos" => f.block_mm_infos = self.mm_infos()?,
                "image_routing" => f.image_routing = self.image_routing()?,
                "group_idx" => f.group_idx = self.opt_u32("group_idx")?,
                "kv_cache_spec_kind" => f.kv_cache_spec_kind = self.opt_string("kv_cache_spec_kind")?,
                "kv_cache_spec_sliding_window" => {
                    f.kv_cache_spec_sliding_window = self.opt_u32("kv_cache_spec_sliding_window")?;
                }
                _ => self.skip()?,
            }
        }
        build_event(f)
    }

    fn event_array(&mut self) -> Result<WireEvent> {
        let n = self.array_len("event array")?;
        if n == 0 {
            return Err(DecodeError::Invalid("empty event array"));
        }
        let name = self.str("type")?.to_owned();
        let mut f = Fields::default();
        let mut extra_keys = None;
        for i in 1..n {
            match (name.as_str(), i) {
                ("BlockStored" | "BlockRemoved", 1) => f.block_hashes = Some(self.hashes()?),
                ("BlockStored", 2) => f.parent_block_hash = self.opt_hash("parent_block_hash")?,
                ("BlockStored", 3) => f.token_ids = self.opt_tokens()?,
                ("BlockStored", 4) => f.block_size = Some(self.u32("block_size")?),
                ("BlockStored", 5) => f.lora_id = self.opt_i64("lora_id")?,
                ("BlockStored", 6) | ("BlockRemoved", 2) => f.medium = self.opt_string("medium")?,
                ("BlockStored", POS_LORA_NAME) => f.lora_name = self.opt_string("lora_name")?,
                ("BlockStored", POS_EXTRA_KEYS) => {
                    extra_keys = Some(self.pos);
                    self.skip()?;
                }
                // The group slots are read by type, as Dynamo reads its
                // tail: older producers put other values there (vLLM 1.2
                // appended `block_mm_infos`), which are skipped, not misread.
                ("BlockStored", POS_GROUP_IDX) | ("BlockRemoved", POS_REMOVED_GROUP_IDX) => {
                    f.group_idx = self.u32_or_skip()?;
                }
                ("BlockStored", POS_SPEC_KIND) => f.kv_cache_spec_kind = self.string_or_skip()?,
                ("BlockStored", POS_SLIDING_WINDOW) => f.kv_cache_spec_sliding_window = self.u32_or_skip()?,
                ("BlockStored", POS_IMAGE_ROUTING) => f.image_routing = self.image_routing()?,
                _ => self.skip()?,
            }
        }
        if let Some(at) = extra_keys {
            // Read once the LoRA name is known (it comes first in each block).
            let end = self.pos;
            self.pos = at;
            let (salt, infos) = self.extra_keys(f.lora_name.as_deref())?;
            self.pos = end;
            f.cache_salt = salt;
            f.block_mm_infos = infos;
        }
        f.type_name = Some(name);
        build_event(f)
    }

    /// vLLM's `extra_keys` as Dynamo reads them: in the first block, a string
    /// tagged [`CACHE_SALT_TAG`] is the cache salt; in every block, a marker
    /// string ([`mm_of_marker`]) alone or as `[marker, offset]` is an image
    /// object. The first string equal to the LoRA name in a block is that
    /// name; everything else is skipped.
    fn extra_keys(&mut self, lora_name: Option<&str>) -> Result<(Option<String>, Option<MmInfos>)> {
        if self.nil()? {
            return Ok((None, None));
        }
        let blocks = self.array_len("extra_keys")?;
        let mut salt = None;
        let mut infos = Vec::with_capacity(self.cap(blocks, 1));
        for block in 0..blocks {
            if self.nil()? {
                infos.push(None);
                continue;
            }
            if !matches!(self.peek()?, 0x90..=0x9f | 0xdc | 0xdd) {
                self.skip()?;
                infos.push(None);
                continue;
            }
            let items = self.array_len("extra_keys entry")?;
            let mut lora_pending = lora_name;
            let mut objects = Vec::new();
            for _ in 0..items {
                let text = match self.peek()? {
                    0xa0..=0xbf | 0xd9 | 0xda | 0xdb => Some(self.str("extra key")?),
                    0x92 => {
                        // [identifier, offset]
                        self.array_len("extra key pair")?;
                        let id = match self.peek()? {
                            0xa0..=0xbf | 0xd9 | 0xda | 0xdb => Some(self.str("extra key")?),
                            _ => {
                                self.skip()?;
                                None
                            }
                        };
                        self.skip()?;
                        if let Some(h) = id.and_then(mm_of_marker) {
                            objects.push(WireMmObject { mm_hash: h, offsets: Vec::new() });
                        }
                        continue;
                    }
                    _ => {
                        self.skip()?;
                        continue;
                    }
                };
                let Some(text) = text else { continue };
                if lora_pending.is_some_and(|n| n == text) {
                    lora_pending = None;
                } else if let Some(h) = mm_of_marker(text) {
                    objects.push(WireMmObject { mm_hash: h, offsets: Vec::new() });
                } else if block == 0
                    && salt.is_none()
                    && let Some(s) = text.strip_prefix(CACHE_SALT_TAG)
                {
                    salt = Some(s.to_owned());
                }
            }
            infos.push((!objects.is_empty()).then_some(WireMmInfo { mm_objects: objects }));
        }
        let any = infos.iter().any(Option::is_some);
        Ok((salt, any.then_some(infos)))
    }

    /// An optional u32 (nil is `None`); any other type or a value out of
    /// range is an error.
    fn opt_u32(&mut self, what: &'static str) -> Result<Option<u32>> {
        if self.nil()? {
            return Ok(None);
        }
        self.u32(what).map(Some)
    }

    /// A u32 when the next value is an integer in range; anything else
    /// (nil, another type, a negative or too large integer) is skipped and
    /// read as `None`.
    fn u32_or_skip(&mut self) -> Result<Option<u32>> {
        if matches!(self.peek()?, 0x00..=0x7f | 0xcc..=0xd3 | 0xe0..=0xff) {
            return Ok(u32::try_from(self.int("group field")?).ok());
        }
        self.skip()?;
        Ok(None)
    }

    /// A string when the next value is one; anything else is skipped and
    /// read as `None`.
    fn string_or_skip(&mut self) -> Result<Option<String>> {
        if matches!(self.peek()?, 0xa0..=0xbf | 0xd9 | 0xda | 0xdb) {
            return Ok(Some(self.str("kv_cache_spec_kind")?.to_owned()));
        }
        self.skip()?;
        Ok(None)
    }

    fn hashes(&mut self) -> Result<Vec<i64>> {
        let n = self.array_len("block_hashes")?;
        let mut v = Vec::with_capacity(self.cap(n, 1));
        for _ in 0..n {
            v.push(self.i64_bits("block hash")?);
        }
        Ok(v)
    }

    fn opt_hash(&mut self, what: &'static str) -> Result<Option<i64>> {
        if self.nil()? {
            return Ok(None);
        }
        self.i64_bits(what).map(Some)
    }

    fn mm_infos(&mut self) -> Result<Option<Vec<Option<WireMmInfo>>>> {
        if self.nil()? {
            return Ok(None);
        }
        let n = self.array_len("block_mm_infos")?;
        let mut v = Vec::with_capacity(self.cap(n, 1));
        for _ in 0..n {
            if self.nil()? {
                v.push(None);
                continue;
            }
            let fields = self.map_len("block_mm_infos entry")?;
            let mut info = WireMmInfo::default();
            for _ in 0..fields {
                if self.key()? != Some("mm_objects") {
                    self.skip()?;
                    continue;
                }
                let objects = self.array_len("mm_objects")?;
                info.mm_objects = Vec::with_capacity(self.cap(objects, MIN_MM_OBJECT_BYTES));
                for _ in 0..objects {
                    info.mm_objects.push(self.mm_object()?);
                }
            }
            v.push(Some(info));
        }
        Ok(Some(v))
    }

    fn mm_object(&mut self) -> Result<WireMmObject> {
        let fields = self.map_len("mm_object")?;
        let mut hash = None;
        let mut offsets = Vec::new();
        for _ in 0..fields {
            match self.key()? {
                Some("mm_hash") => hash = Some(self.bits64("mm_hash")?),
                Some("offsets") => {
                    let n = self.array_len("offsets")?;
                    offsets = Vec::with_capacity(self.cap(n, 3));
                    for _ in 0..n {
                        if self.array_len("offset pair")? != 2 {
                            return Err(DecodeError::Invalid("an mm_object offset is not a [start, end] pair"));
                        }
                        offsets.push([self.u32("offset start")?, self.u32("offset end")?]);
                    }
                }
                _ => self.skip()?,
            }
        }
        let mm_hash = hash.ok_or(DecodeError::Missing { event: "mm_object", field: "mm_hash" })?;
        Ok(WireMmObject { mm_hash, offsets })
    }

    /// A map key: `Some(name)` for a string key, `None` for any other key
    /// Image routing metadata: v1 decoded, any other version skipped.
    fn image_routing(&mut self) -> Result<Option<ImageRoutingV1>> {
        if self.nil()? {
            return Ok(None);
        }
        // Find the version first: a map may list it last, and a later version
        // may shape its other fields differently.
        let start = self.pos;
        let fields = self.map_len("image_routing")?;
        let mut version = None;
        for _ in 0..fields {
            if self.key()? == Some("v") && matches!(self.peek()?, 0x00..=0x7f | 0xcc..=0xd3 | 0xe0..=0xff) {
                version = Some(self.int("image_routing version")?);
            } else {
                self.skip()?;
            }
        }
        if version != Some(IMAGE_ROUTING_VERSION.into()) {
            return Ok(None);
        }
        let end = self.pos;
        self.pos = start;
        self.map_len("image_routing")?;
        let mut r = ImageRoutingV1::default();
        for _ in 0..fields {
            match self.key()? {
                Some("items") => {
                    let n = self.array_len("image_routing items")?;
                    r.items = Vec::with_capacity(self.cap(n, MIN_IMAGE_ITEM_BYTES));
                    for _ in 0..n {
                        if self.array_len("image item")? != 2 {
                            return Err(DecodeError::Invalid("an image item is not [digest, uuid]"));
                        }
                        let at = self.pos;
                        let digest: [u8; 32] = self
                            .bin("image digest")?
                            .try_into()
                            .map_err(|_| DecodeError::OutOfRange { pos: at, what: "image digest length" })?;
                        let uuid = self.opt_string("image uuid")?;
                        r.items.push(WireImageItem { digest, uuid });
                    }
                }
                Some("blocks") => {
                    let n = self.array_len("image_routing blocks")?;
                    r.blocks = Vec::with_capacity(self.cap(n, 1));
                    for _ in 0..n {
                        if self.nil()? {
                            r.blocks.push(Vec::new());
                            continue;
                        }
                        let refs = self.array_len("block image refs")?;
                        let mut v = Vec::with_capacity(self.cap(refs, 5));
                        for _ in 0..refs {
                            if self.array_len("image ref")? != 4 {
                                return Err(DecodeError::Invalid(
                                    "an image ref is not [item, item_offset, block_offset, len]",
                                ));
                            }
                            v.push(WireImageRef {
                                item: self.u32("image ref item")?,
                                item_offset: self.u32("image ref item_offset")?,
                                block_offset: self.u32("image ref block_offset")?,
                                len: self.u32("image ref len")?,
                            });
                        }
                        r.blocks.push(v);
                    }
                }
                _ => self.skip()?,
            }
        }
        debug_assert_eq!(self.pos, end, "decoding the fields reads exactly what the version scan skipped");
        if r.blocks.iter().flatten().any(|x| x.item as usize >= r.items.len()) {
            return Err(DecodeError::Invalid("an image ref names an item the event does not list"));
        }
        Ok(Some(r))
    }
}

fn build_event(f: Fields) -> Result<WireEvent> {
    let name = f.type_name.ok_or(DecodeError::Missing { event: "event", field: "type" })?;
    Ok(match name.as_str() {
        "BlockStored" => {
            let block_hashes =
                f.block_hashes.ok_or(DecodeError::Missing { event: "BlockStored", field: "block_hashes" })?;
            let block_size = f.block_size.ok_or(DecodeError::Missing { event: "BlockStored", field: "block_size" })?;
            if let Some(r) = &f.image_routing
                && r.blocks.len() != block_hashes.len()
            {
                return Err(DecodeError::Invalid("image_routing lists a different number of blocks than block_hashes"));
            }
            WireEvent::BlockStored(WireBlockStored {
                block_hashes,
                parent_block_hash: f.parent_block_hash,
                token_ids: f.token_ids,
                block_size,
                lora_id: f.lora_id,
                medium: f.medium,
                lora_name: f.lora_name,
                cache_salt: f.cache_salt,
                block_mm_infos: f.block_mm_infos,
                image_routing: f.image_routing,
                group_idx: f.group_idx,
                kv_cache_spec_kind: f.kv_cache_spec_kind,
                kv_cache_spec_sliding_window: f.kv_cache_spec_sliding_window,
            })
        }
        "BlockRemoved" => WireEvent::BlockRemoved(WireBlockRemoved {
            block_hashes: f
                .block_hashes
                .ok_or(DecodeError::Missing { event: "BlockRemoved", field: "block_hashes" })?,
            medium: f.medium,
            group_idx: f.group_idx,
            kv_cache_spec_kind: f.kv_cache_spec_kind,
            kv_cache_spec_sliding_window: f.kv_cache_spec_sliding_window,
        }),
        "AllBlocksCleared" => WireEvent::AllBlocksCleared,
        _ => WireEvent::Unknown { name },
    })
}
