//! The real NVML path end to end, without a GPU: the real `lmperf` binary loads the scripted
//! `libnvidia-ml.so.1` of `tests/support/fake_nvml/` through nvml-wrapper (`[gpu]
//! nvml_library`, `lmperf run --nvml-library`), so every call, error code and struct layout of
//! `daemon/src/gpu/nvml.rs` runs: every GPU series with the scripted values, process
//! attribution of a real process, faults (NOT_SUPPORTED, GPU_IS_LOST and back, XID, a hung
//! call, symbols an old driver lacks), and the VRAM peak and gate of `lmperf run`.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_opentelemetry_collector::FakeCollectorServer;
use lmperf_e2e::agent::{Agent, lmperf_bin};
use lmperf_e2e::fake_nvml::{self, Script};
use lmperf_e2e::prom_text::first as prom;
use lmperf_e2e::scripted::{Frame, Reply, ScriptedServer};
use lmperf_e2e::temp;
use serde_json::json;

const GPU0: &str = "GPU-0c8f6f54-2d4e-4f1a-9b1e-000000000000";
const GPU1: &str = "GPU-0c8f6f54-2d4e-4f1a-9b1e-000000000001";

/// `hw.temperature` of the GPU `uuid` (its sensor's `hw.parent`).
fn temperature(metrics: &str, uuid: &str) -> Option<f64> {
    prom(
        metrics,
        "hw_temperature_celsius",
        &[&format!("hw_parent=\"{uuid}\"")],
    )
}

fn hw_id(uuid: &str) -> String {
    format!("hw_id=\"{uuid}\"")
}

fn gpu_lines<'a>(metrics: &'a str, uuid: &str) -> Vec<&'a str> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(&format!("\"{uuid}\"")))
        .collect()
}

/// An agent config with GPU sampling every 100 ms from `lib`, canaries to `target`.
fn config(dir: &std::path::Path, lib: &std::path::Path, target: &str) -> std::path::PathBuf {
    let p = dir.join("agent.toml");
    let text = format!(
        "[canary]\ninterval = \"200ms\"\nmodel = \"m\"\n[[target]]\nurl = \"{target}\"\n[gpu]\ninterval = \"100ms\"\nnvml_library = \"{}\"\n",
        lib.display()
    );
    std::fs::write(&p, text).expect("write config");
    p
}

fn refused_target() -> String {
    format!("http://127.0.0.1:{}", lmperf_e2e::peers::free_port())
}

/// A process of the test's own, as a model server would be: `sleep 120`.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Self {
        Sleeper(
            Command::new("sleep")
                .arg("120")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn sleep"),
        )
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The container id `/proc/PID/cgroup` names (64 hex digits in a path segment), read here
/// independently of the agent's code.
fn container_id_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        for seg in line.rsplit(':').next().unwrap_or("").split('/').rev() {
            let seg = seg.trim_end_matches(".scope");
            let id = seg.rsplit('-').next().unwrap_or(seg);
            if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Some(id.to_owned());
            }
        }
    }
    None
}

/// OTLP data points (attributes, value) by (metric name, `hw.id` or ""), in arrival order.
type Points = BTreeMap<(String, String), Vec<(BTreeMap<String, String>, f64)>>;

/// Every OTLP data point of `exports`.
fn otlp_points(exports: &[fake_opentelemetry_collector::ExportedMetric]) -> Points {
    let mut out = Points::new();
    for e in exports {
        for m in &e.metrics {
            let data = serde_json::to_value(&m.data).unwrap_or_default();
            for kind in ["Gauge", "Sum"] {
                for p in data[kind]["data_points"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                {
                    let v = p["value"]["AsDouble"]
                        .as_f64()
                        .or_else(|| p["value"]["AsInt"].as_f64())
                        .unwrap_or(f64::NAN);
                    let raw: BTreeMap<String, String> =
                        serde_json::from_value(p["attributes"].clone()).unwrap_or_default();
                    let attrs = lmperf_e2e::otlp::attrs(&raw);
                    let id = attrs.get("hw.id").cloned().unwrap_or_default();
                    out.entry((m.name.clone(), id))
                        .or_default()
                        .push((attrs, v));
                }
            }
        }
    }
    out
}

/// The agent with config `cfg`, exporting over gRPC to `collector`, with one more variable.
async fn spawn_agent_otlp(
    script: &Script,
    cfg: &std::path::Path,
    collector: &FakeCollectorServer,
    extra: (&'static str, &str),
) -> Agent {
    let mut envs = script.env();
    envs.push((extra.0, extra.1.to_owned()));
    let args = [
        "--config".to_owned(),
        cfg.display().to_string(),
        "--otlp-protocol".into(),
        "grpc".into(),
        "--otlp-endpoint".into(),
        collector.endpoint(),
    ];
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let e: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Agent::spawn(&a, &e)
    })
    .await
    .expect("spawn the agent")
}

