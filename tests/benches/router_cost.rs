//! What a router target's direct paths cost the agent (issue 52's budget: a router target with
//! 4 workers probed adds ≤ 0.2 % of a core), printed, not asserted. Two agents side by side for
//! one window, each with one router target: a scripted router (its `/list_workers` names 4
//! scripted workers, each streaming a short chat answer) canaried once a second; one agent with
//! its direct paths on (each worker a direct canary every `direct_interval`, default 5 s, and
//! the router's list read every 30 s), the other with `direct_paths = false`. Printed: each
//! one's CPU (user + system, a share of one core) and the difference, the direct paths' cost.
//!
//! `cargo build --release -p lmperf --no-default-features`, then
//! `LMPERF_BIN=$PWD/target/release/lmperf cargo bench -p lmperf-e2e --bench router_cost`
//! (`LMPERF_BENCH_SECS` sets the window, default 60; `LMPERF_BENCH_DIRECT_INTERVAL` the
//! direct interval, default 5s). Only agents measured at once compare on a shared VM.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lmperf_e2e::agent::Agent;
use lmperf_e2e::proc_cpu::cpu_of;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};

const WORKERS: usize = 4;

fn answer() -> Reply {
    Reply::sse(chat_stream(
        4,
        Duration::from_millis(5),
        Duration::from_millis(2),
        16,
    ))
}

async fn worker() -> ScriptedServer {
    ScriptedServer::start(Arc::new(|req, _| match req.path.as_str() {
        "/v1/models" => Reply::json(200, r#"{"object":"list","data":[{"id":"m"}]}"#),
        p if p.ends_with("/chat/completions") => answer(),
        _ => Reply::json(404, "{}"),
    }))
    .await
}

fn agent(router: &str, dir: &std::path::Path, direct: bool, interval: &str) -> Agent {
    let cfg = dir.join(format!("agent-{direct}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[canary]\ninterval = \"1s\"\nmax_tokens = 4\n\n[[target]]\nurl = \"{router}\"\nname = \"router\"\nmodel = \"m\"\nkind = \"router\"\nworker_probes = false\nserver_metrics = \"off\"\ndirect_paths = {direct}\ndirect_interval = \"{interval}\"\n"
        ),
    )
    .expect("write the agent's config");
    let cfg = cfg.to_string_lossy().into_owned();
    Agent::spawn(&["--config", &cfg, "--no-otlp"], &[])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::var("LMPERF_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let interval =
        std::env::var("LMPERF_BENCH_DIRECT_INTERVAL").unwrap_or_else(|_| "5s".to_owned());
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        workers.push(worker().await);
    }
    let list = serde_json::json!({
        "urls": workers.iter().map(ScriptedServer::url).collect::<Vec<_>>()
    })
    .to_string();
    let router = ScriptedServer::start(Arc::new(move |req, _| match req.path.as_str() {
        "/list_workers" => Reply::json(200, &list),
        "/v1/models" => Reply::json(200, r#"{"object":"list","data":[{"id":"m"}]}"#),
        p if p.ends_with("/chat/completions") => answer(),
        _ => Reply::json(404, "{}"),
    }))
    .await;
    let dir = lmperf_e2e::temp::dir("router-cost");
    let url = router.url();
    let (on, off) = tokio::task::spawn_blocking(move || {
        (
            agent(&url, &dir, true, &interval),
            agent(&url, &dir, false, &interval),
        )
    })
    .await
    .expect("spawn the agents");
    // Warm-up: the router's list read, the first direct canaries, the allocator settled.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (on0, off0, t0) = (cpu_of(on.pid()), cpu_of(off.pid()), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let wall = t0.elapsed().as_secs_f64();
    let share = |c0: Duration, pid: u32| (cpu_of(pid) - c0).as_secs_f64() / wall;
    let (a, b) = (share(on0, on.pid()), share(off0, off.pid()));
    let status = on.status();
    let path = &status["targets"][0]["path"];
    let direct: u64 = path["workers"]
        .as_array()
        .map(|w| w.iter().filter_map(|w| w["requests"].as_u64()).sum())
        .unwrap_or(0);
    println!(
        "router target, {WORKERS} workers, a {secs} s window, side by side:\n  direct paths on:  {:.3} % of a core ({direct} direct canaries so far; {})\n  direct paths off: {:.3} % of a core\n  the direct paths' cost: {:+.3} % of a core (budget 0.2 %)",
        a * 100.0,
        path["ttft"]["says"].as_str().unwrap_or("-"),
        b * 100.0,
        (a - b) * 100.0
    );
}
