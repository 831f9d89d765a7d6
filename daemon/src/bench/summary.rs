//! The `summary.json` and `requests.jsonl` types (schema [`super::SCHEMA_VERSION`]): one
//! request's row ([`RequestRow`], [`ChoiceRow`]), one benchmark ([`BenchSummary`]) and the
//! whole run ([`Summary`]).

use std::collections::BTreeMap;

use serde::Serialize;

use super::prompts::{self, Tokenizer};
use super::stats::Distribution;
use super::{Goodput, buckets, capacity, groups, launch, profile, repeat, server, vram, workload};

/// One request of a benchmark: a line of `requests.jsonl`. Times in milliseconds; `*_ms`
/// offsets are from the benchmark's start (the first scheduled send).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestRow {
    pub schema_version: u32,
    pub benchmark: String,
    pub index: usize,
    /// Which run of the benchmark (0-based, `--repeat`); offsets restart at each.
    pub repeat: usize,
    pub concurrency: usize,
    /// Requests allowed in flight when this one was dispatched: `concurrency`, or the
    /// ramp's limit then with `--ramp-over concurrency` ([`workload::Ramp::concurrency_at`]).
    pub concurrency_limit: usize,
    pub scheduled_ms: f64,
    /// Time the request waited for a free concurrency slot after its scheduled time; closed
    /// loop (no rate: every offset 0), after its slot became free (`scheduled_ms` is then
    /// that moment).
    pub dispatch_delay_ms: f64,
    pub send_ms: f64,
    pub ttft_ms: Option<f64>,
    pub ttft_from_schedule_ms: Option<f64>,
    pub time_to_first_content_ms: Option<f64>,
    pub itl_ms: Vec<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: f64,
    pub e2el_from_schedule_ms: f64,
    /// Prompt length by the tokenizer (see `summary.json` `tokenizer`).
    pub prompt_tokens: u32,
    pub prompt_tokens_target: u32,
    /// `max_tokens` asked (and `min_tokens` with ignore-EOS); `output_tokens` is what came.
    pub output_tokens_target: u32,
    /// Turn of a multi-turn conversation (0, 1, …; `index` is the conversation's).
    pub turn: u32,
    /// Input tokens from the server's usage.
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub usage_source: Option<&'static str>,
    pub finish_reasons: Vec<String>,
    pub outcome: &'static str,
    pub error_type: Option<String>,
    pub http_status: Option<u16>,
    pub retries: u32,
    /// `--profile`: the profile revision the request was sent under (0 = as started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_revision: Option<u32>,
    /// The server's own error type (e.g. `exceed_context_size_error`), where it sent one.
    pub error_server_type: Option<String>,
    /// The server's error code, as text.
    pub error_code: Option<String>,
    /// The server's (or the transport's) message, cut to 512 bytes.
    pub error_message: Option<String>,
    /// The server's `Retry-After` on an HTTP error, in milliseconds.
    pub retry_after_ms: Option<f64>,
    /// Per choice of an `n > 1` request (index, first token, ITL, TPOT, finish reason); empty
    /// for one choice.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<ChoiceRow>,
    /// What decided `prompt_tokens`: for chat, the whole request with its chat template
    /// (`server_template`, `local_template`) or not (`text_only`, `estimate`); see
    /// [`prompts::PromptTokensSource`].
    pub prompt_tokens_source: prompts::PromptTokensSource,
    /// `--lora-modules`: the adapter the request named as its `model` (absent without).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// `--target` repeated: the endpoint (base URL) the request went to (absent with one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `--probe-rate`: a canary probe sent alongside the load, summarized apart from the
    /// benchmark (`benchmarks[].probes`); absent for the benchmark's own requests.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub probe: bool,
    /// Of `input_tokens`, those the server took from its prefix cache (its usage's
    /// `prompt_tokens_details.cached_tokens`, llama.cpp's `timings.cache_n`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    /// The response's `id` (e.g. `chatcmpl-…`): the key into the server's or router's own
    /// request log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_id: Option<String>,
    /// A router target (`kind = "router"`): the worker that streamed the answer (Dynamo's
    /// instance id, llm-d's `namespace/pod`, SGLang's gateway's worker URL), its role (agg |
    /// decode | prefill), a disaggregated request's prefill worker, and how it is known
    /// (dynamo_nvext | llm_d_header | smg_header | unattributed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_worker_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_attribution: Option<&'static str>,
    /// The server's own timing of the request, ms, where its response carried it (vLLM's
    /// per-request `metrics`, llama.cpp's `timings`; `server_timing_source` names which).
    /// `server_ttft_ms` is arrival in the engine → first token; each absent when not said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_timing_source: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_ttft_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_queue_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_prefill_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_decode_ms: Option<f64>,
    /// `ttft_ms − server_ttft_ms` (signed): network, client and the server's HTTP front end;
    /// where the server's timing has no queue figure (llama.cpp's `timings`, which start when
    /// a slot takes the request), also the wait for a free slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_minus_server_ttft_ms: Option<f64>,
    /// vllm-router's own clock (`x-router-stages`, with `VLLM_ROUTER_STAGES=1`): its worker's
    /// first token, ms on the router's clock, and the client's TTFT minus it (the time outside
    /// the router's clock: the network to the router, the router's work before its timer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router_first_token_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router_outside_ms: Option<f64>,
    /// A request routed through NVIDIA Dynamo that said its timing (`nvext.timing`): its
    /// client TTFT split along the serving path, ms, summing to `ttft_ms`
    /// ([`crate::measure::server_timing::TtftSplit`]): `ttft_frontend_ms` (what the
    /// frontend's clock did not see), `ttft_router_queue_ms` (received → prefill start),
    /// `ttft_prefill_ms`, `ttft_transfer_and_first_decode_ms` (the KV transfer under P/D, the
    /// first decode step). Absent where the server gave no split.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_frontend_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_router_queue_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_prefill_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_transfer_and_first_decode_ms: Option<f64>,
    /// Dynamo: the prompt's KV blocks the router found cached ÷ its blocks (0..1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_kv_hit_rate: Option<f64>,
    /// Dynamo under prefill/decode disaggregation: the router's estimate of the prompt's KV
    /// transfer, ms (`kv_transfer_estimated_latency_ms`; part of
    /// `ttft_transfer_and_first_decode_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_kv_transfer_ms: Option<f64>,
    /// `--prefix-groups`: the request's group (0-based).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_group: Option<u32>,
    /// `--prefix-groups`: whether it was the first of its group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_first: Option<bool>,
    /// `--prefix-len`: tokens of its group's prefix (what a later request of the group should
    /// find in the server's cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_shared_tokens: Option<u32>,
    /// Images sent with the request (`--images-per-request`, dataset `images`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<u32>,
    /// Encoded bytes of the synthetic images (before base64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_bytes: Option<u64>,
    /// `WxH` of the synthetic images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_size: Option<String>,
}

