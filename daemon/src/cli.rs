//! The command line. Flags stay close to what the user typed; [`crate::config::load`] does
//! the validation.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod analyze;
mod ctl;
pub mod traffic;
pub mod workload;

pub use analyze::{AnalyzeArgs, Format};

use crate::config::Overrides;
use crate::config::raw::RawCanary;

#[derive(Debug, Parser)]
#[command(
    name = "lmperf",
    version,
    about = "LLM inference canary agent and benchmark: TTFT, ITL, TPOT, E2E as GenAI spans and metrics over OTLP"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines on stderr: text, or json (one object per line with timestamp, level,
    /// message, fields, and trace_id/span_id on lines about a request or a diagnosis).
    /// Default: the config file's log_format, else LMPERF_LOG_FORMAT, else text.
    #[arg(long, global = true, value_name = "FORMAT", value_parser = crate::config::log_format::LOG_FORMATS)]
    pub log_format: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent: continuous canary requests to the targets, exported over OTLP.
    Agent(AgentArgs),
    /// Run one-shot benchmarks (one per concurrency × input length) and write
    /// requests.jsonl and summary.json to --output-dir.
    Run(RunArgs),
    /// Talk to a running agent's control API (gRPC): status, recent requests, inject load.
    Ctl(CtlArgs),
    /// Compare two `lmperf run` output directories: deltas with bootstrap intervals and
    /// Mann-Whitney U p-values; writes compare.json and compare.html.
    Compare(CompareArgs),
    /// Root-cause diagnosis offline: the diagnosis engine over a run's requests.jsonl, or a
    /// live agent's diagnosis; prints the scorecard (text, JSON or scorecard.html).
    Analyze(AnalyzeArgs),
}

/// `lmperf ctl` flags. Exit codes: 0 done, 1 agent unreachable or failed, 2 bad command
/// line, 3 refused by the agent.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The agent's control address: unix:/path or IP:port (default: the agent's default socket).
    #[arg(long, value_name = "ADDR", global = true)]
    pub addr: Option<String>,
    /// File that holds the control token (default: the LMPERF_CONTROL_TOKEN environment variable).
    #[arg(long, value_name = "FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// Print the reply as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// The calls of `lmperf ctl`.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Targets, exporter queue, GPU and probe state, the injected load.
    Status,
    /// The root-cause diagnosis of each target: state, onset, causes ranked by score with
    /// their evidence (the scorecard; `--json`: the versioned `Diagnosis` document).
    Diagnose {
        /// Only this target.
        #[arg(long)]
        target: Option<String>,
        /// A target idle now shows its last confirmed diagnosis of this window (e.g. 15m).
        #[arg(long, value_parser = humantime::parse_duration)]
        window: Option<Duration>,
    },
    /// The last measured requests with their trace ids, newest first.
    Recent {
        /// At most this many (at least 1).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// Only this target.
        #[arg(long)]
        target: Option<String>,
        /// Only this outcome.
        #[arg(long, value_parser = ["ok", "error", "aborted", "timeout", "cancelled"])]
        outcome: Option<String>,
        /// Only canaries, only injected requests, or only the probes pinned to a router's
        /// workers.
        #[arg(long, value_parser = ["canary", "inject", "probe"])]
        source: Option<String>,
    },
    /// Start a bounded burst or a trace replay against a target (within the agent's caps).
    Inject {
        /// Target name (may be left out when the agent has one target).
        #[arg(long)]
        target: Option<String>,
        /// Requests per second (e.g. 5 or 5/s).
        #[arg(long, value_parser = parse_rate, required_unless_present_any = ["trace_file", "profile"], conflicts_with_all = ["trace_file", "profile"])]
        rate: Option<f64>,
        /// How long to send (e.g. 30s).
        #[arg(long, value_parser = humantime::parse_duration, required_unless_present = "trace_file", conflicts_with = "trace_file")]
        duration: Option<Duration>,
        /// Requests in flight at most (default 1; a trace replay or a profile: the agent's
        /// cap, control.max_inject_concurrency, so the trace's arrivals or the profile's own
        /// concurrency decide).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        concurrency: Option<u32>,
        /// Requests to send at most (default: rate × duration; a profile: the agent's cap,
        /// control.max_inject_requests; a trace replay: its first N rows).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        max_requests: Option<u64>,
        /// Gaps between sends.
        #[arg(long, value_parser = ["poisson", "constant"], default_value = "poisson")]
        arrival: String,
        /// Replay a trace instead of --rate/--duration: a file on the agent's node, read by the
        /// agent (Azure LLM CSV, BurstGPT CSV, Mooncake JSONL); --max-requests replays its first N.
        #[arg(long = "trace", visible_alias = "trace-file", value_name = "FILE")]
        trace_file: Option<String>,
        /// Replay the trace this many times faster (arrival offsets divided by it).
        #[arg(long, value_name = "X", requires = "trace_file", conflicts_with_all = ["rate", "profile"])]
        trace_speedup: Option<f64>,
        /// Trace format (default: detected from the first line).
        #[arg(long, value_parser = ["azure", "burstgpt", "mooncake"], requires = "trace_file", conflicts_with_all = ["rate", "profile"])]
        trace_format: Option<String>,
        /// Wait for the replay to end, then say whether the p99 alert condition (E2E p99 of a
        /// 30 s window ≥ THRESHOLD) held and print the agent's diagnosis of the replay.
        #[arg(long, value_name = "THRESHOLD", value_parser = humantime::parse_duration, requires = "trace_file", conflicts_with_all = ["rate", "profile"])]
        p99_threshold: Option<Duration>,
        /// Follow a load profile (`lmperf run --profile`'s YAML; token_rate required) for
        /// --duration; read here and sent to the agent. Change it while it runs with
        /// `lmperf ctl update-load --profile FILE`.
        #[arg(
            long,
            value_name = "FILE",
            conflicts_with = "trace_file",
            requires = "duration"
        )]
        profile: Option<PathBuf>,
        /// Output tokens per request of a profile load (default: the target's canary.max_tokens).
        #[arg(long, value_name = "N", requires = "profile", conflicts_with_all = ["rate", "trace_file"], value_parser = clap::value_parser!(u32).range(1..))]
        output_tokens: Option<u32>,
        /// Stay until the profile load ends, watching FILE: each saved edit is sent as
        /// `update-load` (a line per revision on stderr); prints the load as it ended.
        #[arg(long, requires = "profile", conflicts_with_all = ["rate", "trace_file"])]
        watch: bool,
    },
    /// Apply a changed load profile to the running profile load from its next scheduling step
    /// (requests in flight go on; later requests carry the new revision).
    UpdateLoad {
        /// The load's id (default: the running one).
        #[arg(long)]
        id: Option<String>,
        /// The profile file (the whole profile; read here and sent to the agent).
        #[arg(long, value_name = "FILE")]
        profile: PathBuf,
    },
    /// Stop the running injected load.
    Stop {
        /// The load's id (default: the running one).
        #[arg(long)]
        id: Option<String>,
    },
}

