//! Which pods are targets, and as what: a pure function of the pod (as the API server or the
//! kubelet returns it), the configured label selector, and the pod's resolved owner.
//!
//! A pod is a target when it opts in (`lmperf.dev/canary: "true"`, like `prometheus.io/scrape`)
//! or matches the selector (an explicit `"false"` opts out of the selector), is Ready, not
//! terminating, and has an IP. It is canaried at `podIP:port`, named `namespace/pod`. The
//! annotations `lmperf.dev/port`, `/api` (chat | completions), `/model`, `/metrics-path` and
//! `/rate`, `/kind` (server | router) override the `[canary]` defaults; a bad value is [`PodVerdict::Bad`] with a sentence
//! naming the annotation and the value. Pods that neither names but an `InferencePool` selects
//! are targets at the pool's target ports ([`pool_targets`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::pools::InferencePool;
use crate::config::k8s::{K8sIdentity, K8sOwner};
use crate::config::raw::RawCanary;
use crate::config::selector::LabelSelector;

pub const ANN_CANARY: &str = "lmperf.dev/canary";
pub const ANN_PORT: &str = "lmperf.dev/port";
pub const ANN_API: &str = "lmperf.dev/api";
pub const ANN_MODEL: &str = "lmperf.dev/model";
pub const ANN_METRICS_PATH: &str = "lmperf.dev/metrics-path";
pub const ANN_RATE: &str = "lmperf.dev/rate";
/// `server` | `router`: a router pod (llm-d's gateway, Dynamo's frontend, vllm-router).
pub const ANN_KIND: &str = "lmperf.dev/kind";
/// The label a LeaderWorkerSet puts on its pods (its StatefulSets own them).
pub const LWS_NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
/// The label a Deployment's ReplicaSet puts on its pods (the ReplicaSet is `<deployment>-<hash>`).
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// A pod that is a target: the canary settings it sets and who it is.
#[derive(Debug, Clone)]
pub struct PodTarget {
    /// `url`, `name` and what the annotations set; the rest comes from `[canary]`.
    pub raw: RawCanary,
    pub identity: K8sIdentity,
}

/// Why a pod is not a target now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Neither the annotation nor the selector names it.
    NotSelected,
    /// Selected, but not Ready (or no IP yet).
    NotReady,
    /// Selected, being deleted.
    Terminating,
}

/// What a pod is to discovery.
#[derive(Debug, Clone)]
pub enum PodVerdict {
    Target(Box<PodTarget>),
    Skip(Skip),
    /// Selected, but an annotation is bad: the sentence names it and its value.
    Bad(String),
}

/// The owner a pod's own `ownerReferences` name (its controller), before a ReplicaSet is
/// resolved to its Deployment: `ReplicaSet(name)` then. A LeaderWorkerSet's pods (owned by
/// its StatefulSets) name the LeaderWorkerSet.
pub fn direct_owner(pod: &Pod) -> Option<K8sOwner> {
    if let Some(lws) = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LWS_NAME_LABEL))
    {
        return Some(K8sOwner::LeaderWorkerSet(lws.clone()));
    }
    let refs = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let r = refs
        .iter()
        .find(|r| r.controller == Some(true))
        .or_else(|| refs.first())?;
    let name = r.name.clone();
    Some(match r.kind.as_str() {
        "ReplicaSet" => K8sOwner::ReplicaSet(name),
        "StatefulSet" => K8sOwner::StatefulSet(name),
        "DaemonSet" => K8sOwner::DaemonSet(name),
        "Job" => K8sOwner::Job(name),
        "LeaderWorkerSet" => K8sOwner::LeaderWorkerSet(name),
        _ => return None,
    })
}

/// The Deployment of a ReplicaSet named `rs` by the `pod-template-hash` rule
/// (`<deployment>-<hash>`), used when the ReplicaSet cannot be read (RBAC); `None` when the
/// name does not end in the pod's hash.
pub fn deployment_by_hash(pod: &Pod, rs: &str) -> Option<String> {
    let hash = pod.metadata.labels.as_ref()?.get(POD_TEMPLATE_HASH_LABEL)?;
    rs.strip_suffix(hash.as_str())?
        .strip_suffix('-')
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The model server's container: the one declaring `port`, else the first.
fn container_for(pod: &Pod, port: Option<u16>) -> Option<&Container> {
    let cs = &pod.spec.as_ref()?.containers;
    port.and_then(|p| {
        cs.iter().find(|c| {
            c.ports
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|cp| cp.container_port == i32::from(p))
        })
    })
    .or_else(|| cs.first())
}

