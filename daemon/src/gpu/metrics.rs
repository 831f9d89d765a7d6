//! GPU metrics as observable instruments whose callbacks read the sampler's latest
//! [`Snapshot`]: collection (OTLP export, `/metrics` scrape) never calls NVML. A field the
//! device did not give is not observed, so its series is absent, never 0; a lost GPU keeps
//! only `hw.status{hw.state=failed} 1`.
//!
//! Names and units: OpenTelemetry hardware semantic conventions (`hw.*`) where they define
//! the quantity, `lmperf.gpu.*` otherwise; see [`crate::telemetry::names`].

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use super::pods::Attribution;
use super::state::{DeviceEntry, GpuState, Snapshot};
use crate::telemetry::names as n;

/// The attributes that identify a device on every GPU series.
pub fn device_attributes(d: &DeviceEntry, driver_version: &str) -> Vec<KeyValue> {
    let i = &d.info;
    let name = match &i.mig {
        Some(m) => format!("GPU {} MIG {}", i.index, m.mig_index),
        None => format!("GPU {}", i.index),
    };
    let mut kv = vec![
        KeyValue::new(n::HW_ID, i.uuid.clone()),
        KeyValue::new(n::HW_NAME, name),
        KeyValue::new(n::HW_MODEL, i.name.clone()),
        KeyValue::new(n::HW_VENDOR, n::HW_VENDOR_NVIDIA),
        KeyValue::new(n::HW_TYPE, n::HW_TYPE_GPU),
        KeyValue::new(n::LMPERF_GPU_INDEX, i64::from(i.index)),
        KeyValue::new(n::LMPERF_GPU_PCI_BUS_ID, i.pci_bus_id.clone()),
    ];
    if !driver_version.is_empty() {
        kv.push(KeyValue::new(
            n::HW_DRIVER_VERSION,
            driver_version.to_owned(),
        ));
    }
    if let Some(m) = &i.mig {
        kv.push(KeyValue::new(n::HW_PARENT, m.parent_uuid.clone()));
        kv.push(KeyValue::new(n::LMPERF_GPU_MIG_PROFILE, m.profile.clone()));
    }
    kv
}

/// The attribute sets of a device's series: one per container holding it (its
/// `k8s.namespace.name`, `k8s.pod.name`, `k8s.container.name`), or the device's alone when no
/// pod holds it or no pod-resources answer is at hand (see [`super::pods`] on shared devices).
pub fn series_attributes(
    d: &DeviceEntry,
    driver_version: &str,
    pods: Option<&Attribution>,
) -> Vec<Vec<KeyValue>> {
    let base = device_attributes(d, driver_version);
    holder_attributes(pods, &d.info.uuid)
        .iter()
        .map(|k8s| with(&base, k8s))
        .collect()
}

/// The `k8s.*` attributes of each container holding the device `hw_id`; one empty set when
/// none does (or no pod-resources answer is at hand).
pub fn holder_attributes(pods: Option<&Attribution>, hw_id: &str) -> Vec<Vec<KeyValue>> {
    let holders = pods.map_or(&[][..], |p| p.holders(hw_id));
    if holders.is_empty() {
        return vec![Vec::new()];
    }
    holders
        .iter()
        .map(|h| {
            vec![
                KeyValue::new(n::K8S_NAMESPACE_NAME, h.namespace.clone()),
                KeyValue::new(n::K8S_POD_NAME, h.pod.clone()),
                KeyValue::new(n::K8S_CONTAINER_NAME, h.container.clone()),
            ]
        })
        .collect()
}

fn with(base: &[KeyValue], extra: &[KeyValue]) -> Vec<KeyValue> {
    let mut v = base.to_vec();
    v.extend_from_slice(extra);
    v
}

/// Calls `f` for each device with a sample, with its attributes.
fn each(
    state: &GpuState,
    mut f: impl FnMut(&Snapshot, &DeviceEntry, &super::state::DeviceSample, &[KeyValue]),
) {
    let snap = state.latest();
    let pods = state.pods();
    for d in &snap.devices {
        if let Some(s) = &d.sample {
            for attrs in series_attributes(d, &snap.driver_version, pods.as_deref()) {
                f(&snap, d, s, &attrs);
            }
        }
    }
}

