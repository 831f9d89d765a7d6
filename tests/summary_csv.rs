//! `summary.csv`: one row per benchmark beside `summary.json`, every cell equal to the
//! `summary.json` value it names (`FIELD` or `DISTRIBUTION_STAT`), under a fixed header.

use std::process::Command;
use std::time::Duration;

use lmperf_e2e::agent::lmperf_bin;
use lmperf_e2e::slot_server::k_slot_server;
use serde_json::Value;

const DISTRIBUTIONS: &[&str] = &[
    "ttft_from_schedule_ms",
    "e2el_from_schedule_ms",
    "dispatch_delay_ms",
    "output_tokens_target",
    "output_tokens",
    "prompt_tokens",
    "ttft_ms",
    "ttfo_ms",
    "itl_ms",
    "tpot_ms",
    "e2el_ms",
];

/// The `summary.json` value a column names in benchmark `b`.
fn value_of<'a>(b: &'a Value, col: &str) -> &'a Value {
    if let Some(v) = b.get(col) {
        return v;
    }
    // The workload blocks' columns (absent blocks: empty cells).
    let nested: &[(&str, &[&str])] = &[
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
        ("vram_peak_used_bytes", &["vram", "peak_used_bytes"]),
        ("vram_peak_used_pct", &["vram", "peak_used_pct"]),
    ];
    if let Some((_, path)) = nested.iter().find(|(c, _)| *c == col) {
        return path
            .iter()
            .try_fold(b, |x, k| x.get(*k))
            .unwrap_or(&Value::Null);
    }
    let d = DISTRIBUTIONS
        .iter()
        .find(|d| col.starts_with(&format!("{d}_")))
        .unwrap_or_else(|| panic!("column {col}: no such field in summary.json"));
    let stat = &col[d.len() + 1..];
    match &b[*d] {
        Value::Null => &Value::Null,
        dist => dist
            .get(stat)
            .unwrap_or_else(|| panic!("column {col}: {d} has no {stat}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_cells_equal_the_summary_json_values() {
    let (url, _) = k_slot_server(2, Duration::from_millis(20)).await;
    let dir = std::env::temp_dir().join(format!("lmperf-summary-csv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.clone();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(lmperf_bin())
            .args(["run", "--output-dir", d.to_str().unwrap()])
            .args(["--target", &url, "--model", "m", "--seq-lengths", "8"])
            .args(["--output-len", "4", "--num-prompts", "12"])
            .args(["--batch-sizes", "1", "3"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await
    .unwrap();
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let csv = std::fs::read_to_string(dir.join("summary.csv")).unwrap();
    let lines: Vec<&str> = csv.split("\r\n").filter(|l| !l.is_empty()).collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let benches = s["benchmarks"].as_array().unwrap();
    assert_eq!(lines.len() - 1, benches.len(), "one row per benchmark");
    assert_eq!(benches.len(), 2);
    for name in [
        "benchmark",
        "completed",
        "error_rate",
        "oom_rate",
        "vram_peak_used_pct",
        "request_throughput",
        "ttft_ms_p99",
        "ttft_ms_p99.9",
        "e2el_ms_p50",
        "itl_ms_mean",
    ] {
        assert!(header.contains(&name), "{name} in {header:?}");
    }
    let mut compared = 0;
    for (line, b) in lines[1..].iter().zip(benches) {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells.len(), header.len(), "{line}");
        for (col, cell) in header.iter().zip(&cells) {
            match value_of(b, col) {
                Value::Null => assert_eq!(*cell, "", "{col}"),
                Value::String(v) => assert_eq!(cell, v, "{col}"),
                Value::Number(n) => {
                    // Parsed as summary.json is (serde_json's own float parser): the same
                    // digits give the same value.
                    let got: f64 =
                        serde_json::from_str(cell).unwrap_or_else(|_| panic!("{col}: {cell}"));
                    assert_eq!(got, n.as_f64().unwrap(), "{col}");
                    compared += 1;
                }
                v => panic!("{col}: not a scalar in summary.json: {v}"),
            }
        }
    }
    // The figures are real: 12 requests each completed, TTFT measured.
    assert_eq!(value_of(&benches[1], "completed"), 12);
    assert!(value_of(&benches[0], "ttft_ms_p99").as_f64().unwrap() > 0.0);
    assert!(compared > 100, "{compared} numeric cells compared");
    let _ = std::fs::remove_dir_all(&dir);
}
