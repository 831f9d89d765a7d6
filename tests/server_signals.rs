//! Model server signals end to end: the real `lmperf` agent scraping the real llama.cpp server
//! (`/metrics` on, 2 slots) while the test overloads it, and restarted under another alias;
//! the scraper against scripted bad metrics endpoints.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fake_opentelemetry_collector::FakeCollectorServer;
use lmperf_e2e::agent::{Agent, prom_sum};
use lmperf_e2e::otlp::attrs;
use lmperf_e2e::peers::shared_model_server;
use lmperf_e2e::peers::{ModelServer, free_port};
use lmperf_e2e::prom_text;
use lmperf_e2e::serial;
use lmperf_e2e::temp;

/// A config file for one target at `url`, scraped every second.
fn config(dir: &std::path::Path, url: &str, canary_interval: &str) -> std::path::PathBuf {
    let path = dir.join("lmperf.toml");
    let text = format!(
        "[canary]\ninterval = \"{canary_interval}\"\nmax_tokens = 8\n\n[[target]]\nurl = \"{url}\"\nname = \"llama\"\nmetrics_interval = \"1s\"\n"
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// Starts the agent with `cfg`, exporting over gRPC to `endpoint`, every span kept.
async fn spawn_agent(
    cfg: std::path::PathBuf,
    endpoint: String,
    env: &'static [(&'static str, &'static str)],
) -> Agent {
    tokio::task::spawn_blocking(move || {
        let mut envs = vec![("OTEL_TRACES_SAMPLER", "always_on")];
        envs.extend_from_slice(env);
        Agent::spawn(
            &[
                "--config",
                cfg.to_str().unwrap(),
                "--otlp-protocol",
                "grpc",
                "--otlp-endpoint",
                &endpoint,
            ],
            &envs,
        )
    })
    .await
    .unwrap()
}

/// One blocking chat completion of `max_tokens` (no stream), with a long read timeout: a
/// request the server defers waits for a free slot.
fn chat(port: u16, max_tokens: u32) {
    let body = format!(
        r#"{{"model":"gemma-3-270m","max_tokens":{max_tokens},"messages":[{{"role":"user","content":"Write a long story about a lighthouse keeper."}}]}}"#
    );
    let Ok(mut s) = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    ) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
    let _ = write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
}

/// Runs `clients` closed-loop clients against the server until `stop` (each bounded by 60 s).
fn overload(port: u16, clients: usize, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    (0..clients)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                while !stop.load(Ordering::Relaxed) && t.elapsed() < Duration::from_secs(60) {
                    chat(port, 48);
                }
            })
        })
        .collect()
}

/// Drains the collector's span and metric channels (64 deep each: a full one stalls the
/// agent's exporter) until `job` finishes, then for `tail` more.
async fn drain_until<T>(
    collector: &mut FakeCollectorServer,
    job: tokio::task::JoinHandle<T>,
    tail: Duration,
) -> (
    T,
    Vec<fake_opentelemetry_collector::ExportedSpan>,
    Vec<String>,
) {
    let (mut spans, mut metrics) = (Vec::new(), Vec::new());
    let mut drain = |sp: Vec<fake_opentelemetry_collector::ExportedSpan>,
                     ms: Vec<fake_opentelemetry_collector::ExportedMetric>| {
        spans.extend(sp);
        metrics.extend(
            ms.into_iter()
                .flat_map(|e| e.metrics.into_iter().map(|m| m.name)),
        );
    };
    while !job.is_finished() {
        let sp = collector
            .exported_spans(1 << 20, Duration::from_millis(200))
            .await;
        let ms = collector
            .exported_metrics(1 << 20, Duration::from_millis(50))
            .await;
        drain(sp, ms);
    }
    let out = job.await.unwrap();
    let sp = collector.exported_spans(1 << 20, tail).await;
    let ms = collector
        .exported_metrics(1 << 20, Duration::from_millis(50))
        .await;
    drain(sp, ms);
    (out, spans, metrics)
}

