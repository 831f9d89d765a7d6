//! The GenAI client metrics and lmperf's canary counters, recorded for every request whether
//! or not its trace is kept.
//!
//! Instruments and bucket boundaries follow the GenAI semantic conventions ("Generative AI
//! client metrics"): `gen_ai.client.operation.duration` (s), `gen_ai.client.token.usage`
//! ({token}, by `gen_ai.token.type`), `gen_ai.client.operation.time_to_first_chunk` (s) and
//! `gen_ai.client.operation.time_per_output_chunk` (s, one value per chunk after the first).

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter};

use super::names as n;
use crate::measure::Measured;

/// The instruments.
#[derive(Debug, Clone)]
pub struct Instruments {
    duration: Histogram<f64>,
    token_usage: Histogram<u64>,
    time_to_first_chunk: Histogram<f64>,
    time_per_output_chunk: Histogram<f64>,
    ttft_segment: Histogram<f64>,
    requests: Counter<u64>,
    retries: Counter<u64>,
    skipped: Counter<u64>,
    injected: Counter<u64>,
    probes: Counter<u64>,
    probe_ttft: Histogram<f64>,
    direct: Counter<u64>,
    path_overhead: Gauge<f64>,
    worker_slowdown: Gauge<f64>,
    worker_failing: Gauge<f64>,
}

/// Attributes of one request's metric points.
#[derive(Debug, Clone)]
pub struct MetricContext<'a> {
    pub target: &'a str,
    pub operation: &'static str,
    pub provider: &'a str,
    pub request_model: &'a str,
    pub server_address: &'a str,
    pub server_port: u16,
    /// Added to every point (low cardinality): `lmperf run`'s source and benchmark name.
    pub labels: &'a [KeyValue],
}

impl Instruments {
    pub fn new(meter: &Meter) -> Self {
        Self {
            duration: meter
                .f64_histogram(n::METRIC_OPERATION_DURATION)
                .with_unit("s")
                .with_description("GenAI operation duration.")
                .with_boundaries(n::BUCKETS_OPERATION_DURATION.to_vec())
                .build(),
            token_usage: meter
                .u64_histogram(n::METRIC_TOKEN_USAGE)
                .with_unit("{token}")
                .with_description("Number of input and output tokens used.")
                .with_boundaries(n::BUCKETS_TOKEN_USAGE.to_vec())
                .build(),
            time_to_first_chunk: meter
                .f64_histogram(n::METRIC_TIME_TO_FIRST_CHUNK)
                .with_unit("s")
                .with_description(
                    "Time to receive the first chunk, from when the client issues the request.",
                )
                .with_boundaries(n::BUCKETS_TIME_TO_FIRST_CHUNK.to_vec())
                .build(),
            time_per_output_chunk: meter
                .f64_histogram(n::METRIC_TIME_PER_OUTPUT_CHUNK)
                .with_unit("s")
                .with_description(
                    "Time between consecutive output chunks, for each chunk after the first.",
                )
                .with_boundaries(n::BUCKETS_TIME_PER_OUTPUT_CHUNK.to_vec())
                .build(),
            ttft_segment: meter
                .f64_histogram(n::METRIC_TTFT_SEGMENT)
                .with_unit("s")
                .with_description(
                    "A routed canary's TTFT split along the serving path (NVIDIA Dynamo's nvext.timing), by segment: frontend, router_queue, prefill, transfer_and_first_decode.",
                )
                .with_boundaries(n::BUCKETS_TIME_TO_FIRST_CHUNK.to_vec())
                .build(),
            requests: meter
                .u64_counter(n::METRIC_CANARY_REQUESTS)
                .with_unit("{request}")
                .with_description("Canary requests by outcome and error type.")
                .build(),
            retries: meter
                .u64_counter(n::METRIC_CANARY_RETRIES)
                .with_unit("{request}")
                .with_description(
                    "Canary requests re-sent once after a stale keep-alive connection.",
                )
                .build(),
            skipped: meter
                .u64_counter("lmperf.canary.skipped")
                .with_unit("{request}")
                .with_description(
                    "Scheduled canaries not sent because max_in_flight were still running.",
                )
                .build(),
            injected: meter
                .u64_counter(n::METRIC_INJECT_REQUESTS)
                .with_unit("{request}")
                .with_description(
                    "Requests injected through the control API, by outcome and error type.",
                )
                .build(),
            probes: meter
                .u64_counter(n::METRIC_WORKER_PROBE_REQUESTS)
                .with_unit("{request}")
                .with_description(
                    "Probes pinned to one worker behind a router, by worker, role, outcome and error type.",
                )
                .build(),
            probe_ttft: meter
                .f64_histogram(n::METRIC_WORKER_PROBE_TTFT)
                .with_unit("s")
                .with_description("Time to first chunk of the probes pinned to one worker.")
                .with_boundaries(n::BUCKETS_TIME_TO_FIRST_CHUNK.to_vec())
                .build(),
            direct: meter
                .u64_counter(n::METRIC_PATH_DIRECT_REQUESTS)
                .with_unit("{request}")
                .with_description("Canaries sent straight to a router target's workers.")
                .build(),
            path_overhead: meter
                .f64_gauge(n::METRIC_PATH_OVERHEAD)
                .with_unit("s")
                .with_description("Routed p50 minus direct p50 over the last minute: how much the router adds.")
                .build(),
            worker_slowdown: meter
                .f64_gauge(n::METRIC_ROUTER_WORKER_SLOWDOWN)
                .with_unit("1")
                .with_description("A router's worker's TTFT to its direct canaries or pinned probes (the median of its last 3) over the median of the other workers'.")
                .build(),
            worker_failing: meter
                .f64_gauge(n::METRIC_ROUTER_WORKER_FAILING)
                .with_unit("1")
                .with_description("1 while a router's worker failed its last 2 direct canaries or pinned probes as another answered, else 0.")
                .build(),
        }
    }

