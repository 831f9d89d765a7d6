//! Which pod holds which GPU: the kubelet's pod-resources `List` answer
//! ([`super::pod_resources`]) mapped onto the NVML devices, and the GPUs one target may read.
//!
//! Pure: no IO, no clock. The reader passes the answer and the devices NVML knows; the span
//! attributes, the diagnosis and the metrics read the result.
//!
//! **Device ids.** The NVIDIA device plugin hands out `nvidia.com/gpu` (and, with the mixed
//! MIG strategy, `nvidia.com/mig-<profile>`) devices by UUID: `GPU-…` for a whole GPU,
//! `MIG-…` for a MIG device. A time-sliced replica is `<UUID>::<n>` (the suffix is dropped);
//! the older `--device-id-strategy=index` gives the NVML index (`"0"`). Any other resource
//! (CPUs, hugepages, other vendors) is ignored. An id NVML does not know is kept aside
//! ([`Attribution::unknown_ids`]), never guessed.
//!
//! **Shared devices (labelling, as dcgm-exporter does).** A device series carries the
//! `k8s.*` labels of the container that holds it. A MIG device is its own series (`hw.id`
//! `MIG-…`, `hw.parent` the GPU), so two containers on two MIG devices of one GPU each get
//! their own series with their own pod; the parent GPU's series carries a pod only where a
//! container was given the whole GPU. A device given to several containers at once
//! (time-slicing) is exported once per holder (dcgm-exporter's per-pod copies), so a sum over
//! pods counts a shared GPU once per pod that holds it.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::backend::DeviceInfo;
use crate::config::k8s::K8sIdentity;

/// One container's devices of one resource, as `List` gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDevices {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, …
    pub resource: String,
    pub device_ids: Vec<String>,
}

/// A container that holds a GPU: the `k8s.namespace.name`, `k8s.pod.name` and
/// `k8s.container.name` of its series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct GpuHolder {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// The GPUs' holders at one `List`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attribution {
    /// NVML `hw.id` (`GPU-…`, `MIG-…`) → the containers holding it, sorted. A device NVML
    /// knows that no container holds is absent.
    pub by_device: BTreeMap<String, Vec<GpuHolder>>,
    /// Device ids of NVIDIA resources that match no NVML device (as `List` gave them), sorted.
    pub unknown_ids: Vec<String>,
    /// `namespace/pod` of every pod in the answer (with or without devices), sorted.
    pub pods: BTreeSet<String>,
}

impl Attribution {
    /// The holders of the device `hw_id`; empty when no pod holds it.
    pub fn holders(&self, hw_id: &str) -> &[GpuHolder] {
        self.by_device.get(hw_id).map_or(&[], Vec::as_slice)
    }
}

/// Whether `resource` names NVIDIA GPUs or MIG devices.
pub fn is_gpu_resource(resource: &str) -> bool {
    resource
        .strip_prefix("nvidia.com/")
        .is_some_and(|r| r == "gpu" || r.starts_with("gpu.") || r.starts_with("mig-"))
}

/// The NVML device a plugin device id names, by UUID or (an all-digit id) by the index of a
/// whole GPU; `None` when NVML knows none.
fn resolve<'a>(id: &str, devices: &'a [DeviceInfo]) -> Option<&'a DeviceInfo> {
    let id = id.split_once("::").map_or(id, |(uuid, _)| uuid);
    if let Some(d) = devices.iter().find(|d| d.uuid.eq_ignore_ascii_case(id)) {
        return Some(d);
    }
    let index: u32 = id.parse().ok()?;
    devices.iter().find(|d| d.mig.is_none() && d.index == index)
}