/// `lmperf compare` flags.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Output directory of the base run (summary.json, requests.jsonl), or a profiling trace
    /// file (Chrome trace JSON as torch.profiler writes it, .json or .json.gz).
    #[arg(value_name = "BASE_DIR")]
    pub base_dir: PathBuf,
    /// Output directory of the new run, or the new profiling trace file.
    #[arg(value_name = "NEW_DIR")]
    pub new_dir: PathBuf,
    /// Exit 3 when a gate trips: METRIC:+X% (increase over X %), METRIC:-X% (decrease), or
    /// an absolute X in the metric's unit; e.g. ttft_p99:+5% tpot_mean:+5% output_throughput:-5%.
    #[arg(long, num_args = 1..)]
    pub fail_on: Vec<String>,
    /// Where compare.json and compare.html go (default: NEW_DIR; for traces, its folder).
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// When a --fail-on gate on TPOT trips, call the server's profiler once with FILE's
    /// [profiling] table (kind = "vllm" | "sglang", on = ["tpot_regression"], …; see README).
    #[arg(long, value_name = "FILE")]
    pub profile_on_fail: Option<PathBuf>,
    /// Bootstrap resamples.
    #[arg(long, default_value_t = 2000)]
    pub resamples: usize,
    /// Confidence level of the intervals.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// Seed of the bootstrap (same seed, same intervals).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl CompareArgs {
    /// Validates into a comparison specification; the error is one line naming the flag.
    pub fn into_spec(self) -> Result<crate::bench::compare::CompareSpec, String> {
        use crate::bench::compare::{CompareSpec, parse_compare_gate};
        let gates = self
            .fail_on
            .iter()
            .map(|g| parse_compare_gate(g))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--fail-on {e}"))?;
        Ok(CompareSpec {
            output_dir: self.output_dir.unwrap_or_else(|| self.new_dir.clone()),
            base_dir: self.base_dir,
            new_dir: self.new_dir,
            gates,
            resamples: self.resamples,
            confidence: self.confidence,
            seed: self.seed,
        })
    }
}

