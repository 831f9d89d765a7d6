//! Span and metric export of `lmperf run` (`--otlp-endpoint`, or the `OTEL_EXPORTER_OTLP_*`
//! variables): every benchmark request becomes the agent's GenAI CLIENT span and GenAI client
//! metric points, through the agent's own [`Telemetry`] (same builders, same exporters), with
//! `lmperf.request.source=bench` and `lmperf.benchmark` on spans and metric points. Every span
//! is kept (reason `error` for failures, else `head`: no sampling in a benchmark); everything is
//! flushed before `lmperf run` exits.

use std::time::Duration;

use opentelemetry::KeyValue;

use crate::config::{Env, OtlpConfig, TargetConfig};
use crate::measure::Measured;
use crate::measure::Outcome;
use crate::sampler::adaptive::{Decision, Reason};
use crate::telemetry::names as n;
use crate::telemetry::spans::{SpanContextInfo, TraceIds};
use crate::telemetry::{Telemetry, TelemetryError};

/// Spans waiting for export at most during a run (a benchmark keeps every span).
pub const BENCH_QUEUE_SIZE: usize = 65_536;
/// Time given to the final flush.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// The export of one `lmperf run`.
#[derive(Debug)]
pub struct BenchTelemetry {
    telemetry: Telemetry,
}

/// What a benchmark request's span and points say besides its measurement.
#[derive(Debug, Clone, Copy)]
pub struct RequestContext<'a> {
    pub target: &'a TargetConfig,
    pub model: &'a str,
    pub benchmark: &'a str,
    pub max_tokens: u32,
    pub index: usize,
}

impl BenchTelemetry {
    /// Builds the exporters (inside the tokio runtime); the queue holds up to
    /// [`BENCH_QUEUE_SIZE`] spans.
    ///
    /// # Errors
    /// When an exporter cannot be built from the configuration.
    pub fn start(cfg: &OtlpConfig, env: &dyn Env) -> Result<Self, TelemetryError> {
        let mut cfg = cfg.clone();
        cfg.queue_size = cfg.queue_size.max(BENCH_QUEUE_SIZE);
        Ok(Self {
            telemetry: Telemetry::init(&cfg, env)?,
        })
    }

    /// Ids of a request about to be sent (its `traceparent`), always sampled.
    pub fn new_trace() -> TraceIds {
        TraceIds::random(&crate::sampler::head::HeadSampler::AlwaysOn)
    }

    /// Records one measured request: its metric points and its span.
    pub fn record(&self, c: &RequestContext<'_>, ids: TraceIds, m: &Measured) {
        let labels = [
            KeyValue::new(n::LMPERF_REQUEST_SOURCE, n::REQUEST_SOURCE_BENCH),
            KeyValue::new(n::LMPERF_BENCHMARK, c.benchmark.to_owned()),
        ];
        let provider = c
            .target
            .provider
            .clone()
            .unwrap_or_else(|| "openai".to_owned());
        let prompt_id = format!("{}/{}", c.benchmark, c.index);
        let info = SpanContextInfo {
            target: &c.target.name,
            operation: crate::telemetry::operation_name(c.target.api),
            provider: &provider,
            request_model: c.model,
            max_tokens: c.max_tokens,
            server_address: &c.target.host,
            server_port: c.target.port,
            prompt_id: &prompt_id,
            events: Vec::new(),
            extra: labels.to_vec(),
        };
        let failed = m.record.outcome != Outcome::Ok;
        let decision = Decision {
            keep: true,
            reason: if failed { Reason::Error } else { Reason::Head },
            probability: 1.0,
            transition: None,
            spike: None,
        };
        self.telemetry
            .record_labeled(&info, ids, m, &decision, &labels);
    }

    /// Flushes spans and metrics (at most [`FLUSH_TIMEOUT`]) and stops the exporters.
    pub async fn shutdown(&self) {
        self.telemetry.shutdown(FLUSH_TIMEOUT).await;
    }
}
