//! Sends one streaming canary request and measures it.
//!
//! The clock: `Instant::now()` right before the request is handed to the connection (send),
//! and again each time the body yields bytes read from the socket. [`crate::measure`] turns
//! those offsets into TTFT, ITL, TPOT and E2E.
//!
//! Stale keep-alive connections: servers close idle connections (llama.cpp advertises
//! `Keep-Alive: timeout=5`), and a request written onto a connection the server has just
//! closed fails without the server having seen it. That is the client's fault, not the
//! server's, so such a failure (reset or closed before any response byte, on a pooled
//! connection) is re-sent once on a fresh connection, and the retry is recorded
//! (`lmperf.retries`). The pool also forgets idle connections after
//! [`POOL_IDLE_TIMEOUT`], below common server keep-alive timeouts.

use std::error::Error as _;
use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::config::{Api, TargetConfig, TargetKind};
use crate::measure::worker::ServedBy;
use crate::measure::{Outcome, RequestError, RequestRecord, StreamEnd, StreamMeasurer, error_type};

/// Idle pooled connections are dropped after this: shorter than llama.cpp's 5 s keep-alive.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(3);
/// A non-2xx body is read up to this many bytes.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// After `[DONE]`, wait at most this long for the body to end before dropping it.
const AFTER_DONE_GRACE: Duration = Duration::from_millis(200);

/// The two HTTP clients a target uses: a pooled one, and one that never reuses a connection
/// (for the retry after a stale connection).
#[derive(Debug, Clone)]
pub struct Clients {
    pooled: reqwest::Client,
    fresh: reqwest::Client,
}

impl Clients {
    /// # Errors
    /// When the TLS backend cannot be set up.
    pub fn new(connect_timeout: Duration) -> Result<Self, reqwest::Error> {
        crate::install_tls_provider();
        let base = || {
            reqwest::Client::builder()
                .connect_timeout(connect_timeout)
                .tcp_nodelay(true)
                .user_agent(concat!("lmperf/", env!("CARGO_PKG_VERSION")))
        };
        Ok(Self {
            pooled: base().pool_idle_timeout(POOL_IDLE_TIMEOUT).build()?,
            fresh: base().pool_max_idle_per_host(0).build()?,
        })
    }
}

impl Clients {
    /// Sends an idempotent request besides a canary (model list, tokenize), built by `build`
    /// for the client given: on the pooled client, and once more on a fresh connection when
    /// the first attempt fails the way a stale keep-alive connection does.
    pub async fn send_idempotent(
        &self,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, reqwest::Error> {
        match build(&self.pooled).send().await {
            Err(e) if is_stale_connection(&e) => build(&self.fresh).send().await,
            other => other,
        }
    }
}

/// What to send.
#[derive(Debug, Clone)]
pub struct CanaryRequest<'a> {
    pub api: Api,
    pub model: &'a str,
    pub prompt: &'a str,
    pub max_tokens: u32,
    /// W3C `traceparent` header value.
    pub traceparent: &'a str,
    /// Fields merged into the JSON body (e.g. `ignore_eos`, `min_tokens` for benchmarks).
    pub extra_body: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// The measured request and its connection, defined in `measure` (kept here under their old path).
pub use crate::measure::{Conn, Measured};

/// The connection that carried `response`, from hyper's `HttpInfo`.
fn conn_of(response: &reqwest::Response) -> Option<Conn> {
    let info = response
        .extensions()
        .get::<hyper_util::client::legacy::connect::HttpInfo>()?;
    Some(Conn {
        local: info.local_addr(),
        remote: info.remote_addr(),
    })
}

/// The JSON body of a canary request: streaming with usage, temperature 0, bounded output.
pub fn request_body(req: &CanaryRequest<'_>) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": req.model,
        "stream": true,
        "stream_options": { "include_usage": true },
        "max_tokens": req.max_tokens,
        "temperature": 0,
    });
    match req.api {
        Api::Chat => {
            body["messages"] = serde_json::json!([{ "role": "user", "content": req.prompt }])
        }
        Api::Completions => body["prompt"] = serde_json::Value::from(req.prompt),
    }
    if let (Some(extra), Some(obj)) = (req.extra_body, body.as_object_mut()) {
        for (k, v) in extra {
            obj.insert(k.clone(), v.clone());
        }
    }
    body
}

