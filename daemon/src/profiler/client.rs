//! The model servers' profiler endpoints, over HTTP. Checked against upstream:
//! - SGLang `python/sglang/srt/entrypoints/http_server.py`: `@app.api_route("/start_profile",
//!   methods=["GET", "POST"])` taking a `ProfileReqInput` (`python/sglang/srt/managers/
//!   io_struct.py`: `output_dir`, `start_step`, `num_steps`, `activities` ∈ CPU, GPU, MEM,
//!   CUDA_PROFILER); with `num_steps` set "profiling is automatically stopped after this
//!   step, and the caller doesn't need to run stop_profile". 200 `Start profiling.`.
//! - vLLM `vllm/entrypoints/serve/profile/api_router.py` (was `vllm/entrypoints/openai/
//!   api_server.py`): `POST /start_profile` and `POST /stop_profile`, no body, 200 empty; the
//!   router is attached only when `--profiler-config` names a profiler (before v0.13: when
//!   `VLLM_TORCH_PROFILER_DIR` is set), so a server without it answers 404. The trace goes to
//!   the server's `torch_profiler_dir`, written when the profiler stops.

use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::config::profiling::ProfilerKind;

/// How long one profiler request may take (vLLM's stop flushes the trace before it answers:
/// a 70B model's 100-request trace takes minutes).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// How a profiler call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Started (and, for vLLM, stopped): the detail says how.
    Done(String),
    /// 404 at `/start_profile`: the server has no profiler endpoint.
    Unsupported(String),
    /// Any other answer or a transport error.
    Failed(String),
}

impl Outcome {
    /// `done` | `unsupported` | `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Done(_) => "done",
            Self::Unsupported(_) => "unsupported",
            Self::Failed(_) => "failed",
        }
    }

    /// The outcome in words.
    pub fn detail(&self) -> &str {
        match self {
            Self::Done(d) | Self::Unsupported(d) | Self::Failed(d) => d,
        }
    }
}

/// SGLang's `ProfileReqInput` as lmperf sends it.
#[derive(Debug, Serialize)]
pub struct SglangBody<'a> {
    pub output_dir: Option<&'a str>,
    pub num_steps: u32,
    pub start_step: Option<u64>,
    pub activities: &'a [String],
}

async fn post(
    client: &reqwest::Client,
    url: Url,
    body: Option<&SglangBody<'_>>,
) -> Result<(u16, String), String> {
    let mut req = client.post(url.clone()).timeout(REQUEST_TIMEOUT);
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.map_err(|e| format!("POST {url}: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    Ok((status, text.trim().chars().take(200).collect()))
}

fn join(base: &Url, path: &str) -> Url {
    let mut u = base.clone();
    let prefix = u.path().trim_end_matches('/').to_owned();
    u.set_path(&format!("{prefix}{path}"));
    u
}

/// Calls the profiler of the server at `base` once: SGLang's bounded `num_steps`, or vLLM's
/// start, wait `seconds` (cut short by `stop`: the agent's shutdown), stop. A vLLM profiler
/// that started is always asked to stop.
pub async fn profile_once(
    client: &reqwest::Client,
    base: &Url,
    kind: &ProfilerKind,
    output_dir: Option<&str>,
    stop: &CancellationToken,
) -> Outcome {
    let start = join(base, "/start_profile");
    let body = match kind {
        ProfilerKind::Sglang {
            num_steps,
            start_step,
            activities,
        } => Some(SglangBody {
            output_dir,
            num_steps: *num_steps,
            start_step: *start_step,
            activities,
        }),
        ProfilerKind::Vllm { .. } => None,
    };
    match post(client, start.clone(), body.as_ref()).await {
        Err(e) => return Outcome::Failed(e),
        Ok((404, _)) => {
            let how = match kind {
                ProfilerKind::Vllm { .. } => {
                    "vLLM serves it only with --profiler-config (before v0.13: VLLM_TORCH_PROFILER_DIR)"
                }
                ProfilerKind::Sglang { .. } => "not an SGLang server, or a version without it",
            };
            return Outcome::Unsupported(format!("HTTP 404 at {start}: {how}"));
        }
        Ok((s, text)) if !(200..300).contains(&s) => {
            return Outcome::Failed(format!("HTTP {s} at {start}: {text}"));
        }
        Ok(_) => {}
    }
    let ProfilerKind::Vllm { seconds } = kind else {
        if let ProfilerKind::Sglang { num_steps, .. } = kind {
            return Outcome::Done(format!(
                "started for {num_steps} steps (SGLang stops by itself)"
            ));
        }
        return Outcome::Done("started".to_owned());
    };
    let cut = tokio::select! {
        _ = tokio::time::sleep(*seconds) => false,
        _ = stop.cancelled() => true,
    };
    let stop_url = join(base, "/stop_profile");
    let ran = if cut {
        "stopped early: the agent shut down".to_owned()
    } else {
        format!("stopped after {} s", seconds.as_secs_f64())
    };
    match post(client, stop_url.clone(), None).await {
        Ok((s, _)) if (200..300).contains(&s) => Outcome::Done(ran),
        Ok((s, text)) => Outcome::Failed(format!("started; stop: HTTP {s} at {stop_url}: {text}")),
        Err(e) => Outcome::Failed(format!("started; stop: {e}")),
    }
}
