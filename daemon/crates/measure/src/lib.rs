//! Exact measurement of one streamed request. No IO, no clock: the caller reads a monotonic
//! clock when bytes arrive from the socket and passes the offset since the send.
//!
//! Definitions (the same as `../shared/cases/README.md`):
//! - **TTFT**: send → first chunk that carries generated text, reasoning text or a tool call
//!   (not a role-only or empty chunk).
//! - **ITL**: gap between consecutive token-carrying chunks, divided evenly over the tokens that
//!   the later chunk carries when the server reports them (continuous usage stats); one token
//!   per chunk otherwise.
//! - **TPOT**: (time of last token − time of first token) / (output tokens − 1).
//! - **E2E**: send → end of stream (`[DONE]`, else the end of the body).
//! - **Output tokens**: from the server's `usage` when present; else the number of
//!   token-carrying chunks, and [`UsageSource::Chunks`] says so.
//!
//! `n > 1` streams interleave their choices: each choice index is measured on its own
//! ([`ChoiceRecord`]: first token, token chunks, ITL, TPOT, finish reason); the request's TTFT
//! is the first token of any choice, and there is no request-level TPOT across choices.
//!
//! A 200 stream can say "failed" in several ways, all recorded as [`Outcome::Error`] with the
//! server's type, code and message ([`RequestError`]): a `data:` chunk with `error` (wrapped or
//! flat, `object: "error"`), an `event: error` event, an `error:` field line, or a bare JSON
//! error document with no `data:` prefix, before or after tokens (see [`sse::EventKind`]).
//!
//! An event over the size cap ends the measurement as `sse_event_too_large`, keeping the TTFT
//! and tokens measured before it.

pub mod chunk;
pub mod measured;
pub mod path;
pub mod router_stages;
pub mod server_timing;
pub mod sse;
pub mod worker;
pub mod workers_apart;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use chunk::{Payload, StreamError};
use sse::{EventKind, SseEvent, SseParser};

pub use measured::{Conn, Measured};

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Tokens received and the stream ended cleanly (`finish_reason` in the clean set or `[DONE]`).
    Ok,
    /// The server or the transport failed; `error.type` says how.
    Error,
    /// The server ended generation early (`finish_reason` such as `abort`).
    Aborted,
    /// The request ran past its deadline.
    Timeout,
    /// The agent cancelled it (shutdown).
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Aborted => "aborted",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// Where the token counts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageSource {
    /// The server's `usage` object.
    Server,
    /// Counted as one token per token-carrying chunk (the server sent no usage).
    Chunks,
}

impl UsageSource {
    pub fn as_str(self) -> &'static str {
        match self {
            UsageSource::Server => "server",
            UsageSource::Chunks => "chunks",
        }
    }
}

/// `error.type` values that lmperf itself assigns (the server's own types pass through).
pub mod error_type {
    pub const CONNECTION_REFUSED: &str = "connection_refused";
    pub const CONNECTION_ERROR: &str = "connection_error";
    pub const TIMEOUT: &str = "timeout";
    pub const CANCELLED: &str = "cancelled";
    pub const STREAM_TRUNCATED: &str = "stream_truncated";
    pub const INVALID_CHUNK: &str = "invalid_chunk";
    pub const SSE_EVENT_TOO_LARGE: &str = "sse_event_too_large";
    pub const NO_TOKEN_RECEIVED: &str = "no_token_received";
    pub const ABORTED: &str = "aborted";
    pub const UNEXPECTED_FINISH_REASON: &str = "unexpected_finish_reason";
    pub const STREAM_ERROR: &str = "stream_error";
    pub const REQUEST_BUILD: &str = "request_error";
    /// A 2xx reply that is no event stream (an HTML page, a JSON document) and carried no
    /// token; the message names its content type and first bytes.
    pub const NON_SSE_REPLY: &str = "non_sse_reply";
}

/// Characters of a reply's first bytes quoted in [`non_stream_message`].
pub const EXCERPT_CHARS: usize = 120;

