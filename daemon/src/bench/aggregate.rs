//! Bounded summary statistics: `summary.json`'s distributions and counts of a benchmark of
//! any length, fed one request at a time ([`Summarizer`]), in memory that does not grow with
//! the request or ITL count.
//!
//! Each distribution is an [`Accumulator`]: count, mean, population standard deviation, min
//! and max are exact (running sums, Welford's update); percentiles come from an HDR histogram
//! (the `hdrhistogram` crate, Gil Tene's HdrHistogram) at [`SIGNIFICANT_DIGITS`] significant
//! digits, interpolated linearly between the two nearest ranks as numpy's default `linear`
//! method (and `vllm bench serve`) does. Precision: a percentile differs from the exact one of
//! [`super::stats::percentile`] by at most 0.1 % of its value (values are recorded in
//! millionths of their unit, so also at most 10⁻⁶ of the unit near 0, e.g. 1 ns for a value in
//! milliseconds); rank 0 and the last rank are the exact min and max. Exact values stay in
//! `requests.jsonl`. Memory: one histogram per distribution, about 200 KB for values from 1 ns
//! to an hour in ms, whatever the count (`cargo bench -p lmperf --bench summary_memory`).
//! Pure: no clock, no IO.

use std::collections::BTreeMap;

use super::{Goodput, RequestRow};

pub use super::accumulator::{Accumulator, SIGNIFICANT_DIGITS};

/// One benchmark's `summary.json` figures, fed request by request ([`Summarizer::push`]) and
/// read once ([`Summarizer::finish`]); the same figures [`super::summarize`] gives for the
/// same rows (its implementation).
#[derive(Debug, Clone, Default)]
pub struct Summarizer {
    goodput: Goodput,
    num_requests: usize,
    completed: usize,
    meets_goodput: usize,
    errors: BTreeMap<String, usize>,
    errors_by_status: BTreeMap<String, usize>,
    errors_by_status_and_type: BTreeMap<String, BTreeMap<String, usize>>,
    error_messages: BTreeMap<String, String>,
    /// Failed requests the server failed for memory ([`super::oom`]).
    oom: usize,
    /// Per repeat: first send, last end (ms).
    spans: BTreeMap<usize, (f64, f64)>,
    total_input_tokens: u64,
    total_output_tokens: u64,
    output_tokens_target_sum: f64,
    output_tokens_short: usize,
    ttft_ms: Accumulator,
    ttfo_ms: Accumulator,
    itl_ms: Accumulator,
    tpot_ms: Accumulator,
    e2el_ms: Accumulator,
    ttft_from_schedule_ms: Accumulator,
    e2el_from_schedule_ms: Accumulator,
    dispatch_delay_ms: Accumulator,
    output_tokens: Accumulator,
    output_tokens_target: Accumulator,
    prompt_tokens: Accumulator,
    prompt_tokens_mismatch: usize,
    /// Per adapter, per endpoint, probes ([`super::groups`]).
    groups: super::groups::Groups,
    workload: super::workload_stats::WorkloadStats,
    server_timing: super::server_timing::ServerTimingStats,
}

/// What [`Summarizer::finish`] needs from the run besides the rows.
#[derive(Debug, Clone, Copy)]
pub struct BenchShape<'a> {
    pub name: &'a str,
    pub concurrency: usize,
    pub input_len: u32,
    /// `output_len` of the summary: `None` to report the mean asked per request (length
    /// distributions, traces), else the run's `--output-len`.
    pub output_len: Option<u32>,
    pub request_rate: Option<f64>,
}

/// `part` ÷ `whole`, 0 for none.
fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

impl Summarizer {
    /// `goodput`: the `--goodput` SLOs requests are checked against.
    pub fn new(goodput: Goodput) -> Self {
        Self {
            goodput,
            ..Self::default()
        }
    }

