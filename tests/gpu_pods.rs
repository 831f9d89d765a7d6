//! Issue 25: each GPU belongs to a pod. The real `lmperf` binary reads the scripted NVML
//! library (`support/fake_nvml/`: 5 GPUs, the fifth MIG-split into two MIG devices) and a
//! scripted kubelet pod-resources server on a unix socket (`support/pod_resources.rs`, from
//! the same upstream proto as the agent's client), through the agent's production path:
//! every GPU series carries the pod holding its GPU, each fault of the socket is said once in
//! `gpu.pod_resources` while the series keep flowing without pod labels, and `List` is called
//! at most once per GPU interval. (Which GPUs each target's spans and diagnosis read is
//! proven on the agent's code with the times passed in: `daemon/src/gpu/attribution_tests.rs`.)

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lmperf_e2e::agent::Agent;
use lmperf_e2e::fake_nvml::{self, Script};
use lmperf_e2e::pod_resources::{Answer, Held, PodResourcesServer};
use serde_json::{Value, json};

const INTERVAL_MS: u64 = 250;

fn uuid(i: usize) -> String {
    format!("GPU-5d1e0000-0000-4000-8000-00000000000{i}")
}

fn mig(m: usize) -> String {
    format!("MIG-5d1e0000-0000-4000-8000-0000000004a{m}")
}

/// 4 whole GPUs (GPU 3 throttled, GPU 1's memory 99 % used) and GPU 4 MIG-split in two.
fn script() -> Value {
    let total = 150_754_820_096u64;
    let mut devices: Vec<Value> = (0..5)
        .map(|i| {
            json!({
                "uuid": uuid(i),
                "utilization_gpu_pct": 50,
                "utilization_memory_pct": 20,
                "memory_used_bytes": if i == 1 { total / 100 * 99 } else { total / 10 * 6 },
                "power_mw": 400000 + i * 1000,
                "energy_mj": {"rate": {"start": 0, "per_s": 400000}},
                "temperature_c": 60,
                "clock_sm_mhz": if i == 3 { 1100 } else { 1980 },
                "throttle_reasons": if i == 3 { 96 } else { 0 },
                "processes": []
            })
        })
        .collect();
    devices[4]["mig_mode"] = json!(1);
    devices[4]["mig_devices"] = json!([
        {"uuid": mig(0), "name": "NVIDIA H200 MIG 3g.71gb", "memory_total_bytes": 76_000_000_000u64, "memory_used_bytes": 10_000_000_000u64},
        {"uuid": mig(1), "name": "NVIDIA H200 MIG 3g.71gb", "memory_total_bytes": 76_000_000_000u64, "memory_used_bytes": 20_000_000_000u64}
    ]);
    json!({
        "driver_version": "550.54.15",
        "defaults": {
            "name": "NVIDIA H200", "mig_mode": 0, "memory_total_bytes": total,
            "power_limit_mw": 700000, "max_clock_sm_mhz": 1980, "clock_memory_mhz": 3201,
            "pcie_replays": 0, "ecc_corrected": 0, "ecc_uncorrected": 0
        },
        "devices": devices
    })
}

/// Pod A on GPUs 0 and 1, pod B on GPUs 2 and 3, and GPU 4's MIG devices given to two
/// containers of pod C; `extra` added.
fn node_pods(extra: &[Held]) -> Vec<Held> {
    let mut v = vec![
        Held::gpus("ml", "a", "vllm", &[&uuid(0), &uuid(1)]),
        Held::of("ml", "a", "vllm", "cpu", &["2", "3"]),
        Held::gpus("ml", "b", "sglang", &[&uuid(2), &uuid(3)]),
        Held::of("ml", "c", "x", "nvidia.com/mig-3g.71gb", &[&mig(0)]),
        Held::of("ml", "c", "y", "nvidia.com/mig-3g.71gb", &[&mig(1)]),
    ];
    v.extend_from_slice(extra);
    v
}

fn config(dir: &Path, lib: &Path, socket: &Path) -> PathBuf {
    let refused = format!("http://127.0.0.1:{}", lmperf_e2e::peers::free_port());
    config_to(dir, lib, socket, &refused, "1s")
}

