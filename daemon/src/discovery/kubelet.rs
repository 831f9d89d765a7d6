//! Pods of this node through the kubelet's node-local Pods API (KEP-4188, `v1alpha1.Pods`,
//! beta and on by default from Kubernetes 1.37): a gRPC service on the unix socket
//! `kubelet.sock` under `kubelet_pods_api_dir` (default `/var/lib/kubelet/pods-api`). It puts
//! no load on the API server: at 10,000 nodes, 10,000 pod watches fewer.
//!
//! Each (re)connection calls `ListPods` (a full list: it replaces the pods held, like the API
//! server watcher's relist), then `WatchPods`, whose events carry pods as the bytes of
//! `v1.Pod#Marshal()` (decoded by [`super::kubelet_pod`]). `WatchPods` first sends an `ADDED`
//! event per existing pod and then `INITIAL_SYNC_COMPLETE`: a pod listed but not in that initial
//! set went away between the two calls and is deleted then. A closed stream or an error
//! reconnects with backoff (1 s doubling to 30 s, reset by a completed sync); each new error is
//! said in the status. A pod whose bytes do not decode is skipped and logged; the others go on.
//!
//! In `source = auto` the API server is the fall-back: a socket that is missing or refuses the
//! agent, or a kubelet that answers `Unimplemented` (the feature gate off), `PermissionDenied`,
//! `Unauthenticated` or `FailedPrecondition`, ends this source with the reason
//! ([`FallBack`]); the caller then watches the API server and says why in the status. In
//! `source = kubelet` every error is retried.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::kubelet_pod::{self, api};

/// The socket's file name in `kubelet_pods_api_dir` (as the pod-resources API's).
pub const SOCKET_NAME: &str = "kubelet.sock";
/// How long connecting and `ListPods` may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest message accepted (`ListPodsResponse`: ≤ 110 pods of ≤ 1.5 MiB each is the limit
/// of a full node; real pods are a few KiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Pod events queued for the mapper at most (the sender waits beyond it: nothing is dropped).
pub const EVENT_QUEUE: usize = 64;
/// Longest wait between reconnections.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The socket in `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_NAME)
}

/// Why the Pods API gave no pods.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error(
        "socket {0} does not exist (the kubelet does not serve the Pods API: Kubernetes before 1.37 or the PodsAPI feature gate off, or the socket's directory is not mounted into the agent's pod)"
    )]
    Missing(PathBuf),
    #[error("permission denied on socket {0} (the agent must run as a user that may write it)")]
    PermissionDenied(PathBuf),
    #[error("cannot connect to socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{call} did not answer within {CALL_TIMEOUT:?}")]
    Timeout { call: &'static str },
    #[error("{call} failed: {code:?}: {message}")]
    Rpc {
        call: &'static str,
        code: tonic::Code,
        message: String,
    },
    #[error("the kubelet closed the WatchPods stream")]
    Closed,
}

impl KubeletError {
    /// Whether `source = auto` gives the Pods API up for the API server on this error at the
    /// first connection (every error: the API server is known to work) or later (only the
    /// kubelet saying it does not serve the API to this agent; a restarting kubelet is
    /// retried).
    pub fn falls_back(&self, first: bool) -> bool {
        first
            || matches!(
                self,
                Self::Rpc {
                    code: tonic::Code::Unimplemented
                        | tonic::Code::PermissionDenied
                        | tonic::Code::Unauthenticated
                        | tonic::Code::FailedPrecondition,
                    ..
                }
            )
    }

