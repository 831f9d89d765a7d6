//! The `Diagnosis` document (**API Boundary**, versioned by [`SCHEMA_VERSION`]): what
//! `/api/v1/diagnosis`, `lmperf ctl diagnose --json` and offline callers get. The schema is in
//! the module doc of [`crate`].

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::signal::Signal;

/// Version of the `Diagnosis` JSON; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// The causes the diagnosis names (stable names: an **API Boundary**).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// More requests or tokens arriving at the server.
    LoadSurge,
    /// Requests wait without a load rise: the server got slower.
    ServerQueueing,
    /// KV usage near full, preemptions.
    KvCachePressure,
    /// Prefill: input tokens per request rose.
    LongPrompts,
    /// Clocks down with thermal / power / HW-slowdown reasons.
    GpuThrottling,
    /// VRAM near full, or another process on the GPU.
    GpuMemoryPressure,
    /// XID, ECC, GPU lost.
    GpuFault,
    /// Kernel RTT, retransmits, connect latency up while the server's own timings stay flat.
    Network,
    /// 5xx / 429 / timeouts.
    ErrorBurst,
    /// Restart, new version, new model.
    ServerChange,
    /// The model server's cgroup at its CPU quota: CFS periods throttled.
    CpuThrottling,
    /// The node's CPUs contended (PSI cpu): a noisy neighbour.
    NodeCpuPressure,
    /// Memory: PSI memory, the cgroup near its limit, an OOM kill.
    MemoryPressure,
    /// A router target: its routed canaries slower than the direct canaries to its workers
    /// by more than before (the router's queue, CPU or flow control), the workers fine.
    RouterOverhead,
    /// Prefill/decode disaggregation: the KV transfer from the prefill to the decode worker
    /// got slower (its link, its bandwidth, failed transfers), the prefill itself as fast.
    KvTransfer,
    /// A router sending one worker far more than its share of the requests while others idle
    /// (a hot session key under consistent hashing, a stale load view, a sticky policy).
    RoutingImbalance,
    /// A worker the router calls fine (healthy, circuit closed) gets none of its requests:
    /// the others serve them all with less capacity.
    WorkerOutOfRotation,
    /// Prefill/decode disaggregation: the prefill pool short of capacity for its work (a
    /// prefill worker slower or gone): prompt tokens pile up on its workers and requests wait
    /// for their prefill, while the decode pool is as loaded as before.
    PrefillSaturation,
    /// Prefill/decode disaggregation: the decode pool short of capacity for its work (a
    /// decode worker slower or gone): its active sequences stay longer and pile up, tokens
    /// come slower, while the prefill pool is as loaded as before.
    DecodeSaturation,
    /// The symptom is real and nothing explains it.
    Unknown,
}

impl Cause {
    pub const ALL: [Cause; 20] = [
        Cause::LoadSurge,
        Cause::ServerQueueing,
        Cause::KvCachePressure,
        Cause::LongPrompts,
        Cause::GpuThrottling,
        Cause::GpuMemoryPressure,
        Cause::GpuFault,
        Cause::Network,
        Cause::ErrorBurst,
        Cause::ServerChange,
        Cause::CpuThrottling,
        Cause::NodeCpuPressure,
        Cause::MemoryPressure,
        Cause::RouterOverhead,
        Cause::KvTransfer,
        Cause::RoutingImbalance,
        Cause::WorkerOutOfRotation,
        Cause::PrefillSaturation,
        Cause::DecodeSaturation,
        Cause::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::LoadSurge => "load_surge",
            Cause::ServerQueueing => "server_queueing",
            Cause::KvCachePressure => "kv_cache_pressure",
            Cause::LongPrompts => "long_prompts",
            Cause::GpuThrottling => "gpu_throttling",
            Cause::GpuMemoryPressure => "gpu_memory_pressure",
            Cause::GpuFault => "gpu_fault",
            Cause::Network => "network",
            Cause::ErrorBurst => "error_burst",
            Cause::ServerChange => "server_change",
            Cause::CpuThrottling => "cpu_throttling",
            Cause::NodeCpuPressure => "node_cpu_pressure",
            Cause::MemoryPressure => "memory_pressure",
            Cause::RouterOverhead => "router_overhead",
            Cause::KvTransfer => "kv_transfer",
            Cause::RoutingImbalance => "routing_imbalance",
            Cause::WorkerOutOfRotation => "worker_out_of_rotation",
            Cause::PrefillSaturation => "prefill_saturation",
            Cause::DecodeSaturation => "decode_saturation",
            Cause::Unknown => "unknown",
        }
    }
}