/// `lmperf run` flags (the names of `vllm bench serve` where they exist).
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Base URL of an OpenAI-compatible server (a trailing /v1 is fine); default:
    /// OPENAI_BASE_URL, else http://127.0.0.1:8000 (vLLM's default). Given more than once:
    /// one schedule spread over the endpoints (--endpoint-policy), a block per endpoint.
    #[arg(long, value_name = "URL", conflicts_with = "launch", action = clap::ArgAction::Append, help_heading = "Target")]
    pub target: Vec<String>,
    /// Model name; default: the first model of GET /v1/models.
    #[arg(long, help_heading = "Target")]
    pub model: Option<String>,
    /// API to call.
    #[arg(long, value_parser = ["chat", "completions"], default_value = "completions", help_heading = "Target")]
    pub api: String,
    /// `router`: the target is a router in front of workers (Dynamo's frontend, llm-d's
    /// gateway, vllm-router): each request asks it which worker served it, and the results
    /// break down per worker (`benchmarks[].workers`).
    #[arg(long, value_parser = ["server", "router"], default_value = "server", help_heading = "Target")]
    pub target_kind: String,
    /// With `--target-kind router`: the workers behind the router (base URLs). After each
    /// benchmark the same shape goes straight to them, in turn, and the benchmark says routed
    /// p50 − direct p50 of TTFT and E2E (`benchmarks[].path`; rows in direct.jsonl). Default:
    /// the router's own list (GET /list_workers, vllm-router and SGLang's router).
    #[arg(long, value_name = "URL", num_args = 1.., help_heading = "Target")]
    pub direct_workers: Vec<String>,
    /// Concurrency levels: requests in flight at most, one benchmark each (`1 2 4` or
    /// `1,2,4`). Default: 1, or 4096 with `--trace` (a replay is open loop: the trace's own
    /// arrivals decide the concurrency, as in `vllm bench serve` without `--max-concurrency`).
    #[arg(long = "batch-sizes", visible_alias = "concurrency", num_args = 1.., value_delimiter = ',', conflicts_with = "max_concurrency", help_heading = "Workload")]
    pub batch_sizes: Vec<usize>,
    /// One concurrency level (same as a single --batch-sizes value).
    #[arg(long, help_heading = "Workload")]
    pub max_concurrency: Option<usize>,
    /// Input lengths in tokens, one benchmark each (`64 128` or `64,128`).
    #[arg(long = "seq-lengths", visible_alias = "input-lengths", num_args = 1.., value_delimiter = ',', default_values_t = [128u32], help_heading = "Workload")]
    pub seq_lengths: Vec<u32>,
    /// Output length in tokens (max_tokens; with ignore_eos/min_tokens where the server has them).
    #[arg(long, default_value_t = 128, help_heading = "Workload")]
    pub output_len: u32,
    /// Measured requests per benchmark.
    #[arg(long, default_value_t = 100, help_heading = "Workload")]
    pub num_prompts: usize,
    /// Requests per second, or `inf` to send all at once (bounded by the concurrency).
    #[arg(long, default_value = "inf", help_heading = "Workload")]
    pub request_rate: String,
    /// Gaps between sends with a finite rate.
    #[arg(long, value_parser = ["poisson", "gamma", "constant"], default_value = "poisson", help_heading = "Workload")]
    pub arrival: String,
    /// Gamma shape of the gaps (1 = Poisson, < 1 burstier, > 1 steadier).
    #[arg(long, default_value_t = 1.0, help_heading = "Workload")]
    pub burstiness: f64,
    /// Requests before each benchmark that are not counted.
    #[arg(long, default_value_t = 0, help_heading = "Workload")]
    pub warmup: usize,
    /// Stop scheduling after this long (e.g. 60s).
    #[arg(long, value_parser = humantime::parse_duration, help_heading = "Workload")]
    pub duration: Option<Duration>,
    /// Seed of prompts and schedule (same seed, same run). Default: a fresh one per run
    /// (printed and in summary.json), so no run meets the prompts of the last one in the
    /// server's prefix cache; set it to repeat a run on purpose.
    #[arg(long, help_heading = "Workload")]
    pub seed: Option<u64>,
    /// SLOs for goodput: ttft:MS tpot:MS e2el:MS.
    #[arg(long, num_args = 1.., help_heading = "SLO and capacity")]
    pub goodput: Vec<String>,
    /// Exit 3 when a gate trips: e.g. ttft_p99_ms>500 e2el_mean_ms>2000 error_rate>0.01
    /// oom_rate>0 (requests the server failed for memory: CUDA out of memory, KV cache full);
    /// with --probe-rate, the same on the probes alone: probe_ttft_p99_ms>300 probe_error_rate>0.
    #[arg(long, num_args = 1.., help_heading = "SLO and capacity")]
    pub fail_on: Vec<String>,
    /// When a --fail-on gate on TPOT trips, call the server's profiler once with FILE's
    /// [profiling] table (kind = "vllm" | "sglang", on = ["tpot_regression"], …; see README).
    #[arg(long, value_name = "FILE", help_heading = "SLO and capacity")]
    pub profile_on_fail: Option<PathBuf>,
    /// Do not ask the server to ignore EOS (output lengths then vary).
    #[arg(long, help_heading = "Workload")]
    pub no_ignore_eos: bool,
    /// Deadline of one request.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "600s", help_heading = "Target")]
    pub timeout: Duration,
    /// Name of the environment variable that holds the API key (default LMPERF_API_KEY).
    #[arg(long, value_name = "VAR", help_heading = "Target")]
    pub api_key_env: Option<String>,
    /// File that holds the API key.
    #[arg(long, value_name = "FILE", help_heading = "Target")]
    pub api_key_file: Option<String>,
    /// Peak VRAM per benchmark from NVML (`auto`: when a driver is present), or `off`.
    #[arg(long, value_parser = ["auto", "off"], default_value = "auto", help_heading = "Output")]
    pub gpu: String,
    /// NVML library path (default: libnvidia-ml.so.1 from the loader's path).
    #[arg(long, value_name = "PATH", help_heading = "Output")]
    pub nvml_library: Option<std::path::PathBuf>,
    /// Where requests.jsonl and summary.json go.
    #[arg(long, value_name = "DIR", help_heading = "Output")]
    pub output_dir: std::path::PathBuf,
    /// Length distributions, trace replay, prompt files, ramps.
    #[command(flatten)]
    pub workload: workload::WorkloadArgs,
    /// Export each measured request as a GenAI span and metric points to this OTLP endpoint
    /// (also OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_EXPORTER_OTLP_* variables).
    #[arg(long, value_name = "URL", help_heading = "Output")]
    pub otlp_endpoint: Option<String>,
    /// OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf).
    #[arg(long, value_parser = ["grpc", "http/protobuf"], help_heading = "Output")]
    pub otlp_protocol: Option<String>,
    /// Run each benchmark K times; summary.json gives the coefficient of variation of each
    /// metric across the runs and flags those above 1.5 %.
    #[arg(long, value_name = "K", default_value_t = 1, help_heading = "Workload")]
    pub repeat: usize,
    /// Choices per request (the API's `n`); each choice is measured on its own.
    #[arg(long, value_name = "N", default_value_t = 1, help_heading = "Workload")]
    pub n: u32,
    /// Start the server for --model first (on a free loopback port, output in server.log),
    /// warm it up, and stop it at the end: vllm, sglang, llama-server, or a command with
    /// {model} and {port}, e.g. "my-server --model {model} --port {port}".
    #[arg(
        long,
        value_name = "SERVER",
        requires = "model",
        help_heading = "Target"
    )]
    pub launch: Option<String>,
    /// How long a launched server may take to answer (big models load slowly).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20m", help_heading = "Target")]
    pub launch_timeout: Duration,
    /// Capacity search: the highest open-loop request rate at which every --slo holds
    /// (bracketing, then bisection to --precision), and the knee where queueing starts.
    #[arg(long, requires = "slo", help_heading = "SLO and capacity")]
    pub find_max_rate: bool,
    /// SLOs of --find-max-rate: METRIC_pQ:LIMIT, e.g. ttft_p99:500ms tpot_p99:50ms.
    #[arg(long, num_args = 1.., requires = "find_max_rate", help_heading = "SLO and capacity")]
    pub slo: Vec<String>,
    /// Precision of --find-max-rate, relative (5% or 0.05).
    #[arg(
        long,
        default_value = "5%",
        requires = "find_max_rate",
        help_heading = "SLO and capacity"
    )]
    pub precision: String,
    /// Highest rate --find-max-rate offers, req/s.
    #[arg(long, requires = "find_max_rate", help_heading = "SLO and capacity")]
    pub max_rate: Option<f64>,
    /// Requests per --find-max-rate step instead of the order-statistic rule's (fewer: a
    /// less certain p99).
    #[arg(long, requires = "find_max_rate", help_heading = "SLO and capacity")]
    pub step_requests: Option<usize>,
    /// A YAML load profile (prompt_length, concurrency, token_rate) followed for --duration
    /// (default 60 s); edits of the file apply while it runs.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "find_max_rate",
        help_heading = "Workload"
    )]
    pub profile: Option<std::path::PathBuf>,
    /// LoRA adapters, several endpoints, canary probes.
    #[command(flatten)]
    pub traffic: traffic::TrafficArgs,
}

