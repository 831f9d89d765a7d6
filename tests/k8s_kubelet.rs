//! Kubernetes discovery through the kubelet's node-local Pods API (KEP-4188, issue 24) end to
//! end on loopback: the real agent (`source = kubelet | auto`, the socket directory from
//! `kubelet_pods_api_dir`) against the scripted kubelet of `support/kubelet_pods.rs` (real gRPC
//! on a unix socket, pods as protobuf v1.Pod bytes), with scripted vLLM-style servers as the
//! pods of one Deployment.
//!
//! It checks: listed pods become targets with their `k8s.*` identity (the Deployment named by
//! the pod-template-hash rule, without the API server); a watched `ADDED` Ready pod starts its
//! canaries within 5 s; `DELETED` stops them; a restart after `OOMKilled` gives one `restart`
//! change; the eBPF probes follow the new pod's port (where they run); a restarted kubelet
//! (the watch cut) is relisted without a replayed change. In
//! `auto`: with the socket the kubelet runs and the API server is not watched; without it, or
//! with a kubelet answering `Unimplemented`, the API server runs and the status says why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lmperf_e2e::agent::Agent;
use lmperf_e2e::kube_api::{KubeApi, pod};
use lmperf_e2e::kubelet_pods::KubeletPods;
use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
use lmperf_e2e::targets::{changes, completions, target, target_names};
use serde_json::Value;

const NODE: &str = "node-1";
const NS: &str = "llm";
const IMAGE: &str = "vllm/vllm-openai:v0.9.0";

async fn vllm() -> ScriptedServer {
    ScriptedServer::start(Arc::new(|req, _| match req.path.as_str() {
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
    }))
    .await
}

