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
/// The server's own error `type` (e.g. `exceed_context_size_error`); `error.type` may be the
/// HTTP status.
pub const LMPERF_ERROR_SERVER_TYPE: &str = "lmperf.error.server_type";
/// The server's `Retry-After` on an HTTP error, seconds.
pub const LMPERF_ERROR_RETRY_AFTER: &str = "lmperf.error.retry_after";
/// Choices of an `n > 1` stream.
pub const LMPERF_CHOICES: &str = "lmperf.choices";
pub const LMPERF_PROMPT_ID: &str = "lmperf.prompt.id";
/// Where a request came from: `inject` for load injected through the control API, `bench` for
/// `lmperf run` (on spans and, for `bench`, metric points), `probe` for a probe pinned to one
/// worker behind a router; canary spans carry none.
pub const LMPERF_REQUEST_SOURCE: &str = "lmperf.request.source";
pub const REQUEST_SOURCE_BENCH: &str = "bench";
/// The id of the injected load a request belongs to.
pub const LMPERF_LOAD_ID: &str = "lmperf.load.id";
/// The load profile revision an injected profile load sent the request under (0 = as started).
pub const LMPERF_PROFILE_REVISION: &str = "lmperf.profile.revision";
/// `lmperf run`'s benchmark name, e.g. `c4_in512` (on spans and metric points).
pub const LMPERF_BENCHMARK: &str = "lmperf.benchmark";
/// Input length in tokens a replayed trace asked for (the prompt is synthetic text of about
/// that length); set on injected trace-replay spans only.
pub const LMPERF_REQUEST_INPUT_TOKENS_TARGET: &str = "lmperf.request.input_tokens_target";

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
/// Counter of requests injected through the control API, by `lmperf.target`, `lmperf.outcome`
/// and `error.type` (they stay out of the canary counters and the GenAI histograms).
pub const METRIC_INJECT_REQUESTS: &str = "lmperf.inject.requests";
/// Counter of the probes pinned to one worker behind a router target (`canary::probes`), by
/// `lmperf.target`, `lmperf.worker.id`, `lmperf.worker.role` (the role it was pinned in:
/// decode | prefill), `lmperf.outcome` and `error.type`.
pub const METRIC_WORKER_PROBE_REQUESTS: &str = "lmperf.worker.probe.requests";
/// Histogram of those probes' time to first chunk (s), by target, worker and role.
pub const METRIC_WORKER_PROBE_TTFT: &str = "lmperf.worker.probe.time_to_first_chunk";
/// Counter of spans by export result (`lmperf.export.result` = exported | dropped_queue_full | failed).
pub const METRIC_EXPORT_SPANS: &str = "lmperf.export.spans";
pub const LMPERF_EXPORT_RESULT: &str = "lmperf.export.result";

/// Bucket boundaries, in seconds, of `gen_ai.client.operation.duration` (from the conventions).
pub const BUCKETS_OPERATION_DURATION: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// Bucket boundaries of `gen_ai.client.token.usage` (from the conventions).
pub const BUCKETS_TOKEN_USAGE: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
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
/// Namespace of the pod holding a GPU (`hw.gpu.*` series; pod-resources).
pub const K8S_NAMESPACE_NAME: &str = "k8s.namespace.name";
/// Container holding a GPU (`hw.gpu.*` series; pod-resources).
pub const K8S_CONTAINER_NAME: &str = "k8s.container.name";

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
/// On `lmperf.spike.entered`: the rule that fired, error_rate | slo_p99 | latency_jump.
pub const LMPERF_SPIKE_REASON: &str = "lmperf.spike.reason";
/// The value the rule judged: error share, or p99 in seconds.
pub const LMPERF_SPIKE_VALUE: &str = "lmperf.spike.value";
/// The rule's threshold: error share, or p99 in seconds (slo_p99).
pub const LMPERF_SPIKE_THRESHOLD: &str = "lmperf.spike.threshold";
/// latency_jump: ttft | e2e, the baseline median (s), value ÷ median, robust z score.
pub const LMPERF_SPIKE_SIGNAL: &str = "lmperf.spike.signal";
pub const LMPERF_SPIKE_BASELINE: &str = "lmperf.spike.baseline";
pub const LMPERF_SPIKE_RATIO: &str = "lmperf.spike.ratio";
pub const LMPERF_SPIKE_Z: &str = "lmperf.spike.z";
/// latency_jump: canaries still in flight whose elapsed time counted as a lower bound (e2e).
pub const LMPERF_SPIKE_IN_FLIGHT: &str = "lmperf.spike.in_flight";

