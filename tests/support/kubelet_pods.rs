//! A scripted kubelet Pods API server (`v1alpha1.Pods`, KEP-4188) on a unix socket, built from
//! the same upstream proto as the agent's client (`proto/kubelet/pods/v1alpha1/`, generated into
//! `lmperf::discovery::kubelet_pod::api`). Pods are written as the API server's JSON (the
//! `kube_api::pod` helper) and sent as the kubelet sends them: the protobuf bytes of a
//! `k8s.io/api` core/v1 `Pod` (the upstream field numbers of `proto/k8s.io/…`).
//!
//! `WatchPods` sends an `ADDED` event per pod held, then `INITIAL_SYNC_COMPLETE`, then every
//! change (`ADDED`, `MODIFIED`, `DELETED` with only name, namespace and uid), as the kubelet
//! does. The test can make every call answer a gRPC error, cut the open watches, and count the
//! calls.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use lmperf::discovery::kubelet_pod::api::{
    self, EventType, WatchPodsEvent,
    pods_server::{Pods, PodsServer},
};
use lmperf::discovery::kubelet_pod::k8s::io::api::core::v1 as pb;
use lmperf::discovery::kubelet_pod::k8s::io::apimachinery::pkg::apis::meta::v1 as pbmeta;
use prost::Message;
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// Calls counted.
#[derive(Debug, Default)]
pub struct Counts {
    pub lists: AtomicUsize,
    pub watches: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    /// `namespace/name` → the pod's JSON.
    pods: BTreeMap<String, Value>,
    /// Every call answers this error while set.
    error: Option<tonic::Code>,
}

/// `None` cuts the open watches.
type Live = broadcast::Sender<Option<WatchPodsEvent>>;

#[derive(Clone)]
struct Service {
    state: Arc<Mutex<State>>,
    live: Live,
    counts: Arc<Counts>,
}

type EventStream = Pin<Box<dyn Stream<Item = Result<WatchPodsEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Pods for Service {
    type WatchPodsStream = EventStream;

    async fn watch_pods(
        &self,
        _: Request<api::WatchPodsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        self.counts.watches.fetch_add(1, Ordering::SeqCst);
        // Subscribed before the initial set is read: no change is lost in between.
        let mut rx = self.live.subscribe();
        let initial: Vec<WatchPodsEvent> = {
            let s = self.state.lock().unwrap();
            if let Some(code) = s.error {
                return Err(Status::new(code, "scripted error"));
            }
            s.pods
                .values()
                .map(|p| event(EventType::Added, p))
                .chain([WatchPodsEvent {
                    r#type: EventType::InitialSyncComplete as i32,
                    pod: Vec::new(),
                }])
                .collect()
        };
        let (tx, out) = tokio::sync::mpsc::channel(256);
        tokio::spawn(async move {
            for e in initial {
                if tx.send(Ok(e)).await.is_err() {
                    return;
                }
            }
            loop {
                match rx.recv().await {
                    Ok(Some(e)) => {
                        if tx.send(Ok(e)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) | Err(_) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    async fn list_pods(
        &self,
        _: Request<api::ListPodsRequest>,
    ) -> Result<Response<api::ListPodsResponse>, Status> {
        self.counts.lists.fetch_add(1, Ordering::SeqCst);
        let s = self.state.lock().unwrap();
        if let Some(code) = s.error {
            return Err(Status::new(code, "scripted error"));
        }
        Ok(Response::new(api::ListPodsResponse {
            pods: s.pods.values().map(encode).collect(),
        }))
    }

    async fn get_pod(
        &self,
        _: Request<api::GetPodRequest>,
    ) -> Result<Response<api::GetPodResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}

fn event(t: EventType, pod: &Value) -> WatchPodsEvent {
    WatchPodsEvent {
        r#type: t as i32,
        pod: encode(pod),
    }
}

fn key(pod: &Value) -> String {
    format!(
        "{}/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
        pod["metadata"]["name"].as_str().unwrap_or_default()
    )
}

fn s(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(s).collect())
        .unwrap_or_default()
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), s(v)?)))
                .collect()
        })
        .unwrap_or_default()
}

fn int(v: &Value) -> Option<i32> {
    v.as_i64().and_then(|n| i32::try_from(n).ok())
}

fn each<T>(v: &Value, f: impl Fn(&Value) -> T) -> Vec<T> {
    v.as_array()
        .map(|a| a.iter().map(f).collect())
        .unwrap_or_default()
}