async fn wait(agent: &Agent, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let s = agent.status();
        if pred(&s) || t.elapsed() > timeout {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent with `[discovery.kubernetes]` `source` and the kubelet socket directory `dir`,
/// and `KUBECONFIG` when given (else none: the kubelet source needs no API server).
async fn agent(dir: &std::path::Path, source: &str, kubeconfig: Option<&std::path::Path>) -> Agent {
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[canary]\nmax_tokens = 4\ninterval = \"250ms\"\n\n[discovery.kubernetes]\nenabled = true\nnode_name = \"{NODE}\"\nsource = \"{source}\"\nkubelet_pods_api_dir = \"{}\"\n",
            dir.join("pods-api").display()
        ),
    )
    .unwrap();
    let cfg = config.display().to_string();
    // No kubeconfig at all where none is given: a path that does not exist.
    let kc = kubeconfig.map_or_else(
        || dir.join("no-kubeconfig").display().to_string(),
        |k| k.display().to_string(),
    );
    tokio::task::spawn_blocking(move || {
        Agent::spawn(
            &["--config", &cfg],
            &[("KUBECONFIG", kc.as_str()), ("RUST_LOG", "info,kube=warn")],
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kubelet_pods_api_drives_targets_identity_and_lifecycle() {
    let dir = lmperf_e2e::temp::dir("k8s-kubelet");
    let kubelet = KubeletPods::start(&dir.join("pods-api")).await;
    let servers: Vec<ScriptedServer> = servers(3).await;
    let port = |i: usize| servers[i].addr.port();
    kubelet.apply(pod(NS, "vllm-a-0", NODE, "vllm-a", port(0), true, IMAGE));
    kubelet.apply(pod(NS, "vllm-a-1", NODE, "vllm-a", port(1), true, IMAGE));
    kubelet.apply(pod(NS, "web", NODE, "web", 1, false, "nginx"));
    let agent = agent(&dir, "kubelet", None).await;

    // Listed pods: targets with their identity, the Deployment by the pod-template-hash rule.
    let first = vec![format!("{NS}/vllm-a-0"), format!("{NS}/vllm-a-1")];
    let s = wait(&agent, Duration::from_secs(20), |s| {
        target_names(s) == first
            && s["targets"]
                .as_array()
                .is_some_and(|a| a.iter().all(|t| t["requests"].as_u64() >= Some(1)))
    })
    .await;
    assert_eq!(target_names(&s), first, "{s:#}");
    let d = &s["discovery"];
    assert_eq!(d["source"], "kubelet", "{d}");
    assert!(
        d["source_reason"]
            .as_str()
            .is_some_and(|r| r.contains("source = kubelet") && r.contains("kubelet.sock")),
        "{d}"
    );
    assert_eq!(d["state"], "watching", "{d}");
    assert_eq!(d["pods"], 3, "{d}");
    let a0 = target(&s, "llm/vllm-a-0");
    assert_eq!(a0["k8s"]["k8s.namespace.name"], NS, "{a0}");
    assert_eq!(a0["k8s"]["k8s.pod.name"], "vllm-a-0");
    assert_eq!(a0["k8s"]["k8s.pod.uid"], "uid-llm-vllm-a-0");
    assert_eq!(a0["k8s"]["k8s.container.name"], "server");
    assert_eq!(a0["k8s"]["k8s.deployment.name"], "vllm-a");
    assert!(completions(&servers[0]) >= 1 && completions(&servers[1]) >= 1);
    let (code, out, _) = agent.ctl(&["status"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("via kubelet") && out.contains("source = kubelet"),
        "{out}"
    );

    // A watched ADDED Ready pod: canaried within 5 s.
    let t0 = Instant::now();
    kubelet.apply(pod(NS, "vllm-a-2", NODE, "vllm-a", port(2), true, IMAGE));
    while completions(&servers[2]) == 0 && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed();
    println!("new pod's first canary after {took:?}");
    assert!(completions(&servers[2]) >= 1);
    assert!(took < Duration::from_secs(5), "{took:?}");
    // The eBPF probes follow it (where they run: root here, after the agent dropped its
    // capabilities): its port joins the kernel filter.
    let net = agent.status()["net"].clone();
    if net["mode"] == "on" {
        let p = u64::from(port(2));
        assert!(
            net["ports"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v.as_u64() == Some(p))),
            "{net}"
        );
        assert!(net["ports_refused"].is_null(), "{net}");
    } else {
        eprintln!("eBPF probes not on here: {}", net["reason"]);
    }

    // DELETED (name, namespace and uid only): its canaries stop.
    kubelet.delete("llm/vllm-a-1");
    let s = wait(&agent, Duration::from_secs(5), |s| {
        !target_names(s).contains(&"llm/vllm-a-1".to_owned())
    })
    .await;
    assert!(
        !target_names(&s).contains(&"llm/vllm-a-1".to_owned()),
        "{s:#}"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after = completions(&servers[1]);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(completions(&servers[1]), after, "no canary after DELETED");

    // A restart after OOMKilled: one `restart` change with the reason and exit code.
    let mut a0 = kubelet.pod("llm/vllm-a-0").unwrap();
    a0["status"]["containerStatuses"][0]["restartCount"] = 1.into();
    a0["status"]["containerStatuses"][0]["lastState"] =
        serde_json::json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
    kubelet.apply(a0);
    let s = wait(&agent, Duration::from_secs(5), |s| {
        !changes(s, "llm/vllm-a-0", "restart").is_empty()
    })
    .await;
    let r = changes(&s, "llm/vllm-a-0", "restart");
    assert_eq!(r.len(), 1, "{s:#}");
    let new = r[0]["new"].as_str().unwrap_or_default();
    assert!(new.contains("OOMKilled") && new.contains("137"), "{new}");

    // The kubelet restarts (the watch cut): relisted, same targets, no replayed restart.
    use std::sync::atomic::Ordering::SeqCst;
    let lists = kubelet.counts.lists.load(SeqCst);
    kubelet.drop_watches();
    let t = Instant::now();
    while kubelet.counts.lists.load(SeqCst) == lists && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(kubelet.counts.lists.load(SeqCst) > lists, "relisted");
    let now = vec![format!("{NS}/vllm-a-0"), format!("{NS}/vllm-a-2")];
    let s = wait(&agent, Duration::from_secs(5), |s| {
        s["discovery"]["lists"].as_u64() >= Some(2) && s["discovery"]["state"] == "watching"
    })
    .await;
    assert_eq!(target_names(&s), now, "{s:#}");
    assert_eq!(changes(&s, "llm/vllm-a-0", "restart").len(), 1, "no replay");
    drop(agent);
}

async fn servers(n: usize) -> Vec<ScriptedServer> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(vllm().await);
    }
    v
}

/// `auto`: the kubelet where its socket answers (the API server is then not watched at all);
/// the API server without the socket, or when the kubelet answers `Unimplemented` (its feature
/// gate off); the status says which and why.
#[tokio::test(flavor = "multi_thread")]
async fn auto_uses_the_kubelet_where_it_answers_and_the_api_server_otherwise() {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = lmperf_e2e::temp::dir("k8s-kubelet-auto");
    let (by_kubelet, by_api) = (vllm().await, vllm().await);
    let api = KubeApi::start().await;
    api.apply(pod(
        NS,
        "from-api",
        NODE,
        "vllm-b",
        by_api.addr.port(),
        true,
        IMAGE,
    ));
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let only = |s: &Value, name: &str| target_names(s) == [format!("{NS}/{name}")];

    // No socket: the API server, and the status says the socket does not exist.
    let agent1 = agent(&dir, "auto", Some(&kubeconfig)).await;
    let s = wait(&agent1, Duration::from_secs(20), |s| only(s, "from-api")).await;
    assert_eq!(target_names(&s), [format!("{NS}/from-api")], "{s:#}");
    let d = &s["discovery"];
    assert_eq!(d["source"], "apiserver", "{d}");
    let why = d["source_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("source = auto") && why.contains("does not exist"),
        "{why}"
    );
    drop(agent1);

    // The socket answers: the kubelet, and no API-server pod list or watch at all.
    let kubelet = KubeletPods::start(&dir.join("pods-api")).await;
    kubelet.apply(pod(
        NS,
        "from-kubelet",
        NODE,
        "vllm-a",
        by_kubelet.addr.port(),
        true,
        IMAGE,
    ));
    let (lists, watches) = (
        api.counts.lists.load(Relaxed),
        api.counts.watches.load(Relaxed),
    );
    let agent2 = agent(&dir, "auto", Some(&kubeconfig)).await;
    let s = wait(&agent2, Duration::from_secs(20), |s| {
        only(s, "from-kubelet")
    })
    .await;
    assert_eq!(target_names(&s), [format!("{NS}/from-kubelet")], "{s:#}");
    let d = &s["discovery"];
    assert_eq!(d["source"], "kubelet", "{d}");
    assert!(
        d["source_reason"]
            .as_str()
            .is_some_and(|r| r.contains("source = auto") && r.contains("answers")),
        "{d}"
    );
    assert_eq!(
        (
            api.counts.lists.load(Relaxed),
            api.counts.watches.load(Relaxed)
        ),
        (lists, watches),
        "the API server is not asked for pods"
    );
    drop(agent2);

    // The kubelet answers Unimplemented (PodsAPI feature gate off): the API server.
    kubelet.set_error(Some(tonic::Code::Unimplemented));
    let agent3 = agent(&dir, "auto", Some(&kubeconfig)).await;
    let s = wait(&agent3, Duration::from_secs(20), |s| only(s, "from-api")).await;
    assert_eq!(target_names(&s), [format!("{NS}/from-api")], "{s:#}");
    let d = &s["discovery"];
    assert_eq!(d["source"], "apiserver", "{d}");
    let why = d["source_reason"].as_str().unwrap_or_default();
    assert!(why.contains("Unimplemented"), "{why}");
    let (_, out, _) = agent3.ctl(&["status"]);
    assert!(
        out.contains("via apiserver") && out.contains("Unimplemented"),
        "{out}"
    );
    drop(agent3);
}
