#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| pgcarpool::fuzz::startup_packet(data));
