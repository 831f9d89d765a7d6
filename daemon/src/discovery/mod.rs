//! Target discovery: the model-server pods of this node become targets at run time.
//!
//! `selector` (label selectors, pure), `pod` (pod → target, pure), `pools` (InferencePools,
//! pure), `lifecycle` (restarts and rollouts as server changes, pure), `apiserver` (the `kube`
//! watchers of this node's pods and of the InferencePools), `kube_client` (the API client,
//! found as `kube::Config::infer()` does, errors naming it), `status` (the `/api/v1/status`
//! section). [`start`] runs the configured source; it publishes
//! whole desired-target snapshots on a watch channel (the agent's `targets::TargetSet`
//! reconciles them with the static targets) and lifecycle changes on a bounded queue.

pub mod apiserver;
pub mod kube_client;
pub mod lifecycle;
pub mod pod;
pub mod pools;
pub use crate::config::selector;
pub mod status;

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::TargetConfig;
use crate::config::discovery::{DiscoveryConfig, PodSource};
use crate::server::Change;
pub use status::{DiscoveryStatus, DiscoveryView};

/// Where the kubelet's node-local Pods API socket would be (KEP-4188).
pub const KUBELET_PODS_API_DIR: &str = "/var/lib/kubelet/pods-api";
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

/// Which source runs for `source`, and why.
pub fn choose_source(source: PodSource, kubelet_dir: &Path) -> (&'static str, String) {
    let present = kubelet_dir.exists();
    let why_not = "the kubelet Pods API (KEP-4188: v1alpha1.Pods/WatchPods, beta in Kubernetes 1.37, proto published in kubernetes/kubelet pkg/apis/pods/v1alpha1) is not read by this build yet";
    match source {
        PodSource::ApiServer => ("apiserver", "source = apiserver".to_owned()),
        PodSource::Auto if present => (
            "apiserver",
            format!(
                "source = auto: {} is present but {why_not}; the API server is watched with a spec.nodeName field selector",
                kubelet_dir.display()
            ),
        ),
        PodSource::Auto => (
            "apiserver",
            format!(
                "source = auto: no kubelet Pods API socket under {}; the API server is watched with a spec.nodeName field selector",
                kubelet_dir.display()
            ),
        ),
        PodSource::Kubelet => (
            "apiserver",
            format!("source = kubelet asked, but {why_not}; the API server is watched instead"),
        ),
    }
}

/// Starts the configured discovery on the current runtime, `None` when it is off.
pub fn start(cfg: &DiscoveryConfig, stop: CancellationToken) -> Option<Running> {
    let k = &cfg.kubernetes;
    if !k.enabled {
        return None;
    }
    let (source, reason) = choose_source(k.source, Path::new(KUBELET_PODS_API_DIR));
    tracing::info!(node = %k.node_name, source, reason = %reason, "Kubernetes discovery on.");
    let status = Arc::new(DiscoveryStatus::new(
        source,
        reason,
        &k.node_name,
        k.selector.as_ref().map(|s| s.text.clone()),
    ));
    let (desired_tx, desired) = watch::channel(Vec::new());
    let (changes_tx, changes) = mpsc::channel(CHANGE_QUEUE);
    let task = tokio::spawn(apiserver::run(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_says_which_source_and_why() {
        let none = Path::new("/nonexistent/pods-api");
        let (s, why) = choose_source(PodSource::Auto, none);
        assert_eq!(s, "apiserver");
        assert!(why.contains("no kubelet Pods API socket"), "{why}");
        let dir = std::env::temp_dir();
        let (s, why) = choose_source(PodSource::Kubelet, &dir);
        assert_eq!(s, "apiserver");
        assert!(why.contains("KEP-4188"), "{why}");
    }
}
