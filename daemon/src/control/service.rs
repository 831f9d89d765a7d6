//! The `AgentControl` service: the status the admin HTTP serves, the recent-requests ring,
//! and the load manager, as proto messages.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::load::LoadManager;
use super::proto;
use crate::admin::{AdminState, status_doc};
use crate::status::{RecentFilter, RecentRequests, RequestSummary};

/// Requests `ListRecentRequests` returns without a `limit`.
pub const DEFAULT_RECENT_LIMIT: usize = 20;

/// The service state: what `/api/v1/status` reads, the recent requests, the loads.
#[derive(Debug, Clone)]
pub struct ControlService {
    pub admin: AdminState,
    pub recent: Arc<RecentRequests>,
    pub loads: Arc<LoadManager>,
}

/// A serde enum or value (`Mode`) as its JSON string.
fn label<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

impl From<&RequestSummary> for proto::RequestSummary {
    fn from(s: &RequestSummary) -> Self {
        proto::RequestSummary {
            source: s.source.to_owned(),
            target: s.target.clone(),
            model: s.model.clone(),
            at_unix_s: s.at_unix_s,
            outcome: s.outcome.to_owned(),
            error_type: s.error_type.clone(),
            http_status: s.http_status.map(u32::from),
            ttft_ms: s.ttft_ms,
            tpot_ms: s.tpot_ms,
            e2e_ms: s.e2e_ms,
            input_tokens: s.input_tokens,
            output_tokens: s.output_tokens,
            trace_id: s.trace_id.clone(),
            retries: s.retries,
            load_id: s.load_id.clone(),
            profile_revision: s.profile_revision,
            worker: s.worker.clone(),
            error_message: s.error_message.clone(),
        }
    }
}

/// A target's server view as the control API's `ServerStatus`.
fn server_status(v: &crate::server::state::TargetServerView) -> proto::ServerStatus {
    let unix_s = |t: std::time::SystemTime| {
        t.duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let last = v.changes.last();
    proto::ServerStatus {
        mode: serde_json::to_value(v.mode)
            .ok()
            .and_then(|m| m.as_str().map(str::to_owned))
            .unwrap_or_default(),
        reason: v.reason.clone(),
        kind: v.kind.map(|k| k.as_str().to_owned()),
        version: v.version.clone(),
        model: v.model.clone(),
        last_ok_age_s: v.last_ok_age_s,
        requests_waiting: v.latest.as_ref().and_then(|l| l.requests_waiting),
        requests_running: v.latest.as_ref().and_then(|l| l.requests_running),
        kv_cache_usage: v.latest.as_ref().and_then(|l| l.kv_cache_usage),
        changes: v.changes.len() as u64,
        last_change: last.map(|e| {
            format!(
                "{} {} -> {}",
                e.kind.as_str(),
                e.old.as_deref().unwrap_or("-"),
                e.new.as_deref().unwrap_or("-")
            )
        }),
        last_change_at_unix_s: last.map(|e| unix_s(e.at)),
    }
}

impl ControlService {
    fn status(&self) -> proto::GetStatusResponse {
        let doc = status_doc(&self.admin);
        let e = &doc.exporter;
        let caps = self.loads.caps();
        proto::GetStatusResponse {
            version: doc.version.to_owned(),
            uptime_s: doc.uptime_s,
            ready: doc.ready,
            targets: doc
                .targets
                .iter()
                .map(|t| proto::TargetStatus {
                    name: t.name.clone(),
                    url: t.url.clone(),
                    api: t.api.to_owned(),
                    model: t.model.clone(),
                    requests: t.requests,
                    by_outcome: t
                        .by_outcome
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), *v))
                        .collect(),
                    in_flight: t.in_flight,
                    skipped: t.skipped,
                    spike: t.spike,
                    last: t.last.as_ref().map(Into::into),
                    last_error: t.last_error.as_ref().map(Into::into),
                    spike_reason: t.spike_reason.map(|r| r.describe()),
                    server: self
                        .admin
                        .status
                        .server
                        .target(&t.name)
                        .map(|s| server_status(&s.view())),
                    k8s: t.k8s.clone().into_iter().collect(),
                    latency: t.latency.as_ref().map(|l| proto::RecentLatency {
                        window_s: l.window_s,
                        requests: l.requests as u64,
                        ttft_p50_ms: l.ttft_p50_ms,
                        ttft_p99_ms: l.ttft_p99_ms,
                        tpot_p50_ms: l.tpot_p50_ms,
                        tpot_p99_ms: l.tpot_p99_ms,
                    }),
                })
                .collect(),
            exporter: Some(proto::ExporterStatus {
                enabled: e.enabled,
                queue_len: e.queue_len as u64,
                queue_priority: e.queue_priority as u64,
                queue_capacity: e.queue_capacity as u64,
                exporting: e.exporting,
                enqueued: e.enqueued,
                exported: e.exported,
                dropped_queue_full: e.dropped_queue_full,
                dropped_by_reason: e
                    .dropped_by_reason
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), *v))
                    .collect(),
                failed: e.failed,
                export_errors: e.export_errors,
                last_error: e.last_error.clone(),
            }),
            gpu: Some(proto::GpuStatus {
                mode: label(&doc.gpu.mode),
                reason: doc.gpu.reason.clone(),
                driver_version: doc.gpu.driver_version.clone(),
                interval_ms: doc.gpu.interval_ms,
                samples: doc.gpu.samples,
                devices: doc
                    .gpu
                    .devices
                    .iter()
                    .map(|d| proto::GpuDevice {
                        index: d.index,
                        hw_id: d.hw_id.clone(),
                        name: d.name.clone(),
                        pci_bus_id: d.pci_bus_id.clone(),
                        lost: d.lost,
                        utilization: d.utilization,
                        memory_used_bytes: d.memory_used_bytes,
                        memory_total_bytes: d.memory_total_bytes,
                    })
                    .collect(),
            }),
            net: Some(proto::NetStatus {
                mode: label(&doc.net.mode),
                reason: doc.net.reason.clone(),
                ports: doc.net.ports.iter().map(|p| u32::from(*p)).collect(),
                probes: doc
                    .net
                    .probes
                    .iter()
                    .map(|p| proto::Probe {
                        program: p.program.to_owned(),
                        attach: p.attach.to_owned(),
                        live: p.live,
                        error: p.error.clone(),
                    })
                    .collect(),
                rtt_events: doc.net.events.rtt,
                connect_events: doc.net.events.connect,
                retransmit_events: doc.net.events.retransmit,
                dropped: doc.net.dropped,
            }),
            load: self.loads.current().map(|l| l.to_proto()),
            caps: Some(proto::InjectCaps {
                max_rate_per_second: caps.max_rate_per_second,
                max_duration_s: caps.max_duration.as_secs_f64(),
                max_concurrency: caps.max_concurrency,
                max_requests: caps.max_requests,
            }),
            status_json: serde_json::to_string(&doc).unwrap_or_default(),
        }
    }
}

