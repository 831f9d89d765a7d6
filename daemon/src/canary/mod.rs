//! Canary traffic: one independent loop per target.
//!
//! Each target's [`schedule::Ticker`] fires on an absolute schedule; each tick spawns its own
//! request task, so a slow or dead target never delays its own next canary nor any other
//! target's. At most `max_in_flight` requests per target run at once; a tick beyond that is
//! skipped and counted (`lmperf.canary.skipped`).
//!
//! [`TargetRunner::measure`] is also the path of load injected through the control API
//! (`crate::control`): same client, same measurement, its own span marking and counter; and of
//! the probes pinned to each worker behind a router target (`probes`).

pub mod client;
pub mod direct;
pub mod probes;
pub mod prompts;
pub mod schedule;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Mutex, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::TargetConfig;
use crate::gpu::state::GpuState;
use crate::measure::Outcome;
use crate::net::state::NetState;
use crate::sampler::adaptive::{Decision, Observed, Reason, SpikeTransition, TargetSampler};
use crate::status::{RecentRequests, RequestSummary, Source, TargetState};
use crate::telemetry::Telemetry;
use crate::telemetry::spans::SpanContextInfo;
use client::{CanaryRequest, Clients, Discovered, Measured};
use lmperf_measure::path::{PathMetric, PathSample};
use schedule::{Gaps, Ticker};

/// `t` in Unix seconds (0 before the epoch).
fn unix_s(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What one target's loop needs.
#[derive(Debug, Clone)]
pub struct TargetRunner {
    pub target: Arc<TargetConfig>,
    pub clients: Clients,
    pub telemetry: Arc<Telemetry>,
    pub state: Arc<TargetState>,
    /// Print one line per measured request on stdout.
    pub console: bool,
    /// GPU state, for the `lmperf.gpu.*` span attributes; `None`: none added.
    pub gpu: Option<Arc<GpuState>>,
    /// eBPF probe state, for the `lmperf.net.*` span attributes; `None`: none added.
    pub net: Option<Arc<NetState>>,
    /// Where each measured request's summary goes (control API); `None`: nowhere.
    pub recent: Option<Arc<RecentRequests>>,
    /// The live diagnosis, fed by every canary; `None`: not fed.
    pub diagnosis: Option<Arc<crate::diagnosis_live::LiveDiagnosis>>,
    /// The target's model server signals, for the `lmperf.server.*` span attributes and the
    /// server change events; `None`: none added.
    pub server: Option<Arc<crate::server::TargetServer>>,
    /// The agent's targets, for a router target whose direct workers are the discovered pods
    /// of an InferencePool (`direct_pool`); `None`: not known.
    pub peers: Option<Arc<crate::live_list::LiveList<TargetState>>>,
    /// Discovered model and provider, once known.
    discovered: Arc<Mutex<Discovery>>,
    in_flight: Arc<Semaphore>,
    /// The target's adaptive tail sampler.
    sampler: Arc<std::sync::Mutex<TargetSampler>>,
    /// Discovery failed last time (warn once per failing streak).
    discovery_failing: Arc<std::sync::atomic::AtomicBool>,
}

/// What model discovery found, and when it last tried.
#[derive(Debug, Default)]
struct Discovery {
    found: Option<Discovered>,
    last_attempt: Option<tokio::time::Instant>,
    /// The found model is in doubt (a canary got 404 for it): re-discover on the next canary.
    stale: bool,
    /// The server's model/restart changes seen so far ([`server_generation`]).
    server_gen: u64,
}

/// Model, model-revision and restart changes of the target's server so far: a new value means
/// the served model may have changed.
fn server_generation(server: Option<&crate::server::TargetServer>) -> u64 {
    let Some(s) = server else { return 0 };
    let counts = s.change_counts();
    ["model", "model_revision", "restart"]
        .iter()
        .map(|k| counts.get(k).copied().unwrap_or(0))
        .sum()
}

/// The canary failed because the server does not know the model (HTTP 404, `model_not_found`).
fn model_not_found(r: &crate::measure::RequestRecord) -> bool {
    r.http_status == Some(404)
        || r.error
            .as_ref()
            .is_some_and(|e| e.error_type == "404" || e.code.as_deref() == Some("model_not_found"))
}

/// With a configured model, discovery (for the provider name only) is retried at most this
/// often, so a server without `/v1/models` costs one extra request per period, not per canary.
/// Without one, the discovered model is re-read this often (and at once after a server model
/// change or restart event, or a 404 for it).
const REDISCOVER_EVERY: Duration = Duration::from_secs(60);

/// The prompt and output length of one request replayed from a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape<'a> {
    /// Synthetic text of about `input_tokens` tokens.
    pub prompt: &'a str,
    /// The input length the trace asked for, in tokens.
    pub input_tokens: u32,
    /// Sent as `max_tokens`: the trace's output length.
    pub max_tokens: u32,
}

