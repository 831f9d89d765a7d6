//! What `lmperf run` sends and when, beyond fixed lengths at a steady rate: input and output
//! length distributions (`--input-dist`, `--output-dist`), rate and concurrency ramps
//! (`--ramp`, `--ramp-over`), trace
//! replay (`--trace`, see [`super::trace`]) and prompt files with multi-turn conversations
//! (`--prompt-file`, `--multi-turn`, see [`super::dataset`]). Everything is drawn from
//! `--seed`: the same seed gives the same lengths, prompts and schedule.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution as _, LogNormal, Normal, Zipf};
use serde::Serialize;

use super::dataset::PromptSet;
use super::tokens::LocalTokenizer;
use super::trace::{Trace, TraceFormat};

/// A distribution of token lengths. Samples are rounded and clipped to `[1, 1_000_000]`
/// (and to `min` / `max` where given).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LengthDist {
    Fixed(u32),
    /// Uniform integers in `[min, max]`.
    Uniform {
        min: u32,
        max: u32,
    },
    /// Normal with this mean and standard deviation, clipped to `[min, max]`.
    Normal {
        mean: f64,
        std: f64,
        min: u32,
        max: u32,
    },
    /// `exp(N(mu, sigma²))` (mean `exp(mu + sigma²/2)`), clipped to `[min, max]`.
    Lognormal {
        mu: f64,
        sigma: f64,
        min: u32,
        max: u32,
    },
    /// Zipf over `1..=n` with exponent `s` (P(k) ∝ k^−s).
    Zipf {
        n: u32,
        s: f64,
    },
}

const MAX_LEN: u32 = 1_000_000;

impl LengthDist {
    /// Parses `fixed:N`, `uniform:min=A,max=B`, `normal:mean=M,std=S[,min=A][,max=B]`,
    /// `lognormal:mu=M,sigma=S[,min=A][,max=B]`, `zipf:n=N,s=S`. `flag` names the flag in
    /// errors, which are one line naming the flag, the value and what is wrong.
    pub fn parse(flag: &str, text: &str) -> Result<Self, String> {
        let bad = |why: String| format!("{flag} {text:?}: {why}");
        let (kind, params) = text.split_once(':').unwrap_or((text, ""));
        let mut kv: Vec<(&str, f64)> = Vec::new();
        for p in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = match p.split_once('=') {
                Some((k, v)) => (k.trim(), v.trim()),
                None if kind == "fixed" => ("value", p),
                None => return Err(bad(format!("{p:?}: expected NAME=VALUE"))),
            };
            let v: f64 = v
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite())
                .ok_or_else(|| bad(format!("{k} = {v:?} is not a number")))?;
            kv.push((k, v));
        }
        let allowed: &[&str] = match kind {
            "fixed" => &["value"],
            "uniform" => &["min", "max"],
            "normal" => &["mean", "std", "min", "max"],
            "lognormal" => &["mu", "sigma", "min", "max"],
            "zipf" => &["n", "s"],
            _ => {
                return Err(bad(format!(
                    "unknown distribution {kind:?} (fixed, uniform, normal, lognormal, zipf)"
                )));
            }
        };
        if let Some((k, _)) = kv.iter().find(|(k, _)| !allowed.contains(k)) {
            return Err(bad(format!(
                "unknown parameter {k:?} for {kind} (takes {})",
                allowed.join(", ")
            )));
        }
        let get = |k: &str| kv.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let need = |k: &str| {
            get(k).ok_or_else(|| bad(format!("{kind} needs {k}= (takes {})", allowed.join(", "))))
        };
        let len = |k: &str, v: f64| -> Result<u32, String> {
            if v >= 1.0 && v <= f64::from(MAX_LEN) && v.fract() == 0.0 {
                Ok(v as u32)
            } else {
                Err(bad(format!(
                    "{k} = {v}: a whole number of tokens in 1..={MAX_LEN}"
                )))
            }
        };
        let clip = || -> Result<(u32, u32), String> {
            let min = get("min").map_or(Ok(1), |v| len("min", v))?;
            let max = get("max").map_or(Ok(MAX_LEN), |v| len("max", v))?;
            if min > max {
                Err(bad(format!("min {min} > max {max}")))
            } else {
                Ok((min, max))
            }
        };
        let positive = |k: &str| -> Result<f64, String> {
            need(k).and_then(|v| {
                if v > 0.0 {
                    Ok(v)
                } else {
                    Err(bad(format!("{k} = {v}: must be > 0")))
                }
            })
        };
        Ok(match kind {
            "fixed" => Self::Fixed(len("value", need("value")?)?),
            "uniform" => {
                let (min, max) = (len("min", need("min")?)?, len("max", need("max")?)?);
                if min > max {
                    return Err(bad(format!("min {min} > max {max}")));
                }
                Self::Uniform { min, max }
            }
            "normal" => {
                let (min, max) = clip()?;
                let std = need("std")?;
                if std < 0.0 {
                    return Err(bad(format!("std = {std}: must be ≥ 0")));
                }
                Self::Normal {
                    mean: positive("mean")?,
                    std,
                    min,
                    max,
                }
            }
            "lognormal" => {
                let (min, max) = clip()?;
                let sigma = need("sigma")?;
                if sigma < 0.0 {
                    return Err(bad(format!("sigma = {sigma}: must be ≥ 0")));
                }
                Self::Lognormal {
                    mu: need("mu")?,
                    sigma,
                    min,
                    max,
                }
            }
            _ => Self::Zipf {
                n: len("n", need("n")?)?,
                s: positive("s")?,
            },
        })
    }

    /// `n` samples from `rng`.
    pub fn sample_n(&self, rng: &mut SmallRng, n: usize) -> Vec<u32> {
        let clipped =
            |v: f64, min: u32, max: u32| v.round().clamp(f64::from(min), f64::from(max)) as u32;
        match *self {
            Self::Fixed(v) => vec![v; n],
            Self::Uniform { min, max } => (0..n).map(|_| rng.random_range(min..=max)).collect(),
            Self::Normal {
                mean,
                std,
                min,
                max,
            } => match Normal::new(mean, std) {
                Ok(d) => (0..n).map(|_| clipped(d.sample(rng), min, max)).collect(),
                Err(_) => vec![clipped(mean, min, max); n],
            },
            Self::Lognormal {
                mu,
                sigma,
                min,
                max,
            } => match LogNormal::new(mu, sigma) {
                Ok(d) => (0..n).map(|_| clipped(d.sample(rng), min, max)).collect(),
                Err(_) => vec![clipped(mu.exp(), min, max); n],
            },
            Self::Zipf { n: k, s } => match Zipf::new(f64::from(k), s) {
                Ok(d) => (0..n).map(|_| clipped(d.sample(rng), 1, k)).collect(),
                Err(_) => vec![1; n],
            },
        }
    }
}