impl RequestRow {
    /// Its TTFT split in [`crate::measure::server_timing::TtftSplit::SEGMENTS`] order, when
    /// the server gave one (all four segments).
    pub fn ttft_split(&self) -> Option<[f64; 4]> {
        Some([
            self.ttft_frontend_ms?,
            self.ttft_router_queue_ms?,
            self.ttft_prefill_ms?,
            self.ttft_transfer_and_first_decode_ms?,
        ])
    }

    /// The key of its `benchmarks[].workers` block: the worker id, `PREFILL→DECODE` for a
    /// disaggregated request, `unattributed` when the router named none; `None` off a router.
    pub fn worker_key(&self) -> Option<String> {
        let source = self.worker_attribution?;
        Some(match (&self.prefill_worker_id, &self.worker_id) {
            (Some(p), Some(d)) => format!("{p}→{d}"),
            (None, Some(w)) => w.clone(),
            _ => source.to_owned(),
        })
    }

    /// Input tokens the server counted beyond the text of a request with images
    /// (`input_tokens − prompt_tokens`); `None` without images or the server's count.
    pub fn image_tokens(&self) -> Option<u64> {
        self.images.filter(|n| *n > 0)?;
        self.input_tokens
            .map(|n| n.saturating_sub(u64::from(self.prompt_tokens)))
    }