/// `lmperf.prompt.id` of a request with a [`RequestShape`] prompt.
pub const SYNTHETIC_PROMPT_ID: &str = "synthetic";

/// Stop signals: `stop` ends scheduling, `cancel` ends requests in flight.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    pub stop: CancellationToken,
    pub cancel: CancellationToken,
}

impl TargetRunner {
    pub fn new(
        target: Arc<TargetConfig>,
        clients: Clients,
        telemetry: Arc<Telemetry>,
        state: Arc<TargetState>,
        console: bool,
    ) -> Self {
        let in_flight = Arc::new(Semaphore::new(target.max_in_flight));
        let sampling = target.sampling;
        Self {
            target,
            clients,
            telemetry,
            state,
            console,
            gpu: None,
            net: None,
            recent: None,
            diagnosis: None,
            server: None,
            peers: None,
            discovered: Arc::default(),
            in_flight,
            discovery_failing: Arc::default(),
            sampler: Arc::new(std::sync::Mutex::new(TargetSampler::new(sampling))),
        }
    }

    /// Lets a router target find its `direct_pool`'s pods among the agent's `targets`.
    pub fn with_peers(mut self, targets: Arc<crate::live_list::LiveList<TargetState>>) -> Self {
        self.peers = Some(targets);
        self
    }

    /// Adds the node's GPU state during each request to its span (`lmperf.gpu.*`).
    pub fn with_gpu(mut self, gpu: Arc<GpuState>) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// Adds the kernel's view of the target's connections during each request to its span
    /// (`lmperf.net.*`).
    pub fn with_net(mut self, net: Arc<NetState>) -> Self {
        self.net = Some(net);
        self
    }

    /// Adds the server's state at each request's send to its span (`lmperf.server.*`), and
    /// server change events to the next canary span.
    pub fn with_server(mut self, server: Arc<crate::server::TargetServer>) -> Self {
        self.server = Some(server);
        self
    }

    /// Keeps a summary of each measured request (canary or injected) in `recent`.
    pub fn with_recent(mut self, recent: Arc<RecentRequests>) -> Self {
        self.recent = Some(recent);
        self
    }

    /// Feeds each measured canary to the live diagnosis (and its kept priority spans, for the
    /// diagnosis span's links).
    pub fn with_diagnosis(mut self, d: Arc<crate::diagnosis_live::LiveDiagnosis>) -> Self {
        self.diagnosis = Some(d);
        self
    }

    /// Runs the schedule until `shutdown.stop`; request tasks are spawned on `tracker`. Every
    /// [`SPIKE_TICK`], the canaries in flight are judged for spike mode.
    pub async fn run(self, shutdown: Shutdown, tracker: TaskTracker, seed: u64) {
        if self.state.path.is_some() {
            tracker.spawn(direct::run(
                self.clone(),
                shutdown.stop.clone(),
                shutdown.cancel.clone(),
                tracker.clone(),
            ));
        }
        if self.state.worker_probes.is_some() {
            tracker.spawn(probes::run(
                self.clone(),
                shutdown.stop.clone(),
                shutdown.cancel.clone(),
                tracker.clone(),
            ));
        }
        let mut ticker = Ticker::staggered(
            Gaps::new(self.target.schedule, seed),
            tokio::time::Instant::now(),
        )
        .coarse();
        // On the agent's shared grid: every target's judging wakes the runtime once.
        let mut spike_tick = crate::grid::interval(SPIKE_TICK);
        loop {
            let tick = tokio::select! {
                biased;
                _ = shutdown.stop.cancelled() => return,
                _ = spike_tick.tick() => {
                    self.judge_in_flight();
                    continue;
                }
                t = ticker.tick() => t,
            };
            let permit = self.in_flight.clone().try_acquire_owned();
            let now = std::time::SystemTime::now();
            if let Some(d) = &self.diagnosis {
                d.observe_schedule(&self.target.name, now, permit.is_err());
            }
            self.state.note_scheduled(now, permit.is_err());
            let Ok(permit) = permit else {
                self.telemetry.instruments.record_skipped(&self.target.name);
                tracing::debug!(target_name = %self.target.name, "Canary skipped: max_in_flight requests still running.");
                continue;
            };
            let runner = self.clone();
            let cancel = shutdown.cancel.clone();
            tracker.spawn(crate::cost::metered(&crate::cost::CANARY, async move {
                runner.state.in_flight.fetch_add(1, Ordering::Relaxed);
                runner.measure(tick.seq, &cancel, &Source::Canary).await;
                runner.state.in_flight.fetch_sub(1, Ordering::Relaxed);
                drop(permit);
            }));
        }
    }