/// Targets `a` (pod ml/a) and `b` (pod ml/b, container sglang), both canaries to `target`
/// every `every`.
fn config_to(dir: &Path, lib: &Path, socket: &Path, target: &str, every: &str) -> PathBuf {
    let p = dir.join("agent.toml");
    let refused = target;
    let text = format!(
        "[canary]\ninterval = \"{every}\"\nmodel = \"m\"\n\
         [[target]]\nname = \"a\"\nurl = \"{refused}\"\n[target.k8s]\nnamespace = \"ml\"\npod = \"a\"\n\
         [[target]]\nname = \"b\"\nurl = \"{refused}\"\n[target.k8s]\nnamespace = \"ml\"\npod = \"b\"\ncontainer = \"sglang\"\n\
         [gpu]\ninterval = \"{INTERVAL_MS}ms\"\nnvml_library = \"{}\"\npod_resources_socket = \"{}\"\n",
        lib.display(),
        socket.display()
    );
    std::fs::write(&p, text).unwrap();
    p
}

async fn spawn(script: &Script, cfg: &Path) -> Agent {
    let envs = script.env();
    let cfg = cfg.display().to_string();
    tokio::task::spawn_blocking(move || {
        let e: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Agent::spawn(&["--config", &cfg, "--no-otlp"], &e)
    })
    .await
    .unwrap()
}

/// The `/metrics` sample lines (no comments) naming `id` in any label.
fn lines_of<'a>(metrics: &'a str, id: &str) -> Vec<&'a str> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(&format!("\"{id}\"")))
        .collect()
}

/// Asserts every GPU series line of `id` (hw_* and lmperf_gpu_*, `hw.id` or `hw.parent` =
/// `id`) carries exactly the pod labels `want` (one line set per holder), or none.
fn assert_series_pods(metrics: &str, id: &str, want: &[(&str, &str)]) {
    let lines: Vec<&str> = lines_of(metrics, id)
        .into_iter()
        .filter(|l| l.contains(&format!("hw_id=\"{id}\"")))
        .filter(|l| l.starts_with("hw_") || l.starts_with("lmperf_gpu_"))
        .collect();
    assert!(lines.len() >= 5, "few series of {id}:\n{metrics}");
    for l in &lines {
        match want {
            [] => assert!(!l.contains("k8s_pod_name"), "{id} held by no pod: {l}"),
            _ => assert!(
                want.iter()
                    .any(|(pod, container)| l.contains("k8s_namespace_name=\"ml\"")
                        && l.contains(&format!("k8s_pod_name=\"{pod}\""))
                        && l.contains(&format!("k8s_container_name=\"{container}\""))),
                "{id} should carry {want:?}: {l}"
            ),
        }
    }
}

