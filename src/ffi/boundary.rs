//! The boundary: panics stop here, and every pointer is checked here.
//!
//! * [`ffi_boundary!`] wraps an export's whole body in `catch_unwind`, so that a
//!   panic never unwinds into C (which would be undefined behaviour) but comes
//!   back as `KVC_STATUS_PANIC`.
//! * [`with_engine`] is how every engine call reaches its engine: it takes the
//!   handle's lock (a second thread gets `KVC_STATUS_ENGINE_BUSY` instead of a
//!   data race), refuses a poisoned engine, runs the call under its own
//!   `catch_unwind` (a panic poisons the engine) and stores the failure
//!   message on the handle.
//! * The `try_*!` macros turn raw pointers into references and slices after a
//!   NULL and alignment check, failing with a message that names the argument.
//!   They are used inside a `with_engine` closure, which returns
//!   `Result<(), Failure>`, or a [`without_engine`] one for the exports that
//!   take no engine.
//! * [`optional_str`] reads a C string field, [`fill_or_query`] fills a
//!   caller's buffer or only reports the size it needs.
//!
//! This module depends only on the status codes and the handle's type, never
//! on an export, so that every export can use it.

use std::ffi::{CStr, c_char};
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::TryLockError;

use super::handle::{EngineState, kvc_engine};
use super::status::{Failure, kvc_status};

/// Runs an export's body, turning a panic into `$fallback` (by default
/// `KVC_STATUS_PANIC`).
macro_rules! ffi_boundary {
    ($body:block) => {
        ffi_boundary!($crate::ffi::status::kvc_status::Panic, $body)
    };
    ($fallback:expr, $body:block) => {
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| $body)) {
            Ok(value) => value,
            Err(_) => $fallback,
        }
    };
}

/// Borrows `*$ptr` for the duration of the call, or returns a `Failure`
/// (NULL: `KVC_STATUS_NULL_ARGUMENT`; misaligned: `KVC_STATUS_INVALID_ARGUMENT`).
macro_rules! try_ref {
    ($ptr:ident) => {{
        let ptr = $ptr;
        $crate::ffi::boundary::check_ptr(ptr, stringify!($ptr))?;
        // SAFETY: `check_ptr` established that the pointer is non-null and
        // aligned; the export's `# Safety` contract makes the caller guarantee
        // that a non-null argument points to a valid value that outlives the
        // call and that no one writes it during the call.
        unsafe { &*ptr }
    }};
}

/// Checks an `_out` pointer now and returns it as `&mut MaybeUninit<T>`, to be
/// written only when the call succeeds.
macro_rules! try_out {
    ($ptr:ident) => {{
        let ptr = $ptr;
        $crate::ffi::boundary::check_ptr(ptr.cast_const(), stringify!($ptr))?;
        // SAFETY: `check_ptr` established non-null and aligned; the caller
        // guarantees (export `# Safety`) that an `_out` pointer is valid for
        // writes of one `T` for the call. `MaybeUninit` means the target need
        // not be initialised.
        unsafe { $crate::ffi::boundary::uninit_mut(ptr) }
    }};
}

/// Borrows `$len` elements at `$ptr` as a slice (`len == 0` gives an empty
/// slice whatever the pointer).
macro_rules! try_slice {
    ($ptr:expr, $len:expr, $name:expr) => {{
        let (ptr, len) = ($ptr, $len);
        $crate::ffi::boundary::check_slice(ptr, len, $name)?;
        if len == 0 {
            &[]
        } else {
            // SAFETY: `check_slice` established non-null, aligned, and a byte
            // length within `isize::MAX`; the caller guarantees (export
            // `# Safety`) that `len` elements are readable there and not
            // written during the call.
            unsafe { ::std::slice::from_raw_parts(ptr, len) }
        }
    }};
}

/// Borrows `$len` writable elements at `$ptr` as `&mut [MaybeUninit<T>]`.
macro_rules! try_slice_out {
    ($ptr:ident, $len:expr) => {{
        let (ptr, len) = ($ptr, $len);
        $crate::ffi::boundary::check_slice(ptr.cast_const(), len, stringify!($ptr))?;
        if len == 0 {
            &mut []
        } else {
            // SAFETY: `check_slice` established non-null, aligned, and a byte
            // length within `isize::MAX`; the caller guarantees (export
            // `# Safety`) that `len` elements are writable there and that no
            // one else touches them during the call.
            unsafe { $crate::ffi::boundary::uninit_slice_mut(ptr, len) }
        }
    }};
}

pub(crate) use {ffi_boundary, try_out, try_ref, try_slice, try_slice_out};

/// `*ptr` as possibly uninitialised memory to write a result into.
///
/// # Safety
///
/// `ptr` is non-null, aligned, valid for writes of one `T` for `'a`, and not
/// accessed by anyone else meanwhile.
pub(crate) unsafe fn uninit_mut<'a, T>(ptr: *mut T) -> &'a mut MaybeUninit<T> {
    // SAFETY: forwarded from this function's contract; `MaybeUninit<T>` has
    // the layout of `T`.
    unsafe { &mut *ptr.cast::<MaybeUninit<T>>() }
}

/// `len` elements at `ptr` as possibly uninitialised memory.
///
/// # Safety
///
/// `ptr` is non-null, aligned, valid for writes of `len` elements of `T` for
/// `'a`, `len * size_of::<T>() <= isize::MAX`, and no one else accesses them.
pub(crate) unsafe fn uninit_slice_mut<'a, T>(ptr: *mut T, len: usize) -> &'a mut [MaybeUninit<T>] {
    // SAFETY: forwarded from this function's contract; `MaybeUninit<T>` has
    // the layout of `T`.
    unsafe { std::slice::from_raw_parts_mut(ptr.cast::<MaybeUninit<T>>(), len) }
}

