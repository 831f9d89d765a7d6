//! The agent's live state for `/api/v1/status`: per target, counts by outcome and the last
//! result; the exporter's queue and drop counts come from [`crate::telemetry::export`], the
//! GPU section from [`crate::gpu::state`].

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use serde::Serialize;

use crate::canary::client::Measured;
use crate::config::TargetConfig;

/// The last measured request of a target.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LastResult {
    /// Unix time of the send, in seconds.
    pub at_unix_s: f64,
    pub outcome: &'static str,
    pub error_type: Option<String>,
    pub http_status: Option<u16>,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    pub output_tokens: Option<u64>,
    pub trace_id: String,
    pub retries: u32,
}

#[derive(Debug, Default)]
struct Inner {
    model: Option<String>,
    counts: BTreeMap<&'static str, u64>,
    last: Option<LastResult>,
}

/// Live state of one target.
#[derive(Debug)]
pub struct TargetState {
    pub name: String,
    pub url: String,
    pub api: &'static str,
    pub in_flight: AtomicU64,
    pub skipped: AtomicU64,
    /// In spike mode (every span kept).
    pub spike: AtomicBool,
    inner: Mutex<Inner>,
}

/// `/api/v1/status` view of a target.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TargetSnapshot {
    pub name: String,
    pub url: String,
    pub api: &'static str,
    pub model: Option<String>,
    pub requests: u64,
    /// Requests by outcome (`ok`, `error`, `aborted`, `timeout`, `cancelled`).
    pub by_outcome: BTreeMap<&'static str, u64>,
    pub in_flight: u64,
    pub skipped: u64,
    pub spike: bool,
    pub last: Option<LastResult>,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl TargetState {
    pub fn new(t: &TargetConfig) -> Self {
        Self {
            name: t.name.clone(),
            url: t.base_url.to_string(),
            api: t.api.path(),
            in_flight: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            spike: AtomicBool::new(false),
            inner: Mutex::new(Inner { model: t.model.clone(), ..Inner::default() }),
        }
    }

    pub fn set_model(&self, model: &str) {
        if let Ok(mut g) = self.inner.lock() {
            g.model = Some(model.to_owned());
        }
    }

    pub fn record(&self, m: &Measured, trace_id: String) {
        let r = &m.record;
        let last = LastResult {
            at_unix_s: m.wall_start.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
            outcome: r.outcome.as_str(),
            error_type: r.failure().map(|e| e.error_type.clone()),
            http_status: r.http_status,
            ttft_ms: r.ttft.map(ms),
            e2e_ms: ms(r.e2e),
            output_tokens: r.output_tokens,
            trace_id,
            retries: m.retries,
        };
        if let Ok(mut g) = self.inner.lock() {
            *g.counts.entry(r.outcome.as_str()).or_default() += 1;
            g.last = Some(last);
        }
    }

    pub fn snapshot(&self) -> TargetSnapshot {
        let (model, by_outcome, last) = match self.inner.lock() {
            Ok(g) => (g.model.clone(), g.counts.clone(), g.last.clone()),
            Err(_) => (None, BTreeMap::new(), None),
        };
        TargetSnapshot {
            name: self.name.clone(),
            url: self.url.clone(),
            api: self.api,
            model,
            requests: by_outcome.values().sum(),
            by_outcome,
            in_flight: self.in_flight.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            spike: self.spike.load(Ordering::Relaxed),
            last,
        }
    }
}

/// Live state of the agent.
#[derive(Debug)]
pub struct AgentStatus {
    pub targets: Vec<std::sync::Arc<TargetState>>,
    pub started: SystemTime,
    /// False once shutdown has begun (`/readyz` then answers 503).
    pub ready: AtomicBool,
    /// GPU monitoring: mode, reason when off, devices, events.
    pub gpu: std::sync::Arc<crate::gpu::state::GpuState>,
    /// eBPF TCP probes: mode, reason when off, probes, event counts.
    pub net: std::sync::Arc<crate::net::state::NetState>,
}
