//! Faults through the fake NVML, the shared GPU cases, the exported names against the
//! hardware semantic conventions, and the span attributes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::backend::{
    DeviceInfo, GpuBackend, GpuError, GpuProcess, MigInstance, ProcessUtilization, XidEvent,
    throttle,
};
use super::fake::FakeHandle;
use super::sampler::Sampler;
use super::state::{GpuState, Mode};
use crate::config::{self, Env, Overrides};
use crate::telemetry::Telemetry;

struct NoEnv;
impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

/// A telemetry pipeline without OTLP (metrics on the Prometheus registry only).
fn telemetry() -> Telemetry {
    let o = Overrides {
        targets: vec!["http://127.0.0.1:1".into()],
        no_otlp: true,
        ..Overrides::default()
    };
    let cfg = config::load(o, &NoEnv).unwrap();
    Telemetry::init(&cfg.otlp, &NoEnv).unwrap()
}

fn prom(t: &Telemetry) -> String {
    let mut out = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&t.registry.gather(), &mut out)
        .unwrap();
    out
}

/// Sample lines (not comments) of metric family `name`.
fn series<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        })
        .collect()
}

fn value(line: &str) -> f64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn case(name: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/cases/other")
        .join(name);
    serde_json::from_str(
        &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap()
}

struct Rig {
    state: Arc<GpuState>,
    sampler: Sampler<super::fake::FakeBackend>,
    t0: Instant,
    w0: SystemTime,
}

impl Rig {
    fn new(fake: FakeHandle) -> Self {
        let state = Arc::new(GpuState::new(Duration::from_secs(1), Mode::Starting));
        let sampler = Sampler::new(fake.backend(), state.clone(), Duration::from_secs(5));
        Self {
            state,
            sampler,
            t0: Instant::now(),
            w0: SystemTime::now(),
        }
    }
    /// A tick `s` seconds after the start.
    fn tick(&mut self, s: f64) -> bool {
        let d = Duration::from_secs_f64(s);
        self.sampler.tick(self.t0 + d, self.w0 + d)
    }
}

#[test]
fn case_14_nvml_wrapper_56_process_util_not_found() {
    let c = case("14_nvml_wrapper_56_process_util_not_found.json");
    let (input, want) = (&c["input"], &c["expected"]);
    let fake = FakeHandle::with_gpus(1);
    {
        let mut f = fake.lock();
        f.driver_version = input["driver"].as_str().unwrap().into();
        f.devices[0].info.name = input["device"].as_str().unwrap().into();
        assert_eq!(input["gpu_processes"], 0);
        f.devices[0].processes.clear();
        f.devices[0].process_utilization.clear(); // NVML_ERROR_NOT_FOUND
    }
    let mut rig = Rig::new(fake.clone());
    assert!(rig.tick(0.0));
    assert_eq!(rig.tick(1.0), want["sampler_continues"].as_bool().unwrap());
    let snap = rig.state.latest();
    let s = snap.devices[0]
        .sample
        .as_ref()
        .expect("a sample, not an error");
    assert_eq!(
        s.processes.len() as u64,
        want["gpu_process_count"].as_u64().unwrap()
    );
    assert_eq!(
        serde_json::to_value(&s.processes).unwrap(),
        want["per_process_samples"]
    );
    assert_eq!(
        !rig.sampler.warned().is_empty(),
        want["logged_as_error"].as_bool().unwrap(),
        "{:?}",
        rig.sampler.warned()
    );
    assert_eq!(
        s.utilization.is_some() && s.memory_used.is_some() && s.power_w.is_some(),
        want["other_fields_same_tick_exported"].as_bool().unwrap()
    );
    assert_eq!(s.utilization, Some(0.87));
    let calls = fake.lock().process_util_calls.clone();
    assert_eq!(calls[0], 0, "the first call asks for every buffered sample");
    let w1 = rig.w0 + Duration::from_secs(0);
    let expect_ts = w1
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert_eq!(
        calls[1] > 0,
        want["next_call_passes_last_seen_timestamp"]
            .as_bool()
            .unwrap()
    );
    assert_eq!(
        calls[1], expect_ts,
        "the second call passes the time of the first"
    );
    assert_eq!(
        rig.state.status().devices[0].unsupported_fields,
        Vec::<&str>::new()
    );
}

fn a100_mig(input: &serde_json::Value) -> FakeHandle {
    let fake = FakeHandle::with_gpus(1);
    {
        let mut f = fake.lock();
        let parent_uuid = "GPU-a100-0000".to_owned();
        let d = &mut f.devices[0];
        d.info = DeviceInfo {
            index: 0,
            uuid: parent_uuid.clone(),
            name: input["device"].as_str().unwrap().into(),
            pci_bus_id: "00000000:07:00.0".into(),
            mig_enabled: Some(input["mig_mode"] == "enabled"),
            mig: None,
        };
        // From the recorded NVML answers.
        d.unsupported.insert("gpu.utilization");
        d.memory.used = 10737418240;
        d.memory.total = 42949672960;
        d.power_mw = 61000;
        d.temperature_c = 34;
        let mut migs = Vec::new();
        for (m, name) in input["mig_devices"].as_array().unwrap().iter().enumerate() {
            let mut x = d.clone();
            let name = name.as_str().unwrap();
            x.info = DeviceInfo {
                index: 0,
                uuid: format!("MIG-a100-{m}"),
                name: name.into(),
                pci_bus_id: d.info.pci_bus_id.clone(),
                mig_enabled: None,
                mig: Some(MigInstance {
                    profile: "1g.5gb".into(),
                    parent_uuid: parent_uuid.clone(),
                    mig_index: m as u32,
                }),
            };
            x.memory.used = 1 << 30;
            x.memory.total = 5 << 30;
            migs.push(x);
        }
        f.devices.extend(migs);
    }
    fake
}

#[tokio::test]
async fn case_15_dcgm_exporter_430_mig_util_not_supported() {
    let c = case("15_dcgm_exporter_430_mig_util_not_supported.json");
    let (input, want) = (&c["input"], &c["expected"]);
    let t = telemetry();
    let mut rig = Rig::new(a100_mig(input));
    super::metrics::register(&t.meter(), rig.state.clone());
    for i in 0..3 {
        assert!(rig.tick(f64::from(i)), "sampler_crashed must be false");
    }
    assert!(!want["sampler_crashed"].as_bool().unwrap());
    let snap = rig.state.latest();
    assert_eq!(snap.devices.len(), 3, "the GPU and its two MIG instances");
    let parent = &snap.devices[0];
    let s = parent.sample.as_ref().unwrap();
    assert_eq!(
        s.utilization.is_some(),
        want["gpu_utilization_exported"].as_bool().unwrap()
    );
    assert_eq!(s.memory_copy_utilization, None);
    assert_eq!(s.memory_used, want["memory_used_bytes"].as_u64());
    assert_eq!(s.power_w, want["power_w"].as_f64());
    assert_eq!(s.temperature_c, want["temperature_c"].as_f64());
    let mut unsupported: Vec<&str> = want["unsupported_fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    unsupported.sort();
    let mut got = parent.unsupported.clone();
    got.sort();
    assert_eq!(got, unsupported);
    // Warned once per device and field: 2 fields x 3 devices, after 3 ticks.
    assert!(want["warn_once_per_device_field"].as_bool().unwrap());
    assert_eq!(rig.sampler.warnings(), 6);
    let parent_warned: Vec<&str> = rig
        .sampler
        .warned()
        .into_iter()
        .filter(|(id, _)| id == "GPU-a100-0000")
        .map(|(_, f)| f)
        .collect();
    assert_eq!(parent_warned, unsupported);
    // Exported: absent, never 0; the other fields are there.
    let text = prom(&t);
    assert!(
        series(&text, "hw_gpu_utilization_ratio").is_empty(),
        "{text}"
    );
    assert_eq!(want["gpu_utilization_reported_as_zero"], false);
    let mem: Vec<&str> = series(&text, "hw_gpu_memory_usage_bytes")
        .into_iter()
        .filter(|l| l.contains("hw_id=\"GPU-a100-0000\""))
        .collect();
    assert_eq!(mem.len(), 1, "{text}");
    assert_eq!(value(mem[0]), 10737418240.0);
    let power: Vec<&str> = series(&text, "hw_power_watts")
        .into_iter()
        .filter(|l| l.contains("hw_id=\"GPU-a100-0000\""))
        .collect();
    assert_eq!(value(power[0]), 61.0);
    let mig: Vec<&str> = series(&text, "hw_gpu_memory_usage_bytes")
        .into_iter()
        .filter(|l| l.contains("MIG-a100-1"))
        .collect();
    assert!(
        mig[0].contains("hw_parent=\"GPU-a100-0000\"")
            && mig[0].contains("lmperf_gpu_mig_profile=\"1g.5gb\""),
        "{}",
        mig[0]
    );
    let st = rig.state.status();
    assert_eq!(st.devices[1].mig_profile.as_deref(), Some("1g.5gb"));
}

#[tokio::test]
async fn no_driver_turns_gpu_metrics_off_with_the_reason() {
    let fake = FakeHandle::with_gpus(2);
    fake.lock().no_library =
        Some("libnvidia-ml.so.1: cannot open shared object file: No such file or directory".into());
    let t = telemetry();
    let mut rig = Rig::new(fake.clone());
    super::metrics::register(&t.meter(), rig.state.clone());
    assert!(!rig.tick(0.0), "the loop ends");
    assert!(!rig.tick(1.0));
    assert_eq!(fake.lock().inits, 1, "tried once, logged once");
    let st = rig.state.status();
    assert_eq!(st.mode, Mode::Off);
    assert!(
        st.reason.as_deref().unwrap().contains("libnvidia-ml.so.1"),
        "{:?}",
        st.reason
    );
    assert!(st.devices.is_empty());
    let text = prom(&t);
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("hw_") || l.starts_with("lmperf_gpu")),
        "{text}"
    );
}

