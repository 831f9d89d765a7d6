//! `--fail-on` gates: parsed from `METRIC_STAT_ms>VALUE` and checked against a benchmark's
//! summary.

use super::stats::Distribution;
use super::{BenchSummary, Gate};

/// Parses `ttft_p99_ms>500`, `e2el_mean_ms>2000`, `error_rate>0.01`, `oom_rate>0` (requests
/// the server failed for memory ÷ requests sent), `vram_pct>92` (peak used VRAM of any one
/// GPU, percent; a benchmark without GPU figures does not trip it).
pub fn parse_gate(text: &str) -> Result<Gate, String> {
    let (name, limit) = text
        .split_once('>')
        .ok_or_else(|| format!("{text:?}: expected NAME>VALUE, e.g. ttft_p99_ms>500"))?;
    let limit: f64 = limit
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: {limit:?} is not a number"))?;
    let name = name.trim();
    // `--probe-rate`: the same gates on the probes alone (`probe_ttft_p99_ms>300`).
    if let Some(inner) = name.strip_prefix("probe_") {
        if inner == "vram_pct" || inner.starts_with("probe_") {
            return Err(format!(
                "{text:?}: probe_ gates are probe_METRIC_STAT_ms or probe_error_rate"
            ));
        }
        let g = parse_gate(&format!("{inner}>{limit}"))?;
        return Ok(Gate {
            text: text.to_owned(),
            metric: format!("probe_{}", g.metric),
            ..g
        });
    }
    if name == "error_rate" || name == "oom_rate" || name == "vram_pct" {
        return Ok(Gate {
            text: text.to_owned(),
            metric: name.to_owned(),
            stat: None,
            limit,
        });
    }
    let body = name.strip_suffix("_ms").ok_or_else(|| {
        format!(
            "{text:?}: expected METRIC_STAT_ms (ttft|itl|tpot|e2el, mean|p50|p90|p95|p99|p99.9|max)"
        )
    })?;
    let (metric, stat) = body
        .split_once('_')
        .ok_or_else(|| format!("{text:?}: expected METRIC_STAT_ms"))?;
    if !["ttft", "itl", "tpot", "e2el"].contains(&metric)
        || Distribution::default().get(stat).is_none()
    {
        return Err(format!("{text:?}: unknown metric or statistic"));
    }
    Ok(Gate {
        text: text.to_owned(),
        metric: metric.to_owned(),
        stat: Some(stat.to_owned()),
        limit,
    })
}

pub(crate) fn gate_trips(g: &Gate, b: &BenchSummary) -> bool {
    if let Some(metric) = g.metric.strip_prefix("probe_") {
        // No probe block, or no value in it: the gate cannot be checked, so it trips.
        return b
            .probes
            .as_ref()
            .and_then(|p| p.value(metric, g.stat.as_deref()))
            .is_none_or(|v| v > g.limit);
    }
    if g.metric == "error_rate" {
        return b.num_requests > 0 && b.error_rate > g.limit;
    }
    if g.metric == "oom_rate" {
        return b.num_requests > 0 && b.oom_rate > g.limit;
    }
    if g.metric == "vram_pct" {
        return b.vram.as_ref().is_some_and(|v| v.peak_used_pct > g.limit);
    }
    let d = match g.metric.as_str() {
        "ttft" => &b.ttft_ms,
        "itl" => &b.itl_ms,
        "tpot" => &b.tpot_ms,
        _ => &b.e2el_ms,
    };
    // No value (no successful request, or no request-level TPOT with n > 1): the gate cannot
    // be checked, so it trips rather than pass a run whose every request failed.
    d.as_ref()
        .and_then(|d| d.get(g.stat.as_deref().unwrap_or("mean")))
        .is_none_or(|v| v > g.limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_parse_and_reject() {
        let g = parse_gate("ttft_p99_ms>500").unwrap();
        assert_eq!(
            (g.metric.as_str(), g.stat.as_deref(), g.limit),
            ("ttft", Some("p99"), 500.0)
        );
        assert!(parse_gate("error_rate>0.01").is_ok());
        assert_eq!(parse_gate("oom_rate>0").unwrap().metric, "oom_rate");
        assert_eq!(parse_gate("vram_pct>92").unwrap().metric, "vram_pct");
        assert!(parse_gate("ttft_p99>500").is_err());
        assert!(parse_gate("latency_p99_ms>5").is_err());
        assert!(parse_gate("ttft_p98_ms>5").is_err());
        let p = parse_gate("probe_ttft_p99_ms>300").unwrap();
        assert_eq!(
            (
                p.metric.as_str(),
                p.stat.as_deref(),
                p.limit,
                p.text.as_str()
            ),
            ("probe_ttft", Some("p99"), 300.0, "probe_ttft_p99_ms>300")
        );
        assert_eq!(
            parse_gate("probe_error_rate>0").unwrap().metric,
            "probe_error_rate"
        );
        assert!(parse_gate("probe_vram_pct>9").is_err());
        assert!(parse_gate("probe_latency_p99_ms>9").is_err());
    }
}
