//! Fuzz target over the model server metrics page parser (`daemon/src/server/parse.rs`) and
//! what reads its output (`normalize`, `interval`, `quantile`): any bytes give a page or an
//! error, never a panic, and every figure of the sample is finite or absent.
//! Run: `cd daemon/fuzz && cargo +nightly fuzz run parse_metrics -- -max_total_time=300`.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
mod server {
    #[path = "../../../src/server/interval.rs"]
    pub mod interval;
    #[path = "../../../src/server/normalize.rs"]
    pub mod normalize;
    #[path = "../../../src/server/parse.rs"]
    pub mod parse;
    #[path = "../../../src/server/quantile.rs"]
    pub mod quantile;
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(page) = server::parse::parse(&text) {
        let r = server::normalize::normalize(&page, None);
        let t0 = SystemTime::UNIX_EPOCH;
        let s = server::interval::sample(Some((&r, t0)), &r, t0 + Duration::from_secs(1));
        for v in [s.requests_waiting, s.requests_running, s.kv_cache_usage, s.ttft.p50, s.ttft.p99, s.queue.mean] {
            assert!(v.is_none_or(f64::is_finite), "{v:?}");
        }
    }
});
