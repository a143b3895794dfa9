#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fastseq::fuzzing::compose_two(data));
