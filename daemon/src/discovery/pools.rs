//! Gateway API Inference Extension `InferencePool` objects (`inference.networking.k8s.io/v1`):
//! the model-server pods an inference gateway (llm-d, GKE, kgateway) routes to. Pure: what
//! discovery reads of a pool, and whether a pod is a member.
//!
//! Read as upstream defines them (kubernetes-sigs/gateway-api-inference-extension
//! `api/v1/inferencepool_types.go`): `spec.selector.matchLabels` (1 to 64 labels, the pods of the
//! pool's own namespace only) and `spec.targetPorts[].number` (1 to 8 ports, each its own
//! endpoint `podIP:number`). Other fields (the endpoint picker, status) are not read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::core::{ApiResource, DynamicObject};
use serde::Deserialize;

/// The API group of `InferencePool`.
pub const GROUP: &str = "inference.networking.k8s.io";
/// The served version read.
pub const VERSION: &str = "v1";
/// The resource's plural (RBAC and URL name).
pub const PLURAL: &str = "inferencepools";
/// Target ports read per pool at most (the CRD allows 8).
pub const MAX_PORTS: usize = 8;

/// The `ApiResource` of `inferencepools.inference.networking.k8s.io/v1`, for `kube`'s dynamic API.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: VERSION.to_owned(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: "InferencePool".to_owned(),
        plural: PLURAL.to_owned(),
    }
}

/// What discovery reads of one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InferencePool {
    pub namespace: String,
    pub name: String,
    /// `spec.selector.matchLabels`: a member pod carries every one.
    pub match_labels: BTreeMap<String, String>,
    /// `spec.targetPorts[].number`, in order, each once.
    pub ports: Vec<u16>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    selector: Option<Selector>,
    #[serde(default)]
    target_ports: Vec<Port>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Selector {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Port {
    number: i64,
}

impl InferencePool {
    /// Reads a pool from the API server's object.
    ///
    /// # Errors
    /// A sentence naming the field: no `spec`, an empty `spec.selector.matchLabels` (it would
    /// select every pod of the namespace), no `spec.targetPorts`, a port outside 1 to 65535.
    pub fn from_object(obj: &DynamicObject) -> Result<Self, String> {
        let namespace = obj.metadata.namespace.clone().unwrap_or_default();
        let name = obj.metadata.name.clone().unwrap_or_default();
        let spec = obj.data.get("spec").ok_or_else(|| "no spec".to_owned())?;
        let spec = Spec::deserialize(spec).map_err(|e| format!("spec: {e}"))?;
        let match_labels = spec.selector.map(|s| s.match_labels).unwrap_or_default();
        if match_labels.is_empty() {
            return Err("spec.selector.matchLabels is empty (it would select every pod)".into());
        }
        if spec.target_ports.is_empty() {
            return Err("spec.targetPorts is empty".into());
        }
        let mut ports = Vec::new();
        for p in spec.target_ports.iter().take(MAX_PORTS) {
            let port = u16::try_from(p.number)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    format!(
                        "spec.targetPorts[].number = {}: a port, 1 to 65535",
                        p.number
                    )
                })?;
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        Ok(Self {
            namespace,
            name,
            match_labels,
            ports,
        })
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether `pod` is a member: in the pool's namespace, carrying every `matchLabels` entry.
    pub fn selects(&self, pod: &Pod) -> bool {
        if pod.metadata.namespace.as_deref().unwrap_or_default() != self.namespace {
            return false;
        }
        let Some(labels) = pod.metadata.labels.as_ref() else {
            return false;
        };
        !self.match_labels.is_empty()
            && self
                .match_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(json: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json).unwrap()
    }

    fn pool(spec: serde_json::Value) -> DynamicObject {
        obj(serde_json::json!({
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "llama-pool", "namespace": "llm"},
            "spec": spec
        }))
    }

    fn pod(ns: &str, labels: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": ns, "labels": labels}
        }))
        .unwrap()
    }

    #[test]
    fn a_pool_reads_its_selector_and_ports() {
        let p = InferencePool::from_object(&pool(serde_json::json!({
            "selector": {"matchLabels": {"app": "vllm-llama3"}},
            "targetPorts": [{"number": 8000}, {"number": 8001}, {"number": 8000}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}
        })))
        .unwrap();
        assert_eq!(p.key(), "llm/llama-pool");
        assert_eq!(p.ports, [8000, 8001]);
        assert!(p.selects(&pod(
            "llm",
            serde_json::json!({"app": "vllm-llama3", "x": "y"})
        )));
        assert!(
            !p.selects(&pod("other", serde_json::json!({"app": "vllm-llama3"}))),
            "another namespace"
        );
        assert!(!p.selects(&pod("llm", serde_json::json!({"app": "vllm"}))));
        assert!(!p.selects(&pod("llm", serde_json::json!({}))));
    }

    #[test]
    fn bad_pools_name_the_field() {
        for (spec, says) in [
            (
                serde_json::json!({"targetPorts": [{"number": 8000}]}),
                "matchLabels is empty",
            ),
            (
                serde_json::json!({"selector": {"matchLabels": {"a": "b"}}}),
                "targetPorts is empty",
            ),
            (
                serde_json::json!({"selector": {"matchLabels": {"a": "b"}},
                    "targetPorts": [{"number": 70000}]}),
                "number = 70000",
            ),
            (
                serde_json::json!({"selector": {"matchLabels": {"a": "b"}},
                    "targetPorts": [{"number": "http"}]}),
                "spec:",
            ),
        ] {
            let e = InferencePool::from_object(&pool(spec.clone())).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
        let mut none = pool(serde_json::json!({}));
        none.data = serde_json::json!({});
        assert_eq!(InferencePool::from_object(&none).unwrap_err(), "no spec");
    }
}