/// `HTTP 200 text/html; charset=utf-8, not an event stream: "<!doctype html><title>Sign in…"`:
/// what a reply that is not what was `expected` (`an event stream`, `JSON`) was, from its
/// status, content type and first bytes (whitespace collapsed, at most [`EXCERPT_CHARS`]
/// characters, never the whole page).
pub fn non_stream_message(
    status: u16,
    content_type: Option<&str>,
    head: &[u8],
    expected: &str,
) -> String {
    let text = String::from_utf8_lossy(head);
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut excerpt: String = collapsed.chars().take(EXCERPT_CHARS).collect();
    if collapsed.chars().count() > EXCERPT_CHARS {
        excerpt.push('…');
    }
    let ct = content_type.unwrap_or("no content type");
    if excerpt.is_empty() {
        format!("HTTP {status} {ct}, not {expected}: an empty body")
    } else {
        format!("HTTP {status} {ct}, not {expected}: {excerpt:?}")
    }
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestError {
    /// Low-cardinality class: an HTTP status (`"503"`), the server's own error `type`, or one of
    /// [`error_type`].
    pub error_type: String,
    /// The server's or the transport's message, cut to 512 bytes.
    pub message: Option<String>,
    /// The server's error code, where it sent one.
    pub code: Option<String>,
    /// The server's own error `type` (e.g. `exceed_context_size_error`), where it sent one;
    /// for an HTTP error `error_type` stays the status.
    pub server_type: Option<String>,
    /// The server's `Retry-After` (or `retry-after-ms`) on an HTTP error.
    pub retry_after: Option<Duration>,
}

impl RequestError {
    pub fn new(error_type: impl Into<String>, message: Option<String>) -> Self {
        Self {
            error_type: error_type.into(),
            message: message.map(cut_message),
            code: None,
            server_type: None,
            retry_after: None,
        }
    }

    /// An error the server reported in a 200 stream: `error.type` is its own type, else its
    /// code, else [`error_type::STREAM_ERROR`].
    pub fn from_stream(e: StreamError) -> Self {
        let error_type = e
            .error_type
            .clone()
            .or_else(|| e.code.clone())
            .unwrap_or_else(|| error_type::STREAM_ERROR.into());
        Self {
            error_type,
            message: e.message.map(cut_message),
            code: e.code,
            server_type: e.error_type,
            retry_after: None,
        }
    }

    /// The server's type when it gave one, else `error_type` (`"503"`, `"stream_truncated"`).
    pub fn reason(&self) -> &str {
        self.server_type.as_deref().unwrap_or(&self.error_type)
    }
}

const MAX_MESSAGE_BYTES: usize = 512;

/// A plain-text or markup error body as one line: where it is markup (an HTML error page, the
/// first non-blank byte `<`), its text without the tags; whitespace collapsed. A proxy's
/// 404 page then reads `404 Not Found nginx`, and no log line or status carries the page.
pub fn one_line(body: &str) -> String {
    let text = if body.trim_start().starts_with('<') {
        let mut out = String::with_capacity(body.len());
        let mut in_tag = false;
        for c in body.chars() {
            match c {
                '<' => {
                    in_tag = true;
                    out.push(' ');
                }
                '>' if in_tag => in_tag = false,
                c if !in_tag => out.push(c),
                _ => {}
            }
        }
        out
    } else {
        body.to_owned()
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `message` cut to at most [`EXCERPT_CHARS`] characters on one line (`…` where cut): what a
/// status line or a table cell shows of a server's error message.
pub fn excerpt(message: &str) -> String {
    let line = one_line(message);
    if line.chars().count() <= EXCERPT_CHARS {
        return line;
    }
    let mut e: String = line.chars().take(EXCERPT_CHARS).collect();
    e.push('…');
    e
}

fn cut_message(mut m: String) -> String {
    if m.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
    }
    m
}

/// The measurement of one request. Times are offsets from the send.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    pub outcome: Outcome,
    pub error: Option<RequestError>,
    pub http_status: Option<u16>,
    pub ttft: Option<Duration>,
    /// Send → first chunk with visible content (text or tool call), not reasoning.
    pub time_to_first_content: Option<Duration>,
    /// Arrival offset of every token-carrying chunk.
    pub token_chunk_times: Vec<Duration>,
    pub itl: Vec<Duration>,
    pub tpot: Option<Duration>,
    pub e2e: Duration,
    pub input_tokens: Option<u64>,
    /// Of `input_tokens`, those the server took from its prefix cache (its usage's
    /// `prompt_tokens_details.cached_tokens`, or llama.cpp's `timings.cache_n`).
    pub cached_input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub reasoning_tokens: Option<u64>,
    pub usage_source: Option<UsageSource>,
    /// Raw `finish_reason` values, in order of arrival.
    pub finish_reasons: Vec<String>,
    pub response_id: Option<String>,
    pub response_model: Option<String>,
    /// Number of SSE comment lines (keep-alives) seen.
    pub sse_comments: u64,
    /// The generated text, when asked for ([`StreamMeasurer::keep_text`]; multi-turn
    /// benchmarks send it back as the assistant turn). With `n > 1`, that of the lowest index.
    pub output_text: Option<String>,
    /// Tool calls reassembled by their index, when the text is kept (lowest choice index).
    pub tool_calls: Vec<ToolCall>,
    /// Per choice, in index order, when the stream carried more than one choice (`n > 1`);
    /// empty for a single-choice stream (the request-level fields are that choice's).
    pub choices: Vec<ChoiceRecord>,
    /// Whether `[DONE]` arrived.
    pub done_marker_seen: bool,
    /// The worker(s) a router said served the request ([`worker`]); `None` when the
    /// target is not a router. The measurer fills it from Dynamo's `nvext.worker_id`; the
    /// HTTP client from response headers (llm-d) or as unattributed.
    pub served_by: Option<worker::ServedBy>,
    /// The server's own account of the request (queue, prefill, decode on its clock), from
    /// the last chunk that carried one ([`server_timing`]); `None` when the server sent none.
    pub server_timing: Option<server_timing::ServerTiming>,
    /// A router's own clock on the request (vllm-router's `: router-stages` comment on a
    /// stream, else its `x-router-stages` header, which it sends before the worker's first
    /// token: [`router_stages`]); `None` when the router sent none.
    pub router_stages: Option<router_stages::RouterStages>,
}

/// One choice of an `n > 1` stream. Its tokens are counted as its token-carrying chunks (the
/// server's usage covers all choices together).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChoiceRecord {
    pub index: u32,
    /// Send → this choice's first token-carrying chunk.
    pub first_token: Option<Duration>,
    pub last_token: Option<Duration>,
    pub token_chunks: usize,
    /// Gaps between this choice's token-carrying chunks.
    pub itl: Vec<Duration>,
    /// (last − first) / (token chunks − 1).
    pub tpot: Option<Duration>,
    pub finish_reason: Option<String>,
    /// This choice's text, when kept.
    pub text: Option<String>,
}

