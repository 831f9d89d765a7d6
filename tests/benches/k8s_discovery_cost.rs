//! What Kubernetes discovery costs the agent (issue 24), printed, not asserted: a 50,000-pod
//! cluster behind the scripted API server (`tests/support/kube_api.rs`, which applies the
//! `spec.nodeName` field selector server-side), 110 pods on this node of which 8 are annotated
//! model servers (scripted). Two agents in turn for the same window, alternating over
//! `LMPERF_BENCH_ROUNDS` rounds (the machine's other load drifts): the 8 servers discovered,
//! and the same 8 as static targets with discovery off. Printed: CPU (user + system, as a
//! share of one core) and RSS at steady state per run, the means, and the difference. While
//! measuring, one non-target pod of the node changes every second (status churn), as on a busy
//! node.
//!
//! `cargo xtask k8s-discovery-cost [--seconds N] [--rounds R]` builds the release `lmperf` and
//! runs this; by hand: `cargo build --release -p lmperf && cargo bench -p lmperf-e2e --bench
//! k8s_discovery_cost` (`LMPERF_BENCH_SECS` sets the window, default 30; `LMPERF_BENCH_ROUNDS`
//! the rounds, default 2).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lmperf_e2e::agent::Agent;
use lmperf_e2e::kube_api::{KubeApi, pod};
use lmperf_e2e::proc_cpu::cpu_of;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};

const NODE: &str = "node-1";

async fn measure(
    agent: &Agent,
    api: &KubeApi,
    churn: &mut serde_json::Value,
    window: Duration,
) -> (f64, f64) {
    // Warm-up: the first list, model discovery, first canaries.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (c0, t0) = (cpu_of(agent.pid()), Instant::now());
    let mut n = 0u64;
    while t0.elapsed() < window {
        n += 1;
        churn["metadata"]["annotations"]["bench/tick"] = n.to_string().into();
        api.apply(churn.clone());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let cpu = (cpu_of(agent.pid()) - c0).as_secs_f64() / t0.elapsed().as_secs_f64();
    let rss = agent.rss_kib().unwrap_or(0) as f64 / 1024.0;
    (cpu, rss)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let window = Duration::from_secs(
        std::env::var("LMPERF_BENCH_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    );
    let mut servers = Vec::new();
    for _ in 0..8 {
        servers.push(
            ScriptedServer::start(Arc::new(|req, _| match req.path.as_str() {
                "/v1/models" => Reply::json(200, r#"{"object":"list","data":[{"id":"m"}]}"#),
                p if p.ends_with("/completions") => Reply::sse(chat_stream(
                    8,
                    Duration::from_millis(20),
                    Duration::from_millis(5),
                    16,
                )),
                _ => Reply::json(404, "{}"),
            }))
            .await,
        );
    }
    let api = KubeApi::start().await;
    api.add_replicaset("llm", "vllm-5c6b8d", "vllm");
    for (i, s) in servers.iter().enumerate() {
        api.apply(pod(
            "llm",
            &format!("vllm-{i}"),
            NODE,
            "vllm",
            s.addr.port(),
            true,
            "vllm:v1",
        ));
    }
    for i in 0..102 {
        api.apply(pod(
            "apps",
            &format!("web-{i}"),
            NODE,
            "web",
            8080,
            false,
            "nginx",
        ));
    }
    api.apply_all((0..(50_000 - 110)).map(|i| {
        pod(
            "apps",
            &format!("far-{i}"),
            &format!("node-{}", 2 + i % 500),
            "web",
            8080,
            i % 10 == 0,
            "nginx",
        )
    }));
    let mut churn = api.pod("apps/web-0").expect("churn pod");
    let dir = std::env::temp_dir().join(format!("lmperf-k8s-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let head =
        "[canary]\nmax_tokens = 8\ninterval = \"1s\"\nserver_metrics = \"off\"\nmodel = \"m\"\n";
    let discovered = dir.join("discovered.toml");
    std::fs::write(
        &discovered,
        format!("{head}\n[discovery.kubernetes]\nenabled = true\nnode_name = \"{NODE}\"\n"),
    )
    .expect("config");
    let statics = dir.join("static.toml");
    // The same rate as the pods' `lmperf.dev/rate: "4"` (support/kube_api.rs).
    let mut text = head.to_owned();
    for (i, s) in servers.iter().enumerate() {
        text.push_str(&format!(
            "\n[[target]]\nurl = \"{}\"\nname = \"llm/vllm-{i}\"\nrate = 4.0\n",
            s.url()
        ));
    }
    std::fs::write(&statics, text).expect("config");

    let rounds: usize = std::env::var("LMPERF_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(2);
    println!(
        "k8s discovery cost: 50,000 pods in the cluster, 110 on the node, 8 targets; {window:?} per agent, {rounds} rounds (release build: {})",
        lmperf_e2e::agent::lmperf_bin().display()
    );
    // (cpu, rss) per run: [0] static, [1] discovered.
    let mut rows: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    let configs = [
        ("static (discovery off)", &statics),
        ("discovered", &discovered),
    ];
    for round in 0..rounds {
        // Alternate which goes first.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let (label, cfg) = configs[which];
            let (c, k) = (cfg.display().to_string(), kubeconfig.display().to_string());
            let agent = tokio::task::spawn_blocking(move || {
                Agent::spawn(
                    &["--config", &c, "--no-otlp"],
                    &[
                        ("KUBECONFIG", k.as_str()),
                        ("RUST_LOG", "warn,lmperf::agent=info"),
                    ],
                )
            })
            .await
            .expect("agent");
            let (cpu, rss) = measure(&agent, &api, &mut churn, window).await;
            let s = agent.status();
            let targets = s["targets"].as_array().map_or(0, Vec::len);
            let requests: u64 = s["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["requests"].as_u64())
                .sum();
            println!(
                "  round {round} {label:<24} CPU {:.3} % of a core   RSS {rss:.1} MiB   targets {targets}   canaries {requests}   discovery pods {} events-state {}",
                cpu * 100.0,
                s["discovery"]["pods"],
                s["discovery"]["state"]
            );
            rows[which].push((cpu, rss));
            drop(agent);
        }
    }
    let mean = |v: &[(f64, f64)]| {
        let n = v.len().max(1) as f64;
        (
            v.iter().map(|r| r.0).sum::<f64>() / n,
            v.iter().map(|r| r.1).sum::<f64>() / n,
        )
    };
    let (s_cpu, s_rss) = mean(&rows[0]);
    let (k_cpu, k_rss) = mean(&rows[1]);
    println!(
        "  mean static              CPU {:.3} % of a core   RSS {s_rss:.1} MiB",
        s_cpu * 100.0
    );
    println!(
        "  mean discovered          CPU {:.3} % of a core   RSS {k_rss:.1} MiB",
        k_cpu * 100.0
    );
    println!(
        "  discovery adds           CPU {:+.3} % of a core   RSS {:+.1} MiB   (issue 24 budget: <= 0.2 %, <= 10 MiB)",
        (k_cpu - s_cpu) * 100.0,
        k_rss - s_rss
    );
    println!(
        "  API server: {} lists, {} watches",
        api.counts.lists.load(std::sync::atomic::Ordering::Relaxed),
        api.counts
            .watches
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
