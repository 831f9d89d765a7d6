//! The live diagnosis's cost: `cargo bench -p lmperf --bench diagnosis_cost`.
//!
//! Simulates 30 minutes of an agent with 8 targets: canaries at 2/s per target, a GPU tick and
//! a server scrape (11 signals) per second, and one evaluation of the engine per second (as
//! `diagnosis_live::run` does). The last 10 minutes have a load surge on 2 targets, so the
//! scoring path (not only the idle check) is measured. Prints the CPU time per simulated second
//! as a share of one core (target: ≤ 1 %), the split between observing and evaluating, and the
//! evidence store's bytes per target.

use std::time::{Duration, Instant, SystemTime};

use lmperf::diagnosis::{Engine, EngineConfig, Signal};

const TARGETS: usize = 8;
const SECONDS: u64 = 1800;

/// Nanoseconds this thread has run on a CPU.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let names: Vec<String> = (0..TARGETS).map(|i| format!("vllm-{i}")).collect();
    let mut e = Engine::new(EngineConfig::default());
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    };
    let (mut observe_ns, mut evaluate_ns) = (0u64, 0u64);
    let (cpu0, wall0) = (thread_cpu_ns(), Instant::now());
    let mut confirmed = 0;
    for s in 0..SECONDS {
        let started = Instant::now();
        for (i, t) in names.iter().enumerate() {
            let surge = i < 2 && s >= SECONDS - 600;
            for half in [0u64, 500] {
                let at = t0 + Duration::from_millis(s * 1000 + half);
                let ttft = if surge { 1.5 } else { 0.1 } * (0.8 + 0.4 * rnd());
                e.observe(t, Signal::Ttft, at, ttft);
                e.observe(t, Signal::Tpot, at, if surge { 0.05 } else { 0.02 });
                e.observe(t, Signal::E2e, at, ttft + 0.5);
                e.observe(t, Signal::Error, at, 0.0);
                e.observe(t, Signal::InputTokens, at, 200.0);
            }
            let at = t0 + Duration::from_secs(s);
            for (sig, v) in [
                (Signal::GpuSmClock, 1.98e9),
                (Signal::GpuThrottle, 0.0),
                (Signal::GpuMemoryUtilization, 0.7),
                (Signal::GpuForeignProcesses, 1.0),
                (Signal::GpuFault, 0.0),
            ] {
                e.observe(t, sig, at, v);
            }
            let load: f64 = if surge { 5.0 } else { 1.0 };
            for (sig, v) in [
                (Signal::ServerRequestsWaiting, load * 2.0 - 2.0),
                (Signal::ServerRequestsRunning, load),
                (Signal::ServerKvUsage, 0.3 * load.min(3.0)),
                (Signal::ServerPreemptions, 0.0),
                (Signal::ServerPromptTokensRate, 400.0 * load),
                (Signal::ServerGenerationTokensRate, 100.0 * load),
                (Signal::ServerRequestRate, 2.0 * load * (0.9 + 0.2 * rnd())),
                (Signal::ServerTtft, 0.08 * load),
                (Signal::ServerQueueTime, 0.01 * load),
                (Signal::ServerPrefillTime, 0.05),
                (Signal::ServerDecodeTime, 0.02),
            ] {
                e.observe(t, sig, at, v);
            }
        }
        let mid = Instant::now();
        let d = e.evaluate(t0 + Duration::from_secs(s + 1));
        confirmed = d
            .targets
            .iter()
            .filter(|t| t.state.as_str() == "root_confirmed")
            .count();
        observe_ns += (mid - started).as_nanos() as u64;
        evaluate_ns += mid.elapsed().as_nanos() as u64;
    }
    let cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
    let wall = wall0.elapsed();
    let per_s_us = |ns: u64| ns as f64 / SECONDS as f64 / 1000.0;
    println!(
        "diagnosis_cost: {TARGETS} targets, {SECONDS} simulated s (canaries 2/s, GPU + 11 server signals 1/s, one evaluation/s)"
    );
    println!(
        "  CPU per simulated second: {:.0} µs = {:.3} % of one core (thread CPU; wall {:.2} s)",
        per_s_us(cpu_ns),
        per_s_us(cpu_ns) / 1e4,
        wall.as_secs_f64()
    );
    println!(
        "  observing: {:.0} µs/s, evaluating: {:.0} µs/s",
        per_s_us(observe_ns),
        per_s_us(evaluate_ns)
    );
    println!(
        "  evidence store: {} bytes per target ({} bytes for {TARGETS})",
        e.heap_bytes() / TARGETS,
        e.heap_bytes()
    );
    println!("  targets in root_confirmed at the end: {confirmed} of 2 with a surge");
}