    fn rpc(call: &'static str, s: &tonic::Status) -> Self {
        Self::Rpc {
            call,
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}

/// A connection that listed the pods and opened the watch.
pub struct Opened {
    listed: Vec<Pod>,
    watch: tonic::Streaming<api::WatchPodsEvent>,
    /// Pods whose bytes did not decode in the list (logged, skipped).
    bad: usize,
}

/// `source = auto` gives the Pods API up: the reason, for the status.
#[derive(Debug, Clone, PartialEq)]
pub struct FallBack(pub String);

/// Connects to `socket`, lists the pods and opens the watch, within [`CALL_TIMEOUT`] each.
///
/// # Errors
/// [`KubeletError`]: the socket's absence and permission told apart from other connect
/// errors, the gRPC status of a refused call.
pub async fn open(socket: &Path) -> Result<Opened, KubeletError> {
    let timed = |call| move |_| KubeletError::Timeout { call };
    let mut client = tokio::time::timeout(CALL_TIMEOUT, client(socket))
        .await
        .map_err(timed("connect"))??;
    let list = tokio::time::timeout(CALL_TIMEOUT, client.list_pods(api::ListPodsRequest {}))
        .await
        .map_err(timed("ListPods"))?
        .map_err(|s| KubeletError::rpc("ListPods", &s))?
        .into_inner();
    let mut bad = 0;
    let listed = list
        .pods
        .iter()
        .filter_map(|b| match kubelet_pod::decode(b) {
            Ok(p) => Some(p),
            Err(e) => {
                bad += 1;
                tracing::warn!(error = %e, "kubelet Pods API: a listed pod skipped.");
                None
            }
        })
        .collect();
    let watch = tokio::time::timeout(CALL_TIMEOUT, client.watch_pods(api::WatchPodsRequest {}))
        .await
        .map_err(timed("WatchPods"))?
        .map_err(|s| KubeletError::rpc("WatchPods", &s))?
        .into_inner();
    Ok(Opened { listed, watch, bad })
}

async fn client(
    socket: &Path,
) -> Result<api::pods_client::PodsClient<tonic::transport::Channel>, KubeletError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => KubeletError::Missing(socket.to_owned()),
            std::io::ErrorKind::PermissionDenied => {
                KubeletError::PermissionDenied(socket.to_owned())
            }
            _ => KubeletError::Connect {
                path: socket.to_owned(),
                source: e,
            },
        })?;
    let channel = crate::unix_grpc::channel(stream)
        .await
        .map_err(|e| KubeletError::Connect {
            path: socket.to_owned(),
            source: std::io::Error::other(super::kube_client::chain(&e)),
        })?;
    Ok(api::pods_client::PodsClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// What one connection's watch loop ended with.
enum Ended {
    Stopped,
    /// The mapper is gone (it stopped).
    Gone,
    Failed(KubeletError),
}

/// Feeds `tx` with this node's pod events from the Pods API until `stop`, `tx` closes, or (in
/// `auto`) the kubelet refuses the API ([`FallBack`]). `first`: the connection already opened
/// (`None`: open one now). Errors go to `tx` as the status's sentence.
pub async fn events(
    first: Option<Opened>,
    socket: PathBuf,
    auto: bool,
    tx: mpsc::Sender<Result<Event<Pod>, String>>,
    stop: CancellationToken,
) -> Option<FallBack> {
    let mut next = first;
    let mut wait = Duration::from_secs(1);
    let mut first_try = next.is_none();
    loop {
        let opened = match next.take() {
            Some(o) => Ok(o),
            None => tokio::select! {
                _ = stop.cancelled() => return None,
                o = open(&socket) => o,
            },
        };
        let failed = match opened {
            Ok(o) => match follow(o, &tx, &stop, &mut wait).await {
                Ended::Stopped | Ended::Gone => return None,
                Ended::Failed(e) => e,
            },
            Err(e) => e,
        };
        if auto && failed.falls_back(first_try) {
            return Some(FallBack(format!(
                "source = auto: the kubelet Pods API at {} {}: {failed}; the API server is watched with a spec.nodeName field selector",
                socket.display(),
                if first_try {
                    "did not answer"
                } else {
                    "refused"
                },
            )));
        }
        first_try = false;
        let text = format!("kubelet Pods API ({}): {failed}", socket.display());
        if tx.send(Err(text)).await.is_err() {
            return None;
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(MAX_BACKOFF);
    }
}

/// Sends the list as a relist, then the watch's events, until the stream ends.
async fn follow(
    o: Opened,
    tx: &mpsc::Sender<Result<Event<Pod>, String>>,
    stop: &CancellationToken,
    wait: &mut Duration,
) -> Ended {
    let Opened {
        listed,
        mut watch,
        bad,
    } = o;
    tracing::info!(
        pods = listed.len(),
        skipped = bad,
        "kubelet Pods API: pods listed."
    );
    let mut unseen: BTreeMap<String, Pod> = listed.iter().map(|p| (key(p), p.clone())).collect();
    let mut relist = vec![Event::Init];
    relist.extend(listed.into_iter().map(Event::InitApply));
    relist.push(Event::InitDone);
    for e in relist {
        if tx.send(Ok(e)).await.is_err() {
            return Ended::Gone;
        }
    }
    let mut synced = false;
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => return Ended::Stopped,
            m = watch.message() => m,
        };
        let ev = match msg {
            Ok(Some(ev)) => ev,
            Ok(None) => return Ended::Failed(KubeletError::Closed),
            Err(s) => return Ended::Failed(KubeletError::rpc("WatchPods", &s)),
        };
        let out = match api::EventType::try_from(ev.r#type) {
            Ok(api::EventType::InitialSyncComplete) => {
                synced = true;
                *wait = Duration::from_secs(1);
                // Listed, but not in the watch's initial set: deleted in between.
                std::mem::take(&mut unseen)
                    .into_values()
                    .map(|p| Event::Delete(stub(&p)))
                    .collect()
            }
            Ok(
                t @ (api::EventType::Added | api::EventType::Modified | api::EventType::Deleted),
            ) => match kubelet_pod::decode(&ev.pod) {
                Ok(p) => {
                    if !synced {
                        unseen.remove(&key(&p));
                    }
                    if t == api::EventType::Deleted {
                        vec![Event::Delete(p)]
                    } else {
                        vec![Event::Apply(p)]
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, event = ?t, "kubelet Pods API: a pod event skipped.");
                    Vec::new()
                }
            },
            Ok(api::EventType::Unspecified) | Err(_) => Vec::new(),
        };
        for e in out {
            if tx.send(Ok(e)).await.is_err() {
                return Ended::Gone;
            }
        }
    }
}

