//! The call log: every call an engine takes, with its arguments and digests
//! of what it answered, streamed to a writer in a compact, versioned binary
//! format (docs/c-api.md, "Reproducing an incident").
//!
//! An engine's decisions are a function of its configuration and its calls
//! alone (docs/architecture.md, "Determinism"), so a fresh engine given the
//! logged calls must answer the same; `replay.rs` does that and names the
//! first call whose answer differs.
//!
//! Format, version 2 (a reader also reads version 1, whose header ends after
//! the 15 config varints: no groups). Integers marked *varint* are unsigned
//! LEB128 (seven bits a byte, low bits first); a *digest* is 8 bytes,
//! little-endian.
//!
//! ```text
//! header  "KVCCALLS" (8 bytes), version (u16 LE = 2), the config:
//!         15 varints in EngineConfig's field order (bools as 0 or 1), then
//!         the groups: varint count, each 4 varints (kind 0 = full attention
//!         / 1 = sliding window, window tokens, device pages, host pages)
//! record  kind (u8), arguments (per kind), output count (u8),
//!         then per output: what it covers (u8), digest
//! bytes   varint length, then the bytes
//! option  0 (absent) or 1 then the value
//! ```
//!
//! | kind | call | arguments |
//! |---|---|---|
//! | 1 | `add_request` | tokens (varint count, varints), LoRA id (option varint), LoRA name, cache salt (option bytes), items (varint count; each: content tag 0 = BLAKE3 digest of the bytes given / 1 = digest given, the 32 or given bytes; runs: varint count, start and length varints), UUIDs (option: varint count, option bytes each), dummy (u8) |
//! | 2 | `grow` | request id (varint), tokens |
//! | 3 | `commit` | request id, tokens computed (varints) |
//! | 4, 5 | `finish`, `cancel` | request id |
//! | 6 | `evict` | blocks (varint) |
//! | 7, 8, 9, 10 | `clear`, `step`, drain (any of the drains), `snapshot` | none |
//! | 11, 12 | publisher attached, detached | none |
//!
//! Outputs (the byte that says what a digest covers, [`OutputKind`]): 1 the
//! call's result (admission or error, evicted count), 2 the request's block
//! table (one output per group: group 0's, then each sliding window's, its
//! null page where a block was released), 3 the counters and gauges, 4 the step's block copies, 5 the events
//! (the closed batch, the drained batches' sequence ranges, a snapshot).
//! A digest is XXH3-64 (seed 0) of a byte string this file builds; events
//! enter it in their wire encoding (`kvcore::wire::encode_events`, map form,
//! with token ids, time stamp 0) after their `event_seq` numbers.
//!
//! Image bytes are not logged: their BLAKE3 digest is, and the replay gives
//! the digest, which admits exactly as the bytes did.
//!
//! The log is streamed: the writer is buffered (64 KiB) and flushed at every
//! step and when recording stops, so memory stays bounded and a process that
//! dies loses at most the calls since its last step. A write error stops the
//! recording (the engine keeps serving) and is reported when it stops.

use std::io::{self, BufRead, Read, Write};

use crate::config::{EngineConfig, GroupConfig};
use crate::events::KvEvent;
use crate::events::codec::{EncodeOptions, encode_events};
use crate::group::GroupKind;
use crate::keys::ImageDigest;
use crate::resources::{BlockCopy, Counters};
use crate::systems::admit::{MmContent, RequestSpec};
use crate::tables::TokenRun;

/// The log's first bytes.
pub const CALL_LOG_MAGIC: [u8; 8] = *b"KVCCALLS";

/// The format version this build writes and reads.
pub const CALL_LOG_VERSION: u16 = 2;

/// Bytes buffered before a write reaches the sink.
const BUFFER_BYTES: usize = 64 * 1024;

