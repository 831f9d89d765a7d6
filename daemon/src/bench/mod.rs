//! `lmperf run`: one-shot benchmarks with the agent's own client and measurement.
//!
//! One benchmark per (concurrency, input length). Each sends `num_prompts` synthetic prompts
//! of that exact token length, open loop on an absolute schedule (`--request-rate`, Poisson /
//! gamma / constant gaps; `inf` sends all at once) with at most `concurrency` in flight. A
//! request that waits for a free slot records its dispatch delay, and latencies are reported
//! both from the send and from the schedule (`../shared/cases/sse/07_*`). Results go to
//! `requests.jsonl` (one line per request), `summary.json` (schema below, versioned) and
//! `report.html` (self-contained charts and tables, see [`report`]).

pub mod accumulator;
pub mod aggregate;
pub mod buckets;
pub mod capacity;
pub mod compare;
pub mod context;
pub mod export;
pub mod feed;
pub mod find_rate;
pub mod groups;
pub mod launch;
pub mod probe;
pub mod profile;
pub mod progress;
pub mod prompt_tokens;
pub mod repeat;
pub mod report;
pub mod rows;
pub mod server;
pub mod slots;
pub mod stats;
pub mod summary;
pub mod summary_csv;
pub mod traffic;
pub mod vram;
pub mod workload_stats;

// The load layer's modules under their old paths (tests/, xtask and `bench`'s own files use them).
pub use crate::load::{chat_template, dataset, prompts, tokens, trace, workload};
pub use summary::{BenchSummary, ChoiceRow, RequestRow, Summary};

use context::RunContext;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::canary::client::{self, CanaryRequest, Clients, Measured};
use crate::config::{Api, TargetConfig};
use crate::measure::Outcome;
use prompts::{Prompt, TokenizeClient};
use stats::Distribution;

/// Version of `summary.json` and `requests.jsonl`; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Gaps between scheduled sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunArrival {
    Poisson,
    /// Gamma-distributed gaps with this shape (burstiness; 1 = Poisson, < 1 burstier).
    Gamma(f64),
    Constant,
}

/// SLOs for goodput (vLLM's `--goodput`): a request counts when it meets every one set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Goodput {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

/// A `--fail-on` gate: `metric_stat_ms>value` (e.g. `ttft_p99_ms>500`) or `error_rate>0.01`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    pub text: String,
    pub metric: String,
    pub stat: Option<String>,
    pub limit: f64,
}

/// Errors that stop a run before it measures anything.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("output directory {path}: {source}")]
    Output {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("no model: give --model, or the server must list one at GET /v1/models ({0})")]
    NoModel(String),
    #[error("the dispatcher thread ended abnormally: {0}")]
    Dispatcher(String),
    #[error("bad value {field} = {value:?}: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("OTLP export: {0}")]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    #[error("{0}")]
    Launch(#[from] launch::LaunchError),
    /// Ctrl-C or SIGTERM during the benchmarks: those that had completed are written
    /// (`summary.json` `interrupted: true`) when `completed > 0`.
    #[error("interrupted (Ctrl-C or SIGTERM) during {during}; {}", if *completed == 0 { "no benchmark had completed, nothing written".to_owned() } else { format!("the {completed} completed benchmark(s) are written in {}", dir.display()) })]
    Interrupted {
        during: String,
        completed: usize,
        dir: PathBuf,
    },
    #[error(
        "nothing answers at {url} ({reason}): give --target URL (or OPENAI_BASE_URL) of a running server, or --launch vllm|sglang|llama-server|\"CMD … {{model}} … {{port}}\" to start one"
    )]
    Unreachable { url: String, reason: String },
}

impl From<crate::load::LoadError> for BenchError {
    fn from(e: crate::load::LoadError) -> Self {
        match e {
            crate::load::LoadError::Invalid {
                field,
                value,
                reason,
            } => Self::Invalid {
                field,
                value,
                reason,
            },
        }
    }
}

/// A whole `lmperf run`.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub target: TargetConfig,
    pub concurrencies: Vec<usize>,
    pub input_lengths: Vec<u32>,
    pub output_len: u32,
    pub num_prompts: usize,
    /// Requests per second; `None` = all at once (`inf`).
    pub request_rate: Option<f64>,
    pub arrival: RunArrival,
    pub warmup: usize,
    pub duration: Option<Duration>,
    pub seed: u64,
    pub ignore_eos: bool,
    pub goodput: Goodput,
    pub fail_on: Vec<Gate>,
    pub output_dir: PathBuf,
    /// Show progress on stderr (a bar on a terminal, else plain lines; see [`progress`]).
    pub progress: bool,
    /// Where peak VRAM per benchmark comes from ([`vram`]).
    pub gpu: vram::GpuSource,
    /// Length distributions, ramp, trace replay, prompt file ([`workload`]).
    pub workload: workload::Workload,
    /// Runs of each benchmark (`--repeat`, at least 1); see [`repeat`].
    pub repeat: usize,
    /// Span and metric export of every measured request (see [`export`]); `None`: none.
    pub otlp: Option<crate::config::OtlpConfig>,
    /// `--launch`: start this server first and stop it at the end ([`launch`]).
    pub launch: Option<launch::LaunchSpec>,
    /// `--find-max-rate`: a capacity search instead of the benchmark matrix ([`find_rate`]).
    pub find_rate: Option<find_rate::FindRate>,
    /// `--profile FILE`: one benchmark following the load profile, hot-reloaded ([`profile::run`]).
    pub profile: Option<(PathBuf, profile::Profile)>,
    /// Choices per request (`n` of the OpenAI API, `--n`); 1 sends no `n`. Each choice is
    /// measured on its own ([`crate::measure::ChoiceRecord`], `choices` in `requests.jsonl`).
    pub n: u32,
    /// LoRA adapters, several endpoints, canary probes ([`traffic`]); default: none.
    pub traffic: traffic::Traffic,
}