    /// The input length the request is bucketed by (heatmaps, length buckets, SLO cells): the
    /// server's `usage.prompt_tokens` when it reported one, else the calibrated `prompt_tokens`.
    pub fn input_tokens_for_buckets(&self) -> u64 {
        self.input_tokens.unwrap_or(u64::from(self.prompt_tokens))
    }

    /// Whether the server's input count differs from `prompt_tokens` by more than the one BOS
    /// token it may add (`prompt_tokens_mismatch`); false without the server's count.
    /// A request with images is not checked: the server counts the images' tokens too.
    pub fn prompt_tokens_mismatch(&self) -> bool {
        self.images.is_none_or(|n| n == 0)
            && self
                .input_tokens
                .is_some_and(|n| n.abs_diff(u64::from(self.prompt_tokens)) > 1)
    }
}

/// One choice of an `n > 1` request in `requests.jsonl`; times from the request's send.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChoiceRow {
    pub index: u32,
    pub ttft_ms: Option<f64>,
    pub last_token_ms: Option<f64>,
    pub token_chunks: usize,
    pub itl_ms: Vec<f64>,
    pub tpot_ms: Option<f64>,
    pub finish_reason: Option<String>,
}

/// One benchmark of `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct BenchSummary {
    pub benchmark: String,
    pub concurrency: usize,
    pub input_len: u32,
    pub output_len: u32,
    /// `"inf"` or requests per second.
    pub request_rate: serde_json::Value,
    pub num_requests: usize,
    pub completed: usize,
    /// Failed requests by `error.type`.
    pub errors: BTreeMap<String, usize>,
    /// Failed requests by HTTP status (`"400"`; `"none"` without a response).
    pub errors_by_status: BTreeMap<String, usize>,
    /// Failed requests by HTTP status, then by the server's own error type (or `error.type`
    /// when the server gave none): `{"400": {"exceed_context_size_error": 2}}`.
    pub errors_by_status_and_type: BTreeMap<String, BTreeMap<String, usize>>,
    /// The first message per `"STATUS TYPE"` of `errors_by_status_and_type` (the server's
    /// reason: `"400 exceed_context_size_error": "request (3001 tokens) exceeds …"`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub error_messages: BTreeMap<String, String>,
    /// Failed requests ÷ requests sent (0..1; 0 without a request).
    pub error_rate: f64,
    /// Failed requests the server failed for memory: the GPU's (CUDA/HIP out of memory) or
    /// its KV cache's, in each server's words ([`super::oom`]).
    pub oom: usize,
    /// `oom` ÷ requests sent (0..1).
    pub oom_rate: f64,
    /// What the schedule (or the profile's steps) made due against what went out
    /// ([`super::offered`]); absent for a capacity search's steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offered: Option<super::offered::Offered>,
    /// First send to last end, seconds.
    pub duration_s: f64,
    /// Completed requests per second.
    pub request_throughput: f64,
    pub output_token_throughput: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    /// Requests per second meeting every `--goodput` SLO (null without SLOs).
    pub goodput: Option<f64>,
    pub ttft_ms: Option<Distribution>,
    /// Time to first visible output (AIPerf's TTFO): send → first chunk with text or a tool
    /// call, not reasoning (`requests.jsonl` `time_to_first_content_ms`); equal to TTFT for a
    /// model that does not reason, later by its thinking for one that does.
    pub ttfo_ms: Option<Distribution>,
    pub itl_ms: Option<Distribution>,
    pub tpot_ms: Option<Distribution>,
    pub e2el_ms: Option<Distribution>,
    pub ttft_from_schedule_ms: Option<Distribution>,
    pub e2el_from_schedule_ms: Option<Distribution>,
    pub dispatch_delay_ms: Option<Distribution>,
    pub output_tokens: Option<Distribution>,
    /// Output lengths asked (`max_tokens`), against the achieved `output_tokens`.
    pub output_tokens_target: Option<Distribution>,
    /// Successful requests that ended with fewer output tokens than asked.
    pub output_tokens_short: usize,
    pub prompt_tokens: Option<Distribution>,
    /// Requests whose server-reported input tokens differ from `prompt_tokens` by more than
    /// 1 (BOS): a calibration that missed (e.g. a chat template not counted).
    pub prompt_tokens_mismatch: usize,
    /// Peak GPU memory during the benchmark; null without GPU figures (see `Summary::gpu`).
    pub vram: Option<vram::VramStats>,
    /// The model server's own signals during the benchmark ([`server`]); null when its
    /// metrics could not be read or `server_metrics = off`.
    pub server: Option<server::ServerBlock>,
    /// Variation across `--repeat` runs (null with one run); the fields above pool all runs.
    pub repeat: Option<repeat::RepeatStats>,
    /// Warm-up requests sent before the measured ones (`--warmup` per run), not measured.
    pub warmup_requests: usize,
    /// Wall time of those warm-ups, seconds (all runs together); the report marks it.
    pub warmup_s: f64,
    /// Wall time before the first measured send spent making the first prompts (calibrated
    /// with the tokenizer), seconds (all runs together); not measured, the report marks it.
    pub prepare_s: f64,
    /// `--lora-modules`: per adapter (absent without).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapters: Option<BTreeMap<String, groups::GroupSummary>>,
    /// `--target` repeated: per endpoint, by base URL (absent with one endpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<BTreeMap<String, groups::GroupSummary>>,
    /// `--target-kind router`: per worker the router said served each request
    /// ([`RequestRow::worker_key`]; they sum to the benchmark's requests); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<BTreeMap<String, groups::GroupSummary>>,
    /// `--probe-rate`: the canary probes sent alongside the load (absent without).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probes: Option<groups::GroupSummary>,
    /// `--prefix-len`: the server's prefix-cache hit ratio beside the workload's, TTFT first
    /// vs later in group (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<super::workload_stats::PrefixCacheStats>,
    /// Requests with images, by image size (absent without them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<super::workload_stats::ImageStats>,
    /// The server's own per-request timing beside the client's TTFT (absent when no
    /// response carried it; [`super::server_timing`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_timing: Option<super::server_timing::ServerTimingSummary>,
    /// `--target-kind router` with its workers known (`--direct-workers` or the router's
    /// list): routed p50 − direct p50 of TTFT and E2E ([`super::direct`]); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<super::direct::BenchPath>,
}

