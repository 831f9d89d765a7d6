//! The diagnosis live in the agent: feeds the pure [`crate::diagnosis::Engine`] from canary
//! records, `gpu::state` and `net::state`, evaluates it once a second on the runtime, and
//! reports a confirmed root cause: one WARN line in words, an `lmperf.diagnosis` span (INTERNAL,
//! linked to the spike's kept traces), the gauges `lmperf.diagnosis.score` and
//! `lmperf.diagnosis.state`, `/api/v1/diagnosis` and the `Diagnose` RPC.
//!
//! Cost: the engine's lock is held for one observation or one evaluation (µs); GPU values are
//! read from the published snapshot, never from NVML. `cargo bench -p lmperf --bench
//! diagnosis_cost` prints the CPU share with 8 targets.

use crate::cost::thread_cpu_ns;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use crate::config::k8s::K8sIdentity;
use crate::config::profiling::Trigger;
use crate::diagnosis::announce::{Announcement, Announcer};
use crate::diagnosis::node_scope::Placement;
use crate::diagnosis::reachability::{Down, ErrorNote, Reachability, Transition};
use crate::diagnosis::report::{NodeDiagnosis, ServerProfile, State, TargetDiagnosis, unix_s};
use crate::diagnosis::{Cause, Diagnosis, Engine, EngineConfig, Signal};
use crate::gpu::backend::throttle;
use crate::gpu::pods::GpuSelection;
use crate::gpu::state::{GpuState, Snapshot};
use crate::measure::Measured;
use crate::net::state::RequestNet;
use crate::server::interval::ServerSample;
use crate::server::state::{ServerEvent, ServerState};
use crate::telemetry::names as n;
use crate::telemetry::spans::TraceIds;

/// Kept traces remembered per target for the diagnosis span's links.
pub const KEPT_PER_TARGET: usize = 64;
/// How long before an open incident's onset an outage that ended still belongs to it.
pub const DOWN_EPISODE_LOOKBACK: Duration = Duration::from_secs(300);
/// Server change events remembered per target for the outage ranking.
pub const CHANGES_KEPT: usize = 16;
/// Links on one `lmperf.diagnosis` span at most.
pub const MAX_LINKS: usize = 32;

/// A kept span: its end, trace id and span id.
type KeptSpan = (SystemTime, TraceId, SpanId);

/// One target's kept spans that a diagnosis span may link to, oldest first, each list at most
/// [`KEPT_PER_TARGET`]: those kept for a reason (error, SLO breach, spike) and those kept by
/// chance (the base rate, head sampling), apart so that a calm stream of chance-kept spans never
/// pushes out the incident's.
#[derive(Debug, Default)]
struct KeptSpans {
    priority: VecDeque<KeptSpan>,
    chance: VecDeque<KeptSpan>,
}

impl KeptSpans {
    fn push(&mut self, span: KeptSpan, priority: bool) {
        let q = if priority {
            &mut self.priority
        } else {
            &mut self.chance
        };
        if q.len() == KEPT_PER_TARGET {
            q.pop_front();
        }
        q.push_back(span);
    }
}

/// The spans a diagnosis with onset `onset` links to, at most [`MAX_LINKS`]: every target's
/// priority spans that ended since 30 s before the onset, newest first; then, while there is
/// room, spans kept by chance that ended at or after the onset, newest first. Spike mode's
/// detector is stricter than the diagnosis's (`DetectorConfig::spike_mode`), so a diagnosis can
/// confirm before spike mode kept anything: it then still links to the incident's slow
/// requests that were kept (and exported) by chance.
fn link_spans(kept: &[&KeptSpans], onset: SystemTime) -> Vec<KeptSpan> {
    let from = onset.checked_sub(Duration::from_secs(30)).unwrap_or(onset);
    let newest_first = |mut v: Vec<KeptSpan>| {
        v.sort_by_key(|k| std::cmp::Reverse(k.0));
        v
    };
    let priority: Vec<KeptSpan> = kept
        .iter()
        .flat_map(|k| k.priority.iter().filter(|s| s.0 >= from).copied())
        .collect();
    let chance: Vec<KeptSpan> = kept
        .iter()
        .flat_map(|k| k.chance.iter().filter(|s| s.0 >= onset).copied())
        .collect();
    let mut links = newest_first(priority);
    links.extend(newest_first(chance));
    links.truncate(MAX_LINKS);
    links
}

/// One target's gauge values: name, state code, score per cause.
pub type TargetGauges = (String, u8, Vec<(Cause, f64)>);

/// The agent's diagnosis: the engine, the last evaluation, the spikes' kept traces.
#[derive(Debug)]
pub struct LiveDiagnosis {
    engine: Mutex<Engine>,
    last: Mutex<Diagnosis>,
    /// The last root_confirmed diagnosis of each target, with when it was confirmed.
    confirmed: Mutex<BTreeMap<String, (SystemTime, TargetDiagnosis)>>,
    kept: Mutex<BTreeMap<String, KeptSpans>>,
    /// Per target: whether it answers at all (failed canaries in a row, no baseline).
    reachability: Mutex<BTreeMap<String, Reachability>>,
    /// The GPU tick last fed, and per target the fault count then (XIDs + lost GPUs +
    /// uncorrected ECC of the GPUs it reads).
    gpu_seen: Mutex<(Option<SystemTime>, BTreeMap<String, u64>)>,
    /// Per target: its pod, whose GPUs alone it reads where pod-resources tells them.
    k8s: Mutex<BTreeMap<String, K8sIdentity>>,
    /// Per target: its server's address (`host:port`), to name the pod of a worker behind a
    /// router that is also a target ([`TargetDiagnosis::worker_pod`]).
    addresses: Mutex<BTreeMap<String, String>>,
    /// Per target: the GPUs behind each GPU signal's latest harmful value (the evidence's
    /// `hw_ids`).
    gpu_evidence: Mutex<BTreeMap<String, GpuEvidence>>,
    /// Per target: the newest server sample and change event fed.
    server_seen: Mutex<BTreeMap<String, (SystemTime, SystemTime)>>,
    /// Per target: the server change events fed (Unix seconds, kind), the last
    /// [`CHANGES_KEPT`]: an outage's restart is its child even while the engine, without a
    /// baseline, scores no cause.
    server_changes: Mutex<BTreeMap<String, VecDeque<(f64, &'static str)>>>,
    /// Per target: when a canary last carried the server's own timing. While one did within
    /// [`PER_REQUEST_FRESH`], the scrape's histogram means of the same figures are not fed.
    per_request_timing: Mutex<BTreeMap<String, SystemTime>>,
    /// The targets' own profilers (`[target.profiling]`), called once for a confirmed
    /// server-side cause with TPOT up ([`crate::profiler::wants_profile`]).
    pub profilers: crate::profiler::live::Registry,
    /// The latest node sample fed, for the status and the gauges ([`crate::contention`]).
    pub node_latest: std::sync::Arc<crate::contention::LatestNode>,
    /// The agent's targets now (they join and leave at run time: [`LiveDiagnosis::add_target`]).
    targets: Mutex<Vec<String>>,
    /// The targets that are routers (`kind = "router"`): their cgroup is the router's.
    routers: Mutex<std::collections::BTreeSet<String>>,
    /// What was said of each incident (a node's fault once, not per target).
    announcer: Mutex<Announcer>,
    /// Evaluations done and their total time, ns (the cost figure).
    pub evaluations: AtomicU64,
    pub evaluate_ns: AtomicU64,
    /// The CPU time of the once-a-second loop's work ([`run`]): feeding and evaluating, ns of
    /// its thread's CPU clock.
    pub loop_cpu_ns: AtomicU64,
}

/// How long a canary's server timing stands for its target's: within it, the per-request
/// figures replace the scrape's histogram means (a server restarted without per-request
/// metrics falls back to its `/metrics` after this).
pub const PER_REQUEST_FRESH: Duration = Duration::from_secs(60);

/// The evidence `source` of the scrape's server timing.
const SCRAPE_SOURCE: &str = "/metrics (histogram mean per scrape)";

/// The evidence `source` of a canary's own server timing.
fn per_request_source(source: crate::measure::server_timing::TimingSource) -> &'static str {
    use crate::measure::server_timing::TimingSource;
    match source {
        TimingSource::VllmMetrics => "vllm_metrics (per request)",
        TimingSource::LlamaCppTimings => "llama_cpp_timings (per request)",
        TimingSource::DynamoTiming => "dynamo_timing (per request)",
    }
}

/// `host:port` of a base URL (the scheme's port when none is written).
fn address_of(u: &url::Url) -> Option<String> {
    Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?))
}

/// `host:port` of a worker as a router names it: a URL (vllm-router, llm-d) or `host:port`;
/// `None` for an id that is not an address (Dynamo's instance ids).
fn worker_address(worker: &str) -> Option<String> {
    let url = if worker.contains("://") {
        url::Url::parse(worker).ok()?
    } else {
        url::Url::parse(&format!("http://{worker}")).ok()?
    };
    // A bare number parses as a host: it is an instance id, not an address.
    worker.contains(':').then_some(())?;
    address_of(&url)
}

/// `/api/v1/status`'s `diagnosis_cost`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct DiagnosisCost {
    pub evaluations: u64,
    /// CPU time of the diagnosis loop (feeding server, GPU and node signals, evaluating), s.
    pub cpu_s: f64,
}

/// The pure mappers of a canary's record and a server scrape to signals, in the diagnosis
/// crate (their old paths kept).
pub use crate::diagnosis::inputs::{request_signals, server_signals};

/// The node-wide GPU signals of one snapshot: the lowest SM clock, any slowdown, the fullest
/// memory, the processes on the GPUs, and the fault counter (XIDs, lost GPUs, uncorrected ECC).
pub fn gpu_signals(s: &Snapshot) -> (Vec<(Signal, f64)>, u64) {
    let (v, faults, _) = gpu_signals_of(s, &GpuSelection::All);
    (v, faults)
}

/// Which GPUs (`hw.id`) gave a GPU signal its value: the slowest clock, the throttled ones,
/// the fullest memory.
pub type GpuEvidence = Vec<(Signal, Vec<String>)>;

