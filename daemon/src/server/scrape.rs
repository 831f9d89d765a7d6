//! One scraper task per target on the agent's runtime: every `metrics_interval` it reads the
//! server's page (timeout, body cap), publishes a [`ServerSample`](super::ServerSample) to
//! [`TargetServer`], and re-reads the identity routes every minute and after each reconnect.
//! Its own HTTP client and task: a slow or dead metrics endpoint never delays a canary.
//!
//! Each failure reason is logged once per streak and counted; nothing stops the loop but
//! the cancellation token.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::CONTENT_TYPE;
use tokio_util::sync::CancellationToken;

use super::config::{IDENTITY_EVERY, ScrapeConfig};
use super::identity::{self, Change, ChangeKind, Identity};
use super::interval;
use super::normalize::{self, Reading, ServerKind};
use super::parse::{self, ParseStats};
use super::state::TargetServer;
use crate::config::{Secret, TargetConfig};

/// Pages larger than this are parsed on a blocking thread, off the runtime's workers.
const PARSE_INLINE_MAX: usize = 256 << 10;
/// Info route bodies are read up to this.
const INFO_MAX_BYTES: usize = 1 << 20;
/// Idle keep-alive connections the scrapers' client keeps per host: one per target that
/// shares a host and port (several models behind one server), so no scrape reconnects.
const IDLE_PER_HOST: usize = 16;

/// Why one scrape failed: `kind` names the counter reason, `message` is the sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeFailure {
    pub kind: &'static str,
    pub message: String,
}

impl ScrapeFailure {
    fn new(kind: &'static str, message: String) -> Self {
        Self { kind, message }
    }
}

/// A body read up to a cap into `body` (cleared first; its capacity is reused).
async fn read_capped(
    resp: reqwest::Response,
    max: usize,
    url: &str,
    body: &mut Vec<u8>,
) -> Result<(), ScrapeFailure> {
    if let Some(len) = resp.content_length()
        && len > max as u64
    {
        return Err(ScrapeFailure::new(
            "too_large",
            format!("{url}: body of {len} bytes is over the {max}-byte cap (metrics_max_bytes)"),
        ));
    }
    let mut resp = resp;
    body.clear();
    if let Some(len) = resp.content_length() {
        body.reserve(usize::try_from(len).unwrap_or(max).min(max));
    }
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if body.len() + c.len() > max {
                    return Err(ScrapeFailure::new(
                        "too_large",
                        format!("{url}: body over the {max}-byte cap (metrics_max_bytes)"),
                    ));
                }
                body.extend_from_slice(&c);
            }
            Ok(None) => return Ok(()),
            Err(e) if e.is_timeout() => {
                return Err(ScrapeFailure::new(
                    "timeout",
                    format!("{url}: body not read within the timeout"),
                ));
            }
            Err(e) if closed(&e) => {
                return Err(ScrapeFailure::new(
                    "closed",
                    format!(
                        "{url}: the server closed the connection mid-body, after {} bytes: {}",
                        body.len(),
                        error_chain(&e)
                    ),
                ));
            }
            Err(e) => {
                return Err(ScrapeFailure::new(
                    "body",
                    format!("{url}: reading the body: {}", error_chain(&e)),
                ));
            }
        }
    }
}

/// GET `url` within `timeout`, body capped at `max`: the body and its content type.
pub async fn fetch(
    client: &reqwest::Client,
    url: &url::Url,
    key: Option<&Secret>,
    timeout: Duration,
    max: usize,
) -> Result<(Vec<u8>, Option<String>), ScrapeFailure> {
    let mut body = Vec::new();
    fetch_into(client, url, key, timeout, max, &mut body)
        .await
        .map(|ctype| (body, ctype))
}

/// [`fetch`] into `body` (cleared first; a scraper reuses one buffer for every page). `url` is
/// parsed once by the caller (a scrape a second per target parses none).
pub async fn fetch_into(
    client: &reqwest::Client,
    url: &url::Url,
    key: Option<&Secret>,
    timeout: Duration,
    max: usize,
    body: &mut Vec<u8>,
) -> Result<Option<String>, ScrapeFailure> {
    let work = async {
        let resp = send_get(client, url, key).await?;
        let status = resp.status();
        if !status.is_success() {
            let hint = if status.as_u16() == 404 {
                " (is the server's metrics endpoint enabled, e.g. llama.cpp --metrics?)"
            } else {
                ""
            };
            return Err(ScrapeFailure::new(
                "http_status",
                format!("{url}: HTTP {}{hint}", status.as_u16()),
            ));
        }
        let ctype = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        read_capped(resp, max, url.as_str(), body).await?;
        Ok(ctype)
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ScrapeFailure::new(
            "timeout",
            format!(
                "{url}: not read within {}",
                humantime::format_duration(timeout)
            ),
        )),
    }
}

