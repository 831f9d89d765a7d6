//! The agent's live state for `/api/v1/status`: per target, counts by outcome and the last
//! result; the exporter's queue and drop counts come from [`crate::telemetry::export`], the
//! GPU section from [`crate::gpu::state`]. [`RecentRequests`] keeps the last measured requests
//! for the control API (`ListRecentRequests`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use serde::Serialize;

use crate::config::TargetConfig;
use crate::measure::Measured;

pub mod path;
pub mod workers;

/// Where a measured request came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The target's canary schedule.
    Canary,
    /// Load injected through the control API (`InjectLoad`), with the load's id.
    Inject {
        load_id: std::sync::Arc<str>,
        /// The profile revision a profile load sent it under (`None`: not a profile load).
        profile_revision: Option<u32>,
    },
    /// A router target's probe pinned to one worker (`canary::probes`).
    Probe(workers::Pin),
    /// A router target's canary sent straight to one of its workers, not through the router
    /// (`canary::direct`), with the worker's base URL.
    Direct(std::sync::Arc<str>),
}

impl Source {
    /// `canary` | `inject` | `probe` | `direct`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Source::Canary => "canary",
            Source::Inject { .. } => "inject",
            Source::Probe(_) => "probe",
            Source::Direct(_) => "direct",
        }
    }
}

/// One measured request as the status and the control API show it: the last of a target in
/// `/api/v1/status`, each of [`RecentRequests`]. Times in milliseconds as the names say.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RequestSummary {
    /// `canary` | `inject` | `probe`.
    pub source: &'static str,
    pub target: String,
    /// The model asked for (empty when discovery failed).
    pub model: String,
    /// Unix time of the send, in seconds.
    pub at_unix_s: f64,
    pub outcome: &'static str,
    pub error_type: Option<String>,
    pub http_status: Option<u16>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// W3C trace id of the request's span (32 hex digits).
    pub trace_id: String,
    pub retries: u32,
    /// The injected load it belongs to (source `inject`).
    pub load_id: Option<String>,
    /// The profile revision of an injected profile load's request (0 = as started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_revision: Option<u32>,
    /// A router target: the worker that served it (`ServedBy::key`: its id, `PREFILL→DECODE`,
    /// or `unattributed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// A failed request: the server's or the client's reason, one line of at most
    /// `measure::EXCERPT_CHARS` characters (`measure::excerpt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

impl RequestSummary {
    /// The summary of `m`, measured for `target` and `model`, traced as `trace_id`.
    pub fn new(source: &Source, target: &str, model: &str, m: &Measured, trace_id: String) -> Self {
        let r = &m.record;
        RequestSummary {
            source: source.as_str(),
            target: target.to_owned(),
            model: model.to_owned(),
            at_unix_s: m
                .wall_start
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            outcome: r.outcome.as_str(),
            error_type: r.failure().map(|e| e.error_type.clone()),
            http_status: r.http_status,
            ttft_ms: r.ttft.map(ms),
            tpot_ms: r.tpot.map(ms),
            e2e_ms: ms(r.e2e),
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            trace_id,
            retries: m.retries,
            load_id: match source {
                Source::Inject { load_id, .. } => Some(load_id.to_string()),
                Source::Canary | Source::Probe(_) | Source::Direct(_) => None,
            },
            profile_revision: match source {
                Source::Inject {
                    profile_revision, ..
                } => *profile_revision,
                Source::Canary | Source::Probe(_) | Source::Direct(_) => None,
            },
            worker: match source {
                Source::Direct(w) => Some(w.to_string()),
                _ => r.served_by.as_ref().map(|b| b.key()),
            },
            error_message: r
                .failure()
                .and_then(|e| e.message.as_deref())
                .map(crate::measure::excerpt),
        }
    }
}

/// One worker's canaries behind a router target (`/api/v1/status` `targets[].workers`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WorkerTally {
    pub requests: u64,
    pub ok: u64,
    /// The TTFT of its last successful canary, ms.
    pub last_ttft_ms: Option<f64>,
}

/// Workers counted per target at most; later ones count under `other`.
pub const MAX_WORKERS: usize = 256;

/// The last measured requests of every target (canaries and injected), a bounded ring: the
/// oldest is dropped when it is full.
#[derive(Debug)]
pub struct RecentRequests {
    capacity: usize,
    ring: Mutex<VecDeque<RequestSummary>>,
}

