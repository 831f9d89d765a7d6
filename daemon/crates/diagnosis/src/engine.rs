//! The diagnosis engine: per target, symptom → onset → cause scores → state. See the module
//! doc of [`crate`] for the algorithm and its sources.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::detector::{
    Assessment, Baseline, BucketSeries, DEFAULT_TAIL_ALPHA, DetectorConfig, JumpRule, median,
};
use super::node_scope::{self, Placement};
use super::report::{
    BaselineWait, Cause, CauseScore, Diagnosis, Evidence, SCHEMA_VERSION, Scope, State, Symptom,
    TargetDiagnosis, TtftDecomposition, unix_s,
};
use super::signal::{Harm, Signal};
use super::store::{EvidenceStore, SecondSeries};
use super::{
    backlog, contradict, cpu_wait, localize, onset as cause_onset, pressure, queueing, roots,
    serving_path, warning,
};

/// Engine settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    /// Latency buckets (TTFT, TPOT, E2E p99) and baseline history (10 s, 30 min; 8 baseline
    /// buckets suffice). The symptom must persist in 3 of the last 4 buckets, and a bucket's
    /// p99 is never its lone largest sample ([`DetectorConfig::exclude_max`]): with a canary a
    /// second a 10 s p99 is the maximum, and 1 heavy-tail outlier in 40 requests paged.
    pub detector: DetectorConfig,
    /// Error-ratio buckets: a bucket's mean is not carried by one sample, so 2 of the last 3
    /// buckets suffice (a burst is seen within seconds), each with at least
    /// [`MIN_ERRORS_PER_BUCKET`] errors ([`DetectorConfig::min_bucket_sum`]). Default:
    /// [`DetectorConfig::default`] with that minimum.
    pub ratio_detector: DetectorConfig,
    /// The symptom rule: ≥ 1.5 ×, robust z ≥ 3.5; the floor is the signal's
    /// ([`Signal::floor`]; 5 % for the error ratio).
    pub symptom: JumpRule,
    /// A cause at or above this score confirms the root. Default 0.75.
    pub confirm_score: f64,
    /// A cause below `confirm_score` still confirms when it is unambiguous: at least
    /// `confirm_min` (its own signals moved materially) and ahead of the runner-up by
    /// `confirm_margin`. `unknown` confirms only at `confirm_score`. Defaults 0.6 and 0.3.
    pub confirm_min: f64,
    pub confirm_margin: f64,
    /// Without a confirmed cause this long after the symptom was first detected (its own
    /// clock: not after the onset, which the CUSUM places before the detection, so an onset
    /// estimated 50 s early met a 45 s rule 2 s after triggering), `unknown` is concluded when
    /// nothing scores 0.5 and the server's own queue does not explain the jump
    /// ([`super::queueing`]). Default 30 s: with the 3 of 4 buckets detection needs, a
    /// symptom persisted about a minute.
    pub unknown_after: Duration,
    /// The symptom must be gone this long for the state to fall back to idle. Default 60 s.
    pub clear_after: Duration,
    /// At most this many targets (memory bound); observations of others are dropped.
    pub max_targets: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            detector: DetectorConfig {
                recent_buckets: 4,
                min_jumped: 3,
                exclude_max: true,
                tail_alpha: DEFAULT_TAIL_ALPHA,
                ..DetectorConfig::default()
            },
            ratio_detector: DetectorConfig {
                min_bucket_sum: MIN_ERRORS_PER_BUCKET,
                ..DetectorConfig::default()
            },
            symptom: JumpRule {
                ratio: 1.5,
                z: 3.5,
                floor: 0.0,
            },
            confirm_score: 0.75,
            confirm_min: 0.6,
            confirm_margin: 0.3,
            unknown_after: Duration::from_secs(30),
            clear_after: Duration::from_secs(60),
            max_targets: 256,
        }
    }
}

/// Errors a 10 s bucket must hold to count as a jump of the error ratio (the default of
/// [`EngineConfig::ratio_detector`]'s [`DetectorConfig::min_bucket_sum`]). Against an error-free
/// baseline one error among 20 canaries is a 5 % ratio, infinitely many times the baseline and
/// beyond any z: without a count, one stray error in 2 of 3 buckets paged.
pub const MIN_ERRORS_PER_BUCKET: f64 = 2.0;

/// The live diagnosis of many targets: feed it samples, ask it at any time.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use lmperf_diagnosis::{Engine, EngineConfig, Signal};
/// let mut e = Engine::new(EngineConfig::default());
/// let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
/// e.observe("vllm-0", Signal::Ttft, t0, 0.120);
/// let d = e.evaluate(t0 + Duration::from_secs(1));
/// assert_eq!(d.targets[0].state.as_str(), "idle");
/// ```
#[derive(Debug, Clone)]
pub struct Engine {
    config: EngineConfig,
    targets: BTreeMap<String, TargetEngine>,
    /// Where each target runs (its node, its GPUs), for node-level diagnoses; a target not
    /// placed runs on the agent's node and reads every GPU.
    placements: BTreeMap<String, Placement>,
    /// Observations dropped because `max_targets` was reached.
    pub dropped: u64,
}

#[derive(Debug, Clone)]
struct TargetEngine {
    store: EvidenceStore,
    state: State,
    since: Option<SystemTime>,
    onset: Option<u32>,
    /// The signal of the symptom whose onset `onset` is.
    onset_signal: Option<Signal>,
    /// The second the symptom was first detected (the state left idle).
    triggered: Option<u32>,
    last_symptom: Option<SystemTime>,
    last: Option<TargetDiagnosis>,
    /// The canaries in flight at the last [`Engine::in_flight`] call: when it was (Unix s), and
    /// each one's start (since the epoch) and elapsed time (s, a lower bound of its E2E).
    in_flight: (u32, Vec<(Duration, f64)>),
}

/// In-flight bounds older than this (s) are stale: not used.
const IN_FLIGHT_FRESH_S: u32 = 2;