/// [`gpu_signals`] of the GPUs `selection` names only (a target's pod's GPUs), with the GPUs
/// behind each value. With [`GpuSelection::Only`] the fault counter counts the selected GPUs'
/// XIDs, uncorrected ECC errors and those lost now (the node's lost counter is not per GPU).
pub fn gpu_signals_of(
    s: &Snapshot,
    selection: &GpuSelection,
) -> (Vec<(Signal, f64)>, u64, GpuEvidence) {
    let chosen: Vec<_> = s
        .devices
        .iter()
        .filter(|d| selection.contains(&d.info.uuid))
        .collect();
    let samples: Vec<_> = chosen
        .iter()
        .filter_map(|d| Some((d.info.uuid.as_str(), d.sample.as_ref()?)))
        .collect();
    let ids_where = |f: &dyn Fn(&crate::gpu::state::DeviceSample) -> bool| -> Vec<String> {
        samples
            .iter()
            .filter(|(_, d)| f(d))
            .map(|(id, _)| (*id).to_owned())
            .collect()
    };
    let mut v = Vec::new();
    let mut evidence = Vec::new();
    if let Some(c) = samples
        .iter()
        .filter_map(|(_, d)| d.sm_clock_hz)
        .reduce(f64::min)
    {
        v.push((Signal::GpuSmClock, c));
        evidence.push((Signal::GpuSmClock, ids_where(&|d| d.sm_clock_hz == Some(c))));
    }
    let slow: u64 = throttle::SLOWDOWNS
        .iter()
        .map(|(b, _)| b)
        .fold(0, |a, b| a | b);
    if samples.iter().any(|(_, d)| d.throttle.is_some()) {
        let slowed = ids_where(&|d| d.throttle.is_some_and(|t| t & slow != 0));
        v.push((Signal::GpuThrottle, f64::from(u8::from(!slowed.is_empty()))));
        evidence.push((Signal::GpuThrottle, slowed));
    }
    if let Some(m) = samples
        .iter()
        .filter_map(|(_, d)| d.memory_utilization())
        .reduce(f64::max)
    {
        v.push((Signal::GpuMemoryUtilization, m));
        evidence.push((
            Signal::GpuMemoryUtilization,
            ids_where(&|d| d.memory_utilization() == Some(m)),
        ));
    }
    let samples: Vec<_> = samples.into_iter().map(|(_, d)| d).collect();
    if !samples.is_empty() {
        // Foreign: not a target's model server (`gpu::procs::serves_port`); one whose /proc
        // cannot be read counts as foreign.
        let foreign = samples
            .iter()
            .flat_map(|d| &d.processes)
            .filter(|p| !p.model_server)
            .count();
        v.push((Signal::GpuForeignProcesses, foreign as f64));
    }
    let ecc = samples
        .iter()
        .filter_map(|d| d.ecc_uncorrected)
        .sum::<u64>();
    let faults = match selection {
        GpuSelection::All => s.xid_counts.values().sum::<u64>() + s.lost_total + ecc,
        GpuSelection::Only(ids) => {
            s.xid_counts
                .iter()
                .filter(|((id, _), _)| ids.contains(id))
                .map(|(_, n)| n)
                .sum::<u64>()
                + chosen.iter().filter(|d| d.lost).count() as u64
                + ecc
        }
    };
    (v, faults, evidence)
}

/// Signal values of one sample.
pub type Signals = Vec<(Signal, f64)>;

/// A target's cgroup signal `s` as the engine takes it: on a router target the cgroup is the
/// router's, its CPU throttling [`Signal::RouterCpuThrottled`] (seen live: Dynamo 1.6.1's
/// frontend at 5 % of a core named `cpu_throttling`, as if a model server were at its quota).
pub fn router_own(s: Signal, router: bool) -> Signal {
    match s {
        Signal::CgroupCpuThrottled if router => Signal::RouterCpuThrottled,
        s => s,
    }
}

/// The diagnosis signals of one node sample: node-wide ones (PSI, the agent's own CPU) for
/// every target, and each target's cgroup values for it (absent fields stay absent).
pub fn node_signals(s: &crate::node::NodeSample) -> (Signals, Vec<(String, Signals)>) {
    let node = [
        (Signal::NodeCpuPressure, s.cpu_some),
        (Signal::NodeMemoryPressure, s.memory_some),
        (Signal::NodeIoPressure, s.io_some),
        (Signal::AgentCpu, s.agent_cpu_cores),
    ]
    .into_iter()
    .filter_map(|(sig, x)| x.map(|x| (sig, x)))
    .collect();
    let targets = s
        .targets
        .iter()
        .map(|(name, c)| {
            let v = [
                (Signal::CgroupCpuThrottled, c.cpu_throttled_share),
                (Signal::CgroupMemoryUsage, c.memory_usage_ratio),
                (Signal::CgroupOomKill, c.oom_kills.map(|k| k as f64)),
                (Signal::ServerCpuWait, c.cpu_wait_s_per_s),
                (Signal::ServerCpu, c.cpu_cores),
            ]
            .into_iter()
            .filter_map(|(sig, x)| x.map(|x| (sig, x)))
            .collect();
            (name.clone(), v)
        })
        .collect();
    (node, targets)
}

/// The termination a restart followed when the container was OOM-killed: `OOMKilled (exit
/// 137)` of discovery's lifecycle change (`restarts N after OOMKilled (exit 137)`,
/// `crate::discovery::lifecycle`, from the pod's `lastState.terminated`). `OOMKilled` is the
/// reason the container runtime reports for a container its cgroup's OOM killer ended
/// (containerd `internal/cri/server/events.go`, `oomExitReason`; the kubelet passes it on
/// as `ContainerStateTerminated.Reason`). `None` for any other change.
pub fn oom_killed(e: &ServerEvent) -> Option<&str> {
    if e.kind != crate::server::ChangeKind::Restart {
        return None;
    }
    let (_, why) = e.new.as_deref()?.split_once(" after ")?;
    why.starts_with("OOMKilled").then_some(why)
}

impl LiveDiagnosis {
    /// For the agent's `targets` (each gets an entry, idle, from the start).
    pub fn new(config: EngineConfig, targets: Vec<String>) -> Self {
        let last = Diagnosis {
            schema_version: crate::diagnosis::report::SCHEMA_VERSION,
            evaluated_at_unix_s: 0.0,
            targets: targets.iter().map(|t| idle(t)).collect(),
            nodes: Vec::new(),
        };
        Self {
            engine: Mutex::new(Engine::new(config)),
            last: Mutex::new(last),
            confirmed: Mutex::default(),
            kept: Mutex::default(),
            reachability: Mutex::default(),
            gpu_seen: Mutex::default(),
            k8s: Mutex::default(),
            addresses: Mutex::default(),
            gpu_evidence: Mutex::default(),
            server_seen: Mutex::default(),
            server_changes: Mutex::default(),
            per_request_timing: Mutex::default(),
            profilers: Default::default(),
            node_latest: Default::default(),
            targets: Mutex::new(targets),
            routers: Mutex::default(),
            announcer: Mutex::default(),
            evaluations: AtomicU64::new(0),
            evaluate_ns: AtomicU64::new(0),
            loop_cpu_ns: AtomicU64::new(0),
        }
    }