// ---- Node and model-server contention (see `contention`): the latest node sample ----
/// Gauge, unit `1`: the node's PSI avg10 share (0..1) of the last 10 s some (or all) tasks
/// stalled, by `lmperf.node.pressure.resource` (cpu | memory | io) and
/// `lmperf.node.pressure.stall` (some | full). node_exporter's counters of the same files are
/// `node_pressure_{cpu,memory,io}_waiting_seconds_total` (OTel semconv has no PSI metric).
pub const METRIC_NODE_PRESSURE: &str = "lmperf.node.pressure";
pub const LMPERF_NODE_PRESSURE_RESOURCE: &str = "lmperf.node.pressure.resource";
pub const LMPERF_NODE_PRESSURE_STALL: &str = "lmperf.node.pressure.stall";
/// Gauge, unit `s/s`: seconds per second the model server's threads waited for a CPU, by
/// `lmperf.target`.
pub const METRIC_SERVER_CPU_WAIT: &str = "lmperf.server.cpu.wait";
/// Gauge, unit `{cpu}`: the model server's CPU use in cores, by `lmperf.target` (the shape of
/// semconv's `container.cpu.usage`; the server may be a plain process).
pub const METRIC_SERVER_CPU_USAGE: &str = "lmperf.server.cpu.usage";
/// Gauge, unit `1`: share of the server cgroup's CFS periods throttled over the sample, by
/// `lmperf.target` (cAdvisor's counters: `container_cpu_cfs_throttled_periods_total` ÷
/// `container_cpu_cfs_periods_total`).
pub const METRIC_SERVER_CPU_THROTTLED: &str = "lmperf.server.cpu.throttled";
/// Gauge, unit `1`: the server cgroup's memory used of its limit, by `lmperf.target` (the
/// collector's kubeletstats `k8s.container.memory_limit_utilization`); no series without a limit.
pub const METRIC_SERVER_MEMORY_LIMIT_UTILIZATION: &str = "lmperf.server.memory.limit_utilization";
/// Counter, unit `{kill}`: OOM kills in the server's cgroup since the agent started, by
/// `lmperf.target` (cAdvisor: `container_oom_events_total`).
pub const METRIC_SERVER_OOM_KILLS: &str = "lmperf.server.oom_kills";

// ---- Diagnosis (see `diagnosis`, `diagnosis_live`); metric names contracted with the alert rules ----
/// Gauge, unit `1`: score in [0, 1] of a root cause, by `lmperf.target` and `lmperf.diagnosis.cause`.
pub const METRIC_DIAGNOSIS_SCORE: &str = "lmperf.diagnosis.score";
/// Gauge, unit `{state}`: 0 idle, 1 triggered, 2 propagating, 3 root_confirmed, by `lmperf.target`.
pub const METRIC_DIAGNOSIS_STATE: &str = "lmperf.diagnosis.state";
/// A cause's stable name (`load_surge`, `server_queueing`, ..., `unknown`).
pub const LMPERF_DIAGNOSIS_CAUSE: &str = "lmperf.diagnosis.cause";
/// The INTERNAL span of a confirmed diagnosis, linked to the spike's kept traces.
pub const SPAN_DIAGNOSIS: &str = "lmperf.diagnosis";
/// On the span: the top cause's score, the state, the onset (Unix s), the line in words, the
/// top cause's evidence (JSON array, the `Diagnosis` schema's `evidence`).
pub const LMPERF_DIAGNOSIS_SCORE: &str = "lmperf.diagnosis.score";
pub const LMPERF_DIAGNOSIS_STATE: &str = "lmperf.diagnosis.state";
pub const LMPERF_DIAGNOSIS_ONSET: &str = "lmperf.diagnosis.onset";
pub const LMPERF_DIAGNOSIS_SUMMARY: &str = "lmperf.diagnosis.summary";
pub const LMPERF_DIAGNOSIS_EVIDENCE: &str = "lmperf.diagnosis.evidence";
/// The `tracestate` list member of OpenTelemetry ("ot"), holding the sampling threshold `th`.
pub const TRACESTATE_OT: &str = "ot";

