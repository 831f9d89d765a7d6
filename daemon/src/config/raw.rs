//! The configuration file as written (TOML), strict: unknown keys are rejected.
//!
//! ```toml
//! admin_addr = "127.0.0.1:9464"     # admin HTTP: /healthz /readyz /metrics /api/v1/status
//! shutdown_timeout = "5s"           # in-flight canaries are cancelled after this on SIGTERM
//! console = false                   # print one line per measured request on stdout
//! log_format = "text"               # text | json (one JSON object per line, with trace ids)
//!
//! [canary]                          # defaults for every target
//! api = "chat"                      # chat | completions
//! interval = "5s"                   # mean gap, jittered ±10 %; or `rate` below
//! # rate = 2.0                      # requests per second per target
//! # arrival = "poisson"             # poisson | constant (with `rate`)
//! max_tokens = 32
//! timeout = "60s"
//! connect_timeout = "5s"
//! max_in_flight = 4
//! api_key_env = "LMPERF_API_KEY"    # or api_key_file = "/run/secrets/key"
//! sampling_ratio = 0.1              # healthy spans kept outside spikes
//! sampling_max_per_second = 10      # cap on those per target
//! # slo_ttft = "500ms"              # a breach keeps the span
//! # slo_e2e = "5s"
//! spike_window = "30s"              # spike mode: error rate or p99 over this window
//! spike_error_rate = 0.05
//! # spike_p99 = "5s"                # default: slo_e2e
//! spike_hold = "60s"
//! spike_min_requests = 10
//! spike_jump_ratio = 2.0            # spike on a p99 jump vs the target's own baseline (0: off)
//! spike_jump_z = 3.5
//! spike_jump_floor = "50ms"
//! spike_jump_min_share = 0.25      # ...with this share of a 10 s bucket's canaries above it
//!
//! [[target]]
//! url = "http://127.0.0.1:8000"
//! name = "vllm-0"                   # default: host:port
//! model = "meta-llama/Llama-3.1-8B-Instruct"   # default: first of GET /v1/models
//! server_metrics = "auto"           # scrape the server's own /metrics: auto | off
//! # metrics_url = "http://127.0.0.1:8000/metrics"  # default: <url>/metrics
//! metrics_interval = "5s"           # 1s to 60s (metrics_timeout, metrics_max_bytes = 8 MiB)
//! # server_kind = "vllm"            # default: detected from the metric prefixes
//! # kind = "router"                 # server (default) | router: a router in front of workers
//! # worker_probes = true            # router (Dynamo): a canary pinned to each worker (default on)
//! # worker_probe_interval = "10s"   # each worker once per this; worker_probe_max_rate = 1.0 (per s)
//! # direct_workers = ["http://w1:8000"]  # router: canaries straight to each (default: its /list_workers)
//! # direct_pool = "ns/pool"         # router: its workers are the discovered pods of this InferencePool
//! # direct_interval = "5s"          # each worker once per this; direct_paths = false: none
//! # [target.k8s]                    # the pod serving it: its GPUs only (pod-resources)
//! # namespace = "ml"
//! # pod = "vllm-0"
//! # container = "vllm"              # optional; uid = "…" optional
//! # [target.profiling]              # the server's profiler on a TPOT regression (config/profiling.rs)
//! # kind = "vllm"                   # vllm | sglang; output_dir, seconds | num_steps, min_interval, on
//!
//! [otlp]
//! endpoint = "http://127.0.0.1:4318"  # default: OTEL_EXPORTER_OTLP_ENDPOINT, else the spec's
//! protocol = "http/protobuf"          # grpc | http/protobuf (OTEL_EXPORTER_OTLP_PROTOCOL)
//!
//! [gpu]
//! enabled = true                      # GPU metrics through NVML; off by itself without a driver
//! interval = "1s"                     # sampling interval, 100ms to 60s
//! # nvml_library = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
//! pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"  # which pod holds each GPU; "" off
//!
//! [net]
//! enabled = true                      # eBPF TCP probes on the targets' ports; off by itself without permission
//! programs = "auto"                   # auto (BTF tracepoints, else classic ones) | tp_btf | tracepoint
//!
//! [control]                           # the gRPC control API (`lmperf ctl`)
//! enabled = true
//! listen = "unix:/run/lmperf/control.sock"   # or "127.0.0.1:50051"; default: a unix socket (see README)
//! # token_file = "/run/secrets/lmperf-control-token"  # or token_env (default LMPERF_CONTROL_TOKEN)
//! recent_requests = 256               # measured requests kept for ListRecentRequests
//! max_inject_rate = 20.0              # caps of InjectLoad: requests per second,
//! max_inject_duration = "5m"          # duration,
//! max_inject_concurrency = 8          # requests in flight,
//! max_inject_requests = 10000         # requests per load
//! # trace_dir = "/var/lib/lmperf/traces"  # trace replay only of files under it; unset: no replay
//! ```

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub admin_addr: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub shutdown_timeout: Option<Duration>,
    pub console: Option<bool>,
    /// `text` | `json`; read before the rest (`config::log_format::resolve`).
    pub log_format: Option<String>,
    #[serde(default)]
    pub canary: RawCanary,
    /// `[[target]]` tables: a `url`, an optional `name`, and any canary field.
    #[serde(default, rename = "target")]
    pub targets: Vec<RawCanary>,
    #[serde(default)]
    pub otlp: RawOtlp,
    #[serde(default)]
    pub gpu: RawGpu,
    #[serde(default)]
    pub net: RawNet,
    #[serde(default)]
    pub control: RawControl,
    /// `[discovery]`: targets found at run time (`super::discovery`).
    #[serde(default)]
    pub discovery: RawDiscovery,
}