/// The diagnosis state of a target (`lmperf.diagnosis.state`: the number in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// No symptom (0).
    #[default]
    Idle,
    /// A symptom was just detected (1).
    Triggered,
    /// The symptom persists; causes are being scored, none confirmed yet (2).
    Propagating,
    /// A cause reached the confirmation score (or `unknown` was concluded) (3).
    RootConfirmed,
    /// No symptom, but a cause's hard rule holds (KV ≥ 0.95 with preemptions, throttle
    /// reasons, a GPU fault): an early warning, never a page (4).
    Warning,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::Triggered => "triggered",
            State::Propagating => "propagating",
            State::RootConfirmed => "root_confirmed",
            State::Warning => "warning",
        }
    }

    /// The gauge value: 0 idle, 1 triggered, 2 propagating, 3 root_confirmed, 4 warning.
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// The whole document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    pub schema_version: u32,
    /// The `now` of the evaluation, Unix seconds.
    pub evaluated_at_unix_s: f64,
    /// One entry per target, by name.
    pub targets: Vec<TargetDiagnosis>,
    /// Node-level diagnoses: one fault that hit most of a node's targets at once through a
    /// signal they share ([`crate::node_scope`]); each member target says `scope: node` and
    /// names its node. Empty (absent) when every diagnosis is a target's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeDiagnosis>,
}

/// Whose fault a diagnosis names: the target's own (its GPU, its queue), the node's (node
/// CPU or memory pressure, the node's network, a GPU its targets share), or, on a router
/// target, the router's own (`router_overhead`), one pool's behind it (prefill or decode,
/// named in [`TargetDiagnosis::pool`]) or one worker's (the one the router favours or left
/// out, named in [`TargetDiagnosis::worker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    #[default]
    Target,
    Node,
    Worker,
    Router,
    Pool,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Target => "target",
            Scope::Node => "node",
            Scope::Worker => "worker",
            Scope::Router => "router",
            Scope::Pool => "pool",
        }
    }
}

/// One node-level diagnosis: a symptom on at least 2/3 of the node's targets, their onsets
/// within one bucket, with a cause whose signal they share ([`crate::node_scope`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeDiagnosis {
    /// The node's name (`local` for the agent's own node when not told).
    pub node: String,
    /// Always `node`.
    pub scope: Scope,
    /// `root_confirmed` once a member target confirmed it, else `propagating`.
    pub state: State,
    pub cause: Cause,
    /// The mean of the cause's scores on the member targets.
    pub score: f64,
    /// The earliest member onset, Unix seconds.
    pub onset_unix_s: Option<f64>,
    /// The targets it hit (each with `scope: node` and `node` set), by name.
    pub targets: Vec<String>,
    /// How many targets the node has.
    pub node_targets: usize,
    /// The cause's evidence on the member with the highest score.
    pub evidence: Vec<Evidence>,
    /// The WARN line in words.
    pub summary: String,
}

/// One target's diagnosis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetDiagnosis {
    pub target: String,
    pub state: State,
    /// When the state last changed, Unix seconds.
    pub since_unix_s: Option<f64>,
    /// The symptom's change point (CUSUM), Unix seconds; `None` when idle.
    pub onset_unix_s: Option<f64>,
    /// What jumped; `None` when idle.
    pub symptom: Option<Symptom>,
    /// Causes with a score above 0, highest first (empty when idle).
    pub causes: Vec<CauseScore>,
    pub ttft_decomposition: Option<TtftDecomposition>,
    /// The top cause in words (the WARN log line), when a cause is ranked.
    pub summary: Option<String>,
    /// Idle because no symptom series has a baseline yet: seconds held and needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_wait: Option<BaselineWait>,
    /// The target does not answer (or answers only errors): its canaries failed
    /// [`crate::reachability::DOWN_AFTER`] times or more in a row, whatever the baseline.
    /// Filled by the caller from its [`crate::reachability::Reachability`]; absent while the
    /// target answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down: Option<crate::reachability::Down>,
    /// When confirmed with more than one root (each ≥ the confirmation score, none a child of
    /// another in the cause graph): the roots in causal order (when their signals changed).
    /// Empty for a single root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roots: Vec<Cause>,
    /// With [`TargetDiagnosis::roots`]: each root's onset (Unix s), when its own signal
    /// changed (not the symptom's onset, which is the first root's; `None`: no change time).
    /// The target's [`TargetDiagnosis::onset_unix_s`] is the first root's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub root_onsets_unix_s: Vec<Option<f64>>,
    /// The share of scheduled canaries skipped since the onset because `max_in_flight`
    /// canaries still ran (0..1): how much of the spike the canaries did not sample. `None`
    /// when idle or not fed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canaries_skipped_share: Option<f64>,
    /// `node` while this target's diagnosis is part of a node-level one (its node in
    /// [`TargetDiagnosis::node`], the diagnosis in [`Diagnosis::nodes`]); else `target`.
    #[serde(default)]
    pub scope: Scope,
    /// The node of the node-level diagnosis this target belongs to (`scope: node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A router target's worker the top cause is on (`scope: worker`): the worker the router
    /// favours (`routing_imbalance`) or leaves out (`worker_out_of_rotation`), as the router
    /// names it (its URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// That worker's pod (`namespace/pod`), where the agent discovered a model server at the
    /// worker's address (a pod on its node): filled by the agent, not the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_pod: Option<String>,
    /// A disaggregated router target's pool the top cause is on (`scope: pool`): `prefill`
    /// (`prefill_saturation`) or `decode` (`decode_saturation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The model server's profiler, called for this incident (`[target.profiling]`): filled
    /// by the agent, not the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ServerProfile>,
}

