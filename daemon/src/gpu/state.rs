//! What the sampler publishes and everyone else reads: the latest [`Snapshot`] (metrics
//! callbacks), a short history of per-sample summaries (the `lmperf.gpu.*` attributes of a
//! canary span), XID and lost/recovered events, and the `/api/v1/status` view.
//!
//! Readers only take a mutex for a pointer copy or a scan of at most [`HISTORY`] small
//! entries; the sampler publishes once per interval.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use opentelemetry::{Array, KeyValue, StringValue, Value};
use serde::Serialize;

use super::backend::{DeviceInfo, throttle};
use super::pods::{Attribution, GpuHolder, GpuSelection};
use crate::config::k8s::K8sIdentity;
use crate::telemetry::names as n;

/// Per-sample summaries kept for span attributes: 10 minutes at 1 s, 1 minute at 100 ms.
pub const HISTORY: usize = 600;
/// XID events kept for span attributes.
pub const XID_HISTORY: usize = 256;
/// Events kept for `/api/v1/status`.
pub const EVENTS: usize = 32;

/// One process on a GPU, attributed through `/proc`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessSample {
    pub pid: u32,
    /// Bytes of GPU memory held; `None` where NVML cannot tell.
    pub used_bytes: Option<u64>,
    /// Fraction of SM time over the last interval, 0..1; `None` without a fresh sample.
    pub sm_utilization: Option<f64>,
    /// `/proc/PID/comm`.
    pub executable: Option<String>,
    /// `/proc/PID/cmdline`, arguments joined by spaces, at most 256 bytes.
    pub command: Option<String>,
    /// Container id from `/proc/PID/cgroup`.
    pub container_id: Option<String>,
    /// It is a target's model server: it or an ancestor listens on the port of a configured
    /// target ([`GpuState::set_server_ports`], [`super::procs::serves_port`]).
    pub model_server: bool,
}

/// One device's values at one sample; a field is `None` when NVML did not give it (never 0
/// in its place). Units are the exported ones.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceSample {
    /// Fraction of time kernels ran, 0..1.
    pub utilization: Option<f64>,
    /// Fraction of time device memory was read or written, 0..1.
    pub memory_copy_utilization: Option<f64>,
    /// Bytes.
    pub memory_used: Option<u64>,
    /// Bytes.
    pub memory_total: Option<u64>,
    /// W.
    pub power_w: Option<f64>,
    /// W.
    pub power_limit_w: Option<f64>,
    /// J since the driver loaded.
    pub energy_j: Option<f64>,
    /// °C.
    pub temperature_c: Option<f64>,
    /// Hz.
    pub sm_clock_hz: Option<f64>,
    /// Hz.
    pub memory_clock_hz: Option<f64>,
    /// NVML throttle reason bits ([`throttle`]).
    pub throttle: Option<u64>,
    /// Bytes since monitoring began (estimate, see `hw.gpu.io`).
    pub pcie_tx_bytes: Option<u64>,
    pub pcie_rx_bytes: Option<u64>,
    pub pcie_replays: Option<u64>,
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    pub processes: Vec<ProcessSample>,
}

impl DeviceSample {
    /// Fraction of memory used, 0..1.
    pub fn memory_utilization(&self) -> Option<f64> {
        match (self.memory_used, self.memory_total) {
            (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
            _ => None,
        }
    }
}

/// A device the sampler tracks.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceEntry {
    pub info: DeviceInfo,
    /// `GPU_IS_LOST` (or the driver went away): no values until rediscovery finds it again.
    pub lost: bool,
    /// Fields NVML answered `NOT_SUPPORTED` for.
    pub unsupported: Vec<&'static str>,
    /// The values; `None` while lost.
    pub sample: Option<DeviceSample>,
}

/// Everything one sampling tick saw.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    pub at: Option<SystemTime>,
    pub driver_version: String,
    pub devices: Vec<DeviceEntry>,
    /// Critical XID events since start, by (`hw.id`, code).
    pub xid_counts: BTreeMap<(String, u64), u64>,
    /// GPUs lost since start.
    pub lost_total: u64,
}

