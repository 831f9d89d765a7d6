//! Configuration in two stages (as ripgrep does): [`raw`] is the TOML file as written, strict;
//! [`load`] merges it with the command line and the `OTEL_*` environment and validates it into
//! [`AgentConfig`], whose values are parsed (URLs, durations, addresses) and ready to use.
//!
//! Precedence, highest first: command-line flags, the config file, `OTEL_*` environment
//! variables (OpenTelemetry SDK environment variable specification), built-in defaults.
//! Canary flags on the command line apply to every target.

pub mod direct_paths;
pub mod discovery;
pub mod k8s;
pub mod log_format;
pub mod profiling;
pub mod raw;
pub mod scrape;
pub mod selector;
pub mod worker_probes;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use url::Url;

use crate::sampler::adaptive::SamplingPolicy;
use raw::{RawCanary, RawConfig};

/// A configuration that cannot be used. Its `Display` is one line naming the field and value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} line {line} ({text}): {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        text: String,
        message: String,
    },
    #[error("{field} = {value:?}: {reason}")]
    Invalid {
        field: String,
        value: String,
        reason: String,
    },
}

impl ConfigError {
    fn invalid(
        field: impl Into<String>,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// Which OpenAI-compatible API a canary calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "v1/chat/completions",
            Api::Completions => "v1/completions",
        }
    }
}

/// What a target is: a model server, or a router in front of workers (llm-d's gateway,
/// NVIDIA Dynamo's frontend, vllm-router, SGLang's gateway).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TargetKind {
    /// A model server: its canaries measure that server.
    #[default]
    Server,
    /// A router: each canary asks it which worker served it (Dynamo's `nvext.extra_fields =
    /// ["worker_id"]`) and records what it says (`measure::worker`), else `unattributed`.
    Router,
}

impl TargetKind {
    /// `server` | `router`.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Server => "server",
            TargetKind::Router => "router",
        }
    }
}

/// Gaps between request arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Equal gaps.
    Constant,
}

/// When a target's canaries are sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// One request per `period` on average, each gap jittered uniformly by ±10 %.
    Interval { period: Duration },
    /// `per_second` requests per second with the given gaps.
    Rate { per_second: f64, arrival: Arrival },
}

/// An API key. Never printed: `Debug` shows `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value (an API key, a control token).
    pub fn new(value: String) -> Self {
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where the kubelet serves its pod-resources API (`v1.PodResourcesLister`), the default of
/// `[gpu] pod_resources_socket`.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// One validated target.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetConfig {
    /// Low-cardinality name for metrics and logs (default `host:port`).
    pub name: String,
    /// Base URL; API paths are joined to it (a trailing `/v1` is accepted and removed).
    pub base_url: Url,
    /// `server.address`
    pub host: String,
    /// `server.port`
    pub port: u16,
    /// `None`: discovered from `GET /v1/models`.
    pub model: Option<String>,
    pub api: Api,
    pub schedule: Schedule,
    pub max_tokens: u32,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Canaries of this target in flight at once; a tick beyond this is skipped and counted.
    pub max_in_flight: usize,
    pub max_event_bytes: usize,
    pub api_key: Option<Secret>,
    /// `gen_ai.provider.name`; `None`: from `owned_by` of `/v1/models`, else `openai`.
    pub provider: Option<String>,
    pub sampling: SamplingPolicy,
    /// The model server's own metrics and identity (`server`).
    pub server: scrape::ScrapeConfig,
    /// The pod that serves this target (Kubernetes discovery or `[target.k8s]`); `None` on a
    /// plain host.
    pub k8s: Option<k8s::K8sIdentity>,
    /// `[target.profiling]`: the server's profiler, called on a TPOT regression; `None`: never.
    pub profiling: Option<profiling::ProfilingConfig>,
    /// `kind`: a model server (default) or a router in front of workers.
    pub kind: TargetKind,
    /// A router target's pinned probes of each worker (`worker_probes`).
    pub worker_probes: worker_probes::WorkerProbes,
    /// A router target's direct canaries to its workers (`direct_paths`).
    pub direct: direct_paths::DirectPaths,
}

/// OTLP wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

/// Where and how telemetry is exported.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    pub enabled: bool,
    pub protocol: OtlpProtocol,
    /// Full URL for spans (HTTP: `…/v1/traces`; gRPC: the endpoint).
    pub traces_endpoint: String,
    /// Full URL for metrics (HTTP: `…/v1/metrics`; gRPC: the endpoint).
    pub metrics_endpoint: String,
    pub export_interval: Duration,
    pub export_timeout: Duration,
    /// Spans waiting for export at most; more are dropped and counted.
    pub queue_size: usize,
    pub batch_size: usize,
    /// Span batches in flight to the collector at once (one connection each). Default 2.
    pub export_concurrency: usize,
}

/// GPU monitoring (`[gpu]`).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuConfig {
    pub enabled: bool,
    /// Sampling interval, [`MIN_GPU_INTERVAL`] to [`MAX_GPU_INTERVAL`].
    pub interval: Duration,
    /// NVML library path; `None`: `libnvidia-ml.so.1` from the loader's path.
    pub nvml_library: Option<PathBuf>,
    /// The kubelet's pod-resources socket (which pod holds each GPU); `None`: off
    /// (`pod_resources_socket = ""`). Default [`DEFAULT_POD_RESOURCES_SOCKET`].
    pub pod_resources_socket: Option<PathBuf>,
}

pub const DEFAULT_GPU_INTERVAL: Duration = Duration::from_secs(1);
pub const MIN_GPU_INTERVAL: Duration = Duration::from_millis(100);
pub const MAX_GPU_INTERVAL: Duration = Duration::from_secs(60);

/// Kernel TCP measurements through eBPF (`[net]`).
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// Load the probes (default true; without permission they are off and the status says why).
    pub enabled: bool,
    /// Which program types to attach (`[net] programs`, default auto).
    pub programs: NetPrograms,
}

/// The program types the probes may attach as (`[net] programs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NetPrograms {
    /// BTF tracepoints (`tp_btf`), and for each one the kernel refuses, the classic
    /// tracepoint (needs tracefs mounted).
    #[default]
    Auto,
    /// BTF tracepoints only.
    TpBtf,
    /// Classic tracepoints only (kernels whose BTF tracepoints misbehave).
    Tracepoint,
}

/// Where the control API listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlListen {
    /// A unix socket (`unix:/path`), created owner-only (mode 0600).
    Unix(PathBuf),
    /// A TCP address (`IP:port`).
    Tcp(SocketAddr),
}

impl ControlListen {
    /// Parses `unix:/path` or `IP:port`.
    ///
    /// # Errors
    /// A reason, for the caller to name the field and value.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.trim().is_empty() {
                return Err("empty socket path".to_owned());
            }
            return Ok(ControlListen::Unix(PathBuf::from(path)));
        }
        text.parse::<SocketAddr>()
            .map(ControlListen::Tcp)
            .map_err(|e| format!("expected unix:/path or IP:port ({e})"))
    }

    /// A unix socket or a loopback address (no token needed).
    pub fn is_local(&self) -> bool {
        match self {
            ControlListen::Unix(_) => true,
            ControlListen::Tcp(a) => a.ip().is_loopback(),
        }
    }
}

impl fmt::Display for ControlListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlListen::Unix(p) => write!(f, "unix:{}", p.display()),
            ControlListen::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// The default control socket, the same for the agent and `lmperf ctl`:
