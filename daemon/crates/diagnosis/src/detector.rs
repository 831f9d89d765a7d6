//! The robust baseline and jump detector shared by the adaptive sampler (spike mode) and the
//! diagnosis (symptom detection): the same buckets, baseline and rule drive both.
//!
//! A [`BucketSeries`] cuts one signal into fixed buckets (10 s by default) and keeps one
//! statistic per bucket ([`Aggregate`]: p99 for latencies, mean for ratios) for up to the
//! history (30 min). [`BucketSeries::assess`] compares the newest buckets with a baseline of
//! the older ones:
//!
//! - baseline: the median and the MAD of the bucket statistics older than the recent buckets,
//!   within the history; at least [`DetectorConfig::min_baseline_buckets`] non-empty buckets
//!   (2 min of history suffice with the defaults), else no verdict;
//! - a bucket *jumped* when its value is at least `ratio` × the median, its robust z score
//!   `(v − median) / (1.4826 · MAD)` is at least `z`, and `v − median` is at least the
//!   absolute `floor` (so a 3 ms → 7 ms wobble of an idle server never counts), and its
//!   samples sum to at least [`DetectorConfig::min_bucket_sum`] (for the error ratio: at least
//!   that many errors in the bucket); and, with [`DetectorConfig::min_share_above`] (the
//!   sampler's spike mode), when that share of its requests are themselves above the jump
//!   threshold: a shift of the body of the distribution, not two slow requests;
//! - the series jumped when at least [`DetectorConfig::min_jumped`] of the last
//!   [`DetectorConfig::recent_buckets`] buckets did. The bucket in progress counts once it holds
//!   [`DetectorConfig::min_partial_samples`] samples, so a jump is seen within seconds at a
//!   high canary rate and within two buckets at a low one.
//!
//! Sources: the MAD scaled by 1.4826 as a consistent estimator of σ and the modified z score
//! bound 3.5 (Iglewicz & Hoaglin, "How to Detect and Handle Outliers", 1993); BARO (Pham et
//! al., FSE 2024) scores root causes with the same median/IQR-robust standardization.
//!
//! Pure: no clock, no IO. Times are [`Duration`]s since an origin the caller chooses (the Unix
//! epoch, the agent's start); they only need to be monotonic for one series.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

/// What one bucket's statistic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    /// 99th percentile (nearest rank) of the bucket's samples: latencies.
    P99,
    /// Mean of the samples: ratios (an error is 1, a success 0), gauges.
    Mean,
    /// Largest sample: gauges whose peak matters (queue length, KV usage).
    Max,
    /// Sum of the samples: counts per bucket (retransmits, preemptions, requests).
    Sum,
}

/// How a jump is judged: all three must hold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct JumpRule {
    /// Value ÷ baseline median at least this (e.g. 2.0 for the sampler, 1.5 for the diagnosis).
    pub ratio: f64,
    /// Robust z score at least this (3.5: Iglewicz & Hoaglin's outlier bound).
    pub z: f64,
    /// Value − baseline median at least this, in the series' unit (seconds for latencies).
    pub floor: f64,
}

impl JumpRule {
    /// The same rule relaxed by `factor` in (0, 1] (hysteresis: staying in a spike needs less
    /// than entering one): ratio toward 1, z and floor scaled.
    pub fn relaxed(self, factor: f64) -> Self {
        Self {
            ratio: 1.0 + (self.ratio - 1.0) * factor,
            z: self.z * factor,
            floor: self.floor * factor,
        }
    }
}

/// Bucketing and baseline settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DetectorConfig {
    /// Bucket length. Default 10 s.
    pub bucket: Duration,
    /// Baseline history, at most. Default 30 min.
    pub history: Duration,
    /// Non-empty baseline buckets needed for a verdict. Default 8 (with 3 recent buckets,
    /// 2 min of history is enough).
    pub min_baseline_buckets: usize,
    /// Buckets judged as "recent". Default 3.
    pub recent_buckets: usize,
    /// Of the recent buckets, at least this many must have jumped. Default 2.
    pub min_jumped: usize,
    /// The bucket in progress counts as recent once it holds this many samples. Default 5.
    pub min_partial_samples: usize,
    /// A P99 bucket's statistic is never its lone largest sample (the nearest rank is capped
    /// at n − 1): below 100 samples a nearest-rank p99 *is* the maximum, so one heavy-tail
    /// outlier among a handful of canaries would carry the whole bucket. Default false; the
    /// sampler's spike mode and the diagnosis set it.
    pub exclude_max: bool,
    /// A bucket counts as jumped only when the sum of its samples is at least this: for a
    /// ratio of 1/0 flags (the error ratio), the number of errors in the bucket, so that one
    /// error among a handful of requests against an error-free baseline (a ratio of ∞ × and a
    /// z of thousands) is not a jump. Default 0 (off: the sampler's spike mode); the
    /// diagnosis's error ratio sets [`crate::engine::MIN_ERRORS_PER_BUCKET`].
    pub min_bucket_sum: f64,
    /// A p99 bucket counts as jumped only when at least this share of its requests (finished
    /// and in flight) are themselves jumped values, i.e. its `1 − share` quantile jumped too.
    /// At 1 canary/s a bucket's p99 (never its largest sample) is its second largest: two
    /// heavy-tail canaries of a calm real server made a 3.6 × "jump" (z 6.9) in two of three
    /// buckets, while under overload every canary is slow. Default 0 (off: the diagnosis
    /// judges the tail alone); the sampler's spike mode sets 0.25 (`spike_jump_min_share`).
    pub min_share_above: f64,
    /// The baseline's ordinary tail: with a value in (0, 1), a p99 series counts as jumped only
    /// when the number of the recent slots' requests above the jump threshold (pooled: k of
    /// n) is improbable for the baseline's own share of such requests: P(Binomial(n, p̂) ≥ k)
    /// < `tail_alpha`, p̂ the baseline buckets' pooled share above the threshold (their
    /// largest samples are kept). A half-busy server queues a canary now and then (10 ms →
    /// 0.5 s): the median bucket's p99 does not hold that, its pooled share does, and a few
    /// queued canaries among eighty are then ordinary, while a fault that slows most requests
    /// stays improbable. Default 0 (off: the sampler's spike mode); the diagnosis sets
    /// [`DEFAULT_TAIL_ALPHA`].
    pub tail_alpha: f64,
}

