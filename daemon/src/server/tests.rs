//! The recorded server pages of `tests/fixtures/server/` parsed into the vocabulary; every
//! expected value is worked out by hand from the fixture's numbers in the comment beside it
//! (histogram quantiles as PromQL's `histogram_quantile` defines them).

use std::time::{Duration, SystemTime};

use super::interval::{ServerSample, sample};
use super::normalize::{ServerKind, normalize};
use super::parse::parse;

fn pair(name: &str) -> (ServerKind, ServerSample) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/server/");
    let read = |s: &str| {
        std::fs::read_to_string(format!("{dir}{name}.{s}.prom"))
            .unwrap_or_else(|e| panic!("{name}.{s}.prom: {e}"))
    };
    let (text_a, text_b) = (read("a"), read("b"));
    let (a, b) = (parse(&text_a).unwrap(), parse(&text_b).unwrap());
    assert_eq!(
        a.stats.bad_lines + b.stats.bad_lines,
        0,
        "{:?} {:?}",
        a.stats,
        b.stats
    );
    let (ra, rb) = (normalize(&a, None), normalize(&b, None));
    assert_eq!(ra.kind, rb.kind);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_500_000);
    (
        rb.kind,
        sample(Some((&ra, t0)), &rb, t0 + Duration::from_secs(5)),
    )
}

#[track_caller]
fn close(got: Option<f64>, want: f64) {
    let g = got.unwrap_or_else(|| panic!("absent, want {want}"));
    assert!((g - want).abs() < 1e-9, "got {g}, want {want}");
}

fn vllm(name: &str) {
    let (kind, s) = pair(name);
    assert_eq!(kind, ServerKind::Vllm);
    assert_eq!(
        (s.requests_running, s.requests_waiting, s.kv_cache_usage),
        (Some(16.0), Some(9.0), Some(0.87))
    );
    close(s.preemptions_per_s, 1.0); // (12 − 7) preemptions in 5 s
    close(
        s.prefix_cache_hit_ratio,
        (4200.0 - 3000.0) / (14000.0 - 10000.0),
    );
    close(s.prompt_tokens_per_s, (60000.0 - 50000.0) / 5.0);
    close(s.generation_tokens_per_s, (85000.0 - 80000.0) / 5.0);
    // request_success_total summed over finished_reason: (165 + 15) − (90 + 10) = 80.
    close(s.requests_per_s, 80.0 / 5.0);
    // TTFT delta buckets: ≤0.25: 50−40 = 10, ≤0.5: 140−90 = 50, ≤0.75: 70, ≤1: 78, ≤2.5: 80, +Inf 80.
    assert_eq!(s.ttft.count, 80.0);
    close(s.ttft.mean, (60.0 - 30.0) / 80.0);
    // p50: rank 40 falls in (0.25, 0.5] holding 40 from 10: 0.25 + 0.25 × 30/40.
    close(s.ttft.p50, 0.4375);
    // p99: rank 79.2 in (1, 2.5] holding 2 from 78: 1 + 1.5 × 1.2/2.
    close(s.ttft.p99, 1.9);
    // ITL delta: ≤0.025: 4500 − 4000 = 500, ≤0.05: 12500 − 7900 = 4600, +Inf 5000.
    // p50: rank 2500 in (0.025, 0.05] holding 4100 from 500: 0.025 + 0.025 × 2000/4100.
    close(s.itl.p50, 0.025 + 0.025 * 2000.0 / 4100.0);
    // p99: rank 4950 is past every finite bucket (4600): the highest finite bound, 80.
    close(s.itl.p99, 80.0);
    close(s.itl.mean, (330.0 - 180.0) / 5000.0);
    // Queue delta: ≤0.3: 50 … +Inf 80; p50 rank 40 in the first bucket, 0.3 s wide: only
    // "below 0.3 s" is known (an interpolated 0.24 s would be a queue the server may not have).
    assert_eq!((s.queue.p50, s.queue.p50_below), (None, Some(0.3)));
    close(s.queue.mean, 8.0 / 80.0);
    assert_eq!(s.prefill.count, 0.0);
    assert_eq!(
        s.prefill.p50, None,
        "no prefill histogram on the page: absent, not 0"
    );
    assert!(!s.reset);
}

#[test]
fn vllm_new_names() {
    vllm("vllm-new");
}

#[test]
fn vllm_old_names_give_the_same_vocabulary() {
    vllm("vllm-old");
}

#[test]
fn sglang_openmetrics_page() {
    let (kind, s) = pair("sglang");
    assert_eq!(kind, ServerKind::Sglang);
    assert_eq!(
        (
            s.requests_running,
            s.requests_waiting,
            s.kv_cache_usage,
            s.prefix_cache_hit_ratio
        ),
        (Some(64.0), Some(21.0), Some(0.97), Some(0.5))
    );
    close(s.preemptions_per_s, 3.0 / 5.0);
    close(s.prompt_tokens_per_s, 5000.0 / 5.0);
    close(s.generation_tokens_per_s, 2500.0 / 5.0);
    close(s.requests_per_s, 20.0 / 5.0);
    // TTFT delta: ≤0.1: 0, ≤0.2: 0, ≤0.4: 2, ≤0.8: 14, +Inf 20; sum 10 − 1.2.
    close(s.ttft.mean, 8.8 / 20.0);
    // p50: rank 10 in (0.4, 0.8] holding 12 from 2: 0.4 + 0.4 × 8/12.
    close(s.ttft.p50, 0.4 + 0.4 * 8.0 / 12.0);
    close(s.ttft.p99, 0.8);
    // Queue delta: ≤0: 0, ≤0.1: 5, ≤0.5: 16, +Inf 20. p50: rank 10 in (0.1, 0.5] holding 11 from 5.
    close(s.queue.p50, 0.1 + 0.4 * 5.0 / 11.0);
    close(s.queue.mean, 5.6 / 20.0);
}

