//! Model server scraping cost (issue 11, acceptance 5): `cargo bench -p lmperf --bench
//! server_scrape` (the `bench` profile: release, optimized).
//!
//! 1. Parsing and normalizing a 1 MiB vLLM page, CPU time per page (`CLOCK_THREAD_CPUTIME_ID`;
//!    mean and best of 60) (target ≤ 5 ms), on two pages:
//!    - *realistic*: a vLLM 0.11 page as `prometheus_client` writes it (families of
//!      `vllm/v1/metrics/loggers.py` with `# HELP`/`# TYPE` lines and `_created` series, the
//!      Python process and GC families, the HTTP families of the API server's instrumentator),
//!      its per-engine families repeated under more `engine` labels until 1 MiB;
//!    - *fixture*: `tests/fixtures/server/vllm-new.b.prom` repeated the same way; nearly every
//!      line is one the normalizer reads (the worst case).
//! 2. The scrapers' CPU at a 1 s interval with 8 targets: 8 `Scraper` loops on one
//!    current-thread runtime (this thread) reading the realistic page at ≥ 64 KiB (two
//!    engines: 79 KiB; one engine is 46 KiB) from 8 servers on another thread (HTTP/1.1 keep-alive, as uvicorn and llama.cpp
//!    answer), for 15 s. Two figures as a share of one core: this thread's CPU, and the whole
//!    process's CPU less the servers' thread (so tokio's blocking pool and anything else the
//!    scrapers start count too) (target ≤ 0.2 %). HTTP, parsing, normalizing, publishing and
//!    the identity reads are all included.
//!
//! `LMPERF_BENCH_MODE=callgrind` runs fixed work instead of timing it, for instruction counts
//! (load-independent): `valgrind --tool=callgrind --toggle-collect='*parse_pages*'` counts 5
//! parses of the realistic 1 MiB page; the main thread's count (`--separate-threads=yes`) with
//! `LMPERF_BENCH_ROUNDS=20` less the one with `0`, over 160, is one scrape of the 79 KiB page
//! (HTTP, parse, normalize, publish; 8 targets, keep-alive).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use lmperf::config::raw::RawCanary;
use lmperf::config::{self, Env, Overrides, TargetConfig};
use lmperf::server::normalize::normalize;
use lmperf::server::parse::parse;
use lmperf::server::scrape::Scraper;
use lmperf::server::state::TargetServer;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

/// CPU time of `clock` (`CLOCK_THREAD_CPUTIME_ID`, `CLOCK_PROCESS_CPUTIME_ID`), ns. Exact to the
/// call: `/proc/thread-self/schedstat` is only brought up to date at the scheduler's ticks, so a
/// parse of a few ms read from it could show 0.8 ms or 4 ms.
fn cpu_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec the call writes.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

fn thread_cpu_ns() -> u64 {
    cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn task_cpu_ns(tid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// This thread's (user, system) CPU time, ns (`getrusage(RUSAGE_THREAD)`, µs resolution).
fn thread_user_sys_ns() -> (u64, u64) {
    // SAFETY: an all-zero rusage is valid; the call writes it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid rusage the call writes.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return (0, 0);
    }
    let ns = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_usec).unwrap_or(0) * 1000
    };
    (ns(ru.ru_utime), ns(ru.ru_stime))
}

/// CPU time of every thread of the process, exited ones included.
fn process_cpu_ns() -> u64 {
    cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The fixture page with its vLLM series repeated under engines 0.. until `bytes`.
fn fixture_page(bytes: usize) -> String {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/server/vllm-new.b.prom"
    ))
    .expect("fixture");
    let mut out = String::with_capacity(bytes + 16 * 1024);
    let mut engine = 0;
    while out.len() < bytes {
        for line in base.lines() {
            if line.starts_with("vllm:") {
                out.push_str(&line.replace("engine=\"0\"", &format!("engine=\"{engine}\"")));
            } else if engine == 0 {
                out.push_str(line);
            } else {
                continue;
            }
            out.push('\n');
        }
        engine += 1;
    }
    out
}

enum Family {
    Gauge,
    Counter(&'static [&'static str]),
    Histogram(&'static [f64]),
}

