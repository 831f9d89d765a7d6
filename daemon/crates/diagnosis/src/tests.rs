//! Synthetic episodes, one per cause: 10 min calm, then the fault at `ONSET` for 2 min. The
//! engine is evaluated every second like the agent does; each test asserts the confirmed cause,
//! how fast, and the evidence values.

use std::time::{Duration, SystemTime};

use super::report::{Cause, State, TargetDiagnosis};
use super::{Engine, EngineConfig, Signal};

const T0: u64 = 1_700_000_000;
/// Seconds from T0 to the fault.
const ONSET: u64 = 600;

fn at(s: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(T0 as f64 + s)
}

/// A canary-only target (no server `/metrics`: 4 canaries a second, TTFT and TPOT with a
/// ±10 % wobble), 600 s calm then the fault, evaluated every second; `per_second(engine,
/// second, at, params)` adds the node and server signals of that second (`params`: the calm's
/// or the fault's). The first confirmed diagnosis with its second from the fault, else the
/// last. The contention checks' harness (`pressure.rs`, `cpu_wait.rs`).
pub(crate) fn canary_episode<P: Copy>(
    calm: (f64, f64, P),
    fault: (f64, f64, P),
    per_second: impl Fn(&mut Engine, u32, &dyn Fn(f64) -> SystemTime, P),
) -> (u32, TargetDiagnosis) {
    let mut e = Engine::new(EngineConfig::default());
    let mut last = None;
    for s in 0..720_u32 {
        let (ttft, tpot, params) = if s < 600 { calm } else { fault };
        for q in 0..4 {
            let wobble = 1.0 + 0.1 * (f64::from((s * 4 + q) % 7) - 3.0) / 3.0;
            let t = f64::from(s) + f64::from(q) / 4.0;
            e.observe("t", Signal::Ttft, at(t), ttft * wobble);
            e.observe("t", Signal::Tpot, at(t), tpot * wobble);
            e.observe("t", Signal::E2e, at(t), (ttft + 19.0 * tpot) * wobble);
            e.observe("t", Signal::Error, at(t), 0.0);
        }
        per_second(&mut e, s, &at, params);
        let d = e.evaluate(at(f64::from(s) + 1.0));
        let t = d.targets[0].clone();
        if t.state == State::RootConfirmed {
            return (s.saturating_sub(600), t);
        }
        last = Some((s.saturating_sub(600), t));
    }
    last.unwrap()
}

/// xorshift64*, uniform in [0, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    /// `v` ± `rel` × v, uniform.
    fn jitter(&mut self, v: f64, rel: f64) -> f64 {
        v * (1.0 + rel * (2.0 * self.next() - 1.0))
    }
}

/// What one episode's world looks like at second `s` (`fault`: the fault is on).
#[derive(Debug, Clone, Copy)]
struct World {
    ttft: f64,
    tpot: f64,
    error: f64,
    input_tokens: f64,
    /// Server signals present (a vLLM-style `/metrics`).
    server: bool,
    waiting: f64,
    running: f64,
    request_rate: f64,
    prompt_rate: f64,
    queue_time: f64,
    prefill_time: f64,
    server_ttft: f64,
    kv: f64,
    preemptions: f64,
    sm_clock: f64,
    throttle: f64,
    gpu_mem: f64,
    foreign: f64,
    srtt: f64,
    /// Client − server TTFT per canary, where the server times each one (per-request metrics).
    gap: Option<f64>,
}

impl World {
    fn calm(server: bool) -> Self {
        World {
            ttft: 0.1,
            tpot: 0.02,
            error: 0.0,
            input_tokens: 200.0,
            server,
            waiting: 0.0,
            running: 1.0,
            request_rate: 2.0,
            prompt_rate: 400.0,
            queue_time: 0.005,
            prefill_time: 0.05,
            server_ttft: 0.08,
            kv: 0.3,
            preemptions: 0.0,
            sm_clock: 1.98e9,
            throttle: 0.0,
            gpu_mem: 0.7,
            foreign: 0.0,
            srtt: 0.0002,
            gap: None,
        }
    }
}

/// Runs an episode: canaries at 2/s, GPU and server samples at 1/s, network per canary;
/// evaluates every second until `end`. Returns the first root_confirmed diagnosis (with its
/// time from onset) and every state seen.
fn episode(
    server: bool,
    end: u64,
    fault: impl Fn(&mut World),
    events: &[(f64, Signal)],
) -> (Option<(f64, TargetDiagnosis)>, Vec<State>) {
    episode_from(World::calm(server), end, fault, events)
}

/// [`episode`] from a calm world of the caller's.
fn episode_from(
    calm: World,
    end: u64,
    fault: impl Fn(&mut World),
    events: &[(f64, Signal)],
) -> (Option<(f64, TargetDiagnosis)>, Vec<State>) {
    let mut e = Engine::new(EngineConfig::default());
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut first = None;
    let mut states = Vec::new();
    for s in 0..end {
        let mut w = calm;
        if s >= ONSET {
            fault(&mut w);
        }
        for half in [0.0, 0.5] {
            let t = s as f64 + half;
            let failed = rng.next() < w.error;
            e.observe("t", Signal::Error, at(t), f64::from(u8::from(failed)));
            if failed {
                e.observe("t", Signal::Error5xx, at(t), 1.0);
                continue;
            }
            e.observe("t", Signal::Error5xx, at(t), 0.0);
            let ttft = rng.jitter(w.ttft, 0.2);
            let tpot = rng.jitter(w.tpot, 0.1);
            e.observe("t", Signal::Ttft, at(t), ttft);
            e.observe("t", Signal::Tpot, at(t), tpot);
            e.observe("t", Signal::E2e, at(t), ttft + 15.0 * tpot);
            e.observe(
                "t",
                Signal::InputTokens,
                at(t),
                rng.jitter(w.input_tokens, 0.1).round(),
            );
            e.observe("t", Signal::NetSrtt, at(t), rng.jitter(w.srtt, 0.3));
            if let Some(gap) = w.gap {
                e.observe(
                    "t",
                    Signal::ClientServerTtftGap,
                    at(t),
                    rng.jitter(gap, 0.2),
                );
                e.set_source(
                    "t",
                    Signal::ClientServerTtftGap,
                    "vllm_metrics (per request)",
                );
            }
        }
        let t = s as f64 + 0.25;
        e.observe("t", Signal::GpuSmClock, at(t), rng.jitter(w.sm_clock, 0.01));
        e.observe("t", Signal::GpuThrottle, at(t), w.throttle);
        e.observe("t", Signal::GpuMemoryUtilization, at(t), w.gpu_mem);
        e.observe("t", Signal::GpuForeignProcesses, at(t), w.foreign);
        e.observe("t", Signal::GpuFault, at(t), 0.0);
        if w.server {
            e.observe(
                "t",
                Signal::ServerRequestsWaiting,
                at(t),
                (rng.jitter(w.waiting.max(0.01), 0.3)).round(),
            );
            e.observe(
                "t",
                Signal::ServerRequestsRunning,
                at(t),
                rng.jitter(w.running, 0.1).round(),
            );
            e.observe(
                "t",
                Signal::ServerRequestRate,
                at(t),
                rng.jitter(w.request_rate, 0.2),
            );
            e.observe(
                "t",
                Signal::ServerPromptTokensRate,
                at(t),
                rng.jitter(w.prompt_rate, 0.2),
            );
            e.observe(
                "t",
                Signal::ServerQueueTime,
                at(t),
                rng.jitter(w.queue_time, 0.2),
            );
            e.observe(
                "t",
                Signal::ServerPrefillTime,
                at(t),
                rng.jitter(w.prefill_time, 0.1),
            );
            e.observe(
                "t",
                Signal::ServerTtft,
                at(t),
                rng.jitter(w.server_ttft, 0.1),
            );
            e.observe("t", Signal::ServerKvUsage, at(t), rng.jitter(w.kv, 0.05));
            e.observe("t", Signal::ServerPreemptions, at(t), w.preemptions);
        }
        for &(when, signal) in events {
            if (when - s as f64).abs() < 0.5 {
                e.observe("t", signal, at(when), 1.0);
            }
        }
        let d = e.evaluate(at(s as f64 + 1.0));
        let td = d.targets.into_iter().next().expect("one target");
        if states.last() != Some(&td.state) {
            states.push(td.state);
        }
        if first.is_none() && td.state == State::RootConfirmed {
            first = Some((s as f64 + 1.0 - ONSET as f64, td));
        }
    }
    (first, states)
}