/// `--find-max-rate` flags, checked.
fn find_rate_of(
    slo: &[String],
    precision: &str,
    max_rate: Option<f64>,
    step_requests: Option<usize>,
    request_rate: Option<f64>,
) -> Result<crate::bench::find_rate::FindRate, String> {
    use crate::bench::find_rate::{DEFAULT_MAX_RATE, FindRate};
    let slos = slo
        .iter()
        .map(|s| crate::bench::capacity::Slo::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let p = precision.trim();
    let precision = match p.strip_suffix('%') {
        Some(v) => v.trim().parse::<f64>().ok().map(|v| v / 100.0),
        None => p.parse::<f64>().ok(),
    }
    .filter(|v| *v > 0.0 && *v < 1.0)
    .ok_or_else(|| {
        format!("--precision {p:?}: a fraction between 0 and 1, or a percentage (5%)")
    })?;
    let max_rate = max_rate.unwrap_or(DEFAULT_MAX_RATE);
    if !(max_rate.is_finite() && max_rate > 0.0) {
        return Err(format!(
            "--max-rate {max_rate}: a positive number of requests per second"
        ));
    }
    if step_requests == Some(0) {
        return Err("--step-requests 0: at least 1".to_owned());
    }
    Ok(FindRate {
        slos,
        precision,
        start_rate: request_rate.map(|r| r.min(max_rate)),
        max_rate,
        step_requests,
    })
}

/// `--direct-workers`: the workers behind a router (`--target-kind router`), each a base URL.
///
/// # Errors
/// The flag without a router target, or a value that is not an http(s) URL with a host, each
/// naming the flag and the value.
fn check_direct_workers(workers: &[String], target_kind: &str) -> Result<(), String> {
    if !workers.is_empty() && target_kind != "router" {
        return Err(format!(
            "--direct-workers {}: the workers behind a router; it needs --target-kind router",
            workers.join(" ")
        ));
    }
    match workers
        .iter()
        .find(|w| crate::config::direct_paths::worker_url(w).is_none())
    {
        Some(w) => Err(format!(
            "--direct-workers {w}: not an http(s) URL with a host (a worker's base URL, e.g. http://10.0.0.7:8000)"
        )),
        None => Ok(()),
    }
}

/// `lmperf run`'s target without `--target`: `OPENAI_BASE_URL` (the OpenAI SDKs' variable),
/// else vLLM's default `http://127.0.0.1:8000`. With `--launch`, a placeholder the launcher
/// replaces with the server's port.
pub fn default_target(env: &dyn crate::config::Env) -> String {
    env.var("OPENAI_BASE_URL")
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "http://127.0.0.1:8000".to_owned())
}

/// Concurrency of a trace replay without `--batch-sizes`: high enough that the trace's
/// arrivals, not a client limit, decide what is in flight.
pub const TRACE_CONCURRENCY: usize = 4096;

/// `--goodput ttft:500 tpot:50 e2el:2000`.
pub fn parse_goodput(items: &[String]) -> Result<crate::bench::Goodput, String> {
    let mut g = crate::bench::Goodput::default();
    for it in items {
        let (k, v) = it
            .split_once(':')
            .ok_or_else(|| format!("--goodput {it:?}: expected ttft:MS, tpot:MS or e2el:MS"))?;
        let v: f64 = v
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                format!("--goodput {it:?}: {v:?} is not a positive number of milliseconds")
            })?;
        match k {
            "ttft" => g.ttft_ms = Some(v),
            "tpot" => g.tpot_ms = Some(v),
            "e2el" => g.e2el_ms = Some(v),
            _ => {
                return Err(format!(
                    "--goodput {it:?}: unknown SLO {k:?} (ttft, tpot, e2el)"
                ));
            }
        }
    }
    Ok(g)
}