/// `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub schema_version: u32,
    pub lmperf_version: &'static str,
    pub target: String,
    pub model: String,
    pub api: &'static str,
    pub tokenizer: Tokenizer,
    pub seed: u64,
    pub goodput_slo: Goodput,
    pub benchmarks: Vec<BenchSummary>,
    /// Per concurrency, its requests bucketed by their own input × output lengths (the
    /// report's heatmaps and SLO matrix; scheme in [`buckets`]).
    pub length_buckets: Vec<buckets::LengthBuckets>,
    /// Whether the benchmarks have GPU memory figures, and why not.
    pub gpu: vram::GpuRunStatus,
    /// The replayed trace (`--trace`), if any.
    pub trace: Option<workload::TraceInfo>,
    /// Length distributions, prompt file, ramp.
    pub workload: workload::WorkloadInfo,
    /// `--fail-on` gates that tripped.
    pub failed_gates: Vec<String>,
    /// The server `--launch` started (absent without it; the server's own signals are
    /// per benchmark, `benchmarks[].server`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch: Option<launch::ServerInfo>,
    /// `--find-max-rate`: the capacity search (absent without it; see [`capacity`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<capacity::Capacity>,
    /// `--profile`: the file and its revisions over time (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<profile::run::ProfileInfo>,
    /// Ctrl-C or SIGTERM stopped the run: `benchmarks` holds those that completed (absent
    /// when the run finished).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// What decides the prompts' `prompt_tokens` ([`prompts::PromptTokensSource`]).
    pub prompt_tokens_source: prompts::PromptTokensSource,
    /// `--api chat`: where the chat template counted came from (null for completions).
    pub chat_template: Option<String>,
    /// Sum of the benchmarks' `prompt_tokens_mismatch`.
    pub prompt_tokens_mismatch: usize,
    /// `--profile-on-fail`: the server profiler's call when a TPOT gate tripped (absent
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_profile: Option<crate::diagnosis::report::ServerProfile>,
}
