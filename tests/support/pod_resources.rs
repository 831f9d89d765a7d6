//! A scripted kubelet pod-resources server (`v1.PodResourcesLister`) on a unix socket, built
//! from the same upstream proto as the agent's client (`proto/kubelet/podresources/v1/`,
//! generated into `lmperf::gpu::pod_resources::proto`). The test sets what `List` answers
//! (pods and their devices, an error, or no answer at all) and reads when each call came.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lmperf::gpu::pod_resources::proto::{
    self, pod_resources_lister_server::PodResourcesLister,
    pod_resources_lister_server::PodResourcesListerServer,
};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// One container of a pod and the devices of one resource it holds.
#[derive(Debug, Clone)]
pub struct Held {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
}

impl Held {
    /// `namespace/pod` container `container` holding `ids` of `nvidia.com/gpu`.
    pub fn gpus(namespace: &str, pod: &str, container: &str, ids: &[&str]) -> Self {
        Self::of(namespace, pod, container, "nvidia.com/gpu", ids)
    }

    /// The same for any resource (`nvidia.com/mig-3g.71gb`, `cpu`…).
    pub fn of(namespace: &str, pod: &str, container: &str, resource: &str, ids: &[&str]) -> Self {
        Self {
            namespace: namespace.into(),
            pod: pod.into(),
            container: container.into(),
            resource: resource.into(),
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

/// What `List` answers.
#[derive(Debug, Clone)]
pub enum Answer {
    /// These containers' devices (grouped into pods and containers as the kubelet does).
    Pods(Vec<Held>),
    /// Never answers (a hung kubelet): the call waits until the client gives up.
    Hang,
    /// A gRPC error.
    Error(tonic::Code),
}

#[derive(Debug)]
struct Shared {
    answer: Mutex<Answer>,
    calls: Mutex<Vec<Instant>>,
}

#[derive(Clone)]
struct Service(Arc<Shared>);

#[tonic::async_trait]
impl PodResourcesLister for Service {
    async fn list(
        &self,
        _: Request<proto::ListPodResourcesRequest>,
    ) -> Result<Response<proto::ListPodResourcesResponse>, Status> {
        self.0.calls.lock().unwrap().push(Instant::now());
        let answer = self.0.answer.lock().unwrap().clone();
        match answer {
            Answer::Pods(held) => Ok(Response::new(response(&held))),
            Answer::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Err(Status::deadline_exceeded("hung"))
            }
            Answer::Error(code) => Err(Status::new(code, "scripted error")),
        }
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<proto::AllocatableResourcesRequest>,
    ) -> Result<Response<proto::AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn get(
        &self,
        _: Request<proto::GetPodResourcesRequest>,
    ) -> Result<Response<proto::GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}

/// The kubelet's message for `held`: one `PodResources` per pod, one `ContainerResources` per
/// container, in first-seen order.
fn response(held: &[Held]) -> proto::ListPodResourcesResponse {
    let mut pods: Vec<proto::PodResources> = Vec::new();
    for h in held {
        let pi = match pods
            .iter()
            .position(|p| p.namespace == h.namespace && p.name == h.pod)
        {
            Some(i) => i,
            None => {
                pods.push(proto::PodResources {
                    name: h.pod.clone(),
                    namespace: h.namespace.clone(),
                    containers: Vec::new(),
                });
                pods.len() - 1
            }
        };
        let containers = &mut pods[pi].containers;
        let ci = match containers.iter().position(|c| c.name == h.container) {
            Some(i) => i,
            None => {
                containers.push(proto::ContainerResources {
                    name: h.container.clone(),
                    ..Default::default()
                });
                containers.len() - 1
            }
        };
        if !h.resource.is_empty() {
            containers[ci].devices.push(proto::ContainerDevices {
                resource_name: h.resource.clone(),
                device_ids: h.device_ids.clone(),
                topology: None,
            });
        }
    }
    proto::ListPodResourcesResponse {
        pod_resources: pods,
    }
}

/// The server, serving until dropped.
pub struct PodResourcesServer {
    pub path: PathBuf,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl PodResourcesServer {
    /// Listens on `dir/kubelet.sock` (the directory is created), answering `answer`.
    pub async fn start(dir: &Path, answer: Answer) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let shared = Arc::new(Shared {
            answer: Mutex::new(answer),
            calls: Mutex::default(),
        });
        let stop = CancellationToken::new();
        let svc = PodResourcesListerServer::new(Service(shared.clone()));
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
        Self { path, shared, stop }
    }

    /// Answers `answer` from the next call on.
    pub fn set(&self, answer: Answer) {
        *self.shared.answer.lock().unwrap() = answer;
    }

    /// When each `List` came, in order.
    pub fn calls(&self) -> Vec<Instant> {
        self.shared.calls.lock().unwrap().clone()
    }
}

impl Drop for PodResourcesServer {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.path);
    }
}
