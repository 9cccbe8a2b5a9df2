//! Typed events built from the bytes: encode under every option, decode, compare with the projection.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvcore::fuzzing::roundtrip(data);
});