/// Runs a fault episode and checks the top cause and the time to it (≤ 60 s from onset).
fn confirmed(
    server: bool,
    fault: impl Fn(&mut World),
    events: &[(f64, Signal)],
    cause: Cause,
) -> TargetDiagnosis {
    confirmed_from(World::calm(server), fault, events, cause)
}

/// [`confirmed`] from a calm world of the caller's.
fn confirmed_from(
    calm: World,
    fault: impl Fn(&mut World),
    events: &[(f64, Signal)],
    cause: Cause,
) -> TargetDiagnosis {
    let (first, states) = episode_from(calm, ONSET + 120, fault, events);
    let (after, d) = first.unwrap_or_else(|| panic!("never confirmed; states {states:?}"));
    assert_eq!(d.causes[0].cause, cause, "after {after} s: {:#?}", d.causes);
    assert!(
        (0.0..=60.0).contains(&after),
        "confirmed {after} s after the onset"
    );
    assert!(d.causes[0].score >= 0.75, "{:?}", d.causes[0]);
    // An early warning may come before the symptom (a hard rule holds at once): the symptom's
    // states follow it in order.
    let symptom_states: Vec<State> = states
        .iter()
        .copied()
        .filter(|s| *s != State::Warning)
        .collect();
    assert_eq!(
        symptom_states[..3],
        [State::Idle, State::Triggered, State::Propagating],
        "{states:?}"
    );
    let onset = d.onset_unix_s.expect("onset");
    assert!(
        (onset - (T0 + ONSET) as f64).abs() <= 12.0,
        "onset {} s off",
        onset - (T0 + ONSET) as f64
    );
    d
}

fn ev(d: &TargetDiagnosis, cause: Cause, signal: Signal) -> &super::Evidence {
    let c = d
        .causes
        .iter()
        .find(|c| c.cause == cause)
        .unwrap_or_else(|| panic!("{cause:?} not ranked: {:#?}", d.causes));
    c.evidence
        .iter()
        .find(|e| e.signal == signal)
        .unwrap_or_else(|| panic!("{signal:?} not in {:#?}", c.evidence))
}

#[test]
fn calm_30_minutes_yield_no_diagnosis() {
    for server in [false, true] {
        let (first, states) = episode(server, 1800, |_| {}, &[]);
        assert!(first.is_none());
        assert_eq!(states, [State::Idle], "server signals: {server}");
    }
}

#[test]
fn load_surge_ranks_above_the_queue_it_causes() {
    let d = confirmed(
        true,
        |w| {
            w.request_rate = 12.0;
            w.prompt_rate = 2400.0;
            w.running = 8.0;
            w.waiting = 20.0;
            w.queue_time = 0.6;
            w.ttft = 0.8;
            w.tpot = 0.05;
            w.kv = 0.6;
        },
        &[],
        Cause::LoadSurge,
    );
    let rate = ev(&d, Cause::LoadSurge, Signal::ServerRequestRate);
    assert!(
        (rate.before - 2.0).abs() < 0.3 && (rate.after - 12.0).abs() < 1.5,
        "{rate:?}"
    );
    // The queue is evidence of the parent, and the child ranks below it.
    let waiting = ev(&d, Cause::LoadSurge, Signal::ServerRequestsWaiting);
    assert!(
        waiting.before <= 1.0 && waiting.after >= 15.0,
        "{waiting:?}"
    );
    let q = d
        .causes
        .iter()
        .position(|c| c.cause == Cause::ServerQueueing)
        .expect("queueing ranked");
    assert!(q > 0 && d.causes[q].score < d.causes[0].score);
    let line = d.summary.clone().unwrap_or_default();
    assert!(
        line.starts_with("load_surge ")
            && line.contains("server requests/s")
            && line.contains("TTFT p99")
            && line.contains("GPU, network, errors flat"),
        "{line}"
    );
    let dec = d.ttft_decomposition.expect("decomposition");
    assert!(
        dec.extra_s > 0.5 && dec.server_queue_s.unwrap() > 0.5,
        "{dec:?}"
    );
}

#[test]
fn server_queueing_without_load() {
    let d = confirmed(
        true,
        |w| {
            w.waiting = 15.0;
            w.queue_time = 0.5;
            w.ttft = 0.6;
        },
        &[],
        Cause::ServerQueueing,
    );
    let q = ev(&d, Cause::ServerQueueing, Signal::ServerQueueTime);
    assert!(q.before < 0.01 && q.after > 0.4, "{q:?}");
    assert!(
        !d.causes
            .iter()
            .any(|c| c.cause == Cause::LoadSurge && c.score >= 0.5),
        "{:#?}",
        d.causes
    );
}

#[test]
fn kv_cache_pressure_by_usage_and_preemptions() {
    let d = confirmed(
        true,
        |w| {
            w.kv = 0.98;
            w.preemptions = 2.0;
            w.tpot = 0.06;
        },
        &[],
        Cause::KvCachePressure,
    );
    let kv = ev(&d, Cause::KvCachePressure, Signal::ServerKvUsage);
    assert!(
        kv.peak >= 0.95 && kv.rule.as_deref().is_some_and(|r| r.contains("≥ 0.95")),
        "{kv:?}"
    );
    assert!(
        ev(&d, Cause::KvCachePressure, Signal::ServerPreemptions)
            .rule
            .is_some()
    );
}

#[test]
fn long_prompts_by_input_tokens() {
    let d = confirmed(
        true,
        |w| {
            w.input_tokens = 3000.0;
            w.prefill_time = 0.6;
            w.ttft = 0.7;
        },
        &[],
        Cause::LongPrompts,
    );
    let tokens = ev(&d, Cause::LongPrompts, Signal::InputTokens);
    assert!(
        (tokens.before - 200.0).abs() < 30.0 && (tokens.after - 3000.0).abs() < 300.0,
        "{tokens:?}"
    );
    let dec = d.ttft_decomposition.expect("decomposition");
    assert!(dec.server_prefill_s.unwrap() > 0.45, "{dec:?}");
}

