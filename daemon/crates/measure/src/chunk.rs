//! What one SSE `data` payload of an OpenAI-compatible stream says.
//!
//! Chat (`chat.completion.chunk`) and text completion (`text_completion`) chunks share one
//! reader. A chunk *carries tokens* when any choice has non-empty `delta.content`,
//! `delta.reasoning`, `delta.reasoning_content`, a non-empty `delta.tool_calls`, a
//! `delta.function_call`, or non-empty `text`. Role-only, empty and usage-only chunks
//! (`choices: []`, llama.cpp) carry none.
//!
//! Errors: a payload is an error when it holds an `error` member (OpenAI's
//! `{"error": {"message", "type", "code"}}`, or a plain string), or is a flat error object
//! (`{"object": "error", "message", "type", "code"}`, vLLM's `ErrorResponse`).
//! [`parse_error_value`] reads the same shapes, and plain text, for the other ways a 200 stream
//! says "failed" (an `event: error` event, an `error:` field line, a bare JSON body).

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::server_timing::{RawDynamoTiming, RawTimings, RawVllmMetrics, ServerTiming};

/// Token usage as the server reports it (`usage` object).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `completion_tokens_details.reasoning_tokens`, where the server reports it.
    pub reasoning_tokens: Option<u64>,
    /// Prompt tokens the server took from its prefix cache: `prompt_tokens_details.cached_tokens`
    /// (OpenAI, vLLM, SGLang, llama.cpp), else llama.cpp's `timings.cache_n` beside the usage.
    pub cached_tokens: Option<u64>,
}

/// An error the server sent inside the stream (`data: {"error": {...}}`, `event: error`, an
/// `error:` line, a bare JSON error body), often with HTTP 200.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamError {
    pub message: Option<String>,
    /// The error's `type` field (e.g. `GatewayTimeout`).
    pub error_type: Option<String>,
    /// The error's `code` field, as text (e.g. `504`).
    pub code: Option<String>,
}

/// One payload, interpreted.
#[derive(Debug, PartialEq)]
pub enum Payload<'a> {
    /// `[DONE]`: the end-of-stream marker.
    Done,
    Chunk(Chunk<'a>),
    Error(StreamError),
    /// Not JSON, or not a JSON object; carries the parser's message.
    Invalid(String),
}

/// The fields of a chunk that measurement needs.
#[derive(Debug, Default, PartialEq)]
pub struct Chunk<'a> {
    pub id: Option<Cow<'a, str>>,
    pub model: Option<Cow<'a, str>>,
    /// Carries generated text, reasoning text or a tool call.
    pub carries_tokens: bool,
    /// Carries visible output (text or a tool call), not only reasoning.
    pub carries_content: bool,
    /// Each choice of the chunk, in the order sent (`n > 1` streams interleave choices).
    pub choices: Vec<ChoiceDelta<'a>>,
    pub usage: Option<Usage>,
    /// Dynamo's `nvext.worker_id` (the workers that served the request), when the chunk
    /// carries one that reads as `WorkerIdInfo`; a malformed one is ignored, never an error.
    pub dynamo_workers: Option<crate::worker::DynamoWorkerIds>,
    /// The server's own timing of the request (vLLM `metrics`, else llama.cpp `timings`, else
    /// Dynamo's `nvext.timing`), where the chunk carries it; see [`crate::server_timing`].
    pub server_timing: Option<ServerTiming>,
}

/// What one choice of a chunk carries.
#[derive(Debug, Default, PartialEq)]
pub struct ChoiceDelta<'a> {
    /// The choice's `index` (0 when absent).
    pub index: u32,
    /// Carries generated text, reasoning text or a tool call.
    pub carries_tokens: bool,
    /// Carries visible output (text or a tool call).
    pub carries_content: bool,
    /// Visible text (`delta.content` or `text`), when non-empty.
    pub text: Option<Cow<'a, str>>,
    /// Raw `finish_reason`, when set.
    pub finish_reason: Option<Cow<'a, str>>,
    /// Tool-call fragments (`delta.tool_calls`), reassembled by their `index` by the caller.
    pub tool_calls: Vec<ToolCallDelta<'a>>,
}

