//! Target discovery: the model-server pods of this node become targets at run time.
//!
//! `selector` (label selectors, pure), `pod` (pod → target, pure), `pools` (InferencePools,
//! pure), `lifecycle` (restarts and rollouts as server changes, pure), `apiserver` (the `kube`
//! watchers of this node's pods and of the InferencePools, and the mapping both sources feed),
//! `relist` (the pod watch started over from a list after each error),
//! `kubelet` (the kubelet's node-local Pods API, KEP-4188), `kubelet_pod` (its messages and
//! pod bytes decoded, pure), `source` (which source runs and why, the fall-back), `kube_client`
//! (the API client, found as `kube::Config::infer()` does, errors naming it), `status` (the
//! `/api/v1/status` section). [`start`] runs the configured source; it publishes
//! whole desired-target snapshots on a watch channel (the agent's `targets::TargetSet`
//! reconciles them with the static targets) and lifecycle changes on a bounded queue.

pub mod apiserver;
pub mod kube_client;
pub mod kubelet;
pub mod kubelet_pod;
pub mod lifecycle;
pub mod pod;
pub mod pools;
mod relist;
pub use crate::config::selector;
pub mod source;
pub mod status;

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::TargetConfig;
use crate::config::discovery::DiscoveryConfig;
use crate::server::Change;
pub use status::{DiscoveryStatus, DiscoveryView};

/// Where the kubelet's node-local Pods API socket is by default (KEP-4188).
pub use crate::config::discovery::DEFAULT_KUBELET_PODS_API_DIR as KUBELET_PODS_API_DIR;
/// Lifecycle changes queued for the agent at most (more are dropped and counted).
pub const CHANGE_QUEUE: usize = 256;

/// A server change of a discovered target seen in its pod (restart, rollout).
#[derive(Debug, Clone, PartialEq)]
pub struct TargetChange {
    pub target: String,
    pub at: SystemTime,
    pub change: Change,
}

/// The running discovery: its status, the desired targets, the lifecycle changes.
#[derive(Debug)]
pub struct Running {
    pub status: Arc<DiscoveryStatus>,
    pub desired: watch::Receiver<Vec<TargetConfig>>,
    pub changes: mpsc::Receiver<TargetChange>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts the configured discovery on the current runtime, `None` when it is off.
pub fn start(cfg: &DiscoveryConfig, stop: CancellationToken) -> Option<Running> {
    let k = &cfg.kubernetes;
    if !k.enabled {
        return None;
    }
    let (source, reason) = source::initial(k);
    tracing::info!(node = %k.node_name, source, reason = %reason, "Kubernetes discovery on.");
    let status = Arc::new(DiscoveryStatus::new(
        source,
        reason,
        &k.node_name,
        k.selector.as_ref().map(|s| s.text.clone()),
    ));
    let (desired_tx, desired) = watch::channel(Vec::new());
    let (changes_tx, changes) = mpsc::channel(CHANGE_QUEUE);
    let task = tokio::spawn(source::run(
        k.clone(),
        cfg.template.clone(),
        status.clone(),
        desired_tx,
        changes_tx,
        stop,
    ));
    Some(Running {
        status,
        desired,
        changes,
        task,
    })
}