/// The call a record logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CallKind {
    /// `Engine::add_request`.
    AddRequest = 1,
    /// `Engine::grow`.
    Grow = 2,
    /// `Engine::commit`.
    Commit = 3,
    /// `Engine::finish`.
    Finish = 4,
    /// `Engine::cancel`.
    Cancel = 5,
    /// `Engine::evict`.
    Evict = 6,
    /// `Engine::clear`.
    Clear = 7,
    /// `Engine::step`.
    Step = 8,
    /// `Engine::drain_batches`, `drain_events` or `drain_payloads`.
    Drain = 9,
    /// `Engine::snapshot`.
    Snapshot = 10,
    /// A publisher was attached (the engine primed its mirror with a snapshot).
    AttachPublisher = 11,
    /// The publisher was detached.
    DetachPublisher = 12,
}

impl CallKind {
    fn from_byte(b: u8) -> Option<Self> {
        use CallKind::*;
        Some(match b {
            1 => AddRequest,
            2 => Grow,
            3 => Commit,
            4 => Finish,
            5 => Cancel,
            6 => Evict,
            7 => Clear,
            8 => Step,
            9 => Drain,
            10 => Snapshot,
            11 => AttachPublisher,
            12 => DetachPublisher,
            _ => return None,
        })
    }
}

/// What an output digest of a record covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OutputKind {
    /// The call's result: the admission (id, cached and onboarded tokens) or
    /// the error's message; the number of blocks evicted.
    Result = 1,
    /// The request's block table (device pages in order) after the call.
    BlockTable = 2,
    /// Every counter and gauge after the call.
    Counters = 3,
    /// The block copies the step handed out, in order.
    Copies = 4,
    /// Events: the batch the step closed, the drained batches (step index
    /// and `event_seq` range of each), or the snapshot.
    Events = 5,
}

impl OutputKind {
    fn from_byte(b: u8) -> Option<Self> {
        use OutputKind::*;
        Some(match b {
            1 => Result,
            2 => BlockTable,
            3 => Counters,
            4 => Copies,
            5 => Events,
            _ => return None,
        })
    }
}

/// Why a call log could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CallLogError {
    /// The engine already took calls: a log must start from a fresh engine,
    /// or its replay would start from another state.
    #[error("the engine already took calls; a call log starts with a fresh engine")]
    NotFresh,
    /// A log is already being recorded.
    #[error("the engine already records its calls")]
    AlreadyRecording,
    /// No log is being recorded.
    #[error("the engine records no calls")]
    NotRecording,
    /// Writing or reading failed.
    #[error("call log I/O: {0}")]
    Io(#[from] io::Error),
    /// The bytes are not a call log this build reads.
    #[error("not a call log this build reads, at byte {offset}: {what}")]
    Format {
        /// Byte offset of the problem.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The logged configuration is invalid.
    #[error("the logged configuration is invalid: {0}")]
    Config(#[from] crate::error::ConfigError),
    /// A logged publisher could not be attached in the replay.
    #[error("the replay could not attach a publisher: {0}")]
    Publisher(String),
}

/// An engine's open call log (see the module docs).
pub(crate) struct CallLog {
    out: io::BufWriter<Box<dyn Write + Send>>,
    /// The record being built.
    record: Vec<u8>,
    /// Bytes a digest is computed over.
    scratch: Vec<u8>,
    /// The outputs of the record being built (and, once written, of the last).
    outputs: Vec<(OutputKind, u64)>,
    calls: u64,
    error: Option<io::Error>,
}

impl std::fmt::Debug for CallLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallLog").field("calls", &self.calls).field("error", &self.error).finish_non_exhaustive()
    }
}

/// Appends `v` as an unsigned LEB128 varint.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn put_opt_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            put_bytes(out, b);
        }
    }
}

fn put_u32s(out: &mut Vec<u8>, v: &[u32]) {
    put_varint(out, v.len() as u64);
    for t in v {
        put_varint(out, *t as u64);
    }
}

