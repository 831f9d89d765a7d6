//! The control API's client, `lmperf ctl status|recent|inject|stop`: one call, printed as text
//! (or `--json`, the message as it is).
//!
//! Exit codes: 0 done; 1 the agent cannot be reached (or failed); 2 bad command line; 3 the
//! agent refused the call (a cap, a bad value, a missing token, no such target or load).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use super::proto::{self, agent_control_client::AgentControlClient};
use crate::config::{ControlListen, Secret};

/// Time to connect to the agent.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Time for one call (StopLoad waits up to 2 s for cancelled requests).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A failed `lmperf ctl` call.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("cannot reach the agent at {at}: {reason}")]
    Connect { at: String, reason: String },
    /// The connection failed during a call (no answer from the agent).
    #[error("the connection to {at} failed during the call: {reason}")]
    Lost { at: String, reason: String },
    #[error("{}: {}", code_name(.0.code()), .0.message())]
    Rpc(Status),
    /// A local file the command needs (`--profile`) cannot be read.
    #[error("{0}")]
    Local(String),
}

impl CtlError {
    /// The exit code: 3 when the agent refused, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            CtlError::Rpc(s)
                if matches!(
                    s.code(),
                    Code::InvalidArgument
                        | Code::NotFound
                        | Code::AlreadyExists
                        | Code::FailedPrecondition
                        | Code::Unauthenticated
                        | Code::PermissionDenied
                        | Code::OutOfRange
                ) =>
            {
                3
            }
            CtlError::Local(_) => 2,
            _ => 1,
        }
    }
}

/// The gRPC code in the spec's upper snake case (`INVALID_ARGUMENT`).
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A connection to an agent's control API.
#[derive(Debug, Clone)]
pub struct CtlClient {
    inner: AgentControlClient<Channel>,
    token: Option<Secret>,
    /// Where the agent is (errors name it).
    at: String,
}

impl CtlClient {
    /// Connects to `at` (a unix socket or `IP:port`); `token` goes with every call.
    ///
    /// # Errors
    /// [`CtlError::Connect`] when nothing answers there.
    pub async fn connect(at: &ControlListen, token: Option<Secret>) -> Result<Self, CtlError> {
        let fail = |e: &dyn std::fmt::Display| CtlError::Connect {
            at: at.to_string(),
            reason: e.to_string(),
        };
        let unreachable = |e: &tonic::transport::Error| CtlError::Connect {
            at: at.to_string(),
            reason: unreachable_reason(e),
        };
        let channel = match at {
            ControlListen::Tcp(addr) => {
                let ep = Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|e| fail(&e))?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .timeout(CALL_TIMEOUT);
                ep.connect().await.map_err(|e| unreachable(&e))?
            }
            ControlListen::Unix(path) => {
                let path = path.clone();
                let ep = Endpoint::from_static("http://localhost")
                    .connect_timeout(CONNECT_TIMEOUT)
                    .timeout(CALL_TIMEOUT);
                ep.connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let path = path.clone();
                    async move {
                        tokio::net::UnixStream::connect(path)
                            .await
                            .map(hyper_util::rt::TokioIo::new)
                    }
                }))
                .await
                .map_err(|e| unreachable(&e))?
            }
        };
        Ok(Self {
            inner: AgentControlClient::new(channel),
            token,
            at: at.to_string(),
        })
    }

    fn request<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        if let Some(t) = &self.token
            && let Ok(mut v) =
                tonic::metadata::MetadataValue::try_from(format!("Bearer {}", t.expose()))
        {
            v.set_sensitive(true);
            r.metadata_mut().insert("authorization", v);
        }
        r
    }

    /// `GetStatus`.
    ///
    /// # Errors
    /// The call's status.
    pub async fn status(&mut self) -> Result<proto::GetStatusResponse, CtlError> {
        let r = self.request(proto::GetStatusRequest {});
        self.inner
            .get_status(r)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| rpc_error(&self.at, s))
    }

    /// `ListRecentRequests`.
    ///
    /// # Errors
    /// The call's status.
    pub async fn recent(
        &mut self,
        req: proto::ListRecentRequestsRequest,
    ) -> Result<proto::ListRecentRequestsResponse, CtlError> {
        let r = self.request(req);
        self.inner
            .list_recent_requests(r)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| rpc_error(&self.at, s))
    }

    /// `Diagnose`.
    ///
    /// # Errors
    /// The call's status (`NOT_FOUND` for an unknown target).
    pub async fn diagnose(
        &mut self,
        req: proto::DiagnoseRequest,
    ) -> Result<proto::DiagnoseResponse, CtlError> {
        let r = self.request(req);
        self.inner
            .diagnose(r)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| rpc_error(&self.at, s))
    }

    /// `InjectLoad`.
    ///
    /// # Errors
    /// The call's status (`INVALID_ARGUMENT` beyond a cap).
    pub async fn inject(
        &mut self,
        req: proto::InjectLoadRequest,
    ) -> Result<proto::InjectLoadResponse, CtlError> {
        let r = self.request(req);
        self.inner
            .inject_load(r)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| rpc_error(&self.at, s))
    }

    /// `UpdateLoad`.
    ///
    /// # Errors
    /// The call's status (`INVALID_ARGUMENT` for a bad profile, `NOT_FOUND` when no load runs).
    pub async fn update_load(
        &mut self,
        req: proto::UpdateLoadRequest,
    ) -> Result<proto::UpdateLoadResponse, CtlError> {
        let r = self.request(req);
        self.inner
            .update_load(r)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| rpc_error(&self.at, s))
    }

    /// `StopLoad`.
    ///
    /// # Errors
    /// The call's status (`NOT_FOUND` when no load runs).
    pub async fn stop(&mut self, id: String) -> Result<proto::StopLoadResponse, CtlError> {
        let r = self.request(proto::StopLoadRequest { id });
        self.inner
            .stop_load(r)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| rpc_error(&self.at, s))
    }
}

