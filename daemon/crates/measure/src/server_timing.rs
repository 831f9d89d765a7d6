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
}

impl TimingSource {
    /// The name used in spans, rows and evidence (`vllm_metrics`, `llama_cpp_timings`).
    pub fn as_str(self) -> &'static str {
        match self {
            TimingSource::VllmMetrics => "vllm_metrics",
            TimingSource::LlamaCppTimings => "llama_cpp_timings",
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
}

impl ServerTiming {
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
}