    /// The sampling decision for a finished request: the head sampler's when
    /// `OTEL_TRACES_SAMPLER` is set, else the target's adaptive sampler's.
    fn decide(&self, ids: crate::telemetry::spans::TraceIds, m: &Measured) -> Decision {
        if let Some(head) = self.telemetry.head_sampler {
            return Decision {
                keep: ids.sampled,
                reason: Reason::Head,
                probability: head.probability(),
                transition: None,
                spike: None,
            };
        }
        let r = &m.record;
        let observed = Observed {
            failed: !matches!(r.outcome, Outcome::Ok | Outcome::Cancelled),
            ttft: r.ttft,
            e2e: r.e2e,
            trace_id: u128::from_be_bytes(ids.trace_id.to_bytes()),
            cancelled: r.outcome == Outcome::Cancelled,
            timed_out: r.outcome == Outcome::Timeout,
        };
        // A timeout's E2E is censored: its latency is at least the timeout.
        let observed = if observed.timed_out {
            Observed {
                e2e: observed.e2e.max(self.target.timeout),
                ..observed
            }
        } else {
            observed
        };
        let decision = match self.sampler.lock() {
            Ok(mut s) => s.decide(tokio::time::Instant::now(), observed),
            // A poisoned lock only means another canary panicked: keep the span.
            Err(_) => Decision {
                keep: true,
                reason: Reason::Base,
                probability: 1.0,
                transition: None,
                spike: None,
            },
        };
        if let Some(t) = decision.transition {
            self.note_transition(t, decision.spike);
        }
        decision
    }

    /// Judges the canaries in flight for spike mode (unless `OTEL_TRACES_SAMPLER` decides): an
    /// overload that queues them enters it while they wait. The `lmperf.spike.entered` event
    /// goes on the next canary span ([`carried_spike_event`](Self::carried_spike_event)).
    fn judge_in_flight(&self) {
        if self.telemetry.head_sampler.is_some() {
            return;
        }
        let now = tokio::time::Instant::now();
        let (entered, elapsed) = match self.sampler.lock() {
            Ok(mut s) => (s.tick(now), s.in_flight_elapsed(now)),
            Err(_) => (None, Vec::new()),
        };
        // The diagnosis counts the canaries still waiting as lower bounds too.
        if let Some(d) = &self.diagnosis {
            d.observe_in_flight(&self.target.name, std::time::SystemTime::now(), &elapsed);
        }
        if let Some(rule) = entered {
            self.note_transition(SpikeTransition::Entered, Some(rule));
        }
    }

    /// The `lmperf.spike.entered` event of a spike entered on a tick since the last canary
    /// span, stamped with the entry's time.
    fn carried_spike_event(&self) -> Option<opentelemetry::trace::Event> {
        let (rule, at) = self.sampler.lock().ok()?.take_carried()?;
        let ago = tokio::time::Instant::now().saturating_duration_since(at);
        let wall = std::time::SystemTime::now()
            .checked_sub(ago)
            .unwrap_or_else(std::time::SystemTime::now);
        let mut attrs = vec![opentelemetry::KeyValue::new(
            crate::telemetry::names::LMPERF_TARGET,
            self.target.name.clone(),
        )];
        attrs.extend(crate::telemetry::spans::spike_attributes(&rule));
        Some(opentelemetry::trace::Event::new(
            crate::telemetry::names::EVENT_SPIKE_ENTERED,
            wall,
            attrs,
            0,
        ))
    }

    /// Counts the canary `ids` in flight for spike mode until it is decided (or its task is
    /// dropped); `None` when `OTEL_TRACES_SAMPLER` decides.
    fn track_in_flight(&self, ids: crate::telemetry::spans::TraceIds) -> Option<InFlightGuard> {
        if self.telemetry.head_sampler.is_some() {
            return None;
        }
        let trace_id = u128::from_be_bytes(ids.trace_id.to_bytes());
        self.sampler
            .lock()
            .ok()?
            .started(trace_id, tokio::time::Instant::now());
        Some(InFlightGuard {
            sampler: self.sampler.clone(),
            trace_id,
        })
    }

    /// Publishes a spike mode change: the status (and gauge), the log line.
    fn note_transition(
        &self,
        t: SpikeTransition,
        spike: Option<crate::sampler::adaptive::SpikeRule>,
    ) {
        let entered = t == SpikeTransition::Entered;
        self.state.spike.store(entered, Ordering::Relaxed);
        self.state.set_spike_rule(spike);
        let p = &self.target.sampling;
        if entered {
            let rule = spike.map_or_else(|| "-".to_owned(), |r| r.describe());
            tracing::warn!(target_name = %self.target.name, reason = spike.map_or("-", |r| r.as_str()), rule = %rule, hold = ?p.spike_hold, "Spike mode entered: keeping every span.");
        } else {
            tracing::info!(target_name = %self.target.name, "Spike mode left: back to base sampling.");
        }
    }

