//! Admin HTTP (axum), on 127.0.0.1 by default.
//!
//! **API Boundary:** `/healthz` (200 while the process serves), `/readyz` (200 once canaries
//! are scheduled, 503 after shutdown begins; a failing Kubernetes discovery does not make it
//! unready: `discovery.state` = `failing` and `discovery.error` in the status say it),
//! `/metrics` (Prometheus text exposition of the
//! same meter provider that feeds OTLP; names translated as the OTel Prometheus
//! compatibility spec says: dots to underscores, unit suffix, `_total` on counters; the
//! classic text format by default, OpenMetrics 1.0 with exemplars of kept traces when the
//! `Accept` header prefers `application/openmetrics-text`: `telemetry::openmetrics`) and
//! `/api/v1/status` (JSON: targets with counts by outcome and last result, exporter queue
//! and drop counts, GPU monitoring state, eBPF probe state).

pub mod diagnosis_doc;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use crate::gpu::state::GpuStatus;
use crate::net::state::NetStatus;
use crate::status::{AgentStatus, TargetSnapshot};
use crate::telemetry::Telemetry;
use crate::telemetry::export::ExportSnapshot;

/// Shared state of the admin handlers.
#[derive(Debug, Clone)]
pub struct AdminState {
    pub status: Arc<AgentStatus>,
    pub telemetry: Arc<Telemetry>,
}

/// The `/api/v1/status` document.
#[derive(Debug, Serialize)]
pub struct StatusDoc {
    pub version: &'static str,
    pub uptime_s: f64,
    pub ready: bool,
    pub targets: Vec<TargetSnapshot>,
    pub exporter: ExportSnapshot,
    /// GPU monitoring: `mode` (on | off | discovering | disabled | starting), `reason` when
    /// not on, devices with unsupported fields and processes, lost/recovered/XID events.
    pub gpu: GpuStatus,
    /// eBPF TCP probes: `mode` (on | off | disabled | starting), `reason` when off (or when
    /// some probes are not attached), the port filter, each probe, event and drop counts.
    pub net: NetStatus,
    /// Model server signals per target: `mode` (on | failing | off | starting), `reason` when
    /// not on, kind, version, model, last scrape, skipped lines, latest sample, change events.
    pub server: Vec<crate::server::state::TargetServerView>,
    /// Target discovery (absent when off): source and why, `state` (starting | watching |
    /// failing) and `error` (an RBAC 403, an unreachable API server, naming its URL), pods and
    /// targets, pods with bad annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery: Option<crate::discovery::DiscoveryView>,
    /// Config reloads (SIGHUP or a change of the file): attempts, failures, the last outcome,
    /// its refusal reason, the sections that need a restart.
    pub config_reload: crate::reload::ReloadView,
    /// What the live diagnosis has cost the agent: evaluations and the CPU time of its
    /// once-a-second loop (feeding server, GPU and node signals, evaluating).
    pub diagnosis_cost: crate::diagnosis_live::DiagnosisCost,
    /// The agent's CPU by component so far ([`crate::cost`]): its own tasks' polls, seconds.
    pub agent_cost: AgentCost,
    /// The latest node sample the diagnosis was fed: PSI avg10 shares, the agent's CPU, each
    /// target's model server CPU wait and use, cgroup throttling, memory of its limit and OOM
    /// kills (absent values left out; the whole field absent before the first sample).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<crate::contention::NodeView>,
    /// Per target with `[target.profiling]`, its server profiler's last call: when, which
    /// server, why, where the trace went, `started` | `done` | `unsupported` | `failed`
    /// (absent when no profiler was called).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, crate::diagnosis::report::ServerProfile>,
    /// Targets whose last canary failed (`targets[].last.outcome` other than `ok`), and
    /// whether that is every target: the agent stays ready (`/readyz` is about the agent),
    /// this says its targets are all down.
    pub targets_failing: usize,
    pub all_targets_failing: bool,
}

/// `/api/v1/status`'s `agent_cost`: the CPU seconds of each component's task polls since the
/// start (the canaries, the page scrapes, the span export; the diagnosis is `diagnosis_cost`).
/// The runtime, hyper's connection tasks and the kernel's side of each wake-up are the
/// process's CPU less these.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct AgentCost {
    pub canary_cpu_s: f64,
    pub scrape_cpu_s: f64,
    pub export_cpu_s: f64,
}

