//! The named signals the diagnosis reads, with how each is bucketed, which direction harms,
//! and the smallest change that counts (the absolute floor).

use serde::{Deserialize, Serialize};

use super::detector::Aggregate;

/// The side a signal hurts in: a cause gains only when its signal moved this way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Harm {
    Up,
    Down,
}

/// One input series of the diagnosis. Values are in the unit [`Signal::unit`] names; events and
/// per-request flags are 1 (happened) or 0. A stable name (`as_str`): an **API Boundary** of the
/// `Diagnosis` JSON (`evidence[].signal`) and of offline callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    // ---- Canary, one sample per request (`measure::RequestRecord`) ----
    /// Client TTFT, s.
    Ttft,
    /// Client TPOT, s.
    Tpot,
    /// Client E2E, s.
    E2e,
    /// 1 for a failed request (outcome error, timeout, aborted), 0 for a success; never for a
    /// request the agent cancelled itself.
    Error,
    /// 1 for an HTTP 5xx answer, else 0.
    #[serde(rename = "error_5xx")]
    Error5xx,
    /// 1 for an HTTP 429 answer, else 0.
    #[serde(rename = "error_429")]
    Error429,
    /// 1 for a timeout, else 0.
    ErrorTimeout,
    /// Input (prompt) tokens of the request.
    InputTokens,
    // ---- GPU (`gpu::state`), one sample per GPU tick, the node's worst device ----
    /// SM clock, Hz (lowest device).
    GpuSmClock,
    /// 1 while any device has a slowdown throttle reason (thermal, power, HW slowdown).
    GpuThrottle,
    /// Memory used ÷ limit, 0..1 (fullest device).
    GpuMemoryUtilization,
    /// XID, uncorrected ECC or lost-GPU events in the tick (count).
    GpuFault,
    /// Processes on the GPUs other than the model servers' (count): a process is a model
    /// server's when it or an ancestor listens on a configured target's TCP port
    /// (`gpu::procs::serves_port`); one the agent cannot see in `/proc` counts as foreign.
    GpuForeignProcesses,
    // ---- Network (`net::state`), per kernel event of the target's connections ----
    /// Smoothed RTT, s.
    NetSrtt,
    /// Retransmitted segments (count per event).
    NetRetransmits,
    /// Connect latency, s.
    NetConnect,
    // ---- Inference server (its `/metrics`, scraped) ----
    /// Requests waiting in the server's queue.
    ServerRequestsWaiting,
    /// Requests running (in the batch).
    ServerRequestsRunning,
    /// KV cache usage, 0..1.
    ServerKvUsage,
    /// Preemptions per second.
    ServerPreemptions,
    /// Prompt tokens per second.
    ServerPromptTokensRate,
    /// Generated tokens per second.
    ServerGenerationTokensRate,
    /// Requests per second.
    ServerRequestRate,
    /// The server's own TTFT, s.
    ServerTtft,
    /// The server's queue time per request, s.
    ServerQueueTime,
    /// The server's prefill time per request, s.
    ServerPrefillTime,
    /// The server's decode time per output token, s.
    ServerDecodeTime,
    /// 1 at a restart, a new version or a new model (an event).
    ServerChange,
    /// Prompt tokens per generated token the server processed over the last 10 s (derived by
    /// the store from the two token rates of each scrape, never observed directly): longer
    /// prompts raise it, more users of the same prompts do not.
    ServerPromptRatio,
    // ---- Node and model-server cgroup (`node::NodeSampler`), one sample a second ----
    /// PSI cpu `some` avg10 of the node, 0..1 (share of time some task waited for a CPU).
    NodeCpuPressure,
    /// PSI memory `some` avg10 of the node, 0..1.
    NodeMemoryPressure,
    /// PSI io `some` avg10 of the node, 0..1.
    NodeIoPressure,
    /// Share of the model server cgroup's CFS periods throttled (its CPU quota), 0..1.
    CgroupCpuThrottled,
    /// The model server cgroup's memory ÷ its limit, 0..1.
    CgroupMemoryUsage,
    /// OOM kills in the model server's cgroup (an event count).
    CgroupOomKill,
    /// The agent's own CPU use, cores (so the node is never blamed for the agent).
    AgentCpu,
    /// 1 for a scheduled canary skipped because `max_in_flight` canaries still ran, 0 for one
    /// sent: the share of the spike the canaries did not see.
    CanarySkipped,
    /// Seconds per second the model server's threads spent runnable but not running (waiting
    /// for a CPU), s/s: the sum over its threads of `/proc/PID/task/TID/schedstat` run_delay
    /// (plain host), or its cgroup's `cpu.pressure` `some` total (cgroup v2) or its cgroup's
    /// threads' run_delay (cgroup v1), as a rate (`node::cpu_wait`). CFS-throttled time counts
    /// too. May exceed 1 (several threads waiting at once).
    ServerCpuWait,
    /// The model server's own CPU use, cores (its threads' time on a CPU, the same source as
    /// [`Signal::ServerCpuWait`]).
    ServerCpu,
    // ---- Canary and server together, one sample per request that carried server timing ----
    /// The client's TTFT minus the server's own for the same request (vLLM's per-request
    /// `metrics`, llama.cpp's `timings`), s: the network, the client and the server's HTTP
    /// front end. It grows with a slower path while the server's TTFT holds.
    #[serde(rename = "client_minus_server_ttft")]
    ClientServerTtftGap,
    // ---- A router target: its routed canaries against its direct ones ----
    /// A routed canary's TTFT minus the TTFT p50 of the direct canaries to the router's
    /// workers over the last minute (`lmperf.path.overhead_ms`), s: the time the router adds
    /// (its queue, its CPU, its flow control, the extra hop). A slower worker slows the direct
    /// canaries as much, so it holds while the workers are fine. Behind NVIDIA Dynamo (whose
    /// workers take no direct canary): the routed canary's time in the frontend before a
    /// worker got it, its TTFT split's `frontend` + `router_queue` segments.
    PathOverhead,
    /// The TTFT of a direct canary to one of a router's workers, s: whether the workers
    /// slowed (then a routed − direct difference that rose lags the direct window: not the
    /// router).
    DirectTtft,
    // ---- Disaggregated serving (prefill / decode workers) ----
    /// A routed canary's time from the end of its prefill to its first token under
    /// prefill/decode disaggregation, s: the KV transfer to the decode worker and its first
    /// decode step (Dynamo's `transfer_and_first_decode` segment, only for a request whose
    /// timing carried a transfer), or the router's own KV transfer duration per scrape
    /// (SGLang's gateway's `smg_pd_kv_transfer_duration_seconds` mean, or a vLLM worker's own
    /// `vllm:nixl_xfer_time_seconds` mean).
    KvTransfer,
    /// A router's most-picked worker's share of its picks over a scrape interval ÷ its share
    /// were the pickable workers equal (vllm-router's and llm-d's pick counters): 1 when the
    /// router spreads evenly, N when one of N workers gets everything. Only from an interval
    /// with at least [`crate::inputs::MIN_PICKS`] picks.
    PickImbalance,
    /// The workers a router may pick (healthy or unsaid, circuit not open) that got no pick
    /// in a scrape interval with at least [`crate::inputs::MIN_PICKS`] picks: out of its
    /// rotation though it calls them fine.
    StarvedWorkers,
    /// Prompt tokens queued on a disaggregated deployment's prefill workers, as its router's
    /// page says them (Dynamo's `dynamo_frontend_worker_active_prefill_tokens` summed over its
    /// `prefill` workers): more when the prefill pool is short of capacity for its work.
    PrefillPoolLoad,
    /// KV blocks a disaggregated deployment's decode workers' active sequences hold, as its
    /// router's page says them (Dynamo's `dynamo_frontend_worker_active_decode_blocks` summed
    /// over its `decode` workers): more sequences in flight when each stays longer (a decode
    /// pool short of capacity, Little's law).
    DecodePoolLoad,
    /// A router target's slowest worker's direct-canary TTFT p50 over the last minute ÷ the
    /// median of its other workers' (`lmperf_measure::workers_apart`): 1 when they answer
    /// alike, 3 when one takes three times as long. Only with 2 workers of 3 answers each.
    WorkerSlowdown,
    /// A router target's workers whose every direct canary of the last minute failed (at
    /// least 2) while another worker answered: dead or failing, whether or not the router
    /// still sends to them.
    FailingWorkers,
    /// Share of a router target's own cgroup's CFS periods throttled, 0..1: the agent reads
    /// the process listening on a target's port, which behind a `kind = "router"` target is
    /// the router (vllm-router, Dynamo's frontend), not a worker. Its CPU quota is the
    /// router's time (`router_overhead`), where [`Signal::CgroupCpuThrottled`] is a model
    /// server's (`cpu_throttling`).
    RouterCpuThrottled,
}