/// The diagnosis's [`DetectorConfig::tail_alpha`]: one bucket in a thousand of an unchanged
/// server may count as jumped by its tail alone.
pub const DEFAULT_TAIL_ALPHA: f64 = 1e-3;

/// Largest samples kept per closed p99 bucket for the pooled tail share of the baseline.
const TOP_KEPT: usize = 3;

impl Default for DetectorConfig {
    fn default() -> Self {
        Self {
            bucket: Duration::from_secs(10),
            history: Duration::from_secs(30 * 60),
            min_baseline_buckets: 8,
            recent_buckets: 3,
            min_jumped: 2,
            min_partial_samples: 5,
            exclude_max: false,
            min_bucket_sum: 0.0,
            min_share_above: 0.0,
            tail_alpha: 0.0,
        }
    }
}

/// The share of a bucket's canaries above the jump threshold that the sampler's spike mode
/// asks by default ([`DetectorConfig::min_share_above`]): a quarter.
pub const SPIKE_MODE_MIN_SHARE_ABOVE: f64 = 0.25;

impl DetectorConfig {
    /// The sampler's spike-mode settings (its default `spike_detector`): the defaults with the
    /// bucket's largest sample left out and [`SPIKE_MODE_MIN_SHARE_ABOVE`].
    pub fn spike_mode() -> Self {
        Self {
            exclude_max: true,
            min_share_above: SPIKE_MODE_MIN_SHARE_ABOVE,
            ..Self::default()
        }
    }

    fn history_buckets(&self) -> u64 {
        (self.history.as_nanos() / self.bucket.as_nanos().max(1)).max(1) as u64
    }
}

/// A robust baseline: median and MAD of bucket statistics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Baseline {
    pub median: f64,
    /// Median absolute deviation (unscaled).
    pub mad: f64,
    /// Buckets it was computed from.
    pub buckets: usize,
}

impl Baseline {
    /// Of `values` (any order); `None` when empty.
    pub fn of(values: &mut [f64]) -> Option<Self> {
        let median = median(values)?;
        let mut dev: Vec<f64> = values.iter().map(|v| (v - median).abs()).collect();
        let mad = median_of(&mut dev).unwrap_or(0.0);
        Some(Self {
            median,
            mad,
            buckets: values.len(),
        })
    }

    /// The robust z score of `v`: `(v − median) / (1.4826 · MAD)`. The scale is at least 2 %
    /// of the median (and 1e-12), so a perfectly flat baseline does not make every wobble
    /// infinite (the absolute floor of the rule is what keeps such wobbles out).
    pub fn z(&self, v: f64) -> f64 {
        let scale = (1.4826 * self.mad).max(0.02 * self.median.abs()).max(1e-12);
        (v - self.median) / scale
    }

    /// Whether `v` jumped above this baseline under `rule`.
    pub fn jumped(&self, v: f64, rule: &JumpRule) -> bool {
        v >= rule.ratio * self.median && self.z(v) >= rule.z && v - self.median >= rule.floor
    }

    /// `v` ÷ median (∞ for a zero median and a positive `v`, 1 for both zero).
    pub fn ratio(&self, v: f64) -> f64 {
        if self.median > 0.0 {
            v / self.median
        } else if v > 0.0 {
            f64::INFINITY
        } else {
            1.0
        }
    }
}

/// The median of `values` (reorders them); `None` when empty or any is NaN.
pub fn median(values: &mut [f64]) -> Option<f64> {
    median_of(values)
}

fn median_of(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() || v.iter().any(|x| x.is_nan()) {
        return None;
    }
    v.sort_unstable_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Nearest-rank quantile `q` of `v` (reorders it); `None` when empty.
pub fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let last = v.len() - 1;
    let idx = ((v.len() as f64 * q).ceil() as usize)
        .saturating_sub(1)
        .min(last);
    let (_, nth, _) = v.select_nth_unstable_by(idx, f64::total_cmp);
    Some(*nth)
}

/// Nearest-rank quantile `q` of `v` with the rank capped at n − 1 (for n ≥ 2), so the single
/// largest sample never is the answer (reorders `v`); `None` when empty.
pub fn quantile_below_max(v: &mut [f64], q: f64) -> Option<f64> {
    if v.len() < 2 {
        return quantile(v, q);
    }
    let idx = ((v.len() as f64 * q).ceil() as usize)
        .saturating_sub(1)
        .min(v.len() - 2);
    let (_, nth, _) = v.select_nth_unstable_by(idx, f64::total_cmp);
    Some(*nth)
}

/// P(X ≥ `k`) for X ~ Binomial(`n`, `p`): 1 for k = 0, 0 for k > n.
pub fn binomial_sf(k: usize, n: usize, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    let p = p.clamp(0.0, 1.0);
    if p >= 1.0 {
        return 1.0;
    }
    if p <= 0.0 {
        return 0.0;
    }
    // Σ_{i ≥ k} C(n, i) pⁱ (1 − p)ⁿ⁻ⁱ, term by term from i = k in logs (n is a bucket's
    // requests: at most a few thousand).
    let ln_choose = |i: usize| -> f64 {
        (1..=i)
            .map(|j| ((n - i + j) as f64).ln() - (j as f64).ln())
            .sum()
    };
    let mut term = (ln_choose(k) + k as f64 * p.ln() + (n - k) as f64 * (-p).ln_1p()).exp();
    let mut sum = 0.0;
    for i in k..=n {
        sum += term;
        if term < sum * 1e-12 {
            break;
        }
        // term(i + 1) = term(i) · (n − i)/(i + 1) · p/(1 − p)
        term *= (n - i) as f64 / (i + 1) as f64 * p / (1.0 - p);
    }
    sum.min(1.0)
}