/// NULL and alignment check of one pointer argument.
pub(crate) fn check_ptr<T>(ptr: *const T, name: &str) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::new(kvc_status::NullArgument, format!("`{name}` is NULL")));
    }
    if !ptr.is_aligned() {
        return Err(Failure::new(
            kvc_status::InvalidArgument,
            format!("`{name}` is not aligned to {} bytes", align_of::<T>()),
        ));
    }
    Ok(())
}

/// NULL, alignment and size check of a pointer and length pair. A zero length
/// passes whatever the pointer; a NULL pointer with a non-zero length is a
/// mismatched pair (`KVC_STATUS_INVALID_ARGUMENT`).
pub(crate) fn check_slice<T>(ptr: *const T, len: usize, name: &str) -> Result<(), Failure> {
    if len == 0 {
        return Ok(());
    }
    if ptr.is_null() {
        return Err(Failure::new(
            kvc_status::InvalidArgument,
            format!("`{name}` is NULL but its length is {len}: a NULL buffer must have length 0"),
        ));
    }
    if !ptr.is_aligned() {
        return Err(Failure::new(
            kvc_status::InvalidArgument,
            format!("`{name}` is not aligned to {} bytes", align_of::<T>()),
        ));
    }
    if len.checked_mul(size_of::<T>()).is_none_or(|bytes| bytes > isize::MAX as usize) {
        return Err(Failure::new(kvc_status::InvalidArgument, format!("`{name}` has an impossible length {len}")));
    }
    Ok(())
}

/// Reads an optional C string field (`name` as the caller wrote it, e.g.
/// `config.model_type`, for the error).
pub(crate) fn optional_str(ptr: *const c_char, name: &str) -> Result<Option<String>, Failure> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null (checked above); the contract of every export that
    // reads a string field makes the caller guarantee that a non-null field
    // points to a NUL-terminated string readable for the call.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str()
        .map(|s| Some(s.to_owned()))
        .map_err(|_| Failure::new(kvc_status::InvalidUtf8, format!("`{name}` is not valid UTF-8")))
}

/// Copies all of `src` into `dst`, or only reports the size when the caller
/// passed a NULL buffer (`query`), or fails when `dst` is too small.
pub(crate) fn fill_or_query<T: Copy>(
    dst: &mut [std::mem::MaybeUninit<T>],
    query: bool,
    src: &[T],
    what: &str,
) -> Result<(), Failure> {
    if query {
        return Ok(());
    }
    if dst.len() < src.len() {
        return Err(Failure::new(
            kvc_status::BufferTooSmall,
            format!("the {what} has {} entries; the buffer holds {}", src.len(), dst.len()),
        ));
    }
    for (d, s) in dst.iter_mut().zip(src) {
        d.write(*s);
    }
    Ok(())
}

/// Runs `f` (a closure returning `Result<(), Failure>`) for an export that has
/// no engine to hold a message: the status alone comes back.
pub(crate) fn without_engine(f: impl FnOnce() -> Result<(), Failure>) -> kvc_status {
    match f() {
        Ok(()) => kvc_status::Ok,
        Err(failure) => failure.status,
    }
}

/// The text of a panic payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// Runs `f` on the engine behind `engine`: the one path by which an export
/// touches an engine.
///
/// 1. NULL handle: `KVC_STATUS_NULL_ARGUMENT` (no engine to hold a message).
/// 2. Another thread inside a call on it: `KVC_STATUS_ENGINE_BUSY`.
/// 3. Poisoned: `KVC_STATUS_POISONED`.
/// 4. `f` fails: its status, and its message becomes the last error.
/// 5. `f` panics: `KVC_STATUS_PANIC`, the engine is poisoned, and the panic
///    message becomes the last error.
/// 6. `f` succeeds: `KVC_STATUS_OK`, and the last error is cleared.
pub(crate) fn with_engine(
    engine: *const kvc_engine,
    f: impl FnOnce(&mut EngineState) -> Result<(), Failure>,
) -> kvc_status {
    if engine.is_null() || !engine.is_aligned() {
        return if engine.is_null() { kvc_status::NullArgument } else { kvc_status::InvalidArgument };
    }
    // SAFETY: non-null and aligned (checked above); the caller guarantees
    // (export `# Safety`) that a non-null engine came from `kvc_engine_new`
    // and was not freed. Only a shared reference is formed: the mutable state
    // sits behind the handle's mutex.
    let handle = unsafe { &*engine };
    let mut state = match handle.state.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::WouldBlock) => return kvc_status::EngineBusy,
        // The guard is never held across a panic (the panic is caught below
        // while the guard lives), so this arm is defensive only.
        Err(TryLockError::Poisoned(_)) => return kvc_status::Poisoned,
    };
    if state.poisoned {
        return kvc_status::Poisoned;
    }
    match catch_unwind(AssertUnwindSafe(|| f(&mut state))) {
        Ok(Ok(())) => {
            state.last_error.clear();
            kvc_status::Ok
        }
        Ok(Err(failure)) => {
            state.last_error = failure.message;
            failure.status
        }
        Err(payload) => {
            state.poisoned = true;
            state.last_error = format!("kvcore panicked: {}", panic_message(payload.as_ref()));
            kvc_status::Panic
        }
    }
}