/// GETs `url`, and once more when the first attempt fails the way a kept-alive connection the
/// server closed while idle does (closed or reset before any response byte; not a refused
/// connect, not a timeout): the race of llama.cpp's `Keep-Alive: timeout=5` against a scrape
/// period near it. A GET is idempotent; the failed connection has left the pool, so the retry
/// opens a new one (the canary client does the same: `Clients::send_idempotent`).
async fn send_get(
    client: &reqwest::Client,
    url: &url::Url,
    key: Option<&Secret>,
) -> Result<reqwest::Response, ScrapeFailure> {
    let build = || {
        let req = client.get(url.clone());
        match key {
            Some(k) => req.bearer_auth(k.expose()),
            None => req,
        }
    };
    match build().send().await {
        Err(e) if !e.is_connect() && !e.is_timeout() && closed(&e) => build().send().await,
        other => other,
    }
    .map_err(|e| send_failure(url, &e))
}

/// The reason of a request that failed before its response's headers were read: `connect`
/// (refused, DNS, the connect timeout: no connection), `timeout` (connected, no answer in
/// time), `closed` (the server closed or reset the connection before a whole response head),
/// else `response` (a malformed response head, a redirect refused).
fn send_failure(url: &url::Url, e: &reqwest::Error) -> ScrapeFailure {
    let chain = error_chain(e);
    if e.is_connect() {
        ScrapeFailure::new("connect", format!("{url}: cannot connect: {chain}"))
    } else if e.is_timeout() {
        ScrapeFailure::new("timeout", format!("{url}: no answer within the timeout"))
    } else if closed(e) {
        ScrapeFailure::new(
            "closed",
            format!("{url}: the server closed the connection before its response: {chain}"),
        )
    } else {
        ScrapeFailure::new("response", format!("{url}: bad response: {chain}"))
    }
}

/// Whether `e` (or one of its sources) says the peer closed or reset the connection: hyper's
/// incomplete message or closed channel, or an IO reset, abort, broken pipe or early EOF.
fn closed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_closed() || h.is_canceled())
        {
            return true;
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        cur = c.source();
    }
    false
}

/// The error and its sources in one line (reqwest hides the cause, e.g. "connection refused").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Parses and normalizes a page body (only the samples [`normalize::reads`] are kept; every
/// line is checked and counted).
///
/// # Errors
/// A failure named `html`, `empty`, `not_metrics` or `body` (not UTF-8).
pub fn read_page(
    body: &[u8],
    kind: Option<ServerKind>,
    url: &str,
) -> Result<(Reading, ParseStats), ScrapeFailure> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ScrapeFailure::new("body", format!("{url}: the page is not UTF-8 ({e})")))?;
    let page = parse::parse_with(text, normalize::reads).map_err(|e| {
        let kind = match e {
            parse::PageError::Html => "html",
            parse::PageError::Empty => "empty",
            parse::PageError::NoSamples { .. } => "not_metrics",
        };
        ScrapeFailure::new(kind, format!("{url}: {e}"))
    })?;
    Ok((normalize::normalize(&page, kind), page.stats))
}

/// One target's scraper.
#[derive(Debug)]
pub struct Scraper {
    pub target: Arc<TargetServer>,
    pub cfg: ScrapeConfig,
    /// The target's base URL (identity routes are joined to it).
    pub base: url::Url,
    pub api_key: Option<Secret>,
    pub client: reqwest::Client,
    prev: Option<(Reading, SystemTime)>,
    identity_at: Option<tokio::time::Instant>,
    warned_parse: bool,
    /// The page buffer, reused from scrape to scrape.
    body: Vec<u8>,
}

impl Scraper {
    pub fn new(t: &TargetConfig, target: Arc<TargetServer>, client: reqwest::Client) -> Self {
        Self {
            target,
            cfg: t.server.clone(),
            base: t.base_url.clone(),
            api_key: t.api_key.clone(),
            client,
            prev: None,
            identity_at: None,
            warned_parse: false,
            body: Vec::new(),
        }
    }

    /// Builds the HTTP client scrapers share (no proxy from the environment, as the canaries).
    ///
    /// # Errors
    /// When reqwest cannot build a client.
    pub fn client() -> Result<reqwest::Client, reqwest::Error> {
        crate::install_tls_provider();
        reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(IDLE_PER_HOST)
            .build()
    }