/// The verdict of [`BucketSeries::assess`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Assessment {
    /// The newest recent bucket's statistic.
    pub value: f64,
    /// The largest statistic of the recent buckets.
    pub peak: f64,
    pub baseline: Baseline,
    /// `peak` ÷ baseline median.
    pub ratio: f64,
    /// Robust z score of `peak`.
    pub z: f64,
    /// Recent buckets that jumped, of `recent`.
    pub jumped_buckets: usize,
    pub recent: usize,
    /// The series jumped (enough recent buckets did).
    pub jumped: bool,
}

/// At most this many samples are kept for the bucket in progress (memory bound); later ones
/// in the same bucket are dropped and counted.
pub const MAX_BUCKET_SAMPLES: usize = 4096;

/// A closed bucket: its statistic, the sum of its samples, and what is known of how many of
/// its samples lie at or above a value (for [`DetectorConfig::min_share_above`]).
#[derive(Debug, Clone, Copy)]
struct Closed {
    idx: u64,
    stat: f64,
    sum: f64,
    /// The ⌈share · count⌉-th largest sample (∞ when the share rule is off).
    body: f64,
    /// Samples kept (p99 buckets: at most [`MAX_BUCKET_SAMPLES`]).
    count: u32,
    /// Samples ≥ the statistic.
    at_stat: u32,
    /// ⌈share · count⌉ (0 when the share rule is off).
    body_k: u32,
    /// The largest samples, largest first (−∞ where the bucket held fewer; p99 buckets only).
    top: [f32; TOP_KEPT],
}

impl Closed {
    /// `(v, k)` pairs: at least `k` samples are ≥ `v`.
    fn evidence(&self) -> Vec<(f64, usize)> {
        let mut out = vec![
            (self.stat, self.at_stat as usize),
            (self.body, self.body_k as usize),
        ];
        out.extend(
            self.top
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(|(i, &v)| (f64::from(v), i + 1)),
        );
        out
    }

    /// Samples known to satisfy `above` (monotone): a lower bound when more than the kept
    /// largest samples do.
    fn known_above(&self, above: impl Fn(f64) -> bool) -> usize {
        self.evidence()
            .iter()
            .filter(|&&(v, _)| above(v))
            .map(|&(_, k)| k)
            .max()
            .unwrap_or(0)
    }
}

/// One recent slot as judged by [`BucketSeries::assess_with`].
#[derive(Debug, Clone, Default)]
struct Slot {
    /// The statistic, lifted by the bounds of requests in flight.
    stat: f64,
    /// Sum of its samples (∞ when bounds took part).
    sum: f64,
    /// Requests in the slot: samples and bounds.
    total: usize,
    /// `(v, k)`: at least `k` samples are ≥ `v`.
    evidence: Vec<(f64, usize)>,
    /// Lower bounds of requests in flight counted in the slot.
    bounds: Vec<f64>,
    /// The bucket in progress: its samples (the series' own) are counted one by one.
    in_progress: bool,
}

impl Slot {
    /// Requests of the slot known to satisfy `above` (monotone in the value); `current` are
    /// the samples of the bucket in progress.
    fn known_above(&self, current: &[f64], above: impl Fn(f64) -> bool) -> usize {
        let samples = if self.in_progress {
            current.iter().filter(|&&v| above(v)).count()
        } else {
            self.evidence
                .iter()
                .filter(|&&(v, _)| above(v))
                .map(|&(_, k)| k)
                .max()
                .unwrap_or(0)
        };
        samples + self.bounds.iter().filter(|&&b| above(b)).count()
    }
}

/// One signal cut into buckets, with its statistic per bucket for the history.
#[derive(Debug, Clone)]
pub struct BucketSeries {
    config: DetectorConfig,
    aggregate: Aggregate,
    /// Closed buckets, oldest first; empty buckets are absent.
    closed: VecDeque<Closed>,
    current: Option<u64>,
    samples: Vec<f64>,
    sum: f64,
    max: f64,
    count: u64,
    /// Samples beyond [`MAX_BUCKET_SAMPLES`] (p99 buckets only).
    pub dropped: u64,
    /// Baseline cache: valid while `closed` did not change.
    cached: Option<(u64, usize, Option<Baseline>)>,
}

impl BucketSeries {
    pub fn new(config: DetectorConfig, aggregate: Aggregate) -> Self {
        Self {
            config,
            aggregate,
            closed: VecDeque::new(),
            current: None,
            samples: Vec::new(),
            sum: 0.0,
            max: 0.0,
            count: 0,
            dropped: 0,
            cached: None,
        }
    }

    pub fn config(&self) -> &DetectorConfig {
        &self.config
    }

    /// Seconds of history held (non-empty closed buckets) and the seconds a verdict needs
    /// (baseline plus recent buckets): e.g. 40 s of 120 s.
    pub fn history_progress_s(&self) -> (f64, f64) {
        let b = self.config.bucket.as_secs_f64();
        (
            self.closed.len() as f64 * b,
            (self.config.min_baseline_buckets + self.config.recent_buckets) as f64 * b,
        )
    }

    fn index(&self, at: Duration) -> u64 {
        (at.as_nanos() / self.config.bucket.as_nanos().max(1)) as u64
    }

    /// Adds one sample at `at`. A sample older than the bucket in progress goes into it
    /// (late arrivals are not re-bucketed). NaN and infinite values are ignored.
    pub fn push(&mut self, at: Duration, value: f64) {
        if !value.is_finite() {
            return;
        }
        let idx = self.index(at);
        self.roll(idx);
        if self.current.is_none() {
            self.current = Some(idx);
        }
        self.sum += value;
        self.max = if self.count == 0 {
            value
        } else {
            self.max.max(value)
        };
        self.count += 1;
        if self.aggregate == Aggregate::P99 {
            if self.samples.len() >= MAX_BUCKET_SAMPLES {
                self.dropped += 1;
            } else {
                self.samples.push(value);
            }
        }
    }

