//! Two readings → one [`ServerSample`]: counters as per-second rates with reset detection (a
//! counter that went down restarted from 0, so its increase is its new value, as PromQL's
//! `increase` assumes), histograms as per-interval deltas with their mean, p50 and p99.
//! Pure: the caller passes the readings and their times.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::normalize::{Histogram, Reading};
use super::quantile::{below_first_bucket, histogram_quantile};

impl LatencyStats {
    /// Nothing observed: no observation and no mean.
    pub fn is_empty(&self) -> bool {
        self.count == 0.0 && self.mean.is_none()
    }
}

/// Mean, p50 and p99 of one server-side latency over an interval, seconds; `None` when no
/// request finished in it, or when the quantile lies in a wide first bucket: then
/// `p50_below` / `p99_below` say "below the first bucket" with its bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    /// Observations in the interval.
    pub count: f64,
    /// The p50 lies in the histogram's first bucket, (0, this bound], wider than
    /// [`super::quantile::WIDE_FIRST_BUCKET_S`]: below this bound, no interpolated value (vLLM's
    /// queue histogram starts at 0.3 s: a server with no queue read a 150 ms median).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_below: Option<f64>,
    /// As `p50_below`, for the p99.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_below: Option<f64>,
}

/// The server's state at one scrape and its activity since the previous one.
///
/// **Contract** (consumed by the diagnosis): every field is `None` when the server does not
/// expose it or no interval exists yet (the first scrape), never 0 in its place. Rates are per
/// second over the interval between the two scrapes; latencies are seconds.
///
/// Serialized (`server_samples.jsonl` of `lmperf run`, read back by `lmperf analyze`) with
/// `at` in Unix seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerSample {
    /// When the page was read.
    #[serde(serialize_with = "unix_s", deserialize_with = "from_unix_s")]
    pub at: SystemTime,
    pub requests_waiting: Option<f64>,
    pub requests_running: Option<f64>,
    /// 0..1.
    pub kv_cache_usage: Option<f64>,
    pub preemptions_per_s: Option<f64>,
    /// Prefix-cache hits ÷ queries over the interval (SGLang: its own gauge), 0..1.
    pub prefix_cache_hit_ratio: Option<f64>,
    pub prompt_tokens_per_s: Option<f64>,
    pub generation_tokens_per_s: Option<f64>,
    pub requests_per_s: Option<f64>,
    pub ttft: LatencyStats,
    pub itl: LatencyStats,
    pub queue: LatencyStats,
    pub prefill: LatencyStats,
    pub decode: LatencyStats,
    /// A router's KV-cache hit rate of the requests it routed in the interval, 0..1 (NVIDIA
    /// Dynamo's `dynamo_component_router_kv_hit_rate`); absent when not exposed or none.
    #[serde(default, skip_serializing_if = "LatencyStats::is_empty")]
    pub router_kv_hit_rate: LatencyStats,
    /// A router's estimate of the KV transfer from prefill to decode worker, seconds
    /// (`dynamo_component_router_kv_transfer_estimated_latency_seconds`), or SGLang's gateway's
    /// measured KV transfer window (`smg_pd_kv_transfer_duration_seconds`), or a vLLM worker's
    /// own NIXL transfers (`vllm:nixl_xfer_time_seconds`); absent when not exposed or none in
    /// the interval.
    #[serde(default, skip_serializing_if = "LatencyStats::is_empty")]
    pub router_kv_transfer: LatencyStats,
    /// A router's picks per worker in the interval and what it says of each worker (issue
    /// 52.5, [`crate::router_picks`]); empty when its page does not say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub router_picks: Vec<crate::router_picks::RouterPick>,
    /// An endpoint picker's flow control queue, pool saturation and ready endpoints as its
    /// last page said them (issue 52.3, [`crate::picker_pool`]); absent when it does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub picker_pool: Option<crate::picker_pool::PickerPool>,
    /// A disaggregated deployment's prefill and decode pools as its router's last page said
    /// them ([`crate::pool_load`]); absent for one pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_load: Option<crate::pool_load::PoolLoad>,
    /// Seconds since the previous scrape (`None` on the first).
    pub interval_s: Option<f64>,
    /// A counter went backwards or the start time moved: the server restarted in the interval.
    pub reset: bool,
}

fn unix_s<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    )
}

fn from_unix_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let s = f64::deserialize(d)?;
    std::time::Duration::try_from_secs_f64(s)
        .map(|o| SystemTime::UNIX_EPOCH + o)
        .map_err(|e| serde::de::Error::custom(format!("at: {s} is not a Unix time ({e})")))
}