#[test]
fn real_nvml_without_the_library_is_no_library() {
    let mut b = super::nvml::NvmlBackend::new(Some("/nonexistent/libnvidia-ml.so.1".into()));
    match b.init() {
        Err(GpuError::NoLibrary(why)) => {
            assert!(why.contains("/nonexistent/libnvidia-ml.so.1"), "{why}")
        }
        other => panic!("expected NoLibrary, got {other:?}"),
    }
    assert!(matches!(b.device_count(), Err(GpuError::Driver(_))));
}

#[tokio::test]
async fn gpu_lost_mid_run_stops_its_series_then_recovers_without_restart() {
    let t = telemetry();
    let fake = FakeHandle::with_gpus(2);
    let lost_id = fake.lock().devices[1].info.uuid.clone();
    let mut rig = Rig::new(fake.clone());
    super::metrics::register(&t.meter(), rig.state.clone());
    assert!(rig.tick(0.0));
    let text = prom(&t);
    assert_eq!(series(&text, "hw_gpu_utilization_ratio").len(), 2, "{text}");

    fake.lock().lost.insert(lost_id.clone()); // NVML_ERROR_GPU_IS_LOST
    assert!(rig.tick(1.0));
    let snap = rig.state.latest();
    assert!(snap.devices[1].lost && snap.devices[1].sample.is_none());
    assert!(
        !snap.devices[0].lost && snap.devices[0].sample.is_some(),
        "the other GPU goes on"
    );
    let st = rig.state.status();
    assert_eq!(
        (st.events[0].kind, st.events[0].hw_id.as_deref()),
        ("lost", Some(lost_id.as_str()))
    );
    let text = prom(&t);
    let util = series(&text, "hw_gpu_utilization_ratio");
    assert_eq!(util.len(), 1, "{text}");
    assert!(!util[0].contains(&lost_id));
    let failed: Vec<&str> = series(&text, "hw_status_ratio")
        .into_iter()
        .filter(|l| l.contains(&lost_id) && l.contains("hw_state=\"failed\""))
        .collect();
    assert_eq!(value(failed[0]), 1.0, "{text}");
    assert_eq!(value(series(&text, "lmperf_gpu_lost_total")[0]), 1.0);

    // The GPU comes back; discovery is retried every 5 s, not at every tick.
    fake.lock().lost.clear();
    assert!(rig.tick(2.0));
    assert!(rig.state.latest().devices[1].lost);
    assert_eq!(fake.lock().inits, 1);
    assert!(rig.tick(6.5));
    assert_eq!(fake.lock().inits, 2);
    let snap = rig.state.latest();
    assert!(snap.devices.iter().all(|d| !d.lost && d.sample.is_some()));
    assert_eq!(
        rig.state.status().events.last().map(|e| e.kind),
        Some("recovered")
    );
    assert_eq!(rig.state.mode(), Mode::On);
    assert_eq!(series(&prom(&t), "hw_gpu_utilization_ratio").len(), 2);
}