/// Whether GPU monitoring runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `[gpu] enabled = false`.
    Disabled,
    /// Not yet initialized.
    Starting,
    /// No NVML library: off for the agent's life.
    Off,
    /// NVML loaded but not usable, or every GPU lost: retrying discovery.
    Discovering,
    /// Sampling.
    On,
}

/// A lost, recovered or XID event, for `/api/v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuEvent {
    pub at_unix_s: f64,
    /// lost | recovered | xid | driver_unavailable
    pub kind: &'static str,
    pub hw_id: Option<String>,
    pub detail: String,
}

/// One sample, per device: what a span reads of the GPUs its target may read.
#[derive(Debug, Clone)]
struct Summary {
    at: SystemTime,
    devices: Vec<DeviceSummary>,
}

#[derive(Debug, Clone)]
struct DeviceSummary {
    /// `hw.id`, shared with the previous summary's (one allocation per device, not per tick).
    id: Arc<str>,
    util: Option<f64>,
    mem: Option<f64>,
    throttle: u64,
}

/// The pod-resources reader's state (`gpu.pod_resources` of `/api/v1/status`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PodResourcesStatus {
    /// The kubelet socket read; `None` when off (`[gpu] pod_resources_socket = ""`, GPU
    /// monitoring disabled).
    pub socket: Option<String>,
    /// off | starting | ok | unavailable
    pub state: &'static str,
    /// Why it is off or unavailable.
    pub reason: Option<String>,
    /// `List` calls made.
    pub lists: u64,
    pub last_list_unix_s: Option<f64>,
    /// Pods in the last answer.
    pub pods: usize,
    /// NVIDIA device ids of the last answer that NVML does not know.
    pub unknown_device_ids: Vec<String>,
    /// Each fault and change once, when it began (most recent last).
    pub events: Vec<GpuEvent>,
}