const TOKENS_125: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
];
const LATENCY: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM 0.11's per-engine families (`vllm/v1/metrics/loggers.py`), buckets as there
/// (`max_model_len` 8192).
const VLLM: &[(&str, Family)] = &[
    ("num_requests_running", Family::Gauge),
    ("num_requests_waiting", Family::Gauge),
    ("gpu_cache_usage_perc", Family::Gauge),
    ("kv_cache_usage_perc", Family::Gauge),
    ("gpu_prefix_cache_queries", Family::Counter(&[])),
    ("gpu_prefix_cache_hits", Family::Counter(&[])),
    ("prefix_cache_queries", Family::Counter(&[])),
    ("prefix_cache_hits", Family::Counter(&[])),
    ("num_preemptions", Family::Counter(&[])),
    ("prompt_tokens", Family::Counter(&[])),
    ("generation_tokens", Family::Counter(&[])),
    (
        "request_success",
        Family::Counter(&["stop", "length", "abort"]),
    ),
    ("request_prompt_tokens", Family::Histogram(TOKENS_125)),
    ("request_generation_tokens", Family::Histogram(TOKENS_125)),
    (
        "iteration_tokens_total",
        Family::Histogram(&[
            1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
            16384.0,
        ]),
    ),
    (
        "request_max_num_generation_tokens",
        Family::Histogram(TOKENS_125),
    ),
    (
        "request_params_n",
        Family::Histogram(&[1.0, 2.0, 5.0, 10.0, 20.0]),
    ),
    ("request_params_max_tokens", Family::Histogram(TOKENS_125)),
    (
        "time_to_first_token_seconds",
        Family::Histogram(&[
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
        ]),
    ),
    (
        "inter_token_latency_seconds",
        Family::Histogram(&[
            0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0,
        ]),
    ),
    (
        "time_per_prefill_token_request_seconds",
        Family::Histogram(&[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]),
    ),
    ("e2e_request_latency_seconds", Family::Histogram(LATENCY)),
    ("request_queue_time_seconds", Family::Histogram(LATENCY)),
    ("request_inference_time_seconds", Family::Histogram(LATENCY)),
    ("request_prefill_time_seconds", Family::Histogram(LATENCY)),
    ("request_decode_time_seconds", Family::Histogram(LATENCY)),
];

/// The process, GC and HTTP families of vLLM's API server (prometheus_client's default
/// collectors and prometheus-fastapi-instrumentator), written once per page.
fn api_server_families(out: &mut String) {
    for (name, kind) in [
        ("python_gc_objects_collected", "counter"),
        ("python_gc_objects_uncollectable", "counter"),
        ("python_gc_collections", "counter"),
    ] {
        let _ = writeln!(out, "# HELP {name}_total Objects collected during gc");
        let _ = writeln!(out, "# TYPE {name}_total {kind}");
        for g in 0..3 {
            let _ = writeln!(
                out,
                "{name}_total{{generation=\"{g}\"}} {}.0",
                1234 * (g + 1)
            );
        }
    }
    out.push_str("# HELP python_info Python platform information\n# TYPE python_info gauge\npython_info{implementation=\"CPython\",major=\"3\",minor=\"12\",patchlevel=\"11\",version=\"3.12.11\"} 1.0\n");
    for (name, v) in [
        ("process_virtual_memory_bytes", "9.8123456e+10"),
        ("process_resident_memory_bytes", "5.123456e+09"),
        ("process_start_time_seconds", "1.76450012345e+09"),
        ("process_cpu_seconds_total", "12345.67"),
        ("process_open_fds", "187.0"),
        ("process_max_fds", "1.048576e+06"),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} Process figure.\n# TYPE {name} gauge\n{name} {v}"
        );
    }
    let handlers = [
        "/v1/chat/completions",
        "/v1/completions",
        "/metrics",
        "/health",
    ];
    out.push_str("# HELP http_requests_total Total number of requests by method, status and handler.\n# TYPE http_requests_total counter\n");
    for h in handlers {
        let _ = writeln!(
            out,
            "http_requests_total{{handler=\"{h}\",method=\"POST\",status=\"2xx\"}} 81234.0"
        );
    }
    for h in handlers {
        let _ = writeln!(
            out,
            "http_requests_created{{handler=\"{h}\",method=\"POST\",status=\"2xx\"}} 1.7645001e+09"
        );
    }
    for s in ["http_request_size_bytes", "http_response_size_bytes"] {
        let _ = writeln!(out, "# HELP {s} Content length.\n# TYPE {s} summary");
        for h in handlers {
            let _ = writeln!(out, "{s}_count{{handler=\"{h}\"}} 81234.0");
            let _ = writeln!(out, "{s}_sum{{handler=\"{h}\"}} 1.2345678e+08");
        }
    }
    out.push_str("# HELP http_request_duration_highr_seconds Latency with many buckets but no API specific labels.\n# TYPE http_request_duration_highr_seconds histogram\n");
    let highr = [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5,
        5.0, 7.5, 10.0, 30.0, 60.0,
    ];
    for (i, le) in highr.iter().enumerate() {
        let _ = writeln!(
            out,
            "http_request_duration_highr_seconds_bucket{{le=\"{le:?}\"}} {}.0",
            1000 * (i + 1)
        );
    }
    out.push_str("http_request_duration_highr_seconds_bucket{le=\"+Inf\"} 81234.0\nhttp_request_duration_highr_seconds_count 81234.0\nhttp_request_duration_highr_seconds_sum 45678.9\n");
    out.push_str("# HELP http_request_duration_seconds Latency with only few buckets by handler.\n# TYPE http_request_duration_seconds histogram\n");
    for h in handlers {
        for le in ["0.1", "0.5", "1.0", "+Inf"] {
            let _ = writeln!(
                out,
                "http_request_duration_seconds_bucket{{handler=\"{h}\",le=\"{le}\",method=\"POST\"}} 4567.0"
            );
        }
        let _ = writeln!(
            out,
            "http_request_duration_seconds_count{{handler=\"{h}\",method=\"POST\"}} 4567.0\nhttp_request_duration_seconds_sum{{handler=\"{h}\",method=\"POST\"}} 1234.5"
        );
    }
}