/// A deleted pod as the Pods API's `DELETED` event carries it: name, namespace, uid.
fn stub(p: &Pod) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: p.metadata.name.clone(),
            namespace: p.metadata.namespace.clone(),
            uid: p.metadata.uid.clone(),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_falls_back_on_any_first_error_and_later_only_on_refusals() {
        let missing = KubeletError::Missing("/x/kubelet.sock".into());
        assert!(missing.falls_back(true));
        assert!(!missing.falls_back(false), "a restarting kubelet");
        let unimpl = KubeletError::Rpc {
            call: "WatchPods",
            code: tonic::Code::Unimplemented,
            message: String::new(),
        };
        assert!(unimpl.falls_back(false));
        let unavailable = KubeletError::Rpc {
            call: "WatchPods",
            code: tonic::Code::Unavailable,
            message: String::new(),
        };
        assert!(!unavailable.falls_back(false));
        assert!(missing.to_string().contains("/x/kubelet.sock"));
    }

    #[tokio::test]
    async fn a_missing_socket_is_named() {
        let dir = std::env::temp_dir().join(format!("lmperf-no-pods-api-{}", std::process::id()));
        let e = open(&socket_path(&dir)).await.err().map(|e| e.to_string());
        let e = e.unwrap_or_default();
        assert!(
            e.contains("does not exist") && e.contains("kubelet.sock"),
            "{e}"
        );
    }
}