/// One call of a model server's own profiler (vLLM / SGLang `/start_profile`), as the
/// agent's diagnosis, `lmperf compare`'s `compare.json` and the status record it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerProfile {
    /// When it was asked, Unix seconds.
    pub at_unix_s: f64,
    /// The server's base URL.
    pub server: String,
    /// `vllm` | `sglang`.
    pub kind: String,
    /// What asked: `root_confirmed` | `tpot_regression`.
    pub trigger: String,
    /// Why, in words (the cause, the gate).
    pub reason: String,
    /// Where the server writes the trace (SGLang: as sent; vLLM: its own `torch_profiler_dir`,
    /// as configured in lmperf); `None`: the server's default.
    pub output_dir: Option<String>,
    /// `started` (in progress) | `done` | `unsupported` (404: no profiler endpoint) |
    /// `failed`.
    pub outcome: String,
    /// The outcome in words (e.g. `stopped after 10 s`, `HTTP 404 …`).
    pub detail: String,
}

/// How far the history is from a baseline (idle only).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BaselineWait {
    pub have_s: f64,
    pub need_s: f64,
}

impl BaselineWait {
    /// "no baseline yet: 40 s of the 120 s needed".
    pub fn words(&self) -> String {
        format!(
            "no baseline yet: {:.0} s of the {:.0} s needed",
            self.have_s, self.need_s
        )
    }
}

/// The symptom: the latency or error series that jumped the most against its baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Symptom {
    /// `ttft` | `tpot` | `e2e` | `error`.
    pub signal: Signal,
    /// p99 (or error ratio) of the newest 10 s bucket, in the signal's unit.
    pub value: f64,
    /// Peak of the recent buckets.
    pub peak: f64,
    /// Baseline median of the bucket p99s.
    pub baseline: f64,
    pub ratio: f64,
    pub z: f64,
    /// Recent buckets that jumped, of `recent_buckets`.
    pub jumped_buckets: usize,
    pub recent_buckets: usize,
}

/// A cause with its score in [0, 1] and the evidence behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CauseScore {
    pub cause: Cause,
    pub score: f64,
    pub evidence: Vec<Evidence>,
}

/// How one signal moved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub signal: Signal,
    /// Median before the onset (baseline), in the signal's unit.
    pub before: f64,
    /// Median since the onset.
    pub after: f64,
    /// Largest value since the onset.
    pub peak: f64,
    /// Robust z score of the change, in the harmful direction.
    pub z: f64,
    /// When this signal changed (its own CUSUM change point), Unix seconds.
    pub changed_at_unix_s: Option<f64>,
    /// Seconds it moved before the symptom's onset (negative: after).
    pub lead_s: Option<f64>,
    /// The hard rule that fired, in words (e.g. `KV usage ≥ 0.95`).
    pub rule: Option<String>,
    /// For a GPU signal: the GPUs (`hw.id`) that gave its value (the throttled ones, the
    /// fullest, the slowest) among those the target reads (its pod's, where the kubelet's
    /// pod-resources API tells them). Filled by the agent, not the engine; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hw_ids: Vec<String>,
    /// Where the signal's values came from, where its feeder said: for the server's timing,
    /// `vllm_metrics (per request)`, `llama_cpp_timings (per request)` or
    /// `/metrics (histogram mean per scrape)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl Evidence {
    /// When this is the cause's own signal (not the canary latency that some causes read as
    /// evidence, nor a contradiction) with a change point: that change point, Unix seconds.
    pub fn own_change(&self) -> Option<f64> {
        if matches!(self.signal, Signal::Ttft | Signal::Tpot | Signal::E2e)
            || self
                .rule
                .as_deref()
                .is_some_and(|r| r.starts_with("contradicted"))
        {
            return None;
        }
        self.changed_at_unix_s
    }
}

