//! What the server says it spent on one request, read from the response itself.
//!
//! Two shapes exist upstream (checked against their sources):
//! - **vLLM** `--enable-per-request-metrics` (docs/features/per_request_metrics.md, PR #46768):
//!   a top-level `metrics` object on the final usage chunk of a stream (sent only with
//!   `stream_options.include_usage`, which the canary sets), `null` for `n > 1`:
//!   `time_to_first_token_ms` (from *scheduled* to the first token: the prefill),
//!   `queue_time_ms` (waiting in the scheduler), `generation_time_ms` (first to last token: the
//!   decode), `mean_itl_ms`, `tokens_per_second`; each field may be `null`.
//! - **llama.cpp** `timings` beside the usage (tools/server/server-context.cpp, `result_timings`):
//!   `prompt_n` and `prompt_ms` (`t_start_process_prompt` → the first token sampled: after
//!   tokenization and any wait for a free slot), `predicted_n` and `predicted_ms` (the first
//!   token → the last), `cache_n`. llama.cpp reports no wait for a free slot.
//!
//! - **NVIDIA Dynamo** (the frontend, asked with `"nvext": {"extra_fields": ["timing"]}`): the
//!   stream's chunks carry `nvext.timing` (`TimingInfo` of `lib/llm/src/protocols/common/
//!   timing.rs`; the field names checked in the installed 1.6.1 `_core.abi3.so`):
//!   `request_received_ms` (epoch), `prefill_wait_time_ms` (received → prefill start: the
//!   frontend's and router's queue), `prefill_time_ms` (prefill start → its end),
//!   `ttft_ms` (received → the first token), `total_time_ms`, `kv_hit_rate` (cached ÷ input
//!   blocks), `router_queue_depth`. The frontend's clock: the whole serving path behind it.
//!
//! A field absent (or `null`, negative, not finite) is absent here, never 0. SGLang's and TGI's
//! OpenAI-compatible streams carry no per-request timing (SGLang's native `/generate`
//! `meta_info` is not what a canary calls), so they have none.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which response field the figures came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingSource {
    /// vLLM's per-request `metrics` object.
    VllmMetrics,
    /// llama.cpp's `timings` object.
    LlamaCppTimings,
    /// NVIDIA Dynamo's `nvext.timing` (the frontend's clock over router and workers).
    DynamoTiming,
}

impl TimingSource {
    /// The name used in spans, rows and evidence (`vllm_metrics`, `llama_cpp_timings`).
    pub fn as_str(self) -> &'static str {
        match self {
            TimingSource::VllmMetrics => "vllm_metrics",
            TimingSource::LlamaCppTimings => "llama_cpp_timings",
            TimingSource::DynamoTiming => "dynamo_timing",
        }
    }
}

/// The server's own account of one request. Every duration is what the server measured on
/// its clock; `None` where its response did not say.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ServerTiming {
    pub source: TimingSource,
    /// Arrival in the engine → first token: `queue + prefill` for vLLM (both needed);
    /// llama.cpp's `prompt_ms` (it reports no queue).
    pub ttft: Option<Duration>,
    /// Waiting in the scheduler before processing (vLLM `queue_time_ms`).
    pub queue: Option<Duration>,
    /// Scheduled → first token (vLLM `time_to_first_token_ms`; llama.cpp `prompt_ms`).
    pub prefill: Option<Duration>,
    /// First → last token (vLLM `generation_time_ms`; llama.cpp `predicted_ms`).
    pub decode: Option<Duration>,
    /// Mean gap between output tokens during decode (vLLM `mean_itl_ms`).
    pub mean_itl: Option<Duration>,
    /// Prompt tokens the server computed, cached ones excluded (llama.cpp `prompt_n`).
    pub prompt_tokens_computed: Option<u64>,
    /// Tokens the server generated in `decode` (llama.cpp `predicted_n`).
    pub decoded_tokens: Option<u64>,
    /// Dynamo: the KV blocks of the prompt found cached ÷ its blocks (`kv_hit_rate`), 0..1.
    pub kv_hit_rate: Option<f64>,
    /// Dynamo: requests waiting in the router's queue when this one was routed
    /// (`router_queue_depth`).
    pub router_queue_depth: Option<u64>,
    /// Dynamo under prefill/decode disaggregation: the router's estimate of the prompt's KV
    /// transfer from the prefill to the decode worker (`kv_transfer_estimated_latency_ms`),
    /// which 1.6.1's `ttft_ms` (it ends at the prefill worker's first token) does not hold.
    pub kv_transfer_estimate: Option<Duration>,
}