/// The port of a selected pod without `lmperf.dev/port`: a container port named `http`, else
/// the first container port.
fn declared_port(pod: &Pod) -> Option<u16> {
    let ports: Vec<_> = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.as_deref().unwrap_or_default())
        .collect();
    ports
        .iter()
        .find(|p| p.name.as_deref() == Some("http"))
        .or_else(|| ports.first())
        .and_then(|p| u16::try_from(p.container_port).ok())
        .filter(|&p| p > 0)
}

/// What `pod` is to discovery, given the configured `selector` and its resolved `owner`: the
/// opt-in annotation first, then the selector (InferencePools come after: [`pool_targets`]).
pub fn pod_target(
    pod: &Pod,
    selector: Option<&LabelSelector>,
    owner: Option<K8sOwner>,
) -> PodVerdict {
    let empty = BTreeMap::new();
    let ann = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let selected = match ann.get(ANN_CANARY).map(|v| v.trim()) {
        Some("true") => true,
        Some("false") => false,
        Some(other) => {
            return PodVerdict::Bad(format!(
                "{ANN_CANARY} = {other:?}: expected \"true\" or \"false\""
            ));
        }
        None => selector.is_some_and(|s| s.matches(labels)),
    };
    if !selected {
        return PodVerdict::Skip(Skip::NotSelected);
    }
    target_at(pod, ann, None, owner)
}

/// Targets of one pod at most (the distinct target ports of the pools selecting it).
pub const MAX_POOL_TARGETS_PER_POD: usize = 16;

/// The targets of a pod that InferencePools select (`pools`: the pools whose selector matches
/// it, in order) when neither the annotation nor the selector names it: one per distinct
/// target port, at `podIP:port`, named `namespace/pod` when there is one port and
/// `namespace/pod:port` when there are several, each carrying the first pool naming that port
/// as `k8s.inferencepool.name`. `lmperf.dev/canary: "false"` opts the pod out (empty); the
/// other `lmperf.dev/*` annotations apply, except `port` (the pool names the ports).
pub fn pool_targets(
    pod: &Pod,
    pools: &[&InferencePool],
    owner: Option<K8sOwner>,
) -> Vec<PodVerdict> {
    let empty = BTreeMap::new();
    let ann = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    if ann.get(ANN_CANARY).map(|v| v.trim()) == Some("false") {
        return Vec::new();
    }
    let mut ports: Vec<(u16, &str)> = Vec::new();
    for pool in pools {
        for &port in &pool.ports {
            if ports.len() < MAX_POOL_TARGETS_PER_POD && !ports.iter().any(|(p, _)| *p == port) {
                ports.push((port, pool.name.as_str()));
            }
        }
    }
    let several = ports.len() > 1;
    ports
        .into_iter()
        .map(
            |(port, pool)| match target_at(pod, ann, Some(port), owner.clone()) {
                PodVerdict::Target(mut t) => {
                    t.identity.inference_pool = Some(pool.to_owned());
                    if several {
                        t.raw.name = Some(format!("{}:{port}", t.identity.qualified_name()));
                    }
                    PodVerdict::Target(t)
                }
                other => other,
            },
        )
        .collect()
}