/// The configuration as the header writes it.
fn put_config(out: &mut Vec<u8>, c: &EngineConfig) {
    let EngineConfig {
        block_size_tokens,
        blocks_device,
        blocks_host,
        block_reuse,
        partial_reuse,
        offload_first,
        kv_events,
        image_placeholder_token_id,
        requests_max,
        tokens_per_request_max,
        mm_items_max,
        mm_items_per_request_max,
        runs_per_item_max,
        routing_hints_max,
        event_batches_max,
        ref groups,
    } = *c;
    for v in [
        block_size_tokens as u64,
        blocks_device as u64,
        blocks_host as u64,
        block_reuse as u64,
        partial_reuse as u64,
        offload_first as u64,
        kv_events as u64,
        image_placeholder_token_id as u64,
        requests_max as u64,
        tokens_per_request_max as u64,
        mm_items_max as u64,
        mm_items_per_request_max as u64,
        runs_per_item_max as u64,
        routing_hints_max as u64,
        event_batches_max as u64,
    ] {
        put_varint(out, v);
    }
    put_varint(out, groups.len() as u64);
    for g in groups {
        let GroupConfig { kind, blocks_device, blocks_host } = *g;
        let (code, window) = match kind {
            GroupKind::FullAttention => (0, 0),
            GroupKind::SlidingWindow { window_tokens } => (1, window_tokens),
        };
        for v in [code, window, blocks_device, blocks_host] {
            put_varint(out, u64::from(v));
        }
    }
}

