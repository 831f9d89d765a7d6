//! The report's "LoRA adapters", "Endpoints", "Workers behind the router" (then "Routed versus
//! direct", [`super::path`]) and "Probes under load" sections: one table row
//! per benchmark and group, every value one of `summary.json`'s `adapters`, `endpoints` and
//! `probes` blocks ([`crate::bench::groups`]), with a bar chart of TTFT p99 per adapter and
//! endpoint.

use std::fmt::Write as _;

use crate::bench::Summary;
use crate::bench::groups::GroupSummary;

/// The four sections; empty when no benchmark has such a block.
pub fn sections(summary: &Summary) -> String {
    let mut h = String::new();
    let adapters = rows(summary, |b| b.adapters.as_ref());
    table(
        &mut h,
        "LoRA adapters",
        "adapter",
        "Requests spread over the adapters (--lora-modules); each request named its adapter as the model.",
        &adapters,
    );
    let endpoints = rows(summary, |b| b.endpoints.as_ref());
    table(
        &mut h,
        "Endpoints",
        "endpoint",
        "One schedule spread over the endpoints (--target given more than once).",
        &endpoints,
    );
    let workers = rows(summary, |b| b.workers.as_ref());
    table(
        &mut h,
        "Workers behind the router",
        "worker",
        "The worker the router said served each request (--target-kind router: Dynamo's nvext worker ids, llm-d's session tokens; PREFILL→DECODE for a disaggregated request; unattributed where the router named none). The rows sum to the benchmark.",
        &workers,
    );
    split_section(&mut h, &workers);
    h.push_str(&super::path::section(summary));
    let probes: Vec<(&str, &str, &GroupSummary)> = summary
        .benchmarks
        .iter()
        .filter_map(|b| {
            b.probes
                .as_ref()
                .map(|p| (b.benchmark.as_str(), "probes", p))
        })
        .collect();
    table(
        &mut h,
        "Probes under load",
        "group",
        "The agent's small fixed-shape canary sent alongside each benchmark's load (--probe-rate), measured apart from it: what a small interactive request experiences while the server is loaded.",
        &probes,
    );
    h
}

/// Each benchmark's groups of one kind, as (benchmark, group, figures).
fn rows<'a>(
    summary: &'a Summary,
    groups: impl Fn(
        &'a crate::bench::BenchSummary,
    ) -> Option<&'a std::collections::BTreeMap<String, GroupSummary>>,
) -> Vec<(&'a str, &'a str, &'a GroupSummary)> {
    summary
        .benchmarks
        .iter()
        .flat_map(|b| {
            groups(b)
                .into_iter()
                .flatten()
                .map(move |(k, g)| (b.benchmark.as_str(), k.as_str(), g))
        })
        .collect()
}

fn table(h: &mut String, title: &str, key: &str, note: &str, rows: &[(&str, &str, &GroupSummary)]) {
    if rows.is_empty() {
        return;
    }
    let esc = super::esc;
    let _ = write!(
        h,
        r#"<h2>{title}</h2><p>{note}</p><table class="groups" data-group="{key}"><tr><th>benchmark</th><th>{key}</th><th>requests</th><th>ok</th><th>errors</th><th>req/s</th><th>TTFT p50 (ms)</th><th>TTFT p99 (ms)</th><th>ITL p50 (ms)</th><th>ITL p99 (ms)</th><th>E2EL p50 (ms)</th><th>E2EL p99 (ms)</th><th>goodput ratio</th></tr>"#,
        note = esc(note)
    );
    let f = |v: Option<f64>| v.map_or("–".to_owned(), crate::fmt::number);
    for (bench, name, g) in rows {
        let d = |m: &str, s: &str| g.value(m, Some(s));
        let _ = write!(
            h,
            r#"<tr data-benchmark="{b}" data-{key}="{n}" data-requests="{}" data-ttft-p99="{}" data-e2el-p99="{}"><td>{b}</td><td>{n}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            g.num_requests,
            d("ttft", "p99").map_or(String::new(), |v| v.to_string()),
            d("e2el", "p99").map_or(String::new(), |v| v.to_string()),
            g.num_requests,
            g.completed,
            g.num_requests - g.completed,
            f(Some(g.request_throughput)),
            f(d("ttft", "p50")),
            f(d("ttft", "p99")),
            f(d("itl", "p50")),
            f(d("itl", "p99")),
            f(d("e2el", "p50")),
            f(d("e2el", "p99")),
            f(g.goodput_ratio),
            b = esc(bench),
            n = esc(name),
        );
    }
    h.push_str("</table>");
    if key != "group" {
        let bars: Vec<(String, Vec<(f64, f64)>)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, (bench, name, g))| {
                g.value("ttft", Some("p99"))
                    .map(|v| (format!("{bench} {name}"), vec![(i as f64, v)]))
            })
            .collect();
        if !bars.is_empty() {
            h.push_str(&super::line_chart(
                &format!("TTFT p99 per {key}"),
                "row of the table",
                "ms",
                &bars,
            ));
        }
    }
}