fn dur(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

fn sec(t: SystemTime) -> u32 {
    u32::try_from(dur(t).as_secs()).unwrap_or(u32::MAX)
}

impl Engine {
    pub fn new(config: EngineConfig) -> Self {
        Self {
            config,
            targets: BTreeMap::new(),
            placements: BTreeMap::new(),
            dropped: 0,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Adds one sample of `signal` for `target` at `at`, in the signal's unit
    /// ([`Signal::unit`]). NaN and infinite values are ignored.
    pub fn observe(&mut self, target: &str, signal: Signal, at: SystemTime, value: f64) {
        if !self.targets.contains_key(target) {
            if self.targets.len() >= self.config.max_targets {
                self.dropped += 1;
                return;
            }
            self.targets
                .insert(target.to_owned(), TargetEngine::new(&self.config));
        }
        if let Some(t) = self.targets.get_mut(target) {
            t.store.observe(signal, dur(at), value);
        }
    }

    /// Notes why an event of `signal` for `target` happened, as its source said: the reason
    /// and exit code of a container's termination (`OOMKilled (exit 137)`, from the pod's
    /// `lastState.terminated`). The event's evidence then names it ([`Evidence::rule`]). The
    /// event itself is still [`Engine::observe`]d. Unknown targets are ignored.
    /// Says where `signal`'s values of `target` come from now (its evidence's `source`).
    pub fn set_source(&mut self, target: &str, signal: Signal, source: &'static str) {
        if let Some(t) = self.targets.get_mut(target) {
            t.store.set_source(signal, source);
        }
    }

    pub fn note(&mut self, target: &str, signal: Signal, at: SystemTime, words: &str) {
        if let Some(t) = self.targets.get_mut(target) {
            t.store.note(signal, dur(at), words);
        }
    }

    /// The canaries of `target` in flight at `now`, each by its elapsed time: lower bounds of
    /// their E2E, as spike mode counts them ([`crate::detector::BucketSeries::assess_with`]).
    /// Only those that started before the bucket in progress count (a canary sent a moment
    /// ago says nothing yet), so a slowdown that keeps canaries waiting does not thin the
    /// samples the symptom is judged on. Replaces the previous call's; stale after 2 s.
    pub fn in_flight(&mut self, target: &str, now: SystemTime, elapsed: &[Duration]) {
        let bucket = self.config.detector.bucket.as_secs().max(1);
        let Some(t) = self.targets.get_mut(target) else {
            return;
        };
        let now_d = dur(now);
        let bucket_start = Duration::from_secs(now_d.as_secs() / bucket * bucket);
        t.in_flight = (
            sec(now),
            elapsed
                .iter()
                .filter_map(|&e| {
                    let start = now_d.checked_sub(e)?;
                    (start < bucket_start).then_some((start, e.as_secs_f64()))
                })
                .collect(),
        );
    }

    /// Drops everything known of `target` (it left the agent: a pod deleted); a target of the
    /// same name later starts afresh.
    pub fn forget(&mut self, target: &str) {
        self.targets.remove(target);
        self.placements.remove(target);
    }

    /// Says where `target` runs: its node and the GPUs it reads ([`Placement`]).
    pub fn place(&mut self, target: &str, placement: Placement) {
        if placement == Placement::default() {
            self.placements.remove(target);
        } else {
            self.placements.insert(target.to_owned(), placement);
        }
    }

    /// Whether another target runs on `target`'s node.
    pub fn has_neighbours(&self, target: &str) -> bool {
        let node = |t: &str| self.placements.get(t).and_then(|p| p.node.clone());
        let mine = node(target);
        self.targets.keys().any(|t| t != target && node(t) == mine)
    }

    /// Names of the targets seen.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        self.targets.keys().map(String::as_str)
    }

    /// Evaluates every target at `now` and advances its state machine.
    pub fn evaluate(&mut self, now: SystemTime) -> Diagnosis {
        let cfg = self.config;
        let mut targets: Vec<TargetDiagnosis> = self
            .targets
            .iter_mut()
            .map(|(name, t)| t.evaluate(name, now, &cfg))
            .collect();
        let placements = &self.placements;
        let nodes = node_scope::group(
            &mut targets,
            &|t| placements.get(t).cloned().unwrap_or_default(),
            cfg.detector.bucket.as_secs_f64(),
        );
        Diagnosis {
            schema_version: SCHEMA_VERSION,
            evaluated_at_unix_s: unix_s(now),
            targets,
            nodes,
        }
    }

    /// The last evaluation of `target`, if any.
    pub fn last(&self, target: &str) -> Option<&TargetDiagnosis> {
        self.targets.get(target)?.last.as_ref()
    }

    /// Heap bytes of every target's evidence.
    pub fn heap_bytes(&self) -> usize {
        self.targets.values().map(|t| t.store.heap_bytes()).sum()
    }
}

/// How a cause shows in the latency: which part it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// TTFT alone (queue, prefill, network).
    Ttft,
    /// TPOT (decode side: GPU, KV, batch).
    Tpot,
    /// Both (load).
    Both,
    Any,
}

struct CauseDef {
    cause: Cause,
    signals: &'static [Signal],
    part: Part,
}

const CAUSES: &[CauseDef] = &[
    CauseDef {
        cause: Cause::LoadSurge,
        signals: &[
            Signal::ServerRequestRate,
            Signal::ServerPromptTokensRate,
            Signal::ServerRequestsRunning,
            Signal::ServerGenerationTokensRate,
        ],
        part: Part::Both,
    },
    CauseDef {
        cause: Cause::ServerQueueing,
        signals: &[Signal::ServerRequestsWaiting, Signal::ServerQueueTime],
        part: Part::Ttft,
    },
    CauseDef {
        cause: Cause::KvCachePressure,
        signals: &[Signal::ServerKvUsage, Signal::ServerPreemptions],
        part: Part::Tpot,
    },
    CauseDef {
        cause: Cause::LongPrompts,
        signals: &[
            Signal::InputTokens,
            Signal::ServerPrefillTime,
            Signal::ServerPromptRatio,
        ],
        part: Part::Ttft,
    },
    CauseDef {
        cause: Cause::GpuThrottling,
        signals: &[Signal::GpuSmClock, Signal::GpuThrottle],
        part: Part::Tpot,
    },
    CauseDef {
        cause: Cause::GpuMemoryPressure,
        signals: &[Signal::GpuMemoryUtilization, Signal::GpuForeignProcesses],
        part: Part::Any,
    },
    CauseDef {
        cause: Cause::GpuFault,
        signals: &[Signal::GpuFault],
        part: Part::Any,
    },
    CauseDef {
        cause: Cause::Network,
        signals: &[
            Signal::ClientServerTtftGap,
            Signal::NetSrtt,
            Signal::NetRetransmits,
            Signal::NetConnect,
        ],
        part: Part::Ttft,
    },
    CauseDef {
        cause: Cause::ErrorBurst,
        signals: &[
            Signal::Error,
            Signal::Error5xx,
            Signal::Error429,
            Signal::ErrorTimeout,
        ],
        part: Part::Any,
    },
    CauseDef {
        cause: Cause::ServerChange,
        signals: &[Signal::ServerChange],
        part: Part::Any,
    },
    // A CPU-bound frontend (tokenization, detokenization, the scheduler loop) slows both the
    // first token and the tokens after it.
    CauseDef {
        cause: Cause::CpuThrottling,
        signals: &[Signal::CgroupCpuThrottled],
        part: Part::Any,
    },
    CauseDef {
        cause: Cause::NodeCpuPressure,
        // The node's PSI, and the server's own threads waiting for a CPU ([`cpu_wait`]): the
        // PSI cannot rise on a node already near 100 % with other work.
        signals: &[Signal::NodeCpuPressure, Signal::ServerCpuWait],
        part: Part::Any,
    },
    // The router's own time: its queue and work before the dispatch (the first token waits
    // for them), and its CPU, which every relayed token waits for too.
    CauseDef {
        cause: Cause::RouterOverhead,
        signals: &[Signal::PathOverhead, Signal::RouterCpuThrottled],
        part: Part::Any,
    },
    // The transfer sits between the prefill and the first token: only the TTFT pays it.
    CauseDef {
        cause: Cause::KvTransfer,
        signals: &[Signal::KvTransfer],
        part: Part::Ttft,
    },
    // One worker's queue grows with the requests it alone gets: its first tokens wait, its
    // fuller batch decodes slower.
    CauseDef {
        cause: Cause::RoutingImbalance,
        signals: &[Signal::PickImbalance],
        part: Part::Any,
    },
    // The workers left in rotation serve everything: their queues and batches grow. Or the
    // other way: a worker slow or failing to its direct canaries keeps getting its share, and
    // the routed canaries it serves come late or fail.
    CauseDef {
        cause: Cause::WorkerOutOfRotation,
        signals: &[
            Signal::StarvedWorkers,
            Signal::FailingWorkers,
            Signal::WorkerSlowdown,
        ],
        part: Part::Any,
    },
    // Prompts wait for a prefill worker: only the first token waits.
    CauseDef {
        cause: Cause::PrefillSaturation,
        signals: &[Signal::PrefillPoolLoad],
        part: Part::Ttft,
    },
    // Sequences wait for a decode slot (the first token after the transfer) and share a
    // fuller batch (the tokens after it).
    CauseDef {
        cause: Cause::DecodeSaturation,
        signals: &[Signal::DecodePoolLoad],
        part: Part::Any,
    },
    CauseDef {
        cause: Cause::MemoryPressure,
        signals: &[
            Signal::CgroupOomKill,
            Signal::NodeMemoryPressure,
            Signal::CgroupMemoryUsage,
        ],
        part: Part::Any,
    },
];

/// The cause graph (parent → child): when both moved, the parent ranks first and carries the
/// child's evidence (CIRCA's structural ranking, simplified to one level).
const GRAPH: &[(Cause, Cause)] = &[
    // Under prefill/decode disaggregation, requests queued on the prefill workers wait for
    // their prefill (the server's queue time); a decode pool short of slots delays the first
    // decode step after the transfer. First: a cause above the pool ranks above both.
    (Cause::PrefillSaturation, Cause::ServerQueueing),
    (Cause::DecodeSaturation, Cause::KvTransfer),
    // More work, longer prompts, a KV cache too small, a router sending one worker the
    // others' work: each is why a pool fills.
    (Cause::LoadSurge, Cause::PrefillSaturation),
    (Cause::LoadSurge, Cause::DecodeSaturation),
    (Cause::LongPrompts, Cause::PrefillSaturation),
    (Cause::KvCachePressure, Cause::DecodeSaturation),
    (Cause::RoutingImbalance, Cause::PrefillSaturation),
    (Cause::RoutingImbalance, Cause::DecodeSaturation),
    (Cause::WorkerOutOfRotation, Cause::PrefillSaturation),
    (Cause::WorkerOutOfRotation, Cause::DecodeSaturation),
    // What slows a pool's workers (their GPU, their CPU, their memory) is why it fell short.
    (Cause::GpuThrottling, Cause::PrefillSaturation),
    (Cause::GpuThrottling, Cause::DecodeSaturation),
    (Cause::GpuMemoryPressure, Cause::PrefillSaturation),
    (Cause::GpuMemoryPressure, Cause::DecodeSaturation),
    (Cause::GpuFault, Cause::PrefillSaturation),
    (Cause::GpuFault, Cause::DecodeSaturation),
    (Cause::CpuThrottling, Cause::PrefillSaturation),
    (Cause::CpuThrottling, Cause::DecodeSaturation),
    (Cause::NodeCpuPressure, Cause::PrefillSaturation),
    (Cause::NodeCpuPressure, Cause::DecodeSaturation),
    (Cause::MemoryPressure, Cause::PrefillSaturation),
    (Cause::MemoryPressure, Cause::DecodeSaturation),
    (Cause::LoadSurge, Cause::ServerQueueing),
    (Cause::LongPrompts, Cause::ServerQueueing),
    (Cause::KvCachePressure, Cause::ServerQueueing),
    (Cause::LoadSurge, Cause::KvCachePressure),
    (Cause::GpuMemoryPressure, Cause::KvCachePressure),
    (Cause::GpuFault, Cause::ErrorBurst),
    (Cause::ServerChange, Cause::ErrorBurst),
    (Cause::GpuFault, Cause::GpuThrottling),
    // Longer prompts are more tokens arriving: when the prompt tokens per generated token rose
    // with the load, the prompts' length is the more specific cause.
    (Cause::LongPrompts, Cause::LoadSurge),
    // A CPU-starved scheduler makes requests wait.
    (Cause::CpuThrottling, Cause::ServerQueueing),
    (Cause::NodeCpuPressure, Cause::ServerQueueing),
    // A throttled cgroup's runnable tasks count as CPU stalls in the node's PSI too: the node's
    // pressure that rose with the server's throttling is (at least partly) that throttling
    // (seen live: a server cut to 20 % of a core confirmed node_cpu_pressure as a second root).
    (Cause::CpuThrottling, Cause::NodeCpuPressure),
    // A server short of memory (reclaiming, its mapped weights read again at every step)
    // makes requests wait, as a CPU-starved one does.
    (Cause::MemoryPressure, Cause::ServerQueueing),
    // An OOM kill restarts the server (and fails its requests).
    (Cause::MemoryPressure, Cause::ServerChange),
    (Cause::MemoryPressure, Cause::ErrorBurst),
    // A router that holds requests shows its own queue (a frontend's waiting requests).
    (Cause::RouterOverhead, Cause::ServerQueueing),
    // More requests than the workers serve wait in the router's queue (Dynamo's frontend holds
    // them before dispatch): the router's time rose because the load did.
    (Cause::LoadSurge, Cause::RouterOverhead),
    // The requests one worker alone gets wait in its queue.
    (Cause::RoutingImbalance, Cause::ServerQueueing),
    // A worker out of rotation is the more specific imbalance (two workers: one gets all).
    (Cause::WorkerOutOfRotation, Cause::RoutingImbalance),
    (Cause::WorkerOutOfRotation, Cause::ServerQueueing),
    // A failing worker the router still sends to fails the routed requests it gets; a slow
    // one makes the routed canaries slower than the direct ones' median.
    (Cause::WorkerOutOfRotation, Cause::ErrorBurst),
    (Cause::WorkerOutOfRotation, Cause::RouterOverhead),
    // A router target's own cgroup is the router's: throttled, it is why the router adds time
    // (the path difference rose with the workers fine); last, over the throttling's own edges.
    (Cause::RouterOverhead, Cause::CpuThrottling),
];

/// Robust z (harmful direction) → strength in [0, 1): 1 − e^(−z/8) (z 3.5 → 0.35, 10 → 0.71,
/// 20 → 0.92).
fn squash(z: f64) -> f64 {
    if z <= 0.0 {
        0.0
    } else {
        1.0 - (-z / 8.0).exp()
    }
}

/// Ratios and z scores are capped here so the JSON stays finite (a zero baseline).
pub const RATIO_CAP: f64 = 1e6;

/// The seconds before the onset excluded from the baseline (the onset estimate may be late).
const GUARD_S: u32 = 5;
/// CUSUM: drift allowance k and alarm threshold h, in units of the baseline scale.
const CUSUM_K: f64 = 0.5;
const CUSUM_H: f64 = 5.0;
/// The drift allowance of a latency symptom's onset search: a symptom is a jump of ≥ 1.5 × and a
/// robust z ≥ 3.5, and k is about half the shift to find (Page; Montgomery), so a baseline
/// that crept up by half a σ for a minute (a neighbour's load) does not pull the onset a minute
/// early (seen live: the onset 72 s before the overload, every cause scored on calm seconds).
const ONSET_CUSUM_K: f64 = 1.0;
/// Each standardized step is clipped to ±3 (a Huber-type robust CUSUM), so one outlier second
/// cannot raise the alarm: it takes three in a row.
const CUSUM_CAP: f64 = 3.0;

/// How one signal moved since `onset`.
#[derive(Debug, Clone, Copy)]
struct Moved {
    before: f64,
    after: f64,
    peak: f64,
    z: f64,
    changed_at: Option<u32>,
    /// The change is material: beyond the floor and 20 % of the baseline, z ≥ 3.
    material: bool,
}

/// The scale of a baseline for a signal: 1.4826·MAD, at least 2 % of the median and half the
/// signal's floor (so a flat baseline does not make every wobble infinite).
fn scale(b: &Baseline, floor: f64) -> f64 {
    (1.4826 * b.mad)
        .max(0.02 * b.median.abs())
        .max(floor / 2.0)
        .max(1e-12)
}

/// BARO-style robust change of `series` after `onset` against the history before it.
fn moved(
    signal: Signal,
    series: &SecondSeries,
    onset: u32,
    now: u32,
    history_s: u32,
) -> Option<Moved> {
    let mut before: Vec<f64> = series
        .range(
            onset.saturating_sub(history_s),
            onset.saturating_sub(GUARD_S),
        )
        .map(|(_, v)| v)
        .collect();
    let after_vals: Vec<(u32, f64)> = series.range(onset, now.saturating_add(1)).collect();
    if after_vals.is_empty() {
        return None;
    }
    // A signal that has no history before the onset (an event that never happened, a
    // series that starts with the incident) is compared with 0.
    if before.is_empty() {
        before.push(0.0);
    }
    let ratio = signal.mean_over_window();
    let before_mean = mean(&before);
    let mut b = Baseline::of(&mut before)?;
    if ratio {
        // Flags, events and counts: the window's ratio (mean), not its median second.
        b.median = before_mean;
    }
    let sign = if signal.harm() == Harm::Down {
        -1.0
    } else {
        1.0
    };
    let mut after: Vec<f64> = after_vals.iter().map(|&(_, v)| v).collect();
    let after_med = if ratio {
        mean(&after)
    } else {
        median(&mut after)?
    };
    let peak = if ratio {
        // The highest ratio of a bucket-long window (a single second's flag is 0 or 1).
        peak_window_mean(&after_vals, RATIO_WINDOW_S).max(after_med)
    } else {
        after_vals
            .iter()
            .map(|&(_, v)| sign * v)
            .fold(f64::NEG_INFINITY, f64::max)
            * sign
    };
    let floor = signal.floor();
    let s = scale(&b, floor);
    let delta = sign * (after_med - b.median);
    let z = delta / s;
    let relative_ok = b.median == 0.0 || delta / b.median.abs() >= 0.2;
    let mut material = delta >= floor && z >= 3.0 && relative_ok;
    // A level must also leave the server's ordinary tail: a busy server's queue is empty most
    // seconds (median and MAD 0) and full for a while now and then; a window whose median its
    // calm windows of the same length ordinarily reach is no change ([`ordinary_high`]).
    if material
        && !ratio
        && ordinary_high(
            series,
            onset.saturating_sub(history_s),
            onset.saturating_sub(GUARD_S),
            now.saturating_add(1).saturating_sub(onset),
            sign,
        )
        .is_some_and(|o| sign * (after_med - o) < floor)
    {
        material = false;
    }
    // k as for the symptom's onset: with k = 0.5 a level that is 1 a third of the calm seconds
    // (a slot busy with a canary) alarmed 105 s before an overload and read "moved first".
    let k = if ratio { CUSUM_K } else { ONSET_CUSUM_K };
    // A step of one floor (the smallest material change) is one σ of the CUSUM: a level that is
    // 0 or 1 in calm seconds (a canary in a slot) does not walk to an alarm.
    let changed_at = cusum(
        series,
        onset.saturating_sub(300),
        (b.median, s.max(floor)),
        sign,
        k,
        ChangePoint::Persisting,
    );
    Some(Moved {
        before: b.median,
        after: after_med,
        peak,
        z,
        changed_at,
        material,
    })
}

/// Calm windows an [`ordinary_high`] needs (fewer: no verdict, the baseline alone decides).
const MIN_ORDINARY_WINDOWS: usize = 6;

/// The highest median (in the harmful direction `sign`) of the windows of `len` seconds within
/// `[from, to)` of `series`, each window starting half a window after the previous one: how
/// far a window that long ordinarily goes on this server. `None` with fewer than
/// [`MIN_ORDINARY_WINDOWS`] windows holding half their seconds.
fn ordinary_high(series: &SecondSeries, from: u32, to: u32, len: u32, sign: f64) -> Option<f64> {
    let len = len.max(1);
    let vals: Vec<(u32, f64)> = series.range(from, to).collect();
    let step = (len / 2).max(1);
    let mut high: Option<f64> = None;
    let mut windows = 0;
    let mut start = from;
    let mut i = 0;
    let mut w: Vec<f64> = Vec::new();
    while start.saturating_add(len) <= to {
        while i < vals.len() && vals[i].0 < start {
            i += 1;
        }
        w.clear();
        w.extend(
            vals[i..]
                .iter()
                .take_while(|p| p.0 < start + len)
                .map(|p| sign * p.1),
        );
        if 2 * w.len() >= len as usize
            && let Some(m) = median(&mut w)
        {
            windows += 1;
            high = Some(high.map_or(m, |h: f64| h.max(m)));
        }
        start += step;
    }
    (windows >= MIN_ORDINARY_WINDOWS)
        .then_some(high)
        .flatten()
        .map(|h| sign * h)
}

/// The window over which the peak of a ratio signal is taken (one symptom bucket).
const RATIO_WINDOW_S: u32 = 10;

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The largest mean of the seconds in any `window`-second span of `vals` (time-sorted).
fn peak_window_mean(vals: &[(u32, f64)], window: u32) -> f64 {
    let mut best = f64::NEG_INFINITY;
    let mut start = 0;
    let mut sum = 0.0;
    for (i, &(t, v)) in vals.iter().enumerate() {
        sum += v;
        while vals[start].0 + window <= t {
            sum -= vals[start].1;
            start += 1;
        }
        best = best.max(sum / (i + 1 - start) as f64);
    }
    best
}

/// Which change point [`cusum`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChangePoint {
    /// The last second the statistic was 0 before its first alarm.
    FirstAlarm,
    /// That of the shift still in effect at the end: an alarm whose statistic fell back to 0
    /// was an excursion, not a change (the first canary's uncached prompt at an agent's start
    /// read as "moved 108 s before the symptom").
    Persisting,
}

