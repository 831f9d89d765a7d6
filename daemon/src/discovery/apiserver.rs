//! Pods of this node through the API server: `kube`'s watcher (list + watch with
//! resourceVersion, bookmarks, a re-watch on a dropped watch) started over from a fresh list
//! after any error, 410 Gone and 403 included (`super::relist`, backoff between lists), with
//! the field selector `spec.nodeName=<node>` applied by the server, so the agent sees only its
//! node's pods however large the cluster. The API server is found as `kube::Config::infer()`
//! finds it: `KUBECONFIG` (or `~/.kube/config`), else the in-cluster service account.
//!
//! Every event recomputes the desired targets from the pods held (a node holds ≤ 110 pods)
//! and publishes them when they changed; an owner ReplicaSet is read once (cached) to name its
//! Deployment, by the `pod-template-hash` rule when it cannot be read.
//!
//! The same [`Watch`] maps the pods of the kubelet's Pods API (`super::kubelet`): [`Watch::run`]
//! takes the pod events of either source as one stream; without an API server client (the
//! kubelet source) an owner ReplicaSet is named by the `pod-template-hash` rule alone, with no
//! API-server request at all.
//!
//! With `inference_pools = true` a second watcher reads the `InferencePool` objects of every
//! namespace through `kube`'s dynamic API (no generated type); each pool event maps this node's
//! pods again. Its failures (the CRD not installed: 404; RBAC: 403) are said once in the status's
//! `inference_pools` section and retried with backoff; pod discovery goes on meanwhile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::TargetChange;
use super::lifecycle::Lifecycle;
use super::pod::{self, PodVerdict, Skip};
use super::pools::{self, InferencePool};
use super::status::DiscoveryStatus;
use crate::config::TargetConfig;
use crate::config::discovery::{KubernetesDiscovery, TargetTemplate};
use crate::config::k8s::K8sOwner;

/// Owner ReplicaSets remembered at most.
const MAX_REPLICASETS: usize = 1024;

/// What the watch task holds.
pub(super) struct Watch {
    cfg: KubernetesDiscovery,
    template: TargetTemplate,
    status: Arc<DiscoveryStatus>,
    desired: watch::Sender<Vec<TargetConfig>>,
    changes: mpsc::Sender<TargetChange>,
    /// The API server's client; `None` with the kubelet source when none is configured or
    /// needed (no InferencePools).
    client: Option<Client>,
    /// The API server's URL (named in every error), empty without a client.
    url: String,
    /// This node's pods, by `namespace/name`.
    pods: BTreeMap<String, Pod>,
    /// `namespace/replicaset` → its Deployment (`None`: a bare ReplicaSet).
    replicasets: BTreeMap<String, Option<String>>,
    /// Pods whose bad annotation was said, with the reason said.
    said_bad: BTreeMap<String, String>,
    /// Per pod (`namespace/name`) that is or would be a target: its targets, or why it was
    /// skipped; a pod event maps only that pod again, a pool event every pod.
    mapped: BTreeMap<String, Mapped>,
    lifecycle: Lifecycle,
    /// InferencePools by `namespace/name` (empty unless `inference_pools`).
    pools: BTreeMap<String, InferencePool>,
    /// Pools with a bad spec: `namespace/name` → the reason (said once).
    bad_pools: BTreeMap<String, String>,
}

/// What one pod is now.
#[derive(Debug, Default)]
struct Mapped {
    /// One, or one per target port of the pools naming it.
    targets: Vec<TargetConfig>,
    /// Skipped for a bad annotation (or canary value): the sentence.
    bad: Option<String>,
    /// Named by a pool only (not the annotation or the selector).
    by_pool: bool,
}

type PoolEvents = BoxStream<'static, Result<watcher::Event<DynamicObject>, watcher::Error>>;
/// This node's pod events from either source, an error as the sentence the status says.
pub(super) type PodEvents = BoxStream<'static, Result<watcher::Event<Pod>, String>>;
/// A relist of pools in progress: the pools and the bad ones seen so far.
type PoolRelist = (BTreeMap<String, InferencePool>, BTreeMap<String, String>);

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
    let Some(connected) = connect(&status, &stop).await else {
        return;
    };
    let mut w = Watch::new(cfg, template, status, desired, changes, Some(connected));
    w.watch_apiserver(stop).await;
}

