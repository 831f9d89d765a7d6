//! Synthetic episodes: a vLLM-style node (canary at 1 req/s, the server's `/metrics` scraped
//! every 5 s, NVML every 1 s, kernel RTT per request) calm for 6 min, then one fault for 4 min,
//! at two magnitudes. The fault is modelled from how the system behaves (a surge fills the
//! queue and the batch; a throttled GPU decodes slower; a delayed link adds RTT to the TTFT),
//! never from what the engine looks at: the canary's TTFT is the server's queue + prefill +
//! first decode + the client's overhead + one RTT, its TPOT the server's decode time.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal, Normal};

use super::episode::{Episode, FORMAT};
use crate::diagnosis::{Cause, Signal};

/// Seconds of calm before the onset.
pub const CALM_S: f64 = 360.0;
/// Seconds of the fault.
pub const FAULT_S: f64 = 240.0;
pub use super::episode::{START_UNIX_S, TARGET};

/// `mild` or `strong`. Both make a P99 spike (the symptom the on-call is paged for): `mild`
/// about 1.6–2 × the calm p99 of the latency the fault moves, `strong` 2.5 × and more (and, for
/// errors, 12 % vs 50 % of requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Magnitude {
    Mild,
    Strong,
}

impl Magnitude {
    pub fn as_str(self) -> &'static str {
        match self {
            Magnitude::Mild => "mild",
            Magnitude::Strong => "strong",
        }
    }
    /// `mild` → `a`, `strong` → `b`.
    fn pick(self, mild: f64, strong: f64) -> f64 {
        match self {
            Magnitude::Mild => mild,
            Magnitude::Strong => strong,
        }
    }
}

/// The causes the synthetic corpus injects: all but `unknown`.
pub fn causes() -> impl Iterator<Item = Cause> {
    Cause::ALL.into_iter().filter(|c| *c != Cause::Unknown)
}

/// The no-fault controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Steady traffic.
    Calm,
    /// Load rising 25 % over the episode (a diurnal ramp): the server absorbs it.
    Drift,
    /// Steady, with single slow requests (5 × TTFT) every ~40 s.
    Outliers,
    /// The canary alone (no server metrics, no GPU, no kernel RTT).
    CanaryOnly,
}

impl Control {
    pub const ALL: [Control; 4] = [
        Control::Calm,
        Control::Drift,
        Control::Outliers,
        Control::CanaryOnly,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Control::Calm => "calm",
            Control::Drift => "drift",
            Control::Outliers => "outliers",
            Control::CanaryOnly => "canary_only",
        }
    }
}

/// The node's state at one second.
#[derive(Debug, Clone, Copy)]
struct World {
    queue_s: f64,
    prefill_s: f64,
    decode_s: f64,
    client_s: f64,
    srtt_s: f64,
    /// Round trips in a canary's TTFT: 2 (a connection opened per request: the handshake and
    /// the request), 1 on a kept-alive connection (the request and the first chunk).
    ttft_round_trips: f64,
    retransmit_p: f64,
    error_p: f64,
    /// An error is a 429 (else a 5xx) with this probability.
    error_429_p: f64,
    /// Errors are refused connections (no HTTP status).
    error_connect: bool,
    input_tokens: f64,
    waiting: f64,
    running: f64,
    kv: f64,
    preemptions: f64,
    request_rate: f64,
    prompt_rate: f64,
    generation_rate: f64,
    sm_clock_hz: f64,
    throttle: f64,
    gpu_mem: f64,
    foreign: f64,
    /// Node PSI cpu / memory `some` avg10 (0..1).
    cpu_psi: f64,
    mem_psi: f64,
    /// The model server cgroup's throttled share of CFS periods and memory ÷ limit.
    throttled: f64,
    /// A router target: its own cgroup's throttled share of CFS periods (the router's quota).
    router_throttled: f64,
    cgroup_mem: f64,
    /// OOM kills at the onset (an event).
    oom_kill: bool,
    /// A router target: the time the router adds before the first token (its queue, its CPU),
    /// s; the direct canaries to its workers do not pay it.
    router_s: f64,
    /// Prefill/decode disaggregation: the KV transfer from the prefill worker to the decode
    /// worker before the first token, s.
    transfer_s: f64,
    /// A router's most-picked worker's share of its picks ÷ its fair share (1: even).
    pick_ratio: f64,
    /// Workers the router calls fine that get none of its picks.
    starved: f64,
    /// Prefill/decode disaggregation, as the router's page says it: prompt tokens queued on
    /// the prefill workers, and KV blocks the decode workers' sequences hold.
    prefill_pool: f64,
    decode_pool: f64,
    /// A router target's worker 0 takes this × the time of the others (1: alike).
    slow_worker: f64,
    /// A router target's worker 0 fails every request (a dead pod the router still sends to).
    dead_worker: bool,
}