/// The admin router, for serving or for driving with `oneshot` in tests.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/status", get(status))
        .route("/api/v1/diagnosis", get(diagnosis))
        .with_state(state)
}

async fn readyz(State(s): State<AdminState>) -> Response {
    if s.status.ready.load(Ordering::Relaxed) {
        let targets: Vec<TargetSnapshot> = s.status.targets.iter().map(|t| t.snapshot()).collect();
        let failing = failing(&targets);
        if failing > 0 && failing == targets.len() {
            // Ready (the agent works); the body says its targets do not.
            let body = format!("ready; all {failing} targets failing\n");
            return (StatusCode::OK, body).into_response();
        }
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

async fn metrics(State(s): State<AdminState>, headers: axum::http::HeaderMap) -> Response {
    let families = s.telemetry.registry.gather();
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if crate::telemetry::openmetrics::prefers_openmetrics(accept) {
        let body = crate::telemetry::openmetrics::encode(&families, &s.telemetry.exemplars);
        return (
            [(
                header::CONTENT_TYPE,
                crate::telemetry::openmetrics::CONTENT_TYPE,
            )],
            body,
        )
            .into_response();
    }
    let mut out = String::new();
    match prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            out,
        )
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "Encoding /metrics failed.");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "metrics encoding failed\n",
            )
                .into_response()
        }
    }
}

/// Targets whose last canary failed.
fn failing(targets: &[TargetSnapshot]) -> usize {
    targets
        .iter()
        .filter(|t| t.last.as_ref().is_some_and(|l| l.outcome != "ok"))
        .count()
}

/// Builds the status document.
pub fn status_doc(s: &AdminState) -> StatusDoc {
    let targets: Vec<TargetSnapshot> = s.status.targets.iter().map(|t| t.snapshot()).collect();
    let failing = failing(&targets);
    StatusDoc {
        version: env!("CARGO_PKG_VERSION"),
        uptime_s: s
            .status
            .started
            .elapsed()
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        ready: s.status.ready.load(Ordering::Relaxed),
        targets_failing: failing,
        all_targets_failing: failing > 0 && failing == targets.len(),
        targets,
        exporter: s.telemetry.spans.snapshot(),
        gpu: s.status.gpu.status(),
        net: s.status.net.status(),
        server: s.status.server.view(),
        discovery: s
            .status
            .discovery
            .lock()
            .ok()
            .and_then(|d| d.as_ref().map(|d| d.view())),
        config_reload: s.status.reload.view(),
        diagnosis_cost: s.status.diagnosis.cost(),
        agent_cost: AgentCost {
            canary_cpu_s: crate::cost::CANARY.cpu_s(),
            scrape_cpu_s: crate::cost::SCRAPE.cpu_s(),
            export_cpu_s: crate::cost::EXPORT.cpu_s(),
        },
        node: s.status.diagnosis.node_latest.view(),
        profiles: s.status.diagnosis.profilers.latest(),
    }
}

async fn status(State(s): State<AdminState>) -> axum::Json<StatusDoc> {
    axum::Json(status_doc(&s))
}

/// `/api/v1/diagnosis?target=T&window=15m`: the `Diagnosis` document (schema in
/// `crate::diagnosis`); `window`: a target idle now shows its last confirmed diagnosis of the
/// window.
#[derive(Debug, serde::Deserialize)]
struct DiagnosisQuery {
    target: Option<String>,
    window: Option<String>,
}

async fn diagnosis(
    State(s): State<AdminState>,
    axum::extract::Query(q): axum::extract::Query<DiagnosisQuery>,
) -> Response {
    let window = match q.window.as_deref().map(humantime::parse_duration) {
        Some(Err(e)) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("window = {:?}: {e}\n", q.window.unwrap_or_default()),
            )
                .into_response();
        }
        Some(Ok(w)) => Some(w),
        None => None,
    };
    let d = s
        .status
        .diagnosis
        .snapshot(q.target.as_deref(), window, std::time::SystemTime::now());
    axum::Json(diagnosis_doc::with_k8s(&s.status, &d)).into_response()
}
