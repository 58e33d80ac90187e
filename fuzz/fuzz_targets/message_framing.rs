#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| pgcarpool::fuzz::message_framing(data));
