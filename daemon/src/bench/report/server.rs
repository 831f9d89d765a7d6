//! The report's "Model server" section, drawn from the `server` blocks of `summary.json`
//! (`bench/server.rs` makes them).

use std::fmt::Write as _;

use crate::bench::Summary;
use crate::bench::server::{ServerBlock, ServerPoint};

/// The report's "Model server" section: per benchmark, the server's queue depth and running
/// requests, and its KV-cache usage, over time (drawn beside the client's TTFT over time), and
/// a table of the `server` blocks. Empty when no benchmark has a block.
pub fn section(summary: &Summary) -> String {
    let with: Vec<(&str, &ServerBlock)> = summary
        .benchmarks
        .iter()
        .filter_map(|b| b.server.as_ref().map(|s| (b.benchmark.as_str(), s)))
        .collect();
    let Some((_, first)) = with.first() else {
        return String::new();
    };
    let esc = super::esc;
    let mut h = String::new();
    let _ = write!(
        h,
        "<h2>Model server</h2><p>{} {} · model <code>{}</code>, read every second during each benchmark</p>",
        first.kind,
        esc(first.version.as_deref().unwrap_or("")),
        esc(first.model.as_deref().unwrap_or("?"))
    );
    let series =
        |f: fn(&ServerPoint) -> Option<f64>, suffix: &str| -> Vec<(String, Vec<(f64, f64)>)> {
            with.iter()
                .map(|(name, s)| {
                    (
                        format!("{name}{suffix}"),
                        s.timeline
                            .iter()
                            .filter_map(|p| f(p).map(|v| (p.t_s, v)))
                            .collect(),
                    )
                })
                .collect()
        };
    let mut queue = series(|p| p.waiting, " waiting");
    queue.extend(series(|p| p.running, " running"));
    h.push_str(&super::line_chart(
        "Server queue over time",
        "seconds from the benchmark's start",
        "requests",
        &queue,
    ));
    if with.iter().any(|(_, s)| s.kv_usage_max.is_some()) {
        h.push_str(&super::line_chart(
            "Server KV cache usage over time",
            "seconds from the benchmark's start",
            "share of the KV cache",
            &series(|p| p.kv_usage, ""),
        ));
    }
    h.push_str(r#"<table class="server"><tr><th>benchmark</th><th>waiting mean</th><th>waiting max</th><th>running mean</th><th>running max</th><th>KV max</th><th>preemptions</th><th>prefix hit</th><th>server TTFT p50 (s)</th><th>p99 (s)</th><th>queue p50 (s)</th><th>p99 (s)</th></tr>"#);
    let f = |v: Option<f64>| v.map_or("–".to_owned(), crate::fmt::number);
    // A quantile in a wide first bucket: "below" its bound, never an interpolated guess.
    let q = |v: Option<f64>, below: Option<f64>| match below {
        Some(b) => format!("&lt; {}", crate::fmt::number(b)),
        None => f(v),
    };
    for (name, s) in &with {
        let _ = write!(
            h,
            r#"<tr data-benchmark="{}" data-waiting-max="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            esc(name),
            s.waiting_max.map_or(String::new(), |v| v.to_string()),
            esc(name),
            f(s.waiting_mean),
            f(s.waiting_max),
            f(s.running_mean),
            f(s.running_max),
            f(s.kv_usage_max),
            f(s.preemptions),
            f(s.prefix_hit_ratio),
            q(s.ttft_s.p50, s.ttft_s.p50_below),
            q(s.ttft_s.p99, s.ttft_s.p99_below),
            q(s.queue_s.p50, s.queue_s.p50_below),
            q(s.queue_s.p99, s.queue_s.p99_below),
        );
    }
    h.push_str("</table><p>Server-side latencies in seconds, from the server's histograms over each benchmark.</p>");
    h
}