/// Maps a `List` answer onto the devices NVML knows.
pub fn attribute(list: &[ContainerDevices], devices: &[DeviceInfo]) -> Attribution {
    let mut a = Attribution::default();
    let mut unknown = BTreeSet::new();
    for c in list {
        a.pods.insert(format!("{}/{}", c.namespace, c.pod));
        if !is_gpu_resource(&c.resource) {
            continue;
        }
        for id in &c.device_ids {
            match resolve(id, devices) {
                Some(d) => a
                    .by_device
                    .entry(d.uuid.clone())
                    .or_default()
                    .push(GpuHolder {
                        namespace: c.namespace.clone(),
                        pod: c.pod.clone(),
                        container: c.container.clone(),
                    }),
                None => {
                    unknown.insert(id.clone());
                }
            }
        }
    }
    for h in a.by_device.values_mut() {
        h.sort();
        h.dedup();
    }
    a.unknown_ids = unknown.into_iter().collect();
    a
}

/// The GPUs a target's spans and diagnosis read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelection {
    /// Every GPU of the node: the target names no pod, or no pod-resources answer is at hand
    /// (not Kubernetes, socket not mounted or failing): process-based attribution stays.
    All,
    /// Only these `hw.id`s (possibly none: the pod holds no GPU).
    Only(BTreeSet<String>),
}

impl GpuSelection {
    /// Whether the device `hw_id` is selected.
    pub fn contains(&self, hw_id: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(s) => s.contains(hw_id),
        }
    }
}

