//! Measurement → span and metrics → export.
//!
//! [`Telemetry::record`] takes one measured request: metrics are recorded for every request
//! (before any sampling), the span is built only when the trace is sampled and goes to the
//! bounded [`export::SpanQueue`]. Metrics reach OTLP through a periodic reader on the tokio
//! runtime and `/metrics` through the Prometheus exporter, both readers of one meter provider,
//! so both show the same counts.

pub mod exemplars;
pub mod export;
pub mod k8s;
pub mod metrics;
pub mod names;
pub mod openmetrics;
pub mod spans;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SpanExporter as _;

use crate::config::{Env, OtlpConfig, OtlpProtocol};
use crate::measure::Measured;
use crate::sampler::adaptive::{Decision, Reason};
use crate::sampler::head::HeadSampler;
use export::{ExportStats, SpanQueue};
use metrics::{Instruments, MetricContext};
use spans::{SpanContextInfo, TraceIds};

/// Telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP span exporter for {endpoint}: {source}")]
    SpanExporter {
        endpoint: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("OTLP metric exporter for {endpoint}: {source}")]
    MetricExporter {
        endpoint: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("Prometheus exporter: {0}")]
    Prometheus(String),
}

/// The telemetry pipeline of the agent.
#[derive(Debug)]
pub struct Telemetry {
    pub instruments: Instruments,
    pub spans: SpanQueue,
    /// `Some` when `OTEL_TRACES_SAMPLER` is set: head sampling replaces the adaptive sampler.
    pub head_sampler: Option<HeadSampler>,
    /// Where `/metrics` reads from.
    pub registry: prometheus::Registry,
    /// Exemplars of kept traces for the OpenMetrics exposition of `/metrics`.
    pub exemplars: Arc<exemplars::ExemplarStore>,
    scope: InstrumentationScope,
    meter_provider: SdkMeterProvider,
    sampling_spans: opentelemetry::metrics::Counter<u64>,
}

/// `gen_ai.operation.name` of a target's API.
pub fn operation_name(api: crate::config::Api) -> &'static str {
    match api {
        crate::config::Api::Chat => names::OPERATION_CHAT,
        crate::config::Api::Completions => names::OPERATION_TEXT_COMPLETION,
    }
}

/// The resource: `service.name` (`lmperf` unless `OTEL_SERVICE_NAME` or
/// `OTEL_RESOURCE_ATTRIBUTES` set it), `host.name`, `k8s.node.name` / `k8s.pod.name` from the
/// downward-API variables `K8S_NODE_NAME` / `K8S_POD_NAME`, and `OTEL_RESOURCE_ATTRIBUTES`.
pub fn resource(env: &dyn Env) -> Resource {
    let mut b = Resource::builder();
    let service_from_env = env.var("OTEL_SERVICE_NAME").is_some()
        || env.var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        });
    if !service_from_env {
        b = b.with_service_name("lmperf");
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| env.var("HOSTNAME"));
    if let Some(h) = host {
        b = b.with_attribute(KeyValue::new(names::HOST_NAME, h));
    }
    if let Some(node) = env.var("K8S_NODE_NAME") {
        b = b.with_attribute(KeyValue::new(names::K8S_NODE_NAME, node));
    }
    if let Some(pod) = env.var("K8S_POD_NAME") {
        b = b.with_attribute(KeyValue::new(names::K8S_POD_NAME, pod));
    }
    b.build()
}