impl std::fmt::Display for LengthDist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Fixed(v) => write!(f, "fixed:{v}"),
            Self::Uniform { min, max } => write!(f, "uniform:min={min},max={max}"),
            Self::Normal {
                mean,
                std,
                min,
                max,
            } => write!(f, "normal:mean={mean},std={std},min={min},max={max}"),
            Self::Lognormal {
                mu,
                sigma,
                min,
                max,
            } => write!(f, "lognormal:mu={mu},sigma={sigma},min={min},max={max}"),
            Self::Zipf { n, s } => write!(f, "zipf:n={n},s={s}"),
        }
    }
}

/// Shape of a ramp (of the request rate or of the concurrency).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RampKind {
    /// `r(t) = from + (to − from)·t/D` for `t < D`, then `to`.
    Linear,
    /// `r(t) = from·(to/from)^(t/D)` for `t < D`, then `to`.
    Exponential,
    /// The linear ramp repeated every `D`.
    Sawtooth,
}

/// What a ramp drives (`--ramp-over`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RampOver {
    /// The request rate, open loop (requests per second).
    #[default]
    Rate,
    /// The number of requests in flight, closed loop: a request goes as soon as fewer than
    /// [`Ramp::concurrency_at`] are in flight.
    Concurrency,
}

/// A ramp (`--ramp KIND --ramp-from R --ramp-to R --ramp-duration D [--ramp-over rate|concurrency]`).
///
/// Over the rate (open loop): the instantaneous rate `r(t)` follows the ramp, and the i-th
/// send is where the integral of the rate `Λ(t) = ∫₀ᵗ r` reaches the i-th arrival of a
/// unit-rate process (constant: `i`; Poisson / gamma: sums of unit-mean gaps). This is the
/// time change of a renewal process, so a Poisson ramp is a non-homogeneous Poisson process
/// of intensity `r(t)`.
///
/// Over the concurrency (closed loop): the number of requests allowed in flight at `t`
/// seconds is `r(t)` rounded, at least 1 ([`Ramp::concurrency_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ramp {
    pub kind: RampKind,
    /// Requests per second (> 0 for exponential, ≥ 0 otherwise), or requests in flight
    /// (≥ 1), at the start.
    pub from: f64,
    /// Requests per second (> 0), or requests in flight (≥ 1), at the end of the ramp.
    pub to: f64,
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// What the ramp drives.
    pub over: RampOver,
}