/// `e` and its sources as one line, each message once (a source whose text its error already
/// shows is left out: `connection refused: connection refused`).
fn source_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            let _ = write!(s, ": {text}");
        }
        cur = c.source();
    }
    s
}

/// Why the agent's address does not answer, with what to do: from the innermost io error of
/// `e`'s chain (no socket, refused, permission, time-out), else its chain once.
fn unreachable_reason(e: &(dyn std::error::Error + 'static)) -> String {
    const CHECK: &str = "is the agent running, with control.listen there? (--addr unix:PATH or IP:PORT names another)";
    let mut io = None;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(i) = c.downcast_ref::<std::io::Error>() {
            io = Some(i);
        }
        if c.to_string().contains("timed out") || c.to_string().contains("Timeout expired") {
            return format!(
                "no answer within {} s; check --addr and that the agent runs",
                CONNECT_TIMEOUT.as_secs()
            );
        }
        cur = c.source();
    }
    match io.map(std::io::Error::kind) {
        Some(std::io::ErrorKind::NotFound) => format!("no socket there; {CHECK}"),
        Some(std::io::ErrorKind::PermissionDenied) => "permission denied: the control socket is owner-only; run lmperf ctl as the agent's user".to_owned(),
        Some(std::io::ErrorKind::TimedOut) => format!("no answer within {} s; check --addr and that the agent runs", CONNECT_TIMEOUT.as_secs()),
        Some(k) => format!("{k}; {CHECK}"),
        None => format!("{}; {CHECK}", source_chain(e)),
    }
}