#[test]
fn driver_reloaded_mid_run_rediscovers_and_recovers() {
    let fake = FakeHandle::with_gpus(2);
    let mut rig = Rig::new(fake.clone());
    assert!(rig.tick(0.0));
    fake.lock().driver_down = true;
    assert!(rig.tick(1.0));
    let st = rig.state.status();
    assert_eq!(st.mode, Mode::Discovering);
    assert!(
        st.reason.as_deref().unwrap().contains("driver unavailable"),
        "{:?}",
        st.reason
    );
    assert!(st.devices.iter().all(|d| d.lost));
    assert_eq!(st.events.last().map(|e| e.kind), Some("driver_unavailable"));
    // Still reloading at the next discovery: stays discovering.
    assert!(rig.tick(6.5));
    assert_eq!(rig.state.mode(), Mode::Discovering);
    fake.lock().driver_down = false;
    assert!(rig.tick(7.5), "not yet due");
    assert_eq!(rig.state.mode(), Mode::Discovering);
    assert!(rig.tick(12.0));
    let st = rig.state.status();
    assert_eq!(st.mode, Mode::On);
    assert!(
        st.devices
            .iter()
            .all(|d| !d.lost && d.utilization == Some(0.87))
    );
    assert_eq!(
        st.events.iter().filter(|e| e.kind == "recovered").count(),
        2
    );
    assert_eq!(fake.lock().inits, 3);
}