impl Telemetry {
    /// Builds exporters and readers. Must run inside a tokio runtime (the exporters and the
    /// export task live on it). A collector that is down is not an error here: exports fail
    /// later and are counted.
    ///
    /// # Errors
    /// When an exporter cannot be built from the configuration.
    pub fn init(cfg: &OtlpConfig, env: &dyn Env) -> Result<Self, TelemetryError> {
        crate::install_tls_provider();
        let resource = resource(env);
        let registry = prometheus::Registry::new();
        let prom = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .map_err(|e| TelemetryError::Prometheus(e.to_string()))?;
        let mut mp = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(prom);
        let spans = if cfg.enabled {
            let mut exporters = Vec::with_capacity(cfg.export_concurrency);
            for _ in 0..cfg.export_concurrency {
                let mut exporter =
                    span_exporter(cfg).map_err(|source| TelemetryError::SpanExporter {
                        endpoint: cfg.traces_endpoint.clone(),
                        source,
                    })?;
                exporter.set_resource(&resource);
                exporters.push(exporter);
            }
            let metric_exporter =
                metric_exporter(cfg).map_err(|source| TelemetryError::MetricExporter {
                    endpoint: cfg.metrics_endpoint.clone(),
                    source,
                })?;
            let reader = opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader::builder(
                metric_exporter,
                opentelemetry_sdk::runtime::Tokio,
            )
            .with_interval(cfg.export_interval)
            .build();
            mp = mp.with_reader(reader);
            SpanQueue::start_many(
                exporters,
                cfg.queue_size,
                cfg.batch_size,
                cfg.export_timeout,
            )
        } else {
            SpanQueue::disabled()
        };
        let meter_provider = mp.build();
        let scope = InstrumentationScope::builder("lmperf")
            .with_version(env!("CARGO_PKG_VERSION"))
            .with_schema_url(names::SEMCONV_SCHEMA_URL)
            .build();
        let meter = meter_provider.meter_with_scope(scope.clone());
        let instruments = Instruments::new(&meter);
        register_export_counters(&meter, spans.stats.clone());
        let head_sampler = env.var("OTEL_TRACES_SAMPLER").map(|name| {
            HeadSampler::from_env_values(Some(&name), env.var("OTEL_TRACES_SAMPLER_ARG").as_deref())
        });
        let sampling_spans = meter
            .u64_counter(names::METRIC_SAMPLING_SPANS)
            .with_unit("{span}")
            .with_description("Sampling decisions by target, reason and decision (kept or dropped); every request once.")
            .build();
        Ok(Self {
            instruments,
            spans,
            head_sampler,
            registry,
            exemplars: Arc::default(),
            scope,
            meter_provider,
            sampling_spans,
        })
    }

    /// New trace ids for a request about to be sent. With the adaptive sampler the
    /// `traceparent` says "sampled" (the span may be kept); a head sampler decides here.
    pub fn new_trace(&self) -> TraceIds {
        TraceIds::random(&self.head_sampler.unwrap_or(HeadSampler::AlwaysOn))
    }

    /// The instrumentation scope of the agent's spans.
    pub fn scope(&self) -> &InstrumentationScope {
        &self.scope
    }

    /// The meter of the agent's own instruments (for other sources' metrics).
    pub fn meter(&self) -> opentelemetry::metrics::Meter {
        self.meter_provider.meter_with_scope(self.scope.clone())
    }

    /// Records the metrics of a measured request (always) and, when `decision` keeps it,
    /// queues its span.
    pub fn record(
        &self,
        info: &SpanContextInfo<'_>,
        ids: TraceIds,
        m: &Measured,
        decision: &Decision,
    ) {
        self.record_labeled(info, ids, m, decision, &[]);
    }

    /// [`Telemetry::record`] with `labels` added to every metric point (low cardinality, e.g.
    /// `lmperf.request.source`; a span carries its own in `info.extra`).
    pub fn record_labeled(
        &self,
        info: &SpanContextInfo<'_>,
        ids: TraceIds,
        m: &Measured,
        decision: &Decision,
        labels: &[KeyValue],
    ) {
        let mc = MetricContext {
            labels,
            target: info.target,
            operation: info.operation,
            provider: info.provider,
            request_model: info.request_model,
            server_address: info.server_address,
            server_port: info.server_port,
        };
        self.instruments.record(&mc, m);
        if self.record_span(info, ids, m, decision) {
            // Only a trace that was kept and queued gets exemplars: they must resolve.
            let r = &m.record;
            self.exemplars.offer_request(
                &metrics::histogram_attrs(&mc, m),
                exemplars::KeptRequest {
                    trace_id: ids.trace_id,
                    span_id: ids.span_id,
                    end: m
                        .wall_start
                        .checked_add(r.e2e)
                        .unwrap_or_else(std::time::SystemTime::now),
                    e2e: r.e2e,
                    ttft: r.ttft,
                },
                r.token_chunk_times
                    .windows(2)
                    .map(|w| w[1].saturating_sub(w[0])),
            );
        }
    }