    /// The model and provider to use; `Err` carries the measured discovery failure.
    async fn resolve(&self, cancel: &CancellationToken) -> Result<(String, String), Measured> {
        let t = &self.target;
        let configured_provider = t.provider.clone();
        if let (Some(model), Some(provider)) = (&t.model, &configured_provider) {
            return Ok((model.clone(), provider.clone()));
        }
        let mut cached = self.discovered.lock().await;
        let period_over = cached
            .last_attempt
            .is_none_or(|at| at.elapsed() >= REDISCOVER_EVERY);
        let due = t.model.is_none() || period_over;
        // A discovered model (none configured) is re-read every period, after a model change or
        // restart of the server, and after a 404 for it; a configured model is never replaced.
        let server_gen = server_generation(self.server.as_deref());
        let recheck = t.model.is_none()
            && cached.found.is_some()
            && (period_over || cached.stale || server_gen != cached.server_gen);
        if (cached.found.is_none() && due) || recheck {
            cached.stale = false;
            cached.server_gen = server_gen;
            cached.last_attempt = Some(tokio::time::Instant::now());
            let discovered = tokio::select! {
                biased;
                _ = cancel.cancelled() => Err(crate::measure::RequestRecord::failed(
                    crate::measure::Outcome::Cancelled,
                    crate::measure::RequestError::new(crate::measure::error_type::CANCELLED, Some("during model discovery".into())),
                    None,
                    Duration::ZERO,
                )),
                d = client::discover_model(&self.clients, t) => d,
            };
            match discovered {
                Ok(d) => {
                    self.discovery_failing.store(false, Ordering::Relaxed);
                    let old = cached.found.as_ref().map(|f| f.model.clone());
                    if old.as_deref() != Some(d.model.as_str()) {
                        tracing::info!(target_name = %t.name, model = %d.model, previous = old.as_deref().unwrap_or(""), owned_by = d.owned_by.as_deref().unwrap_or(""), "Discovered the served model.");
                    }
                    cached.found = Some(d);
                }
                // A re-check that failed keeps the model found before (the canary says the rest).
                Err(record)
                    if cached.found.is_some()
                        && record.outcome != crate::measure::Outcome::Cancelled =>
                {
                    tracing::debug!(target_name = %t.name, error_type = record.error.as_ref().map_or("-", |e| e.error_type.as_str()), "Model re-discovery failed; keeping the model found before.");
                }
                Err(record)
                    if t.model.is_none()
                        || record.outcome == crate::measure::Outcome::Cancelled =>
                {
                    if record.outcome != crate::measure::Outcome::Cancelled
                        && !self.discovery_failing.swap(true, Ordering::Relaxed)
                    {
                        tracing::warn!(
                            target_name = %t.name,
                            error_type = record.error.as_ref().map_or("-", |e| e.error_type.as_str()),
                            error = record.error.as_ref().and_then(|e| e.message.as_deref()).unwrap_or("-"),
                            "Model discovery (GET /v1/models) failed; canaries are recorded as errors until it succeeds."
                        );
                    }
                    return Err(Measured {
                        record,
                        wall_start: std::time::SystemTime::now(),
                        retries: 0,
                        conn: None,
                    });
                }
                Err(_) => {} // model configured: go on with the default provider
            }
        }
        let d = cached.found.as_ref();
        let model = t
            .model
            .clone()
            .or_else(|| d.map(|d| d.model.clone()))
            .unwrap_or_default();
        let provider = configured_provider
            .or_else(|| d.and_then(|d| d.owned_by.clone()))
            .unwrap_or_else(|| "openai".to_owned());
        Ok((model, provider))
    }

    /// The sampling decision for an injected request: every span is kept (failures in the
    /// priority lane), unless `OTEL_TRACES_SAMPLER` decides. Injected load never moves the
    /// canaries' adaptive sampler (spike mode).
    fn decide_inject(&self, ids: crate::telemetry::spans::TraceIds, m: &Measured) -> Decision {
        if let Some(head) = self.telemetry.head_sampler {
            return Decision {
                keep: ids.sampled,
                reason: Reason::Head,
                probability: head.probability(),
                transition: None,
                spike: None,
            };
        }
        let reason = if m.record.outcome == Outcome::Ok {
            Reason::Inject
        } else {
            Reason::Error
        };
        Decision {
            keep: true,
            reason,
            probability: 1.0,
            transition: None,
            spike: None,
        }
    }