/// What [`RecentRequests::list`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentFilter {
    /// At most this many.
    pub limit: usize,
    /// Only this target, outcome, source (`None`: all).
    pub target: Option<String>,
    pub outcome: Option<String>,
    pub source: Option<String>,
}

impl RecentRequests {
    /// A ring of `capacity` requests (0 keeps none).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn push(&self, s: RequestSummary) {
        if self.capacity == 0 {
            return;
        }
        if let Ok(mut g) = self.ring.lock() {
            if g.len() == self.capacity {
                g.pop_front();
            }
            g.push_back(s);
        }
    }

    /// The newest first, filtered.
    pub fn list(&self, f: &RecentFilter) -> Vec<RequestSummary> {
        let Ok(g) = self.ring.lock() else {
            return Vec::new();
        };
        let matches = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        g.iter()
            .rev()
            .filter(|s| {
                matches(&f.target, &s.target)
                    && matches(&f.outcome, s.outcome)
                    && matches(&f.source, s.source)
            })
            .take(f.limit)
            .cloned()
            .collect()
    }
}

#[derive(Debug, Default)]
struct Inner {
    model: Option<String>,
    counts: BTreeMap<&'static str, u64>,
    last: Option<RequestSummary>,
    /// The last canary that did not end `ok` (nor `cancelled` by the agent).
    last_error: Option<RequestSummary>,
    spike_rule: Option<crate::sampler::adaptive::SpikeRule>,
    /// Scheduled and skipped canaries per [`SKIP_BUCKET_S`] bucket (its Unix index), the
    /// newest last, at most [`SKIP_BUCKETS`].
    skip_window: VecDeque<(u64, u32, u32)>,
    workers: BTreeMap<String, WorkerTally>,
    /// Successful canaries of the last [`LATENCY_WINDOW_S`]: `(send Unix s, TTFT ms, TPOT
    /// ms)`, oldest first, at most [`LATENCY_KEPT`].
    latency: VecDeque<(f64, Option<f64>, Option<f64>)>,
}

/// The window of [`TargetSnapshot::latency`]: the last 5 minutes.
pub const LATENCY_WINDOW_S: f64 = 300.0;
/// Successful canaries kept for it, at most (the newest; a canary a second fills 300).
pub const LATENCY_KEPT: usize = 2048;

/// TTFT and TPOT of a target's successful canaries sent in the last [`LATENCY_WINDOW_S`]
/// (`/api/v1/status` `targets[].latency`, `ctl status`): what "is it slow now" needs without
/// a dashboard. Nearest-rank percentiles, milliseconds; `None` where no canary had the value.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RecentLatency {
    pub window_s: f64,
    /// Successful canaries in the window.
    pub requests: usize,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub tpot_p50_ms: Option<f64>,
    pub tpot_p99_ms: Option<f64>,
}

impl RecentLatency {
    /// Over the canaries of `kept` sent from `now_unix_s − window` on; `None` without one.
    fn of(kept: &VecDeque<(f64, Option<f64>, Option<f64>)>, now_unix_s: f64) -> Option<Self> {
        let from = now_unix_s - LATENCY_WINDOW_S;
        let recent = || kept.iter().filter(|k| k.0 >= from);
        let mut ttft: Vec<f64> = recent().filter_map(|k| k.1).collect();
        let mut tpot: Vec<f64> = recent().filter_map(|k| k.2).collect();
        let requests = recent().count();
        let q = lmperf_diagnosis::detector::quantile;
        (requests > 0).then(|| RecentLatency {
            window_s: LATENCY_WINDOW_S,
            requests,
            ttft_p50_ms: q(&mut ttft, 0.5),
            ttft_p99_ms: q(&mut ttft, 0.99),
            tpot_p50_ms: q(&mut tpot, 0.5),
            tpot_p99_ms: q(&mut tpot, 0.99),
        })
    }
}

/// The skip share's window: 6 buckets of 10 s (the last minute).
pub const SKIP_BUCKET_S: u64 = 10;
pub const SKIP_BUCKETS: usize = 6;

/// Live state of one target.
#[derive(Debug)]
pub struct TargetState {
    pub name: String,
    pub url: String,
    pub api: &'static str,
    pub in_flight: AtomicU64,
    pub skipped: AtomicU64,
    /// Canaries the schedule fired (sent or skipped).
    pub scheduled: AtomicU64,
    /// In spike mode (every span kept).
    pub spike: AtomicBool,
    /// The serving pod's `k8s.*` attributes (empty on a plain host).
    pub k8s: BTreeMap<String, String>,
    /// A router target's workers and their pinned probes (`canary::probes`); `None` for a
    /// model server or with `worker_probes = false`.
    pub worker_probes: Option<WorkerProbes>,
    /// A router target's direct canaries to its workers (`canary::direct`); `None` for a
    /// model server or with `direct_paths = false`.
    pub path: Option<path::DirectPathState>,
    inner: Mutex<Inner>,
}