/// Increase of a counter from `prev` to `cur`; a decrease is a reset (increase = `cur`).
/// Returns the increase and whether it was a reset.
pub fn increase(prev: Option<f64>, cur: Option<f64>) -> Option<(f64, bool)> {
    let (p, c) = (prev?, cur?);
    if c < p {
        Some((c, true))
    } else {
        Some((c - p, false))
    }
}

/// Per-interval delta of a cumulative histogram; a `_count` or bucket that went down is a reset
/// (the delta is then the current histogram). Returns the delta and whether it was a reset.
pub fn histogram_delta(prev: &Histogram, cur: &Histogram) -> (Histogram, bool) {
    let same_bounds = prev.buckets.len() == cur.buckets.len()
        && prev
            .buckets
            .iter()
            .zip(&cur.buckets)
            .all(|(a, b)| a.0 == b.0);
    let reset = cur.count < prev.count
        || !same_bounds
        || prev
            .buckets
            .iter()
            .zip(&cur.buckets)
            .any(|(a, b)| b.1 < a.1);
    if reset {
        return (cur.clone(), true);
    }
    let buckets = prev
        .buckets
        .iter()
        .zip(&cur.buckets)
        .map(|(a, b)| (b.0, b.1 - a.1))
        .collect();
    (
        Histogram {
            buckets,
            count: cur.count - prev.count,
            sum: cur.sum - prev.sum,
        },
        false,
    )
}

/// Mean, p50 and p99 of a (delta) histogram.
pub fn latency_stats(h: &Histogram) -> LatencyStats {
    let count = h.count.max(h.buckets.last().map_or(0.0, |b| b.1));
    if count <= 0.0 {
        return LatencyStats::default();
    }
    let mean = (h.sum.is_finite() && h.count > 0.0).then(|| h.sum / h.count);
    let (p50_below, p99_below) = (
        below_first_bucket(0.5, &h.buckets),
        below_first_bucket(0.99, &h.buckets),
    );
    LatencyStats {
        mean,
        p50: histogram_quantile(0.5, &h.buckets).filter(|_| p50_below.is_none()),
        p99: histogram_quantile(0.99, &h.buckets).filter(|_| p99_below.is_none()),
        count,
        p50_below,
        p99_below,
    }
}

fn stats(prev: Option<&Histogram>, cur: Option<&Histogram>, reset: &mut bool) -> LatencyStats {
    match (prev, cur) {
        (Some(p), Some(c)) => {
            let (d, r) = histogram_delta(p, c);
            *reset |= r;
            latency_stats(&d)
        }
        _ => LatencyStats::default(),
    }
}

/// The sample for `cur` read at `at`, with rates and deltas against `prev` (read at `prev_at`)
/// when there is one.
pub fn sample(prev: Option<(&Reading, SystemTime)>, cur: &Reading, at: SystemTime) -> ServerSample {
    let mut s = ServerSample {
        at,
        requests_waiting: cur.requests_waiting,
        requests_running: cur.requests_running,
        kv_cache_usage: cur.kv_cache_usage,
        preemptions_per_s: None,
        prefix_cache_hit_ratio: cur.prefix_cache_hit_ratio,
        prompt_tokens_per_s: None,
        generation_tokens_per_s: None,
        requests_per_s: None,
        ttft: LatencyStats::default(),
        itl: LatencyStats::default(),
        queue: LatencyStats::default(),
        prefill: LatencyStats::default(),
        decode: LatencyStats::default(),
        router_kv_hit_rate: LatencyStats::default(),
        router_kv_transfer: LatencyStats::default(),
        router_picks: cur
            .router_worker_readings
            .as_deref()
            .map(|c| {
                let p = prev.and_then(|(p, _)| p.router_worker_readings.as_deref());
                crate::router_picks::router_picks(p, c)
            })
            .unwrap_or_default(),
        picker_pool: cur.picker_pool,
        pool_load: cur.pool_load,
        interval_s: None,
        reset: false,
    };
    let Some((p, p_at)) = prev else {
        return s.finite();
    };
    let dt = at.duration_since(p_at).map_or(0.0, |d| d.as_secs_f64());
    if dt <= 0.0 {
        return s.finite();
    }
    s.interval_s = Some(dt);
    let (pc, cc) = (&p.counters, &cur.counters);
    let mut reset = matches!((p.process_start_time_s, cur.process_start_time_s), (Some(a), Some(b)) if (a - b).abs() > 0.5);
    let mut rate = |a: Option<f64>, b: Option<f64>| {
        increase(a, b).map(|(d, r)| {
            reset |= r;
            d / dt
        })
    };
    s.preemptions_per_s = rate(pc.preemptions, cc.preemptions);
    s.prompt_tokens_per_s = rate(pc.prompt_tokens, cc.prompt_tokens);
    s.generation_tokens_per_s = rate(pc.generation_tokens, cc.generation_tokens);
    s.requests_per_s = rate(pc.requests, cc.requests);
    let hits = rate(pc.prefix_hits, cc.prefix_hits);
    let queries = rate(pc.prefix_queries, cc.prefix_queries);
    if s.prefix_cache_hit_ratio.is_none()
        && let (Some(h), Some(q)) = (hits, queries)
        && q > 0.0
    {
        s.prefix_cache_hit_ratio = Some((h / q).clamp(0.0, 1.0));
    }
    let (ph, ch) = (&p.histograms, &cur.histograms);
    s.ttft = stats(ph.ttft.as_ref(), ch.ttft.as_ref(), &mut reset);
    s.itl = stats(ph.itl.as_ref(), ch.itl.as_ref(), &mut reset);
    s.queue = stats(ph.queue.as_ref(), ch.queue.as_ref(), &mut reset);
    s.prefill = stats(ph.prefill.as_ref(), ch.prefill.as_ref(), &mut reset);
    s.decode = stats(ph.decode.as_ref(), ch.decode.as_ref(), &mut reset);
    // The router's own histograms restart with the frontend, not with a worker: they say
    // nothing of a restart.
    let mut router_reset = false;
    s.router_kv_hit_rate = stats(
        ph.router_kv_hit_rate.as_ref(),
        ch.router_kv_hit_rate.as_ref(),
        &mut router_reset,
    );
    s.router_kv_transfer = stats(
        ph.router_kv_transfer.as_ref(),
        ch.router_kv_transfer.as_ref(),
        &mut router_reset,
    );
    s.reset = reset;
    s.finite()
}

