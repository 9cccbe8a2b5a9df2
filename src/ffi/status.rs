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
//! | 3xx | the GPU |
//! | 4xx | events and the publisher |
//! | 5xx | the call log |
//! | 9xx | kvcore itself (a bug) |
//!
//! A retired code stays listed here as a comment so that it is never handed
//! out again.

use std::ffi::{CStr, c_char};

use crate::error::{AdmitError, ConfigError, RequestError};
use crate::outbound::PublisherError;

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
    /// A request names a LoRA adapter by id without its name. Routers scope
    /// blocks by the adapter's name, so kvcore refuses an adapter a router
    /// could not tell from the base model; nothing was admitted.
    LoraNameRequired = 112,
    /// A KV cache group index past the engine's last group.
    UnknownGroup = 113,
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
    /// The configuration is valid, but the memory it reserves could not be
    /// allocated on this machine (`kvc_engine_new`); nothing was kept.
    OutOfMemory = 205,
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
    /// `kvc_engine_call_log_open` on an engine that already took a call
    /// (a log starts with a fresh engine) or already records one.
    CallLogRefused = 500,
    /// The call log file could not be created or written (the message holds
    /// the system's error). A failed write stops the recording; the engine
    /// keeps serving.
    CallLogFailed = 501,
    /// `kvc_engine_call_log_close` on an engine that records no call log.
    CallLogNotOpen = 502,
    /// kvcore panicked inside this call (a broken invariant). The engine is
    /// now poisoned; only `kvc_engine_last_error` and `kvc_engine_free` remain useful.
    Panic = 900,
    /// An earlier call on this engine panicked; the engine refuses all work.
    Poisoned = 901,
    /// An internal step failed that should not (for example serialising JSON).
    Internal = 902,
}

/// The one table of statuses: each variant of [`kvc_status`] (its code and
/// its C name come from the enum above, which cbindgen reads) with its static
/// description. The table becomes [`kvc_status::ALL`] and an exhaustive
/// `match` in [`kvc_status::message`], so a status added to the enum and
/// missing here (or named here and not in the enum) fails to compile, and a
/// status named twice is an unreachable pattern.
macro_rules! status_table {
    ($($status:ident => $message:literal,)+) => {
        impl kvc_status {
            /// Every status, in code order: the list `kvc_status_str` answers
            /// from and the tests walk.
            pub const ALL: &'static [kvc_status] = &[$(kvc_status::$status),+];

            /// The static, NUL-terminated description of the status.
            pub const fn message(self) -> &'static CStr {
                match self {
                    $(kvc_status::$status => $message,)+
                }
            }
        }
    };
}

status_table! {
    Ok => c"ok",
    NullArgument => c"a required pointer argument was NULL",
    InvalidArgument => c"an argument is malformed",
    UnknownId => c"unknown or stale request id",
    InvalidConfig => c"invalid engine configuration",
    InvalidUtf8 => c"a string argument is not valid UTF-8",
    EmptyPrompt => c"the prompt is empty",
    InvalidImageRuns => c"invalid image placement runs",
    BadDigestLength => c"an image digest is not 32 bytes long",
    UuidCountMismatch => c"the UUID list does not have one entry per image item",
    BadComputedCount => c"the computed token count is out of range",
    BufferTooSmall => c"the caller's buffer is too small",
    EngineBusy => c"another thread is using this engine",
    LoraNameRequired => c"a LoRA adapter id was given without its name",
    UnknownGroup => c"no such KV cache group",
    OutOfBlocks => c"not enough KV blocks",
    TooManyRequests => c"too many live requests",
    TooManyItems => c"the image item table is full",
    RequestTooLong => c"the request is longer than tokens_per_request_max",
    TooManyItemsPerRequest => c"the request has too many image items",
    OutOfMemory => c"the configuration's memory could not be allocated",
    GpuUnavailable => c"no GPU is available or open",
    GpuFailed => c"a CUDA call failed",
    KvPoolNotAttached => c"no KV pool is attached",
    PublisherRunning => c"a publisher is already running",
    PublisherStartFailed => c"the publisher could not start",
    PublisherNotRunning => c"no publisher is running",
    CallLogRefused => c"the call log cannot start on this engine",
    CallLogFailed => c"the call log could not be written",
    CallLogNotOpen => c"no call log is open",
    Panic => c"kvcore panicked; the engine is poisoned",
    Poisoned => c"the engine is poisoned by an earlier panic",
    Internal => c"internal error",
}

/// What `kvc_status_str` says of a code that is no status.
const UNKNOWN_STATUS: &CStr = c"unknown status code";

// The table lists the statuses in strictly increasing code order, so no code
// appears twice, and every code lies in a range of its origin (module docs).
const _: () = {
    let all = kvc_status::ALL;
    let mut i = 0;
    while i < all.len() {
        let code = all[i] as u32;
        assert!(i == 0 || (all[i - 1] as u32) < code, "status codes are listed in strictly increasing order");
        assert!(matches!(code / 100, 0 | 1 | 2 | 3 | 4 | 5 | 9), "a status code lies in an origin's range");
        i += 1;
    }
};

impl kvc_status {
    /// The status whose code is `code`, if there is one.
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| *s as u32 == code)
    }

    /// The static, NUL-terminated description of a code; an unknown code
    /// gives "unknown status code".
    pub(crate) fn describe(code: u32) -> &'static CStr {
        Self::from_code(code).map_or(UNKNOWN_STATUS, Self::message)
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
            AdmitError::LoraNameRequired { .. } => S::LoraNameRequired,
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
            RequestError::UnknownGroup { .. } => kvc_status::UnknownGroup,
        };
        Self::new(status, e.to_string())
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        let status = match e {
            ConfigError::Invalid(_) => kvc_status::InvalidConfig,
            ConfigError::OutOfMemory(_) => kvc_status::OutOfMemory,
        };
        Self::new(status, e.to_string())
    }
}

impl From<PublisherError> for Failure {
    fn from(e: PublisherError) -> Self {
        let status = match e {
            PublisherError::Running => kvc_status::PublisherRunning,
            PublisherError::NotRunning => kvc_status::PublisherNotRunning,
            PublisherError::Start(_) => kvc_status::PublisherStartFailed,
        };
        Self::new(status, e.to_string())
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
    std::panic::catch_unwind(|| kvc_status::describe(status).as_ptr()).unwrap_or(UNKNOWN_STATUS.as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every status of the table, the GPU codes included, has its own
    /// NUL-terminated description, comes back from its code, and an unknown
    /// code gets the fallback; checked by walking `kvc_status::ALL`.
    #[test]
    fn every_status_is_described_once() {
        let mut seen = std::collections::HashSet::new();
        for status in kvc_status::ALL {
            let code = *status as u32;
            assert_eq!(kvc_status::from_code(code), Some(*status), "code {code} comes back");
            let d = kvc_status::describe(code);
            assert_ne!(d, UNKNOWN_STATUS, "code {code} is described");
            assert!(seen.insert(d), "code {code} has its own text");
        }
        assert!(kvc_status::ALL.contains(&kvc_status::KvPoolNotAttached), "the GPU codes are in the table");
        assert_eq!(kvc_status::describe(12345), UNKNOWN_STATUS);
        assert_eq!(kvc_status::from_code(12345), None);
    }
}