fn digest(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The gauges that the counters digest covers beside [`Counters`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gauges {
    pub requests_live: u64,
    pub blocks_free_device: u64,
    pub blocks_cached_device: u64,
    pub blocks_cached_host: u64,
    pub step_index: u64,
}

impl CallLog {
    /// Starts a log on `sink`: writes the header for `config`.
    pub(crate) fn start(sink: Box<dyn Write + Send>, config: &EngineConfig) -> Result<Self, CallLogError> {
        let mut log = Self {
            out: io::BufWriter::with_capacity(BUFFER_BYTES, sink),
            record: Vec::with_capacity(256),
            scratch: Vec::with_capacity(256),
            outputs: Vec::with_capacity(4),
            calls: 0,
            error: None,
        };
        let mut header = Vec::with_capacity(64);
        header.extend_from_slice(&CALL_LOG_MAGIC);
        header.extend_from_slice(&CALL_LOG_VERSION.to_le_bytes());
        put_config(&mut header, config);
        log.out.write_all(&header)?;
        log.out.flush()?;
        Ok(log)
    }

    /// Calls recorded so far.
    pub(crate) fn calls(&self) -> u64 {
        self.calls
    }

    /// The outputs of the last call recorded.
    pub(crate) fn last_outputs(&self) -> &[(OutputKind, u64)] {
        &self.outputs
    }

    /// Begins a record of `kind`.
    pub(crate) fn begin(&mut self, kind: CallKind) {
        self.record.clear();
        self.outputs.clear();
        self.record.push(kind as u8);
    }

    /// Logs a varint argument.
    pub(crate) fn arg(&mut self, v: u64) {
        put_varint(&mut self.record, v);
    }

    /// Logs a token list argument.
    pub(crate) fn arg_tokens(&mut self, tokens: &[u32]) {
        put_u32s(&mut self.record, tokens);
    }

    /// Logs the arguments of an admission.
    pub(crate) fn arg_request(&mut self, spec: &RequestSpec<'_>) {
        let r = &mut self.record;
        put_u32s(r, spec.tokens);
        match spec.lora_id {
            None => r.push(0),
            Some(id) => {
                r.push(1);
                put_varint(r, id as u64);
            }
        }
        put_opt_bytes(r, spec.lora_name.map(str::as_bytes));
        put_opt_bytes(r, spec.cache_salt.map(str::as_bytes));
        put_varint(r, spec.items.len() as u64);
        for item in &spec.items {
            match item.content {
                MmContent::Bytes(b) => {
                    r.push(0);
                    put_bytes(r, &ImageDigest::of_content(b).0);
                }
                MmContent::Digest(d) => {
                    r.push(1);
                    put_bytes(r, d);
                }
            }
            put_varint(r, item.runs.len() as u64);
            for TokenRun { start, len } in &item.runs {
                put_varint(r, *start as u64);
                put_varint(r, *len as u64);
            }
        }
        match &spec.uuids {
            None => r.push(0),
            Some(list) => {
                r.push(1);
                put_varint(r, list.len() as u64);
                for u in list {
                    put_opt_bytes(r, *u);
                }
            }
        }
        r.push(spec.dummy as u8);
    }

    fn output(&mut self, kind: OutputKind) {
        let d = digest(&self.scratch);
        self.outputs.push((kind, d));
    }

    /// Digests a call's result: `Ok` with the given values, or the error's
    /// message.
    pub(crate) fn out_result<E: std::fmt::Display>(&mut self, result: Result<&[u64], &E>) {
        self.scratch.clear();
        match result {
            Ok(values) => {
                self.scratch.push(0);
                for v in values {
                    put_varint(&mut self.scratch, *v);
                }
            }
            Err(e) => {
                self.scratch.push(1);
                let _ = write!(&mut self.scratch, "{e}");
            }
        }
        self.output(OutputKind::Result);
    }

    /// Digests a block table.
    pub(crate) fn out_block_table(&mut self, pages: impl Iterator<Item = u32>) {
        self.scratch.clear();
        for p in pages {
            put_varint(&mut self.scratch, p as u64);
        }
        self.output(OutputKind::BlockTable);
    }

    /// Digests the counters and gauges.
    pub(crate) fn out_counters(&mut self, counters: &Counters, gauges: Gauges) {
        let Counters {
            requests_admitted,
            requests_rejected,
            tokens_cached,
            tokens_uncached,
            blocks_evicted_device,
            blocks_offloaded,
            blocks_onboarded,
            blocks_evicted_host,
            blocks_partially_reused,
            hint_hits,
            hint_misses,
            hint_evictions,
            hint_conflicts,
            hint_oversized,
            events_emitted,
            event_batches_dropped,
        } = *counters;
        let Gauges { requests_live, blocks_free_device, blocks_cached_device, blocks_cached_host, step_index } = gauges;
        self.scratch.clear();
        for v in [
            requests_admitted,
            requests_rejected,
            tokens_cached,
            tokens_uncached,
            blocks_evicted_device,
            blocks_offloaded,
            blocks_onboarded,
            blocks_evicted_host,
            blocks_partially_reused,
            hint_hits,
            hint_misses,
            hint_evictions,
            hint_conflicts,
            hint_oversized,
            events_emitted,
            event_batches_dropped,
            requests_live,
            blocks_free_device,
            blocks_cached_device,
            blocks_cached_host,
            step_index,
        ] {
            put_varint(&mut self.scratch, v);
        }
        self.output(OutputKind::Counters);
    }

    /// Digests a step's block copies.
    pub(crate) fn out_copies(&mut self, copies: &[BlockCopy]) {
        self.scratch.clear();
        for c in copies {
            for v in [c.src.medium as u64, c.src.page as u64, c.dst.medium as u64, c.dst.page as u64, c.tokens as u64] {
                put_varint(&mut self.scratch, v);
            }
            // A copy of group 0 is digested as before groups existed.
            if c.group != 0 {
                put_varint(&mut self.scratch, u64::from(c.group));
            }
        }
        self.output(OutputKind::Copies);
    }

    /// Digests events: a step index (or none), their sequence numbers, then
    /// their wire encoding.
    pub(crate) fn out_events(&mut self, step_index: Option<u64>, events: &[KvEvent]) {
        self.scratch.clear();
        match step_index {
            None => self.scratch.push(0),
            Some(s) => {
                self.scratch.push(1);
                put_varint(&mut self.scratch, s);
            }
        }
        for e in events {
            put_varint(&mut self.scratch, e.event_seq());
        }
        encode_events(events, 0.0, None, &EncodeOptions::default(), &mut self.scratch);
        self.output(OutputKind::Events);
    }

    /// Digests drained batches by their step index and `event_seq` range
    /// (their content was digested when their step closed).
    pub(crate) fn out_drained<'e>(&mut self, batches: impl Iterator<Item = (u64, &'e [KvEvent])>) {
        self.scratch.clear();
        for (step, events) in batches {
            put_varint(&mut self.scratch, step);
            put_varint(&mut self.scratch, events.len() as u64);
            if let (Some(first), Some(last)) = (events.first(), events.last()) {
                put_varint(&mut self.scratch, first.event_seq());
                put_varint(&mut self.scratch, last.event_seq());
            }
        }
        self.output(OutputKind::Events);
    }

    /// Ends the record and writes it; flushes when `flush` (each step).
    pub(crate) fn end(&mut self, flush: bool) {
        self.record.push(self.outputs.len() as u8);
        for (kind, d) in &self.outputs {
            self.record.push(*kind as u8);
            self.record.extend_from_slice(&d.to_le_bytes());
        }
        self.calls += 1;
        if self.error.is_some() {
            return;
        }
        let written = self.out.write_all(&self.record).and_then(|()| if flush { self.out.flush() } else { Ok(()) });
        if let Err(e) = written {
            self.error = Some(e);
        }
    }

    /// Flushes and closes the log; returns the calls recorded, or the first
    /// write error.
    pub(crate) fn finish(mut self) -> Result<u64, CallLogError> {
        if let Some(e) = self.error.take() {
            return Err(e.into());
        }
        self.out.flush()?;
        Ok(self.calls)
    }
}

