//! One bounded distribution of `summary.json` ([`Accumulator`]): exact moments, HDR-histogram
//! percentiles (see [`super::aggregate`] for the precision). Pure: no clock, no IO.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use super::stats::Distribution;

/// Significant decimal digits the histograms keep (relative precision 10⁻³).
pub const SIGNIFICANT_DIGITS: u8 = 3;
/// Values are recorded as whole multiples of 1 / `SCALE` of their unit.
const SCALE: f64 = 1e6;

/// One distribution, fed value by value.
#[derive(Debug, Clone)]
pub struct Accumulator {
    hist: Histogram<u64>,
    count: u64,
    mean: f64,
    /// Sum of squared deviations from the running mean (Welford).
    m2: f64,
    min: f64,
    max: f64,
}

impl Default for Accumulator {
    fn default() -> Self {
        Self::new()
    }
}

impl Accumulator {
    pub fn new() -> Self {
        // An auto-resizing histogram: grows to the largest value recorded (logarithmically).
        let hist = Histogram::new(SIGNIFICANT_DIGITS).unwrap_or_else(|_| {
            // 3 significant digits is always a valid precision; keep a fixed range otherwise.
            Histogram::new_with_bounds(1, u64::MAX / 2, 2).unwrap_or_else(|_| unreachable!())
        });
        Self {
            hist,
            count: 0,
            mean: 0.0,
            m2: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    /// Records `v` (non-finite values are left out; a negative one counts as 0 in the
    /// percentiles, exactly in the moments).
    pub fn record(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        self.count += 1;
        let delta = v - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (v - self.mean);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        // At most 2^62 millionths (4.6e12 units): the histogram grows to the largest value
        // recorded (logarithmically: at most ~450 KB); beyond that it saturates.
        let scaled = (v.max(0.0) * SCALE).round().min((1u64 << 62) as f64) as u64;
        if self.hist.record(scaled).is_err() {
            self.hist.saturating_record(scaled);
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Adds `other`'s values, as if each had been recorded here: count, extremes, histogram,
    /// and the mean and squared deviations by Chan, Golub and LeVeque's pairwise update.
    pub fn merge(&mut self, other: &Accumulator) {
        if other.count == 0 {
            return;
        }
        let n = self.count + other.count;
        let delta = other.mean - self.mean;
        let (a, b) = (self.count as f64, other.count as f64);
        self.m2 += other.m2 + delta * delta * a * b / n as f64;
        self.mean += delta * b / n as f64;
        self.count = n;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        if self.hist.add(&other.hist).is_err() {
            for v in other.hist.iter_recorded() {
                self.hist
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
    }

    /// Values `ranks` (0-based, ascending) would have in sorted order: the exact min and max
    /// at the ends, else the middle of the histogram bucket holding that rank.
    fn values_at_ranks(&self, ranks: &[u64]) -> Vec<f64> {
        let mut out = Vec::with_capacity(ranks.len());
        let last = self.count.saturating_sub(1);
        let mut wanted = ranks.iter().copied().peekable();
        let mut below = 0u64;
        for it in self.hist.iter_recorded() {
            let n = it.count_since_last_iteration();
            let value = self.hist.median_equivalent(it.value_iterated_to()) as f64 / SCALE;
            while let Some(&k) = wanted.peek() {
                if k >= below + n {
                    break;
                }
                out.push(match k {
                    0 => self.min,
                    k if k == last => self.max,
                    _ => value.clamp(self.min, self.max),
                });
                wanted.next();
            }
            below += n;
        }
        // Ranks beyond the count (none when called from `quantiles`): the max.
        out.resize(ranks.len(), self.max);
        out
    }

    /// Percentiles at `qs` (each in [0, 1]): position `q × (n − 1)`, interpolated linearly
    /// between the values at the two nearest ranks; NaN without values.
    pub fn quantiles(&self, qs: &[f64]) -> Vec<f64> {
        if self.count == 0 {
            return vec![f64::NAN; qs.len()];
        }
        let n = self.count;
        let pos: Vec<f64> = qs
            .iter()
            .map(|q| q.clamp(0.0, 1.0) * (n - 1) as f64)
            .collect();
        let mut ranks: Vec<u64> = pos
            .iter()
            .flat_map(|p| [p.floor() as u64, (p.floor() as u64 + 1).min(n - 1)])
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let values: BTreeMap<u64, f64> = ranks
            .iter()
            .copied()
            .zip(self.values_at_ranks(&ranks))
            .collect();
        pos.iter()
            .map(|p| {
                let lo = p.floor() as u64;
                let hi = (lo + 1).min(n - 1);
                let (a, b) = (values[&lo], values[&hi]);
                a + (b - a) * (p - lo as f64)
            })
            .collect()
    }

    /// The summary's distribution; `None` without a finite value.
    pub fn distribution(&self) -> Option<Distribution> {
        if self.count == 0 {
            return None;
        }
        let q = self.quantiles(&[0.5, 0.9, 0.95, 0.99, 0.999]);
        Some(Distribution {
            count: usize::try_from(self.count).unwrap_or(usize::MAX),
            mean: self.mean,
            std: (self.m2 / self.count as f64).max(0.0).sqrt(),
            min: self.min,
            p50: q[0],
            p90: q[1],
            p95: q[2],
            p99: q[3],
            p99_9: q[4],
            max: self.max,
        })
    }

    /// Bytes the histogram's counts take now.
    pub fn histogram_bytes(&self) -> usize {
        self.hist.distinct_values() * std::mem::size_of::<u64>()
    }
}
