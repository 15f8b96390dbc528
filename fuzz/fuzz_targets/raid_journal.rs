//! libFuzzer entry for `stria_fuzzing::raid_journal`; the properties are checked there.
#![no_main]

#[global_allocator]
static ALLOC: stria_fuzzing::TrackingAlloc = stria_fuzzing::TrackingAlloc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| stria_fuzzing::raid_journal(data));