// ---- Hardware metrics (OpenTelemetry semantic conventions, "Semantic conventions for
// hardware metrics": docs/hardware/common.md, gpu.md, temperature.md; status Development) ----
/// Gauge, unit `1`: fraction of time the GPU spent in a task (`hw.gpu.task`), 0..1 (gpu.md).
pub const METRIC_HW_GPU_UTILIZATION: &str = "hw.gpu.utilization";
/// UpDownCounter, unit `By`: GPU memory used (gpu.md).
pub const METRIC_HW_GPU_MEMORY_USAGE: &str = "hw.gpu.memory.usage";
/// UpDownCounter, unit `By`: size of the GPU memory (gpu.md).
pub const METRIC_HW_GPU_MEMORY_LIMIT: &str = "hw.gpu.memory.limit";
/// Gauge, unit `1`: fraction of GPU memory used, 0..1 (gpu.md).
pub const METRIC_HW_GPU_MEMORY_UTILIZATION: &str = "hw.gpu.memory.utilization";
/// Counter, unit `By`: bytes received and transmitted by the GPU, by `network.io.direction`
/// (gpu.md). From NVML's PCIe throughput (KB/s over 20 ms) integrated over the sampling
/// interval, so an estimate.
pub const METRIC_HW_GPU_IO: &str = "hw.gpu.io";
/// Gauge, unit `W`: instantaneous power consumed (common.md).
pub const METRIC_HW_POWER: &str = "hw.power";
/// Counter, unit `J`: energy consumed (common.md).
pub const METRIC_HW_ENERGY: &str = "hw.energy";
/// Counter, unit `{error}`: errors, by `error.type` = corrected | uncorrected (gpu.md, `hw.errors` (GPU)).
pub const METRIC_HW_ERRORS: &str = "hw.errors";
/// UpDownCounter, unit `1`: 1 for the current `hw.state` (ok | failed), 0 for the others (gpu.md, `hw.status` (GPU)).
pub const METRIC_HW_STATUS: &str = "hw.status";
/// Gauge, unit `Cel`: temperature (temperature.md); `hw.type` = temperature, `hw.parent` = the GPU.
pub const METRIC_HW_TEMPERATURE: &str = "hw.temperature";

// ---- Hardware attributes (docs/registry/attributes/hardware.md) ----
/// Identifier unique within the host: the GPU's NVML UUID (`GPU-…`, `MIG-…`).
pub const HW_ID: &str = "hw.id";
/// Easily recognizable name: `GPU {index}` (`GPU 0 MIG 1`).
pub const HW_NAME: &str = "hw.name";
/// Descriptive model name: NVML's product name (`NVIDIA H200`).
pub const HW_MODEL: &str = "hw.model";
/// Vendor name: `NVIDIA`.
pub const HW_VENDOR: &str = "hw.vendor";
/// Component type: `gpu` (or `temperature` for the GPU's temperature sensor).
pub const HW_TYPE: &str = "hw.type";
/// Driver version (`nvmlSystemGetDriverVersion`).
pub const HW_DRIVER_VERSION: &str = "hw.driver_version";
/// `hw.id` of the parent: the physical GPU of a MIG instance or a temperature sensor.
pub const HW_PARENT: &str = "hw.parent";
/// Task of `hw.gpu.utilization`: `general` (kernels running).
pub const HW_GPU_TASK: &str = "hw.gpu.task";
/// State of `hw.status`: ok | failed.
pub const HW_STATE: &str = "hw.state";
/// Direction of `hw.gpu.io`: receive | transmit (docs/registry/attributes/network.md).
pub const NETWORK_IO_DIRECTION: &str = "network.io.direction";
/// Process id (docs/registry/attributes/process.md).
pub const PROCESS_PID: &str = "process.pid";
/// Executable name, from `/proc/PID/comm` (docs/registry/attributes/process.md).
pub const PROCESS_EXECUTABLE_NAME: &str = "process.executable.name";
/// Container id, from `/proc/PID/cgroup` (docs/registry/attributes/container.md).
pub const CONTAINER_ID: &str = "container.id";

/// Values of `hw.type`, `hw.vendor`, `hw.gpu.task`, `hw.state`, `error.type` of `hw.errors`.
pub const HW_TYPE_GPU: &str = "gpu";
pub const HW_TYPE_TEMPERATURE: &str = "temperature";
pub const HW_VENDOR_NVIDIA: &str = "NVIDIA";
pub const HW_GPU_TASK_GENERAL: &str = "general";
pub const HW_STATE_OK: &str = "ok";
pub const HW_STATE_FAILED: &str = "failed";
pub const HW_ERROR_CORRECTED: &str = "corrected";
pub const HW_ERROR_UNCORRECTED: &str = "uncorrected";

// ---- lmperf's own GPU metrics (what the hardware conventions lack; dcgm-exporter's default
// counter set names the same quantities) ----
/// Gauge, unit `1`: fraction of time device memory was read or written (NVML "memory" utilization).
pub const METRIC_GPU_MEMORY_COPY_UTILIZATION: &str = "lmperf.gpu.memory_copy.utilization";
/// Gauge, unit `W`: enforced power limit.
pub const METRIC_GPU_POWER_LIMIT: &str = "lmperf.gpu.power.limit";
/// Gauge, unit `Hz`: clock frequency, by `lmperf.gpu.clock` = sm | memory.
pub const METRIC_GPU_CLOCK: &str = "lmperf.gpu.clock.frequency";
/// Gauge, unit `1`: 1 while the clock throttle reason `lmperf.gpu.throttle.reason` is active, else 0.
pub const METRIC_GPU_THROTTLE: &str = "lmperf.gpu.throttle";
/// Counter, unit `{replay}`: PCIe replays.
pub const METRIC_GPU_PCIE_REPLAYS: &str = "lmperf.gpu.pcie.replays";
/// Counter, unit `{event}`: critical XID events, by `lmperf.gpu.xid`.
pub const METRIC_GPU_XID: &str = "lmperf.gpu.xid_errors";
/// UpDownCounter, unit `By`: GPU memory held by a process (`process.pid`, `process.executable.name`, `container.id`).
pub const METRIC_GPU_PROCESS_MEMORY_USAGE: &str = "lmperf.gpu.process.memory.usage";
/// Gauge, unit `1`: fraction of SM time used by a process over the last interval.
pub const METRIC_GPU_PROCESS_UTILIZATION: &str = "lmperf.gpu.process.utilization";
/// Counter, unit `{event}`: GPUs lost (`GPU_IS_LOST`, driver gone) since start.
pub const METRIC_GPU_LOST: &str = "lmperf.gpu.lost";