/// `$XDG_RUNTIME_DIR/lmperf/control.sock`, else `/run/lmperf/control.sock` for root, else
/// `/tmp/lmperf-<uid>/control.sock`.
pub fn default_control_socket(env: &dyn Env) -> PathBuf {
    if let Some(dir) = env.var("XDG_RUNTIME_DIR") {
        return PathBuf::from(dir).join("lmperf/control.sock");
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        PathBuf::from("/run/lmperf/control.sock")
    } else {
        PathBuf::from(format!("/tmp/lmperf-{uid}/control.sock"))
    }
}

/// Hard caps of load injected through the control API; a request beyond one is refused.
#[derive(Debug, Clone, PartialEq)]
pub struct InjectCaps {
    /// `control.max_inject_rate`, requests per second.
    pub max_rate_per_second: f64,
    /// `control.max_inject_duration`.
    pub max_duration: Duration,
    /// `control.max_inject_concurrency`, requests in flight.
    pub max_concurrency: u32,
    /// `control.max_inject_requests`, requests per load.
    pub max_requests: u64,
    /// `control.trace_dir`: trace files an `InjectLoad` may replay must lie under it (after
    /// resolving links); `None`: no trace replay, so the API cannot make the agent read files.
    pub trace_dir: Option<PathBuf>,
}

impl Default for InjectCaps {
    fn default() -> Self {
        Self {
            max_rate_per_second: 20.0,
            max_duration: Duration::from_secs(300),
            max_concurrency: 8,
            max_requests: 10_000,
            trace_dir: None,
        }
    }
}

/// The gRPC control API (`[control]`).
#[derive(Debug, Clone, PartialEq)]
pub struct ControlConfig {
    pub enabled: bool,
    pub listen: ControlListen,
    /// Required on every call when set (`authorization: Bearer …`); required for a
    /// non-loopback `listen`.
    pub token: Option<Secret>,
    /// Measured requests kept for `ListRecentRequests`.
    pub recent_requests: usize,
    pub caps: InjectCaps,
}

pub const DEFAULT_CONTROL_TOKEN_ENV: &str = "LMPERF_CONTROL_TOKEN";
pub const DEFAULT_RECENT_REQUESTS: usize = 256;

/// The whole validated agent configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub targets: Vec<TargetConfig>,
    pub admin_addr: SocketAddr,
    pub shutdown_timeout: Duration,
    pub console: bool,
    pub otlp: OtlpConfig,
    pub gpu: GpuConfig,
    pub net: NetConfig,
    pub control: ControlConfig,
    /// `[discovery]`; its targets join the static ones at run time.
    pub discovery: discovery::DiscoveryConfig,
}

/// What the command line sets (see `cli.rs`); `None` leaves the file's or default value.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub targets: Vec<String>,
    pub canary: RawCanary,
    pub admin_addr: Option<String>,
    pub console: bool,
    pub otlp_endpoint: Option<String>,
    pub otlp_protocol: Option<String>,
    pub no_otlp: bool,
}

/// Reads the environment; a seam so tests need not touch the process environment.
pub trait Env {
    fn var(&self, key: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok().filter(|v| !v.is_empty())
    }
}

pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:9464";
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_TOKENS: u32 = 32;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4;
/// The default cap of one SSE event (the measurer's, [`crate::measure::DEFAULT_MAX_EVENT_BYTES`]).
pub use crate::measure::DEFAULT_MAX_EVENT_BYTES;
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_API_KEY_ENV: &str = "LMPERF_API_KEY";

/// Loads the file named in `overrides` (if any), merges the command line and environment, and
/// validates.
///
/// # Errors
/// [`ConfigError`] naming the first bad field and its value.
pub fn load(overrides: Overrides, env: &dyn Env) -> Result<AgentConfig, ConfigError> {
    let raw = match &overrides.config {
        Some(path) => parse_file(path)?,
        None => RawConfig::default(),
    };
    validate(raw, overrides, env)
}

/// Unknown keys reported at most in one error.
const MAX_UNKNOWN_REPORTED: usize = 16;

/// Parses TOML text; `path` only names it in errors. Every unknown key is reported, in file
/// order (the first in `line` and `text`, each in `message`); another error ends the search.
pub fn parse_str(path: &Path, text: &str) -> Result<RawConfig, ConfigError> {
    let mut work = text.to_owned();
    let mut found: Vec<(usize, String, String)> = Vec::new();
    while found.len() < MAX_UNKNOWN_REPORTED {
        let e = match toml::from_str::<RawConfig>(&work) {
            Ok(raw) if found.is_empty() => return Ok(raw),
            Ok(_) => break,
            Err(e) => e,
        };
        let (line, line_text) = match e.span() {
            Some(span) => {
                let line = work[..span.start.min(work.len())].matches('\n').count() + 1;
                (
                    line,
                    text.lines().nth(line - 1).unwrap_or("").trim().to_owned(),
                )
            }
            None => (0, String::new()),
        };
        let message = in_section(text, line, &e.message().replace('\n', " "));
        let unknown = line > 0 && message.starts_with("unknown field");
        found.push((line, line_text, message));
        if !unknown {
            break;
        }
        // That line left out (its lines kept, so the next error's line is the file's).
        work = work
            .split('\n')
            .enumerate()
            .map(|(i, l)| if i + 1 == line { "" } else { l })
            .collect::<Vec<_>>()
            .join("\n");
    }
    found.sort_by_key(|f| f.0);
    let message = match found.as_slice() {
        [(_, _, m)] => m.clone(),
        all => all
            .iter()
            .map(|(l, _, m)| format!("line {l}: {m}"))
            .collect::<Vec<_>>()
            .join("; "),
    };
    let (line, text) = found
        .into_iter()
        .next()
        .map(|(l, t, _)| (l, t))
        .unwrap_or_default();
    Err(ConfigError::Parse {
        path: path.to_owned(),
        line,
        text,
        message,
    })
}

/// An unknown-key `message` at `line` of `text`, named by the table it was written in
/// (`canary.spike_jump_min_shar`), listing only that table's keys (`[canary]` takes no `url`
/// nor `name`: those belong in `[[target]]`).
fn in_section(text: &str, line: usize, message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_owned();
    };
    let section = text
        .lines()
        .take(line.saturating_sub(1))
        .filter_map(|l| {
            l.trim().strip_prefix('[').map(|h| {
                h.trim_start_matches('[')
                    .trim_end_matches(']')
                    .trim()
                    .to_owned()
            })
        })
        .last();
    let Some(section) = section else {
        return message.to_owned();
    };
    let mut m = format!("unknown field `{section}.{rest}");
    if section == "canary" {
        m = m.replace("`url`, ", "").replace("`name`, ", "");
    }
    m
}

fn parse_file(path: &Path) -> Result<RawConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_str(path, &text)
}