#[test]
fn gpu_throttling_by_clock_and_reasons() {
    let d = confirmed(
        false,
        |w| {
            w.sm_clock = 1.1e9;
            w.throttle = 1.0;
            w.tpot = 0.045;
        },
        &[],
        Cause::GpuThrottling,
    );
    let clock = ev(&d, Cause::GpuThrottling, Signal::GpuSmClock);
    assert!(clock.before > 1.9e9 && clock.after < 1.2e9, "{clock:?}");
    assert!(d.summary.unwrap().contains("network, errors flat"));
}

#[test]
fn gpu_memory_pressure_by_a_foreign_process() {
    let d = confirmed(
        false,
        |w| {
            w.gpu_mem = 0.97;
            w.foreign = 1.0;
            w.tpot = 0.04;
            w.ttft = 0.3;
        },
        &[],
        Cause::GpuMemoryPressure,
    );
    assert!(
        ev(&d, Cause::GpuMemoryPressure, Signal::GpuForeignProcesses)
            .rule
            .is_some()
    );
}

#[test]
fn gpu_fault_by_an_xid_event() {
    let d = confirmed(
        false,
        |w| {
            w.ttft = 0.5;
        },
        &[((ONSET + 2) as f64, Signal::GpuFault)],
        Cause::GpuFault,
    );
    assert!(ev(&d, Cause::GpuFault, Signal::GpuFault).rule.is_some());
}

#[test]
fn network_by_kernel_rtt_with_server_flat() {
    let d = confirmed(
        true,
        |w| {
            w.srtt = 0.05;
            w.ttft = 0.25;
        },
        &[],
        Cause::Network,
    );
    let rtt = ev(&d, Cause::Network, Signal::NetSrtt);
    assert!(
        rtt.before < 0.001 && rtt.after > 0.04 && rtt.rule.is_some(),
        "{rtt:?}"
    );
    let dec = d.ttft_decomposition.expect("decomposition");
    assert!(dec.network_s.unwrap() > 0.04, "{dec:?}");
}

/// The server times each canary: a path that slows (a router, a proxy, the kernel RTT
/// unseen) grows the client − server gap while the server's TTFT holds, so `network` is named
/// from the gap, its source said, and the TTFT split puts the extra time on the path.
#[test]
fn network_by_the_client_server_gap_with_the_server_flat() {
    let calm = World {
        gap: Some(0.003),
        ..World::calm(true)
    };
    let d = confirmed_from(
        calm,
        |w| {
            w.gap = Some(0.153);
            w.ttft = 0.25;
        },
        &[],
        Cause::Network,
    );
    let gap = ev(&d, Cause::Network, Signal::ClientServerTtftGap);
    assert!(gap.before < 0.01 && gap.after > 0.12, "{gap:?}");
    assert_eq!(gap.source.as_deref(), Some("vllm_metrics (per request)"));
    let dec = d.ttft_decomposition.expect("decomposition");
    assert!(dec.network_s.unwrap() > 0.12, "{dec:?}");
}

/// The same gap with a queue that grew is the queue's (llama.cpp times no wait for a slot):
/// the gap is no evidence of `network`.
#[test]
fn a_gap_that_grows_with_the_queue_is_not_the_network() {
    let calm = World {
        gap: Some(0.003),
        ..World::calm(true)
    };
    let (first, states) = episode_from(
        calm,
        ONSET + 120,
        |w| {
            w.gap = Some(0.153);
            w.ttft = 0.25;
            w.waiting = 6.0;
        },
        &[],
    );
    let (_, d) = first.unwrap_or_else(|| panic!("never confirmed; states {states:?}"));
    assert_ne!(d.causes[0].cause, Cause::Network, "{:#?}", d.causes);
    let network_gap = d
        .causes
        .iter()
        .filter(|c| c.cause == Cause::Network)
        .flat_map(|c| &c.evidence)
        .any(|e| e.signal == Signal::ClientServerTtftGap);
    assert!(!network_gap, "{:#?}", d.causes);
}

#[test]
fn error_burst_by_5xx() {
    let d = confirmed(false, |w| w.error = 0.3, &[], Cause::ErrorBurst);
    assert_eq!(d.symptom.as_ref().map(|s| s.signal), Some(Signal::Error));
    let e = ev(&d, Cause::ErrorBurst, Signal::Error);
    assert!(e.after > 0.2 && e.rule.is_some(), "{e:?}");
}

#[test]
fn a_mild_error_burst_is_a_ratio_not_a_median() {
    // 12 % of canaries fail: fewer than half the seconds hold an error, so a median of the
    // seconds reads 0 ("errors flat", `unknown`); the mean is the burst's ratio.
    let d = confirmed(false, |w| w.error = 0.12, &[], Cause::ErrorBurst);
    let e = ev(&d, Cause::ErrorBurst, Signal::Error);
    assert!((0.04..=0.3).contains(&e.after), "{e:?}");
    assert!(
        e.before < 0.01 && e.peak >= e.after && e.rule.is_some(),
        "{e:?}"
    );
    let x = ev(&d, Cause::ErrorBurst, Signal::Error5xx);
    assert!((0.04..=0.3).contains(&x.after), "{x:?}");
    let line = d.summary.expect("summary");
    assert!(
        line.starts_with("error_burst") && !line.contains("errors flat"),
        "{line}"
    );
}

#[test]
fn server_change_before_the_onset() {
    let d = confirmed(
        true,
        |w| w.ttft = 0.4,
        &[((ONSET - 60) as f64, Signal::ServerChange)],
        Cause::ServerChange,
    );
    assert!(
        ev(&d, Cause::ServerChange, Signal::ServerChange)
            .rule
            .as_deref()
            .is_some_and(|r| r.contains("15 min"))
    );
}

#[test]
fn canary_only_overload_reads_load_surge() {
    // llama.cpp without server signals: TTFT and TPOT both rose, hardware flat.
    let d = confirmed(
        false,
        |w| {
            w.ttft = 2.0;
            w.tpot = 0.05;
        },
        &[],
        Cause::LoadSurge,
    );
    assert_eq!(d.causes[0].evidence[0].signal, Signal::Ttft);
}

#[test]
fn nothing_explains_it_says_unknown() {
    let d = confirmed(false, |w| w.ttft = 0.5, &[], Cause::Unknown);
    assert!(d.causes[0].evidence.is_empty());
}

#[test]
fn back_to_idle_after_the_fault_clears() {
    // A 60 s fault, then calm: back to idle.
    let mut e = Engine::new(EngineConfig::default());
    let mut last = State::Idle;
    let mut seen = Vec::new();
    for s in 0..(ONSET + 300) {
        let bad = (ONSET..ONSET + 60).contains(&s);
        for half in [0.0, 0.5] {
            let t = s as f64 + half;
            e.observe(
                "t",
                Signal::Ttft,
                at(t),
                if bad { 2.0 } else { 0.1 + 0.01 * half },
            );
            e.observe("t", Signal::Tpot, at(t), if bad { 0.05 } else { 0.02 });
        }
        last = e.evaluate(at(s as f64 + 1.0)).targets[0].state;
        if seen.last() != Some(&last) {
            seen.push(last);
        }
    }
    assert_eq!(last, State::Idle, "{seen:?}");
    assert!(seen.contains(&State::RootConfirmed), "{seen:?}");
    assert!(e.heap_bytes() < 64 * 1024, "{}", e.heap_bytes());
}