/// One-sided CUSUM (Page 1954) over the series from second `from`, against mean `mu` and scale
/// `sigma`, in the harmful direction `sign`, with allowance `k`; the change point as `which`.
fn cusum(
    series: &SecondSeries,
    from: u32,
    (mu, sigma): (f64, f64),
    sign: f64,
    k: f64,
    which: ChangePoint,
) -> Option<u32> {
    let mut s = 0.0;
    let mut last_zero = None;
    let mut alarm = None;
    for (t, v) in series.range(from, u32::MAX) {
        let prev = s;
        s = (s + (sign * (v - mu) / sigma).clamp(-CUSUM_CAP, CUSUM_CAP) - k).max(0.0);
        if prev == 0.0 {
            last_zero = Some(t);
        }
        if s > CUSUM_H && alarm.is_none() {
            if which == ChangePoint::FirstAlarm {
                return last_zero;
            }
            alarm = last_zero;
        }
        if s == 0.0 {
            alarm = None;
        }
    }
    alarm
}

impl TargetEngine {
    fn new(cfg: &EngineConfig) -> Self {
        Self {
            store: EvidenceStore::new(cfg.detector, cfg.ratio_detector),
            state: State::Idle,
            since: None,
            onset: None,
            onset_signal: None,
            triggered: None,
            last_symptom: None,
            last: None,
            in_flight: (0, Vec::new()),
        }
    }