/// Attributes of the lmperf GPU metrics.
pub const LMPERF_GPU_INDEX: &str = "lmperf.gpu.index";
pub const LMPERF_GPU_PCI_BUS_ID: &str = "lmperf.gpu.pci_bus_id";
/// MIG profile of a MIG instance (`1g.5gb`).
pub const LMPERF_GPU_MIG_PROFILE: &str = "lmperf.gpu.mig.profile";
pub const LMPERF_GPU_CLOCK: &str = "lmperf.gpu.clock";
pub const LMPERF_GPU_THROTTLE_REASON: &str = "lmperf.gpu.throttle.reason";
pub const LMPERF_GPU_XID: &str = "lmperf.gpu.xid";

// ---- lmperf.gpu.* span attributes: the node's GPUs during one canary request (samples
// taken between the send and the end of the stream, else the latest before the end) ----
/// Highest `hw.gpu.utilization` of any GPU, 0..1.
pub const LMPERF_GPU_UTILIZATION_MAX: &str = "lmperf.gpu.utilization.max";
/// Highest fraction of memory used of any GPU, 0..1.
pub const LMPERF_GPU_MEMORY_UTILIZATION_MAX: &str = "lmperf.gpu.memory.utilization.max";
/// True when any slowdown throttle reason was active on any GPU.
pub const LMPERF_GPU_THROTTLED: &str = "lmperf.gpu.throttled";
/// The slowdown throttle reasons seen (string array).
pub const LMPERF_GPU_THROTTLE_REASONS: &str = "lmperf.gpu.throttle.reasons";
/// True when an XID event arrived during the request.
pub const LMPERF_GPU_XID_SEEN: &str = "lmperf.gpu.xid.seen";
/// The XID codes seen during the request (int array).
pub const LMPERF_GPU_XID_CODES: &str = "lmperf.gpu.xid.codes";
/// GPU samples the values come from.
pub const LMPERF_GPU_SAMPLES: &str = "lmperf.gpu.samples";
/// Span: the `hw.id`s of the GPUs whose state the span carries, when its target's pod is known
/// and the kubelet's pod-resources API says which GPUs that pod holds (absent otherwise: every
/// GPU of the node).
pub const LMPERF_GPU_HW_IDS: &str = "lmperf.gpu.hw_ids";
/// The compute processes on the node's GPUs at the request's end (latest sample), by PID
/// (int array, ascending, at most [`MAX_SPAN_GPU_PROCESSES`]): on a node with one model server,
/// its PID.
pub const LMPERF_GPU_PROCESS_PIDS: &str = "lmperf.gpu.process.pids";
/// Their executables (`/proc/PID/comm`), in the order of the PIDs (string array; "" where
/// `/proc` did not tell).
pub const LMPERF_GPU_PROCESS_EXECUTABLES: &str = "lmperf.gpu.process.executables";
/// Their container ids, in the order of the PIDs (string array; "" outside a container).
pub const LMPERF_GPU_PROCESS_CONTAINER_IDS: &str = "lmperf.gpu.process.container_ids";
/// The most GPU processes named on one span.
pub const MAX_SPAN_GPU_PROCESSES: usize = 8;

