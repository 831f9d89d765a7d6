//! How much a router adds (issue 52.2): the routed canaries' latency against the same-shaped
//! canaries sent straight to the workers behind it, over the same window. A router that adds
//! seconds leaves every pod fast to a direct canary (llm-d-router #2408: 40 ms direct, 9.7 s
//! through the router); this says the difference and what it compares.
//!
//! The figure is routed p50 − direct p50 (nearest-rank medians) of the requests that ended in
//! the window; with fewer than [`MIN_SAMPLES`] on either side it is absent and the sentence says
//! why. Times are given (Unix seconds), never read.

use serde::Serialize;

/// Samples each side needs in the window before a difference is said.
pub const MIN_SAMPLES: usize = 5;

/// One finished, successful request on one path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathSample {
    /// When it ended, Unix seconds.
    pub at_unix_s: f64,
    /// Its time to first token, ms; `None` when it streamed no token.
    pub ttft_ms: Option<f64>,
    /// Send → end of stream, ms.
    pub e2e_ms: f64,
}

/// Which latency is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMetric {
    Ttft,
    E2e,
}

impl PathMetric {
    /// `ttft` | `e2e`.
    pub fn as_str(self) -> &'static str {
        match self {
            PathMetric::Ttft => "ttft",
            PathMetric::E2e => "e2e",
        }
    }

    fn of(self, s: &PathSample) -> Option<f64> {
        match self {
            PathMetric::Ttft => s.ttft_ms,
            PathMetric::E2e => Some(s.e2e_ms),
        }
    }
}

/// One path's requests in the window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PathSide {
    /// Requests with a value in the window.
    pub n: usize,
    /// Their median, ms; `None` with none.
    pub p50_ms: Option<f64>,
}

/// Routed against direct over one window, for one metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathComparison {
    pub metric: PathMetric,
    /// The window's length, seconds (it ends at the time given).
    pub window_s: f64,
    pub routed: PathSide,
    pub direct: PathSide,
    /// routed p50 − direct p50, ms; `None` with fewer than [`MIN_SAMPLES`] on a side.
    pub overhead_ms: Option<f64>,
    /// What the figure compares, or why there is none, in one sentence.
    pub says: String,
}

/// The nearest-rank median of `v` (sorted here); `None` when empty.
pub fn p50(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[(v.len() - 1) / 2])
}

fn side(samples: &[PathSample], metric: PathMetric, from: f64, to: f64) -> PathSide {
    let v: Vec<f64> = samples
        .iter()
        .filter(|s| s.at_unix_s > from && s.at_unix_s <= to)
        .filter_map(|s| metric.of(s))
        .filter(|v| v.is_finite())
        .collect();
    PathSide {
        n: v.len(),
        p50_ms: p50(v),
    }
}

/// Compares `routed` with `direct` over the `window_s` seconds ending at `now_unix_s`.
pub fn compare(
    routed: &[PathSample],
    direct: &[PathSample],
    metric: PathMetric,
    now_unix_s: f64,
    window_s: f64,
) -> PathComparison {
    let from = now_unix_s - window_s;
    let (r, d) = (
        side(routed, metric, from, now_unix_s),
        side(direct, metric, from, now_unix_s),
    );
    compare_sides(
        metric,
        window_s,
        r,
        d,
        &format!("over the last {window_s:.0} s"),
    )
}