impl ServerTiming {
    /// A timing from `source` that says nothing yet (every figure `None`), to fill in.
    pub fn said_by(source: TimingSource) -> Self {
        ServerTiming {
            source,
            ttft: None,
            queue: None,
            prefill: None,
            decode: None,
            mean_itl: None,
            prompt_tokens_computed: None,
            decoded_tokens: None,
            kv_hit_rate: None,
            router_queue_depth: None,
            kv_transfer_estimate: None,
        }
    }

    /// Client TTFT minus the server's, in milliseconds (signed): the network, the client and
    /// the server's HTTP front end (tokenization, routing). `None` without a server TTFT.
    pub fn client_minus_server_ttft_ms(&self, client_ttft: Duration) -> Option<f64> {
        let nanos = |d: Duration| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX);
        self.ttft
            .map(|s| (nanos(client_ttft) - nanos(s)) as f64 / 1e6)
    }
}

/// vLLM's per-request `metrics` object, every field optional.
#[derive(Debug, Deserialize)]
pub(crate) struct RawVllmMetrics {
    #[serde(default)]
    time_to_first_token_ms: Option<f64>,
    #[serde(default)]
    generation_time_ms: Option<f64>,
    #[serde(default)]
    queue_time_ms: Option<f64>,
    #[serde(default)]
    mean_itl_ms: Option<f64>,
}

/// llama.cpp's `timings` object, every field optional.
#[derive(Debug, Deserialize)]
pub(crate) struct RawTimings {
    #[serde(default)]
    pub(crate) cache_n: Option<u64>,
    #[serde(default)]
    prompt_n: Option<u64>,
    #[serde(default)]
    prompt_ms: Option<f64>,
    #[serde(default)]
    predicted_n: Option<u64>,
    #[serde(default)]
    predicted_ms: Option<f64>,
}

/// Dynamo's `nvext.timing` object (`TimingInfo`), every field optional here.
#[derive(Debug, Deserialize)]
pub(crate) struct RawDynamoTiming {
    #[serde(default)]
    prefill_wait_time_ms: Option<f64>,
    #[serde(default)]
    prefill_time_ms: Option<f64>,
    #[serde(default)]
    ttft_ms: Option<f64>,
    #[serde(default)]
    total_time_ms: Option<f64>,
    #[serde(default)]
    kv_hit_rate: Option<f64>,
    #[serde(default)]
    router_queue_depth: Option<f64>,
    #[serde(default)]
    kv_transfer_estimated_latency_ms: Option<f64>,
}

impl RawDynamoTiming {
    /// `None` when it carries no duration (a `request_received_ms`-only object).
    pub(crate) fn read(&self) -> Option<ServerTiming> {
        let ttft = millis(self.ttft_ms);
        let total = millis(self.total_time_ms);
        let t = ServerTiming {
            source: TimingSource::DynamoTiming,
            ttft,
            queue: millis(self.prefill_wait_time_ms),
            prefill: millis(self.prefill_time_ms),
            decode: total.zip(ttft).and_then(|(a, b)| a.checked_sub(b)),
            mean_itl: None,
            prompt_tokens_computed: None,
            decoded_tokens: None,
            kv_hit_rate: self
                .kv_hit_rate
                .filter(|r| r.is_finite() && (0.0..=1.0).contains(r)),
            router_queue_depth: self
                .router_queue_depth
                .filter(|d| d.is_finite() && *d >= 0.0)
                .map(|d| d as u64),
            kv_transfer_estimate: millis(self.kv_transfer_estimated_latency_ms),
        };
        (t.ttft.is_some() || t.queue.is_some() || t.prefill.is_some() || total.is_some())
            .then_some(t)
    }
}

