#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| pgcarpool::fuzz::scram_client(data));
