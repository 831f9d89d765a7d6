//! `lmperf compare`'s terminal table: per matched benchmark, the headline metrics of
//! `compare.json` (TTFT, TPOT, ITL, E2EL at p50 and p99, throughput, error rate, and the
//! server's own timing where the runs carried it) with base, new, the relative change, its
//! confidence interval, the rank test's p-value and the verdict; then any other metric with a
//! verdict (every flagged row is shown). A plain function of the
//! [`Comparison`]: no IO.

use std::fmt::Write as _;

use super::compare::{Comparison, MetricDelta, Verdict};

/// The metrics shown, in order; those a benchmark lacks are left out.
const SHOWN: &[&str] = &[
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "tpot_p99",
    "itl_p99",
    "e2el_p99",
    "request_throughput",
    "output_throughput",
    "error_rate",
    "server_request_ttft_p50",
    "server_request_queue_p99",
    "server_request_prefill_p99",
    "client_minus_server_ttft_p50",
];

fn value(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), crate::fmt::number)
}

/// The change as the report shows it: points for a ratio, percent otherwise.
fn change(m: &MetricDelta) -> String {
    if m.unit == "ratio" {
        return m
            .delta
            .map_or_else(|| "–".to_owned(), |d| format!("{:+.1} pt", d * 100.0));
    }
    m.delta_pct
        .map_or_else(|| "–".to_owned(), |p| format!("{p:+.1} %"))
}

fn interval(m: &MetricDelta) -> String {
    match (m.ci_low, m.ci_high) {
        (Some(lo), Some(hi)) => format!("[{}, {}]", crate::fmt::number(lo), crate::fmt::number(hi)),
        _ => "–".to_owned(),
    }
}

fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Regression => "REGRESSION",
        Verdict::Improvement => "improvement",
        Verdict::Unchanged => "unchanged",
    }
}

/// The table, one block per benchmark; empty when nothing was compared.
pub fn table(c: &Comparison) -> String {
    let mut out = String::new();
    for b in &c.benchmarks {
        let _ = writeln!(
            out,
            "{} ({} base / {} new requests; delta CI at {:.0} %)",
            b.benchmark,
            b.base_requests,
            b.new_requests,
            c.confidence * 100.0
        );
        let _ = writeln!(
            out,
            "  {:<34} {:>10} {:>10} {:>9} {:>24} {:>8}  verdict",
            "metric", "base", "new", "change", "delta CI", "p"
        );
        // The headline metrics, then every other metric with a verdict: nothing flagged in
        // compare.json is missing from the table.
        let flagged = b
            .metrics
            .iter()
            .filter(|m| m.verdict != Verdict::Unchanged && !SHOWN.contains(&m.metric.as_str()));
        let shown = SHOWN
            .iter()
            .filter_map(|name| b.metrics.iter().find(|m| m.metric == *name));
        for m in shown.chain(flagged) {
            let _ = writeln!(
                out,
                "  {:<34} {:>10} {:>10} {:>9} {:>24} {:>8}  {}",
                format!("{} ({})", m.metric, m.unit),
                value(m.base),
                value(m.new),
                change(m),
                interval(m),
                m.p_value
                    .map_or_else(|| "–".to_owned(), |p| format!("{p:.3}")),
                match m.too_few_values {
                    Some(n) => format!("{} (too few values: needs {n})", verdict(m.verdict)),
                    None => verdict(m.verdict).to_owned(),
                },
            );
        }
    }
    out
}