    /// Adds one request (successful requests feed the latency statistics).
    pub fn push(&mut self, r: &RequestRow) {
        // A probe counts in its own block only.
        if self.groups.push(r, self.goodput) {
            return;
        }
        self.num_requests += 1;
        self.workload.push(r);
        let s = self.spans.entry(r.repeat).or_insert((f64::INFINITY, 0.0));
        *s = (s.0.min(r.send_ms), s.1.max(r.send_ms + r.e2el_ms));
        self.dispatch_delay_ms.record(r.dispatch_delay_ms);
        self.output_tokens_target
            .record(f64::from(r.output_tokens_target));
        self.output_tokens_target_sum += f64::from(r.output_tokens_target);
        self.prompt_tokens.record(f64::from(r.prompt_tokens));
        self.prompt_tokens_mismatch += usize::from(r.prompt_tokens_mismatch());
        if r.outcome != "ok" {
            let error_type = r.error_type.clone().unwrap_or_else(|| r.outcome.to_owned());
            let status = r
                .http_status
                .map_or_else(|| "none".to_owned(), |s| s.to_string());
            let server_type = r
                .error_server_type
                .clone()
                .unwrap_or_else(|| error_type.clone());
            if let Some(m) = r.error_message.as_deref().filter(|m| !m.is_empty()) {
                self.error_messages
                    .entry(format!("{status} {server_type}"))
                    .or_insert_with(|| m.to_owned());
            }
            *self
                .errors_by_status_and_type
                .entry(status.clone())
                .or_default()
                .entry(server_type)
                .or_insert(0) += 1;
            *self.errors_by_status.entry(status).or_insert(0) += 1;
            *self.errors.entry(error_type).or_insert(0) += 1;
            self.oom += usize::from(super::oom::out_of_memory(
                r.error_server_type.as_deref(),
                r.error_code.as_deref(),
                r.error_message.as_deref(),
            ));
            return;
        }
        self.completed += 1;
        self.server_timing.push(r);
        self.total_output_tokens += r.output_tokens.unwrap_or(0);
        self.total_input_tokens += r.input_tokens.unwrap_or(0);
        let g = self.goodput;
        if g.ttft_ms.is_none_or(|s| r.ttft_ms.is_some_and(|v| v <= s))
            && g.tpot_ms.is_none_or(|s| r.tpot_ms.is_none_or(|v| v <= s))
            && g.e2el_ms.is_none_or(|s| r.e2el_ms <= s)
        {
            self.meets_goodput += 1;
        }
        if let Some(v) = r.ttft_ms {
            self.ttft_ms.record(v);
        }
        if let Some(v) = r.time_to_first_content_ms {
            self.ttfo_ms.record(v);
        }
        for v in &r.itl_ms {
            self.itl_ms.record(*v);
        }
        if let Some(v) = r.tpot_ms {
            self.tpot_ms.record(v);
        }
        self.e2el_ms.record(r.e2el_ms);
        if let Some(v) = r.ttft_from_schedule_ms {
            self.ttft_from_schedule_ms.record(v);
        }
        self.e2el_from_schedule_ms.record(r.e2el_from_schedule_ms);
        if let Some(v) = r.output_tokens {
            self.output_tokens.record(v as f64);
            if v < u64::from(r.output_tokens_target) {
                self.output_tokens_short += 1;
            }
        }
    }

    /// Bytes the histograms take now (the bounded part of the summary).
    pub fn histogram_bytes(&self) -> usize {
        [
            &self.ttft_ms,
            &self.ttfo_ms,
            &self.itl_ms,
            &self.tpot_ms,
            &self.e2el_ms,
            &self.ttft_from_schedule_ms,
            &self.e2el_from_schedule_ms,
            &self.dispatch_delay_ms,
            &self.output_tokens,
            &self.output_tokens_target,
            &self.prompt_tokens,
        ]
        .iter()
        .map(|a| a.histogram_bytes())
        .sum()
    }

