//! Root-cause diagnosis: what moved with a P99 spike, ranked, with its evidence.
//!
//! - [`detector`]: the robust per-bucket baseline and jump detector, shared by the adaptive
//!   sampler's spike mode (2 ×) and the diagnosis's symptom detection (1.5 ×).
//! - [`signal`]: the named input signals (canary, GPU, network, inference server).
//! - [`store`]: the evidence store of a target (1 s resolution, 30 min, bounded).
//! - [`contradict`]: what the server says against a cause (arrivals for a load surge, the
//!   queue for queueing).
//! - [`backlog`]: arrivals read from the queue on a server without a request counter (a queue
//!   that grew while its throughput held: more work than it serves).
//! - [`pressure`]: how much a node pressure (PSI) can explain: at most 1 ÷ (1 − share) of a
//!   step, unless the server's queue amplifies it.
//! - [`cpu_wait`]: the model server's own threads waiting for a CPU as `node_cpu_pressure`
//!   evidence (the node's PSI cannot rise once other work keeps it near 100 %), unless its
//!   cgroup's throttling rose with it; at most (c + w) ÷ c of a step.
//! - [`onset`]: the incident's onset from its first cause's own signal change (an XID, the
//!   kernel RTT) when the latency's change point is late or early.
//! - [`localize`]: where a detected latency change began (the rise out of the baseline's
//!   noise; slow canaries dated at their send, since they report at their end).
//! - [`queueing`]: whether the server's own queue explains a jump (ordinary queueing).
//! - [`engine`]: [`Engine`]: symptom → onset → cause scores → state, per target.
//! - [`warning`]: early warnings (a cause's hard rule holds, the latency moved less than a
//!   symptom): the `warning` state, never a page.
//! - [`roots`]: concurrent faults: more than one confirmed root, in causal order, leading the
//!   ranking.
//! - [`node_scope`]: node-wide vs target: one fault on most of a node's targets through a
//!   signal they share is one node-level diagnosis (`scope: node`); [`announce`]: what is said
//!   once per incident (a node's fault once, not per target).
//! - [`reachability`]: whether a target answers at all (failed canaries in a row, no
//!   baseline): a dead port or an outage is said whenever it happens.
//! - [`report`]: the [`Diagnosis`] document (**API Boundary**); [`scorecard`]: it as text.
//!
//! **Architecture Invariant:** pure, like `measure/`: no clock, no socket, no file. Callers
//! pass the times; everything is testable on recorded series in milliseconds. The agent's
//! feeder is `lmperf::diagnosis_live`.
//!
//! # API (for the agent and offline callers)
//!
//! `Engine::new(EngineConfig::default())`, then `engine.observe(target, Signal::Ttft, at,
//! seconds)` for every sample (any order of targets and signals, times non-decreasing per
//! signal), and `engine.evaluate(now) -> Diagnosis` as often as wanted (the agent: every
//! second; an offline replay: every second of the recording, in time order, since the state
//! machine advances one step per evaluation).
//!
//! # Algorithm
//!
//! 1. **Symptom** (per evaluation): TTFT, TPOT, E2E p99 and the error ratio per 10 s bucket
//!    against the median and MAD of up to the previous 30 min of buckets (8 buckets, about
//!    2 min, suffice): a bucket jumped with ≥ 1.5 × the median, a robust z ≥ 3.5 and the
//!    signal's absolute floor (50 ms TTFT/E2E, 5 ms TPOT, 5 % errors); a latency symptom needs
//!    3 of the last 4 buckets and a bucket's p99 is never its lone largest sample (with a few
//!    canaries per bucket a nearest-rank p99 is the maximum, and one heavy-tail outlier would
//!    carry it); the error ratio (a bucket mean) needs 2 of the last 3, each holding at least
//!    2 errors (`MIN_ERRORS_PER_BUCKET`: one error against an error-free baseline is an
//!    infinite ratio). Staying needs the rule relaxed to 80 % (hysteresis).
//! 2. **Onset**: a one-sided CUSUM (Page 1954; k = 1 σ for a latency, about half the smallest
//!    shift a symptom is, 0.5 σ for the error ratio's 0/1 seconds; h = 5 σ) over the symptom signal's 1 s values (each step clipped to ±3 σ)
//!    against their pre-symptom median and robust scale; searched from one bucket before the
//!    symptom's recent buckets (a search a minute earlier found a busy neighbour's drift); the
//!    onset is the last second the statistic was 0 before the alarm, then, for a latency,
//!    dated where the rise left the baseline's noise (a backward CUSUM in the baseline's own
//!    scale with an allowance of a tenth of the jump) and no later than the send of the first
//!    slow canaries (end − latency + the baseline; not before the last ordinary canary's end).
//!    With two roots, the first root's own change ([`roots`]).
//! 3. **States**: `idle → triggered → propagating → root_confirmed → idle` (Grafana Sift /
//!    seed-style): triggered on the symptom, propagating while causes are scored,
//!    root_confirmed when a cause scores ≥ 0.75, or is unambiguous (≥ 0.6 and 0.3 ahead of the
//!    best cause that is not its child in the graph); back to idle 60 s after the symptom ended.
//!    `unknown` is concluded 30 s after the symptom was detected (its own clock, never the
//!    onset estimated before it) when no cause reaches 0.5 (score 1 − best) and the server's
//!    queue does not explain the jump at its scrape resolution (requests waiting at a scrape,
//!    or a queue time ≥ 20 ms: then `server_queueing` 0.45, ordinary queueing, no page).
//! 4. **Cause scores** in [0, 1]: for each signal of a cause, a BARO-style robust change
//!    (Pham et al., "BARO: Robust Root Cause Analysis for Microservices via Multivariate
//!    Bayesian Online Change Point Detection", FSE 2024): (median after onset − median before;
//!    for flags, events and counts the mean, i.e. the window's ratio or rate)
//!    ÷ (1.4826 · MAD), in the harmful direction only, material when beyond the signal's floor,
//!    20 % and z ≥ 3, and for a level beyond the highest median its calm windows of the same length
//!    reached (a busy server's queue is empty most seconds and full now and then: its ordinary
//!    tail, not a change), squashed as 1 − e^(−z/8); hard rules raise a signal to ≥ 0.85 (KV ≥ 0.95 with preemptions,
//!    any preemption, throttle reasons set, GPU memory ≥ 95 % or a new process, an XID / ECC /
//!    lost event, kernel RTT ≥ 2 × and +5 ms, error ratio ≥ 1 %, a router target's routed − direct
//!    TTFT up by the TTFT floor (50 ms: `router_overhead`, its workers answering direct canaries
//!    as before), and the serving path's other rules ([`serving_path`]: the KV transfer
//!    doubled, a worker given 2 × its fair share of the picks or none, one pool's load doubled
//!    (decode 1.5 ×) with the other's steady, one worker 2 × slower than the others or failing
//!    its direct canaries), a server change in the 15 min
//!    before onset, requests running ≥ 2 × and +1 and beyond its ordinary full batch
//!    (95th percentile) with arrivals up while generated tokens/s did not fall: more work, not a
//!    slower server; on a server without a request counter, requests waiting up ≥ 2 while its
//!    generated and total token throughput held ([`backlog`]: arrivals ≈ admissions + queue
//!    growth) is `load_surge`'s own rule and counts as arrivals up); a node pressure (PSI) that cannot stretch a step as far as the latency
//!    moved (at most 1 ÷ (1 − share), [`pressure`]) without a queue to amplify it stays below
//!    0.5; `long_prompts` also reads the prompt tokens per generated token
//!    over 10 s (`server_prompt_ratio`, derived by the store from the two token rates: llama.cpp
//!    has no request counter); time order (the signal's own CUSUM change point of the shift
//!    still in effect, one floor a σ, k = 1 σ for levels: ≥ 2 s before the onset
//!    × 1.05, up to 5 s after × 1, later down to × 0.6); which part of latency moved (TTFT alone
//!    → queue / prefill / network; TPOT → decode: GPU, KV; both → load): a cause whose part did
//!    not move × 0.75. Without server signals, TTFT and TPOT rising together with GPU, network
//!    and errors flat is read as `load_surge` (0.5 + 0.4 × strength). The cause graph
//!    (load_surge → server_queueing, long_prompts → server_queueing, kv_cache_pressure →
//!    server_queueing, load_surge → kv_cache_pressure, gpu_memory_pressure → kv_cache_pressure,
//!    gpu_fault → error_burst, server_change → error_burst, gpu_fault → gpu_throttling,
//!    long_prompts → load_surge, router_overhead → server_queueing, and the CPU and memory
//!    causes' and the serving path's edges in `engine::GRAPH`: a pool's saturation under what
//!    fills or slows a pool, the worker a router mishandles above the errors and the path
//!    difference it causes) ranks a
//!    parent above its child when both score ≥ 0.5, the child's evidence joining the parent's
//!    (CIRCA: Li et al., "Causal Inference-Based Root Cause Analysis for Online Service Systems
//!    with Intervention Recognition", KDD 2022). Named checks with a threshold, evidence and a
//!    sentence follow Coroot's inspections; the evaluation targets (AC@k) are RCAEval's (Pham et
//!    al., WWW 2025).
//! 5. **TTFT decomposition**: extra client TTFT (median after − before) = server queue +
//!    server prefill + network (the change of the per-canary client − server TTFT gap where the
//!    server timed its canaries, else kernel RTT change × 1 round trip) + unexplained.
//!
//! # `Diagnosis` JSON (schema_version 1)
//!
//! ```text
//! { "schema_version": 1, "evaluated_at_unix_s": f64,
//!   "targets": [ { "target": str,
//!     "state": "idle" | "triggered" | "propagating" | "root_confirmed" | "warning",
//!     "since_unix_s": f64 | null,            // last state change
//!     "onset_unix_s": f64 | null,            // the symptom's change point (or its cause's)
//!     "symptom": null | { "signal": "ttft" | "tpot" | "e2e" | "error", "value": f64,
//!                         "peak": f64, "baseline": f64, "ratio": f64, "z": f64,
//!                         "jumped_buckets": int, "recent_buckets": int },
//!     "causes": [ { "cause": "load_surge" | "server_queueing" | "kv_cache_pressure" |
//!                   "long_prompts" | "gpu_throttling" | "gpu_memory_pressure" | "gpu_fault" |
//!                   "network" | "error_burst" | "server_change" | "cpu_throttling" |
//!                   "node_cpu_pressure" | "memory_pressure" | "router_overhead" |
//!                   "kv_transfer" | "routing_imbalance" | "worker_out_of_rotation" |
//!                   "prefill_saturation" | "decode_saturation" | "unknown",
//!                   "score": f64 in [0, 1],      // ranked, highest first
//!                   "evidence": [ { "signal": str (Signal::as_str), "before": f64,
//!                                   "after": f64, "peak": f64, "z": f64,
//!                                   "changed_at_unix_s": f64 | null, "lead_s": f64 | null,
//!                                   "rule": str | null,
//!                                   "hw_ids": [str]?, "source": str? } ] } ],
//!                                   // source: where the figure came from, e.g.
//!                                   // "vllm_metrics (per request)", "/metrics (…)"
//!     "ttft_decomposition": null | { "extra_s": f64, "server_queue_s": f64 | null,
//!                                    "server_prefill_s": f64 | null, "network_s": f64 | null,
//!                                    "unexplained_s": f64 },
//!     "summary": str | null,                // the WARN line in words
//!     "roots": [str]?, "root_onsets_unix_s": [f64 | null]?,  // two roots or more: each one's
//!                                           // onset (its own signal's change)
//!     "profile": null? | { "at_unix_s", "server", "kind": "vllm" | "sglang", "trigger",
//!                   "reason", "output_dir", "outcome": "started" | "done" | "unsupported" |
//!                   "failed", "detail" },  // the server's profiler, when [target.profiling]
//!     "scope": "target" | "node" | "worker" | "router" | "pool",
//!                                           // node: part of a node-level diagnosis;
//!                                           // worker: on one worker behind the router;
//!                                           // router: the router's own time; pool: one
//!                                           // pool of a disaggregated deployment
//!     "node": str?,                         // that diagnosis's node (scope node only)
//!     "worker": str?,                       // that worker, as the router names it
//!     "pool": "prefill" | "decode"? } ],    // that pool (scope pool only)
//!   "nodes": [ { "node": str, "scope": "node", "state": str, "cause": str, "score": f64,
//!                "onset_unix_s": f64 | null, "targets": [str], "node_targets": int,
//!                "evidence": [ … ], "summary": str } ]? }   // absent when empty
//! ```
//! Values are in the signal's unit ([`Signal::unit`]: seconds, Hz, ratios, counts). Fields
//! are only added in version 1; a rename or removal bumps [`report::SCHEMA_VERSION`].

pub mod announce;
pub mod backlog;
pub mod contradict;
pub mod cpu_wait;
pub mod detector;
pub mod engine;
pub mod inputs;
pub mod localize;
pub mod node_scope;
pub mod onset;
pub mod outage;
pub mod pressure;
pub mod queueing;
pub mod reachability;
pub mod report;
pub mod roots;
pub mod scorecard;
pub mod serving_path;
pub mod signal;
pub mod store;
pub mod warning;

pub use engine::{Engine, EngineConfig};
pub use report::{
    Cause, CauseScore, Diagnosis, Evidence, NodeDiagnosis, Scope, State, TargetDiagnosis,
};
pub use signal::Signal;

#[cfg(test)]
mod tests;