/// The API server's client, retried with backoff (each new failure said in `status`) until it
/// can be built; `None` once `stop` fires.
pub(super) async fn connect(
    status: &DiscoveryStatus,
    stop: &CancellationToken,
) -> Option<super::kube_client::Connected> {
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
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(std::time::Duration::from_secs(30));
    };
    tracing::info!(api_server = %connected.url, from = connected.source, "Kubernetes API server found.");
    Some(connected)
}

impl Watch {
    /// A watch holding nothing yet; `connected`: the API server's client, if any.
    pub(super) fn new(
        cfg: KubernetesDiscovery,
        template: TargetTemplate,
        status: Arc<DiscoveryStatus>,
        desired: watch::Sender<Vec<TargetConfig>>,
        changes: mpsc::Sender<TargetChange>,
        connected: Option<super::kube_client::Connected>,
    ) -> Self {
        let (client, url) = match connected {
            Some(c) => (Some(c.client), c.url),
            None => (None, String::new()),
        };
        Self {
            cfg,
            template,
            status,
            desired,
            changes,
            client,
            url,
            pods: BTreeMap::new(),
            replicasets: BTreeMap::new(),
            said_bad: BTreeMap::new(),
            mapped: BTreeMap::new(),
            lifecycle: Lifecycle::default(),
            pools: BTreeMap::new(),
            bad_pools: BTreeMap::new(),
        }
    }

    /// Watches this node's pods through the API server until `stop`, connecting first when
    /// no client is held (a fall-back from the kubelet source). The pods, owners and lifecycle
    /// held so far are kept: the first list replaces the pods, a pod seen before gives no
    /// replayed change.
    pub(super) async fn watch_apiserver(&mut self, stop: CancellationToken) {
        if self.client.is_none() {
            let Some(c) = connect(&self.status, &stop).await else {
                return;
            };
            self.client = Some(c.client);
            self.url = c.url;
        }
        let Some(client) = self.client.clone() else {
            return;
        };
        let api: Api<Pod> = Api::all(client);
        let wc =
            watcher::Config::default().fields(&format!("spec.nodeName={}", self.cfg.node_name));
        let stream = super::relist::pod_events(api, wc, self.url.clone(), watch_error);
        self.run(stop, stream).await;
    }