/// The request's `X-Request-ID`: its trace and span ids (`TRACE-SPAN`, from its W3C
/// `traceparent`), unique per request. A server that logs request ids (vLLM with
/// `--enable-request-id-headers`, gateways) then logs the canary's trace; a router that hashes
/// a session key to pick a worker reads it when no session or user id is sent (vllm-router's
/// `consistent_hash`: `X-Session-ID`, `X-User-ID`, `X-Tenant-ID`, then `X-Request-ID`), so the
/// canaries spread over its workers as independent requests do, instead of all hashing to the
/// worker of one body (seen on 0.1.17: every request without a key to one worker). `None` for
/// a `traceparent` not of four fields.
fn request_id(traceparent: &str) -> Option<String> {
    let fields: Vec<&str> = traceparent.split('-').collect();
    match fields.as_slice() {
        [_, trace, span, _] => Some(format!("{trace}-{span}")),
        _ => None,
    }
}

fn headers(target: &TargetConfig, traceparent: &str) -> Result<HeaderMap, String> {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
    h.insert(
        "traceparent",
        HeaderValue::from_str(traceparent).map_err(|e| format!("traceparent: {e}"))?,
    );
    if let Some(id) = request_id(traceparent) {
        h.insert(
            "x-request-id",
            HeaderValue::from_str(&id).map_err(|e| format!("x-request-id: {e}"))?,
        );
    }
    if let Some(key) = &target.api_key {
        let mut v = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
            .map_err(|_| "the API key holds characters not allowed in a header".to_owned())?;
        v.set_sensitive(true);
        h.insert(AUTHORIZATION, v);
    }
    Ok(h)
}

/// Sends `req` to `target` and measures it. Never fails: every failure is a measured outcome.
/// `cancel` ends the request early (recorded as `cancelled`).
pub async fn execute(
    clients: &Clients,
    target: &TargetConfig,
    req: &CanaryRequest<'_>,
    cancel: &CancellationToken,
) -> Measured {
    execute_with(clients, target, req, cancel, false).await
}

/// [`execute`]; with `keep_text` the record also holds the generated text
/// ([`RequestRecord::output_text`]).
pub async fn execute_with(
    clients: &Clients,
    target: &TargetConfig,
    req: &CanaryRequest<'_>,
    cancel: &CancellationToken,
    keep_text: bool,
) -> Measured {
    let url = match target.base_url.join(req.api.path()) {
        Ok(u) => u,
        Err(e) => return build_failure(format!("url: {e}")),
    };
    let headers = match headers(target, req.traceparent) {
        Ok(h) => h,
        Err(e) => return build_failure(e),
    };
    let mut body = request_body(req);
    if target.kind == TargetKind::Router {
        ask_for_worker(&mut body);
    }
    let body = match serde_json::to_vec(&body) {
        Ok(b) => b,
        Err(e) => return build_failure(format!("body: {e}")),
    };
    let mut retries = 0;
    loop {
        let client = if retries == 0 {
            &clients.pooled
        } else {
            &clients.fresh
        };
        let request = client
            .post(url.clone())
            .headers(headers.clone())
            .body(body.clone());
        match attempt(request, target, cancel, keep_text).await {
            Attempt::StaleConnection if retries == 0 => retries += 1,
            Attempt::StaleConnection => {
                // Cannot happen with `fresh`, but never loop: report it.
                let record = RequestRecord::failed(
                    Outcome::Error,
                    RequestError::new(
                        error_type::CONNECTION_ERROR,
                        Some("connection closed before any response".into()),
                    ),
                    None,
                    Duration::ZERO,
                );
                return Measured {
                    record,
                    wall_start: SystemTime::now(),
                    retries,
                    conn: None,
                };
            }
            Attempt::Done(record, wall_start, conn) => {
                return Measured {
                    record,
                    wall_start,
                    retries,
                    conn,
                };
            }
        }
    }
}