/// One fragment of a streamed tool call: the first carries `id` and the function's `name`,
/// later ones pieces of `arguments`.
#[derive(Debug, Default, PartialEq)]
pub struct ToolCallDelta<'a> {
    pub index: u32,
    pub id: Option<Cow<'a, str>>,
    pub name: Option<Cow<'a, str>>,
    pub arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawChunk<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Option<Vec<RawChoice<'a>>>,
    #[serde(default)]
    usage: Option<RawUsage>,
    /// llama.cpp's `timings` (`cache_n`: prompt tokens reused from the slot's cache; prompt
    /// and decode times). Read leniently: a shape not expected is ignored, never an error.
    #[serde(default)]
    timings: Option<serde_json::Value>,
    /// vLLM's per-request `metrics` (`--enable-per-request-metrics`); `null` for `n > 1`.
    /// Read leniently, as `timings`.
    #[serde(default)]
    metrics: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<serde_json::Value>,
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
    #[serde(default)]
    message: Option<serde_json::Value>,
    #[serde(rename = "type", default)]
    error_type: Option<serde_json::Value>,
    #[serde(default)]
    code: Option<serde_json::Value>,
    /// Dynamo's response extensions (`NvExtResponse`; `worker_id` when asked for).
    #[serde(default)]
    nvext: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(borrow, default)]
    delta: Option<RawDelta<'a>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<RawToolCall<'a>>>,
    #[serde(default)]
    function_call: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct RawToolCall<'a> {
    #[serde(default)]
    index: Option<u32>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<RawFunction<'a>>,
}

#[derive(Deserialize)]
struct RawFunction<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens_details: Option<RawCompletionDetails>,
    #[serde(default)]
    prompt_tokens_details: Option<RawPromptDetails>,
}

#[derive(Deserialize)]
struct RawPromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct RawCompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

fn non_empty(s: &Option<Cow<'_, str>>) -> bool {
    s.as_deref().is_some_and(|s| !s.is_empty())
}

/// Interprets one SSE `data` payload.
pub fn parse_payload(data: &str) -> Payload<'_> {
    let trimmed = data.trim();
    if trimmed == "[DONE]" {
        return Payload::Done;
    }
    let raw: RawChunk<'_> = match serde_json::from_str(trimmed) {
        Ok(raw) => raw,
        Err(e) => return Payload::Invalid(e.to_string()),
    };
    if let Some(err) = raw.error.filter(|e| !e.is_null()) {
        return Payload::Error(stream_error(err));
    }
    if raw.object.as_deref() == Some("error") {
        return Payload::Error(StreamError {
            message: raw.message.as_ref().and_then(value_text),
            error_type: raw.error_type.as_ref().and_then(value_text),
            code: raw.code.as_ref().and_then(value_text),
        });
    }
    let timings = raw
        .timings
        .as_ref()
        .and_then(|v| RawTimings::deserialize(v).ok());
    let mut chunk = Chunk {
        id: raw.id,
        model: raw.model,
        usage: raw.usage.map(|u| Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            reasoning_tokens: u.completion_tokens_details.and_then(|d| d.reasoning_tokens),
            cached_tokens: u
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .or_else(|| timings.as_ref().and_then(|t| t.cache_n)),
        }),
        dynamo_workers: raw
            .nvext
            .as_ref()
            .and_then(|n| n.get("worker_id"))
            .and_then(|w| crate::worker::DynamoWorkerIds::deserialize(w).ok()),
        server_timing: raw
            .metrics
            .as_ref()
            .and_then(|v| RawVllmMetrics::deserialize(v).ok())
            .and_then(|m| m.read())
            .or_else(|| timings.as_ref().and_then(RawTimings::read))
            .or_else(|| {
                raw.nvext
                    .as_ref()
                    .and_then(|n| n.get("timing"))
                    .and_then(|v| RawDynamoTiming::deserialize(v).ok())
                    .and_then(|t| t.read())
            }),
        ..Chunk::default()
    };
    for choice in raw.choices.into_iter().flatten() {
        let mut c = ChoiceDelta {
            index: choice.index.unwrap_or(0),
            finish_reason: choice.finish_reason,
            ..ChoiceDelta::default()
        };
        if let Some(delta) = choice.delta {
            let calls = delta.tool_calls.unwrap_or_default();
            let tool = !calls.is_empty() || delta.function_call.is_some();
            let text = non_empty(&delta.content);
            c.carries_content = text || tool;
            c.carries_tokens = c.carries_content
                || non_empty(&delta.reasoning)
                || non_empty(&delta.reasoning_content);
            if text {
                c.text = delta.content;
            }
            c.tool_calls = calls
                .into_iter()
                .map(|t| {
                    let (name, arguments) =
                        t.function.map_or((None, None), |f| (f.name, f.arguments));
                    ToolCallDelta {
                        index: t.index.unwrap_or(0),
                        id: t.id,
                        name,
                        arguments,
                    }
                })
                .collect();
        }
        if non_empty(&choice.text) {
            c.carries_content = true;
            c.carries_tokens = true;
            if c.text.is_none() {
                c.text = choice.text;
            }
        }
        chunk.carries_content |= c.carries_content;
        chunk.carries_tokens |= c.carries_tokens;
        chunk.choices.push(c);
    }
    Payload::Chunk(chunk)
}