    /// The benchmark's summary (no VRAM, server or repeat block: the caller adds those).
    pub fn finish(&self, shape: BenchShape<'_>) -> super::BenchSummary {
        // First send to last end of each repeat (their offsets restart), summed.
        let duration_s = if self.num_requests == 0 {
            0.0
        } else {
            (self.spans.values().map(|(a, b)| b - a).sum::<f64>() / 1000.0).max(1e-9)
        };
        let g = self.goodput;
        let goodput = (g.ttft_ms.is_some() || g.tpot_ms.is_some() || g.e2el_ms.is_some())
            .then(|| self.meets_goodput as f64 / duration_s);
        let groups = self.groups.finish(g);
        super::BenchSummary {
            benchmark: shape.name.to_owned(),
            concurrency: shape.concurrency,
            input_len: shape.input_len,
            output_len: shape.output_len.unwrap_or_else(|| {
                (self.output_tokens_target_sum / self.num_requests.max(1) as f64).round() as u32
            }),
            request_rate: shape
                .request_rate
                .map_or(serde_json::Value::from("inf"), serde_json::Value::from),
            num_requests: self.num_requests,
            completed: self.completed,
            errors: self.errors.clone(),
            errors_by_status: self.errors_by_status.clone(),
            errors_by_status_and_type: self.errors_by_status_and_type.clone(),
            error_messages: self.error_messages.clone(),
            error_rate: share(self.num_requests - self.completed, self.num_requests),
            oom: self.oom,
            oom_rate: share(self.oom, self.num_requests),
            offered: None,
            duration_s,
            request_throughput: self.completed as f64 / duration_s,
            output_token_throughput: self.total_output_tokens as f64 / duration_s,
            total_input_tokens: self.total_input_tokens,
            total_output_tokens: self.total_output_tokens,
            goodput,
            ttft_ms: self.ttft_ms.distribution(),
            ttfo_ms: self.ttfo_ms.distribution(),
            itl_ms: self.itl_ms.distribution(),
            tpot_ms: self.tpot_ms.distribution(),
            e2el_ms: self.e2el_ms.distribution(),
            ttft_from_schedule_ms: self.ttft_from_schedule_ms.distribution(),
            e2el_from_schedule_ms: self.e2el_from_schedule_ms.distribution(),
            dispatch_delay_ms: self.dispatch_delay_ms.distribution(),
            output_tokens: self.output_tokens.distribution(),
            output_tokens_target: self.output_tokens_target.distribution(),
            output_tokens_short: self.output_tokens_short,
            prompt_tokens: self.prompt_tokens.distribution(),
            prompt_tokens_mismatch: self.prompt_tokens_mismatch,
            vram: None,
            server: None,
            repeat: None,
            warmup_requests: 0,
            warmup_s: 0.0,
            prepare_s: 0.0,
            adapters: groups.adapters,
            endpoints: groups.endpoints,
            workers: groups.workers,
            probes: groups.probes,
            prefix_cache: self.workload.prefix_cache(),
            images: self.workload.images(),
            server_timing: self.server_timing.finish(),
            path: None,
        }
    }
}