impl Signal {
    pub const ALL: [Signal; 50] = [
        Signal::Ttft,
        Signal::Tpot,
        Signal::E2e,
        Signal::Error,
        Signal::Error5xx,
        Signal::Error429,
        Signal::ErrorTimeout,
        Signal::InputTokens,
        Signal::GpuSmClock,
        Signal::GpuThrottle,
        Signal::GpuMemoryUtilization,
        Signal::GpuFault,
        Signal::GpuForeignProcesses,
        Signal::NetSrtt,
        Signal::NetRetransmits,
        Signal::NetConnect,
        Signal::ServerRequestsWaiting,
        Signal::ServerRequestsRunning,
        Signal::ServerKvUsage,
        Signal::ServerPreemptions,
        Signal::ServerPromptTokensRate,
        Signal::ServerGenerationTokensRate,
        Signal::ServerRequestRate,
        Signal::ServerTtft,
        Signal::ServerQueueTime,
        Signal::ServerPrefillTime,
        Signal::ServerDecodeTime,
        Signal::ServerChange,
        Signal::ServerPromptRatio,
        Signal::NodeCpuPressure,
        Signal::NodeMemoryPressure,
        Signal::NodeIoPressure,
        Signal::CgroupCpuThrottled,
        Signal::CgroupMemoryUsage,
        Signal::CgroupOomKill,
        Signal::AgentCpu,
        Signal::CanarySkipped,
        Signal::ServerCpuWait,
        Signal::ServerCpu,
        Signal::ClientServerTtftGap,
        Signal::PathOverhead,
        Signal::DirectTtft,
        Signal::KvTransfer,
        Signal::PickImbalance,
        Signal::StarvedWorkers,
        Signal::PrefillPoolLoad,
        Signal::DecodePoolLoad,
        Signal::WorkerSlowdown,
        Signal::FailingWorkers,
        Signal::RouterCpuThrottled,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Ttft => "ttft",
            Signal::Tpot => "tpot",
            Signal::E2e => "e2e",
            Signal::Error => "error",
            Signal::Error5xx => "error_5xx",
            Signal::Error429 => "error_429",
            Signal::ErrorTimeout => "error_timeout",
            Signal::InputTokens => "input_tokens",
            Signal::GpuSmClock => "gpu_sm_clock",
            Signal::GpuThrottle => "gpu_throttle",
            Signal::GpuMemoryUtilization => "gpu_memory_utilization",
            Signal::GpuFault => "gpu_fault",
            Signal::GpuForeignProcesses => "gpu_foreign_processes",
            Signal::NetSrtt => "net_srtt",
            Signal::NetRetransmits => "net_retransmits",
            Signal::NetConnect => "net_connect",
            Signal::ServerRequestsWaiting => "server_requests_waiting",
            Signal::ServerRequestsRunning => "server_requests_running",
            Signal::ServerKvUsage => "server_kv_usage",
            Signal::ServerPreemptions => "server_preemptions",
            Signal::ServerPromptTokensRate => "server_prompt_tokens_rate",
            Signal::ServerGenerationTokensRate => "server_generation_tokens_rate",
            Signal::ServerRequestRate => "server_request_rate",
            Signal::ServerTtft => "server_ttft",
            Signal::ServerQueueTime => "server_queue_time",
            Signal::ServerPrefillTime => "server_prefill_time",
            Signal::ServerDecodeTime => "server_decode_time",
            Signal::ServerChange => "server_change",
            Signal::ServerPromptRatio => "server_prompt_ratio",
            Signal::NodeCpuPressure => "node_cpu_pressure",
            Signal::NodeMemoryPressure => "node_memory_pressure",
            Signal::NodeIoPressure => "node_io_pressure",
            Signal::CgroupCpuThrottled => "cgroup_cpu_throttled",
            Signal::CgroupMemoryUsage => "cgroup_memory_usage",
            Signal::CgroupOomKill => "cgroup_oom_kill",
            Signal::AgentCpu => "agent_cpu",
            Signal::CanarySkipped => "canary_skipped",
            Signal::ServerCpuWait => "server_cpu_wait",
            Signal::ServerCpu => "server_cpu",
            Signal::ClientServerTtftGap => "client_minus_server_ttft",
            Signal::PathOverhead => "path_overhead",
            Signal::DirectTtft => "direct_ttft",
            Signal::KvTransfer => "kv_transfer",
            Signal::PickImbalance => "pick_imbalance",
            Signal::StarvedWorkers => "starved_workers",
            Signal::PrefillPoolLoad => "prefill_pool_load",
            Signal::DecodePoolLoad => "decode_pool_load",
            Signal::WorkerSlowdown => "worker_slowdown",
            Signal::FailingWorkers => "failing_workers",
            Signal::RouterCpuThrottled => "router_cpu_throttled",
        }
    }

    /// The signal of a stable name.
    pub fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Words for the log line ("requests waiting").
    pub fn words(self) -> &'static str {
        match self {
            Signal::Ttft => "TTFT",
            Signal::Tpot => "TPOT",
            Signal::E2e => "E2E",
            Signal::Error => "error ratio",
            Signal::Error5xx => "5xx ratio",
            Signal::Error429 => "429 ratio",
            Signal::ErrorTimeout => "timeout ratio",
            Signal::InputTokens => "input tokens",
            Signal::GpuSmClock => "SM clock",
            Signal::GpuThrottle => "GPU throttled",
            Signal::GpuMemoryUtilization => "GPU memory used",
            Signal::GpuFault => "GPU faults",
            Signal::GpuForeignProcesses => "foreign GPU processes",
            Signal::NetSrtt => "kernel RTT",
            Signal::NetRetransmits => "retransmits",
            Signal::NetConnect => "connect latency",
            Signal::ServerRequestsWaiting => "requests waiting",
            Signal::ServerRequestsRunning => "requests running",
            Signal::ServerKvUsage => "KV cache usage",
            Signal::ServerPreemptions => "preemptions/s",
            Signal::ServerPromptTokensRate => "prompt tokens/s",
            Signal::ServerGenerationTokensRate => "generated tokens/s",
            Signal::ServerRequestRate => "server requests/s",
            Signal::ServerTtft => "server TTFT",
            Signal::ServerQueueTime => "server queue time",
            Signal::ServerPrefillTime => "server prefill time",
            Signal::ServerDecodeTime => "server decode time",
            Signal::ServerChange => "server changes",
            Signal::ServerPromptRatio => "prompt tokens per generated token",
            Signal::NodeCpuPressure => "node CPU pressure (PSI some)",
            Signal::NodeMemoryPressure => "node memory pressure (PSI some)",
            Signal::NodeIoPressure => "node IO pressure (PSI some)",
            Signal::CgroupCpuThrottled => "CPU periods throttled",
            Signal::CgroupMemoryUsage => "memory used of its limit",
            Signal::CgroupOomKill => "OOM kills",
            Signal::AgentCpu => "agent CPU (cores)",
            Signal::CanarySkipped => "canaries skipped at max_in_flight",
            Signal::ServerCpuWait => "model server CPU wait (s/s)",
            Signal::ServerCpu => "model server CPU (cores)",
            Signal::ClientServerTtftGap => "client − server TTFT (network, front end)",
            Signal::PathOverhead => "routed − direct TTFT (the router's time)",
            Signal::DirectTtft => "direct canaries' TTFT (the workers)",
            Signal::KvTransfer => "KV transfer and first decode (P/D)",
            Signal::PickImbalance => "the most-picked worker's share of picks ÷ its fair share",
            Signal::StarvedWorkers => "pickable workers with no pick",
            Signal::PrefillPoolLoad => "prompt tokens queued on the prefill workers",
            Signal::DecodePoolLoad => "KV blocks held on the decode workers",
            Signal::WorkerSlowdown => "the slowest worker's direct TTFT ÷ the others'",
            Signal::FailingWorkers => "workers failing every direct canary",
            Signal::RouterCpuThrottled => "the router's CPU periods throttled",
        }
    }

    /// `s` | `Hz` | `1` (ratios, counts, flags) | `{token}` | `{request}/s` ...
    pub fn unit(self) -> &'static str {
        match self {
            Signal::Ttft
            | Signal::Tpot
            | Signal::E2e
            | Signal::NetSrtt
            | Signal::NetConnect
            | Signal::ServerTtft
            | Signal::ServerQueueTime
            | Signal::ServerPrefillTime
            | Signal::ServerDecodeTime
            | Signal::ClientServerTtftGap
            | Signal::PathOverhead
            | Signal::DirectTtft
            | Signal::KvTransfer => "s",
            Signal::GpuSmClock => "Hz",
            Signal::InputTokens | Signal::PrefillPoolLoad => "{token}",
            Signal::DecodePoolLoad => "{block}",
            Signal::ServerPromptTokensRate | Signal::ServerGenerationTokensRate => "{token}/s",
            Signal::ServerRequestRate | Signal::ServerPreemptions => "1/s",
            Signal::ServerRequestsWaiting | Signal::ServerRequestsRunning => "{request}",
            Signal::AgentCpu | Signal::ServerCpu => "{cpu}",
            Signal::ServerCpuWait => "s/s",
            _ => "1",
        }
    }

    /// How a second (and a bucket) of samples is summarized.
    pub fn aggregate(self) -> Aggregate {
        match self {
            Signal::Ttft | Signal::Tpot | Signal::E2e => Aggregate::P99,
            Signal::GpuFault
            | Signal::NetRetransmits
            | Signal::ServerChange
            | Signal::CgroupOomKill => Aggregate::Sum,
            Signal::CgroupMemoryUsage => Aggregate::Max,
            Signal::GpuThrottle
            | Signal::GpuMemoryUtilization
            | Signal::GpuForeignProcesses
            | Signal::ServerRequestsWaiting
            | Signal::ServerKvUsage
            | Signal::NetSrtt
            | Signal::NetConnect => Aggregate::Max,
            Signal::GpuSmClock => Aggregate::Mean,
            _ => Aggregate::Mean,
        }
    }

    /// Whether a window of this signal's seconds is summarized by its mean rather than its
    /// median: per-request flags (an error is 1, a success 0), events and counts. Their median
    /// is 0 whenever fewer than half the seconds had one, so a 12 % error burst would read
    /// "flat"; the mean is the window's ratio (rate). Levels and latencies keep the median.
    pub fn mean_over_window(self) -> bool {
        matches!(
            self,
            Signal::Error
                | Signal::Error5xx
                | Signal::Error429
                | Signal::ErrorTimeout
                | Signal::GpuThrottle
                | Signal::GpuFault
                | Signal::NetRetransmits
                | Signal::ServerPreemptions
                | Signal::ServerChange
                | Signal::CgroupOomKill
                | Signal::CanarySkipped
        )
    }

    pub fn harm(self) -> Harm {
        match self {
            Signal::GpuSmClock => Harm::Down,
            _ => Harm::Up,
        }
    }

    /// A segment of the client's TTFT, measured per request: the KV transfer
    /// (`transfer_and_first_decode` of the TTFT split) and the router's time before dispatch
    /// (routed − direct, or the split's `frontend` + `router_queue`). Its rise is the TTFT's.
    pub fn is_ttft_segment(self) -> bool {
        matches!(self, Signal::KvTransfer | Signal::PathOverhead)
    }

    /// The smallest change (in the harmful direction, in the unit) that counts as material.
    pub fn floor(self) -> f64 {
        match self {
            Signal::Ttft | Signal::E2e | Signal::DirectTtft => 0.05,
            Signal::Tpot | Signal::ServerDecodeTime => 0.005,
            Signal::ServerTtft | Signal::ServerQueueTime | Signal::ServerPrefillTime => 0.02,
            Signal::NetSrtt | Signal::ClientServerTtftGap => 0.005,
            Signal::PathOverhead | Signal::KvTransfer => 0.02,
            Signal::PickImbalance
            | Signal::StarvedWorkers
            | Signal::WorkerSlowdown
            | Signal::FailingWorkers => 0.5,
            // A prompt of the canary's length; a sequence's few blocks.
            Signal::PrefillPoolLoad => 64.0,
            Signal::DecodePoolLoad => 4.0,
            Signal::NetConnect => 0.01,
            Signal::Error | Signal::Error5xx | Signal::Error429 | Signal::ErrorTimeout => 0.01,
            Signal::InputTokens => 64.0,
            Signal::GpuSmClock => 100e6,
            Signal::GpuThrottle
            | Signal::GpuFault
            | Signal::ServerChange
            | Signal::GpuForeignProcesses => 0.5,
            Signal::GpuMemoryUtilization | Signal::ServerKvUsage => 0.05,
            Signal::NetRetransmits => 0.5,
            Signal::ServerRequestsWaiting | Signal::ServerRequestsRunning => 1.0,
            Signal::ServerPreemptions => 0.05,
            Signal::ServerPromptTokensRate => 50.0,
            Signal::ServerGenerationTokensRate => 20.0,
            Signal::ServerRequestRate => 0.2,
            Signal::ServerPromptRatio => 1.0,
            Signal::NodeCpuPressure | Signal::NodeMemoryPressure | Signal::NodeIoPressure => 0.05,
            Signal::CgroupCpuThrottled | Signal::RouterCpuThrottled => 0.1,
            Signal::CgroupMemoryUsage => 0.05,
            Signal::CgroupOomKill => 0.5,
            Signal::AgentCpu => 0.2,
            Signal::CanarySkipped => 0.05,
            Signal::ServerCpuWait => 0.05,
            Signal::ServerCpu => 0.1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        let mut seen = std::collections::BTreeSet::new();
        for (i, s) in Signal::ALL.into_iter().enumerate() {
            assert_eq!(s.index(), i);
            assert!(seen.insert(s.as_str()), "{}", s.as_str());
            assert_eq!(Signal::parse(s.as_str()), Some(s));
        }
        assert_eq!(Signal::parse("nope"), None);
    }

    #[test]
    fn serde_names_are_the_stable_names() {
        for s in Signal::ALL {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<Signal>(&json).unwrap(), s);
        }
    }
}
