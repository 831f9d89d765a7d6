//! `report.html`'s capacity section of `--find-max-rate`: latency and achieved rate vs the
//! offered rate, with the SLO limits, the max rate and the knee marked.

use std::fmt::Write as _;

use super::{esc, line_chart};
use crate::bench::Summary;

/// The section; empty without a capacity search.
pub(in crate::bench) fn section(summary: &Summary) -> String {
    let Some(c) = &summary.capacity else {
        return String::new();
    };
    let mut h = String::new();
    let r = |v: Option<f64>| v.map_or("none".to_owned(), |v| super::fmt::rate(v, "req/s"));
    let _ = write!(
        h,
        "<h2>Capacity search</h2><p>Max rate with every SLO held: <b data-max-rate=\"{}\">{}</b> (first failing: {}); knee (queueing starts): <b data-knee-rate=\"{}\">{}</b> {}; {} requests per step; stopped: {}.</p><p>{}</p>",
        c.max_rate.map_or(String::new(), |v| v.to_string()),
        r(c.max_rate),
        r(c.failing_rate),
        c.knee_rate.map_or(String::new(), |v| v.to_string()),
        r(c.knee_rate),
        esc(&c.knee_reasons.join(", ")),
        c.step_requests,
        c.stopped,
        esc(&c.step_rule)
    );
    let mut steps: Vec<_> = c.steps.iter().collect();
    steps.sort_by(|a, b| a.offered_rate.total_cmp(&b.offered_rate));
    let (lo, hi) = (
        steps.first().map_or(0.0, |s| s.offered_rate),
        steps.last().map_or(1.0, |s| s.offered_rate),
    );
    // Vertical markers: two points at one x, from 0 to the chart's top.
    let vertical = |name: &str, x: Option<f64>, top: f64| {
        x.map(|x| (name.to_owned(), vec![(x, 0.0), (x, top)]))
    };
    let rate_top = steps
        .iter()
        .map(|s| s.offered_rate.max(s.achieved_rate))
        .fold(0.0, f64::max);
    let mut rate: Vec<(String, Vec<(f64, f64)>)> = vec![
        (
            "achieved".into(),
            steps
                .iter()
                .map(|s| (s.offered_rate, s.achieved_rate))
                .collect(),
        ),
        ("offered".into(), vec![(lo, lo), (hi, hi)]),
    ];
    rate.extend(vertical("max rate", c.max_rate, rate_top));
    rate.extend(vertical("knee", c.knee_rate, rate_top));
    h.push_str(&line_chart(
        "Achieved vs offered rate",
        "offered req/s",
        "achieved req/s",
        &rate,
    ));
    for (i, slo) in c.slos.iter().enumerate() {
        let pts: Vec<(f64, f64)> = steps
            .iter()
            .filter_map(|s| {
                s.slos
                    .get(i)
                    .and_then(|k| k.value_ms)
                    .map(|v| (s.offered_rate, v))
            })
            .collect();
        let bound: Vec<(f64, f64)> = steps
            .iter()
            .filter_map(|s| {
                s.slos
                    .get(i)
                    .and_then(|k| k.upper_bound_ms)
                    .map(|v| (s.offered_rate, v))
            })
            .collect();
        let top = bound.iter().map(|p| p.1).fold(slo.limit_ms, f64::max);
        let mut series = vec![
            (slo.text.clone(), pts),
            ("95 % upper bound".into(), bound),
            (
                "SLO limit".into(),
                vec![(lo, slo.limit_ms), (hi, slo.limit_ms)],
            ),
        ];
        series.extend(vertical("max rate", c.max_rate, top));
        series.extend(vertical("knee", c.knee_rate, top));
        h.push_str(&line_chart(
            &format!("{} vs offered rate", slo.text),
            "offered req/s",
            "ms",
            &series,
        ));
    }
    h.push_str("<table><tr><th>offered req/s</th><th>achieved req/s</th><th>requests</th><th>failed</th><th>SLOs (value / bound ms)</th><th>verdict</th><th>queueing</th></tr>");
    for s in &steps {
        let checks: Vec<String> = s
            .slos
            .iter()
            .map(crate::bench::capacity::SloCheck::brief)
            .collect();
        let _ = write!(
            h,
            "<tr><td title=\"{}\">{}</td><td title=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            s.offered_rate,
            super::fmt::number(s.offered_rate),
            s.achieved_rate,
            super::fmt::number(s.achieved_rate),
            s.requests,
            s.failed,
            esc(&checks.join("; ")),
            if s.passed { "pass" } else { "fail" },
            esc(&s.queueing.join(", "))
        );
    }
    h.push_str("</table>");
    h
}