    /// Counts the sampling decision of a measured request and, when it keeps it, queues its
    /// span (no GenAI metric: [`Telemetry::record`] adds those for canaries). True when the
    /// span was queued for export.
    pub fn record_span(
        &self,
        info: &SpanContextInfo<'_>,
        ids: TraceIds,
        m: &Measured,
        decision: &Decision,
    ) -> bool {
        self.sampling_spans.add(
            1,
            &[
                KeyValue::new(names::LMPERF_TARGET, info.target.to_owned()),
                KeyValue::new(names::LMPERF_SAMPLING_REASON, decision.reason.as_str()),
                KeyValue::new(
                    names::LMPERF_SAMPLING_DECISION,
                    if decision.keep { "kept" } else { "dropped" },
                ),
            ],
        );
        if !decision.keep {
            return false;
        }
        let e = self.spans.enqueue(
            spans::build_span(ids, info, m, decision, &self.scope),
            decision.reason,
        );
        // A trace evicted from the queue is never exported: its exemplars must go.
        if let Some(t) = e.evicted {
            self.exemplars.forget_trace(t);
        }
        e.queued
    }

    /// Flushes spans and metrics within `timeout`, then stops the exporters. A collector that
    /// is down makes this return at the deadline, never later.
    pub async fn shutdown(&self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        self.spans.shutdown(timeout).await;
        let mp = self.meter_provider.clone();
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_millis(200));
        let flush = tokio::task::spawn_blocking(move || mp.shutdown_with_timeout(left));
        match tokio::time::timeout(left, flush).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "Metric flush at shutdown failed."),
            Ok(Err(e)) => tracing::warn!(error = %e, "Metric flush task failed."),
            Err(_) => tracing::warn!("Metric flush at shutdown timed out."),
        }
    }
}

fn span_exporter(
    cfg: &OtlpConfig,
) -> Result<opentelemetry_otlp::SpanExporter, opentelemetry_otlp::ExporterBuildError> {
    match cfg.protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(cfg.traces_endpoint.clone())
            .with_timeout(cfg.export_timeout)
            .build(),
        OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(cfg.traces_endpoint.clone())
            .with_timeout(cfg.export_timeout)
            .build(),
    }
}

fn metric_exporter(
    cfg: &OtlpConfig,
) -> Result<opentelemetry_otlp::MetricExporter, opentelemetry_otlp::ExporterBuildError> {
    match cfg.protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(cfg.metrics_endpoint.clone())
            .with_timeout(cfg.export_timeout)
            .build(),
        OtlpProtocol::HttpProtobuf => opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(cfg.metrics_endpoint.clone())
            .with_timeout(cfg.export_timeout)
            .build(),
    }
}

/// `lmperf.export.spans{lmperf.export.result=exported|failed}` and
/// `lmperf.export.spans{lmperf.export.result=dropped_queue_full, lmperf.sampling.reason=…}`.
fn register_export_counters(meter: &opentelemetry::metrics::Meter, stats: Arc<ExportStats>) {
    let _counter = meter
        .u64_observable_counter(names::METRIC_EXPORT_SPANS)
        .with_unit("{span}")
        .with_description("Spans by export result: exported, dropped because the queue was full, or failed to export.")
        .with_callback(move |obs| {
            for (result, v) in [("exported", &stats.exported), ("failed", &stats.failed)] {
                obs.observe(v.load(Ordering::Relaxed), &[KeyValue::new(names::LMPERF_EXPORT_RESULT, result)]);
            }
            for r in Reason::ALL {
                obs.observe(
                    stats.dropped[r.index()].load(Ordering::Relaxed),
                    &[KeyValue::new(names::LMPERF_EXPORT_RESULT, "dropped_queue_full"), KeyValue::new(names::LMPERF_SAMPLING_REASON, r.as_str())],
                );
            }
        })
        .build();
}
