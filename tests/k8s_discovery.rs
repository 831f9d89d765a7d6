//! Kubernetes discovery end to end on loopback (issue 24): the real agent, through a kubeconfig
//! file (its production code path: `kube`'s client and watcher), against the scripted API server
//! of `support/kube_api.rs`, with scripted vLLM-style servers as the pods of two Deployments and
//! the real llama.cpp server as the pod of a third on this node, and 2,000 annotated pods on
//! other nodes.
//!
//! It checks: exactly this node's annotated Ready pods are canaried, beside a static target;
//! spans and series carry namespace / pod / deployment; a deleted pod's canaries stop within
//! one watch event; a new Ready pod starts within 5 s; a restart with `OOMKilled` is one
//! `restart` change with the reason; a replacement with a new image is one `rollout`; a 410
//! Gone relists without duplicating targets; a dropped watch resumes; a 403 is said in the
//! status while every target goes on. InferencePools: a missing CRD is said in the status while
//! annotated pods are canaried; a pool selecting 2 pods gives 2 targets at podIP:targetPort
//! carrying the pool's name; the pool deleted, they are gone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_opentelemetry_collector::FakeCollectorServer;
use lmperf_e2e::agent::{Agent, prom_sum};
use lmperf_e2e::kube_api::{KubeApi, inference_pool, pod};
use lmperf_e2e::otlp::attrs;
use lmperf_e2e::peers::shared_model_server;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
use lmperf_e2e::serial;
use lmperf_e2e::targets::{changes, completions, target, target_names};
use serde_json::Value;

const NODE: &str = "node-1";
const NS: &str = "llm";

async fn vllm() -> ScriptedServer {
    vllm_at("127.0.0.1:0").await
}