impl World {
    fn calm() -> Self {
        World {
            queue_s: 0.003,
            prefill_s: 0.045,
            decode_s: 0.011,
            client_s: 0.012,
            srtt_s: 0.0003,
            ttft_round_trips: 2.0,
            retransmit_p: 0.0,
            error_p: 0.0,
            error_429_p: 0.0,
            error_connect: false,
            input_tokens: 100.0,
            waiting: 0.0,
            running: 4.0,
            kv: 0.35,
            preemptions: 0.0,
            request_rate: 4.0,
            prompt_rate: 500.0,
            generation_rate: 250.0,
            sm_clock_hz: 1.98e9,
            throttle: 0.0,
            gpu_mem: 0.90,
            foreign: 0.0,
            cpu_psi: 0.02,
            mem_psi: 0.0,
            throttled: 0.01,
            router_throttled: 0.01,
            cgroup_mem: 0.6,
            oom_kill: false,
            router_s: 0.002,
            transfer_s: 0.013,
            pick_ratio: 1.0,
            starved: 0.0,
            prefill_pool: 60.0,
            decode_pool: 36.0,
            slow_worker: 1.0,
            dead_worker: false,
        }
    }
}

fn lerp(a: f64, b: f64, f: f64) -> f64 {
    a + (b - a) * f
}

impl World {
    /// The pools' loads `prefill` × and `decode` × the calm ones at full fault (`f` = 1):
    /// work that takes longer, or more of it, holds more of each pool (Little's law).
    fn pools(&mut self, prefill: f64, decode: f64, f: f64) {
        let c = World::calm();
        self.prefill_pool = lerp(c.prefill_pool, c.prefill_pool * prefill, f);
        self.decode_pool = lerp(c.decode_pool, c.decode_pool * decode, f);
    }
}

