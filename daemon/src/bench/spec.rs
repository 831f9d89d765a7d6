//! What a run is asked to do ([`RunSpec`], built by the CLI layer from `lmperf run`'s flags),
//! its goodput SLOs and gates, and the errors that stop it before it measures.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::{find_rate, launch, profile, traffic, vram, workload};
use crate::config::TargetConfig;
pub use crate::load::arrival::RunArrival;

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

impl RunSpec {
    /// What the item and schedule feed ([`crate::load::feed`]) needs of this run.
    pub fn feed(&self) -> crate::load::feed::FeedSpec<'_> {
        crate::load::feed::FeedSpec {
            workload: &self.workload,
            num_prompts: self.num_prompts,
            output_len: self.output_len,
            request_rate: self.request_rate,
            arrival: self.arrival,
        }
    }
}
