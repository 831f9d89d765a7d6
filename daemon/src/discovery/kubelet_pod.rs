//! The kubelet Pods API's messages and its pods: each pod comes as the bytes of
//! `v1.Pod#Marshal()` (the protobuf encoding of `k8s.io/api` core/v1 `Pod`), decoded here into
//! the same `k8s_openapi` [`Pod`] the API server's watch yields, so [`super::pod`] maps both
//! sources alike (targets, identity, lifecycle). Pure: no IO.
//!
//! The decoder is generated from a subset of upstream's `generated.proto` files
//! (`proto/k8s.io/…`, upstream's field numbers verbatim): the fields discovery reads; protobuf
//! skips the others as unknown fields. Not the `k8s-pb` crate (every Kubernetes type, 39k lines
//! of generated Rust): it took 100 s (46 s of CPU) to build alone on the 2-core CI machine,
//! the subset adds a few hundred lines (ARCHITECTURE.md, Kubernetes discovery).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;

/// The kubelet Pods API (`v1alpha1.Pods`: `ListPods`, `WatchPods`, `GetPod`), generated from
/// `proto/kubelet/pods/v1alpha1/api.proto` by `daemon/build.rs`: the client discovery runs
/// and the server the tests script.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("v1alpha1");
}

/// The `k8s.io` protobuf packages of the v1.Pod subset (`proto/k8s.io/…`), nested as prost
/// names them (`k8s.io.api.core.v1` → `k8s::io::api::core::v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod k8s {
    pub mod io {
        pub mod api {
            pub mod core {
                pub mod v1 {
                    tonic::include_proto!("k8s.io.api.core.v1");
                }
            }
        }
        pub mod apimachinery {
            pub mod pkg {
                pub mod apis {
                    pub mod meta {
                        pub mod v1 {
                            tonic::include_proto!("k8s.io.apimachinery.pkg.apis.meta.v1");
                        }
                    }
                }
            }
        }
    }
}

use k8s::io::api::core::v1 as pb;
use k8s::io::apimachinery::pkg::apis::meta::v1 as pbmeta;

/// Largest pod accepted (a pod object is limited to 1.5 MiB by etcd's request size).
pub const MAX_POD_BYTES: usize = 4 * 1024 * 1024;

/// Why a pod's bytes were not read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PodDecodeError {
    #[error("pod of {0} bytes is over the {MAX_POD_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("pod bytes are not a protobuf v1.Pod: {0}")]
    Decode(String),
    #[error("pod without metadata.name or metadata.namespace")]
    Unnamed,
}

/// Decodes one pod of the Pods API (`WatchPodsEvent.pod`, `ListPodsResponse.pods`).
///
/// # Errors
/// [`PodDecodeError`]: too large, not a v1.Pod, or a pod without a name or namespace.
pub fn decode(bytes: &[u8]) -> Result<core::Pod, PodDecodeError> {
    if bytes.len() > MAX_POD_BYTES {
        return Err(PodDecodeError::TooLarge(bytes.len()));
    }
    let p = pb::Pod::decode(bytes).map_err(|e| PodDecodeError::Decode(e.to_string()))?;
    let pod = to_openapi(p);
    let named = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
    if !named(&pod.metadata.name) || !named(&pod.metadata.namespace) {
        return Err(PodDecodeError::Unnamed);
    }
    Ok(pod)
}

fn map(m: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!m.is_empty()).then_some(m)
}

fn vec<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

fn time(t: pbmeta::Time) -> meta::Time {
    let at = k8s_openapi::jiff::Timestamp::new(t.seconds.unwrap_or(0), t.nanos.unwrap_or(0))
        .unwrap_or_default();
    meta::Time(at)
}

