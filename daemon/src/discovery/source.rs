//! Which pod source runs, and why: `source = apiserver` watches the API server; `kubelet`
//! reads the kubelet's Pods API only (its errors retried, said in the status); `auto` reads the
//! Pods API when its socket answers at start and the API server otherwise, and falls back to
//! the API server later if the kubelet refuses the API (`Unimplemented`, `PermissionDenied`).
//! The status's `source` and `source_reason` say which runs and why; the pods, owners and
//! lifecycle held carry over a fall-back (no target restarts, no change replayed).

use std::sync::Arc;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::TargetChange;
use super::apiserver::{self, Watch};
use super::kubelet;
use super::status::DiscoveryStatus;
use crate::config::TargetConfig;
use crate::config::discovery::{KubernetesDiscovery, PodSource, TargetTemplate};

/// The status's source and reason before anything was tried: `(source, reason)`.
pub fn initial(cfg: &KubernetesDiscovery) -> (&'static str, String) {
    let socket = kubelet::socket_path(&cfg.kubelet_pods_api_dir);
    match cfg.source {
        PodSource::ApiServer => (
            "apiserver",
            "source = apiserver: the API server is watched with a spec.nodeName field selector"
                .to_owned(),
        ),
        PodSource::Kubelet => (
            "kubelet",
            format!(
                "source = kubelet: the kubelet Pods API (KEP-4188) at {}",
                socket.display()
            ),
        ),
        PodSource::Auto => (
            "starting",
            format!(
                "source = auto: trying the kubelet Pods API at {} first",
                socket.display()
            ),
        ),
    }
}