/// Acceptance 1: more concurrent requests than `--parallel` slots: the agent's
/// `lmperf_server_requests_waiting` rises above 0, `requests.running` equals the busy slots
/// (2), its token counters equal the server's own counter deltas, and canary spans carry the
/// queue at their send.
#[tokio::test(flavor = "multi_thread")]
async fn overloaded_llamacpp_queue_running_tokens_and_span_attributes() {
    let _serial = serial::lock().await;
    let server = tokio::task::spawn_blocking(shared_model_server)
        .await
        .unwrap();
    let port = server.port;
    let mut collector = FakeCollectorServer::start().await.unwrap();
    let dir = temp::dir("server-overload");
    let cfg = config(&dir, &server.url(), "700ms");
    let before = prom_sum(&server.metrics(), "llamacpp:tokens_predicted_total", &[]);
    let endpoint = collector.endpoint();
    let agent = spawn_agent(cfg, endpoint, &[("OTEL_METRIC_EXPORT_INTERVAL", "1000")]).await;
    let agent = Arc::new(agent);

    let checked = {
        let agent = agent.clone();
        tokio::task::spawn_blocking(move || {
            // The first scrape: kind, model and version from /props.
            let s = agent.wait_status(Duration::from_secs(30), |s| {
                s["server"][0]["mode"] == "on" && !s["server"][0]["model"].is_null()
            });
            let sv = &s["server"][0];
            assert_eq!(
                (sv["kind"].as_str(), sv["model"].as_str()),
                (Some("llama.cpp"), Some("gemma-3-270m")),
                "{s}"
            );
            assert!(sv["version"].is_string(), "{sv}");

            let stop = Arc::new(AtomicBool::new(false));
            let clients = overload(port, 8, stop.clone());
            let (mut max_waiting, mut max_running) = (0.0_f64, 0.0_f64);
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(40)
                && !(max_waiting > 0.0
                    && max_running >= 2.0
                    && t.elapsed() > Duration::from_secs(6))
            {
                let (_, m) = agent.get("/metrics");
                max_waiting = max_waiting.max(
                    prom_text::first(&m, "lmperf_server_requests_waiting", &[]).unwrap_or(0.0),
                );
                max_running = max_running.max(
                    prom_text::first(&m, "lmperf_server_requests_running", &[]).unwrap_or(0.0),
                );
                std::thread::sleep(Duration::from_millis(250));
            }
            stop.store(true, Ordering::Relaxed);
            for c in clients {
                let _ = c.join();
            }
            assert!(
                max_waiting > 0.0,
                "lmperf_server_requests_waiting never rose above 0 under 8 clients on 2 slots"
            );
            // 2 slots (--parallel 2): running is the busy slots, never more.
            assert_eq!(max_running, 2.0);

            // Token counters: the agent's total equals the server's counter delta since the
            // agent's first scrape (`before`: nothing ran between reading it and that scrape).
            // Read around one agent scrape: the server's counter c1 before it and c2 after it
            // bound what that scrape saw, c1 ≤ before + agent total ≤ c2; at a moment the
            // counter stood still (c1 = c2, usual on a quiet machine) that is an equality. On a
            // loaded machine the canaries may keep the counter moving: the bounds still hold.
            let mut last = None;
            for _ in 0..20 {
                let c1 = prom_sum(&server.metrics(), "llamacpp:tokens_predicted_total", &[]);
                let scrape0 = agent.status()["server"][0]["last_scrape_unix_s"]
                    .as_f64()
                    .unwrap_or(0.0);
                let s = agent.wait_status(Duration::from_secs(3), |s| {
                    s["server"][0]["last_scrape_unix_s"].as_f64().unwrap_or(0.0) > scrape0
                });
                if s["server"][0]["last_scrape_unix_s"].as_f64().unwrap_or(0.0) <= scrape0 {
                    continue;
                }
                let (_, m) = agent.get("/metrics");
                let c2 = prom_sum(&server.metrics(), "llamacpp:tokens_predicted_total", &[]);
                let agent_total = prom_sum(&m, "lmperf_server_generation_tokens_total", &[]);
                last = Some((c1 - before, agent_total, c2 - before));
                if c1 == c2 {
                    break;
                }
            }
            let (low, agent_total, high) = last.expect("the agent never scraped again");
            assert!(high >= 48.0, "at least one 48-token request: {high}");
            assert!(
                agent_total >= low - 1e-6 && agent_total <= high + 1e-6,
                "agent {agent_total} outside the server's delta [{low}, {high}]"
            );
            max_waiting
        })
    };
    let (_max_waiting, spans, names) =
        drain_until(&mut collector, checked, Duration::from_secs(3)).await;

    // Canary spans: the queue at send, with the scrape's age (≤ interval + a loaded machine's slack).
    let with_server: Vec<BTreeMap<String, String>> = spans
        .iter()
        .map(|s| attrs(&s.attributes))
        .filter(|a| a.contains_key("lmperf.server.requests.waiting"))
        .collect();
    assert!(!with_server.is_empty(), "no span carries lmperf.server.*");
    let queued = with_server
        .iter()
        .filter(|a| a["lmperf.server.requests.waiting"].parse::<f64>().unwrap() > 0.0)
        .count();
    assert!(queued > 0, "no canary span saw the queue: {with_server:?}");
    // A scrape under this load may time out (the server answers /metrics between decode
    // steps), so a span may see an older one; the age says so, and the freshest is recent.
    let ages: Vec<f64> = with_server
        .iter()
        .map(|a| a["lmperf.server.scrape.age"].parse().unwrap())
        .collect();
    assert!(ages.iter().all(|a| (0.0..60.0).contains(a)), "{ages:?}");
    assert!(
        ages.iter().cloned().fold(f64::INFINITY, f64::min) < 1.5,
        "{ages:?}"
    );
    assert!(
        with_server
            .iter()
            .all(|a| a.contains_key("lmperf.server.requests.running"))
    );
    // The normalized signals reach OTLP too.
    for n in [
        "lmperf.server.requests.waiting",
        "lmperf.server.requests.running",
        "lmperf.server.generation_tokens",
        "lmperf.server.info",
    ] {
        assert!(
            names.iter().any(|x| x == n),
            "{n} not exported over OTLP: {names:?}"
        );
    }
    if let Ok(a) = Arc::try_unwrap(agent) {
        a.sigterm();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Acceptance 3: the server restarted under another `--alias` while the agent runs: exactly one
/// `model` change event with the old and new model, in the log, `/api/v1/status`, the next
/// canary span and `lmperf_server_changes_total`.
#[tokio::test(flavor = "multi_thread")]
async fn restart_under_another_alias_is_one_model_change() {
    let _serial = serial::lock().await;
    let port = free_port();
    let server =
        tokio::task::spawn_blocking(move || ModelServer::start_with(port, &["--alias", "model-a"]))
            .await
            .unwrap();
    let mut collector = FakeCollectorServer::start().await.unwrap();
    let dir = temp::dir("server-restart");
    let cfg = config(&dir, &server.url(), "1s");
    let endpoint = collector.endpoint();
    let agent = spawn_agent(cfg, endpoint, &[]).await;
    let agent = Arc::new(agent);
    let a2 = agent.clone();
    let job = tokio::task::spawn_blocking(move || {
        let s = a2.wait_status(Duration::from_secs(30), |s| {
            s["server"][0]["model"] == "model-a"
        });
        assert_eq!(s["server"][0]["model"], "model-a", "{s}");
        drop(server);
        let server = ModelServer::start_with(port, &["--alias", "model-b"]);
        let s = a2.wait_status(Duration::from_secs(60), |s| {
            s["server"][0]["model"] == "model-b" && s["targets"][0]["model"] == "model-b"
        });
        // Let a canary or two carry the event.
        std::thread::sleep(Duration::from_secs(4));
        let s2 = a2.status();
        (s, s2, server)
    });
    let ((s, s2, _server), spans, _) =
        drain_until(&mut collector, job, Duration::from_secs(3)).await;
    assert_eq!(s["server"][0]["model"], "model-b", "{s}");
    let changes = s2["server"][0]["changes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let model_changes: Vec<_> = changes.iter().filter(|c| c["kind"] == "model").collect();
    assert_eq!(model_changes.len(), 1, "{s2}\n{}", agent.stderr_text());
    assert_eq!(
        (
            model_changes[0]["old"].as_str(),
            model_changes[0]["new"].as_str()
        ),
        (Some("model-a"), Some("model-b"))
    );
    let (_, m) = agent.get("/metrics");
    assert_eq!(
        prom_sum(
            &m,
            "lmperf_server_changes_total",
            &["lmperf_server_change_kind=\"model\""]
        ),
        1.0,
        "{m}"
    );
    assert!(
        agent.stderr_text().contains("Server change.")
            || agent.stdout_text().contains("Server change."),
        "no log line"
    );
    // The next canary span after the change carries it; a canary may still be in flight.
    let mut spans = spans;
    let is_change = |name: &str, a: &BTreeMap<String, String>| {
        name == "lmperf.server.change"
            && attrs(a)
                .get("lmperf.server.change.kind")
                .map(String::as_str)
                == Some("model")
    };
    let t = Instant::now();
    while !spans
        .iter()
        .any(|s| s.events.iter().any(|e| is_change(&e.name, &e.attributes)))
        && t.elapsed() < Duration::from_secs(20)
    {
        spans.extend(
            collector
                .exported_spans(1 << 20, Duration::from_millis(500))
                .await,
        );
    }
    let carried: Vec<_> = spans
        .iter()
        .flat_map(|s| s.events.iter())
        .filter(|e| is_change(&e.name, &e.attributes))
        .map(|e| attrs(&e.attributes))
        .collect();
    let all_events: Vec<_> = spans
        .iter()
        .flat_map(|s| {
            s.events
                .iter()
                .map(|e| (e.name.clone(), e.attributes.clone()))
        })
        .collect();
    assert_eq!(
        carried.len(),
        1,
        "{} spans, events {all_events:?}",
        spans.len()
    );
    assert_eq!(
        (
            carried[0]["lmperf.server.change.old"].as_str(),
            carried[0]["lmperf.server.change.new"].as_str()
        ),
        ("model-a", "model-b")
    );
    if let Ok(a) = Arc::try_unwrap(agent) {
        a.sigterm();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Acceptance 4: `lmperf run` at 6 concurrent requests against the real 2-slot server:
/// `summary.json`'s `server.waiting_max > 0`, and `report.html` draws the queue plot beside
/// the client's TTFT (rendered in headless Chromium when present).
#[test]
fn lmperf_run_against_the_overloaded_server_reports_its_queue() {
    let _serial = serial::lock_blocking();
    let server = shared_model_server();
    let dir = temp::dir("server-run");
    let out = std::process::Command::new(lmperf_e2e::agent::lmperf_bin())
        .args([
            "run",
            "--target",
            &server.url(),
            "--batch-sizes",
            "6",
            "--seq-lengths",
            "32",
            "--num-prompts",
            "10",
            "--output-len",
            "16",
            "--warmup",
            "0",
        ])
        .arg("--output-dir")
        .arg(&dir)
        .output()
        .expect("run lmperf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let b = &summary["benchmarks"][0];
    let sv = &b["server"];
    assert_eq!(
        (sv["kind"].as_str(), sv["model"].as_str()),
        (Some("llama.cpp"), Some("gemma-3-270m")),
        "{sv}"
    );
    assert!(
        sv["waiting_max"].as_f64().unwrap() > 0.0,
        "6 requests on 2 slots queue: {sv}"
    );
    assert_eq!(sv["running_max"].as_f64(), Some(2.0), "{sv}");
    // The server's token counter over the benchmark equals the tokens the run received
    // (only this run talks to the server).
    let generated = sv["generation_tokens"].as_f64().unwrap();
    assert_eq!(
        generated,
        b["total_output_tokens"].as_f64().unwrap(),
        "{sv}"
    );
    assert!(sv["timeline"].as_array().unwrap().len() >= 2);
    // server_samples.jsonl: the scrapes between the benchmark's start and end reads, as the
    // timeline has them (absent when the benchmark was shorter than one scrape interval).
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("server_samples.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        rows.len(),
        sv["timeline"].as_array().unwrap().len() - 2,
        "{rows:?}"
    );
    for r in &rows {
        assert_eq!(r["benchmark"], b["benchmark"], "{r}");
        assert!(r["t_ms"].as_f64().unwrap() >= 0.0, "{r}");
        assert!(r["requests_running"].as_f64().unwrap() <= 2.0, "{r}");
    }
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    // Issue 50.4: llama.cpp's timings start when a slot takes the request, so with 6 requests
    // on 2 slots the client − server gap holds their wait for a slot, and says so beside the
    // server's waiting requests (not "network").
    let timing = &b["server_timing"];
    assert_eq!(
        timing["gap_holds"], "network_client_front_end_and_slot_wait",
        "{timing}"
    );
    assert!(
        html.contains(r#"data-gap-holds="network_client_front_end_and_slot_wait""#)
            && html.contains("network, client, front end and the wait for a slot")
            && html.contains("server waiting (mean / max)"),
        "server timing section"
    );
    let ttft = html.find("TTFT over time").expect("client TTFT plot");
    let queue = html
        .find("Server queue over time")
        .expect("server queue plot");
    assert!(queue > ttft, "the queue plot follows the TTFT plot");
    assert!(html.contains(&format!(
        r#"data-waiting-max="{}""#,
        sv["waiting_max"].as_f64().unwrap()
    )));
    if let Some(dom) =
        lmperf_e2e::chromium::dom(&dir.join("report.html"), &dir.join("chromium-profile"))
    {
        assert!(
            dom.contains("Server queue over time") && dom.contains("<polyline"),
            "rendered DOM lacks the queue plot"
        );
        assert!(dom.contains(r#"<table class="server">"#));
    }
    let _ = std::fs::remove_dir_all(dir);
}