fn build_failure(message: String) -> Measured {
    let record = RequestRecord::failed(
        Outcome::Error,
        RequestError::new(error_type::REQUEST_BUILD, Some(message)),
        None,
        Duration::ZERO,
    );
    Measured {
        record,
        wall_start: SystemTime::now(),
        retries: 0,
        conn: None,
    }
}

enum Attempt {
    Done(RequestRecord, SystemTime, Option<Conn>),
    /// The connection failed before any response byte in a way a stale keep-alive
    /// connection does: re-send on a fresh connection.
    StaleConnection,
}

async fn attempt(
    request: reqwest::RequestBuilder,
    target: &TargetConfig,
    cancel: &CancellationToken,
    keep_text: bool,
) -> Attempt {
    let wall_start = SystemTime::now();
    let t0 = Instant::now();
    let deadline = tokio::time::Instant::from_std(t0 + target.timeout);
    let sent = tokio::select! {
        biased;
        _ = cancel.cancelled() => {
            let r = RequestRecord::failed(Outcome::Cancelled, RequestError::new(error_type::CANCELLED, None), None, t0.elapsed());
            return Attempt::Done(r, wall_start, None);
        }
        r = tokio::time::timeout_at(deadline, request.send()) => r,
    };
    let response = match sent {
        Err(_elapsed) => {
            let r = RequestRecord::failed(
                Outcome::Timeout,
                RequestError::new(error_type::TIMEOUT, Some("no response headers".into())),
                None,
                t0.elapsed(),
            );
            return Attempt::Done(r, wall_start, None);
        }
        Ok(Err(e)) => {
            let e2e = t0.elapsed();
            if is_stale_connection(&e) {
                return Attempt::StaleConnection;
            }
            return Attempt::Done(transport_failure(e, e2e), wall_start, None);
        }
        Ok(Ok(resp)) => resp,
    };
    let status = response.status().as_u16();
    let conn = conn_of(&response);
    if !response.status().is_success() {
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let dropped = response
            .headers()
            .get(crate::measure::worker::LLM_D_DROPPED_REASON_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = read_error_body(response, deadline).await;
        let mut record = RequestRecord::http_error(status, &body, t0.elapsed());
        if let Some(e) = record.error.as_mut() {
            e.retry_after = retry_after;
            if let Some(reason) = dropped {
                crate::measure::worker::name_dropped_reason(e, &reason);
            }
        }
        return Attempt::Done(record, wall_start, conn);
    }
    let named =
        (target.kind == TargetKind::Router).then(|| worker_from_headers(response.headers()));
    let stages = response
        .headers()
        .get(crate::measure::router_stages::HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::measure::router_stages::RouterStages::parse);
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (mut record, head) =
        read_stream(response, status, target, t0, deadline, cancel, keep_text).await;
    name_a_non_stream(&mut record, content_type.as_deref(), &head);
    if let Some(named) = named
        && record.served_by.is_none()
    {
        record.served_by = Some(named.unwrap_or_else(ServedBy::unattributed));
    }
    // The stream's own comment, sent once the worker's first token came, else the header.
    record.router_stages = record.router_stages.or(stages);
    Attempt::Done(record, wall_start, conn)
}

/// Asks a router which worker served the request and how its time went: Dynamo's
/// `nvext.extra_fields = ["worker_id", "timing"]` (`docs/pages/components/frontend/nvext.md`;
/// `timing` is `TimingInfo`, [`crate::measure::server_timing`]; other routers pass the field
/// on, and the workers ignore it), kept with any `nvext` the body already has.
pub fn ask_for_worker(body: &mut serde_json::Value) {
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    let nvext = obj.entry("nvext").or_insert_with(|| serde_json::json!({}));
    if let Some(n) = nvext.as_object_mut() {
        let fields = n
            .entry("extra_fields")
            .or_insert_with(|| serde_json::json!([]));
        if let Some(list) = fields.as_array_mut() {
            for want in ["worker_id", "timing"] {
                if !list.iter().any(|f| f == want) {
                    list.push(want.into());
                }
            }
        }
    }
}

/// The worker(s) the router's response headers name: SGLang's model gateway's
/// `x-smg-routed-worker-id`, else llm-d's (`x-session-token`, `x-session-token-prefill`, else
/// the `llm-d-session` cookie); `None` when they name none. A malformed token names none
/// (said at debug level): never a guess.
fn worker_from_headers(h: &HeaderMap) -> Option<ServedBy> {
    use crate::measure::worker::{
        LLM_D_PREFILL_TOKEN_HEADER, LLM_D_TOKEN_HEADER, SMG_ROUTED_WORKER_HEADER, llm_d_cookie,
    };
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    if let Some(by) = text(SMG_ROUTED_WORKER_HEADER).and_then(ServedBy::from_smg) {
        return Some(by);
    }
    let cookie = h
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(llm_d_cookie);
    let decode = text(LLM_D_TOKEN_HEADER).or(cookie);
    match ServedBy::from_llm_d(decode, text(LLM_D_PREFILL_TOKEN_HEADER)) {
        Ok(named) => named,
        Err(e) => {
            tracing::debug!(error = %e, "Router's worker token not read.");
            None
        }
    }
}

/// Chunks read ahead of the measurement at most (bounded memory: the reader waits when the
/// measurement falls this far behind).
const READ_AHEAD_CHUNKS: usize = 64;

/// A chunk that, with the bytes of the event it continues, reaches this size hands the rest
/// of the body to a reader task ([`Body::hand_off`]): measuring a token event takes
/// microseconds, measuring a 1 MiB one milliseconds (in a debug build).
const HAND_OFF_BYTES: usize = 16 * 1024;

/// One body chunk (or the end, or the error), and when it was read (after the send).
type Read = (Result<Option<hyper::body::Bytes>, reqwest::Error>, Duration);

/// Where the measuring loop reads the body from: the response itself while events are small
/// (one task: a chunk is timestamped as it is read, then measured in microseconds), or, once a
/// large event arrives, a reader task that timestamps each chunk as it arrives while this task
/// measures (so parsing a large event never delays the timestamps of the bytes after it).
enum Body {
    Inline(reqwest::Response),
    /// The reader task is aborted when this is dropped (cancelled, timed out or done: the
    /// connection goes with it).
    Reader {
        rx: tokio::sync::mpsc::Receiver<Read>,
        _reader: tokio_util::task::AbortOnDropHandle<()>,
    },
    /// Handed off or ended.
    Gone,
}

impl Body {
    /// The next chunk; `None` once the body is gone (the reader ended).
    async fn next(&mut self, t0: Instant) -> Option<Read> {
        match self {
            Body::Inline(response) => {
                let chunk = response.chunk().await;
                Some((chunk, t0.elapsed()))
            }
            Body::Reader { rx, .. } => rx.recv().await,
            Body::Gone => None,
        }
    }

    /// From now on a reader task reads the body (a no-op if one already does).
    fn hand_off(&mut self, t0: Instant) {
        if !matches!(self, Body::Inline(_)) {
            return;
        }
        let Body::Inline(mut response) = std::mem::replace(self, Body::Gone) else {
            return;
        };
        let (tx, rx) = tokio::sync::mpsc::channel(READ_AHEAD_CHUNKS);
        let reader = tokio::spawn(async move {
            loop {
                let chunk = response.chunk().await;
                let at = t0.elapsed();
                let last = !matches!(chunk, Ok(Some(_)));
                if tx.send((chunk, at)).await.is_err() || last {
                    break;
                }
            }
        });
        *self = Body::Reader {
            rx,
            _reader: tokio_util::task::AbortOnDropHandle::new(reader),
        };
    }
}

/// Reads the body and measures it. Small chunks are read and measured on this task; from the
/// first chunk that makes a large event ([`HAND_OFF_BYTES`]) on, a reader task takes each
/// chunk's arrival time as it reads it ([`Body`]).
async fn read_stream(
    response: reqwest::Response,
    status: u16,
    target: &TargetConfig,
    t0: Instant,
    deadline: tokio::time::Instant,
    cancel: &CancellationToken,
    keep_text: bool,
) -> (RequestRecord, Vec<u8>) {
    let mut m = StreamMeasurer::new(status, target.max_event_bytes);
    // The body's first bytes, to name a reply that is no event stream.
    let mut head: Vec<u8> = Vec::new();
    if keep_text {
        m = m.keep_text();
    }
    let mut body = Body::Inline(response);
    let mut after_done = false;
    let mut ended_at = None;
    // One timer for the whole stream (reset once after [DONE]), not one per chunk, and one
    // registration with the cancel token (a new `cancelled()` each chunk locks the token's
    // tree twice per frame).
    let timer = tokio::time::sleep_until(deadline);
    let cancelled = cancel.cancelled();
    tokio::pin!(timer, cancelled);
    let end = loop {
        tokio::select! {
            biased;
            _ = &mut cancelled, if !after_done => break StreamEnd::Cancelled,
            _ = &mut timer => {
                break if after_done { StreamEnd::Eof } else { StreamEnd::Timeout };
            }
            read = body.next(t0) => match read {
                Some((Ok(Some(bytes)), at)) => {
                    if head.len() < HEAD_BYTES {
                        let take = (HEAD_BYTES - head.len()).min(bytes.len());
                        head.extend_from_slice(&bytes[..take]);
                    }
                    if bytes.len() + m.buffered_bytes() >= HAND_OFF_BYTES {
                        body.hand_off(t0);
                    }
                    if !m.on_bytes(at, &bytes) {
                        break StreamEnd::Eof;
                    }
                    if m.is_done() && !after_done {
                        after_done = true;
                        let grace = deadline.min(tokio::time::Instant::now() + AFTER_DONE_GRACE);
                        timer.as_mut().reset(grace);
                    }
                }
                Some((Ok(None), at)) => {
                    ended_at = Some(at);
                    break StreamEnd::Eof;
                }
                Some((Err(e), at)) => {
                    ended_at = Some(at);
                    break StreamEnd::BodyError(error_chain(&e));
                }
                None => break StreamEnd::Eof,
            },
        }
    };
    drop(body);
    (
        m.finish(end, ended_at.unwrap_or_else(|| t0.elapsed())),
        head,
    )
}

/// Bytes of a reply's start kept to name it when it is no event stream.
const HEAD_BYTES: usize = 160;

/// A 2xx reply that carried no token and is not `text/event-stream` (an HTML error page, a
/// proxy's login form, a JSON document) failed because it is no stream: its error says so
/// with the content type and the first bytes (`non_sse_reply`), not `stream_truncated`.
fn name_a_non_stream(record: &mut RequestRecord, content_type: Option<&str>, head: &[u8]) {
    let is_stream = content_type.is_some_and(|c| c.trim_start().starts_with("text/event-stream"));
    if is_stream || record.ttft.is_some() || record.outcome != Outcome::Error {
        return;
    }
    // A server's own error document (`{"error": …}`) keeps its type and message.
    if record
        .error
        .as_ref()
        .is_some_and(|e| e.server_type.is_some() || e.error_type == error_type::STREAM_ERROR)
    {
        return;
    }
    let status = record.http_status.unwrap_or(200);
    let message = crate::measure::non_stream_message(status, content_type, head, "an event stream");
    record.error = Some(RequestError::new(error_type::NON_SSE_REPLY, Some(message)));
}

/// The server's wait before a retry: `retry-after-ms` (OpenAI, milliseconds), else
/// `Retry-After` as seconds or as an HTTP-date after `now` (RFC 9110 §10.2.3). Recorded only:
/// measured latency is never stretched by it.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let v = text("retry-after")?;
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9)));
    }
    httpdate::parse_http_date(v)
        .ok()
        .map(|at| at.duration_since(now).unwrap_or(Duration::ZERO))
}

