#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fastseq::fuzzing::decode_and_merge(data));