impl RunArgs {
    /// Validates into a run specification; the error is one line naming the flag and value.
    pub fn into_spec(self, env: &dyn crate::config::Env) -> Result<crate::bench::RunSpec, String> {
        use crate::bench::{RunArrival, RunSpec, parse_gate};
        let launch = match &self.launch {
            Some(l) => Some(crate::bench::launch::LaunchSpec {
                launcher: crate::bench::launch::Launcher::parse(l)?,
                model: self
                    .model
                    .clone()
                    .ok_or("--launch needs --model (the model the server loads)")?,
                timeout: self.launch_timeout,
            }),
            None => None,
        };
        check_direct_workers(&self.direct_workers, &self.target_kind)?;
        let targets = if self.target.is_empty() {
            vec![default_target(env)]
        } else {
            self.target.clone()
        };
        let overrides = Overrides {
            targets,
            canary: RawCanary {
                model: self.model,
                api: Some(self.api),
                kind: Some(self.target_kind),
                direct_workers: (!self.direct_workers.is_empty()).then_some(self.direct_workers),
                timeout: Some(self.timeout),
                max_tokens: Some(self.output_len),
                api_key_env: self.api_key_env,
                api_key_file: self.api_key_file,
                ..RawCanary::default()
            },
            no_otlp: no_otlp_asked(self.otlp_endpoint.as_deref(), env),
            otlp_endpoint: self.otlp_endpoint,
            otlp_protocol: self.otlp_protocol,
            ..Overrides::default()
        };
        if self.output_len == 0 || self.output_len > MAX_OUTPUT_LEN {
            return Err(format!(
                "--output-len {}: between 1 and {MAX_OUTPUT_LEN} tokens",
                self.output_len
            ));
        }
        let mut cfg = crate::config::load(overrides, env).map_err(|e| e.to_string())?;
        let target = cfg.targets.remove(0);
        let traffic = self
            .traffic
            .into_traffic(std::mem::take(&mut cfg.targets))?;
        // A profile sends through its own scheduler: these flags would be ignored there.
        if let Some(p) = &self.profile {
            let refused = [
                (traffic.probe_rate.is_some(), "--probe-rate"),
                (traffic.lora.is_some(), "--lora-modules"),
                (
                    !traffic.more_endpoints.is_empty(),
                    "--target (more than one)",
                ),
            ];
            if let Some((_, flag)) = refused.iter().find(|(on, _)| *on) {
                return Err(format!(
                    "{flag}: not with --profile {} (it applies to the benchmarks of the matrix and --find-max-rate)",
                    p.display()
                ));
            }
        }
        let request_rate = match self.request_rate.as_str() {
            "inf" => None,
            r => Some(
                r.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .ok_or_else(|| format!("--request-rate {r:?}: a positive number or inf"))?,
            ),
        };
        if !(self.burstiness.is_finite() && self.burstiness > 0.0) {
            return Err(format!(
                "--burstiness {}: a positive number",
                self.burstiness
            ));
        }
        let arrival = match (self.arrival.as_str(), self.burstiness) {
            ("constant", _) => RunArrival::Constant,
            ("gamma", b) => RunArrival::Gamma(b),
            (_, b) if (b - 1.0).abs() > f64::EPSILON => RunArrival::Gamma(b),
            _ => RunArrival::Poisson,
        };
        let mut workload =
            crate::bench::workload::WorkloadArgs::from(self.workload).into_workload()?;
        if workload.images.is_some() && target.api != crate::config::Api::Chat {
            return Err(
                "--images-per-request: images go in chat messages: it needs --api chat".to_owned(),
            );
        }
        if let Some(d) = &workload.dataset {
            for w in d.warnings(20) {
                eprintln!("{w}");
            }
        }
        if workload.chat_template.is_some() && target.api != crate::config::Api::Chat {
            return Err("--chat-template: counts chat requests: it needs --api chat (or leave --chat-template out)".to_owned());
        }
        if let Some(d) = workload.output_dist.as_mut() {
            cap_output_dist(d)?;
        }
        let concurrency_ramp = workload
            .ramp
            .filter(|r| r.over == crate::bench::workload::RampOver::Concurrency);
        if let Some(r) = concurrency_ramp {
            if let Some(rate) = request_rate {
                return Err(format!(
                    "--request-rate {rate}: --ramp-over concurrency sends closed loop (as soon as a slot is free); leave --request-rate at inf"
                ));
            }
            if !self.batch_sizes.is_empty() || self.max_concurrency.is_some() {
                return Err(format!(
                    "--batch-sizes: not with --ramp-over concurrency (the ramp sets the concurrency, {} → {})",
                    r.from, r.to
                ));
            }
        }
        let profile = match &self.profile {
            Some(p) => Some((
                p.clone(),
                crate::bench::profile::load(p).map_err(|e| format!("--profile {e}"))?,
            )),
            None => None,
        };
        // A profile is one benchmark whose lengths, concurrency and rate the file sets: flags
        // that would make more benchmarks or another load are refused, not ignored.
        if let Some((p, _)) = &profile {
            let refused = [
                (self.repeat > 1, "--repeat"),
                (self.batch_sizes.len() > 1, "--batch-sizes (more than one)"),
                (self.seq_lengths.len() > 1, "--seq-lengths (more than one)"),
                (workload.ramp.is_some(), "--ramp"),
                (workload.trace.is_some(), "--trace"),
            ];
            if let Some((_, flag)) = refused.iter().find(|(on, _)| *on) {
                return Err(format!(
                    "{flag}: not with --profile {} (the profile sets the lengths, concurrency and rate of its one benchmark)",
                    p.display()
                ));
            }
        }
        let find_rate = if self.find_max_rate {
            Some(find_rate_of(
                &self.slo,
                &self.precision,
                self.max_rate,
                self.step_requests,
                request_rate,
            )?)
        } else {
            None
        };
        if find_rate.is_some() && (workload.trace.is_some() || workload.ramp.is_some()) {
            return Err(
                "--find-max-rate: not with --trace or --ramp (the search sets the rate)".to_owned(),
            );
        }
        let concurrencies = match self.max_concurrency {
            Some(c) => vec![c],
            // The search is open loop: arrivals, not a client limit, decide what is in flight.
            None if find_rate.is_some() && self.batch_sizes.is_empty() => vec![TRACE_CONCURRENCY],
            // One benchmark, named by the ramp's highest concurrency.
            None if concurrency_ramp.is_some() => {
                vec![concurrency_ramp.map_or(1, |r| r.max_concurrency())]
            }
            None if self.batch_sizes.is_empty() => vec![if workload.trace.is_some() {
                TRACE_CONCURRENCY
            } else {
                1
            }],
            None => self.batch_sizes,
        };
        if concurrencies.contains(&0) {
            return Err("--batch-sizes 0: concurrency is at least 1".to_owned());
        }
        if self.seq_lengths.contains(&0) {
            return Err("--seq-lengths 0: input length is at least 1 token".to_owned());
        }
        if self.repeat == 0 {
            return Err("--repeat 0: at least 1".to_owned());
        }
        if self.num_prompts == 0 {
            return Err("--num-prompts 0: at least 1".to_owned());
        }
        if self.n == 0 {
            return Err("--n 0: at least 1 choice".to_owned());
        }
        let fail_on = self
            .fail_on
            .iter()
            .map(|g| parse_gate(g))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--fail-on {e}"))?;
        Ok(RunSpec {
            target,
            concurrencies,
            input_lengths: self.seq_lengths,
            output_len: self.output_len,
            num_prompts: self.num_prompts,
            request_rate,
            arrival,
            warmup: self.warmup,
            duration: self.duration,
            seed: self.seed.unwrap_or_else(rand::random),
            ignore_eos: !self.no_ignore_eos,
            goodput: parse_goodput(&self.goodput)?,
            fail_on,
            output_dir: self.output_dir,
            progress: true,
            gpu: match (self.gpu.as_str(), self.nvml_library) {
                ("off", _) => crate::bench::vram::GpuSource::Off,
                (_, Some(p)) => crate::bench::vram::GpuSource::NvmlAt(p),
                (_, None) => crate::bench::vram::GpuSource::Nvml,
            },
            workload,
            repeat: self.repeat,
            otlp: cfg.otlp.enabled.then_some(cfg.otlp.clone()),
            launch,
            find_rate,
            profile,
            n: self.n,
            traffic,
        })
    }
}

