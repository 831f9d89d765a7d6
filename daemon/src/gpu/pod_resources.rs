//! The kubelet's pod-resources API (`v1.PodResourcesLister/List`, GA since Kubernetes 1.28)
//! over its unix socket: which container holds which GPU, read once per GPU interval on the
//! async runtime (never on the NVML thread), mapped onto the NVML devices by [`super::pods`]
//! and published to [`GpuState`] (the `k8s.*` labels of the GPU series, each target's GPUs).
//!
//! Faults (socket missing, permission denied, a `List` that does not answer within
//! [`list_timeout`], an RPC error, a device id NVML does not know, a pod that went away) are
//! each said once, when they begin, in `gpu.pod_resources` of `/api/v1/status` and in the log;
//! while no answer is at hand the GPU series flow without pod labels and every target reads
//! every GPU (today's process-based attribution). The kubelet limits the API to 100 calls per
//! second per node for all clients: one `List` per interval at most, one connection each.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::pods::{self, Attribution, ContainerDevices};
use super::state::{GpuState, Mode};

/// The messages and the client (and server, for tests) generated from
/// `proto/kubelet/podresources/v1/api.proto` by `daemon/build.rs`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1");
}

/// The kubelet's socket where the agent's config does not name another.
pub use crate::config::DEFAULT_POD_RESOURCES_SOCKET as DEFAULT_SOCKET;
/// Largest `List` answer accepted (a node with hundreds of pods answers well under it).
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// How long one `List` (connect included) may take: the GPU interval, at least 1 s, at most
/// 10 s.
pub fn list_timeout(interval: Duration) -> Duration {
    interval.clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// Why a `List` gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error(
        "socket {0} does not exist (not a Kubernetes node, or the kubelet's pod-resources directory is not mounted)"
    )]
    Missing(PathBuf),
    #[error("permission denied on socket {0} (the agent must run as a user that may write it)")]
    PermissionDenied(PathBuf),
    #[error("List did not answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot connect to socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("List failed: {0}")]
    Rpc(String),
}

impl PodResourcesError {
    /// A short stable name for the status events.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Missing(_) => "socket_missing",
            Self::PermissionDenied(_) => "permission_denied",
            Self::Timeout(_) => "timeout",
            Self::Connect { .. } => "connect_failed",
            Self::Rpc(_) => "list_failed",
        }
    }
}

/// One `List` over the socket at `path`, within `timeout` (connect included): every
/// container's devices, flattened.
///
/// # Errors
/// [`PodResourcesError`]: the socket's absence and permission are told apart from other
/// connect errors, a slow answer is [`PodResourcesError::Timeout`].
pub async fn list(
    path: &Path,
    timeout: Duration,
) -> Result<Vec<ContainerDevices>, PodResourcesError> {
    match tokio::time::timeout(timeout, list_inner(path)).await {
        Ok(r) => r,
        Err(_) => Err(PodResourcesError::Timeout(timeout)),
    }
}

async fn list_inner(path: &Path) -> Result<Vec<ContainerDevices>, PodResourcesError> {
    let stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => PodResourcesError::Missing(path.to_owned()),
            std::io::ErrorKind::PermissionDenied => {
                PodResourcesError::PermissionDenied(path.to_owned())
            }
            _ => PodResourcesError::Connect {
                path: path.to_owned(),
                source: e,
            },
        })?;
    let channel = crate::unix_grpc::channel(stream)
        .await
        .map_err(|e| PodResourcesError::Rpc(e.to_string()))?;
    let mut client = proto::pod_resources_lister_client::PodResourcesListerClient::new(channel)
        .max_decoding_message_size(MAX_ANSWER_BYTES);
    let answer = client
        .list(proto::ListPodResourcesRequest {})
        .await
        .map_err(|s| PodResourcesError::Rpc(format!("{}: {}", s.code(), s.message())))?
        .into_inner();
    Ok(flatten(answer))
}

/// Every (pod, container, resource) with its device ids.
pub fn flatten(answer: proto::ListPodResourcesResponse) -> Vec<ContainerDevices> {
    let mut out = Vec::new();
    for p in answer.pod_resources {
        if p.containers.is_empty() {
            // A pod without containers still counts as present (a pod gone is told apart).
            out.push(ContainerDevices {
                namespace: p.namespace.clone(),
                pod: p.name.clone(),
                container: String::new(),
                resource: String::new(),
                device_ids: Vec::new(),
            });
        }
        for c in p.containers {
            if c.devices.is_empty() {
                out.push(ContainerDevices {
                    namespace: p.namespace.clone(),
                    pod: p.name.clone(),
                    container: c.name.clone(),
                    resource: String::new(),
                    device_ids: Vec::new(),
                });
            }
            for d in c.devices {
                out.push(ContainerDevices {
                    namespace: p.namespace.clone(),
                    pod: p.name.clone(),
                    container: c.name.clone(),
                    resource: d.resource_name,
                    device_ids: d.device_ids,
                });
            }
        }
    }
    out
}

