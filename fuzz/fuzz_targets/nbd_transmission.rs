//! libFuzzer entry for `stria_fuzzing::nbd_transmission`; the properties are checked there.
#![no_main]

#[global_allocator]
static ALLOC: stria_fuzzing::TrackingAlloc = stria_fuzzing::TrackingAlloc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| stria_fuzzing::nbd_transmission(data));