fn events(status: &Value) -> Vec<(String, String)> {
    status["gpu"]["pod_resources"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap_or_default().to_owned(),
                e["hw_id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn count(ev: &[(String, String)], kind: &str) -> usize {
    ev.iter().filter(|(k, _)| k == kind).count()
}

fn metrics(agent: &Agent) -> String {
    let (code, body) = agent.get("/metrics");
    assert_eq!(code, 200);
    body
}

fn holders(status: &Value, id: &str) -> Value {
    status["gpu"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["hw_id"] == id)
        .map(|d| d["k8s_holders"].clone())
        .unwrap_or(Value::Null)
}

/// Waits until `pred(status)` holds, then one more GPU interval for the next scrape.
fn wait(agent: &Agent, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let s = agent.wait_status(Duration::from_secs(20), &pred);
    assert!(pred(&s), "{what}: {}\n{}", s["gpu"], agent.stderr_text());
    s
}

/// The proof's first half: every series carries the right pod (MIG devices their own
/// container), a GPU held by no pod says so, and `List` comes at most once per interval.
#[tokio::test(flavor = "multi_thread")]
async fn every_gpu_series_carries_its_pod() {
    let script = Script::write("gpu-pods", &script());
    let lib = fake_nvml::library(&[]);
    let server = PodResourcesServer::start(
        &script.dir.join("pod-resources"),
        Answer::Pods(node_pods(&[])),
    )
    .await;
    let cfg = config(&script.dir, &lib, &server.path);
    let started = Instant::now();
    let agent = spawn(&script, &cfg).await;
    let status = wait(&agent, "pods attributed", |s| {
        s["gpu"]["pod_resources"]["state"] == "ok"
            && s["gpu"]["devices"].as_array().is_some_and(|d| d.len() == 7)
            && s["gpu"]["pod_resources"]["lists"].as_u64().unwrap_or(0) >= 3
    });
    let pr = &status["gpu"]["pod_resources"];
    assert_eq!(pr["socket"], server.path.display().to_string());
    assert_eq!(pr["pods"], 3, "{pr}");
    assert_eq!(pr["unknown_device_ids"], json!([]), "{pr}");
    assert!(events(&status).is_empty(), "{pr}");
    let holder = |pod: &str, c: &str| json!([{"namespace": "ml", "pod": pod, "container": c}]);
    assert_eq!(holders(&status, &uuid(0)), holder("a", "vllm"));
    assert_eq!(holders(&status, &uuid(3)), holder("b", "sglang"));
    assert_eq!(holders(&status, &mig(0)), holder("c", "x"));
    assert_eq!(holders(&status, &mig(1)), holder("c", "y"));
    // The MIG-split GPU itself was given to no container: said so.
    assert_eq!(holders(&status, &uuid(4)), json!([]));

    std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS));
    let m = metrics(&agent);
    assert_series_pods(&m, &uuid(0), &[("a", "vllm")]);
    assert_series_pods(&m, &uuid(1), &[("a", "vllm")]);
    assert_series_pods(&m, &uuid(2), &[("b", "sglang")]);
    assert_series_pods(&m, &uuid(3), &[("b", "sglang")]);
    assert_series_pods(&m, &mig(0), &[("c", "x")]);
    assert_series_pods(&m, &mig(1), &[("c", "y")]);
    assert_series_pods(&m, &uuid(4), &[]);
    // The values are the scripted ones on the labelled series (GPU 3 throttled, GPU 1 full).
    let sm3 = lines_of(&m, &uuid(3))
        .into_iter()
        .find(|l| l.starts_with("hw_gpu_clock") || l.starts_with("lmperf_gpu_clock"))
        .unwrap_or_default()
        .to_owned();
    assert!(sm3.contains("k8s_pod_name=\"b\""), "{sm3}");

    // At most one List per GPU interval (the kubelet allows 100 per second per node, for
    // every client together), and a steady reader.
    let window = started.elapsed();
    let calls = server.calls().len() as f64;
    let most = window.as_secs_f64() / (INTERVAL_MS as f64 / 1000.0) + 1.0;
    println!(
        "List calls: {calls} in {:.2} s (at most {most:.1} at one per {INTERVAL_MS} ms)",
        window.as_secs_f64()
    );
    assert!(calls <= most, "{calls} Lists in {window:?}");
    assert!(calls >= 3.0, "{calls} Lists in {window:?}");
    drop(agent);
}