/// A selected pod as a target at `port` (`None`: `lmperf.dev/port`, else a declared port).
fn target_at(
    pod: &Pod,
    ann: &BTreeMap<String, String>,
    port: Option<u16>,
    owner: Option<K8sOwner>,
) -> PodVerdict {
    if pod.metadata.deletion_timestamp.is_some() {
        return PodVerdict::Skip(Skip::Terminating);
    }
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
    let (true, Some(ip)) = (ready(pod), ip.filter(|ip| !ip.is_empty())) else {
        return PodVerdict::Skip(Skip::NotReady);
    };
    let port = match (port, ann.get(ANN_PORT).map(|v| v.trim())) {
        (Some(p), _) => p,
        (None, Some(v)) => match v.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return PodVerdict::Bad(format!("{ANN_PORT} = {v:?}: a port, 1 to 65535"));
            }
        },
        (None, None) => match declared_port(pod) {
            Some(p) => p,
            None => {
                return PodVerdict::Bad(format!(
                    "no port: set {ANN_PORT} or declare a container port"
                ));
            }
        },
    };
    let api = match ann.get(ANN_API).map(|v| v.trim()) {
        None => None,
        Some(v @ ("chat" | "completions")) => Some(v.to_owned()),
        Some(v) => {
            return PodVerdict::Bad(format!("{ANN_API} = {v:?}: expected chat or completions"));
        }
    };
    let model = match ann.get(ANN_MODEL).map(|v| v.trim()) {
        None => None,
        Some("") => return PodVerdict::Bad(format!("{ANN_MODEL} = \"\": empty")),
        Some(v) => Some(v.to_owned()),
    };
    let rate = match ann.get(ANN_RATE).map(|v| v.trim()) {
        None => None,
        Some(v) => match v.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Some(r),
            _ => {
                return PodVerdict::Bad(format!(
                    "{ANN_RATE} = {v:?}: requests per second, above 0"
                ));
            }
        },
    };
    let kind = match ann.get(ANN_KIND).map(|v| v.trim()) {
        None => None,
        Some(v @ ("server" | "router")) => Some(v.to_owned()),
        Some(v) => {
            return PodVerdict::Bad(format!("{ANN_KIND} = {v:?}: expected server or router"));
        }
    };
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    };
    let base = format!("http://{host}:{port}");
    let metrics_url = match ann.get(ANN_METRICS_PATH).map(|v| v.trim()) {
        None => None,
        Some(p) if p.starts_with('/') && !p.contains(char::is_whitespace) => {
            Some(format!("{base}{p}"))
        }
        Some(p) => {
            return PodVerdict::Bad(format!(
                "{ANN_METRICS_PATH} = {p:?}: a path starting with /"
            ));
        }
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let identity = K8sIdentity {
        namespace,
        pod_name,
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
        container_name: container_for(pod, Some(port)).map(|c| c.name.clone()),
        owner,
        inference_pool: None,
    };
    let raw = RawCanary {
        url: Some(base),
        name: Some(identity.qualified_name()),
        model,
        api,
        rate,
        metrics_url,
        kind,
        ..RawCanary::default()
    };
    PodVerdict::Target(Box::new(PodTarget { raw, identity }))
}

/// What the lifecycle tracker reads of a pod's model-server container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerFacts {
    pub name: String,
    pub image: String,
    /// `command` and `args`, joined by spaces.
    pub args: String,
    pub restart_count: i32,
    /// The previous termination's reason (`OOMKilled`, `Error`) and exit code.
    pub last_reason: Option<String>,
    pub last_exit_code: Option<i32>,
}