impl ServerSample {
    /// Every figure finite or `None` (sums of absurd page values can overflow).
    fn finite(mut self) -> Self {
        let f = |v: &mut Option<f64>| {
            if v.is_some_and(|x| !x.is_finite()) {
                *v = None;
            }
        };
        for v in [
            &mut self.requests_waiting,
            &mut self.requests_running,
            &mut self.kv_cache_usage,
            &mut self.preemptions_per_s,
            &mut self.prefix_cache_hit_ratio,
            &mut self.prompt_tokens_per_s,
            &mut self.generation_tokens_per_s,
            &mut self.requests_per_s,
        ] {
            f(v);
        }
        for l in [
            &mut self.ttft,
            &mut self.itl,
            &mut self.queue,
            &mut self.prefill,
            &mut self.decode,
            &mut self.router_kv_hit_rate,
            &mut self.router_kv_transfer,
        ] {
            f(&mut l.mean);
            f(&mut l.p50);
            f(&mut l.p99);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn counter_reset_counts_the_new_value() {
        assert_eq!(increase(Some(10.0), Some(15.0)), Some((5.0, false)));
        assert_eq!(increase(Some(10.0), Some(3.0)), Some((3.0, true)));
        assert_eq!(increase(None, Some(3.0)), None);
    }

    #[test]
    fn histogram_delta_and_reset() {
        let inf = f64::INFINITY;
        let a = Histogram {
            buckets: vec![(1.0, 2.0), (inf, 4.0)],
            count: 4.0,
            sum: 3.0,
        };
        let b = Histogram {
            buckets: vec![(1.0, 5.0), (inf, 10.0)],
            count: 10.0,
            sum: 9.0,
        };
        let (d, r) = histogram_delta(&a, &b);
        assert!(!r);
        assert_eq!(
            d,
            Histogram {
                buckets: vec![(1.0, 3.0), (inf, 6.0)],
                count: 6.0,
                sum: 6.0
            }
        );
        let (d, r) = histogram_delta(&b, &a);
        assert!(r);
        assert_eq!(d, a);
    }

    #[test]
    fn first_scrape_has_no_rates_and_reset_is_flagged() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let mut r = crate::normalize::normalize(
            &crate::parse::parse("vllm:prompt_tokens_total 100\nvllm:num_requests_waiting 2\n")
                .unwrap(),
            None,
        );
        let s = sample(None, &r, t0);
        assert_eq!(
            (s.requests_waiting, s.prompt_tokens_per_s, s.interval_s),
            (Some(2.0), None, None)
        );
        let prev = r.clone();
        r.counters.prompt_tokens = Some(40.0);
        let s = sample(Some((&prev, t0)), &r, t0 + Duration::from_secs(2));
        assert_eq!(s.prompt_tokens_per_s, Some(20.0));
        assert!(s.reset);
        assert_eq!(s.generation_tokens_per_s, None);
    }
}