/// The world `since` seconds after the injection of `cause` (ramped in over `ramp` seconds).
fn faulted(cause: Cause, m: Magnitude, since: f64, variant: u64) -> World {
    let mut w = World::calm();
    let ramp = match cause {
        Cause::LoadSurge | Cause::KvCachePressure => 20.0,
        Cause::GpuFault
        | Cause::ErrorBurst
        | Cause::ServerChange
        | Cause::Network
        | Cause::MemoryPressure => 2.0,
        _ => 10.0,
    };
    let f = (since / ramp).clamp(0.0, 1.0);
    let c = World::calm();
    match cause {
        Cause::LoadSurge => {
            let k = m.pick(2.2, 4.0);
            w.request_rate = lerp(c.request_rate, c.request_rate * k, f);
            w.prompt_rate = lerp(c.prompt_rate, c.prompt_rate * k, f);
            w.generation_rate = lerp(c.generation_rate, c.generation_rate * m.pick(1.8, 3.0), f);
            w.running = lerp(c.running, m.pick(8.0, 16.0), f);
            w.waiting = lerp(0.0, m.pick(3.0, 20.0), f);
            w.kv = lerp(c.kv, m.pick(0.55, 0.85), f);
            w.queue_s = lerp(c.queue_s, m.pick(0.09, 0.45), f);
            w.prefill_s = lerp(c.prefill_s, c.prefill_s * 1.3, f);
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.4, 2.0), f);
            w.pools(k, w.running / c.running, f);
        }
        Cause::ServerQueueing => {
            // Disaggregated, requests wait in the frontend's queue: the pools see no more.
            // The scheduler got slower (a stuck batch, a slow tokenizer): requests wait.
            w.waiting = lerp(0.0, m.pick(4.0, 12.0), f);
            w.queue_s = lerp(c.queue_s, m.pick(0.15, 0.5), f);
            w.decode_s = lerp(c.decode_s, c.decode_s * 1.1, f);
        }
        Cause::KvCachePressure => {
            // Long generations fill the KV cache: preemption and recompute.
            w.kv = lerp(0.35, m.pick(0.965, 0.985), f);
            w.preemptions = if f >= 0.7 { m.pick(0.6, 3.0) } else { 0.0 };
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.6, 2.5), f);
            w.queue_s = lerp(c.queue_s, m.pick(0.03, 0.1), f);
            w.waiting = lerp(0.0, m.pick(1.0, 4.0), f);
            w.running = lerp(c.running, 3.0, f);
            w.generation_rate = lerp(c.generation_rate, c.generation_rate * 0.8, f);
            w.pools(1.2, m.pick(2.2, 2.7), f);
        }
        Cause::LongPrompts => {
            // A second client sends long prompts: the canary's own prompts do not change.
            w.prompt_rate = lerp(c.prompt_rate, c.prompt_rate * m.pick(2.5, 6.0), f);
            w.prefill_s = lerp(c.prefill_s, m.pick(0.18, 0.6), f);
            w.queue_s = lerp(c.queue_s, m.pick(0.04, 0.15), f);
            w.waiting = lerp(0.0, m.pick(1.0, 3.0), f);
            w.running = lerp(c.running, c.running + 1.0, f);
            w.request_rate = lerp(c.request_rate, c.request_rate + 0.5, f);
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.1, 1.3), f);
            w.pools(m.pick(3.0, 8.0), 1.1, f);
        }
        Cause::GpuThrottling => {
            w.throttle = 1.0;
            w.sm_clock_hz = lerp(c.sm_clock_hz, m.pick(1.2e9, 0.9e9), f);
            let k = c.sm_clock_hz / w.sm_clock_hz;
            w.decode_s = c.decode_s * k;
            w.prefill_s = c.prefill_s * k;
            w.pools(k, k, f);
        }
        Cause::GpuMemoryPressure => {
            // Another process on the GPU: its memory, and its kernels beside the server's.
            w.foreign = 1.0;
            w.gpu_mem = lerp(c.gpu_mem, m.pick(0.97, 0.995), f);
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.7, 2.5), f);
            w.prefill_s = lerp(c.prefill_s, c.prefill_s * m.pick(1.4, 1.8), f);
            w.pools(m.pick(1.4, 1.8), m.pick(1.7, 2.5), f);
        }
        Cause::GpuFault => {
            // An XID at the onset; the server fails part of its requests and the rest slow down.
            w.error_p = m.pick(0.25, 0.7) * f;
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.4, 2.0), f);
            w.prefill_s = lerp(c.prefill_s, c.prefill_s * m.pick(1.4, 2.0), f);
            w.pools(m.pick(1.4, 2.0), m.pick(1.4, 2.0), f);
        }
        Cause::Network => {
            // Delay on the link (DelayLink: each packet held), retransmits when strong.
            w.srtt_s = lerp(c.srtt_s, m.pick(0.03, 0.1), f);
            w.retransmit_p = m.pick(0.0, 0.05) * f;
        }
        Cause::ErrorBurst => {
            w.error_p = m.pick(0.12, 0.5) * f;
            w.error_429_p = if variant.is_multiple_of(2) { 0.0 } else { 1.0 };
        }
        Cause::ServerChange => {
            // Restarted with another (bigger) model: refused while it loads, then slower.
            let down = m.pick(5.0, 15.0);
            if since < down {
                w.error_p = 1.0;
                w.error_connect = true;
            }
            let k = m.pick(1.8, 2.5);
            w.decode_s = c.decode_s * k;
            w.prefill_s = c.prefill_s * k;
        }
        Cause::CpuThrottling => {
            // The container at its CFS quota: the CPU-bound frontend (tokenization, the
            // scheduler loop, detokenization) runs in bursts: requests wait, tokens come late.
            w.throttled = lerp(c.throttled, m.pick(0.4, 0.8), f);
            w.queue_s = lerp(c.queue_s, m.pick(0.06, 0.25), f);
            w.waiting = lerp(0.0, m.pick(1.0, 4.0), f);
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.4, 2.0), f);
            w.client_s = lerp(c.client_s, c.client_s * 1.5, f);
            w.pools(1.5, m.pick(1.4, 2.0), f);
        }
        Cause::NodeCpuPressure => {
            // A neighbour spinning the node's cores: the server's threads wait for a CPU (its
            // own quota is not the limit, so no throttling).
            w.cpu_psi = lerp(c.cpu_psi, m.pick(0.35, 0.7), f);
            w.queue_s = lerp(c.queue_s, m.pick(0.05, 0.2), f);
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.4, 1.9), f);
            w.client_s = lerp(c.client_s, c.client_s * 2.0, f);
            w.pools(1.5, m.pick(1.4, 1.9), f);
        }
        Cause::MemoryPressure => {
            // A memory hog: reclaim stalls the server (PSI memory), its cgroup near its limit;
            // strong: a helper process OOM-killed at the onset.
            w.mem_psi = lerp(c.mem_psi, m.pick(0.2, 0.5), f);
            w.cgroup_mem = lerp(c.cgroup_mem, m.pick(0.96, 0.995), f);
            w.oom_kill = m == Magnitude::Strong;
            w.prefill_s = lerp(c.prefill_s, c.prefill_s * m.pick(1.6, 2.5), f);
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.5, 2.2), f);
            w.pools(m.pick(1.6, 2.5), m.pick(1.5, 2.2), f);
        }
        Cause::RouterOverhead
        | Cause::KvTransfer
        | Cause::RoutingImbalance
        | Cause::WorkerOutOfRotation
        | Cause::PrefillSaturation
        | Cause::DecodeSaturation => serving_path(&mut w, cause, m, f, variant),
        Cause::Unknown => {}
    }
    w
}