/// Registers every GPU instrument on `meter`, reading `state`.
pub fn register(meter: &Meter, state: Arc<GpuState>) {
    macro_rules! gauge {
        ($name:expr, $unit:expr, $desc:expr, |$s:ident, $a:ident, $o:ident| $body:expr) => {{
            let st = state.clone();
            let _g = meter
                .f64_observable_gauge($name)
                .with_unit($unit)
                .with_description($desc)
                .with_callback(move |$o| each(&st, |_, _, $s, $a| $body))
                .build();
        }};
    }
    macro_rules! counter {
        ($name:expr, $unit:expr, $desc:expr, |$s:ident, $a:ident, $o:ident| $body:expr) => {{
            let st = state.clone();
            let _c = meter
                .u64_observable_counter($name)
                .with_unit($unit)
                .with_description($desc)
                .with_callback(move |$o| each(&st, |_, _, $s, $a| $body))
                .build();
        }};
    }
    macro_rules! updown {
        ($name:expr, $unit:expr, $desc:expr, |$s:ident, $a:ident, $o:ident| $body:expr) => {{
            let st = state.clone();
            let _u = meter
                .i64_observable_up_down_counter($name)
                .with_unit($unit)
                .with_description($desc)
                .with_callback(move |$o| each(&st, |_, _, $s, $a| $body))
                .build();
        }};
    }
    let task = [KeyValue::new(n::HW_GPU_TASK, n::HW_GPU_TASK_GENERAL)];
    gauge!(
        n::METRIC_HW_GPU_UTILIZATION,
        "1",
        "Fraction of time spent in a specific task.",
        |s, a, o| if let Some(v) = s.utilization {
            o.observe(v, &with(a, &task))
        }
    );
    gauge!(
        n::METRIC_GPU_MEMORY_COPY_UTILIZATION,
        "1",
        "Fraction of time device memory was read or written.",
        |s, a, o| if let Some(v) = s.memory_copy_utilization {
            o.observe(v, a)
        }
    );
    updown!(
        n::METRIC_HW_GPU_MEMORY_USAGE,
        "By",
        "GPU memory used.",
        |s, a, o| if let Some(v) = s.memory_used {
            o.observe(v as i64, a)
        }
    );
    updown!(
        n::METRIC_HW_GPU_MEMORY_LIMIT,
        "By",
        "Size of the GPU memory.",
        |s, a, o| if let Some(v) = s.memory_total {
            o.observe(v as i64, a)
        }
    );
    gauge!(
        n::METRIC_HW_GPU_MEMORY_UTILIZATION,
        "1",
        "Fraction of GPU memory used.",
        |s, a, o| if let Some(v) = s.memory_utilization() {
            o.observe(v, a)
        }
    );
    gauge!(
        n::METRIC_HW_POWER,
        "W",
        "Instantaneous power consumed by the component.",
        |s, a, o| if let Some(v) = s.power_w {
            o.observe(v, a)
        }
    );
    gauge!(
        n::METRIC_GPU_POWER_LIMIT,
        "W",
        "Enforced power limit.",
        |s, a, o| if let Some(v) = s.power_limit_w {
            o.observe(v, a)
        }
    );
    {
        let st = state.clone();
        let _c = meter
            .f64_observable_counter(n::METRIC_HW_ENERGY)
            .with_unit("J")
            .with_description("Energy consumed by the component.")
            .with_callback(move |o| {
                each(&st, |_, _, s, a| {
                    if let Some(v) = s.energy_j {
                        o.observe(v, a)
                    }
                })
            })
            .build();
    }
    {
        let st = state.clone();
        let _g = meter
            .f64_observable_gauge(n::METRIC_HW_TEMPERATURE)
            .with_unit("Cel")
            .with_description("Temperature in degrees Celsius.")
            .with_callback(move |o| {
                each(&st, |_, d, s, _| {
                    if let Some(v) = s.temperature_c {
                        o.observe(
                            v,
                            &[
                                KeyValue::new(n::HW_ID, format!("{}-temperature", d.info.uuid)),
                                KeyValue::new(n::HW_TYPE, n::HW_TYPE_TEMPERATURE),
                                KeyValue::new(n::HW_PARENT, d.info.uuid.clone()),
                                KeyValue::new(
                                    n::HW_NAME,
                                    format!("GPU {} temperature", d.info.index),
                                ),
                            ],
                        )
                    }
                })
            })
            .build();
    }
    gauge!(n::METRIC_GPU_CLOCK, "Hz", "Clock frequency.", |s, a, o| {
        if let Some(v) = s.sm_clock_hz {
            o.observe(v, &with(a, &[KeyValue::new(n::LMPERF_GPU_CLOCK, "sm")]));
        }
        if let Some(v) = s.memory_clock_hz {
            o.observe(v, &with(a, &[KeyValue::new(n::LMPERF_GPU_CLOCK, "memory")]));
        }
    });
    gauge!(
        n::METRIC_GPU_THROTTLE,
        "1",
        "1 while the clock throttle reason is active.",
        |s, a, o| if let Some(bits) = s.throttle {
            for (bit, name) in super::backend::throttle::SLOWDOWNS {
                o.observe(
                    if bits & bit != 0 { 1.0 } else { 0.0 },
                    &with(a, &[KeyValue::new(n::LMPERF_GPU_THROTTLE_REASON, *name)]),
                );
            }
        }
    );
    counter!(
        n::METRIC_HW_GPU_IO,
        "By",
        "Received and transmitted bytes by the GPU (PCIe, estimated from NVML's throughput).",
        |s, a, o| {
            if let Some(v) = s.pcie_rx_bytes {
                o.observe(
                    v,
                    &with(a, &[KeyValue::new(n::NETWORK_IO_DIRECTION, "receive")]),
                );
            }
            if let Some(v) = s.pcie_tx_bytes {
                o.observe(
                    v,
                    &with(a, &[KeyValue::new(n::NETWORK_IO_DIRECTION, "transmit")]),
                );
            }
        }
    );
    counter!(
        n::METRIC_GPU_PCIE_REPLAYS,
        "{replay}",
        "PCIe replays.",
        |s, a, o| if let Some(v) = s.pcie_replays {
            o.observe(v, a)
        }
    );
    counter!(
        n::METRIC_HW_ERRORS,
        "{error}",
        "Number of errors encountered by the component (ECC, since the driver loaded).",
        |s, a, o| {
            if let Some(v) = s.ecc_corrected {
                o.observe(
                    v,
                    &with(a, &[KeyValue::new(n::ERROR_TYPE, n::HW_ERROR_CORRECTED)]),
                );
            }
            if let Some(v) = s.ecc_uncorrected {
                o.observe(
                    v,
                    &with(a, &[KeyValue::new(n::ERROR_TYPE, n::HW_ERROR_UNCORRECTED)]),
                );
            }
        }
    );
    updown!(
        n::METRIC_GPU_PROCESS_MEMORY_USAGE,
        "By",
        "GPU memory held by a process.",
        |s, a, o| for p in &s.processes {
            if let Some(b) = p.used_bytes {
                o.observe(b as i64, &with(a, &process_attributes(p)));
            }
        }
    );
    gauge!(
        n::METRIC_GPU_PROCESS_UTILIZATION,
        "1",
        "Fraction of SM time used by a process.",
        |s, a, o| for p in &s.processes {
            if let Some(u) = p.sm_utilization {
                o.observe(u, &with(a, &process_attributes(p)));
            }
        }
    );
    {
        let st = state.clone();
        let _s = meter
            .i64_observable_up_down_counter(n::METRIC_HW_STATUS)
            .with_unit("1")
            .with_description(
                "Operational status: 1 (true) or 0 (false) for each of the possible states.",
            )
            .with_callback(move |o| {
                let snap = st.latest();
                let pods = st.pods();
                for d in &snap.devices {
                    for a in series_attributes(d, &snap.driver_version, pods.as_deref()) {
                        o.observe(
                            i64::from(!d.lost),
                            &with(&a, &[KeyValue::new(n::HW_STATE, n::HW_STATE_OK)]),
                        );
                        o.observe(
                            i64::from(d.lost),
                            &with(&a, &[KeyValue::new(n::HW_STATE, n::HW_STATE_FAILED)]),
                        );
                    }
                }
            })
            .build();
    }
    {
        let st = state.clone();
        let _x = meter
            .u64_observable_counter(n::METRIC_GPU_XID)
            .with_unit("{event}")
            .with_description("Critical XID error events.")
            .with_callback(move |o| {
                let snap = st.latest();
                let pods = st.pods();
                for ((uuid, code), count) in &snap.xid_counts {
                    let base = [
                        KeyValue::new(n::HW_ID, uuid.clone()),
                        KeyValue::new(n::HW_TYPE, n::HW_TYPE_GPU),
                        KeyValue::new(n::LMPERF_GPU_XID, *code as i64),
                    ];
                    for k8s in holder_attributes(pods.as_deref(), uuid) {
                        o.observe(*count, &with(&base, &k8s));
                    }
                }
            })
            .build();
    }
    {
        let st = state;
        let _l = meter
            .u64_observable_counter(n::METRIC_GPU_LOST)
            .with_unit("{event}")
            .with_description("GPUs lost (GPU_IS_LOST or driver gone) since the agent started.")
            .with_callback(move |o| {
                let snap = st.latest();
                if !snap.devices.is_empty() || snap.lost_total > 0 {
                    o.observe(
                        snap.lost_total,
                        &[KeyValue::new(n::HW_TYPE, n::HW_TYPE_GPU)],
                    );
                }
            })
            .build();
    }
}

fn process_attributes(p: &super::state::ProcessSample) -> Vec<KeyValue> {
    let mut kv = vec![KeyValue::new(n::PROCESS_PID, i64::from(p.pid))];
    if let Some(e) = &p.executable {
        kv.push(KeyValue::new(n::PROCESS_EXECUTABLE_NAME, e.clone()));
    }
    if let Some(c) = &p.container_id {
        kv.push(KeyValue::new(n::CONTAINER_ID, c.clone()));
    }
    kv
}
