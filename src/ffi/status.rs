//! `kvc_status`: the return code of every fallible export, and the mapping
//! from the engine's error enums to it.
//!
//! Codes are grouped by where the failure comes from and are never reused:
//!
//! | range | origin |
//! |---|---|
//! | 0 | success |
//! | 1xx | the caller's arguments or handles |
//! | 2xx | a configured capacity was reached |
//! | 3xx | the GPU (none yet) |
//! | 4xx | events and the publisher |
//! | 9xx | kvcore itself (a bug) |
//!
//! A retired code stays listed here as a comment so that it is never handed
//! out again.

use std::ffi::{CStr, c_char};

use crate::error::{AdmitError, ConfigError, RequestError};

/// The outcome of a call. `KVC_STATUS_OK` is 0; every other value is a
/// failure, and the engine's last error (`kvc_engine_last_error`) then holds
/// a detailed message. A failed call changes nothing in the engine and writes
/// no `_out` parameter.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum kvc_status {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL (the message names it).
    NullArgument = 100,
    /// An argument is malformed: an unknown enum value, a misaligned pointer,
    /// a NULL pointer paired with a non-zero length, or a length too large to
    /// be a buffer.
    InvalidArgument = 101,
    /// The request id is stale (the request finished or was cancelled) or was
    /// never issued by this engine.
    UnknownId = 102,
    /// The configuration was refused (the message names the field).
    InvalidConfig = 103,
    /// A string argument (LoRA name, cache salt, UUID, model type, endpoint)
    /// is not valid UTF-8.
    InvalidUtf8 = 104,
    /// The request has no prompt tokens.
    EmptyPrompt = 105,
    /// An image item's placement runs are missing, too many, empty, outside
    /// the prompt, out of order, or overlapping.
    InvalidImageRuns = 106,
    /// An image digest is not 32 bytes long.
    BadDigestLength = 107,
    /// A UUID list was given whose length differs from the number of image items.
    UuidCountMismatch = 108,
    /// `kvc_engine_commit` was given a count that goes backwards or past the
    /// request's tokens.
    BadComputedCount = 109,
    /// A caller buffer is too small for the whole result; nothing was written.
    BufferTooSmall = 110,
    /// Another thread is inside a call on the same engine. An engine serves one
    /// thread at a time; this is reported instead of racing.
    EngineBusy = 111,
    /// Not enough free or evictable KV blocks on the device.
    OutOfBlocks = 200,
    /// All `requests_max` request slots are in use.
    TooManyRequests = 201,
    /// The engine-wide image item table (`mm_items_max`) is full.
    TooManyItems = 202,
    /// The request would hold more than `tokens_per_request_max` tokens.
    RequestTooLong = 203,
    /// The request has more than `mm_items_per_request_max` image items.
    TooManyItemsPerRequest = 204,
    /// No GPU is open on the engine (`kvc_engine_gpu_open` was not called or
    /// failed), or none could be opened: no CUDA driver, no such device, or
    /// kvcore built without CUDA. The message says which.
    GpuUnavailable = 300,
    /// A CUDA call or a kernel compilation failed (the message holds the
    /// driver's error).
    GpuFailed = 301,
    /// `kvc_engine_copy_blocks` on an engine with no KV pool attached.
    KvPoolNotAttached = 302,
    /// `kvc_engine_publisher_start` on an engine whose publisher already runs.
    PublisherRunning = 400,
    /// The publisher could not start: an endpoint ZMQ refused, a rank that
    /// cannot offset the endpoint's port, or its thread could not be spawned.
    PublisherStartFailed = 401,
    /// A publisher call on an engine with no publisher running.
    PublisherNotRunning = 402,
    /// kvcore panicked inside this call (a broken invariant). The engine is
    /// now poisoned; only `kvc_engine_last_error` and `kvc_engine_free` remain useful.
    Panic = 900,
    /// An earlier call on this engine panicked; the engine refuses all work.
    Poisoned = 901,
    /// An internal step failed that should not (for example serialising JSON).
    Internal = 902,
}