#[test]
fn span_attributes_describe_the_gpus_during_the_request() {
    let fake = FakeHandle::with_gpus(2);
    let mut rig = Rig::new(fake.clone());
    assert!(rig.tick(0.0));
    {
        let mut f = fake.lock();
        f.devices[1].utilization.gpu_pct = 99;
        f.devices[1].throttle = throttle::SW_POWER_CAP | throttle::GPU_IDLE;
        let uuid = f.devices[1].info.uuid.clone();
        f.pending_xids.push(XidEvent { uuid, code: 79 });
    }
    assert!(rig.tick(1.0));
    fake.lock().devices[1].throttle = throttle::GPU_IDLE;
    fake.lock().devices[1].utilization.gpu_pct = 10;
    assert!(rig.tick(2.0));
    let at = |s: f64| rig.w0 + Duration::from_secs_f64(s);
    let attrs = |a: SystemTime, b: SystemTime| -> std::collections::HashMap<String, String> {
        rig.state
            .request_attributes(a, b)
            .into_iter()
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect()
    };
    // A request from 0.5 s to 1.5 s saw the sample at 1 s.
    let a = attrs(at(0.5), at(1.5));
    assert_eq!(a["lmperf.gpu.utilization.max"], "0.99");
    assert_eq!(
        a["lmperf.gpu.memory.utilization.max"],
        (71.0f64 / 141.0).to_string()
    );
    assert_eq!(a["lmperf.gpu.throttled"], "true");
    assert_eq!(a["lmperf.gpu.throttle.reasons"], "[\"sw_power_cap\"]");
    assert_eq!(a["lmperf.gpu.xid.seen"], "true");
    assert_eq!(a["lmperf.gpu.xid.codes"], "[79]");
    assert_eq!(a["lmperf.gpu.samples"], "1");
    // A short request between samples gets the latest sample before its end; idle is no throttle.
    let a = attrs(at(2.1), at(2.3));
    assert_eq!(a["lmperf.gpu.utilization.max"], "0.87");
    assert_eq!(a["lmperf.gpu.throttled"], "false");
    assert_eq!(a["lmperf.gpu.xid.seen"], "false");
    assert!(!a.contains_key("lmperf.gpu.xid.codes"));
    // Before any sample: nothing.
    assert!(
        rig.state
            .request_attributes(
                rig.w0 - Duration::from_secs(5),
                rig.w0 - Duration::from_secs(4)
            )
            .is_empty()
    );
    assert_eq!(rig.state.latest().xid_counts.values().sum::<u64>(), 1);
}