    /// The statistic of the bucket in progress, with its sample count and sum.
    fn current_value(&mut self) -> Option<(f64, u64, f64)> {
        if self.count == 0 {
            return None;
        }
        let v = match self.aggregate {
            Aggregate::P99 if self.config.exclude_max && self.samples.len() >= 2 => {
                quantile_below_max(&mut self.samples, 0.99)?
            }
            Aggregate::P99 => quantile(&mut self.samples, 0.99)?,
            Aggregate::Mean => self.sum / self.count as f64,
            Aggregate::Max => self.max,
            Aggregate::Sum => self.sum,
        };
        Some((v, self.count, self.sum))
    }

    /// Closes the bucket in progress when `idx` is past it, and forgets buckets older than
    /// the history.
    fn roll(&mut self, idx: u64) {
        if let Some(cur) = self.current
            && idx > cur
        {
            if let Some((stat, count, sum)) = self.current_value() {
                let [(_, at_stat), (body, body_k)] = self.evidence_of_closing(stat);
                let top = self.top_samples();
                let count = if self.aggregate == Aggregate::P99 {
                    self.samples.len() as u64
                } else {
                    count
                };
                let u32_of = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
                self.closed.push_back(Closed {
                    idx: cur,
                    stat,
                    sum,
                    body,
                    count: u32_of(count),
                    at_stat: u32_of(at_stat as u64),
                    body_k: u32_of(body_k as u64),
                    top,
                });
            }
            self.current = None;
            self.samples.clear();
            self.sum = 0.0;
            self.count = 0;
        }
        let keep_from =
            idx.saturating_sub(self.config.history_buckets() + self.config.recent_buckets as u64);
        while self.closed.front().is_some_and(|c| c.idx < keep_from) {
            self.closed.pop_front();
        }
    }