    /// Records router target `target`'s workers apart from the others: each one's slowdown
    /// against the others and whether it fails (every worker named by `a`).
    pub fn record_workers_apart(
        &self,
        target: &str,
        a: &crate::measure::workers_apart::WorkersApart,
    ) {
        let attrs = |w: &str| {
            [
                KeyValue::new(n::LMPERF_TARGET, target.to_owned()),
                KeyValue::new(n::LMPERF_WORKER_ID, w.to_owned()),
            ]
        };
        for (w, ratio) in &a.ratios {
            self.worker_slowdown.record(*ratio, &attrs(w));
        }
        let named = a.ratios.iter().map(|(w, _)| w).chain(&a.failing);
        for w in named {
            let failing = f64::from(u8::from(a.failing.contains(w)));
            self.worker_failing.record(failing, &attrs(w));
        }
    }

    /// Counts one probe pinned to worker `worker_id` in `role` (decode | prefill), and its
    /// TTFT when it had one: its own instruments, never the canary counters nor the GenAI
    /// histograms.
    pub fn record_probe(&self, target: &str, worker_id: &str, role: &'static str, m: &Measured) {
        let base = vec![
            KeyValue::new(n::LMPERF_TARGET, target.to_owned()),
            KeyValue::new(n::LMPERF_WORKER_ID, worker_id.to_owned()),
            KeyValue::new(n::LMPERF_WORKER_ROLE, role),
        ];
        if let Some(t) = m.record.ttft {
            self.probe_ttft.record(t.as_secs_f64(), &base);
        }
        let mut attrs = base;
        attrs.push(KeyValue::new(n::LMPERF_OUTCOME, m.record.outcome.as_str()));
        if let Some(e) = m.record.failure() {
            attrs.push(KeyValue::new(n::ERROR_TYPE, e.error_type.clone()));
        }
        self.probes.add(1, &attrs);
    }

    /// Counts one canary sent straight to `worker` (its base URL) of router target `target`.
    pub fn record_direct(&self, target: &str, worker: &str, m: &Measured) {
        let mut attrs = vec![
            KeyValue::new(n::LMPERF_TARGET, target.to_owned()),
            KeyValue::new(n::LMPERF_WORKER_ID, worker.to_owned()),
            KeyValue::new(n::LMPERF_OUTCOME, m.record.outcome.as_str()),
        ];
        if let Some(e) = m.record.failure() {
            attrs.push(KeyValue::new(n::ERROR_TYPE, e.error_type.clone()));
        }
        self.direct.add(1, &attrs);
    }

    /// Records router target `target`'s routed-minus-direct `metric` (`ttft` | `e2e`), seconds.
    pub fn record_path_overhead(&self, target: &str, metric: &'static str, seconds: f64) {
        self.path_overhead.record(
            seconds,
            &[
                KeyValue::new(n::LMPERF_TARGET, target.to_owned()),
                KeyValue::new(n::LMPERF_PATH_METRIC, metric),
            ],
        );
    }