    /// The sampling decision for a pinned probe: every span is kept (a probe is rare and
    /// names its worker), unless `OTEL_TRACES_SAMPLER` decides.
    fn decide_probe(&self, ids: crate::telemetry::spans::TraceIds) -> Decision {
        let (keep, reason, probability) = match self.telemetry.head_sampler {
            Some(head) => (ids.sampled, Reason::Head, head.probability()),
            None => (true, Reason::Base, 1.0),
        };
        Decision {
            keep,
            reason,
            probability,
            transition: None,
            spike: None,
        }
    }

    /// Records a pinned probe's result on its worker: answered by it, or why not.
    fn probe_done(&self, pin: crate::status::workers::Pin, m: &Measured) {
        let Some(p) = self.state.worker_probes.as_ref() else {
            return;
        };
        let r = &m.record;
        let failure = r.failure().map(|e| match &e.message {
            Some(msg) => format!("{}: {}", e.error_type, crate::measure::excerpt(msg)),
            None => e.error_type.clone(),
        });
        let failed = failure.is_some();
        let error = crate::status::workers::probe_error(pin, failure, r.served_by.as_ref());
        let refused = crate::status::workers::pin_refused(r.http_status, failed, error.is_some());
        let ttft_ms = r.ttft.map(|d| d.as_secs_f64() * 1e3);
        let end = m.wall_start + r.e2e;
        let at = unix_s(end);
        let answered = if error.is_none() {
            crate::status::workers::own_ms(pin, r)
        } else {
            None
        };
        let (t, apart) = match p.set.lock() {
            Ok(mut s) => {
                let t = s.probe_done(pin, ttft_ms, error, refused);
                // A probe refused as another model's says nothing of the worker's speed.
                if !refused {
                    s.record_result(pin, at, answered);
                }
                (t, Some(s.apart(at)))
            }
            Err(_) => (None, None),
        };
        if let Some(a) = &apart {
            (self.telemetry.instruments).record_workers_apart(&self.target.name, a);
        }
        if let (Some(d), Some(a)) = (&self.diagnosis, apart) {
            d.observe_workers_apart(&self.target.name, end, &a);
        }
        probes::log_transitions(&self.target.name, t.into_iter().collect());
    }

    /// Records a routed canary or a direct one on the target's direct paths, and the routed
    /// minus direct figures once both sides have enough requests in the window.
    fn path_done(&self, source: &Source, m: &Measured) {
        let Some(p) = self.state.path.as_ref() else {
            return;
        };
        let r = &m.record;
        let sample = PathSample {
            at_unix_s: unix_s(m.wall_start + r.e2e),
            ttft_ms: r.ttft.map(|d| d.as_secs_f64() * 1e3),
            e2e_ms: r.e2e.as_secs_f64() * 1e3,
        };
        let error = r.failure().map(|e| e.error_type.as_str());
        if let (Source::Direct(_), Some(d), Some(ttft), None) =
            (source, &self.diagnosis, r.ttft, error)
        {
            d.observe_direct_ttft(&self.target.name, m.wall_start + r.e2e, ttft.as_secs_f64());
        }
        match source {
            Source::Canary => p.record_routed(r.outcome == Outcome::Ok, sample, &replied_urls(r)),
            Source::Direct(w) => {
                p.record_direct(w, error, sample);
                let apart = p.apart(sample.at_unix_s);
                (self.telemetry.instruments).record_workers_apart(&self.target.name, &apart);
                if let Some(d) = &self.diagnosis {
                    d.observe_workers_apart(&self.target.name, m.wall_start + r.e2e, &apart);
                }
            }
            _ => return,
        }
        for metric in [PathMetric::Ttft, PathMetric::E2e] {
            let c = p.compare(metric, sample.at_unix_s);
            // This routed canary's TTFT against the direct p50 of its window, for the
            // diagnosis (the direct side is the span's: this canary joined the routed side).
            if let (Source::Canary, PathMetric::Ttft, Some(d), Some(t), Some(direct)) = (
                source,
                metric,
                &self.diagnosis,
                r.ttft,
                c.direct
                    .p50_ms
                    .filter(|_| c.direct.n >= lmperf_measure::path::MIN_SAMPLES),
            ) {
                let o = t.as_secs_f64() - direct / 1e3;
                d.observe_path_overhead(&self.target.name, m.wall_start + r.e2e, o);
            }
            if let Some(o) = c.overhead_ms {
                (self.telemetry.instruments).record_path_overhead(
                    &self.target.name,
                    metric.as_str(),
                    o / 1e3,
                );
            }
        }
    }

