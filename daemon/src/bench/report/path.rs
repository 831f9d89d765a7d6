//! The report's "Routed versus direct" section (`lmperf run --target-kind router` with its
//! workers known): per benchmark, each path's TTFT and E2E p50 and their difference, with the
//! sentence that says what is compared, every value one of `summary.json`'s
//! `benchmarks[].path` ([`crate::bench::direct`]).

use std::fmt::Write as _;

use lmperf_measure::path::PathComparison;

use super::esc;
use crate::bench::Summary;

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.1} ms"))
}

fn cells(h: &mut String, c: &PathComparison) {
    let _ = write!(
        h,
        "<td>{}</td><td>{}</td><td>{}</td>",
        ms(c.routed.p50_ms),
        ms(c.direct.p50_ms),
        c.overhead_ms
            .map_or_else(|| "–".to_owned(), |v| format!("{v:+.1} ms"))
    );
}

/// The section; empty when no benchmark has a `path` block.
pub fn section(summary: &Summary) -> String {
    let mut h = String::new();
    let with: Vec<_> = summary
        .benchmarks
        .iter()
        .filter_map(|b| Some((b.benchmark.as_str(), b.path.as_ref()?)))
        .collect();
    if with.is_empty() {
        return h;
    }
    h.push_str("<h2>Routed versus direct</h2><p>How much the router adds: after each benchmark, the same shape sent straight to the workers behind the router (--direct-workers, else the router's own list), in turn; routed p50 − direct p50. The phases follow each other: a difference the workers' own load explains shows in both.</p>");
    h.push_str("<table><tr><th>benchmark</th><th>workers</th><th>TTFT routed p50</th><th>TTFT direct p50</th><th>TTFT added</th><th>E2E routed p50</th><th>E2E direct p50</th><th>E2E added</th><th>direct requests (failed)</th></tr>");
    for (b, p) in &with {
        let _ = write!(
            h,
            r#"<tr data-benchmark="{b}" data-path-ttft-overhead="{}"><td>{b}</td><td>{}</td>"#,
            p.ttft
                .overhead_ms
                .map_or_else(String::new, |v| format!("{v:.3}")),
            esc(&p.workers.join(" ")),
            b = esc(b),
        );
        cells(&mut h, &p.ttft);
        cells(&mut h, &p.e2e);
        let _ = write!(
            h,
            "<td>{} ({})</td></tr>",
            p.direct_requests, p.direct_errors
        );
    }
    h.push_str("</table>");
    for (b, p) in &with {
        let _ = write!(
            h,
            "<p>{}: {}; {}.</p>",
            esc(b),
            esc(&p.ttft.says),
            esc(&p.e2e.says)
        );
    }
    h
}