fn validate(mut raw: RawConfig, o: Overrides, env: &dyn Env) -> Result<AgentConfig, ConfigError> {
    if let Some(url) = &raw.canary.url {
        return Err(ConfigError::invalid(
            "canary.url",
            url,
            "a URL belongs in a [[target]] table",
        ));
    }
    if let Some(name) = &raw.canary.name {
        return Err(ConfigError::invalid(
            "canary.name",
            name,
            "a name belongs in a [[target]] table",
        ));
    }
    // A bad sampling value written in [canary] is named there, not in the target inheriting it.
    validate_sampling("canary", &raw.canary)?;
    // Command-line canary settings win over the file; a schedule given on the command line
    // replaces the file's (interval and rate exclude each other).
    let cli = o.canary;
    if cli.interval.is_some() || cli.rate.is_some() {
        for t in raw
            .targets
            .iter_mut()
            .chain(std::iter::once(&mut raw.canary))
        {
            t.interval = None;
            t.rate = None;
        }
    }
    let raw_targets: Vec<(String, RawCanary)> = if o.targets.is_empty() {
        raw.targets
            .into_iter()
            .enumerate()
            .map(|(i, t)| (format!("target[{i}]"), t))
            .collect()
    } else {
        o.targets
            .iter()
            .enumerate()
            .map(|(i, url)| {
                (
                    format!("--target[{i}]"),
                    RawCanary {
                        url: Some(url.clone()),
                        ..RawCanary::default()
                    },
                )
            })
            .collect()
    };
    let discovery = discovery::validate(
        std::mem::take(&mut raw.discovery),
        discovery::TargetTemplate::new(cli.clone().or(&raw.canary), env)?,
        env,
    )?;
    if raw_targets.is_empty() && !discovery.enabled() {
        return Err(ConfigError::invalid(
            "--target",
            "",
            "no target: give --target URL or a [[target]] table",
        ));
    }
    if raw.canary.k8s.is_some() {
        return Err(ConfigError::invalid(
            "canary.k8s",
            "[canary.k8s]",
            "a pod serves one target: set [target.k8s] in that [[target]]",
        ));
    }
    let mut targets = Vec::with_capacity(raw_targets.len());
    for (field, t) in raw_targets {
        let merged = cli.clone().or(&t.or(&raw.canary));
        targets.push(validate_target(&field, merged, env)?);
    }
    let mut names: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(ConfigError::invalid(
            "target.name",
            w[0],
            "two targets have the same name",
        ));
    }

    let admin = o
        .admin_addr
        .or(raw.admin_addr)
        .unwrap_or_else(|| DEFAULT_ADMIN_ADDR.to_owned());
    let admin_addr = admin.parse::<SocketAddr>().map_err(|e| {
        ConfigError::invalid(
            "admin_addr",
            &admin,
            format!("not an IP:port address ({e})"),
        )
    })?;
    let shutdown_timeout = raw.shutdown_timeout.unwrap_or(DEFAULT_SHUTDOWN_TIMEOUT);
    if shutdown_timeout > Duration::from_secs(8) {
        return Err(ConfigError::invalid(
            "shutdown_timeout",
            humantime::format_duration(shutdown_timeout),
            "at most 8s, so the agent flushes and exits within 10 s of SIGTERM",
        ));
    }
    let otlp = validate_otlp(raw.otlp, o.otlp_endpoint, o.otlp_protocol, o.no_otlp, env)?;
    let gpu = validate_gpu(raw.gpu)?;
    let programs = match raw.net.programs.as_deref() {
        None | Some("auto") => NetPrograms::Auto,
        Some("tp_btf") => NetPrograms::TpBtf,
        Some("tracepoint") => NetPrograms::Tracepoint,
        Some(other) => {
            return Err(ConfigError::invalid(
                "net.programs",
                other,
                "one of auto, tp_btf, tracepoint",
            ));
        }
    };
    let net = NetConfig {
        enabled: raw.net.enabled.unwrap_or(true),
        programs,
    };
    let control = validate_control(raw.control, env)?;
    Ok(AgentConfig {
        targets,
        admin_addr,
        shutdown_timeout,
        console: o.console || raw.console.unwrap_or(false),
        otlp,
        gpu,
        net,
        control,
        discovery,
    })
}

fn validate_control(raw: raw::RawControl, env: &dyn Env) -> Result<ControlConfig, ConfigError> {
    let listen = match &raw.listen {
        Some(text) => ControlListen::parse(text)
            .map_err(|why| ConfigError::invalid("control.listen", text, why))?,
        None => ControlListen::Unix(default_control_socket(env)),
    };
    let token = match (&raw.token_file, &raw.token_env) {
        (Some(f), Some(_)) => {
            return Err(ConfigError::invalid(
                "control.token_env",
                f,
                "token_file and token_env exclude each other",
            ));
        }
        (Some(path), None) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConfigError::invalid("control.token_file", path, format!("cannot read: {e}"))
            })?;
            let t = text.trim();
            if t.is_empty() {
                return Err(ConfigError::invalid(
                    "control.token_file",
                    path,
                    "file is empty",
                ));
            }
            Some(Secret(t.to_owned()))
        }
        (None, Some(var)) => match env.var(var) {
            Some(v) if !v.trim().is_empty() => Some(Secret(v.trim().to_owned())),
            _ => {
                return Err(ConfigError::invalid(
                    "control.token_env",
                    var,
                    "environment variable is not set",
                ));
            }
        },
        (None, None) => env
            .var(DEFAULT_CONTROL_TOKEN_ENV)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .map(Secret),
    };
    let enabled = raw.enabled.unwrap_or(true);
    if enabled && token.is_none() && !listen.is_local() {
        return Err(ConfigError::invalid(
            "control.listen",
            &listen,
            format!(
                "a non-loopback address needs a token (control.token_file, or the {DEFAULT_CONTROL_TOKEN_ENV} environment variable)"
            ),
        ));
    }
    if let Some(t) = &token
        && t.0.bytes().any(|b| !(0x21..0x7f).contains(&b))
    {
        return Err(ConfigError::invalid(
            "control.token",
            "***",
            "printable ASCII without spaces (it goes in a header)",
        ));
    }
    let d = InjectCaps::default();
    let max_rate_per_second = raw.max_inject_rate.unwrap_or(d.max_rate_per_second);
    if !(max_rate_per_second.is_finite()
        && max_rate_per_second > 0.0
        && max_rate_per_second <= 1000.0)
    {
        return Err(ConfigError::invalid(
            "control.max_inject_rate",
            max_rate_per_second,
            "requests per second in (0, 1000]",
        ));
    }
    let max_duration = raw.max_inject_duration.unwrap_or(d.max_duration);
    if !(Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&max_duration) {
        return Err(ConfigError::invalid(
            "control.max_inject_duration",
            humantime::format_duration(max_duration),
            "between 1s and 24h",
        ));
    }
    let max_concurrency = raw.max_inject_concurrency.unwrap_or(d.max_concurrency);
    if !(1..=1024).contains(&max_concurrency) {
        return Err(ConfigError::invalid(
            "control.max_inject_concurrency",
            max_concurrency,
            "between 1 and 1024",
        ));
    }
    let max_requests = raw.max_inject_requests.unwrap_or(d.max_requests);
    if !(1..=1_000_000).contains(&max_requests) {
        return Err(ConfigError::invalid(
            "control.max_inject_requests",
            max_requests,
            "between 1 and 1000000",
        ));
    }
    let trace_dir = match &raw.trace_dir {
        Some(d) if !Path::new(d).is_absolute() => {
            return Err(ConfigError::invalid(
                "control.trace_dir",
                d,
                "an absolute path",
            ));
        }
        Some(d) if !Path::new(d).is_dir() => {
            return Err(ConfigError::invalid(
                "control.trace_dir",
                d,
                "not a directory",
            ));
        }
        d => d.as_ref().map(PathBuf::from),
    };
    let recent_requests = raw.recent_requests.unwrap_or(DEFAULT_RECENT_REQUESTS);
    if recent_requests > 100_000 {
        return Err(ConfigError::invalid(
            "control.recent_requests",
            recent_requests,
            "at most 100000",
        ));
    }
    Ok(ControlConfig {
        enabled,
        listen,
        token,
        recent_requests,
        caps: InjectCaps {
            max_rate_per_second,
            max_duration,
            max_concurrency,
            max_requests,
            trace_dir,
        },
    })
}