/// The serving path's faults (a router target's, a disaggregated deployment's): `w` as
/// `cause` at `m` makes it, `f` of the way in.
fn serving_path(w: &mut World, cause: Cause, m: Magnitude, f: f64, variant: u64) {
    let c = World::calm();
    match cause {
        Cause::RouterOverhead => {
            // The router itself slower (its CPU quota, its queue, flow control): every routed
            // request waits in it before a worker sees it; the workers are as fast as ever.
            w.router_s = lerp(c.router_s, m.pick(0.08, 0.4), f);
            // Odd variants: its CPU quota (its own cgroup throttled).
            if !variant.is_multiple_of(2) {
                w.router_throttled = lerp(c.router_throttled, m.pick(0.4, 0.8), f);
            }
        }
        Cause::KvTransfer => {
            // The decode worker restarted with a slower KV link (bandwidth 10 × lower): every
            // disaggregated request waits for its KV; prefill and decode as fast as before.
            w.transfer_s = lerp(c.transfer_s, m.pick(0.08, 0.25), f);
        }
        Cause::RoutingImbalance => {
            // The router sends one worker the others' requests (one hot session key under
            // consistent hashing): its queue grows, its fuller batch decodes slower.
            w.pick_ratio = lerp(c.pick_ratio, m.pick(2.0, 3.5), f);
            w.waiting = lerp(0.0, m.pick(2.0, 8.0), f);
            w.queue_s = lerp(c.queue_s, m.pick(0.1, 0.35), f);
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.3, 1.6), f);
            w.pools(m.pick(1.8, 3.0), 1.2, f);
        }
        Cause::WorkerOutOfRotation if variant == 2 => {
            // One of two workers slow (mild: a CPU quota, its own slow GPU) or dead (strong:
            // its pod killed), and the router still sends it half its requests.
            if m == Magnitude::Strong {
                w.dead_worker = f >= 0.5;
                w.error_p = if f >= 0.5 { 0.5 } else { 0.0 };
            } else {
                w.slow_worker = lerp(1.0, 3.5, f);
            }
        }
        Cause::WorkerOutOfRotation => {
            // One of four workers, healthy by the router's word, gets no request (a stale
            // registration, a weight of 0): the other three share its traffic evenly.
            w.starved = if f >= 0.5 { 1.0 } else { 0.0 };
            w.pick_ratio = lerp(c.pick_ratio, 4.0 / 3.0, f);
            w.waiting = lerp(0.0, m.pick(1.0, 4.0), f);
            w.queue_s = lerp(c.queue_s, m.pick(0.08, 0.25), f);
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.2, 1.4), f);
            w.pools(1.5, 1.2, f);
        }
        Cause::PrefillSaturation => {
            // A prefill worker slower (or one of them gone): prompts queue on the prefill
            // workers and wait for their prefill; the decode pool gets what it got before.
            w.pools(m.pick(3.0, 8.0), 1.0, f);
            w.queue_s = lerp(c.queue_s, m.pick(0.08, 0.3), f);
        }
        Cause::DecodeSaturation => {
            // A decode worker slower (or one of them gone): sequences stay longer and pile up
            // on the decode workers, the first decode step after the transfer waits for a
            // slot; the prefill pool is as busy as before.
            w.pools(1.0, m.pick(1.8, 3.0), f);
            w.decode_s = lerp(c.decode_s, c.decode_s * m.pick(1.6, 2.5), f);
            w.transfer_s = lerp(c.transfer_s, c.transfer_s + m.pick(0.03, 0.1), f);
        }
        _ => {}
    }
}

struct Recorder {
    series: BTreeMap<Signal, Vec<[f64; 2]>>,
}

impl Recorder {
    fn push(&mut self, s: Signal, t: f64, v: f64) {
        // Millisecond offsets and 6 significant digits keep the files small.
        let t = (t * 1000.0).round() / 1000.0;
        let v = if v == 0.0 {
            0.0
        } else {
            let mag = 10f64.powi(5 - v.abs().log10().floor() as i32);
            (v * mag).round() / mag
        };
        self.series.entry(s).or_default().push([t, v]);
    }
}

/// What the episode records.
#[derive(Debug, Clone, Copy)]
struct Sources {
    server: bool,
    gpu: bool,
    net: bool,
    /// The target is a router: its canaries pay [`World::router_s`], and direct canaries to
    /// its workers (every 2.5 s: two workers, one each per 5 s) give their TTFT and each
    /// routed canary's TTFT minus their p50 over the last minute, as the agent computes it.
    router: bool,
    /// Prefill/decode disaggregated: each canary's TTFT holds [`World::transfer_s`], and its
    /// transfer segment (the transfer and the first decode step) is recorded; the router's
    /// page gives both pools' loads.
    pd: bool,
}

/// The direct canaries of a router target so far: (time, TTFT) of the last minute.
#[derive(Debug, Default)]
struct DirectWindow {
    next_s: f64,
    recent: std::collections::VecDeque<(f64, f64)>,
    /// Each worker's results (`None`: failed), as the agent keeps them per worker.
    results: [Vec<lmperf_measure::workers_apart::DirectResult>; 2],
    sent: usize,
}

impl DirectWindow {
    /// The direct canaries' gap: two workers, each once per 5 s.
    const GAP_S: f64 = 2.5;

    /// Sends the direct canaries due by `t` (worker 0 and 1 in turn; `ttft_at(at, worker)`:
    /// its TTFT, `None` when it fails), recording their TTFT and the workers apart as the
    /// agent does, and returns their TTFT p50 over the minute before `t`, with at least 5.
    fn p50_at(
        &mut self,
        t: f64,
        mut ttft_at: impl FnMut(f64, usize) -> Option<f64>,
        r: &mut Recorder,
    ) -> Option<f64> {
        while self.next_s <= t {
            let (at, worker) = (self.next_s, self.sent % 2);
            let v = ttft_at(at, worker);
            self.results[worker].push(lmperf_measure::workers_apart::DirectResult {
                at_unix_s: at,
                ttft_ms: v.map(|v| v * 1e3),
            });
            let apart = lmperf_measure::workers_apart::workers_apart(
                [("w0", &self.results[0][..]), ("w1", &self.results[1][..])],
                at,
                lmperf_measure::workers_apart::WINDOW_S,
            );
            for (signal, value, _) in crate::diagnosis::inputs::apart_signals(&apart) {
                r.push(signal, at, value);
            }
            if let Some(v) = v {
                r.push(Signal::DirectTtft, at, v);
                self.recent.push_back((at, v));
            }
            self.sent += 1;
            self.next_s += Self::GAP_S;
        }
        while self.recent.front().is_some_and(|&(at, _)| at < t - 60.0) {
            self.recent.pop_front();
        }
        let mut v: Vec<f64> = self.recent.iter().map(|&(_, v)| v).collect();
        (v.len() >= 5)
            .then(|| crate::diagnosis::detector::median(&mut v))
            .flatten()
    }
}