/// A vLLM 0.11 page with `engines` engines, as prometheus_client writes it.
fn realistic_page_of(engines: usize) -> String {
    let mut out = String::new();
    api_server_families(&mut out);
    let model = "meta-llama/Llama-3.1-8B-Instruct";
    for (f, (name, family)) in VLLM.iter().enumerate() {
        let name = format!("vllm:{name}");
        let labels = |e: usize| format!("model_name=\"{model}\",engine=\"{e}\"");
        match family {
            Family::Gauge => {
                let _ = writeln!(out, "# HELP {name} Metric.\n# TYPE {name} gauge");
                for e in 0..engines {
                    let _ = writeln!(out, "{name}{{{}}} {}.0", labels(e), 3 + f + e);
                }
            }
            Family::Counter(reasons) => {
                let _ = writeln!(
                    out,
                    "# HELP {name}_total Metric.\n# TYPE {name}_total counter"
                );
                let series = |e: usize| -> Vec<String> {
                    if reasons.is_empty() {
                        vec![labels(e)]
                    } else {
                        reasons
                            .iter()
                            .map(|r| format!("{},finished_reason=\"{r}\"", labels(e)))
                            .collect()
                    }
                };
                for e in 0..engines {
                    for l in series(e) {
                        let _ = writeln!(out, "{name}_total{{{l}}} {}.0", 12345 * (f + 1) + e);
                    }
                }
                let _ = writeln!(
                    out,
                    "# HELP {name}_created Metric.\n# TYPE {name}_created gauge"
                );
                for e in 0..engines {
                    for l in series(e) {
                        let _ = writeln!(out, "{name}_created{{{l}}} 1.7645001234567e+09");
                    }
                }
            }
            Family::Histogram(bounds) => {
                let _ = writeln!(out, "# HELP {name} Metric.\n# TYPE {name} histogram");
                for e in 0..engines {
                    let l = labels(e);
                    let mut n = 0;
                    for b in bounds.iter() {
                        n += 37 + e;
                        let _ = writeln!(out, "{name}_bucket{{{l},le=\"{b:?}\"}} {n}.0");
                    }
                    let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {n}.0");
                    let _ = writeln!(out, "{name}_count{{{l}}} {n}.0");
                    let _ = writeln!(out, "{name}_sum{{{l}}} {}.123456789", n * 3);
                }
                let _ = writeln!(
                    out,
                    "# HELP {name}_created Metric.\n# TYPE {name}_created gauge"
                );
                for e in 0..engines {
                    let _ = writeln!(out, "{name}_created{{{}}} 1.7645001234567e+09", labels(e));
                }
            }
        }
    }
    out.push_str("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n");
    for e in 0..engines {
        let _ = writeln!(
            out,
            "vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",calculate_kv_scales=\"False\",cpu_offload_gb=\"0\",enable_prefix_caching=\"True\",engine=\"{e}\",gpu_memory_utilization=\"0.9\",is_attention_free=\"False\",num_cpu_blocks=\"None\",num_gpu_blocks=\"27015\",prefix_caching_hash_algo=\"sha256\",sliding_window=\"None\",swap_space=\"4\",swap_space_bytes=\"4294967296\"}} 1.0"
        );
    }
    out
}