/// Runs discovery from the configured source until `stop`.
pub async fn run(
    cfg: KubernetesDiscovery,
    template: TargetTemplate,
    status: Arc<DiscoveryStatus>,
    desired: watch::Sender<Vec<TargetConfig>>,
    changes: mpsc::Sender<TargetChange>,
    stop: CancellationToken,
) {
    let socket = kubelet::socket_path(&cfg.kubelet_pods_api_dir);
    let first = match cfg.source {
        PodSource::ApiServer => {
            return apiserver::run(cfg, template, status, desired, changes, stop).await;
        }
        PodSource::Kubelet => None,
        PodSource::Auto => match kubelet::open(&socket).await {
            Ok(o) => Some(o),
            Err(e) => {
                let reason = format!(
                    "source = auto: the kubelet Pods API at {} did not answer: {e}; the API server is watched with a spec.nodeName field selector",
                    socket.display()
                );
                tracing::info!(reason = %reason, "Kubernetes discovery: API server source.");
                status.set_source("apiserver", reason);
                return apiserver::run(cfg, template, status, desired, changes, stop).await;
            }
        },
    };
    if first.is_some() {
        status.set_source(
            "kubelet",
            format!(
                "source = auto: the kubelet Pods API (KEP-4188) answers at {}; no API-server watch",
                socket.display()
            ),
        );
    }
    tracing::info!(socket = %socket.display(), "Kubernetes discovery: kubelet Pods API source.");
    // The API server only for InferencePools (owners: the pod-template-hash rule).
    let connected = if cfg.inference_pools {
        super::kube_client::connect().await.ok()
    } else {
        None
    };
    let auto = cfg.source == PodSource::Auto;
    let mut w = Watch::new(cfg, template, status.clone(), desired, changes, connected);
    let (tx, rx) = mpsc::channel(kubelet::EVENT_QUEUE);
    let feed = tokio::spawn(kubelet::events(first, socket, auto, tx, stop.clone()));
    w.run(
        stop.clone(),
        tokio_stream::wrappers::ReceiverStream::new(rx).boxed(),
    )
    .await;
    // The stream ended: stopped, or `auto` fell back.
    let fall_back = feed.await.ok().flatten();
    if let Some(kubelet::FallBack(reason)) = fall_back
        && !stop.is_cancelled()
    {
        tracing::warn!(reason = %reason, "Kubernetes discovery: falling back to the API server.");
        status.set_source("apiserver", reason);
        w.watch_apiserver(stop).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(source: PodSource) -> KubernetesDiscovery {
        KubernetesDiscovery {
            enabled: true,
            node_name: "n1".into(),
            selector: None,
            inference_pools: false,
            source,
            kubelet_pods_api_dir: "/run/pods-api".into(),
        }
    }

    #[test]
    fn the_status_says_which_source_and_why_before_trying() {
        let (s, why) = initial(&cfg(PodSource::ApiServer));
        assert_eq!(s, "apiserver");
        assert!(why.contains("spec.nodeName"), "{why}");
        let (s, why) = initial(&cfg(PodSource::Kubelet));
        assert_eq!(s, "kubelet");
        assert!(why.contains("/run/pods-api/kubelet.sock"), "{why}");
        let (s, why) = initial(&cfg(PodSource::Auto));
        assert_eq!(s, "starting");
        assert!(why.contains("trying the kubelet Pods API"), "{why}");
    }

    /// `auto` without a socket watches the API server: it says so once the socket failed.
    #[tokio::test]
    async fn auto_without_a_socket_says_why_it_watches_the_api_server() {
        let dir = std::env::temp_dir().join(format!("lmperf-src-{}", std::process::id()));
        let mut c = cfg(PodSource::Auto);
        c.kubelet_pods_api_dir = dir.clone();
        let status = Arc::new(DiscoveryStatus::new("starting", String::new(), "n1", None));
        let (desired, _rx) = watch::channel(Vec::new());
        let (changes, _crx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let template = crate::config::discovery::TargetTemplate::new(
            crate::config::raw::RawCanary::default(),
            &NoEnv,
        )
        .unwrap();
        let task = tokio::spawn(run(
            c,
            template,
            status.clone(),
            desired,
            changes,
            stop.clone(),
        ));
        let t = std::time::Instant::now();
        while status.view().source != "apiserver" && t.elapsed().as_secs() < 10 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        stop.cancel();
        let _ = task.await;
        let v = status.view();
        assert_eq!(v.source, "apiserver");
        assert!(
            v.source_reason.contains("does not exist") && v.source_reason.contains("source = auto"),
            "{}",
            v.source_reason
        );
    }

    /// `kubelet` without a socket: the status says failing with the reason, the source stays
    /// the kubelet (retried with backoff, never the API server).
    #[tokio::test]
    async fn kubelet_without_a_socket_is_failing_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("lmperf-src-k-{}", std::process::id()));
        let mut c = cfg(PodSource::Kubelet);
        c.kubelet_pods_api_dir = dir.clone();
        let (source, reason) = initial(&c);
        let status = Arc::new(DiscoveryStatus::new(source, reason, "n1", None));
        let (desired, _rx) = watch::channel(Vec::new());
        let (changes, _crx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let template = crate::config::discovery::TargetTemplate::new(
            crate::config::raw::RawCanary::default(),
            &NoEnv,
        )
        .unwrap();
        let task = tokio::spawn(run(
            c,
            template,
            status.clone(),
            desired,
            changes,
            stop.clone(),
        ));
        let t = std::time::Instant::now();
        while status.view().error.is_none() && t.elapsed().as_secs() < 10 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        stop.cancel();
        let _ = task.await;
        let v = serde_json::to_value(status.view()).unwrap();
        assert_eq!(v["source"], "kubelet", "{v}");
        assert_eq!(v["state"], "failing", "{v}");
        let e = v["error"].as_str().unwrap_or_default();
        assert!(
            e.contains("kubelet Pods API") && e.contains("does not exist"),
            "{e}"
        );
    }

    struct NoEnv;
    impl crate::config::Env for NoEnv {
        fn var(&self, _: &str) -> Option<String> {
            None
        }
    }
}