    /// Closed buckets `(start offset, statistic)`, oldest first.
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, f64)> + '_ {
        self.closed
            .iter()
            .map(|c| (self.config.bucket * c.idx as u32, c.stat))
    }

    /// The largest samples of the bucket in progress (p99 buckets with the tail test only).
    fn top_samples(&mut self) -> [f32; TOP_KEPT] {
        let mut top = [f32::NEG_INFINITY; TOP_KEPT];
        if self.aggregate != Aggregate::P99 || self.config.tail_alpha <= 0.0 {
            return top;
        }
        let n = self.samples.len();
        if n > TOP_KEPT {
            self.samples
                .select_nth_unstable_by(n - TOP_KEPT, f64::total_cmp);
        }
        let mut kept: Vec<f64> = self.samples[n.saturating_sub(TOP_KEPT)..].to_vec();
        kept.sort_unstable_by(|a, b| b.total_cmp(a));
        for (slot, v) in top.iter_mut().zip(kept) {
            *slot = v as f32;
        }
        top
    }

    /// The baseline's pooled share of samples satisfying `above` (a lower bound: at most
    /// [`TOP_KEPT`] per bucket are known), smoothed by half a sample: (k + ½) ÷ (n + 1).
    fn baseline_share(&self, first_recent: u64, above: impl Fn(f64) -> bool) -> f64 {
        let from = first_recent.saturating_sub(self.config.history_buckets());
        let (mut k, mut n) = (0usize, 0usize);
        for c in self
            .closed
            .iter()
            .filter(|c| c.idx >= from && c.idx < first_recent)
        {
            k += c.known_above(&above);
            n += c.count as usize;
        }
        (k as f64 + 0.5) / (n as f64 + 1.0)
    }

    /// Whether the share rule applies to this series.
    fn share_rule(&self) -> bool {
        self.aggregate == Aggregate::P99 && self.config.min_share_above > 0.0
    }

    /// The evidence of the bucket being closed (statistic `stat`): how many samples are ≥ the
    /// statistic, and the ⌈share · n⌉-th largest sample.
    fn evidence_of_closing(&mut self, stat: f64) -> [(f64, usize); 2] {
        if !self.share_rule() || self.samples.is_empty() {
            return [(f64::INFINITY, 0); 2];
        }
        let n = self.samples.len();
        let k = ((self.config.min_share_above * n as f64).ceil() as usize).clamp(1, n);
        let (_, kth, _) = self.samples.select_nth_unstable_by(n - k, f64::total_cmp);
        let kth = *kth;
        let at_stat = self.samples.iter().filter(|&&v| v >= stat).count();
        [(stat, at_stat), (kth, k)]
    }

    /// The recent buckets at `now` (newest last): the closed ones of the last
    /// `recent_buckets` bucket slots, plus the one in progress when it holds enough samples.
    /// `bounds` (see [`BucketSeries::assess_with`]) lift the slots of their start.
    /// Each slot as (statistic, sum of its samples); a slot judged by bounds alone has an
    /// infinite sum ([`DetectorConfig::min_bucket_sum`] limits sampled ratios, not latencies).
    fn recent(&mut self, now_idx: u64, bounds: &[(Duration, f64)]) -> (Vec<Slot>, u64) {
        let n = self.config.recent_buckets.max(1) as u64;
        let latency = matches!(self.aggregate, Aggregate::P99 | Aggregate::Max);
        // The bucket in progress is judged sample by sample (share rule, tail test).
        let share =
            self.share_rule() || (self.aggregate == Aggregate::P99 && self.config.tail_alpha > 0.0);
        // (slot of its start, start, lower bound); a start after `now` counts in the slot of
        // `now`.
        let bounds: Vec<(u64, f64, f64)> = if latency {
            bounds
                .iter()
                .filter(|(_, v)| v.is_finite())
                .map(|&(at, v)| (self.index(at).min(now_idx), at.as_secs_f64(), v))
                .collect()
        } else {
            Vec::new()
        };
        let bucket_s = self.config.bucket.as_secs_f64();
        let in_progress = if self.current == Some(now_idx) {
            self.current_value()
        } else {
            None
        };
        let now_bounds: Vec<f64> = bounds
            .iter()
            .filter(|&&(i, _, _)| i == now_idx)
            .map(|&(_, _, v)| v)
            .collect();
        let count = in_progress.map_or(0, |(_, c, _)| c as usize) + now_bounds.len();
        let partial_sum = if now_bounds.is_empty() {
            in_progress.map_or(0.0, |(_, _, sum)| sum)
        } else {
            f64::INFINITY
        };
        let partial = if count >= self.config.min_partial_samples && count > 0 {
            if now_bounds.is_empty() {
                in_progress.map(|(v, _, _)| v)
            } else {
                // The statistic of the samples and the bounds together: a lower bound of the
                // bucket's statistic once the requests in flight end.
                match self.aggregate {
                    Aggregate::P99 => {
                        let mut all: Vec<f64> = self
                            .samples
                            .iter()
                            .copied()
                            .chain(now_bounds.iter().copied())
                            .collect();
                        if self.config.exclude_max {
                            quantile_below_max(&mut all, 0.99)
                        } else {
                            quantile(&mut all, 0.99)
                        }
                    }
                    _ => in_progress
                        .map(|(v, _, _)| v)
                        .into_iter()
                        .chain(now_bounds.iter().copied())
                        .reduce(f64::max),
                }
            }
        } else {
            None
        };
        let closed_slots = if partial.is_some() { n - 1 } else { n };
        // Closed buckets count from the newest slot that is complete at `now`.
        let newest_complete = now_idx.saturating_sub(1);
        let first = (newest_complete + 1).saturating_sub(closed_slots);
        let mut out = Vec::with_capacity(n as usize);
        for slot in (first..=newest_complete).filter(|_| now_idx > 0) {
            let closed = self.closed.iter().find(|c| c.idx == slot).copied();
            // A request that started before the recent slots and still runs counts in the oldest.
            let slot_bounds: Vec<f64> = bounds
                .iter()
                .filter(|&&(i, _, _)| i.max(first) == slot)
                .map(|&(_, _, v)| v)
                .collect();
            if closed.is_some() || !slot_bounds.is_empty() {
                let sum = if slot_bounds.is_empty() {
                    closed.map_or(f64::INFINITY, |c| c.sum)
                } else {
                    f64::INFINITY
                };
                let (count, evidence) =
                    closed.map_or((0, Vec::new()), |c| (c.count as usize, c.evidence()));
                if let Some(stat) = self.lift(closed.map(|c| c.stat), slot_bounds.clone()) {
                    out.push(Slot {
                        stat,
                        sum,
                        total: count + slot_bounds.len(),
                        evidence,
                        bounds: slot_bounds,
                        in_progress: false,
                    });
                }
            } else {
                // A slot where no request started nor ended (all of them stuck: new ones are
                // skipped) is judged by the requests in flight through it, at its end.
                let through: Vec<f64> = bounds
                    .iter()
                    .filter(|&&(i, _, _)| i < slot)
                    .map(|&(_, start, _)| (slot + 1) as f64 * bucket_s - start)
                    .collect();
                if let Some(stat) = self.lift(None, through.clone()) {
                    out.push(Slot {
                        stat,
                        sum: f64::INFINITY,
                        total: through.len(),
                        evidence: Vec::new(),
                        bounds: through,
                        in_progress: false,
                    });
                }
            }
        }
        if let Some(v) = partial {
            // With no closed recent slot, older bounds count in the one in progress.
            let older: Vec<f64> = if closed_slots == 0 {
                bounds
                    .iter()
                    .filter(|&&(i, _, _)| i < now_idx)
                    .map(|&(_, _, v)| v)
                    .collect()
            } else {
                Vec::new()
            };
            let sum = if older.is_empty() {
                partial_sum
            } else {
                f64::INFINITY
            };
            // Every sample of the bucket in progress is known: counted as judged (`in_progress`).
            let total = self.samples.len() + now_bounds.len() + older.len();
            let mut slot_bounds = now_bounds;
            slot_bounds.extend(older.iter().copied());
            if let Some(stat) = self.lift(Some(v), older) {
                out.push(Slot {
                    stat,
                    sum,
                    total,
                    evidence: Vec::new(),
                    bounds: slot_bounds,
                    in_progress: share,
                });
            }
        }
        (out, first)
    }

    /// A closed slot's statistic `stat` lifted by the lower bounds of requests in flight: to
    /// the largest bound, or with [`DetectorConfig::exclude_max`] to the second largest of the
    /// statistic and the bounds (one request never carries the slot alone, in flight or not).
    fn lift(&self, stat: Option<f64>, mut bounds: Vec<f64>) -> Option<f64> {
        if bounds.is_empty() {
            return stat;
        }
        if !self.config.exclude_max {
            let b = bounds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            return Some(stat.map_or(b, |s| s.max(b)));
        }
        bounds.extend(stat);
        let lifted = quantile_below_max(&mut bounds, 1.0)?;
        Some(stat.map_or(lifted, |s| s.max(lifted)))
    }

    /// The baseline at `now`: buckets before the recent slots, within the history.
    pub fn baseline(&mut self, now: Duration) -> Option<Baseline> {
        let now_idx = self.index(now);
        self.roll(now_idx);
        let (_, first_recent) = self.recent(now_idx, &[]);
        self.baseline_before(first_recent)
    }

    fn baseline_before(&mut self, first_recent: u64) -> Option<Baseline> {
        let from = first_recent.saturating_sub(self.config.history_buckets());
        if let Some((f, len, b)) = self.cached
            && f == first_recent
            && len == self.closed.len()
        {
            return b;
        }
        let mut vals: Vec<f64> = self
            .closed
            .iter()
            .filter(|c| c.idx >= from && c.idx < first_recent)
            .map(|c| c.stat)
            .collect();
        let b = if vals.len() >= self.config.min_baseline_buckets {
            Baseline::of(&mut vals)
        } else {
            None
        };
        self.cached = Some((first_recent, self.closed.len(), b));
        b
    }

    /// Judges the recent buckets at `now` against the baseline under `rule`. `None` while the
    /// baseline is too short or no recent bucket holds data.
    pub fn assess(&mut self, now: Duration, rule: &JumpRule) -> Option<Assessment> {
        self.assess_with(now, rule, &[])
    }

    /// As [`assess`](Self::assess), with requests still in flight as right-censored samples:
    /// each `(start, bound)` is a request that started at `start` and whose value is at least
    /// `bound` (its elapsed time so far). A bound lifts the recent slot of its start (the
    /// oldest recent slot for an earlier start) like a sample would: in the bucket in progress
    /// it joins the samples (and counts toward [`DetectorConfig::min_partial_samples`]), in a
    /// closed slot it raises the statistic to at least the bound (exact for a p99 below 100
    /// samples per bucket, where the p99 is the largest sample). A request counts once: in
    /// flight by its start, finished by its end (its [`push`](Self::push)); except in a recent
    /// slot where no request started nor ended (every request stuck, new ones skipped): that
    /// slot takes the requests in flight through it, with their elapsed time at its end. Bounds
    /// never enter the baseline, and only latency series (p99, max) take them; the others
    /// ignore them.
    pub fn assess_with(
        &mut self,
        now: Duration,
        rule: &JumpRule,
        bounds: &[(Duration, f64)],
    ) -> Option<Assessment> {
        let now_idx = self.index(now);
        self.roll(now_idx);
        let (recent, first_recent) = self.recent(now_idx, bounds);
        let baseline = self.baseline_before(first_recent)?;
        let value = recent.last()?.stat;
        let peak = recent
            .iter()
            .map(|s| s.stat)
            .fold(f64::NEG_INFINITY, f64::max);
        let share = if self.share_rule() {
            self.config.min_share_above
        } else {
            0.0
        };
        let tail = self.aggregate == Aggregate::P99 && self.config.tail_alpha > 0.0;
        let p_tail = if tail {
            self.baseline_share(first_recent, |v| baseline.jumped(v, rule))
        } else {
            0.0
        };
        let (mut above_all, mut total_all) = (0usize, 0usize);
        let jumped_buckets = recent
            .iter()
            .filter(|s| {
                let above = s.known_above(&self.samples, |v| baseline.jumped(v, rule));
                above_all += above;
                total_all += s.total;
                baseline.jumped(s.stat, rule)
                    && s.sum >= self.config.min_bucket_sum
                    && above as f64 >= (share * s.total as f64).ceil()
            })
            .count();
        // The ordinary tail: the recent slots' requests above the threshold, pooled, must be
        // improbable at the baseline's own share of them (a few canaries a bucket cannot make
        // a bucket improbable alone; a fault slows most of the canaries of every slot).
        let ordinary_tail =
            tail && binomial_sf(above_all, total_all, p_tail) >= self.config.tail_alpha;
        Some(Assessment {
            value,
            peak,
            baseline,
            ratio: baseline.ratio(peak),
            z: baseline.z(peak),
            jumped_buckets,
            recent: recent.len(),
            jumped: jumped_buckets >= self.config.min_jumped.max(1) && !ordinary_tail,
        })
    }

    /// Approximate heap bytes held (for the per-target memory figure).
    pub fn heap_bytes(&self) -> usize {
        self.closed.capacity() * std::mem::size_of::<Closed>()
            + self.samples.capacity() * std::mem::size_of::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLER: JumpRule = JumpRule {
        ratio: 2.0,
        z: 3.5,
        floor: 0.05,
    };

    /// A small deterministic PRNG (xorshift64*), uniform in [0, 1).
    pub(crate) struct Rng(u64);
    impl Rng {
        pub(crate) fn new(seed: u64) -> Self {
            Self(seed.max(1))
        }
        pub(crate) fn next(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
        }
        /// Exponential with the given mean.
        pub(crate) fn exp(&mut self, mean: f64) -> f64 {
            -mean * (1.0 - self.next()).ln()
        }
    }

    /// Feeds `f(t)` (seconds → value) every `step` from `from` to `to` seconds; returns the first
    /// time the series jumped, if any.
    fn run(
        s: &mut BucketSeries,
        from: f64,
        to: f64,
        step: f64,
        rule: &JumpRule,
        mut f: impl FnMut(f64) -> f64,
    ) -> Option<f64> {
        let mut t = from;
        let mut first = None;
        while t < to {
            let at = Duration::from_secs_f64(t);
            s.push(at, f(t));
            if first.is_none() && s.assess(at, rule).is_some_and(|a| a.jumped) {
                first = Some(t);
            }
            t += step;
        }
        first
    }

    #[test]
    fn median_mad_and_z() {
        let b = Baseline::of(&mut [1.0, 2.0, 3.0, 4.0, 100.0]).unwrap();
        assert_eq!((b.median, b.mad, b.buckets), (3.0, 1.0, 5));
        assert!((b.z(3.0 + 1.4826 * 4.0) - 4.0).abs() < 1e-9);
        assert!(Baseline::of(&mut []).is_none());
        assert_eq!(quantile(&mut [5.0, 1.0, 3.0], 0.99), Some(5.0));
        assert_eq!(quantile_below_max(&mut [5.0, 1.0, 3.0], 0.99), Some(3.0));
        assert_eq!(quantile_below_max(&mut [5.0], 0.99), Some(5.0));
        assert_eq!(
            quantile_below_max(&mut (1..=200).map(f64::from).collect::<Vec<_>>(), 0.99),
            Some(198.0)
        );
        assert_eq!(
            quantile(&mut (1..=200).map(f64::from).collect::<Vec<_>>(), 0.99),
            Some(198.0)
        );
    }

    #[test]
    fn ttft_jump_after_two_minutes_is_seen_within_seconds() {
        // Canaries at 2/s, TTFT ~ 100 ms ± exponential jitter; at 120 s it jumps to ~400 ms.
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::P99);
        let mut rng = Rng::new(7);
        let first = run(&mut s, 0.0, 180.0, 0.5, &SAMPLER, |t| {
            if t < 120.0 {
                0.08 + rng.exp(0.02)
            } else {
                0.4 + rng.exp(0.05)
            }
        });
        let at = first.expect("jump seen");
        assert!((120.0..=135.0).contains(&at), "jump seen at {at} s");
        let a = s.assess(Duration::from_secs(180), &SAMPLER).unwrap();
        assert!(
            a.jumped && a.ratio > 2.0 && a.baseline.median > 0.09 && a.baseline.median < 0.25,
            "{a:?}"
        );
    }

    #[test]
    fn not_before_the_baseline_has_eight_buckets() {
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::P99);
        // 60 s of history: 6 buckets, then a jump: no verdict at all.
        let first = run(&mut s, 0.0, 90.0, 0.5, &SAMPLER, |t| {
            if t < 60.0 { 0.1 } else { 1.0 }
        });
        assert_eq!(first, None);
        assert!(s.assess(Duration::from_secs(65), &SAMPLER).is_none());
    }

    #[test]
    fn slow_drift_does_not_fire() {
        // TTFT doubles over 30 min (a slow drift): the baseline follows, no jump.
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::P99);
        let mut rng = Rng::new(11);
        let first = run(&mut s, 0.0, 3600.0, 0.5, &SAMPLER, |t| {
            0.1 * (1.0 + t / 1800.0) + rng.exp(0.01)
        });
        assert_eq!(first, None);
    }

    #[test]
    fn idle_server_noise_does_not_fire() {
        // An idle server at 3 ms with wobbles to 7 ms and rare 12 ms outliers: ratio and z are
        // large, but below the 50 ms floor.
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::P99);
        let mut rng = Rng::new(3);
        let first = run(&mut s, 0.0, 1200.0, 0.2, &SAMPLER, |_| {
            let u = rng.next();
            if u < 0.01 {
                0.012
            } else if u < 0.2 {
                0.007
            } else {
                0.003
            }
        });
        assert_eq!(first, None);
    }

    #[test]
    fn a_single_slow_bucket_does_not_fire() {
        // One 10 s bucket at 5× (a GC pause), the rest calm: 1 of 3 recent buckets jumped.
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::P99);
        let mut rng = Rng::new(5);
        let first = run(&mut s, 0.0, 400.0, 0.5, &SAMPLER, |t| {
            if (200.0..210.0).contains(&t) {
                0.5
            } else {
                0.1 + rng.exp(0.01)
            }
        });
        assert_eq!(first, None);
    }

    #[test]
    fn low_rate_canaries_need_two_buckets() {
        // The default interval (5 s): 2 samples per bucket, no partial bucket counts.
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::P99);
        let mut rng = Rng::new(9);
        let first = run(&mut s, 0.0, 300.0, 5.0, &SAMPLER, |t| {
            if t < 200.0 { 0.2 + rng.exp(0.02) } else { 1.2 }
        });
        let at = first.expect("jump seen");
        assert!((210.0..=230.0).contains(&at), "jump seen at {at} s");
    }

    #[test]
    fn error_ratio_as_mean() {
        let rule = JumpRule {
            ratio: 2.0,
            z: 3.5,
            floor: 0.05,
        };
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::Mean);
        let mut rng = Rng::new(1);
        let first = run(&mut s, 0.0, 300.0, 0.1, &rule, |t| {
            let p = if t < 200.0 { 0.01 } else { 0.3 };
            f64::from(u8::from(rng.next() < p))
        });
        let at = first.expect("error burst seen");
        assert!((200.0..=212.0).contains(&at), "seen at {at}");
    }

    #[test]
    fn max_and_sum_buckets() {
        let cfg = DetectorConfig {
            min_baseline_buckets: 1,
            ..DetectorConfig::default()
        };
        let mut m = BucketSeries::new(cfg, Aggregate::Max);
        let mut s = BucketSeries::new(cfg, Aggregate::Sum);
        for (t, v) in [(1.0, 3.0), (2.0, 9.0), (3.0, 4.0), (12.0, 1.0)] {
            m.push(Duration::from_secs_f64(t), v);
            s.push(Duration::from_secs_f64(t), v);
        }
        assert_eq!(m.buckets().collect::<Vec<_>>(), [(Duration::ZERO, 9.0)]);
        assert_eq!(s.buckets().collect::<Vec<_>>(), [(Duration::ZERO, 16.0)]);
    }

    /// Requests in flight at `t`, started every `step` from `from`, none finished: the
    /// lower bounds `(start, t − start)`.
    fn stalled(from: f64, t: f64, step: f64) -> Vec<(Duration, f64)> {
        let mut out = Vec::new();
        let mut s = from;
        while s <= t {
            out.push((Duration::from_secs_f64(s), t - s));
            s += step;
        }
        out
    }

    #[test]
    fn a_queue_is_seen_from_requests_in_flight_before_any_ends() {
        // 2 min calm at 2/s (E2E ~400 ms), then from 125 s every request queues (none ends
        // for 40 s). On finished requests alone nothing is seen; with the in-flight bounds the
        // jump is seen within 13 s, whatever the bucket phase (the rest of the onset's bucket,
        // then the 5 requests the next one needs, waiting ≥ 2 × the baseline).
        for (onset, config) in [121.0, 125.0, 129.5]
            .into_iter()
            .flat_map(|o| [(o, DetectorConfig::default()), (o, spike_mode())])
        {
            let mut s = BucketSeries::new(config, Aggregate::P99);
            let mut rng = Rng::new(13);
            let mut t = 0.0;
            while t < onset {
                s.push(Duration::from_secs_f64(t), 0.35 + rng.exp(0.03));
                t += 0.5;
            }
            let mut first = None;
            let mut t = onset;
            while t < onset + 40.0 && first.is_none() {
                let at = Duration::from_secs_f64(t);
                assert!(
                    !s.assess(at, &SAMPLER).is_some_and(|a| a.jumped),
                    "no request ended"
                );
                let a = s.assess_with(at, &SAMPLER, &stalled(onset, t, 0.5));
                if a.is_some_and(|a| a.jumped) {
                    first = Some(t - onset);
                }
                t += 1.0;
            }
            let after = first.expect("jump seen");
            assert!(
                after <= 13.0,
                "onset {onset} ({config:?}): seen after {after} s"
            );
        }
    }

    #[test]
    fn one_slow_request_counts_once_in_flight_or_ended() {
        // Calm at 2/s; one request started at 128 s takes 6 s (across a bucket boundary) while
        // the others go on: in flight it lifts the slot of its start, ended the slot of its
        // end, never both: 1 of 3 recent buckets at most.
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::P99);
        let mut rng = Rng::new(17);
        let mut t = 0.0;
        while t < 200.0 {
            let at = Duration::from_secs_f64(t);
            s.push(at, 0.35 + rng.exp(0.03));
            if (134.0..134.5).contains(&t) {
                s.push(at, 6.0);
            }
            let slow = if (128.0..134.0).contains(&t) {
                stalled(128.0, t, 100.0)
            } else {
                Vec::new()
            };
            let a = s.assess_with(at, &SAMPLER, &slow);
            assert!(!a.is_some_and(|a| a.jumped), "fired at {t}: {a:?}");
            if t > 129.0 && t < 134.0 {
                assert!(
                    a.is_some_and(|a| a.jumped_buckets == 1 && a.peak >= t - 128.0),
                    "{t}: {a:?}"
                );
            }
            t += 0.5;
        }
    }

    #[test]
    fn requests_stuck_while_new_ones_are_skipped_keep_the_jump() {
        // 2 min calm at 1/s, then 16 requests start in 16 s and stay stuck for 2 min: no new
        // request starts (max in flight), none ends. The jump holds throughout, through the
        // empty slots.
        for config in [DetectorConfig::default(), spike_mode()] {
            let mut s = BucketSeries::new(config, Aggregate::P99);
            let mut rng = Rng::new(19);
            for t in 0..120 {
                s.push(Duration::from_secs(t), 0.4 + rng.exp(0.05));
            }
            let mut first = None;
            for t in 120..240u64 {
                let stuck: Vec<(Duration, f64)> = (120..=t.min(135))
                    .map(|st| (Duration::from_secs(st), (t - st) as f64))
                    .collect();
                let a = s.assess_with(Duration::from_secs(t), &SAMPLER, &stuck);
                let jumped = a.is_some_and(|a| a.jumped);
                if jumped && first.is_none() {
                    first = Some(t);
                }
                assert!(first.is_none() || jumped, "the jump lapsed at {t} s: {a:?}");
            }
            assert!(first.is_some_and(|t| t <= 135), "{config:?}: {first:?}");
        }
    }

    /// The sampler's spike-mode detector settings.
    fn spike_mode() -> DetectorConfig {
        DetectorConfig::spike_mode()
    }

    /// 1 canary/s with a real server's calm TTFT (~94 ms, light exponential jitter), where
    /// `slow_per_bucket` canaries of every 10 s bucket from 180 s on take 0.3–0.45 s (the CI
    /// calm phase that entered spike mode: 0.335 s = 3.6 × 0.094 s, z 6.9); then from 300 s
    /// an overload: every canary ~1.5 s. Returns the first jump before and after 300 s.
    fn calm_jitter_then_overload(
        config: DetectorConfig,
        slow_per_bucket: u64,
    ) -> (Option<u64>, Option<u64>) {
        let mut s = BucketSeries::new(config, Aggregate::P99);
        let mut rng = Rng::new(23);
        let (mut calm, mut overload) = (None, None);
        for t in 0..400u64 {
            let v = if t >= 300 {
                1.5 + rng.exp(0.2)
            } else if t >= 180 && t % 10 < slow_per_bucket {
                0.3 + 0.15 * rng.next()
            } else {
                0.08 + rng.exp(0.015)
            };
            let at = Duration::from_secs(t);
            s.push(at, v);
            if s.assess(at, &SAMPLER).is_some_and(|a| a.jumped) {
                let first = if t < 300 { &mut calm } else { &mut overload };
                first.get_or_insert(t);
            }
        }
        (calm, overload)
    }

    #[test]
    fn two_slow_canaries_a_bucket_are_jitter_for_spike_mode() {
        // Without the share rule, two slow canaries in each bucket make a "jump" (the CI
        // failure); with it they do not, and the overload is still seen within 15 s (the
        // bucket in progress after 5 canaries, then the next one: the jittery bucket before the
        // onset no longer counts as the second jumped bucket).
        let tail_only = DetectorConfig {
            exclude_max: true,
            ..DetectorConfig::default()
        };
        assert!(
            calm_jitter_then_overload(tail_only, 2).0.is_some(),
            "the jitter must look like a jump to the tail alone"
        );
        let (calm, overload) = calm_jitter_then_overload(spike_mode(), 2);
        assert_eq!(calm, None, "two slow canaries in ten entered spike mode");
        assert!(
            overload.is_some_and(|t| t <= 315),
            "overload seen at {overload:?}"
        );
        // A quarter of the canaries slow is a shift of the body: seen.
        let (calm, _) = calm_jitter_then_overload(spike_mode(), 3);
        assert!(calm.is_some_and(|t| t <= 205), "3 of 10 slow: {calm:?}");
    }

    #[test]
    fn bounds_are_ignored_by_ratio_and_count_series() {
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::Mean);
        for i in 0..150 {
            s.push(Duration::from_secs(i), 0.0);
        }
        let a = s.assess_with(
            Duration::from_secs(150),
            &SAMPLER,
            &stalled(120.0, 150.0, 1.0),
        );
        assert!(a.is_some_and(|a| !a.jumped && a.peak == 0.0), "{a:?}");
    }

    #[test]
    fn history_is_bounded() {
        let mut s = BucketSeries::new(DetectorConfig::default(), Aggregate::P99);
        run(&mut s, 0.0, 7200.0, 1.0, &SAMPLER, |_| 0.1);
        assert!(s.buckets().count() <= 183, "{}", s.buckets().count());
        assert!(s.heap_bytes() < 16 * 1024, "{}", s.heap_bytes());
    }
}
