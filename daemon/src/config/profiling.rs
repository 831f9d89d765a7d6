//! `[target.profiling]` (the agent, per target) and the `[profiling]` table of a
//! `--profile-on-fail FILE` (`lmperf run`, `lmperf compare`): calling the model server's own
//! profiler once when TPOT regresses. Off unless written: no section, no profiler call.
//!
//! ```toml
//! [target.profiling]
//! kind = "vllm"               # vllm | sglang: which profiler endpoint the server has
//! output_dir = "/traces"      # sglang: sent as output_dir; vllm: where the server's
//!                             # --profiler-config torch_profiler_dir writes (recorded only)
//! seconds = "10s"             # vllm: POST /start_profile, then /stop_profile after this
//! # num_steps = 10            # sglang: POST /start_profile {num_steps}: it stops by itself
//! # activities = ["CPU", "GPU"]  # sglang only (upstream: CPU, GPU, MEM, CUDA_PROFILER)
//! # start_step = 0            # sglang only: the forward step to start at (default: now)
//! min_interval = "1h"         # never more often than this per server
//! on = ["tpot_regression", "root_confirmed"]
//! # url = "http://10.0.0.7:8000"   # default: the target's URL (the server's own port)
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use super::ConfigError;

/// Default `min_interval`.
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(3600);
/// Default vLLM profiling window.
pub const DEFAULT_SECONDS: Duration = Duration::from_secs(10);
/// Default SGLang step count.
pub const DEFAULT_NUM_STEPS: u32 = 10;
/// Most steps asked of SGLang (a trace per step of a large model is large).
pub const MAX_NUM_STEPS: u32 = 1000;
/// Longest vLLM window.
pub const MAX_SECONDS: Duration = Duration::from_secs(600);
/// The activities SGLang's `ProfileReqInput` accepts
/// (`python/sglang/srt/managers/io_struct.py`).
pub const SGLANG_ACTIVITIES: [&str; 4] = ["CPU", "GPU", "MEM", "CUDA_PROFILER"];

/// `[target.profiling]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProfiling {
    pub kind: Option<String>,
    pub output_dir: Option<String>,
    pub num_steps: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub seconds: Option<Duration>,
    pub activities: Option<Vec<String>>,
    pub start_step: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    pub min_interval: Option<Duration>,
    pub on: Option<Vec<String>>,
    pub url: Option<String>,
}

/// How the server is profiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfilerKind {
    /// `POST /start_profile`, `POST /stop_profile` after `seconds` (no body; the server
    /// writes to its `--profiler-config` `torch_profiler_dir`, or `VLLM_TORCH_PROFILER_DIR`
    /// before v0.13).
    Vllm { seconds: Duration },
    /// `POST /start_profile {output_dir, num_steps, start_step, activities}`; stops itself.
    Sglang {
        num_steps: u32,
        start_step: Option<u64>,
        activities: Vec<String>,
    },
}

impl ProfilerKind {
    /// `vllm` or `sglang`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Vllm { .. } => "vllm",
            Self::Sglang { .. } => "sglang",
        }
    }
}

/// What calls the profiler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A `--fail-on` TPOT gate of `lmperf run` / `lmperf compare` (with `--profile-on-fail`).
    TpotRegression,
    /// The agent's diagnosis confirmed a server-side root with TPOT up.
    RootConfirmed,
}

impl Trigger {
    /// The name written in `on`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TpotRegression => "tpot_regression",
            Self::RootConfirmed => "root_confirmed",
        }
    }
}

/// Validated profiling settings of one server.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfilingConfig {
    pub kind: ProfilerKind,
    /// Where the trace goes (SGLang: sent; vLLM: the server's own setting, recorded).
    pub output_dir: Option<String>,
    pub min_interval: Duration,
    pub on: Vec<Trigger>,
    /// The server's base URL; `None`: the target's.
    pub url: Option<Url>,
}

impl ProfilingConfig {
    /// Whether `t` calls the profiler.
    pub fn fires_on(&self, t: Trigger) -> bool {
        self.on.contains(&t)
    }
}

