//! `summary.csv` beside `summary.json` (as GuideLLM and AIPerf export): one row per benchmark,
//! the benchmark's scalar fields and each latency distribution's statistics, under stable
//! column names: a scalar field keeps its `summary.json` name (`request_throughput`), a
//! distribution statistic is `FIELD_STAT` (`ttft_ms_p99`, `e2el_ms_p99.9`). The columns are a
//! fixed list, so a benchmark without a figure (no TTFT when nothing completed) has an empty
//! cell, never a missing column. Maps and nested blocks (errors by type, server, repeat) stay
//! in `summary.json` only; the error and OOM rates and the VRAM peak are columns. RFC 4180: comma separated, quoted when a cell needs it, CRLF.

use super::BenchSummary;

/// The benchmark's scalar fields, in column order.
pub const SCALARS: &[&str] = &[
    "benchmark",
    "concurrency",
    "input_len",
    "output_len",
    "request_rate",
    "num_requests",
    "completed",
    "error_rate",
    "oom",
    "oom_rate",
    "duration_s",
    "request_throughput",
    "output_token_throughput",
    "total_input_tokens",
    "total_output_tokens",
    "goodput",
    "output_tokens_short",
    "prompt_tokens_mismatch",
    "warmup_requests",
    "warmup_s",
    "prepare_s",
];

/// The distributions ([`super::stats::Distribution`]), in column order.
pub const DISTRIBUTIONS: &[&str] = &[
    "ttft_ms",
    "ttfo_ms",
    "itl_ms",
    "tpot_ms",
    "e2el_ms",
    "ttft_from_schedule_ms",
    "e2el_from_schedule_ms",
    "dispatch_delay_ms",
    "output_tokens",
    "output_tokens_target",
    "prompt_tokens",
];

/// A distribution's statistics (their `summary.json` names), in column order.
pub const STATS: &[&str] = &[
    "count", "mean", "std", "min", "p50", "p90", "p95", "p99", "p99.9", "max",
];

/// Scalars of the workload blocks (`prefix_cache`, `images`): column name and JSON path; empty
/// cells in a benchmark without the block.
pub const WORKLOAD_SCALARS: &[(&str, &[&str])] = &[
    (
        "prefix_expected_hit_ratio",
        &["prefix_cache", "expected_hit_ratio"],
    ),
    (
        "prefix_server_hit_ratio",
        &["prefix_cache", "server_hit_ratio"],
    ),
    (
        "prefix_ttft_first_ms_p50",
        &["prefix_cache", "ttft_first_ms", "p50"],
    ),
    (
        "prefix_ttft_later_ms_p50",
        &["prefix_cache", "ttft_later_ms", "p50"],
    ),
    ("images", &["images", "images"]),
    ("image_bytes", &["images", "image_bytes"]),
    // The peak GPU memory (empty: not measured, as `summary.json`'s `gpu` says why).
    ("vram_peak_used_bytes", &["vram", "peak_used_bytes"]),
    ("vram_peak_used_pct", &["vram", "peak_used_pct"]),
];

/// The header: [`SCALARS`], then `FIELD_STAT` for each of [`DISTRIBUTIONS`] × [`STATS`], then
/// [`WORKLOAD_SCALARS`].
pub fn columns() -> Vec<String> {
    let mut c: Vec<String> = SCALARS.iter().map(|s| (*s).to_owned()).collect();
    for d in DISTRIBUTIONS {
        c.extend(STATS.iter().map(|s| format!("{d}_{s}")));
    }
    c.extend(WORKLOAD_SCALARS.iter().map(|(n, _)| (*n).to_owned()));
    c
}

/// One cell: numbers as JSON writes them (the same digits as `summary.json`), strings as they
/// are, null empty.
fn cell(v: Option<&serde_json::Value>) -> String {
    match v {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => quote(s),
        Some(v) => quote(&v.to_string()),
    }
}

fn quote(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The CSV text of `benchmarks`: the header and one row each.
///
/// # Errors
/// A benchmark that does not serialize (not expected: plain data).
pub fn render(benchmarks: &[BenchSummary]) -> Result<String, serde_json::Error> {
    let mut out = columns().join(",");
    out.push_str("\r\n");
    for b in benchmarks {
        let v = serde_json::to_value(b)?;
        let mut row: Vec<String> = SCALARS.iter().map(|k| cell(v.get(*k))).collect();
        for d in DISTRIBUTIONS {
            row.extend(
                STATS
                    .iter()
                    .map(|s| cell(v.get(*d).and_then(|x| x.get(*s)))),
            );
        }
        for (_, path) in WORKLOAD_SCALARS {
            row.push(cell(path.iter().try_fold(&v, |x, k| x.get(*k))));
        }
        out.push_str(&row.join(","));
        out.push_str("\r\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scalar field and every distribution of a benchmark has its columns: a field added
    /// to `BenchSummary` must be listed here (or be a map or block, which CSV leaves out).
    #[test]
    fn every_scalar_field_and_distribution_is_a_column() {
        use super::super::{RequestRow, aggregate};
        let mut s = aggregate::Summarizer::new(crate::bench::Goodput::default());
        s.push(&RequestRow {
            outcome: "ok",
            send_ms: 0.0,
            ttft_ms: Some(12.5),
            e2el_ms: 40.0,
            ..RequestRow::default()
        });
        let b = s.finish(aggregate::BenchShape {
            name: "c1_in8",
            concurrency: 1,
            input_len: 8,
            output_len: Some(4),
            request_rate: None,
        });
        let v = serde_json::to_value(&b).unwrap();
        let cols = columns();
        for (k, x) in v.as_object().unwrap() {
            let is_dist = DISTRIBUTIONS.contains(&k.as_str());
            // Blocks that are null in this benchmark (no GPU, server signals or repeats).
            let null_block = ["vram", "server", "repeat"].contains(&k.as_str());
            let scalar = !(x.is_object() || x.is_array() || null_block);
            if scalar && !is_dist {
                assert!(SCALARS.contains(&k.as_str()), "{k} missing from SCALARS");
            }
        }
        let csv = render(&[b]).unwrap();
        let lines: Vec<&str> = csv.split("\r\n").collect();
        assert_eq!(lines[0].split(',').count(), cols.len());
        assert_eq!(lines[1].split(',').count(), cols.len());
        assert!(lines[0].starts_with("benchmark,concurrency,"));
        assert!(lines[0].contains(",ttft_ms_p99,ttft_ms_p99.9,ttft_ms_max,"));
        assert!(lines[1].starts_with("c1_in8,1,8,"));
        let at = |c: &str| {
            lines[1]
                .split(',')
                .nth(cols.iter().position(|x| x == c).unwrap())
        };
        assert_eq!(at("ttft_ms_p99"), Some("12.5"));
        assert_eq!(at("e2el_ms_max"), Some("40.0"));
        // A distribution without values (no TPOT of one token): its cells are empty.
        assert_eq!(at("tpot_ms_p50"), Some(""));
        assert_eq!(quote("a,\"b\""), "\"a,\"\"b\"\"\"");
    }
}
