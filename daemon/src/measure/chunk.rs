//! What one SSE `data` payload of an OpenAI-compatible stream says.
//!
//! Chat (`chat.completion.chunk`) and text completion (`text_completion`) chunks share one
//! reader. A chunk *carries tokens* when any choice has non-empty `delta.content`,
//! `delta.reasoning`, `delta.reasoning_content`, a non-empty `delta.tool_calls`, a
//! `delta.function_call`, or non-empty `text`. Role-only, empty and usage-only chunks
//! (`choices: []`, llama.cpp) carry none.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;

/// Token usage as the server reports it (`usage` object).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `completion_tokens_details.reasoning_tokens`, where the server reports it.
    pub reasoning_tokens: Option<u64>,
}

/// An error the server sent inside the stream (`data: {"error": {...}}`), often with HTTP 200.
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
    /// Visible text of the first choice that has some (`delta.content` or `text`).
    pub text: Option<Cow<'a, str>>,
    /// Raw `finish_reason` of each choice that set one.
    pub finish_reasons: Vec<Cow<'a, str>>,
    pub usage: Option<Usage>,
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
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
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
    #[serde(default)]
    tool_calls: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    function_call: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens_details: Option<RawCompletionDetails>,
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
    if let Some(err) = raw.error {
        return Payload::Error(stream_error(err));
    }
    let mut chunk = Chunk {
        id: raw.id,
        model: raw.model,
        usage: raw.usage.map(|u| Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            reasoning_tokens: u.completion_tokens_details.and_then(|d| d.reasoning_tokens),
        }),
        ..Chunk::default()
    };
    for choice in raw.choices.into_iter().flatten() {
        if let Some(delta) = choice.delta {
            let tool = delta.tool_calls.as_ref().is_some_and(|t| !t.is_empty())
                || delta.function_call.is_some();
            let text = non_empty(&delta.content);
            let content = text || tool;
            chunk.carries_content |= content;
            chunk.carries_tokens |=
                content || non_empty(&delta.reasoning) || non_empty(&delta.reasoning_content);
            if text && chunk.text.is_none() {
                chunk.text = delta.content;
            }
        }
        if non_empty(&choice.text) {
            chunk.carries_content = true;
            chunk.carries_tokens = true;
            if chunk.text.is_none() {
                chunk.text = choice.text;
            }
        }
        if let Some(reason) = choice.finish_reason {
            chunk.finish_reasons.push(reason);
        }
    }
    Payload::Chunk(chunk)
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
        other => StreamError { message: value_text(&other), ..StreamError::default() },
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
        let null_content = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}"#;
        let empty = r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
        for d in [role, null_content, empty, usage] {
            assert!(!chunk(d).carries_tokens, "{d}");
        }
        assert_eq!(chunk(empty).finish_reasons, vec!["stop"]);
        assert_eq!(
            chunk(usage).usage,
            Some(Usage { prompt_tokens: Some(5), completion_tokens: Some(2), reasoning_tokens: None })
        );
    }

    #[test]
    fn reasoning_and_tool_calls_carry_tokens() {
        let r = chunk(r#"{"choices":[{"delta":{"reasoning":"Okay"}}]}"#);
        assert!(r.carries_tokens && !r.carries_content);
        let r = chunk(r#"{"choices":[{"delta":{"reasoning_content":" so"}}]}"#);
        assert!(r.carries_tokens && !r.carries_content);
        let t = chunk(r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#);
        assert!(t.carries_tokens && t.carries_content);
        let c = chunk(r#"{"id":"cmpl-1","model":"m","choices":[{"text":"Hello","finish_reason":null}]}"#);
        assert!(c.carries_tokens && c.carries_content);
        assert_eq!(c.id.as_deref(), Some("cmpl-1"));
    }

    #[test]
    fn errors_done_and_garbage() {
        assert_eq!(parse_payload(" [DONE] "), Payload::Done);
        assert_eq!(
            parse_payload(r#"{"error": {"message": "TimeoutError", "type": "GatewayTimeout", "code": 504}}"#),
            Payload::Error(StreamError {
                message: Some("TimeoutError".into()),
                error_type: Some("GatewayTimeout".into()),
                code: Some("504".into()),
            })
        );
        assert!(matches!(parse_payload("{\"choices\": [ {"), Payload::Invalid(_)));
        assert!(matches!(parse_payload("42"), Payload::Invalid(_)));
    }
}