/// A router target's pinned probes: the configuration and the workers known.
#[derive(Debug)]
pub struct WorkerProbes {
    pub interval: std::time::Duration,
    pub max_rate: f64,
    pub set: Mutex<workers::WorkerSet>,
}

/// `/api/v1/status` `targets[].worker_probes`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkerProbesView {
    /// Each worker is probed once per this, seconds.
    pub interval_s: f64,
    /// Probes per second of the target at most.
    pub max_rate: f64,
    /// Every worker known (registered on the router's page or named by a reply), by id.
    pub workers: Vec<workers::WorkerView>,
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
    /// Canaries the schedule fired (sent or skipped at `max_in_flight`).
    pub scheduled: u64,
    /// `skipped ÷ scheduled` since the start (0 before the first canary).
    pub skipped_share: f64,
    /// The share skipped over the last minute (6 buckets of 10 s; `None` before a canary was
    /// scheduled in it): the share of a spike the canaries do not see.
    pub skipped_share_last_minute: Option<f64>,
    pub spike: bool,
    pub last: Option<RequestSummary>,
    /// The last canary that failed (outcome other than `ok` and `cancelled`), with its
    /// `error_message`: what an on-call reader looks for first when a target fails.
    pub last_error: Option<RequestSummary>,
    /// While in spike mode: the rule that started it, with its values.
    pub spike_reason: Option<crate::sampler::adaptive::SpikeRule>,
    /// The serving pod, by OTel attribute name (`k8s.namespace.name`, `k8s.pod.name`,
    /// `k8s.pod.uid`, `k8s.container.name`, the owner); absent on a plain host.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub k8s: BTreeMap<String, String>,
    /// A router target: its canaries per worker the router said served them (at most
    /// [`MAX_WORKERS`], then `other`); absent otherwise.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub workers: BTreeMap<String, WorkerTally>,
    /// TTFT and TPOT p50/p99 of the last 5 minutes' successful canaries; `None` without one.
    pub latency: Option<RecentLatency>,
    /// A router target's workers and their pinned probes; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_probes: Option<WorkerProbesView>,
    /// A router target's direct paths: its workers sent canaries straight, and routed minus
    /// direct latency; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<path::PathView>,
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Skipped ÷ scheduled over the buckets of the last minute before bucket `now_idx` (itself
/// included); `None` without a scheduled canary there.
fn skip_share(window: &VecDeque<(u64, u32, u32)>, now_idx: u64) -> Option<f64> {
    let from = now_idx.saturating_sub(SKIP_BUCKETS as u64 - 1);
    let (sched, skipped) = window
        .iter()
        .filter(|b| b.0 >= from && b.0 <= now_idx)
        .fold((0u64, 0u64), |(a, b), x| {
            (a + u64::from(x.1), b + u64::from(x.2))
        });
    (sched > 0).then(|| skipped as f64 / sched as f64)
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
            scheduled: AtomicU64::new(0),
            spike: AtomicBool::new(false),
            k8s: t
                .k8s
                .as_ref()
                .map(|k| {
                    crate::telemetry::k8s::span_attributes(k)
                        .into_iter()
                        .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                        .collect()
                })
                .unwrap_or_default(),
            worker_probes: (t.kind == crate::config::TargetKind::Router && t.worker_probes.enabled)
                .then(|| WorkerProbes {
                    interval: t.worker_probes.interval,
                    max_rate: t.worker_probes.max_rate,
                    set: Mutex::default(),
                }),
            path: (t.kind == crate::config::TargetKind::Router && t.direct.enabled)
                .then(|| path::DirectPathState::new(t.direct.interval)),
            inner: Mutex::new(Inner {
                model: t.model.clone(),
                ..Inner::default()
            }),
        }
    }

    pub fn set_model(&self, model: &str) {
        if let Ok(mut g) = self.inner.lock() {
            g.model = Some(model.to_owned());
        }
    }

    /// The rule that started the current spike (`None` when spike mode is left).
    pub fn set_spike_rule(&self, rule: Option<crate::sampler::adaptive::SpikeRule>) {
        if let Ok(mut g) = self.inner.lock() {
            g.spike_rule = rule;
        }
    }

    /// Counts a scheduled canary at `now`: `skipped` when `max_in_flight` canaries still ran.
    pub fn note_scheduled(&self, now: SystemTime, skipped: bool) {
        self.scheduled.fetch_add(1, Ordering::Relaxed);
        if skipped {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
        let idx = unix_secs(now) / SKIP_BUCKET_S;
        if let Ok(mut g) = self.inner.lock() {
            match g.skip_window.back_mut() {
                Some(b) if b.0 == idx => {
                    b.1 += 1;
                    b.2 += u32::from(skipped);
                }
                _ => {
                    g.skip_window.push_back((idx, 1, u32::from(skipped)));
                    while g.skip_window.len() > SKIP_BUCKETS {
                        g.skip_window.pop_front();
                    }
                }
            }
        }
    }

    /// Counts a measured canary and keeps it as the last result.
    pub fn record(&self, last: &RequestSummary) {
        if let Ok(mut g) = self.inner.lock() {
            *g.counts.entry(last.outcome).or_default() += 1;
            if let Some(w) = &last.worker {
                let key = if g.workers.len() < MAX_WORKERS || g.workers.contains_key(w) {
                    w.clone()
                } else {
                    "other".to_owned()
                };
                let t = g.workers.entry(key).or_default();
                t.requests += 1;
                if last.outcome == "ok" {
                    t.ok += 1;
                    t.last_ttft_ms = last.ttft_ms.or(t.last_ttft_ms);
                }
            }
            if last.outcome != "ok" && last.outcome != "cancelled" {
                g.last_error = Some(last.clone());
            }
            if last.outcome == "ok" {
                let from = last.at_unix_s - LATENCY_WINDOW_S;
                while g
                    .latency
                    .front()
                    .is_some_and(|k| k.0 < from || g.latency.len() >= LATENCY_KEPT)
                {
                    g.latency.pop_front();
                }
                g.latency
                    .push_back((last.at_unix_s, last.ttft_ms, last.tpot_ms));
            }
            g.last = Some(last.clone());
        }
    }

    pub fn snapshot(&self) -> TargetSnapshot {
        self.snapshot_at(SystemTime::now())
    }

    /// The snapshot as of `now` (the skip share's and the latency's windows end there).
    pub fn snapshot_at(&self, now: SystemTime) -> TargetSnapshot {
        let now_idx = unix_secs(now) / SKIP_BUCKET_S;
        let now_s = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let (model, by_outcome, (last, last_error), spike_reason, last_minute, workers, latency) =
            match self.inner.lock() {
                Ok(g) => (
                    g.model.clone(),
                    g.counts.clone(),
                    (g.last.clone(), g.last_error.clone()),
                    g.spike_rule,
                    skip_share(&g.skip_window, now_idx),
                    g.workers.clone(),
                    RecentLatency::of(&g.latency, now_s),
                ),
                Err(_) => (
                    None,
                    BTreeMap::new(),
                    (None, None),
                    None,
                    None,
                    BTreeMap::new(),
                    None,
                ),
            };
        let scheduled = self.scheduled.load(Ordering::Relaxed);
        let skipped = self.skipped.load(Ordering::Relaxed);
        TargetSnapshot {
            name: self.name.clone(),
            url: self.url.clone(),
            api: self.api,
            model,
            requests: by_outcome.values().sum(),
            by_outcome,
            in_flight: self.in_flight.load(Ordering::Relaxed),
            skipped,
            scheduled,
            skipped_share: if scheduled == 0 {
                0.0
            } else {
                skipped as f64 / scheduled as f64
            },
            skipped_share_last_minute: last_minute,
            spike: self.spike.load(Ordering::Relaxed),
            last,
            last_error,
            spike_reason,
            k8s: self.k8s.clone(),
            workers,
            latency,
            worker_probes: self.worker_probes.as_ref().map(|p| WorkerProbesView {
                interval_s: p.interval.as_secs_f64(),
                max_rate: p.max_rate,
                workers: p.set.lock().map(|s| s.view()).unwrap_or_default(),
            }),
            path: self.path.as_ref().map(|p| {
                p.view(
                    now.duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64()),
                )
            }),
        }
    }
}

