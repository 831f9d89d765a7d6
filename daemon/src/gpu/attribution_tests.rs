//! Per-target GPU attribution through the agent's own code (no NVML, no socket): a node of
//! 4 GPUs, pod A on GPUs 0 and 1, pod B on GPUs 2 and 3, published to [`GpuState`] as the
//! sampler and the pod-resources reader do; canaries of both pods' targets (and of a target
//! that names no pod) fed to [`LiveDiagnosis`] with the times passed in, as in the agent.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use opentelemetry::Value;

use super::backend::DeviceInfo;
use super::pods::{Attribution, ContainerDevices, attribute};
use super::state::{DeviceEntry, DeviceSample, GpuState, Mode, Snapshot};
use crate::canary::client::Measured;
use crate::config::k8s::K8sIdentity;
use crate::diagnosis::report::{State, TargetDiagnosis};
use crate::diagnosis::{Cause, EngineConfig, Signal};
use crate::diagnosis_live::LiveDiagnosis;
use crate::measure::{Outcome, RequestRecord};
use crate::telemetry::names as n;

const TOTAL: u64 = 150_000_000_000;

fn info(i: u32) -> DeviceInfo {
    DeviceInfo {
        index: i,
        uuid: format!("GPU-{i}"),
        name: "NVIDIA H200".into(),
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x17 + i),
        mig_enabled: Some(false),
        mig: None,
    }
}

/// GPU `i` at a sample: `throttled` (SM clock 1100 MHz, thermal reasons) or 1980 MHz; `mem_pct`
/// % of its 150 GB used.
fn device(i: u32, throttled: bool, mem_pct: u64) -> DeviceEntry {
    DeviceEntry {
        info: info(i),
        lost: false,
        unsupported: Vec::new(),
        sample: Some(DeviceSample {
            utilization: Some(0.5),
            memory_used: Some(TOTAL / 100 * mem_pct),
            memory_total: Some(TOTAL),
            sm_clock_hz: Some(if throttled { 1100e6 } else { 1980e6 }),
            throttle: Some(if throttled { 0x60 } else { 0 }),
            ..DeviceSample::default()
        }),
    }
}

fn pods() -> Attribution {
    let held = |pod: &str, ids: &[&str]| ContainerDevices {
        namespace: "ml".into(),
        pod: pod.into(),
        container: "server".into(),
        resource: "nvidia.com/gpu".into(),
        device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
    };
    let devices: Vec<DeviceInfo> = (0..4).map(info).collect();
    attribute(
        &[
            held("a", &["GPU-0", "GPU-1"]),
            held("b", &["GPU-2", "GPU-3"]),
        ],
        &devices,
    )
}

fn identity(pod: &str) -> K8sIdentity {
    K8sIdentity {
        namespace: "ml".into(),
        pod_name: pod.into(),
        container_name: Some("server".into()),
        ..K8sIdentity::default()
    }
}

fn measured(ttft_ms: u64, at: SystemTime) -> Measured {
    let mut record = RequestRecord::failed(
        Outcome::Ok,
        crate::measure::RequestError::new("x", None),
        None,
        Duration::from_millis(ttft_ms * 2),
    );
    record.outcome = Outcome::Ok;
    record.error = None;
    record.ttft = Some(Duration::from_millis(ttft_ms));
    record.tpot = Some(Duration::from_millis(ttft_ms / 10));
    Measured {
        record,
        wall_start: at,
        retries: 0,
        conn: None,
    }
}

/// 200 s calm, then `fault` on the GPUs (per second, per GPU: throttled, memory used) while
/// every target's canaries slow down (TTFT 100 → 300 ms, TPOT 10 → 30 ms). Returns each
/// target's first root_confirmed diagnosis.
fn episode(
    pods_known: bool,
    fault: impl Fn(u32) -> (bool, u64),
) -> (BTreeMap<String, TargetDiagnosis>, GpuState) {
    let targets = ["a", "b", "plain"];
    let live = LiveDiagnosis::new(
        EngineConfig::default(),
        targets.iter().map(|t| (*t).to_owned()).collect(),
    );
    live.set_k8s("a", Some(identity("a")));
    live.set_k8s("b", Some(identity("b")));
    let gpu = GpuState::new(Duration::from_secs(1), Mode::Starting);
    gpu.set_mode(Mode::On, None);
    if pods_known {
        gpu.set_pods(Some(pods()));
    }
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut confirmed = BTreeMap::new();
    for s in 0..320u64 {
        let at = t0 + Duration::from_secs(s);
        let bad = s >= 200;
        let devices = (0..4)
            .map(|i| {
                let (throttled, mem) = if bad { fault(i) } else { (false, 60) };
                device(i, throttled, mem)
            })
            .collect();
        gpu.publish(
            Snapshot {
                at: Some(at),
                driver_version: "550.54.15".into(),
                devices,
                ..Snapshot::default()
            },
            Duration::ZERO,
        );
        for t in targets {
            for half in [0u64, 500] {
                let ttft = if bad { 300 } else { 100 + (s % 7) * 3 };
                live.observe_request(t, &measured(ttft, at + Duration::from_millis(half)), None);
            }
        }
        for d in live.tick(at + Duration::from_secs(1), Some(&gpu)) {
            confirmed.entry(d.target.clone()).or_insert(d);
        }
    }
    (confirmed, gpu)
}

fn has_cause(d: Option<&TargetDiagnosis>, cause: Cause) -> bool {
    d.is_some_and(|d| d.causes.iter().any(|c| c.cause == cause))
}

fn gpu_ids(d: &TargetDiagnosis, cause: Cause, signal: Signal) -> Vec<String> {
    d.causes
        .iter()
        .find(|c| c.cause == cause)
        .and_then(|c| c.evidence.iter().find(|e| e.signal == signal))
        .map(|e| e.hw_ids.clone())
        .unwrap_or_default()
}