/// What a router target and a disaggregated server add to each canary, drawn apart from the
/// workers' own noise (a router in front leaves it as it was; the transfer likewise).
struct Paths {
    direct: DirectWindow,
    router_rng: StdRng,
    pd_rng: StdRng,
    lat: LogNormal<f64>,
    /// The prefill pool's queued tokens: a few prompts in flight, so wider than a latency.
    pool_noise: LogNormal<f64>,
}

impl Paths {
    fn new(seed: u64, lat: LogNormal<f64>) -> Self {
        Paths {
            direct: DirectWindow::default(),
            router_rng: StdRng::seed_from_u64(seed ^ 0x726f_7574_6572),
            pd_rng: StdRng::seed_from_u64(seed ^ 0x7064_7864_6672),
            lat,
            pool_noise: LogNormal::new(0.0, 0.3).unwrap_or_else(|_| unreachable!()),
        }
    }

    /// A router target's page scraped at `t`: its picks' imbalance (round robin's ± a tenth).
    fn scrape(&mut self, sources: Sources, w: &World, t: f64, r: &mut Recorder) {
        if sources.pd {
            let queued = w.prefill_pool * self.pool_noise.sample(&mut self.pd_rng);
            r.push(Signal::PrefillPoolLoad, t, queued.round());
            let blocks = w.decode_pool * self.lat.sample(&mut self.pd_rng);
            r.push(Signal::DecodePoolLoad, t, blocks.round());
        }
        if sources.router {
            let spread = 1.0 + 0.1 * (self.lat.sample(&mut self.router_rng) - 1.0).abs();
            r.push(Signal::PickImbalance, t, w.pick_ratio * spread);
            r.push(Signal::StarvedWorkers, t, w.starved);
        }
    }

    /// A canary at `t` in world `w` whose workers took `ttft`, s, with the KV transfer and
    /// the router's time added (the TTFT the client sees); the transfer segment, the direct
    /// canaries and the routed − direct difference recorded.
    fn routed_ttft(
        &mut self,
        sources: Sources,
        (w, t): (&World, f64),
        world_at: &dyn Fn(f64) -> World,
        mut ttft: f64,
        r: &mut Recorder,
    ) -> f64 {
        let lat = self.lat;
        if sources.pd {
            let transfer = w.transfer_s * lat.sample(&mut self.pd_rng);
            ttft += transfer;
            let first_decode = w.decode_s * lat.sample(&mut self.pd_rng);
            r.push(Signal::KvTransfer, t, transfer + first_decode);
        }
        if sources.router {
            // The direct canaries see the workers as they are at their own send; disaggregated,
            // the path past the router holds the KV transfer too.
            // Worker 0 is the one a fault on one worker hits: slower, or failing.
            let worker = |rng: &mut StdRng, at: f64, i: usize| {
                let w = world_at(at);
                if i == 0 && w.dead_worker {
                    return None;
                }
                let transfer = if sources.pd { w.transfer_s } else { 0.0 };
                let slow = if i == 0 { w.slow_worker } else { 1.0 };
                Some(
                    (w.queue_s + w.prefill_s + w.decode_s) * slow * lat.sample(rng)
                        + transfer
                        + w.client_s
                        + w.ttft_round_trips * w.srtt_s,
                )
            };
            // The router sends worker 0 half its requests.
            if w.slow_worker > 1.0 && self.router_rng.random_bool(0.5) {
                ttft *= w.slow_worker;
            }
            ttft += w.router_s * lat.sample(&mut self.router_rng);
            let rng = &mut self.router_rng;
            if let Some(p50) = self.direct.p50_at(t, |at, i| worker(rng, at, i), r) {
                r.push(Signal::PathOverhead, t, ttft - p50);
            }
        }
        ttft
    }
}

/// A canary's error signals, each 0 for a success.
const ERRORS: [Signal; 4] = [
    Signal::Error,
    Signal::Error5xx,
    Signal::Error429,
    Signal::ErrorTimeout,
];