/// Live state of the agent.
#[derive(Debug)]
pub struct AgentStatus {
    /// The targets now, in the order they joined (static and discovered).
    pub targets: std::sync::Arc<crate::live_list::LiveList<TargetState>>,
    pub started: SystemTime,
    /// False once shutdown has begun (`/readyz` then answers 503).
    pub ready: AtomicBool,
    /// GPU monitoring: mode, reason when off, devices, events.
    pub gpu: std::sync::Arc<crate::gpu::state::GpuState>,
    /// eBPF TCP probes: mode, reason when off, probes, event counts.
    pub net: std::sync::Arc<crate::net::state::NetState>,
    /// The last measured requests (control API).
    pub recent: std::sync::Arc<RecentRequests>,
    /// The live root-cause diagnosis (`/api/v1/diagnosis`, `Diagnose`).
    pub diagnosis: std::sync::Arc<crate::diagnosis_live::LiveDiagnosis>,
    /// Model server signals per target (`server`).
    pub server: std::sync::Arc<crate::server::ServerState>,
    /// Target discovery, once started (`None`: off).
    pub discovery: Mutex<Option<std::sync::Arc<crate::discovery::DiscoveryStatus>>>,
    /// Config reloads (SIGHUP, file change): the last outcome and its reason.
    pub reload: std::sync::Arc<crate::reload::ReloadStatus>,
}