#[tokio::test]
async fn processes_are_attributed_through_proc() {
    let t = telemetry();
    let me = std::process::id();
    let fake = FakeHandle::with_gpus(1);
    {
        let mut f = fake.lock();
        f.devices[0].processes = vec![GpuProcess {
            pid: me,
            used_bytes: Some(71 << 30),
        }];
        f.devices[0].process_utilization = vec![ProcessUtilization {
            pid: me,
            timestamp_us: u64::MAX,
            sm_pct: 64,
            memory_pct: 20,
        }];
    }
    let mut rig = Rig::new(fake);
    super::metrics::register(&t.meter(), rig.state.clone());
    assert!(rig.tick(0.0));
    let st = rig.state.status();
    let p = &st.devices[0].processes[0];
    assert_eq!(
        (p.pid, p.used_bytes, p.sm_utilization),
        (me, Some(71 << 30), Some(0.64))
    );
    assert!(
        p.command.as_deref().is_some_and(|c| !c.is_empty()) && p.executable.is_some(),
        "{p:?}"
    );
    let text = prom(&t);
    let line = series(&text, "lmperf_gpu_process_memory_usage_bytes")[0];
    assert!(line.contains(&format!("process_pid=\"{me}\"")), "{line}");
    assert_eq!(value(line), (71u64 << 30) as f64);
}