/// A failed call as the user should read it: the agent's answer (its code and message) as
/// [`CtlError::Rpc`]; a connection that failed during the call as [`CtlError::Lost`]; a server
/// there that is not an agent's control API (plain HTTP, no `grpc-status`) as
/// [`CtlError::Connect`].
fn rpc_error(at: &str, s: Status) -> CtlError {
    if s.code() == Code::Unimplemented && s.message().contains("grpc-status header missing") {
        let http = s
            .message()
            .rsplit(' ')
            .next()
            .filter(|c| c.bytes().all(|b| b.is_ascii_digit()))
            .unwrap_or("?");
        return CtlError::Connect {
            at: at.to_owned(),
            reason: format!(
                "it answers HTTP {http} but is not an lmperf agent's control API; check --addr"
            ),
        };
    }
    let not_grpc = |c: &(dyn std::error::Error + 'static)| source_chain(c).contains("http2 error");
    match std::error::Error::source(&s) {
        Some(cause) if not_grpc(cause) => CtlError::Connect { at: at.to_owned(), reason: "it answers, but not as an lmperf agent's control API (no gRPC over HTTP/2 there); check --addr".to_owned() },
        Some(cause) if matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded | Code::Internal) => {
            let reason = if s.message().contains("Timeout expired") {
                format!("no answer within {} s; see the agent's log, or retry", CALL_TIMEOUT.as_secs())
            } else {
                let chain = source_chain(cause);
                format!("{}; is the agent still running, and is this its control.listen address? (--addr names another)", chain.trim_start_matches("transport error: "))
            };
            CtlError::Lost { at: at.to_owned(), reason }
        }
        _ => CtlError::Rpc(s),
    }
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn opt_u64(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn outcomes(m: &std::collections::BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".to_owned();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Seconds since a unix time, for "12.3s ago".
fn ago(at_unix_s: f64) -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    format!("{:.1}s ago", (now - at_unix_s).max(0.0))
}

/// `lmperf ctl status` as text.
pub fn format_status(s: &proto::GetStatusResponse) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "lmperf {}  up {:.0}s  {}",
        s.version,
        s.uptime_s,
        if s.ready { "ready" } else { "not ready" }
    );
    for t in &s.targets {
        let _ = writeln!(
            o,
            "target {}  {}{}  model={}  requests={} ({})  in_flight={} skipped={}{}",
            t.name,
            t.url,
            t.api,
            t.model.as_deref().unwrap_or("-"),
            t.requests,
            outcomes(&t.by_outcome),
            t.in_flight,
            t.skipped,
            if t.spike { "  SPIKE" } else { "" }
        );
        if !t.k8s.is_empty() {
            let mut k: Vec<_> = t.k8s.iter().collect();
            k.sort();
            let _ = writeln!(
                o,
                "  k8s: {}",
                k.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        if let Some(r) = &t.spike_reason {
            // The rule's values when the spike began (status does not re-evaluate it).
            let _ = writeln!(o, "  spike: {r} (entered on these values)");
        }
        if let Some(l) = &t.last {
            let _ = writeln!(
                o,
                "  last: {} {} ttft_ms={} e2e_ms={:.1}{} trace_id={}",
                ago(l.at_unix_s),
                l.outcome,
                opt_ms(l.ttft_ms),
                l.e2e_ms,
                l.worker
                    .as_deref()
                    .map(|w| format!(" worker={w}"))
                    .unwrap_or_default(),
                l.trace_id
            );
        }
        if let Some(l) = &t.latency {
            let _ = writeln!(
                o,
                "  last {:.0} min: {} ok  TTFT p50/p99 {}/{} ms  TPOT p50/p99 {}/{} ms",
                l.window_s / 60.0,
                l.requests,
                opt_ms(l.ttft_p50_ms),
                opt_ms(l.ttft_p99_ms),
                opt_ms(l.tpot_p50_ms),
                opt_ms(l.tpot_p99_ms)
            );
        }
        if let Some(e) = &t.last_error {
            let _ = writeln!(o, "  last error: {} {}", ago(e.at_unix_s), error_words(e));
        }
        if let Some(sv) = &t.server {
            o.push_str(&format_server(sv));
        }
    }
    if let Some(e) = &s.exporter {
        let _ = writeln!(
            o,
            "exporter: {}  queue {}/{}  exported={} dropped={} failed={}{}",
            if e.enabled { "on" } else { "off" },
            e.queue_len,
            e.queue_capacity,
            e.exported,
            e.dropped_queue_full,
            e.failed,
            e.last_error
                .as_ref()
                .map_or(String::new(), |x| format!("  last error: {x}"))
        );
    }
    if let Some(g) = &s.gpu {
        let _ = writeln!(
            o,
            "gpu: {}{}  devices={}",
            g.mode,
            g.reason
                .as_ref()
                .map_or(String::new(), |r| format!(" ({r})")),
            g.devices.len()
        );
        for d in &g.devices {
            let _ = writeln!(
                o,
                "  gpu{} {} util={} mem={}/{} B{}",
                d.index,
                d.name,
                d.utilization
                    .map_or("-".to_owned(), |u| format!("{:.0}%", u * 100.0)),
                opt_u64(d.memory_used_bytes),
                opt_u64(d.memory_total_bytes),
                if d.lost { " LOST" } else { "" }
            );
        }
    }
    if let Some(n) = &s.net {
        let live: Vec<&str> = n
            .probes
            .iter()
            .filter(|p| p.live)
            .map(|p| p.program.as_str())
            .collect();
        let _ = writeln!(
            o,
            "net: {}{}  probes live={}",
            n.mode,
            n.reason
                .as_ref()
                .map_or(String::new(), |r| format!(" ({r})")),
            if live.is_empty() {
                "-".to_owned()
            } else {
                live.join(",")
            }
        );
    }
    o.push_str(&super::status_sections::format(&s.status_json));
    match &s.load {
        Some(l) => o.push_str(&format!("load: {}", format_load(l))),
        None => o.push_str("load: none\n"),
    }
    if let Some(c) = &s.caps {
        let _ = writeln!(
            o,
            "inject caps: rate<={}/s duration<={}s concurrency<={} requests<={}",
            c.max_rate_per_second, c.max_duration_s, c.max_concurrency, c.max_requests
        );
    }
    o
}

/// A target's model server as text (one line, a second for its newest change):
/// `  server: llama.cpp b6000 model=gemma on (read 0.4s ago) waiting=3 running=2 kv=41%`.
pub fn format_server(s: &proto::ServerStatus) -> String {
    let num = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v}"));
    let mut o = format!(
        "  server: {} {} model={} {}{}",
        s.kind.as_deref().unwrap_or("-"),
        s.version.as_deref().unwrap_or("-"),
        s.model.as_deref().unwrap_or("-"),
        s.mode,
        s.reason
            .as_ref()
            .map_or(String::new(), |r| format!(" ({r})")),
    );
    if let Some(age) = s.last_ok_age_s {
        o.push_str(&format!(" (read {age:.1}s ago)"));
    }
    o.push_str(&format!(
        " waiting={} running={} kv={}\n",
        num(s.requests_waiting),
        num(s.requests_running),
        s.kv_cache_usage
            .map_or("-".to_owned(), |k| format!("{:.0}%", k * 100.0))
    ));
    if let (Some(c), Some(at)) = (&s.last_change, s.last_change_at_unix_s) {
        o.push_str(&format!(
            "  server changes={}  newest: {c} {}\n",
            s.changes,
            ago(at)
        ));
    }
    o
}

/// One load as text (one line). A profile load shows its name, running revision and file,
/// and what it does now (concurrency limit, request and token rate) beside its caps.
pub fn format_load(l: &proto::LoadStatus) -> String {
    let (shape, concurrency) = if !l.profile.is_empty() {
        (
            profile_shape(l),
            format!("concurrency_cap={}", l.concurrency),
        )
    } else if l.trace.is_empty() {
        (
            format!("rate={}/s ({})", l.rate_per_second, l.arrival),
            format!("concurrency={}", l.concurrency),
        )
    } else {
        (
            format!(
                "trace={} speedup={} rate={:.2}/s (peak {}/s)",
                l.trace, l.trace_speedup, l.rate_per_second, l.trace_peak_rate_per_second
            ),
            format!("concurrency={}", l.concurrency),
        )
    };
    format!(
        "{} {} target={} {shape} duration={} {concurrency} max_requests={}  elapsed={:.1}s sent={} skipped={} in_flight={} ({})\n",
        l.id,
        l.state,
        l.target,
        seconds(l.duration_s),
        l.max_requests,
        l.elapsed_s,
        l.sent,
        l.skipped,
        l.in_flight,
        outcomes(&l.by_outcome)
    )
}

/// Seconds as a person reads them: whole ones as such (`30s`), else to a tenth (`26.7s`, not
/// `26.7248753s`).
fn seconds(v: f64) -> String {
    if (v - v.round()).abs() < 0.05 {
        format!("{:.0}s", v.round())
    } else {
        format!("{v:.1}s")
    }
}

/// A failed request in words: `connection_refused: <message>` or `503 HTTP 503: <message>`,
/// with the worker of a routed target.
fn error_words(s: &proto::RequestSummary) -> String {
    let mut w = s.error_type.clone().unwrap_or_else(|| s.outcome.clone());
    let said = s
        .error_message
        .as_deref()
        .is_some_and(|m| m.starts_with("HTTP "));
    if let Some(h) = s.http_status.filter(|h| w != h.to_string() && !said) {
        let _ = write!(w, " HTTP {h}");
    }
    if let Some(m) = &s.error_message {
        let _ = write!(w, ": {m}");
    }
    if let Some(k) = &s.worker {
        let _ = write!(w, " (worker={k})");
    }
    w
}

/// `lmperf ctl recent` as text: one line per request, newest first.
pub fn format_recent(r: &proto::ListRecentRequestsResponse) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<10} {:<7} {:<20} {:<9} {:>9} {:>9} {:>9} {:>6}  {:<32}  error (type, HTTP status, message) or worker",
        "age", "source", "target", "outcome", "ttft_ms", "tpot_ms", "e2e_ms", "tokens", "trace_id"
    );
    for s in &r.requests {
        let _ = writeln!(
            o,
            "{:<10} {:<7} {:<20} {:<9} {:>9} {:>9} {:>9.1} {:>6}  {:<32}  {}",
            ago(s.at_unix_s),
            s.source,
            s.target,
            s.outcome,
            opt_ms(s.ttft_ms),
            opt_ms(s.tpot_ms),
            s.e2e_ms,
            opt_u64(s.output_tokens),
            s.trace_id,
            match (&s.error_type, &s.worker) {
                (Some(_), _) => error_words(s),
                (None, Some(w)) => format!("worker={w}"),
                (None, None) => "-".to_owned(),
            }
        );
    }
    let _ = writeln!(
        o,
        "({} shown; the agent keeps the last {})",
        r.requests.len(),
        r.capacity
    );
    o
}

