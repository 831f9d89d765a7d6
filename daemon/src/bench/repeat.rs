//! `--repeat K`: each benchmark runs K times; `summary.json` gives per metric the values of
//! each repeat, their coefficient of variation and whether it is above [`CV_LIMIT_PCT`].

use std::collections::BTreeMap;

use serde::Serialize;

use super::BenchSummary;
use super::stats::Distribution;

/// A metric whose coefficient of variation across repeats is above this (percent) is flagged
/// unstable.
pub const CV_LIMIT_PCT: f64 = 1.5;

/// One metric across the repeats of a benchmark.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RepeatMetric {
    /// The metric of each repeat, in order.
    pub values: Vec<f64>,
    pub mean: f64,
    /// Coefficient of variation in percent: 100 × sample standard deviation (n − 1) / |mean|;
    /// null when the mean is 0.
    pub cv_pct: Option<f64>,
    /// `cv_pct` > [`CV_LIMIT_PCT`].
    pub unstable: bool,
}

/// `benchmarks[].repeat` of `summary.json` (null without `--repeat`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RepeatStats {
    /// Repeats run (K).
    pub k: usize,
    pub cv_limit_pct: f64,
    /// By metric: `ttft_mean_ms`, `ttft_p50_ms`, `ttft_p90_ms`, `ttft_p99_ms` (same for `itl`,
    /// `tpot`, `e2el`), `request_throughput`, `output_token_throughput`. A metric missing in
    /// some repeat (no successful request) is left out.
    pub metrics: BTreeMap<String, RepeatMetric>,
    /// Names of the metrics above the limit.
    pub unstable: Vec<String>,
}

/// Coefficient of variation (percent) of `v`: sample standard deviation over |mean|.
pub fn cv_pct(v: &[f64]) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean != 0.0).then(|| 100.0 * var.sqrt() / mean.abs())
}

/// The repeat statistics of one benchmark from the summaries of its repeats (each over that
/// repeat's requests only); `None` for fewer than two repeats.
pub fn repeat_stats(per_repeat: &[BenchSummary]) -> Option<RepeatStats> {
    if per_repeat.len() < 2 {
        return None;
    }
    let mut series: Vec<(String, Vec<Option<f64>>)> = Vec::new();
    type Get = fn(&BenchSummary) -> &Option<Distribution>;
    let dists: [(&str, Get); 4] = [
        ("ttft", |b| &b.ttft_ms),
        ("itl", |b| &b.itl_ms),
        ("tpot", |b| &b.tpot_ms),
        ("e2el", |b| &b.e2el_ms),
    ];
    for (name, get) in dists {
        for stat in ["mean", "p50", "p90", "p99"] {
            series.push((
                format!("{name}_{stat}_ms"),
                per_repeat
                    .iter()
                    .map(|b| get(b).as_ref().and_then(|d| d.get(stat)))
                    .collect(),
            ));
        }
    }
    series.push((
        "request_throughput".into(),
        per_repeat
            .iter()
            .map(|b| Some(b.request_throughput))
            .collect(),
    ));
    series.push((
        "output_token_throughput".into(),
        per_repeat
            .iter()
            .map(|b| Some(b.output_token_throughput))
            .collect(),
    ));
    let mut metrics = BTreeMap::new();
    for (name, vals) in series {
        let Some(values) = vals.into_iter().collect::<Option<Vec<f64>>>() else {
            continue;
        };
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let cv = cv_pct(&values);
        metrics.insert(
            name,
            RepeatMetric {
                mean,
                cv_pct: cv,
                unstable: cv.is_some_and(|c| c > CV_LIMIT_PCT),
                values,
            },
        );
    }
    let unstable = metrics
        .iter()
        .filter(|(_, m)| m.unstable)
        .map(|(k, _)| k.clone())
        .collect();
    Some(RepeatStats {
        k: per_repeat.len(),
        cv_limit_pct: CV_LIMIT_PCT,
        metrics,
        unstable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cv_is_sample_std_over_mean() {
        // [100, 102, 98]: mean 100, sample std 2 → 2 %.
        assert!((cv_pct(&[100.0, 102.0, 98.0]).unwrap() - 2.0).abs() < 1e-12);
        // [10, 10.1]: std √0.005 = 0.0707107, mean 10.05 → 0.703589 %.
        assert!((cv_pct(&[10.0, 10.1]).unwrap() - 0.703_589).abs() < 1e-6);
        assert_eq!(cv_pct(&[5.0]), None);
        assert_eq!(cv_pct(&[0.0, 0.0]), None);
    }
}