/// The faults, one agent run: socket missing at start, then a good answer with an id NVML
/// does not know, pod B gone between two Lists, a List that hangs, permission denied, an RPC
/// error: each said once in `gpu.pod_resources`, and the GPU series keep flowing (without pod
/// labels while no answer is at hand).
#[tokio::test(flavor = "multi_thread")]
async fn each_fault_is_said_once_and_series_keep_flowing() {
    let script = Script::write("gpu-pods-faults", &script());
    let lib = fake_nvml::library(&[]);
    let dir = script.dir.join("pod-resources");
    let socket = dir.join("kubelet.sock");
    let cfg = config(&script.dir, &lib, &socket);
    let agent = spawn(&script, &cfg).await;

    // 1. No socket: unavailable, said once; series without pod labels.
    let s = wait(&agent, "socket missing", |s| {
        s["gpu"]["mode"] == "on" && s["gpu"]["pod_resources"]["lists"].as_u64().unwrap_or(0) >= 4
    });
    assert_eq!(
        s["gpu"]["pod_resources"]["state"], "unavailable",
        "{}",
        s["gpu"]
    );
    assert!(
        s["gpu"]["pod_resources"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("does not exist"),
        "{}",
        s["gpu"]
    );
    assert_eq!(count(&events(&s), "socket_missing"), 1, "{}", s["gpu"]);
    assert_eq!(holders(&s, &uuid(0)), Value::Null);
    assert_series_pods(&metrics(&agent), &uuid(0), &[]);

    // 2. The kubelet comes up, one id NVML does not know among the devices.
    let server = PodResourcesServer::start(
        &dir,
        Answer::Pods(node_pods(&[Held::gpus(
            "ml",
            "e",
            "z",
            &["GPU-ffffffff-0000-4000-8000-000000000009"],
        )])),
    )
    .await;
    let s = wait(&agent, "first answer", |s| {
        s["gpu"]["pod_resources"]["state"] == "ok" && count(&events(s), "unknown_device_id") == 1
    });
    assert_eq!(
        s["gpu"]["pod_resources"]["unknown_device_ids"],
        json!(["GPU-ffffffff-0000-4000-8000-000000000009"])
    );
    let lists = s["gpu"]["pod_resources"]["lists"].as_u64().unwrap();
    let s = wait(&agent, "more answers", |s| {
        s["gpu"]["pod_resources"]["lists"].as_u64().unwrap_or(0) >= lists + 3
    });
    assert_eq!(
        count(&events(&s), "unknown_device_id"),
        1,
        "said once: {}",
        s["gpu"]
    );
    assert_eq!(count(&events(&s), "socket_missing"), 1);
    std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS));
    assert_series_pods(&metrics(&agent), &uuid(2), &[("b", "sglang")]);

    // 3. Pod B goes away between two Lists: its GPUs are said held by no pod, once each.
    let without_b: Vec<Held> = node_pods(&[])
        .into_iter()
        .filter(|h| h.pod != "b")
        .collect();
    server.set(Answer::Pods(without_b.clone()));
    let s = wait(&agent, "pod b gone", |s| count(&events(s), "pod_gone") == 2);
    let gone: Vec<String> = events(&s)
        .into_iter()
        .filter(|(k, _)| k == "pod_gone")
        .map(|(_, h)| h)
        .collect();
    assert_eq!(gone, [uuid(2), uuid(3)]);
    assert_eq!(holders(&s, &uuid(2)), json!([]));
    std::thread::sleep(Duration::from_millis(3 * INTERVAL_MS));
    let m = metrics(&agent);
    assert_series_pods(&m, &uuid(2), &[]);
    assert_series_pods(&m, &uuid(0), &[("a", "vllm")]);
    assert_eq!(count(&events(&agent.status()), "pod_gone"), 2);

    // 4. A List that hangs: a timeout, said once; series without pod labels.
    server.set(Answer::Hang);
    let s = wait(&agent, "timeout", |s| {
        s["gpu"]["pod_resources"]["state"] == "unavailable" && count(&events(s), "timeout") == 1
    });
    assert!(
        s["gpu"]["pod_resources"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("did not answer"),
        "{}",
        s["gpu"]
    );
    let lists = s["gpu"]["pod_resources"]["lists"].as_u64().unwrap();
    let s = wait(&agent, "more timeouts", |s| {
        s["gpu"]["pod_resources"]["lists"].as_u64().unwrap_or(0) >= lists + 2
    });
    assert_eq!(count(&events(&s), "timeout"), 1, "{}", s["gpu"]);
    let m = metrics(&agent);
    assert_series_pods(&m, &uuid(0), &[]);

    // 5. Back, then permission denied on the socket (the agent holds no capability after
    // start, so file modes bind it even as root).
    server.set(Answer::Pods(without_b));
    wait(&agent, "recovered", |s| count(&events(s), "recovered") == 1);
    set_mode(&server.path, 0o000);
    let s = wait(&agent, "permission denied", |s| {
        count(&events(s), "permission_denied") == 1
    });
    assert!(
        s["gpu"]["pod_resources"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("permission denied"),
        "{}",
        s["gpu"]
    );
    set_mode(&server.path, 0o660);

    // 6. An RPC error (the kubelet's API refusing): said once.
    server.set(Answer::Error(tonic::Code::Unavailable));
    let s = wait(&agent, "list failed", |s| {
        count(&events(s), "list_failed") == 1
    });
    let lists = s["gpu"]["pod_resources"]["lists"].as_u64().unwrap();
    let s = wait(&agent, "more failures", |s| {
        s["gpu"]["pod_resources"]["lists"].as_u64().unwrap_or(0) >= lists + 3
    });
    assert_eq!(count(&events(&s), "list_failed"), 1, "{}", s["gpu"]);
    assert_eq!(count(&events(&s), "permission_denied"), 1, "{}", s["gpu"]);
    // Through it all the GPUs were sampled and exported.
    assert_eq!(s["gpu"]["mode"], "on");
    let m = metrics(&agent);
    assert!(lines_of(&m, &uuid(3)).len() >= 5, "{m}");
    println!("pod-resources events: {:?}", events(&s));
    drop(agent);
}

/// Each target's canary spans carry its own pod's GPUs only: pod A's spans see GPU 1's full
/// memory and no throttling, pod B's see GPU 3 throttled and no full memory, each naming its
/// GPUs in `lmperf.gpu.hw_ids`.
#[tokio::test(flavor = "multi_thread")]
async fn each_targets_spans_carry_its_pods_gpus() {
    use fake_opentelemetry_collector::FakeCollectorServer;
    use lmperf_e2e::scripted::{Reply, ScriptedServer, chat_stream};
    let script = Script::write("gpu-pods-spans", &script());
    let lib = fake_nvml::library(&[]);
    let pods = PodResourcesServer::start(
        &script.dir.join("pod-resources"),
        Answer::Pods(node_pods(&[])),
    )
    .await;
    let server = ScriptedServer::start(std::sync::Arc::new(|_, _| {
        Reply::sse(chat_stream(
            4,
            Duration::from_millis(30),
            Duration::from_millis(60),
            5,
        ))
    }))
    .await;
    let cfg = config_to(&script.dir, &lib, &pods.path, &server.url(), "300ms");
    let mut collector = FakeCollectorServer::start().await.expect("collector");
    let mut envs = script.env();
    envs.push(("OTEL_TRACES_SAMPLER", "always_on".to_owned()));
    let args = [
        "--config".to_owned(),
        cfg.display().to_string(),
        "--otlp-protocol".into(),
        "grpc".into(),
        "--otlp-endpoint".into(),
        collector.endpoint(),
    ];
    let agent = tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let e: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Agent::spawn(&a, &e)
    })
    .await
    .unwrap();
    let st = agent.wait_status(Duration::from_secs(20), |s| {
        s["gpu"]["pod_resources"]["state"] == "ok"
    });
    assert_eq!(st["gpu"]["pod_resources"]["state"], "ok", "{}", st["gpu"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let spans = collector.exported_spans(20, Duration::from_secs(15)).await;
    drop(agent);
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for sp in &spans {
        let a = lmperf_e2e::otlp::attrs(&sp.attributes);
        let Some(ids) = sp.attributes.get("lmperf.gpu.hw_ids") else {
            continue;
        };
        let target = a.get("lmperf.target").cloned().unwrap_or_default();
        // The raw OTLP array (a Debug string): which GPU ids it names.
        let named: Vec<usize> = (0..5).filter(|i| ids.contains(&uuid(*i))).collect();
        match target.as_str() {
            "a" => {
                assert_eq!(named, [0, 1], "{ids}");
                assert_eq!(a["lmperf.gpu.throttled"], "false", "{a:?}");
                assert_eq!(
                    a["lmperf.gpu.memory.utilization.max"]
                        .parse::<f64>()
                        .unwrap(),
                    (150_754_820_096u64 / 100 * 99) as f64 / 150_754_820_096.0,
                    "{a:?}"
                );
            }
            "b" => {
                assert_eq!(named, [2, 3], "{ids}");
                assert_eq!(a["lmperf.gpu.throttled"], "true", "{a:?}");
                assert_eq!(
                    a["lmperf.gpu.memory.utilization.max"]
                        .parse::<f64>()
                        .unwrap(),
                    (150_754_820_096u64 / 10 * 6) as f64 / 150_754_820_096.0,
                    "{a:?}"
                );
            }
            other => panic!("span of target {other:?}: {a:?}"),
        }
        *seen.entry(target).or_default() += 1;
    }
    println!("spans with their pod's GPUs: {seen:?}");
    assert!(
        seen.get("a").is_some_and(|n| *n >= 2) && seen.get("b").is_some_and(|n| *n >= 2),
        "{seen:?} of {} spans",
        spans.len()
    );
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The proof's diagnosis half on the real binary (`LMPERF_DIAGNOSE_LIVE=1`, about 4 min, like
/// `tests/diagnose_live.rs`): both pods' targets slow down at once (inter-token gap 10 → 30 ms)
/// while GPU 3 (pod B's) throttles for thermal reasons and GPU 1's memory (pod A's) fills to
/// 99 %. Pod B's target is diagnosed `gpu_throttling` naming GPU 3, never memory pressure; pod
/// A's sees `gpu_memory_pressure` naming GPU 1, never throttling. Without the pod-resources
/// attribution both would read both GPUs (the unit test
/// `gpu::attribution_tests::without_pod_resources_every_target_reads_every_gpu`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_each_gpu_fault_is_its_own_pods_cause() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use lmperf_e2e::scripted::{Received, Reply, ScriptedServer, chat_stream};
    if std::env::var("LMPERF_DIAGNOSE_LIVE").map_or(true, |v| v != "1") {
        eprintln!("skipped: set LMPERF_DIAGNOSE_LIVE=1 (about 4 min)");
        return;
    }
    let total = 150_754_820_096u64;
    let files = std::env::temp_dir().join(format!("lmperf-gpu-pods-live-{}", std::process::id()));
    std::fs::create_dir_all(&files).unwrap();
    let file = |name: &str| files.join(name).display().to_string();
    let mut s = script();
    s["devices"][3]["clock_sm_mhz"] = json!({"file": file("sm3"), "default": 1980});
    s["devices"][3]["throttle_reasons"] = json!({"file": file("throttle3"), "default": 0});
    s["devices"][1]["memory_used_bytes"] = json!({"file": file("mem1"), "default": total / 10 * 6});
    let script = Script::write("gpu-pods-live", &s);
    let lib = fake_nvml::library(&[]);
    let pods = PodResourcesServer::start(
        &script.dir.join("pod-resources"),
        Answer::Pods(node_pods(&[])),
    )
    .await;
    let fault = Arc::new(AtomicBool::new(false));
    let f = fault.clone();
    let server = ScriptedServer::start(Arc::new(move |r: &Received, i: usize| {
        if !r.path.ends_with("/chat/completions") {
            return Reply::json(
                200,
                r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#,
            );
        }
        let on = f.load(Ordering::SeqCst);
        Reply::sse(chat_stream(
            16,
            Duration::from_millis(40 + (i % 7) as u64 * 3),
            Duration::from_millis(if on { 30 } else { 10 }),
            20,
        ))
    }))
    .await;
    let cfg = config_to(&script.dir, &lib, &pods.path, &server.url(), "500ms");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("[net]\nenabled = false\n");
    std::fs::write(&cfg, text).unwrap();
    let agent = spawn(&script, &cfg).await;
    tokio::time::sleep(Duration::from_secs(115)).await;
    std::fs::write(files.join("sm3"), "1100").unwrap();
    std::fs::write(files.join("throttle3"), "96").unwrap();
    std::fs::write(files.join("mem1"), (total / 100 * 99).to_string()).unwrap();
    fault.store(true, Ordering::SeqCst);
    let onset = Instant::now();
    let mut confirmed: std::collections::BTreeMap<String, Value> = Default::default();
    while onset.elapsed() < Duration::from_secs(100) && confirmed.len() < 2 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (code, body) = agent.get("/api/v1/diagnosis");
        assert_eq!(code, 200, "{body}");
        let d: Value = serde_json::from_str(&body).unwrap();
        for t in d["targets"].as_array().cloned().unwrap_or_default() {
            let name = t["target"].as_str().unwrap_or_default().to_owned();
            if t["state"] == "root_confirmed" && !confirmed.contains_key(&name) {
                println!(
                    "{name} root_confirmed {:.0} s after the onset: {}",
                    onset.elapsed().as_secs_f64(),
                    t["summary"]
                );
                confirmed.insert(name, t);
            }
        }
    }
    let status = agent.status();
    drop(agent);
    let _ = std::fs::remove_dir_all(&files);
    assert_eq!(
        status["gpu"]["pod_resources"]["state"], "ok",
        "{}",
        status["gpu"]
    );
    let causes = |t: &Value| -> Vec<String> {
        t["causes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|c| c["cause"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let gpus = |t: &Value, cause: &str, signal: &str| -> Value {
        t["causes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .find(|c| c["cause"] == cause)
            .and_then(|c| {
                c["evidence"]
                    .as_array()
                    .and_then(|e| e.iter().find(|e| e["signal"] == signal).cloned())
            })
            .map_or(Value::Null, |e| e["hw_ids"].clone())
    };
    let b = confirmed
        .get("b")
        .unwrap_or_else(|| panic!("pod B's target not confirmed: {confirmed:?}"));
    assert_eq!(b["causes"][0]["cause"], "gpu_throttling", "{b}");
    assert_eq!(
        gpus(b, "gpu_throttling", "gpu_throttle"),
        json!([uuid(3)]),
        "{b}"
    );
    assert!(
        !causes(b).contains(&"gpu_memory_pressure".to_owned()),
        "{b}"
    );
    let a = confirmed
        .get("a")
        .unwrap_or_else(|| panic!("pod A's target not confirmed: {confirmed:?}"));
    assert!(causes(a).contains(&"gpu_memory_pressure".to_owned()), "{a}");
    assert_eq!(
        gpus(a, "gpu_memory_pressure", "gpu_memory_utilization"),
        json!([uuid(1)]),
        "{a}"
    );
    assert!(!causes(a).contains(&"gpu_throttling".to_owned()), "{a}");
}