/// One `lmperf ctl` call as given (the CLI converts its flags, `cli::CtlArgs`, into it).
#[derive(Debug)]
pub struct CtlRequest {
    /// The agent's control address (`unix:/path` or `IP:port`); `None`: the default socket.
    pub addr: Option<String>,
    /// File holding the control token; `None`: `LMPERF_CONTROL_TOKEN`.
    pub token_file: Option<std::path::PathBuf>,
    /// Print the reply as JSON.
    pub json: bool,
    pub call: CtlCall,
}

/// The calls of `lmperf ctl` (see `cli::CtlCommand` for each field's meaning).
#[derive(Debug)]
pub enum CtlCall {
    Status,
    Diagnose {
        target: Option<String>,
        window: Option<std::time::Duration>,
    },
    Recent {
        limit: u32,
        target: Option<String>,
        outcome: Option<String>,
        source: Option<String>,
    },
    Inject {
        target: Option<String>,
        rate: Option<f64>,
        duration: Option<std::time::Duration>,
        concurrency: Option<u32>,
        max_requests: Option<u64>,
        arrival: String,
        trace_file: Option<String>,
        trace_speedup: Option<f64>,
        trace_format: Option<String>,
        p99_threshold: Option<std::time::Duration>,
        profile: Option<std::path::PathBuf>,
        output_tokens: Option<u32>,
        watch: bool,
    },
    UpdateLoad {
        id: Option<String>,
        profile: std::path::PathBuf,
    },
    Stop {
        id: Option<String>,
    },
}