    /// The targets now.
    fn target_names(&self) -> Vec<String> {
        self.targets.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// A target joined: it is evaluated from now on (idle until it has evidence).
    pub fn add_target(&self, name: &str) {
        if let Ok(mut g) = self.targets.lock()
            && !g.iter().any(|t| t == name)
        {
            g.push(name.to_owned());
        }
    }

    /// Whether `name` is a router in front of workers (`kind = "router"`): its cgroup's CPU
    /// throttling is fed as the router's ([`Signal::RouterCpuThrottled`]), not a model
    /// server's.
    pub fn set_router(&self, name: &str, router: bool) {
        if let Ok(mut g) = self.routers.lock() {
            if router {
                g.insert(name.to_owned());
            } else {
                g.remove(name);
            }
        }
    }

    /// A target left: its evidence, last evaluation, confirmed diagnosis and kept spans go.
    pub fn remove_target(&self, name: &str) {
        if let Ok(mut g) = self.targets.lock() {
            g.retain(|t| t != name);
        }
        if let Ok(mut e) = self.engine.lock() {
            e.forget(name);
        }
        if let Ok(mut l) = self.last.lock() {
            l.targets.retain(|t| t.target != name);
        }
        if let Ok(mut c) = self.confirmed.lock() {
            c.remove(name);
        }
        if let Ok(mut k) = self.kept.lock() {
            k.remove(name);
        }
        if let Ok(mut r) = self.reachability.lock() {
            r.remove(name);
        }
        if let Ok(mut s) = self.server_seen.lock() {
            s.remove(name);
        }
    }

    /// Feeds one measured canary of `target` (at its end) and what the kernel saw of it.
    pub fn observe_request(&self, target: &str, m: &Measured, net: Option<RequestNet>) {
        let end = m.wall_start + m.record.e2e;
        self.observe_reachability(target, m, end);
        let Ok(mut e) = self.engine.lock() else {
            return;
        };
        for (s, v) in request_signals(m) {
            e.observe(target, s, end, v);
        }
        if let Some(t) = &m.record.server_timing {
            let source = per_request_source(t.source);
            for s in crate::diagnosis::inputs::PER_REQUEST_SIGNALS
                .into_iter()
                .chain([Signal::ClientServerTtftGap])
            {
                e.set_source(target, s, source);
            }
            if let Ok(mut seen) = self.per_request_timing.lock() {
                seen.insert(target.to_owned(), end);
            }
        }
        if let Some(net) = net {
            if let Some(rtt) = net.srtt_max {
                e.observe(target, Signal::NetSrtt, end, rtt.as_secs_f64());
            }
            if net.rtt_samples > 0 || net.retransmits > 0 {
                e.observe(target, Signal::NetRetransmits, end, net.retransmits as f64);
            }
            if let Some(c) = net.connect {
                e.observe(target, Signal::NetConnect, end, c.as_secs_f64());
            }
        }
    }

    /// Feeds a router target's routed canary that ended at `at`: its TTFT minus the direct
    /// canaries' p50 of the window, s ([`Signal::PathOverhead`]).
    pub fn observe_path_overhead(&self, target: &str, at: SystemTime, seconds: f64) {
        if let Ok(mut e) = self.engine.lock() {
            e.observe(target, Signal::PathOverhead, at, seconds);
        }
    }

    /// Feeds a router target's direct canary to one of its workers that ended at `at` with a
    /// first token after `ttft_s` ([`Signal::DirectTtft`]).
    pub fn observe_direct_ttft(&self, target: &str, at: SystemTime, ttft_s: f64) {
        if let Ok(mut e) = self.engine.lock() {
            e.observe(target, Signal::DirectTtft, at, ttft_s);
        }
    }

    /// Feeds a router target's workers apart from the others after a direct canary ended at
    /// `at` ([`crate::diagnosis::inputs::apart_signals`]: the slowest's ratio, the failing
    /// count), each with the worker it names.
    pub fn observe_workers_apart(
        &self,
        target: &str,
        at: SystemTime,
        apart: &lmperf_measure::workers_apart::WorkersApart,
    ) {
        if let Ok(mut e) = self.engine.lock() {
            for (signal, value, words) in crate::diagnosis::inputs::apart_signals(apart) {
                e.observe(target, signal, at, value);
                if let Some(w) = words {
                    e.note(target, signal, at, &w);
                }
            }
        }
    }

    /// Feeds one node sample taken at `at` (see [`node_signals`]).
    pub fn feed_node(&self, at: SystemTime, sample: &crate::node::NodeSample) {
        self.node_latest.record(at, sample);
        let (node, targets) = node_signals(sample);
        let names = self.target_names();
        let routers = self.routers.lock().map(|g| g.clone()).unwrap_or_default();
        let Ok(mut e) = self.engine.lock() else {
            return;
        };
        for t in &names {
            for &(s, v) in &node {
                e.observe(t, s, at, v);
            }
        }
        for (t, values) in targets {
            let router = routers.contains(&t);
            for (s, v) in values {
                e.observe(&t, router_own(s, router), at, v);
            }
        }
    }

    /// Feeds one scheduled canary of `target` at `at`: `skipped` when `max_in_flight`
    /// canaries still ran ([`Signal::CanarySkipped`]).
    pub fn observe_schedule(&self, target: &str, at: SystemTime, skipped: bool) {
        if let Ok(mut e) = self.engine.lock() {
            e.observe(
                target,
                Signal::CanarySkipped,
                at,
                f64::from(u8::from(skipped)),
            );
        }
    }

    /// The canaries of `target` in flight at `now`, by elapsed time (lower bounds of their
    /// E2E: [`Engine::in_flight`]).
    pub fn observe_in_flight(&self, target: &str, now: SystemTime, elapsed: &[Duration]) {
        if let Ok(mut e) = self.engine.lock() {
            e.in_flight(target, now, elapsed);
        }
    }

    /// What the diagnosis has cost so far.
    pub fn cost(&self) -> DiagnosisCost {
        DiagnosisCost {
            evaluations: self.evaluations.load(Ordering::Relaxed),
            cpu_s: self.loop_cpu_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    /// Feeds `target`'s reachability one canary (the agent's own cancellations left out) and
    /// says a change in the log: a WARN line when the target goes down (with its first error)
    /// and when it answers again (how long it was down).
    fn observe_reachability(&self, target: &str, m: &Measured, end: SystemTime) {
        let r = &m.record;
        let at_unix_s = unix_s(end);
        let outcome = match (r.outcome, r.failure()) {
            (crate::measure::Outcome::Cancelled, _) => return,
            (crate::measure::Outcome::Ok, _) => Ok(at_unix_s),
            (o, e) => Err(ErrorNote {
                at_unix_s,
                error_type: e.map_or_else(|| o.as_str().to_owned(), |e| e.error_type.clone()),
                message: e
                    .and_then(|e| e.message.as_deref())
                    .map(crate::measure::excerpt),
            }),
        };
        let Ok(mut all) = self.reachability.lock() else {
            return;
        };
        // The target's entry, without a new String per canary once it exists.
        if !all.contains_key(target) {
            all.insert(target.to_owned(), Reachability::default());
        }
        let Some(r) = all.get_mut(target) else {
            return;
        };
        match r.observe(outcome) {
            Some(Transition::Down(d)) => {
                tracing::warn!(target_name = %target, kind = d.kind.as_str(), since_start = d.since_start, "Target down: {}", d.words());
            }
            Some(Transition::Recovered {
                down,
                at_unix_s: last_failed,
            }) => {
                tracing::warn!(target_name = %target, down_s = format!("{:.1}", at_unix_s - down.since_unix_s), failed = down.failed, "Target answers again after {:.0} s {} ({} canaries failed, last at {} UTC).", at_unix_s - down.since_unix_s, down.kind.as_str(), down.failed, crate::diagnosis::report::clock(last_failed));
            }
            None => {}
        }
    }

    /// Whether `target` is down now (failed canaries in a row), with its errors; or, while
    /// an incident is open (`open_since`: its onset, Unix seconds), the episode that ended
    /// within [`DOWN_EPISODE_LOOKBACK`] before it: a restart after an outage is part of the
    /// outage's incident, and its errors stay its evidence.
    pub fn down(&self, target: &str, open_since: Option<f64>, now_unix_s: f64) -> Option<Down> {
        let r = self.reachability.lock().ok()?;
        let r = r.get(target)?;
        r.current().or_else(|| {
            r.last_episode()
                .filter(|d| {
                    d.recovered_unix_s.is_some_and(|up| {
                        open_since.is_some_and(|on| up >= on - DOWN_EPISODE_LOOKBACK.as_secs_f64())
                            || now_unix_s - up < crate::diagnosis::outage::HOLD_AFTER_RECOVERY_S
                    })
                })
                .cloned()
        })
    }

    /// The server change events of `target` remembered (Unix seconds, kind), oldest first.
    fn server_changes(&self, target: &str) -> Vec<(f64, &'static str)> {
        self.server_changes
            .lock()
            .ok()
            .and_then(|k| k.get(target).map(|v| v.iter().copied().collect()))
            .unwrap_or_default()
    }

    /// Remembers a kept span of `target` that ended at `end`, for the diagnosis span's links:
    /// `priority` when it was kept for a reason (error, SLO breach, spike), else by chance.
    pub fn note_kept(&self, target: &str, ids: TraceIds, end: SystemTime, priority: bool) {
        let Ok(mut k) = self.kept.lock() else { return };
        k.entry(target.to_owned())
            .or_default()
            .push((end, ids.trace_id, ids.span_id), priority);
    }

    /// Sets the pod serving `target` (`None`: not known; it reads every GPU).
    /// `target`'s server address, from its base URL (`None`: it left).
    pub fn set_address(&self, target: &str, base_url: Option<&url::Url>) {
        let Ok(mut a) = self.addresses.lock() else {
            return;
        };
        match base_url.and_then(address_of) {
            Some(addr) => a.insert(target.to_owned(), addr),
            None => a.remove(target),
        };
    }

    pub fn set_k8s(&self, target: &str, identity: Option<K8sIdentity>) {
        let Ok(mut k) = self.k8s.lock() else { return };
        match identity {
            Some(i) => k.insert(target.to_owned(), i),
            None => k.remove(target),
        };
    }

    /// Feeds a new GPU tick to every target: the GPUs of its pod where the kubelet's
    /// pod-resources API tells them, else every GPU of the node.
    fn feed_gpu(&self, gpu: &GpuState) {
        let snap = gpu.latest();
        let Some(at) = snap.at else { return };
        let Ok(mut seen) = self.gpu_seen.lock() else {
            return;
        };
        if seen.0 == Some(at) {
            return;
        }
        seen.0 = Some(at);
        let identities = self.k8s.lock().map(|k| k.clone()).unwrap_or_default();
        let targets = self.target_names();
        let mut fed = Vec::with_capacity(targets.len());
        for t in &targets {
            let selection = gpu.selection(identities.get(t));
            let (signals, faults, evidence) = gpu_signals_of(&snap, &selection);
            let new_faults = seen
                .1
                .get(t)
                .map_or(0, |before| faults.saturating_sub(*before));
            seen.1.insert(t.clone(), faults);
            // Where it reads its GPUs: a node-level GPU fault needs targets sharing one.
            let gpus = match selection {
                GpuSelection::All => None,
                GpuSelection::Only(ids) => Some(ids),
            };
            fed.push((t, signals, new_faults, evidence, gpus));
        }
        drop(seen);
        if let Ok(mut ev) = self.gpu_evidence.lock() {
            for (t, _, _, evidence, _) in &fed {
                let kept = ev.entry((*t).clone()).or_default();
                for (sig, ids) in evidence {
                    // A throttle that stopped keeps naming the GPUs that throttled.
                    if *sig == Signal::GpuThrottle && ids.is_empty() {
                        continue;
                    }
                    kept.retain(|(s, _)| s != sig);
                    kept.push((*sig, ids.clone()));
                }
            }
        }
        let Ok(mut e) = self.engine.lock() else {
            return;
        };
        for (t, signals, new_faults, _, gpus) in fed {
            e.place(t, Placement { node: None, gpus });
            for (s, v) in signals {
                e.observe(t, s, at, v);
            }
            e.observe(t, Signal::GpuFault, at, new_faults as f64);
        }
    }

    /// Names the GPUs behind the GPU evidence of `td`.
    fn add_gpu_evidence(&self, td: &mut TargetDiagnosis) {
        let Ok(ev) = self.gpu_evidence.lock() else {
            return;
        };
        let Some(kept) = ev.get(&td.target) else {
            return;
        };
        for e in td.causes.iter_mut().flat_map(|c| &mut c.evidence) {
            if let Some((_, ids)) = kept.iter().find(|(s, _)| *s == e.signal) {
                e.hw_ids = ids.clone();
            }
        }
    }

    /// Feeds the model server samples and change events scraped since the last call.
    pub fn feed_server(&self, server: &ServerState) {
        let Ok(mut seen) = self.server_seen.lock() else {
            return;
        };
        for t in &self.target_names() {
            let (last_sample, last_event) = seen
                .get(t)
                .copied()
                .unwrap_or((SystemTime::UNIX_EPOCH, SystemTime::UNIX_EPOCH));
            let samples: Vec<ServerSample> = server
                .history(t)
                .into_iter()
                .filter(|s| s.at > last_sample)
                .collect();
            let events: Vec<ServerEvent> = server
                .events(t)
                .into_iter()
                .filter(|e| e.at > last_event)
                .collect();
            if samples.is_empty() && events.is_empty() {
                continue;
            }
            let Ok(mut e) = self.engine.lock() else {
                return;
            };
            let per_request_since = self
                .per_request_timing
                .lock()
                .ok()
                .and_then(|m| m.get(t).copied());
            for s in &samples {
                // The canaries' own server timing, fresh, stands for the histogram means.
                let per_request = per_request_since.is_some_and(|at| {
                    s.at.duration_since(at).unwrap_or_default() <= PER_REQUEST_FRESH
                });
                for (sig, v) in server_signals(s) {
                    let timed = crate::diagnosis::inputs::PER_REQUEST_SIGNALS.contains(&sig);
                    if timed && per_request {
                        continue;
                    }
                    if timed {
                        e.set_source(t, sig, SCRAPE_SOURCE);
                    }
                    e.observe(t, sig, s.at, v);
                }
                // Which worker the router favours: named in the imbalance's evidence.
                if let Some(w) = crate::diagnosis::inputs::most_picked(&s.router_picks) {
                    e.note(t, Signal::PickImbalance, s.at, &w);
                }
                if let Some(w) = crate::diagnosis::inputs::starved(&s.router_picks)
                    && !w.is_empty()
                {
                    e.note(t, Signal::StarvedWorkers, s.at, &w.join(", "));
                }
            }
            if let Ok(mut kept) = self.server_changes.lock() {
                let k = kept.entry(t.clone()).or_default();
                for ev in &events {
                    k.push_back((unix_s(ev.at), ev.kind.as_str()));
                    while k.len() > CHANGES_KEPT {
                        k.pop_front();
                    }
                }
            }
            for ev in &events {
                e.observe(t, Signal::ServerChange, ev.at, 1.0);
                // A container the kernel killed for memory (Kubernetes says `OOMKilled`): the
                // OOM kill is memory_pressure's own event, the restart its consequence.
                if let Some(why) = oom_killed(ev) {
                    e.observe(t, Signal::CgroupOomKill, ev.at, 1.0);
                    e.note(t, Signal::CgroupOomKill, ev.at, why);
                    e.note(t, Signal::ServerChange, ev.at, why);
                }
            }
            let newest_sample = samples.iter().map(|s| s.at).max().unwrap_or(last_sample);
            let newest_event = events.iter().map(|e| e.at).max().unwrap_or(last_event);
            seen.insert(t.clone(), (newest_sample, newest_event));
        }
    }

    /// One evaluation at `now`; returns the targets that just reached root_confirmed.
    pub fn tick(&self, now: SystemTime, gpu: Option<&GpuState>) -> Vec<TargetDiagnosis> {
        self.step(now, gpu).newly
    }

    /// One evaluation at `now`: the targets that just reached root_confirmed, and what to say
    /// of them ([`Announcer`]: a node-level fault once for its node, not once per target).
    pub fn step(&self, now: SystemTime, gpu: Option<&GpuState>) -> Tick {
        if let Some(g) = gpu {
            self.feed_gpu(g);
        }
        let started = std::time::Instant::now();
        let (d, neighbours) = match self.engine.lock() {
            Ok(mut e) => {
                let d = e.evaluate(now);
                let n: Vec<(String, bool)> = d
                    .targets
                    .iter()
                    .map(|t| (t.target.clone(), e.has_neighbours(&t.target)))
                    .collect();
                (d, n)
            }
            Err(_) => return Tick::default(),
        };
        self.evaluations.fetch_add(1, Ordering::Relaxed);
        self.evaluate_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut newly = Vec::new();
        let Ok(mut last) = self.last.lock() else {
            return Tick::default();
        };
        let names = self.target_names();
        let mut merged = Diagnosis {
            schema_version: d.schema_version,
            evaluated_at_unix_s: d.evaluated_at_unix_s,
            targets: Vec::new(),
            nodes: d
                .nodes
                .iter()
                .filter(|n| n.targets.iter().any(|t| names.contains(t)))
                .cloned()
                .collect(),
        };
        for name in &names {
            let mut td = d
                .targets
                .iter()
                .find(|t| &t.target == name)
                .cloned()
                .unwrap_or_else(|| idle(name));
            self.add_gpu_evidence(&mut td);
            td.down = self.down(
                name,
                td.onset_unix_s.filter(|_| td.state != State::Idle),
                unix_s(now),
            );
            if let Some(down) = td.down.clone() {
                // The outage ranks as its own root (a restart seen after it, its child); a
                // target down now, or back for less than the hold, is an incident whatever
                // the baseline.
                crate::diagnosis::outage::add_changes(&mut td, &down, &self.server_changes(name));
                crate::diagnosis::outage::rank(&mut td, unix_s(now));
                td.summary = crate::diagnosis::outage::line(&td).or_else(|| td.line());
            }
            let before = last
                .targets
                .iter()
                .find(|t| &t.target == name)
                .map_or(State::Idle, |t| t.state);
            if td.state == State::RootConfirmed && before != State::RootConfirmed {
                newly.push(td.clone());
                if let Ok(mut c) = self.confirmed.lock() {
                    c.insert(name.clone(), (now, td.clone()));
                }
            }
            merged.targets.push(td);
        }
        let announce = match self.announcer.lock() {
            Ok(mut a) => a.step(&merged, &|t| {
                neighbours.iter().any(|(n, has)| n == t && *has)
            }),
            Err(_) => Vec::new(),
        };
        *last = merged;
        Tick { newly, announce }
    }

    /// The last evaluation, for `target` only when given; with `window`, a target idle now
    /// that was root_confirmed within `window` before `now` shows that diagnosis instead.
    pub fn snapshot(
        &self,
        target: Option<&str>,
        window: Option<Duration>,
        now: SystemTime,
    ) -> Diagnosis {
        let mut d = self
            .last
            .lock()
            .map(|g| g.clone())
            .unwrap_or_else(|_| Diagnosis {
                schema_version: crate::diagnosis::report::SCHEMA_VERSION,
                evaluated_at_unix_s: 0.0,
                targets: Vec::new(),
                nodes: Vec::new(),
            });
        d.targets.retain(|t| target.is_none_or(|w| w == t.target));
        d.nodes
            .retain(|n| target.is_none_or(|w| n.targets.iter().any(|t| t == w)));
        if let Some(w) = window
            && let Ok(c) = self.confirmed.lock()
        {
            for t in &mut d.targets {
                if t.state == State::Idle
                    && let Some((at, past)) = c.get(&t.target)
                    && now.duration_since(*at).unwrap_or_default() <= w
                {
                    *t = past.clone();
                }
            }
        }
        self.add_profiles(&mut d);
        self.add_worker_pods(&mut d);
        d
    }

    /// The pod of each diagnosis's worker (`scope: worker`) that is a target of this agent
    /// with a pod: the target at the worker's address.
    fn add_worker_pods(&self, d: &mut Diagnosis) {
        let (Ok(addresses), Ok(k8s)) = (self.addresses.lock(), self.k8s.lock()) else {
            return;
        };
        for t in &mut d.targets {
            let Some(addr) = t.worker.as_deref().and_then(worker_address) else {
                continue;
            };
            t.worker_pod = addresses
                .iter()
                .find(|(_, a)| **a == addr)
                .and_then(|(target, _)| k8s.get(target))
                .map(K8sIdentity::qualified_name);
        }
    }

    /// A confirmed diagnosis's profiler call, as it stands now (`started`, then its outcome):
    /// the target's latest call made since the diagnosis's onset.
    fn add_profiles(&self, d: &mut Diagnosis) {
        let latest = self.profilers.latest();
        for t in &mut d.targets {
            if t.state != State::RootConfirmed {
                continue;
            }
            let since = t.onset_unix_s.or(t.since_unix_s).unwrap_or(f64::INFINITY);
            if let Some(p) = latest.get(&t.target).filter(|p| p.at_unix_s >= since) {
                t.profile = Some(p.clone());
            }
        }
    }

    /// Calls `d.target`'s profiler for a confirmed diagnosis it can explain (a server-side
    /// cause with TPOT up) when `[target.profiling]` allows it now; the `started` record is
    /// put on `d` and returned.
    pub fn profile_for(&self, d: &mut TargetDiagnosis, now: SystemTime) -> Option<ServerProfile> {
        if !crate::profiler::wants_profile(d) {
            return None;
        }
        let p = self.profilers.get(&d.target)?;
        let reason = d
            .causes
            .first()
            .map_or("unknown", |c| c.cause.as_str())
            .to_owned()
            + " with TPOT up";
        let started = p.trigger(Trigger::RootConfirmed, &reason, Instant::now(), now)?;
        d.profile = Some(started.clone());
        Some(started)
    }

    /// The current score of each cause and the state code of each target (for the gauges).
    pub fn gauges(&self) -> Vec<TargetGauges> {
        let Ok(g) = self.last.lock() else {
            return Vec::new();
        };
        g.targets
            .iter()
            .map(|t| {
                let scores = Cause::ALL
                    .iter()
                    .map(|&c| {
                        (
                            c,
                            t.causes
                                .iter()
                                .find(|x| x.cause == c)
                                .map_or(0.0, |x| x.score),
                        )
                    })
                    .collect();
                (t.target.clone(), t.state.code(), scores)
            })
            .collect()
    }

    /// The `lmperf.diagnosis` span of a confirmed diagnosis: INTERNAL, from the onset to `now`,
    /// linked to the target's kept traces ([`link_spans`]).
    pub fn span(
        &self,
        d: &TargetDiagnosis,
        ids: TraceIds,
        now: SystemTime,
        scope: &opentelemetry::InstrumentationScope,
    ) -> SpanData {
        self.span_linking(d, std::slice::from_ref(&d.target), ids, now, scope)
    }

    /// The `lmperf.diagnosis` span of a node-level diagnosis: as [`span`](Self::span), its
    /// `lmperf.target` the member targets (comma-separated), linked to each one's kept traces.
    pub fn node_span(
        &self,
        n: &NodeDiagnosis,
        ids: TraceIds,
        now: SystemTime,
        scope: &opentelemetry::InstrumentationScope,
    ) -> SpanData {
        let mut d = idle(&n.targets.join(","));
        d.state = n.state;
        d.onset_unix_s = n.onset_unix_s;
        d.causes = vec![crate::diagnosis::CauseScore {
            cause: n.cause,
            score: n.score,
            evidence: n.evidence.clone(),
        }];
        d.summary = Some(n.summary.clone());
        d.scope = crate::diagnosis::Scope::Node;
        d.node = Some(n.node.clone());
        self.span_linking(&d, &n.targets, ids, now, scope)
    }

    fn span_linking(
        &self,
        d: &TargetDiagnosis,
        link_targets: &[String],
        ids: TraceIds,
        now: SystemTime,
        scope: &opentelemetry::InstrumentationScope,
    ) -> SpanData {
        let onset = d.onset_unix_s.map_or(now, |s| {
            SystemTime::UNIX_EPOCH + Duration::from_secs_f64(s.max(0.0))
        });
        let mut links = SpanLinks::default();
        if let Ok(k) = self.kept.lock() {
            let kept: Vec<&KeptSpans> = link_targets.iter().filter_map(|t| k.get(t)).collect();
            for (_, trace_id, span_id) in link_spans(&kept, onset) {
                let ctx = SpanContext::new(
                    trace_id,
                    span_id,
                    TraceFlags::SAMPLED,
                    false,
                    TraceState::default(),
                );
                links.links.push(Link::new(ctx, Vec::new(), 0));
            }
        }
        let top = d.causes.first();
        let mut a = vec![
            KeyValue::new(n::LMPERF_TARGET, d.target.clone()),
            KeyValue::new(n::LMPERF_DIAGNOSIS_STATE, d.state.as_str()),
            KeyValue::new(
                n::LMPERF_DIAGNOSIS_CAUSE,
                top.map_or("unknown", |c| c.cause.as_str()),
            ),
            KeyValue::new(n::LMPERF_DIAGNOSIS_SCORE, top.map_or(0.0, |c| c.score)),
            KeyValue::new(
                n::LMPERF_DIAGNOSIS_ONSET,
                Value::F64(d.onset_unix_s.unwrap_or_else(|| unix_s(now))),
            ),
        ];
        if let Some(line) = &d.summary {
            a.push(KeyValue::new(n::LMPERF_DIAGNOSIS_SUMMARY, line.clone()));
        }
        if let Some(c) = top {
            a.push(KeyValue::new(
                n::LMPERF_DIAGNOSIS_EVIDENCE,
                serde_json::to_string(&c.evidence).unwrap_or_default(),
            ));
        }
        SpanData {
            span_context: SpanContext::new(
                ids.trace_id,
                ids.span_id,
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: n::SPAN_DIAGNOSIS.into(),
            start_time: onset.min(now),
            end_time: now,
            attributes: a,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links,
            status: Status::Unset,
            instrumentation_scope: scope.clone(),
        }
    }
}

fn idle(target: &str) -> TargetDiagnosis {
    TargetDiagnosis::idle(target)
}

/// What one evaluation ([`LiveDiagnosis::step`]) found.
#[derive(Debug, Default)]
pub struct Tick {
    /// The targets that just reached root_confirmed.
    pub newly: Vec<TargetDiagnosis>,
    /// What to say: each incident once (a node's fault for the node).
    pub announce: Vec<Announcement>,
}

/// Evaluates every second until `stop`; on each new root_confirmed: the WARN line and the
/// `lmperf.diagnosis` span.
pub async fn run(
    live: std::sync::Arc<LiveDiagnosis>,
    gpu: std::sync::Arc<GpuState>,
    server: std::sync::Arc<ServerState>,
    telemetry: std::sync::Arc<crate::telemetry::Telemetry>,
    mut node: Option<crate::node::NodeSampler>,
    stop: tokio_util::sync::CancellationToken,
) {
    // On the shared grid with the canaries' spike ticks: one wake-up a second for both.
    let mut every = crate::grid::interval(Duration::from_secs(1));
    let confirmed = telemetry
        .meter()
        .u64_counter(n::METRIC_DIAGNOSIS_CONFIRMED)
        .with_unit("{diagnosis}")
        .with_description("Confirmed root causes, by target and cause.")
        .build();
    // The first evaluation at once (the API lists the targets from the start), then on the grid.
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            tokio::select! {
                biased;
                _ = stop.cancelled() => {
                    // A vLLM profile in progress is stopped, never left running.
                    live.profilers.shutdown(Duration::from_secs(2)).await;
                    return;
                }
                _ = every.tick() => {}
            }
        }
        let now = SystemTime::now();
        let cpu0 = thread_cpu_ns();
        live.feed_server(&server);
        let cpu_feed = thread_cpu_ns().saturating_sub(cpu0);
        // The node's /proc and /sys files, off the runtime's threads.
        if let Some(mut n) = node.take() {
            let at = std::time::Instant::now();
            if let Ok((n, sample, read_ns)) = tokio::task::spawn_blocking(move || {
                let cpu0 = thread_cpu_ns();
                let s = n.sample(at);
                (n, s, thread_cpu_ns().saturating_sub(cpu0))
            })
            .await
            {
                let cpu0 = thread_cpu_ns();
                live.feed_node(now, &sample);
                live.loop_cpu_ns.fetch_add(
                    read_ns + thread_cpu_ns().saturating_sub(cpu0),
                    Ordering::Relaxed,
                );
                node = Some(n);
            }
        }
        // The engine's step off the runtime's worker: a canary's frames are timed as they
        // arrive, never behind an evaluation.
        let (l, g) = (live.clone(), gpu.clone());
        let Ok((tick, step_ns)) = tokio::task::spawn_blocking(move || {
            let cpu0 = thread_cpu_ns();
            let tick = l.step(now, Some(&g));
            (tick, thread_cpu_ns().saturating_sub(cpu0))
        })
        .await
        else {
            continue;
        };
        live.loop_cpu_ns
            .fetch_add(cpu_feed + step_ns, Ordering::Relaxed);
        for a in tick.announce {
            let mut d = match a {
                Announcement::Target(d) => *d,
                Announcement::Node(n) => {
                    announce_node(&live, &telemetry, &confirmed, &n, now);
                    continue;
                }
            };
            let mut line = d.summary.clone().unwrap_or_else(|| "unknown".to_owned());
            if let Some(p) = live.profile_for(&mut d, now) {
                let dir = p.output_dir.as_deref().unwrap_or("its default directory");
                line.push_str(&format!(
                    " Profiler: {} {} asked {}, trace in {dir} on the server.",
                    p.kind, p.server, p.detail
                ));
            }
            // The line carries its `lmperf.diagnosis` span's ids, so a log line joins its trace.
            let ids = telemetry.new_trace();
            tracing::warn!(target_name = %d.target, cause = d.causes.first().map_or("unknown", |c| c.cause.as_str()), trace_id = %ids.trace_id, span_id = %ids.span_id, "Diagnosis: {line}");
            let span = live.span(&d, ids, now, telemetry.scope());
            let attrs = [
                KeyValue::new(n::LMPERF_TARGET, d.target.clone()),
                KeyValue::new(
                    n::LMPERF_DIAGNOSIS_CAUSE,
                    d.causes.first().map_or("unknown", |c| c.cause.as_str()),
                ),
            ];
            confirmed.add(1, &attrs);
            let e = telemetry
                .spans
                .enqueue(span, crate::sampler::adaptive::Reason::Spike);
            if let Some(t) = e.evicted {
                telemetry.exemplars.forget_trace(t);
            }
            if e.queued {
                // The counter's exemplar is this diagnosis span (only once it is queued).
                telemetry.exemplars.offer_counter(
                    crate::telemetry::exemplars::DIAGNOSIS_CONFIRMED_FAMILY,
                    &attrs,
                    ids.trace_id,
                    ids.span_id,
                    now,
                    1.0,
                );
            }
        }
    }
}

/// Says a node-level diagnosis once: one WARN line naming the node and its targets, one
/// `lmperf.diagnosis` span linked to every member's kept traces, the confirmed counter for each
/// member target (it counts by target).
fn announce_node(
    live: &LiveDiagnosis,
    telemetry: &crate::telemetry::Telemetry,
    confirmed: &opentelemetry::metrics::Counter<u64>,
    nd: &NodeDiagnosis,
    now: SystemTime,
) {
    let ids = telemetry.new_trace();
    let targets = nd.targets.join(",");
    tracing::warn!(target_name = %targets, node = %nd.node, scope = "node", cause = nd.cause.as_str(), trace_id = %ids.trace_id, span_id = %ids.span_id, "Diagnosis: {}", nd.summary);
    let span = live.node_span(nd, ids, now, telemetry.scope());
    for t in &nd.targets {
        confirmed.add(
            1,
            &[
                KeyValue::new(n::LMPERF_TARGET, t.clone()),
                KeyValue::new(n::LMPERF_DIAGNOSIS_CAUSE, nd.cause.as_str()),
            ],
        );
    }
    let e = telemetry
        .spans
        .enqueue(span, crate::sampler::adaptive::Reason::Spike);
    if let Some(t) = e.evicted {
        telemetry.exemplars.forget_trace(t);
    }
}

/// `lmperf.diagnosis.score{lmperf.target, lmperf.diagnosis.cause}` (unit 1) and
/// `lmperf.diagnosis.state{lmperf.target}` (unit `{state}`: 0 idle, 1 triggered,
/// 2 propagating, 3 root_confirmed, 4 warning).
pub fn register_gauges(meter: &opentelemetry::metrics::Meter, live: std::sync::Arc<LiveDiagnosis>) {
    crate::contention::register_gauges(meter, live.node_latest.clone());
    let l = live.clone();
    let _score = meter
        .f64_observable_gauge(n::METRIC_DIAGNOSIS_SCORE)
        .with_unit("1")
        .with_description("Score in [0, 1] of each root cause of the target's latency or error spike (0 when not ranked).")
        .with_callback(move |obs| {
            for (target, _, scores) in l.gauges() {
                for (cause, score) in scores {
                    obs.observe(score, &[KeyValue::new(n::LMPERF_TARGET, target.clone()), KeyValue::new(n::LMPERF_DIAGNOSIS_CAUSE, cause.as_str())]);
                }
            }
        })
        .build();
    let _state = meter
        .u64_observable_gauge(n::METRIC_DIAGNOSIS_STATE)
        .with_unit("{state}")
        .with_description(
            "Diagnosis state of the target: 0 idle, 1 triggered, 2 propagating, 3 root_confirmed, 4 warning (a cause's hard rule holds, no symptom yet).",
        )
        .with_callback(move |obs| {
            for (target, state, _) in live.gauges() {
                obs.observe(u64::from(state), &[KeyValue::new(n::LMPERF_TARGET, target)]);
            }
        })
        .build();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::{Outcome, RequestRecord};

    fn measured(ttft_ms: u64, outcome: Outcome, at: SystemTime) -> Measured {
        let mut record = RequestRecord::failed(
            outcome,
            crate::measure::RequestError::new("x", None),
            None,
            Duration::from_millis(ttft_ms * 2),
        );
        if outcome == Outcome::Ok {
            record.outcome = Outcome::Ok;
            record.error = None;
            record.ttft = Some(Duration::from_millis(ttft_ms));
            record.tpot = Some(Duration::from_millis(ttft_ms / 10));
        }
        Measured {
            record,
            wall_start: at,
            retries: 0,
            conn: None,
        }
    }

    /// Priority spans from 30 s before the onset first, then chance-kept spans from the onset
    /// on, newest first, at most MAX_LINKS; a diagnosis confirmed before spike mode kept
    /// anything links to the chance-kept slow requests of the incident.
    #[test]
    fn links_prefer_the_spike_and_fall_back_on_chance_kept_spans_of_the_incident() {
        let onset = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_100);
        let span = |s: i64, id: u64| {
            let at = if s >= 0 {
                onset + Duration::from_secs(s.unsigned_abs())
            } else {
                onset - Duration::from_secs(s.unsigned_abs())
            };
            (at, TraceId::from(u128::from(id)), SpanId::from(id))
        };
        let ids = |v: &[KeptSpan]| v.iter().map(|s| s.2).collect::<Vec<_>>();
        let mut only_chance = KeptSpans::default();
        for (s, id) in [(-60, 1), (-5, 2), (0, 3), (4, 4), (9, 5)] {
            only_chance.push(span(s, id), false);
        }
        assert_eq!(
            ids(&link_spans(&[&only_chance], onset)),
            [SpanId::from(5), SpanId::from(4), SpanId::from(3)],
            "chance-kept spans from the onset on, newest first"
        );
        let mut both = KeptSpans::default();
        for (s, id) in [(-40, 10), (-20, 11), (2, 12)] {
            both.push(span(s, id), true);
        }
        both.push(span(5, 13), false);
        assert_eq!(
            ids(&link_spans(&[&both], onset)),
            [SpanId::from(12), SpanId::from(11), SpanId::from(13)],
            "priority since onset − 30 s first, then chance"
        );
        let mut many = KeptSpans::default();
        for id in 0..(KEPT_PER_TARGET as u64 + 10) {
            many.push(span(id as i64, 100 + id), id % 2 == 0);
        }
        assert_eq!(many.priority.len() + many.chance.len(), 74);
        let links = link_spans(&[&many, &both], onset);
        assert_eq!(links.len(), MAX_LINKS);
        assert_eq!(
            links[0].2,
            SpanId::from(100 + 72),
            "the newest priority span first"
        );
        assert!(
            links.iter().all(|l| l.2 != SpanId::from(13)),
            "no chance span while priority fills it"
        );
    }

    #[test]
    fn cancelled_requests_feed_nothing_and_errors_feed_ratios() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert!(request_signals(&measured(10, Outcome::Cancelled, t)).is_empty());
        let ok = request_signals(&measured(100, Outcome::Ok, t));
        assert!(
            ok.contains(&(Signal::Error, 0.0))
                && ok.contains(&(Signal::Ttft, 0.1))
                && ok.contains(&(Signal::Tpot, 0.01)),
            "{ok:?}"
        );
        let timeout = request_signals(&measured(100, Outcome::Timeout, t));
        assert!(
            timeout.contains(&(Signal::Error, 1.0))
                && timeout.contains(&(Signal::ErrorTimeout, 1.0))
                && !timeout.iter().any(|(s, _)| *s == Signal::Ttft),
            "{timeout:?}"
        );
    }