impl Ramp {
    /// A request-rate ramp; validates the flags; errors name the flag and value.
    pub fn new(kind: &str, from: f64, to: f64, duration: Duration) -> Result<Self, String> {
        Self::new_over(kind, from, to, duration, RampOver::Rate)
    }

    /// A ramp of the rate or of the concurrency; validates the flags (a concurrency ramp goes
    /// from and to at least 1); errors name the flag and value.
    pub fn new_over(
        kind: &str,
        from: f64,
        to: f64,
        duration: Duration,
        over: RampOver,
    ) -> Result<Self, String> {
        let kind = match kind {
            "linear" => RampKind::Linear,
            "exponential" => RampKind::Exponential,
            "sawtooth" => RampKind::Sawtooth,
            k => return Err(format!("--ramp {k:?}: linear, exponential or sawtooth")),
        };
        if over == RampOver::Concurrency {
            for (flag, v) in [("--ramp-from", from), ("--ramp-to", to)] {
                if !(v.is_finite() && v >= 1.0) {
                    return Err(format!(
                        "{flag} {v}: requests in flight ≥ 1 with --ramp-over concurrency"
                    ));
                }
            }
        }
        let min_from = if kind == RampKind::Exponential {
            "> 0 for an exponential ramp"
        } else {
            "≥ 0"
        };
        if !(from.is_finite() && (from > 0.0 || (from == 0.0 && kind != RampKind::Exponential))) {
            return Err(format!(
                "--ramp-from {from}: requests per second {min_from}"
            ));
        }
        if !(to.is_finite() && to > 0.0) {
            return Err(format!("--ramp-to {to}: requests per second > 0"));
        }
        if duration.is_zero() {
            return Err("--ramp-duration 0s: longer than zero".to_owned());
        }
        Ok(Self {
            kind,
            from,
            to,
            duration,
            over,
        })
    }

    /// Requests allowed in flight at `t` seconds of a concurrency ramp: [`Ramp::rate`]
    /// rounded to the nearest integer, at least 1.
    pub fn concurrency_at(&self, t: f64) -> usize {
        self.rate(t).round().max(1.0) as usize
    }

    /// The highest [`Ramp::concurrency_at`] of the ramp (its `from` or `to`, rounded).
    pub fn max_concurrency(&self) -> usize {
        self.from.max(self.to).round().max(1.0) as usize
    }

    /// The rate at `t` seconds, requests per second.
    pub fn rate(&self, t: f64) -> f64 {
        let d = self.duration.as_secs_f64();
        let (a, b) = (self.from, self.to);
        match self.kind {
            _ if t >= d && self.kind != RampKind::Sawtooth => b,
            RampKind::Exponential => a * (b / a).powf(t / d),
            RampKind::Linear => a + (b - a) * t / d,
            RampKind::Sawtooth => a + (b - a) * t.rem_euclid(d) / d,
        }
    }

    /// `Λ(t)`: expected requests sent by `t` seconds.
    pub fn integral(&self, t: f64) -> f64 {
        let d = self.duration.as_secs_f64();
        let (a, b) = (self.from, self.to);
        let lin = |t: f64| a * t + (b - a) * t * t / (2.0 * d);
        let exp_part = |t: f64| {
            if (b - a).abs() < 1e-12 * a {
                a * t
            } else {
                a * d / (b / a).ln() * ((b / a).powf(t / d) - 1.0)
            }
        };
        match self.kind {
            RampKind::Sawtooth => (t / d).floor() * lin(d) + lin(t.rem_euclid(d)),
            RampKind::Linear if t < d => lin(t),
            RampKind::Linear => lin(d) + b * (t - d),
            RampKind::Exponential if t < d => exp_part(t),
            RampKind::Exponential => exp_part(d) + b * (t - d),
        }
    }

    /// `Λ⁻¹(x)`: the time, seconds, at which `x` requests are due.
    pub fn inverse(&self, x: f64) -> f64 {
        let d = self.duration.as_secs_f64();
        let (a, b) = (self.from, self.to);
        if x <= 0.0 {
            return 0.0;
        }
        // Root of a·t + (b − a)·t²/(2d) = x, in the form that is stable for b ≷ a.
        let lin_inv = |x: f64| 2.0 * x / (a + (a * a + 2.0 * (b - a) * x / d).max(0.0).sqrt());
        let whole = self.integral(d);
        match self.kind {
            RampKind::Sawtooth => {
                let k = (x / whole).floor();
                k * d + lin_inv(x - k * whole)
            }
            _ if x >= whole => d + (x - whole) / b,
            RampKind::Linear => lin_inv(x),
            RampKind::Exponential if (b - a).abs() < 1e-12 * a => x / a,
            RampKind::Exponential => {
                let g = (b / a).ln() / d;
                (1.0 + g * x / a).ln() / g
            }
        }
    }
}

