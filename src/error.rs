//! Error enums, one per layer. The C boundary maps each variant to a
//! `kvc_status` code in `ffi/status.rs`.

use thiserror::Error;

/// Why an engine could not be built from a [`crate::EngineConfig`].
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A field is out of its documented range (the text names it and the range).
    #[error("invalid engine config: {0}")]
    Invalid(&'static str),
    /// The config is valid, but the memory it asks to reserve could not be
    /// allocated; nothing was kept.
    #[error("the engine's {0} could not be reserved: not enough memory for this config")]
    OutOfMemory(&'static str),
}

/// Why a request was not admitted. A rejected request leaves the engine
/// exactly as it was before the call.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AdmitError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt is longer than `tokens_per_request_max`.
    #[error("the prompt has {tokens} tokens, more than the limit of {max}")]
    PromptTooLong {
        /// Tokens in the prompt.
        tokens: usize,
        /// The configured limit.
        max: u32,
    },
    /// More image items than the per-request limit.
    #[error("the request has {items} image items, more than the limit of {max}")]
    TooManyItems {
        /// Items in the request.
        items: usize,
        /// The configured limit.
        max: u32,
    },
    /// An item has no runs, or more than the limit.
    #[error("image item {item} has {runs} runs; it needs between 1 and {max}")]
    BadRunCount {
        /// Index of the item.
        item: usize,
        /// Runs given.
        runs: usize,
        /// The configured limit.
        max: u32,
    },
    /// A run of zero tokens.
    #[error("image item {item} has a zero-length run")]
    ZeroLengthRun {
        /// Index of the item.
        item: usize,
    },
    /// A run reaches past the prompt.
    #[error("image item {item} has a run [{start}, {end}) outside the prompt of {prompt_len} tokens")]
    RunOutOfRange {
        /// Index of the item.
        item: usize,
        /// First token of the run.
        start: u64,
        /// One past the last token of the run.
        end: u64,
        /// Prompt length.
        prompt_len: usize,
    },
    /// Two runs overlap (of one item or of two), or an item's runs are not in order.
    #[error("image runs overlap or are out of order at token {at} (item {item})")]
    OverlappingRuns {
        /// Index of the item whose run starts the overlap.
        item: usize,
        /// The first token position involved.
        at: u64,
    },
    /// A digest given as bytes is not 32 bytes long.
    #[error("image item {item} has a digest of {len} bytes; a BLAKE3-256 digest has 32")]
    BadDigestLength {
        /// Index of the item.
        item: usize,
        /// Bytes given.
        len: usize,
    },
    /// The UUID list does not have one entry per item.
    #[error("{uuids} UUIDs were given for {items} image items")]
    UuidCountMismatch {
        /// UUID entries given.
        uuids: usize,
        /// Image items.
        items: usize,
    },
    /// A UUID is not valid UTF-8.
    #[error("the UUID of image item {item} is not valid UTF-8")]
    InvalidUtf8Uuid {
        /// Index of the item.
        item: usize,
    },
    /// A LoRA adapter given by id without a name. Routers (Dynamo, vLLM's
    /// consumers, kvcore's own) scope blocks by the adapter's name, so an
    /// unnamed adapter's blocks would look like base-model blocks to them.
    #[error("LoRA adapter {lora_id} has no name; routers scope blocks by name, so an adapter id needs its lora_name")]
    LoraNameRequired {
        /// The adapter id given.
        lora_id: u32,
    },
    /// The LoRA name or cache salt is not valid UTF-8.
    #[error("the {field} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which field.
        field: &'static str,
    },
    /// No request row is free.
    #[error("all {max} request slots are in use")]
    TooManyRequests {
        /// The configured limit.
        max: u32,
    },
    /// The item table is full.
    #[error("the image item table is full ({max} items)")]
    TooManyLiveItems {
        /// The configured limit.
        max: u32,
    },
    /// Not enough free or evictable device blocks.
    #[error("not enough KV blocks: {needed} needed, {available} free or evictable")]
    OutOfBlocks {
        /// Blocks the request needs.
        needed: usize,
        /// Blocks that could be had.
        available: usize,
    },
}

/// Why an operation on an admitted request failed. The engine is unchanged.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// The id is stale or was never issued.
    #[error("unknown or stale request id")]
    UnknownRequest,
    /// Reported computed tokens go backwards or past the request's tokens.
    #[error("computed tokens must be in {current}..={len}, got {given}")]
    BadComputedCount {
        /// Tokens already reported as computed.
        current: u32,
        /// Tokens in the request.
        len: u32,
        /// The count given.
        given: u64,
    },
    /// Growing would pass `tokens_per_request_max`.
    #[error("the request would have {tokens} tokens, more than the limit of {max}")]
    TooLong {
        /// Tokens after growing.
        tokens: u64,
        /// The configured limit.
        max: u32,
    },
    /// Not enough free or evictable device blocks to grow.
    #[error("not enough KV blocks: {needed} needed, {available} free or evictable")]
    OutOfBlocks {
        /// Blocks needed.
        needed: usize,
        /// Blocks that could be had.
        available: usize,
    },
    /// A group index past the engine's last group.
    #[error("no KV cache group {group}: the engine has {groups}")]
    UnknownGroup {
        /// The group asked for.
        group: usize,
        /// Groups the engine has.
        groups: usize,
    },
}