#[test]
fn diagnosis_json_round_trips_with_stable_names() {
    let d = confirmed(false, |w| w.error = 0.3, &[], Cause::ErrorBurst);
    let doc = super::Diagnosis {
        schema_version: super::report::SCHEMA_VERSION,
        evaluated_at_unix_s: 1.0,
        targets: vec![d],
        nodes: Vec::new(),
    };
    let v = serde_json::to_value(&doc).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["targets"][0]["state"], "root_confirmed");
    assert_eq!(v["targets"][0]["causes"][0]["cause"], "error_burst");
    assert_eq!(
        v["targets"][0]["causes"][0]["evidence"][0]["signal"],
        "error"
    );
    let back: super::Diagnosis = serde_json::from_value(v).unwrap();
    assert_eq!(back, doc);
}

#[test]
fn a_lone_outlier_before_the_fault_does_not_move_the_onset() {
    let mut e = Engine::new(EngineConfig::default());
    let mut onset = None;
    for s in 0..(ONSET + 90) {
        for half in [0.0, 0.5] {
            let t = s as f64 + half;
            // One slow canary 40 s before the fault (a GC pause on the client's machine).
            let ttft = if s >= ONSET {
                2.0
            } else if s == ONSET - 40 && half == 0.0 {
                0.6
            } else {
                0.1 + 0.01 * half
            };
            e.observe("t", Signal::Ttft, at(t), ttft);
            e.observe(
                "t",
                Signal::Tpot,
                at(t),
                if s >= ONSET { 0.05 } else { 0.02 },
            );
        }
        let d = e.evaluate(at(s as f64 + 1.0));
        if onset.is_none() {
            onset = d.targets[0].onset_unix_s;
        }
    }
    let off = onset.expect("onset") - (T0 + ONSET) as f64;
    assert!((-2.0..=3.0).contains(&off), "onset {off} s off");
}

#[test]
fn heavy_tail_calm_series_yields_no_diagnosis() {
    // A calm server where 1 canary in 40 takes 5 × the TTFT, 1 canary a second for 30 min:
    // a nearest-rank p99 of a 10 s bucket is its maximum, so a lone outlier carried buckets
    // and two of three recent buckets paged. Nothing may leave idle.
    let mut e = Engine::new(EngineConfig::default());
    let mut rng = Rng(0x5151_7A7A_0101_2323);
    let mut states = vec![State::Idle];
    for s in 0..1800u64 {
        let t = s as f64 + 0.3;
        let mut ttft = rng.jitter(0.1, 0.3);
        if rng.next() < 1.0 / 40.0 {
            ttft *= 5.0;
        }
        let tpot = rng.jitter(0.02, 0.2);
        e.observe("t", Signal::Error, at(t), 0.0);
        e.observe("t", Signal::Ttft, at(t), ttft);
        e.observe("t", Signal::Tpot, at(t), tpot);
        e.observe("t", Signal::E2e, at(t), ttft + 15.0 * tpot);
        let d = e.evaluate(at(s as f64 + 1.0));
        let st = d.targets[0].state;
        if states.last() != Some(&st) {
            states.push(st);
        }
    }
    assert_eq!(states, [State::Idle]);
}

#[test]
fn a_real_spike_with_heavy_tail_noise_still_pages_within_a_minute() {
    // The same heavy tail, then every request 4 × slower (and TPOT 2 ×): confirmed ≤ 60 s.
    let mut e = Engine::new(EngineConfig::default());
    let mut rng = Rng(0x0BAD_5EED_1234_5678);
    let mut confirmed_after = None;
    for s in 0..(ONSET + 120) {
        let k = if s >= ONSET { 4.0 } else { 1.0 };
        let t = s as f64 + 0.3;
        let mut ttft = k * rng.jitter(0.1, 0.3);
        if rng.next() < 1.0 / 40.0 {
            ttft *= 5.0;
        }
        let tpot = rng.jitter(0.02, 0.2) * if s >= ONSET { 2.0 } else { 1.0 };
        e.observe("t", Signal::Error, at(t), 0.0);
        e.observe("t", Signal::Ttft, at(t), ttft);
        e.observe("t", Signal::Tpot, at(t), tpot);
        e.observe("t", Signal::E2e, at(t), ttft + 15.0 * tpot);
        let d = e.evaluate(at(s as f64 + 1.0));
        if confirmed_after.is_none() && d.targets[0].state == State::RootConfirmed {
            assert_eq!(d.targets[0].causes[0].cause, Cause::LoadSurge, "{d:#?}");
            confirmed_after = Some(s + 1 - ONSET);
        }
    }
    let after = confirmed_after.expect("confirmed");
    assert!(after <= 60, "confirmed {after} s after the onset");
}

/// Canary-only: TTFT ×4 and TPOT ×2 from `ONSET`, 1 canary a second; the first confirmed
/// diagnosis under `cfg` (seconds after the onset, the top cause and its score).
fn canary_overload(cfg: EngineConfig) -> Option<(u64, Cause, f64)> {
    let mut e = Engine::new(cfg);
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    for s in 0..(ONSET + 120) {
        let (k, m) = if s >= ONSET { (4.0, 2.0) } else { (1.0, 1.0) };
        let t = s as f64 + 0.3;
        let ttft = k * rng.jitter(0.1, 0.3);
        let tpot = m * rng.jitter(0.02, 0.2);
        e.observe("t", Signal::Error, at(t), 0.0);
        e.observe("t", Signal::Ttft, at(t), ttft);
        e.observe("t", Signal::Tpot, at(t), tpot);
        e.observe("t", Signal::E2e, at(t), ttft + 15.0 * tpot);
        let d = e.evaluate(at(s as f64 + 1.0));
        let td = &d.targets[0];
        if td.state == State::RootConfirmed {
            return Some((s + 1 - ONSET, td.causes[0].cause, td.causes[0].score));
        }
    }
    None
}

#[test]
fn an_unambiguous_cause_below_the_confirm_score_confirms() {
    // The absolute threshold out of reach: only the margin rule can confirm.
    let margin_only = EngineConfig {
        confirm_score: 1.01,
        ..EngineConfig::default()
    };
    let (after, cause, score) = canary_overload(margin_only).expect("confirmed by its margin");
    assert_eq!(cause, Cause::LoadSurge);
    assert!(after <= 60 && score >= 0.6, "{after} s, {score}");
    // Neither rule reachable: never confirmed.
    let neither = EngineConfig {
        confirm_score: 1.01,
        confirm_margin: 1.01,
        ..EngineConfig::default()
    };
    assert_eq!(canary_overload(neither), None);
}