    #[test]
    fn confirmed_once_with_links_and_gauges() {
        let live = LiveDiagnosis::new(EngineConfig::default(), vec!["a".into(), "b".into()]);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut confirmed = Vec::new();
        for s in 0..400u64 {
            let bad = s >= 300;
            for half in [0u64, 500] {
                let at = t0 + Duration::from_millis(s * 1000 + half);
                let m = measured(if bad { 2000 } else { 100 + (s % 7) * 3 }, Outcome::Ok, at);
                live.observe_request("a", &m, None);
                if bad {
                    let ids = TraceIds {
                        trace_id: TraceId::from(u128::from(s) + 1),
                        span_id: SpanId::from(s + 1),
                        sampled: true,
                    };
                    live.note_kept("a", ids, at, true);
                }
            }
            confirmed.extend(live.tick(t0 + Duration::from_secs(s + 1), None));
        }
        assert_eq!(confirmed.len(), 1, "{confirmed:#?}");
        let d = &confirmed[0];
        assert_eq!(
            (d.target.as_str(), d.causes[0].cause),
            ("a", Cause::LoadSurge)
        );
        let g = live.gauges();
        assert_eq!(
            g.iter()
                .map(|(t, s, _)| (t.as_str(), *s))
                .collect::<Vec<_>>(),
            [("a", 3), ("b", 0)]
        );
        assert!(
            g[0].2
                .iter()
                .any(|&(c, s)| c == Cause::LoadSurge && s >= 0.75)
        );
        let ids = TraceIds {
            trace_id: TraceId::from(99u128),
            span_id: SpanId::from(99u64),
            sampled: true,
        };
        let span = live.span(
            d,
            ids,
            t0 + Duration::from_secs(400),
            &opentelemetry::InstrumentationScope::builder("t").build(),
        );
        assert_eq!(span.span_kind, SpanKind::Internal);
        assert_eq!(span.links.links.len(), MAX_LINKS);
        assert!(
            span.attributes
                .iter()
                .any(|kv| kv.key.as_str() == n::LMPERF_DIAGNOSIS_CAUSE
                    && kv.value.as_str() == "load_surge")
        );
        // Only target a, with a window showing the confirmed episode.
        let snap = live.snapshot(
            Some("a"),
            Some(Duration::from_secs(900)),
            t0 + Duration::from_secs(400),
        );
        assert_eq!(snap.targets.len(), 1);
        assert_eq!(snap.targets[0].state, State::RootConfirmed);
    }

