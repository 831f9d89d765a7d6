//! The `report.html` section of a concurrency ramp (`--ramp-over concurrency`): TTFT and E2EL
//! against the concurrency limit each request was dispatched under (`concurrency_limit` of
//! `requests.jsonl`), so one run shows latency vs concurrency.

use std::collections::BTreeMap;

use super::line_chart;
use crate::bench::stats::percentile;
use crate::bench::workload::RampOver;
use crate::bench::{RequestRow, Summary};

/// Latency of the successful requests dispatched under one concurrency limit; percentiles in
/// milliseconds, linear-interpolated as in `summary.json` (TTFT NaN when none has one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitLatency {
    pub limit: usize,
    pub requests: usize,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub e2el_p50_ms: f64,
    pub e2el_p99_ms: f64,
}

/// One benchmark's successful rows grouped by `concurrency_limit`, ascending.
pub fn by_limit(rows: &[RequestRow], benchmark: &str) -> Vec<LimitLatency> {
    let mut groups: BTreeMap<usize, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.benchmark == benchmark && r.outcome == "ok")
    {
        let g = groups.entry(r.concurrency_limit).or_default();
        g.0.extend(r.ttft_ms);
        g.1.push(r.e2el_ms);
    }
    groups
        .into_iter()
        .map(|(limit, (mut ttft, mut e2el))| {
            ttft.sort_by(f64::total_cmp);
            e2el.sort_by(f64::total_cmp);
            let p = |v: &[f64], q| {
                if v.is_empty() {
                    f64::NAN
                } else {
                    percentile(v, q)
                }
            };
            LimitLatency {
                limit,
                requests: e2el.len(),
                ttft_p50_ms: p(&ttft, 0.5),
                ttft_p99_ms: p(&ttft, 0.99),
                e2el_p50_ms: p(&e2el, 0.5),
                e2el_p99_ms: p(&e2el, 0.99),
            }
        })
        .collect()
}

/// The section: empty unless the run's ramp is over the concurrency.
pub fn section(summary: &Summary, rows: &[RequestRow]) -> String {
    let Some(ramp) = summary
        .workload
        .ramp
        .filter(|r| r.over == RampOver::Concurrency)
    else {
        return String::new();
    };
    let mut h = format!(
        "<h2>Latency vs concurrency (ramp)</h2><p>{:?} concurrency ramp {} → {} over {:.1} s; each request under the limit it was dispatched with.</p>",
        ramp.kind,
        ramp.from,
        ramp.to,
        ramp.duration.as_secs_f64()
    );
    for b in &summary.benchmarks {
        let pts = by_limit(rows, &b.benchmark);
        let series = |name: &str, f: fn(&LimitLatency) -> f64| {
            (
                name.to_owned(),
                pts.iter()
                    .map(|p| (p.limit as f64, f(p)))
                    .filter(|(_, y)| y.is_finite())
                    .collect::<Vec<_>>(),
            )
        };
        let lines = [
            series("TTFT p50", |p| p.ttft_p50_ms),
            series("TTFT p99", |p| p.ttft_p99_ms),
            series("E2EL p50", |p| p.e2el_p50_ms),
            series("E2EL p99", |p| p.e2el_p99_ms),
        ];
        h.push_str(&line_chart(
            &format!("{}: latency vs concurrency limit", b.benchmark),
            "concurrency limit (requests in flight)",
            "ms",
            &lines,
        ));
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
        let rows = vec![
            row(1, Some(10.0), 50.0, "ok"),
            row(1, Some(20.0), 70.0, "ok"),
            row(2, None, 90.0, "ok"),
            row(2, Some(5.0), 1.0, "error"),
            row(3, Some(30.0), 100.0, "ok"),
        ];
        let got = by_limit(&rows, "b");
        assert_eq!(got.len(), 3);
        assert_eq!(
            (
                got[0].limit,
                got[0].requests,
                got[0].ttft_p50_ms,
                got[0].e2el_p50_ms
            ),
            (1, 2, 15.0, 60.0)
        );
        assert!(
            (got[0].ttft_p99_ms - 19.9).abs() < 1e-9 && (got[0].e2el_p99_ms - 69.8).abs() < 1e-9,
            "p99 of 10, 20 and of 50, 70: {:?}",
            got[0]
        );
        assert_eq!(
            (got[1].limit, got[1].requests, got[1].e2el_p50_ms),
            (2, 1, 90.0),
            "the failed request is left out"
        );
        assert!(got[1].ttft_p50_ms.is_nan());
        assert_eq!((got[2].limit, got[2].e2el_p99_ms), (3, 100.0));
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
            ..RequestRow::default()
        }
    }
}