/// Acceptance 1 and 2: two scripted GPUs through the real nvml-wrapper backend. Every
/// `hw.gpu.*` / `lmperf.gpu.*` series on `/metrics` and over OTLP carries the script's value
/// in the documented unit (mW → W, mJ → J, MHz → Hz, % → fraction, KB/s → bytes), the status
/// lists both GPUs, and a real process of this test, scripted on GPU 0, is named by its command
/// and container id as `/proc` says.
#[tokio::test(flavor = "multi_thread")]
async fn two_scripted_gpus_every_series_with_the_scripted_values() {
    let sleeper = Sleeper::start();
    let pid = sleeper.pid();
    let mut script = fake_nvml::example("two_gpus.json");
    script["devices"][0]["processes"][0]["pid"] = json!(pid);
    let script = Script::write("two-gpus", &script);
    let lib = fake_nvml::library(&[]);
    let cfg = config(&script.dir, &lib, &refused_target());
    let mut collector = FakeCollectorServer::start().await.expect("collector");
    let agent = spawn_agent_otlp(
        &script,
        &cfg,
        &collector,
        ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
    )
    .await;
    let status = agent.wait_status(Duration::from_secs(10), |s| {
        s["gpu"]["mode"] == "on" && s["gpu"]["samples"].as_u64().unwrap_or(0) >= 5
    });
    let t0 = script.wait_t0(Duration::from_secs(1));
    let gpu = &status["gpu"];
    assert_eq!(gpu["mode"], "on", "{gpu}\n{}", agent.stderr_text());
    assert_eq!(gpu["driver_version"], "550.54.15");
    let devs = gpu["devices"].as_array().expect("devices");
    assert_eq!(devs.len(), 2, "{gpu}");
    for (d, (uuid, bus, used)) in devs.iter().zip([
        (GPU0, "00000000:17:00.0", 76235669504u64),
        (GPU1, "00000000:2A:00.0", 1073741824),
    ]) {
        assert_eq!(d["hw_id"], uuid);
        assert_eq!(d["name"], "NVIDIA H200");
        assert_eq!(d["pci_bus_id"], bus);
        assert_eq!(d["lost"], false);
        assert_eq!(d["unsupported_fields"], json!([]), "{d}");
        assert_eq!(d["memory_used_bytes"].as_u64(), Some(used));
        assert_eq!(d["memory_total_bytes"].as_u64(), Some(150754820096));
    }
    assert_eq!(devs[0]["utilization"].as_f64(), Some(0.87));
    // Acceptance 2: the real PID, with its command and container id as /proc says.
    let procs = devs[0]["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 1, "{procs:?}");
    assert_eq!(procs[0]["pid"].as_u64(), Some(u64::from(pid)));
    assert_eq!(procs[0]["executable"], "sleep");
    assert_eq!(procs[0]["command"], "sleep 120");
    assert_eq!(procs[0]["container_id"], json!(container_id_of(pid)));
    assert_eq!(procs[0]["used_bytes"].as_u64(), Some(75161927680));
    assert_eq!(procs[0]["sm_utilization"].as_f64(), Some(0.83));
    assert_eq!(devs[1]["processes"], json!([]));

    let (code, m) = agent.get("/metrics");
    assert_eq!(code, 200);
    let g0 = hw_id(GPU0);
    let g1 = hw_id(GPU1);
    // (series, extra label, GPU 0 value, GPU 1 value), in exported units.
    #[rustfmt::skip]
    let expect: &[(&str, &str, f64, f64)] = &[
        ("hw_gpu_utilization_ratio", "hw_gpu_task=\"general\"", 0.87, 0.12),
        ("lmperf_gpu_memory_copy_utilization_ratio", "", 0.41, 0.05),
        ("hw_gpu_memory_usage_bytes", "", 76235669504.0, 1073741824.0),
        ("hw_gpu_memory_limit_bytes", "", 150754820096.0, 150754820096.0),
        ("hw_gpu_memory_utilization_ratio", "", 76235669504.0 / 150754820096.0, 1073741824.0 / 150754820096.0),
        ("hw_power_watts", "", 512.345, 98.765),
        ("lmperf_gpu_power_limit_watts", "", 700.0, 700.0),
        ("hw_energy_joules_total", "", 123456.789, 98765.432),
        ("lmperf_gpu_clock_frequency_hertz", "lmperf_gpu_clock=\"sm\"", 1980e6, 1410e6),
        ("lmperf_gpu_clock_frequency_hertz", "lmperf_gpu_clock=\"memory\"", 3201e6, 3201e6),
        ("lmperf_gpu_throttle_ratio", "lmperf_gpu_throttle_reason=\"sw_thermal\"", 0.0, 0.0),
        ("lmperf_gpu_pcie_replays_total", "", 3.0, 0.0),
        ("hw_errors_total", "error_type=\"corrected\"", 7.0, 0.0),
        ("hw_errors_total", "error_type=\"uncorrected\"", 1.0, 0.0),
        ("hw_status_ratio", "hw_state=\"ok\"", 1.0, 1.0),
        ("hw_status_ratio", "hw_state=\"failed\"", 0.0, 0.0),
    ];
    for (name, extra, v0, v1) in expect {
        for (id, want) in [(&g0, v0), (&g1, v1)] {
            let labels: Vec<&str> = [id.as_str(), *extra]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect();
            let got = prom(&m, name, &labels)
                .unwrap_or_else(|| panic!("{name}{{{}}} missing:\n{m}", labels.join(",")));
            assert!(
                (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                "{name}{{{}}} = {got}, scripted {want}",
                labels.join(",")
            );
        }
    }
    // Identity labels on every series of a GPU.
    for l in gpu_lines(&m, GPU0)
        .into_iter()
        .filter(|l| l.starts_with("hw_gpu_") || l.starts_with("hw_power"))
    {
        for lab in [
            "hw_model=\"NVIDIA H200\"",
            "hw_vendor=\"NVIDIA\"",
            "hw_type=\"gpu\"",
            "hw_driver_version=\"550.54.15\"",
            "lmperf_gpu_pci_bus_id=\"00000000:17:00.0\"",
            "hw_name=\"GPU 0\"",
        ] {
            assert!(l.contains(lab), "{l} lacks {lab}");
        }
    }
    assert_eq!(temperature(&m, GPU0), Some(64.0));
    assert_eq!(temperature(&m, GPU1), Some(38.0));
    // PCIe: KB/s × 1024 over the time each reading stands for (from the first sample, which
    // counts one interval, to the last), in whole bytes; receive is twice transmit exactly.
    let since_start = fake_nvml::since(t0, std::time::SystemTime::now()) + 0.1;
    for (id, tx) in [(&g0, 1024.0), (&g1, 10.0)] {
        let io = |dir: &str| {
            prom(
                &m,
                "hw_gpu_io_bytes_total",
                &[id, &format!("network_io_direction=\"{dir}\"")],
            )
            .expect("hw.gpu.io")
        };
        let (sent, received) = (io("transmit"), io("receive"));
        let covered = sent / (tx * 1024.0);
        // At least the 5 samples the status wait saw (the first counts one 100 ms interval,
        // each next one the time since the one before: 0.5 s); how far the sampler got past
        // them before this read depends on the machine's load (a stressed run read 0.500 s of
        // 1.1 s), never beyond the time since the start.
        assert!(
            covered >= 0.5 - 1e-3 && covered <= since_start + 0.05,
            "hw.gpu.io covers {covered:.3} s of {since_start:.3} s"
        );
        assert!(
            (received - 2.0 * sent).abs() <= 2.0,
            "receive {received} vs transmit {sent}"
        );
    }
    let pid_label = format!("process_pid=\"{pid}\"");
    assert_eq!(
        prom(
            &m,
            "lmperf_gpu_process_memory_usage_bytes",
            &[&g0, &pid_label, "process_executable_name=\"sleep\""]
        ),
        Some(75161927680.0),
        "{m}"
    );
    assert_eq!(
        prom(
            &m,
            "lmperf_gpu_process_utilization_ratio",
            &[&g0, &pid_label]
        ),
        Some(0.83)
    );
    assert_eq!(prom(&m, "lmperf_gpu_lost_total", &[]), Some(0.0));

    // The same values over OTLP.
    let exports = collector.exported_metrics(2, Duration::from_secs(10)).await;
    let points = otlp_points(&exports);
    let otlp = |name: &str, id: &str, extra: Option<(&str, &str)>| -> Option<f64> {
        points
            .get(&(name.to_owned(), id.to_owned()))?
            .iter()
            .rev()
            .find(|(a, _)| extra.is_none_or(|(k, v)| a.get(k).map(String::as_str) == Some(v)))
            .map(|(_, v)| *v)
    };
    type Expect<'a> = (&'a str, Option<(&'a str, &'a str)>, f64, f64);
    #[rustfmt::skip]
    let otlp_expect: &[Expect] = &[
        ("hw.gpu.utilization", None, 0.87, 0.12),
        ("lmperf.gpu.memory_copy.utilization", None, 0.41, 0.05),
        ("hw.gpu.memory.usage", None, 76235669504.0, 1073741824.0),
        ("hw.gpu.memory.limit", None, 150754820096.0, 150754820096.0),
        ("hw.power", None, 512.345, 98.765),
        ("lmperf.gpu.power.limit", None, 700.0, 700.0),
        ("hw.energy", None, 123456.789, 98765.432),
        ("lmperf.gpu.clock.frequency", Some(("lmperf.gpu.clock", "sm")), 1980e6, 1410e6),
        ("lmperf.gpu.pcie.replays", None, 3.0, 0.0),
        ("hw.errors", Some(("error.type", "corrected")), 7.0, 0.0),
        ("hw.status", Some(("hw.state", "ok")), 1.0, 1.0),
        ("hw.gpu.memory.utilization", None, 76235669504.0 / 150754820096.0, 1073741824.0 / 150754820096.0),
        ("lmperf.gpu.throttle", Some(("lmperf.gpu.throttle.reason", "hw_thermal")), 0.0, 0.0),
    ];
    let names: Vec<&(String, String)> = points.keys().collect();
    for (name, extra, v0, v1) in otlp_expect {
        for (id, want) in [(GPU0, v0), (GPU1, v1)] {
            let got = otlp(name, id, *extra)
                .unwrap_or_else(|| panic!("OTLP {name} {id} missing; have {names:?}"));
            assert!(
                (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                "OTLP {name} {id} = {got}, scripted {want}"
            );
        }
    }
    assert_eq!(
        otlp("hw.temperature", &format!("{GPU0}-temperature"), None),
        Some(64.0)
    );
    assert_eq!(
        otlp("hw.temperature", &format!("{GPU1}-temperature"), None),
        Some(38.0)
    );
    assert_eq!(otlp("lmperf.gpu.lost", "", None), Some(0.0));
    assert_eq!(
        otlp("lmperf.gpu.process.utilization", GPU0, None),
        Some(0.83)
    );
    for id in [GPU0, GPU1] {
        let io = |dir: &str| {
            otlp("hw.gpu.io", id, Some(("network.io.direction", dir))).expect("OTLP hw.gpu.io")
        };
        let (sent, received) = (io("transmit"), io("receive"));
        assert!(
            sent > 0.0 && (received - 2.0 * sent).abs() <= 2.0,
            "OTLP hw.gpu.io {received} vs {sent}"
        );
    }
    let proc_mem = points
        .get(&(
            "lmperf.gpu.process.memory.usage".to_owned(),
            GPU0.to_owned(),
        ))
        .expect("OTLP process memory");
    let (attrs, v) = proc_mem.last().expect("a point");
    assert_eq!(*v, 75161927680.0);
    assert_eq!(
        attrs.get("process.pid").map(String::as_str),
        Some(pid.to_string().as_str()),
        "{attrs:?}"
    );
    assert_eq!(
        attrs.get("process.executable.name").map(String::as_str),
        Some("sleep")
    );
    assert_eq!(attrs.get("container.id").cloned(), container_id_of(pid));
    drop(sleeper);
}

fn spawn_agent(script: &Script, lib: &std::path::Path, target: &str) -> Agent {
    let cfg = config(&script.dir, lib, target);
    let envs = script.env();
    let e: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Agent::spawn(&["--config", cfg.to_str().unwrap(), "--no-otlp"], &e)
}

/// Writes script `s` and starts the agent on the full fake library, canaries to a refused port.
fn agent_on(tag: &str, s: &serde_json::Value) -> (Script, Agent) {
    let script = Script::write(tag, s);
    let agent = spawn_agent(&script, &fake_nvml::library(&[]), &refused_target());
    (script, agent)
}

fn events(status: &serde_json::Value, kind: &str) -> Vec<serde_json::Value> {
    status["gpu"]["events"]
        .as_array()
        .map(|v| v.iter().filter(|e| e["kind"] == kind).cloned().collect())
        .unwrap_or_default()
}

/// `st` holds one XID event, 79 on GPU 0, and `/metrics` counts it once; returns `/metrics`.
fn assert_one_xid_79_on_gpu0(agent: &Agent, st: &serde_json::Value) -> String {
    let xid = events(st, "xid");
    assert_eq!(xid.len(), 1, "{}", st["gpu"]);
    assert_eq!(xid[0]["hw_id"], GPU0, "{}", st["gpu"]);
    assert_eq!(xid[0]["detail"], "XID 79");
    // The snapshot with the count is published at the end of the tick that logged the event.
    std::thread::sleep(Duration::from_millis(300));
    let (_, m) = agent.get("/metrics");
    let counted = prom(
        &m,
        "lmperf_gpu_xid_errors_total",
        &[&hw_id(GPU0), "lmperf_gpu_xid=\"79\""],
    );
    assert_eq!(counted, Some(1.0), "{m}");
    m
}

/// Acceptance 3, faults through the real path: `NOT_SUPPORTED` on one field of GPU 1 (absent,
/// listed, warned once even across rediscoveries), GPU 1 answering `GPU_IS_LOST` from t=2 s to
/// t=4 s (a `lost` event, its series stop, `hw.status` failed, then rediscovery finds it and
/// its series resume), XID 79 on GPU 0 at t=1 s (counter and event).
#[test]
fn not_supported_gpu_lost_and_back_and_an_xid() {
    let mut s = fake_nvml::example("two_gpus.json");
    s["faults"] =
        json!([{ "call": "nvmlDeviceGetPowerUsage", "device": 1, "error": "NOT_SUPPORTED" }]);
    s["devices"][1]["lost"] = json!([{ "from": 2.0, "until": 4.0 }]);
    s["devices"][0]["xids"] = json!([{ "at": 1.0, "code": 79 }]);
    let (script, agent) = agent_on("faults", &s);
    let g1 = hw_id(GPU1);

    // XID 79 at t=1 s: the counter and the event.
    let st = agent.wait_status(Duration::from_secs(10), |s| !events(s, "xid").is_empty());
    let m = assert_one_xid_79_on_gpu0(&agent, &st);

    // NOT_SUPPORTED: GPU 1 has no power series, GPU 0 has; the field is listed.
    let st = agent.wait_status(Duration::from_secs(5), |s| {
        s["gpu"]["devices"][1]["unsupported_fields"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
    });
    assert_eq!(
        st["gpu"]["devices"][1]["unsupported_fields"],
        json!(["gpu.power"]),
        "{}",
        st["gpu"]
    );
    assert_eq!(st["gpu"]["devices"][0]["unsupported_fields"], json!([]));
    assert_eq!(prom(&m, "hw_power_watts", &[&g1]), None, "{m}");
    assert_eq!(prom(&m, "hw_power_watts", &[&hw_id(GPU0)]), Some(512.345));
    assert_eq!(
        prom(&m, "lmperf_gpu_power_limit_watts", &[&g1]),
        Some(700.0),
        "only the one field is absent"
    );

    // GPU_IS_LOST from t=2 s: the lost event, GPU 1's value series stop, hw.status says failed.
    let st = agent.wait_status(Duration::from_secs(10), |s| !events(s, "lost").is_empty());
    let lost = events(&st, "lost");
    assert_eq!(lost.len(), 1, "{}", st["gpu"]);
    assert_eq!(lost[0]["hw_id"], GPU1);
    let t0 = script.wait_t0(Duration::from_secs(1));
    let lost_at = lost[0]["at_unix_s"].as_f64().unwrap()
        - t0.duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
    // The agent stamps a GPU sample with its tick's start, the calls follow within
    // milliseconds (a fresh CI run saw 1.999 s for a loss scripted at 2 s): 100 ms early is
    // that, not a loss seen before it happened.
    assert!(
        (1.9..3.0).contains(&lost_at),
        "lost seen at t={lost_at:.3} s, scripted at 2 s"
    );
    assert_eq!(st["gpu"]["devices"][1]["lost"], true);
    let (_, m) = agent.get("/metrics");
    let values: Vec<&str> = gpu_lines(&m, GPU1)
        .into_iter()
        .filter(|l| !l.starts_with("hw_status_ratio"))
        .collect();
    assert_eq!(
        values,
        Vec::<&str>::new(),
        "a lost GPU keeps only hw.status"
    );
    assert_eq!(
        prom(&m, "hw_status_ratio", &[&g1, "hw_state=\"failed\""]),
        Some(1.0)
    );
    assert_eq!(
        prom(&m, "hw_status_ratio", &[&g1, "hw_state=\"ok\""]),
        Some(0.0)
    );
    assert_eq!(prom(&m, "lmperf_gpu_lost_total", &[]), Some(1.0));
    assert_eq!(
        prom(&m, "hw_gpu_memory_usage_bytes", &[&hw_id(GPU0)]),
        Some(76235669504.0),
        "GPU 0 goes on"
    );

    // Back at t=4 s; rediscovery (every 5 s) finds it, its series resume.
    let st = agent.wait_status(Duration::from_secs(12), |s| {
        !events(s, "recovered").is_empty() && s["gpu"]["devices"][1]["lost"] == false
    });
    let rec = events(&st, "recovered");
    assert_eq!(rec.len(), 1, "{}", st["gpu"]);
    assert_eq!(rec[0]["hw_id"], GPU1);
    std::thread::sleep(Duration::from_millis(300));
    let (_, m) = agent.get("/metrics");
    assert_eq!(
        prom(&m, "hw_gpu_memory_usage_bytes", &[&g1]),
        Some(1073741824.0),
        "{m}"
    );
    assert_eq!(
        prom(&m, "hw_status_ratio", &[&g1, "hw_state=\"ok\""]),
        Some(1.0)
    );
    assert_eq!(prom(&m, "hw_power_watts", &[&g1]), None);
    let err = agent.stderr_text();
    let warned = err
        .lines()
        .filter(|l| l.contains("GPU field not supported") && l.contains("gpu.power"))
        .count();
    assert_eq!(warned, 1, "warned once across the rediscovery:\n{err}");
    assert_eq!(err.matches("GPU is lost (GPU_IS_LOST)").count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Acceptance 3, a hung call: `nvmlDeviceGetTemperature` sleeps 5 s once from t=3 s. GPU samples
/// stall meanwhile; the canaries keep their 200 ms schedule.
#[test]
fn a_hung_nvml_call_delays_gpu_samples_never_canaries() {
    let mut s = fake_nvml::example("two_gpus.json");
    s["faults"] = json!([{ "call": "nvmlDeviceGetTemperature", "device": 0, "from": 3.0, "sleep_s": 5.0, "count": 1 }]);
    let (script, agent) = agent_on("hung", &s);
    let t0 = script.wait_t0(Duration::from_secs(5));
    let at = |secs: f64| {
        let due = t0 + Duration::from_secs_f64(secs);
        if let Ok(wait) = due.duration_since(std::time::SystemTime::now()) {
            std::thread::sleep(wait);
        }
        let st = agent.status();
        let samples = st["gpu"]["samples"].as_u64().unwrap_or(0);
        (
            samples,
            st["targets"][0]["requests"].as_u64().unwrap_or(0),
            Instant::now(),
        )
    };
    // The call hangs from the first tick after t=3 s until about t=8 s.
    let (s_before, r_before, t_before) = at(3.5);
    let (s_after, r_after, t_after) = at(7.0);
    let (s_end, _, _) = at(9.0);
    // The sampler is stuck in the call: at most the tick already under way is published.
    assert!(
        s_after <= s_before + 1,
        "GPU samples went on during the hung call: {s_before} → {s_after}"
    );
    assert!(
        s_end > s_after + 3,
        "GPU samples resume after it: {s_after} → {s_end}"
    );
    // PCIe bytes count the hung 5 s too (the reading after it stands for the whole gap).
    let (_, m) = agent.get("/metrics");
    let sent = prom(
        &m,
        "hw_gpu_io_bytes_total",
        &[&hw_id(GPU0), "network_io_direction=\"transmit\""],
    )
    .expect("hw.gpu.io");
    let covered = sent / (1024.0 * 1024.0);
    assert!(
        covered > 8.3,
        "hw.gpu.io covers {covered:.2} s of the 9 s since the first sample"
    );
    // One canary per 200 ms (± 10 % jitter) all along: 17 or 18 in 3.5 s.
    let sent = (r_after - r_before) as f64;
    let scheduled = (t_after - t_before).as_secs_f64() / 0.2;
    assert!(
        (sent - scheduled).abs() <= 0.15 * scheduled + 1.0,
        "{sent} canaries while the NVML call hung, {scheduled:.1} scheduled"
    );
    assert!(agent.stderr_text().lines().all(|l| !l.contains("panicked")));
}

/// Acceptance 3, symbols a driver lacks. Without `nvmlDeviceGetMemoryInfo_v2` (before R510)
/// VRAM comes from the v1 call; without `nvmlDeviceGetCurrentClocksThrottleReasons` (renamed
/// `…ClocksEventReasons` since R535) throttle reasons come from the new name; without `nvmlDeviceGetTotalEnergyConsumption` energy is
/// absent and the warning names the function; without `nvmlEventSetFree` XID counting is off
/// with its reason; the agent samples everything else. A library without `nvmlShutdown` is
/// refused with a reason, never a panic.
#[test]
fn missing_symbols_fall_back_or_say_why() {
    let mut s = fake_nvml::example("two_gpus.json");
    s["devices"][0]["throttle_reasons"] = json!(0x20);
    let script = Script::write("missing", &s);
    let lib = fake_nvml::library(&[
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlEventSetFree",
    ]);
    let agent = spawn_agent(&script, &lib, &refused_target());
    let st = agent.wait_status(Duration::from_secs(10), |s| {
        s["gpu"]["samples"].as_u64().unwrap_or(0) >= 5
    });
    assert_eq!(st["gpu"]["mode"], "on", "{}", st["gpu"]);
    for d in st["gpu"]["devices"].as_array().unwrap() {
        assert_eq!(d["unsupported_fields"], json!(["gpu.energy"]), "{d}");
    }
    let (_, m) = agent.get("/metrics");
    assert_eq!(
        prom(&m, "hw_gpu_memory_usage_bytes", &[&hw_id(GPU0)]),
        Some(76235669504.0),
        "v1 fallback:\n{m}"
    );
    assert_eq!(
        prom(&m, "hw_gpu_memory_limit_bytes", &[&hw_id(GPU1)]),
        Some(150754820096.0)
    );
    assert_eq!(prom(&m, "hw_energy_joules_total", &[]), None);
    // Throttle reasons from nvmlDeviceGetCurrentClocksEventReasons, the successor's name.
    assert_eq!(
        prom(
            &m,
            "lmperf_gpu_throttle_ratio",
            &[&hw_id(GPU0), "lmperf_gpu_throttle_reason=\"sw_thermal\""]
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        prom(
            &m,
            "lmperf_gpu_throttle_ratio",
            &[&hw_id(GPU1), "lmperf_gpu_throttle_reason=\"sw_thermal\""]
        ),
        Some(0.0)
    );
    assert_eq!(prom(&m, "hw_power_watts", &[&hw_id(GPU0)]), Some(512.345));
    let err = agent.stderr_text();
    let energy: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("function=nvmlDeviceGetTotalEnergyConsumption"))
        .collect();
    assert_eq!(energy.len(), 2, "once per GPU, naming the function:\n{err}");
    assert!(
        energy
            .iter()
            .all(|l| l.contains("gpu.energy") && l.contains("driver too old")),
        "{energy:?}"
    );
    assert_eq!(
        err.matches("no nvmlEventSetFree; XID events are not counted")
            .count(),
        1,
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    drop(agent);

    let lib = fake_nvml::library(&["nvmlShutdown"]);
    let agent = spawn_agent(&script, &lib, &refused_target());
    let st = agent.wait_status(Duration::from_secs(10), |s| s["gpu"]["mode"] == "off");
    assert_eq!(st["gpu"]["mode"], "off", "{}", st["gpu"]);
    let reason = st["gpu"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("no nvmlShutdown") && reason.contains(lib.to_str().unwrap()),
        "{reason}"
    );
    let st = agent.wait_status(Duration::from_secs(5), |s| {
        s["targets"][0]["requests"].as_u64().unwrap_or(0) >= 3
    });
    assert!(
        st["targets"][0]["requests"].as_u64().unwrap_or(0) >= 3,
        "canaries go on: {st}"
    );
    assert!(!agent.stderr_text().contains("panicked"));
}

/// Acceptance 4: `lmperf run --nvml-library` against a scripted server. GPU 1's used memory is
/// scripted from a file the server writes when the second benchmark (concurrency 2) starts
/// (its 11th request): 71 GiB, then 133 GiB of 141 GiB (94.3 %). Peak VRAM per benchmark is
/// the script's, and `--fail-on vram_pct>92` trips on the second benchmark only.
#[test]
fn lmperf_run_peak_vram_and_the_vram_gate_through_the_library() {
    let gib = |g: u64| g << 30;
    let dir = temp::dir("nvml-run");
    std::fs::create_dir_all(&dir).unwrap();
    let level = dir.join("gpu1_used_bytes");
    let devices = json!([
        { "uuid": GPU0, "memory_used_bytes": gib(71) },
        { "uuid": GPU1, "memory_used_bytes": { "file": level.display().to_string(), "default": gib(71) } }
    ]);
    let script = Script::write(
        "run",
        &json!({ "defaults": { "memory_total_bytes": gib(141) }, "devices": devices }),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let file = level.clone();
    let server = rt.block_on(ScriptedServer::start(Arc::new(move |req, _| {
        if req.path != "/v1/completions" {
            return Reply::json(404, r#"{"error":{"message":"not found"}}"#);
        }
        if served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 10 {
            std::fs::write(&file, (133u64 << 30).to_string()).expect("write the GPU 1 level");
        }
        let tok = |t: u64, fin: &str| Frame {
            at: Duration::from_millis(t),
            bytes: format!(
                "data: {{\"choices\":[{{\"text\":\"a\",\"finish_reason\":{fin}}}]}}\n\n"
            )
            .into_bytes(),
        };
        Reply::sse(vec![
            tok(20, "null"),
            tok(60, "null"),
            tok(100, "\"length\""),
            Frame {
                at: Duration::from_millis(100),
                bytes: b"data: [DONE]\n\n".to_vec(),
            },
        ])
    })));
    let out_dir = dir.join("out");
    let lib = fake_nvml::library(&[]);
    let t = Instant::now();
    let out = Command::new(lmperf_bin())
        .args([
            "run",
            "--target",
            &server.url(),
            "--model",
            "m",
            "--api",
            "completions",
            "--batch-sizes",
            "1",
            "2",
            "--seq-lengths",
            "8",
            "--num-prompts",
            "10",
            "--output-len",
            "3",
        ])
        .args([
            "--no-ignore-eos",
            "--fail-on",
            "vram_pct>92",
            "--nvml-library",
            lib.to_str().unwrap(),
            "--output-dir",
            out_dir.to_str().unwrap(),
        ])
        .envs(script.env())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    drop(server);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(t.elapsed() < Duration::from_secs(60));
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("summary.json"))
            .unwrap_or_else(|e| panic!("{e}\n{stderr}")),
    )
    .unwrap();
    assert_eq!(summary["gpu"]["mode"], "on", "{}\n{stderr}", summary["gpu"]);
    assert_ne!(
        out.status.code(),
        Some(0),
        "the gate fails the run:\n{stderr}"
    );
    assert_eq!(summary["failed_gates"], json!(["vram_pct>92"]));
    let (b1, b2) = (
        &summary["benchmarks"][0]["vram"],
        &summary["benchmarks"][1]["vram"],
    );
    assert_eq!(b1["peak_used_bytes"].as_u64(), Some(gib(71) * 2), "{b1}");
    assert_eq!(b1["total_bytes"].as_u64(), Some(gib(141) * 2));
    let pct1 = b1["peak_used_pct"].as_f64().unwrap();
    assert!(
        (pct1 - 71.0 / 141.0 * 100.0).abs() < 1e-6 && pct1 <= 92.0,
        "{b1}"
    );
    assert_eq!(
        b2["peak_used_bytes"].as_u64(),
        Some(gib(71) + gib(133)),
        "{b2}"
    );
    let pct2 = b2["peak_used_pct"].as_f64().unwrap();
    assert!(
        (pct2 - 133.0 / 141.0 * 100.0).abs() < 1e-6 && pct2 > 92.0,
        "{b2}"
    );
    // gpu_samples.jsonl: each benchmark's GPU signals, the fullest GPU's memory share as
    // scripted (71 of 141 GiB in the first; 133 in the second once the level was written).
    let samples = std::fs::read_to_string(out_dir.join("gpu_samples.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = samples
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mem = |b: &str| -> Vec<f64> {
        rows.iter()
            .filter(|r| r["benchmark"].as_str().is_some_and(|n| n.starts_with(b)))
            .map(|r| r["signals"]["gpu_memory_utilization"].as_f64().unwrap())
            .collect()
    };
    let (m1, m2) = (mem("c1_"), mem("c2_"));
    assert!(
        !m1.is_empty() && m1.iter().all(|&m| (m - 71.0 / 141.0).abs() < 1e-9),
        "{m1:?}"
    );
    assert!(
        m2.iter().any(|&m| (m - 133.0 / 141.0).abs() < 1e-9),
        "{m2:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Acceptance 3, error codes within a time window: `UNKNOWN` from `nvmlDeviceGetTemperature` of
/// GPU 0 and `TIMEOUT` from every `nvmlDeviceGetClockInfo` until t=2 s. Those series are absent
/// meanwhile (never 0), warned once each, and come back with the scripted values after.
#[test]
fn unknown_and_timeout_for_a_while_then_values_again() {
    let mut s = fake_nvml::example("two_gpus.json");
    s["faults"] = json!([
        { "call": "nvmlDeviceGetTemperature", "device": 0, "error": "UNKNOWN", "until": 2.0 },
        { "call": "nvmlDeviceGetClockInfo", "error": "TIMEOUT", "until": 2.0 }
    ]);
    let (script, agent) = agent_on("window", &s);
    let t0 = script.wait_t0(Duration::from_secs(5));
    let st = agent.wait_status(Duration::from_secs(5), |s| {
        s["gpu"]["samples"].as_u64().unwrap_or(0) >= 3
    });
    assert!(
        fake_nvml::since(t0, std::time::SystemTime::now()) < 1.8,
        "the check below must run inside the window"
    );
    let (_, m) = agent.get("/metrics");
    assert_eq!(temperature(&m, GPU0), None, "{m}");
    assert_eq!(temperature(&m, GPU1), Some(38.0));
    assert_eq!(prom(&m, "lmperf_gpu_clock_frequency_hertz", &[]), None);
    assert_eq!(
        st["gpu"]["devices"][0]["unsupported_fields"],
        json!([]),
        "a failing call is not \"unsupported\""
    );
    let st = agent.wait_status(Duration::from_secs(5), |_| {
        fake_nvml::since(t0, std::time::SystemTime::now()) > 2.5
    });
    assert_eq!(st["gpu"]["mode"], "on");
    let (_, m) = agent.get("/metrics");
    assert_eq!(temperature(&m, GPU0), Some(64.0), "{m}");
    assert_eq!(
        prom(
            &m,
            "lmperf_gpu_clock_frequency_hertz",
            &[&hw_id(GPU1), "lmperf_gpu_clock=\"sm\""]
        ),
        Some(1410e6)
    );
    let err = agent.stderr_text();
    let failed: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("Reading a GPU field failed"))
        .collect();
    // Temperature of GPU 0 once; the SM clock once per GPU.
    assert_eq!(
        failed
            .iter()
            .filter(|l| l.contains("gpu.temperature"))
            .count(),
        1,
        "{err}"
    );
    assert_eq!(
        failed.iter().filter(|l| l.contains("gpu.clock.sm")).count(),
        2,
        "{err}"
    );
    assert!(
        failed
            .iter()
            .any(|l| l.contains("Timeout") || l.contains("timed out") || l.contains("timeout")),
        "{failed:?}"
    );
}

/// The driver through the real path: `nvmlInit` answers `DRIVER_NOT_LOADED` until t=1 s (the
/// agent starts discovering and finds both GPUs at the 5 s retry), then every call answers
/// `UNINITIALIZED` from t=7 s to t=9 s (the driver went away: every GPU lost, one event, then
/// rediscovery). The script's clock runs across the library's reloads.
#[test]
fn driver_not_loaded_at_start_then_gone_and_back() {
    let mut s = fake_nvml::example("two_gpus.json");
    s["faults"] = json!([
        { "call": "nvmlInit_v2", "error": "DRIVER_NOT_LOADED", "until": 1.0 },
        { "call": "*", "error": "UNINITIALIZED", "from": 7.0, "until": 9.0 }
    ]);
    let (script, agent) = agent_on("driver", &s);
    let t0 = script.wait_t0(Duration::from_secs(5));
    let st = agent.wait_status(Duration::from_secs(3), |s| {
        s["gpu"]["mode"] == "discovering"
    });
    assert_eq!(st["gpu"]["mode"], "discovering", "{}", st["gpu"]);
    assert!(
        st["gpu"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("not loaded"),
        "{}",
        st["gpu"]
    );
    let st = agent.wait_status(Duration::from_secs(8), |s| s["gpu"]["mode"] == "on");
    assert_eq!(
        st["gpu"]["devices"].as_array().map(Vec::len),
        Some(2),
        "{}",
        st["gpu"]
    );
    let on_at = fake_nvml::since(t0, std::time::SystemTime::now());
    assert!(
        (4.5..6.5).contains(&on_at),
        "found at t={on_at:.2} s: the 5 s retry"
    );
    let st = agent.wait_status(Duration::from_secs(5), |s| {
        !events(s, "driver_unavailable").is_empty()
    });
    assert_eq!(st["gpu"]["mode"], "discovering", "{}", st["gpu"]);
    assert!(
        st["gpu"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("UNINITIALIZED"),
        "{}",
        st["gpu"]
    );
    assert!(
        st["gpu"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["lost"] == true)
    );
    let (_, m) = agent.get("/metrics");
    assert_eq!(prom(&m, "lmperf_gpu_lost_total", &[]), Some(2.0));
    assert_eq!(
        prom(&m, "hw_gpu_utilization_ratio", &[]),
        None,
        "no values while the driver is gone"
    );
    let st = agent.wait_status(Duration::from_secs(8), |s| s["gpu"]["mode"] == "on");
    assert_eq!(events(&st, "recovered").len(), 2, "{}", st["gpu"]);
    let back_at = fake_nvml::since(t0, std::time::SystemTime::now());
    assert!((9.0..14.0).contains(&back_at), "back at t={back_at:.2} s");
    std::thread::sleep(Duration::from_millis(300));
    let (_, m) = agent.get("/metrics");
    assert_eq!(
        prom(&m, "hw_gpu_utilization_ratio", &[&hw_id(GPU1)]),
        Some(0.12),
        "{m}"
    );
    assert!(!agent.stderr_text().contains("panicked"));
}

/// XID 79 as GPU 0 falls off the bus (it answers GPU_IS_LOST from the same instant, so its
/// UUID is no longer readable), while GPU 1 refuses XID registration: the event and the counter
/// still name GPU 0. (Two bugs the real path showed: nvml-wrapper frees the whole event set when
/// one registration fails, which silently dropped GPU 0's registration; and the UUID was read
/// at the event, giving `hw.id=""`.)
#[test]
fn xid_79_as_the_gpu_falls_off_the_bus_next_to_a_gpu_without_xid_events() {
    let mut s = fake_nvml::example("two_gpus.json");
    s["faults"] =
        json!([{ "call": "nvmlDeviceRegisterEvents", "device": 1, "error": "NOT_SUPPORTED" }]);
    s["devices"][0]["xids"] = json!([{ "at": 1.0, "code": 79 }]);
    s["devices"][0]["lost"] = json!([{ "from": 1.0, "until": 100.0 }]);
    s["devices"][1]["xids"] = json!([{ "at": 1.0, "code": 48 }]);
    let (_script, agent) = agent_on("xid79", &s);
    let st = agent.wait_status(Duration::from_secs(8), |s| {
        !events(s, "xid").is_empty() && !events(s, "lost").is_empty()
    });
    assert_eq!(events(&st, "lost")[0]["hw_id"], GPU0);
    let m = assert_one_xid_79_on_gpu0(&agent, &st);
    assert_eq!(
        prom(
            &m,
            "lmperf_gpu_xid_errors_total",
            &["lmperf_gpu_xid=\"48\""]
        ),
        None,
        "GPU 1 is not registered"
    );
    assert_eq!(
        prom(&m, "lmperf_gpu_xid_errors_total", &["hw_id=\"\""]),
        None
    );
}

/// Per-process utilization as NVML buffers it: one sample per 500 ms, while the agent samples
/// every 100 ms, so 4 ticks in 5 get `NOT_FOUND`. The process's SM utilization stays on
/// `/metrics` at every scrape (the last sample stands in for up to 3 s), never flickering.
#[test]
fn process_utilization_between_nvml_samples_does_not_flicker() {
    let sleeper = Sleeper::start();
    let mut s = fake_nvml::example("two_gpus.json");
    s["devices"][0]["processes"][0]["pid"] = json!(sleeper.pid());
    s["devices"][0]["process_sample_period_s"] = json!(0.5);
    let (_script, agent) = agent_on("period", &s);
    agent.wait_status(Duration::from_secs(5), |s| {
        s["gpu"]["samples"].as_u64().unwrap_or(0) >= 10
    });
    let pid = format!("process_pid=\"{}\"", sleeper.pid());
    let mut seen = Vec::new();
    for _ in 0..20 {
        let (_, m) = agent.get("/metrics");
        seen.push(prom(
            &m,
            "lmperf_gpu_process_utilization_ratio",
            &[&hw_id(GPU0), &pid],
        ));
        std::thread::sleep(Duration::from_millis(70));
    }
    assert!(seen.iter().all(|v| *v == Some(0.83)), "{seen:?}");
}

/// Every example of `tests/support/fake_nvml/examples/` loads without a complaint from the
/// library (no unknown field, no script error), and the agent lists exactly its GPUs with the
/// values the example gives at its start.
#[test]
fn every_example_script_loads_and_lists_its_gpus() {
    let dir = lmperf_e2e::agent::workspace_root().join("tests/support/fake_nvml/examples");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "throttle.json",
            "two_gpus.json",
            "vram_full.json",
            "xid.json"
        ]
    );
    for name in &names {
        let s = fake_nvml::example(name);
        let script = Script::write(&format!("example-{}", name.trim_end_matches(".json")), &s);
        let agent = spawn_agent(&script, &fake_nvml::library(&[]), &refused_target());
        let st = agent.wait_status(Duration::from_secs(5), |s| {
            s["gpu"]["samples"].as_u64().unwrap_or(0) >= 3
        });
        assert_eq!(st["gpu"]["mode"], "on", "{name}: {}", st["gpu"]);
        let want: Vec<&str> = s["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["uuid"].as_str().unwrap())
            .collect();
        let got: Vec<&str> = st["gpu"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["hw_id"].as_str().unwrap())
            .collect();
        assert_eq!(got, want, "{name}");
        let err = agent.stderr_text();
        assert!(
            !err.contains("fake-nvml:"),
            "{name}: the library complained:\n{err}"
        );
        let (_, m) = agent.get("/metrics");
        let g0 = hw_id(want[0]);
        match name.as_str() {
            // Before t=20 s: full clock, no thermal reason.
            "throttle.json" => {
                assert_eq!(
                    prom(
                        &m,
                        "lmperf_gpu_clock_frequency_hertz",
                        &[&g0, "lmperf_gpu_clock=\"sm\""]
                    ),
                    Some(1980e6),
                    "{m}"
                );
                assert_eq!(
                    prom(
                        &m,
                        "lmperf_gpu_throttle_ratio",
                        &[&g0, "lmperf_gpu_throttle_reason=\"sw_thermal\""]
                    ),
                    Some(0.0)
                );
            }
            // Before t=10 s: 60 %.
            "vram_full.json" => assert_eq!(
                prom(&m, "hw_gpu_memory_utilization_ratio", &[&g0])
                    .map(|v| (v * 1e6).round() / 1e6),
                Some(0.6),
                "{m}"
            ),
            // Before t=30 s: no XID yet, nothing lost.
            "xid.json" => {
                assert_eq!(prom(&m, "lmperf_gpu_xid_errors_total", &[]), None);
                assert_eq!(prom(&m, "lmperf_gpu_lost_total", &[]), Some(0.0));
            }
            _ => assert_eq!(prom(&m, "hw_power_watts", &[&g0]), Some(512.345)),
        }
    }
}

/// Each canary span carries the GPUs' state during its request, through the real backend:
/// GPU 0 throttles for thermal reasons (0x60) from t=2 s and raises XID 13 then; spans sent
/// before say neither, spans sent after say they were throttled, a span in flight at t=2 s
/// saw the XID; all with the scripted maximum utilization and memory.
#[tokio::test(flavor = "multi_thread")]
async fn canary_spans_carry_the_scripted_gpu_state() {
    // The GPU's one compute process is a real process of this test (as the model server would
    // be): spans name its PID, executable and container id as /proc tells them.
    let sleeper = Sleeper::start();
    let pid = sleeper.pid();
    let mut s = fake_nvml::example("two_gpus.json");
    s["devices"][0]["processes"][0]["pid"] = json!(pid);
    s["devices"][0]["throttle_reasons"] = json!({ "steps": [[0, 0], [2.0, 0x60]] });
    s["devices"][0]["xids"] = json!([{ "at": 2.0, "code": 13 }]);
    let script = Script::write("spans", &s);
    // Streams of 600 ms, so that a request spans several 100 ms GPU samples.
    let server = ScriptedServer::start(Arc::new(|_, _| {
        Reply::sse(lmperf_e2e::scripted::chat_stream(
            7,
            Duration::from_millis(50),
            Duration::from_millis(90),
            5,
        ))
    }))
    .await;
    let cfg = config(&script.dir, &fake_nvml::library(&[]), &server.url());
    let mut collector = FakeCollectorServer::start().await.expect("collector");
    let agent = spawn_agent_otlp(
        &script,
        &cfg,
        &collector,
        ("OTEL_TRACES_SAMPLER", "always_on"),
    )
    .await;
    let t0 = script.wait_t0(Duration::from_secs(5));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let spans = collector.exported_spans(15, Duration::from_secs(10)).await;
    drop(agent);
    let (mut before, mut after) = (0, 0);
    for sp in &spans {
        let a = lmperf_e2e::otlp::attrs(&sp.attributes);
        let start = std::time::UNIX_EPOCH + Duration::from_nanos(sp.start_time_unix_nano);
        let t = fake_nvml::since(t0, start);
        let end = std::time::UNIX_EPOCH + Duration::from_nanos(sp.end_time_unix_nano);
        let t_end = fake_nvml::since(t0, end);
        let Some(samples) = a.get("lmperf.gpu.samples") else {
            continue;
        };
        assert!(samples.parse::<u64>().unwrap() >= 1, "{a:?}");
        assert_eq!(a["lmperf.gpu.utilization.max"], "0.87", "{a:?}");
        assert!(
            sp.attributes["lmperf.gpu.process.pids"].contains(&pid.to_string()),
            "{a:?}"
        );
        assert!(
            sp.attributes["lmperf.gpu.process.executables"].contains("sleep"),
            "{a:?}"
        );
        let container = container_id_of(pid).unwrap_or_default();
        assert!(
            sp.attributes["lmperf.gpu.process.container_ids"].contains(&container),
            "{a:?}"
        );
        let mem: f64 = a["lmperf.gpu.memory.utilization.max"].parse().unwrap();
        assert!(
            (mem - 76235669504.0 / 150754820096.0).abs() < 1e-12,
            "{a:?}"
        );
        if t_end < 1.9 {
            before += 1;
            assert_eq!(a["lmperf.gpu.throttled"], "false", "t={t:.2}: {a:?}");
            assert_eq!(a["lmperf.gpu.xid.seen"], "false", "t={t:.2}: {a:?}");
        } else if t > 2.2 {
            after += 1;
            assert_eq!(a["lmperf.gpu.throttled"], "true", "t={t:.2}: {a:?}");
            let reasons = &sp.attributes["lmperf.gpu.throttle.reasons"];
            assert!(
                reasons.contains("sw_thermal") && reasons.contains("hw_thermal"),
                "{reasons}"
            );
        }
    }
    assert!(
        before >= 3 && after >= 3,
        "{before} spans before t=2 s, {after} after, of {}",
        spans.len()
    );
    let xid_spans = spans
        .iter()
        .filter(|sp| {
            lmperf_e2e::otlp::attrs(&sp.attributes)
                .get("lmperf.gpu.xid.seen")
                .map(String::as_str)
                == Some("true")
        })
        .count();
    assert!(xid_spans >= 1, "a span during the XID says so");
}

/// A GPU already lost when the agent starts (GPU_IS_LOST from its handle until t=3 s) is
/// never identified at the first discovery; discovery is retried for it, and it joins at the
/// 5 s retry. (Before, only tracked lost GPUs scheduled a retry: it stayed missing for good.)
#[test]
fn a_gpu_lost_at_start_joins_when_it_answers() {
    let mut s = fake_nvml::example("two_gpus.json");
    s["devices"][1]["lost"] = json!([{ "from": 0.0, "until": 3.0 }]);
    let (_script, agent) = agent_on("lost-at-start", &s);
    // After the first sample: "on" is reported as the GPU thread starts, before its first tick.
    let st = agent.wait_status(Duration::from_secs(3), |s| {
        s["gpu"]["mode"] == "on" && s["gpu"]["samples"].as_u64().is_some_and(|n| n >= 1)
    });
    assert_eq!(
        st["gpu"]["devices"].as_array().map(Vec::len),
        Some(1),
        "{}",
        st["gpu"]
    );
    let st = agent.wait_status(Duration::from_secs(8), |s| {
        s["gpu"]["devices"].as_array().map_or(0, Vec::len) == 2
    });
    let ids: Vec<&str> = st["gpu"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["hw_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [GPU0, GPU1], "{}", st["gpu"]);
    std::thread::sleep(Duration::from_millis(300));
    let (_, m) = agent.get("/metrics");
    assert_eq!(
        prom(&m, "hw_gpu_utilization_ratio", &[&hw_id(GPU1)]),
        Some(0.12),
        "{m}"
    );
    let err = agent.stderr_text();
    assert_eq!(err.matches("GPU is lost at discovery").count(), 1, "{err}");
}

/// A failed `nvmlEventSetWait_v2` (UNKNOWN from t=0.5 s to t=1 s) does not end XID counting:
/// XID 31 at t=2 s is still counted. (Before, the XID thread returned at the first error and
/// only a lost GPU's rediscovery would start another.)
#[test]
fn xid_counting_survives_a_failed_wait() {
    let mut s = fake_nvml::example("two_gpus.json");
    s["faults"] =
        json!([{ "call": "nvmlEventSetWait_v2", "error": "UNKNOWN", "from": 0.5, "until": 1.0 }]);
    s["devices"][1]["xids"] = json!([{ "at": 2.0, "code": 31 }]);
    let (_script, agent) = agent_on("xid-wait", &s);
    let st = agent.wait_status(Duration::from_secs(6), |s| !events(s, "xid").is_empty());
    let xid = events(&st, "xid");
    assert_eq!(xid.len(), 1, "{}", st["gpu"]);
    assert_eq!(xid[0]["hw_id"], GPU1);
    assert_eq!(xid[0]["detail"], "XID 31");
    let err = agent.stderr_text();
    assert_eq!(
        err.matches("Waiting for XID events failed").count(),
        1,
        "{err}"
    );
}