/// Routed against direct given each side's count and median, the sentence saying where they
/// come from by `scope` ("over the last 60 s"; "over the benchmark" for `lmperf run
/// --direct-workers`, whose two phases follow each other); `window_s` as the caller measured it.
pub fn compare_sides(
    metric: PathMetric,
    window_s: f64,
    r: PathSide,
    d: PathSide,
    scope: &str,
) -> PathComparison {
    let name = metric.as_str().to_uppercase();
    let (overhead_ms, says) = match (r.p50_ms, d.p50_ms) {
        (Some(a), Some(b)) if r.n >= MIN_SAMPLES && d.n >= MIN_SAMPLES => (
            Some(a - b),
            format!(
                "routed {name} p50 − direct p50 {scope}, n = {} vs {}: {:+.1} ms",
                r.n,
                d.n,
                a - b
            ),
        ),
        _ => (
            None,
            format!(
                "too few requests {scope} to compare {name} (routed {}, direct {}; {MIN_SAMPLES} each needed)",
                r.n, d.n
            ),
        ),
    };
    PathComparison {
        metric,
        window_s,
        routed: r,
        direct: d,
        overhead_ms,
        says,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at: f64, ttft: f64, e2e: f64) -> PathSample {
        PathSample {
            at_unix_s: at,
            ttft_ms: Some(ttft),
            e2e_ms: e2e,
        }
    }

    /// A router adding 200 ms: the medians' difference, the counts, the sentence.
    #[test]
    fn routed_minus_direct_over_the_window() {
        let routed: Vec<PathSample> = (0..6)
            .map(|i| s(100.0 + f64::from(i), 230.0 + f64::from(i), 400.0))
            .collect();
        let direct: Vec<PathSample> = (0..5)
            .map(|i| s(100.0 + f64::from(i), 30.0 + f64::from(i), 190.0))
            .collect();
        let c = compare(&routed, &direct, PathMetric::Ttft, 110.0, 60.0);
        // Nearest-rank medians: 232 (of 230..235) and 32 (of 30..34).
        assert_eq!(
            (c.routed.p50_ms, c.direct.p50_ms),
            (Some(232.0), Some(32.0))
        );
        assert_eq!(c.overhead_ms, Some(200.0));
        assert_eq!(
            c.says,
            "routed TTFT p50 − direct p50 over the last 60 s, n = 6 vs 5: +200.0 ms"
        );
        let e = compare(&routed, &direct, PathMetric::E2e, 110.0, 60.0);
        assert_eq!(e.overhead_ms, Some(210.0));
    }

    /// Requests outside the window are not counted; too few on a side: no figure, and why.
    #[test]
    fn window_and_too_few() {
        let routed: Vec<PathSample> = (0..6).map(|i| s(f64::from(i), 10.0, 20.0)).collect();
        let direct: Vec<PathSample> = (0..6).map(|i| s(50.0 + f64::from(i), 5.0, 9.0)).collect();
        let c = compare(&routed, &direct, PathMetric::Ttft, 100.0, 60.0);
        assert_eq!((c.routed.n, c.direct.n), (0, 6));
        assert_eq!(c.overhead_ms, None);
        assert_eq!(
            c.says,
            "too few requests over the last 60 s to compare TTFT (routed 0, direct 6; 5 each needed)"
        );
        // A request with no token has no TTFT but an E2E.
        let no_token = [PathSample {
            at_unix_s: 99.0,
            ttft_ms: None,
            e2e_ms: 3.0,
        }];
        assert_eq!(
            compare(&no_token, &[], PathMetric::Ttft, 100.0, 60.0)
                .routed
                .n,
            0
        );
        assert_eq!(
            compare(&no_token, &[], PathMetric::E2e, 100.0, 60.0)
                .routed
                .n,
            1
        );
        assert_eq!(p50(vec![3.0, 1.0, 2.0, 4.0]), Some(2.0));
    }

    /// Two sides given whole (a benchmark's phases): the sentence says the scope given.
    #[test]
    fn sides_given_whole() {
        let side = |n, p50| PathSide {
            n,
            p50_ms: Some(p50),
        };
        let c = compare_sides(
            PathMetric::Ttft,
            12.5,
            side(12, 54.0),
            side(12, 50.0),
            "over the benchmark",
        );
        assert_eq!(c.overhead_ms, Some(4.0));
        assert_eq!(
            c.says,
            "routed TTFT p50 − direct p50 over the benchmark, n = 12 vs 12: +4.0 ms"
        );
        let few = compare_sides(
            PathMetric::E2e,
            1.0,
            side(4, 9.0),
            side(12, 5.0),
            "over the benchmark",
        );
        assert_eq!(few.overhead_ms, None);
        assert_eq!(
            few.says,
            "too few requests over the benchmark to compare E2E (routed 4, direct 12; 5 each needed)"
        );
    }
}
