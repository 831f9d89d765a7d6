//! Quantiles of a bucketed histogram, as PromQL's `histogram_quantile` computes them
//! (prometheus/prometheus `promql/quantile.go`, `bucketQuantile` of classic buckets): linear
//! interpolation inside the bucket that holds the rank, the lowest bucket starting at 0 (or
//! at its own bound when that is ≤ 0), the `+Inf` bucket answered with the highest finite bound.

/// The `q` quantile (0..1) of `buckets`: `(upper bound, cumulative count)`, sorted by bound.
///
/// Returns `None` where PromQL returns NaN: no `+Inf` bucket, fewer than two buckets, no
/// observations, or `q` outside 0..1 (PromQL gives ±Inf there; nothing here wants that).
/// Counts that decrease from one bucket to the next (a torn scrape) are raised to the
/// previous count, as PromQL's `ensureMonotonic` does.
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    if !(0.0..=1.0).contains(&q) || buckets.len() < 2 {
        return None;
    }
    let last = buckets.len() - 1;
    if buckets[last].0 != f64::INFINITY {
        return None;
    }
    // Coalesce equal bounds and make the counts monotonic.
    let mut b: Vec<(f64, f64)> = Vec::with_capacity(buckets.len());
    for &(le, c) in buckets {
        match b.last_mut() {
            Some(prev) if prev.0 == le => prev.1 += c,
            Some(prev) => {
                let c = c.max(prev.1);
                b.push((le, c));
            }
            None => b.push((le, c)),
        }
    }
    if b.len() < 2 {
        return None;
    }
    let last = b.len() - 1;
    let observations = b[last].1;
    if observations <= 0.0 || !observations.is_finite() {
        return None;
    }
    let mut rank = q * observations;
    let i = b.iter().position(|&(_, c)| c >= rank).unwrap_or(last);
    if i == last {
        return Some(b[last - 1].0);
    }
    if i == 0 && b[0].0 <= 0.0 {
        return Some(b[0].0);
    }
    let (mut start, end, mut count) = (0.0, b[i].0, b[i].1);
    if i > 0 {
        start = b[i - 1].0;
        count -= b[i - 1].1;
        rank -= b[i - 1].1;
    }
    if count <= 0.0 {
        return Some(end);
    }
    Some(start + (end - start) * (rank / count))
}

/// A first bucket wider than this (s) says too little to interpolate in: vLLM's queue and
/// prefill histograms start at 0.3 s, so a server with no queue read a 150 ms queue median.
pub const WIDE_FIRST_BUCKET_S: f64 = 0.01;

/// The first bucket's upper bound when the `q` quantile lies in it, it starts at 0 and is
/// wider than [`WIDE_FIRST_BUCKET_S`]: the quantile is only known to be below that bound
/// (what [`histogram_quantile`] would interpolate there is a guess). `None` otherwise.
pub fn below_first_bucket(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let &(first, first_count) = buckets.first()?;
    let total = buckets.last()?.1.max(first_count);
    if !(0.0..=1.0).contains(&q)
        || total <= 0.0
        || first <= WIDE_FIRST_BUCKET_S
        || !first.is_finite()
        || first_count < q * total
    {
        return None;
    }
    Some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    #[test]
    fn interpolates_inside_the_rank_bucket() {
        // 10 observations: 2 ≤ 0.1, 6 ≤ 0.5, 9 ≤ 1, 10 total. Rank of p50 = 5, in (0.1, 0.5]
        // holding 4: 0.1 + 0.4 × (5 − 2) / 4 = 0.4.
        let b = [(0.1, 2.0), (0.5, 6.0), (1.0, 9.0), (INF, 10.0)];
        assert!((histogram_quantile(0.5, &b).unwrap() - 0.4).abs() < 1e-12);
        // p10: rank 1 in the first bucket, from 0: 0.1 × 1/2 = 0.05.
        assert!((histogram_quantile(0.1, &b).unwrap() - 0.05).abs() < 1e-12);
        // p99: rank 9.9 falls in +Inf: the highest finite bound.
        assert_eq!(histogram_quantile(0.99, &b), Some(1.0));
    }

    #[test]
    fn a_quantile_in_a_wide_first_bucket_is_only_below_it() {
        // vLLM's queue histogram: 50 of 80 requests ≤ 0.3 s (the first bucket).
        let b = [(0.3, 50.0), (0.5, 70.0), (1.0, 80.0), (INF, 80.0)];
        assert_eq!(below_first_bucket(0.5, &b), Some(0.3));
        assert_eq!(below_first_bucket(0.99, &b), None, "p99 in (0.5, 1]");
        // A narrow first bucket (1 ms): interpolating there costs under a millisecond.
        let narrow = [(0.001, 50.0), (0.5, 70.0), (INF, 80.0)];
        assert_eq!(below_first_bucket(0.5, &narrow), None);
        assert_eq!(below_first_bucket(0.5, &[(0.3, 0.0), (INF, 0.0)]), None);
    }

    #[test]
    fn nan_cases_are_none() {
        assert_eq!(
            histogram_quantile(0.5, &[(0.1, 1.0), (1.0, 2.0)]),
            None,
            "no +Inf bucket"
        );
        assert_eq!(histogram_quantile(0.5, &[(INF, 3.0)]), None, "one bucket");
        assert_eq!(
            histogram_quantile(0.5, &[(1.0, 0.0), (INF, 0.0)]),
            None,
            "empty"
        );
        assert_eq!(histogram_quantile(1.5, &[(1.0, 1.0), (INF, 1.0)]), None);
    }

    #[test]
    fn non_positive_first_bound_and_non_monotonic_counts() {
        assert_eq!(
            histogram_quantile(0.2, &[(0.0, 5.0), (1.0, 10.0), (INF, 10.0)]),
            Some(0.0)
        );
        // 1.0's count 3 < 4 is raised to 4: p50 rank 4 → bucket 0.5 (first with c ≥ 4), start 0.
        assert!(
            (histogram_quantile(0.5, &[(0.5, 4.0), (1.0, 3.0), (INF, 8.0)]).unwrap() - 0.5).abs()
                < 1e-12
        );
    }
}
