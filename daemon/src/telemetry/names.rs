//! Every exported attribute and metric name, in one place.
//!
//! **API Boundary:** dashboards, alerts and users' queries depend on these strings. The GenAI
//! semantic conventions are still in development (OpenTelemetry `semantic-conventions-genai`,
//! "Semantic conventions for generative AI client spans/metrics"), so when they rename
//! something, this is the only file that changes.
//!
//! Names the conventions lack carry the `lmperf.` prefix.

// ---- Span and metric attributes from the OpenTelemetry GenAI conventions ----
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
pub const GEN_AI_REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
pub const GEN_AI_REQUEST_STREAM: &str = "gen_ai.request.stream";
pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
/// Seconds from the request to the first chunk that carries generated output.
pub const GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub const GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: &str = "gen_ai.usage.reasoning.output_tokens";
pub const GEN_AI_TOKEN_TYPE: &str = "gen_ai.token.type";
pub const SERVER_ADDRESS: &str = "server.address";
pub const SERVER_PORT: &str = "server.port";
pub const ERROR_TYPE: &str = "error.type";
pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";

/// Values of `gen_ai.operation.name`.
pub const OPERATION_CHAT: &str = "chat";
pub const OPERATION_TEXT_COMPLETION: &str = "text_completion";
/// Values of `gen_ai.token.type`.
pub const TOKEN_TYPE_INPUT: &str = "input";
pub const TOKEN_TYPE_OUTPUT: &str = "output";

// ---- lmperf's own span attributes (what the conventions lack) ----
/// Target name as configured (low cardinality).
pub const LMPERF_TARGET: &str = "lmperf.target";
/// Request outcome: ok | error | aborted | timeout | cancelled.
pub const LMPERF_OUTCOME: &str = "lmperf.outcome";
/// Seconds from the request to the first chunk with visible content (not reasoning).
pub const LMPERF_TIME_TO_FIRST_CONTENT: &str = "lmperf.time_to_first_content";
pub const LMPERF_ITL_MEAN: &str = "lmperf.itl.mean";
pub const LMPERF_ITL_MAX: &str = "lmperf.itl.max";
pub const LMPERF_TPOT: &str = "lmperf.tpot";
pub const LMPERF_E2E: &str = "lmperf.e2e";
pub const LMPERF_TOKEN_CHUNKS: &str = "lmperf.token_chunks";
/// Where the token counts come from: server | chunks.
pub const LMPERF_USAGE_SOURCE: &str = "lmperf.usage.source";
/// Times the request was re-sent after a reused connection turned out stale.
pub const LMPERF_RETRIES: &str = "lmperf.retries";
pub const LMPERF_ERROR_MESSAGE: &str = "lmperf.error.message";
pub const LMPERF_ERROR_CODE: &str = "lmperf.error.code";
pub const LMPERF_PROMPT_ID: &str = "lmperf.prompt.id";

// ---- Metrics from the GenAI conventions (client side only; `gen_ai.server.*` is the server's) ----
pub const METRIC_OPERATION_DURATION: &str = "gen_ai.client.operation.duration";
pub const METRIC_TOKEN_USAGE: &str = "gen_ai.client.token.usage";
pub const METRIC_TIME_TO_FIRST_CHUNK: &str = "gen_ai.client.operation.time_to_first_chunk";
pub const METRIC_TIME_PER_OUTPUT_CHUNK: &str = "gen_ai.client.operation.time_per_output_chunk";

// ---- lmperf's own metrics ----
/// Counter of canary requests by `lmperf.outcome` and `error.type`.
pub const METRIC_CANARY_REQUESTS: &str = "lmperf.canary.requests";
/// Counter of requests re-sent after a stale keep-alive connection.
pub const METRIC_CANARY_RETRIES: &str = "lmperf.canary.retries";
/// Counter of spans by export result (`lmperf.export.result` = exported | dropped_queue_full | failed).
pub const METRIC_EXPORT_SPANS: &str = "lmperf.export.spans";
pub const LMPERF_EXPORT_RESULT: &str = "lmperf.export.result";

/// Bucket boundaries, in seconds, of `gen_ai.client.operation.duration` (from the conventions).
pub const BUCKETS_OPERATION_DURATION: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// Bucket boundaries of `gen_ai.client.token.usage` (from the conventions).
pub const BUCKETS_TOKEN_USAGE: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
    4194304.0, 16777216.0, 67108864.0,
];
/// Bucket boundaries, in seconds, of `gen_ai.client.operation.time_to_first_chunk` (the
/// conventions' boundaries for time to first token).
pub const BUCKETS_TIME_TO_FIRST_CHUNK: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// Bucket boundaries, in seconds, of `gen_ai.client.operation.time_per_output_chunk` (the
/// conventions' boundaries for time per output token).
pub const BUCKETS_TIME_PER_OUTPUT_CHUNK: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];

// ---- Resource attributes ----
pub const SERVICE_NAME: &str = "service.name";
pub const HOST_NAME: &str = "host.name";
pub const K8S_NODE_NAME: &str = "k8s.node.name";
pub const K8S_POD_NAME: &str = "k8s.pod.name";

// ---- Sampling (see `sampler`) ----
/// Why a kept span was kept: error | slo_breach | spike | base | head.
pub const LMPERF_SAMPLING_REASON: &str = "lmperf.sampling.reason";
/// kept | dropped.
pub const LMPERF_SAMPLING_DECISION: &str = "lmperf.sampling.decision";
/// Counter of sampling decisions by target, reason and decision (every request counted once).
pub const METRIC_SAMPLING_SPANS: &str = "lmperf.sampling.spans";
/// Gauge: 1 while a target is in spike mode, else 0.
pub const METRIC_SAMPLING_SPIKE: &str = "lmperf.sampling.spike";
/// Span events marking spike mode changes.
pub const EVENT_SPIKE_ENTERED: &str = "lmperf.spike.entered";
pub const EVENT_SPIKE_LEFT: &str = "lmperf.spike.left";
/// The `tracestate` list member of OpenTelemetry ("ot"), holding the sampling threshold `th`.
pub const TRACESTATE_OT: &str = "ot";