/// Most tokens a request of `lmperf run` asks for (`--output-len`, `--output-dist`): the
/// canary's `max_tokens` cap.
const MAX_OUTPUT_LEN: u32 = 4096;

/// `--output-dist` within [`MAX_OUTPUT_LEN`]: a stated bound above it is refused; normal and
/// lognormal without `max=` are clipped to it.
fn cap_output_dist(d: &mut crate::bench::workload::LengthDist) -> Result<(), String> {
    use crate::bench::workload::LengthDist as D;
    let top = match d {
        D::Fixed(v) => *v,
        D::Uniform { max, .. } => *max,
        D::Zipf { n, .. } => *n,
        D::Normal { max, min, .. } | D::Lognormal { max, min, .. } => {
            if *max == 1_000_000 {
                *max = MAX_OUTPUT_LEN.max(*min);
            }
            *max
        }
    };
    if top > MAX_OUTPUT_LEN {
        return Err(format!(
            "--output-dist {d}: at most {MAX_OUTPUT_LEN} output tokens (its largest is {top})"
        ));
    }
    Ok(())
}

/// `lmperf agent` flags. Canary flags apply to every target and override the config file.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// TOML configuration file (see the README for its keys).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Base URL of an OpenAI-compatible server; repeat for several targets.
    #[arg(long = "target", value_name = "URL")]
    pub targets: Vec<String>,
    /// Model name; default: the first model of GET /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    /// API to call.
    #[arg(long, value_parser = ["chat", "completions"])]
    pub api: Option<String>,
    /// `router`: every --target is a router in front of workers; each canary records the
    /// worker that served it (`lmperf.worker.*`).
    #[arg(long, value_parser = ["server", "router"])]
    pub target_kind: Option<String>,
    /// Mean gap between canaries per target, jittered ±10 % (e.g. 5s, 500ms).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "rate", allow_hyphen_values = true)]
    pub interval: Option<Duration>,
    /// Canaries per second per target (e.g. 2 or 2/s; above 0).
    #[arg(long, value_parser = parse_rate, allow_hyphen_values = true)]
    pub rate: Option<f64>,
    /// Arrival process with --rate.
    #[arg(long, value_parser = ["poisson", "constant"], requires = "rate")]
    pub arrival: Option<String>,
    /// max_tokens of each canary (1 to 4096).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096), allow_hyphen_values = true)]
    pub max_tokens: Option<u32>,
    /// Deadline of one canary request (e.g. 60s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Name of the environment variable that holds the API key (default LMPERF_API_KEY).
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// File that holds the API key.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<String>,
    /// Admin HTTP address (/healthz, /readyz, /metrics, /api/v1/status).
    #[arg(long, value_name = "ADDR")]
    pub admin_addr: Option<String>,
    /// OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4318 or :4317).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf).
    #[arg(long, value_parser = ["grpc", "http/protobuf"])]
    pub otlp_protocol: Option<String>,
    /// Do not export over OTLP (metrics stay on /metrics).
    #[arg(long)]
    pub no_otlp: bool,
    /// Print one line per measured request on stdout.
    #[arg(long)]
    pub console: bool,
}

/// `lmperf run` exports only when asked: `--otlp-endpoint` or an OTLP endpoint variable.
fn no_otlp_asked(flag: Option<&str>, env: &dyn crate::config::Env) -> bool {
    flag.is_none()
        && [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        ]
        .iter()
        .all(|v| env.var(v).is_none())
}

/// Parses `2`, `2.5` or `2/s`.
fn parse_rate(s: &str) -> Result<f64, String> {
    let n = s.strip_suffix("/s").unwrap_or(s);
    let v = n
        .trim()
        .parse::<f64>()
        .map_err(|_| format!("expected requests per second such as 2 or 2/s, got {s:?}"))?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!(
            "{s:?}: requests per second above 0, such as 2 or 2/s"
        ))
    }
}