fn generate(
    seed: u64,
    sources: Sources,
    world_at: &dyn Fn(f64) -> World,
    outliers: bool,
) -> BTreeMap<Signal, Vec<[f64; 2]>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let noise = |sigma: f64| LogNormal::new(0.0, sigma).unwrap_or_else(|_| unreachable!());
    let lat = noise(0.12);
    let rate = noise(0.08);
    let rtt = noise(0.3);
    let unit = Normal::new(0.0, 1.0).unwrap_or_else(|_| unreachable!());
    let mut r = Recorder {
        series: BTreeMap::new(),
    };
    let total = CALM_S + FAULT_S;
    let mut t = rng.random_range(0.0..1.0);
    let mut paths = Paths::new(seed, lat);
    // Canary requests, one per second with jitter.
    while t < total {
        let w = world_at(t);
        if rng.random_bool(w.error_p.clamp(0.0, 1.0)) {
            r.push(Signal::Error, t, 1.0);
            let is_429 = !w.error_connect && rng.random_bool(w.error_429_p);
            let is_5xx = !w.error_connect && !is_429;
            r.push(Signal::Error5xx, t, f64::from(u8::from(is_5xx)));
            r.push(Signal::Error429, t, f64::from(u8::from(is_429)));
            r.push(Signal::ErrorTimeout, t, 0.0);
            r.push(
                Signal::E2e,
                t,
                0.004 * lat.sample(&mut rng) + 2.0 * w.srtt_s,
            );
        } else {
            let mut ttft = (w.queue_s + w.prefill_s + w.decode_s) * lat.sample(&mut rng)
                + w.client_s
                + w.ttft_round_trips * w.srtt_s;
            if outliers && rng.random_bool(1.0 / 40.0) {
                ttft *= 5.0;
            }
            ttft = paths.routed_ttft(sources, (&w, t), world_at, ttft, &mut r);
            let tpot = (w.decode_s + 0.001) * lat.sample(&mut rng);
            let out_tokens = 32.0;
            for s in ERRORS {
                r.push(s, t, 0.0);
            }
            r.push(Signal::Ttft, t, ttft);
            r.push(Signal::Tpot, t, tpot);
            r.push(Signal::E2e, t, ttft + tpot * (out_tokens - 1.0) + w.srtt_s);
        }
        r.push(
            Signal::InputTokens,
            t,
            (w.input_tokens + 30.0 * unit.sample(&mut rng))
                .round()
                .max(8.0),
        );
        if sources.net {
            for i in 0..3 {
                let te = t + 0.01 * f64::from(i);
                r.push(Signal::NetSrtt, te, w.srtt_s * rtt.sample(&mut rng));
                let rt = rng.random_bool(w.retransmit_p.clamp(0.0, 1.0));
                r.push(Signal::NetRetransmits, te, f64::from(u8::from(rt)));
            }
        }
        t += rng.random_range(0.8..1.2);
    }
    if sources.net {
        // A new connection every ~30 s (keep-alive expiry).
        let mut t = rng.random_range(0.0..30.0);
        while t < total {
            let w = world_at(t);
            r.push(Signal::NetConnect, t, 1.5 * w.srtt_s * rtt.sample(&mut rng));
            t += rng.random_range(20.0..40.0);
        }
    }
    if sources.gpu {
        let mut t = rng.random_range(0.0..1.0);
        while t < total {
            let w = world_at(t);
            r.push(
                Signal::GpuSmClock,
                t,
                (w.sm_clock_hz + 8e6 * unit.sample(&mut rng)).max(0.0),
            );
            r.push(Signal::GpuThrottle, t, w.throttle);
            r.push(
                Signal::GpuMemoryUtilization,
                t,
                (w.gpu_mem + 0.002 * unit.sample(&mut rng)).clamp(0.0, 1.0),
            );
            r.push(Signal::GpuForeignProcesses, t, w.foreign);
            r.push(Signal::GpuFault, t, 0.0);
            // The node sampler's signals (PSI, the server's cgroup, the agent's own CPU).
            let jitter =
                |rng: &mut StdRng, v: f64, sd: f64| (v + sd * unit.sample(rng)).clamp(0.0, 1.0);
            let node = [
                (Signal::NodeCpuPressure, w.cpu_psi, 0.01),
                (Signal::NodeMemoryPressure, w.mem_psi, 0.005),
                (Signal::NodeIoPressure, 0.01, 0.005),
                (Signal::CgroupCpuThrottled, w.throttled, 0.02),
                (Signal::CgroupMemoryUsage, w.cgroup_mem, 0.003),
            ];
            for (s, v, sd) in node {
                r.push(s, t, jitter(&mut rng, v, sd));
            }
            r.push(Signal::CgroupOomKill, t, 0.0);
            if sources.router {
                let v = jitter(&mut rng, w.router_throttled, 0.02);
                r.push(Signal::RouterCpuThrottled, t, v);
            }
            r.push(Signal::AgentCpu, t, jitter(&mut rng, 0.015, 0.003));
            t += 1.0;
        }
    }
    if sources.server {
        let mut t = rng.random_range(0.0..5.0);
        while t < total {
            let w = world_at(t);
            let count = |rng: &mut StdRng, v: f64| {
                (v + (0.3 + 0.2 * v) * unit.sample(rng)).round().max(0.0)
            };
            let waiting = count(&mut rng, w.waiting);
            r.push(Signal::ServerRequestsWaiting, t, waiting);
            let running = count(&mut rng, w.running);
            r.push(Signal::ServerRequestsRunning, t, running);
            r.push(
                Signal::ServerKvUsage,
                t,
                (w.kv + 0.02 * unit.sample(&mut rng)).clamp(0.0, 1.0),
            );
            let pre = if w.preemptions > 0.0 {
                (w.preemptions * rate.sample(&mut rng) * 5.0).round() / 5.0
            } else {
                0.0
            };
            r.push(Signal::ServerPreemptions, t, pre);
            r.push(
                Signal::ServerRequestRate,
                t,
                w.request_rate * rate.sample(&mut rng),
            );
            r.push(
                Signal::ServerPromptTokensRate,
                t,
                w.prompt_rate * rate.sample(&mut rng),
            );
            r.push(
                Signal::ServerGenerationTokensRate,
                t,
                w.generation_rate * rate.sample(&mut rng),
            );
            let q = w.queue_s * lat.sample(&mut rng);
            let p = w.prefill_s * lat.sample(&mut rng);
            r.push(Signal::ServerQueueTime, t, q);
            r.push(Signal::ServerPrefillTime, t, p);
            r.push(
                Signal::ServerDecodeTime,
                t,
                w.decode_s * lat.sample(&mut rng),
            );
            r.push(Signal::ServerTtft, t, q + p + w.decode_s);
            r.push(Signal::ServerChange, t, 0.0);
            paths.scrape(sources, &w, t, &mut r);
            t += 5.0;
        }
    }
    r.series
}