/// The recorded calm canaries of the live control episode (`tests/fixtures/episodes/`: the real
/// agent, 2 canaries/s against a steady server, 202 s), with `errors_per_bucket` of the
/// successes in each of two consecutive 10 s buckets from 150 s on turned into 503s (the
/// latency samples stay). Replayed once a second with `config`; returns the evaluations that
/// were not idle and the first non-idle symptom's signal.
fn control_with_stray_errors(
    config: EngineConfig,
    errors_per_bucket: usize,
) -> (usize, Option<Signal>) {
    let v: serde_json::Value = serde_json::from_str(include_str!(
        "../../../../tests/fixtures/episodes/live-control-1.json"
    ))
    .unwrap();
    let start = v["start_unix_s"].as_f64().unwrap();
    let series = v["series"]["t0"].as_object().unwrap();
    let mut samples: Vec<(f64, Signal, f64)> = Vec::new();
    for (name, pts) in series {
        let sig = Signal::parse(name).unwrap();
        for p in pts.as_array().unwrap() {
            samples.push((p[0].as_f64().unwrap(), sig, p[1].as_f64().unwrap()));
        }
    }
    // The two buckets (Unix-aligned 10 s) after offset 150 s.
    let first_bucket = ((start + 150.0) / 10.0).ceil() as u64;
    // Per bucket, per signal (error, error_5xx): the samples flipped. Both signals of one
    // request come in time order, so the first n of each are the same n requests.
    let mut flipped = [[0usize; 2]; 2];
    for (o, sig, val) in samples.iter_mut() {
        let bucket = ((start + *o) / 10.0).floor() as u64;
        let k = bucket.wrapping_sub(first_bucket) as usize;
        let j = match sig {
            Signal::Error => 0,
            Signal::Error5xx => 1,
            _ => continue,
        };
        if k < 2 && flipped[k][j] < errors_per_bucket {
            *val = 1.0;
            flipped[k][j] += 1;
        }
    }
    assert_eq!(
        flipped, [[errors_per_bucket; 2]; 2],
        "requests flipped per bucket"
    );
    samples.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut e = Engine::new(config);
    let (mut not_idle, mut symptom) = (0, None);
    let mut next = 0;
    for k in 1..=v["duration_s"].as_f64().unwrap() as u64 {
        while next < samples.len() && samples[next].0 < k as f64 {
            let (o, s, x) = samples[next];
            e.observe("t0", s, at_unix(start + o), x);
            next += 1;
        }
        let d = e.evaluate(at_unix(start + k as f64));
        if d.targets[0].state != State::Idle {
            not_idle += 1;
            symptom = symptom.or(d.targets[0].symptom.as_ref().map(|s| s.signal));
        }
    }
    (not_idle, symptom)
}

fn at_unix(s: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(s)
}

#[test]
fn one_error_per_bucket_against_an_error_free_baseline_does_not_page() {
    // One 503 in each of 2 consecutive buckets of ~20 canaries: a 5 % ratio against 0 %,
    // infinitely many times the baseline. Before the minimum count it was a symptom.
    let (not_idle, symptom) = control_with_stray_errors(EngineConfig::default(), 1);
    assert_eq!((not_idle, symptom), (0, None));
    let without_minimum = EngineConfig {
        ratio_detector: super::detector::DetectorConfig {
            min_bucket_sum: 0.0,
            ..EngineConfig::default().ratio_detector
        },
        ..EngineConfig::default()
    };
    let (not_idle, symptom) = control_with_stray_errors(without_minimum, 1);
    assert!(not_idle > 0, "the case the minimum is for");
    assert_eq!(symptom, Some(Signal::Error));
    // Two errors in each of the two buckets (10 %) meet the minimum: a symptom.
    assert_eq!(super::engine::MIN_ERRORS_PER_BUCKET, 2.0);
    let (not_idle, symptom) = control_with_stray_errors(EngineConfig::default(), 2);
    assert!(not_idle > 0);
    assert_eq!(symptom, Some(Signal::Error));
}

#[test]
fn a_short_history_says_no_baseline_yet_instead_of_no_spike() {
    // A server dead from the start: every canary fails, one a second, for 45 s.
    let mut e = Engine::new(EngineConfig::default());
    for s in 0..45 {
        e.observe("t", Signal::Error, at(f64::from(s)), 1.0);
    }
    let d = e.evaluate(at(45.0));
    let t = &d.targets[0];
    assert_eq!(t.state, State::Idle);
    let w = t.baseline_wait.unwrap();
    // The error ratio judges 3 recent buckets after 8 of baseline: 110 s.
    assert_eq!((w.have_s, w.need_s), (40.0, 110.0));
    let text = super::scorecard::text(&d);
    assert!(
        text.starts_with("t  not judged\n  no baseline yet: 40 s of the 110 s needed"),
        "{text}"
    );
    assert!(!text.contains("no spike"), "{text}");
    // With a full history and no spike: the old line, no wait in the JSON.
    for s in 45..300 {
        e.observe("t", Signal::Error, at(f64::from(s)), 1.0);
    }
    let d = e.evaluate(at(300.0));
    assert!(d.targets[0].baseline_wait.is_none());
    assert_eq!(
        super::scorecard::text(&d),
        "t  no spike\n  nothing to diagnose\n"
    );
    assert!(!serde_json::to_string(&d).unwrap().contains("baseline_wait"));
}

#[test]
fn small_latencies_keep_significant_digits() {
    use super::report::fmt_value;
    assert_eq!(fmt_value(Signal::Tpot, 0.000_103), "0.103 ms");
    assert_eq!(fmt_value(Signal::E2e, 0.001_66), "1.66 ms");
    assert_eq!(fmt_value(Signal::Tpot, 0.053), "53.0 ms");
    assert_eq!(fmt_value(Signal::E2e, 1.24), "1.24 s");
}

#[test]
fn a_mild_kv_squeeze_warns_within_a_minute_and_never_pages() {
    // Issue 28: KV ≥ 0.95, a preemption every two seconds, TPOT +38 %, no load change: below the
    // symptom's 1.5 ×, so no page; the hard rule holds, so a `warning` within 60 s.
    let squeeze = |w: &mut World| {
        w.kv = 0.97;
        w.preemptions = 0.5;
        w.tpot = 0.02 * 1.38;
    };
    let (first, states) = episode(true, ONSET + 60, squeeze, &[]);
    assert!(first.is_none(), "{first:?}");
    assert!(states.contains(&State::Warning), "{states:?}");
    let (first, states) = episode(true, ONSET + 240, squeeze, &[]);
    assert!(first.is_none(), "{first:?}");
    assert!(
        states
            .iter()
            .all(|s| matches!(s, State::Idle | State::Warning)),
        "{states:?}"
    );
    // The warning's words and evidence.
    let mut e = Engine::new(EngineConfig::default());
    for s in 0..(ONSET + 60) {
        let kv = if s >= ONSET { 0.97 } else { 0.3 };
        let t = s as f64 + 0.25;
        e.observe("t", Signal::Ttft, at(t), 0.1);
        e.observe("t", Signal::ServerKvUsage, at(t), kv);
        e.observe(
            "t",
            Signal::ServerPreemptions,
            at(t),
            if s >= ONSET && s % 2 == 0 { 1.0 } else { 0.0 },
        );
        e.evaluate(at(s as f64 + 1.0));
    }
    let d = e.evaluate(at((ONSET + 60) as f64));
    let t = &d.targets[0];
    assert_eq!(t.state, State::Warning);
    assert_eq!(t.state.code(), 4);
    assert_eq!(t.causes[0].cause, Cause::KvCachePressure);
    let kv = &t.causes[0].evidence[0];
    assert!(
        kv.signal == Signal::ServerKvUsage && kv.after >= 0.95 && kv.before < 0.5,
        "{kv:?}"
    );
    let line = t.summary.clone().unwrap_or_default();
    assert!(
        line.starts_with("warning: kv_cache_pressure: KV cache usage"),
        "{line}"
    );
    let text = super::scorecard::text(&d);
    assert!(text.starts_with("t  warning"), "{text}");
    assert_eq!(
        serde_json::to_value(&d).unwrap()["targets"][0]["state"],
        "warning"
    );
}

