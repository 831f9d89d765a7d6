//! Summary statistics of a benchmark, exact: every value is kept, and percentiles interpolate
//! linearly between the two nearest ranks (numpy's default `linear` method, which `vllm bench
//! serve` reports), so anyone can recompute them from `requests.jsonl`.

use serde::Serialize;

/// Distribution of one metric, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Distribution {
    pub count: usize,
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    #[serde(rename = "p99.9")]
    pub p99_9: f64,
    pub max: f64,
}

/// Percentile of sorted values, `q` in [0, 1]: position `q × (n − 1)`, interpolated linearly.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
        }
    }
}

impl Distribution {
    /// `None` when there is no finite value (non-finite values are left out).
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        Some(Self {
            count: v.len(),
            mean,
            std: var.sqrt(),
            min: v[0],
            p50: percentile(&v, 0.5),
            p90: percentile(&v, 0.9),
            p95: percentile(&v, 0.95),
            p99: percentile(&v, 0.99),
            p99_9: percentile(&v, 0.999),
            max: v[v.len() - 1],
        })
    }

    /// A statistic by name (`mean`, `p99`, `max`, …), for `--fail-on` gates.
    pub fn get(&self, stat: &str) -> Option<f64> {
        Some(match stat {
            "mean" => self.mean,
            "std" => self.std,
            "min" => self.min,
            "p50" | "median" => self.p50,
            "p90" => self.p90,
            "p95" => self.p95,
            "p99" => self.p99,
            "p99.9" | "p999" => self.p99_9,
            "max" => self.max,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_as_numpy() {
        // numpy.percentile(range(1, 21), [50, 90, 95, 99]) = 10.5, 18.1, 19.05, 19.81
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        for (q, want) in [(0.5, 10.5), (0.9, 18.1), (0.95, 19.05), (0.99, 19.81)] {
            assert!((percentile(&v, q) - want).abs() < 1e-9, "{q}");
        }
        // Case 05: the median of the TTFT samples [120, 140] is 130.
        let d = Distribution::of(&[120.0, 140.0]).unwrap();
        assert_eq!((d.mean, d.p50, d.min, d.max), (130.0, 130.0, 120.0, 140.0));
        assert!((d.std - 10.0).abs() < 1e-9);
        // Non-finite values are left out; none finite is no distribution (not a panic).
        assert_eq!(Distribution::of(&[f64::NAN, 1.0]).unwrap().count, 1);
        assert_eq!(Distribution::of(&[f64::NAN]), None);
    }
}