/// The facts of `container` in `pod` (spec and status); `None` when the pod lacks it.
pub fn container_facts(pod: &Pod, container: &str) -> Option<ContainerFacts> {
    let spec = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?;
    let args = spec
        .command
        .iter()
        .flatten()
        .chain(spec.args.iter().flatten())
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container));
    let terminated = status
        .and_then(|s| s.last_state.as_ref())
        .and_then(|l| l.terminated.as_ref());
    Some(ContainerFacts {
        name: container.to_owned(),
        image: spec.image.clone().unwrap_or_default(),
        args,
        restart_count: status.map_or(0, |s| s.restart_count),
        last_reason: terminated.and_then(|t| t.reason.clone()),
        last_exit_code: terminated.map(|t| t.exit_code),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn vllm(annotations: serde_json::Value, ready: &str) -> Pod {
        pod(serde_json::json!({
            "metadata": {
                "name": "vllm-0-7d9f", "namespace": "llm", "uid": "u-1",
                "labels": {"app": "vllm", "pod-template-hash": "5c6b8d"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "vllm-5c6b8d", "uid": "rs-1", "controller": true}]
            },
            "spec": {"nodeName": "n1", "containers": [
                {"name": "sidecar", "image": "envoy"},
                {"name": "server", "image": "vllm/vllm-openai:v0.9.0", "args": ["--model", "m"],
                 "ports": [{"containerPort": 8000, "name": "http"}]}
            ]},
            "status": {"podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": ready}],
                "containerStatuses": [{"name": "server", "image": "vllm/vllm-openai:v0.9.0",
                    "imageID": "", "ready": true, "restartCount": 2,
                    "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
        }))
    }

    #[test]
    fn an_annotated_ready_pod_is_a_target_with_its_identity() {
        let p = vllm(
            serde_json::json!({"lmperf.dev/canary": "true", "lmperf.dev/model": "m",
                "lmperf.dev/api": "completions", "lmperf.dev/rate": "0.5",
                "lmperf.dev/metrics-path": "/metrics"}),
            "True",
        );
        let owner = Some(K8sOwner::Deployment("vllm".into()));
        let PodVerdict::Target(t) = pod_target(&p, None, owner.clone()) else {
            panic!("{:?}", pod_target(&p, None, None));
        };
        assert_eq!(t.raw.url.as_deref(), Some("http://10.1.2.3:8000"));
        assert_eq!(t.raw.name.as_deref(), Some("llm/vllm-0-7d9f"));
        assert_eq!(t.raw.model.as_deref(), Some("m"));
        assert_eq!(t.raw.api.as_deref(), Some("completions"));
        assert_eq!(t.raw.rate, Some(0.5));
        assert_eq!(
            t.raw.metrics_url.as_deref(),
            Some("http://10.1.2.3:8000/metrics")
        );
        assert_eq!(
            t.identity,
            K8sIdentity {
                namespace: "llm".into(),
                pod_name: "vllm-0-7d9f".into(),
                pod_uid: "u-1".into(),
                container_name: Some("server".into()),
                owner,
                inference_pool: None,
            }
        );
    }

    #[test]
    fn unready_unselected_terminating_pods_are_skipped() {
        let ann = serde_json::json!({"lmperf.dev/canary": "true"});
        assert!(matches!(
            pod_target(&vllm(ann.clone(), "False"), None, None),
            PodVerdict::Skip(Skip::NotReady)
        ));
        assert!(matches!(
            pod_target(&vllm(serde_json::json!({}), "True"), None, None),
            PodVerdict::Skip(Skip::NotSelected)
        ));
        let mut gone = vllm(ann, "True");
        gone.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert!(matches!(
            pod_target(&gone, None, None),
            PodVerdict::Skip(Skip::Terminating)
        ));
    }

    #[test]
    fn the_selector_selects_and_false_opts_out() {
        let sel = LabelSelector::parse("app=vllm").unwrap();
        let PodVerdict::Target(t) =
            pod_target(&vllm(serde_json::json!({}), "True"), Some(&sel), None)
        else {
            panic!("selected by label")
        };
        // The container port named http.
        assert_eq!(t.raw.url.as_deref(), Some("http://10.1.2.3:8000"));
        assert!(matches!(
            pod_target(
                &vllm(serde_json::json!({"lmperf.dev/canary": "false"}), "True"),
                Some(&sel),
                None
            ),
            PodVerdict::Skip(Skip::NotSelected)
        ));
    }

    #[test]
    fn bad_annotations_name_the_annotation_and_value() {
        for (k, v, says) in [
            ("lmperf.dev/canary", "yes", "lmperf.dev/canary = \"yes\""),
            ("lmperf.dev/port", "http", "lmperf.dev/port = \"http\""),
            ("lmperf.dev/port", "0", "1 to 65535"),
            ("lmperf.dev/api", "embeddings", "chat or completions"),
            ("lmperf.dev/kind", "gateway", "server or router"),
            ("lmperf.dev/rate", "-2", "lmperf.dev/rate = \"-2\""),
            ("lmperf.dev/metrics-path", "metrics", "starting with /"),
        ] {
            let mut ann = serde_json::json!({"lmperf.dev/canary": "true"});
            ann[k] = serde_json::Value::String(v.into());
            match pod_target(&vllm(ann, "True"), None, None) {
                PodVerdict::Bad(e) => assert!(e.contains(says), "{k}={v}: {e}"),
                other => panic!("{k}={v}: {other:?}"),
            }
        }
    }

    #[test]
    fn ipv6_pods_get_brackets() {
        let mut p = vllm(serde_json::json!({"lmperf.dev/canary": "true"}), "True");
        if let Some(s) = p.status.as_mut() {
            s.pod_ip = Some("fd00::7".into());
        }
        let PodVerdict::Target(t) = pod_target(&p, None, None) else {
            panic!()
        };
        assert_eq!(t.raw.url.as_deref(), Some("http://[fd00::7]:8000"));
    }

    #[test]
    fn owners_from_references_labels_and_the_hash() {
        let p = vllm(serde_json::json!({}), "True");
        assert_eq!(
            direct_owner(&p),
            Some(K8sOwner::ReplicaSet("vllm-5c6b8d".into()))
        );
        assert_eq!(
            deployment_by_hash(&p, "vllm-5c6b8d").as_deref(),
            Some("vllm")
        );
        assert_eq!(deployment_by_hash(&p, "other"), None);
        let mut lws = p.clone();
        lws.metadata
            .labels
            .get_or_insert_default()
            .insert(LWS_NAME_LABEL.into(), "llama-405b".into());
        assert_eq!(
            direct_owner(&lws),
            Some(K8sOwner::LeaderWorkerSet("llama-405b".into()))
        );
    }

    fn pool(name: &str, ports: &[u16]) -> InferencePool {
        InferencePool {
            namespace: "llm".into(),
            name: name.into(),
            match_labels: [("app".to_owned(), "vllm".to_owned())].into(),
            ports: ports.to_vec(),
        }
    }

    #[test]
    fn pool_members_are_targets_at_each_target_port() {
        let p = vllm(serde_json::json!({"lmperf.dev/model": "m"}), "True");
        let (a, b) = (pool("llama-pool", &[8000]), pool("llama-b", &[8000, 8002]));
        let one = pool_targets(&p, &[&a], None);
        let [PodVerdict::Target(t)] = &one[..] else {
            panic!("{one:?}")
        };
        assert_eq!(t.raw.url.as_deref(), Some("http://10.1.2.3:8000"));
        assert_eq!(t.raw.name.as_deref(), Some("llm/vllm-0-7d9f"));
        assert_eq!(t.raw.model.as_deref(), Some("m"), "annotations apply");
        assert_eq!(t.identity.inference_pool.as_deref(), Some("llama-pool"));
        assert_eq!(t.identity.container_name.as_deref(), Some("server"));
        let two = pool_targets(&p, &[&a, &b], None);
        let got: Vec<_> = two
            .iter()
            .map(|v| match v {
                PodVerdict::Target(t) => (
                    t.raw.name.clone().unwrap_or_default(),
                    t.raw.url.clone().unwrap_or_default(),
                    t.identity.inference_pool.clone().unwrap_or_default(),
                ),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "llm/vllm-0-7d9f:8000".to_owned(),
                    "http://10.1.2.3:8000".to_owned(),
                    "llama-pool".to_owned()
                ),
                (
                    "llm/vllm-0-7d9f:8002".to_owned(),
                    "http://10.1.2.3:8002".to_owned(),
                    "llama-b".to_owned()
                )
            ]
        );
        let out = vllm(serde_json::json!({"lmperf.dev/canary": "false"}), "True");
        assert!(pool_targets(&out, &[&a], None).is_empty(), "opted out");
        let unready = vllm(serde_json::json!({}), "False");
        assert!(matches!(
            &pool_targets(&unready, &[&a], None)[..],
            [PodVerdict::Skip(Skip::NotReady)]
        ));
    }

    #[test]
    fn container_facts_read_restarts_and_the_last_termination() {
        let p = vllm(serde_json::json!({}), "True");
        let f = container_facts(&p, "server").unwrap();
        assert_eq!(f.image, "vllm/vllm-openai:v0.9.0");
        assert_eq!(f.args, "--model m");
        assert_eq!(f.restart_count, 2);
        assert_eq!(f.last_reason.as_deref(), Some("OOMKilled"));
        assert_eq!(f.last_exit_code, Some(137));
        assert_eq!(container_facts(&p, "nope"), None);
    }
}