#[test]
fn a_slower_server_without_more_arrivals_is_not_a_load_surge() {
    // Issue 28, 0b: the batch fills (running 1 → 6) and requests wait because the server got
    // slower (decode 3 ×), while the arrivals (requests/s, prompt tokens/s) stay flat. Little's
    // law reads occupancy as more work; arrivals say otherwise.
    let (first, _) = episode(
        true,
        ONSET + 120,
        |w| {
            w.running = 6.0;
            w.waiting = 4.0;
            w.queue_time = 0.3;
            w.ttft = 0.5;
            w.tpot = 0.06;
        },
        &[],
    );
    let (_, d) = first.expect("confirmed");
    let surge = d
        .causes
        .iter()
        .find(|c| c.cause == Cause::LoadSurge)
        .map_or(0.0, |c| c.score);
    assert!(surge < 0.5, "load_surge {surge}: {:#?}", d.causes);
    assert_eq!(d.causes[0].cause, Cause::ServerQueueing, "{:#?}", d.causes);
}

#[test]
fn a_server_refusing_everything_contradicts_queueing() {
    // Every request refused with 503 at once, nothing waiting at any scrape: the error burst,
    // and no `server_queueing` ≥ 0.5 (its queue time may read a few slow refusals).
    let d = confirmed(
        true,
        |w| {
            w.error = 1.0;
            w.queue_time = 0.2;
        },
        &[],
        Cause::ErrorBurst,
    );
    assert!(
        d.causes
            .iter()
            .all(|c| c.cause == Cause::ErrorBurst || c.score < 0.5),
        "{:#?}",
        d.causes
    );
}

#[test]
fn the_ttft_decomposition_never_leaves_a_negative_rest() {
    // The server's queue time rose more than the client's TTFT median: the rest is 0 and the
    // note says by how much the parts exceed it.
    let d = confirmed(
        true,
        |w| {
            w.waiting = 15.0;
            w.queue_time = 1.2;
            w.ttft = 0.6;
        },
        &[],
        Cause::ServerQueueing,
    );
    let dec = d.ttft_decomposition.expect("decomposition");
    assert!(dec.unexplained_s >= 0.0, "{dec:?}");
    assert!(
        dec.note.as_deref().is_some_and(|n| n.contains("exceed")),
        "{dec:?}"
    );
}

#[test]
fn a_network_delay_and_a_throttled_gpu_are_two_causes() {
    // Two faults at once on one node: the link delayed and the GPU throttled. Both roots are
    // confirmed (neither a child of the other), in the order their signals changed.
    let (first, _) = episode(
        true,
        ONSET + 120,
        |w| {
            w.srtt = 0.05;
            w.ttft = 0.3;
            w.sm_clock = 1.1e9;
            w.throttle = 1.0;
            w.tpot = 0.045;
        },
        &[],
    );
    let (_, d) = first.expect("confirmed");
    let top3: Vec<Cause> = d.causes.iter().take(3).map(|c| c.cause).collect();
    assert!(
        top3.contains(&Cause::Network) && top3.contains(&Cause::GpuThrottling),
        "{:#?}",
        d.causes
    );
    assert_eq!(d.roots.len(), 2, "{:#?}", d.causes);
    let line = d.summary.clone().unwrap_or_default();
    assert!(line.starts_with("two causes: "), "{line}");
    // Each root said with what it moved, in causal order, before the symptom they caused.
    let (a, b) = (d.roots[0].as_str(), d.roots[1].as_str());
    let (ia, ib) = (line.find(a), line.find(b));
    assert!(ia.is_some() && ib.is_some() && ia < ib, "{line}");
    assert!(line.contains("kernel RTT"), "{line}");
    assert!(
        line.contains("SM clock") || line.contains("GPU throttled"),
        "{line}"
    );
    assert!(line.contains("; together TTFT p99"), "{line}");
}

#[test]
fn the_share_of_skipped_canaries_is_said_with_the_diagnosis() {
    // Overload: a third of the scheduled canaries skipped at max_in_flight from the onset.
    let mut e = Engine::new(EngineConfig::default());
    let mut rng = Rng(0x7777_1234_5678_9ABC);
    let mut confirmed = None;
    for s in 0..(ONSET + 120) {
        let over = s >= ONSET;
        let t = s as f64 + 0.3;
        let skipped = over && s % 3 == 0;
        e.observe(
            "t",
            Signal::CanarySkipped,
            at(t),
            f64::from(u8::from(skipped)),
        );
        if !skipped {
            let k = if over { 4.0 } else { 1.0 };
            e.observe("t", Signal::Error, at(t), 0.0);
            e.observe("t", Signal::Ttft, at(t), k * rng.jitter(0.1, 0.3));
            e.observe(
                "t",
                Signal::Tpot,
                at(t),
                (1.0 + k / 4.0) * rng.jitter(0.02, 0.2),
            );
        }
        let d = e.evaluate(at(s as f64 + 1.0));
        if confirmed.is_none() && d.targets[0].state == State::RootConfirmed {
            confirmed = Some(d.targets[0].clone());
        }
    }
    let d = confirmed.expect("confirmed");
    let share = d.canaries_skipped_share.expect("share");
    assert!((0.2..=0.45).contains(&share), "{share}");
    let line = d.summary.clone().unwrap_or_default();
    assert!(
        line.contains("of canaries skipped at max_in_flight"),
        "{line}"
    );
    let doc = super::Diagnosis {
        schema_version: 1,
        evaluated_at_unix_s: 0.0,
        targets: vec![d],
        nodes: Vec::new(),
    };
    assert!(super::scorecard::text(&doc).contains("scheduled canaries skipped since the onset"));
}

/// A router target's signals of one second: each routed canary's TTFT minus the direct p50
/// (`overhead`, s) and a direct canary's TTFT every 2 s (`direct`, s), each ± 5 %.
fn router_second(e: &mut Engine, s: u32, at: &dyn Fn(f64) -> SystemTime, p: (f64, f64)) {
    let (overhead, direct) = p;
    let wobble = 1.0 + 0.05 * (f64::from(s % 5) - 2.0) / 2.0;
    e.observe(
        "t",
        Signal::PathOverhead,
        at(f64::from(s) + 0.5),
        overhead * wobble,
    );
    if s.is_multiple_of(2) {
        e.observe(
            "t",
            Signal::DirectTtft,
            at(f64::from(s) + 0.7),
            direct * wobble,
        );
    }
}

/// The router adds 200 ms (its CPU quota, its queue) while its workers answer direct canaries
/// as fast as before: `router_overhead`, confirmed within a minute, with its rule.
#[test]
fn a_slower_router_with_its_workers_fine_is_router_overhead() {
    let (after, t) = canary_episode(
        (0.100, 0.010, (0.002, 0.098)),
        (0.300, 0.010, (0.202, 0.098)),
        router_second,
    );
    assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
    assert!(after <= 60, "confirmed {after} s after the fault");
    assert_eq!(t.causes[0].cause, Cause::RouterOverhead, "{t:#?}");
    let e = ev(&t, Cause::RouterOverhead, Signal::PathOverhead);
    assert!((e.after - 0.202).abs() < 0.02, "{e:?}");
    assert!(
        e.rule
            .as_deref()
            .is_some_and(|r| r.contains("the router adds it")),
        "{e:?}"
    );
}

