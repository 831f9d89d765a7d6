//! One CLIENT span per canary request, built after the request ends from its measurement
//! (the agent owns the whole client trace, so the span needs no live SDK span).
//!
//! Shape (OpenTelemetry GenAI semantic conventions, "Inference" client spans): name
//! `{gen_ai.operation.name} {gen_ai.request.model}`, kind CLIENT, start at the send, end at
//! the end of the stream, status ERROR with `error.type` on failure and unset otherwise.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use crate::sampler::adaptive::{Decision, SpikeTransition};
use crate::sampler::threshold;
use rand::Rng;

use super::names as n;
use crate::measure::Measured;
use crate::sampler::head::HeadSampler;

/// Ids of a canary's trace, made before the request so they can go out in `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceIds {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub sampled: bool,
}

impl TraceIds {
    /// Random, non-zero ids (W3C Trace Context §3.2.2.3, §3.2.2.4).
    pub fn random(sampler: &HeadSampler) -> Self {
        let mut rng = rand::rng();
        let trace_id = TraceId::from(rng.random_range(1..=u128::MAX));
        let span_id = SpanId::from(rng.random_range(1..=u64::MAX));
        Self {
            trace_id,
            span_id,
            sampled: sampler.should_sample(trace_id),
        }
    }

    /// The W3C `traceparent` header value: `00-{trace-id}-{parent-id}-{flags}`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            if self.sampled { 1 } else { 0 }
        )
    }
}

/// What the span needs besides the measurement.
#[derive(Debug, Clone)]
pub struct SpanContextInfo<'a> {
    pub target: &'a str,
    pub operation: &'static str,
    pub provider: &'a str,
    pub request_model: &'a str,
    pub max_tokens: u32,
    pub server_address: &'a str,
    pub server_port: u16,
    pub prompt_id: &'a str,
    /// Attributes other sources add to the span (GPU, kernel network view), appended last.
    pub extra: Vec<KeyValue>,
    /// Span events other sources add (server change events), after the spike events.
    pub events: Vec<opentelemetry::trace::Event>,
}

fn secs(d: std::time::Duration) -> Value {
    Value::F64(d.as_secs_f64())
}