    /// The symptom at `now`: the jumped symptom series with the largest ratio.
    fn symptom(&mut self, now: SystemTime, cfg: &EngineConfig, factor: f64) -> Option<Symptom> {
        let at = dur(now);
        let mut best: Option<(Signal, Assessment)> = None;
        // Strong cause evidence (a hard rule holds) lowers the latency floors.
        let floor_factor = if warning::corroborated(&self.store, sec(now)) {
            warning::CORROBORATED_FLOOR
        } else {
            1.0
        };
        // A kernel RTT that doubled is carried whole by TTFT and E2E: their ratio relaxes too
        // (not under an early warning's rule: a mild KV squeeze stays a warning).
        let rtt_rose = warning::rtt_rose(&self.store, sec(now));
        let bounds: &[(Duration, f64)] =
            if sec(now).saturating_sub(self.in_flight.0) <= IN_FLIGHT_FRESH_S {
                &self.in_flight.1
            } else {
                &[]
            };
        let s = &mut self.store;
        let series: [(Signal, &mut BucketSeries); 4] = [
            (Signal::Ttft, &mut s.ttft),
            (Signal::Tpot, &mut s.tpot),
            (Signal::E2e, &mut s.e2e),
            (Signal::Error, &mut s.errors),
        ];
        for (signal, b) in series {
            let floor = if signal == Signal::Error {
                0.05
            } else {
                signal.floor() * floor_factor
            };
            let mut rule = JumpRule {
                floor,
                ..cfg.symptom
            }
            .relaxed(factor);
            if rtt_rose && matches!(signal, Signal::Ttft | Signal::E2e) {
                rule.ratio = 1.0 + (rule.ratio - 1.0) * warning::CORROBORATED_FLOOR;
            }
            // Canaries in flight bound the E2E from below (their TTFT may have come).
            let lower = if signal == Signal::E2e { bounds } else { &[] };
            if let Some(a) = b.assess_with(at, &rule, lower)
                && a.jumped
                && best.as_ref().is_none_or(|(_, x)| a.ratio > x.ratio)
            {
                best = Some((signal, a));
            }
        }
        best.map(|(signal, a)| Symptom {
            signal,
            value: a.value,
            peak: a.peak,
            baseline: a.baseline.median,
            ratio: a.ratio.min(RATIO_CAP),
            z: a.z.min(RATIO_CAP),
            jumped_buckets: a.jumped_buckets,
            recent_buckets: a.recent,
        })
    }

    /// Without a symptom: `warning` while a cause's hard rule holds ([`warning`]), else idle.
    /// The worker behind a router that `cause` is on (`routing_imbalance`: the most-picked;
    /// `worker_out_of_rotation`: the first left out), from the router's newest page since
    /// `onset`; `None` for other causes or when no page named one.
    fn worker_of(&self, top: Option<&CauseScore>, onset: u32, now: u32) -> Option<String> {
        let top = top?;
        let named: &[Signal] = match top.cause {
            Cause::RoutingImbalance => &[Signal::PickImbalance],
            Cause::WorkerOutOfRotation => &[
                Signal::StarvedWorkers,
                Signal::FailingWorkers,
                Signal::WorkerSlowdown,
            ],
            _ => return None,
        };
        // The strongest evidence that names a worker: the first in the cause's order.
        top.evidence
            .iter()
            .map(|e| e.signal)
            .filter(|s| named.contains(s))
            .find_map(|s| {
                let note = self.store.note_in(s, onset, now.saturating_add(1))?;
                let w = note.split([' ', ',']).next()?;
                (!w.is_empty()).then(|| w.to_owned())
            })
    }

