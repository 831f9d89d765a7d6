//! The paragraph at the top of `report.html`: the run in words (requests and errors, fastest
//! and slowest benchmarks, top throughput, SLO verdicts, gates), every number from
//! `summary.json` and marked with the field it shows.

use std::fmt::Write as _;

use super::{Pick, esc, field};
use crate::bench::stats::Distribution;
use crate::bench::{BenchSummary, Summary};
use crate::fmt::{TimeUnit, count, number};

/// A time of one benchmark in its own unit (`16.6 ms`), marked with its summary.json field.
fn time(
    b: &BenchSummary,
    path: &str,
    d: &Option<Distribution>,
    get: fn(&Distribution) -> f64,
) -> String {
    let v = d.as_ref().map(get);
    let u = TimeUnit::of_ms(v.unwrap_or(0.0));
    let shown = v.map_or_else(
        || "–".to_owned(),
        |v| format!("{} {}", u.show(v), u.symbol()),
    );
    field("span", Some(&b.benchmark), path, v, u.symbol(), &shown)
}

fn name(b: &BenchSummary) -> String {
    format!("<b>{}</b>", esc(&b.benchmark))
}

/// `, none failed. ` or how many failed, why (the server's own reason per status and type,
/// its first message, all benchmarks) and how many of them for memory.
fn failures(bs: &[BenchSummary], failed: usize) -> String {
    if failed == 0 {
        return ", none failed. ".to_owned();
    }
    let types: Vec<String> = bs
        .iter()
        .flat_map(super::super::BenchSummary::error_reasons)
        .map(|r| esc(&r))
        .collect();
    let oom: usize = bs.iter().map(|b| b.oom).sum();
    let memory = if oom == 0 {
        String::new()
    } else {
        format!(
            r#"; <b style="color:#b00">{}</b> of them for memory (CUDA or KV cache out of memory: <code>oom</code>)"#,
            count(oom as u64)
        )
    };
    format!(
        r#", <b style="color:#b00">{} failed</b> ({}){memory}. "#,
        count(failed as u64),
        types.join(", ")
    )
}

