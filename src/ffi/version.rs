//! Version macros and the version string.
//!
//! cbindgen copies constants but cannot read Cargo.toml, so the numbers are
//! written here and a compile-time assertion ties them to the package version:
//! bumping Cargo.toml without them fails the build, and the header drift test
//! then makes sure `include/kvcore.h` carries the new numbers.

use std::ffi::c_char;

/// Major version of kvcore (the `KVCORE_VERSION_MAJOR` macro).
pub const KVCORE_VERSION_MAJOR: u32 = 0;
/// Minor version of kvcore.
pub const KVCORE_VERSION_MINOR: u32 = 2;
/// Patch version of kvcore.
pub const KVCORE_VERSION_PATCH: u32 = 0;

/// Parses a decimal `u32` at compile time; panics (a build error in const
/// context) on anything else.
const fn parse_u32(s: &str) -> u32 {
    let bytes = s.as_bytes();
    assert!(!bytes.is_empty(), "empty version component");
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        assert!(bytes[i].is_ascii_digit(), "non-digit in version component");
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}

const _: () = {
    assert!(KVCORE_VERSION_MAJOR == parse_u32(env!("CARGO_PKG_VERSION_MAJOR")), "update KVCORE_VERSION_MAJOR");
    assert!(KVCORE_VERSION_MINOR == parse_u32(env!("CARGO_PKG_VERSION_MINOR")), "update KVCORE_VERSION_MINOR");
    assert!(KVCORE_VERSION_PATCH == parse_u32(env!("CARGO_PKG_VERSION_PATCH")), "update KVCORE_VERSION_PATCH");
};

/// The version as a static NUL-terminated string (e.g. "0.1.0"), the one the
/// library was built as; compare with the `KVCORE_VERSION_*` macros to catch a
/// header that does not match the linked library.
///
/// Ownership: static, never free it. Threading: any thread.
///
/// # Safety
///
/// Always safe to call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
