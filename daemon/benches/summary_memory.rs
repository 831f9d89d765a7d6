//! The summary's memory on a long run: `cargo bench -p lmperf --bench summary_memory`.
//!
//! Simulates the aggregation of a 1 h `lmperf run` at 2,000 req/s × 128 output tokens:
//! 7.2 M requests, 921.6 M ITL values, fed one request at a time to the summary's
//! [`Summarizer`] (no network; the rows are made here and dropped after they are fed, as a
//! run that streams `requests.jsonl` does). Prints the process's peak RSS (`VmHWM`) before and
//! after, the histograms' bytes, the time, and the p50 / p99 ITL against the values made, and
//! what the exact percentiles would have kept (8 bytes per value). Arguments: `--seconds S`
//! (default 3600), `--rate R` (2000), `--tokens N` (128).

use std::time::Instant;

use lmperf::bench::RequestRow;
use lmperf::bench::aggregate::{BenchShape, SIGNIFICANT_DIGITS, Summarizer};

/// Peak resident set size of this process, in KiB (`/proc/self/status` `VmHWM`).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (seconds, rate, tokens) = (
        arg("--seconds", 3600.0),
        arg("--rate", 2000.0),
        arg("--tokens", 128.0) as usize,
    );
    let requests = (seconds * rate) as u64;
    let before = peak_rss_kib();
    let mut s = Summarizer::new(Default::default());
    // xorshift: ITL ~ 8 ms ± 50 % with a 1-in-1000 tail of 5×, TTFT ~ 60 ms.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut row = RequestRow {
        outcome: "ok",
        output_tokens: Some(tokens as u64),
        output_tokens_target: tokens as u32,
        prompt_tokens: 512,
        input_tokens: Some(512),
        itl_ms: Vec::with_capacity(tokens),
        ..RequestRow::default()
    };
    let t = Instant::now();
    let mut itl_values = 0u64;
    for i in 0..requests {
        row.index = i as usize;
        row.send_ms = i as f64 * 1000.0 / rate;
        row.ttft_ms = Some(60.0 + 40.0 * rnd());
        row.itl_ms.clear();
        for _ in 1..tokens.max(1) {
            let base = 4.0 + 8.0 * rnd();
            row.itl_ms
                .push(if rnd() < 0.001 { base * 5.0 } else { base });
        }
        let decode: f64 = row.itl_ms.iter().sum();
        row.tpot_ms = Some(decode / (tokens.max(2) - 1) as f64);
        row.e2el_ms = row.ttft_ms.unwrap_or(0.0) + decode;
        row.e2el_from_schedule_ms = row.e2el_ms;
        row.ttft_from_schedule_ms = row.ttft_ms;
        itl_values += row.itl_ms.len() as u64;
        s.push(&row);
    }
    let fed = t.elapsed();
    let summary = s.finish(BenchShape {
        name: "sim",
        concurrency: 4096,
        input_len: 512,
        output_len: Some(tokens as u32),
        request_rate: Some(rate),
    });
    let after = peak_rss_kib();
    let itl = summary.itl_ms.unwrap_or_default();
    println!(
        "summary_memory: {requests} requests ({seconds} s at {rate} req/s), {itl_values} ITL values ({tokens} output tokens each), fed in {:.1} s ({:.1} ns per ITL value)",
        fed.as_secs_f64(),
        fed.as_secs_f64() * 1e9 / itl_values.max(1) as f64
    );
    println!(
        "summary_memory: peak RSS {:.1} MiB (at start {:.1} MiB); histograms {:.1} KiB for 10 distributions at {SIGNIFICANT_DIGITS} significant digits",
        after as f64 / 1024.0,
        before as f64 / 1024.0,
        s.histogram_bytes() as f64 / 1024.0
    );
    println!(
        "summary_memory: exact percentiles would keep {:.2} GiB of ITL values alone (8 bytes each)",
        itl_values as f64 * 8.0 / f64::from(1u32 << 30)
    );
    println!(
        "summary_memory: ITL count {} mean {:.3} ms p50 {:.3} ms p99 {:.3} ms p99.9 {:.3} ms max {:.3} ms; throughput {:.0} tokens/s",
        itl.count, itl.mean, itl.p50, itl.p99, itl.p99_9, itl.max, summary.output_token_throughput
    );
}