impl PodResourcesStatus {
    fn off(reason: &str) -> Self {
        Self {
            socket: None,
            state: "off",
            reason: Some(reason.to_owned()),
            lists: 0,
            last_list_unix_s: None,
            pods: 0,
            unknown_device_ids: Vec::new(),
            events: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct Inner {
    mode: Mode,
    reason: Option<String>,
    latest: Arc<Snapshot>,
    history: VecDeque<Summary>,
    xids: VecDeque<(SystemTime, String, u64)>,
    events: VecDeque<GpuEvent>,
    samples: u64,
    last_tick_us: u64,
    /// TCP ports of the configured targets: a GPU process listening on one is a model server.
    server_ports: Vec<u16>,
    /// The GPUs' holders from the last good pod-resources `List`; `None` without one.
    pods: Option<Arc<Attribution>>,
    pod_status: PodResourcesStatus,
}

/// The shared GPU state.
#[derive(Debug)]
pub struct GpuState {
    interval: Duration,
    inner: Mutex<Inner>,
}

/// `/api/v1/status` → `gpu`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuStatus {
    pub mode: Mode,
    /// Why GPU metrics are off or not yet on.
    pub reason: Option<String>,
    pub driver_version: Option<String>,
    pub interval_ms: u64,
    /// Sampling ticks done.
    pub samples: u64,
    /// Duration of the last tick, µs (the sampling cost).
    pub last_tick_us: u64,
    pub devices: Vec<GpuDeviceStatus>,
    /// Most recent last.
    pub events: Vec<GpuEvent>,
    /// Which pod holds which GPU (the kubelet's pod-resources API).
    pub pod_resources: PodResourcesStatus,
}

/// One device in `/api/v1/status`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuDeviceStatus {
    pub index: u32,
    pub hw_id: String,
    pub name: String,
    pub pci_bus_id: String,
    pub mig_profile: Option<String>,
    pub lost: bool,
    pub unsupported_fields: Vec<&'static str>,
    pub utilization: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub processes: Vec<ProcessSample>,
    /// The containers holding it (pod-resources); `[]`: held by no pod; `None`: not known
    /// (no pod-resources answer).
    pub k8s_holders: Option<Vec<GpuHolder>>,
}

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl GpuState {
    /// A state for sampling every `interval`, in `mode` (`Starting` or `Disabled`).
    pub fn new(interval: Duration, mode: Mode) -> Self {
        let reason = (mode == Mode::Disabled)
            .then(|| "disabled in the configuration ([gpu] enabled = false)".to_owned());
        Self {
            interval,
            inner: Mutex::new(Inner {
                mode,
                reason,
                latest: Arc::default(),
                history: VecDeque::with_capacity(HISTORY),
                xids: VecDeque::new(),
                events: VecDeque::new(),
                samples: 0,
                last_tick_us: 0,
                server_ports: Vec::new(),
                pods: None,
                pod_status: PodResourcesStatus::off(if mode == Mode::Disabled {
                    "GPU monitoring is disabled ([gpu] enabled = false)"
                } else {
                    "not started"
                }),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state holds plain values: a panic elsewhere cannot leave it half-written in a
        // way readers could misread, so a poisoned lock is taken over.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the TCP ports of the targets' model servers (their URLs' ports): a GPU process
    /// that listens on one, or whose ancestor does, is the model server's
    /// ([`ProcessSample::model_server`]); every other one is foreign.
    pub fn set_server_ports(&self, mut ports: Vec<u16>) {
        ports.sort_unstable();
        ports.dedup();
        self.lock().server_ports = ports;
    }

    /// The ports of [`Self::set_server_ports`], sorted.
    pub fn server_ports(&self) -> Vec<u16> {
        self.lock().server_ports.clone()
    }

    /// The sampling interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.lock().mode
    }

    /// Sets the mode and its reason.
    pub fn set_mode(&self, mode: Mode, reason: Option<String>) {
        let mut g = self.lock();
        g.mode = mode;
        g.reason = reason;
    }

    /// Records an event for `/api/v1/status`.
    pub fn event(&self, at: SystemTime, kind: &'static str, hw_id: Option<&str>, detail: String) {
        let mut g = self.lock();
        if g.events.len() == EVENTS {
            g.events.pop_front();
        }
        g.events.push_back(GpuEvent {
            at_unix_s: unix_s(at),
            kind,
            hw_id: hw_id.map(str::to_owned),
            detail,
        });
    }

    /// Records XID codes seen at `at`, each with the `hw.id` of its GPU.
    pub fn xids(&self, at: SystemTime, codes: &[(String, u64)]) {
        let mut g = self.lock();
        for (id, c) in codes {
            if g.xids.len() == XID_HISTORY {
                g.xids.pop_front();
            }
            g.xids.push_back((at, id.clone(), *c));
        }
    }

    /// Sets the pod-resources reader's status (the reader owns it; see
    /// [`super::pod_resources`]).
    pub fn set_pod_status(&self, f: impl FnOnce(&mut PodResourcesStatus)) {
        f(&mut self.lock().pod_status);
    }

    /// Records a pod-resources event (a fault or change, once when it began).
    pub fn pod_event(
        &self,
        at: SystemTime,
        kind: &'static str,
        hw_id: Option<&str>,
        detail: String,
    ) {
        let mut g = self.lock();
        let events = &mut g.pod_status.events;
        if events.len() == EVENTS {
            events.remove(0);
        }
        events.push(GpuEvent {
            at_unix_s: unix_s(at),
            kind,
            hw_id: hw_id.map(str::to_owned),
            detail,
        });
    }

    /// Sets the GPUs' holders (`None`: no pod-resources answer at hand; the pod labels go and
    /// targets read every GPU).
    pub fn set_pods(&self, pods: Option<Attribution>) {
        self.lock().pods = pods.map(Arc::new);
    }

    /// The GPUs' holders of the last good pod-resources answer.
    pub fn pods(&self) -> Option<Arc<Attribution>> {
        self.lock().pods.clone()
    }

    /// The GPUs the target whose pod is `identity` reads ([`super::pods::select`]).
    pub fn selection(&self, identity: Option<&K8sIdentity>) -> GpuSelection {
        if identity.is_none() {
            return GpuSelection::All;
        }
        let (pods, latest) = {
            let g = self.lock();
            (g.pods.clone(), g.latest.clone())
        };
        let devices: Vec<DeviceInfo> = latest.devices.iter().map(|d| d.info.clone()).collect();
        super::pods::select(identity, pods.as_deref(), &devices)
    }

    /// Publishes a tick's snapshot; `cost` is how long the tick took.
    pub fn publish(&self, snap: Snapshot, cost: Duration) {
        let at = snap.at.unwrap_or_else(SystemTime::now);
        let mut g = self.lock();
        let prev = g
            .history
            .back()
            .map(|p| p.devices.clone())
            .unwrap_or_default();
        let s = Summary {
            at,
            devices: snap
                .devices
                .iter()
                .filter_map(|d| {
                    let sample = d.sample.as_ref()?;
                    let id = prev
                        .iter()
                        .find(|p| *p.id == *d.info.uuid)
                        .map_or_else(|| Arc::from(d.info.uuid.as_str()), |p| p.id.clone());
                    Some(DeviceSummary {
                        id,
                        util: sample.utilization,
                        mem: sample.memory_utilization(),
                        throttle: sample.throttle.unwrap_or(0),
                    })
                })
                .collect(),
        };
        if g.history.len() == HISTORY {
            g.history.pop_front();
        }
        g.history.push_back(s);
        g.latest = Arc::new(snap);
        g.samples += 1;
        g.last_tick_us = cost.as_micros() as u64;
    }

    /// The latest snapshot (empty before the first tick and while monitoring is off).
    pub fn latest(&self) -> Arc<Snapshot> {
        self.lock().latest.clone()
    }

    /// The `lmperf.gpu.*` attributes of a request sent at `start` that ended at `end`: from
    /// the samples taken in between, else from the latest one before `end` (a request shorter
    /// than the interval). Empty when no sample exists (GPU monitoring off).
    pub fn request_attributes(&self, start: SystemTime, end: SystemTime) -> Vec<KeyValue> {
        self.request_attributes_of(start, end, &GpuSelection::All)
    }

    /// [`Self::request_attributes`] of the GPUs `selection` names only (a target's pod's
    /// GPUs); with [`GpuSelection::Only`] the span also names them (`lmperf.gpu.hw_ids`).
    pub fn request_attributes_of(
        &self,
        start: SystemTime,
        end: SystemTime,
        selection: &GpuSelection,
    ) -> Vec<KeyValue> {
        let g = self.lock();
        let mut used: Vec<&Summary> = g
            .history
            .iter()
            .filter(|s| s.at >= start && s.at <= end)
            .collect();
        if used.is_empty()
            && let Some(s) = g.history.iter().rev().find(|s| s.at <= end)
        {
            used.push(s);
        }
        if used.is_empty() {
            return Vec::new();
        }
        let xids: Vec<i64> = g
            .xids
            .iter()
            .filter(|(t, id, _)| *t >= start && *t <= end && selection.contains(id))
            .map(|(_, _, c)| *c as i64)
            .collect();
        let mut procs: Vec<ProcessSample> = g
            .latest
            .devices
            .iter()
            .filter(|d| selection.contains(&d.info.uuid))
            .filter_map(|d| d.sample.as_ref())
            .flat_map(|s| s.processes.iter().cloned())
            .collect();
        let (mut max_util, mut max_mem, mut bits) = (None, None, 0);
        for d in used
            .iter()
            .flat_map(|s| &s.devices)
            .filter(|d| selection.contains(&d.id))
        {
            max_util = max_opt(max_util, d.util);
            max_mem = max_opt(max_mem, d.mem);
            bits |= d.throttle;
        }
        let samples = used.len();
        drop(g);
        procs.sort_by_key(|p| p.pid);
        procs.dedup_by_key(|p| p.pid);
        procs.truncate(n::MAX_SPAN_GPU_PROCESSES);
        let reasons = throttle::names(bits);
        let mut kv = Vec::with_capacity(8);
        if let GpuSelection::Only(ids) = selection {
            kv.push(KeyValue::new(
                n::LMPERF_GPU_HW_IDS,
                Value::Array(Array::String(
                    ids.iter().map(|i| StringValue::from(i.clone())).collect(),
                )),
            ));
        }
        if let Some(u) = max_util {
            kv.push(KeyValue::new(n::LMPERF_GPU_UTILIZATION_MAX, u));
        }
        if let Some(m) = max_mem {
            kv.push(KeyValue::new(n::LMPERF_GPU_MEMORY_UTILIZATION_MAX, m));
        }
        kv.push(KeyValue::new(n::LMPERF_GPU_THROTTLED, !reasons.is_empty()));
        if !reasons.is_empty() {
            let arr: Vec<StringValue> = reasons.into_iter().map(StringValue::from).collect();
            kv.push(KeyValue::new(
                n::LMPERF_GPU_THROTTLE_REASONS,
                Value::Array(Array::String(arr)),
            ));
        }
        kv.push(KeyValue::new(n::LMPERF_GPU_XID_SEEN, !xids.is_empty()));
        if !xids.is_empty() {
            kv.push(KeyValue::new(
                n::LMPERF_GPU_XID_CODES,
                Value::Array(Array::I64(xids)),
            ));
        }
        kv.push(KeyValue::new(n::LMPERF_GPU_SAMPLES, samples as i64));
        if !procs.is_empty() {
            let strings = |f: fn(&ProcessSample) -> Option<&String>| {
                Value::Array(Array::String(
                    procs
                        .iter()
                        .map(|p| StringValue::from(f(p).cloned().unwrap_or_default()))
                        .collect(),
                ))
            };
            kv.push(KeyValue::new(
                n::LMPERF_GPU_PROCESS_PIDS,
                Value::Array(Array::I64(procs.iter().map(|p| i64::from(p.pid)).collect())),
            ));
            kv.push(KeyValue::new(
                n::LMPERF_GPU_PROCESS_EXECUTABLES,
                strings(|p| p.executable.as_ref()),
            ));
            kv.push(KeyValue::new(
                n::LMPERF_GPU_PROCESS_CONTAINER_IDS,
                strings(|p| p.container_id.as_ref()),
            ));
        }
        kv
    }

    /// The `gpu` section of `/api/v1/status`.
    pub fn status(&self) -> GpuStatus {
        let g = self.lock();
        let snap = g.latest.clone();
        GpuStatus {
            mode: g.mode,
            reason: g.reason.clone(),
            driver_version: (!snap.driver_version.is_empty()).then(|| snap.driver_version.clone()),
            interval_ms: self.interval.as_millis() as u64,
            samples: g.samples,
            last_tick_us: g.last_tick_us,
            events: g.events.iter().cloned().collect(),
            pod_resources: g.pod_status.clone(),
            devices: snap
                .devices
                .iter()
                .map(|d| GpuDeviceStatus {
                    index: d.info.index,
                    hw_id: d.info.uuid.clone(),
                    name: d.info.name.clone(),
                    pci_bus_id: d.info.pci_bus_id.clone(),
                    mig_profile: d.info.mig.as_ref().map(|m| m.profile.clone()),
                    lost: d.lost,
                    unsupported_fields: d.unsupported.clone(),
                    utilization: d.sample.as_ref().and_then(|s| s.utilization),
                    memory_used_bytes: d.sample.as_ref().and_then(|s| s.memory_used),
                    memory_total_bytes: d.sample.as_ref().and_then(|s| s.memory_total),
                    processes: d
                        .sample
                        .as_ref()
                        .map(|s| s.processes.clone())
                        .unwrap_or_default(),
                    k8s_holders: g.pods.as_ref().map(|p| p.holders(&d.info.uuid).to_vec()),
                })
                .collect(),
        }
    }
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}