async fn read_error_body(
    mut response: reqwest::Response,
    deadline: tokio::time::Instant,
) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(b))) => {
                body.extend_from_slice(&b[..b.len().min(MAX_ERROR_BODY - body.len())])
            }
            _ => break,
        }
    }
    body
}

/// The error and its sources, joined by `: `, without the URL.
fn error_chain(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

fn io_kind(e: &reqwest::Error) -> Option<std::io::ErrorKind> {
    let mut src = e.source();
    while let Some(cause) = src {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        src = cause.source();
    }
    None
}

fn hyper_incomplete(e: &reqwest::Error) -> bool {
    let mut src = e.source();
    while let Some(cause) = src {
        if let Some(h) = cause.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        src = cause.source();
    }
    false
}

fn is_stale_connection(e: &reqwest::Error) -> bool {
    use std::io::ErrorKind::*;
    if e.is_connect() || e.is_timeout() {
        return false;
    }
    hyper_incomplete(e)
        || matches!(
            io_kind(e),
            Some(ConnectionReset | BrokenPipe | ConnectionAborted | UnexpectedEof)
        )
}

fn transport_failure(e: reqwest::Error, e2e: Duration) -> RequestRecord {
    let e = e.without_url();
    let message = Some(error_chain(&e));
    let (outcome, kind) = if e.is_timeout() {
        (Outcome::Timeout, error_type::TIMEOUT)
    } else if io_kind(&e) == Some(std::io::ErrorKind::ConnectionRefused) {
        (Outcome::Error, error_type::CONNECTION_REFUSED)
    } else {
        (Outcome::Error, error_type::CONNECTION_ERROR)
    };
    RequestRecord::failed(outcome, RequestError::new(kind, message), None, e2e)
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, Deserialize)]
struct ModelEntry {
    id: String,
    #[serde(default)]
    owned_by: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

/// The served model found by [`discover_model`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    pub model: String,
    /// `owned_by` of that model (e.g. `llamacpp`, `vllm`), if given.
    pub owned_by: Option<String>,
}

