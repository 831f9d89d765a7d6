//! The `report.html` section of a concurrency ramp (`--ramp-over concurrency`): TTFT and E2EL
//! against the concurrency limit each request was dispatched under (`concurrency_limit` of
//! `requests.jsonl`), so one run shows latency vs concurrency.

use std::collections::BTreeMap;

use super::report::line_chart;
use super::stats::percentile;
use super::workload::RampOver;
use super::{RequestRow, Summary};

/// Per concurrency limit of one benchmark's successful rows: (limit, requests, TTFT p50,
/// TTFT p99, E2EL p50, E2EL p99), milliseconds (linear-interpolated percentiles, as in
/// `summary.json`); TTFT is NaN for a limit whose requests have none.
pub fn by_limit(rows: &[RequestRow], benchmark: &str) -> Vec<(usize, usize, f64, f64, f64, f64)> {
    let mut groups: BTreeMap<usize, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.benchmark == benchmark && r.outcome == "ok") {
        let g = groups.entry(r.concurrency_limit).or_default();
        g.0.extend(r.ttft_ms);
        g.1.push(r.e2el_ms);
    }
    groups
        .into_iter()
        .map(|(limit, (mut ttft, mut e2el))| {
            ttft.sort_by(f64::total_cmp);
            e2el.sort_by(f64::total_cmp);
            let p = |v: &[f64], q| if v.is_empty() { f64::NAN } else { percentile(v, q) };
            (limit, e2el.len(), p(&ttft, 0.5), p(&ttft, 0.99), p(&e2el, 0.5), p(&e2el, 0.99))
        })
        .collect()
}

/// The section: empty unless the run's ramp is over the concurrency.
pub fn section(summary: &Summary, rows: &[RequestRow]) -> String {
    let Some(ramp) = summary.workload.ramp.filter(|r| r.over == RampOver::Concurrency) else { return String::new() };
    let mut h = format!(
        "<h2>Latency vs concurrency (ramp)</h2><p>{:?} concurrency ramp {} → {} over {:.1} s; each request under the limit it was dispatched with.</p>",
        ramp.kind,
        ramp.from,
        ramp.to,
        ramp.duration.as_secs_f64()
    );
    for b in &summary.benchmarks {
        let pts = by_limit(rows, &b.benchmark);
        let series = |name: &str, f: fn(&(usize, usize, f64, f64, f64, f64)) -> f64| (name.to_owned(), pts.iter().map(|p| (p.0 as f64, f(p))).filter(|(_, y)| y.is_finite()).collect::<Vec<_>>());
        let lines = [series("TTFT p50", |p| p.2), series("TTFT p99", |p| p.3), series("E2EL p50", |p| p.4), series("E2EL p99", |p| p.5)];
        h.push_str(&line_chart(&format!("{}: latency vs concurrency limit", b.benchmark), "concurrency limit (requests in flight)", "ms", &lines));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_by_limit() {
        let row = |limit: usize, ttft: Option<f64>, e2el: f64, outcome: &'static str| {
            let mut r = empty_row();
            r.benchmark = "b".into();
            r.concurrency_limit = limit;
            r.ttft_ms = ttft;
            r.e2el_ms = e2el;
            r.outcome = outcome;
            r
        };
        let rows = vec![row(1, Some(10.0), 50.0, "ok"), row(1, Some(20.0), 70.0, "ok"), row(2, None, 90.0, "ok"), row(2, Some(5.0), 1.0, "error"), row(3, Some(30.0), 100.0, "ok")];
        let got = by_limit(&rows, "b");
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].0, got[0].1, got[0].2, got[0].4), (1, 2, 15.0, 60.0));
        assert!((got[0].5 - 69.8).abs() < 1e-9, "p99 of 50, 70: {}", got[0].5);
        assert_eq!((got[1].0, got[1].1, got[1].4), (2, 1, 90.0), "the failed request is left out");
        assert!(got[1].2.is_nan());
        assert!(by_limit(&rows, "other").is_empty());
    }

    fn empty_row() -> RequestRow {
        RequestRow {
            schema_version: 1,
            benchmark: String::new(),
            index: 0,
            repeat: 0,
            concurrency: 1,
            concurrency_limit: 1,
            scheduled_ms: 0.0,
            dispatch_delay_ms: 0.0,
            send_ms: 0.0,
            ttft_ms: None,
            ttft_from_schedule_ms: None,
            time_to_first_content_ms: None,
            itl_ms: Vec::new(),
            tpot_ms: None,
            e2el_ms: 0.0,
            e2el_from_schedule_ms: 0.0,
            prompt_tokens: 0,
            prompt_tokens_target: 0,
            output_tokens_target: 0,
            turn: 0,
            input_tokens: None,
            output_tokens: None,
            usage_source: None,
            finish_reasons: Vec::new(),
            outcome: "ok",
            error_type: None,
            http_status: None,
            retries: 0,
        }
    }
}