/// Reads an error however it is written: JSON with the `{"error": …}` wrapper, a flat error
/// object (`message` / `type` / `code`), a JSON string, or plain text (the message). `None`
/// for empty text and for JSON that is no error (for instance an ordinary chunk).
pub fn parse_error_value(text: &str) -> Option<StreamError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return None;
    }
    match serde_json::from_str::<serde_json::Value>(trimmed) {
        Ok(serde_json::Value::Object(mut map)) => match map.remove("error") {
            Some(err) if !err.is_null() => Some(stream_error(err)),
            _ if map.contains_key("message")
                || map.get("object").and_then(|o| o.as_str()) == Some("error") =>
            {
                Some(stream_error(serde_json::Value::Object(map)))
            }
            _ => None,
        },
        Ok(serde_json::Value::String(s)) => Some(StreamError {
            message: Some(s),
            ..StreamError::default()
        }),
        Ok(_) => None,
        Err(_) => Some(StreamError {
            message: Some(trimmed.to_owned()),
            ..StreamError::default()
        }),
    }
}

/// Whether a bare (non-SSE) JSON document is an error (see [`parse_error_value`]).
pub fn parse_bare_error(text: &str) -> Option<StreamError> {
    serde_json::from_str::<serde_json::Value>(text.trim())
        .ok()
        .filter(|v| v.is_object())
        .and_then(|_| parse_error_value(text))
}

fn value_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