/// Replay of a trace: its requests, the speedup (offsets are divided by it).
#[derive(Debug, Clone)]
pub struct TraceReplay {
    pub trace: Arc<Trace>,
    pub speedup: f64,
}

/// The shaping options of a run (all off by default: fixed lengths, steady rate).
#[derive(Debug, Clone, Default)]
pub struct Workload {
    pub input_dist: Option<LengthDist>,
    pub output_dist: Option<LengthDist>,
    pub trace: Option<TraceReplay>,
    /// Prompts (or conversations with `--multi-turn`) from a file (`--prompt-file`, or the
    /// usable rows of `--dataset`).
    pub prompt_file: Option<Arc<PromptSet>>,
    /// `--dataset`: its format, rows and skipped rows (its prompts are `prompt_file`).
    pub dataset: Option<super::datasets::DatasetInfo>,
    /// `--prefix-len`, `--prefix-groups`: shared system prompts.
    pub shared_prefix: Option<super::shared_prefix::SharedPrefix>,
    /// `--images-per-request`: synthetic images with every request.
    pub images: Option<super::images::SyntheticImages>,
    pub multi_turn: bool,
    pub ramp: Option<Ramp>,
    /// A local tokenizer for exact prompt lengths (`--tokenizer`).
    pub tokenizer: Option<LocalTokenizer>,
    /// `--chat-template`: the chat template to count chat requests with (else the one beside
    /// `--tokenizer`, else the server's; see [`super::chat_template`]).
    pub chat_template: Option<Arc<super::chat_template::ChatTemplate>>,
}

impl Workload {
    /// Whether the input lengths come from the workload rather than `--seq-lengths` (one
    /// benchmark per concurrency then).
    pub fn own_inputs(&self) -> bool {
        self.trace.is_some() || self.prompt_file.is_some() || self.input_dist.is_some()
    }

    /// Benchmark name part for the inputs: `in{len}`, `trace`, `file` or `dist`.
    pub fn label(&self, input_len: u32) -> String {
        if self.trace.is_some() {
            "trace".into()
        } else if self.prompt_file.is_some() {
            "file".into()
        } else if self.input_dist.is_some() {
            "dist".into()
        } else {
            format!("in{input_len}")
        }
    }

    /// What `summary.json` says about the workload.
    pub fn info(&self) -> WorkloadInfo {
        WorkloadInfo {
            input_dist: self.input_dist.map(|d| d.to_string()),
            output_dist: self.output_dist.map(|d| d.to_string()),
            prompt_file: self
                .prompt_file
                .as_ref()
                .filter(|_| self.dataset.is_none())
                .map(|p| p.name.clone()),
            dataset: self.dataset.clone(),
            shared_prefix: self.shared_prefix,
            images: self.images,
            multi_turn: self.multi_turn,
            ramp: self.ramp,
            tokenizer_file: self
                .tokenizer
                .as_ref()
                .map(|t| t.path().display().to_string()),
        }
    }
}

/// `summary.json` `workload`: the shaping options of the run.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadInfo {
    pub input_dist: Option<String>,
    pub output_dist: Option<String>,
    pub prompt_file: Option<String>,
    /// `--dataset` (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<super::datasets::DatasetInfo>,
    /// `--prefix-len` / `--prefix-groups` (absent without them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_prefix: Option<super::shared_prefix::SharedPrefix>,
    /// `--images-per-request` (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<super::images::SyntheticImages>,
    pub multi_turn: bool,
    pub ramp: Option<Ramp>,
    /// The local tokenizer.json of `--tokenizer` (`tokenizer` is then `local_file`).
    pub tokenizer_file: Option<String>,
}

/// `summary.json` `trace`: the replayed trace.
#[derive(Debug, Clone, Serialize)]
pub struct TraceInfo {
    /// File name.
    pub name: String,
    pub format: TraceFormat,
    /// Requests replayed (after `--trace-limit`).
    pub requests: usize,
    pub speedup: f64,
    /// Failed rows of the trace that were skipped (BurstGPT `Response tokens` = 0).
    pub skipped_failed: usize,
    /// From the first to the last arrival after the speedup, seconds.
    pub span_s: f64,
}