fn named(series: BTreeMap<Signal, Vec<[f64; 2]>>) -> BTreeMap<String, Vec<[f64; 2]>> {
    series
        .into_iter()
        .map(|(s, v)| (s.as_str().to_owned(), v))
        .collect()
}

fn sort(series: &mut BTreeMap<Signal, Vec<[f64; 2]>>) {
    for v in series.values_mut() {
        v.sort_by(|a, b| a[0].total_cmp(&b[0]));
    }
}

/// One fault episode: `cause` at `magnitude`, `variant` picks the seed (and, for
/// `error_burst`, 503 on even variants, 429 on odd ones).
pub fn fault(cause: Cause, magnitude: Magnitude, variant: u64) -> Episode {
    let name = format!("{}-{}-{}", cause.as_str(), magnitude.as_str(), variant);
    let seed = 0x6c6d_7065_7266 ^ (cause as u64) << 8 ^ (magnitude as u64) << 4 ^ variant;
    let world_at = |t: f64| {
        if t < CALM_S {
            World::calm()
        } else {
            faulted(cause, magnitude, t - CALM_S, variant)
        }
    };
    // The second variant of each cause is a router target's (its workers faulted, or the
    // router itself): a worker's fault slows the direct canaries as much as the routed ones.
    let sources = Sources {
        server: true,
        gpu: true,
        net: true,
        router: matches!(
            cause,
            Cause::RouterOverhead | Cause::RoutingImbalance | Cause::WorkerOutOfRotation
        ) || variant == 2,
        // The first variant of each cause is disaggregated (its transfer recorded).
        pd: matches!(
            cause,
            Cause::KvTransfer | Cause::PrefillSaturation | Cause::DecodeSaturation
        ) || variant == 1,
    };
    let mut series = generate(seed, sources, &world_at, false);
    // Events: an XID at the onset; a server change (restart with another model).
    let event = match cause {
        Cause::GpuFault => Some(Signal::GpuFault),
        Cause::ServerChange => Some(Signal::ServerChange),
        Cause::MemoryPressure if faulted(cause, magnitude, 1.0, variant).oom_kill => {
            Some(Signal::CgroupOomKill)
        }
        _ => None,
    };
    if let Some(s) = event {
        series.entry(s).or_default().push([CALM_S, 1.0]);
    }
    if cause == Cause::ServerChange {
        // Nothing answers /metrics while the server is down.
        let down = magnitude.pick(5.0, 15.0);
        for (s, v) in series.iter_mut() {
            if s.as_str().starts_with("server_") && *s != Signal::ServerChange {
                v.retain(|p| !(p[0] >= CALM_S && p[0] < CALM_S + down));
            }
        }
    }
    sort(&mut series);
    Episode {
        format: FORMAT.to_owned(),
        name,
        source: "synthetic".to_owned(),
        cause: Some(cause),
        magnitude: Some(magnitude.as_str().to_owned()),
        target: TARGET.to_owned(),
        start_unix_s: START_UNIX_S,
        duration_s: CALM_S + FAULT_S,
        onset_offset_s: Some(CALM_S),
        notes: format!(
            "synthetic: {} min calm, then {} ({}) for {} min",
            CALM_S / 60.0,
            cause.as_str(),
            magnitude.as_str(),
            FAULT_S / 60.0
        ),
        series: BTreeMap::from([(TARGET.to_owned(), named(series))]),
    }
}

/// The link delay of [`network_delay`] episodes (s): +40 ms on the round trip, a canary TTFT
/// +40 ms on its kept-alive connection, under the 50 ms TTFT floor (issue 28).
pub const NETWORK_DELAY_40MS_S: f64 = 0.04;