    /// A direct canary's source and worker; a routed canary's TTFT minus the direct p50 of the
    /// window, when the direct side has enough requests in it.
    fn path_attributes(&self, source: &Source, m: &Measured) -> Vec<opentelemetry::KeyValue> {
        use crate::telemetry::names as n;
        use opentelemetry::KeyValue;
        match (source, self.state.path.as_ref()) {
            (Source::Direct(w), _) => vec![
                KeyValue::new(n::LMPERF_REQUEST_SOURCE, source.as_str()),
                KeyValue::new(n::LMPERF_WORKER_ID, w.to_string()),
            ],
            (Source::Canary, Some(_)) => self
                .routed_overhead_ms(m)
                .map(|o| vec![KeyValue::new(n::LMPERF_PATH_OVERHEAD_MS, o)])
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// A routed canary's TTFT minus the direct canaries' TTFT p50 over the window it ended
    /// in, ms; `None` without direct paths, a TTFT, or enough direct canaries in the window.
    fn routed_overhead_ms(&self, m: &Measured) -> Option<f64> {
        let p = self.state.path.as_ref()?;
        let c = p.compare(PathMetric::Ttft, unix_s(m.wall_start + m.record.e2e));
        match (m.record.ttft, c.direct.p50_ms) {
            (Some(t), Some(d)) if c.direct.n >= lmperf_measure::path::MIN_SAMPLES => {
                Some(t.as_secs_f64() * 1e3 - d)
            }
            _ => None,
        }
    }

    /// Adds the workers a router's reply named to the target's worker set.
    fn note_workers(&self, m: &Measured) {
        let (Some(p), Some(by)) = (
            self.state.worker_probes.as_ref(),
            m.record.served_by.as_ref(),
        ) else {
            return;
        };
        let at = m
            .wall_start
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let t = match p.set.lock() {
            Ok(mut s) => s.from_reply(at, by),
            Err(_) => Vec::new(),
        };
        probes::log_transitions(&self.target.name, t);
    }

    /// The span attributes of a measured request beyond the GenAI ones: the GPUs and the
    /// kernel's view of its connection during it, where it came from (an injected load, a
    /// pinned probe), its synthetic shape, the server's state at its send, the serving pod.
    fn span_extra(
        &self,
        source: &Source,
        shape: Option<&RequestShape<'_>>,
        measured: &Measured,
    ) -> Vec<opentelemetry::KeyValue> {
        let t = &self.target;
        let (from, to) = (
            measured.wall_start,
            measured.wall_start + measured.record.e2e,
        );
        let mut extra = self
            .gpu
            .as_ref()
            .map(|g| {
                // Only the GPUs of the target's pod, where pod-resources tells them.
                g.request_attributes_of(from, to, &g.selection(t.k8s.as_ref()))
            })
            .unwrap_or_default();
        if let Some(n) = &self.net {
            extra.extend(n.request_attributes(
                t.port,
                measured.conn.map(|c| (c.local, c.remote)),
                from,
                to,
            ));
        }
        if let Source::Inject {
            load_id,
            profile_revision,
        } = source
        {
            extra.push(opentelemetry::KeyValue::new(
                crate::telemetry::names::LMPERF_REQUEST_SOURCE,
                source.as_str(),
            ));
            extra.push(opentelemetry::KeyValue::new(
                crate::telemetry::names::LMPERF_LOAD_ID,
                load_id.to_string(),
            ));
            if let Some(r) = profile_revision {
                extra.push(opentelemetry::KeyValue::new(
                    crate::telemetry::names::LMPERF_PROFILE_REVISION,
                    i64::from(*r),
                ));
            }
        }
        extra.extend(self.path_attributes(source, measured));
        if let Source::Probe(pin) = source {
            extra.push(opentelemetry::KeyValue::new(
                crate::telemetry::names::LMPERF_REQUEST_SOURCE,
                source.as_str(),
            ));
            extra.push(opentelemetry::KeyValue::new(
                crate::telemetry::names::LMPERF_WORKER_PINNED,
                pin.id().to_string(),
            ));
        }
        if let Some(s) = shape {
            extra.push(opentelemetry::KeyValue::new(
                crate::telemetry::names::LMPERF_REQUEST_INPUT_TOKENS_TARGET,
                i64::from(s.input_tokens),
            ));
        }
        if let Some(s) = &self.server {
            extra.extend(crate::server::span_attributes(s, measured.wall_start));
        }
        if let Some(k) = &t.k8s {
            extra.extend(crate::telemetry::k8s::span_attributes(k));
        }
        extra
    }

    /// Sends the `seq`-th prompt to the target, measures it, and records it as `source` says:
    /// a canary feeds the GenAI metrics, the target's counts and the adaptive sampler; an
    /// injected request only `lmperf.inject.requests` and a span marked
    /// `lmperf.request.source=inject`; a probe pinned to a worker only its own instruments, its
    /// span (`lmperf.request.source=probe`) and its worker's entry. All go to the
    /// recent-requests ring.
    pub async fn measure(
        &self,
        seq: u64,
        cancel: &CancellationToken,
        source: &Source,
    ) -> RequestSummary {
        self.measure_with(seq, cancel, source, None).await
    }

    /// As [`measure`](Self::measure), with `shape`'s prompt and `max_tokens` instead of the
    /// `seq`-th canary prompt and the target's `max_tokens` (trace replay); the span then
    /// carries `lmperf.prompt.id=synthetic` and `lmperf.request.input_tokens_target`.
    pub async fn measure_with(
        &self,
        seq: u64,
        cancel: &CancellationToken,
        source: &Source,
        shape: Option<RequestShape<'_>>,
    ) -> RequestSummary {
        let t = &self.target;
        let (prompt_id, prompt_text, max_tokens) = match shape {
            Some(s) => (SYNTHETIC_PROMPT_ID, s.prompt, s.max_tokens),
            None => {
                let p = prompts::nth(seq);
                (p.id, p.text, t.max_tokens)
            }
        };
        let ids = self.telemetry.new_trace();
        let _in_flight = if *source == Source::Canary {
            self.track_in_flight(ids)
        } else {
            None
        };
        let (model, provider, measured) = match self.resolve(cancel).await {
            Ok((model, provider)) => {
                self.state.set_model(&model);
                let traceparent = ids.traceparent();
                let pinned = match source {
                    Source::Probe(pin) => {
                        let mut m = serde_json::Map::new();
                        m.insert("nvext".to_owned(), pin.nvext());
                        Some(m)
                    }
                    _ => None,
                };
                let req = CanaryRequest {
                    api: t.api,
                    model: &model,
                    prompt: prompt_text,
                    max_tokens,
                    traceparent: &traceparent,
                    extra_body: pinned.as_ref(),
                };
                let m = client::execute(&self.clients, t, &req, cancel).await;
                if t.model.is_none() && model_not_found(&m.record) {
                    self.discovered.lock().await.stale = true;
                }
                (model, provider, m)
            }
            Err(m) => (
                String::new(),
                t.provider.clone().unwrap_or_else(|| "openai".to_owned()),
                m,
            ),
        };
        let mut info = SpanContextInfo {
            target: &t.name,
            operation: crate::telemetry::operation_name(t.api),
            provider: &provider,
            request_model: &model,
            max_tokens,
            server_address: &t.host,
            server_port: t.port,
            prompt_id,
            extra: self.span_extra(source, shape.as_ref(), &measured),
            events: match (&self.server, source) {
                (Some(s), Source::Canary) => crate::server::span_events(s),
                _ => Vec::new(),
            },
        };
        let summary =
            RequestSummary::new(source, &t.name, &model, &measured, ids.trace_id.to_string());
        match source {
            Source::Canary => {
                let decision = self.decide(ids, &measured);
                info.events.extend(self.carried_spike_event());
                let k8s = t
                    .k8s
                    .as_ref()
                    .map(crate::telemetry::k8s::series_labels)
                    .unwrap_or_default();
                self.telemetry
                    .record_labeled(&info, ids, &measured, &decision, &k8s);
                self.state.record(&summary);
                if let Some(d) = &self.diagnosis {
                    let (from, to) = (
                        measured.wall_start,
                        measured.wall_start + measured.record.e2e,
                    );
                    let net = self
                        .net
                        .as_ref()
                        .map(|n| n.request(t.port, measured.conn.map(|c| c.local), from, to));
                    d.observe_request(&t.name, &measured, net);
                    if decision.keep {
                        d.note_kept(&t.name, ids, to, decision.reason.is_priority());
                    }
                }
            }
            Source::Inject { .. } => {
                let decision = self.decide_inject(ids, &measured);
                self.telemetry.instruments.record_inject(&t.name, &measured);
                self.telemetry.record_span(&info, ids, &measured, &decision);
            }
            Source::Probe(pin) => {
                let decision = self.decide_probe(ids);
                self.telemetry.instruments.record_probe(
                    &t.name,
                    &pin.id().to_string(),
                    pin.role(),
                    &measured,
                );
                self.telemetry.record_span(&info, ids, &measured, &decision);
                self.probe_done(*pin, &measured);
            }
            Source::Direct(worker) => {
                let decision = self.decide_probe(ids);
                (self.telemetry.instruments).record_direct(&t.name, worker, &measured);
                self.telemetry.record_span(&info, ids, &measured, &decision);
            }
        }
        self.path_done(source, &measured);
        self.note_workers(&measured);
        if let Some(recent) = &self.recent {
            recent.push(summary.clone());
        }
        let r = &measured.record;
        if r.outcome != crate::measure::Outcome::Ok {
            tracing::debug!(target_name = %t.name, source = source.as_str(), outcome = r.outcome.as_str(), error_type = r.error.as_ref().map_or("", |e| e.error_type.as_str()), trace_id = %ids.trace_id, span_id = %ids.span_id, "Request failed.");
        }
        if self.console && *source == Source::Canary {
            println!(
                "{}",
                console_line(&t.name, &model, &measured, &ids.trace_id.to_string())
            );
        }
        summary
    }
}

/// How often the canaries in flight are judged for spike mode.
pub const SPIKE_TICK: Duration = Duration::from_secs(1);

/// A canary in flight for the sampler; dropping it (the canary's task ended or was dropped)
/// forgets it.
struct InFlightGuard {
    sampler: Arc<std::sync::Mutex<TargetSampler>>,
    trace_id: u128,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Ok(mut s) = self.sampler.lock() {
            s.abandoned(self.trace_id);
        }
    }
}

fn fmt_ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".to_owned(),
        |d| format!("{:.1}", d.as_secs_f64() * 1000.0),
    )
}