/// Asks `GET /v1/models` for the served model (the first listed).
///
/// # Errors
/// The failure as a measured record (`error.type` as for a canary), so a dead target shows
/// in the metrics even before its model is known.
pub async fn discover_model(
    clients: &Clients,
    target: &TargetConfig,
) -> Result<Discovered, RequestRecord> {
    let t0 = Instant::now();
    let fail = |kind: &str, msg: String| {
        RequestRecord::failed(
            Outcome::Error,
            RequestError::new(kind, Some(format!("model discovery: {msg}"))),
            None,
            t0.elapsed(),
        )
    };
    let url = target
        .base_url
        .join("v1/models")
        .map_err(|e| fail(error_type::REQUEST_BUILD, e.to_string()))?;
    let resp = clients
        .send_idempotent(|c| {
            let req = c
                .get(url.clone())
                .timeout(target.timeout.min(Duration::from_secs(10)));
            match &target.api_key {
                Some(key) => req.bearer_auth(key.expose()),
                None => req,
            }
        })
        .await
        .map_err(|e| transport_failure(e, t0.elapsed()))?;
    let status = resp.status().as_u16();
    if !resp.status().is_success() {
        let body = resp.bytes().await.unwrap_or_default();
        let mut record = RequestRecord::http_error(status, &body, t0.elapsed());
        // Said as model discovery's, as its other failures are: not a canary's reply.
        if let Some(e) = record.error.as_mut() {
            e.message = Some(match e.message.take() {
                Some(m) => format!("model discovery: {m}"),
                None => format!("model discovery: HTTP {status}"),
            });
        }
        return Err(record);
    }
    let content_type = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp
        .bytes()
        .await
        .map_err(|e| transport_failure(e, t0.elapsed()))?;
    let list: ModelList = serde_json::from_slice(&body).map_err(|e| {
        if content_type.as_deref().is_some_and(|c| c.contains("json")) {
            fail(error_type::INVALID_CHUNK, e.to_string())
        } else {
            let head = &body[..body.len().min(HEAD_BYTES)];
            let msg =
                crate::measure::non_stream_message(status, content_type.as_deref(), head, "JSON");
            fail(error_type::NON_SSE_REPLY, msg)
        }
    })?;
    let first = list
        .data
        .into_iter()
        .next()
        .ok_or_else(|| fail("no_model", "the server lists no model".into()))?;
    Ok(Discovered {
        model: first.id,
        owned_by: first.owned_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each request's id is its trace and span: unique, and findable by its trace id.
    #[test]
    fn the_request_id_is_the_trace_and_span() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            request_id(tp).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7")
        );
        assert_eq!(request_id("garbage"), None);
    }

    /// A router is asked for the worker and its timing once, beside whatever `nvext` the body
    /// has.
    #[test]
    fn a_router_is_asked_which_worker_served_the_request() {
        let mut body = serde_json::json!({"model": "m", "nvext": {"annotations": ["x"]}});
        ask_for_worker(&mut body);
        ask_for_worker(&mut body);
        assert_eq!(
            body["nvext"],
            serde_json::json!({"annotations": ["x"], "extra_fields": ["worker_id", "timing"]})
        );
    }

    /// llm-d's tokens (base64 `namespace/pod`) name the pods; the cookie stands in for the
    /// header; a malformed token names none.
    #[test]
    fn llm_d_headers_name_the_decode_and_prefill_pods() {
        use crate::measure::worker::WorkerRole;
        let h = |pairs: &[(&'static str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(*k, HeaderValue::from_str(v).unwrap());
            }
            m
        };
        // base64("ml/decode-0"), base64("ml/prefill-1")
        let by = worker_from_headers(&h(&[
            ("x-session-token", "bWwvZGVjb2RlLTA="),
            ("x-session-token-prefill", "bWwvcHJlZmlsbC0x"),
        ]))
        .unwrap();
        assert_eq!(by.key(), "ml/prefill-1→ml/decode-0");
        assert_eq!(by.primary().unwrap().role, WorkerRole::Decode);
        let by = worker_from_headers(&h(&[(
            "set-cookie",
            "llm-d-session=bWwvZGVjb2RlLTA=; Path=/",
        )]))
        .unwrap();
        assert_eq!(
            (by.key(), by.primary().unwrap().role),
            ("ml/decode-0".into(), WorkerRole::Agg)
        );
        assert_eq!(worker_from_headers(&h(&[("x-session-token", "%%%")])), None);
        let smg = worker_from_headers(&h(&[("x-smg-routed-worker-id", "http://10.0.0.9:30000")]))
            .unwrap();
        assert_eq!(
            (smg.source.as_str(), smg.key()),
            ("smg_header", "http://10.0.0.9:30000".to_owned())
        );
        assert_eq!(worker_from_headers(&h(&[])), None);
    }

    #[test]
    fn retry_after_in_seconds_milliseconds_and_dates() {
        let h = |pairs: &[(&'static str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_str(v).unwrap());
            }
            m
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            retry_after(&h(&[("retry-after", "2")]), now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&h(&[("retry-after", "2"), ("retry-after-ms", "1500")]), now),
            Some(Duration::from_millis(1500))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            retry_after(&h(&[("retry-after", &date)]), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(retry_after(&h(&[("retry-after", "soon")]), now), None);
        assert_eq!(retry_after(&h(&[("retry-after", "-1")]), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }
}