/// `gpu_foreign_processes` counts the processes on the GPUs other than the model servers':
/// with a fake `/proc`, vLLM's API server (pid 100) listens on the target's port 8000, its GPU
/// worker (101, a child) holds 60 GB; a training job (500) arrives with 10 GB. The worker is
/// the model server's, the job is foreign; a process `/proc` does not show counts as foreign.
#[test]
fn foreign_gpu_processes_leave_out_the_model_servers_own() {
    use super::procs::tests::{TCP_8000, fake_proc};
    let root = std::env::temp_dir().join(format!("lmperf-gpu-foreign-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    fake_proc(&root, 100, 1, TCP_8000, &["socket:[4242]"]);
    fake_proc(&root, 101, 100, TCP_8000, &["/dev/nvidia0"]);
    fake_proc(&root, 500, 1, TCP_8000, &["/dev/nvidia0", "socket:[4343]"]);
    let fake = FakeHandle::with_gpus(1);
    fake.lock().devices[0].processes = vec![GpuProcess {
        pid: 101,
        used_bytes: Some(60 << 30),
    }];
    fake.lock().devices[0].process_utilization.clear();
    let state = Arc::new(GpuState::new(Duration::from_secs(1), Mode::Starting));
    let sampler = Sampler::new(fake.backend(), state.clone(), Duration::from_secs(5))
        .with_proc_root(root.clone());
    let mut rig = Rig {
        state,
        sampler,
        t0: Instant::now(),
        w0: SystemTime::now(),
    };
    rig.state.set_server_ports(vec![8000, 8000]);
    let foreign = |rig: &Rig| {
        let (signals, _) = crate::diagnosis_live::gpu_signals(&rig.state.latest());
        signals
            .iter()
            .find(|(s, _)| *s == crate::diagnosis::Signal::GpuForeignProcesses)
            .map(|(_, v)| *v)
    };
    assert!(rig.tick(0.0));
    assert_eq!(
        foreign(&rig),
        Some(0.0),
        "the model server's worker alone: nothing foreign"
    );
    fake.lock().devices[0].processes.push(GpuProcess {
        pid: 500,
        used_bytes: Some(10 << 30),
    });
    fake.lock().devices[0].processes.push(GpuProcess {
        pid: 77_777,
        used_bytes: Some(1 << 30),
    });
    assert!(rig.tick(1.0));
    assert_eq!(
        foreign(&rig),
        Some(2.0),
        "the job and the process /proc does not show"
    );
    let st = rig.state.status();
    let flags: Vec<(u32, bool)> = st.devices[0]
        .processes
        .iter()
        .map(|p| (p.pid, p.model_server))
        .collect();
    assert_eq!(flags, [(101, true), (500, false), (77_777, false)]);
    // Other target ports: the worker is no longer a model server's.
    rig.state.set_server_ports(vec![9000]);
    assert!(rig.tick(2.0));
    assert_eq!(foreign(&rig), Some(3.0));
    let _ = std::fs::remove_dir_all(&root);
}

/// The hardware conventions' GPU-related metrics (semantic-conventions docs/hardware/gpu.md,
/// common.md, temperature.md): name, instrument, unit.
const SPEC_METRICS: &[(&str, &str, &str)] = &[
    ("hw.errors", "Counter", "{error}"),
    ("hw.gpu.io", "Counter", "By"),
    ("hw.gpu.memory.limit", "UpDownCounter", "By"),
    ("hw.gpu.memory.utilization", "Gauge", "1"),
    ("hw.gpu.memory.usage", "UpDownCounter", "By"),
    ("hw.gpu.utilization", "Gauge", "1"),
    ("hw.status", "UpDownCounter", "1"),
    ("hw.power", "Gauge", "W"),
    ("hw.energy", "Counter", "J"),
    ("hw.temperature", "Gauge", "Cel"),
];
/// Attributes the conventions define for those metrics (docs/registry/attributes/hardware.md,
/// network.md, error.md, process.md, container.md).
const SPEC_ATTRIBUTES: &[&str] = &[
    "hw.id",
    "hw.name",
    "hw.model",
    "hw.vendor",
    "hw.type",
    "hw.driver_version",
    "hw.parent",
    "hw.gpu.task",
    "hw.state",
    "network.io.direction",
    "error.type",
    "process.pid",
    "process.executable.name",
    "container.id",
];

#[tokio::test]
async fn exported_names_match_the_hardware_conventions() {
    use crate::telemetry::names as n;
    let ours = [
        n::METRIC_HW_ERRORS,
        n::METRIC_HW_GPU_IO,
        n::METRIC_HW_GPU_MEMORY_LIMIT,
        n::METRIC_HW_GPU_MEMORY_UTILIZATION,
        n::METRIC_HW_GPU_MEMORY_USAGE,
        n::METRIC_HW_GPU_UTILIZATION,
        n::METRIC_HW_STATUS,
        n::METRIC_HW_POWER,
        n::METRIC_HW_ENERGY,
        n::METRIC_HW_TEMPERATURE,
    ];
    assert_eq!(
        ours.to_vec(),
        SPEC_METRICS.iter().map(|m| m.0).collect::<Vec<_>>()
    );
    let attrs = [
        n::HW_ID,
        n::HW_NAME,
        n::HW_MODEL,
        n::HW_VENDOR,
        n::HW_TYPE,
        n::HW_DRIVER_VERSION,
        n::HW_PARENT,
        n::HW_GPU_TASK,
        n::HW_STATE,
        n::NETWORK_IO_DIRECTION,
        n::ERROR_TYPE,
        n::PROCESS_PID,
        n::PROCESS_EXECUTABLE_NAME,
        n::CONTAINER_ID,
    ];
    assert_eq!(attrs.to_vec(), SPEC_ATTRIBUTES.to_vec());

    // What is actually exported, through the Prometheus translation (dots → underscores,
    // unit suffix, `_total` on counters): every spec metric is there with its unit, every
    // other GPU series is `lmperf_gpu_*`, and every label is a spec attribute or `lmperf.*`.
    let t = telemetry();
    let fake = FakeHandle::with_gpus(1);
    {
        let mut f = fake.lock();
        f.devices[0].processes = vec![GpuProcess {
            pid: std::process::id(),
            used_bytes: Some(1 << 30),
        }];
        f.devices[0].process_utilization = vec![ProcessUtilization {
            pid: std::process::id(),
            timestamp_us: u64::MAX,
            sm_pct: 5,
            memory_pct: 1,
        }];
        let uuid = f.devices[0].info.uuid.clone();
        f.pending_xids.push(XidEvent { uuid, code: 48 });
    }
    let mut rig = Rig::new(fake);
    super::metrics::register(&t.meter(), rig.state.clone());
    rig.tick(0.0);
    let text = prom(&t);
    let prom_unit = |u: &str| match u {
        "By" => "_bytes",
        "1" => "_ratio",
        "W" => "_watts",
        "J" => "_joules",
        "Cel" => "_celsius",
        _ => "",
    };
    for (name, kind, unit) in SPEC_METRICS {
        let total = if *kind == "Counter" { "_total" } else { "" };
        let family = format!("{}{}{total}", name.replace('.', "_"), prom_unit(unit));
        assert!(
            !series(&text, &family).is_empty(),
            "{family} missing:\n{text}"
        );
    }
    let allowed: Vec<String> = SPEC_ATTRIBUTES
        .iter()
        .map(|a| a.replace('.', "_"))
        .collect();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && (l.starts_with("hw_") || l.starts_with("lmperf_gpu")))
    {
        let family = &line[..line.find(['{', ' ']).unwrap()];
        assert!(
            family.starts_with("lmperf_gpu_")
                || SPEC_METRICS
                    .iter()
                    .any(|(n, _, _)| family.starts_with(&n.replace('.', "_"))),
            "{family} is neither a spec metric nor lmperf_gpu_*"
        );
        let labels = line
            .split_once('{')
            .map(|(_, r)| r.split_once('}').unwrap().0)
            .unwrap_or("");
        for kv in labels.split("\",").filter(|s| !s.is_empty()) {
            let key = kv.split('=').next().unwrap();
            assert!(
                allowed.iter().any(|a| a == key)
                    || key.starts_with("lmperf_")
                    || key.starts_with("otel_scope_"),
                "label {key} of {family}"
            );
        }
    }
    let util = series(&text, "hw_gpu_utilization_ratio")[0];
    for want in [
        "hw_type=\"gpu\"",
        "hw_vendor=\"NVIDIA\"",
        "hw_model=\"NVIDIA H200\"",
        "hw_driver_version=\"550.54.14\"",
        "hw_gpu_task=\"general\"",
        "hw_name=\"GPU 0\"",
        "lmperf_gpu_pci_bus_id=\"00000000:17:00.0\"",
    ] {
        assert!(util.contains(want), "{want} in {util}");
    }
    assert_eq!(value(util), 0.87);
}

/// A backend whose every call takes 20 ms (a slow driver).
struct Slow(super::fake::FakeBackend);
macro_rules! slow {
    ($($f:ident($($a:ident: $t:ty),*) -> $r:ty;)*) => {
        $(fn $f(&mut self, $($a: $t),*) -> $r { std::thread::sleep(Duration::from_millis(20)); self.0.$f($($a),*) })*
    };
}
impl GpuBackend for Slow {
    fn shutdown(&mut self) {
        self.0.shutdown()
    }
    slow! {
        init() -> Result<String, GpuError>;
        device_count() -> Result<u32, GpuError>;
        devices_at(i: u32) -> Result<Vec<DeviceInfo>, GpuError>;
        utilization(d: super::backend::DeviceRef) -> Result<super::backend::Utilization, GpuError>;
        memory(d: super::backend::DeviceRef) -> Result<super::backend::MemoryInfo, GpuError>;
        power_mw(d: super::backend::DeviceRef) -> Result<u32, GpuError>;
        power_limit_mw(d: super::backend::DeviceRef) -> Result<u32, GpuError>;
        energy_mj(d: super::backend::DeviceRef) -> Result<u64, GpuError>;
        temperature_c(d: super::backend::DeviceRef) -> Result<u32, GpuError>;
        clock_mhz(d: super::backend::DeviceRef, k: super::backend::ClockKind) -> Result<u32, GpuError>;
        throttle_reasons(d: super::backend::DeviceRef) -> Result<u64, GpuError>;
        pcie_kb_per_s(d: super::backend::DeviceRef, k: super::backend::PcieDirection) -> Result<u32, GpuError>;
        pcie_replays(d: super::backend::DeviceRef) -> Result<u64, GpuError>;
        ecc_errors(d: super::backend::DeviceRef, k: super::backend::EccKind) -> Result<u64, GpuError>;
        processes(d: super::backend::DeviceRef) -> Result<Vec<GpuProcess>, GpuError>;
        process_utilization(d: super::backend::DeviceRef, l: u64) -> Result<Vec<ProcessUtilization>, GpuError>;
        poll_xids() -> Result<Vec<XidEvent>, GpuError>;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_driver_delays_no_task_of_the_runtime() {
    // 8 GPUs x ~17 calls x 20 ms: a tick takes ~3 s on the sampler thread.
    let state = Arc::new(GpuState::new(Duration::from_millis(100), Mode::Starting));
    let monitor = super::sampler::spawn(
        Slow(FakeHandle::with_gpus(8).backend()),
        state.clone(),
        Duration::from_secs(5),
    )
    .unwrap();
    // Meanwhile a one-thread runtime's timers fire: a sampler on the runtime's thread would
    // hold the first 10 ms timer for the whole ~3 s tick. The bound is a third of that, far
    // above what a busy machine delays a wake-up by (CI runs these tests at nice 19 beside
    // the e2e tests).
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        worst = worst.max(t.elapsed());
    }
    assert!(
        worst < Duration::from_secs(1),
        "a 10 ms timer took {worst:?}"
    );
    assert_eq!(
        state.status().samples,
        0,
        "the first slow tick is still running"
    );
    let t = Instant::now();
    monitor.stop(Duration::from_millis(50));
    // Waiting for the hung tick would take seconds.
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "stop does not wait for a hung call: {:?}",
        t.elapsed()
    );
}

#[test]
fn spawned_sampler_publishes_every_interval_and_stops() {
    let state = Arc::new(GpuState::new(Duration::from_millis(100), Mode::Starting));
    let monitor = super::sampler::spawn(
        FakeHandle::with_gpus(2).backend(),
        state.clone(),
        Duration::from_secs(5),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(450));
    let n = state.status().samples;
    assert!((4..=6).contains(&n), "{n} samples in 450 ms at 100 ms");
    monitor.stop(Duration::from_secs(1));
    let after = state.status().samples;
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(state.status().samples, after, "no sample after stop");
    assert_eq!(state.mode(), Mode::On);
}