/// A streamed tool call, reassembled from its fragments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ToolCall {
    pub index: u32,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

impl RequestRecord {
    /// A request that failed before any response body was measured.
    pub fn failed(
        outcome: Outcome,
        error: RequestError,
        http_status: Option<u16>,
        e2e: Duration,
    ) -> Self {
        Self {
            outcome,
            error: Some(error),
            http_status,
            ttft: None,
            time_to_first_content: None,
            token_chunk_times: Vec::new(),
            itl: Vec::new(),
            tpot: None,
            e2e,
            input_tokens: None,
            cached_input_tokens: None,
            output_tokens: None,
            reasoning_tokens: None,
            usage_source: None,
            finish_reasons: Vec::new(),
            response_id: None,
            response_model: None,
            sse_comments: 0,
            output_text: None,
            tool_calls: Vec::new(),
            choices: Vec::new(),
            done_marker_seen: false,
            served_by: None,
            router_stages: None,
            server_timing: None,
        }
    }

    /// A non-2xx reply: `error.type` is the status code; the body's OpenAI-style
    /// `{"error": {"message", "type", "code"}}` (or `{"message"}`) fills message and code.
    /// The body's `type` is kept as [`RequestError::server_type`].
    pub fn http_error(status: u16, body: &[u8], e2e: Duration) -> Self {
        let mut error = RequestError::new(status.to_string(), None);
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(v) => {
                let e = v.get("error").unwrap_or(&v);
                let text = |k: &str| match e.get(k) {
                    Some(serde_json::Value::String(s)) => Some(s.clone()),
                    Some(serde_json::Value::Null) | None => None,
                    Some(other) => Some(other.to_string()),
                };
                error.message = text("message")
                    .or_else(|| e.as_str().map(str::to_owned))
                    .map(cut_message);
                error.code = text("code");
                error.server_type = text("type");
            }
            // An SSE body (`data: {"error": …}`, `event: error`, …) on a non-2xx status.
            Err(_) if let Some(e) = sse_body_error(body) => {
                error.message = e.message.map(cut_message);
                error.code = e.code;
                error.server_type = e.error_type;
            }
            Err(_) if !body.is_empty() => {
                error.message = Some(cut_message(one_line(&String::from_utf8_lossy(body))));
            }
            Err(_) => {}
        }
        Self::failed(Outcome::Error, error, Some(status), e2e)
    }

    /// The failure of a request that did not end `ok` (`error.type` and message).
    pub fn failure(&self) -> Option<&RequestError> {
        self.error.as_ref().filter(|_| self.outcome != Outcome::Ok)
    }

    /// Mean ITL, if any.
    pub fn itl_mean(&self) -> Option<Duration> {
        let n = u32::try_from(self.itl.len()).ok().filter(|&n| n > 0)?;
        Some(self.itl.iter().sum::<Duration>() / n)
    }

    pub fn itl_max(&self) -> Option<Duration> {
        self.itl.iter().max().copied()
    }

    /// Time of the last token-carrying chunk.
    pub fn last_token(&self) -> Option<Duration> {
        self.token_chunk_times.last().copied()
    }

    /// The record with every time set to zero (lists keep their lengths): what must not
    /// depend on how the bytes were split into reads (chunk-boundary invariance; the property
    /// test and the fuzz target compare these).
    pub fn timeless(&self) -> RequestRecord {
        let zero = |v: &Option<Duration>| v.map(|_| Duration::ZERO);
        let zeros = |v: &[Duration]| vec![Duration::ZERO; v.len()];
        let mut r = self.clone();
        (r.ttft, r.time_to_first_content, r.tpot, r.e2e) = (
            zero(&r.ttft),
            zero(&r.time_to_first_content),
            zero(&r.tpot),
            Duration::ZERO,
        );
        (r.token_chunk_times, r.itl) = (zeros(&r.token_chunk_times), zeros(&r.itl));
        for c in &mut r.choices {
            (c.first_token, c.last_token, c.tpot, c.itl) = (
                zero(&c.first_token),
                zero(&c.last_token),
                zero(&c.tpot),
                zeros(&c.itl),
            );
        }
        r
    }
}

/// The first error an SSE body states, in any of the shapes of [`sse::EventKind`].
fn sse_body_error(body: &[u8]) -> Option<StreamError> {
    let mut parser = SseParser::new(body.len().saturating_add(1));
    let mut events = Vec::new();
    parser.push(body, &mut events).ok()?;
    parser.finish(&mut events).ok()?;
    events.iter().find_map(|ev| match ev.kind {
        EventKind::Message => match chunk::parse_payload(&ev.data) {
            Payload::Error(e) => Some(e),
            _ => None,
        },
        EventKind::Error | EventKind::ErrorLine => chunk::parse_error_value(&ev.data),
        EventKind::Bare => chunk::parse_bare_error(&ev.data),
    })
}

/// How the response body ended, as the transport saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    /// The body ended normally.
    Eof,
    /// Reading the body failed (connection reset, incomplete chunked encoding).
    BodyError(String),
    /// The request's deadline passed.
    Timeout,
    /// The agent cancelled the request.
    Cancelled,
}

/// Finish reasons that mean a clean completion (OpenAI API).
const CLEAN_FINISH_REASONS: &[&str] = &[
    "stop",
    "length",
    "tool_calls",
    "content_filter",
    "function_call",
    "eos",
];
const ABORT_FINISH_REASONS: &[&str] = &["abort", "aborted", "cancelled", "canceled"];

