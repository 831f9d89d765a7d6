//! Fuzzes the metrics page parser and everything downstream of it: any bytes must give a page
//! or an error, never a panic, and normalizing two pages must not panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lmperf::server::{interval, normalize, parse};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(page) = parse::parse(&text) {
        let r = normalize::normalize(&page, None);
        let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(10);
        let s = interval::sample(Some((&r, std::time::SystemTime::UNIX_EPOCH)), &r, t);
        assert!(s.prompt_tokens_per_s.is_none_or(|v| v == 0.0));
    }
});