#[test]
fn gpu3_throttling_is_pod_bs_cause_only() {
    let (d, _) = episode(true, |i| (i == 3, 60));
    let b = d.get("b").expect("pod B's target confirmed");
    assert_eq!(b.state, State::RootConfirmed);
    assert_eq!(b.causes[0].cause, Cause::GpuThrottling, "{:#?}", b.causes);
    assert_eq!(
        gpu_ids(b, Cause::GpuThrottling, Signal::GpuThrottle),
        ["GPU-3"]
    );
    assert_eq!(
        gpu_ids(b, Cause::GpuThrottling, Signal::GpuSmClock),
        ["GPU-3"]
    );
    // Pod A's GPUs never throttled: not a cause for its target (its slowdown is unexplained).
    assert!(
        !has_cause(d.get("a"), Cause::GpuThrottling),
        "{:#?}",
        d.get("a")
    );
    // A target that names no pod reads every GPU, as before.
    assert!(has_cause(d.get("plain"), Cause::GpuThrottling));
}

#[test]
fn gpu1_memory_pressure_is_pod_as_cause_only() {
    let (d, _) = episode(true, |i| (false, if i == 1 { 99 } else { 60 }));
    let a = d.get("a").expect("pod A's target confirmed");
    assert_eq!(
        a.causes[0].cause,
        Cause::GpuMemoryPressure,
        "{:#?}",
        a.causes
    );
    assert_eq!(
        gpu_ids(a, Cause::GpuMemoryPressure, Signal::GpuMemoryUtilization),
        ["GPU-1"]
    );
    assert!(
        !has_cause(d.get("b"), Cause::GpuMemoryPressure),
        "{:#?}",
        d.get("b")
    );
}

#[test]
fn without_pod_resources_every_target_reads_every_gpu() {
    let (d, _) = episode(false, |i| (i == 3, 60));
    for t in ["a", "b", "plain"] {
        assert!(has_cause(d.get(t), Cause::GpuThrottling), "{t}: {d:#?}");
    }
}

fn attr<'a>(kv: &'a [opentelemetry::KeyValue], key: &str) -> Option<&'a Value> {
    kv.iter().find(|k| k.key.as_str() == key).map(|k| &k.value)
}

#[test]
fn a_span_carries_only_its_pods_gpus() {
    let (_, gpu) = episode(true, |i| (i == 3, if i == 1 { 99 } else { 60 }));
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let (from, to) = (t0 + Duration::from_secs(300), t0 + Duration::from_secs(302));
    let a = gpu.request_attributes_of(from, to, &gpu.selection(Some(&identity("a"))));
    assert_eq!(attr(&a, n::LMPERF_GPU_THROTTLED), Some(&Value::Bool(false)));
    assert_eq!(
        attr(&a, n::LMPERF_GPU_MEMORY_UTILIZATION_MAX),
        Some(&Value::F64(0.99))
    );
    assert_eq!(
        attr(&a, n::LMPERF_GPU_HW_IDS),
        Some(&Value::Array(opentelemetry::Array::String(vec![
            "GPU-0".into(),
            "GPU-1".into()
        ])))
    );
    let b = gpu.request_attributes_of(from, to, &gpu.selection(Some(&identity("b"))));
    assert_eq!(attr(&b, n::LMPERF_GPU_THROTTLED), Some(&Value::Bool(true)));
    assert_eq!(
        attr(&b, n::LMPERF_GPU_MEMORY_UTILIZATION_MAX),
        Some(&Value::F64(0.6))
    );
    // No pod named: the node's GPUs, no id list.
    let all = gpu.request_attributes(from, to);
    assert_eq!(
        attr(&all, n::LMPERF_GPU_THROTTLED),
        Some(&Value::Bool(true))
    );
    assert_eq!(
        attr(&all, n::LMPERF_GPU_MEMORY_UTILIZATION_MAX),
        Some(&Value::F64(0.99))
    );
    assert!(attr(&all, n::LMPERF_GPU_HW_IDS).is_none());
    // Pod-resources unreadable: every GPU again.
    gpu.set_pods(None);
    let a = gpu.request_attributes_of(from, to, &gpu.selection(Some(&identity("a"))));
    assert_eq!(attr(&a, n::LMPERF_GPU_THROTTLED), Some(&Value::Bool(true)));
}

#[test]
fn series_carry_their_holders() {
    let a = pods();
    let attrs = |i: u32| {
        super::metrics::series_attributes(&device(i, false, 60), "550", Some(&a))
            .into_iter()
            .map(|kv| {
                kv.into_iter()
                    .filter(|k| k.key.as_str().starts_with("k8s."))
                    .map(|k| (k.key.to_string(), k.value.to_string()))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let pod = |p: &str| {
        vec![vec![
            ("k8s.namespace.name".to_owned(), "ml".to_owned()),
            ("k8s.pod.name".to_owned(), p.to_owned()),
            ("k8s.container.name".to_owned(), "server".to_owned()),
        ]]
    };
    assert_eq!(attrs(0), pod("a"));
    assert_eq!(attrs(1), pod("a"));
    assert_eq!(attrs(2), pod("b"));
    assert_eq!(attrs(3), pod("b"));
    // Held by no pod, or no answer: the device's own attributes only.
    let alone = super::metrics::series_attributes(&device(7, false, 60), "550", Some(&a));
    assert_eq!(alone.len(), 1);
    assert!(!alone[0].iter().any(|k| k.key.as_str().starts_with("k8s.")));
    assert_eq!(
        super::metrics::series_attributes(&device(0, false, 60), "550", None).len(),
        1
    );
}