/// Measures one streamed response. Feed it with [`StreamMeasurer::on_bytes`] as bytes arrive,
/// then call [`StreamMeasurer::finish`].
#[derive(Debug)]
pub struct StreamMeasurer {
    parser: SseParser,
    events: Vec<SseEvent>,
    http_status: u16,
    /// (arrival, server's cumulative completion_tokens on that chunk if it sent usage)
    token_chunks: Vec<(Duration, Option<u64>)>,
    time_to_first_content: Option<Duration>,
    done_at: Option<Duration>,
    /// (choice index, raw finish_reason), in order of arrival.
    finish_reasons: Vec<(u32, String)>,
    /// Per choice index (at most [`MAX_CHOICES`]).
    choices: BTreeMap<u32, ChoiceState>,
    usage: Option<chunk::Usage>,
    /// Usage chunks with no choices that followed a choice's finish, by that choice: llama.cpp
    /// sends one such chunk per choice of an `n > 1` stream (each counting its own choice),
    /// vLLM one for the whole request after the last finish.
    choice_usage: BTreeMap<u32, chunk::Usage>,
    /// Choices that finished with no usage chunk after them yet, in order of finish.
    finished_without_usage: Vec<u32>,
    last_completion_tokens: Option<u64>,
    response_id: Option<String>,
    response_model: Option<String>,
    stream_error: Option<StreamError>,
    invalid: Option<String>,
    too_large: Option<String>,
    /// Keep the generated text and tool calls.
    keep_text: bool,
    /// The first `nvext.worker_id` of the stream (Dynamo repeats it on every chunk).
    dynamo_workers: Option<worker::DynamoWorkerIds>,
    server_timing: Option<server_timing::ServerTiming>,
}

/// Choice indexes measured apart; a stream with more keeps the first ones only.
pub const MAX_CHOICES: usize = 128;

/// One SSE event may be large (a long text piece, a logprobs block, a tool call with a large
/// argument: `../shared/cases/sse/19_*` is 1 MiB); 16 MiB is above any real server's and still
/// bounds memory.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 << 20;

#[derive(Debug, Default)]
struct ChoiceState {
    chunks: Vec<Duration>,
    finish_reason: Option<String>,
    text: String,
    tool_calls: BTreeMap<u32, ToolCall>,
}

impl StreamMeasurer {
    /// The request's usage: the last usage the server sent, except when several choices each
    /// got their own usage chunk (llama.cpp with `n > 1`): then output tokens are their sum and
    /// input tokens the largest (one prompt, reported by every choice).
    fn request_usage(&self) -> Option<chunk::Usage> {
        if self.choice_usage.len() < 2 {
            return self.usage;
        }
        let parts = self.choice_usage.values();
        let sum = |f: fn(&chunk::Usage) -> Option<u64>| parts.clone().map(f).sum::<Option<u64>>();
        Some(chunk::Usage {
            prompt_tokens: parts.clone().filter_map(|u| u.prompt_tokens).max(),
            completion_tokens: sum(|u| u.completion_tokens),
            reasoning_tokens: sum(|u| u.reasoning_tokens),
            cached_tokens: parts.clone().filter_map(|u| u.cached_tokens).max(),
        })
    }

    /// A measurer for a response with status `http_status` whose SSE events may not exceed
    /// `max_event_bytes`.
    pub fn new(http_status: u16, max_event_bytes: usize) -> Self {
        Self {
            parser: SseParser::new(max_event_bytes),
            events: Vec::new(),
            http_status,
            token_chunks: Vec::new(),
            time_to_first_content: None,
            done_at: None,
            finish_reasons: Vec::new(),
            choices: BTreeMap::new(),
            usage: None,
            choice_usage: BTreeMap::new(),
            finished_without_usage: Vec::new(),
            last_completion_tokens: None,
            response_id: None,
            response_model: None,
            stream_error: None,
            invalid: None,
            too_large: None,
            keep_text: false,
            dynamo_workers: None,
            server_timing: None,
        }
    }

    /// Keeps the generated text (first choice) for [`RequestRecord::output_text`] and the
    /// tool calls for [`RequestRecord::tool_calls`].
    pub fn keep_text(mut self) -> Self {
        self.keep_text = true;
        self
    }

    /// Bytes the SSE parser holds for the event being built (at most the event cap).
    pub fn buffered_bytes(&self) -> usize {
        self.parser.buffered_bytes()
    }

    /// Bytes that arrived `at` after the send. Returns `false` when reading should stop (the
    /// stream broke a limit); the body may then be dropped.
    pub fn on_bytes(&mut self, at: Duration, bytes: &[u8]) -> bool {
        if self.too_large.is_some() {
            return false;
        }
        let mut events = std::mem::take(&mut self.events);
        let ok = match self.parser.push(bytes, &mut events) {
            Ok(()) => true,
            Err(e) => {
                self.too_large = Some(e.to_string());
                false
            }
        };
        for ev in events.drain(..) {
            self.on_event(at, &ev);
        }
        self.events = events;
        ok
    }

    /// Whether `[DONE]` has arrived.
    pub fn is_done(&self) -> bool {
        self.done_at.is_some()
    }

    fn on_error(&mut self, e: StreamError) {
        if self.stream_error.is_none() {
            self.stream_error = Some(e);
        }
    }