/// One image item of a logged admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedItem {
    /// Whether the caller gave the digest (else kvcore computed it from bytes).
    pub digest_given: bool,
    /// The digest (32 bytes when computed; as given otherwise).
    pub digest: Vec<u8>,
    /// The item's runs.
    pub runs: Vec<TokenRun>,
}

/// A logged admission's arguments, owned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoggedRequest {
    /// Prompt tokens.
    pub tokens: Vec<u32>,
    /// LoRA adapter id.
    pub lora_id: Option<u32>,
    /// LoRA adapter name (bytes as logged).
    pub lora_name: Option<Vec<u8>>,
    /// Cache salt (bytes as logged).
    pub cache_salt: Option<Vec<u8>>,
    /// Image items.
    pub items: Vec<LoggedItem>,
    /// UUID list.
    pub uuids: Option<Vec<Option<Vec<u8>>>>,
    /// Warm-up request.
    pub dummy: bool,
}

/// A logged call's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoggedCall {
    /// `add_request`.
    AddRequest(LoggedRequest),
    /// `grow(id, tokens)`.
    Grow(u64, Vec<u32>),
    /// `commit(id, tokens_computed)`.
    Commit(u64, u64),
    /// `finish(id)`.
    Finish(u64),
    /// `cancel(id)`.
    Cancel(u64),
    /// `evict(n)`.
    Evict(u64),
    /// `clear()`.
    Clear,
    /// `step()`.
    Step,
    /// A drain.
    Drain,
    /// `snapshot()`.
    Snapshot,
    /// A publisher attached.
    AttachPublisher,
    /// The publisher detached.
    DetachPublisher,
}

