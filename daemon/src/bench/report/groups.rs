//! The report's "LoRA adapters", "Endpoints", "Workers behind the router" and "Probes under
//! load" sections: one table row
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
}