    /// Whose fault the top cause of `d` is: the router's own, one pool's (which) or one
    /// worker's (which, [`Self::worker_of`]); else it stays the target's.
    fn scope(&self, d: &mut TargetDiagnosis, onset: u32, now: u32) {
        if let Some(w) = self.worker_of(d.causes.first(), onset, now) {
            d.scope = Scope::Worker;
            d.worker = Some(w);
        }
        match d.causes.first().map(|c| c.cause) {
            Some(Cause::RouterOverhead) => d.scope = Scope::Router,
            Some(c @ (Cause::PrefillSaturation | Cause::DecodeSaturation)) => {
                d.scope = Scope::Pool;
                d.pool = Some(pool_of(c).to_owned());
            }
            _ => {}
        }
    }

    fn quiet(&mut self, name: &str, now: SystemTime, cfg: &EngineConfig) -> TargetDiagnosis {
        let warnings = warning::early_warnings(&self.store, sec(now));
        if warnings.is_empty() {
            self.set_state(State::Idle, now);
            return self.idle(name);
        }
        self.set_state(State::Warning, now);
        // How far the latency moved: the newest buckets' p99 against the baseline.
        let at = dur(now);
        let s = &mut self.store;
        let mut moved = Vec::new();
        for (signal, b) in [(Signal::Ttft, &mut s.ttft), (Signal::Tpot, &mut s.tpot)] {
            let rule = JumpRule {
                floor: signal.floor(),
                ..cfg.symptom
            };
            if let Some(a) = b.assess(at, &rule)
                && a.baseline.median > 0.0
            {
                moved.push((signal, a.value / a.baseline.median));
            }
        }
        let d = TargetDiagnosis {
            state: State::Warning,
            since_unix_s: self.since.map(unix_s),
            summary: warning::line(&warnings, &moved, cfg.symptom.ratio),
            causes: warnings,
            ..TargetDiagnosis::idle(name)
        };
        self.last = Some(d.clone());
        d
    }

    /// The idle diagnosis (kept as the last one).
    fn idle(&mut self, name: &str) -> TargetDiagnosis {
        let d = TargetDiagnosis {
            since_unix_s: self.since.map(unix_s),
            baseline_wait: self.baseline_wait(),
            ..TargetDiagnosis::idle(name)
        };
        self.last = Some(d.clone());
        d
    }

    /// `Some` while no symptom series holds the history a verdict needs (the most advanced
    /// one's progress).
    fn baseline_wait(&self) -> Option<BaselineWait> {
        let s = &self.store;
        let (have, need) = [&s.ttft, &s.tpot, &s.e2e, &s.errors]
            .iter()
            .map(|b| b.history_progress_s())
            .fold((0.0_f64, 0.0_f64), |(h, n), (bh, bn)| {
                if bh / bn.max(1e-9) > h / n.max(1e-9) {
                    (bh, bn)
                } else {
                    (h, n)
                }
            });
        (have < need).then_some(BaselineWait {
            have_s: have,
            need_s: need,
        })
    }

    fn set_state(&mut self, s: State, now: SystemTime) {
        if self.state != s {
            self.state = s;
            self.since = Some(now);
        }
    }

    fn evaluate(&mut self, name: &str, now: SystemTime, cfg: &EngineConfig) -> TargetDiagnosis {
        let now_sec = sec(now);
        self.store.roll(now_sec);
        let prev = self.state;
        let factor = if matches!(self.state, State::Idle | State::Warning) {
            1.0
        } else {
            0.8
        };
        let symptom = self.symptom(now, cfg, factor);
        self.last_symptom = symptom.as_ref().map_or(self.last_symptom, |_| Some(now));
        let cleared = self
            .last_symptom
            .is_none_or(|t| now.duration_since(t).unwrap_or_default() >= cfg.clear_after);
        match (self.state, &symptom) {
            (State::Idle | State::Warning, None) => return self.quiet(name, now, cfg),
            (State::Idle | State::Warning, Some(sym)) => {
                self.set_state(State::Triggered, now);
                self.onset = Some(self.onset_of(sym.signal, sym.value, now_sec, cfg));
                self.onset_signal = Some(sym.signal);
                self.triggered = Some(now_sec);
            }
            (_, None) if cleared => {
                self.set_state(State::Idle, now);
                self.onset = None;
                self.onset_signal = None;
                self.triggered = None;
                return self.quiet(name, now, cfg);
            }
            (State::Triggered, Some(_)) => self.set_state(State::Propagating, now),
            _ => {}
        }
        let mut onset = self.onset.unwrap_or(now_sec);
        let history_s = cfg.detector.history.as_secs() as u32;
        let triggered = self.triggered.unwrap_or(now_sec);
        let (mut causes, mut decomposition) = score(&self.store, onset, now_sec, history_s);
        // The incident began when the first cause's own signal changed, if it is well supported
        // and the same cause ranks first from there ([`cause_onset`]).
        // Before the symptom's onset, only where the symptom's own series had already moved
        // between the two ([`cause_onset::moved_early`]) (a restart a minute before a later slowdown is its
        // precursor, not its onset; a mild fault's error ratio paged a minute late); after it
        // (an ordinary blip found first), at the cause's change.
        let refined = cause_onset::cause_onset(&causes, onset, triggered).and_then(|at| {
            if at > onset {
                return Some(at);
            }
            let signal = self.onset_signal?;
            let series = self.store.series(signal)?;
            // Half way to its level since, or a material move on its own (a mild error ratio's
            // detection waited for a cluster of errors that its level since reads).
            (cause_onset::moved_early(signal, series, at, onset, now_sec)
                || moved(signal, series, at, onset.saturating_sub(1), history_s)
                    .is_some_and(|m| m.material))
            .then_some(at)
        });
        if let Some(at) = refined {
            let (again, dec) = score(&self.store, at, now_sec, history_s);
            if again.first().map(|c| c.cause) == causes.first().map(|c| c.cause) {
                (causes, decomposition, onset) = (again, dec, at);
            }
        }
        let best = causes.first().map_or(0.0, |c| c.score);
        let waited = Duration::from_secs(u64::from(now_sec.saturating_sub(triggered)));
        // The seconds of the symptom: its recent buckets before the detection, and since.
        let recent_s =
            (cfg.detector.bucket.as_secs() as u32).max(1) * (cfg.detector.recent_buckets as u32);
        let queued = (best < 0.5)
            .then(|| {
                queueing::queue_explains(
                    &self.store,
                    triggered.saturating_sub(recent_s).min(onset),
                    now_sec,
                )
            })
            .flatten();
        if let Some(e) = queued {
            match causes.iter_mut().find(|c| c.cause == Cause::ServerQueueing) {
                Some(c) => {
                    c.score = c.score.max(queueing::ORDINARY_QUEUEING_SCORE);
                    c.evidence.insert(0, e);
                }
                None => causes.push(CauseScore {
                    cause: Cause::ServerQueueing,
                    score: queueing::ORDINARY_QUEUEING_SCORE,
                    evidence: vec![e],
                }),
            }
            causes.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.cause.cmp(&b.cause)));
        } else if best < 0.5 && waited >= cfg.unknown_after && symptom.is_some() {
            causes.insert(
                0,
                CauseScore {
                    cause: Cause::Unknown,
                    score: 1.0 - best,
                    evidence: Vec::new(),
                },
            );
        }
        let top = causes.first().map_or(0.0, |c| c.score);
        // The runner-up competes with the top cause unless it is the top's own child in the
        // cause graph (the queue under a load surge is its evidence, not an alternative).
        let runner_up = causes.first().map_or(0.0, |first| {
            causes[1..]
                .iter()
                .filter(|c| !GRAPH.contains(&(first.cause, c.cause)))
                .map(|c| c.score)
                .fold(0.0, f64::max)
        });
        let unambiguous = causes.first().is_some_and(|c| c.cause != Cause::Unknown)
            && top >= cfg.confirm_min
            && top - runner_up >= cfg.confirm_margin;
        // Each state lasts at least one evaluation: triggered → propagating → root_confirmed.
        if matches!(prev, State::Propagating | State::RootConfirmed)
            && (top >= cfg.confirm_score || unambiguous)
        {
            self.set_state(State::RootConfirmed, now);
        }
        let mut d = TargetDiagnosis {
            state: self.state,
            since_unix_s: self.since.map(unix_s),
            onset_unix_s: Some(f64::from(onset)),
            symptom: symptom.or_else(|| self.last.as_ref().and_then(|l| l.symptom.clone())),
            causes,
            ttft_decomposition: decomposition,
            ..TargetDiagnosis::idle(name)
        };
        // The roots first (they order the sentence: each root in causal order).
        if d.state == State::RootConfirmed {
            let roots = roots::concurrent_roots(&d.causes, cfg.confirm_score, |p, c| {
                GRAPH.contains(&(p, c))
            });
            if roots.len() >= 2 {
                // Each root began when its own signal changed; the incident, when the first
                // did (a surge's queue 38 s before the 503s it hid paged on the error ratio).
                if let Some(first) = roots::first_onset(&roots, onset, now_sec) {
                    d.onset_unix_s = Some(first);
                }
                d.root_onsets_unix_s = roots.iter().map(|r| r.1).collect();
                d.roots = roots.into_iter().map(|(c, _)| c).collect();
                roots::rank_first(&mut d.causes, &d.roots);
            }
        }
        self.scope(&mut d, onset, now_sec);
        d.summary = d.line();
        d.canaries_skipped_share = self.store.series(Signal::CanarySkipped).and_then(|x| {
            let v: Vec<f64> = x
                .range(onset, now_sec.saturating_add(1))
                .map(|(_, v)| v)
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        });
        if let (Some(share), Some(line)) = (d.canaries_skipped_share, d.summary.as_mut())
            && share >= 0.005
        {
            line.push_str(&format!(
                " ({:.0} % of canaries skipped at max_in_flight)",
                share * 100.0
            ));
        }
        self.last = Some(d.clone());
        d
    }

    /// The onset of the symptom on `signal` (its bucket value `value` jumped): the CUSUM change
    /// point of its 1 s values against the history before the recent buckets, dated where the
    /// rise began ([`localize`]); the start of the recent buckets without one.
    fn onset_of(&self, signal: Signal, value: f64, now_sec: u32, cfg: &EngineConfig) -> u32 {
        let recent_s = (cfg.detector.bucket.as_secs() as u32).max(1)
            * (cfg.detector.recent_buckets as u32 + 1);
        let fallback = now_sec.saturating_sub(recent_s);
        // From one bucket before the recent buckets: the symptom is theirs, and a search a
        // minute earlier found the drift of a busy neighbour instead.
        let Some(change) = self.change_from(signal, fallback, cfg) else {
            return fallback;
        };
        // Dated where it began ([`localize`]): a latency's rise where it left the baseline's
        // noise, and slow canaries at their send (they report at their end).
        if signal.mean_over_window() {
            return change;
        }
        let (Some(series), Some(b)) = (
            self.store.series(signal),
            self.baseline_before(signal, fallback, cfg),
        ) else {
            return change;
        };
        let sigma = (1.4826 * b.mad).max(0.02 * b.median.abs());
        let mut at = localize::start_of_rise(series, change, b.median, sigma, value);
        if matches!(signal, Signal::Ttft | Signal::E2e) {
            let slow = (cfg.symptom.ratio * b.median).max(b.median + signal.floor());
            if let Some(sent) = localize::sent_by(series, change, b.median, slow) {
                at = at.min(sent);
            }
        }
        at
    }

    /// The baseline of `signal`'s 1 s values over the history before second `from`.
    fn baseline_before(&self, signal: Signal, from: u32, cfg: &EngineConfig) -> Option<Baseline> {
        let series = self.store.series(signal)?;
        let history_s = cfg.detector.history.as_secs() as u32;
        let mut before: Vec<f64> = series
            .range(from.saturating_sub(history_s), from)
            .map(|(_, v)| v)
            .collect();
        Baseline::of(&mut before)
    }

    /// The first change point of the 1 s values of `signal` from second `from` on, against the
    /// history before `from` (CUSUM, the last second its statistic was 0 before the alarm).
    fn change_from(&self, signal: Signal, from: u32, cfg: &EngineConfig) -> Option<u32> {
        let series = self.store.series(signal)?;
        let b = self.baseline_before(signal, from, cfg)?;
        let s = scale(&b, signal.floor());
        cusum(
            series,
            from,
            (b.median, s),
            1.0,
            // A ratio's seconds are 0/1 flags: k = 1 would let a 12 % burst's zeros cancel its
            // errors.
            if signal.mean_over_window() {
                CUSUM_K
            } else {
                ONSET_CUSUM_K
            },
            ChangePoint::FirstAlarm,
        )
    }
}