#[tonic::async_trait]
impl proto::agent_control_server::AgentControl for ControlService {
    async fn get_status(
        &self,
        _req: Request<proto::GetStatusRequest>,
    ) -> Result<Response<proto::GetStatusResponse>, Status> {
        Ok(Response::new(self.status()))
    }

    async fn list_recent_requests(
        &self,
        req: Request<proto::ListRecentRequestsRequest>,
    ) -> Result<Response<proto::ListRecentRequestsResponse>, Status> {
        let r = req.into_inner();
        let some = |s: String| (!s.is_empty()).then_some(s);
        let filter = RecentFilter {
            limit: if r.limit == 0 {
                DEFAULT_RECENT_LIMIT
            } else {
                r.limit as usize
            },
            target: some(r.target),
            outcome: some(r.outcome),
            source: some(r.source),
        };
        if let Some(s) = filter
            .source
            .as_deref()
            .filter(|s| !matches!(*s, "canary" | "inject" | "probe"))
        {
            return Err(Status::invalid_argument(format!(
                "source = {s:?}: canary, inject or probe"
            )));
        }
        let requests = self.recent.list(&filter).iter().map(Into::into).collect();
        Ok(Response::new(proto::ListRecentRequestsResponse {
            requests,
            capacity: u32::try_from(self.recent.capacity()).unwrap_or(u32::MAX),
        }))
    }

    async fn inject_load(
        &self,
        req: Request<proto::InjectLoadRequest>,
    ) -> Result<Response<proto::InjectLoadResponse>, Status> {
        let load = self.loads.start(req.get_ref()).await?;
        Ok(Response::new(proto::InjectLoadResponse {
            load: Some(load.to_proto()),
        }))
    }

    async fn stop_load(
        &self,
        req: Request<proto::StopLoadRequest>,
    ) -> Result<Response<proto::StopLoadResponse>, Status> {
        let load = self.loads.stop(&req.get_ref().id).await?;
        Ok(Response::new(proto::StopLoadResponse {
            load: Some(load.to_proto()),
        }))
    }

    async fn update_load(
        &self,
        req: Request<proto::UpdateLoadRequest>,
    ) -> Result<Response<proto::UpdateLoadResponse>, Status> {
        let (load, revision) = self.loads.update(req.get_ref())?;
        Ok(Response::new(proto::UpdateLoadResponse {
            load: Some(load.to_proto()),
            revision,
        }))
    }

    async fn diagnose(
        &self,
        req: Request<proto::DiagnoseRequest>,
    ) -> Result<Response<proto::DiagnoseResponse>, Status> {
        let r = req.into_inner();
        let target = (!r.target.is_empty()).then_some(r.target.as_str());
        if let Some(t) = target
            && !self.admin.status.targets.iter().any(|s| s.name == t)
        {
            return Err(Status::not_found(format!("target = {t:?}: no such target")));
        }
        if !(r.window_s.is_finite() && r.window_s >= 0.0) {
            return Err(Status::invalid_argument(format!(
                "window_s = {}: seconds, 0 or more",
                r.window_s
            )));
        }
        let window = (r.window_s > 0.0).then(|| std::time::Duration::from_secs_f64(r.window_s));
        let d = self
            .admin
            .status
            .diagnosis
            .snapshot(target, window, std::time::SystemTime::now());
        let diagnosis_json = serde_json::to_string(&crate::admin::diagnosis_doc::with_k8s(
            &self.admin.status,
            &d,
        ))
        .map_err(|e| Status::internal(format!("diagnosis JSON: {e}")))?;
        Ok(Response::new(proto::DiagnoseResponse { diagnosis_json }))
    }
}