/// Runs one `lmperf ctl` command, prints the reply on stdout (errors on stderr), and returns
/// the exit code.
pub async fn run(args: CtlRequest, env: &dyn crate::config::Env) -> u8 {
    use CtlCall as CtlCommand;
    let at = match &args.addr {
        Some(a) => match ControlListen::parse(a) {
            Ok(at) => at,
            Err(why) => {
                eprintln!("lmperf ctl: --addr {a:?}: {why}");
                return 2;
            }
        },
        None => ControlListen::Unix(crate::config::default_control_socket(env)),
    };
    let token = match &args.token_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) if !t.trim().is_empty() => Some(Secret::new(t.trim().to_owned())),
            Ok(_) => {
                eprintln!("lmperf ctl: --token-file {}: file is empty", path.display());
                return 2;
            }
            Err(e) => {
                eprintln!("lmperf ctl: --token-file {}: {e}", path.display());
                return 2;
            }
        },
        None => env
            .var(crate::config::DEFAULT_CONTROL_TOKEN_ENV)
            .map(|t| Secret::new(t.trim().to_owned())),
    };
    let result = async {
        let mut c = CtlClient::connect(&at, token).await?;
        let out: (String, String) = match args.call {
            CtlCommand::Status => {
                let r = c.status().await?;
                (format_status(&r), json(&r))
            }
            CtlCommand::Recent {
                limit,
                target,
                outcome,
                source,
            } => {
                let req = proto::ListRecentRequestsRequest {
                    limit,
                    target: target.unwrap_or_default(),
                    outcome: outcome.unwrap_or_default(),
                    source: source.unwrap_or_default(),
                };
                let r = c.recent(req).await?;
                (format_recent(&r), json(&r))
            }
            CtlCommand::Inject {
                target,
                rate,
                duration,
                concurrency,
                max_requests,
                arrival,
                trace_file,
                trace_speedup,
                trace_format,
                p99_threshold,
                profile,
                output_tokens,
                watch,
            } => {
                let (profile_yaml, profile_file) = match &profile {
                    Some(path) => read_profile(path)?,
                    None => (String::new(), String::new()),
                };
                let req = proto::InjectLoadRequest {
                    target: target.unwrap_or_default(),
                    rate_per_second: rate.unwrap_or(0.0),
                    duration_s: duration.map_or(0.0, |d| d.as_secs_f64()),
                    concurrency: concurrency.unwrap_or(0),
                    max_requests: max_requests.unwrap_or(0),
                    arrival,
                    // The agent reads the file; a relative path is taken from here.
                    trace_file: trace_file
                        .map(|f| std::path::absolute(&f).map_or(f, |p| p.display().to_string()))
                        .unwrap_or_default(),
                    trace_speedup: trace_speedup.unwrap_or(0.0),
                    trace_format: trace_format.unwrap_or_default(),
                    profile_yaml,
                    profile_file,
                    output_tokens: output_tokens.unwrap_or(0),
                };
                let r = c.inject(req).await?;
                match (p99_threshold, r.load.as_ref()) {
                    (Some(th), Some(l)) => scene_after(&mut c, l.clone(), th).await?,
                    (None, Some(l)) if watch => match &profile {
                        Some(path) => watch_profile(&mut c, path, l.clone()).await?,
                        None => (format_load(l), json(&r)),
                    },
                    _ => (
                        r.load
                            .as_ref()
                            .map_or_else(String::new, |l| format!("started {}", format_load(l))),
                        json(&r),
                    ),
                }
            }
            CtlCommand::UpdateLoad { id, profile } => {
                let (profile_yaml, profile_file) = read_profile(&profile)?;
                let r = c
                    .update_load(proto::UpdateLoadRequest {
                        id: id.unwrap_or_default(),
                        profile_yaml,
                        profile_file,
                    })
                    .await?;
                (
                    r.load.as_ref().map_or_else(String::new, |l| {
                        format!("revision {} of {}", r.revision, format_load(l))
                    }),
                    json(&r),
                )
            }
            CtlCommand::Stop { id } => {
                let r = c.stop(id.unwrap_or_default()).await?;
                (
                    r.load
                        .as_ref()
                        .map_or_else(String::new, |l| format!("stopped {}", format_load(l))),
                    json(&r),
                )
            }
            CtlCommand::Diagnose { target, window } => {
                let r = c
                    .diagnose(proto::DiagnoseRequest {
                        target: target.unwrap_or_default(),
                        window_s: window.map_or(0.0, |w| w.as_secs_f64()),
                    })
                    .await?;
                let doc: serde_json::Value =
                    serde_json::from_str(&r.diagnosis_json).unwrap_or(serde_json::Value::Null);
                let text =
                    match serde_json::from_str::<crate::diagnosis::Diagnosis>(&r.diagnosis_json) {
                        Ok(d) => crate::diagnosis::scorecard::text(&d),
                        Err(e) => format!("unreadable diagnosis from the agent: {e}\n"),
                    };
                (text, json(&doc))
            }
        };
        Ok::<_, CtlError>(out)
    }
    .await;
    match result {
        Ok((text, json_text)) => {
            if args.json {
                println!("{json_text}");
            } else {
                print!("{text}");
            }
            0
        }
        Err(e) => {
            eprintln!("lmperf ctl: {e}");
            e.exit_code()
        }
    }
}