impl super::BenchSummary {
    /// The failures by status and server type with the server's first message:
    /// `3 × 400 exceed_context_size_error: request (3001 tokens) exceeds …`.
    pub fn error_reasons(&self) -> Vec<String> {
        self.errors_by_status_and_type
            .iter()
            .flat_map(|(status, types)| {
                types.iter().map(move |(t, n)| {
                    let key = format!("{status} {t}");
                    match self.error_messages.get(&key) {
                        Some(m) => format!("{n} × {key}: {m}"),
                        None => format!("{n} × {key}"),
                    }
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::stats::{Distribution, percentile};
    use super::*;

    fn exact(values: &[f64], q: f64) -> f64 {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        percentile(&v, q)
    }

    /// Against the exact percentiles (numpy's linear method) on latency-like samples of every
    /// size: within 0.1 % (3 significant digits), min / max / mean / std exact.
    #[test]
    fn percentiles_within_the_stated_precision() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut rnd = move || rng.random::<f64>();
        for n in [1usize, 2, 3, 10, 101, 1000, 100_000] {
            // Log-normal-ish ms: 0.01 ms … several s, plus exact ties.
            let values: Vec<f64> = (0..n)
                .map(|i| {
                    if i % 17 == 0 {
                        25.0
                    } else {
                        (rnd() * 12.0 - 4.0).exp()
                    }
                })
                .collect();
            let mut a = Accumulator::new();
            values.iter().for_each(|v| a.record(*v));
            let d = a.distribution().unwrap();
            let e = Distribution::of(&values).unwrap();
            assert_eq!((d.count, d.min, d.max), (e.count, e.min, e.max));
            assert!(
                (d.mean - e.mean).abs() <= 1e-9 * e.mean.abs().max(1.0),
                "{n}"
            );
            assert!((d.std - e.std).abs() <= 1e-9 * e.std.abs().max(1.0), "{n}");
            for (q, got) in [0.5, 0.9, 0.95, 0.99, 0.999]
                .iter()
                .zip([d.p50, d.p90, d.p95, d.p99, d.p99_9])
            {
                let want = exact(&values, *q);
                assert!(
                    (got - want).abs() <= 1e-3 * want.abs() + 1e-6,
                    "n={n} q={q}: {got} vs exact {want}"
                );
            }
        }
        // Case 05: [120, 140] → p50 130 exactly (the ends are the exact min and max).
        let mut a = Accumulator::new();
        [120.0, 140.0].iter().for_each(|v| a.record(*v));
        let d = a.distribution().unwrap();
        assert_eq!((d.mean, d.p50, d.min, d.max), (130.0, 130.0, 120.0, 140.0));
        assert!((d.std - 10.0).abs() < 1e-9);
        assert_eq!(Accumulator::new().distribution(), None);
        let mut a = Accumulator::new();
        a.record(f64::NAN);
        assert_eq!(a.distribution(), None);
    }

    /// Counts, errors by type and status, throughput, goodput over the repeats' spans.
    #[test]
    fn summary_counts_errors_and_goodput() {
        let ok = |repeat, send_ms, ttft, e2el| RequestRow {
            outcome: "ok",
            repeat,
            send_ms,
            ttft_ms: Some(ttft),
            e2el_ms: e2el,
            itl_ms: vec![10.0, 30.0],
            tpot_ms: Some(20.0),
            output_tokens: Some(3),
            input_tokens: Some(8),
            output_tokens_target: 4,
            ..RequestRow::default()
        };
        let failed = RequestRow {
            outcome: "error",
            error_type: Some("http.400".into()),
            http_status: Some(400),
            error_server_type: Some("exceed_context_size_error".into()),
            error_message: Some(
                "request (3001 tokens) exceeds the available context size (2048 tokens)".into(),
            ),
            send_ms: 500.0,
            e2el_ms: 100.0,
            output_tokens_target: 8,
            ..RequestRow::default()
        };
        let mut s = Summarizer::new(Goodput {
            ttft_ms: Some(100.0),
            tpot_ms: None,
            e2el_ms: None,
        });
        // Repeat 0 spans 0 … 1000 ms, repeat 1 spans 0 … 1000 ms: 2 s in all.
        for r in [ok(0, 0.0, 50.0, 1000.0), failed, ok(1, 0.0, 150.0, 1000.0)] {
            s.push(&r);
        }
        let b = s.finish(BenchShape {
            name: "b",
            concurrency: 2,
            input_len: 8,
            output_len: None,
            request_rate: Some(4.0),
        });
        assert_eq!((b.num_requests, b.completed, b.output_len), (3, 2, 5));
        assert_eq!(
            (b.duration_s, b.request_throughput, b.goodput),
            (2.0, 1.0, Some(0.5))
        );
        assert_eq!(
            (
                b.total_output_tokens,
                b.total_input_tokens,
                b.output_tokens_short
            ),
            (6, 16, 2)
        );
        assert_eq!(
            serde_json::json!(b.errors),
            serde_json::json!({"http.400": 1})
        );
        assert_eq!(
            serde_json::json!(b.errors_by_status_and_type),
            serde_json::json!({"400": {"exceed_context_size_error": 1}})
        );
        assert_eq!(
            b.error_reasons(),
            vec!["1 × 400 exceed_context_size_error: request (3001 tokens) exceeds the available context size (2048 tokens)".to_owned()]
        );
        let itl = b.itl_ms.unwrap();
        assert_eq!(
            (itl.count, itl.min, itl.max, itl.mean, itl.p50),
            (4, 10.0, 30.0, 20.0, 20.0)
        );
        assert_eq!(
            b.ttft_ms.map(|d| d.count),
            Some(2),
            "failed requests give no latency"
        );
        assert_eq!(b.prompt_tokens.map(|d| d.count), Some(3));
    }

    /// Two accumulators merged give the figures of one fed every value.
    #[test]
    fn merge_equals_one_accumulator() {
        let values: Vec<f64> = (0..5000).map(|i| f64::from(i % 977) * 0.37 + 1.0).collect();
        let (mut whole, mut a, mut b) =
            (Accumulator::new(), Accumulator::new(), Accumulator::new());
        for (i, v) in values.iter().enumerate() {
            whole.record(*v);
            if i < 1200 { a.record(*v) } else { b.record(*v) }
        }
        a.merge(&b);
        a.merge(&Accumulator::new());
        let (m, w) = (a.distribution().unwrap(), whole.distribution().unwrap());
        assert_eq!(
            (m.count, m.min, m.max, m.p50, m.p99, m.p99_9),
            (w.count, w.min, w.max, w.p50, w.p99, w.p99_9)
        );
        assert!(
            (m.mean - w.mean).abs() < 1e-9 && (m.std - w.std).abs() < 1e-9,
            "{m:?} vs {w:?}"
        );
        let mut empty = Accumulator::new();
        empty.merge(&whole);
        assert_eq!(empty.distribution(), whole.distribution());
    }

    /// Memory does not grow with the count: a million values take the histogram of a hundred.
    #[test]
    fn memory_is_bounded_by_the_value_range() {
        let mut a = Accumulator::new();
        for i in 0..100 {
            a.record(f64::from(i) * 37.0 + 0.5);
        }
        let small = a.histogram_bytes();
        for i in 0..1_000_000u32 {
            a.record(f64::from(i % 3700) + 0.25);
        }
        assert_eq!(a.histogram_bytes(), small);
        assert!(small < 256 << 10, "{small} bytes");
    }
}