// ---- Kernel TCP measurements through eBPF (`net`) ----
// No stable OpenTelemetry convention names TCP RTT, connect latency or retransmits, so the
// metrics carry the `lmperf.tcp.` prefix; their attributes follow the general registry:
// `server.address`, `server.port` (docs/registry/attributes/server.md) and `network.type`
// (docs/registry/attributes/network.md). The quantities are those of libbpf-tools `tcprtt`,
// `tcpconnlat` and `tcpretrans`.
/// Histogram, unit `s`: the socket's smoothed RTT (`tcp_sock.srtt_us`) after each received
/// segment (tracepoint `tcp_probe`).
pub const METRIC_TCP_RTT: &str = "lmperf.tcp.rtt";
/// Histogram, unit `s`: SYN_SENT → ESTABLISHED (tracepoint `inet_sock_set_state`).
pub const METRIC_TCP_CONNECT_DURATION: &str = "lmperf.tcp.connect.duration";
/// Counter, unit `{segment}`: retransmitted segments (tracepoint `tcp_retransmit_skb`).
pub const METRIC_TCP_RETRANSMITS: &str = "lmperf.tcp.retransmits";
/// Counter, unit `{event}`: probe events by `lmperf.tcp.event` (rtt | connect | retransmit | dropped).
pub const METRIC_TCP_PROBE_EVENTS: &str = "lmperf.tcp.probe.events";
/// Which end of the connection the measuring socket is: client | server (the server being
/// the end on a target's port).
pub const LMPERF_TCP_SIDE: &str = "lmperf.tcp.side";
pub const LMPERF_TCP_EVENT: &str = "lmperf.tcp.event";
/// `ipv4` | `ipv6` (docs/registry/attributes/network.md).
pub const NETWORK_TYPE: &str = "network.type";
/// Bucket boundaries, in seconds, of `lmperf.tcp.rtt` and `lmperf.tcp.connect.duration`:
/// 25 µs (loopback) to about 1.3 s.
pub const BUCKETS_TCP_RTT: &[f64] = &[
    0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16,
    0.32, 0.64, 1.28,
];

// ---- lmperf.net.* span attributes: the kernel's view of the canary's connection during one
// request (eBPF events of its own socket, by local address, when the HTTP client reports the
// connection; else of client sockets to the target's port in the request's time window; or
// one TCP_INFO reading when the probes are not on) ----
/// Where the `lmperf.net.*` values come from: [`NET_SOURCE_EBPF`] or [`NET_SOURCE_TCP_INFO`].
pub const LMPERF_NET_SOURCE: &str = "lmperf.net.source";
/// The probes' events during the request.
pub const NET_SOURCE_EBPF: &str = "ebpf";
/// One `getsockopt(TCP_INFO)` of the canary's own socket at the end of the request
/// (`srtt.min` = `srtt.max` = `tcpi_rtt`, one sample; no retransmits or connect latency).
pub const NET_SOURCE_TCP_INFO: &str = "tcp_info";
/// Smallest and largest smoothed RTT seen, seconds.
pub const LMPERF_NET_SRTT_MIN: &str = "lmperf.net.srtt.min";
pub const LMPERF_NET_SRTT_MAX: &str = "lmperf.net.srtt.max";
/// RTT samples (received segments) the min/max come from.
pub const LMPERF_NET_RTT_SAMPLES: &str = "lmperf.net.rtt.samples";
/// Segments retransmitted.
pub const LMPERF_NET_RETRANSMITS: &str = "lmperf.net.retransmits";
/// Connect latency in seconds, when a connection was opened during the request.
pub const LMPERF_NET_CONNECT_DURATION: &str = "lmperf.net.connect.duration";

