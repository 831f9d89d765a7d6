//! The `k8s.*` attributes of a target's Kubernetes identity: on every canary span (all of
//! them) and on the per-target series (bounded: namespace, pod, container, owner and the
//! InferencePool; the pod uid only on spans; no pod labels copied).

use opentelemetry::KeyValue;

use super::names as n;
use crate::config::k8s::{K8sIdentity, K8sOwner};

/// The owner's attribute name and value.
pub fn owner_attribute(o: &K8sOwner) -> KeyValue {
    let (k, v) = match o {
        K8sOwner::Deployment(v) => (n::K8S_DEPLOYMENT_NAME, v),
        K8sOwner::StatefulSet(v) => (n::K8S_STATEFULSET_NAME, v),
        K8sOwner::DaemonSet(v) => (n::K8S_DAEMONSET_NAME, v),
        K8sOwner::LeaderWorkerSet(v) => (n::K8S_LEADERWORKERSET_NAME, v),
        K8sOwner::ReplicaSet(v) => (n::K8S_REPLICASET_NAME, v),
        K8sOwner::Job(v) => (n::K8S_JOB_NAME, v),
    };
    KeyValue::new(k, v.clone())
}

/// The labels of a target's series: namespace, pod, container (when known), owner, the
/// InferencePool (when one selects the pod).
pub fn series_labels(id: &K8sIdentity) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new(n::K8S_NAMESPACE_NAME, id.namespace.clone()),
        KeyValue::new(n::K8S_POD_NAME, id.pod_name.clone()),
    ];
    if let Some(c) = &id.container_name {
        a.push(KeyValue::new(n::K8S_CONTAINER_NAME, c.clone()));
    }
    if let Some(o) = &id.owner {
        a.push(owner_attribute(o));
    }
    if let Some(p) = &id.inference_pool {
        a.push(KeyValue::new(n::K8S_INFERENCEPOOL_NAME, p.clone()));
    }
    a
}

/// The attributes of a target's spans: the series labels and the pod uid.
pub fn span_attributes(id: &K8sIdentity) -> Vec<KeyValue> {
    let mut a = series_labels(id);
    if !id.pod_uid.is_empty() {
        a.push(KeyValue::new(n::K8S_POD_UID, id.pod_uid.clone()));
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_bounded_and_spans_add_the_uid() {
        let id = K8sIdentity {
            namespace: "llm".into(),
            pod_name: "vllm-0".into(),
            pod_uid: "u1".into(),
            container_name: Some("server".into()),
            owner: Some(K8sOwner::Deployment("vllm".into())),
            inference_pool: Some("llama-pool".into()),
        };
        let keys = |v: Vec<KeyValue>| v.into_iter().map(|k| k.key.to_string()).collect::<Vec<_>>();
        assert_eq!(
            keys(series_labels(&id)),
            [
                "k8s.namespace.name",
                "k8s.pod.name",
                "k8s.container.name",
                "k8s.deployment.name",
                "k8s.inferencepool.name"
            ]
        );
        assert_eq!(
            keys(span_attributes(&id)).last().map(String::as_str),
            Some("k8s.pod.uid")
        );
    }
}