impl LoggedCall {
    /// The record kind of this call.
    pub fn kind(&self) -> CallKind {
        match self {
            LoggedCall::AddRequest(_) => CallKind::AddRequest,
            LoggedCall::Grow(..) => CallKind::Grow,
            LoggedCall::Commit(..) => CallKind::Commit,
            LoggedCall::Finish(_) => CallKind::Finish,
            LoggedCall::Cancel(_) => CallKind::Cancel,
            LoggedCall::Evict(_) => CallKind::Evict,
            LoggedCall::Clear => CallKind::Clear,
            LoggedCall::Step => CallKind::Step,
            LoggedCall::Drain => CallKind::Drain,
            LoggedCall::Snapshot => CallKind::Snapshot,
            LoggedCall::AttachPublisher => CallKind::AttachPublisher,
            LoggedCall::DetachPublisher => CallKind::DetachPublisher,
        }
    }
}

/// One record read back: the call, its arguments and its output digests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// Byte offset of the record in the log.
    pub offset: u64,
    /// The call and its arguments.
    pub call: LoggedCall,
    /// What the engine answered, as digests.
    pub outputs: Vec<(OutputKind, u64)>,
}

/// Reads a call log record by record, without holding it in memory.
pub struct CallLogReader<R> {
    input: R,
    offset: u64,
    config: EngineConfig,
    /// Set when the log ended inside a record (a process that died while
    /// writing): the offset of that record.
    truncated_at: Option<u64>,
}

enum ReadFail {
    Truncated,
    Format(String),
    Io(io::Error),
}

