//! Chunk-boundary invariance (the property behind cases 16–20 of `../shared/cases`): the same
//! bytes, split at any positions into any number of reads, give the same measurement.
//!
//! For every stream request of every shared SSE case (each frame's `bytes` / `bytes_b64`):
//! - splits *inside* frames, each read stamped with its frame's time: the record equals the
//!   reference (one read per frame) exactly, times included (an event's time is that of the read
//!   that completes it, and that read lies in the same frame);
//! - splits anywhere (reads across frames, stamped 1 ms apart): the record equals the
//!   reference's with the times set aside ([`RequestRecord::timeless`]).
//!
//! `PROPTEST_CASES` sets the number of random splittings per request (default 64).

use std::time::Duration;

use lmperf::config::DEFAULT_MAX_EVENT_BYTES;
use lmperf::measure::{RequestRecord, StreamEnd, StreamMeasurer};
use lmperf_e2e::scripted::case_frames;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// A case request's name and its frames (arrival, bytes).
type Stream = (String, Vec<(Duration, Vec<u8>)>);

/// The stream requests (HTTP 200, no own headers) of every SSE case.
fn streams() -> Vec<Stream> {
    let dir = lmperf_e2e::agent::workspace_root().join("tests/fixtures/cases/sse");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("cases")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let c = lmperf_e2e::case(&format!("sse/{name}"));
        let status = c["http_status"].as_u64().unwrap_or(200);
        let requests = match c["requests"].as_array() {
            Some(r) => r
                .iter()
                .map(|r| {
                    (
                        format!("{name} {}", r["id"].as_str().unwrap_or("?")),
                        r.clone(),
                    )
                })
                .collect(),
            None => vec![(name.clone(), c.clone())],
        };
        for (id, r) in requests {
            if r["frames"].is_null()
                || r["http_status"].as_u64().unwrap_or(status) != 200
                || r["response_headers"].is_object()
            {
                continue;
            }
            out.push((
                id,
                case_frames(&r["frames"])
                    .into_iter()
                    .map(|f| (f.at, f.bytes))
                    .collect(),
            ));
        }
    }
    out
}

fn measure(reads: &[(Duration, &[u8])], end_at: Duration) -> RequestRecord {
    let mut m = StreamMeasurer::new(200, DEFAULT_MAX_EVENT_BYTES).keep_text();
    for (at, b) in reads {
        if !m.on_bytes(*at, b) {
            break;
        }
    }
    m.finish(StreamEnd::Eof, end_at)
}

/// Cut points as fractions in [0, 1), turned into sorted byte offsets of a `len`-byte slice.
fn cuts(fractions: &[f64], len: usize) -> Vec<usize> {
    let mut c: Vec<usize> = fractions
        .iter()
        .map(|f| ((f * len as f64) as usize).min(len))
        .collect();
    c.sort_unstable();
    c.dedup();
    c
}

fn pieces<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
        if c > start {
            out.push(&bytes[start..c]);
            start = c;
        }
    }
    out
}

fn runner() -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

#[test]
fn splits_inside_frames_give_the_same_record_times_included() {
    let all = streams();
    assert!(
        all.len() >= 20,
        "every stream request of the shared cases: {}",
        all.len()
    );
    let mut checked = 0u64;
    for (id, frames) in &all {
        let end = frames.last().map_or(Duration::ZERO, |f| f.0);
        let reference = measure(
            &frames
                .iter()
                .map(|(t, b)| (*t, b.as_slice()))
                .collect::<Vec<_>>(),
            end,
        );
        let strategy =
            proptest::collection::vec(proptest::collection::vec(0.0..1.0f64, 0..12), frames.len());
        runner()
            .run(&strategy, |per_frame| {
                let mut reads = Vec::new();
                for ((t, bytes), fr) in frames.iter().zip(&per_frame) {
                    reads.extend(
                        pieces(bytes, &cuts(fr, bytes.len()))
                            .into_iter()
                            .map(|p| (*t, p)),
                    );
                }
                prop_assert_eq!(&measure(&reads, end), &reference, "{}", id);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        checked += 1;
    }
    eprintln!(
        "chunk invariance (inside frames): {checked} requests x {} random splittings",
        runner().config().cases
    );
}

#[test]
fn splits_anywhere_give_the_same_record_times_aside() {
    let all = streams();
    let mut checked = 0u64;
    for (id, frames) in &all {
        let bytes: Vec<u8> = frames.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let reference = measure(&[(Duration::ZERO, &bytes)], Duration::ZERO).timeless();
        runner()
            .run(&proptest::collection::vec(0.0..1.0f64, 0..64), |fr| {
                let reads: Vec<(Duration, &[u8])> = pieces(&bytes, &cuts(&fr, bytes.len()))
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| (Duration::from_millis(i as u64), p))
                    .collect();
                let end = Duration::from_millis(reads.len() as u64);
                prop_assert_eq!(&measure(&reads, end).timeless(), &reference, "{}", id);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        // Byte by byte, the extreme split.
        let reads: Vec<(Duration, &[u8])> = bytes.chunks(1).map(|p| (Duration::ZERO, p)).collect();
        assert_eq!(
            measure(&reads, Duration::ZERO).timeless(),
            reference,
            "{id}: byte by byte"
        );
        checked += 1;
    }
    eprintln!(
        "chunk invariance (anywhere): {checked} requests x {} random splittings + byte by byte",
        runner().config().cases
    );
}
