//! Pods of this node through the API server: `kube`'s watcher (list + watch with
//! resourceVersion, bookmarks, a relist on 410 Gone or a dropped watch, backoff on errors) with
//! the field selector `spec.nodeName=<node>` applied by the server, so the agent sees only its
//! node's pods however large the cluster. The API server is found as `kube::Config::infer()`
//! finds it: `KUBECONFIG` (or `~/.kube/config`), else the in-cluster service account.
//!
//! Every event recomputes the desired targets from the pods held (a node holds ≤ 110 pods)
//! and publishes them when they changed; an owner ReplicaSet is read once (cached) to name its
//! Deployment, by the `pod-template-hash` rule when it cannot be read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::TargetChange;
use super::lifecycle::Lifecycle;
use super::pod::{self, PodVerdict};
use super::status::DiscoveryStatus;
use crate::config::TargetConfig;
use crate::config::discovery::{KubernetesDiscovery, TargetTemplate};
use crate::config::k8s::K8sOwner;

/// Owner ReplicaSets remembered at most.
const MAX_REPLICASETS: usize = 1024;

/// What the watch task holds.
struct Watch {
    cfg: KubernetesDiscovery,
    template: TargetTemplate,
    status: Arc<DiscoveryStatus>,
    desired: watch::Sender<Vec<TargetConfig>>,
    changes: mpsc::Sender<TargetChange>,
    client: Client,
    /// The API server's URL (named in every error).
    url: String,
    /// This node's pods, by `namespace/name`.
    pods: BTreeMap<String, Pod>,
    /// `namespace/replicaset` → its Deployment (`None`: a bare ReplicaSet).
    replicasets: BTreeMap<String, Option<String>>,
    /// Pods whose bad annotation was said, with the reason said.
    said_bad: BTreeMap<String, String>,
    /// Per pod (`namespace/name`): its target, or why it was skipped for a bad annotation;
    /// a pod event maps only that pod again.
    mapped: BTreeMap<String, Result<TargetConfig, String>>,
    lifecycle: Lifecycle,
}