    /// A confirmed server-side cause with TPOT up calls `[target.profiling]`'s vLLM profiler
    /// once (a second confirmation within `min_interval` does not), a network cause never; the
    /// agent's shutdown stops the running profile at once (`/stop_profile`), and the record
    /// says so.
    #[tokio::test]
    async fn a_confirmed_server_cause_with_tpot_up_profiles_once_and_shutdown_stops_it() {
        use crate::config::profiling::{RawProfiling, validate};
        use crate::diagnosis::report::{CauseScore, Symptom};
        let calls: std::sync::Arc<Mutex<Vec<String>>> = Default::default();
        let (c1, c2) = (calls.clone(), calls.clone());
        let app = axum::Router::new()
            .route(
                "/start_profile",
                axum::routing::post(move || async move {
                    c1.lock().unwrap().push("start".into());
                }),
            )
            .route(
                "/stop_profile",
                axum::routing::post(move || async move {
                    c2.lock().unwrap().push("stop".into());
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = url::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let cfg = validate(
            "target[0].profiling",
            RawProfiling {
                kind: Some("vllm".into()),
                seconds: Some(Duration::from_secs(300)),
                on: Some(vec!["root_confirmed".into()]),
                ..RawProfiling::default()
            },
        )
        .unwrap();
        let live = LiveDiagnosis::new(EngineConfig::default(), vec!["a".into()]);
        live.profilers.set("a", Some(&cfg), &url);
        let confirmed = |cause: Cause| TargetDiagnosis {
            state: State::RootConfirmed,
            onset_unix_s: Some(1.0),
            symptom: Some(Symptom {
                signal: Signal::Tpot,
                value: 0.04,
                peak: 0.05,
                baseline: 0.02,
                ratio: 2.0,
                z: 9.0,
                jumped_buckets: 3,
                recent_buckets: 3,
            }),
            causes: vec![CauseScore {
                cause,
                score: 0.9,
                evidence: Vec::new(),
            }],
            ..idle("a")
        };
        let now = SystemTime::now();
        let mut net = confirmed(Cause::Network);
        assert_eq!(live.profile_for(&mut net, now), None);
        let mut d = confirmed(Cause::KvCachePressure);
        let started = live.profile_for(&mut d, now).expect("called");
        assert_eq!(
            (started.outcome.as_str(), started.trigger.as_str()),
            ("started", "root_confirmed")
        );
        assert_eq!(d.profile.as_ref(), Some(&started));
        assert_eq!(
            live.profile_for(&mut confirmed(Cause::KvCachePressure), now),
            None
        );
        for _ in 0..200 {
            if !calls.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        live.profilers.shutdown(Duration::from_secs(5)).await;
        assert_eq!(*calls.lock().unwrap(), ["start", "stop"]);
        let last = &live.profilers.latest()["a"];
        assert_eq!(last.outcome, "done", "{last:?}");
        assert_eq!(last.detail, "stopped early: the agent shut down");
    }

    /// Target `a` with a scraped server, its server state, and a diagnosis of it.
    fn one_scraped_target() -> (
        std::sync::Arc<crate::server::TargetServer>,
        ServerState,
        LiveDiagnosis,
    ) {
        let target = std::sync::Arc::new(crate::server::TargetServer::new(
            "a",
            Some("http://x/metrics".into()),
            None,
        ));
        let state = ServerState {
            targets: crate::live_list::LiveList::new(vec![target.clone()]),
        };
        let live = LiveDiagnosis::new(EngineConfig::default(), vec!["a".into()]);
        (target, state, live)
    }

    fn server_sample(at: SystemTime, waiting: f64, rate: f64) -> ServerSample {
        ServerSample {
            at,
            requests_waiting: Some(waiting),
            requests_running: Some(2.0),
            kv_cache_usage: None,
            preemptions_per_s: None,
            prefix_cache_hit_ratio: None,
            prompt_tokens_per_s: Some(rate * 100.0),
            generation_tokens_per_s: None,
            requests_per_s: Some(rate),
            ttft: Default::default(),
            itl: Default::default(),
            queue: crate::server::LatencyStats {
                mean: Some(waiting * 0.1),
                ..Default::default()
            },
            prefill: Default::default(),
            decode: Default::default(),
            router_kv_hit_rate: Default::default(),
            router_kv_transfer: Default::default(),
            router_picks: Vec::new(),
            picker_pool: None,
            pool_load: None,
            interval_s: Some(1.0),
            reset: false,
        }
    }

    /// Canaries that carry the server's own timing (vLLM's per-request `metrics`) feed its
    /// queue at canary resolution and say so; the scrape's histogram mean of the same figure is
    /// not fed while they do (here it says a steady 2 s, which would hide the change).
    #[test]
    fn per_request_server_timing_replaces_the_scrapes_histogram_means() {
        use crate::measure::server_timing::{ServerTiming, TimingSource};
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let (target, state, live) = one_scraped_target();
        let mut confirmed = Vec::new();
        for s in 0..300u64 {
            let at = t0 + Duration::from_secs(s);
            let slow = s >= 200;
            for half in [0u64, 500] {
                let queue_ms = if slow { 1400 } else { 5 + s % 3 };
                let mut m = measured(
                    100 + queue_ms + (s % 5) * 4,
                    Outcome::Ok,
                    at + Duration::from_millis(half),
                );
                m.record.server_timing = Some(ServerTiming {
                    ttft: Some(Duration::from_millis(queue_ms + 90)),
                    queue: Some(Duration::from_millis(queue_ms)),
                    prefill: Some(Duration::from_millis(90)),
                    ..ServerTiming::said_by(TimingSource::VllmMetrics)
                });
                live.observe_request("a", &m, None);
            }
            // Waiting 20 gives a scraped queue mean of 2 s, throughout.
            target.record_ok(
                server_sample(at + Duration::from_millis(600), 20.0, 2.0),
                crate::server::ServerKind::Vllm,
                &Default::default(),
            );
            live.feed_server(&state);
            confirmed.extend(live.tick(at + Duration::from_secs(1), None));
        }
        let d = confirmed
            .first()
            .unwrap_or_else(|| panic!("never confirmed"));
        let queue = d
            .causes
            .iter()
            .flat_map(|c| &c.evidence)
            .find(|e| e.signal == Signal::ServerQueueTime)
            .unwrap_or_else(|| panic!("no queue evidence: {:#?}", d.causes));
        assert!(queue.before < 0.01 && queue.after > 1.3, "{queue:?}");
        assert_eq!(queue.source.as_deref(), Some("vllm_metrics (per request)"));
        assert_eq!(d.causes[0].cause, Cause::ServerQueueing, "{:#?}", d.causes);
    }

    /// Behind Dynamo's frontend (no direct canary possible), the frontend starved of CPU:
    /// each routed canary waits in it before dispatch (`prefill_wait_time_ms` 1 → 60–180 ms,
    /// and its receiving the first token late: `prefill_time_ms` 3 → 100 ms, as measured on
    /// 1.6.1 with its quota cut to 1 % of a core): router_overhead, on the router, from the
    /// split's time before dispatch.
    #[test]
    fn dynamo_frontend_time_before_dispatch_names_the_router() {
        use crate::measure::server_timing::{ServerTiming, TimingSource};
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let (_target, _state, live) = one_scraped_target();
        let mut confirmed = Vec::new();
        for s in 0..300u64 {
            let at = t0 + Duration::from_secs(s);
            let slow = s >= 200;
            let (queue_ms, prefill_ms) = if slow {
                (60 + (s % 5) * 30, 100)
            } else {
                (1 + s % 2, 3 + s % 3)
            };
            let mut m = measured(queue_ms + prefill_ms + 2, Outcome::Ok, at);
            m.record.input_tokens = Some(24);
            m.record.server_timing = Some(ServerTiming {
                ttft: Some(Duration::from_millis(queue_ms + prefill_ms)),
                queue: Some(Duration::from_millis(queue_ms)),
                prefill: Some(Duration::from_millis(prefill_ms)),
                ..ServerTiming::said_by(TimingSource::DynamoTiming)
            });
            live.observe_request("a", &m, None);
            confirmed.extend(live.tick(at + Duration::from_secs(1), None));
        }
        let d = confirmed
            .first()
            .unwrap_or_else(|| panic!("never confirmed"));
        assert_eq!(d.causes[0].cause, Cause::RouterOverhead, "{:#?}", d.causes);
        assert_eq!(d.scope, lmperf_diagnosis::Scope::Router);
        let e = d.causes[0]
            .evidence
            .iter()
            .find(|e| e.signal == Signal::PathOverhead)
            .unwrap_or_else(|| panic!("{:#?}", d.causes));
        assert!(e.before < 0.005 && e.after > 0.06, "{e:?}");
        // The prefill time the starved frontend inflated is not longer prompts: the canaries'
        // prompts held.
        assert!(!d.roots.contains(&Cause::LongPrompts), "{d:#?}");
        assert!(
            d.causes
                .iter()
                .all(|c| c.cause != Cause::LongPrompts || c.score < 0.5),
            "{:#?}",
            d.causes
        );
    }

    /// A worker named by its URL or `host:port` is the pod of the target at that address;
    /// an instance id (Dynamo) or an address no target has names no pod.
    #[test]
    fn a_workers_pod_is_the_target_at_its_address() {
        let (_, _, live) = one_scraped_target();
        let url = |s: &str| url::Url::parse(s).unwrap();
        live.set_address("pod-a", Some(&url("http://10.0.0.5:8000/")));
        live.set_k8s(
            "pod-a",
            Some(K8sIdentity {
                namespace: "ml".into(),
                pod_name: "vllm-0".into(),
                ..K8sIdentity::default()
            }),
        );
        live.set_address("no-pod", Some(&url("http://10.0.0.6:8000")));
        let mut d = Diagnosis {
            schema_version: 1,
            evaluated_at_unix_s: 0.0,
            targets: Vec::new(),
            nodes: Vec::new(),
        };
        for (name, worker) in [
            ("r1", "http://10.0.0.5:8000"),
            ("r2", "10.0.0.5:8000"),
            ("r3", "http://10.0.0.6:8000"),
            ("r4", "7587888766"),
            ("r5", "http://10.0.0.5:8001"),
        ] {
            let mut t = idle(name);
            t.worker = Some(worker.into());
            d.targets.push(t);
        }
        live.add_worker_pods(&mut d);
        let pods: Vec<Option<&str>> = d.targets.iter().map(|t| t.worker_pod.as_deref()).collect();
        assert_eq!(
            pods,
            [Some("ml/vllm-0"), Some("ml/vllm-0"), None, None, None]
        );
        // The target left: its pod is no longer named.
        live.set_address("pod-a", None);
        live.add_worker_pods(&mut d);
        assert!(d.targets.iter().all(|t| t.worker_pod.is_none()));
    }

    #[test]
    fn server_samples_are_fed_once_and_absent_fields_stay_absent() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let v = server_signals(&server_sample(t0, 3.0, 2.0));
        assert_eq!(
            v,
            [
                (Signal::ServerRequestsWaiting, 3.0),
                (Signal::ServerRequestsRunning, 2.0),
                (Signal::ServerPromptTokensRate, 200.0),
                (Signal::ServerRequestRate, 2.0),
                (Signal::ServerQueueTime, 0.30000000000000004),
            ]
        );
        let (target, state, live) = one_scraped_target();
        // 3 min calm at 2 req/s with nothing waiting, then 12 req/s with 20 waiting; canaries
        // show TTFT and TPOT up: load_surge from the server's own signals, the queue as evidence.
        let mut confirmed = Vec::new();
        for s in 0..300u64 {
            let at = t0 + Duration::from_secs(s);
            let surge = s >= 200;
            target.record_ok(
                server_sample(
                    at,
                    if surge { 20.0 } else { 0.0 },
                    if surge { 12.0 } else { 2.0 },
                ),
                crate::server::ServerKind::Vllm,
                &Default::default(),
            );
            live.feed_server(&state);
            live.feed_server(&state); // nothing new: fed once
            for half in [0u64, 500] {
                let m = measured(
                    if surge { 1500 } else { 100 + (s % 5) * 4 },
                    Outcome::Ok,
                    at + Duration::from_millis(half),
                );
                live.observe_request("a", &m, None);
            }
            confirmed.extend(live.tick(at + Duration::from_secs(1), None));
        }
        assert_eq!(confirmed.len(), 1, "{confirmed:#?}");
        let d = &confirmed[0];
        assert_eq!(d.causes[0].cause, Cause::LoadSurge, "{:#?}", d.causes);
        let rate = d.causes[0]
            .evidence
            .iter()
            .find(|e| e.signal == Signal::ServerRequestRate)
            .expect("request rate evidence");
        assert_eq!((rate.before, rate.after), (2.0, 12.0));
        let waiting = d.causes[0]
            .evidence
            .iter()
            .find(|e| e.signal == Signal::ServerRequestsWaiting)
            .expect("queue as evidence");
        assert_eq!((waiting.before, waiting.after), (0.0, 20.0));
    }

    /// Two targets on the agent's node, fed as the agent feeds them (canaries, node samples),
    /// for 10 min calm then 2 min of `slowed` targets with the node PSI cpu at `psi`: every
    /// announcement with its second, and the live diagnosis.
    fn two_targets(slowed: &[&str], psi: f64) -> (Vec<(u64, Announcement)>, LiveDiagnosis) {
        let live = LiveDiagnosis::new(EngineConfig::default(), vec!["a".into(), "b".into()]);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut said = Vec::new();
        for s in 0..720u64 {
            let at = t0 + Duration::from_secs(s);
            let bad = s >= 600;
            for t in ["a", "b"] {
                for half in [0u64, 500] {
                    let ms = if bad && slowed.contains(&t) {
                        400 + (s % 5) * 10
                    } else {
                        100 + (s % 7) * 3
                    };
                    live.observe_request(
                        t,
                        &measured(ms, Outcome::Ok, at + Duration::from_millis(half)),
                        None,
                    );
                }
            }
            let sample = crate::node::NodeSample {
                cpu_some: Some(if bad { psi } else { 0.05 } + (s % 3) as f64 * 0.005),
                agent_cpu_cores: Some(0.01),
                ..Default::default()
            };
            live.feed_node(at, &sample);
            for a in live.step(at + Duration::from_secs(1), None).announce {
                said.push((s, a));
            }
        }
        (said, live)
    }

    /// A target slowed with its cgroup at its CPU quota: a model server's `cpu_throttling`;
    /// a router's (`kind = "router"`: its cgroup is the router's) `router_overhead`.
    #[test]
    fn a_router_targets_cpu_quota_is_the_routers_time() {
        let top = |router: bool| {
            let live = LiveDiagnosis::new(EngineConfig::default(), vec!["a".into()]);
            live.set_router("a", router);
            let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
            let mut first = None;
            for s in 0..720u64 {
                let at = t0 + Duration::from_secs(s);
                let bad = s >= 600;
                let ms = if bad {
                    400 + (s % 5) * 10
                } else {
                    100 + (s % 7) * 3
                };
                live.observe_request("a", &measured(ms, Outcome::Ok, at), None);
                let contention = crate::node::TargetContention {
                    cpu_throttled_share: Some(if bad { 0.6 } else { 0.0 }),
                    ..Default::default()
                };
                let sample = crate::node::NodeSample {
                    targets: vec![("a".into(), contention)],
                    ..Default::default()
                };
                live.feed_node(at, &sample);
                for a in live.step(at + Duration::from_secs(1), None).announce {
                    if let (None, Announcement::Target(d)) = (&first, a) {
                        first = d.causes.first().map(|c| c.cause);
                    }
                }
            }
            first
        };
        assert_eq!(top(false), Some(crate::diagnosis::Cause::CpuThrottling));
        assert_eq!(top(true), Some(crate::diagnosis::Cause::RouterOverhead));
        assert_eq!(
            router_own(Signal::CgroupMemoryUsage, true),
            Signal::CgroupMemoryUsage
        );
    }

    #[test]
    fn one_slowed_target_of_two_is_its_own_diagnosis() {
        let (said, live) = two_targets(&["a"], 0.05);
        assert_eq!(said.len(), 1, "{said:#?}");
        let Announcement::Target(d) = &said[0].1 else {
            panic!("{said:#?}")
        };
        assert_eq!(d.target, "a");
        assert_eq!(d.scope, crate::diagnosis::Scope::Target);
        let snap = live.snapshot(None, None, SystemTime::now());
        assert!(snap.nodes.is_empty());
        let b = snap.targets.iter().find(|t| t.target == "b").expect("b");
        assert_eq!(b.state, State::Idle);
    }

    #[test]
    fn both_targets_slowed_by_node_cpu_pressure_are_one_node_level_diagnosis() {
        let (said, live) = two_targets(&["a", "b"], 0.7);
        assert_eq!(said.len(), 1, "one incident: {said:#?}");
        let (when, Announcement::Node(n)) = &said[0] else {
            panic!("{said:#?}")
        };
        assert!((600..=660).contains(when), "said at {when} s");
        assert_eq!(n.cause, Cause::NodeCpuPressure, "{n:#?}");
        assert_eq!(n.targets, ["a", "b"]);
        // The node's diagnosis shows with either target, and each target links to it.
        let snap = live.snapshot(Some("b"), None, SystemTime::now());
        assert_eq!(snap.nodes.len(), 1);
        assert_eq!(snap.targets[0].scope, crate::diagnosis::Scope::Node);
        assert_eq!(snap.targets[0].node.as_deref(), Some("local"));
        let text = crate::diagnosis::scorecard::text(&snap);
        assert!(
            text.starts_with("node local  root_confirmed  node_cpu_pressure"),
            "{text}"
        );
        // One span for the node, linking to both targets' kept traces.
        for (i, t) in ["a", "b"].into_iter().enumerate() {
            let ids = TraceIds {
                trace_id: TraceId::from(i as u128 + 1),
                span_id: SpanId::from(i as u64 + 1),
                sampled: true,
            };
            live.note_kept(
                t,
                ids,
                SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_650),
                true,
            );
        }
        let span = live.node_span(
            n,
            TraceIds {
                trace_id: TraceId::from(99u128),
                span_id: SpanId::from(99u64),
                sampled: true,
            },
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_700),
            &opentelemetry::InstrumentationScope::builder("t").build(),
        );
        assert_eq!(span.links.links.len(), 2);
        assert!(
            span.attributes
                .iter()
                .any(|kv| kv.key.as_str() == n::LMPERF_TARGET && kv.value.as_str() == "a,b")
        );
    }

    #[test]
    fn in_flight_canaries_bound_the_e2e_from_below() {
        // Target a: 5 min calm (E2E 200 ms), then its canaries hang: none finishes, 4 are in
        // flight for ever longer. Without bounds no bucket would hold a sample.
        let live = LiveDiagnosis::new(EngineConfig::default(), vec!["a".into()]);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut states = Vec::new();
        for s in 0..400u64 {
            let at = t0 + Duration::from_secs(s);
            if s < 300 {
                for half in [0u64, 500] {
                    live.observe_request(
                        "a",
                        &measured(
                            100 + (s % 7) * 3,
                            Outcome::Ok,
                            at + Duration::from_millis(half),
                        ),
                        None,
                    );
                }
            } else {
                let elapsed: Vec<Duration> =
                    (0..4).map(|k| Duration::from_secs(s - 300 + k)).collect();
                live.observe_in_flight("a", at, &elapsed);
            }
            let d = live.step(at + Duration::from_secs(1), None);
            drop(d);
            let snap = live.snapshot(Some("a"), None, at);
            states.push(snap.targets[0].state);
        }
        assert!(
            states[300..].iter().any(|s| *s != State::Idle),
            "the hung canaries were never seen"
        );
    }

    /// A restart as another model (seen in the live `server_change` episode, which read
    /// "server changes 0 → 5" for 4 logged changes): the reset sample and the scraper's change
    /// events feed one server change each, and the diagnosis counts exactly the changes logged.
    #[test]
    fn a_restart_is_counted_once() {
        use crate::server::{Change, ChangeKind};
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut reset = server_sample(t0, 0.0, 2.0);
        reset.reset = true;
        assert!(
            !server_signals(&reset)
                .iter()
                .any(|(s, _)| *s == Signal::ServerChange)
        );
        let (target, state, live) = one_scraped_target();
        // 200 s calm, then the restart (the reset sample, its restart event and the new
        // model) while TTFT 100 → 300 ms.
        let mut confirmed = Vec::new();
        for s in 0..260u64 {
            let at = t0 + Duration::from_secs(s);
            let mut sample = server_sample(at, 0.0, 2.0);
            sample.reset = s == 200;
            target.record_ok(sample, crate::server::ServerKind::Vllm, &Default::default());
            if s == 200 {
                for (kind, old, new) in [
                    (ChangeKind::Restart, "1700000000", "1700000200"),
                    (ChangeKind::Model, "model-a", "model-b"),
                ] {
                    target.push_event(
                        at,
                        Change {
                            kind,
                            old: Some(old.into()),
                            new: Some(new.into()),
                        },
                    );
                }
            }
            live.feed_server(&state);
            for half in [0u64, 500] {
                let ms = if s >= 200 { 300 } else { 100 + (s % 5) * 4 };
                live.observe_request(
                    "a",
                    &measured(ms, Outcome::Ok, at + Duration::from_millis(half)),
                    None,
                );
            }
            confirmed.extend(live.tick(at + Duration::from_secs(1), None));
        }
        assert_eq!(confirmed.len(), 1, "{confirmed:#?}");
        let d = &confirmed[0];
        assert_eq!(d.causes[0].cause, Cause::ServerChange, "{:#?}", d.causes);
        let change = d.causes[0]
            .evidence
            .iter()
            .find(|e| e.signal == Signal::ServerChange)
            .expect("server change evidence");
        assert_eq!(
            change.after, 2.0,
            "one restart and one model change: {change:?}"
        );
    }

    /// A container Kubernetes restarted after `OOMKilled` (exit 137), its canaries failing
    /// while it was down (seen live as `server_change 1.00, error_burst 0.95`, the kill only in
    /// the status): the kill is memory_pressure's own event, ranked first with the restart as
    /// its child, and the sentence says `OOMKilled (exit 137)`.
    #[test]
    fn an_oom_killed_restart_is_memory_pressure_with_the_restart_as_its_child() {
        use crate::server::{Change, ChangeKind};
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let target = std::sync::Arc::new(crate::server::TargetServer::new("a", None, None));
        let state = ServerState {
            targets: crate::live_list::LiveList::new(vec![target.clone()]),
        };
        let oom = |new: &str| ServerEvent {
            at: t0,
            kind: ChangeKind::Restart,
            old: Some("restarts 0".into()),
            new: Some(new.into()),
        };
        assert_eq!(
            oom_killed(&oom("restarts 1 after OOMKilled (exit 137)")),
            Some("OOMKilled (exit 137)")
        );
        assert_eq!(oom_killed(&oom("restarts 1 after Error (exit 1)")), None);
        assert_eq!(oom_killed(&oom("1700000200")), None);
        let live = LiveDiagnosis::new(EngineConfig::default(), vec!["a".into()]);
        // 200 s calm; the container killed at 200, its canaries refused until it is back at
        // 214; the pod's restart (with its last termination) seen at 212.
        let mut confirmed = Vec::new();
        let mut last_confirmed = None;
        for s in 0..280u64 {
            let at = t0 + Duration::from_secs(s);
            if s == 212 {
                target.push_event(
                    at,
                    Change {
                        kind: ChangeKind::Restart,
                        old: Some("restarts 0".into()),
                        new: Some("restarts 1 after OOMKilled (exit 137)".into()),
                    },
                );
            }
            live.feed_server(&state);
            for half in [0u64, 500] {
                let down = (200..214).contains(&s);
                let outcome = if down { Outcome::Error } else { Outcome::Ok };
                let ms = 100 + (s % 5) * 4;
                live.observe_request(
                    "a",
                    &measured(ms, outcome, at + Duration::from_millis(half)),
                    None,
                );
            }
            confirmed.extend(live.tick(at + Duration::from_secs(1), None));
            if let Some(t) = live
                .snapshot(Some("a"), None, at)
                .targets
                .into_iter()
                .find(|t| t.state == State::RootConfirmed)
            {
                last_confirmed = Some(t);
            }
        }
        // Confirmed once, as the outage, seconds after the kill (issue 50): its canaries
        // failing is the evidence, whatever the baseline, before the kill itself is known.
        assert_eq!(confirmed.len(), 1, "{confirmed:#?}");
        let outage = &confirmed[0];
        assert_eq!(outage.causes[0].cause, Cause::ErrorBurst, "{outage:#?}");
        assert!(
            outage.since_unix_s.is_some_and(|t| t < 1_700_000_204.0),
            "{outage:#?}"
        );
        // Once the kill is seen, it leads: memory_pressure first, the outage and the restart
        // below it.
        let d = &last_confirmed.expect("root_confirmed while the incident is open");
        let ranked: Vec<Cause> = d.causes.iter().map(|c| c.cause).collect();
        assert_eq!(ranked[0], Cause::MemoryPressure, "{:#?}", d.causes);
        assert!(
            ranked.contains(&Cause::ServerChange) && d.causes[0].score > d.causes[1].score,
            "{ranked:?}"
        );
        assert!(d.roots.is_empty(), "one root: {:?}", d.roots);
        let line = d.summary.as_deref().unwrap_or("");
        assert!(
            line.starts_with("memory_pressure") && line.contains("OOMKilled (exit 137)"),
            "{line}"
        );
        // The restart is the kill's child: its evidence joins memory_pressure's, with the reason.
        let change = d.causes[0]
            .evidence
            .iter()
            .find(|e| e.signal == Signal::ServerChange)
            .and_then(|e| e.rule.as_deref());
        assert!(
            change.is_some_and(|r| r.starts_with("OOMKilled (exit 137)")),
            "{change:?}"
        );
    }
}