// ---- Model server signals (`server`): the server's own /metrics page, normalized across
// vLLM, SGLang, TGI and llama.cpp. No OpenTelemetry convention covers a server's queue or KV
// cache (`gen_ai.server.*` is the server's own request metrics), so they carry `lmperf.server.` ----
/// Gauge, unit `{request}`: requests the server is running (in its batch).
pub const METRIC_SERVER_REQUESTS_RUNNING: &str = "lmperf.server.requests.running";
/// Gauge, unit `{request}`: requests queued in the server, waiting for a batch slot.
pub const METRIC_SERVER_REQUESTS_WAITING: &str = "lmperf.server.requests.waiting";
/// Gauge, unit `1`: fraction of the KV cache in use, 0..1.
pub const METRIC_SERVER_KV_CACHE_USAGE: &str = "lmperf.server.kv_cache.usage";
/// Gauge, unit `1`: prefix-cache hits ÷ queries over the last scrape interval.
/// Exported to Prometheus as `lmperf_server_prefix_cache_hit_ratio` (unit `1` adds `_ratio`:
/// named `hit_ratio`, it read `…_hit_ratio_ratio`).
pub const METRIC_SERVER_PREFIX_CACHE_HIT_RATIO: &str = "lmperf.server.prefix_cache.hit";
/// Gauges, unit `1`, by `lmperf.target` and `lmperf.worker.id` (the worker's URL as the router
/// names it): a router's share of its picks that went to the worker over the last scrape
/// interval (vllm-router's `vllm_router_processed_requests_total{worker}`), and its share were
/// the workers equal (1 ÷ the workers the router may pick: healthy, circuit not open; 0 when
/// this one is not among them). Issue 52.5: a router sending 85 % to one of four workers shows
/// as 0.85 against 0.25.
pub const METRIC_ROUTER_PICK_SHARE: &str = "lmperf.router.worker.pick_share";
pub const METRIC_ROUTER_FAIR_SHARE: &str = "lmperf.router.worker.fair_share";
/// Gauge, unit `1`, by `lmperf.target` and `lmperf.worker.id`: 1 when the router says the
/// worker is healthy and its circuit breaker is not open, else 0 (absent when it says neither).
pub const METRIC_ROUTER_WORKER_PICKABLE: &str = "lmperf.router.worker.pickable";
/// Gauge, unit `{request}`, by `lmperf.target` and `lmperf.worker.id`: the requests waiting in
/// the worker's queue as the router sees it (llm-d's endpoint picker:
/// `llm_d_epp_per_endpoint_queue_size`, `llm_d_router_epp_per_endpoint_queue_size`,
/// `inference_pool_per_pod_queue_size`); absent when the router does not say.
pub const METRIC_ROUTER_WORKER_QUEUE: &str = "lmperf.router.worker.queue";
/// Gauges by `lmperf.target`, from an endpoint picker's page (llm-d's, the Gateway API
/// Inference Extension's): requests its flow control holds (`{request}`), its most saturated
/// pool (`1`: 0 empty, 1 saturated), its ready endpoints (`{endpoint}`); absent when it does
/// not say.
pub const METRIC_ROUTER_FLOW_CONTROL_QUEUE: &str = "lmperf.router.flow_control.queue";
pub const METRIC_ROUTER_POOL_SATURATION: &str = "lmperf.router.pool.saturation";
pub const METRIC_ROUTER_READY_ENDPOINTS: &str = "lmperf.router.ready_endpoints";
/// Gauges by `lmperf.target`, from a disaggregated deployment's router page (NVIDIA Dynamo's
/// frontend: `dynamo_frontend_worker_active_prefill_tokens` over its `prefill` workers,
/// `dynamo_frontend_worker_active_decode_blocks` over its `decode` workers): the prompt tokens
/// queued on the prefill pool (`{token}`) and the KV blocks the decode pool's active sequences
/// hold (`{block}`); absent with one pool (issue 53).
pub const METRIC_ROUTER_PREFILL_POOL_TOKENS: &str = "lmperf.router.prefill_pool.queued_tokens";
pub const METRIC_ROUTER_DECODE_POOL_BLOCKS: &str = "lmperf.router.decode_pool.active_blocks";
/// Gauges by `lmperf.target` and `lmperf.worker.id` (issue 53, `lmperf_measure::workers_apart`):
/// a router target's worker against the others, from its direct canaries (or, behind Dynamo,
/// its pinned probes): its TTFT (the median of its last 3 answers) ÷ the median of the other
/// workers' (`lmperf.router.worker.slowdown`, unit `1`: 1 alike, 3 when it takes three times
/// as long), and 1 while its last 2 failed as another answered, else 0
/// (`lmperf.router.worker.failing`, unit `1`). Recorded at each direct canary or probe.
pub const METRIC_ROUTER_WORKER_SLOWDOWN: &str = "lmperf.router.worker.slowdown";
pub const METRIC_ROUTER_WORKER_FAILING: &str = "lmperf.router.worker.failing";
/// Gauge, unit `s`, by `lmperf.target` and `lmperf.path.metric` (ttft | e2e): how much a router
/// adds, the routed canaries' p50 minus the p50 of the canaries sent straight to its workers
/// over the last minute (issue 52.2); recorded when both sides have 5 requests in it.
pub const METRIC_PATH_OVERHEAD: &str = "lmperf.path.overhead";
pub const LMPERF_PATH_METRIC: &str = "lmperf.path.metric";
/// Counter, by `lmperf.target`, `lmperf.worker.id` (the worker's URL) and `lmperf.outcome`:
/// canaries sent straight to a router target's workers.
pub const METRIC_PATH_DIRECT_REQUESTS: &str = "lmperf.path.direct.requests";
/// Span attributes: a routed canary's TTFT minus the direct p50 of the same window, ms
/// (`lmperf.path.overhead_ms`); a direct canary's worker is `lmperf.worker.id`, its source
/// `lmperf.request.source = direct`.
pub const LMPERF_PATH_OVERHEAD_MS: &str = "lmperf.path.overhead_ms";
/// Span attributes of vllm-router's own clock on a request (`x-router-stages`, with
/// `VLLM_ROUTER_STAGES=1`), ms: the worker's response headers, its first token, the first token
/// after the first bytes; and the client's TTFT minus the router's first token
/// (`lmperf.router.outside_ms`: the time outside the router's clock).
pub const LMPERF_ROUTER_HTTP_TTFB_MS: &str = "lmperf.router.http_ttfb_ms";
pub const LMPERF_ROUTER_FIRST_TOKEN_MS: &str = "lmperf.router.first_token_ms";
pub const LMPERF_ROUTER_ENGINE_MS: &str = "lmperf.router.engine_ms";
pub const LMPERF_ROUTER_OUTSIDE_MS: &str = "lmperf.router.outside_ms";
/// Counters (restart-safe sums of the server's own counters' increases).
pub const METRIC_SERVER_PROMPT_TOKENS: &str = "lmperf.server.prompt_tokens";
pub const METRIC_SERVER_GENERATION_TOKENS: &str = "lmperf.server.generation_tokens";
pub const METRIC_SERVER_REQUESTS: &str = "lmperf.server.requests";
pub const METRIC_SERVER_PREEMPTIONS: &str = "lmperf.server.preemptions";
/// Gauge, unit `s`: server-side latency over the last scrape interval, by
/// `lmperf.server.phase` (ttft | itl | queue | prefill | decode) and `lmperf.server.statistic`
/// (mean | p50 | p99; quantiles as PromQL's `histogram_quantile` of the interval's buckets).
pub const METRIC_SERVER_LATENCY: &str = "lmperf.server.latency";
/// Counter, unit `{change}`: server change events by `lmperf.server.change.kind`
/// (version | model | model_revision | restart | kind).
pub const METRIC_SERVER_CHANGES: &str = "lmperf.server.changes";
/// Counter, unit `{scrape}`: scrapes by `lmperf.server.scrape.result` (ok | connect: no
/// connection (refused, DNS, connect timeout) | timeout | closed: the server closed or reset
/// the connection mid-response | response: a malformed response head | http_status |
/// too_large | html | empty | not_metrics | body: the body broke otherwise).
pub const METRIC_SERVER_SCRAPES: &str = "lmperf.server.scrapes";
/// Gauge, unit `1`: always 1, carrying `lmperf.server.kind`, `.version`, `.model`.
pub const METRIC_SERVER_INFO: &str = "lmperf.server.info";
pub const LMPERF_SERVER_PHASE: &str = "lmperf.server.phase";
pub const LMPERF_SERVER_STATISTIC: &str = "lmperf.server.statistic";
pub const LMPERF_SERVER_CHANGE_KIND: &str = "lmperf.server.change.kind";
pub const LMPERF_SERVER_SCRAPE_RESULT: &str = "lmperf.server.scrape.result";
pub const LMPERF_SERVER_KIND: &str = "lmperf.server.kind";
pub const LMPERF_SERVER_VERSION: &str = "lmperf.server.version";
pub const LMPERF_SERVER_MODEL: &str = "lmperf.server.model";
/// Span attributes: the server's state at the canary's send (the latest scrape before it).
pub const LMPERF_SERVER_REQUESTS_WAITING: &str = "lmperf.server.requests.waiting";
pub const LMPERF_SERVER_REQUESTS_RUNNING: &str = "lmperf.server.requests.running";
pub const LMPERF_SERVER_KV_CACHE_USAGE: &str = "lmperf.server.kv_cache.usage";
/// Seconds from that scrape to the send.
pub const LMPERF_SERVER_SCRAPE_AGE: &str = "lmperf.server.scrape.age";
/// Span attributes of a canary through a router (`kind = "router"`): the worker that streamed
/// the answer (`lmperf.worker.id`: Dynamo's instance id in decimal, llm-d's `namespace/pod`;
/// `lmperf.worker.role` = agg | decode | prefill), a disaggregated request's prefill worker
/// (`lmperf.worker.prefill.id`), and how that is known (`lmperf.worker.attribution` =
/// dynamo_nvext | llm_d_header | smg_header | unattributed: the router named none).
pub const LMPERF_WORKER_ID: &str = "lmperf.worker.id";
pub const LMPERF_WORKER_ROLE: &str = "lmperf.worker.role";
pub const LMPERF_WORKER_PREFILL_ID: &str = "lmperf.worker.prefill.id";
pub const LMPERF_WORKER_ATTRIBUTION: &str = "lmperf.worker.attribution";
/// Span attribute of a probe pinned to one worker (`lmperf.request.source` = probe): the
/// worker's id it was pinned to (`lmperf.worker.id` says who served it).
pub const LMPERF_WORKER_PINNED: &str = "lmperf.worker.pinned";
/// Span attributes: the server's own timing of this request, read from its response
/// (`lmperf_measure::server_timing`: vLLM's per-request `metrics`, llama.cpp's `timings`),
/// in seconds; each set only where the server said it. `…timing_source` names the field
/// (`vllm_metrics` | `llama_cpp_timings` | `dynamo_timing`).
pub const LMPERF_SERVER_REQUEST_TTFT: &str = "lmperf.server.request.ttft";
pub const LMPERF_SERVER_REQUEST_QUEUE: &str = "lmperf.server.request.queue";
pub const LMPERF_SERVER_REQUEST_PREFILL: &str = "lmperf.server.request.prefill";
pub const LMPERF_SERVER_REQUEST_DECODE: &str = "lmperf.server.request.decode";
pub const LMPERF_SERVER_REQUEST_ITL_MEAN: &str = "lmperf.server.request.itl_mean";
pub const LMPERF_SERVER_REQUEST_TIMING_SOURCE: &str = "lmperf.server.request.timing_source";
/// Seconds, signed: the client's TTFT minus the server's (network, client, HTTP front end).
pub const LMPERF_SERVER_REQUEST_CLIENT_MINUS_SERVER_TTFT: &str =
    "lmperf.server.request.client_minus_server_ttft";