/// The paragraph (`<p id="overview">`).
pub fn paragraph(summary: &Summary) -> String {
    let bs = &summary.benchmarks;
    let mut h = String::from(r#"<p id="overview">"#);
    let requests: usize = bs.iter().map(|b| b.num_requests).sum();
    let failed: usize = bs
        .iter()
        .map(|b| b.num_requests.saturating_sub(b.completed))
        .sum();
    let what = if bs.len() == 1 {
        "1 benchmark".to_owned()
    } else {
        format!("{} benchmarks", bs.len())
    };
    let _ = write!(h, "{what}, {} requests", count(requests as u64));
    h.push_str(&failures(bs, failed));
    let with_e2el: Vec<&BenchSummary> = bs.iter().filter(|b| b.e2el_ms.is_some()).collect();
    let by_e2el = |b: &&BenchSummary| b.e2el_ms.as_ref().map_or(f64::NAN, |d| d.p50);
    match with_e2el[..] {
        [] => {}
        [b] => {
            let _ = write!(
                h,
                "{}: TTFT p50 {}, p99 {}; E2EL p50 {}, p99 {}. ",
                name(b),
                time(b, "ttft_ms/p50", &b.ttft_ms, |d| d.p50),
                time(b, "ttft_ms/p99", &b.ttft_ms, |d| d.p99),
                time(b, "e2el_ms/p50", &b.e2el_ms, |d| d.p50),
                time(b, "e2el_ms/p99", &b.e2el_ms, |d| d.p99)
            );
        }
        _ => {
            let fastest = with_e2el
                .iter()
                .min_by(|a, b| by_e2el(a).total_cmp(&by_e2el(b)));
            let slowest = with_e2el
                .iter()
                .max_by(|a, b| by_e2el(a).total_cmp(&by_e2el(b)));
            if let (Some(f), Some(s)) = (fastest, slowest) {
                let _ = write!(
                    h,
                    "Fastest: {} (E2EL p50 {}, TTFT p50 {}); slowest: {} (E2EL p50 {}, TTFT p50 {}). ",
                    name(f),
                    time(f, "e2el_ms/p50", &f.e2el_ms, |d| d.p50),
                    time(f, "ttft_ms/p50", &f.ttft_ms, |d| d.p50),
                    name(s),
                    time(s, "e2el_ms/p50", &s.e2el_ms, |d| d.p50),
                    time(s, "ttft_ms/p50", &s.ttft_ms, |d| d.p50)
                );
            }
        }
    }
    // A capacity search: its answer, not the step that ran fastest (which may have failed).
    if let Some(c) = &summary.capacity {
        h.push_str(&esc(&capacity_sentence(c)));
        h.push(' ');
    } else if let Some(top) = bs.iter().filter(|b| b.completed > 0).max_by(|a, b| {
        a.output_token_throughput
            .total_cmp(&b.output_token_throughput)
    }) {
        let _ = write!(
            h,
            "{}: {} output tok/s at {} req/s. ",
            if bs.len() > 1 {
                format!("Highest throughput, {}", name(top))
            } else {
                "Throughput".to_owned()
            },
            field(
                "span",
                Some(&top.benchmark),
                "output_token_throughput",
                Some(top.output_token_throughput),
                "tok/s",
                &number(top.output_token_throughput)
            ),
            field(
                "span",
                Some(&top.benchmark),
                "request_throughput",
                Some(top.request_throughput),
                "req/s",
                &number(top.request_throughput)
            ),
        );
    }
    let slo = summary.goodput_slo;
    let slos: Vec<(&str, f64, Pick)> = [
        ("TTFT", slo.ttft_ms, (|b: &BenchSummary| &b.ttft_ms) as Pick),
        ("TPOT", slo.tpot_ms, |b| &b.tpot_ms),
        ("E2EL", slo.e2el_ms, |b| &b.e2el_ms),
    ]
    .into_iter()
    .filter_map(|(n, l, f)| l.map(|l| (n, l, f)))
    .collect();
    if slos.is_empty() && summary.capacity.as_ref().is_none_or(|c| c.slos.is_empty()) {
        h.push_str("No SLO given. ");
    }
    for (n, limit, get) in slos {
        let missed: Vec<&str> = bs
            .iter()
            .filter(|b| get(b).as_ref().is_none_or(|d| d.p99 > limit))
            .map(|b| b.benchmark.as_str())
            .collect();
        let limit_shown = super::fmt::limit_ms(limit);
        if missed.is_empty() {
            let _ = write!(
                h,
                r#"<span class="slo-verdict" data-pass="true">SLO {n} p99 ≤ {limit_shown}: met by {}.</span> "#,
                if bs.len() == 1 {
                    "it".to_owned()
                } else {
                    format!("all {}", bs.len())
                }
            );
        } else {
            let _ = write!(
                h,
                r#"<span class="slo-verdict" data-pass="false" style="color:#b00">SLO {n} p99 ≤ {limit_shown}: missed by {} of {} ({}).</span> "#,
                missed.len(),
                bs.len(),
                esc(&missed.join(", "))
            );
        }
    }
    if !summary.failed_gates.is_empty() {
        let _ = write!(
            h,
            r#"<b style="color:#b00">Gates tripped: {}.</b> "#,
            esc(&summary.failed_gates.join(", "))
        );
    }
    if summary.interrupted {
        h.push_str("<b>Interrupted:</b> only the benchmarks that completed are shown. ");
    }
    h.push_str("</p>");
    h
}

/// The capacity search in words: the highest offered rate meeting every SLO, the first that
/// broke one, and the knee (where queueing started).
pub fn capacity_sentence(c: &crate::bench::capacity::Capacity) -> String {
    use crate::fmt::rate;
    let slos: Vec<&str> = c.slos.iter().map(|s| s.text.as_str()).collect();
    let max = match c.max_rate {
        Some(r) => format!(
            "max rate meeting every SLO ({}): {}",
            slos.join(", "),
            rate(r, "req/s")
        ),
        None => format!("no rate met every SLO ({})", slos.join(", ")),
    };
    let failing = c.failing_rate.map_or_else(String::new, |r| {
        format!(" (first failing: {})", rate(r, "req/s"))
    });
    let knee = match c.knee_rate {
        Some(r) => format!(
            "knee at {} ({})",
            rate(r, "req/s"),
            c.knee_reasons.join(", ")
        ),
        None => "no knee (queueing) seen".to_owned(),
    };
    format!(
        "Capacity search, {} steps: {max}{failing}; {knee}; stopped: {}.",
        c.steps.len(),
        c.stopped
    )
}

#[cfg(test)]
mod tests {
    use crate::bench::capacity::{Search, Slo, StepObservation};

    /// The found rate and the knee, named with units; the failing step is not "the highest".
    #[test]
    fn capacity_sentence_states_the_max_rate_and_the_knee() {
        let mut s = Search::new(
            vec![Slo::parse("ttft_p99:5ms").unwrap()],
            0.05,
            100.0,
            10_000.0,
            Some(20),
        );
        let step = |rate: f64, achieved: f64, ttft: f64| StepObservation {
            offered_rate: rate,
            achieved_rate: achieved,
            requests: 20,
            ttft_ms: vec![ttft; 20],
            ..StepObservation::default()
        };
        s.feed(step(100.0, 100.0, 1.0));
        s.feed(step(200.0, 120.0, 9.0));
        assert_eq!(
            s.result().steps[0].slos[0].brief(),
            "ttft_p99:5ms 1.00 ms / bound 1.00 ms"
        );
        let text = super::capacity_sentence(&s.result());
        assert_eq!(
            text,
            "Capacity search, 2 steps: max rate meeting every SLO (ttft_p99:5ms): 100 req/s (first failing: 200 req/s); knee at 200 req/s (achieved_behind_offered, latency_rise); stopped: running."
        );
    }
}