/// A routed request's TTFT split along the serving path, milliseconds, from the client's TTFT
/// and Dynamo's own clock ([`TimingSource::DynamoTiming`] with its `ttft_ms`,
/// `prefill_wait_time_ms`, `prefill_time_ms` and, disaggregated,
/// `kv_transfer_estimated_latency_ms`). The four segments add up to the client's TTFT (to the
/// nanosecond, each rounded there): `frontend` is what the frontend's clock did not see
/// (network, HTTP, tokenization before its timer), `transfer_and_first_decode` what follows the
/// prefill up to the first token: the rest of `ttft_ms`, plus, under prefill/decode
/// disaggregation, the KV transfer. Dynamo 1.6.1's `ttft_ms` ends at the prefill worker's
/// first token, before the transfer (measured: `ttft_ms` 8.2 ms, the client's TTFT 124.8 ms,
/// `kv_transfer_estimated_latency_ms` 108.5 ms at 0.1 GB/s); the transfer is the router's
/// estimate, the one figure of it 1.6.1 gives, so an estimate that is off moves the
/// difference into `frontend`. Signed: clocks that disagree show as a negative segment, never
/// hidden.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TtftSplit {
    pub frontend_ms: f64,
    pub router_queue_ms: f64,
    pub prefill_ms: f64,
    pub transfer_and_first_decode_ms: f64,
}

impl TtftSplit {
    /// The segment names, in path order (`lmperf.ttft.<name>_ms`, `requests.jsonl`).
    pub const SEGMENTS: [&'static str; 4] = [
        "frontend",
        "router_queue",
        "prefill",
        "transfer_and_first_decode",
    ];