/// A change worth saying once: `(kind, hw_id, detail)`.
pub type Note = (&'static str, Option<String>, String);

/// What the reader said so far, so that each fault and change is said once.
#[derive(Debug, Default)]
pub struct Watch {
    /// The kind of the failure in progress; `None` after a good answer (or before any).
    failing: Option<&'static str>,
    ok_once: bool,
    /// Unknown device ids already said.
    unknown: BTreeSet<String>,
    /// `namespace/pod` → the GPUs it held at the last good answer.
    holders: BTreeMap<String, BTreeSet<String>>,
}

impl Watch {
    /// The notes of one `List` outcome (a good answer mapped to `a`, or a failure).
    /// `devices_known`: NVML has listed the node's devices (unknown ids are judged only then).
    pub fn after(
        &mut self,
        outcome: Result<&Attribution, &PodResourcesError>,
        devices_known: bool,
    ) -> Vec<Note> {
        let mut notes = Vec::new();
        match outcome {
            Err(e) => {
                if self.failing != Some(e.kind()) {
                    notes.push((e.kind(), None, e.to_string()));
                }
                self.failing = Some(e.kind());
                // The holders are kept: a pod is "gone" only when an answer lacks it.
            }
            Ok(a) => {
                if self.failing.take().is_some() && self.ok_once {
                    notes.push(("recovered", None, "List answers again".to_owned()));
                }
                self.ok_once = true;
                if devices_known {
                    for id in &a.unknown_ids {
                        if self.unknown.insert(id.clone()) {
                            notes.push((
                                "unknown_device_id",
                                None,
                                format!("device id {id} matches no GPU NVML knows"),
                            ));
                        }
                    }
                }
                let mut now: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                for (hw_id, hs) in &a.by_device {
                    for h in hs {
                        now.entry(format!("{}/{}", h.namespace, h.pod))
                            .or_default()
                            .insert(hw_id.clone());
                    }
                }
                for (pod, gpus) in &self.holders {
                    if !now.contains_key(pod) {
                        for g in gpus {
                            notes.push((
                                "pod_gone",
                                Some(g.clone()),
                                format!("pod {pod} no longer holds it; held by no pod now"),
                            ));
                        }
                    }
                }
                self.holders = now;
            }
        }
        notes
    }
}

/// Reads `socket` once per `interval` until `stop`, publishing to `state`. A `None` socket
/// (`[gpu] pod_resources_socket = ""`) only marks the feature off.
pub async fn run(
    socket: Option<PathBuf>,
    interval: Duration,
    state: Arc<GpuState>,
    stop: CancellationToken,
) {
    let Some(socket) = socket else {
        state.set_pod_status(|s| {
            s.state = "off";
            s.reason = Some("off in the configuration ([gpu] pod_resources_socket = \"\")".into());
        });
        return;
    };
    state.set_pod_status(|s| {
        s.socket = Some(socket.display().to_string());
        s.state = "starting";
        s.reason = None;
    });
    let timeout = list_timeout(interval);
    let mut watch = Watch::default();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if state.mode() == Mode::Off {
            // No NVML library: no GPU to attribute, no call to the kubelet.
            state.set_pod_status(|s| {
                s.state = "off";
                s.reason = Some("GPU monitoring is off (no NVML library)".into());
            });
            state.set_pods(None);
            continue;
        }
        let result = tokio::select! {
            () = stop.cancelled() => return,
            r = list(&socket, timeout) => r,
        };
        let at = SystemTime::now();
        let at_s = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let latest = state.latest();
        let devices: Vec<_> = latest.devices.iter().map(|d| d.info.clone()).collect();
        let devices_known = state.mode() == Mode::On && !devices.is_empty();
        let (notes, attribution) = match &result {
            Ok(list) => {
                let a = pods::attribute(list, &devices);
                (watch.after(Ok(&a), devices_known), Ok(a))
            }
            Err(e) => (watch.after(Err(e), devices_known), Err(e)),
        };
        for (kind, hw_id, detail) in notes {
            if kind == "socket_missing" {
                // A missing socket is the plain host's normal case: said once, quietly.
                tracing::info!(socket = %socket.display(), kind, detail = %detail, "Pod-resources attribution off: {detail}.");
            } else if kind == "recovered" {
                tracing::info!(socket = %socket.display(), "Pod-resources API answers again; GPU series carry pod labels.");
            } else {
                tracing::warn!(socket = %socket.display(), hw_id = hw_id.as_deref().unwrap_or(""), kind, detail = %detail, "Pod-resources attribution: {detail}.");
            }
            state.pod_event(at, kind, hw_id.as_deref(), detail);
        }
        match attribution {
            Ok(a) => {
                state.set_pod_status(|s| {
                    s.state = "ok";
                    s.reason = None;
                    s.lists += 1;
                    s.last_list_unix_s = Some(at_s);
                    s.pods = a.pods.len();
                    s.unknown_device_ids = if devices_known {
                        a.unknown_ids.clone()
                    } else {
                        Vec::new()
                    };
                });
                state.set_pods(Some(a));
            }
            Err(e) => {
                state.set_pod_status(|s| {
                    s.state = "unavailable";
                    s.reason = Some(e.to_string());
                    s.lists += 1;
                    s.last_list_unix_s = Some(at_s);
                });
                state.set_pods(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::pods::GpuHolder;

    fn attribution(pairs: &[(&str, &str)], unknown: &[&str]) -> Attribution {
        let mut a = Attribution::default();
        for (gpu, pod) in pairs {
            a.by_device
                .entry((*gpu).to_owned())
                .or_default()
                .push(GpuHolder {
                    namespace: "ml".into(),
                    pod: (*pod).into(),
                    container: "c".into(),
                });
            a.pods.insert(format!("ml/{pod}"));
        }
        a.unknown_ids = unknown.iter().map(|s| (*s).to_owned()).collect();
        a
    }

    fn kinds(n: &[Note]) -> Vec<&'static str> {
        n.iter().map(|(k, _, _)| *k).collect()
    }

    #[test]
    fn each_fault_and_change_is_said_once() {
        let mut w = Watch::default();
        let missing = PodResourcesError::Missing("/x".into());
        assert_eq!(kinds(&w.after(Err(&missing), true)), ["socket_missing"]);
        assert!(w.after(Err(&missing), true).is_empty());
        let two = attribution(&[("GPU-0", "a"), ("GPU-1", "b")], &["GPU-x"]);
        // The first good answer is not a recovery; the unknown id is said once.
        assert_eq!(kinds(&w.after(Ok(&two), true)), ["unknown_device_id"]);
        assert!(w.after(Ok(&two), true).is_empty());
        let timeout = PodResourcesError::Timeout(Duration::from_secs(1));
        assert_eq!(kinds(&w.after(Err(&timeout), true)), ["timeout"]);
        assert!(w.after(Err(&timeout), true).is_empty());
        let denied = PodResourcesError::PermissionDenied("/x".into());
        assert_eq!(kinds(&w.after(Err(&denied), true)), ["permission_denied"]);
        assert_eq!(kinds(&w.after(Ok(&two), true)), ["recovered"]);
        // Pod b goes away between two Lists: said once, naming its GPU.
        let one = attribution(&[("GPU-0", "a")], &["GPU-x"]);
        let n = w.after(Ok(&one), true);
        assert_eq!(kinds(&n), ["pod_gone"]);
        assert_eq!(n[0].1.as_deref(), Some("GPU-1"));
        assert!(n[0].2.contains("ml/b"), "{n:?}");
        assert!(w.after(Ok(&one), true).is_empty());
    }

    #[test]
    fn unknown_ids_wait_for_nvml() {
        let mut w = Watch::default();
        let a = attribution(&[], &["GPU-x"]);
        assert!(w.after(Ok(&a), false).is_empty());
        assert_eq!(kinds(&w.after(Ok(&a), true)), ["unknown_device_id"]);
    }

    #[test]
    fn timeout_is_the_interval_within_bounds() {
        assert_eq!(
            list_timeout(Duration::from_millis(100)),
            Duration::from_secs(1)
        );
        assert_eq!(list_timeout(Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(
            list_timeout(Duration::from_secs(60)),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn flatten_keeps_pods_without_devices() {
        use proto::{ContainerDevices as D, ContainerResources as C, PodResources as P};
        let answer = proto::ListPodResourcesResponse {
            pod_resources: vec![
                P {
                    name: "a".into(),
                    namespace: "ml".into(),
                    containers: vec![C {
                        name: "vllm".into(),
                        devices: vec![D {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec!["GPU-0".into()],
                            topology: None,
                        }],
                        ..C::default()
                    }],
                },
                P {
                    name: "b".into(),
                    namespace: "ml".into(),
                    containers: vec![],
                },
            ],
        };
        let f = flatten(answer);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].device_ids, ["GPU-0"]);
        assert_eq!((f[1].pod.as_str(), f[1].resource.as_str()), ("b", ""));
    }
}