/// Span attributes of a request routed through NVIDIA Dynamo that said its timing: its
/// client TTFT split along the serving path, milliseconds, the four summing to the TTFT
/// (`lmperf_measure::server_timing::TtftSplit`), and the router's KV hit rate (0..1) and
/// queue depth.
pub const LMPERF_TTFT_FRONTEND_MS: &str = "lmperf.ttft.frontend_ms";
pub const LMPERF_TTFT_ROUTER_QUEUE_MS: &str = "lmperf.ttft.router_queue_ms";
pub const LMPERF_TTFT_PREFILL_MS: &str = "lmperf.ttft.prefill_ms";
pub const LMPERF_TTFT_TRANSFER_AND_FIRST_DECODE_MS: &str =
    "lmperf.ttft.transfer_and_first_decode_ms";
pub const LMPERF_SERVER_REQUEST_KV_HIT_RATE: &str = "lmperf.server.request.kv_hit_rate";
/// Histogram (s) of routed canaries' TTFT segments (Prometheus
/// `lmperf_canary_ttft_segment_duration_seconds`), by `lmperf.target`, `lmperf.worker.id` and
/// `lmperf.ttft.segment` (frontend | router_queue | prefill | transfer_and_first_decode).
pub const METRIC_TTFT_SEGMENT: &str = "lmperf.canary.ttft.segment.duration";
pub const LMPERF_TTFT_SEGMENT: &str = "lmperf.ttft.segment";
pub const LMPERF_SERVER_REQUEST_ROUTER_QUEUE_DEPTH: &str =
    "lmperf.server.request.router_queue_depth";