fn stream_error(err: serde_json::Value) -> StreamError {
    match err {
        serde_json::Value::Object(map) => StreamError {
            message: map.get("message").and_then(value_text),
            error_type: map.get("type").and_then(value_text),
            code: map.get("code").and_then(value_text),
        },
        other => StreamError {
            message: value_text(&other),
            ..StreamError::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(data: &str) -> Chunk<'_> {
        match parse_payload(data) {
            Payload::Chunk(c) => c,
            other => panic!("not a chunk: {other:?}"),
        }
    }

    #[test]
    fn role_only_empty_and_usage_only_chunks_carry_no_tokens() {
        let role = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        let null_content =
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}"#;
        let empty = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
        for d in [role, null_content, empty, usage] {
            assert!(!chunk(d).carries_tokens, "{d}");
        }
        assert_eq!(
            chunk(empty).choices[0].finish_reason.as_deref(),
            Some("stop")
        );
        assert_eq!(
            chunk(usage).usage,
            Some(Usage {
                prompt_tokens: Some(5),
                completion_tokens: Some(2),
                reasoning_tokens: None,
                cached_tokens: None,
            })
        );
    }

    /// Cached prompt tokens: OpenAI's `prompt_tokens_details.cached_tokens` (llama.cpp sends
    /// it too), else llama.cpp's `timings.cache_n`.
    #[test]
    fn cached_prompt_tokens_from_details_or_llama_cpp_timings() {
        let details = r#"{"choices":[],"usage":{"prompt_tokens":204,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":181}},"timings":{"cache_n":180}}"#;
        assert_eq!(
            chunk(details).usage.and_then(|u| u.cached_tokens),
            Some(181)
        );
        let timings = r#"{"choices":[],"usage":{"prompt_tokens":204,"completion_tokens":2},"timings":{"cache_n":23,"prompt_n":181}}"#;
        assert_eq!(chunk(timings).usage.and_then(|u| u.cached_tokens), Some(23));
        let none = r#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}"#;
        assert_eq!(chunk(none).usage.and_then(|u| u.cached_tokens), None);
    }

    #[test]
    fn reasoning_and_tool_calls_carry_tokens() {
        let r = chunk(r#"{"choices":[{"delta":{"reasoning":"Okay"}}]}"#);
        assert!(r.carries_tokens && !r.carries_content);
        let r = chunk(r#"{"choices":[{"delta":{"reasoning_content":" so"}}]}"#);
        assert!(r.carries_tokens && !r.carries_content);
        let t = chunk(
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
        );
        assert!(t.carries_tokens && t.carries_content);
        let c = chunk(
            r#"{"id":"cmpl-1","model":"m","choices":[{"text":"Hello","finish_reason":null}]}"#,
        );
        assert!(c.carries_tokens && c.carries_content);
        assert_eq!(c.id.as_deref(), Some("cmpl-1"));
    }

    #[test]
    fn errors_done_and_garbage() {
        assert_eq!(parse_payload(" [DONE] "), Payload::Done);
        assert_eq!(
            parse_payload(
                r#"{"error": {"message": "TimeoutError", "type": "GatewayTimeout", "code": 504}}"#
            ),
            Payload::Error(StreamError {
                message: Some("TimeoutError".into()),
                error_type: Some("GatewayTimeout".into()),
                code: Some("504".into()),
            })
        );
        assert_eq!(
            parse_payload(
                r#"{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}"#
            ),
            Payload::Error(StreamError {
                message: Some("too long".into()),
                error_type: Some("BadRequestError".into()),
                code: Some("400".into())
            })
        );
        assert!(matches!(
            parse_payload("{\"choices\": [ {"),
            Payload::Invalid(_)
        ));
        assert!(matches!(parse_payload("42"), Payload::Invalid(_)));
    }

    #[test]
    fn choices_keep_their_index_text_and_tool_calls() {
        let c = chunk(
            r#"{"choices":[{"index":0,"delta":{"content":"A"}},{"index":1,"delta":{},"finish_reason":"stop"}]}"#,
        );
        assert_eq!(c.choices.len(), 2);
        assert_eq!(
            (
                c.choices[0].index,
                c.choices[0].text.as_deref(),
                c.choices[0].carries_tokens
            ),
            (0, Some("A"), true)
        );
        assert_eq!(
            (
                c.choices[1].index,
                c.choices[1].finish_reason.as_deref(),
                c.choices[1].carries_tokens
            ),
            (1, Some("stop"), false)
        );
        let t = chunk(
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"f","arguments":""}}]}}]}"#,
        );
        let call = &t.choices[0].tool_calls[0];
        assert_eq!(
            (
                call.index,
                call.id.as_deref(),
                call.name.as_deref(),
                call.arguments.as_deref()
            ),
            (1, Some("call_2"), Some("f"), Some(""))
        );
    }

    #[test]
    fn error_values_in_every_shape() {
        let want = StreamError {
            message: Some("too long".into()),
            error_type: Some("exceed_context_size_error".into()),
            code: Some("400".into()),
        };
        let wrapped =
            r#"{"error":{"code":400,"message":"too long","type":"exceed_context_size_error"}}"#;
        let flat = r#"{"code":400,"message":"too long","type":"exceed_context_size_error"}"#;
        assert_eq!(parse_error_value(wrapped), Some(want.clone()));
        assert_eq!(parse_error_value(flat), Some(want.clone()));
        assert_eq!(parse_bare_error(wrapped), Some(want));
        assert_eq!(
            parse_error_value("upstream died")
                .and_then(|e| e.message)
                .as_deref(),
            Some("upstream died")
        );
        assert_eq!(
            parse_error_value(r#""quota""#)
                .and_then(|e| e.message)
                .as_deref(),
            Some("quota")
        );
        assert_eq!(
            parse_error_value(r#"{"choices":[]}"#),
            None,
            "a chunk is no error"
        );
        assert_eq!(
            parse_bare_error("not json"),
            None,
            "bare text is no JSON error"
        );
        assert_eq!(parse_error_value("  "), None);
    }
}