/// Whether the server's queue (its queue time or the requests waiting) moved since `onset`.
fn queue_grew(store: &EvidenceStore, onset: u32, now: u32, history_s: u32) -> bool {
    [Signal::ServerQueueTime, Signal::ServerRequestsWaiting]
        .into_iter()
        .filter_map(|s| moved(s, store.series(s)?, onset, now, history_s))
        .any(|x| x.material)
}

/// Whether a signal that moved is another cause's, not evidence of its own.
fn explained_elsewhere(
    s: Signal,
    store: &EvidenceStore,
    onset: u32,
    now: u32,
    history_s: u32,
) -> bool {
    match s {
        // The client − server gap holds whatever the server did not time: with a queue that
        // grew (llama.cpp times no wait for a slot), it is that queue's, not the path's.
        Signal::ClientServerTtftGap => queue_grew(store, onset, now, history_s),
        // CFS-throttled time is run delay too: a wait that rose with the server cgroup's
        // throttling is its quota's (cpu_throttling), not a neighbour's.
        Signal::ServerCpuWait => cpu_wait::quota_explains(store, onset, now).is_some(),
        _ => false,
    }
}

/// Scores every cause since `onset`; highest first, those above 0 only.
fn score(
    store: &EvidenceStore,
    onset: u32,
    now: u32,
    history_s: u32,
) -> (Vec<CauseScore>, Option<TtftDecomposition>) {
    let m = |s: Signal| {
        store
            .series(s)
            .and_then(|series| moved(s, series, onset, now, history_s))
    };
    let evidence = |s: Signal, mv: &Moved, rule: Option<String>| Evidence {
        signal: s,
        before: mv.before,
        after: mv.after,
        peak: mv.peak,
        z: mv.z,
        changed_at_unix_s: mv.changed_at.map(f64::from),
        lead_s: mv.changed_at.map(|c| f64::from(onset) - f64::from(c)),
        rule,
        hw_ids: Vec::new(),
        source: store.source(s).map(str::to_owned),
    };
    let ttft = m(Signal::Ttft);
    let tpot = m(Signal::Tpot);
    let ttft_moved = ttft.is_some_and(|x| x.material);
    let tpot_moved = tpot.is_some_and(|x| x.material);
    // The latency's inflation (the most inflated latency that moved), for the PSI magnitude
    // check ([`pressure`]).
    let inflation = [ttft, tpot, m(Signal::E2e)]
        .into_iter()
        .flatten()
        .filter(|x| x.material && x.before > 0.0)
        .map(|x| x.after / x.before)
        .fold(1.0_f64, f64::max);
    let mut out: Vec<CauseScore> = Vec::new();
    // Causes whose every signal was a node pressure that cannot explain the latency: they do
    // not argue against a load the canaries show.
    let mut insufficient: Vec<Cause> = Vec::new();
    for def in CAUSES {
        let mut best = 0.0_f64;
        let mut ev: Vec<(f64, Evidence)> = Vec::new();
        let mut only_insufficient = true;
        for &s in def.signals {
            if let Some((value, e)) = event_evidence(s, store, onset, now) {
                best = best.max(value);
                ev.push((value, e));
                only_insufficient = false;
                continue;
            }
            let Some(mv) = m(s) else { continue };
            if explained_elsewhere(s, store, onset, now, history_s) {
                continue;
            }
            let mut rule = hard_rule(s, &mv, store, onset, now);
            let strength = if mv.material { squash(mv.z) } else { 0.0 };
            let mut value = strength;
            if rule.is_some() {
                value = value.max(0.85);
            }
            if value <= 0.0 {
                continue;
            }
            // A node pressure stretches a step at most 1 ÷ (1 − share): far more inflation
            // without a queue to amplify it is another cause's.
            // The server's CPU wait, at most (c + w) ÷ c ([`cpu_wait::insufficient`]).
            let short = match s {
                Signal::NodeCpuPressure | Signal::NodeMemoryPressure => pressure::insufficient(
                    mv.before, mv.after, inflation, store, onset, now,
                )
                .map(|i| {
                    let words = i.words(&format!(
                        "{} {:.0} % → {:.0} %",
                        s.words(),
                        mv.before * 100.0,
                        mv.after * 100.0
                    ));
                    (i, words)
                }),
                Signal::ServerCpuWait => {
                    cpu_wait::insufficient(mv.before, mv.after, inflation, store, onset, now)
                }
                _ => None,
            };
            if let Some((i, words)) = short {
                value = (value * i.explained).min(pressure::INSUFFICIENT_CAP);
                rule = Some(match rule {
                    Some(r) => format!("{r}; but {words}"),
                    None => words,
                });
            } else {
                only_insufficient = false;
            }
            // Time order: moved before the symptom gains, well after loses.
            let lead = mv.changed_at.map(|c| f64::from(onset) - f64::from(c));
            value *= time_order(lead);
            best = best.max(value);
            ev.push((value, evidence(s, &mv, rule)));
        }
        // A server without a request counter: arrivals read from its queue ([`backlog`]).
        let mut part = def.part;
        if def.cause == Cause::LoadSurge
            && let Some(b) = backlog::outgrows_service(store, onset, now)
        {
            let e = b.evidence(onset);
            let value = BACKLOG_SCORE * time_order(e.lead_s);
            if value >= best {
                // More work than the batch serves waits: it shows in the TTFT first, whether
                // or not the full batch decodes slower.
                part = Part::Ttft;
            }
            best = best.max(value);
            ev.push((value, e));
        }
        if best <= 0.0 {
            continue;
        }
        if only_insufficient {
            insufficient.push(def.cause);
        }
        // Which part of the latency moved. A segment of the TTFT (the KV transfer, the time
        // before dispatch) adds to it by construction: its material rise is the TTFT's, below
        // the TTFT's own floor too (seen on Dynamo 1.6.1: a transfer 10 → 68 ms behind a
        // 20 ms TTFT).
        let segment_moved = def
            .signals
            .iter()
            .any(|&s| s.is_ttft_segment() && m(s).is_some_and(|x| x.material));
        let fits = match part {
            Part::Ttft => ttft_moved || segment_moved,
            Part::Tpot => tpot_moved,
            Part::Both => ttft_moved && tpot_moved,
            Part::Any => true,
        };
        let part_factor = match (part, fits) {
            (_, true) => 1.0,
            (Part::Both, false) => 0.8,
            _ => 0.75,
        };
        let mut sc = (best * part_factor).min(1.0);
        // Network: only while the server's own timings stay flat.
        if def.cause == Cause::Network && m(Signal::ServerTtft).is_some_and(|x| x.material) {
            sc *= 0.5;
        }
        ev.sort_by(|a, b| b.0.total_cmp(&a.0));
        if let Some(why) = contradict::contradiction(def.cause, store, onset, now) {
            sc = sc.min(contradict::CONTRADICTED_CAP);
            let signal = def.signals.first().copied().unwrap_or(Signal::Ttft);
            ev.push((
                0.0,
                Evidence {
                    signal: if def.cause == Cause::ServerQueueing {
                        Signal::ServerRequestsWaiting
                    } else {
                        signal
                    },
                    before: 0.0,
                    after: 0.0,
                    peak: 0.0,
                    z: 0.0,
                    changed_at_unix_s: None,
                    lead_s: None,
                    rule: Some(format!("contradicted: {why}")),
                    hw_ids: Vec::new(),
                    source: None,
                },
            ));
        }
        out.push(CauseScore {
            cause: def.cause,
            score: sc,
            evidence: ev.into_iter().map(|(_, e)| e).collect(),
        });
    }
    // Load inferred from the canary alone: TTFT and TPOT both rose, no server signal to say
    // more, and no hardware cause explains it.
    let has_server = store.series(Signal::ServerRequestRate).is_some()
        || store.series(Signal::ServerRequestsRunning).is_some();
    if let (Some(a), Some(b)) = (ttft.filter(|x| x.material), tpot.filter(|x| x.material))
        && !has_server
        && !out.iter().any(|c| c.cause == Cause::LoadSurge)
    {
        let hw = out
            .iter()
            .filter(|c| !insufficient.contains(&c.cause))
            .filter(|c| slows_without_load(c.cause))
            .map(|c| c.score)
            .fold(0.0, f64::max);
        let sc = ((0.5 + 0.4 * squash(a.z.min(b.z))) - hw).max(0.0);
        if sc > 0.0 {
            let rule = Some("TTFT and TPOT both rose with GPU, network and errors flat: more work at the server".to_owned());
            out.push(CauseScore {
                cause: Cause::LoadSurge,
                score: sc,
                evidence: vec![
                    evidence(Signal::Ttft, &a, rule),
                    evidence(Signal::Tpot, &b, None),
                ],
            });
        }
    }
    apply_graph(&mut out);
    out.retain(|c| c.score > 0.0);
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.cause.cmp(&b.cause)));
    for c in &mut out {
        c.score = (c.score * 1000.0).round() / 1000.0;
    }
    let decomposition = ttft.filter(|t| t.material).map(|t| decompose(&t, &m));
    (out, decomposition)
}