impl kvc_status {
    /// The static, NUL-terminated description of the code.
    pub(crate) fn describe(code: u32) -> &'static CStr {
        use kvc_status as S;
        let known = [
            (S::Ok, c"ok"),
            (S::NullArgument, c"a required pointer argument was NULL"),
            (S::InvalidArgument, c"an argument is malformed"),
            (S::UnknownId, c"unknown or stale request id"),
            (S::InvalidConfig, c"invalid engine configuration"),
            (S::InvalidUtf8, c"a string argument is not valid UTF-8"),
            (S::EmptyPrompt, c"the prompt is empty"),
            (S::InvalidImageRuns, c"invalid image placement runs"),
            (S::BadDigestLength, c"an image digest is not 32 bytes long"),
            (S::UuidCountMismatch, c"the UUID list does not have one entry per image item"),
            (S::BadComputedCount, c"the computed token count is out of range"),
            (S::BufferTooSmall, c"the caller's buffer is too small"),
            (S::EngineBusy, c"another thread is using this engine"),
            (S::OutOfBlocks, c"not enough KV blocks"),
            (S::TooManyRequests, c"too many live requests"),
            (S::TooManyItems, c"the image item table is full"),
            (S::RequestTooLong, c"the request is longer than tokens_per_request_max"),
            (S::TooManyItemsPerRequest, c"the request has too many image items"),
            (S::GpuUnavailable, c"no GPU is available or open"),
            (S::GpuFailed, c"a CUDA call failed"),
            (S::KvPoolNotAttached, c"no KV pool is attached"),
            (S::PublisherRunning, c"a publisher is already running"),
            (S::PublisherStartFailed, c"the publisher could not start"),
            (S::PublisherNotRunning, c"no publisher is running"),
            (S::Panic, c"kvcore panicked; the engine is poisoned"),
            (S::Poisoned, c"the engine is poisoned by an earlier panic"),
            (S::Internal, c"internal error"),
        ];
        known.iter().find(|(s, _)| *s as u32 == code).map_or(c"unknown status code", |(_, m)| m)
    }
}

/// A failed call: its status and the detailed message that
/// `kvc_engine_last_error` returns afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The status returned to C.
    pub status: kvc_status,
    /// The detailed message.
    pub message: String,
}

impl Failure {
    /// A failure with a message.
    pub fn new(status: kvc_status, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

impl From<AdmitError> for Failure {
    fn from(e: AdmitError) -> Self {
        use kvc_status as S;
        let status = match e {
            AdmitError::EmptyPrompt => S::EmptyPrompt,
            AdmitError::PromptTooLong { .. } => S::RequestTooLong,
            AdmitError::TooManyItems { .. } => S::TooManyItemsPerRequest,
            AdmitError::BadRunCount { .. }
            | AdmitError::ZeroLengthRun { .. }
            | AdmitError::RunOutOfRange { .. }
            | AdmitError::OverlappingRuns { .. } => S::InvalidImageRuns,
            AdmitError::BadDigestLength { .. } => S::BadDigestLength,
            AdmitError::UuidCountMismatch { .. } => S::UuidCountMismatch,
            AdmitError::InvalidUtf8Uuid { .. } | AdmitError::InvalidUtf8 { .. } => S::InvalidUtf8,
            AdmitError::TooManyRequests { .. } => S::TooManyRequests,
            AdmitError::TooManyLiveItems { .. } => S::TooManyItems,
            AdmitError::OutOfBlocks { .. } => S::OutOfBlocks,
        };
        Self::new(status, e.to_string())
    }
}

impl From<RequestError> for Failure {
    fn from(e: RequestError) -> Self {
        let status = match e {
            RequestError::UnknownRequest => kvc_status::UnknownId,
            RequestError::BadComputedCount { .. } => kvc_status::BadComputedCount,
            RequestError::TooLong { .. } => kvc_status::RequestTooLong,
            RequestError::OutOfBlocks { .. } => kvc_status::OutOfBlocks,
        };
        Self::new(status, e.to_string())
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Self::new(kvc_status::InvalidConfig, e.to_string())
    }
}

/// Describes a status code. Any value is accepted; an unknown code gives
/// "unknown status code".
///
/// Ownership: the returned string is static, NUL-terminated, and must not be
/// freed. Threading: callable from any thread at any time. Never allocates.
///
/// # Safety
///
/// Always safe to call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_status_str(status: u32) -> *const c_char {
    // No panic is possible here (a lookup in a fixed table), but the boundary
    // still holds so that every export is covered.
    std::panic::catch_unwind(|| kvc_status::describe(status).as_ptr()).unwrap_or(c"unknown status code".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code has its own NUL-terminated description and codes stay in
    /// their origin's range; checked by walking the table.
    #[test]
    fn every_status_is_described_once() {
        let codes = [
            0u32, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 200, 201, 202, 203, 204, 400, 401, 402,
            900, 901, 902,
        ];
        let mut seen = std::collections::HashSet::new();
        for c in codes {
            let d = kvc_status::describe(c);
            assert_ne!(d, c"unknown status code", "code {c} is described");
            assert!(seen.insert(d), "code {c} has its own text");
        }
        assert_eq!(kvc_status::describe(12345), c"unknown status code");
    }
}