/// Extra client TTFT since the onset, split into parts (seconds; a part is `None` without its
/// signal).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TtftDecomposition {
    /// Client TTFT median after − before.
    pub extra_s: f64,
    pub server_queue_s: Option<f64>,
    pub server_prefill_s: Option<f64>,
    /// The path's share: the change of the per-canary client − server TTFT gap where the
    /// server timed its canaries ([`crate::Signal::ClientServerTtftGap`]), else the kernel
    /// RTT change × round trips (1: the request and the first chunk).
    pub network_s: Option<f64>,
    /// What the parts leave unexplained, ≥ 0: when the parts add up to more than the extra
    /// client TTFT, 0 and [`TtftDecomposition::note`] says by how much and why.
    pub unexplained_s: f64,
    /// Why the parts do not add up, when they exceed the client's extra TTFT (the server's
    /// means cover all its requests, the client's median its canaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Unix seconds of `t` (0 before the epoch).
pub fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `03:02:04` (UTC) of Unix seconds.
pub fn clock(unix: f64) -> String {
    let s = unix.max(0.0) as u64 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// A value in its unit, short: `412 ms`, `0.97`, `37`, `1.2 GHz`.
pub fn fmt_value(signal: Signal, v: f64) -> String {
    match signal.unit() {
        // Three significant digits in its own unit: 0.103 ms, 1.66 ms, 53.0 ms, 1.24 s.
        "s" => lmperf_fmt::duration_ms(v * 1000.0),
        "Hz" => format!("{:.2} GHz", v / 1e9),
        _ if v.fract() == 0.0 && v.abs() < 1e6 => format!("{v:.0}"),
        _ if v.abs() >= 10.0 => format!("{v:.0}"),
        _ => format!("{v:.2}"),
    }
}

impl TargetDiagnosis {
    /// The WARN line of a confirmed cause, e.g. `load_surge 0.91: requests waiting 0 → 37 from
    /// 03:02:04, 6 s before TTFT p99 38 → 412 ms; GPU, network, errors flat`.
    /// The evidence the sentence names for the first cause: its strongest, unless that changed
    /// more than 5 s after the onset while another of its signals changed by then (a KV cache
    /// that filled before it preempted: the sentence does not put the cause after the spike).
    pub fn headline_evidence(&self) -> Option<&Evidence> {
        let top = self.causes.first()?;
        let first = top.evidence.first()?;
        // An OOM kill is seen after the failures it caused (Kubernetes reports the restart
        // once the container is back): it still leads.
        if first.signal == Signal::CgroupOomKill {
            return Some(first);
        }
        if first.lead_s.is_some_and(|l| l < -5.0) {
            let earlier = top.evidence.iter().find(|e| {
                e.lead_s.is_some_and(|l| l >= -5.0)
                    && !e
                        .rule
                        .as_deref()
                        .is_some_and(|r| r.starts_with("contradicted"))
            });
            if earlier.is_some() {
                return earlier;
            }
        }
        Some(first)
    }

    ///
    /// With two or more [`TargetDiagnosis::roots`] (after [`crate::roots::rank_first`]), each
    /// root in causal order, with its score, its onset and the own signal that moved, then the
    /// symptom they caused together: `two causes: network 0.91 from 03:02:04 (kernel RTT
    /// 1.00 ms → 50.0 ms), then gpu_throttling 0.88 from 03:02:30 (SM clock 1.98 GHz → 1.10
    /// GHz); together TTFT p99 38.0 ms → 412 ms; errors flat`.
    pub fn line(&self) -> Option<String> {
        let top = self.causes.first()?;
        let mut s = format!("{} {:.2}", top.cause.as_str(), top.score);
        if let Some(roots) = self.roots_words() {
            s = roots;
        } else if let Some(e) = self.headline_evidence() {
            match (e.signal, &e.rule) {
                // A kill is said in its source's words (`OOMKilled (exit 137): …`), not as a
                // count that went 0 → 1.
                (Signal::CgroupOomKill, Some(rule)) => s.push_str(&format!(": {rule}")),
                _ => s.push_str(&format!(
                    ": {} {} → {}",
                    e.signal.words(),
                    fmt_value(e.signal, e.before),
                    fmt_value(e.signal, e.peak.max(e.after))
                )),
            }
            if let Some(at) = e.changed_at_unix_s {
                s.push_str(&format!(" from {}", clock(at)));
            }
            if let Some(lead) = e.lead_s {
                if lead >= 0.5 {
                    s.push_str(&format!(", {lead:.0} s before"));
                } else if lead <= -0.5 {
                    s.push_str(&format!(", {:.0} s after", -lead));
                } else {
                    s.push_str(", with");
                }
            } else {
                s.push_str(", with");
            }
        } else {
            s.push(':');
        }
        if let Some(sym) = &self.symptom {
            if self.roots.len() >= 2 {
                s.push_str("; together");
            }
            let name = if sym.signal == Signal::Error {
                "error ratio".to_owned()
            } else {
                format!("{} p99", sym.signal.words())
            };
            s.push_str(&format!(
                " {name} {} → {}",
                fmt_value(sym.signal, sym.baseline),
                fmt_value(sym.signal, sym.peak)
            ));
        }
        let flat = self.flat();
        if !flat.is_empty() {
            s.push_str(&format!("; {} flat", flat.join(", ")));
        }
        if let Some(d) = &self.down {
            s.push_str(&format!("; target {}", d.words()));
        }
        Some(s)
    }

    /// What did not move, as the sentence ends (`GPU, network, errors flat`): a family is
    /// flat when none of its causes scored 0.3 or more; failed canaries in a row
    /// ([`TargetDiagnosis::down`]) are never flat errors, whatever the error ratio's baseline.
    pub fn flat(&self) -> Vec<&'static str> {
        let moved = |c: &[Cause]| {
            self.causes
                .iter()
                .any(|x| c.contains(&x.cause) && x.score >= 0.3)
        };
        let mut flat = Vec::new();
        if !moved(&[
            Cause::GpuThrottling,
            Cause::GpuMemoryPressure,
            Cause::GpuFault,
        ]) {
            flat.push("GPU");
        }
        if !moved(&[Cause::Network]) {
            flat.push("network");
        }
        if !moved(&[Cause::ErrorBurst]) && self.down.is_none() {
            flat.push("errors");
        }
        flat
    }

    /// An idle diagnosis of `target` (no symptom, no cause), to fill in.
    pub fn idle(target: &str) -> Self {
        TargetDiagnosis {
            target: target.to_owned(),
            state: State::Idle,
            since_unix_s: None,
            onset_unix_s: None,
            symptom: None,
            causes: Vec::new(),
            ttft_decomposition: None,
            summary: None,
            baseline_wait: None,
            down: None,
            roots: Vec::new(),
            root_onsets_unix_s: Vec::new(),
            canaries_skipped_share: None,
            scope: Default::default(),
            node: None,
            worker: None,
            pool: None,
            worker_pod: None,
            profile: None,
        }
    }

    /// The roots part of [`TargetDiagnosis::line`]: `two causes: network 0.91 from 03:02:04
    /// (kernel RTT 1.00 ms → 50.0 ms), then …`, each root in the order of
    /// [`TargetDiagnosis::roots`] (causal), its onset from
    /// [`TargetDiagnosis::root_onsets_unix_s`]. `None` with fewer than two roots ranked.
    fn roots_words(&self) -> Option<String> {
        if self.roots.len() < 2 {
            return None;
        }
        let parts: Vec<String> = self
            .roots
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let c = self.causes.iter().find(|c| c.cause == *r)?;
                let mut p = format!("{} {:.2}", c.cause.as_str(), c.score);
                let e = own_evidence(c);
                let at = self
                    .root_onsets_unix_s
                    .get(i)
                    .copied()
                    .flatten()
                    .or_else(|| e.and_then(|e| e.changed_at_unix_s));
                if let Some(at) = at {
                    p.push_str(&format!(" from {}", clock(at)));
                }
                if let Some(e) = e {
                    p.push_str(&format!(
                        " ({} {} → {})",
                        e.signal.words(),
                        fmt_value(e.signal, e.before),
                        fmt_value(e.signal, e.peak.max(e.after))
                    ));
                }
                Some(p)
            })
            .collect();
        if parts.len() < 2 {
            return None;
        }
        let n = match parts.len() {
            2 => "two".to_owned(),
            3 => "three".to_owned(),
            k => k.to_string(),
        };
        Some(format!("{n} causes: {}", parts.join(", then ")))
    }
}

