//! The call log switch: an engine records every call it takes, with its
//! arguments and digests of its answers, into a file that `kvcore
//! replay-calls FILE` replays into a fresh engine (docs/c-api.md,
//! "Reproducing an incident"). The format and the recording are the core's
//! (`Engine::record_calls`); this file opens and closes it for C.

use std::ffi::c_char;
use std::path::Path;

use crate::call_log::CallLogError;

use super::boundary::{ffi_boundary, optional_str, try_out, with_engine};
use super::handle::kvc_engine;
use super::status::{Failure, kvc_status};

impl From<CallLogError> for Failure {
    fn from(e: CallLogError) -> Self {
        let status = match e {
            CallLogError::NotFresh | CallLogError::AlreadyRecording => kvc_status::CallLogRefused,
            CallLogError::NotRecording => kvc_status::CallLogNotOpen,
            CallLogError::Io(_)
            | CallLogError::Format { .. }
            | CallLogError::Config(_)
            | CallLogError::Publisher(_) => kvc_status::CallLogFailed,
        };
        Self::new(status, e.to_string())
    }
}

/// Starts recording every call on `engine` into the file at `path` (UTF-8;
/// created, or truncated when it exists). Call it right after
/// `kvc_engine_new`, before any other call that changes the engine: a log
/// replays from a fresh engine. The file is written through a 64 KiB buffer
/// flushed at every `kvc_engine_step`, by `kvc_engine_call_log_close` and by
/// `kvc_engine_free`; a process that dies loses at most the calls since its
/// last step. A write that fails stops the recording (the engine keeps
/// serving) and `kvc_engine_call_log_close` reports it.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_UTF8`; `KVC_STATUS_CALL_LOG_REFUSED` (the engine already
/// took a call, or already records); `KVC_STATUS_CALL_LOG_FAILED` (the file
/// cannot be created); `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `path` is NULL or a NUL-terminated
/// string readable for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_call_log_open(engine: *mut kvc_engine, path: *const c_char) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let path =
                optional_str(path, "path")?.ok_or_else(|| Failure::new(kvc_status::NullArgument, "`path` is NULL"))?;
            st.engine.record_calls_to_file(Path::new(&path))?;
            Ok(())
        })
    })
}

/// Stops recording: flushes and closes the call log; `*calls_out` receives
/// the number of calls it holds.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_CALL_LOG_NOT_OPEN`; `KVC_STATUS_CALL_LOG_FAILED` (a write
/// failed: the log ends at the last record written before it; the log is
/// closed all the same); `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `calls_out` is NULL or valid for one
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_call_log_close(engine: *mut kvc_engine, calls_out: *mut u64) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(calls_out);
            if st.engine.calls_recorded().is_none() {
                return Err(CallLogError::NotRecording.into());
            }
            out.write(st.engine.stop_recording()?);
            Ok(())
        })
    })
}