fn validate_gpu(raw: raw::RawGpu) -> Result<GpuConfig, ConfigError> {
    let interval = raw.interval.unwrap_or(DEFAULT_GPU_INTERVAL);
    if !(MIN_GPU_INTERVAL..=MAX_GPU_INTERVAL).contains(&interval) {
        return Err(ConfigError::invalid(
            "gpu.interval",
            humantime::format_duration(interval),
            "between 100ms and 60s",
        ));
    }
    let nvml_library = match raw.nvml_library {
        Some(p) if p.trim().is_empty() => {
            return Err(ConfigError::invalid("gpu.nvml_library", p, "empty path"));
        }
        p => p.map(PathBuf::from),
    };
    let pod_resources_socket = match raw.pod_resources_socket {
        None => Some(PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET)),
        Some(p) if p.is_empty() => None,
        Some(p) if p.trim().is_empty() || !p.starts_with('/') => {
            return Err(ConfigError::invalid(
                "gpu.pod_resources_socket",
                p,
                "an absolute path, or \"\" for off",
            ));
        }
        Some(p) => Some(PathBuf::from(p)),
    };
    Ok(GpuConfig {
        enabled: raw.enabled.unwrap_or(true),
        interval,
        nvml_library,
        pod_resources_socket,
    })
}

fn validate_target(field: &str, t: RawCanary, env: &dyn Env) -> Result<TargetConfig, ConfigError> {
    let url_text = t
        .url
        .clone()
        .ok_or_else(|| ConfigError::invalid(format!("{field}.url"), "", "missing"))?;
    let base_url = Url::parse(&url_text)
        .map_err(|e| ConfigError::invalid(format!("{field}.url"), &url_text, e.to_string()))?;
    if !matches!(base_url.scheme(), "http" | "https") {
        return Err(ConfigError::invalid(
            format!("{field}.url"),
            &url_text,
            "scheme must be http or https",
        ));
    }
    let host = base_url
        .host_str()
        .ok_or_else(|| ConfigError::invalid(format!("{field}.url"), &url_text, "no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = base_url
        .port_or_known_default()
        .ok_or_else(|| ConfigError::invalid(format!("{field}.url"), &url_text, "no port"))?;
    // Accept "http://h:p", "http://h:p/" and "http://h:p/v1": API paths are joined below.
    let base_url = direct_paths::base_url(base_url);

    let (api, kind) = api_and_kind(field, &t)?;
    let schedule = match (t.interval, t.rate) {
        (Some(_), Some(r)) => {
            return Err(ConfigError::invalid(
                format!("{field}.rate"),
                r,
                "interval and rate exclude each other",
            ));
        }
        (Some(period), None) => {
            if period < Duration::from_millis(10) {
                return Err(ConfigError::invalid(
                    format!("{field}.interval"),
                    humantime::format_duration(period),
                    "at least 10ms",
                ));
            }
            if t.arrival.is_some() {
                return Err(ConfigError::invalid(
                    format!("{field}.arrival"),
                    t.arrival.unwrap_or_default(),
                    "arrival needs rate",
                ));
            }
            Schedule::Interval { period }
        }
        (None, Some(per_second)) => {
            if !(per_second.is_finite() && per_second > 0.0 && per_second <= 1000.0) {
                return Err(ConfigError::invalid(
                    format!("{field}.rate"),
                    per_second,
                    "requests per second in (0, 1000]",
                ));
            }
            let arrival = match t.arrival.as_deref() {
                None | Some("poisson") => Arrival::Poisson,
                Some("constant") => Arrival::Constant,
                Some(other) => {
                    return Err(ConfigError::invalid(
                        format!("{field}.arrival"),
                        other,
                        "expected poisson or constant",
                    ));
                }
            };
            Schedule::Rate {
                per_second,
                arrival,
            }
        }
        (None, None) => {
            if let Some(a) = &t.arrival {
                return Err(ConfigError::invalid(
                    format!("{field}.arrival"),
                    a,
                    "arrival needs rate",
                ));
            }
            Schedule::Interval {
                period: DEFAULT_INTERVAL,
            }
        }
    };
    let max_tokens = t.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens == 0 || max_tokens > 4096 {
        return Err(ConfigError::invalid(
            format!("{field}.max_tokens"),
            max_tokens,
            "between 1 and 4096",
        ));
    }
    let timeout = t.timeout.unwrap_or(DEFAULT_TIMEOUT);
    if timeout.is_zero() {
        return Err(ConfigError::invalid(
            format!("{field}.timeout"),
            "0s",
            "must be positive",
        ));
    }
    let max_in_flight = t.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT);
    if max_in_flight == 0 {
        return Err(ConfigError::invalid(
            format!("{field}.max_in_flight"),
            0,
            "at least 1",
        ));
    }
    let max_event_bytes = t.max_event_bytes.unwrap_or(DEFAULT_MAX_EVENT_BYTES);
    if max_event_bytes < 1024 {
        return Err(ConfigError::invalid(
            format!("{field}.max_event_bytes"),
            max_event_bytes,
            "at least 1024",
        ));
    }
    if let Some(m) = &t.model
        && m.trim().is_empty()
    {
        return Err(ConfigError::invalid(
            format!("{field}.model"),
            m,
            "empty model name",
        ));
    }
    let mut sampling = validate_sampling(field, &t)?;
    sampling.spike_min_requests = effective_spike_min(field, &sampling, &schedule);
    let api_key = read_api_key(field, &t, env)?;
    let name = t.name.clone().unwrap_or_else(|| format!("{host}:{port}"));
    let server = scrape::validate(field, &t, &base_url)?;
    let worker_probes = worker_probes::validate(field, &t)?;
    let direct = direct_paths::validate(field, &t)?;
    Ok(TargetConfig {
        name,
        base_url,
        host,
        port,
        model: t.model,
        api,
        schedule,
        max_tokens,
        timeout,
        connect_timeout: t.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        max_in_flight,
        max_event_bytes,
        api_key,
        provider: t.provider,
        sampling,
        server,
        k8s: t.k8s.map(|k| validate_k8s(field, k)).transpose()?,
        profiling: (t.profiling)
            .map(|p| profiling::validate(&format!("{field}.profiling"), p))
            .transpose()?,
        kind,
        worker_probes,
        direct,
    })
}

/// `api` (chat | completions) and `kind` (server | router) of a target.
fn api_and_kind(field: &str, t: &RawCanary) -> Result<(Api, TargetKind), ConfigError> {
    let api = match t.api.as_deref() {
        None | Some("chat") => Api::Chat,
        Some("completions") => Api::Completions,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{field}.api"),
                other,
                "expected chat or completions",
            ));
        }
    };
    let kind = match t.kind.as_deref() {
        None | Some("server") => TargetKind::Server,
        Some("router") => TargetKind::Router,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{field}.kind"),
                other,
                "server or router",
            ));
        }
    };
    Ok((api, kind))
}