/// Whether `cause` slows a server's answers without more work at it (hardware, network,
/// errors, CPU or memory, the router, the KV transfer): against a load read from the canary
/// alone.
fn slows_without_load(cause: Cause) -> bool {
    matches!(
        cause,
        Cause::GpuThrottling
            | Cause::GpuMemoryPressure
            | Cause::GpuFault
            | Cause::Network
            | Cause::ErrorBurst
            | Cause::CpuThrottling
            | Cause::NodeCpuPressure
            | Cause::MemoryPressure
            | Cause::RouterOverhead
            | Cause::KvTransfer
    )
}

/// The pool a pool's cause is on (`prefill` | `decode`), as [`TargetDiagnosis::pool`] says it.
fn pool_of(cause: Cause) -> &'static str {
    if cause == Cause::DecodeSaturation {
        "decode"
    } else {
        "prefill"
    }
}

/// The score of a load surge read from the queue ([`backlog`]): a hard rule's.
const BACKLOG_SCORE: f64 = 0.85;

/// Time order: a signal that moved before the symptom (its lead, s) gains, one well after it
/// loses; one without a change point × 0.9.
fn time_order(lead: Option<f64>) -> f64 {
    match lead {
        Some(l) if l >= 2.0 => 1.05,
        Some(l) if l >= -5.0 => 1.0,
        Some(l) if l >= -30.0 => 1.0 - 0.3 * ((-l - 5.0) / 25.0),
        Some(_) => 0.6,
        None => 0.9,
    }
}

/// Event signals (GPU faults, server changes): the hard rule over their window before the
/// onset (60 s for a fault, 15 min for a change) until now. `None` for other signals or
/// without an event.
fn event_evidence(
    s: Signal,
    store: &EvidenceStore,
    onset: u32,
    now: u32,
) -> Option<(f64, Evidence)> {
    let (window, rule) = match s {
        Signal::GpuFault => (60, "XID / ECC / GPU lost event"),
        Signal::CgroupOomKill => (
            60,
            "OOM kill: the model server's process killed for memory (cgroup oom_kill, or Kubernetes OOMKilled)",
        ),
        Signal::ServerChange => (
            15 * 60,
            "server change (restart, version, model) in the 15 min before",
        ),
        _ => return None,
    };
    let events: Vec<(u32, f64)> = store
        .series(s)?
        .range(onset.saturating_sub(window), now.saturating_add(1))
        .filter(|&(_, v)| v > 0.0)
        .collect();
    let &(last, _) = events.last()?;
    let count: f64 = events.iter().map(|&(_, v)| v).sum();
    // What the event's source said of it (a termination's reason): first, it is the news.
    let rule = match store.note_in(s, onset.saturating_sub(window), now.saturating_add(1)) {
        Some(note) => format!("{note}: {rule}"),
        None => rule.to_owned(),
    };
    let lead = f64::from(onset) - f64::from(last);
    let value = if lead >= 0.0 {
        0.9
    } else if lead >= -30.0 {
        0.85
    } else {
        0.6
    };
    let e = Evidence {
        signal: s,
        before: 0.0,
        after: count,
        peak: count,
        z: 0.0,
        changed_at_unix_s: Some(f64::from(last)),
        lead_s: Some(lead),
        rule: Some(rule),
        hw_ids: Vec::new(),
        source: None,
    };
    Some((value, e))
}