impl<R: BufRead> CallLogReader<R> {
    /// Reads and checks the header.
    pub fn new(mut input: R) -> Result<Self, CallLogError> {
        let mut offset = 0u64;
        let fail = |offset: u64, what: &str| CallLogError::Format { offset, what: what.to_owned() };
        let mut magic = [0u8; 10];
        input.read_exact(&mut magic).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => fail(0, "shorter than a header"),
            _ => CallLogError::Io(e),
        })?;
        if magic[..8] != CALL_LOG_MAGIC {
            return Err(fail(0, "no KVCCALLS magic"));
        }
        let version = u16::from_le_bytes([magic[8], magic[9]]);
        if version != CALL_LOG_VERSION && version != 1 {
            return Err(fail(8, &format!("format version {version}; this build reads {CALL_LOG_VERSION}")));
        }
        offset += 10;
        let mut fields = [0u64; 15];
        for f in &mut fields {
            *f = read_varint(&mut input, &mut offset).map_err(|e| match e {
                ReadFail::Io(e) => CallLogError::Io(e),
                ReadFail::Truncated => fail(offset, "the header ends early"),
                ReadFail::Format(w) => fail(offset, &w),
            })?;
        }
        let u32_of = |i: usize| -> Result<u32, CallLogError> {
            u32::try_from(fields[i]).map_err(|_| fail(10, &format!("config field {i} is out of range")))
        };
        let bool_of = |i: usize| -> Result<bool, CallLogError> {
            match fields[i] {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(fail(10, &format!("config field {i} is not a flag"))),
            }
        };
        let config = EngineConfig {
            block_size_tokens: u32_of(0)?,
            blocks_device: u32_of(1)?,
            blocks_host: u32_of(2)?,
            block_reuse: bool_of(3)?,
            partial_reuse: bool_of(4)?,
            offload_first: bool_of(5)?,
            kv_events: bool_of(6)?,
            image_placeholder_token_id: u32_of(7)?,
            requests_max: u32_of(8)?,
            tokens_per_request_max: u32_of(9)?,
            mm_items_max: u32_of(10)?,
            mm_items_per_request_max: u32_of(11)?,
            runs_per_item_max: u32_of(12)?,
            routing_hints_max: u32_of(13)?,
            event_batches_max: u32_of(14)?,
            groups: Vec::new(),
        };
        let mut config = config;
        let read = |input: &mut R, offset: &mut u64| {
            read_varint(input, offset).map_err(|e| match e {
                ReadFail::Io(e) => CallLogError::Io(e),
                ReadFail::Truncated => fail(*offset, "the header ends early"),
                ReadFail::Format(w) => fail(*offset, &w),
            })
        };
        // Version 1 ends the header with the 15 fields: no group list.
        let groups = if version == 1 { 0 } else { read(&mut input, &mut offset)? };
        if groups > crate::config::GROUPS_LIMIT as u64 {
            return Err(fail(offset, &format!("{groups} groups in the config")));
        }
        for _ in 0..groups {
            let mut g = [0u32; 4];
            for v in &mut g {
                *v = u32::try_from(read(&mut input, &mut offset)?)
                    .map_err(|_| fail(offset, "a group field is out of range"))?;
            }
            let kind = match g[0] {
                0 => GroupKind::FullAttention,
                1 => GroupKind::SlidingWindow { window_tokens: g[1] },
                k => return Err(fail(offset, &format!("group kind {k}"))),
            };
            config.groups.push(GroupConfig { kind, blocks_device: g[2], blocks_host: g[3] });
        }
        Ok(Self { input, offset, config, truncated_at: None })
    }

    /// The logged configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Where the log ended inside a record, if it did (reading stops there).
    pub fn truncated_at(&self) -> Option<u64> {
        self.truncated_at
    }

    /// The next record; `None` at the end of the log (or where it was cut).
    pub fn next_record(&mut self) -> Result<Option<CallRecord>, CallLogError> {
        if self.truncated_at.is_some() {
            return Ok(None);
        }
        let start = self.offset;
        match self.input.fill_buf() {
            Ok([]) => return Ok(None),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        match self.read_record() {
            Ok((call, outputs)) => Ok(Some(CallRecord { offset: start, call, outputs })),
            Err(ReadFail::Truncated) => {
                self.truncated_at = Some(start);
                Ok(None)
            }
            Err(ReadFail::Io(e)) => Err(e.into()),
            Err(ReadFail::Format(what)) => Err(CallLogError::Format { offset: self.offset, what }),
        }
    }

    fn read_record(&mut self) -> Result<(LoggedCall, Vec<(OutputKind, u64)>), ReadFail> {
        let kind_byte = self.u8()?;
        let kind =
            CallKind::from_byte(kind_byte).ok_or_else(|| ReadFail::Format(format!("unknown call kind {kind_byte}")))?;
        let call = match kind {
            CallKind::AddRequest => LoggedCall::AddRequest(self.request()?),
            CallKind::Grow => LoggedCall::Grow(self.varint()?, self.u32s()?),
            CallKind::Commit => LoggedCall::Commit(self.varint()?, self.varint()?),
            CallKind::Finish => LoggedCall::Finish(self.varint()?),
            CallKind::Cancel => LoggedCall::Cancel(self.varint()?),
            CallKind::Evict => LoggedCall::Evict(self.varint()?),
            CallKind::Clear => LoggedCall::Clear,
            CallKind::Step => LoggedCall::Step,
            CallKind::Drain => LoggedCall::Drain,
            CallKind::Snapshot => LoggedCall::Snapshot,
            CallKind::AttachPublisher => LoggedCall::AttachPublisher,
            CallKind::DetachPublisher => LoggedCall::DetachPublisher,
        };
        let n = self.u8()?;
        let mut outputs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let k = self.u8()?;
            let kind = OutputKind::from_byte(k).ok_or_else(|| ReadFail::Format(format!("unknown output kind {k}")))?;
            let mut d = [0u8; 8];
            self.exact(&mut d)?;
            outputs.push((kind, u64::from_le_bytes(d)));
        }
        Ok((call, outputs))
    }

    fn exact(&mut self, buf: &mut [u8]) -> Result<(), ReadFail> {
        match self.input.read_exact(buf) {
            Ok(()) => {
                self.offset += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(ReadFail::Truncated),
            Err(e) => Err(ReadFail::Io(e)),
        }
    }

    fn u8(&mut self) -> Result<u8, ReadFail> {
        let mut b = [0u8; 1];
        self.exact(&mut b)?;
        Ok(b[0])
    }

    fn varint(&mut self) -> Result<u64, ReadFail> {
        read_varint(&mut self.input, &mut self.offset)
    }

    fn u32_value(&mut self) -> Result<u32, ReadFail> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| ReadFail::Format(format!("{v} does not fit 32 bits")))
    }

    /// A length: grows what it reads item by item, so a corrupt length
    /// costs no allocation beyond the bytes actually present.
    fn u32s(&mut self) -> Result<Vec<u32>, ReadFail> {
        let n = self.varint()?;
        let mut v = Vec::with_capacity(n.min(4096) as usize);
        for _ in 0..n {
            v.push(self.u32_value()?);
        }
        Ok(v)
    }

    fn bytes(&mut self) -> Result<Vec<u8>, ReadFail> {
        let n = self.varint()?;
        let mut v = Vec::with_capacity(n.min(4096) as usize);
        let got = (&mut self.input).take(n).read_to_end(&mut v).map_err(ReadFail::Io)?;
        self.offset += got as u64;
        if (got as u64) < n {
            return Err(ReadFail::Truncated);
        }
        Ok(v)
    }

    fn flag(&mut self) -> Result<bool, ReadFail> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(ReadFail::Format(format!("{b} is not a flag"))),
        }
    }

    fn opt_bytes(&mut self) -> Result<Option<Vec<u8>>, ReadFail> {
        Ok(if self.flag()? { Some(self.bytes()?) } else { None })
    }

    fn request(&mut self) -> Result<LoggedRequest, ReadFail> {
        let tokens = self.u32s()?;
        let lora_id = if self.flag()? { Some(self.u32_value()?) } else { None };
        let lora_name = self.opt_bytes()?;
        let cache_salt = self.opt_bytes()?;
        let n = self.varint()?;
        let mut items = Vec::with_capacity(n.min(64) as usize);
        for _ in 0..n {
            let digest_given = self.flag()?;
            let digest = self.bytes()?;
            let runs_n = self.varint()?;
            let mut runs = Vec::with_capacity(runs_n.min(64) as usize);
            for _ in 0..runs_n {
                runs.push(TokenRun { start: self.u32_value()?, len: self.u32_value()? });
            }
            items.push(LoggedItem { digest_given, digest, runs });
        }
        let uuids = if self.flag()? {
            let n = self.varint()?;
            let mut list = Vec::with_capacity(n.min(64) as usize);
            for _ in 0..n {
                list.push(self.opt_bytes()?);
            }
            Some(list)
        } else {
            None
        };
        let dummy = self.flag()?;
        Ok(LoggedRequest { tokens, lora_id, lora_name, cache_salt, items, uuids, dummy })
    }
}

fn read_varint(input: &mut impl BufRead, offset: &mut u64) -> Result<u64, ReadFail> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let mut b = [0u8; 1];
        match input.read_exact(&mut b) {
            Ok(()) => *offset += 1,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(ReadFail::Truncated),
            Err(e) => return Err(ReadFail::Io(e)),
        }
        let bits = (b[0] & 0x7f) as u64;
        if shift == 63 && bits > 1 {
            return Err(ReadFail::Format("a varint past 64 bits".to_owned()));
        }
        v |= bits << shift;
        if b[0] & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(ReadFail::Format("a varint past 64 bits".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Varints round-trip at their edges, and the reader refuses one past
    /// 64 bits instead of wrapping.
    #[test]
    fn varints_round_trip_and_refuse_overflow() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut off = 0;
            assert!(matches!(read_varint(&mut b.as_slice(), &mut off), Ok(x) if x == v));
            assert_eq!(off, b.len() as u64);
        }
        let over = [0xffu8; 10];
        assert!(matches!(read_varint(&mut over.as_slice(), &mut 0), Err(ReadFail::Format(_))));
        assert!(matches!(read_varint(&mut [0x80u8].as_slice(), &mut 0), Err(ReadFail::Truncated)));
    }
}
