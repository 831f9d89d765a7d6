//! A calm, busy server as an episode: a vLLM-style server with a fixed number of batch slots
//! (FCFS, M/G/c), kept 40–60 % busy by background traffic with varied prompt and output lengths
//! (Poisson arrivals), and the agent's Poisson canaries (capped in flight, as the agent does)
//! queued with it. Nothing is injected: a canary now and then waits behind ordinary traffic
//! (a 10 ms TTFT becomes 0.5 s), which is the server's ordinary tail, never a page (issue 28,
//! item 0).
//!
//! The model is the queue itself, not what the engine reads: each request holds a slot for its
//! prefill and its decode; a request waits when every slot is held. The scrape (every
//! [`BusyConfig::scrape_s`]) reads the instantaneous queue and batch and the counters' rates
//! over its interval, as the agent's scraper does.

use std::collections::{BTreeMap, BinaryHeap};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal};

use super::episode::{Episode, FORMAT, START_UNIX_S, TARGET};
use crate::diagnosis::Signal;

/// The server and the traffic of a busy episode.
#[derive(Debug, Clone, Copy)]
pub struct BusyConfig {
    /// Concurrent sequences (vLLM's `max_num_seqs`).
    pub slots: usize,
    /// Background requests per second (Poisson).
    pub background_rps: f64,
    /// Median background prompt and output lengths, tokens (log-normal, σ 0.8).
    pub prompt_tokens: f64,
    pub output_tokens: f64,
    /// Canaries per second (Poisson) and at most this many in flight (the agent's default 4).
    pub canary_rps: f64,
    pub canary_max_in_flight: usize,
    /// Seconds between scrapes of `/metrics`.
    pub scrape_s: f64,
    /// Episode length, s.
    pub duration_s: f64,
}

impl Default for BusyConfig {
    /// 12 slots, 2 background requests/s of ~2.7 s each: about half busy; a canary waits
    /// behind the traffic now and then (0.3–1.3 s).
    fn default() -> Self {
        Self {
            slots: 12,
            background_rps: 2.0,
            prompt_tokens: 400.0,
            output_tokens: 150.0,
            canary_rps: 2.0,
            canary_max_in_flight: 4,
            scrape_s: 1.0,
            duration_s: 600.0,
        }
    }
}

impl BusyConfig {
    /// A heavier busy server (`variant` 1, 2, …, cycling through four shapes): fewer slots
    /// held longer (long answers, long prompts), more canaries, a slower scrape; each kept
    /// about half busy by its background rate. Its canaries queue for seconds, not
    /// milliseconds, and its queue is often non-empty: the ordinary tail the baseline must hold.
    pub fn heavy(variant: u64) -> Self {
        let base = Self::default();
        match variant % 4 {
            // 4 slots, long answers: a queue of several seconds now and then.
            1 => Self {
                slots: 4,
                background_rps: 0.33,
                prompt_tokens: 800.0,
                output_tokens: 300.0,
                ..base
            },
            // 8 slots, long prompts, 4 canaries/s.
            2 => Self {
                slots: 8,
                background_rps: 0.85,
                prompt_tokens: 1600.0,
                output_tokens: 200.0,
                canary_rps: 4.0,
                ..base
            },
            // 6 slots, very long answers, a 2 s scrape.
            3 => Self {
                slots: 6,
                background_rps: 0.3,
                prompt_tokens: 300.0,
                output_tokens: 500.0,
                scrape_s: 2.0,
                ..base
            },
            // 16 slots, 3 canaries/s.
            _ => Self {
                slots: 16,
                background_rps: 3.1,
                prompt_tokens: 500.0,
                output_tokens: 150.0,
                canary_rps: 3.0,
                ..base
            },
        }
    }
}

/// Prefill seconds per prompt token, decode seconds per output token at an empty batch, and
/// the decode slowdown per running sequence.
const PREFILL_S_PER_TOKEN: f64 = 1e-4;
const DECODE_S: f64 = 0.010;
const DECODE_PER_RUNNING: f64 = 0.03;
/// The client's own overhead on a canary's TTFT, s.
const CLIENT_S: f64 = 0.002;
/// Canary prompt and output tokens.
const CANARY_PROMPT: f64 = 100.0;
const CANARY_OUTPUT: f64 = 32.0;
/// KV capacity in tokens (the batch's tokens ÷ this is the usage).
const KV_TOKENS: f64 = 16_000.0;