/// Runs discovery through the API server until `stop`. Never returns an error: a client that
/// cannot be built, a 403, an unreachable server are said in `status` and retried.
pub async fn run(
    cfg: KubernetesDiscovery,
    template: TargetTemplate,
    status: Arc<DiscoveryStatus>,
    desired: watch::Sender<Vec<TargetConfig>>,
    changes: mpsc::Sender<TargetChange>,
    stop: CancellationToken,
) {
    let mut wait = std::time::Duration::from_secs(1);
    let connected = loop {
        match super::kube_client::connect().await {
            Ok(c) => break c,
            Err(e) => {
                if status.failed(e.clone()) {
                    tracing::warn!(error = %e, "Kubernetes discovery cannot start; retrying.");
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(std::time::Duration::from_secs(30));
    };
    tracing::info!(api_server = %connected.url, from = connected.source, "Kubernetes API server found.");
    let mut w = Watch {
        cfg,
        template,
        status,
        desired,
        changes,
        client: connected.client,
        url: connected.url,
        pods: BTreeMap::new(),
        replicasets: BTreeMap::new(),
        said_bad: BTreeMap::new(),
        mapped: BTreeMap::new(),
        lifecycle: Lifecycle::default(),
    };
    w.run(stop).await;
}

impl Watch {
    async fn run(&mut self, stop: CancellationToken) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let wc =
            watcher::Config::default().fields(&format!("spec.nodeName={}", self.cfg.node_name));
        let mut stream = std::pin::pin!(watcher(api, wc).default_backoff());
        let mut init: Option<BTreeMap<String, Pod>> = None;
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                n = stream.next() => n,
            };
            let Some(item) = next else { return };
            let event = match item {
                Ok(e) => e,
                Err(e) => {
                    let text = format!("{} (API server {})", watch_error(&e), self.url);
                    if self.status.failed(text.clone()) {
                        tracing::warn!(error = %text, "Kubernetes pod watch failed; retrying with backoff.");
                    }
                    continue;
                }
            };
            self.status.event(SystemTime::now());
            match event {
                watcher::Event::Init => init = Some(BTreeMap::new()),
                watcher::Event::InitApply(p) => {
                    if let Some(m) = init.as_mut() {
                        m.insert(key(&p), p);
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(m) = init.take() {
                        self.pods = m;
                    }
                    self.status.listed();
                    self.mapped.clear();
                    let pods: Vec<Pod> = self.pods.values().cloned().collect();
                    for p in &pods {
                        self.map(p).await;
                    }
                    self.publish();
                }
                watcher::Event::Apply(p) => {
                    self.map(&p).await;
                    self.pods.insert(key(&p), p);
                    self.publish();
                }
                watcher::Event::Delete(p) => {
                    let k = key(&p);
                    self.pods.remove(&k);
                    self.mapped.remove(&k);
                    if let Some(uid) = p.metadata.uid.as_deref() {
                        self.lifecycle.forget_pod(uid);
                    }
                    self.publish();
                }
            }
        }
    }

    /// The pod's owner, a ReplicaSet resolved to its Deployment (read once, cached).
    async fn owner(&mut self, p: &Pod) -> Option<K8sOwner> {
        let direct = pod::direct_owner(p)?;
        let K8sOwner::ReplicaSet(rs) = &direct else {
            return Some(direct);
        };
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let k = format!("{ns}/{rs}");
        if let Some(d) = self.replicasets.get(&k) {
            return Some(d.clone().map_or(direct, K8sOwner::Deployment));
        }
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        let deployment = match api.get_opt(rs).await {
            Ok(Some(r)) => r
                .metadata
                .owner_references
                .unwrap_or_default()
                .into_iter()
                .find(|o| o.kind == "Deployment")
                .map(|o| o.name),
            Ok(None) => pod::deployment_by_hash(p, rs),
            Err(e) => {
                tracing::debug!(replicaset = %k, error = %e, "ReplicaSet not readable; its Deployment is named by the pod-template-hash rule.");
                pod::deployment_by_hash(p, rs)
            }
        };
        if self.replicasets.len() >= MAX_REPLICASETS {
            self.replicasets.clear();
        }
        self.replicasets.insert(k, deployment.clone());
        Some(deployment.map_or(direct, K8sOwner::Deployment))
    }

    /// Maps one pod (its target or its bad annotation), feeding the lifecycle.
    async fn map(&mut self, p: &Pod) {
        let name = key(p);
        let owner = self.owner(p).await;
        let verdict = pod::pod_target(p, self.cfg.selector.as_ref(), owner.clone());
        let entry = match verdict {
            PodVerdict::Target(t) => {
                match self.template.target(&format!("pod {name}"), t.raw.clone()) {
                    Ok(mut c) => {
                        self.feed_lifecycle(p, &c.name, &t.identity, owner.as_ref());
                        c.k8s = Some(t.identity);
                        Some(Ok(c))
                    }
                    Err(e) => Some(Err(e.to_string())),
                }
            }
            PodVerdict::Skip(_) => None,
            PodVerdict::Bad(why) => Some(Err(why)),
        };
        match entry {
            Some(Err(why)) => {
                if self.said_bad.get(&name) != Some(&why) {
                    tracing::warn!(pod = %name, reason = %why, "Pod skipped: bad lmperf.dev annotation (said once per pod).");
                    self.said_bad.insert(name.clone(), why.clone());
                }
                self.mapped.insert(name, Err(why));
            }
            Some(Ok(c)) => {
                self.said_bad.remove(&name);
                self.mapped.insert(name, Ok(c));
            }
            None => {
                self.said_bad.remove(&name);
                self.mapped.remove(&name);
            }
        }
    }

    /// Publishes the targets when they changed; the counts for the status.
    fn publish(&mut self) {
        let targets: Vec<TargetConfig> = self
            .mapped
            .values()
            .filter_map(|m| m.as_ref().ok().cloned())
            .collect();
        let bad: BTreeMap<String, String> = self
            .mapped
            .iter()
            .filter_map(|(k, m)| m.as_ref().err().map(|e| (k.clone(), e.clone())))
            .collect();
        self.said_bad.retain(|k, _| bad.contains_key(k));
        self.status.counts(self.pods.len(), targets.len(), bad);
        self.desired.send_if_modified(|cur| {
            if *cur == targets {
                false
            } else {
                *cur = targets;
                true
            }
        });
    }

    fn feed_lifecycle(
        &mut self,
        p: &Pod,
        target: &str,
        id: &crate::config::k8s::K8sIdentity,
        owner: Option<&K8sOwner>,
    ) {
        let Some(container) = id.container_name.as_deref() else {
            return;
        };
        let Some(facts) = pod::container_facts(p, container) else {
            return;
        };
        let owner_key = owner.map(|o| format!("{}/{o:?}", id.namespace));
        for change in self
            .lifecycle
            .observe(&id.pod_uid, owner_key.as_deref(), &facts)
        {
            let c = TargetChange {
                target: target.to_owned(),
                at: SystemTime::now(),
                change,
            };
            if self.changes.try_send(c).is_err() {
                self.status.change_dropped();
            }
        }
    }
}

fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A watch error in one line, naming an RBAC refusal as such.
fn watch_error(e: &watcher::Error) -> String {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.as_ref().clone()),
        watcher::Error::WatchError(s) => Some(s.as_ref().clone()),
        _ => None,
    };
    match status {
        Some(s) if s.code == 403 => format!(
            "403 Forbidden: the agent's ServiceAccount may not list/watch pods (RBAC: a ClusterRole with get/list/watch on pods): {}",
            s.message
        ),
        Some(s) if s.code == 410 => format!("410 Gone (watch expired; relisting): {}", s.message),
        _ => super::kube_client::chain(e),
    }
}
