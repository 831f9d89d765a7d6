//! The Kubernetes identity of a target: which pod (and container) serves it.
//!
//! Filled by Kubernetes discovery (`[discovery.kubernetes]`) for discovered targets and from a
//! static target's `[target.k8s]` table; `None` on a plain host. Read by the GPU attribution
//! (pod-resources: which GPUs this target's pod holds), by telemetry (the `k8s.*` attributes of
//! the OpenTelemetry semantic conventions on spans and per-target series) and by the status and
//! diagnosis outputs.

/// The owner of a pod, as the OTel k8s conventions name it (`k8s.deployment.name` through the
/// pod's ReplicaSet, `k8s.statefulset.name`, `k8s.daemonset.name`, LeaderWorkerSet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum K8sOwner {
    /// A Deployment (the pod's ReplicaSet's owner).
    Deployment(String),
    /// A StatefulSet.
    StatefulSet(String),
    /// A DaemonSet.
    DaemonSet(String),
    /// A LeaderWorkerSet (`leaderworkerset.x-k8s.io`).
    LeaderWorkerSet(String),
    /// A bare ReplicaSet (no Deployment above it).
    ReplicaSet(String),
    /// A Job.
    Job(String),
}

/// Which pod and container serve a target (OTel `k8s.*` resource attributes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct K8sIdentity {
    /// `k8s.namespace.name`
    pub namespace: String,
    /// `k8s.pod.name`
    pub pod_name: String,
    /// `k8s.pod.uid`; empty when not known (a static target names only namespace and pod).
    pub pod_uid: String,
    /// `k8s.container.name` of the model server's container; `None` when not known.
    pub container_name: Option<String>,
    /// The pod's controller, where one is known.
    pub owner: Option<K8sOwner>,
    /// `k8s.inferencepool.name`: the Gateway API Inference Extension `InferencePool` (same
    /// namespace) that selects the pod, where discovery watches pools; the first by name when
    /// several do.
    pub inference_pool: Option<String>,
}

/// Whether `s` is a pod uid as the API server writes `metadata.uid`: a UUID in its canonical
/// text form, 8-4-4-4-12 hex digits (either case).
pub fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

impl K8sIdentity {
    /// `namespace/pod`, the target name discovery gives a pod.
    pub fn qualified_name(&self) -> String {
        format!("{}/{}", self.namespace, self.pod_name)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_uid_is_a_canonical_uuid() {
        assert!(super::is_uid("0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1a"));
        assert!(super::is_uid("0B7C9A52-3E1F-4C2D-9A8B-6F5E4D3C2B1A"));
        for bad in [
            "",
            "0b7c",
            "0b7c9a523e1f4c2d9a8b6f5e4d3c2b1a",
            "0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1",
            "0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1az",
            "0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1g",
            "{0b7c9a52-3e1f-4c2d-9a8b-6f5e4d3c2b1a}",
        ] {
            assert!(!super::is_uid(bad), "{bad}");
        }
    }
}