/// The subset as the `k8s_openapi` pod the API server source holds (absent fields stay
/// `None`, as the API server's JSON leaves them).
pub fn to_openapi(p: pb::Pod) -> core::Pod {
    let m = p.metadata.unwrap_or_default();
    let metadata = meta::ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        deletion_timestamp: m.deletion_timestamp.map(time),
        labels: map(m.labels),
        annotations: map(m.annotations),
        owner_references: vec(m
            .owner_references
            .into_iter()
            .map(|o| meta::OwnerReference {
                api_version: o.api_version.unwrap_or_default(),
                kind: o.kind.unwrap_or_default(),
                name: o.name.unwrap_or_default(),
                uid: o.uid.unwrap_or_default(),
                controller: o.controller,
                block_owner_deletion: None,
            })
            .collect()),
        ..meta::ObjectMeta::default()
    };
    let spec = p.spec.map(|s| core::PodSpec {
        node_name: s.node_name,
        containers: s.containers.into_iter().map(container).collect(),
        ..core::PodSpec::default()
    });
    let status = p.status.map(|s| core::PodStatus {
        phase: s.phase,
        pod_ip: s.pod_ip,
        conditions: vec(s
            .conditions
            .into_iter()
            .map(|c| core::PodCondition {
                type_: c.r#type.unwrap_or_default(),
                status: c.status.unwrap_or_default(),
                ..core::PodCondition::default()
            })
            .collect()),
        container_statuses: vec(s.container_statuses.into_iter().map(status).collect()),
        ..core::PodStatus::default()
    });
    core::Pod {
        metadata,
        spec,
        status,
    }
}

fn container(c: pb::Container) -> core::Container {
    core::Container {
        name: c.name.unwrap_or_default(),
        image: c.image,
        command: vec(c.command),
        args: vec(c.args),
        ports: vec(c
            .ports
            .into_iter()
            .map(|p| core::ContainerPort {
                name: p.name,
                host_port: p.host_port,
                container_port: p.container_port.unwrap_or(0),
                protocol: p.protocol,
                ..core::ContainerPort::default()
            })
            .collect()),
        ..core::Container::default()
    }
}