/// The pod's JSON (API-server form) as the kubelet's bytes: `v1.Pod#Marshal()`.
pub fn encode(pod: &Value) -> Vec<u8> {
    let m = &pod["metadata"];
    let metadata = pbmeta::ObjectMeta {
        name: s(&m["name"]),
        namespace: s(&m["namespace"]),
        uid: s(&m["uid"]),
        resource_version: s(&m["resourceVersion"]),
        deletion_timestamp: m["deletionTimestamp"].as_str().map(|_| pbmeta::Time {
            seconds: Some(1_700_000_000),
            nanos: Some(0),
        }),
        labels: string_map(&m["labels"]),
        annotations: string_map(&m["annotations"]),
        owner_references: each(&m["ownerReferences"], |o| pbmeta::OwnerReference {
            api_version: s(&o["apiVersion"]),
            kind: s(&o["kind"]),
            name: s(&o["name"]),
            uid: s(&o["uid"]),
            controller: o["controller"].as_bool(),
        }),
    };
    let sp = &pod["spec"];
    let spec = sp.is_object().then(|| pb::PodSpec {
        node_name: s(&sp["nodeName"]),
        containers: each(&sp["containers"], |c| pb::Container {
            name: s(&c["name"]),
            image: s(&c["image"]),
            command: strings(&c["command"]),
            args: strings(&c["args"]),
            ports: each(&c["ports"], |p| pb::ContainerPort {
                name: s(&p["name"]),
                host_port: int(&p["hostPort"]),
                container_port: int(&p["containerPort"]),
                protocol: s(&p["protocol"]),
            }),
        }),
    });
    let st = &pod["status"];
    let status = st.is_object().then(|| pb::PodStatus {
        phase: s(&st["phase"]),
        pod_ip: s(&st["podIP"]),
        conditions: each(&st["conditions"], |c| pb::PodCondition {
            r#type: s(&c["type"]),
            status: s(&c["status"]),
        }),
        container_statuses: each(&st["containerStatuses"], |c| pb::ContainerStatus {
            name: s(&c["name"]),
            ready: c["ready"].as_bool(),
            restart_count: int(&c["restartCount"]),
            image: s(&c["image"]),
            image_id: s(&c["imageID"]),
            last_state: c["lastState"].is_object().then(|| pb::ContainerState {
                terminated: c["lastState"]["terminated"].is_object().then(|| {
                    let t = &c["lastState"]["terminated"];
                    pb::ContainerStateTerminated {
                        exit_code: int(&t["exitCode"]),
                        signal: int(&t["signal"]),
                        reason: s(&t["reason"]),
                    }
                }),
            }),
        }),
    });
    pb::Pod {
        metadata: Some(metadata),
        spec,
        status,
    }
    .encode_to_vec()
}

/// The server, serving until dropped.
pub struct KubeletPods {
    /// The socket: `dir/kubelet.sock`.
    pub path: PathBuf,
    pub counts: Arc<Counts>,
    state: Arc<Mutex<State>>,
    live: Live,
    stop: CancellationToken,
}

impl KubeletPods {
    /// Listens on `dir/kubelet.sock` (the directory is created), holding no pods.
    pub async fn start(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let (live, _) = broadcast::channel(1024);
        let counts = Arc::new(Counts::default());
        let stop = CancellationToken::new();
        let svc = PodsServer::new(Service {
            state: state.clone(),
            live: live.clone(),
            counts: counts.clone(),
        });
        let done = stop.clone();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    done.cancelled_owned(),
                )
                .await;
        });
        Self {
            path,
            counts,
            state,
            live,
            stop,
        }
    }

    /// Adds or replaces a pod (JSON as the API server's, e.g. `kube_api::pod`): `ADDED` or
    /// `MODIFIED` on the open watches.
    pub fn apply(&self, pod: Value) {
        let k = key(&pod);
        let t = {
            let mut s = self.state.lock().unwrap();
            let t = if s.pods.contains_key(&k) {
                EventType::Modified
            } else {
                EventType::Added
            };
            s.pods.insert(k, pod.clone());
            t
        };
        let _ = self.live.send(Some(event(t, &pod)));
    }

    /// Removes `namespace/name`: `DELETED` carrying only its name, namespace and uid.
    pub fn delete(&self, ns_name: &str) {
        let Some(pod) = self.state.lock().unwrap().pods.remove(ns_name) else {
            return;
        };
        let m = &pod["metadata"];
        let stub = serde_json::json!({"metadata": {"name": m["name"], "namespace": m["namespace"],
            "uid": m["uid"]}});
        let _ = self.live.send(Some(event(EventType::Deleted, &stub)));
    }

    /// The pod held as `namespace/name`.
    pub fn pod(&self, ns_name: &str) -> Option<Value> {
        self.state.lock().unwrap().pods.get(ns_name).cloned()
    }

    /// While `Some`, every call answers that gRPC code (the open watches are cut).
    pub fn set_error(&self, code: Option<tonic::Code>) {
        self.state.lock().unwrap().error = code;
        if code.is_some() {
            self.drop_watches();
        }
    }

    /// Ends every open `WatchPods` stream (a restarting kubelet).
    pub fn drop_watches(&self) {
        let _ = self.live.send(None);
    }
}

impl Drop for KubeletPods {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.path);
    }
}