/// Canary settings; every field may be set in `[canary]` (defaults) or per `[[target]]`;
/// `url` and `name` only per target.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCanary {
    pub url: Option<String>,
    pub name: Option<String>,
    pub model: Option<String>,
    pub api: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    pub rate: Option<f64>,
    pub arrival: Option<String>,
    pub max_tokens: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    pub max_in_flight: Option<usize>,
    pub max_event_bytes: Option<usize>,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<String>,
    pub provider: Option<String>,
    /// Adaptive sampling (see `sampler::adaptive`): share of healthy spans kept, [0, 1].
    pub sampling_ratio: Option<f64>,
    /// At most this many healthy spans kept per second.
    pub sampling_max_per_second: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub slo_ttft: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub slo_e2e: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub spike_window: Option<Duration>,
    pub spike_error_rate: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub spike_p99: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub spike_hold: Option<Duration>,
    pub spike_min_requests: Option<usize>,
    /// Spike mode on a latency jump against the target's own baseline: p99 ÷ median at least
    /// this (0: off), robust z at least `spike_jump_z`, and `spike_jump_floor` above the median.
    pub spike_jump_ratio: Option<f64>,
    pub spike_jump_z: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub spike_jump_floor: Option<Duration>,
    /// Share of a bucket's canaries that must be above the jump threshold themselves, in [0, 1].
    pub spike_jump_min_share: Option<f64>,
    /// Model server signals (`server::config`): auto | off.
    pub server_metrics: Option<String>,
    pub metrics_url: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub metrics_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub metrics_timeout: Option<Duration>,
    pub metrics_max_bytes: Option<usize>,
    /// auto | vllm | sglang | tgi | llama.cpp.
    pub server_kind: Option<String>,
    /// `[target.k8s]`: the pod serving a static target (only per target).
    pub k8s: Option<RawK8s>,
    /// `[target.profiling]`: the server's profiler called when TPOT regresses
    /// (`super::profiling`); taken whole, `[canary.profiling]` for every target.
    pub profiling: Option<super::profiling::RawProfiling>,
    /// `server` (default) | `router`: a router in front of workers, asked which worker served
    /// each canary.
    pub kind: Option<String>,
    /// A router target's pinned probes of each worker (`super::worker_probes`).
    pub worker_probes: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    pub worker_probe_interval: Option<Duration>,
    pub worker_probe_max_rate: Option<f64>,
    /// A router target's direct canaries to its workers (`super::direct_paths`).
    pub direct_paths: Option<bool>,
    pub direct_workers: Option<Vec<String>>,
    pub direct_pool: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub direct_interval: Option<Duration>,
}

/// `[target.k8s]`: which pod (and container) serves a static target, for the GPU attribution
/// (the GPUs that pod holds) and the `k8s.*` identity.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawK8s {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    /// The model server's container; absent: every container of the pod.
    pub container: Option<String>,
    /// `k8s.pod.uid`.
    pub uid: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlp {
    pub enabled: Option<bool>,
    pub endpoint: Option<String>,
    pub protocol: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub export_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub export_timeout: Option<Duration>,
    pub queue_size: Option<usize>,
    pub batch_size: Option<usize>,
    pub export_concurrency: Option<usize>,
}

/// `[gpu]`: GPU metrics through NVML.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGpu {
    pub enabled: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// Path of the NVML library instead of `libnvidia-ml.so.1` from the loader's path.
    pub nvml_library: Option<String>,
    /// The kubelet's pod-resources socket; `""` turns the pod attribution off.
    pub pod_resources_socket: Option<String>,
}