impl TraceReplay {
    /// The summary's description.
    pub fn info(&self) -> TraceInfo {
        TraceInfo {
            name: self.trace.name.clone(),
            format: self.trace.format,
            requests: self.trace.requests.len(),
            speedup: self.speedup,
            skipped_failed: self.trace.skipped_failed,
            span_s: self
                .trace
                .requests
                .last()
                .map_or(0.0, |r| r.at.as_secs_f64() / self.speedup),
        }
    }
}

/// The workload options of `lmperf run`, as given (the CLI's `--input-dist`, `--trace`, …
/// flags, `cli::workload`); [`WorkloadArgs::into_workload`] validates them and reads the files.
#[derive(Debug, Default)]
pub struct WorkloadArgs {
    /// Input length distribution in tokens, instead of --seq-lengths: fixed:N,
    /// uniform:min=A,max=B, normal:mean=M,std=S, lognormal:mu=M,sigma=S, zipf:n=N,s=S
    /// (normal and lognormal take min=, max= to clip).
    pub input_dist: Option<String>,
    /// Output length distribution in tokens (max_tokens per request), instead of --output-len.
    pub output_dist: Option<String>,
    /// Replay a trace: arrival times, input and output lengths (Azure LLM CSV, BurstGPT CSV,
    /// Mooncake JSONL). One benchmark per concurrency; --num-prompts does not apply.
    pub trace: Option<std::path::PathBuf>,
    /// Trace format (default: detected from the first line).
    pub trace_format: Option<String>,
    /// Replay the trace this many times faster (arrival offsets divided by it).
    pub trace_speedup: f64,
    /// Replay only the first N requests of the trace.
    pub trace_limit: Option<usize>,
    /// Prompts from a file: JSONL with a prompt/text field (or turns), or CSV with a prompt column.
    pub prompt_file: Option<std::path::PathBuf>,
    /// `--dataset FORMAT FILE`: `sharegpt` or `jsonl` and the file ([`super::datasets`]).
    pub dataset: Option<(String, std::path::PathBuf)>,
    /// `--prefix-len N`: tokens of each shared prefix.
    pub prefix_len: Option<u32>,
    /// `--prefix-groups G`: distinct shared prefixes (default 1).
    pub prefix_groups: Option<u32>,
    /// `--prompts-per-group P`: requests per group in a row.
    pub prompts_per_group: Option<u32>,
    /// `--images-per-request K`.
    pub images_per_request: Option<u32>,
    /// `--image-size WxH`.
    pub image_size: String,
    /// `--image-format png`.
    pub image_format: String,
    /// Multi-turn conversations from --prompt-file's `turns` (MT-Bench question.jsonl): each
    /// turn sent after the previous answer, with the history (needs --api chat).
    pub multi_turn: bool,
    /// Ramp the request rate (open loop) instead of --request-rate, or the concurrency
    /// (closed loop, see --ramp-over).
    pub ramp: Option<String>,
    /// What the ramp drives: the request rate (default), or the concurrency (requests in
    /// flight, sent as soon as a slot is free; needs --request-rate inf).
    pub ramp_over: Option<String>,
    /// Rate (requests per second) or concurrency at the start of the ramp.
    pub ramp_from: Option<f64>,
    /// Rate (requests per second) or concurrency at the end of the ramp.
    pub ramp_to: Option<f64>,
    /// Length of the ramp (the sawtooth's period), e.g. 60s.
    pub ramp_duration: Option<Duration>,
    /// A Hugging Face tokenizer.json (or its directory) for exact prompt lengths, used instead
    /// of the server's /tokenize (needed where the server has none).
    pub tokenizer: Option<std::path::PathBuf>,
    /// The model's chat template, to count --api chat requests exactly: a Jinja file or a
    /// tokenizer_config.json (default: the tokenizer_config.json beside --tokenizer, else the
    /// server's own template).
    pub chat_template: Option<std::path::PathBuf>,
}

