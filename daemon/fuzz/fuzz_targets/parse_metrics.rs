//! Fuzz target over the model server metrics page parser (`daemon/crates/server-page/src/parse.rs`) and
//! what reads its output (`normalize`, `interval`, `quantile`): any bytes give a page or an
//! error, never a panic, and every figure of the sample is finite or absent; the scraper's
//! filtered parse (`parse_with(normalize::reads)`) gives the same reading.
//! Run: `cd daemon/fuzz && cargo +nightly fuzz run parse_metrics -- -max_total_time=300`.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;

use lmperf_server_page as server;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(page) = server::parse::parse(&text) {
        let r = server::normalize::normalize(&page, None);
        let t0 = SystemTime::UNIX_EPOCH;
        let s = server::interval::sample(Some((&r, t0)), &r, t0 + Duration::from_secs(1));
        for v in [s.requests_waiting, s.requests_running, s.kv_cache_usage, s.ttft.p50, s.ttft.p99, s.queue.mean] {
            assert!(v.is_none_or(f64::is_finite), "{v:?}");
        }
        // The scraper's path: only the families normalize reads are kept, and they give the
        // same reading (Debug: a NaN histogram sum is not equal to itself).
        let kept = server::parse::parse_with(&text, server::normalize::reads)
            .expect("parse_with accepts what parse accepts");
        let (a, b) = (&page.stats, &kept.stats);
        assert_eq!((a.bad_lines, &a.first_bad, a.non_finite, a.eof), (b.bad_lines, &b.first_bad, b.non_finite, b.eof));
        assert!(b.duplicates <= a.duplicates);
        assert_eq!(format!("{r:?}"), format!("{:?}", server::normalize::normalize(&kept, None)));
    }
});