/// Builds the span of one measured request, kept by `decision`: it carries
/// `lmperf.sampling.reason`, its sampling probability as `tracestate: ot=th:…`, and a span
/// event when spike mode changed with this request.
pub fn build_span(
    ids: TraceIds,
    info: &SpanContextInfo<'_>,
    m: &Measured,
    decision: &Decision,
    scope: &InstrumentationScope,
) -> SpanData {
    let r = &m.record;
    let mut a: Vec<KeyValue> = Vec::with_capacity(32);
    a.push(KeyValue::new(n::GEN_AI_OPERATION_NAME, info.operation));
    a.push(KeyValue::new(
        n::GEN_AI_PROVIDER_NAME,
        info.provider.to_owned(),
    ));
    a.push(KeyValue::new(
        n::GEN_AI_REQUEST_MODEL,
        info.request_model.to_owned(),
    ));
    a.push(KeyValue::new(
        n::GEN_AI_REQUEST_MAX_TOKENS,
        i64::from(info.max_tokens),
    ));
    a.push(KeyValue::new(n::GEN_AI_REQUEST_TEMPERATURE, 0.0));
    a.push(KeyValue::new(n::GEN_AI_REQUEST_STREAM, true));
    a.push(KeyValue::new(
        n::SERVER_ADDRESS,
        info.server_address.to_owned(),
    ));
    a.push(KeyValue::new(n::SERVER_PORT, i64::from(info.server_port)));
    a.push(KeyValue::new(n::LMPERF_TARGET, info.target.to_owned()));
    a.push(KeyValue::new(
        n::LMPERF_PROMPT_ID,
        info.prompt_id.to_owned(),
    ));
    a.push(KeyValue::new(n::LMPERF_OUTCOME, r.outcome.as_str()));
    a.push(KeyValue::new(n::LMPERF_E2E, secs(r.e2e)));
    a.push(KeyValue::new(n::LMPERF_RETRIES, i64::from(m.retries)));
    if let Some(id) = &r.response_id {
        a.push(KeyValue::new(n::GEN_AI_RESPONSE_ID, id.clone()));
    }
    if let Some(model) = &r.response_model {
        a.push(KeyValue::new(n::GEN_AI_RESPONSE_MODEL, model.clone()));
    }
    if !r.finish_reasons.is_empty() {
        let v: Vec<opentelemetry::StringValue> =
            r.finish_reasons.iter().map(|s| s.clone().into()).collect();
        a.push(KeyValue::new(
            n::GEN_AI_RESPONSE_FINISH_REASONS,
            Value::Array(v.into()),
        ));
    }
    if let Some(t) = r.ttft {
        a.push(KeyValue::new(
            n::GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
            secs(t),
        ));
    }
    if let Some(t) = r.time_to_first_content {
        a.push(KeyValue::new(n::LMPERF_TIME_TO_FIRST_CONTENT, secs(t)));
    }
    if let Some(v) = r.input_tokens {
        a.push(KeyValue::new(n::GEN_AI_USAGE_INPUT_TOKENS, v as i64));
    }
    if let Some(v) = r.output_tokens {
        a.push(KeyValue::new(n::GEN_AI_USAGE_OUTPUT_TOKENS, v as i64));
    }
    if let Some(v) = r.reasoning_tokens {
        a.push(KeyValue::new(
            n::GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
            v as i64,
        ));
    }
    if let Some(src) = r.usage_source {
        a.push(KeyValue::new(n::LMPERF_USAGE_SOURCE, src.as_str()));
    }
    if let Some(v) = r.itl_mean() {
        a.push(KeyValue::new(n::LMPERF_ITL_MEAN, secs(v)));
    }
    if let Some(v) = r.itl_max() {
        a.push(KeyValue::new(n::LMPERF_ITL_MAX, secs(v)));
    }
    if let Some(v) = r.tpot {
        a.push(KeyValue::new(n::LMPERF_TPOT, secs(v)));
    }
    a.push(KeyValue::new(
        n::LMPERF_TOKEN_CHUNKS,
        r.token_chunk_times.len() as i64,
    ));
    if !r.choices.is_empty() {
        a.push(KeyValue::new(n::LMPERF_CHOICES, r.choices.len() as i64));
    }
    response_attributes(r, &mut a);
    a.push(KeyValue::new(
        n::LMPERF_SAMPLING_REASON,
        decision.reason.as_str(),
    ));
    a.extend(info.extra.iter().cloned());
    let status = match r.failure() {
        Some(e) => {
            a.push(KeyValue::new(n::ERROR_TYPE, e.error_type.clone()));
            if let Some(msg) = &e.message {
                a.push(KeyValue::new(n::LMPERF_ERROR_MESSAGE, msg.clone()));
            }
            if let Some(code) = &e.code {
                a.push(KeyValue::new(n::LMPERF_ERROR_CODE, code.clone()));
            }
            if let Some(t) = &e.server_type {
                a.push(KeyValue::new(n::LMPERF_ERROR_SERVER_TYPE, t.clone()));
            }
            if let Some(d) = e.retry_after {
                a.push(KeyValue::new(n::LMPERF_ERROR_RETRY_AFTER, secs(d)));
            }
            Status::error(e.message.clone().unwrap_or_else(|| e.error_type.clone()))
        }
        _ => Status::Unset,
    };
    let name: Cow<'static, str> = if info.request_model.is_empty() {
        Cow::Borrowed(info.operation)
    } else {
        Cow::Owned(format!("{} {}", info.operation, info.request_model))
    };
    let end_time = m
        .wall_start
        .checked_add(r.e2e)
        .unwrap_or_else(SystemTime::now);
    let mut events = SpanEvents::default();
    if let Some(t) = decision.transition {
        let name = match t {
            SpikeTransition::Entered => n::EVENT_SPIKE_ENTERED,
            SpikeTransition::Left => n::EVENT_SPIKE_LEFT,
        };
        let mut attrs = vec![KeyValue::new(n::LMPERF_TARGET, info.target.to_owned())];
        if let Some(rule) = decision.spike {
            attrs.extend(spike_attributes(&rule));
        }
        events
            .events
            .push(opentelemetry::trace::Event::new(name, end_time, attrs, 0));
    }
    events.events.extend(info.events.iter().cloned());
    let th = format!(
        "th:{}",
        threshold::encode(threshold::threshold(decision.probability))
    );
    let trace_state =
        TraceState::from_key_value([(n::TRACESTATE_OT, th.as_str())]).unwrap_or_default();
    SpanData {
        span_context: SpanContext::new(
            ids.trace_id,
            ids.span_id,
            TraceFlags::SAMPLED,
            false,
            trace_state,
        ),
        parent_span_id: SpanId::INVALID,
        parent_span_is_remote: false,
        span_kind: SpanKind::Client,
        name,
        start_time: m.wall_start,
        end_time,
        attributes: a,
        dropped_attributes_count: 0,
        events,
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope.clone(),
    }
}

/// `lmperf.router.*`: vllm-router's own clock on the request, where it sent one.
fn router_stage_attributes(r: &crate::measure::RequestRecord, a: &mut Vec<KeyValue>) {
    let Some(s) = &r.router_stages else {
        return;
    };
    let outside = r.ttft.and_then(|t| s.outside_ms(t.as_secs_f64() * 1e3));
    for (key, v) in [
        (n::LMPERF_ROUTER_HTTP_TTFB_MS, s.http_ttfb_ms),
        (n::LMPERF_ROUTER_FIRST_TOKEN_MS, s.first_token_ms),
        (n::LMPERF_ROUTER_ENGINE_MS, s.engine_ms),
        (n::LMPERF_ROUTER_OUTSIDE_MS, outside),
    ] {
        if let Some(v) = v {
            a.push(KeyValue::new(key, v));
        }
    }
}