/// One human-readable line per request (the demo's live view).
pub fn console_line(target: &str, model: &str, m: &Measured, trace_id: &str) -> String {
    let r = &m.record;
    let err = r
        .failure()
        .map_or(String::new(), |e| format!(" error.type={}", e.error_type));
    format!(
        "span target={target} model={model} outcome={}{err} ttft_ms={} tpot_ms={} e2e_ms={:.1} tokens_in={} tokens_out={} ({}) finish={} retries={} trace_id={trace_id}",
        r.outcome.as_str(),
        fmt_ms(r.ttft),
        fmt_ms(r.tpot),
        r.e2e.as_secs_f64() * 1000.0,
        r.input_tokens.map_or("-".to_owned(), |v| v.to_string()),
        r.output_tokens.map_or("-".to_owned(), |v| v.to_string()),
        r.usage_source.map_or("-", |s| s.as_str()),
        if r.finish_reasons.is_empty() {
            "-".to_owned()
        } else {
            r.finish_reasons.join(",")
        },
        m.retries,
    )
}

/// The aggregated workers `r`'s reply named by URL (SGLang's gateway's
/// `x-smg-routed-worker-id`), as base URLs: the direct workers of a router that lists none.
fn replied_urls(r: &lmperf_measure::RequestRecord) -> Vec<String> {
    r.served_by.as_ref().map_or_else(Vec::new, |by| {
        by.workers
            .iter()
            .filter(|w| w.role == lmperf_measure::worker::WorkerRole::Agg)
            .filter_map(|w| crate::config::direct_paths::worker_url(&w.id))
            .map(|u| u.to_string())
            .collect()
    })
}