/// The variants of `network-40ms-N` in [`corpus`]. Their names were chosen so that, in the
/// `network` group of [`super::eval::split`] (ordered by the FNV-1a of the names), they come
/// in adjacent pairs: every episode already in the corpus keeps its half and each pair puts
/// one in each half (`network-40ms-1`/`-2` sort between `network-strong-1` and
/// `live-network-delaylink-60ms-1`, `-3`/`-4` between `live-network-delaylink-80ms-1` and
/// `network-strong-2`).
pub const NETWORK_DELAY_VARIANTS: [u64; 4] = [1, 2, 3, 4];

/// A network episode of `delay_s` more round-trip time on a kept-alive connection (the delay
/// enters the canary's TTFT once), the server's own timings flat: `network-{ms}ms-{variant}`,
/// magnitude `"{ms}ms"`.
pub fn network_delay(delay_s: f64, variant: u64) -> Episode {
    let ms = (delay_s * 1e3).round();
    let name = format!("network-{ms:.0}ms-{variant}");
    let seed = 0x6e65_7464_656c ^ (ms as u64) << 8 ^ variant;
    let world_at = |t: f64| {
        let mut w = World::calm();
        w.ttft_round_trips = 1.0;
        if t >= CALM_S {
            let f = ((t - CALM_S) / 2.0).clamp(0.0, 1.0);
            w.srtt_s = lerp(w.srtt_s, w.srtt_s + delay_s, f);
        }
        w
    };
    let sources = Sources {
        server: true,
        gpu: true,
        net: true,
        router: false,
        pd: false,
    };
    let mut series = generate(seed, sources, &world_at, false);
    sort(&mut series);
    Episode {
        format: FORMAT.to_owned(),
        name,
        source: "synthetic".to_owned(),
        cause: Some(Cause::Network),
        magnitude: Some(format!("{ms:.0}ms")),
        target: TARGET.to_owned(),
        start_unix_s: START_UNIX_S,
        duration_s: CALM_S + FAULT_S,
        onset_offset_s: Some(CALM_S),
        notes: format!(
            "synthetic: {} min calm, then the round trip +{ms:.0} ms on a kept-alive connection (TTFT +{ms:.0} ms, under the 50 ms floor) for {} min",
            CALM_S / 60.0,
            FAULT_S / 60.0
        ),
        series: BTreeMap::from([(TARGET.to_owned(), named(series))]),
    }
}

/// One no-fault control episode.
pub fn control(kind: Control, variant: u64) -> Episode {
    let name = format!("control-{}-{}", kind.as_str(), variant);
    let seed = 0x636f_6e74 ^ (kind as u64) << 8 ^ variant;
    let total = CALM_S + FAULT_S;
    let world_at = move |t: f64| {
        let mut w = World::calm();
        if kind == Control::Drift {
            let k = 1.0 + 0.25 * t / total;
            w.request_rate *= k;
            w.prompt_rate *= k;
            w.generation_rate *= k;
            w.running *= k;
            w.kv *= k;
            w.decode_s *= 1.0 + 0.05 * t / total;
        }
        w
    };
    let sources = if kind == Control::CanaryOnly {
        Sources {
            server: false,
            gpu: false,
            net: false,
            router: false,
            pd: false,
        }
    } else {
        // The second of each kind is calm through a router.
        Sources {
            server: true,
            gpu: true,
            net: true,
            router: variant == 2,
            pd: variant == 1,
        }
    };
    let mut series = generate(seed, sources, &world_at, kind == Control::Outliers);
    sort(&mut series);
    Episode {
        format: FORMAT.to_owned(),
        name,
        source: "synthetic".to_owned(),
        cause: None,
        magnitude: None,
        target: TARGET.to_owned(),
        start_unix_s: START_UNIX_S,
        duration_s: total,
        onset_offset_s: None,
        notes: format!("synthetic control: {}, {} min", kind.as_str(), total / 60.0),
        series: BTreeMap::from([(TARGET.to_owned(), named(series))]),
    }
}

/// The synthetic corpus: every cause at both magnitudes, `per_magnitude` variants each, the
/// `network-40ms-N` episodes ([`network_delay`]), every
/// control kind `controls` times, `controls` calm busy servers ([`super::busy`]) and `4 ×
/// controls` heavier ones ([`super::busy::BusyConfig::heavy`]).
pub fn corpus(per_magnitude: u64, controls: u64) -> Vec<Episode> {
    let mut out = Vec::new();
    for cause in causes() {
        for m in [Magnitude::Mild, Magnitude::Strong] {
            for v in 1..=per_magnitude {
                out.push(fault(cause, m, v));
            }
        }
    }
    // A +40 ms round trip (issue 28: confirmed within 30 s).
    for v in NETWORK_DELAY_VARIANTS {
        out.push(network_delay(NETWORK_DELAY_40MS_S, v));
    }
    for kind in Control::ALL {
        for v in 1..=controls {
            out.push(control(kind, v));
        }
    }
    // A calm, busy server (issue 28): canaries queued behind ordinary traffic.
    let busy = super::busy::BusyConfig::default();
    for v in 1..=controls {
        out.push(super::busy::episode(&busy, v));
    }
    // Heavier busy servers: fewer slots held longer, queues of seconds (four shapes).
    for v in 1..=4 * controls {
        out.push(super::busy::heavy_episode(v));
    }
    out
}
