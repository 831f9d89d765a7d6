//! The diagnosis JSON as served (`/api/v1/diagnosis`, the `Diagnose` RPC): the engine's
//! `Diagnosis` document with each target's `k8s` identity added (by OTel attribute name), from
//! the target's status entry. The engine knows nothing of Kubernetes; this adds it at the edge.

use crate::diagnosis::Diagnosis;
use crate::status::AgentStatus;

/// `d` as JSON, each target with its `k8s` object when it has one (discovered pods, `[target.k8s]`).
pub fn with_k8s(status: &AgentStatus, d: &Diagnosis) -> serde_json::Value {
    let mut v = serde_json::to_value(d).unwrap_or(serde_json::Value::Null);
    let targets = status.targets.snapshot();
    if let Some(list) = v.get_mut("targets").and_then(|t| t.as_array_mut()) {
        for t in list {
            let Some(name) = t.get("target").and_then(|n| n.as_str()).map(str::to_owned) else {
                continue;
            };
            if let Some(s) = targets.iter().find(|s| s.name == name && !s.k8s.is_empty())
                && let Some(obj) = t.as_object_mut()
            {
                obj.insert(
                    "k8s".to_owned(),
                    serde_json::to_value(&s.k8s).unwrap_or_default(),
                );
            }
        }
    }
    v
}