/// `[target.k8s]`: namespace and pod required, Kubernetes name syntax (a namespace and a
/// container are DNS labels, a pod a DNS subdomain).
fn validate_k8s(field: &str, k: raw::RawK8s) -> Result<k8s::K8sIdentity, ConfigError> {
    fn name(
        field: &str,
        key: &str,
        value: Option<String>,
        max: usize,
        dots: bool,
    ) -> Result<String, ConfigError> {
        let f = format!("{field}.k8s.{key}");
        let v = value.ok_or_else(|| ConfigError::invalid(&f, "", "missing"))?;
        let ok_char = |c: char| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.')
        };
        let edge =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if v.is_empty()
            || v.len() > max
            || !v.chars().all(ok_char)
            || !edge(v.chars().next())
            || !edge(v.chars().last())
        {
            return Err(ConfigError::invalid(
                &f,
                &v,
                format!(
                    "a Kubernetes name: at most {max} lowercase letters, digits{} and '-', starting and ending with a letter or digit",
                    if dots { ", '.'" } else { "" }
                ),
            ));
        }
        Ok(v)
    }
    let namespace = name(field, "namespace", k.namespace, 63, false)?;
    let pod_name = name(field, "pod", k.pod, 253, true)?;
    let container_name = match k.container {
        Some(c) => Some(name(field, "container", Some(c), 63, false)?),
        None => None,
    };
    let pod_uid = match k.uid {
        Some(u) if !k8s::is_uid(&u) => {
            return Err(ConfigError::invalid(
                format!("{field}.k8s.uid"),
                u,
                "a UUID as in the pod's metadata.uid (8-4-4-4-12 hex digits, e.g. 0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1a)",
            ));
        }
        u => u.unwrap_or_default(),
    };
    Ok(k8s::K8sIdentity {
        namespace,
        pod_name,
        pod_uid,
        container_name,
        owner: None,
        inference_pool: None,
    })
}

fn validate_sampling(field: &str, t: &RawCanary) -> Result<SamplingPolicy, ConfigError> {
    let d = SamplingPolicy::default();
    let unit =
        |name: &str, v: Option<f64>, default: f64, zero_ok: bool| -> Result<f64, ConfigError> {
            let v = v.unwrap_or(default);
            let ok = v.is_finite() && v <= 1.0 && (v > 0.0 || (zero_ok && v == 0.0));
            if ok {
                Ok(v)
            } else {
                Err(ConfigError::invalid(
                    format!("{field}.{name}"),
                    v,
                    "a share in [0, 1]",
                ))
            }
        };
    let base_ratio = unit("sampling_ratio", t.sampling_ratio, d.base_ratio, true)?;
    let spike_error_rate = unit(
        "spike_error_rate",
        t.spike_error_rate,
        d.spike_error_rate,
        false,
    )?;
    let max_base_per_second = t.sampling_max_per_second.unwrap_or(d.max_base_per_second);
    if !(max_base_per_second.is_finite() && max_base_per_second >= 0.0) {
        return Err(ConfigError::invalid(
            format!("{field}.sampling_max_per_second"),
            max_base_per_second,
            "spans per second, 0 or more",
        ));
    }
    let spike_window = t.spike_window.unwrap_or(d.spike_window);
    if spike_window < Duration::from_secs(1) {
        return Err(ConfigError::invalid(
            format!("{field}.spike_window"),
            humantime::format_duration(spike_window),
            "at least 1s",
        ));
    }
    let spike_min_requests = t.spike_min_requests.unwrap_or(d.spike_min_requests);
    if spike_min_requests == 0 {
        return Err(ConfigError::invalid(
            format!("{field}.spike_min_requests"),
            0,
            "at least 1",
        ));
    }
    let spike_jump = validate_spike_jump(field, t)?;
    let min_share_above = unit(
        "spike_jump_min_share",
        t.spike_jump_min_share,
        d.spike_detector.min_share_above,
        true,
    )?;
    Ok(SamplingPolicy {
        base_ratio,
        max_base_per_second,
        slo_ttft: t.slo_ttft,
        slo_e2e: t.slo_e2e,
        spike_window,
        spike_error_rate,
        spike_p99: t.spike_p99.or(t.slo_e2e),
        spike_hold: t.spike_hold.unwrap_or(d.spike_hold),
        spike_min_requests,
        spike_jump,
        spike_detector: crate::diagnosis::detector::DetectorConfig {
            min_share_above,
            ..d.spike_detector
        },
    })
}

/// `spike_min_requests` judged against the canaries `spike_window` holds at the target's rate
/// (see [`crate::sampler::adaptive::effective_min_requests`]); warns when it is lowered, and when
/// the error-rate and SLO rules can never fire.
fn effective_spike_min(field: &str, p: &SamplingPolicy, schedule: &Schedule) -> usize {
    let rate = match *schedule {
        Schedule::Interval { period } => 1.0 / period.as_secs_f64(),
        Schedule::Rate { per_second, .. } => per_second,
    };
    let (min, can_fire) = crate::sampler::adaptive::effective_min_requests(
        p.spike_min_requests,
        p.spike_window,
        rate,
    );
    let window = humantime::format_duration(p.spike_window);
    if !can_fire {
        tracing::warn!(field, spike_window = %window, spike_min_requests = min, rate_per_s = rate, "The spike window cannot hold spike_min_requests canaries at this rate: the error-rate and SLO spike rules can never fire. Lengthen spike_window or raise the canary rate.");
    } else if min < p.spike_min_requests {
        tracing::debug!(field, spike_window = %window, configured = p.spike_min_requests, effective = min, "spike_min_requests lowered to the canaries the spike window holds at this rate.");
    }
    min
}

/// The latency-jump rule of spike mode; `spike_jump_ratio = 0` turns it off.
fn validate_spike_jump(
    field: &str,
    t: &RawCanary,
) -> Result<Option<crate::diagnosis::detector::JumpRule>, ConfigError> {
    let d = crate::sampler::adaptive::DEFAULT_SPIKE_JUMP;
    let ratio = t.spike_jump_ratio.unwrap_or(d.ratio);
    if ratio == 0.0 {
        return Ok(None);
    }
    if !(ratio.is_finite() && ratio > 1.0) {
        return Err(ConfigError::invalid(
            format!("{field}.spike_jump_ratio"),
            ratio,
            "0 (off) or a ratio above 1",
        ));
    }
    let z = t.spike_jump_z.unwrap_or(d.z);
    if !(z.is_finite() && z >= 0.0) {
        return Err(ConfigError::invalid(
            format!("{field}.spike_jump_z"),
            z,
            "a robust z score, 0 or more",
        ));
    }
    let floor = t.spike_jump_floor.map_or(d.floor, |f| f.as_secs_f64());
    Ok(Some(crate::diagnosis::detector::JumpRule {
        ratio,
        z,
        floor,
    }))
}

/// The key comes from a file (`api_key_file`) or an environment variable (`api_key_env`,
/// default `LMPERF_API_KEY`), never from a flag value that `ps` would show.
fn read_api_key(field: &str, t: &RawCanary, env: &dyn Env) -> Result<Option<Secret>, ConfigError> {
    if let Some(path) = &t.api_key_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::invalid(
                format!("{field}.api_key_file"),
                path,
                format!("cannot read: {e}"),
            )
        })?;
        let key = text.trim();
        if key.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.api_key_file"),
                path,
                "file is empty",
            ));
        }
        return Ok(Some(Secret(key.to_owned())));
    }
    let var = t.api_key_env.as_deref().unwrap_or(DEFAULT_API_KEY_ENV);
    match env.var(var) {
        Some(v) => Ok(Some(Secret(v.trim().to_owned()))),
        None if t.api_key_env.is_some() => Err(ConfigError::invalid(
            format!("{field}.api_key_env"),
            var,
            "environment variable is not set",
        )),
        None => Ok(None),
    }
}