/// A scripted vLLM-style server on `bind` (another loopback address stands for another pod IP).
async fn vllm_at(bind: &str) -> ScriptedServer {
    let bind = bind.parse().expect("a socket address");
    ScriptedServer::start_at(
        bind,
        Arc::new(|req, _| match req.path.as_str() {
            "/v1/models" => Reply::json(
                200,
                r#"{"object":"list","data":[{"id":"m","owned_by":"vllm"}]}"#,
            ),
            p if p.ends_with("/completions") => Reply::sse(chat_stream(
                3,
                Duration::from_millis(5),
                Duration::from_millis(2),
                4,
            )),
            _ => Reply::json(404, r#"{"error":"not scripted"}"#),
        }),
        None,
    )
    .await
}

async fn wait(
    agent: &Agent,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> (Value, Duration) {
    let t = Instant::now();
    loop {
        let s = agent.status();
        if pred(&s) || t.elapsed() > timeout {
            return (s, t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_canaries_exactly_this_nodes_annotated_pods() {
    // One pod is the real llama.cpp server (shared: one test at a time sends to it).
    let _serial = serial::lock().await;
    let llama = tokio::task::spawn_blocking(shared_model_server)
        .await
        .unwrap();
    let llama_before = prom_sum(&llama.metrics(), "llamacpp:tokens_predicted_total", &[]);
    let api = KubeApi::start().await;
    api.add_replicaset(NS, "vllm-a-5c6b8d", "vllm-a");
    api.add_replicaset(NS, "vllm-b-5c6b8d", "vllm-b");
    api.add_replicaset(NS, "llama-5c6b8d", "llama");
    let mut servers = BTreeMap::new();
    for name in [
        "vllm-a-0", "vllm-a-1", "vllm-b-0", "vllm-b-1", "vllm-a-2", "vllm-b-2", "static",
    ] {
        servers.insert(name, vllm().await);
    }
    let port = |n: &str| servers[n].addr.port();
    for n in ["vllm-a-0", "vllm-a-1"] {
        api.apply(pod(
            NS,
            n,
            NODE,
            "vllm-a",
            port(n),
            true,
            "vllm/vllm-openai:v0.9.0",
        ));
    }
    for n in ["vllm-b-0", "vllm-b-1"] {
        api.apply(pod(
            NS,
            n,
            NODE,
            "vllm-b",
            port(n),
            true,
            "vllm/vllm-openai:v0.9.0",
        ));
    }
    let mut real = pod(
        NS,
        "llama-0",
        NODE,
        "llama",
        llama.port,
        true,
        "ghcr.io/ggml-org/llama.cpp:server",
    );
    real["metadata"]["annotations"]["lmperf.dev/model"] = "gemma-3-270m".into();
    api.apply(real);
    // On this node but not targets: not annotated; annotated but not Ready.
    api.apply(pod(NS, "plain", NODE, "web", 1, false, "nginx"));
    let mut unready = pod(
        NS,
        "vllm-a-starting",
        NODE,
        "vllm-a",
        1,
        true,
        "vllm/vllm-openai:v0.9.0",
    );
    unready["status"]["conditions"][0]["status"] = "False".into();
    api.apply(unready);
    // 2,000 annotated pods on other nodes (port 1: a canary to them would fail loudly).
    api.apply_all((0..2000).map(|i| {
        pod(
            NS,
            &format!("other-{i}"),
            &format!("node-{}", 2 + i % 50),
            "vllm-a",
            1,
            true,
            "x",
        )
    }));

    let dir = std::env::temp_dir().join(format!("lmperf-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[canary]\nmax_tokens = 4\ninterval = \"250ms\"\n\n[[target]]\nurl = \"{}\"\nname = \"static\"\nmodel = \"m\"\nserver_metrics = \"off\"\n\n[discovery.kubernetes]\nenabled = true\nnode_name = \"{NODE}\"\n",
            servers["static"].url()
        ),
    )
    .unwrap();
    let mut collector = FakeCollectorServer::start().await.unwrap();
    let endpoint = collector.endpoint();
    let (cfg, kc) = (
        config.display().to_string(),
        kubeconfig.display().to_string(),
    );
    let agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &[
                "--config",
                &cfg,
                "--otlp-protocol",
                "grpc",
                "--otlp-endpoint",
                &endpoint,
            ],
            &[
                ("KUBECONFIG", kc.as_str()),
                ("OTEL_TRACES_SAMPLER", "always_on"),
                ("RUST_LOG", "info,kube=warn"),
            ],
        )
    })
    .await
    .unwrap();

    // Exactly this node's annotated Ready pods, beside the static target.
    let want = |extra: &[&str]| {
        let mut v: Vec<String> = ["static"]
            .iter()
            .chain(extra)
            .map(|n| {
                if *n == "static" {
                    (*n).to_owned()
                } else {
                    format!("{NS}/{n}")
                }
            })
            .collect();
        v.sort();
        v
    };
    let first = want(&["llama-0", "vllm-a-0", "vllm-a-1", "vllm-b-0", "vllm-b-1"]);
    let (s, _) = wait(&agent, Duration::from_secs(30), |s| {
        target_names(s) == first
            && s["targets"]
                .as_array()
                .is_some_and(|a| a.iter().all(|t| t["requests"].as_u64() >= Some(2)))
    })
    .await;
    assert_eq!(target_names(&s), first, "{s:#}");
    let d = &s["discovery"];
    assert_eq!(d["source"], "apiserver", "{d}");
    assert_eq!(d["node"], NODE);
    assert_eq!(d["pods"], 7, "this node's pods only (field selector): {d}");
    assert_eq!(d["targets"], 5, "{d}");
    let a0 = target(&s, "llm/vllm-a-0");
    assert_eq!(a0["k8s"]["k8s.namespace.name"], NS, "{a0}");
    assert_eq!(a0["k8s"]["k8s.pod.name"], "vllm-a-0");
    assert_eq!(a0["k8s"]["k8s.pod.uid"], "uid-llm-vllm-a-0");
    assert_eq!(a0["k8s"]["k8s.container.name"], "server");
    assert_eq!(a0["k8s"]["k8s.deployment.name"], "vllm-a");
    assert_eq!(
        target(&s, "llm/vllm-b-1")["k8s"]["k8s.deployment.name"],
        "vllm-b"
    );
    assert!(
        target(&s, "static")["k8s"].is_null(),
        "a static target has none"
    );
    for n in ["vllm-a-0", "vllm-a-1", "vllm-b-0", "vllm-b-1", "static"] {
        assert!(completions(&servers[n]) >= 2, "{n} canaried");
    }
    // The per-target series carry the identity.
    let (_, metrics) = agent.get("/metrics");
    // The real llama.cpp pod: its own count of generated tokens grew by the canaries'.
    let llama_generated =
        prom_sum(&llama.metrics(), "llamacpp:tokens_predicted_total", &[]) - llama_before;
    assert!(
        llama_generated >= 2.0,
        "llama-0 canaried: {llama_generated} tokens"
    );
    let l0 = target(&s, "llm/llama-0");
    assert_eq!(l0["k8s"]["k8s.deployment.name"], "llama", "{l0}");
    assert_eq!(l0["k8s"]["k8s.pod.name"], "llama-0", "{l0}");
    for (pod, dep) in [
        ("vllm-a-1", "vllm-a"),
        ("vllm-b-0", "vllm-b"),
        ("llama-0", "llama"),
    ] {
        let n = prom_sum(
            &metrics,
            "lmperf_canary_requests_total",
            &[
                "k8s_namespace_name=\"llm\"",
                &format!("k8s_pod_name=\"{pod}\""),
                &format!("k8s_deployment_name=\"{dep}\""),
            ],
        );
        assert!(n >= 1.0, "{pod}: {metrics}");
    }

    // A deleted pod: gone within one watch event; its server gets no canary after that
    // (one in flight may finish).
    let events_before = api
        .counts
        .watches
        .load(std::sync::atomic::Ordering::Relaxed);
    api.delete("llm/vllm-a-1");
    let (s, took) = wait(&agent, Duration::from_secs(5), |s| {
        !target_names(s).contains(&"llm/vllm-a-1".to_owned())
    })
    .await;
    assert!(
        !target_names(&s).contains(&"llm/vllm-a-1".to_owned()),
        "{s:#}"
    );
    println!("deleted pod left the targets in {took:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after_delete = completions(&servers["vllm-a-1"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        completions(&servers["vllm-a-1"]),
        after_delete,
        "no canary after the delete"
    );
    assert_eq!(
        api.counts
            .watches
            .load(std::sync::atomic::Ordering::Relaxed),
        events_before,
        "the delete came on the open watch"
    );

    // A new Ready pod starts within 5 s.
    let t0 = Instant::now();
    api.apply(pod(
        NS,
        "vllm-a-2",
        NODE,
        "vllm-a",
        port("vllm-a-2"),
        true,
        "vllm/vllm-openai:v0.9.0",
    ));
    while completions(&servers["vllm-a-2"]) == 0 && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed();
    println!("new pod's first canary after {took:?}");
    assert!(completions(&servers["vllm-a-2"]) >= 1);
    assert!(took < Duration::from_secs(5), "{took:?}");

    // A container restart after OOMKilled: one `restart` change with the reason.
    let mut b0 = api.pod("llm/vllm-b-0").unwrap();
    b0["status"]["containerStatuses"][0]["restartCount"] = 1.into();
    b0["status"]["containerStatuses"][0]["lastState"] =
        serde_json::json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
    api.apply(b0);
    let (s, _) = wait(&agent, Duration::from_secs(5), |s| {
        !changes(s, "llm/vllm-b-0", "restart").is_empty()
    })
    .await;
    let r = changes(&s, "llm/vllm-b-0", "restart");
    assert_eq!(r.len(), 1, "{r:?}");
    let new = r[0]["new"].as_str().unwrap_or_default();
    assert!(new.contains("OOMKilled") && new.contains("137"), "{new}");

    // A replacement with a new image: one `rollout` (old → new image).
    api.delete("llm/vllm-b-1");
    api.apply(pod(
        NS,
        "vllm-b-2",
        NODE,
        "vllm-b",
        port("vllm-b-2"),
        true,
        "vllm/vllm-openai:v0.10.0",
    ));
    let (s, _) = wait(&agent, Duration::from_secs(5), |s| {
        !changes(s, "llm/vllm-b-2", "rollout").is_empty()
    })
    .await;
    let r = changes(&s, "llm/vllm-b-2", "rollout");
    assert_eq!(r.len(), 1, "{s:#}");
    assert_eq!(r[0]["old"], "vllm/vllm-openai:v0.9.0");
    assert_eq!(r[0]["new"], "vllm/vllm-openai:v0.10.0");
    let now = want(&["llama-0", "vllm-a-0", "vllm-a-2", "vllm-b-0", "vllm-b-2"]);
    assert_eq!(target_names(&s), now);

    // A bookmark, a dropped watch, then a 410 Gone: relisted, no duplicate, nothing restarted.
    use std::sync::atomic::Ordering::Relaxed;
    let lists = api.counts.lists.load(Relaxed);
    let watches = api.counts.watches.load(Relaxed);
    api.bookmark();
    api.drop_watches();
    let t = Instant::now();
    while api.counts.watches.load(Relaxed) == watches && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        api.counts.watches.load(Relaxed) > watches,
        "re-watched after the drop"
    );
    api.compact();
    let t = Instant::now();
    while api.counts.lists.load(Relaxed) == lists && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(api.counts.lists.load(Relaxed) > lists, "relisted after 410");
    let (s, _) = wait(&agent, Duration::from_secs(5), |s| {
        s["discovery"]["lists"].as_u64() >= Some(2) && s["discovery"]["state"] == "watching"
    })
    .await;
    assert_eq!(
        target_names(&s),
        now,
        "no duplicate after the relist: {s:#}"
    );
    assert_eq!(
        changes(&s, "llm/vllm-b-0", "restart").len(),
        1,
        "no replayed restart"
    );

    // RBAC 403: said in the status; every running target goes on.
    let static_before = completions(&servers["static"]);
    let a0_before = completions(&servers["vllm-a-0"]);
    api.set_forbidden(true);
    let (s, _) = wait(&agent, Duration::from_secs(30), |s| {
        s["discovery"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("403"))
    })
    .await;
    let e = s["discovery"]["error"].as_str().unwrap_or_default();
    assert!(e.contains("403") && e.contains("RBAC"), "{s:#}");
    assert!(
        e.contains(&format!("API server http://{}", api.addr)),
        "names the API server: {e}"
    );
    assert_eq!(s["discovery"]["state"], "failing");
    // Readiness stays: the static and already-found targets go on (documented in admin/).
    assert_eq!(s["ready"], true, "{s:#}");
    assert_eq!(agent.get("/readyz").0, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        completions(&servers["static"]) > static_before,
        "static target goes on"
    );
    assert!(
        completions(&servers["vllm-a-0"]) > a0_before,
        "discovered targets go on"
    );
    api.set_forbidden(false);
    let (s, took) = wait(&agent, Duration::from_secs(40), |s| {
        s["discovery"]["state"] == "watching"
    })
    .await;
    println!("watching again {took:?} after the 403s ended");
    assert_eq!(s["discovery"]["state"], "watching", "{s:#}");
    assert_eq!(target_names(&s), now);

    // Spans carry the pod.
    // Batches arrive in export order: read until one of the newest pod's spans is in.
    let mut a: Vec<BTreeMap<String, String>> = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20)
        && !a
            .iter()
            .any(|a| a.get("k8s.pod.name").map(String::as_str) == Some("vllm-a-2"))
    {
        let spans = collector.exported_spans(1, Duration::from_secs(2)).await;
        a.extend(spans.iter().map(|s| attrs(&s.attributes)));
    }
    let a2 = a
        .iter()
        .find(|a| a.get("k8s.pod.name").map(String::as_str) == Some("vllm-a-2"))
        .unwrap_or_else(|| panic!("a span of vllm-a-2 among {}", a.len()));
    assert_eq!(a2["k8s.namespace.name"], NS);
    assert_eq!(a2["k8s.deployment.name"], "vllm-a");
    assert_eq!(a2["k8s.pod.uid"], "uid-llm-vllm-a-2");
    assert_eq!(a2["lmperf.target"], "llm/vllm-a-2");
    assert!(
        a.iter()
            .filter(|a| a.get("lmperf.target").map(String::as_str) == Some("static"))
            .all(|a| !a.contains_key("k8s.pod.name")),
        "static spans carry no pod"
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Config reload in place: a new file (written as a ConfigMap update is, a symlink swap) adds a
/// target without a restart and the running one keeps its counts; a bad file is refused with
/// the field named in `/api/v1/status` while the old config keeps running; SIGHUP reloads too.
#[tokio::test(flavor = "multi_thread")]
async fn config_file_changes_and_sighup_reload_in_place() {
    let (a, b) = (vllm().await, vllm().await);
    let dir = std::env::temp_dir().join(format!("lmperf-reload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let table = |name: &str, s: &ScriptedServer| {
        format!(
            "[[target]]\nurl = \"{}\"\nname = \"{name}\"\nmodel = \"m\"\nserver_metrics = \"off\"\n",
            s.url()
        )
    };
    let head = "[canary]\nmax_tokens = 4\ninterval = \"200ms\"\n\n";
    // A ConfigMap volume: the file is a link through `..data`, swapped on update.
    let swap = |n: u32, text: &str| {
        let data = dir.join(format!("..data-{n}"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("lmperf.toml"), text).unwrap();
        let tmp = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&data, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
    };
    swap(1, &format!("{head}{}", table("a", &a)));
    std::os::unix::fs::symlink(dir.join("..data/lmperf.toml"), dir.join("lmperf.toml")).unwrap();
    let cfg = dir.join("lmperf.toml").display().to_string();
    let agent =
        tokio::task::spawn_blocking(move || Agent::spawn(&["--config", &cfg, "--no-otlp"], &[]))
            .await
            .unwrap();
    let (s, _) = wait(&agent, Duration::from_secs(20), |s| {
        target(s, "a")["requests"].as_u64() >= Some(3)
    })
    .await;
    let a_before = target(&s, "a")["requests"].as_u64().unwrap_or(0);
    assert!(a_before >= 3, "{s:#}");

    swap(2, &format!("{head}{}\n{}", table("a", &a), table("b", &b)));
    let (s, took) = wait(&agent, Duration::from_secs(10), |s| {
        target(s, "b")["requests"].as_u64() >= Some(1)
    })
    .await;
    println!("added target's first canary {took:?} after the swap");
    assert_eq!(target_names(&s), ["a", "b"], "{s:#}");
    assert!(
        target(&s, "a")["requests"].as_u64().unwrap_or(0) >= a_before,
        "the unchanged target kept its counts"
    );
    assert_eq!(
        s["config_reload"]["last_ok"], true,
        "{}",
        s["config_reload"]
    );

    // A bad file: refused, named, the old config goes on.
    swap(
        3,
        &format!(
            "{head}{}\n[[target]]\nurl = \"{}\"\nname = \"c\"\nrate = -1.0\n",
            table("a", &a),
            b.url()
        ),
    );
    let (s, _) = wait(&agent, Duration::from_secs(10), |s| {
        s["config_reload"]["last_ok"] == false
    })
    .await;
    let e = s["config_reload"]["last_error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        e.contains("rate") && e.contains("-1"),
        "{}",
        s["config_reload"]
    );
    let b_now = completions(&b);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(completions(&b) > b_now, "the running config goes on");
    assert_eq!(target_names(&agent.status()), ["a", "b"]);

    // SIGHUP after fixing the file in place (no swap event: only the signal reloads it).
    std::fs::write(
        dir.join("..data-3/lmperf.toml"),
        format!("{head}{}", table("a", &a)),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    unsafe { libc::kill(agent.pid() as i32, libc::SIGHUP) };
    let (s, _) = wait(&agent, Duration::from_secs(10), |s| {
        target_names(s) == ["a"]
    })
    .await;
    assert_eq!(target_names(&s), ["a"], "{s:#}");
    assert_eq!(
        s["config_reload"]["last_ok"], true,
        "{}",
        s["config_reload"]
    );
    assert!(s["config_reload"]["attempts"].as_u64() >= Some(3));
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reload that changes only `canary.interval` (issue 50): the target measures the same
/// server, so it keeps its request count, its diagnosis history (the baseline it had learned)
/// and its status entry; `needs_restart` stays empty (nothing read only at start changed);
/// the new interval is in force (the schedule restarted with it).
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_of_the_interval_alone_keeps_the_targets_history() {
    let a = vllm().await;
    let dir = std::env::temp_dir().join(format!("lmperf-reload-interval-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lmperf.toml");
    let text = |interval: &str| {
        format!(
            "[canary]\nmax_tokens = 4\ninterval = \"{interval}\"\n\n[[target]]\nurl = \"{}\"\nname = \"a\"\nmodel = \"m\"\nserver_metrics = \"off\"\n",
            a.url()
        )
    };
    std::fs::write(&file, text("200ms")).unwrap();
    let cfg = file.display().to_string();
    let agent =
        tokio::task::spawn_blocking(move || Agent::spawn(&["--config", &cfg, "--no-otlp"], &[]))
            .await
            .unwrap();
    let (s, _) = wait(&agent, Duration::from_secs(20), |s| {
        target(s, "a")["requests"].as_u64() >= Some(10)
    })
    .await;
    let before = target(&s, "a")["requests"].as_u64().unwrap_or(0);
    assert!(before >= 10, "{s:#}");
    // The history the diagnosis holds (said once it evaluated the target, on its 1 s grid).
    let have = |agent: &Agent| {
        let t = Instant::now();
        loop {
            let (code, body) = agent.get("/api/v1/diagnosis");
            assert_eq!(code, 200, "{body}");
            let d: Value = serde_json::from_str(&body).unwrap();
            if let Some(h) = d["targets"][0]["baseline_wait"]["have_s"].as_f64() {
                return h;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no baseline_wait: {d}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let have_before = have(&agent);
    assert!(have_before > 0.0, "the diagnosis holds some history");

    std::fs::write(&file, text("300ms")).unwrap();
    let (s, _) = wait(&agent, Duration::from_secs(10), |s| {
        s["config_reload"]["attempts"].as_u64() >= Some(1)
    })
    .await;
    assert_eq!(
        s["config_reload"]["last_ok"], true,
        "{}",
        s["config_reload"]
    );
    assert_eq!(
        s["config_reload"]["needs_restart"],
        serde_json::json!([]),
        "only canary.interval changed: {}",
        s["config_reload"]
    );
    let after = target(&s, "a")["requests"].as_u64().unwrap_or(0);
    assert!(
        after >= before,
        "requests {before} before the reload, {after} after: {s:#}"
    );
    let have_after = have(&agent);
    assert!(
        have_after >= have_before,
        "the diagnosis kept its history: {have_before} s before the reload, {have_after} s after"
    );
    // The new interval is in force: 300 ms apart (on the server's clock), not 200.
    let n = completions(&a);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let sent = completions(&a) - n;
    assert!(
        (7..=11).contains(&sent),
        "{sent} canaries in 3 s at one per 300 ms"
    );
    assert!(
        agent.stderr_text().contains("its history kept"),
        "{}",
        agent.stderr_text()
    );
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// InferencePool discovery (`inference_pools = true`): while the CRD is absent the status says
/// so and the annotated pod is canaried; installed, a pool selecting 2 pods of this node makes
/// them 2 targets at podIP:targetPort with `k8s.inferencepool.name` (a pod on another node and
/// one of another namespace are not); the pool deleted, both stop. Issue 52.1: a router target
/// with `direct_pool` (the pool's gateway) sends its direct canaries to those two pods while
/// they are the pool's, and to none before or after.
#[tokio::test(flavor = "multi_thread")]
async fn inference_pools_name_their_pods_as_targets() {
    let api = KubeApi::start().await;
    api.add_replicaset(NS, "llama-5c6b8d", "llama");
    let annotated = vllm().await;
    // An llm-d gateway in front of the pool: a router target whose direct workers are the
    // pool's pods that discovery finds (`direct_pool`).
    let gateway = vllm().await;
    // Two pod IPs (loopback addresses) on one port: the pool's target port.
    let a = vllm_at("127.0.0.2:0").await;
    let port = a.addr.port();
    let b = vllm_at(&format!("127.0.0.3:{port}")).await;
    api.apply(pod(
        NS,
        "annotated-0",
        NODE,
        "annotated",
        annotated.addr.port(),
        true,
        "vllm/vllm-openai:v0.9.0",
    ));
    for (name, node, ns, ip) in [
        ("llama-0", NODE, NS, "127.0.0.2"),
        ("llama-1", NODE, NS, "127.0.0.3"),
        ("llama-far", "node-9", NS, "127.0.0.4"),
        ("llama-other-ns", NODE, "other", "127.0.0.5"),
    ] {
        let mut p = pod(
            ns,
            name,
            node,
            "llama",
            port,
            false,
            "vllm/vllm-openai:v0.9.0",
        );
        p["status"]["podIP"] = ip.into();
        api.apply(p);
    }
    api.apply_pool(inference_pool(
        NS,
        "llama-pool",
        &[("app", "llama")],
        &[port],
    ));

    let dir = std::env::temp_dir().join(format!("lmperf-k8s-pools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[canary]\nmax_tokens = 4\ninterval = \"250ms\"\nmodel = \"m\"\nserver_metrics = \"off\"\n\n[[target]]\nurl = \"{}\"\nname = \"gw\"\nkind = \"router\"\nworker_probes = false\ndirect_pool = \"{NS}/llama-pool\"\ndirect_interval = \"1s\"\n\n[discovery.kubernetes]\nenabled = true\nnode_name = \"{NODE}\"\ninference_pools = true\n",
            gateway.url()
        ),
    )
    .unwrap();
    let (cfg, kc) = (
        config.display().to_string(),
        kubeconfig.display().to_string(),
    );
    let agent = tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &["--config", &cfg, "--no-otlp"],
            &[("KUBECONFIG", kc.as_str()), ("RUST_LOG", "info,kube=warn")],
        )
    })
    .await
    .unwrap();

    // The CRD absent: said in the status; the annotated pod is canaried all the same.
    let (s, _) = wait(&agent, Duration::from_secs(30), |s| {
        s["discovery"]["inference_pools"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("404"))
            && target(s, "llm/annotated-0")["requests"].as_u64() >= Some(1)
    })
    .await;
    let pools = &s["discovery"]["inference_pools"];
    let e = pools["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("not installed") && e.contains("inferencepools.inference.networking.k8s.io"),
        "{s:#}"
    );
    assert_eq!(pools["state"], "failing", "{pools}");
    assert_eq!(s["discovery"]["state"], "watching", "pods go on: {s:#}");
    assert_eq!(target_names(&s), ["gw", "llm/annotated-0"]);
    assert_eq!(
        target(&s, "gw")["path"]["workers"],
        serde_json::json!([]),
        "{s:#}"
    );
    assert!(completions(&annotated) >= 1);
    assert_eq!(completions(&a) + completions(&b), 0);

    // Installed: the pool's 2 pods of this node become targets at podIP:targetPort.
    api.install_pool_crd();
    let want = ["gw", "llm/annotated-0", "llm/llama-0", "llm/llama-1"];
    let direct_ok = |s: &serde_json::Value| {
        target(s, "gw")["path"]["workers"]
            .as_array()
            .map(|w| {
                w.iter()
                    .map(|w| {
                        (
                            w["url"].as_str().unwrap_or("").to_owned(),
                            w["ok"].as_u64() >= Some(1),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    // Each pool target's canary served and recorded: the server counts a request when it
    // arrives, the agent when its stream ends (its counter first, then its status).
    let (s, took) = wait(&agent, Duration::from_secs(30), |s| {
        target_names(s) == want
            && completions(&a) >= 1
            && completions(&b) >= 1
            && ["llm/llama-0", "llm/llama-1"]
                .iter()
                .all(|t| target(s, t)["requests"].as_u64() >= Some(1))
            && direct_ok(s).len() == 2
            && direct_ok(s).iter().all(|(_, ok)| *ok)
    })
    .await;
    println!("pool targets canaried {took:?} after the CRD was installed");
    assert_eq!(target_names(&s), want, "{s:#}");
    let pools = &s["discovery"]["inference_pools"];
    assert_eq!(pools["state"], "watching", "{pools}");
    assert_eq!(pools["pools"], 1, "{pools}");
    assert_eq!(pools["targets"], 2, "{pools}");
    assert!(pools["error"].is_null(), "{pools}");
    for (name, ip) in [("llm/llama-0", "127.0.0.2"), ("llm/llama-1", "127.0.0.3")] {
        let t = target(&s, name);
        assert_eq!(t["url"], format!("http://{ip}:{port}/"), "{t}");
        assert_eq!(t["k8s"]["k8s.inferencepool.name"], "llama-pool", "{t}");
        assert_eq!(t["k8s"]["k8s.deployment.name"], "llama", "{t}");
    }
    assert!(
        target(&s, "llm/annotated-0")["k8s"]["k8s.inferencepool.name"].is_null(),
        "no pool selects the annotated pod"
    );
    // The gateway's direct canaries went to the pool's two pods of this node, each answered.
    assert_eq!(target(&s, "gw")["path"]["workers_from"], "pool", "{s:#}");
    assert_eq!(
        direct_ok(&s),
        [
            (format!("http://127.0.0.2:{port}/"), true),
            (format!("http://127.0.0.3:{port}/"), true)
        ],
        "{s:#}"
    );
    assert!(completions(&a) >= 1 && completions(&b) >= 1);
    let (_, metrics) = agent.get("/metrics");
    let n = prom_sum(
        &metrics,
        "lmperf_canary_requests_total",
        &[
            "k8s_pod_name=\"llama-1\"",
            "k8s_inferencepool_name=\"llama-pool\"",
        ],
    );
    assert!(n >= 1.0, "{metrics}");

    // The pool deleted: its targets leave, their servers get no canary after that.
    api.delete_pool("llm/llama-pool");
    let (s, _) = wait(&agent, Duration::from_secs(5), |s| {
        target_names(s) == ["gw", "llm/annotated-0"] && direct_ok(s).is_empty()
    })
    .await;
    assert_eq!(target_names(&s), ["gw", "llm/annotated-0"], "{s:#}");
    assert!(
        direct_ok(&s).is_empty(),
        "no direct worker once the pool is gone: {s:#}"
    );
    assert_eq!(s["discovery"]["inference_pools"]["pools"], 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after = completions(&a) + completions(&b);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        completions(&a) + completions(&b),
        after,
        "no canary after the delete"
    );
    // The annotated pod goes on: its next canary within a bound a loaded machine keeps.
    let before = completions(&annotated);
    let t = std::time::Instant::now();
    while completions(&annotated) <= before {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the annotated pod goes on"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}