#[cfg(test)]
mod discovery_tests {
    use super::*;
    use crate::measure::{RequestError, RequestRecord};

    #[test]
    fn a_404_or_model_not_found_marks_the_model_stale() {
        let failed = |error_type: &str, code: Option<&str>, status: Option<u16>| {
            let mut e = RequestError::new(error_type, None);
            e.code = code.map(str::to_owned);
            let mut r = RequestRecord::failed(Outcome::Error, e, None, Duration::ZERO);
            r.http_status = status;
            r
        };
        assert!(model_not_found(&failed("404", None, Some(404))));
        assert!(model_not_found(&failed(
            "NotFoundError",
            Some("model_not_found"),
            None
        )));
        assert!(!model_not_found(&failed("503", None, Some(503))));
    }

    #[test]
    fn model_and_restart_changes_move_the_server_generation() {
        use crate::server::identity::{Change, ChangeKind};
        let s = crate::server::TargetServer::new("t", None, None);
        assert_eq!(server_generation(None), 0);
        assert_eq!(server_generation(Some(&s)), 0);
        s.push_event(
            std::time::SystemTime::now(),
            Change {
                kind: ChangeKind::Version,
                old: None,
                new: Some("2".into()),
            },
        );
        assert_eq!(
            server_generation(Some(&s)),
            0,
            "a version change alone keeps the model"
        );
        s.push_event(
            std::time::SystemTime::now(),
            Change {
                kind: ChangeKind::Model,
                old: Some("llama-a".into()),
                new: Some("llama-b".into()),
            },
        );
        s.push_event(
            std::time::SystemTime::now(),
            Change {
                kind: ChangeKind::Restart,
                old: None,
                new: None,
            },
        );
        assert_eq!(server_generation(Some(&s)), 2);
    }
}
