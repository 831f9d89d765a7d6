//! Model server scraping cost: `cargo bench -p lmperf --bench server_scrape`.
//!
//! 1. Parsing (and normalizing) a 1 MiB vLLM page: the fixture `vllm-new.b.prom` with its
//!    series repeated under more `engine` labels until the page is 1 MiB; CPU time per page
//!    from `/proc/thread-self/schedstat` (target ≤ 5 ms).
//! 2. The scrapers' CPU at a 1 s interval with 8 targets: 8 `Scraper` loops on one
//!    current-thread runtime (this thread), reading a 64 KiB vLLM page from a server on
//!    another thread (keep-alive), for 15 s; this thread's CPU time as a share of one core
//!    (target ≤ 0.2 %). HTTP, parsing, normalizing and publishing are all included.

use std::time::{Duration, Instant};

use lmperf::config::raw::RawCanary;
use lmperf::config::{self, Env, Overrides};
use lmperf::server::normalize::normalize;
use lmperf::server::parse::parse;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The fixture page with its vLLM series repeated under engines 0.. until `bytes`.
fn vllm_page(bytes: usize) -> String {
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

fn parse_cost() {
    let page = vllm_page(1 << 20);
    let runs = 60;
    let mut best = u64::MAX;
    let t0 = thread_cpu_ns();
    for _ in 0..runs {
        let t = thread_cpu_ns();
        let p = parse(&page).expect("page");
        let r = normalize(&p, None);
        std::hint::black_box(r);
        best = best.min(thread_cpu_ns() - t);
    }
    let mean_ms = (thread_cpu_ns() - t0) as f64 / f64::from(runs) / 1e6;
    let series = parse(&page).map(|p| p.samples.len()).unwrap_or(0);
    println!(
        "parse+normalize a {:.2} MiB vLLM page ({series} series): mean {mean_ms:.2} ms CPU, best {:.2} ms (target ≤ 5 ms)",
        page.len() as f64 / 1048576.0,
        best as f64 / 1e6
    );
}

fn scrape_cost() {
    // The page server runs on its own thread and runtime (HTTP/1.1 keep-alive, as uvicorn and
    // llama.cpp answer): only this thread's CPU, where the scrapers run, is measured.
    let page = vllm_page(64 << 10);
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = std_listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let _ = std_listener.set_nonblocking(true);
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            let app = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move || {
                    let p = page.clone();
                    async move { p }
                }),
            );
            let _ = axum::serve(listener, app).await;
        });
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let seconds = 15;
    let (cpu_ns, scrapes) = rt.block_on(async {
        let url = format!("http://127.0.0.1:{port}");
        let mut targets = Vec::new();
        for i in 0..8 {
            let o = Overrides {
                targets: vec![url.clone()],
                canary: RawCanary {
                    model: Some("m".into()),
                    name: Some(format!("t{i}")),
                    metrics_interval: Some(Duration::from_secs(1)),
                    ..RawCanary::default()
                },
                ..Overrides::default()
            };
            targets.push(config::load(o, &NoEnv).expect("config").targets.remove(0));
        }
        let (state, monitor) = lmperf::server::start(&targets, None);
        // Warm-up: the first scrape of each (connections, identity).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let ok0: u64 = state.targets.iter().map(|t| t.view().scrapes_ok).sum();
        let (c0, w0) = (thread_cpu_ns(), Instant::now());
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let cpu = (thread_cpu_ns() - c0) as f64 / w0.elapsed().as_nanos() as f64;
        let ok: u64 = state
            .targets
            .iter()
            .map(|t| t.view().scrapes_ok)
            .sum::<u64>()
            - ok0;
        monitor.stop().await;
        (cpu, ok)
    });
    println!(
        "scrapers, 8 targets at 1 s, 64 KiB vLLM page: {:.3} % of one core over {seconds} s ({scrapes} pages read; target ≤ 0.2 %)",
        cpu_ns * 100.0
    );
}

fn main() {
    parse_cost();
    scrape_cost();
}