/// One request through the slot model: its times (s from the episode's or server's start),
/// its lengths (tokens) and whether it is a canary.
#[derive(Debug, Clone, Copy)]
pub struct Req {
    pub arrive: f64,
    pub start: f64,
    pub first_token: f64,
    pub end: f64,
    pub prompt: f64,
    pub output: f64,
    pub canary: bool,
}

impl Req {
    /// Seconds between output tokens (the decode step while it ran).
    pub fn tpot_s(&self) -> f64 {
        (self.end - self.first_token) / (self.output - 1.0).max(1.0)
    }
}

/// A slot's free time in the min-heap (reversed order).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Free(f64);
impl Eq for Free {}
impl PartialOrd for Free {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Free {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.0.total_cmp(&self.0)
    }
}

/// The server of a busy episode as a queue: `slots` sequences at a time, FCFS; a request holds
/// its slot for its prefill ([`PREFILL_S_PER_TOKEN`] a prompt token) and its decode (10 ms a
/// token, 3 % slower per running sequence). Requests must be admitted in arrival order; the
/// whole schedule is known at admission. The synthetic controls replay it; the live calm run
/// (`tests/support/busy_server.rs`) serves it.
#[derive(Debug, Clone)]
pub struct SlotQueue {
    free: BinaryHeap<Free>,
}

impl SlotQueue {
    /// An idle server of `slots` slots (at least 1).
    pub fn new(slots: usize) -> Self {
        Self {
            free: (0..slots.max(1)).map(|_| Free(0.0)).collect(),
        }
    }

    /// Admits a request arriving at `arrive` (s) of `prompt` and `output` tokens; `jitter` in
    /// 0..1 varies its prefill by ±10 %. Returns its schedule.
    pub fn admit(
        &mut self,
        arrive: f64,
        prompt: f64,
        output: f64,
        jitter: f64,
        canary: bool,
    ) -> Req {
        let slot_free = self.free.pop().map_or(0.0, |f| f.0);
        let start = arrive.max(slot_free);
        let running = self.free.iter().filter(|f| f.0 > start).count() as f64 + 1.0;
        let prefill = prompt * PREFILL_S_PER_TOKEN * (0.9 + 0.2 * jitter);
        let tpot = DECODE_S * (1.0 + DECODE_PER_RUNNING * running);
        let first_token = start + prefill + tpot;
        let end = first_token + (output - 1.0) * tpot;
        self.free.push(Free(end));
        Req {
            arrive,
            start,
            first_token,
            end,
            prompt,
            output,
            canary,
        }
    }
}

/// The background traffic's arrival times of `cfg` from `rng` (s, Poisson at
/// `cfg.background_rps`, until `cfg.duration_s`).
fn background_times(cfg: &BusyConfig, rng: &mut StdRng) -> Vec<f64> {
    let bg = Exp::new(cfg.background_rps.max(1e-9)).unwrap_or_else(|_| unreachable!());
    let mut out = Vec::new();
    let mut t = bg.sample(rng);
    while t < cfg.duration_s {
        out.push(t);
        t += bg.sample(rng);
    }
    out
}

/// One background request's prompt and output tokens: log-normal (σ 0.8) around `cfg`'s
/// medians, clamped to 8..8192 and 4..2048.
fn background_lengths(cfg: &BusyConfig, rng: &mut StdRng) -> (f64, f64) {
    let len = LogNormal::new(0.0, 0.8).unwrap_or_else(|_| unreachable!());
    (
        (cfg.prompt_tokens * len.sample(rng)).clamp(8.0, 8192.0),
        (cfg.output_tokens * len.sample(rng)).clamp(4.0, 2048.0),
    )
}

/// The background traffic of `cfg` for a live server (`tests/support/busy_server.rs`):
/// (arrival s, prompt tokens, output tokens) in arrival order, reproducible from `seed`.
pub fn background_requests(cfg: &BusyConfig, seed: u64) -> Vec<(f64, f64, f64)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let times = background_times(cfg, &mut rng);
    times
        .into_iter()
        .map(|t| {
            let (p, o) = background_lengths(cfg, &mut rng);
            (t, p, o)
        })
        .collect()
}