impl AgentArgs {
    pub fn into_overrides(self) -> Overrides {
        Overrides {
            config: self.config,
            targets: self.targets,
            canary: RawCanary {
                model: self.model,
                api: self.api,
                kind: self.target_kind,
                interval: self.interval,
                rate: self.rate,
                arrival: self.arrival,
                max_tokens: self.max_tokens,
                timeout: self.timeout,
                api_key_env: self.api_key_env,
                api_key_file: self.api_key_file,
                ..RawCanary::default()
            },
            admin_addr: self.admin_addr,
            console: self.console,
            otlp_endpoint: self.otlp_endpoint,
            otlp_protocol: self.otlp_protocol,
            no_otlp: self.no_otlp,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    /// A flag of a trace replay or a profile load given with `--rate` is refused, not ignored
    /// (clap leaves out a `requires` whose target conflicts with an arg that is present, so
    /// each such flag names `--rate` as a conflict itself).
    #[test]
    fn ctl_inject_refuses_replay_and_profile_flags_beside_rate() {
        for extra in [
            &["--trace-speedup", "10"][..],
            &["--trace-format", "azure"],
            &["--p99-threshold", "1s"],
            &["--output-tokens", "5"],
            &["--watch"],
        ] {
            let args = ["lmperf", "ctl", "inject", "--rate", "2", "--duration", "2s"];
            let e = Cli::try_parse_from(args.iter().chain(extra)).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{extra:?}");
            assert!(
                e.to_string().contains(extra[0]) && e.to_string().contains("--rate"),
                "{extra:?}: {e}"
            );
        }
    }

    /// Values that mean nothing are refused where they are typed (the new-user walk found
    /// them taken silently: an unknown outcome gave 0 rows, `--limit 0` the default 20).
    #[test]
    fn ctl_refuses_meaningless_values() {
        let refused = |args: &[&str]| {
            let e = Cli::try_parse_from(["lmperf", "ctl"].iter().chain(args)).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            e.to_string()
        };
        assert!(
            refused(&["recent", "--outcome", "weird"])
                .contains("possible values: ok, error, aborted, timeout, cancelled")
        );
        assert!(refused(&["recent", "--limit", "0"]).contains("'--limit <LIMIT>'"));
        assert!(
            refused(&[
                "inject",
                "--rate",
                "1",
                "--duration",
                "1s",
                "--concurrency",
                "0"
            ])
            .contains("--concurrency")
        );
        assert!(
            refused(&[
                "inject",
                "--rate",
                "1",
                "--duration",
                "1s",
                "--max-requests",
                "0"
            ])
            .contains("--max-requests")
        );
        assert!(
            refused(&[
                "inject",
                "--profile",
                "p.yaml",
                "--duration",
                "1s",
                "--output-tokens",
                "0"
            ])
            .contains("--output-tokens")
        );
        assert!(
            Cli::try_parse_from([
                "lmperf",
                "ctl",
                "recent",
                "--outcome",
                "timeout",
                "--limit",
                "1"
            ])
            .is_ok()
        );
    }

    /// `run --profile` with flags that would make more benchmarks or another load: exit 2
    /// naming the flag (the walk found them accepted and ignored).
    #[test]
    fn run_profile_refuses_flags_it_would_ignore() {
        struct NoEnv;
        impl crate::config::Env for NoEnv {
            fn var(&self, _: &str) -> Option<String> {
                None
            }
        }
        let file =
            std::env::temp_dir().join(format!("lmperf-cli-profile-{}.yaml", std::process::id()));
        std::fs::write(
            &file,
            "profile: x\ntoken_rate: {mode: constant, target: 10/s}\n",
        )
        .unwrap();
        let spec = |extra: &[&str]| {
            let mut args = vec![
                "lmperf",
                "run",
                "--target",
                "http://127.0.0.1:9",
                "--output-dir",
                "/tmp/lmperf-unused",
                "--profile",
                file.to_str().unwrap(),
            ];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).unwrap().command {
                super::Command::Run(r) => r.into_spec(&NoEnv),
                _ => unreachable!(),
            }
        };
        for (extra, flag) in [
            (&["--repeat", "2"][..], "--repeat"),
            (&["--batch-sizes", "1", "2"], "--batch-sizes"),
            (&["--seq-lengths", "32", "64"], "--seq-lengths"),
            (&["--probe-rate", "2"], "--probe-rate"),
            (&["--lora-modules", "a"], "--lora-modules"),
            (
                &["--target", "http://127.0.0.1:10"],
                "--target (more than one)",
            ),
        ] {
            let e = spec(extra).unwrap_err();
            assert!(
                e.starts_with(flag) && e.contains("not with --profile"),
                "{e}"
            );
        }
        assert!(spec(&["--batch-sizes", "4"]).is_ok());
        let _ = std::fs::remove_file(&file);
    }

    /// Usage errors found before any network call: `--chat-template` without `--api chat`,
    /// `--output-len` / `--output-dist` above the 4096-token cap (named by their own flag).
    #[test]
    fn run_refuses_chat_template_without_chat_and_long_outputs() {
        struct NoEnv;
        impl crate::config::Env for NoEnv {
            fn var(&self, _: &str) -> Option<String> {
                None
            }
        }
        let tpl = std::env::temp_dir().join(format!("lmperf-cli-tpl-{}.jinja", std::process::id()));
        std::fs::write(&tpl, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
        let spec = |extra: &[&str]| {
            let mut args = vec![
                "lmperf",
                "run",
                "--target",
                "http://127.0.0.1:9",
                "--output-dir",
                "/tmp/lmperf-unused",
            ];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).unwrap().command {
                super::Command::Run(r) => r.into_spec(&NoEnv),
                _ => unreachable!(),
            }
        };
        let e = spec(&[
            "--chat-template",
            tpl.to_str().unwrap(),
            "--api",
            "completions",
        ])
        .unwrap_err();
        assert!(
            e.starts_with("--chat-template:") && e.contains("--api chat"),
            "{e}"
        );
        assert!(spec(&["--chat-template", tpl.to_str().unwrap(), "--api", "chat"]).is_ok());
        assert_eq!(
            spec(&["--output-len", "5000"]).unwrap_err(),
            "--output-len 5000: between 1 and 4096 tokens"
        );
        assert_eq!(
            spec(&["--output-dist", "uniform:max=6000,min=1"]).unwrap_err(),
            "--output-dist uniform:min=1,max=6000: at most 4096 output tokens (its largest is 6000)"
        );
        let s = spec(&["--output-dist", "normal:mean=100,std=10"]).unwrap();
        assert_eq!(
            s.workload.output_dist.unwrap().to_string(),
            "normal:mean=100,std=10,min=1,max=4096"
        );
        assert!(
            spec(&[
                "--output-len",
                "4096",
                "--output-dist",
                "uniform:min=1,max=4096"
            ])
            .is_ok()
        );
        let _ = std::fs::remove_file(&tpl);
    }

    /// `--direct-workers` needs a router target and base URLs; a bad one is named by the flag.
    /// A negative or zero value is refused by the flag that got it, naming flag, value and
    /// range (it read "unexpected argument '-5' found", or named the config key).
    #[test]
    fn agent_flags_refuse_bad_values_naming_flag_value_and_range() {
        for (args, flag, words) in [
            (&["--interval", "-5s"][..], "--interval", "'-5s'"),
            (&["--rate", "-2/s"][..], "--rate", "above 0"),
            (&["--rate", "0/s"][..], "--rate", "above 0"),
            (&["--max-tokens=-1"][..], "--max-tokens", "1..=4096"),
            (&["--max-tokens", "5000"][..], "--max-tokens", "1..=4096"),
        ] {
            let mut all = vec!["lmperf", "agent"];
            all.extend_from_slice(args);
            let e = Cli::try_parse_from(all).unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains(words), "{args:?}: {e}");
        }
    }