/// The realistic page with as many engines as reach `bytes`.
fn realistic_page(bytes: usize) -> String {
    let mut engines = 1;
    loop {
        let p = realistic_page_of(engines);
        if p.len() >= bytes {
            return p;
        }
        engines += 1;
    }
}

fn parse_cost(label: &str, page: &str) {
    let runs = 60;
    let mut best = u64::MAX;
    let t0 = thread_cpu_ns();
    for _ in 0..runs {
        let t = thread_cpu_ns();
        let p = parse(page).expect("page");
        let r = normalize(&p, None);
        std::hint::black_box(r);
        best = best.min(thread_cpu_ns() - t);
    }
    let mean_ms = (thread_cpu_ns() - t0) as f64 / f64::from(runs) / 1e6;
    let lines = page
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    println!(
        "parse+normalize a {:.2} MiB {label} vLLM page ({lines} sample lines): mean {mean_ms:.2} ms CPU, best {:.2} ms (target ≤ 5 ms)",
        page.len() as f64 / 1048576.0,
        best as f64 / 1e6
    );
}

/// The scraping path's parse, as `Scraper` runs it (`read_page`), on the same page.
fn read_page_cost(label: &str, page: &str) {
    let runs = 60;
    let mut best = u64::MAX;
    let t0 = thread_cpu_ns();
    for _ in 0..runs {
        let t = thread_cpu_ns();
        let r = lmperf::server::scrape::read_page(page.as_bytes(), None, "bench");
        std::hint::black_box(r.is_ok());
        best = best.min(thread_cpu_ns() - t);
    }
    let mean_ms = (thread_cpu_ns() - t0) as f64 / f64::from(runs) / 1e6;
    println!(
        "  the scraper's read_page (UTF-8 check, parse, normalize) on the {label} page: mean {mean_ms:.2} ms CPU, best {:.2} ms",
        best as f64 / 1e6
    );
}

/// Serves `page` on `/metrics` (and vLLM's `/version`, `/v1/models`) on `n` ports from one
/// thread; returns the ports and the thread's id (for its CPU time).
fn serve(page: String, n: usize) -> (Vec<u16>, i32) {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let ports = listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        let _ = tx.send(unsafe { libc::gettid() });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let page = axum::body::Bytes::from(page);
            let mut servers = Vec::new();
            for l in listeners {
                let _ = l.set_nonblocking(true);
                let listener = tokio::net::TcpListener::from_std(l).expect("listener");
                let p = page.clone();
                let app = axum::Router::new()
                    .route(
                        "/metrics",
                        axum::routing::get(move || {
                            let p = p.clone();
                            async move { p }
                        }),
                    )
                    .route(
                        "/version",
                        axum::routing::get(|| async { r#"{"version":"0.11.0"}"# }),
                    )
                    .route(
                        "/v1/models",
                        axum::routing::get(|| async {
                            r#"{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1764500000,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B-Instruct"}]}"#
                        }),
                    );
                servers.push(tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                }));
            }
            for s in servers {
                let _ = s.await;
            }
        });
    });
    (ports, rx.recv().unwrap_or(0))
}

fn targets(ports: &[u16]) -> Vec<TargetConfig> {
    ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let o = Overrides {
                targets: vec![format!("http://127.0.0.1:{port}")],
                canary: RawCanary {
                    model: Some("m".into()),
                    name: Some(format!("t{i}")),
                    metrics_interval: Some(Duration::from_secs(1)),
                    ..RawCanary::default()
                },
                ..Overrides::default()
            };
            config::load(o, &NoEnv).expect("config").targets.remove(0)
        })
        .collect()
}