/// The requests of one episode, FCFS over `slots` slots; canaries beyond the cap in flight are
/// skipped (returned as their arrival times).
fn simulate(cfg: &BusyConfig, seed: u64) -> (Vec<Req>, Vec<f64>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let can = Exp::new(cfg.canary_rps.max(1e-9)).unwrap_or_else(|_| unreachable!());
    // Arrivals of both streams, in time order.
    let mut arrivals: Vec<(f64, bool)> = background_times(cfg, &mut rng)
        .into_iter()
        .map(|t| (t, false))
        .collect();
    let mut t = can.sample(&mut rng);
    while t < cfg.duration_s {
        arrivals.push((t, true));
        t += can.sample(&mut rng);
    }
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut queue = SlotQueue::new(cfg.slots);
    let mut reqs: Vec<Req> = Vec::with_capacity(arrivals.len());
    let mut skipped = Vec::new();
    for (arrive, canary) in arrivals {
        if canary {
            let in_flight = reqs
                .iter()
                .rev()
                .take(64)
                .filter(|r| r.canary && r.end > arrive)
                .count();
            if in_flight >= cfg.canary_max_in_flight {
                skipped.push(arrive);
                continue;
            }
        }
        let (prompt, output) = if canary {
            (CANARY_PROMPT, CANARY_OUTPUT)
        } else {
            background_lengths(cfg, &mut rng)
        };
        reqs.push(queue.admit(arrive, prompt, output, rng.random::<f64>(), canary));
    }
    (reqs, skipped)
}

/// The server's gauges at `t` (s): requests waiting, requests running, and the KV cache's
/// usage (0..1: the running requests' prompt and generated tokens ÷ its capacity), as a scrape
/// of vLLM's `num_requests_waiting`, `num_requests_running` and `kv_cache_usage_perc` reads them.
pub fn gauges(reqs: &[Req], t: f64) -> (usize, usize, f64) {
    let waiting = reqs.iter().filter(|r| r.arrive <= t && t < r.start).count();
    let running: Vec<&Req> = reqs.iter().filter(|r| r.start <= t && t < r.end).collect();
    let kv: f64 = running
        .iter()
        .map(|r| r.prompt + r.output * ((t - r.start) / (r.end - r.start)).clamp(0.0, 1.0))
        .sum::<f64>()
        / KV_TOKENS;
    (waiting, running.len(), kv.min(1.0))
}

/// A no-fault control episode of a busy server (`control-busy-<variant>`): canary TTFT, TPOT,
/// E2E and errors per canary, the kernel RTT per canary, the GPU once a second (flat), and the
/// server's queue, batch, KV usage, counter rates and mean queue / prefill time per scrape.
pub fn episode(cfg: &BusyConfig, variant: u64) -> Episode {
    episode_named(cfg, variant, &format!("control-busy-{variant}"))
}

/// A heavier busy control ([`BusyConfig::heavy`]), `control-busy-heavy-<variant>`.
pub fn heavy_episode(variant: u64) -> Episode {
    episode_named(
        &BusyConfig::heavy(variant),
        0x6865_6176 ^ variant,
        &format!("control-busy-heavy-{variant}"),
    )
}

