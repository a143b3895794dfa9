#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = fastseq::fuzzing::external_load_and_save(data);
});