/// Parent first: a parent that moved with its child ranks above it and carries its evidence.
fn apply_graph(out: &mut [CauseScore]) {
    for &(parent, child) in GRAPH {
        let (Some(pi), Some(ci)) = (
            out.iter().position(|c| c.cause == parent),
            out.iter().position(|c| c.cause == child),
        ) else {
            continue;
        };
        if out[pi].score >= 0.5 && out[ci].score >= 0.5 {
            let child_ev = out[ci].evidence.clone();
            let child_score = out[ci].score;
            let p = &mut out[pi];
            p.score = p.score.max(child_score).min(1.0);
            for e in child_ev {
                if !p.evidence.iter().any(|x| x.signal == e.signal) {
                    p.evidence.push(e);
                }
            }
            let ps = out[pi].score;
            out[ci].score = out[ci].score.min(ps - 0.05).max(0.0);
        }
    }
}

/// Hard rules of the issue, in words, when they fire.
fn hard_rule(s: Signal, mv: &Moved, store: &EvidenceStore, onset: u32, now: u32) -> Option<String> {
    let any_after = |sig: Signal, from: u32| {
        store
            .series(sig)
            .is_some_and(|x| x.range(from, now.saturating_add(1)).any(|(_, v)| v > 0.0))
    };
    match s {
        // A full cache is a busy vLLM's steady state (it admits requests until the blocks run
        // out): pressure is when it preempts (the warning's rule, KV ≥ 0.95 with preemptions).
        // Without a preemption a full cache counts only by how far it moved (its z).
        Signal::ServerKvUsage if mv.peak >= 0.95 && any_after(Signal::ServerPreemptions, onset) => {
            Some(format!("KV usage {:.2} ≥ 0.95 with preemptions", mv.peak))
        }
        Signal::ServerPreemptions if mv.before == 0.0 && any_after(s, onset) => {
            Some("preemptions since the onset".to_owned())
        }
        // Occupancy rises as much when the server only got slower (Little's law): the rule
        // needs the arrivals to have risen too.
        // And beyond the server's ordinary full batch: a half-busy server with few slots fills
        // them whenever a Poisson burst of its ordinary traffic arrives.
        Signal::ServerRequestsRunning
            if mv.after >= 2.0 * mv.before
                && mv.after - mv.before >= 1.0
                && contradict::ordinary_batch(store, onset)
                    .is_none_or(|(_, full)| mv.after > full)
                && contradict::arrivals_rose(store, onset, now) == Some(true)
                && !generation_fell(store, onset, now) =>
        {
            Some(format!(
                "requests running {:.0} → {:.0} (≥ 2 × and +1, beyond its ordinary full batch) with arrivals up and generated tokens/s not falling: more work arrived",
                mv.before, mv.after
            ))
        }
        Signal::PathOverhead
        | Signal::KvTransfer
        | Signal::PickImbalance
        | Signal::PrefillPoolLoad
        | Signal::DecodePoolLoad
        | Signal::WorkerSlowdown
        | Signal::FailingWorkers
        | Signal::StarvedWorkers => serving_path::rule(s, (mv.before, mv.after), store, onset, now),
        Signal::GpuThrottle if mv.before == 0.0 && mv.peak >= 0.5 => {
            Some("throttle reasons set (thermal / power / HW slowdown)".to_owned())
        }
        Signal::GpuMemoryUtilization if mv.peak >= 0.95 => {
            Some(format!("GPU memory {:.0} % used", mv.peak * 100.0))
        }
        Signal::GpuForeignProcesses if mv.before == 0.0 && mv.peak >= 1.0 => {
            Some("another process on the GPU".to_owned())
        }
        Signal::NetSrtt
            if mv.before > 0.0 && mv.after >= 2.0 * mv.before && mv.after - mv.before >= 0.005 =>
        {
            Some(format!(
                "kernel RTT ≥ 2 × and +5 ms ({:.1} → {:.1} ms)",
                mv.before * 1e3,
                mv.after * 1e3
            ))
        }
        Signal::Error if mv.after >= 0.01 && mv.material => {
            Some(format!("error ratio {:.1} % ≥ 1 %", mv.after * 100.0))
        }
        // Grafana Sift's check: throttled periods above 25 % of the CFS periods, and rising.
        Signal::CgroupCpuThrottled if mv.after >= 0.25 && mv.after > mv.before => Some(format!(
            "CPU periods throttled {:.0} % ≥ 25 % (from {:.0} %): the model server's cgroup is at its CPU quota",
            mv.after * 100.0,
            mv.before * 100.0
        )),
        Signal::RouterCpuThrottled if mv.after >= 0.25 && mv.after > mv.before => Some(format!(
            "the router's CPU periods throttled {:.0} % ≥ 25 % (from {:.0} %): the router's cgroup is at its CPU quota, every request waits for its CPU",
            mv.after * 100.0,
            mv.before * 100.0
        )),
        Signal::NodeCpuPressure if mv.after >= 0.1 && mv.after - mv.before >= 0.05 => {
            Some(format!(
                "node PSI cpu some avg10 {:.0} % → {:.0} %: tasks wait for a CPU",
                mv.before * 100.0,
                mv.after * 100.0
            ))
        }
        Signal::ServerCpuWait => cpu_wait::rule(mv.before, mv.after, store, onset, now),
        Signal::NodeMemoryPressure if mv.after >= 0.1 && mv.after - mv.before >= 0.05 => {
            Some(format!(
                "node PSI memory some avg10 {:.0} % → {:.0} %: tasks stall on memory reclaim",
                mv.before * 100.0,
                mv.after * 100.0
            ))
        }
        Signal::CgroupMemoryUsage if mv.peak >= 0.95 => Some(format!(
            "the model server's cgroup at {:.0} % of its memory limit",
            mv.peak * 100.0
        )),
        _ => None,
    }
}

/// Whether the server's generated tokens/s fell after `onset` (mean of the seconds after
/// against the mean of up to 5 min before, both means: llama.cpp counts a request's tokens
/// when it ends, so its seconds are bursts and zeros). A server whose batch filled while it
/// generated less got slower; one that generated more got more work. `false` without the
/// signal.
fn generation_fell(store: &EvidenceStore, onset: u32, now: u32) -> bool {
    let Some(s) = store.series(Signal::ServerGenerationTokensRate) else {
        return false;
    };
    let before: Vec<f64> = s
        .range(onset.saturating_sub(300), onset.saturating_sub(GUARD_S))
        .map(|(_, v)| v)
        .collect();
    let after: Vec<f64> = s
        .range(onset, now.saturating_add(1))
        .map(|(_, v)| v)
        .collect();
    !before.is_empty() && !after.is_empty() && mean(&after) < mean(&before)
}

/// Extra client TTFT split into server queue, prefill, network and the rest.
fn decompose(ttft: &Moved, m: &impl Fn(Signal) -> Option<Moved>) -> TtftDecomposition {
    let extra = ttft.after - ttft.before;
    let part = |s: Signal| m(s).map(|x| (x.after - x.before).max(0.0));
    let queue = part(Signal::ServerQueueTime);
    let prefill = part(Signal::ServerPrefillTime);
    // The path's share: the client − server gap where the server timed each canary (all of
    // the path, front end included), else the kernel's RTT change.
    let network = part(Signal::ClientServerTtftGap).or_else(|| part(Signal::NetSrtt));
    let explained = queue.unwrap_or(0.0) + prefill.unwrap_or(0.0) + network.unwrap_or(0.0);
    let over = explained - extra;
    TtftDecomposition {
        extra_s: extra,
        server_queue_s: queue,
        server_prefill_s: prefill,
        network_s: network,
        unexplained_s: (extra - explained).max(0.0),
        note: (over > 0.0).then(|| {
            format!(
                "the parts exceed the client's extra TTFT by {:.0} ms: the server's queue and prefill are means over all its requests, the client's TTFT the median of its canaries",
                over * 1e3
            )
        }),
    }
}