/// "TTFT along the serving path": per benchmark and worker (pair) whose requests carried
/// Dynamo's timing, the p50 of each segment as one stacked bar (widths ∝ ms) and the p50 /
/// p99 figures beside it. Nothing when no worker has a split.
fn split_section(h: &mut String, rows: &[(&str, &str, &GroupSummary)]) {
    let with: Vec<_> = rows
        .iter()
        .filter_map(|(b, w, g)| g.ttft_split.as_ref().map(|s| (*b, *w, s)))
        .collect();
    if with.is_empty() {
        return;
    }
    let esc = super::esc;
    const NAMES: [&str; 4] = [
        "frontend",
        "router queue",
        "prefill",
        "transfer and first decode",
    ];
    const COLORS: [&str; 4] = ["#9aa5b1", "#e0a030", "#3a7bd5", "#c0504d"];
    h.push_str(r#"<h2>TTFT along the serving path</h2><p>Each request's TTFT on NVIDIA Dynamo's own clock (<code>nvext.timing</code>), split into segments that add up to the client's TTFT: frontend (what the frontend's clock did not see: network, HTTP, tokenization), router queue (received → prefill start), prefill, transfer and first decode (the rest up to the first token: the KV transfer under prefill/decode disaggregation). Bars: each segment's p50, ms; figures p50 / p99.</p><table class="ttft-split"><tr><th>benchmark</th><th>worker</th><th>requests</th><th>p50 split</th>"#);
    for n in NAMES {
        let _ = write!(h, "<th>{n}</th>");
    }
    h.push_str("</tr>");
    let ms = |d: Option<&crate::bench::stats::Distribution>,
              f: fn(&crate::bench::stats::Distribution) -> f64| {
        d.map_or("–".to_owned(), |d| crate::fmt::number(f(d)))
    };
    for (bench, worker, split) in with {
        let segs = split.segments();
        let p50: Vec<f64> = segs
            .iter()
            .map(|d| d.map_or(0.0, |d| d.p50.max(0.0)))
            .collect();
        let total = p50.iter().sum::<f64>().max(1e-9);
        let mut bar =
            String::from(r#"<div class="split-bar" style="display:flex;width:240px;height:12px">"#);
        for ((v, c), n) in p50.iter().zip(COLORS).zip(NAMES) {
            let _ = write!(
                bar,
                r#"<span title="{n} {v:.2} ms" style="width:{:.1}%;background:{c}"></span>"#,
                v / total * 100.0
            );
        }
        bar.push_str("</div>");
        let _ = write!(
            h,
            r#"<tr data-benchmark="{b}" data-worker="{w}" data-split-requests="{}"><td>{b}</td><td>{w}</td><td>{}</td><td>{bar}</td>"#,
            split.requests,
            split.requests,
            b = esc(bench),
            w = esc(worker),
        );
        for d in segs {
            let _ = write!(h, "<td>{} / {}</td>", ms(d, |d| d.p50), ms(d, |d| d.p99));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::groups::GroupAcc;
    use crate::bench::{Goodput, RequestRow};

    #[test]
    fn a_row_per_benchmark_and_adapter_with_its_values() {
        let mut acc = GroupAcc::default();
        for ttft in [100.0, 300.0] {
            acc.push(
                &RequestRow {
                    outcome: "ok",
                    ttft_ms: Some(ttft),
                    e2el_ms: 400.0,
                    ..RequestRow::default()
                },
                Goodput::default(),
            );
        }
        let g = acc.finish(Goodput::default());
        let rows = [("c1_in8", "slow", &g)];
        let mut h = String::new();
        table(&mut h, "LoRA adapters", "adapter", "n", &rows);
        assert!(
            h.contains(
                r#"data-benchmark="c1_in8" data-adapter="slow" data-requests="2" data-ttft-p99="29"#
            ),
            "{h}"
        );
        assert!(h.contains(r#"data-e2el-p99="400""#), "{h}");
        assert!(h.contains("<h2>LoRA adapters</h2>"), "{h}");
        let mut none = String::new();
        table(&mut none, "Endpoints", "endpoint", "n", &[]);
        assert!(none.is_empty());
    }

    /// A worker pair's requests with Dynamo's split: one row, its bar's widths the p50
    /// segments' shares; a worker without a split has no row.
    #[test]
    fn the_ttft_split_per_worker_pair() {
        let mut acc = GroupAcc::default();
        for k in 0..4 {
            acc.push(
                &RequestRow {
                    outcome: "ok",
                    ttft_ms: Some(50.0),
                    e2el_ms: 90.0,
                    ttft_frontend_ms: Some(10.0),
                    ttft_router_queue_ms: Some(5.0),
                    ttft_prefill_ms: Some(25.0 + f64::from(k)),
                    ttft_transfer_and_first_decode_ms: Some(10.0 - f64::from(k)),
                    ..RequestRow::default()
                },
                Goodput::default(),
            );
        }
        let g = acc.finish(Goodput::default());
        assert_eq!(g.ttft_split.as_ref().map(|s| s.requests), Some(4));
        let plain = GroupAcc::default().finish(Goodput::default());
        let mut h = String::new();
        split_section(&mut h, &[("c1_in16", "7→9", &g), ("c1_in16", "8", &plain)]);
        assert!(h.contains("<h2>TTFT along the serving path</h2>"), "{h}");
        assert_eq!(h.matches("data-split-requests=").count(), 1, "{h}");
        assert!(
            h.contains(r#"data-worker="7→9" data-split-requests="4""#)
                && h.contains(r#"title="frontend 10.00 ms" style="width:20.0%"#),
            "{h}"
        );
        let mut none = String::new();
        split_section(&mut none, &[("c1_in16", "8", &plain)]);
        assert!(none.is_empty());
    }
}