/// `[net]`: kernel TCP measurements through eBPF.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNet {
    pub enabled: Option<bool>,
    pub programs: Option<String>,
}

/// `[control]`: the gRPC control API.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawControl {
    pub enabled: Option<bool>,
    /// `unix:/path` or `IP:port`.
    pub listen: Option<String>,
    pub token_file: Option<String>,
    pub token_env: Option<String>,
    pub recent_requests: Option<usize>,
    pub max_inject_rate: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub max_inject_duration: Option<Duration>,
    pub max_inject_concurrency: Option<u32>,
    pub max_inject_requests: Option<u64>,
    /// Directory of the trace files `InjectLoad` may replay (absolute).
    pub trace_dir: Option<String>,
}

impl RawCanary {
    /// `self`'s values where set, else `base`'s. A schedule (`interval` or `rate`) is taken
    /// whole: a target's `rate` replaces a default `interval` and the reverse.
    pub fn or(self, base: &RawCanary) -> RawCanary {
        let mut b = base.clone();
        if self.interval.is_some() || self.rate.is_some() {
            b.interval = None;
            b.rate = None;
            b.arrival = None;
        }
        RawCanary {
            url: self.url.or(b.url),
            name: self.name.or(b.name),
            model: self.model.or(b.model),
            api: self.api.or(b.api),
            interval: self.interval.or(b.interval),
            rate: self.rate.or(b.rate),
            arrival: self.arrival.or(b.arrival),
            max_tokens: self.max_tokens.or(b.max_tokens),
            timeout: self.timeout.or(b.timeout),
            connect_timeout: self.connect_timeout.or(b.connect_timeout),
            max_in_flight: self.max_in_flight.or(b.max_in_flight),
            max_event_bytes: self.max_event_bytes.or(b.max_event_bytes),
            api_key_env: self.api_key_env.or(b.api_key_env),
            api_key_file: self.api_key_file.or(b.api_key_file),
            provider: self.provider.or(b.provider),
            sampling_ratio: self.sampling_ratio.or(b.sampling_ratio),
            sampling_max_per_second: self.sampling_max_per_second.or(b.sampling_max_per_second),
            slo_ttft: self.slo_ttft.or(b.slo_ttft),
            slo_e2e: self.slo_e2e.or(b.slo_e2e),
            spike_window: self.spike_window.or(b.spike_window),
            spike_error_rate: self.spike_error_rate.or(b.spike_error_rate),
            spike_p99: self.spike_p99.or(b.spike_p99),
            spike_hold: self.spike_hold.or(b.spike_hold),
            spike_min_requests: self.spike_min_requests.or(b.spike_min_requests),
            spike_jump_ratio: self.spike_jump_ratio.or(b.spike_jump_ratio),
            spike_jump_z: self.spike_jump_z.or(b.spike_jump_z),
            spike_jump_floor: self.spike_jump_floor.or(b.spike_jump_floor),
            spike_jump_min_share: self.spike_jump_min_share.or(b.spike_jump_min_share),
            server_metrics: self.server_metrics.or(b.server_metrics),
            metrics_url: self.metrics_url.or(b.metrics_url),
            metrics_interval: self.metrics_interval.or(b.metrics_interval),
            metrics_timeout: self.metrics_timeout.or(b.metrics_timeout),
            metrics_max_bytes: self.metrics_max_bytes.or(b.metrics_max_bytes),
            server_kind: self.server_kind.or(b.server_kind),
            // A pod names one target: `[canary] k8s` is refused before merging.
            k8s: self.k8s.or(b.k8s),
            profiling: self.profiling.or(b.profiling),
            kind: self.kind.or(b.kind),
            worker_probes: self.worker_probes.or(b.worker_probes),
            worker_probe_interval: self.worker_probe_interval.or(b.worker_probe_interval),
            worker_probe_max_rate: self.worker_probe_max_rate.or(b.worker_probe_max_rate),
            direct_paths: self.direct_paths.or(b.direct_paths),
            direct_workers: self.direct_workers.or(b.direct_workers),
            direct_pool: self.direct_pool.or(b.direct_pool),
            direct_interval: self.direct_interval.or(b.direct_interval),
        }
    }
}

/// `[discovery]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDiscovery {
    #[serde(default)]
    pub kubernetes: RawKubernetes,
}

/// `[discovery.kubernetes]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKubernetes {
    pub enabled: Option<bool>,
    pub node_name: Option<String>,
    pub selector: Option<String>,
    pub inference_pools: Option<bool>,
    pub source: Option<String>,
    pub kubelet_pods_api_dir: Option<String>,
}
