//! Sampling cost with the fake NVML: `cargo bench -p lmperf --bench gpu_sampling`.
//!
//! Runs the sampler's tick (every field of 8 GPUs, 2 processes each, attributed through
//! `/proc`, published to the shared state) and reports the CPU time per tick, read from
//! `/proc/thread-self/schedstat`, as a share of one core at a 1 s and a 100 ms interval
//! (target: < 0.2 % at 1 s). Also the cost of one metrics collection (a `/metrics` scrape)
//! and of one span's `lmperf.gpu.*` attributes. NVML's own time is not included: a real
//! driver's calls cost what they cost, and run on the sampler's thread either way.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use lmperf::config::{self, Env, Overrides};
use lmperf::gpu::backend::{GpuProcess, ProcessUtilization};
use lmperf::gpu::fake::FakeHandle;
use lmperf::gpu::sampler::Sampler;
use lmperf::gpu::state::{GpuState, Mode};

const GPUS: u32 = 8;
const TICKS: u32 = 5000;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

/// Nanoseconds this thread has run on a CPU.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let fake = FakeHandle::with_gpus(GPUS);
    {
        let mut f = fake.lock();
        let me = std::process::id();
        for d in &mut f.devices {
            d.processes = vec![
                GpuProcess {
                    pid: me,
                    used_bytes: Some(40 << 30),
                },
                GpuProcess {
                    pid: 1,
                    used_bytes: Some(1 << 30),
                },
            ];
            d.process_utilization = vec![ProcessUtilization {
                pid: me,
                timestamp_us: u64::MAX,
                sm_pct: 80,
                memory_pct: 30,
            }];
        }
    }
    let state = Arc::new(GpuState::new(Duration::from_secs(1), Mode::Starting));
    let mut sampler = Sampler::new(fake.backend(), state.clone(), Duration::from_secs(5));
    let (t0, w0) = (Instant::now(), SystemTime::now());
    sampler.tick(t0, w0); // discovery
    let cpu0 = thread_cpu_ns();
    let wall0 = Instant::now();
    for i in 1..=TICKS {
        let d = Duration::from_secs(u64::from(i));
        sampler.tick(t0 + d, w0 + d);
        if i % 1000 == 0 {
            fake.lock().process_util_calls.clear(); // the fake's call log, not the sampler's work
        }
    }
    let cpu = Duration::from_nanos(thread_cpu_ns() - cpu0);
    let wall = wall0.elapsed();
    // The ticks did the work: every GPU sampled, every field present, processes attributed.
    let snap = state.latest();
    assert_eq!(state.status().samples, u64::from(TICKS) + 1);
    assert!(
        snap.devices.len() == GPUS as usize
            && snap
                .devices
                .iter()
                .all(
                    |d| d.sample.as_ref().is_some_and(|s| s.utilization.is_some()
                        && s.ecc_uncorrected.is_some()
                        && s.processes.len() == 2
                        && s.processes[0].command.is_some())
                )
    );
    let per_tick = cpu / TICKS;
    let pct_1s = per_tick.as_secs_f64() / 1.0 * 100.0;
    let pct_100ms = per_tick.as_secs_f64() / 0.1 * 100.0;
    println!("gpu_sampling: {GPUS} fake GPUs, {TICKS} ticks");
    println!(
        "  CPU per tick:        {:>9.1} µs (wall {:.1} µs)",
        per_tick.as_secs_f64() * 1e6,
        wall.as_secs_f64() * 1e6 / f64::from(TICKS)
    );
    println!(
        "  share of one core:   {pct_1s:>9.4} % at 1 s, {pct_100ms:.4} % at 100 ms (target < 0.2 % at 1 s: {})",
        if pct_1s < 0.2 { "met" } else { "NOT met" }
    );

    // One collection of every GPU instrument (what a /metrics scrape or an OTLP export adds).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _g = rt.enter();
    let o = Overrides {
        targets: vec!["http://127.0.0.1:1".into()],
        no_otlp: true,
        ..Overrides::default()
    };
    let cfg = config::load(o, &NoEnv).expect("config");
    let telemetry = lmperf::telemetry::Telemetry::init(&cfg.otlp, &NoEnv).expect("telemetry");
    lmperf::gpu::metrics::register(&telemetry.meter(), state.clone());
    let n = 200;
    let c0 = thread_cpu_ns();
    let mut bytes = 0;
    for _ in 0..n {
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&telemetry.registry.gather(), &mut out)
            .expect("encode");
        bytes = out.len();
    }
    let per_scrape = Duration::from_nanos((thread_cpu_ns() - c0) / n);
    println!(
        "  /metrics scrape:     {:>9.1} µs ({bytes} bytes, whole registry)",
        per_scrape.as_secs_f64() * 1e6
    );

    let n = 10_000;
    let c0 = thread_cpu_ns();
    let mut attrs = 0;
    for i in 0..n {
        let end = w0 + Duration::from_secs(TICKS as u64 - (i % 100));
        attrs += std::hint::black_box(
            state.request_attributes(std::hint::black_box(end - Duration::from_secs(2)), end),
        )
        .len();
    }
    let per_span = Duration::from_nanos((thread_cpu_ns() - c0) / n);
    println!(
        "  span attributes:     {:>9.1} µs per canary ({} attributes)",
        per_span.as_secs_f64() * 1e6,
        attrs / n as usize
    );
}