/// Span event on the next canary span after a server change (attributes
/// `lmperf.server.change.kind`, `lmperf.server.change.old`, `lmperf.server.change.new`).
pub const EVENT_SERVER_CHANGE: &str = "lmperf.server.change";
pub const LMPERF_SERVER_CHANGE_OLD: &str = "lmperf.server.change.old";
pub const LMPERF_SERVER_CHANGE_NEW: &str = "lmperf.server.change.new";

// ---- The conventions these names follow (pinned) ----
/// The OpenTelemetry semantic conventions release lmperf's `gen_ai.*`, `hw.*`, `k8s.*` and
/// general names follow: v1.41.0, the last release of `open-telemetry/semantic-conventions`
/// that holds the GenAI conventions (they continue in `open-telemetry/semantic-conventions-genai`,
/// whose v0.1.0 renames the client metrics to `gen_ai.client.inference.*`; lmperf keeps the
/// v1.41.0 names by default, as the conventions' transition plan asks of existing
/// instrumentations, until it opts in through `OTEL_SEMCONV_STABILITY_OPT_IN`).
pub const SEMCONV_VERSION: &str = "1.41.0";
/// The schema URL of [`SEMCONV_VERSION`], set on the agent's instrumentation scope (spans and
/// metrics; `otel_scope_schema_url` on `/metrics`).
pub const SEMCONV_SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.41.0";

// ---- Diagnosis counter (issue 26: carries the diagnosis span as its exemplar) ----
/// Counter, unit `{diagnosis}`: confirmed root causes, by `lmperf.target` and
/// `lmperf.diagnosis.cause`; on `/metrics` (OpenMetrics) its exemplar is the latest
/// `lmperf.diagnosis` span of the series.
pub const METRIC_DIAGNOSIS_CONFIRMED: &str = "lmperf.diagnosis.confirmed";

// ---- A target's Kubernetes identity (OTel k8s semantic conventions; span attributes and
// per-target series labels of discovered targets: `telemetry::k8s`) ----
pub const K8S_POD_UID: &str = "k8s.pod.uid";
pub const K8S_DEPLOYMENT_NAME: &str = "k8s.deployment.name";
pub const K8S_STATEFULSET_NAME: &str = "k8s.statefulset.name";
pub const K8S_DAEMONSET_NAME: &str = "k8s.daemonset.name";
pub const K8S_REPLICASET_NAME: &str = "k8s.replicaset.name";
pub const K8S_JOB_NAME: &str = "k8s.job.name";
/// No OTel convention yet; named like the others.
pub const K8S_LEADERWORKERSET_NAME: &str = "k8s.leaderworkerset.name";
/// The Gateway API Inference Extension `InferencePool` that selects the target's pod (one per
/// target). No OTel convention yet; named like the others.
pub const K8S_INFERENCEPOOL_NAME: &str = "k8s.inferencepool.name";