    /// Maps the pod events of `stream` until it ends or `stop` fires.
    pub(super) async fn run(&mut self, stop: CancellationToken, stream: PodEvents) {
        let mut stream = stream;
        let mut pool_events: PoolEvents = match (&self.client, self.cfg.inference_pools) {
            (Some(client), true) => {
                self.status.pools_on();
                let api: Api<DynamicObject> = Api::all_with(client.clone(), &pools::api_resource());
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .boxed()
            }
            (None, true) => {
                self.status.pools_on();
                self.status.pools_failed(
                    "no Kubernetes API server client (kubeconfig or in-cluster): InferencePools are read from the API server only; pod discovery goes on".to_owned(),
                );
                futures_util::stream::pending().boxed()
            }
            (_, false) => futures_util::stream::pending().boxed(),
        };
        let mut init: Option<BTreeMap<String, Pod>> = None;
        let mut pool_init: Option<PoolRelist> = None;
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                n = stream.next() => n,
                p = pool_events.next() => {
                    match p {
                        Some(item) => self.on_pool(item, &mut pool_init).await,
                        None => pool_events = futures_util::stream::pending().boxed(),
                    }
                    continue;
                }
            };
            let Some(item) = next else { return };
            let event = match item {
                Ok(e) => e,
                Err(text) => {
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
                    if let Some(m) = init.as_mut() {
                        m.remove(&k);
                    }
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

    /// One event of the InferencePool watch: the pools change, every pod is mapped again.
    async fn on_pool(
        &mut self,
        item: Result<watcher::Event<DynamicObject>, watcher::Error>,
        relist: &mut Option<PoolRelist>,
    ) {
        let event = match item {
            Ok(e) => e,
            Err(e) => {
                let text = pool_watch_error(&e);
                if self.status.pools_failed(text.clone()) {
                    tracing::warn!(error = %text, "InferencePool watch failed; pod discovery goes on, pools are retried with backoff.");
                }
                return;
            }
        };
        match event {
            watcher::Event::Init => {
                *relist = Some((BTreeMap::new(), BTreeMap::new()));
                return;
            }
            watcher::Event::InitApply(o) => {
                if let Some((ok, bad)) = relist.as_mut() {
                    let (k, read) = self.read_pool(&o);
                    match read {
                        Ok(p) => {
                            ok.insert(k, p);
                        }
                        Err(why) => {
                            bad.insert(k, why);
                        }
                    }
                }
                return;
            }
            watcher::Event::InitDone => {
                if let Some((ok, bad)) = relist.take() {
                    self.pools = ok;
                    self.bad_pools = bad;
                }
            }
            watcher::Event::Apply(o) => {
                let (k, read) = self.read_pool(&o);
                match read {
                    Ok(p) => {
                        self.bad_pools.remove(&k);
                        self.pools.insert(k, p);
                    }
                    Err(why) => {
                        self.pools.remove(&k);
                        self.bad_pools.insert(k, why);
                    }
                }
            }
            watcher::Event::Delete(o) => {
                let (k, _) = self.read_pool(&o);
                self.pools.remove(&k);
                self.bad_pools.remove(&k);
            }
        }
        self.status.pools_listed();
        self.mapped.clear();
        let pods: Vec<Pod> = self.pods.values().cloned().collect();
        for p in &pods {
            self.map(p).await;
        }
        self.publish();
    }

    /// A pool's key and what it reads as; a bad spec is logged once per pool and reason.
    fn read_pool(&self, o: &DynamicObject) -> (String, Result<InferencePool, String>) {
        let k = format!(
            "{}/{}",
            o.metadata.namespace.as_deref().unwrap_or_default(),
            o.metadata.name.as_deref().unwrap_or_default()
        );
        let read = InferencePool::from_object(o);
        if let Err(why) = &read
            && self.bad_pools.get(&k) != Some(why)
        {
            tracing::warn!(pool = %k, reason = %why, "InferencePool skipped: bad spec (said once per pool).");
        }
        (k, read)
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
        let Some(client) = self.client.clone() else {
            // The kubelet source: no API-server request, the pod-template-hash rule.
            let deployment = pod::deployment_by_hash(p, rs);
            return Some(deployment.map_or(direct, K8sOwner::Deployment));
        };
        let api: Api<ReplicaSet> = Api::namespaced(client, &ns);
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

    /// Maps one pod (its targets or its bad annotation), feeding the lifecycle: the annotation
    /// first, then the selector, then the InferencePools selecting it.
    async fn map(&mut self, p: &Pod) {
        let name = key(p);
        let owner = self.owner(p).await;
        let members: Vec<&InferencePool> = self.pools.values().filter(|pl| pl.selects(p)).collect();
        let (verdicts, by_pool) =
            match pod::pod_target(p, self.cfg.selector.as_ref(), owner.clone()) {
                PodVerdict::Target(mut t) => {
                    t.identity.inference_pool = members.first().map(|m| m.name.clone());
                    (vec![PodVerdict::Target(t)], false)
                }
                PodVerdict::Skip(Skip::NotSelected) if !members.is_empty() => {
                    (pod::pool_targets(p, &members, owner.clone()), true)
                }
                other => (vec![other], false),
            };
        let mut m = Mapped {
            by_pool,
            ..Mapped::default()
        };
        for v in verdicts {
            match v {
                PodVerdict::Target(t) => {
                    match self.template.target(&format!("pod {name}"), t.raw.clone()) {
                        Ok(mut c) => {
                            c.k8s = Some(t.identity);
                            m.targets.push(c);
                        }
                        Err(e) => {
                            m.bad.get_or_insert(e.to_string());
                        }
                    }
                }
                PodVerdict::Skip(_) => {}
                PodVerdict::Bad(why) => {
                    m.bad.get_or_insert(why);
                }
            }
        }
        if m.bad.is_some() {
            m.targets.clear();
        }
        if !m.targets.is_empty() {
            self.feed_lifecycle(p, &m.targets, owner.as_ref());
        }
        match &m.bad {
            Some(why) => {
                if self.said_bad.get(&name) != Some(why) {
                    tracing::warn!(pod = %name, reason = %why, "Pod skipped: bad lmperf.dev annotation (said once per pod).");
                    self.said_bad.insert(name.clone(), why.clone());
                }
            }
            None => {
                self.said_bad.remove(&name);
            }
        }
        if m.bad.is_some() || !m.targets.is_empty() {
            self.mapped.insert(name, m);
        } else {
            self.mapped.remove(&name);
        }
    }

    /// Publishes the targets when they changed; the counts for the status.
    fn publish(&mut self) {
        let targets: Vec<TargetConfig> = self
            .mapped
            .values()
            .flat_map(|m| m.targets.iter().cloned())
            .collect();
        let bad: BTreeMap<String, String> = self
            .mapped
            .iter()
            .filter_map(|(k, m)| m.bad.as_ref().map(|e| (k.clone(), e.clone())))
            .collect();
        self.said_bad.retain(|k, _| bad.contains_key(k));
        self.status.counts(self.pods.len(), targets.len(), bad);
        let by_pool = self
            .mapped
            .values()
            .filter(|m| m.by_pool)
            .map(|m| m.targets.len())
            .sum();
        self.status
            .pools_counts(self.pools.len(), by_pool, &self.bad_pools);
        self.desired.send_if_modified(|cur| {
            if *cur == targets {
                false
            } else {
                *cur = targets;
                true
            }
        });
    }

    /// Feeds the pod's model-server container to the lifecycle; its changes go to each of the
    /// pod's `targets` (several when a pool names several ports).
    fn feed_lifecycle(&mut self, p: &Pod, targets: &[TargetConfig], owner: Option<&K8sOwner>) {
        let Some(id) = targets.first().and_then(|t| t.k8s.clone()) else {
            return;
        };
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
            for t in targets {
                let c = TargetChange {
                    target: t.name.clone(),
                    at: SystemTime::now(),
                    change: change.clone(),
                };
                if self.changes.try_send(c).is_err() {
                    self.status.change_dropped();
                }
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

/// The API server's Status in a watch error, when it sent one.
fn api_status(e: &watcher::Error) -> Option<kube::core::Status> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.as_ref().clone()),
        watcher::Error::WatchError(s) => Some(s.as_ref().clone()),
        _ => None,
    }
}

/// An InferencePool watch error in one line: a missing CRD and an RBAC refusal named as such.
fn pool_watch_error(e: &watcher::Error) -> String {
    let what = format!("{}.{}/{}", pools::PLURAL, pools::GROUP, pools::VERSION);
    match api_status(e) {
        Some(s) if s.code == 404 => format!(
            "404 Not Found: the InferencePool CRD ({what}) is not installed; pools are not read, pod discovery goes on"
        ),
        Some(s) if s.code == 403 => format!(
            "403 Forbidden: the agent's ServiceAccount may not list/watch {what} (RBAC: get/list/watch on inferencepools, the chart's discovery.inferencePools); pod discovery goes on: {}",
            s.message
        ),
        Some(s) if s.code == 410 => format!("410 Gone (watch expired; relisting): {}", s.message),
        _ => e.to_string(),
    }
}

/// A watch error in one line, naming an RBAC refusal as such.
fn watch_error(e: &watcher::Error) -> String {
    match api_status(e) {
        Some(s) if s.code == 403 => format!(
            "403 Forbidden: the agent's ServiceAccount may not list/watch pods (RBAC: a ClusterRole with get/list/watch on pods): {}",
            s.message
        ),
        Some(s) if s.code == 410 => format!("410 Gone (watch expired; relisting): {}", s.message),
        _ => super::kube_client::chain(e),
    }
}