/// `lmperf.sampling.spike{lmperf.target}` on `meter`: 1 while a target is in spike mode.
pub fn register_spike_gauge(
    meter: &opentelemetry::metrics::Meter,
    targets: std::sync::Arc<crate::live_list::LiveList<TargetState>>,
) {
    use crate::telemetry::names;
    let _gauge = meter
        .u64_observable_gauge(names::METRIC_SAMPLING_SPIKE)
        .with_description("1 while the target is in spike mode (every span kept), else 0.")
        .with_callback(move |obs| {
            for t in targets.iter() {
                obs.observe(
                    u64::from(t.spike.load(Ordering::Relaxed)),
                    &[opentelemetry::KeyValue::new(
                        names::LMPERF_TARGET,
                        t.name.clone(),
                    )],
                );
            }
        })
        .build();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(
        target: &str,
        outcome: &'static str,
        source: &'static str,
        at: f64,
    ) -> RequestSummary {
        RequestSummary {
            source,
            target: target.to_owned(),
            model: "m".to_owned(),
            at_unix_s: at,
            outcome,
            error_type: None,
            http_status: Some(200),
            ttft_ms: Some(1.0),
            tpot_ms: None,
            e2e_ms: 2.0,
            input_tokens: None,
            output_tokens: None,
            trace_id: format!("{at}"),
            retries: 0,
            load_id: None,
            profile_revision: None,
            worker: None,
            error_message: None,
        }
    }

    /// A target's state, for `http://127.0.0.1:9`.
    fn target_state() -> TargetState {
        let cfg = crate::config::load(
            crate::config::Overrides {
                targets: vec!["http://127.0.0.1:9".into()],
                ..Default::default()
            },
            &crate::config::ProcessEnv,
        )
        .unwrap();
        TargetState::new(&cfg.targets[0])
    }

    /// A router target's canaries are counted per worker, bounded; a server's carry none.
    #[test]
    fn a_router_targets_canaries_are_tallied_per_worker_bounded() {
        let t = target_state();
        let with = |w: Option<&str>, outcome, ttft| RequestSummary {
            worker: w.map(str::to_owned),
            ttft_ms: ttft,
            ..summary("a", outcome, "canary", 1.0)
        };
        t.record(&with(Some("11→22"), "ok", Some(5.0)));
        t.record(&with(Some("11→22"), "error", None));
        t.record(&with(Some("unattributed"), "ok", Some(7.0)));
        t.record(&with(None, "ok", Some(1.0)));
        let w = t.snapshot().workers;
        assert_eq!(
            w["11→22"],
            WorkerTally {
                requests: 2,
                ok: 1,
                last_ttft_ms: Some(5.0)
            }
        );
        assert_eq!((w.len(), w["unattributed"].ok), (2, 1));
        for i in 0..MAX_WORKERS + 5 {
            t.record(&with(Some(&format!("w{i}")), "ok", Some(1.0)));
        }
        let w = t.snapshot().workers;
        assert_eq!(w.len(), MAX_WORKERS + 1);
        assert_eq!(w["other"].requests, 7);
    }

    /// `latency`: the last five minutes' successful canaries, as of the snapshot's time.
    #[test]
    fn recent_latency_is_the_last_five_minutes_of_successes() {
        let t = target_state();
        let at = |s: f64| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs_f64(s);
        assert_eq!(t.snapshot_at(at(1000.0)).latency, None);
        // An old slow canary, then 100 of the last minutes (TTFT 1..=100 ms, TPOT 5 ms), a
        // failure and one without TPOT.
        t.record(&RequestSummary {
            ttft_ms: Some(9000.0),
            ..summary("a", "ok", "canary", 600.0)
        });
        for i in 1..=100 {
            t.record(&RequestSummary {
                ttft_ms: Some(f64::from(i)),
                tpot_ms: Some(5.0),
                ..summary("a", "ok", "canary", 950.0 + f64::from(i) / 10.0)
            });
        }
        t.record(&RequestSummary {
            ttft_ms: Some(7000.0),
            ..summary("a", "error", "canary", 990.0)
        });
        let l = t.snapshot_at(at(1000.0)).latency.unwrap();
        assert_eq!(
            l,
            RecentLatency {
                window_s: 300.0,
                requests: 100,
                ttft_p50_ms: Some(50.0),
                ttft_p99_ms: Some(99.0),
                tpot_p50_ms: Some(5.0),
                tpot_p99_ms: Some(5.0),
            }
        );
        // Five minutes after the last success: nothing left in the window.
        assert_eq!(t.snapshot_at(at(1261.0)).latency, None);
    }

    /// The last failure stays in the snapshot, with its message, after later successes; the
    /// agent's own cancellations are not failures.
    #[test]
    fn the_last_error_outlives_later_successes() {
        let t = target_state();
        assert_eq!(t.snapshot().last_error, None);
        let refused = RequestSummary {
            error_type: Some("connection_refused".into()),
            error_message: Some("connection refused".into()),
            http_status: None,
            ..summary("a", "error", "canary", 1.0)
        };
        t.record(&refused);
        t.record(&summary("a", "ok", "canary", 2.0));
        t.record(&summary("a", "cancelled", "canary", 3.0));
        let s = t.snapshot();
        assert_eq!(s.last_error, Some(refused));
        assert_eq!(s.last.map(|l| l.outcome), Some("cancelled"));
    }

    #[test]
    fn the_skip_share_counts_the_last_minute() {
        let mut w = VecDeque::new();
        // Buckets 100..=106: 10 scheduled each, 0 skipped in the old ones, 5 in the last two.
        for i in 100..=106u64 {
            w.push_back((i, 10, if i >= 105 { 5 } else { 0 }));
        }
        // The last minute of bucket 106: 101..=106, 60 scheduled, 10 skipped.
        let share = skip_share(&w, 106).expect("share");
        assert!((share - 10.0 / 60.0).abs() < 1e-12, "{share}");
        assert_eq!(skip_share(&w, 200), None);
    }

    #[test]
    fn recent_ring_keeps_the_newest_and_filters() {
        let ring = RecentRequests::new(3);
        for (i, (t, o, s)) in [
            ("a", "ok", "canary"),
            ("b", "error", "canary"),
            ("a", "error", "inject"),
            ("a", "ok", "inject"),
        ]
        .into_iter()
        .enumerate()
        {
            ring.push(summary(t, o, s, i as f64));
        }
        let all = |f: RecentFilter| {
            ring.list(&RecentFilter { limit: 10, ..f })
                .iter()
                .map(|s| s.at_unix_s)
                .collect::<Vec<_>>()
        };
        // The oldest (0) fell out; newest first.
        assert_eq!(all(RecentFilter::default()), [3.0, 2.0, 1.0]);
        assert_eq!(
            all(RecentFilter {
                target: Some("a".into()),
                ..Default::default()
            }),
            [3.0, 2.0]
        );
        assert_eq!(
            all(RecentFilter {
                outcome: Some("error".into()),
                ..Default::default()
            }),
            [2.0, 1.0]
        );
        assert_eq!(
            all(RecentFilter {
                source: Some("canary".into()),
                ..Default::default()
            }),
            [1.0]
        );
        assert_eq!(
            ring.list(&RecentFilter {
                limit: 1,
                ..Default::default()
            })
            .len(),
            1
        );
        let none = RecentRequests::new(0);
        none.push(summary("a", "ok", "canary", 0.0));
        assert!(
            none.list(&RecentFilter {
                limit: 5,
                ..Default::default()
            })
            .is_empty()
        );
    }
}