fn validate_otlp(
    raw: raw::RawOtlp,
    cli_endpoint: Option<String>,
    cli_protocol: Option<String>,
    no_otlp: bool,
    env: &dyn Env,
) -> Result<OtlpConfig, ConfigError> {
    let sdk_disabled = env
        .var("OTEL_SDK_DISABLED")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let enabled = !no_otlp && raw.enabled.unwrap_or(!sdk_disabled);
    let (proto_field, proto_text) = match (cli_protocol, raw.protocol) {
        (Some(p), _) => ("--otlp-protocol", p),
        (None, Some(p)) => ("otlp.protocol", p),
        (None, None) => match env
            .var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| env.var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        {
            Some(p) => ("OTEL_EXPORTER_OTLP_PROTOCOL", p),
            None => ("otlp.protocol", "http/protobuf".to_owned()),
        },
    };
    let protocol = match proto_text.as_str() {
        "grpc" => OtlpProtocol::Grpc,
        "http/protobuf" => OtlpProtocol::HttpProtobuf,
        other => {
            return Err(ConfigError::invalid(
                proto_field,
                other,
                "expected grpc or http/protobuf",
            ));
        }
    };
    let default_base = match protocol {
        OtlpProtocol::Grpc => "http://localhost:4317",
        OtlpProtocol::HttpProtobuf => "http://localhost:4318",
    };
    let explicit = cli_endpoint
        .map(|e| ("--otlp-endpoint", e))
        .or(raw.endpoint.map(|e| ("otlp.endpoint", e)));
    let base = explicit.clone().or(env
        .var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .map(|e| ("OTEL_EXPORTER_OTLP_ENDPOINT", e)));
    let (base_field, base) = base.unwrap_or(("otlp.endpoint", default_base.to_owned()));
    let parsed =
        Url::parse(&base).map_err(|e| ConfigError::invalid(base_field, &base, e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ConfigError::invalid(
            base_field,
            &base,
            "scheme must be http or https",
        ));
    }
    let signal = |suffix: &str, var: &str| -> String {
        if explicit.is_none()
            && let Some(v) = env.var(var)
        {
            return v;
        }
        match protocol {
            OtlpProtocol::Grpc => base.clone(),
            OtlpProtocol::HttpProtobuf => format!("{}/{suffix}", base.trim_end_matches('/')),
        }
    };
    let traces_endpoint = signal("v1/traces", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let metrics_endpoint = signal("v1/metrics", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
    let env_ms = |var: &str| -> Result<Option<Duration>, ConfigError> {
        match env.var(var) {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(|ms| Some(Duration::from_millis(ms)))
                .map_err(|_| ConfigError::invalid(var, &v, "milliseconds as an integer")),
        }
    };
    let export_interval = match raw.export_interval {
        Some(d) => d,
        None => env_ms("OTEL_METRIC_EXPORT_INTERVAL")?.unwrap_or(Duration::from_secs(60)),
    };
    if export_interval < Duration::from_millis(100) {
        return Err(ConfigError::invalid(
            "otlp.export_interval",
            humantime::format_duration(export_interval),
            "at least 100ms",
        ));
    }
    let export_timeout = match raw.export_timeout {
        Some(d) => d,
        None => env_ms("OTEL_EXPORTER_OTLP_TIMEOUT")?.unwrap_or(Duration::from_secs(10)),
    };
    let queue_size = raw.queue_size.unwrap_or(2048);
    let batch_size = raw.batch_size.unwrap_or(512);
    if queue_size == 0 {
        return Err(ConfigError::invalid(
            "otlp.queue_size",
            queue_size,
            "at least 1",
        ));
    }
    if batch_size == 0 || batch_size > queue_size {
        return Err(ConfigError::invalid(
            "otlp.batch_size",
            batch_size,
            format!("between 1 and queue_size ({queue_size})"),
        ));
    }
    let export_concurrency = raw.export_concurrency.unwrap_or(2);
    if !(1..=16).contains(&export_concurrency) {
        return Err(ConfigError::invalid(
            "otlp.export_concurrency",
            export_concurrency,
            "between 1 and 16",
        ));
    }
    Ok(OtlpConfig {
        enabled,
        protocol,
        traces_endpoint,
        metrics_endpoint,
        export_interval,
        export_timeout,
        queue_size,
        batch_size,
        export_concurrency,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct MapEnv(HashMap<&'static str, &'static str>);
    impl Env for MapEnv {
        fn var(&self, key: &str) -> Option<String> {
            self.0.get(key).map(|v| v.to_string())
        }
    }

    fn from_toml(
        text: &str,
        o: Overrides,
        env: &[(&'static str, &'static str)],
    ) -> Result<AgentConfig, ConfigError> {
        let raw = parse_str(Path::new("t.toml"), text)?;
        validate(raw, o, &MapEnv(env.iter().copied().collect()))
    }

    /// Two unknown keys in two tables: both said, in file order, on one line.
    #[test]
    fn every_unknown_key_is_reported_in_file_order() {
        let text = "[canary]\nintervall = \"5s\"\nmax_tokens = 8\n[[target]]\nurl = \"http://x:1\"\nsampling_rati = 0.5\n";
        let err = from_toml(text, Overrides::default(), &[])
            .unwrap_err()
            .to_string();
        let (a, b) = (
            err.find("line 2: unknown field `canary.intervall`"),
            err.find("line 6: unknown field `target.sampling_rati`"),
        );
        assert!(a.is_some() && b.is_some() && a < b, "{err}");
        assert!(err.contains("line 2 (intervall = \"5s\")"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }

    #[test]
    fn unknown_key_is_rejected_with_line_and_name() {
        let err = from_toml("[canary]\nintervall = \"5s\"\n", Overrides::default(), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("intervall"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }

    #[test]
    fn bad_values_name_field_and_value() {
        let cases = [
            (
                "[[target]]\nurl = \"ftp://x\"\n",
                "target[0].url = \"ftp://x\"",
            ),
            (
                "[[target]]\nurl = \"http://x:1\"\napi = \"embeddings\"\n",
                "target[0].api = \"embeddings\"",
            ),
            (
                "[[target]]\nurl = \"http://x:1\"\nrate = -1.0\n",
                "target[0].rate = \"-1\"",
            ),
            (
                "admin_addr = \"localhost\"\n[[target]]\nurl = \"http://x:1\"\n",
                "admin_addr = \"localhost\"",
            ),
            (
                "[otlp]\nprotocol = \"http/json\"\n[[target]]\nurl = \"http://x:1\"\n",
                "otlp.protocol = \"http/json\"",
            ),
            (
                "[otlp]\nqueue_size = 0\n[[target]]\nurl = \"http://x:1\"\n",
                "otlp.queue_size = \"0\"",
            ),
            (
                "[[target]]\nurl = \"http://x:1\"\narrival = \"poisson\"\n",
                "target[0].arrival = \"poisson\"",
            ),
            (
                "[gpu]\ninterval = \"50ms\"\n[[target]]\nurl = \"http://x:1\"\n",
                "gpu.interval = \"50ms\"",
            ),
            (
                "[gpu]\ninterval = \"2m\"\n[[target]]\nurl = \"http://x:1\"\n",
                "gpu.interval = \"2m\"",
            ),
            (
                "[gpu]\nnvml_library = \" \"\n[[target]]\nurl = \"http://x:1\"\n",
                "gpu.nvml_library = \" \"",
            ),
        ];
        for (text, want) in cases {
            let err = from_toml(text, Overrides::default(), &[])
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(want), "{err} should start with {want}");
        }
        let err = from_toml(
            "[canary]\ninterval = \"5 parsecs\"\n",
            Overrides::default(),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("interval = \"5 parsecs\""), "{err}");
    }

    #[test]
    fn spike_min_requests_is_judged_against_the_window_at_the_canary_rate() {
        let min = |text: &str| {
            from_toml(text, Overrides::default(), &[]).unwrap().targets[0]
                .sampling
                .spike_min_requests
        };
        // Defaults: 30 s window, one canary per 5 s: 6 canaries, not 10.
        assert_eq!(min("[[target]]\nurl = \"http://127.0.0.1:8000\"\n"), 6);
        assert_eq!(
            min("[canary]\nrate = 10.0\n[[target]]\nurl = \"http://127.0.0.1:8000\"\n"),
            10
        );
        // A window of 2 canaries cannot hold 3: kept at 3 (warned: never fires).
        assert_eq!(
            min("[canary]\nspike_window = \"10s\"\n[[target]]\nurl = \"http://127.0.0.1:8000\"\n"),
            3
        );
    }

    #[test]
    fn spike_jump_min_share_is_a_share() {
        let t = "[[target]]\nurl = \"http://127.0.0.1:8000\"\n";
        let share = |text: &str| {
            from_toml(text, Overrides::default(), &[])
                .map(|c| c.targets[0].sampling.spike_detector.min_share_above)
        };
        assert_eq!(share(t).unwrap(), 0.25);
        assert_eq!(
            share(&format!("[canary]\nspike_jump_min_share = 0.5\n{t}")).unwrap(),
            0.5
        );
        let err = share(&format!("[canary]\nspike_jump_min_share = 1.5\n{t}"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "canary.spike_jump_min_share = \"1.5\": a share in [0, 1]"
        );
        // A misspelled key is named with its table, and [canary] lists only its own keys.
        let err = share(&format!("[canary]\nspike_jump_min_shar = 0.5\n{t}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown field `canary.spike_jump_min_shar`, expected one of `model`"),
            "{err}"
        );
        assert!(
            !err.contains("`url`")
                && !err.contains("`name`")
                && err.contains("`spike_jump_min_share`"),
            "{err}"
        );
        let err = share("[[target]]\nurl = \"http://127.0.0.1:8000\"\nsampling_rati = 0.5\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown field `target.sampling_rati`, expected one of `url`, `name`"),
            "{err}"
        );
    }

    #[test]
    fn cli_overrides_file_and_targets_merge_defaults() {
        let text = "[canary]\ninterval = \"2s\"\nmax_tokens = 8\n[[target]]\nurl = \"http://127.0.0.1:8000/v1\"\nmodel = \"a\"\n[[target]]\nurl = \"http://[::1]:9000\"\nname = \"b\"\nmax_tokens = 16\n";
        let c = from_toml(text, Overrides::default(), &[]).unwrap();
        assert_eq!(c.targets[0].base_url.as_str(), "http://127.0.0.1:8000/");
        assert_eq!(c.targets[0].name, "127.0.0.1:8000");
        assert_eq!(c.targets[0].max_tokens, 8);
        assert_eq!(c.targets[1].max_tokens, 16);
        assert_eq!(c.targets[1].host, "::1");
        assert_eq!(
            c.targets[0].schedule,
            Schedule::Interval {
                period: Duration::from_secs(2)
            }
        );
        let o = Overrides {
            canary: RawCanary {
                rate: Some(3.0),
                max_tokens: Some(4),
                ..RawCanary::default()
            },
            ..Overrides::default()
        };
        let c = from_toml(text, o, &[]).unwrap();
        assert_eq!(
            c.targets[1].schedule,
            Schedule::Rate {
                per_second: 3.0,
                arrival: Arrival::Poisson
            }
        );
        assert_eq!(c.targets[1].max_tokens, 4);
        // A target's own rate replaces the default interval.
        let c = from_toml("[canary]\ninterval = \"2s\"\n[[target]]\nurl = \"http://x:1\"\nrate = 4.0\narrival = \"constant\"\n", Overrides::default(), &[]).unwrap();
        assert_eq!(
            c.targets[0].schedule,
            Schedule::Rate {
                per_second: 4.0,
                arrival: Arrival::Constant
            }
        );
    }

    #[test]
    fn otlp_follows_the_environment_spec() {
        let o = || Overrides {
            targets: vec!["http://127.0.0.1:1".into()],
            ..Overrides::default()
        };
        let c = from_toml("", o(), &[]).unwrap();
        assert_eq!(c.otlp.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(c.otlp.traces_endpoint, "http://localhost:4318/v1/traces");
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1500"),
        ];
        let c = from_toml("", o(), &env).unwrap();
        assert_eq!(
            (c.otlp.protocol, c.otlp.traces_endpoint.as_str()),
            (OtlpProtocol::Grpc, "http://collector:4317")
        );
        assert_eq!(c.otlp.export_interval, Duration::from_millis(1500));
        let c = from_toml("", o(), &[("OTEL_SDK_DISABLED", "true")]).unwrap();
        assert!(!c.otlp.enabled);
    }

    #[test]
    fn net_table_default_on_and_strict() {
        let o = || Overrides {
            targets: vec!["http://127.0.0.1:1".into()],
            ..Overrides::default()
        };
        assert_eq!(
            from_toml("", o(), &[]).unwrap().net,
            NetConfig {
                enabled: true,
                programs: NetPrograms::Auto
            }
        );
        assert_eq!(
            from_toml("[net]\nenabled = false\n", o(), &[]).unwrap().net,
            NetConfig {
                enabled: false,
                programs: NetPrograms::Auto
            }
        );
        assert_eq!(
            from_toml("[net]\nprograms = \"tracepoint\"\n", o(), &[])
                .unwrap()
                .net
                .programs,
            NetPrograms::Tracepoint
        );
        let e = from_toml("[net]\nprograms = \"kprobe\"\n", o(), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("net.programs") && e.contains("kprobe"), "{e}");
        let err = from_toml("[net]\nenable = true\n", o(), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("enable"), "{err}");
    }

    #[test]
    fn gpu_table_defaults_and_bounds() {
        let o = || Overrides {
            targets: vec!["http://127.0.0.1:1".into()],
            ..Overrides::default()
        };
        let c = from_toml("", o(), &[]).unwrap();
        assert_eq!(
            c.gpu,
            GpuConfig {
                enabled: true,
                interval: Duration::from_secs(1),
                nvml_library: None,
                pod_resources_socket: Some("/var/lib/kubelet/pod-resources/kubelet.sock".into()),
            }
        );
        let c = from_toml("[gpu]\nenabled = false\ninterval = \"100ms\"\nnvml_library = \"/x/libnvidia-ml.so.1\"\n", o(), &[]).unwrap();
        assert_eq!(
            c.gpu,
            GpuConfig {
                enabled: false,
                interval: Duration::from_millis(100),
                nvml_library: Some("/x/libnvidia-ml.so.1".into()),
                pod_resources_socket: Some("/var/lib/kubelet/pod-resources/kubelet.sock".into()),
            }
        );
        let err = from_toml("[gpu]\nintervall = \"1s\"\n", o(), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("intervall"), "{err}");
    }

    #[test]
    fn pod_resources_socket_and_target_pod() {
        let o = || Overrides {
            targets: vec!["http://127.0.0.1:1".into()],
            ..Overrides::default()
        };
        let gpu = |text: &str| from_toml(text, o(), &[]).map(|c| c.gpu.pod_resources_socket);
        assert_eq!(gpu("[gpu]\npod_resources_socket = \"\"\n").unwrap(), None);
        assert_eq!(
            gpu("[gpu]\npod_resources_socket = \"/run/k/kubelet.sock\"\n").unwrap(),
            Some("/run/k/kubelet.sock".into())
        );
        let err = gpu("[gpu]\npod_resources_socket = \"kubelet.sock\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("gpu.pod_resources_socket = \"kubelet.sock\""),
            "{err}"
        );

        let target = |k8s: &str| {
            from_toml(
                &format!("[[target]]\nurl = \"http://x:1\"\n[target.k8s]\n{k8s}"),
                Overrides::default(),
                &[],
            )
            .map(|c| c.targets[0].k8s.clone())
        };
        assert_eq!(
            target(
                "namespace = \"ml\"\npod = \"vllm-0.a\"\ncontainer = \"vllm\"\nuid = \"0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1a\"\n"
            )
            .unwrap(),
            Some(k8s::K8sIdentity {
                namespace: "ml".into(),
                pod_name: "vllm-0.a".into(),
                pod_uid: "0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1a".into(),
                container_name: Some("vllm".into()),
                owner: None,
                inference_pool: None,
            })
        );
        let id = target("namespace = \"ml\"\npod = \"p\"\n")
            .unwrap()
            .unwrap();
        assert_eq!((id.container_name, id.pod_uid.as_str()), (None, ""));
        assert_eq!(
            from_toml(
                "[[target]]\nurl = \"http://x:1\"\n",
                Overrides::default(),
                &[]
            )
            .unwrap()
            .targets[0]
                .k8s,
            None
        );
        let cases = [
            ("pod = \"p\"\n", "target[0].k8s.namespace = \"\": missing"),
            ("namespace = \"ml\"\n", "target[0].k8s.pod = \"\": missing"),
            (
                "namespace = \"ML\"\npod = \"p\"\n",
                "target[0].k8s.namespace = \"ML\"",
            ),
            (
                "namespace = \"ml\"\npod = \"p-\"\n",
                "target[0].k8s.pod = \"p-\"",
            ),
            (
                "namespace = \"ml\"\npod = \"p\"\ncontainer = \"a.b\"\n",
                "target[0].k8s.container = \"a.b\"",
            ),
            (
                "namespace = \"ml\"\npod = \"p\"\nuid = \" \"\n",
                "target[0].k8s.uid = \" \": a UUID",
            ),
            (
                "namespace = \"ml\"\npod = \"p\"\nuid = \"0b7c\"\n",
                "target[0].k8s.uid = \"0b7c\": a UUID",
            ),
            (
                "namespace = \"ml\"\npod = \"p\"\nuid = \"0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1g\"\n",
                "target[0].k8s.uid = \"0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1g\": a UUID",
            ),
        ];
        for (k8s, want) in cases {
            let err = target(k8s).unwrap_err().to_string();
            assert!(err.starts_with(want), "{err} should start with {want}");
        }
        let err = target("namespace = \"ml\"\npods = \"p\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("pods"), "{err}");
        let err = from_toml(
            "[canary.k8s]\nnamespace = \"ml\"\npod = \"p\"\n[[target]]\nurl = \"http://x:1\"\n",
            Overrides::default(),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("canary.k8s"), "{err}");
    }

    #[test]
    fn control_defaults_local_and_token_for_non_loopback() {
        let o = || Overrides {
            targets: vec!["http://127.0.0.1:1".into()],
            ..Overrides::default()
        };
        let c = from_toml("", o(), &[("XDG_RUNTIME_DIR", "/run/user/7")])
            .unwrap()
            .control;
        assert_eq!(
            c.listen,
            ControlListen::Unix("/run/user/7/lmperf/control.sock".into())
        );
        assert!(c.enabled && c.token.is_none());
        assert_eq!(
            (c.recent_requests, c.caps),
            (DEFAULT_RECENT_REQUESTS, InjectCaps::default())
        );
        let c = from_toml(
            "[control]\nlisten = \"127.0.0.1:5000\"\nmax_inject_rate = 5.0\n",
            o(),
            &[],
        )
        .unwrap()
        .control;
        assert_eq!(
            (c.listen.to_string().as_str(), c.caps.max_rate_per_second),
            ("127.0.0.1:5000", 5.0)
        );
        let err = from_toml("[control]\nlisten = \"0.0.0.0:5000\"\n", o(), &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "control.listen = \"0.0.0.0:5000\": a non-loopback address needs a token"
            ),
            "{err}"
        );
        let c = from_toml(
            "[control]\nlisten = \"0.0.0.0:5000\"\n",
            o(),
            &[("LMPERF_CONTROL_TOKEN", "tok-1")],
        )
        .unwrap()
        .control;
        assert_eq!(c.token.as_ref().map(Secret::expose), Some("tok-1"));
        assert!(!format!("{c:?}").contains("tok-1"));
        // Disabled, a non-loopback address is not an error.
        assert!(
            !from_toml(
                "[control]\nenabled = false\nlisten = \"0.0.0.0:5000\"\n",
                o(),
                &[]
            )
            .unwrap()
            .control
            .enabled
        );
        for (text, want) in [
            (
                "[control]\nlisten = \"unix:\"\n",
                "control.listen = \"unix:\"",
            ),
            (
                "[control]\nlisten = \"localhost\"\n",
                "control.listen = \"localhost\"",
            ),
            (
                "[control]\nmax_inject_rate = 0.0\n",
                "control.max_inject_rate = \"0\"",
            ),
            (
                "[control]\nmax_inject_concurrency = 0\n",
                "control.max_inject_concurrency = \"0\"",
            ),
            (
                "[control]\ntoken_env = \"NOPE_TOKEN\"\n",
                "control.token_env = \"NOPE_TOKEN\"",
            ),
            (
                "[control]\nlisten_addr = \"x\"\n",
                "config file t.toml line 2",
            ),
        ] {
            let err = from_toml(text, o(), &[]).unwrap_err().to_string();
            assert!(err.starts_with(want), "{err} should start with {want}");
        }
    }

    #[test]
    fn api_key_from_env_or_file_never_debug_printed() {
        let o = Overrides {
            targets: vec!["http://127.0.0.1:1".into()],
            ..Overrides::default()
        };
        let c = from_toml("", o.clone(), &[("LMPERF_API_KEY", "sk-secret-1")]).unwrap();
        assert_eq!(
            c.targets[0].api_key.as_ref().map(Secret::expose),
            Some("sk-secret-1")
        );
        assert!(!format!("{c:?}").contains("sk-secret-1"));
        let err = from_toml("[canary]\napi_key_env = \"NOPE\"\n", o, &[])
            .unwrap_err()
            .to_string();
        // The [canary] defaults are validated once as the template of every target (static
        // and discovered), so the error names the section the key is written in.
        assert!(err.starts_with("canary.api_key_env = \"NOPE\""), "{err}");
    }
}