fn status(s: pb::ContainerStatus) -> core::ContainerStatus {
    core::ContainerStatus {
        name: s.name.unwrap_or_default(),
        ready: s.ready.unwrap_or(false),
        restart_count: s.restart_count.unwrap_or(0),
        image: s.image.unwrap_or_default(),
        image_id: s.image_id.unwrap_or_default(),
        last_state: s.last_state.map(|l| core::ContainerState {
            terminated: l.terminated.map(|t| core::ContainerStateTerminated {
                exit_code: t.exit_code.unwrap_or(0),
                signal: t.signal,
                reason: t.reason,
                ..core::ContainerStateTerminated::default()
            }),
            ..core::ContainerState::default()
        }),
        ..core::ContainerStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod as upstream encodes it, with fields the subset does not know (volumes, hostIP,
    /// a container's env) in between: they are skipped, the rest reads as written.
    fn upstream_bytes() -> Vec<u8> {
        use prost::encoding::{WireType, encode_key, encode_varint, string};
        let mut meta = pbmeta::ObjectMeta {
            name: Some("vllm-0".into()),
            namespace: Some("llm".into()),
            uid: Some("u-1".into()),
            labels: [("app".to_owned(), "vllm".to_owned())].into(),
            annotations: [("lmperf.dev/canary".to_owned(), "true".to_owned())].into(),
            owner_references: vec![pbmeta::OwnerReference {
                api_version: Some("apps/v1".into()),
                kind: Some("ReplicaSet".into()),
                name: Some("vllm-5c6b8d".into()),
                uid: Some("rs-1".into()),
                controller: Some(true),
            }],
            ..Default::default()
        }
        .encode_to_vec();
        // generateName (2) and finalizers (14): unknown to the subset.
        string::encode(2, &"vllm-".to_owned(), &mut meta);
        string::encode(14, &"f".to_owned(), &mut meta);
        let mut container = pb::Container {
            name: Some("server".into()),
            image: Some("vllm/vllm-openai:v0.9.0".into()),
            args: vec!["--model".into(), "m".into()],
            ports: vec![pb::ContainerPort {
                name: Some("http".into()),
                container_port: Some(8000),
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec();
        string::encode(5, &"/workdir".to_owned(), &mut container); // workingDir
        let mut spec = Vec::new();
        // volumes (1), an empty message, before the containers.
        encode_key(1, WireType::LengthDelimited, &mut spec);
        encode_varint(0, &mut spec);
        encode_key(2, WireType::LengthDelimited, &mut spec);
        encode_varint(container.len() as u64, &mut spec);
        spec.extend_from_slice(&container);
        string::encode(10, &"node-1".to_owned(), &mut spec);
        let mut status = pb::PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.1.2.3".into()),
            conditions: vec![pb::PodCondition {
                r#type: Some("Ready".into()),
                status: Some("True".into()),
            }],
            container_statuses: vec![pb::ContainerStatus {
                name: Some("server".into()),
                restart_count: Some(2),
                last_state: Some(pb::ContainerState {
                    terminated: Some(pb::ContainerStateTerminated {
                        exit_code: Some(137),
                        reason: Some("OOMKilled".into()),
                        signal: None,
                    }),
                }),
                ..Default::default()
            }],
        }
        .encode_to_vec();
        string::encode(5, &"192.168.0.9".to_owned(), &mut status); // hostIP
        let mut out = Vec::new();
        for (field, body) in [(1, &meta), (2, &spec), (3, &status)] {
            encode_key(field, WireType::LengthDelimited, &mut out);
            encode_varint(body.len() as u64, &mut out);
            out.extend_from_slice(body);
        }
        out
    }

    #[test]
    fn an_upstream_pod_decodes_to_what_discovery_reads() {
        let p = decode(&upstream_bytes()).unwrap();
        assert_eq!(p.metadata.name.as_deref(), Some("vllm-0"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("llm"));
        assert_eq!(p.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(p.metadata.labels.as_ref().unwrap()["app"], "vllm");
        let o = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.name.as_str()),
            ("ReplicaSet", "vllm-5c6b8d")
        );
        assert_eq!(o.controller, Some(true));
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(
            spec.containers[0].ports.as_ref().unwrap()[0].container_port,
            8000
        );
        assert_eq!(
            spec.containers[0].args.as_deref(),
            Some(&["--model".to_owned(), "m".to_owned()][..])
        );
        // The same verdict and facts as the API server's JSON pod gives.
        let crate::discovery::pod::PodVerdict::Target(t) =
            crate::discovery::pod::pod_target(&p, None, None)
        else {
            panic!("a target")
        };
        assert_eq!(t.raw.url.as_deref(), Some("http://10.1.2.3:8000"));
        assert_eq!(t.identity.container_name.as_deref(), Some("server"));
        let f = crate::discovery::pod::container_facts(&p, "server").unwrap();
        assert_eq!(f.restart_count, 2);
        assert_eq!(f.last_reason.as_deref(), Some("OOMKilled"));
        assert_eq!(f.last_exit_code, Some(137));
        assert_eq!(f.args, "--model m");
    }

    #[test]
    fn bad_bytes_and_unnamed_pods_are_errors() {
        assert!(matches!(
            decode(&[0xff, 0xff]),
            Err(PodDecodeError::Decode(_))
        ));
        let unnamed = pb::Pod::default().encode_to_vec();
        assert_eq!(decode(&unnamed), Err(PodDecodeError::Unnamed));
        let deleted = pb::Pod {
            metadata: Some(pbmeta::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                deletion_timestamp: Some(pbmeta::Time {
                    seconds: Some(1_700_000_000),
                    nanos: Some(0),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let p = decode(&deleted.encode_to_vec()).unwrap();
        assert_eq!(
            p.metadata.deletion_timestamp.map(|t| t.0.as_second()),
            Some(1_700_000_000)
        );
    }
}
