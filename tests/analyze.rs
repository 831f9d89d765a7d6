//! `lmperf analyze` end to end (issue 12): the binary over a run directory (text, JSON,
//! scorecard.html rendered by headless Chromium, exit codes) and over a live agent's
//! `/api/v1/diagnosis`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lmperf_e2e::agent::{Agent, lmperf_bin};
use lmperf_e2e::temp;

/// A run of two benchmarks at 1 request/s for 10 min: `calm`, and `burst` whose server answers
/// 503 to 60 % of the requests from 360 s on.
fn write_run(dir: &Path) {
    let mut s = String::new();
    for bench in ["calm", "burst"] {
        for i in 0..600u32 {
            let send = f64::from(i) * 1000.0;
            // Deterministic ±10 % noise.
            let n =
                0.9 + 0.2 * f64::from((i * 7919 + bench.len() as u32 * 104_729) % 1000) / 1000.0;
            let line = if bench == "burst" && i >= 360 && i % 5 < 3 {
                serde_json::json!({"benchmark": bench, "repeat": 0, "send_ms": send, "e2el_ms": 4.0 * n,
                    "outcome": "error", "http_status": 503, "prompt_tokens": 100})
            } else {
                let (ttft, tpot) = (60.0 * n, 12.0 * (2.0 - n));
                serde_json::json!({"benchmark": bench, "repeat": 0, "send_ms": send,
                    "e2el_ms": ttft + 31.0 * tpot, "ttft_ms": ttft, "tpot_ms": tpot,
                    "outcome": "ok", "http_status": 200, "prompt_tokens": 100})
            };
            s.push_str(&line.to_string());
            s.push('\n');
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("requests.jsonl"), s).unwrap();
}

fn analyze(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(lmperf_bin())
        .arg("analyze")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn analyze_a_run_dir_as_text_json_and_html() {
    let dir = temp::dir("analyze-run");
    write_run(&dir);
    let d = dir.to_str().unwrap();
    let (code, text, err) = analyze(&[d]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("calm  no spike"), "{text}");
    assert!(text.contains("burst  root_confirmed"), "{text}");
    assert!(text.contains("error_burst"), "{text}");

    let (code, json, err) = analyze(&[d, "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["diagnosis"]["schema_version"], 1);
    let burst = v["diagnosis"]["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["target"] == "burst")
        .unwrap();
    assert_eq!(burst["state"], "root_confirmed");
    assert_eq!(burst["causes"][0]["cause"], "error_burst");
    assert!(
        burst["causes"][0]["score"].as_f64().unwrap() >= 0.75,
        "{burst}"
    );
    assert_eq!(v["timeline"]["burst"].as_array().unwrap().len(), 21);

    let page = dir.join("scorecard.html");
    let (code, _, err) = analyze(&[d, "--format", "html", "--output", page.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains(r#"<td class="hm top" data-cause="error_burst""#),
        "{html}"
    );
    if let Some(dom) = lmperf_e2e::chromium::dom(&page, &dir.join("profile")) {
        assert!(
            dom.contains(r#"data-target="burst" data-state="root_confirmed""#),
            "{dom}"
        );
        assert!(dom.contains("top-3 bottleneck heatmap"));
        assert!(dom.contains("<svg"));
    }

    // No requests.jsonl: exit 1 naming the file; nothing to analyze: exit 2.
    let empty = temp::dir("analyze-empty");
    let (code, _, err) = analyze(&[empty.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("requests.jsonl"), "{err}");
    let (code, _, err) = analyze(&[]);
    assert_eq!(code, 2, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&empty);
}

#[test]
fn analyze_a_live_agent() {
    // A target nobody listens on: the agent runs, its diagnosis lists the target.
    let agent = Agent::spawn(
        &[
            "--target",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--interval",
            "500ms",
            "--no-otlp",
        ],
        &[],
    );
    let addr = agent.admin.to_string();
    let t = Instant::now();
    let v = loop {
        let (code, json, err) = analyze(&["--agent", &addr, "--format", "json", "--window", "15m"]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        if v["diagnosis"]["targets"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
            || t.elapsed() > Duration::from_secs(20)
        {
            break v;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(v["source"], format!("agent {addr}"));
    assert_eq!(v["diagnosis"]["schema_version"], 1);
    let targets = v["diagnosis"]["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 1, "{v}");
    assert_eq!(targets[0]["state"], "idle");
    // An address nobody answers on: exit 1 naming it.
    let (code, _, err) = analyze(&["--agent", "127.0.0.1:9"]);
    assert_eq!(code, 1);
    assert!(err.contains("agent 127.0.0.1:9"), "{err}");
}

/// `lmperf analyze --prometheus`: Debian's Prometheus (1 s scrape) scrapes two real agents,
/// `node-a` and `node-b`, each with its own scripted model server. After 90 s of calm, node-a's
/// server answers 503 to 3 requests in 5 for 50 s; the analysis of the last 150 s through
/// Prometheus must name `error_burst` on node-a and say that one node moved. About 2.5 min.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyze_the_fleet_through_prometheus() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use lmperf_e2e::prometheus::{Prometheus, tool};
    use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};

    // A Prometheus nobody answers on: exit 1 naming it.
    let (code, _, err) = analyze(&["--prometheus", "http://127.0.0.1:9", "--window", "5m"]);
    assert_eq!(code, 1);
    assert!(err.contains("prometheus http://127.0.0.1:9: GET"), "{err}");
    let Some(bin) = tool("prometheus") else {
        return;
    };
    let failing = Arc::new(AtomicBool::new(false));
    let mut servers = Vec::new();
    for node in ["a", "b"] {
        let f = failing.clone();
        let n = Arc::new(AtomicU64::new(0));
        let faulty = node == "a";
        servers.push(
            ScriptedServer::start(Arc::new(move |_, _| {
                let i = n.fetch_add(1, Ordering::Relaxed);
                if faulty && f.load(Ordering::Relaxed) && i % 5 < 3 {
                    Reply::json(
                        503,
                        r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
                    )
                } else {
                    Reply::sse(chat_stream(
                        4,
                        Duration::from_millis(20),
                        Duration::from_millis(5),
                        8,
                    ))
                }
            }))
            .await,
        );
    }
    let urls: Vec<String> = servers.iter().map(ScriptedServer::url).collect();
    let out = tokio::task::spawn_blocking(move || {
        let agents: Vec<Agent> = urls
            .iter()
            .map(|u| {
                Agent::spawn(
                    &[
                        "--target",
                        u,
                        "--model",
                        "m",
                        "--interval",
                        "200ms",
                        "--no-otlp",
                    ],
                    &[],
                )
            })
            .collect();
        let mut config = "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: lmperf\n    static_configs:\n".to_owned();
        for (agent, node) in agents.iter().zip(["node-a", "node-b"]) {
            config.push_str(&format!(
                "      - targets: ['{}']\n        labels: {{node: {node}}}\n",
                agent.admin
            ));
        }
        let prom = Prometheus::start(&bin, &config, &[]);
        std::thread::sleep(Duration::from_secs(90));
        failing.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(50));
        let url = format!("http://{}", prom.addr);
        // The last 150 s at a 2 s step, rates over 10 s; `extra` flags after.
        let fleet = |extra: &[&str]| {
            let mut args = vec![
                "--prometheus",
                &url,
                "--window",
                "150s",
                "--step",
                "2s",
                "--rate-window",
                "10s",
            ];
            args.extend_from_slice(extra);
            analyze(&args)
        };
        let t = Instant::now();
        let (code, json, err) = fleet(&["--format", "json"]);
        let took = t.elapsed();
        let (_, text, _) = fleet(&[]);
        drop(prom);
        drop(agents);
        (code, json, err, text, took)
    })
    .await
    .unwrap();
    drop(servers);
    let (code, json, err, text, took) = out;
    println!("lmperf analyze --prometheus ({took:?}):\n{text}");
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let fleet = &v["fleet"];
    assert_eq!(fleet["nodes"], 2, "{fleet}");
    assert_eq!(fleet["scope"], "one_node", "{fleet}\n{text}");
    let moved = fleet["moved"].as_array().unwrap();
    assert_eq!(moved.len(), 1, "{fleet}");
    assert_eq!(moved[0]["node"], "node-a", "{fleet}");
    assert_eq!(moved[0]["cause"], "error_burst", "{fleet}\n{text}");
    assert_eq!(fleet["calm"][0]["node"], "node-b", "{fleet}");
    assert!(
        v["source"].as_str().unwrap().starts_with("prometheus "),
        "{v}"
    );
}