/// The workers slow by 200 ms: the direct canaries slow as much, and the routed − direct
/// difference rises only while the direct minute catches up (30 s). Not the router: its cause
/// is contradicted, never confirmed.
#[test]
fn slower_workers_behind_a_router_are_not_router_overhead() {
    let (_, t) = canary_episode(
        (0.100, 0.010, (0.002, 0.098)),
        (0.300, 0.010, (0.002, 0.298)),
        |e, s, at, (o, d)| {
            // The lag: a routed canary against a direct p50 still half calm.
            let lagging = (600..630).contains(&s);
            router_second(e, s, at, (if lagging { 0.2 } else { o }, d));
        },
    );
    let router = t.causes.iter().find(|c| c.cause == Cause::RouterOverhead);
    assert!(
        router.is_none_or(|c| c.score <= super::contradict::CONTRADICTED_CAP),
        "{t:#?}"
    );
    assert_ne!(
        t.causes.first().map(|c| c.cause),
        Some(Cause::RouterOverhead),
        "{t:#?}"
    );
}

/// A disaggregated target's transfer segment each second (`transfer`, s, ± 5 %) beside its
/// prefill (45 ms).
fn pd_second(e: &mut Engine, s: u32, at: &dyn Fn(f64) -> SystemTime, transfer: f64) {
    let wobble = 1.0 + 0.05 * (f64::from(s % 5) - 2.0) / 2.0;
    e.observe(
        "t",
        Signal::KvTransfer,
        at(f64::from(s) + 0.5),
        transfer * wobble,
    );
    e.observe(
        "t",
        Signal::ServerPrefillTime,
        at(f64::from(s) + 0.5),
        0.045 * wobble,
    );
}

/// The decode worker's KV link 10 × slower (Dynamo's mocker with a tenth of the bandwidth: the
/// transfer segment 13 → 95 ms), the prefill as fast: `kv_transfer`, confirmed within a minute.
#[test]
fn a_slower_kv_transfer_is_kv_transfer() {
    let (after, t) = canary_episode((0.080, 0.010, 0.013), (0.162, 0.010, 0.095), pd_second);
    assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
    assert!(after <= 60, "confirmed {after} s after the fault");
    assert_eq!(t.causes[0].cause, Cause::KvTransfer, "{t:#?}");
    let e = ev(&t, Cause::KvTransfer, Signal::KvTransfer);
    assert!((e.after - 0.095).abs() < 0.01, "{e:?}");
    assert!(e.rule.is_some(), "{e:?}");
}

/// A busier decode worker's first step adds a few milliseconds to the segment (13 → 22 ms)
/// while the TTFT doubles for another reason: under the floor, never `kv_transfer`.
#[test]
fn a_few_more_milliseconds_of_first_decode_are_not_kv_transfer() {
    let (_, t) = canary_episode((0.080, 0.010, 0.013), (0.400, 0.010, 0.022), pd_second);
    assert!(
        t.causes
            .iter()
            .all(|c| c.cause != Cause::KvTransfer || c.score < 0.5),
        "{t:#?}"
    );
}

/// A router's page every 5 s: its most-picked worker's share ÷ fair share (`ratio`, ± 5 %).
fn picks_second(e: &mut Engine, s: u32, at: &dyn Fn(f64) -> SystemTime, ratio: f64) {
    if s.is_multiple_of(5) {
        let wobble = 1.0 + 0.05 * (f64::from(s / 5 % 5) - 2.0) / 2.0;
        e.observe(
            "t",
            Signal::PickImbalance,
            at(f64::from(s) + 0.2),
            ratio * wobble,
        );
        if ratio >= 1.5 {
            let words = "http://w1:8000 (75 % of 40 picks, fair share 25 %)";
            e.note("t", Signal::PickImbalance, at(f64::from(s) + 0.2), words);
        }
    }
}

/// One of two workers gets 85 % of the picks (1.7 × its fair share: the canaries, each with
/// its own request id, still spread): `routing_imbalance` on it.
#[test]
fn one_of_two_workers_getting_most_picks_is_routing_imbalance() {
    let (after, t) = canary_episode((0.100, 0.010, 1.1), (0.300, 0.014, 1.7), picks_second);
    assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
    assert!(after <= 60, "confirmed {after} s after the fault");
    assert_eq!(t.causes[0].cause, Cause::RoutingImbalance, "{t:#?}");
    let e = ev(&t, Cause::RoutingImbalance, Signal::PickImbalance);
    assert!((e.after - 1.7).abs() < 0.15, "{e:?}");
    assert_eq!(t.worker.as_deref(), Some("http://w1:8000"));
}

/// One session key under consistent hashing: the router sends one of four workers 3 × its
/// share (75 % of the picks) and its queue slows every first token: `routing_imbalance`.
#[test]
fn one_worker_getting_the_others_picks_is_routing_imbalance() {
    let (after, t) = canary_episode((0.100, 0.010, 1.05), (0.300, 0.014, 3.0), picks_second);
    assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
    assert!(after <= 60, "confirmed {after} s after the fault");
    assert_eq!(t.causes[0].cause, Cause::RoutingImbalance, "{t:#?}");
    let e = ev(&t, Cause::RoutingImbalance, Signal::PickImbalance);
    assert!((e.after - 3.0).abs() < 0.2, "{e:?}");
    let named = "; last: http://w1:8000 (75 % of 40 picks, fair share 25 %)";
    assert!(
        e.rule.as_deref().is_some_and(|r| r.ends_with(named)),
        "{e:?}"
    );
    // On the worker the router favours, the router's entry pointing at it.
    assert_eq!(
        (t.scope, t.worker.as_deref()),
        (super::Scope::Worker, Some("http://w1:8000"))
    );
}

/// A router that always spread its picks unevenly (2 × on one worker, a few keys hashed) and
/// still does: the latency jumped for another reason, never `routing_imbalance`.
#[test]
fn an_imbalance_that_did_not_move_is_not_routing_imbalance() {
    let (_, t) = canary_episode((0.100, 0.010, 2.0), (0.300, 0.014, 2.05), picks_second);
    assert!(
        t.causes
            .iter()
            .all(|c| c.cause != Cause::RoutingImbalance || c.score < 0.5),
        "{t:#?}"
    );
}

/// A router's page every 5 s: its pickable workers with no pick (`starved`) beside an even
/// spread over the others (4 ÷ 3 with one of four out).
fn rotation_second(e: &mut Engine, s: u32, at: &dyn Fn(f64) -> SystemTime, starved: f64) {
    if s.is_multiple_of(5) {
        let at = at(f64::from(s) + 0.2);
        e.observe("t", Signal::StarvedWorkers, at, starved);
        let ratio = if starved > 0.0 { 4.0 / 3.0 } else { 1.0 };
        e.observe("t", Signal::PickImbalance, at, ratio);
        if starved > 0.0 {
            e.note("t", Signal::StarvedWorkers, at, "http://w4:8000");
        }
    }
}

/// One of four workers the router calls healthy gets none of its picks, the other three its
/// traffic: `worker_out_of_rotation` first (the uneven spread is its consequence).
#[test]
fn a_healthy_worker_without_picks_is_out_of_rotation() {
    let (after, t) = canary_episode((0.100, 0.010, 0.0), (0.250, 0.013, 1.0), rotation_second);
    assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
    assert!(after <= 60, "confirmed {after} s after the fault");
    assert_eq!(t.causes[0].cause, Cause::WorkerOutOfRotation, "{t:#?}");
    let e = ev(&t, Cause::WorkerOutOfRotation, Signal::StarvedWorkers);
    assert_eq!(e.after, 1.0, "{e:?}");
    assert!(e.rule.is_some(), "{e:?}");
    assert_eq!(
        (t.scope, t.worker.as_deref()),
        (super::Scope::Worker, Some("http://w4:8000"))
    );
}