#[test]
fn tgi_page() {
    let (kind, s) = pair("tgi");
    assert_eq!(kind, ServerKind::Tgi);
    assert_eq!(
        (s.requests_running, s.requests_waiting, s.kv_cache_usage),
        (Some(32.0), Some(17.0), None)
    );
    // Token rates from the input/generated length histograms' sums.
    close(s.prompt_tokens_per_s, (71680.0 - 51200.0) / 5.0);
    close(s.generation_tokens_per_s, (35840.0 - 25600.0) / 5.0);
    close(s.requests_per_s, 40.0 / 5.0);
    // Queue delta: ≤0.01: 0, ≤0.1: 10, ≤1: 30, +Inf 40. p50: rank 20 in (0.1, 1] holding 20 from 10.
    close(s.queue.p50, 0.1 + 0.9 * 10.0 / 20.0);
    close(s.queue.mean, 17.0 / 40.0);
    // Prefill (method="prefill") delta: 0, 10, 20, 25. p50: rank 12.5 in (0.1, 1] holding 10 from 10.
    close(s.prefill.p50, 0.1 + 0.9 * 2.5 / 10.0);
    // Decode delta: 200, 400, 500, 500. p99: rank 495 in (0.1, 1] holding 100 from 400.
    close(s.decode.p99, 0.1 + 0.9 * 95.0 / 100.0);
    close(s.decode.p50, 0.01 + 0.09 * 50.0 / 200.0);
    assert_eq!(s.preemptions_per_s, None);
}

#[test]
fn llamacpp_page() {
    let (kind, s) = pair("llamacpp");
    assert_eq!(kind, ServerKind::LlamaCpp);
    assert_eq!(
        (s.requests_running, s.requests_waiting, s.kv_cache_usage),
        (Some(2.0), Some(5.0), None)
    );
    close(s.prompt_tokens_per_s, 600.0 / 5.0);
    close(s.generation_tokens_per_s, 300.0 / 5.0);
    // Cached Δ300 of queried Δ(300 cached + 600 processed).
    close(s.prefix_cache_hit_ratio, 300.0 / 900.0);
    assert_eq!((s.requests_per_s, s.ttft.p50), (None, None));
}

#[test]
fn restart_between_scrapes_is_a_reset_with_the_new_values_as_increase() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/server/");
    let a = normalize(
        &parse(&std::fs::read_to_string(format!("{dir}vllm-new.a.prom")).unwrap()).unwrap(),
        None,
    );
    let b = normalize(
        &parse(&std::fs::read_to_string(format!("{dir}vllm-new.b.prom")).unwrap()).unwrap(),
        None,
    );
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_500_000);
    // b then a: every counter went down, so the server restarted and counted a's values since.
    let s = sample(Some((&b, t0)), &a, t0 + Duration::from_secs(10));
    assert!(s.reset);
    close(s.preemptions_per_s, 7.0 / 10.0);
    close(s.prompt_tokens_per_s, 50000.0 / 10.0);
    // The TTFT histogram is a's whole: 100 observations, p50 rank 50 in (0.25, 0.5] holding 50 from 40.
    assert_eq!(s.ttft.count, 100.0);
    close(s.ttft.p50, 0.25 + 0.25 * 10.0 / 50.0);
}

/// A short, deterministic stand-in for the fuzz target (`daemon/fuzz`) that runs in CI:
/// mutated fixture pages never make the parser or the normalization panic.
#[test]
fn mutated_pages_never_panic() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/server/");
    let seed_page = std::fs::read(format!("{dir}sglang.b.prom")).unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let alphabet = b"{}\",=# \n\\eE+-.0123456789NaInf_:le";
    for _ in 0..3000 {
        let mut page = seed_page.clone();
        for _ in 0..(next() % 16 + 1) {
            let at = (next() % page.len() as u64) as usize;
            match next() % 3 {
                0 => page[at] = alphabet[(next() % alphabet.len() as u64) as usize],
                1 => {
                    page.remove(at);
                }
                _ => page.insert(at, alphabet[(next() % alphabet.len() as u64) as usize]),
            }
        }
        let text = String::from_utf8_lossy(&page);
        if let Ok(p) = parse(&text) {
            let r = normalize(&p, None);
            // The scraper's filtered parse reads the same (Debug: NaN sums), counts the same.
            let kept = super::parse::parse_with(&text, super::normalize::reads).unwrap();
            assert_eq!(format!("{r:?}"), format!("{:?}", normalize(&kept, None)));
            assert_eq!(
                (p.stats.bad_lines, p.stats.non_finite, p.sample_lines),
                (
                    kept.stats.bad_lines,
                    kept.stats.non_finite,
                    kept.sample_lines
                )
            );
            let t0 = SystemTime::UNIX_EPOCH;
            let s = sample(Some((&r, t0)), &r, t0 + Duration::from_secs(1));
            for v in [
                s.requests_waiting,
                s.kv_cache_usage,
                s.ttft.p50,
                s.ttft.p99,
                s.queue.mean,
            ] {
                assert!(v.is_none_or(f64::is_finite), "{v:?}");
            }
        }
    }
}