    /// The split of `client_ttft` by `t`; `None` unless `t` is Dynamo's and says its TTFT,
    /// queue and prefill (no split is ever guessed).
    pub fn of(client_ttft: Duration, t: &ServerTiming) -> Option<TtftSplit> {
        if t.source != TimingSource::DynamoTiming {
            return None;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        // To the nanosecond: a difference of equal figures is 0, not float noise.
        let ns = |v: f64| (v * 1e6).round() / 1e6;
        let (ttft, queue, prefill) = (ms(t.ttft?), ms(t.queue?), ms(t.prefill?));
        let transfer = t.kv_transfer_estimate.map_or(0.0, ms);
        Some(TtftSplit {
            frontend_ms: ns(ms(client_ttft) - ttft - transfer),
            router_queue_ms: ns(queue),
            prefill_ms: ns(prefill),
            transfer_and_first_decode_ms: ns(ttft - queue - prefill + transfer),
        })
    }

    /// The segments in [`TtftSplit::SEGMENTS`] order.
    pub fn values(&self) -> [f64; 4] {
        [
            self.frontend_ms,
            self.router_queue_ms,
            self.prefill_ms,
            self.transfer_and_first_decode_ms,
        ]
    }
}

/// Milliseconds as the server wrote them → a duration; `None` for negative or not finite.
fn millis(v: Option<f64>) -> Option<Duration> {
    v.filter(|ms| ms.is_finite() && *ms >= 0.0)
        .and_then(|ms| Duration::try_from_secs_f64(ms / 1e3).ok())
}

impl RawVllmMetrics {
    /// `None` when no timing field is set (all `null`).
    pub(crate) fn read(&self) -> Option<ServerTiming> {
        let queue = millis(self.queue_time_ms);
        let prefill = millis(self.time_to_first_token_ms);
        let t = ServerTiming {
            source: TimingSource::VllmMetrics,
            ttft: queue.zip(prefill).map(|(q, p)| q + p),
            queue,
            prefill,
            decode: millis(self.generation_time_ms),
            mean_itl: millis(self.mean_itl_ms),
            prompt_tokens_computed: None,
            decoded_tokens: None,
            kv_hit_rate: None,
            router_queue_depth: None,
            kv_transfer_estimate: None,
        };
        (t.prefill.is_some() || t.queue.is_some() || t.decode.is_some()).then_some(t)
    }
}

impl RawTimings {
    /// `None` when neither `prompt_ms` nor `predicted_ms` is set (a `cache_n`-only object).
    pub(crate) fn read(&self) -> Option<ServerTiming> {
        let prefill = millis(self.prompt_ms);
        let decode = millis(self.predicted_ms);
        (prefill.is_some() || decode.is_some()).then_some(ServerTiming {
            source: TimingSource::LlamaCppTimings,
            ttft: prefill,
            queue: None,
            prefill,
            decode,
            mean_itl: None,
            prompt_tokens_computed: self.prompt_n,
            decoded_tokens: self.predicted_n,
            kv_hit_rate: None,
            router_queue_depth: None,
            kv_transfer_estimate: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm(json: &str) -> Option<ServerTiming> {
        serde_json::from_str::<RawVllmMetrics>(json).unwrap().read()
    }

    fn llama(json: &str) -> Option<ServerTiming> {
        serde_json::from_str::<RawTimings>(json).unwrap().read()
    }

    /// The upstream docs' example: TTFT from scheduled (prefill) plus queue is the server TTFT.
    #[test]
    fn vllm_metrics_split_into_queue_prefill_and_decode() {
        let t = vllm(r#"{"time_to_first_token_ms":85.2,"generation_time_ms":1240.5,"queue_time_ms":12.3,"mean_itl_ms":9.1,"tokens_per_second":103.2}"#).unwrap();
        assert_eq!(t.source, TimingSource::VllmMetrics);
        assert_eq!(t.queue, Some(Duration::from_micros(12_300)));
        assert_eq!(t.prefill, Some(Duration::from_micros(85_200)));
        assert_eq!(t.ttft, Some(Duration::from_micros(97_500)));
        assert_eq!(t.decode, Some(Duration::from_micros(1_240_500)));
        assert_eq!(t.mean_itl, Some(Duration::from_micros(9_100)));
        let gap = t
            .client_minus_server_ttft_ms(Duration::from_millis(100))
            .unwrap();
        assert!((gap - 2.5).abs() < 1e-9, "{gap}");
    }

    /// Absent is absent: a `null` queue leaves no server TTFT; all `null` is no timing at all.
    #[test]
    fn null_and_bad_fields_are_absent_never_zero() {
        let t = vllm(r#"{"time_to_first_token_ms":40.0,"queue_time_ms":null,"mean_itl_ms":null}"#)
            .unwrap();
        assert_eq!(
            (t.prefill, t.queue, t.ttft),
            (Some(Duration::from_millis(40)), None, None)
        );
        assert_eq!(
            t.client_minus_server_ttft_ms(Duration::from_millis(50)),
            None
        );
        assert_eq!(
            vllm(r#"{"time_to_first_token_ms":null,"generation_time_ms":null}"#),
            None
        );
        let t = vllm(r#"{"time_to_first_token_ms":-1.0,"generation_time_ms":3.0}"#).unwrap();
        assert_eq!(
            (t.prefill, t.decode),
            (None, Some(Duration::from_millis(3)))
        );
    }

    /// llama.cpp: `prompt_ms` is prefill and the server TTFT; no queue; token counts kept.
    #[test]
    fn llama_cpp_timings_give_prefill_decode_and_counts() {
        let t = llama(r#"{"cache_n":0,"prompt_n":12,"prompt_ms":31.25,"prompt_per_token_ms":2.6,"predicted_n":8,"predicted_ms":120.5,"predicted_per_second":66.4}"#).unwrap();
        assert_eq!(t.source, TimingSource::LlamaCppTimings);
        assert_eq!(t.ttft, Some(Duration::from_micros(31_250)));
        assert_eq!(t.prefill, t.ttft);
        assert_eq!(t.queue, None);
        assert_eq!(t.decode, Some(Duration::from_micros(120_500)));
        assert_eq!(
            (t.prompt_tokens_computed, t.decoded_tokens),
            (Some(12), Some(8))
        );
        assert_eq!(llama(r#"{"cache_n":23}"#), None);
    }

    fn dynamo(json: &str) -> Option<ServerTiming> {
        serde_json::from_str::<RawDynamoTiming>(json)
            .unwrap()
            .read()
    }

    /// Disaggregated, 1.6.1's `ttft_ms` ends at the prefill worker's first token and the KV
    /// transfer follows it (a live P/D reply at 0.1 GB/s): the transfer goes to
    /// `transfer_and_first_decode`, not to `frontend`; the split still adds up.
    #[test]
    fn a_disaggregated_ttft_holds_the_kv_transfer_after_dynamos_ttft() {
        let t = dynamo(r#"{"request_received_ms":1796640737419,"prefill_wait_time_ms":3.477828,"prefill_time_ms":4.711715,"ttft_ms":8.189543,"total_time_ms":118.597991,"kv_transfer_estimated_latency_ms":108.533123}"#).unwrap();
        assert_eq!(
            t.kv_transfer_estimate,
            Some(Duration::from_nanos(108_533_123))
        );
        let client = Duration::from_micros(124_768);
        let s = TtftSplit::of(client, &t).unwrap();
        assert_eq!(s.router_queue_ms, 3.477828);
        assert_eq!(s.prefill_ms, 4.711715);
        assert_eq!(s.transfer_and_first_decode_ms, 108.533123);
        assert_eq!(s.frontend_ms, 8.045334);
        let sum: f64 = s.values().iter().sum();
        assert!((sum - 124.768).abs() < 1e-6, "{sum}");
    }

    /// Dynamo's `nvext.timing` as the 1.6.1 frontend writes it: the queue, the prefill, the
    /// TTFT on its clock; the split of a client TTFT adds up to it exactly.
    #[test]
    fn dynamo_timing_splits_a_routed_ttft_along_the_path() {
        let t = dynamo(r#"{"request_received_ms":1765000000000,"prefill_wait_time_ms":1.5,"prefill_time_ms":20.25,"ttft_ms":31.75,"total_time_ms":131.75,"kv_hit_rate":0.5,"router_queue_depth":3}"#).unwrap();
        assert_eq!(t.source, TimingSource::DynamoTiming);
        assert_eq!(t.source.as_str(), "dynamo_timing");
        assert_eq!(t.queue, Some(Duration::from_micros(1_500)));
        assert_eq!(t.prefill, Some(Duration::from_micros(20_250)));
        assert_eq!(t.ttft, Some(Duration::from_micros(31_750)));
        assert_eq!(t.decode, Some(Duration::from_millis(100)));
        assert_eq!((t.kv_hit_rate, t.router_queue_depth), (Some(0.5), Some(3)));
        let split = TtftSplit::of(Duration::from_millis(40), &t).unwrap();
        assert_eq!(
            split,
            TtftSplit {
                frontend_ms: 8.25,
                router_queue_ms: 1.5,
                prefill_ms: 20.25,
                transfer_and_first_decode_ms: 10.0,
            }
        );
        assert!((split.values().iter().sum::<f64>() - 40.0).abs() < 1e-9);
    }

    /// No split without all three figures, nor from another server's timing; a field Dynamo
    /// did not send stays absent; an object with no duration is no timing.
    #[test]
    fn no_dynamo_split_is_guessed() {
        let t = dynamo(r#"{"request_received_ms":1,"ttft_ms":30.0,"prefill_wait_time_ms":2.0}"#)
            .unwrap();
        assert_eq!((t.prefill, t.decode, t.kv_hit_rate), (None, None, None));
        assert_eq!(TtftSplit::of(Duration::from_millis(40), &t), None);
        assert_eq!(dynamo(r#"{"request_received_ms":1}"#), None);
        assert_eq!(
            dynamo(r#"{"ttft_ms":5.0,"kv_hit_rate":7.0}"#)
                .unwrap()
                .kv_hit_rate,
            None
        );
        let v = vllm(r#"{"time_to_first_token_ms":10.0,"queue_time_ms":1.0}"#).unwrap();
        assert_eq!(TtftSplit::of(Duration::from_millis(40), &v), None);
    }
}