    /// Scrapes every `interval` until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = crate::cost::metered(&crate::cost::SCRAPE, self.scrape_once()) => {}
            }
        }
    }

    /// One scrape: read, publish, and the identity when due. Returns whether the page was read.
    pub async fn scrape_once(&mut self) -> bool {
        let url = self.cfg.metrics_url.as_str();
        let at = SystemTime::now();
        let mut body = std::mem::take(&mut self.body);
        let fetched = fetch_into(
            &self.client,
            &self.cfg.metrics_url,
            self.api_key.as_ref(),
            self.cfg.timeout,
            self.cfg.max_bytes,
            &mut body,
        )
        .await;
        let read = match fetched {
            Ok(_) if body.len() > PARSE_INLINE_MAX => {
                let (kind, u) = (self.cfg.kind, url.to_owned());
                match tokio::task::spawn_blocking(move || {
                    let r = read_page(&body, kind, &u);
                    (r, body)
                })
                .await
                {
                    Ok((r, b)) => {
                        body = b;
                        r
                    }
                    Err(e) => {
                        body = Vec::new();
                        Err(ScrapeFailure::new(
                            "body",
                            format!("{url}: parser task failed: {e}"),
                        ))
                    }
                }
            }
            Ok(_) => read_page(&body, self.cfg.kind, url),
            Err(f) => Err(f),
        };
        // Keep the buffer for the next page unless it holds far more than pages need now.
        if body.capacity() <= 4 * body.len().max(PARSE_INLINE_MAX) {
            body.clear();
            self.body = body;
        }
        match read {
            Ok((reading, stats)) => {
                self.publish(reading, &stats, at).await;
                true
            }
            Err(f) => {
                if self.target.record_failure(at, f.kind, f.message.clone()) {
                    // A server without a metrics endpoint is common, not a fault: said at info.
                    if f.kind == "http_status" && f.message.contains("HTTP 404") {
                        tracing::info!(target_name = %self.target.target, reason = f.kind, "Server metrics not read: {}", f.message);
                    } else {
                        tracing::warn!(target_name = %self.target.target, reason = f.kind, "Server metrics not read: {}", f.message);
                    }
                }
                false
            }
        }
    }

    async fn publish(&mut self, reading: Reading, stats: &ParseStats, at: SystemTime) {
        if (stats.bad_lines > 0 || stats.duplicates > 0 || stats.non_finite > 0)
            && !self.warned_parse
        {
            self.warned_parse = true;
            tracing::warn!(
                target_name = %self.target.target,
                bad_lines = stats.bad_lines,
                duplicate_series = stats.duplicates,
                non_finite = stats.non_finite,
                first_bad = stats.first_bad.as_deref().unwrap_or("-"),
                "Server metrics page has lines that were skipped (said once; counted in the status)."
            );
        }
        let prev_kind = self.target.kind();
        let sample = interval::sample(self.prev.as_ref().map(|(r, t)| (r, *t)), &reading, at);
        let reset = sample.reset;
        let kind = reading.kind;
        let reconnect = self.target.record_ok(sample, kind, stats);
        self.target
            .set_router_workers(at, reading.router_workers.clone());
        if let Some(old) = prev_kind
            && old != kind
        {
            self.change(
                at,
                Change {
                    kind: ChangeKind::Kind,
                    old: Some(old.as_str().to_owned()),
                    new: Some(kind.as_str().to_owned()),
                },
            );
        }
        if reset {
            let start = |r: Option<&Reading>| {
                r.and_then(|r| r.process_start_time_s)
                    .map(|s| format!("{s:.0}"))
            };
            let old = start(self.prev.as_ref().map(|(r, _)| r));
            self.change(
                at,
                Change {
                    kind: ChangeKind::Restart,
                    old,
                    new: start(Some(&reading)),
                },
            );
        }
        self.prev = Some((reading, at));
        let due = self
            .identity_at
            .is_none_or(|t| t.elapsed() >= IDENTITY_EVERY);
        if reconnect || due || reset {
            self.identity_at = Some(tokio::time::Instant::now());
            let id = self.read_identity(kind).await;
            for c in self.target.set_identity(id) {
                self.change(SystemTime::now(), c);
            }
        }
    }

    fn change(&self, at: SystemTime, c: Change) {
        tracing::warn!(
            target_name = %self.target.target,
            kind = c.kind.as_str(),
            old = c.old.as_deref().unwrap_or("-"),
            new = c.new.as_deref().unwrap_or("-"),
            "Server change."
        );
        self.target.push_event(at, c);
    }

    /// Reads the kind's info route and `/v1/models`; a route that fails leaves its fields `None`.
    pub async fn read_identity(&self, kind: ServerKind) -> Identity {
        let mut id = Identity::default();
        if let Some(path) = identity::info_path(kind)
            && let Some(body) = self.get_info(path).await
        {
            identity::read_info(kind, &body, &mut id);
        }
        if let Some(body) = self.get_info("/v1/models").await {
            identity::read_models(&body, &mut id);
        }
        id
    }

    /// The body of `path` under the target's base URL, or `None` on any failure.
    async fn get_info(&self, path: &str) -> Option<Vec<u8>> {
        let url = self.base.join(path.trim_start_matches('/')).ok()?;
        let got = fetch(
            &self.client,
            &url,
            self.api_key.as_ref(),
            self.cfg.timeout,
            INFO_MAX_BYTES,
        )
        .await;
        got.ok().map(|(body, _)| body)
    }
}