fn scrape_cost(page: String) {
    let bytes = page.len();
    let (ports, server_tid) = serve(page, 8);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let seconds = 15;
    let (thread_share, process_share, scrapes, (user, sys)) = rt.block_on(async {
        let targets = targets(&ports);
        let (state, monitor) = lmperf::server::start(&targets, None);
        // Warm-up: the first scrape of each (connections, identity).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let ok0: u64 = state.targets.iter().map(|t| t.view().scrapes_ok).sum();
        let us0 = thread_user_sys_ns();
        let (c0, p0, s0, w0) = (
            thread_cpu_ns(),
            process_cpu_ns(),
            task_cpu_ns(server_tid),
            Instant::now(),
        );
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let wall = w0.elapsed().as_nanos() as f64;
        let thread = (thread_cpu_ns() - c0) as f64 / wall;
        let us1 = thread_user_sys_ns();
        let user_sys = (
            us1.0.saturating_sub(us0.0) as f64 / wall,
            us1.1.saturating_sub(us0.1) as f64 / wall,
        );
        let server = task_cpu_ns(server_tid).saturating_sub(s0);
        let process = (process_cpu_ns() - p0).saturating_sub(server) as f64 / wall;
        let ok: u64 = state
            .targets
            .iter()
            .map(|t| t.view().scrapes_ok)
            .sum::<u64>()
            - ok0;
        monitor.stop().await;
        (thread, process, ok, user_sys)
    });
    println!(
        "scrapers, 8 targets at 1 s, {:.0} KiB realistic vLLM page: {:.3} % of one core on the scrapers' thread (user {:.3} %, system {:.3} %), {:.3} % for the process less the page servers' thread, over {seconds} s ({scrapes} pages read; target ≤ 0.2 %)",
        bytes as f64 / 1024.0,
        thread_share * 100.0,
        user * 100.0,
        sys * 100.0,
        process_share * 100.0,
    );
}

/// Fixed work for callgrind: 5 parses of the realistic 1 MiB page.
#[inline(never)]
fn parse_pages(page: &str) -> usize {
    let mut n = 0;
    for _ in 0..5 {
        let p = parse(page).expect("page");
        n += std::hint::black_box(normalize(&p, None))
            .requests_waiting
            .is_some() as usize;
    }
    n
}

/// Fixed work for callgrind: `rounds` rounds of one scrape per target (8 targets), after one
/// warm-up round (connections, identity).
async fn scrape_rounds(scrapers: &mut [Scraper], rounds: usize) -> usize {
    let mut ok = 0;
    for _ in 0..rounds {
        for s in scrapers.iter_mut() {
            ok += usize::from(s.scrape_once().await);
        }
    }
    ok
}

fn callgrind() {
    let page = realistic_page(1 << 20);
    println!("parse_pages: {}", parse_pages(&page));
    let (ports, _) = serve(realistic_page(64 << 10), 8);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = Scraper::client().expect("client");
        let mut scrapers: Vec<Scraper> = targets(&ports)
            .iter()
            .map(|t| {
                let ts = std::sync::Arc::new(TargetServer::new(&t.name, None, None));
                Scraper::new(t, ts, client.clone())
            })
            .collect();
        for s in scrapers.iter_mut() {
            s.scrape_once().await;
        }
        let rounds = std::env::var("LMPERF_BENCH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        println!(
            "scrape_rounds: {} pages",
            scrape_rounds(&mut scrapers, rounds).await
        );
    });
}

fn main() {
    if std::env::var("LMPERF_BENCH_MODE").as_deref() == Ok("callgrind") {
        callgrind();
        return;
    }
    println!(
        "build: {}",
        if cfg!(debug_assertions) {
            "debug assertions on (not the bench profile: figures not comparable)"
        } else {
            "optimized (cargo bench: the bench profile, i.e. release)"
        }
    );
    let realistic = realistic_page(1 << 20);
    parse_cost("realistic", &realistic);
    read_page_cost("realistic", &realistic);
    let fixture = fixture_page(1 << 20);
    parse_cost("fixture", &fixture);
    read_page_cost("fixture", &fixture);
    scrape_cost(realistic_page(64 << 10));
}
