//! Soak: the real agent at 50 canaries/s (every span kept) against a scripted server while the
//! collector is down for `LMPERF_SOAK_MINUTES` (default 10); the agent's RSS every 10 s; then
//! the collector (rotel) comes up on the configured port, and the time until spans flow again
//! is the recovery time. Prints figures; not a test.
//! `cargo bench -p lmperf-e2e --bench export_soak` (needs `cargo build -p lmperf`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lmperf_e2e::agent::Agent;
use lmperf_e2e::peers::{QuietCollector, free_port};
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let minutes: f64 = std::env::var("LMPERF_SOAK_MINUTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let server = ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(chat_stream(
            8,
            Duration::from_millis(5),
            Duration::from_millis(2),
            20,
        ))
    }))
    .await;
    let (grpc, http) = (free_port(), free_port());
    let url = server.url();
    let endpoint = format!("http://127.0.0.1:{grpc}");
    let agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &[
                "--target",
                &url,
                "--model",
                "m",
                "--rate",
                "50",
                "--arrival",
                "poisson",
                "--otlp-protocol",
                "grpc",
                "--otlp-endpoint",
                &endpoint,
            ],
            &[
                ("OTEL_TRACES_SAMPLER", "always_on"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "10000"),
            ],
        )
    })
    .await
    .expect("agent");
    println!(
        "collector down for {minutes} min; agent at 50 canaries/s, every span kept; RSS every 10 s"
    );
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "t_s", "rss_MB", "requests", "queued", "dropped", "failed"
    );
    let down = Duration::from_secs_f64(minutes * 60.0);
    let t0 = Instant::now();
    let mut tick = 0u32;
    let print = |agent: &Agent, t0: Instant| {
        let s = agent.status();
        let e = &s["exporter"];
        println!(
            "{:>6.0} {:>9.1} {:>9} {:>9} {:>9} {:>9}",
            t0.elapsed().as_secs_f64(),
            agent.rss_kib().unwrap_or(0) as f64 / 1024.0,
            s["targets"][0]["requests"],
            e["queue_len"],
            e["dropped_queue_full"],
            e["failed"]
        );
        s
    };
    while t0.elapsed() < down {
        print(&agent, t0);
        tick += 1;
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            t0 + Duration::from_secs(10 * u64::from(tick)),
        ))
        .await;
    }
    let before = agent.status()["exporter"]["exported"].as_u64().unwrap_or(0);
    let t_up = Instant::now();
    let _collector = tokio::task::spawn_blocking(move || QuietCollector::start(grpc, http))
        .await
        .expect("collector");
    let started = t_up.elapsed();
    let recovered = loop {
        let s = agent.status();
        if s["exporter"]["exported"].as_u64().unwrap_or(0) > before {
            break t_up.elapsed();
        }
        if t_up.elapsed() > Duration::from_secs(120) {
            println!("no recovery within 120 s");
            break t_up.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "collector up after {:.1} s (process start); spans flowing again {:.1} s after the collector was started",
        started.as_secs_f64(),
        recovered.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    let s = print(&agent, t0);
    let e = &s["exporter"];
    println!(
        "30 s after recovery: exported {}, dropped {}, failed {}, export errors {}",
        e["exported"], e["dropped_queue_full"], e["failed"], e["export_errors"]
    );
    let warns = agent
        .stderr_text()
        .lines()
        .filter(|l| l.contains("WARN"))
        .count();
    println!("warning lines over the whole run: {warns}");
}