/// `ctl inject --trace … --p99-threshold T`: waits for the load to end (its replay duration
/// plus 2 min at most), then the p99 alert verdict over the replay's requests and the agent's
/// diagnosis of its span (`control::scene`).
async fn scene_after(
    c: &mut CtlClient,
    started: proto::LoadStatus,
    threshold: std::time::Duration,
) -> Result<(String, String), CtlError> {
    let deadline = std::time::Instant::now()
        + std::time::Duration::from_secs_f64(started.duration_s.max(0.0) + 120.0);
    let mut last = started.clone();
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let s = c.status().await?;
        if let Some(l) = s.load.filter(|l| l.id == started.id) {
            let running = l.state == "running";
            last = l;
            if !running {
                break;
            }
        }
    }
    let from = started.started_unix_s;
    let to = from + last.elapsed_s.max(0.0) + 1.0;
    let recent = c
        .recent(proto::ListRecentRequestsRequest {
            limit: 100_000,
            target: last.target.clone(),
            ..Default::default()
        })
        .await?;
    let alert = super::scene::p99_alert(
        &recent.requests,
        &last.target,
        from,
        to,
        threshold.as_secs_f64(),
    );
    let window_s = (to - from).max(60.0) + 60.0;
    let d = c
        .diagnose(proto::DiagnoseRequest {
            target: last.target.clone(),
            window_s,
        })
        .await?;
    let doc: serde_json::Value =
        serde_json::from_str(&d.diagnosis_json).unwrap_or(serde_json::Value::Null);
    let card = match serde_json::from_str::<crate::diagnosis::Diagnosis>(&d.diagnosis_json) {
        Ok(d) => crate::diagnosis::scorecard::text(&d),
        Err(e) => format!("unreadable diagnosis from the agent: {e}\n"),
    };
    let text = format!(
        "replayed {}\n{}{card}",
        format_load(&last),
        super::scene::text(&alert, from)
    );
    let js = serde_json::json!({"load": serde_json::from_str::<serde_json::Value>(&json(&last)).unwrap_or_default(), "p99_alert": alert, "diagnosis": doc});
    Ok((text, json(&js)))
}

/// `ctl inject --profile FILE --watch`: sends each settled edit of FILE as `UpdateLoad` (one
/// line per revision, or per refused edit, on stderr) until the load ends (its duration + 30 s
/// at most) or Ctrl-C (the load goes on); returns the load as it ended or is.
async fn watch_profile(
    c: &mut CtlClient,
    path: &std::path::Path,
    started: proto::LoadStatus,
) -> Result<(String, String), CtlError> {
    eprint!("lmperf ctl: started {}", format_load(&started));
    let mut watch = crate::load::profile::watch::ProfileWatch::start(path);
    let deadline =
        std::time::Instant::now() + Duration::from_secs_f64(started.duration_s.max(0.0) + 30.0);
    let mut last = started.clone();
    while std::time::Instant::now() < deadline {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                // Watching ends; the load is the agent's and runs to its duration.
                eprintln!("lmperf ctl: stopped watching {}; load {} goes on until its duration (`lmperf ctl stop` ends it)", path.display(), started.id);
                break;
            }
            () = watch.changed() => {
                let (profile_yaml, profile_file) = match read_profile(path) {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("lmperf ctl: {e}");
                        continue;
                    }
                };
                match c.update_load(proto::UpdateLoadRequest { id: started.id.clone(), profile_yaml, profile_file }).await {
                    Ok(r) => eprintln!("lmperf ctl: revision {} from {}", r.revision, path.display()),
                    Err(CtlError::Rpc(s)) if s.code() == Code::InvalidArgument => eprintln!("lmperf ctl: edit refused, the running revision is kept: {}", s.message()),
                    Err(CtlError::Rpc(s)) if s.code() == Code::NotFound => break,
                    Err(e) => return Err(e),
                }
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                if let Some(l) = c.status().await?.load.filter(|l| l.id == started.id) {
                    let running = l.state == "running";
                    last = l;
                    if !running {
                        break;
                    }
                }
            }
        }
    }
    if let Some(l) = c.status().await?.load.filter(|l| l.id == started.id) {
        last = l;
    }
    Ok((format!("ended {}", format_load(&last)), json(&last)))
}

/// A profile file's text and name, read here (the agent reads no file for it).
fn read_profile(path: &std::path::Path) -> Result<(String, String), CtlError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let e = e.to_string();
        CtlError::Local(format!(
            "--profile {}: cannot read: {}",
            path.display(),
            e.split(" (os error").next().unwrap_or_default()
        ))
    })?;
    Ok((text, path.display().to_string()))
}

/// The shape of a profile load: name, running revision and its file, when each revision took
/// effect, what it does now per dimension, sustained rate.
fn profile_shape(l: &proto::LoadStatus) -> String {
    let revisions: Vec<String> = l
        .profile_revisions
        .iter()
        .map(|r| format!("{}@{:.1}s", r.revision, r.at_s))
        .collect();
    let mut now = Vec::new();
    if let Some(c) = l.profile_concurrency_now {
        now.push(format!("concurrency={c}"));
    }
    if let (Some(r), Some(t)) = (l.profile_rate_per_second_now, l.profile_token_rate_now) {
        now.push(format!("rate={r:.2} req/s ({t:.0} tok/s)"));
    }
    let now = if now.is_empty() {
        String::new()
    } else {
        format!(" now: {}", now.join(" "))
    };
    let sustained = l
        .sustained_token_rate
        .map_or(String::new(), |r| format!(" sustained={r:.1} tokens/s"));
    // The revision's peak (bursty: its on rate) when it is not what runs now.
    let peak = match l.profile_rate_per_second_now {
        Some(r) if (r - l.rate_per_second).abs() < 1e-9 => String::new(),
        _ => format!(" peak={:.2} req/s", l.rate_per_second),
    };
    format!(
        "profile={} revision={} ({}) [{}]{now}{peak}{sustained}",
        l.profile,
        l.profile_revision,
        l.profile_file,
        revisions.join(" ")
    )
}