fn episode_named(cfg: &BusyConfig, variant: u64, name: &str) -> Episode {
    let (reqs, _skipped) = simulate(cfg, 0x6275_7379 ^ variant);
    let mut s: BTreeMap<Signal, Vec<[f64; 2]>> = BTreeMap::new();
    let mut push = |sig: Signal, t: f64, v: f64| {
        let t = (t * 1000.0).round() / 1000.0;
        s.entry(sig).or_default().push([t, v]);
    };
    for r in reqs.iter().filter(|r| r.canary) {
        let ttft = r.first_token - r.arrive + CLIENT_S;
        let tpot = r.tpot_s();
        // A canary's samples are recorded when it ends (the agent's record).
        push(Signal::Error, r.end, 0.0);
        push(Signal::Error5xx, r.end, 0.0);
        push(Signal::Ttft, r.end, ttft);
        push(Signal::Tpot, r.end, tpot);
        push(Signal::E2e, r.end, r.end - r.arrive + CLIENT_S);
        push(Signal::InputTokens, r.end, r.prompt);
        push(Signal::NetSrtt, r.end, 0.0003);
    }
    let mut t = 0.5;
    while t < cfg.duration_s {
        push(Signal::GpuSmClock, t, 1.98e9);
        push(Signal::GpuThrottle, t, 0.0);
        push(Signal::GpuMemoryUtilization, t, 0.9);
        push(Signal::GpuForeignProcesses, t, 0.0);
        push(Signal::GpuFault, t, 0.0);
        t += 1.0;
    }
    let mut t = cfg.scrape_s;
    while t < cfg.duration_s {
        let from = t - cfg.scrape_s;
        let (waiting, running, kv) = gauges(&reqs, t);
        let started: Vec<&Req> = reqs
            .iter()
            .filter(|r| from <= r.start && r.start < t)
            .collect();
        let finished = reqs.iter().filter(|r| from <= r.end && r.end < t).count();
        // Generated tokens in the interval: each running request's share of its decode.
        let generated: f64 = reqs
            .iter()
            .filter(|r| r.first_token < t && r.end > from)
            .map(|r| {
                let span = (r.end - r.first_token).max(1e-9);
                let overlap = r.end.min(t) - r.first_token.max(from);
                (r.output - 1.0) * (overlap / span).clamp(0.0, 1.0)
            })
            .sum();
        push(Signal::ServerRequestsWaiting, t, waiting as f64);
        push(Signal::ServerRequestsRunning, t, running as f64);
        push(Signal::ServerKvUsage, t, kv);
        push(Signal::ServerPreemptions, t, 0.0);
        push(Signal::ServerRequestRate, t, finished as f64 / cfg.scrape_s);
        push(
            Signal::ServerPromptTokensRate,
            t,
            started.iter().map(|r| r.prompt).sum::<f64>() / cfg.scrape_s,
        );
        push(
            Signal::ServerGenerationTokensRate,
            t,
            generated / cfg.scrape_s,
        );
        if !started.is_empty() {
            let n = started.len() as f64;
            let queue = started.iter().map(|r| r.start - r.arrive).sum::<f64>() / n;
            let prefill = started.iter().map(|r| r.first_token - r.start).sum::<f64>() / n;
            push(Signal::ServerQueueTime, t, queue);
            push(Signal::ServerPrefillTime, t, prefill);
            push(Signal::ServerTtft, t, queue + prefill);
        }
        push(Signal::ServerChange, t, 0.0);
        t += cfg.scrape_s;
    }
    for v in s.values_mut() {
        v.sort_by(|a, b| a[0].total_cmp(&b[0]));
    }
    let series = s
        .into_iter()
        .map(|(k, v)| (k.as_str().to_owned(), v))
        .collect();
    Episode {
        format: FORMAT.to_owned(),
        name: name.to_owned(),
        source: "synthetic".to_owned(),
        cause: None,
        magnitude: None,
        target: TARGET.to_owned(),
        start_unix_s: START_UNIX_S,
        duration_s: cfg.duration_s,
        onset_offset_s: None,
        notes: format!(
            "synthetic control: a {}-slot server kept busy by {} background requests/s, {} Poisson canaries/s (≤ {} in flight), scraped every {} s",
            cfg.slots, cfg.background_rps, cfg.canary_rps, cfg.canary_max_in_flight, cfg.scrape_s
        ),
        series: BTreeMap::from([(TARGET.to_owned(), series)]),
    }
}

/// The share of the slots held over the episode (the server's busy share) and the share of
/// canaries skipped at the cap: the scenario's own figures.
pub fn busy_share(cfg: &BusyConfig, variant: u64) -> (f64, f64) {
    let (reqs, skipped) = simulate(cfg, 0x6275_7379 ^ variant);
    let held: f64 = reqs
        .iter()
        .map(|r| r.end.min(cfg.duration_s) - r.start.min(cfg.duration_s))
        .sum();
    let canaries = reqs.iter().filter(|r| r.canary).count() + skipped.len();
    (
        held / (cfg.slots as f64 * cfg.duration_s),
        skipped.len() as f64 / canaries.max(1) as f64,
    )
}