/// A disaggregated router's page every 5 s: prompt tokens queued on its prefill workers and
/// KV blocks held on its decode workers (`(prefill, decode)`, ± 10 %).
fn pools_second(e: &mut Engine, s: u32, at: &dyn Fn(f64) -> SystemTime, pools: (f64, f64)) {
    if s.is_multiple_of(5) {
        let wobble = 1.0 + 0.1 * (f64::from(s / 5 % 5) - 2.0) / 2.0;
        let at = at(f64::from(s) + 0.2);
        e.observe("t", Signal::PrefillPoolLoad, at, (pools.0 * wobble).round());
        e.observe("t", Signal::DecodePoolLoad, at, (pools.1 * wobble).round());
    }
}

/// A prefill worker slowed: prompt tokens queued on the prefill pool 60 → 400, the decode
/// pool as loaded, the first token 3 × later: `prefill_saturation`, on the prefill pool.
#[test]
fn prompts_piling_on_the_prefill_workers_is_prefill_saturation() {
    let (after, t) = canary_episode(
        (0.100, 0.010, (60.0, 36.0)),
        (0.300, 0.010, (400.0, 36.0)),
        pools_second,
    );
    assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
    assert!(after <= 60, "confirmed {after} s after the fault");
    assert_eq!(t.causes[0].cause, Cause::PrefillSaturation, "{t:#?}");
    let e = ev(&t, Cause::PrefillSaturation, Signal::PrefillPoolLoad);
    assert!((e.after - 400.0).abs() < 40.0, "{e:?}");
    assert!(e.rule.is_some(), "{e:?}");
    assert_eq!(
        (t.scope, t.pool.as_deref()),
        (super::Scope::Pool, Some("prefill"))
    );
}

/// A decode worker slowed: blocks held on the decode pool 36 → 90, tokens 2 × slower, the
/// prefill pool as loaded: `decode_saturation`, on the decode pool.
#[test]
fn sequences_piling_on_the_decode_workers_is_decode_saturation() {
    let (after, t) = canary_episode(
        (0.100, 0.010, (60.0, 36.0)),
        (0.130, 0.022, (60.0, 90.0)),
        pools_second,
    );
    assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
    assert!(after <= 60, "confirmed {after} s after the fault");
    assert_eq!(t.causes[0].cause, Cause::DecodeSaturation, "{t:#?}");
    assert_eq!(
        (t.scope, t.pool.as_deref()),
        (super::Scope::Pool, Some("decode"))
    );
}

/// Both pools fuller at once (more work for both, or every worker slower): neither pool's
/// saturation is confirmed, each contradicted by the other.
#[test]
fn both_pools_fuller_is_neither_pools_saturation() {
    let (_, t) = canary_episode(
        (0.100, 0.010, (60.0, 36.0)),
        (0.300, 0.022, (400.0, 90.0)),
        pools_second,
    );
    for c in &t.causes {
        if matches!(c.cause, Cause::PrefillSaturation | Cause::DecodeSaturation) {
            assert!(c.score <= super::contradict::CONTRADICTED_CAP, "{t:#?}");
            assert!(
                c.evidence.iter().any(|e| e
                    .rule
                    .as_deref()
                    .is_some_and(|r| r.starts_with("contradicted: the other pool"))),
                "{c:?}"
            );
        }
    }
}

/// The direct canaries every 2.5 s name the slowest worker (`(ratio, failing)`): its TTFT ÷
/// the others', and the workers failing every one.
fn apart_second(e: &mut Engine, s: u32, at: &dyn Fn(f64) -> SystemTime, apart: (f64, f64)) {
    if s.is_multiple_of(5) || s % 5 == 2 {
        let at = at(f64::from(s) + 0.6);
        let wobble = 1.0 + 0.08 * (f64::from(s % 7) - 3.0) / 3.0;
        e.observe("t", Signal::WorkerSlowdown, at, apart.0 * wobble);
        e.note("t", Signal::WorkerSlowdown, at, "http://w2:8000 (ratio)");
        e.observe("t", Signal::FailingWorkers, at, apart.1);
        if apart.1 > 0.0 {
            e.note("t", Signal::FailingWorkers, at, "http://w1:8000");
        }
    }
}

/// One of two workers killed while the router still sends it half its requests: the routed
/// canaries fail half the time, its direct canaries all do: `worker_out_of_rotation` on that
/// worker, above the error burst it explains.
#[test]
fn a_dead_worker_the_router_still_sends_to_is_named() {
    let mut e = Engine::new(EngineConfig::default());
    let mut confirmed = None;
    for s in 0..720_u32 {
        let dead = s >= 600;
        for q in 0..4 {
            let t = f64::from(s) + f64::from(q) / 4.0;
            let wobble = 1.0 + 0.1 * (f64::from((s * 4 + q) % 7) - 3.0) / 3.0;
            if dead && q % 2 == 0 {
                e.observe("t", Signal::Error, at(t), 1.0);
                e.observe("t", Signal::Error5xx, at(t), 1.0);
            } else {
                e.observe("t", Signal::Error, at(t), 0.0);
                e.observe("t", Signal::Error5xx, at(t), 0.0);
                e.observe("t", Signal::Ttft, at(t), 0.1 * wobble);
                e.observe("t", Signal::Tpot, at(t), 0.01 * wobble);
                e.observe("t", Signal::E2e, at(t), 0.29 * wobble);
            }
        }
        apart_second(&mut e, s, &at, (1.0, if dead { 1.0 } else { 0.0 }));
        let d = e.evaluate(at(f64::from(s) + 1.0));
        if d.targets[0].state == State::RootConfirmed {
            confirmed = Some((s - 600, d.targets[0].clone()));
            break;
        }
    }
    let (after, t) = confirmed.expect("confirmed");
    assert!(after <= 60, "confirmed {after} s after the kill");
    assert_eq!(t.causes[0].cause, Cause::WorkerOutOfRotation, "{t:#?}");
    assert!(
        ev(&t, Cause::WorkerOutOfRotation, Signal::FailingWorkers)
            .rule
            .is_some()
    );
    assert_eq!(
        (t.scope, t.worker.as_deref()),
        (super::Scope::Worker, Some("http://w1:8000"))
    );
}

/// One of two workers 3 × slower to its direct canaries while the router still sends it
/// half its requests: `worker_out_of_rotation` on the slow worker.
#[test]
fn a_slow_worker_the_router_still_sends_to_is_named() {
    let (after, t) = canary_episode(
        (0.100, 0.010, (1.0, 0.0)),
        (0.300, 0.010, (3.0, 0.0)),
        apart_second,
    );
    assert_eq!(t.state, State::RootConfirmed, "{t:#?}");
    assert!(after <= 60, "confirmed {after} s after the fault");
    assert_eq!(t.causes[0].cause, Cause::WorkerOutOfRotation, "{t:#?}");
    assert_eq!(
        (t.scope, t.worker.as_deref()),
        (super::Scope::Worker, Some("http://w2:8000"))
    );
}
