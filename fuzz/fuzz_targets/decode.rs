//! Arbitrary bytes into the wire decoder: never a panic; what decodes re-encodes to the same batch.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvcore::fuzzing::decode(data);
});