    fn on_event(&mut self, at: Duration, ev: &SseEvent) {
        if self.done_at.is_some() {
            return;
        }
        match ev.kind {
            EventKind::Message => {}
            EventKind::Error | EventKind::ErrorLine => {
                let data = ev.data.trim();
                let e = chunk::parse_error_value(data).unwrap_or_else(|| StreamError {
                    message: (!data.is_empty()).then(|| data.to_owned()),
                    ..StreamError::default()
                });
                return self.on_error(e);
            }
            EventKind::Bare => {
                if let Some(e) = chunk::parse_bare_error(&ev.data) {
                    self.on_error(e);
                }
                return;
            }
        }
        match chunk::parse_payload(&ev.data) {
            Payload::Done => self.done_at = Some(at),
            Payload::Error(e) => self.on_error(e),
            Payload::Invalid(msg) => {
                if self.invalid.is_none() {
                    self.invalid = Some(msg);
                }
            }
            Payload::Chunk(c) => {
                if self.response_id.is_none() {
                    self.response_id = c.id.map(|s| s.into_owned());
                }
                if self.response_model.is_none() {
                    self.response_model = c.model.map(|s| s.into_owned());
                }
                if self.dynamo_workers.is_none() {
                    self.dynamo_workers = c.dynamo_workers;
                }
                if c.server_timing.is_some() {
                    self.server_timing = c.server_timing;
                }
                if let Some(u) = c.usage {
                    self.usage = Some(u);
                    if c.choices.is_empty()
                        && let Some(i) = self.finished_without_usage.pop()
                    {
                        self.choice_usage.insert(i, u);
                    }
                }
                let completion = c.usage.and_then(|u| u.completion_tokens);
                if c.carries_tokens {
                    self.token_chunks.push((at, completion));
                    if c.carries_content && self.time_to_first_content.is_none() {
                        self.time_to_first_content = Some(at);
                    }
                }
                if completion.is_some() {
                    self.last_completion_tokens = completion;
                }
                for choice in c.choices {
                    if let Some(reason) = &choice.finish_reason {
                        self.finish_reasons.push((choice.index, reason.to_string()));
                        if !self.choice_usage.contains_key(&choice.index)
                            && !self.finished_without_usage.contains(&choice.index)
                            && self.finished_without_usage.len() < MAX_CHOICES
                        {
                            self.finished_without_usage.push(choice.index);
                        }
                    }
                    if !self.choices.contains_key(&choice.index)
                        && self.choices.len() >= MAX_CHOICES
                    {
                        continue;
                    }
                    let state = self.choices.entry(choice.index).or_default();
                    if choice.carries_tokens {
                        state.chunks.push(at);
                    }
                    if let Some(reason) = choice.finish_reason {
                        state.finish_reason = Some(reason.into_owned());
                    }
                    if self.keep_text {
                        if let Some(t) = choice.text.as_deref() {
                            state.text.push_str(t);
                        }
                        for call in choice.tool_calls {
                            let kept =
                                state
                                    .tool_calls
                                    .entry(call.index)
                                    .or_insert_with(|| ToolCall {
                                        index: call.index,
                                        ..ToolCall::default()
                                    });
                            if kept.id.is_none() {
                                kept.id = call.id.map(|s| s.into_owned());
                            }
                            if kept.name.is_none() {
                                kept.name = call.name.map(|s| s.into_owned());
                            }
                            if let Some(a) = call.arguments.as_deref() {
                                kept.arguments.push_str(a);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Closes the measurement: `end` says how the body ended, `at` when.
    pub fn finish(mut self, end: StreamEnd, at: Duration) -> RequestRecord {
        if matches!(end, StreamEnd::Eof) && self.too_large.is_none() {
            let mut events = std::mem::take(&mut self.events);
            // Errors here only concern an unterminated oversize tail: record it.
            if let Err(e) = self.parser.finish(&mut events) {
                self.too_large = Some(e.to_string());
            }
            for ev in events.drain(..) {
                self.on_event(at, &ev);
            }
        }
        let e2e = self.done_at.unwrap_or(at);
        let multi_choice = self.choices.len() > 1;

        let ttft = self.token_chunks.first().map(|(t, _)| *t);
        let usage = self.request_usage();
        let server_output = usage.and_then(|u| u.completion_tokens);
        let (output_tokens, usage_source) = match server_output {
            Some(n) => (n, UsageSource::Server),
            None => (self.token_chunks.len() as u64, UsageSource::Chunks),
        };
        let choices: Vec<ChoiceRecord> = if multi_choice {
            self.choices
                .iter()
                .map(|(i, c)| choice_record(*i, c, self.keep_text))
                .collect()
        } else {
            Vec::new()
        };
        // Across parallel choices only per-choice gaps mean anything; no request-level TPOT.
        let (itl, tpot) = if multi_choice {
            (
                choices.iter().flat_map(|c| c.itl.iter().copied()).collect(),
                None,
            )
        } else {
            let tpot = match (ttft, self.token_chunks.last()) {
                (Some(first), Some((last, _))) if output_tokens > 1 => {
                    u32::try_from(output_tokens - 1)
                        .ok()
                        .map(|n| (*last - first) / n)
                }
                _ => None,
            };
            (inter_token_latencies(&self.token_chunks), tpot)
        };
        if multi_choice {
            self.finish_reasons.sort_by_key(|(i, _)| *i);
        }
        let first_choice = self.choices.values().next();
        let output_text = self
            .keep_text
            .then(|| first_choice.map(|c| c.text.clone()).unwrap_or_default());
        let tool_calls = if self.keep_text {
            first_choice
                .map(|c| c.tool_calls.values().cloned().collect())
                .unwrap_or_default()
        } else {
            Vec::new()
        };

        let (outcome, error) = self.classify(&end, ttft.is_some());
        RequestRecord {
            outcome,
            error,
            http_status: Some(self.http_status),
            ttft,
            time_to_first_content: self.time_to_first_content,
            token_chunk_times: self.token_chunks.iter().map(|(t, _)| *t).collect(),
            itl,
            tpot,
            e2e,
            input_tokens: usage.and_then(|u| u.prompt_tokens),
            cached_input_tokens: usage.and_then(|u| u.cached_tokens),
            output_tokens: Some(output_tokens),
            reasoning_tokens: usage.and_then(|u| u.reasoning_tokens),
            usage_source: Some(usage_source),
            finish_reasons: self.finish_reasons.into_iter().map(|(_, r)| r).collect(),
            response_id: self.response_id,
            response_model: self.response_model,
            sse_comments: self.parser.comments,
            output_text,
            tool_calls,
            choices,
            done_marker_seen: self.done_at.is_some(),
            served_by: self
                .dynamo_workers
                .as_ref()
                .and_then(worker::ServedBy::from_dynamo),
            server_timing: self.server_timing,
            router_stages: (self.parser.router_stages.as_deref())
                .and_then(router_stages::RouterStages::parse),
        }
    }

    fn classify(&mut self, end: &StreamEnd, got_tokens: bool) -> (Outcome, Option<RequestError>) {
        use error_type as et;
        if let Some(e) = self.stream_error.take() {
            return (Outcome::Error, Some(RequestError::from_stream(e)));
        }
        if let Some(msg) = self.too_large.take() {
            return (
                Outcome::Error,
                Some(RequestError::new(et::SSE_EVENT_TOO_LARGE, Some(msg))),
            );
        }
        let ended_cleanly = self.done_at.is_some();
        match end {
            StreamEnd::Timeout if !ended_cleanly => {
                return (Outcome::Timeout, Some(RequestError::new(et::TIMEOUT, None)));
            }
            StreamEnd::Cancelled if !ended_cleanly => {
                return (
                    Outcome::Cancelled,
                    Some(RequestError::new(et::CANCELLED, None)),
                );
            }
            _ => {}
        }
        if let Some(msg) = self.invalid.take() {
            return (
                Outcome::Error,
                Some(RequestError::new(et::INVALID_CHUNK, Some(msg))),
            );
        }
        if let Some((_, reason)) = self
            .finish_reasons
            .iter()
            .find(|(_, r)| !CLEAN_FINISH_REASONS.contains(&r.as_str()))
        {
            let msg = Some(format!("finish_reason {reason:?}"));
            return if ABORT_FINISH_REASONS.contains(&reason.as_str()) {
                (Outcome::Aborted, Some(RequestError::new(et::ABORTED, msg)))
            } else {
                (
                    Outcome::Error,
                    Some(RequestError::new(et::UNEXPECTED_FINISH_REASON, msg)),
                )
            };
        }
        if !ended_cleanly && self.finish_reasons.is_empty() {
            let msg = match end {
                StreamEnd::BodyError(m) => Some(m.clone()),
                _ => Some("stream ended without finish_reason or [DONE]".to_owned()),
            };
            return (
                Outcome::Error,
                Some(RequestError::new(et::STREAM_TRUNCATED, msg)),
            );
        }
        if !got_tokens {
            return (
                Outcome::Error,
                Some(RequestError::new(et::NO_TOKEN_RECEIVED, None)),
            );
        }
        (Outcome::Ok, None)
    }
}

fn choice_record(index: u32, c: &ChoiceState, keep_text: bool) -> ChoiceRecord {
    let (first, last) = (c.chunks.first().copied(), c.chunks.last().copied());
    let tpot = match (first, last, u32::try_from(c.chunks.len()).ok()) {
        (Some(f), Some(l), Some(n)) if n > 1 => Some(l.saturating_sub(f) / (n - 1)),
        _ => None,
    };
    ChoiceRecord {
        index,
        first_token: first,
        last_token: last,
        token_chunks: c.chunks.len(),
        itl: c
            .chunks
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
            .collect(),
        tpot,
        finish_reason: c.finish_reason.clone(),
        text: keep_text.then(|| c.text.clone()),
    }
}

/// Tokens the cumulative counts of one stream may claim for its ITL list, at most: beyond
/// it (a count that jumps by billions) the counts are not believed and each chunk counts as
/// one token, so a bad server never makes the list grow without bound.
pub const MAX_COUNTED_TOKENS: u64 = 1 << 18;

/// ITL list from token-carrying chunk arrivals. When every token chunk carried the server's
/// cumulative `completion_tokens` (continuous usage stats) and they claim at most
/// [`MAX_COUNTED_TOKENS`], a chunk that carries `n` tokens contributes `n` equal gaps;
/// otherwise each chunk counts as one token.
fn inter_token_latencies(chunks: &[(Duration, Option<u64>)]) -> Vec<Duration> {
    let claimed = chunks
        .windows(2)
        .map(|w| match (w[0].1, w[1].1) {
            (Some(a), Some(b)) => b.saturating_sub(a).max(1),
            _ => 1,
        })
        .fold(0u64, u64::saturating_add);
    let continuous = !chunks.is_empty()
        && chunks.iter().all(|(_, c)| c.is_some())
        && claimed <= MAX_COUNTED_TOKENS;
    let mut itl = Vec::with_capacity(chunks.len());
    for pair in chunks.windows(2) {
        let [(t0, c0), (t1, c1)] = pair else { continue };
        let gap = t1.saturating_sub(*t0);
        let n = match (continuous, c0, c1) {
            (true, Some(a), Some(b)) => b.saturating_sub(*a).max(1),
            _ => 1,
        };
        let n32 = u32::try_from(n).unwrap_or(u32::MAX);
        itl.extend(std::iter::repeat_n(gap / n32, n32 as usize));
    }
    itl
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// Cumulative counts of 3 then 4 billion (the fuzzer's crash: a list of billions of gaps)
    /// are not believed: each chunk counts as one token; plausible counts still spread a
    /// chunk's gap over its tokens.
    #[test]
    fn counts_that_claim_billions_of_tokens_are_not_believed() {
        let bogus = [
            (ms(10), Some(1)),
            (ms(20), Some(3_000_000_000)),
            (ms(30), Some(4_000_000_000)),
        ];
        assert_eq!(inter_token_latencies(&bogus), vec![ms(10), ms(10)]);
        let fine = [(ms(10), Some(1)), (ms(20), Some(3)), (ms(30), Some(4))];
        assert_eq!(inter_token_latencies(&fine), vec![ms(5), ms(5), ms(10)]);
    }

    /// Feeds `(t_ms, bytes)` frames and finishes at the last frame's time.
    fn measure(frames: &[(u64, &str)], end: StreamEnd) -> RequestRecord {
        let mut m = StreamMeasurer::new(200, 1 << 20);
        for (t, b) in frames {
            m.on_bytes(ms(*t), b.as_bytes());
        }
        let last = frames.last().map_or(0, |f| f.0);
        m.finish(end, ms(last))
    }

    /// vLLM's `metrics` on the final usage chunk and llama.cpp's `timings` on its last chunk
    /// become the record's server timing; a malformed `metrics` loses neither it nor the tokens.
    #[test]
    fn server_timing_from_the_final_chunk_of_vllm_and_llama_cpp() {
        let tok = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
        let vllm = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1},\"metrics\":{\"time_to_first_token_ms\":20.0,\"queue_time_ms\":5.0,\"generation_time_ms\":0.0,\"mean_itl_ms\":null}}\n\n";
        let r = measure(
            &[(27, tok), (28, vllm), (29, "data: [DONE]\n\n")],
            StreamEnd::Eof,
        );
        let t = r.server_timing.unwrap();
        assert_eq!(t.source, server_timing::TimingSource::VllmMetrics);
        assert_eq!(
            (t.queue, t.prefill, t.ttft),
            (Some(ms(5)), Some(ms(20)), Some(ms(25)))
        );
        assert_eq!(t.client_minus_server_ttft_ms(r.ttft.unwrap()), Some(2.0));
        let llama = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"timings\":{\"cache_n\":3,\"prompt_n\":6,\"prompt_ms\":11.5,\"predicted_n\":1,\"predicted_ms\":0.5}}\n\n";
        let r = measure(&[(12, tok), (13, llama)], StreamEnd::Eof);
        let t = r.server_timing.unwrap();
        assert_eq!(t.source, server_timing::TimingSource::LlamaCppTimings);
        assert_eq!(t.ttft, Some(Duration::from_micros(11_500)));
        assert_eq!(t.prompt_tokens_computed, Some(6));
        let bad = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1},\"metrics\":\"on\",\"timings\":[1]}\n\n";
        let r = measure(
            &[(5, tok), (6, bad), (7, "data: [DONE]\n\n")],
            StreamEnd::Eof,
        );
        assert_eq!(
            (r.outcome, r.input_tokens, r.server_timing),
            (Outcome::Ok, Some(9), None)
        );
        assert_eq!(measure(&[(5, tok)], StreamEnd::Eof).server_timing, None);
    }

    #[test]
    fn dynamo_worker_ids_in_chunks_attribute_the_request() {
        let nv = r#""nvext":{"worker_id":{"prefill_worker_id":11,"prefill_dp_rank":0,"decode_worker_id":22,"decode_dp_rank":0}}"#;
        let a = format!(
            "data: {{\"id\":\"x\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"a\"}}}}],{nv}}}\n\n"
        );
        let b = format!(
            "data: {{\"id\":\"x\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"b\"}},\"finish_reason\":\"length\"}}],{nv}}}\n\n"
        );
        let r = measure(
            &[(5, &a), (9, &b), (10, "data: [DONE]\n\n")],
            StreamEnd::Eof,
        );
        assert_eq!(r.outcome, Outcome::Ok);
        assert_eq!(r.output_tokens, Some(2));
        let s = r.served_by.unwrap();
        assert_eq!(s.source, worker::AttributionSource::DynamoNvext);
        let ids: Vec<_> = s.workers.iter().map(|w| (w.id.as_str(), w.role)).collect();
        assert_eq!(
            ids,
            [
                ("11", worker::WorkerRole::Prefill),
                ("22", worker::WorkerRole::Decode)
            ]
        );
        // A malformed nvext is no error and names no worker.
        let bad = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"nvext\":{\"worker_id\":\"w1\"}}\n\n";
        let r = measure(&[(5, bad), (6, "data: [DONE]\n\n")], StreamEnd::Eof);
        assert_eq!(r.outcome, Outcome::Ok);
        assert_eq!(r.output_tokens, Some(1));
        assert_eq!(r.served_by, None);
        // A plain server's stream names none either.
        let plain = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
        let r = measure(&[(5, plain)], StreamEnd::Eof);
        assert_eq!(r.output_tokens, Some(1));
        assert_eq!(r.served_by, None);
    }

    #[test]
    fn kept_text_joins_the_first_choice() {
        let mut m = StreamMeasurer::new(200, 1 << 20).keep_text();
        m.on_bytes(
            ms(1),
            b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        );
        m.on_bytes(ms(2), b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"lo \\\"x\\\"\"}}]}\n\n");
        m.on_bytes(ms(3), b"data: {\"choices\":[{\"text\":\"!\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
        assert_eq!(
            m.finish(StreamEnd::Eof, ms(3)).output_text.as_deref(),
            Some("Hello \"x\"!")
        );
        assert_eq!(
            measure(
                &[(
                    1,
                    "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n"
                )],
                StreamEnd::Eof
            )
            .output_text,
            None,
            "not kept by default"
        );
    }

    #[test]
    fn multi_token_chunks_spread_the_gap() {
        let chunks = vec![(ms(100), Some(1)), (ms(160), Some(4)), (ms(180), Some(5))];
        assert_eq!(inter_token_latencies(&chunks), vec![ms(20); 4]);
        let chunks = vec![(ms(100), None), (ms(160), None), (ms(180), None)];
        assert_eq!(inter_token_latencies(&chunks), vec![ms(60), ms(20)]);
    }

    #[test]
    fn final_usage_in_the_finish_chunk_does_not_spread() {
        // llama.cpp /v1/completions puts the total usage in the finish chunk only.
        let r = measure(
            &[
                (10, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"),
                (20, "data: {\"choices\":[{\"text\":\"b\"}]}\n\n"),
                (
                    30,
                    "data: {\"choices\":[{\"text\":\"c\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3}}\n\n",
                ),
                (31, "data: [DONE]\n\n"),
            ],
            StreamEnd::Eof,
        );
        assert_eq!(r.itl, vec![ms(10), ms(10)]);
        assert_eq!(r.output_tokens, Some(3));
        assert_eq!(r.usage_source, Some(UsageSource::Server));
        assert_eq!(r.tpot, Some(ms(10)));
        assert_eq!(r.outcome, Outcome::Ok);
    }

    #[test]
    fn truncated_stream_is_an_error_with_partial_measurement() {
        let r = measure(
            &[(
                10,
                "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            )],
            StreamEnd::BodyError("connection reset".into()),
        );
        assert_eq!(r.outcome, Outcome::Error);
        assert_eq!(
            r.error.as_ref().map(|e| e.error_type.as_str()),
            Some(error_type::STREAM_TRUNCATED)
        );
        assert_eq!(r.ttft, Some(ms(10)));
    }

    #[test]
    fn timeout_and_cancel_win_over_truncation() {
        let frames = [(
            10,
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        )];
        assert_eq!(
            measure(&frames, StreamEnd::Timeout).outcome,
            Outcome::Timeout
        );
        assert_eq!(
            measure(&frames, StreamEnd::Cancelled).outcome,
            Outcome::Cancelled
        );
    }

    #[test]
    fn invalid_json_is_recorded_and_reading_goes_on() {
        let r = measure(
            &[
                (
                    10,
                    "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
                ),
                (20, "data: {not json\n\n"),
                (
                    30,
                    "data: {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}\n\n",
                ),
                (40, "data: [DONE]\n\n"),
            ],
            StreamEnd::Eof,
        );
        assert_eq!(r.outcome, Outcome::Error);
        assert_eq!(
            r.error.as_ref().map(|e| e.error_type.as_str()),
            Some(error_type::INVALID_CHUNK)
        );
        assert_eq!(r.token_chunk_times, vec![ms(10), ms(30)]);
        assert_eq!(r.e2e, ms(40));
    }

    #[test]
    fn http_error_body_is_read() {
        let r = RequestRecord::http_error(
            429,
            br#"{"error":{"message":"rate limited","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#,
            ms(5),
        );
        let e = r.error.unwrap();
        assert_eq!(
            (
                e.error_type.as_str(),
                e.message.as_deref(),
                e.code.as_deref()
            ),
            ("429", Some("rate limited"), Some("rate_limit_exceeded"))
        );
        let page = b"<!DOCTYPE html>\n<html>\n<head><title>404 Not Found</title></head>\n<body>\n<center><h1>404 Not Found</h1></center>\n<hr><center>nginx/1.25.3</center>\n</body>\n</html>\n";
        let r = RequestRecord::http_error(404, page, ms(5));
        assert_eq!(
            r.error.as_ref().and_then(|e| e.message.as_deref()),
            Some("404 Not Found 404 Not Found nginx/1.25.3"),
            "an HTML error page as its text on one line"
        );
        assert_eq!(
            excerpt(&"x ".repeat(100)).chars().count(),
            EXCERPT_CHARS + 1
        );
        assert_eq!(excerpt("a\n  b"), "a b");
        let r = RequestRecord::http_error(500, b"Internal Server Error", ms(5));
        assert_eq!(
            r.error.unwrap().message.as_deref(),
            Some("Internal Server Error")
        );
        // An SSE error body on a non-2xx status.
        let r = RequestRecord::http_error(500, b"data: {\"error\":{\"message\":\"engine dead\",\"type\":\"EngineDeadError\",\"code\":500}}\n\n", ms(5));
        let e = r.error.unwrap();
        assert_eq!(
            (
                e.error_type.as_str(),
                e.server_type.as_deref(),
                e.message.as_deref(),
                e.code.as_deref()
            ),
            (
                "500",
                Some("EngineDeadError"),
                Some("engine dead"),
                Some("500")
            )
        );
    }
}

#[cfg(test)]
mod wild_tests;