impl RunSpec {
    /// A run against `target` writing to `output_dir`, otherwise `lmperf run`'s defaults
    /// (concurrency 1, 128 input and output tokens, 100 prompts, all at once, seed 0,
    /// ignore EOS) with no progress, no GPU figures and no export.
    pub fn new(target: TargetConfig, output_dir: PathBuf) -> Self {
        Self {
            target,
            concurrencies: vec![1],
            input_lengths: vec![128],
            output_len: 128,
            num_prompts: 100,
            request_rate: None,
            arrival: RunArrival::Poisson,
            warmup: 0,
            duration: None,
            seed: 0,
            ignore_eos: true,
            goodput: Goodput::default(),
            fail_on: Vec::new(),
            output_dir,
            progress: false,
            gpu: vram::GpuSource::Off,
            workload: workload::Workload::default(),
            repeat: 1,
            otlp: None,
            launch: None,
            find_rate: None,
            profile: None,
            n: 1,
            traffic: traffic::Traffic::default(),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs every benchmark of `spec`, writes `requests.jsonl` and `summary.json`, and returns the
/// summary (its `failed_gates` say whether a `--fail-on` gate tripped).
///
/// # Errors
/// Only what stops the run from starting (output directory, HTTP client, no model).
pub async fn run(spec: RunSpec) -> Result<Summary, BenchError> {
    std::fs::create_dir_all(&spec.output_dir).map_err(|source| BenchError::Output {
        path: spec.output_dir.clone(),
        source,
    })?;
    // Ctrl-C / SIGTERM, awaited once for the whole run: the benchmarks then stop and what
    // completed is written; before them (start-up, discovery) the run just ends.
    let stop = CancellationToken::new();
    let signal = tokio::spawn({
        let stop = stop.clone();
        async move {
            launch::interrupted().await;
            stop.cancel();
        }
    });
    let result = run_launched(spec, &stop).await;
    signal.abort();
    result
}

async fn run_launched(mut spec: RunSpec, stop: &CancellationToken) -> Result<Summary, BenchError> {
    let Some(l) = spec.launch.clone() else {
        return run_on(spec, None, stop).await;
    };
    let port = launch::free_port().map_err(|source| {
        BenchError::Launch(launch::LaunchError::Spawn {
            command: "bind 127.0.0.1:0".into(),
            source,
        })
    })?;
    launch::retarget(&mut spec.target, port).map_err(|reason| BenchError::Invalid {
        field: "--launch",
        value: port.to_string(),
        reason,
    })?;
    let mut server = launch::Server::spawn(&l, port, &spec.output_dir)?;
    let progress = spec.progress;
    let start = async {
        let clients = Clients::new(spec.target.connect_timeout)?;
        let startup = server
            .wait_ready(&clients, &spec.target, l.timeout, progress)
            .await?;
        let version = launch::version(&clients, &spec.target).await;
        let warmup = launch::warm_up(&clients, &spec.target, &l.model).await?;
        Ok::<_, BenchError>(launch::ServerInfo {
            launcher: l.launcher.name(),
            command: server.command.clone(),
            port,
            version,
            startup_s: startup.as_secs_f64(),
            warmup_s: warmup.as_secs_f64(),
            log: server.log.clone(),
        })
    };
    let started = tokio::select! {
        r = start => r,
        () = stop.cancelled() => Err(BenchError::Launch(launch::LaunchError::Interrupted)),
    };
    let result = match started {
        Ok(info) => run_on(spec, Some(info), stop).await,
        Err(e) => Err(e),
    };
    let status = tokio::task::spawn_blocking(move || server.stop(launch::STOP_GRACE))
        .await
        .ok()
        .flatten();
    if progress {
        eprintln!(
            "lmperf run: server stopped ({})",
            status.as_deref().unwrap_or("already gone")
        );
    }
    result
}

async fn run_on(
    spec: RunSpec,
    server: Option<launch::ServerInfo>,
    stop: &CancellationToken,
) -> Result<Summary, BenchError> {
    let interrupted = |during: &str, completed: usize| BenchError::Interrupted {
        during: during.to_owned(),
        completed,
        dir: spec.output_dir.clone(),
    };
    let clients = Clients::new(spec.target.connect_timeout)?;
    for t in std::iter::once(&spec.target).chain(&spec.traffic.more_endpoints) {
        launch::reachable(t)
            .await
            .map_err(|reason| BenchError::Unreachable {
                url: t.base_url.to_string(),
                reason,
            })?;
    }
    let telemetry = match &spec.otlp {
        Some(cfg) => Some(Arc::new(export::BenchTelemetry::start(
            cfg,
            &crate::config::ProcessEnv,
        )?)),
        None => None,
    };
    let model = match &spec.target.model {
        Some(m) => m.clone(),
        None => client::discover_model(&clients, &spec.target)
            .await
            .map(|d| d.model)
            .map_err(|r| {
                BenchError::NoModel(
                    r.error
                        .map(|e| format!("{}: {}", e.error_type, e.message.unwrap_or_default()))
                        .unwrap_or_default(),
                )
            })?,
    };
    let tok = match &spec.workload.tokenizer {
        Some(local) => TokenizeClient::local(&clients, &spec.target, &model, local.clone()),
        None => TokenizeClient::detect(&clients, &spec.target, &model).await,
    };
    if spec.progress {
        let kind = serde_json::to_value(tok.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        eprintln!(
            "lmperf run: target {} model {model} tokenizer {kind}",
            spec.target.base_url
        );
    }
    let tok = tokens::setup(
        tok,
        spec.workload.chat_template.as_ref(),
        spec.workload.tokenizer.as_ref(),
        spec.target.api,
        spec.progress,
    )
    .await?;
    // Chat prompts shorter than the template itself cannot be sent: warned, and the summary's
    // input_len is then the achieved mean.
    let template_floor = match spec.target.api {
        Api::Chat if !spec.workload.own_inputs() => tokens::template_floor(&tok).await,
        _ => None,
    };
    if spec.progress
        && let Some(w) = template_floor
            .and_then(|f| chat_template::short_lengths_warning(&spec.input_lengths, f))
    {
        eprintln!("{w}");
    }
    let mut extra = serde_json::Map::new();
    if spec.ignore_eos {
        extra.insert("ignore_eos".into(), serde_json::Value::Bool(true));
    }
    if spec.n > 1 {
        extra.insert("n".into(), serde_json::Value::from(spec.n));
    }
    if spec.workload.multi_turn && spec.target.api != Api::Chat {
        return Err(BenchError::Invalid {
            field: "--multi-turn",
            value: "completions".into(),
            reason: "multi-turn needs --api chat".into(),
        });
    }
    // Each request of a shared-prefix workload is its group's prefix and a unique suffix, so the
    // prefix must leave room in every input length (a distribution's lengths are drawn later).
    if let (Some(p), None, Some(&shortest)) = (
        spec.workload.shared_prefix,
        &spec.workload.input_dist,
        spec.input_lengths.iter().min(),
    ) && p.len >= shortest
    {
        return Err(BenchError::Invalid {
            field: "--prefix-len",
            value: p.len.to_string(),
            reason: format!(
                "the shared prefix must be shorter than the shortest --seq-lengths ({shortest} tokens): each request needs a unique suffix"
            ),
        });
    }
    let ctx = RunContext {
        spec: &spec,
        clients: &clients,
        model: &model,
        extra: &extra,
        tok: &tok,
        telemetry: telemetry.clone(),
    };
    let watch = vram::VramWatch::start(&spec.gpu);
    let mut server_watch = server::ServerWatch::start(&spec.target);
    // Rows go to requests.jsonl, the length buckets and the report's sample as they finish.
    let mut out = rows::RunRows::new(&spec.output_dir, spec.seed);
    let mut benchmarks = Vec::new();
    let mut capacity = None;
    let mut profile_info = None;
    if let Some((path, p)) = &spec.profile {
        let name = format!("profile_{}", p.name);
        let concurrency = spec.concurrencies.iter().copied().max().unwrap_or(1);
        server_watch.mark().await;
        let mut s = aggregate::Summarizer::new(spec.goodput);
        out.begin();
        let mut sink = |r: RequestRow| {
            s.push(&r);
            out.push(r);
        };
        let run = profile::run::run(&ctx, path, p.clone(), &name, &mut sink);
        let info = tokio::select! {
            r = run => r?,
            () = stop.cancelled() => {
                out.discard();
                return Err(interrupted(&name, 0));
            }
        };
        out.commit();
        let input = spec.input_lengths.first().copied().unwrap_or(128);
        let mut summary = s.finish(shape(&spec, &name, concurrency, input));
        summary.server = server_watch.take(&name).await;
        if spec.progress {
            eprintln!("{}", result_line(&summary));
        }
        benchmarks.push(summary);
        profile_info = Some(info);
    }
    let input_lengths = if spec.find_rate.is_some() || spec.profile.is_some() {
        Vec::new()
    } else if spec.workload.own_inputs() {
        vec![0]
    } else {
        spec.input_lengths.clone()
    };
    let mut stopped_during = None;
    if let Some(f) = &spec.find_rate {
        // Ctrl-C: the steps that completed are written with a partial `capacity`.
        let (benches, c, cut) = find_rate::search(&ctx, f, &mut out, stop).await?;
        (benchmarks, capacity, stopped_during) = (benches, Some(c), cut);
    }
    'benchmarks: for &input_len in &input_lengths {
        for &concurrency in &spec.concurrencies {
            let name = format!("c{concurrency}_{}", spec.workload.label(input_len));
            out.begin();
            let one = async {
                // Fresh prompts per benchmark: a server's prefix cache must not carry one
                // benchmark's prompts into the next.
                let mut all = aggregate::Summarizer::new(spec.goodput);
                let mut per_repeat = Vec::new();
                let mut summary_input_len = input_len;
                let (mut warmup_requests, mut warmup_s) = (0usize, 0.0f64);
                for k in 0..spec.repeat.max(1) {
                    // Each repeat: fresh prompts too (the first is the run without --repeat), on
                    // the same schedule.
                    let seed = spec.seed
                        ^ (concurrency as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        ^ (k as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
                    let (warm, measured) = match &spec.workload.trace {
                        // A trace replays all its requests; warm-up sends the shapes of its first ones
                        // with other prompts (no prefix-cache hit carried into the measured replay).
                        Some(t) => (
                            feed::ItemSource::new(
                                &spec,
                                &tok,
                                spec.warmup,
                                input_len,
                                seed ^ 0x5741_524D_5550,
                            ),
                            feed::ItemSource::new(
                                &spec,
                                &tok,
                                t.trace.requests.len(),
                                input_len,
                                seed,
                            ),
                        ),
                        None => (
                            feed::ItemSource::new(&spec, &tok, spec.warmup, input_len, seed),
                            feed::ItemSource::new(
                                &spec,
                                &tok,
                                spec.warmup + spec.num_prompts,
                                input_len,
                                seed,
                            )
                            .skip(spec.warmup),
                        ),
                    };
                    if !warm.is_empty() {
                        let started = std::time::Instant::now();
                        let mut sent = 0usize;
                        one_benchmark(
                            &ctx,
                            &name,
                            concurrency,
                            warm,
                            None,
                            &mut |_: RequestRow| sent += 1,
                        )
                        .await?;
                        warmup_requests += sent;
                        warmup_s += started.elapsed().as_secs_f64();
                    }
                    let schedule = feed::Schedule::new(&spec, measured.len(), spec.seed)?;
                    if k == 0 {
                        watch.reset();
                        server_watch.mark().await;
                    }
                    let mut this = aggregate::Summarizer::new(spec.goodput);
                    // Mean input of the first turns (length distributions, files, traces).
                    let (mut first_turns, mut first_turn_tokens, mut first_turn_sent) =
                        (0usize, 0.0f64, 0.0f64);
                    let mut sink = |mut r: RequestRow| {
                        r.repeat = k;
                        all.push(&r);
                        if spec.repeat > 1 {
                            this.push(&r);
                        }
                        if r.turn == 0 && !r.probe {
                            first_turns += 1;
                            first_turn_tokens += f64::from(r.prompt_tokens_target);
                            first_turn_sent += f64::from(r.prompt_tokens);
                        }
                        out.push(r);
                    };
                    one_benchmark(
                        &ctx,
                        &name,
                        concurrency,
                        measured,
                        Some(schedule),
                        &mut sink,
                    )
                    .await?;
                    if spec.workload.own_inputs() {
                        summary_input_len =
                            (first_turn_tokens / first_turns.max(1) as f64).round() as u32;
                    } else if template_floor.is_some_and(|f| input_len < f) && first_turns > 0 {
                        summary_input_len = (first_turn_sent / first_turns as f64).round() as u32;
                    }
                    if spec.repeat > 1 {
                        per_repeat.push(this.finish(shape(
                            &spec,
                            &name,
                            concurrency,
                            summary_input_len,
                        )));
                    }
                }
                let mut summary = all.finish(shape(&spec, &name, concurrency, summary_input_len));
                summary.repeat = repeat::repeat_stats(&per_repeat);
                (summary.warmup_requests, summary.warmup_s) = (warmup_requests, warmup_s);
                summary.vram = watch.take(summary.output_token_throughput);
                watch.take_samples(&name);
                summary.server = server_watch.take(&name).await;
                if spec.progress {
                    eprintln!("{}", result_line(&summary));
                    if let Some(w) = behind_warning(&summary, spec.request_rate) {
                        eprintln!("{w}");
                    }
                }
                Ok::<_, BenchError>(summary)
            };
            let summary = tokio::select! {
                r = one => r?,
                () = stop.cancelled() => {
                    // Only completed benchmarks are written: this one's rows are cut.
                    out.rollback();
                    stopped_during = Some(name);
                    break 'benchmarks;
                }
            };
            out.commit();
            benchmarks.push(summary);
        }
    }
    if let Some(name) = &stopped_during
        && benchmarks.is_empty()
    {
        watch.stop();
        out.discard();
        return Err(interrupted(name, 0));
    }
    let gpu = watch.status();
    let gpu_samples = watch.rows();
    watch.stop();
    let server_samples = server_watch.stop().await;
    let (length_buckets, sample) =
        out.finish(spec.goodput)
            .map_err(|source| BenchError::Output {
                path: spec.output_dir.join("requests.jsonl"),
                source,
            })?;
    let failed_gates = spec
        .fail_on
        .iter()
        .filter(|g| benchmarks.iter().any(|b| gate_trips(g, b)))
        .map(|g| g.text.clone())
        .collect();
    let summary = Summary {
        schema_version: SCHEMA_VERSION,
        lmperf_version: env!("CARGO_PKG_VERSION"),
        target: spec.target.base_url.to_string(),
        model,
        api: match spec.target.api {
            Api::Chat => "chat",
            Api::Completions => "completions",
        },
        tokenizer: tok.kind,
        seed: spec.seed,
        goodput_slo: spec.goodput,
        benchmarks,
        length_buckets,
        gpu,
        trace: spec
            .workload
            .trace
            .as_ref()
            .map(workload::TraceReplay::info),
        workload: spec.workload.info(),
        failed_gates,
        launch: server,
        capacity,
        profile: profile_info,
        interrupted: stopped_during.is_some(),
        prompt_tokens_source: tok.source(),
        chat_template: tok.chat.as_ref().map(tokens::ChatCounting::describe),
        prompt_tokens_mismatch: 0,
    };
    let summary = prompt_tokens::checked(summary, spec.progress);
    write_outputs(&spec.output_dir, &sample, &summary)?;
    server::write_samples(&spec.output_dir, &server_samples).map_err(|source| {
        BenchError::Output {
            path: spec.output_dir.clone(),
            source,
        }
    })?;
    vram::write_samples(&spec.output_dir, &gpu_samples).map_err(|source| BenchError::Output {
        path: spec.output_dir.clone(),
        source,
    })?;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    match stopped_during {
        Some(name) => Err(interrupted(&name, summary.benchmarks.len())),
        None => Ok(summary),
    }
}

/// The line printed as a benchmark ends: `lmperf run: c1_in8: 10 requests, 10 ok, …`.
fn result_line(summary: &BenchSummary) -> String {
    let errors = if summary.errors.is_empty() {
        String::new()
    } else {
        format!(", failed: {}", summary.error_reasons().join("; "))
    };
    let ms = |d: &Option<Distribution>, f: fn(&Distribution) -> f64| {
        crate::fmt::opt_duration_ms(d.as_ref().map(f))
    };
    format!(
        "lmperf run: {}: {} requests, {} ok{errors}, {}, {}, TTFT p50 {} p99 {}, E2EL p99 {}",
        summary.benchmark,
        summary.num_requests,
        summary.completed,
        crate::fmt::rate(summary.request_throughput, "req/s"),
        crate::fmt::rate(summary.output_token_throughput, "tok/s"),
        ms(&summary.ttft_ms, |d| d.p50),
        ms(&summary.ttft_ms, |d| d.p99),
        ms(&summary.e2el_ms, |d| d.p99),
    )
}

/// Dispatch delay p99 above which an open-loop schedule counts as fallen behind: one
/// inter-arrival gap at `rate`, at least [`BEHIND_FLOOR_MS`].
pub const BEHIND_FLOOR_MS: f64 = 100.0;

/// The warning when an open-loop benchmark (`rate` req/s) could not send on schedule: its
/// dispatch delay p99 above the bound (the concurrency limit held requests back).
fn behind_warning(summary: &BenchSummary, rate: Option<f64>) -> Option<String> {
    let rate = rate?;
    let bound = (1000.0 / rate).max(BEHIND_FLOOR_MS);
    let p99 = summary.dispatch_delay_ms.as_ref()?.p99;
    (p99 > bound).then(|| {
        format!(
            "lmperf run: warning: {}: the schedule fell behind (dispatch delay p99 {} > {} at {} offered; achieved {}): concurrency {} holds requests back; raise --batch-sizes (concurrency)",
            summary.benchmark,
            crate::fmt::duration_ms(p99),
            crate::fmt::duration_ms(bound),
            crate::fmt::rate(rate, "req/s"),
            crate::fmt::rate(summary.request_throughput, "req/s"),
            summary.concurrency,
        )
    })
}

/// Writes `rows` as JSON lines to `path`; nothing (no file) when `rows` is empty.
///
/// # Errors
/// A row cannot be serialized or the file cannot be written.
fn write_jsonl<T: Serialize>(path: &std::path::Path, rows: &[T]) -> std::io::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut lines = String::new();
    for r in rows {
        lines.push_str(&serde_json::to_string(r).map_err(std::io::Error::other)?);
        lines.push('\n');
    }
    std::fs::write(path, lines)
}

/// Writes `summary.json`, `summary.csv` ([`summary_csv`]) and `report.html` (`requests.jsonl` is written as rows finish, see
/// [`rows`]); `sample`: the report's rows ([`rows::REPORT_SAMPLE`] per benchmark at most).
fn write_outputs(
    dir: &std::path::Path,
    sample: &[RequestRow],
    summary: &Summary,
) -> Result<(), BenchError> {
    let io = |source| BenchError::Output {
        path: dir.to_owned(),
        source,
    };
    let text = serde_json::to_string_pretty(summary).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(dir.join("summary.json"), text + "\n").map_err(io)?;
    let csv = summary_csv::render(&summary.benchmarks).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(dir.join("summary.csv"), csv).map_err(io)?;
    std::fs::write(dir.join("report.html"), report::render(summary, sample)).map_err(io)
}

/// Sends one benchmark's `items` on `schedule` (`None`: the warm-up, closed loop) and passes
/// each finished request's rows to `on_row` in `(index, turn)` order ([`rows::Reorder`]).
/// Nothing here grows with the item count: items are made as they are due ([`feed`]), and a
/// row leaves once it is in order. Dropped (Ctrl-C), it stops sending and cancels the
/// requests in flight.
async fn one_benchmark(
    ctx: &RunContext<'_>,
    name: &str,
    concurrency: usize,
    items: feed::ItemSource,
    schedule: Option<feed::Schedule>,
    on_row: &mut dyn FnMut(RequestRow),
) -> Result<(), BenchError> {
    let (spec, clients, model, extra) = (ctx.spec, ctx.clients, ctx.model, ctx.extra);
    let n = items.len();
    // Warm-up (no schedule) runs closed loop and is not exported; measured runs follow the
    // schedule.
    let measured = schedule.is_some();
    let telemetry = ctx.telemetry.clone().filter(|_| measured);
    let schedule = schedule.unwrap_or_else(|| feed::Schedule::zero(n));
    // Every offset 0 (no rate, no trace): each request waits for a slot (closed loop).
    let closed_loop = schedule.closed_loop();
    let mut feed = items.start().await;
    let endpoints = traffic::Endpoints::new(
        &spec.target,
        &spec.traffic.more_endpoints,
        spec.traffic.endpoint_policy,
    );
    let lora = spec.traffic.lora.clone().map(Arc::new);
    let seed = spec.seed;
    let extra = Arc::new(extra.clone());
    let model: Arc<str> = Arc::from(model);
    let counters = progress::Counters::default();
    let (done, errors) = (counters.done.clone(), counters.errors.clone());
    let shown = progress::Progress::start(name, n, &counters, spec.progress && measured);
    let cancel = CancellationToken::new();
    // Dropped (the benchmark interrupted): no more sends, the requests in flight cancelled.
    let _cancel_on_drop = cancel.clone().drop_guard();
    let t0 = Instant::now() + Duration::from_millis(10);
    let (bench_name, multi_turn, ignore_eos, max_offset) = (
        name.to_owned(),
        spec.workload.multi_turn,
        spec.ignore_eos,
        spec.duration,
    );
    // The dispatcher runs on its own thread: it sleeps until each send (no spinning on the
    // runtime's workers, which do the HTTP), waits for a free slot, and spawns the request.
    let slots = match spec.workload.ramp {
        // Measured runs of a concurrency ramp: closed loop, slots follow the ramp.
        Some(r) if measured && r.over == workload::RampOver::Concurrency => {
            slots::Slots::ramp(r, t0, spec.duration.map(|d| t0 + d))
        }
        _ => slots::Slots::fixed(concurrency),
    };
    // Finished requests' rows, to the collector below (bounded: a full queue holds the
    // requests' tasks, not the dispatcher).
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(usize, Vec<RequestRow>)>(1024);
    // `--probe-rate`: canary probes beside the measured load, until its last request ends.
    let probes = match spec.traffic.probe_rate {
        Some(rate) if measured => Some(probe::start(probe::ProbeRun {
            clients: clients.clone(),
            endpoints: endpoints.clone(),
            model: model.clone(),
            name: name.to_owned(),
            concurrency,
            rate,
            t0,
            cancel: cancel.clone(),
        })),
        _ => None,
    };
    let (handle, clients) = (tokio::runtime::Handle::current(), clients.clone());
    let dispatcher = tokio::task::spawn_blocking(move || {
        crate::canary::schedule::pacer_thread_init();
        for (i, offset) in schedule.enumerate().take(n) {
            if cancel.is_cancelled() || max_offset.is_some_and(|d| offset > d) {
                break;
            }
            let scheduled = t0 + offset;
            let Some(item) = feed.next_blocking() else {
                break;
            };
            crate::canary::schedule::pace_until(scheduled.into_std());
            let Some((permit, limit, free_since)) = handle.block_on(slots.acquire_timed()) else {
                break;
            };
            let dispatched = Instant::now();
            // Closed loop: a request is due when its slot became free.
            let scheduled = if closed_loop {
                scheduled.max(free_since)
            } else {
                scheduled
            };
            // The endpoint, held (in flight) until the request's last turn ends.
            let hold = endpoints.pick();
            let adapter = lora.as_ref().map(|l| l.adapter_for(seed, i).to_owned());
            let (clients, target, extra, model, task_done, task_errors, cancel) = (
                clients.clone(),
                hold.target.clone(),
                extra.clone(),
                adapter.as_deref().map_or_else(|| model.clone(), Arc::from),
                done.clone(),
                errors.clone(),
                cancel.clone(),
            );
            let (bench_name, telemetry, tx) = (bench_name.clone(), telemetry.clone(), tx.clone());
            handle.spawn(async move {
                let mut extra = (*extra).clone();
                if ignore_eos {
                    extra.insert("min_tokens".into(), serde_json::Value::from(item.max_tokens));
                }
                let mut rows = Vec::with_capacity(1 + item.next_turns.len());
                let mut messages = if multi_turn { vec![item.extras.user_message(&item.prompt.text)] } else { Vec::new() };
                let mut prompt = item.prompt.clone();
                let (mut scheduled, mut dispatched) = (scheduled, dispatched);
                for turn in 0..=item.next_turns.len() {
                    if multi_turn {
                        extra.insert("messages".into(), serde_json::Value::Array(messages.clone()));
                    } else if target.api == Api::Chat && let Some(m) = item.extras.chat_messages(&prompt.text) {
                        extra.insert("messages".into(), m);
                    }
                    let ids = export::BenchTelemetry::new_trace();
                    let traceparent = ids.traceparent();
                    let req = CanaryRequest { api: target.api, model: &model, prompt: &prompt.text, max_tokens: item.max_tokens, traceparent: &traceparent, extra_body: Some(&extra) };
                    let m = client::execute_with(&clients, &target, &req, &cancel, multi_turn).await;
                    if let Some(t) = &telemetry {
                        t.record(&export::RequestContext { target: &target, model: &model, benchmark: &bench_name, max_tokens: item.max_tokens, index: i }, ids, &m);
                    }
                    let ok = m.record.outcome == Outcome::Ok;
                    if !ok {
                        task_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut r = row(RowKey { name: &bench_name, index: i, turn: turn as u32, concurrency, concurrency_limit: limit }, t0, scheduled, dispatched, &prompt, item.max_tokens, &m);
                    (r.adapter, r.endpoint) = (adapter.clone(), hold.label.clone());
                    item.extras.tag(&mut r);
                    rows.push(r);
                    // The next turn: after this answer, with the history.
                    let Some((text, tokens)) = item.next_turns.get(turn).cloned() else { break };
                    if !ok {
                        break;
                    }
                    messages.push(serde_json::json!({ "role": "assistant", "content": m.record.output_text.unwrap_or_default() }));
                    messages.push(serde_json::json!({ "role": "user", "content": text }));
                    prompt = item.next_turn_prompt(&messages, text, tokens).await;
                    (scheduled, dispatched) = (Instant::now(), Instant::now());
                }
                // The endpoint first: the next request, dispatched as the slot frees, sees
                // this one's endpoint no longer in flight (least-outstanding).
                drop(hold);
                drop(permit);
                task_done.fetch_add(1, Ordering::Relaxed);
                // The collector is gone only when the benchmark was dropped.
                let _ = tx.send((i, rows)).await;
            });
        }
        // The dispatcher's sender drops here; the channel closes when every request's has.
    });
    // Rows back in (index, turn) order as they finish; the channel ends with the last request.
    let mut reorder = rows::Reorder::default();
    while let Some((i, r)) = rx.recv().await {
        reorder.push(i, r, on_row);
    }
    reorder.finish(on_row);
    dispatcher
        .await
        .map_err(|e| BenchError::Dispatcher(e.to_string()))?;
    // The load has ended: no more probes; those in flight finish, their rows follow the
    // benchmark's.
    if let Some(p) = probes {
        p.finish().await.into_iter().for_each(&mut *on_row);
    }
    shown.finish().await;
    Ok(())
}

/// Which request a [`RequestRow`] is: its benchmark, index and turn, and the concurrency it
/// ran at with the limit then in force (`RequestRow::concurrency_limit`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowKey<'a> {
    pub name: &'a str,
    pub index: usize,
    pub turn: u32,
    pub concurrency: usize,
    pub concurrency_limit: usize,
}

fn row(
    RowKey {
        name,
        index,
        turn,
        concurrency,
        concurrency_limit,
    }: RowKey<'_>,
    t0: Instant,
    scheduled: Instant,
    dispatched: Instant,
    prompt: &Prompt,
    max_tokens: u32,
    m: &Measured,
) -> RequestRow {
    let r = &m.record;
    let delay = dispatched.saturating_duration_since(scheduled);
    RequestRow {
        schema_version: SCHEMA_VERSION,
        benchmark: name.to_owned(),
        index,
        repeat: 0,
        concurrency,
        concurrency_limit,
        scheduled_ms: ms(scheduled.saturating_duration_since(t0)),
        dispatch_delay_ms: ms(delay),
        send_ms: ms(dispatched.saturating_duration_since(t0)),
        ttft_ms: r.ttft.map(ms),
        ttft_from_schedule_ms: r.ttft.map(|t| ms(t + delay)),
        time_to_first_content_ms: r.time_to_first_content.map(ms),
        itl_ms: r.itl.iter().map(|d| ms(*d)).collect(),
        tpot_ms: r.tpot.map(ms),
        e2el_ms: ms(r.e2e),
        e2el_from_schedule_ms: ms(r.e2e + delay),
        prompt_tokens: prompt.tokens,
        prompt_tokens_target: prompt.target_tokens,
        output_tokens_target: max_tokens,
        turn,
        input_tokens: r.input_tokens,
        output_tokens: r.output_tokens,
        usage_source: r.usage_source.map(|s| s.as_str()),
        finish_reasons: r.finish_reasons.clone(),
        outcome: r.outcome.as_str(),
        error_type: r.failure().map(|e| e.error_type.clone()),
        http_status: r.http_status,
        retries: m.retries,
        profile_revision: None,
        error_server_type: r.failure().and_then(|e| e.server_type.clone()),
        error_code: r.failure().and_then(|e| e.code.clone()),
        error_message: r.failure().and_then(|e| e.message.clone()),
        retry_after_ms: r.failure().and_then(|e| e.retry_after).map(ms),
        choices: r
            .choices
            .iter()
            .map(|c| ChoiceRow {
                index: c.index,
                ttft_ms: c.first_token.map(ms),
                last_token_ms: c.last_token.map(ms),
                token_chunks: c.token_chunks,
                itl_ms: c.itl.iter().map(|d| ms(*d)).collect(),
                tpot_ms: c.tpot.map(ms),
                finish_reason: c.finish_reason.clone(),
            })
            .collect(),
        prompt_tokens_source: prompt.source,
        adapter: None,
        endpoint: None,
        probe: false,
        cached_input_tokens: r.cached_input_tokens,
        ..RequestRow::default()
    }
}

/// The summary of one benchmark's rows. Latency distributions use the successful requests
/// only (a failed request has no meaningful TTFT); errors are counted by type. Percentiles
/// from bounded histograms at 3 significant digits ([`aggregate`]); the rest exact.
pub fn summarize(
    spec: &RunSpec,
    name: &str,
    concurrency: usize,
    input_len: u32,
    rows: &[RequestRow],
) -> BenchSummary {
    let mut s = aggregate::Summarizer::new(spec.goodput);
    rows.iter().for_each(|r| s.push(r));
    s.finish(shape(spec, name, concurrency, input_len))
}

/// What a benchmark's summary says besides its rows' figures.
fn shape<'a>(
    spec: &RunSpec,
    name: &'a str,
    concurrency: usize,
    input_len: u32,
) -> aggregate::BenchShape<'a> {
    let own_output = spec.workload.output_dist.is_some() || spec.workload.trace.is_some();
    aggregate::BenchShape {
        name,
        concurrency,
        input_len,
        output_len: (!own_output).then_some(spec.output_len),
        request_rate: spec.request_rate,
    }
}

/// Parses `ttft_p99_ms>500`, `e2el_mean_ms>2000`, `error_rate>0.01`, `vram_pct>92` (peak
/// used VRAM of any one GPU, percent; a benchmark without GPU figures does not trip it).
pub fn parse_gate(text: &str) -> Result<Gate, String> {
    let (name, limit) = text
        .split_once('>')
        .ok_or_else(|| format!("{text:?}: expected NAME>VALUE, e.g. ttft_p99_ms>500"))?;
    let limit: f64 = limit
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: {limit:?} is not a number"))?;
    let name = name.trim();
    // `--probe-rate`: the same gates on the probes alone (`probe_ttft_p99_ms>300`).
    if let Some(inner) = name.strip_prefix("probe_") {
        if inner == "vram_pct" || inner.starts_with("probe_") {
            return Err(format!(
                "{text:?}: probe_ gates are probe_METRIC_STAT_ms or probe_error_rate"
            ));
        }
        let g = parse_gate(&format!("{inner}>{limit}"))?;
        return Ok(Gate {
            text: text.to_owned(),
            metric: format!("probe_{}", g.metric),
            ..g
        });
    }
    if name == "error_rate" || name == "vram_pct" {
        return Ok(Gate {
            text: text.to_owned(),
            metric: name.to_owned(),
            stat: None,
            limit,
        });
    }
    let body = name.strip_suffix("_ms").ok_or_else(|| {
        format!(
            "{text:?}: expected METRIC_STAT_ms (ttft|itl|tpot|e2el, mean|p50|p90|p95|p99|p99.9|max)"
        )
    })?;
    let (metric, stat) = body
        .split_once('_')
        .ok_or_else(|| format!("{text:?}: expected METRIC_STAT_ms"))?;
    if !["ttft", "itl", "tpot", "e2el"].contains(&metric)
        || Distribution::default().get(stat).is_none()
    {
        return Err(format!("{text:?}: unknown metric or statistic"));
    }
    Ok(Gate {
        text: text.to_owned(),
        metric: metric.to_owned(),
        stat: Some(stat.to_owned()),
        limit,
    })
}

fn gate_trips(g: &Gate, b: &BenchSummary) -> bool {
    if let Some(metric) = g.metric.strip_prefix("probe_") {
        // No probe block, or no value in it: the gate cannot be checked, so it trips.
        return b
            .probes
            .as_ref()
            .and_then(|p| p.value(metric, g.stat.as_deref()))
            .is_none_or(|v| v > g.limit);
    }
    if g.metric == "error_rate" {
        let failed: usize = b.errors.values().sum();
        return b.num_requests > 0 && failed as f64 / b.num_requests as f64 > g.limit;
    }
    if g.metric == "vram_pct" {
        return b.vram.as_ref().is_some_and(|v| v.peak_used_pct > g.limit);
    }
    let d = match g.metric.as_str() {
        "ttft" => &b.ttft_ms,
        "itl" => &b.itl_ms,
        "tpot" => &b.tpot_ms,
        _ => &b.e2el_ms,
    };
    // No value (no successful request, or no request-level TPOT with n > 1): the gate cannot
    // be checked, so it trips rather than pass a run whose every request failed.
    d.as_ref()
        .and_then(|d| d.get(g.stat.as_deref().unwrap_or("mean")))
        .is_none_or(|v| v > g.limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--request-rate 10` at concurrency 1 with requests of ~400 ms: the dispatch delay grows
    /// to seconds; the warning names the figures and --batch-sizes. On schedule: no warning.
    #[test]
    fn a_schedule_that_fell_behind_is_warned() {
        let summary = |delays: &[f64]| {
            let mut s = aggregate::Summarizer::new(Goodput {
                ttft_ms: None,
                tpot_ms: None,
                e2el_ms: None,
            });
            for (i, &d) in delays.iter().enumerate() {
                s.push(&RequestRow {
                    outcome: "ok",
                    send_ms: i as f64 * 400.0,
                    e2el_ms: 400.0,
                    dispatch_delay_ms: d,
                    ..RequestRow::default()
                });
            }
            s.finish(aggregate::BenchShape {
                name: "c1_in8",
                concurrency: 1,
                input_len: 8,
                output_len: Some(4),
                request_rate: Some(10.0),
            })
        };
        let behind = summary(&(0..100).map(|i| f64::from(i) * 60.0).collect::<Vec<_>>());
        let w = behind_warning(&behind, Some(10.0)).unwrap();
        assert!(w.starts_with("lmperf run: warning: c1_in8: the schedule fell behind (dispatch delay p99 5.88 s > 100 ms at 10.0 req/s offered; achieved "), "{w}");
        assert!(
            w.ends_with("concurrency 1 holds requests back; raise --batch-sizes (concurrency)"),
            "{w}"
        );
        assert_eq!(behind_warning(&summary(&[1.0; 100]), Some(10.0)), None);
        assert_eq!(
            behind_warning(&behind, None),
            None,
            "closed loop: no schedule"
        );
    }

    #[test]
    fn gates_parse_and_reject() {
        let g = parse_gate("ttft_p99_ms>500").unwrap();
        assert_eq!(
            (g.metric.as_str(), g.stat.as_deref(), g.limit),
            ("ttft", Some("p99"), 500.0)
        );
        assert!(parse_gate("error_rate>0.01").is_ok());
        assert_eq!(parse_gate("vram_pct>92").unwrap().metric, "vram_pct");
        assert!(parse_gate("ttft_p99>500").is_err());
        assert!(parse_gate("latency_p99_ms>5").is_err());
        assert!(parse_gate("ttft_p98_ms>5").is_err());
        let p = parse_gate("probe_ttft_p99_ms>300").unwrap();
        assert_eq!(
            (
                p.metric.as_str(),
                p.stat.as_deref(),
                p.limit,
                p.text.as_str()
            ),
            ("probe_ttft", Some("p99"), 300.0, "probe_ttft_p99_ms>300")
        );
        assert_eq!(
            parse_gate("probe_error_rate>0").unwrap().metric,
            "probe_error_rate"
        );
        assert!(parse_gate("probe_vram_pct>9").is_err());
        assert!(parse_gate("probe_latency_p99_ms>9").is_err());
    }
}