fn json<T: serde::Serialize>(v: &T) -> String {
    let v = serde_json::to_value(v).map(|mut v| {
        omit_empty_trace(&mut v);
        v
    });
    v.and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// A load that replays no trace (`"trace": ""`) shows no trace fields (`trace`,
/// `trace_speedup`, `trace_peak_rate_per_second`), at any depth.
fn omit_empty_trace(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            if m.get("trace").is_some_and(|t| t == "") {
                m.retain(|k, _| k != "trace" && !k.starts_with("trace_"));
            }
            m.values_mut().for_each(omit_empty_trace);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(omit_empty_trace),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_exit_3_and_transport_failures_exit_1() {
        assert_eq!(CtlError::Rpc(Status::invalid_argument("x")).exit_code(), 3);
        assert_eq!(CtlError::Rpc(Status::unauthenticated("x")).exit_code(), 3);
        assert_eq!(CtlError::Rpc(Status::unavailable("x")).exit_code(), 1);
        assert_eq!(
            CtlError::Connect {
                at: "unix:/x".into(),
                reason: "no".into()
            }
            .exit_code(),
            1
        );
        assert_eq!(
            CtlError::Rpc(Status::invalid_argument("rate_per_second = 50: above")).to_string(),
            "INVALID_ARGUMENT: rate_per_second = 50: above"
        );
    }

    #[test]
    fn server_line_shows_identity_queue_kv_and_the_newest_change() {
        let s = proto::ServerStatus {
            mode: "on".into(),
            kind: Some("llama.cpp".into()),
            version: Some("b6000".into()),
            model: Some("gemma".into()),
            last_ok_age_s: Some(0.44),
            requests_waiting: Some(3.0),
            requests_running: Some(2.0),
            kv_cache_usage: Some(0.414),
            changes: 2,
            last_change: Some("model a -> gemma".into()),
            last_change_at_unix_s: Some(0.0),
            ..Default::default()
        };
        let text = format_server(&s);
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "  server: llama.cpp b6000 model=gemma on (read 0.4s ago) waiting=3 running=2 kv=41%"
            )
        );
        let change = lines.next().unwrap();
        assert!(
            change.starts_with("  server changes=2  newest: model a -> gemma "),
            "{change}"
        );
        let failing = proto::ServerStatus {
            mode: "failing".into(),
            reason: Some("not a metrics page".into()),
            ..Default::default()
        };
        assert_eq!(
            format_server(&failing),
            "  server: - - model=- failing (not a metrics page) waiting=- running=- kv=-\n"
        );
    }

    #[test]
    fn a_profile_load_shows_its_running_revision_and_what_it_does_now() {
        let l = proto::LoadStatus {
            id: "load-1".into(),
            state: "running".into(),
            target: "t0".into(),
            arrival: "profile".into(),
            profile: "burst".into(),
            profile_file: "b.yaml".into(),
            profile_revision: 1,
            profile_revisions: vec![
                proto::ProfileRevision {
                    revision: 0,
                    at_s: 0.0,
                    file: "a.yaml".into(),
                },
                proto::ProfileRevision {
                    revision: 1,
                    at_s: 2.04,
                    file: "b.yaml".into(),
                },
            ],
            rate_per_second: 10.0,
            profile_rate_per_second_now: Some(0.0),
            profile_token_rate_now: Some(0.0),
            profile_concurrency_now: Some(8),
            concurrency: 16,
            duration_s: 30.0,
            max_requests: 1000,
            ..Default::default()
        };
        let text = format_load(&l);
        assert!(
            text.starts_with("load-1 running target=t0 profile=burst revision=1 (b.yaml) [0@0.0s 1@2.0s] now: concurrency=8 rate=0.00 req/s (0 tok/s) peak=10.00 req/s duration=30s concurrency_cap=16 max_requests=1000 "),
            "{text}"
        );
        // A rate load keeps its plain concurrency.
        let plain = proto::LoadStatus {
            arrival: "poisson".into(),
            rate_per_second: 2.0,
            concurrency: 4,
            ..Default::default()
        };
        assert!(
            format_load(&plain).contains(" rate=2/s (poisson) duration=0s concurrency=4 "),
            "{}",
            format_load(&plain)
        );
        assert_eq!(
            (seconds(26.7248753), seconds(30.0), seconds(0.0)),
            ("26.7s".to_owned(), "30s".to_owned(), "0s".to_owned())
        );
    }

    #[test]
    fn unreachable_agents_are_one_line_naming_the_cause_once_and_what_to_do() {
        #[derive(Debug, thiserror::Error)]
        #[error("transport error")]
        struct Transport(#[source] std::io::Error);
        let refused = Transport(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            unreachable_reason(&refused),
            "connection refused; is the agent running, with control.listen there? (--addr unix:PATH or IP:PORT names another)"
        );
        let missing = Transport(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "No such file or directory (os error 2)",
        ));
        assert!(
            unreachable_reason(&missing).starts_with("no socket there; is the agent running"),
            "{}",
            unreachable_reason(&missing)
        );
        let denied = Transport(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert_eq!(
            unreachable_reason(&denied),
            "permission denied: the control socket is owner-only; run lmperf ctl as the agent's user"
        );
        // A source whose text the error already shows is not repeated.
        #[derive(Debug, thiserror::Error)]
        #[error("tcp connect error: {0}")]
        struct Shows(#[source] std::io::Error);
        assert_eq!(
            source_chain(&Shows(std::io::Error::other("refused"))),
            "tcp connect error: refused"
        );
        // A plain HTTP server there: no agent.
        let e = rpc_error(
            "10.0.0.1:9",
            Status::unimplemented("grpc-status header missing, mapped from HTTP status code 404"),
        );
        assert_eq!(
            e.to_string(),
            "cannot reach the agent at 10.0.0.1:9: it answers HTTP 404 but is not an lmperf agent's control API; check --addr"
        );
        // The agent's own answers are kept as they are (code and message).
        assert_eq!(
            rpc_error("x", Status::unavailable("the agent is shutting down")).to_string(),
            "UNAVAILABLE: the agent is shutting down"
        );
        let lost = rpc_error(
            "x",
            Status::from_error(Box::new(Transport(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )))),
        );
        assert!(matches!(lost, CtlError::Lost { .. }), "{lost}");
        assert_eq!(
            lost.to_string(),
            "the connection to x failed during the call: connection reset; is the agent still running, and is this its control.listen address? (--addr names another)"
        );
    }

    #[test]
    fn recent_lines_show_trace_ids_and_values() {
        let r = proto::ListRecentRequestsResponse {
            requests: vec![proto::RequestSummary {
                source: "inject".into(),
                target: "t0".into(),
                outcome: "error".into(),
                error_type: Some("http.503".into()),
                ttft_ms: None,
                e2e_ms: 12.34,
                trace_id: "0af7651916cd43dd8448eb211c80319c".into(),
                ..Default::default()
            }],
            capacity: 256,
        };
        let text = format_recent(&r);
        let line = text.lines().nth(1).unwrap();
        for want in [
            "inject",
            "t0",
            "error",
            "12.3",
            "0af7651916cd43dd8448eb211c80319c",
            "http.503",
        ] {
            assert!(line.contains(want), "{want} in {line}");
        }
        assert!(
            text.ends_with("(1 shown; the agent keeps the last 256)\n"),
            "{text}"
        );
    }

    #[test]
    fn json_of_a_rate_load_omits_the_trace_fields() {
        let rate = proto::LoadStatus {
            rate_per_second: 5.0,
            ..Default::default()
        };
        let r = proto::GetStatusResponse {
            load: Some(rate),
            ..Default::default()
        };
        let v: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        let l = v["load"].as_object().unwrap();
        assert!(!l.keys().any(|k| k.starts_with("trace")), "{l:?}");
        assert_eq!(l["rate_per_second"], 5.0);
        let replay = proto::LoadStatus {
            trace: "t.jsonl".into(),
            trace_speedup: 2.0,
            ..Default::default()
        };
        let v: serde_json::Value = serde_json::from_str(&json(&replay)).unwrap();
        assert_eq!(
            (v["trace"].as_str(), v["trace_speedup"].as_f64()),
            (Some("t.jsonl"), Some(2.0))
        );
    }

    #[test]
    fn status_names_the_spike_rule_with_its_values() {
        use crate::sampler::adaptive::SpikeRule;
        let rule = SpikeRule::LatencyJump {
            signal: "e2e",
            p99_s: 4.1,
            baseline_s: 0.42,
            ratio: 9.76,
            z: 61.2,
            in_flight: 5,
        };
        let s = proto::GetStatusResponse {
            targets: vec![proto::TargetStatus {
                name: "t0".into(),
                spike: true,
                spike_reason: Some(rule.describe()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = format_status(&s);
        assert!(text.contains("  SPIKE\n"), "{text}");
        assert!(
            text.contains("  spike: latency_jump: e2e p99 ≥ 4.10 s = 9.8 × baseline 420 ms (z 61.2; 5 canaries still in flight) (entered on these values)\n"),
            "{text}"
        );
    }

    /// Issue 50.2: `ctl status` says how fast a target answered lately, per target.
    #[test]
    fn status_text_has_the_last_minutes_latency() {
        let s = proto::GetStatusResponse {
            targets: vec![proto::TargetStatus {
                name: "t0".into(),
                latency: Some(proto::RecentLatency {
                    window_s: 300.0,
                    requests: 150,
                    ttft_p50_ms: Some(41.25),
                    ttft_p99_ms: Some(230.0),
                    tpot_p50_ms: Some(12.0),
                    tpot_p99_ms: None,
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = format_status(&s);
        assert!(
            text.contains(
                "  last 5 min: 150 ok  TTFT p50/p99 41.2/230.0 ms  TPOT p50/p99 12.0/- ms\n"
            ),
            "{text}"
        );
    }
}