    /// Records one measured request.
    pub fn record(&self, c: &MetricContext<'_>, m: &Measured) {
        let r = &m.record;
        let attrs = histogram_attrs(c, m);
        let error = r.failure();
        self.duration.record(r.e2e.as_secs_f64(), &attrs);
        if let Some(t) = r.ttft {
            self.time_to_first_chunk.record(t.as_secs_f64(), &attrs);
        }
        for w in r.token_chunk_times.windows(2) {
            self.time_per_output_chunk
                .record(w[1].saturating_sub(w[0]).as_secs_f64(), &attrs);
        }
        self.record_split(c, m);
        // Token usage: only what the server or the stream reported.
        let with_type = |ty: &'static str, v: u64| {
            let mut a = attrs.clone();
            a.push(KeyValue::new(n::GEN_AI_TOKEN_TYPE, ty));
            self.token_usage.record(v, &a);
        };
        if let Some(v) = r.input_tokens {
            with_type(n::TOKEN_TYPE_INPUT, v);
        }
        if let Some(v) = r
            .output_tokens
            .filter(|_| r.http_status.is_some_and(|s| (200..300).contains(&s)))
        {
            with_type(n::TOKEN_TYPE_OUTPUT, v);
        }
        let mut counter_attrs = vec![
            KeyValue::new(n::LMPERF_TARGET, c.target.to_owned()),
            KeyValue::new(n::GEN_AI_REQUEST_MODEL, c.request_model.to_owned()),
            KeyValue::new(n::LMPERF_OUTCOME, r.outcome.as_str()),
        ];
        counter_attrs.extend(c.labels.iter().cloned());
        if let Some(e) = error {
            counter_attrs.push(KeyValue::new(n::ERROR_TYPE, e.error_type.clone()));
        }
        self.requests.add(1, &counter_attrs);
        if m.retries > 0 {
            self.retries.add(
                u64::from(m.retries),
                &[KeyValue::new(n::LMPERF_TARGET, c.target.to_owned())],
            );
        }
    }

    /// A routed canary's TTFT segments ([`crate::measure::server_timing::TtftSplit`]), by
    /// target, segment and worker; a negative segment (clocks that disagree) counts as 0.
    fn record_split(&self, c: &MetricContext<'_>, m: &Measured) {
        let r = &m.record;
        let Some(split) = r
            .server_timing
            .zip(r.ttft)
            .and_then(|(t, ttft)| crate::measure::server_timing::TtftSplit::of(ttft, &t))
        else {
            return;
        };
        let mut attrs = vec![KeyValue::new(n::LMPERF_TARGET, c.target.to_owned())];
        if let Some(w) = r.served_by.as_ref().and_then(|b| b.primary()) {
            attrs.push(KeyValue::new(n::LMPERF_WORKER_ID, w.id.clone()));
        }
        let names = crate::measure::server_timing::TtftSplit::SEGMENTS;
        for (segment, ms) in names.into_iter().zip(split.values()) {
            let mut a = attrs.clone();
            a.push(KeyValue::new(n::LMPERF_TTFT_SEGMENT, segment));
            self.ttft_segment.record(ms.max(0.0) / 1e3, &a);
        }
    }

    /// Counts one measured injected request (only here: injected load stays out of the canary
    /// counters and the GenAI histograms, which describe the canaries).
    pub fn record_inject(&self, target: &str, m: &Measured) {
        let mut attrs = vec![
            KeyValue::new(n::LMPERF_TARGET, target.to_owned()),
            KeyValue::new(n::LMPERF_OUTCOME, m.record.outcome.as_str()),
        ];
        if let Some(e) = m.record.failure() {
            attrs.push(KeyValue::new(n::ERROR_TYPE, e.error_type.clone()));
        }
        self.injected.add(1, &attrs);
    }

    /// Counts a scheduled canary that was not sent.
    pub fn record_skipped(&self, target: &str) {
        self.skipped
            .add(1, &[KeyValue::new(n::LMPERF_TARGET, target.to_owned())]);
    }
}

/// The attributes of a request's GenAI histogram points (also the series of its exemplars).
pub fn histogram_attrs(c: &MetricContext<'_>, m: &Measured) -> Vec<KeyValue> {
    let r = &m.record;
    let mut attrs = vec![
        KeyValue::new(n::GEN_AI_OPERATION_NAME, c.operation),
        KeyValue::new(n::GEN_AI_PROVIDER_NAME, c.provider.to_owned()),
        KeyValue::new(n::GEN_AI_REQUEST_MODEL, c.request_model.to_owned()),
        KeyValue::new(n::SERVER_ADDRESS, c.server_address.to_owned()),
        KeyValue::new(n::SERVER_PORT, i64::from(c.server_port)),
        KeyValue::new(n::LMPERF_TARGET, c.target.to_owned()),
    ];
    attrs.extend(c.labels.iter().cloned());
    if let Some(model) = &r.response_model {
        attrs.push(KeyValue::new(n::GEN_AI_RESPONSE_MODEL, model.clone()));
    }
    if let Some(e) = r.failure() {
        attrs.push(KeyValue::new(n::ERROR_TYPE, e.error_type.clone()));
    }
    attrs
}

#[cfg(test)]
#[path = "genai_buckets_case.rs"]
mod genai_buckets_case;
