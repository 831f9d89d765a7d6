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

impl K8sIdentity {
    /// `namespace/pod`, the target name discovery gives a pod.
    pub fn qualified_name(&self) -> String {
        format!("{}/{}", self.namespace, self.pod_name)
    }
}
