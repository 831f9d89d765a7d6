//! Fuzz target over `StreamMeasurer` (`daemon/crates/measure/`): arbitrary bytes in arbitrary
//! reads. Checks, for every input:
//! - no panic (libFuzzer reports one as a crash);
//! - bounded memory: after each read the parser holds at most the event cap
//!   (`StreamMeasurer::buffered_bytes`), and the record's text is at most 3 × the input (an
//!   invalid UTF-8 byte decodes to the 3-byte U+FFFD; `-rss_limit_mb` in `cargo xtask fuzz`
//!   catches the rest);
//! - chunk-boundary invariance: the input split into fuzzer-chosen reads gives the record of
//!   the input in one read, times aside (`RequestRecord::timeless`);
//! - times are consistent: TTFT ≤ E2E, token chunks in order.
//!
//! Input layout: byte 0 picks the event cap (64 B … 16 KiB, small so that the cap is hit),
//! byte 1 seeds the split points, byte 2 their number (0–63); the rest is the response body.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;

use lmperf_measure as measure;
use measure::{RequestRecord, StreamEnd, StreamMeasurer};

fn measure(body: &[u8], cap: usize, cuts: &[usize]) -> RequestRecord {
    let mut m = StreamMeasurer::new(200, cap).keep_text();
    let mut start = 0;
    let mut reads = 0u64;
    for &c in cuts.iter().chain(std::iter::once(&body.len())) {
        if c <= start {
            continue;
        }
        reads += 1;
        let ok = m.on_bytes(Duration::from_millis(reads), &body[start..c]);
        assert!(
            m.buffered_bytes() <= cap,
            "parser holds {} bytes over the cap {cap}",
            m.buffered_bytes()
        );
        start = c;
        if !ok {
            break;
        }
    }
    m.finish(StreamEnd::Eof, Duration::from_millis(reads + 1))
}

fuzz_target!(|data: &[u8]| {
    let [cap_sel, seed, n_cuts, body @ ..] = data else {
        return;
    };
    let cap = 64 + usize::from(*cap_sel) * 64;
    // xorshift64 from the seed: the split points.
    let mut x = u64::from(*seed) << 32 | 0x9E37_79B9 | body.len() as u64;
    let mut cuts: Vec<usize> = (0..(n_cuts % 64))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (body.len() as u64 + 1)) as usize
        })
        .collect();
    cuts.sort_unstable();

    let whole = measure(body, cap, &[]);
    let split = measure(body, cap, &cuts);
    assert_eq!(
        split.timeless(),
        whole.timeless(),
        "chunk-boundary invariance, cuts {cuts:?}"
    );

    for r in [&whole, &split] {
        // Text is decoded lossily: an invalid byte becomes U+FFFD, 3 bytes.
        let text = r.output_text.as_ref().map_or(0, String::len);
        assert!(
            text <= 3 * body.len(),
            "kept text {text} > input {}",
            body.len()
        );
        assert!(
            r.token_chunk_times.len() <= body.len() / 8 + 1,
            "more token chunks than events fit"
        );
        assert!(
            r.ttft.is_none_or(|t| t <= r.e2e),
            "TTFT {:?} after E2E {:?}",
            r.ttft,
            r.e2e
        );
        assert!(
            r.token_chunk_times.windows(2).all(|w| w[0] <= w[1]),
            "token chunks out of order"
        );
        assert!(r.choices.len() <= measure::MAX_CHOICES);
    }
});