/// The HTTP status, the worker a router said served the request (`lmperf.worker.*`), and the
/// `lmperf.server.request.*` attributes of the server's own timing, where it sent one.
fn response_attributes(r: &crate::measure::RequestRecord, a: &mut Vec<KeyValue>) {
    if let Some(s) = r.http_status {
        a.push(KeyValue::new(n::HTTP_RESPONSE_STATUS_CODE, i64::from(s)));
    }
    if let Some(by) = &r.served_by {
        a.push(KeyValue::new(
            n::LMPERF_WORKER_ATTRIBUTION,
            by.source.as_str(),
        ));
        if let Some(w) = by.primary() {
            a.push(KeyValue::new(n::LMPERF_WORKER_ID, w.id.clone()));
            a.push(KeyValue::new(n::LMPERF_WORKER_ROLE, w.role.as_str()));
        }
        if let Some(p) = by.prefill() {
            a.push(KeyValue::new(n::LMPERF_WORKER_PREFILL_ID, p.id.clone()));
        }
    }
    router_stage_attributes(r, a);
    let Some(t) = &r.server_timing else {
        return;
    };
    a.push(KeyValue::new(
        n::LMPERF_SERVER_REQUEST_TIMING_SOURCE,
        t.source.as_str(),
    ));
    let figures = [
        (n::LMPERF_SERVER_REQUEST_TTFT, t.ttft),
        (n::LMPERF_SERVER_REQUEST_QUEUE, t.queue),
        (n::LMPERF_SERVER_REQUEST_PREFILL, t.prefill),
        (n::LMPERF_SERVER_REQUEST_DECODE, t.decode),
        (n::LMPERF_SERVER_REQUEST_ITL_MEAN, t.mean_itl),
    ];
    for (key, v) in figures {
        if let Some(v) = v {
            a.push(KeyValue::new(key, secs(v)));
        }
    }
    if let Some(gap) = r.ttft.and_then(|c| t.client_minus_server_ttft_ms(c)) {
        a.push(KeyValue::new(
            n::LMPERF_SERVER_REQUEST_CLIENT_MINUS_SERVER_TTFT,
            gap / 1e3,
        ));
    }
    if let Some(rate) = t.kv_hit_rate {
        a.push(KeyValue::new(n::LMPERF_SERVER_REQUEST_KV_HIT_RATE, rate));
    }
    if let Some(depth) = t.router_queue_depth {
        a.push(KeyValue::new(
            n::LMPERF_SERVER_REQUEST_ROUTER_QUEUE_DEPTH,
            i64::try_from(depth).unwrap_or(i64::MAX),
        ));
    }
    let split = r
        .ttft
        .and_then(|c| crate::measure::server_timing::TtftSplit::of(c, t));
    if let Some(s) = split {
        let keys = [
            n::LMPERF_TTFT_FRONTEND_MS,
            n::LMPERF_TTFT_ROUTER_QUEUE_MS,
            n::LMPERF_TTFT_PREFILL_MS,
            n::LMPERF_TTFT_TRANSFER_AND_FIRST_DECODE_MS,
        ];
        for (key, v) in keys.into_iter().zip(s.values()) {
            a.push(KeyValue::new(key, v));
        }
    }
}

/// The `lmperf.spike.*` attributes of the rule that started a spike.
pub fn spike_attributes(rule: &crate::sampler::adaptive::SpikeRule) -> Vec<KeyValue> {
    use crate::sampler::adaptive::SpikeRule;
    let mut a = vec![KeyValue::new(n::LMPERF_SPIKE_REASON, rule.as_str())];
    match *rule {
        SpikeRule::ErrorRate {
            error_rate,
            threshold,
            ..
        } => {
            a.push(KeyValue::new(n::LMPERF_SPIKE_VALUE, error_rate));
            a.push(KeyValue::new(n::LMPERF_SPIKE_THRESHOLD, threshold));
        }
        SpikeRule::SloP99 { p99_s, threshold_s } => {
            a.push(KeyValue::new(n::LMPERF_SPIKE_VALUE, p99_s));
            a.push(KeyValue::new(n::LMPERF_SPIKE_THRESHOLD, threshold_s));
        }
        SpikeRule::LatencyJump {
            signal,
            p99_s,
            baseline_s,
            ratio,
            z,
            in_flight,
        } => {
            a.push(KeyValue::new(n::LMPERF_SPIKE_SIGNAL, signal));
            a.push(KeyValue::new(n::LMPERF_SPIKE_VALUE, p99_s));
            a.push(KeyValue::new(n::LMPERF_SPIKE_BASELINE, baseline_s));
            a.push(KeyValue::new(n::LMPERF_SPIKE_RATIO, ratio));
            a.push(KeyValue::new(n::LMPERF_SPIKE_Z, z));
            a.push(KeyValue::new(n::LMPERF_SPIKE_IN_FLIGHT, in_flight as i64));
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_w3c() {
        let ids = TraceIds {
            trace_id: TraceId::from(0x0af7651916cd43dd8448eb211c80319c_u128),
            span_id: SpanId::from(0xb7ad6b7169203331_u64),
            sampled: true,
        };
        assert_eq!(
            ids.traceparent(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
    }
}
