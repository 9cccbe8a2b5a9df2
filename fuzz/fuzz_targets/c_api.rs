//! Random call sequences through the C API, with arbitrary ids, lengths, strings and configs: every
//! status documented, invariants and memory bounds checked after each call (`kvcore::ffi::c_api_calls`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvcore::ffi::c_api_calls(data);
});