    /// Lists of numbers take commas as well as spaces (`--batch-sizes 1,2` read "invalid digit
    /// found in string").
    #[test]
    fn run_lists_take_commas_and_spaces() {
        for args in [
            &["--batch-sizes", "1,2", "--seq-lengths", "64,128"][..],
            &["--batch-sizes", "1", "2", "--seq-lengths", "64", "128"][..],
            &["--batch-sizes", "1,2", "--seq-lengths", "64", "128"][..],
        ] {
            let mut all = vec!["lmperf", "run", "--target", "http://127.0.0.1:9"];
            all.extend_from_slice(&["--output-dir", "/tmp/lmperf-unused"]);
            all.extend_from_slice(args);
            match Cli::try_parse_from(all).unwrap().command {
                super::Command::Run(r) => {
                    assert_eq!((r.batch_sizes, r.seq_lengths), (vec![1, 2], vec![64, 128]));
                }
                _ => unreachable!(),
            }
        }
    }

    #[test]
    fn run_direct_workers_are_urls_behind_a_router() {
        struct NoEnv;
        impl crate::config::Env for NoEnv {
            fn var(&self, _: &str) -> Option<String> {
                None
            }
        }
        let spec = |extra: &[&str]| {
            let mut args = vec!["lmperf", "run", "--target", "http://127.0.0.1:9"];
            args.extend_from_slice(&["--output-dir", "/tmp/lmperf-unused"]);
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).unwrap().command {
                super::Command::Run(r) => r.into_spec(&NoEnv).map(|_| ()),
                _ => unreachable!(),
            }
        };
        let router = ["--target-kind", "router", "--direct-workers"];
        assert_eq!(
            spec(&[&router[..], &["http://10.0.0.7:8000"]].concat()),
            Ok(())
        );
        let e =
            spec(&[&router[..], &["http://10.0.0.7:8000", "10.0.0.8:8000"]].concat()).unwrap_err();
        assert!(
            e.starts_with("--direct-workers 10.0.0.8:8000: not an http(s) URL with a host"),
            "{e}"
        );
        let e = spec(&["--direct-workers", "http://10.0.0.7:8000"]).unwrap_err();
        assert!(e.contains("it needs --target-kind router"), "{e}");
    }

    /// `--lora-modules`, `--target` repeated, `--endpoint-policy`, `--probe-rate` into the
    /// spec; bad values named; `--help` groups the run flags under headings.
    #[test]
    fn run_traffic_flags_and_help_groups() {
        use crate::bench::traffic::{Assignment, EndpointPolicy};
        struct NoEnv;
        impl crate::config::Env for NoEnv {
            fn var(&self, _: &str) -> Option<String> {
                None
            }
        }
        let spec = |extra: &[&str]| {
            let mut args = vec!["lmperf", "run", "--output-dir", "/tmp/lmperf-unused"];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).unwrap().command {
                super::Command::Run(r) => r.into_spec(&NoEnv),
                _ => unreachable!(),
            }
        };
        let s = spec(&[
            "--target",
            "http://127.0.0.1:9",
            "--target",
            "http://127.0.0.1:10",
            "--lora-modules",
            "a",
            "b",
            "--lora-assignment",
            "round-robin",
            "--endpoint-policy",
            "least-outstanding",
            "--probe-rate",
            "2.5",
        ])
        .unwrap();
        assert_eq!(s.target.port, 9);
        let t = &s.traffic;
        assert_eq!(
            t.more_endpoints.iter().map(|e| e.port).collect::<Vec<_>>(),
            [10]
        );
        assert_eq!(t.endpoint_policy, EndpointPolicy::LeastOutstanding);
        assert_eq!(t.probe_rate, Some(2.5));
        let lora = t.lora.as_ref().unwrap();
        assert_eq!(
            (lora.adapters.len(), lora.assignment),
            (2, Assignment::RoundRobin)
        );
        // The seed command: one target, nothing spread, no probes.
        let plain = spec(&["--target", "http://127.0.0.1:9"]).unwrap();
        assert_eq!(plain.traffic, crate::bench::traffic::Traffic::default());
        let t = "http://127.0.0.1:9";
        assert_eq!(
            spec(&["--target", t, "--probe-rate", "0"]).unwrap_err(),
            "--probe-rate 0: a positive number of probes per second, at most 1000"
        );
        assert_eq!(
            spec(&[
                "--target",
                t,
                "--lora-modules",
                "a",
                "b",
                "--lora-weights",
                "1"
            ])
            .unwrap_err(),
            "--lora-weights: 1 weights for 2 adapters (one per --lora-modules name)"
        );
        let mut cmd = <Cli as clap::CommandFactory>::command();
        let help = cmd
            .find_subcommand_mut("run")
            .unwrap()
            .render_long_help()
            .to_string();
        let at = |needle: &str| {
            help.find(needle)
                .unwrap_or_else(|| panic!("{needle}: {help}"))
        };
        let groups = [
            ("Target:", "--target <URL>"),
            ("Workload:", "--batch-sizes"),
            ("Datasets:", "--trace <PATH>"),
            ("LoRA:", "--lora-modules"),
            ("Endpoints:", "--endpoint-policy"),
            ("Probes:", "--probe-rate"),
            ("SLO and capacity:", "--find-max-rate"),
            ("Output:", "--output-dir"),
        ];
        for (heading, flag) in groups {
            // The flag's own line (6 spaces in), under the last heading above it.
            let f = at(&format!("\n      {flag}"));
            let owner = groups
                .iter()
                .map(|(h, _)| (at(&format!("\n{h}")), *h))
                .filter(|(p, _)| *p < f)
                .max();
            assert_eq!(owner.map(|o| o.1), Some(heading), "{flag}");
        }
    }
}