/// The evidence that says what a root did: its strongest own signal (not the canary latency it
/// reads, nor a contradiction; [`crate::onset::own_change`]), else its strongest uncontradicted
/// evidence.
fn own_evidence(c: &CauseScore) -> Option<&Evidence> {
    let usable = |e: &&Evidence| {
        !e.rule
            .as_deref()
            .is_some_and(|r| r.starts_with("contradicted"))
    };
    c.evidence
        .iter()
        .find(|e| e.own_change().is_some())
        .or_else(|| c.evidence.iter().find(usable))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(signal: Signal, before: f64, after: f64, at: Option<f64>) -> Evidence {
        Evidence {
            signal,
            before,
            after,
            peak: after,
            z: 9.0,
            changed_at_unix_s: at,
            lead_s: None,
            rule: None,
            hw_ids: Vec::new(),
            source: None,
        }
    }

    /// Two confirmed roots: the sentence says each one (its score, onset and own signal) in
    /// causal order, whichever scores higher, then the symptom they caused together.
    #[test]
    fn two_roots_are_each_said_in_causal_order() {
        let d = TargetDiagnosis {
            target: "vllm".to_owned(),
            state: State::RootConfirmed,
            since_unix_s: Some(200.0),
            onset_unix_s: Some(100.0),
            symptom: Some(Symptom {
                signal: Signal::Ttft,
                value: 0.4,
                peak: 0.412,
                baseline: 0.038,
                ratio: 10.8,
                z: 20.0,
                jumped_buckets: 3,
                recent_buckets: 3,
            }),
            // As ranked by `roots::rank_first`: the first root first although it scores less.
            causes: vec![
                CauseScore {
                    cause: Cause::Network,
                    score: 0.81,
                    evidence: vec![
                        // Canary latency it reads moved at the symptom: not its own signal.
                        evidence(Signal::Ttft, 0.038, 0.4, Some(100.0)),
                        evidence(Signal::NetSrtt, 0.001, 0.05, Some(100.0)),
                    ],
                },
                CauseScore {
                    cause: Cause::GpuThrottling,
                    score: 0.93,
                    evidence: vec![evidence(Signal::GpuSmClock, 1.98e9, 1.1e9, Some(130.0))],
                },
                CauseScore {
                    cause: Cause::ServerQueueing,
                    score: 0.4,
                    evidence: vec![],
                },
            ],
            ttft_decomposition: None,
            summary: None,
            baseline_wait: None,
            down: None,
            roots: vec![Cause::Network, Cause::GpuThrottling],
            root_onsets_unix_s: vec![Some(100.0), Some(130.0)],
            canaries_skipped_share: None,
            scope: Scope::Target,
            node: None,
            worker: None,
            pool: None,
            worker_pod: None,
            profile: None,
        };
        assert_eq!(
            d.line().as_deref(),
            Some(
                "two causes: network 0.81 from 00:01:40 (kernel RTT 1.00 ms → 50.0 ms), \
                 then gpu_throttling 0.93 from 00:02:10 (SM clock 1.98 GHz → 1.10 GHz); \
                 together TTFT p99 38.0 ms → 412 ms; errors flat"
            )
        );
        // One root: the single-cause sentence, unchanged.
        let mut one = d.clone();
        one.roots.clear();
        one.root_onsets_unix_s.clear();
        let line = one.line().unwrap_or_default();
        assert!(line.starts_with("network 0.81: TTFT"), "{line}");
        // While the target's canaries fail in a row (or the outage ended within the incident),
        // the errors are not flat: the sentence says the outage instead.
        let note = |at: f64| crate::reachability::ErrorNote {
            at_unix_s: at,
            error_type: "connection_refused".into(),
            message: None,
        };
        one.down = Some(crate::reachability::Down {
            kind: crate::reachability::DownKind::Unreachable,
            since_unix_s: 90.0,
            failed: 12,
            since_start: false,
            first_error: note(90.0),
            last_error: note(112.0),
            recovered_unix_s: Some(115.0),
        });
        let line = one.line().unwrap_or_default();
        assert!(
            !line.contains("errors flat")
                && line.ends_with("TTFT p99 38.0 ms → 412 ms; target unreachable from 00:01:30 to 00:01:55 UTC (12 canaries failed): first connection_refused"),
            "{line}"
        );
    }
}