impl WorkloadArgs {
    /// Validates the flags and reads the trace or prompt file; errors are one line naming the
    /// flag and value.
    pub fn into_workload(self) -> Result<Workload, String> {
        let dist = |flag: &str, v: &Option<String>| {
            v.as_deref().map(|t| LengthDist::parse(flag, t)).transpose()
        };
        if !(self.trace_speedup.is_finite() && self.trace_speedup > 0.0) {
            return Err(format!(
                "--trace-speedup {}: a positive number",
                self.trace_speedup
            ));
        }
        if self.trace_limit == Some(0) {
            return Err("--trace-limit 0: at least 1".to_owned());
        }
        let trace = match &self.trace {
            Some(path) => {
                let format = self.trace_format.as_deref().and_then(TraceFormat::parse);
                let t = super::trace::load(path, format, self.trace_limit)
                    .map_err(|e| format!("--trace {e}"))?;
                Some(TraceReplay {
                    trace: Arc::new(t),
                    speedup: self.trace_speedup,
                })
            }
            None => None,
        };
        let prompt_file = match &self.prompt_file {
            Some(p) => Some(Arc::new(
                super::dataset::load(p, self.multi_turn)
                    .map_err(|e| format!("--prompt-file {e}"))?,
            )),
            None => None,
        };
        let (prompt_file, dataset) = match &self.dataset {
            Some((format, path)) => {
                let f = super::datasets::DatasetFormat::parse(format).ok_or_else(|| {
                    format!("--dataset {format:?}: sharegpt or jsonl, then the file")
                })?;
                let d = super::datasets::load(f, path, self.multi_turn)
                    .map_err(|e| format!("--dataset {e}"))?;
                let info = d.info();
                (Some(Arc::new(d.prompts)), Some(info))
            }
            None => (prompt_file, None),
        };
        let shared_prefix = self
            .prefix_len
            .map(|n| {
                super::shared_prefix::SharedPrefix::new(
                    n,
                    self.prefix_groups.unwrap_or(1),
                    self.prompts_per_group,
                )
            })
            .transpose()?;
        let images = self
            .images_per_request
            .map(|k| super::images::SyntheticImages::new(k, &self.image_size, &self.image_format))
            .transpose()?;
        let ramp = match (&self.ramp, self.ramp_from, self.ramp_to, self.ramp_duration) {
            (Some(k), Some(a), Some(b), Some(d)) => {
                let over = if self.ramp_over.as_deref() == Some("concurrency") {
                    RampOver::Concurrency
                } else {
                    RampOver::Rate
                };
                Some(Ramp::new_over(k, a, b, d, over)?)
            }
            _ => None,
        };
        let tokenizer = self
            .tokenizer
            .as_deref()
            .map(LocalTokenizer::load)
            .transpose()
            .map_err(|e| format!("--tokenizer {e}"))?;
        let chat_template = self
            .chat_template
            .as_deref()
            .map(super::chat_template::ChatTemplate::load)
            .transpose()
            .map_err(|e| format!("--chat-template {e}"))?
            .map(Arc::new);
        Ok(Workload {
            input_dist: dist("--input-dist", &self.input_dist)?,
            output_dist: dist("--output-dist", &self.output_dist)?,
            trace,
            prompt_file,
            dataset,
            shared_prefix,
            images,
            multi_turn: self.multi_turn,
            ramp,
            tokenizer,
            chat_template,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::arrival::RunArrival;
    use rand::SeedableRng;

    fn moments(v: &[u32]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var.sqrt())
    }

    fn draw(text: &str, n: usize, seed: u64) -> Vec<u32> {
        LengthDist::parse("--input-dist", text)
            .unwrap()
            .sample_n(&mut SmallRng::seed_from_u64(seed), n)
    }

    #[test]
    fn sampler_moments() {
        let n = 200_000;
        // Tolerances: several standard errors (σ/√n) of the mean and of the std.
        let (m, s) = moments(&draw("uniform:min=64,max=512", n, 1));
        assert!(
            (m - 288.0).abs() < 1.5 && (s - ((449.0f64 * 449.0 - 1.0) / 12.0).sqrt()).abs() < 1.5,
            "uniform {m} {s}"
        );
        let v = draw("uniform:min=64,max=512", n, 1);
        assert_eq!((v.iter().min(), v.iter().max()), (Some(&64), Some(&512)));
        let (m, s) = moments(&draw("normal:mean=1000,std=100", n, 2));
        assert!(
            (m - 1000.0).abs() < 1.5 && (s - 100.0).abs() < 1.5,
            "normal {m} {s}"
        );
        let (m, s) = moments(&draw("lognormal:mu=7.1,sigma=0.8", n, 3));
        let want_m = (7.1f64 + 0.32).exp();
        let want_s = want_m * (0.64f64.exp() - 1.0).sqrt();
        assert!(
            (m / want_m - 1.0).abs() < 0.01 && (s / want_s - 1.0).abs() < 0.03,
            "lognormal {m} vs {want_m}, {s} vs {want_s}"
        );
        let v = draw("zipf:n=100,s=1.2", n, 4);
        let h: f64 = (1..=100).map(|k| f64::from(k).powf(-1.2)).sum();
        let p1 = v.iter().filter(|&&x| x == 1).count() as f64 / n as f64;
        assert!(
            (p1 - 1.0 / h).abs() < 0.005,
            "zipf P(1) {p1} vs {}",
            1.0 / h
        );
        let want_mean: f64 = (1..=100)
            .map(|k| f64::from(k) * f64::from(k).powf(-1.2))
            .sum::<f64>()
            / h;
        assert!(
            (moments(&v).0 - want_mean).abs() < 0.3,
            "zipf mean {} vs {want_mean}",
            moments(&v).0
        );
        assert!(v.iter().all(|&x| (1..=100).contains(&x)));
        assert_eq!(draw("fixed:77", 5, 0), vec![77; 5]);
        // Clipping.
        let v = draw("normal:mean=100,std=500,min=10,max=150", 10_000, 5);
        assert!(v.iter().all(|&x| (10..=150).contains(&x)) && v.contains(&10) && v.contains(&150));
    }

    #[test]
    fn samplers_are_seeded() {
        for d in [
            "uniform:min=1,max=9999",
            "normal:mean=500,std=50",
            "lognormal:mu=5,sigma=1",
            "zipf:n=1000,s=1.1",
        ] {
            assert_eq!(draw(d, 100, 42), draw(d, 100, 42), "{d}");
            assert_ne!(draw(d, 100, 42), draw(d, 100, 43), "{d}");
        }
    }

    #[test]
    fn parse_errors_name_flag_and_value() {
        for (text, part) in [
            ("gaussian:mean=1", "unknown distribution \"gaussian\""),
            ("uniform:min=64", "needs max="),
            ("uniform:min=600,max=5", "min 600 > max 5"),
            ("normal:mean=10,std=-1", "std = -1"),
            (
                "lognormal:mu=7.1,sigma=abc",
                "sigma = \"abc\" is not a number",
            ),
            ("zipf:n=10,s=0", "s = 0"),
            ("zipf:n=10,s=1,q=2", "unknown parameter \"q\""),
            ("fixed:0", "value = 0"),
            ("uniform:64,512", "expected NAME=VALUE"),
        ] {
            let e = LengthDist::parse("--output-dist", text).unwrap_err();
            assert!(
                e.starts_with(&format!("--output-dist {text:?}: ")) && e.contains(part),
                "{text}: {e}"
            );
        }
        assert_eq!(
            LengthDist::parse("--input-dist", "fixed:value=12"),
            Ok(LengthDist::Fixed(12))
        );
        let d = LengthDist::parse("--input-dist", "lognormal:mu=7.1,sigma=0.8").unwrap();
        assert_eq!(
            LengthDist::parse("--input-dist", &d.to_string()),
            Ok(d),
            "Display round-trips"
        );
    }

    #[test]
    fn ramp_offsets_follow_the_integral_of_the_rate() {
        for (kind, from, to) in [
            ("linear", 10.0, 100.0),
            ("linear", 100.0, 10.0),
            ("linear", 0.0, 50.0),
            ("exponential", 5.0, 200.0),
            ("sawtooth", 10.0, 60.0),
        ] {
            let r = Ramp::new(kind, from, to, Duration::from_secs(10)).unwrap();
            // Λ is the integral of r: check numerically (trapezoids over 1 ms).
            let mut acc = 0.0;
            for k in 0..25_000 {
                let (t0, t1) = (k as f64 * 1e-3, (k + 1) as f64 * 1e-3);
                acc += (r.rate(t0) + r.rate(t1)) / 2.0 * 1e-3;
                if (k + 1) % 5000 == 0 {
                    assert!(
                        (r.integral(t1) - acc).abs() < 0.05,
                        "{kind}: Λ({t1}) = {} vs ∫r = {acc}",
                        r.integral(t1)
                    );
                }
            }
            // Constant arrivals: request i is due exactly where Λ = i.
            let offs = r.offsets(400, RunArrival::Constant, 1);
            for (i, o) in offs.iter().enumerate() {
                assert!(
                    (r.integral(o.as_secs_f64()) - i as f64).abs() < 1e-6,
                    "{kind}: Λ(t_{i}) = {}",
                    r.integral(o.as_secs_f64())
                );
            }
            assert!(offs.windows(2).all(|w| w[0] <= w[1]));
        }
        // Linear 10 → 100 over 10 s: 550 requests due by 10 s, the rate at the end is 100/s.
        let r = Ramp::new("linear", 10.0, 100.0, Duration::from_secs(10)).unwrap();
        let offs = r.offsets(600, RunArrival::Constant, 1);
        assert!((offs[550].as_secs_f64() - 10.0).abs() < 1e-9);
        assert!(((offs[599] - offs[598]).as_secs_f64() - 0.01).abs() < 1e-9);
        // Poisson on the ramp: counts per 2 s window match ∫r over it (±4σ, σ = √Λ).
        let offs = r.offsets(550, RunArrival::Poisson, 9);
        for w in 0..5 {
            let (a, b) = (w as f64 * 2.0, (w + 1) as f64 * 2.0);
            let got = offs
                .iter()
                .filter(|o| (a..b).contains(&o.as_secs_f64()))
                .count() as f64;
            let want = r.integral(b) - r.integral(a);
            assert!(
                (got - want).abs() < 4.0 * want.sqrt(),
                "window {a}-{b}: {got} vs {want}"
            );
        }
        assert_eq!(
            r.offsets(50, RunArrival::Poisson, 9),
            r.offsets(50, RunArrival::Poisson, 9)
        );
        assert!(
            Ramp::new("exponential", 0.0, 5.0, Duration::from_secs(1))
                .unwrap_err()
                .contains("--ramp-from 0")
        );
        assert!(
            Ramp::new("step", 1.0, 5.0, Duration::from_secs(1))
                .unwrap_err()
                .contains("--ramp \"step\"")
        );
    }

    #[test]
    fn concurrency_ramp_limits() {
        let c = |kind: &str, from: f64, to: f64, secs: u64| {
            Ramp::new_over(
                kind,
                from,
                to,
                Duration::from_secs(secs),
                RampOver::Concurrency,
            )
            .unwrap()
        };
        // Linear 1 → 64 over 60 s: 1 + 63·t/60, rounded; 64 from 60 s on.
        let r = c("linear", 1.0, 64.0, 60);
        let at = |r: &Ramp, ts: &[f64]| ts.iter().map(|&t| r.concurrency_at(t)).collect::<Vec<_>>();
        assert_eq!(
            at(&r, &[0.0, 0.47, 0.48, 10.0, 30.0, 59.99, 60.0, 600.0]),
            vec![1, 1, 2, 12, 33, 64, 64, 64]
        );
        // Linear 1 → 8 over 2 s (the e2e test's): steps of 1 every 2/7 s, a half step late.
        let r = c("linear", 1.0, 8.0, 2);
        for k in 1..=7usize {
            let step = (k as f64 - 0.5) * 2.0 / 7.0;
            assert_eq!(
                (r.concurrency_at(step - 1e-9), r.concurrency_at(step + 1e-9)),
                (k, k + 1),
                "step {k} at {step} s"
            );
        }
        // Exponential 1 → 64 over 6 s: doubles every second.
        let r = c("exponential", 1.0, 64.0, 6);
        assert_eq!(
            at(&r, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]),
            vec![1, 2, 4, 8, 16, 32, 64, 64]
        );
        assert_eq!(at(&r, &[2.5]), vec![6], "4·√2 = 5.66");
        // Sawtooth 2 → 10 over 4 s: rises, falls back to 2 at each period.
        let r = c("sawtooth", 2.0, 10.0, 4);
        assert_eq!(
            at(&r, &[0.0, 2.0, 3.99, 4.0, 6.0, 7.99, 8.0]),
            vec![2, 6, 10, 2, 6, 10, 2]
        );
        // Falling linear 16 → 1, never below 1; a fractional 1.2 rounds to 1.
        let r = c("linear", 16.0, 1.2, 10);
        assert_eq!(at(&r, &[0.0, 5.0, 10.0, 100.0]), vec![16, 9, 1, 1]);
        assert_eq!(
            (
                r.max_concurrency(),
                c("linear", 1.0, 63.6, 1).max_concurrency()
            ),
            (16, 64)
        );
        // Errors name the flag and value.
        let e = |from: f64, to: f64| {
            Ramp::new_over(
                "linear",
                from,
                to,
                Duration::from_secs(1),
                RampOver::Concurrency,
            )
            .unwrap_err()
        };
        assert_eq!(
            e(0.5, 8.0),
            "--ramp-from 0.5: requests in flight ≥ 1 with --ramp-over concurrency"
        );
        assert_eq!(
            e(1.0, 0.0),
            "--ramp-to 0: requests in flight ≥ 1 with --ramp-over concurrency"
        );
        assert!(e(1.0, f64::INFINITY).starts_with("--ramp-to inf"));
        // A rate ramp from 0.5 is fine.
        assert!(Ramp::new("linear", 0.5, 8.0, Duration::from_secs(1)).is_ok());
    }
}