/// The GPUs of the target whose pod is `identity`: every device a container of that pod
/// holds (only its `container_name` when set), and the physical GPU of each MIG device it
/// holds (clocks, throttling and XIDs are the whole GPU's). [`GpuSelection::All`] without an
/// identity or without an attribution.
pub fn select(
    identity: Option<&K8sIdentity>,
    attribution: Option<&Attribution>,
    devices: &[DeviceInfo],
) -> GpuSelection {
    let (Some(id), Some(a)) = (identity, attribution) else {
        return GpuSelection::All;
    };
    let mut ids = BTreeSet::new();
    for (hw_id, holders) in &a.by_device {
        let mine = holders.iter().any(|h| {
            h.namespace == id.namespace
                && h.pod == id.pod_name
                && id.container_name.as_ref().is_none_or(|c| *c == h.container)
        });
        if !mine {
            continue;
        }
        ids.insert(hw_id.clone());
        if let Some(parent) = devices
            .iter()
            .find(|d| d.uuid == *hw_id)
            .and_then(|d| d.mig.as_ref())
        {
            ids.insert(parent.parent_uuid.clone());
        }
    }
    GpuSelection::Only(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::backend::MigInstance;

    fn gpu(index: u32) -> DeviceInfo {
        DeviceInfo {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H200".into(),
            pci_bus_id: String::new(),
            mig_enabled: Some(false),
            mig: None,
        }
    }

    fn mig(parent: u32, m: u32) -> DeviceInfo {
        DeviceInfo {
            index: parent,
            uuid: format!("MIG-{parent}-{m}"),
            name: "NVIDIA H200 MIG 3g.71gb".into(),
            pci_bus_id: String::new(),
            mig_enabled: None,
            mig: Some(MigInstance {
                profile: "3g.71gb".into(),
                parent_uuid: format!("GPU-{parent}"),
                mig_index: m,
            }),
        }
    }

    fn held(
        ns: &str,
        pod: &str,
        container: &str,
        resource: &str,
        ids: &[&str],
    ) -> ContainerDevices {
        ContainerDevices {
            namespace: ns.into(),
            pod: pod.into(),
            container: container.into(),
            resource: resource.into(),
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn holder(ns: &str, pod: &str, container: &str) -> GpuHolder {
        GpuHolder {
            namespace: ns.into(),
            pod: pod.into(),
            container: container.into(),
        }
    }

    fn identity(ns: &str, pod: &str, container: Option<&str>) -> K8sIdentity {
        K8sIdentity {
            namespace: ns.into(),
            pod_name: pod.into(),
            container_name: container.map(str::to_owned),
            ..K8sIdentity::default()
        }
    }

    fn node() -> Vec<DeviceInfo> {
        let mut d: Vec<DeviceInfo> = (0..4).map(gpu).collect();
        d[3].mig_enabled = Some(true);
        d.push(mig(3, 0));
        d.push(mig(3, 1));
        d
    }

    fn answer() -> Vec<ContainerDevices> {
        vec![
            held("ml", "a", "vllm", "nvidia.com/gpu", &["GPU-0", "GPU-1"]),
            held("ml", "a", "vllm", "cpu", &["3"]),
            held("ml", "b", "sglang", "nvidia.com/gpu", &["GPU-2::0", "1"]),
            held("ml", "c", "x", "nvidia.com/mig-3g.71gb", &["MIG-3-0"]),
            held("ml", "c", "y", "nvidia.com/mig-3g.71gb", &["MIG-3-1"]),
            held("ml", "d", "z", "nvidia.com/gpu", &["GPU-ffff", "MIG-9-9"]),
            held("kube-system", "dns", "coredns", "", &[]),
        ]
    }

    #[test]
    fn maps_uuids_replicas_indexes_and_mig_devices() {
        let a = attribute(&answer(), &node());
        assert_eq!(a.holders("GPU-0"), [holder("ml", "a", "vllm")]);
        // GPU 1 by UUID for a, by index for b: a time-sliced GPU has two holders.
        assert_eq!(
            a.holders("GPU-1"),
            [holder("ml", "a", "vllm"), holder("ml", "b", "sglang")]
        );
        assert_eq!(a.holders("GPU-2"), [holder("ml", "b", "sglang")]);
        assert_eq!(a.holders("MIG-3-0"), [holder("ml", "c", "x")]);
        assert_eq!(a.holders("MIG-3-1"), [holder("ml", "c", "y")]);
        // The MIG-split GPU itself was given to no container.
        assert!(a.holders("GPU-3").is_empty());
        assert_eq!(a.unknown_ids, ["GPU-ffff", "MIG-9-9"]);
        assert_eq!(a.pods.len(), 5);
        assert!(a.pods.contains("kube-system/dns"));
    }

    #[test]
    fn ignores_other_resources() {
        assert!(is_gpu_resource("nvidia.com/gpu"));
        assert!(is_gpu_resource("nvidia.com/gpu.shared"));
        assert!(is_gpu_resource("nvidia.com/mig-1g.10gb"));
        assert!(!is_gpu_resource("cpu"));
        assert!(!is_gpu_resource("amd.com/gpu"));
        assert!(!is_gpu_resource("nvidia.com/rdma"));
        let a = attribute(&[held("ml", "a", "c", "cpu", &["0"])], &node());
        assert!(a.by_device.is_empty());
        assert!(a.unknown_ids.is_empty());
    }

    #[test]
    fn a_target_selects_only_its_pods_gpus() {
        let devices = node();
        let a = attribute(&answer(), &devices);
        let only = |ids: &[&str]| GpuSelection::Only(ids.iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(
            select(Some(&identity("ml", "a", None)), Some(&a), &devices),
            only(&["GPU-0", "GPU-1"])
        );
        assert_eq!(
            select(
                Some(&identity("ml", "b", Some("sglang"))),
                Some(&a),
                &devices
            ),
            only(&["GPU-1", "GPU-2"])
        );
        // Another container of pod b holds nothing.
        assert_eq!(
            select(
                Some(&identity("ml", "b", Some("sidecar"))),
                Some(&a),
                &devices
            ),
            only(&[])
        );
        // A MIG device brings its physical GPU (clocks, throttling) along.
        assert_eq!(
            select(Some(&identity("ml", "c", Some("y"))), Some(&a), &devices),
            only(&["GPU-3", "MIG-3-1"])
        );
        // Same pod name in another namespace: nothing.
        assert_eq!(
            select(Some(&identity("other", "a", None)), Some(&a), &devices),
            only(&[])
        );
    }

    #[test]
    fn without_identity_or_answer_every_gpu_stays() {
        let devices = node();
        let a = attribute(&answer(), &devices);
        assert_eq!(select(None, Some(&a), &devices), GpuSelection::All);
        assert_eq!(
            select(Some(&identity("ml", "a", None)), None, &devices),
            GpuSelection::All
        );
        assert!(GpuSelection::All.contains("GPU-7"));
        assert!(!GpuSelection::Only(BTreeSet::new()).contains("GPU-0"));
    }
}