/// Validates `raw` (`field` names it in errors: `target[0].profiling`).
///
/// # Errors
/// [`ConfigError::Invalid`] naming the key and value: a kind other than vllm / sglang, a
/// key of the other kind, a bound out of range, an unknown trigger or activity, a bad URL.
pub fn validate(field: &str, raw: RawProfiling) -> Result<ProfilingConfig, ConfigError> {
    let bad = |key: &str, value: &dyn std::fmt::Display, reason: &str| {
        ConfigError::invalid(format!("{field}.{key}"), value.to_string(), reason)
    };
    let kind_text = raw.kind.as_deref().unwrap_or("");
    let kind = match kind_text {
        "vllm" => {
            if let Some(n) = raw.num_steps {
                return Err(bad(
                    "num_steps",
                    &n,
                    "vLLM's /start_profile takes no step count: use seconds",
                ));
            }
            if raw.activities.is_some() || raw.start_step.is_some() {
                return Err(bad(
                    "activities",
                    &"…",
                    "sglang only (vLLM's endpoint takes no body)",
                ));
            }
            let seconds = raw.seconds.unwrap_or(DEFAULT_SECONDS);
            if seconds < Duration::from_secs(1) || seconds > MAX_SECONDS {
                return Err(bad(
                    "seconds",
                    &humantime::format_duration(seconds),
                    "between 1s and 10m",
                ));
            }
            ProfilerKind::Vllm { seconds }
        }
        "sglang" => {
            if let Some(s) = raw.seconds {
                return Err(bad(
                    "seconds",
                    &humantime::format_duration(s),
                    "SGLang stops after num_steps: use num_steps",
                ));
            }
            let num_steps = raw.num_steps.unwrap_or(DEFAULT_NUM_STEPS);
            if num_steps == 0 || num_steps > MAX_NUM_STEPS {
                return Err(bad("num_steps", &num_steps, "between 1 and 1000"));
            }
            let activities = raw
                .activities
                .unwrap_or_else(|| vec!["CPU".to_owned(), "GPU".to_owned()]);
            if let Some(a) = activities
                .iter()
                .find(|a| !SGLANG_ACTIVITIES.contains(&a.as_str()))
            {
                return Err(bad("activities", a, "one of CPU, GPU, MEM, CUDA_PROFILER"));
            }
            ProfilerKind::Sglang {
                num_steps,
                start_step: raw.start_step,
                activities,
            }
        }
        other => return Err(bad("kind", &other, "vllm or sglang")),
    };
    let min_interval = raw.min_interval.unwrap_or(DEFAULT_MIN_INTERVAL);
    if min_interval < Duration::from_secs(1) {
        return Err(bad(
            "min_interval",
            &humantime::format_duration(min_interval),
            "at least 1s",
        ));
    }
    let on = match raw.on {
        None => vec![Trigger::TpotRegression, Trigger::RootConfirmed],
        Some(list) => list
            .iter()
            .map(|t| match t.as_str() {
                "tpot_regression" => Ok(Trigger::TpotRegression),
                "root_confirmed" => Ok(Trigger::RootConfirmed),
                other => Err(bad("on", &other, "tpot_regression or root_confirmed")),
            })
            .collect::<Result<_, _>>()?,
    };
    let url = match raw.url {
        None => None,
        Some(u) => {
            let parsed = Url::parse(&u).map_err(|e| bad("url", &u, &e.to_string()))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(bad("url", &u, "scheme must be http or https"));
            }
            Some(parsed)
        }
    };
    Ok(ProfilingConfig {
        kind,
        output_dir: raw.output_dir.filter(|d| !d.is_empty()),
        min_interval,
        on,
        url,
    })
}

/// A `--profile-on-fail FILE`: the TOML file's `[profiling]` table (other tables, such as an
/// agent config's, are ignored).
#[derive(Debug, Deserialize)]
struct ProfilingFile {
    profiling: Option<RawProfiling>,
}

/// Reads the `[profiling]` table of `path`.
///
/// # Errors
/// [`ConfigError`] naming the file: unreadable, not TOML, no `[profiling]` table, or an
/// invalid key (as [`validate`]).
pub fn load_file(path: &PathBuf) -> Result<ProfilingConfig, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::invalid("--profile-on-fail", &shown, e.to_string()))?;
    let file: ProfilingFile = toml::from_str(&text)
        .map_err(|e| ConfigError::invalid("--profile-on-fail", &shown, e.to_string()))?;
    let raw = file
        .profiling
        .ok_or_else(|| ConfigError::invalid("--profile-on-fail", &shown, "no [profiling] table"))?;
    validate(&format!("{shown}: profiling"), raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: &str) -> RawProfiling {
        RawProfiling {
            kind: Some(kind.into()),
            ..RawProfiling::default()
        }
    }

    #[test]
    fn defaults_per_kind() {
        let v = validate("t", raw("vllm")).unwrap();
        assert_eq!(
            v.kind,
            ProfilerKind::Vllm {
                seconds: DEFAULT_SECONDS
            }
        );
        assert_eq!(v.min_interval, Duration::from_secs(3600));
        assert!(v.fires_on(Trigger::TpotRegression) && v.fires_on(Trigger::RootConfirmed));
        let s = validate("t", raw("sglang")).unwrap();
        assert_eq!(
            s.kind,
            ProfilerKind::Sglang {
                num_steps: 10,
                start_step: None,
                activities: vec!["CPU".into(), "GPU".into()]
            }
        );
    }

    #[test]
    fn errors_name_the_key_and_value() {
        let e = |r: RawProfiling| validate("target[0].profiling", r).unwrap_err().to_string();
        assert!(
            e(raw("tgi")).contains("target[0].profiling.kind"),
            "{}",
            e(raw("tgi"))
        );
        let steps = RawProfiling {
            num_steps: Some(5),
            ..raw("vllm")
        };
        assert!(e(steps).contains("target[0].profiling.num_steps"));
        let secs = RawProfiling {
            seconds: Some(Duration::from_secs(5)),
            ..raw("sglang")
        };
        assert!(e(secs).contains("use num_steps"));
        let zero = RawProfiling {
            num_steps: Some(0),
            ..raw("sglang")
        };
        assert!(e(zero).contains("between 1 and 1000"));
        let act = RawProfiling {
            activities: Some(vec!["TPU".into()]),
            ..raw("sglang")
        };
        assert!(e(act).contains("\"TPU\""));
        let on = RawProfiling {
            on: Some(vec!["always".into()]),
            ..raw("vllm")
        };
        assert!(e(on).contains("target[0].profiling.on"));
        let url = RawProfiling {
            url: Some("ftp://x".into()),
            ..raw("vllm")
        };
        assert!(e(url).contains("http or https"));
        assert!(e(RawProfiling::default()).contains("vllm or sglang"));
    }
}
