//! Direct paths (issue 52.1): a router target's workers each get low-rate canaries of the
//! target's own shape (api, model, prompts, `max_tokens`) sent straight to them, not through
//! the router, so that the routed canaries can be compared with them over the same window
//! (`status::path`, `lmperf_path_overhead_seconds`). The workers are the target's
//! `direct_workers`, else the discovered pods of its `direct_pool` InferencePool (looked up in
//! the agent's targets before each send), else the router's own list (`GET /list_workers`, read again every
//! [`LIST_EVERY`]), else the workers the routed replies named by URL (SGLang's gateway's
//! `x-smg-routed-worker-id`); a list that cannot be read is said in the status and the workers
//! known are kept. Each worker gets one canary per `direct_interval`, the workers' sends spread evenly
//! over it. A direct canary goes the canary's path (`TargetRunner::measure` with
//! `Source::Direct`), is not one of the target's canaries (no canary counts, no diagnosis
//! sample) and carries its worker on its span.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::TargetRunner;
use crate::config::TargetKind;
use crate::config::direct_paths::base_url;
use crate::status::Source;
use crate::status::path::WorkersFrom;

/// How often the router's own worker list is read again.
pub const LIST_EVERY: Duration = Duration::from_secs(30);

/// Why the router's worker list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("GET {url}: {source}")]
    Request { url: String, source: reqwest::Error },
    #[error("GET {url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("GET {url}: {source}")]
    Body {
        url: String,
        source: lmperf_server_page::router_list::ListWorkersError,
    },
}

/// The router's own list of its workers (`GET <target>/list_workers`).
///
/// # Errors
/// The request fails, answers other than 2xx, or its body is not a list of http(s) URLs.
pub async fn list_workers(runner: &TargetRunner) -> Result<Vec<String>, ListError> {
    list_workers_of(&runner.clients, &runner.target).await
}

/// [`list_workers`] of router target `t` through `clients` (`lmperf run --target-kind router`
/// asks it too).
///
/// # Errors
/// As [`list_workers`].
pub async fn list_workers_of(
    clients: &crate::canary::client::Clients,
    t: &crate::config::TargetConfig,
) -> Result<Vec<String>, ListError> {
    let url = t
        .base_url
        .join("list_workers")
        .map_or_else(|_| format!("{}list_workers", t.base_url), |u| u.to_string());
    let resp = clients
        .send_idempotent(|c| {
            let req = c.get(&url).timeout(t.timeout.min(Duration::from_secs(10)));
            match &t.api_key {
                Some(key) => req.bearer_auth(key.expose()),
                None => req,
            }
        })
        .await
        .map_err(|source| ListError::Request {
            url: url.clone(),
            source,
        })?;
    let status = resp.status().as_u16();
    if !resp.status().is_success() {
        return Err(ListError::Status { url, status });
    }
    let body = resp.bytes().await.map_err(|source| ListError::Request {
        url: url.clone(),
        source,
    })?;
    lmperf_server_page::router_list::list_workers(&body)
        .map_err(|source| ListError::Body { url, source })
}

/// `runner` aimed at `worker` (a base URL): the target's shape and name, a plain model server
/// (no router fields asked, no probes, no direct paths of its own). `None` when the URL does
/// not parse or has no host or port.
fn aimed_at(runner: &TargetRunner, worker: &str) -> Option<TargetRunner> {
    let mut r = runner.clone();
    r.target = Arc::new(aimed_target(&runner.target, worker)?);
    Some(r)
}

/// Router target `target` aimed at `worker` (a base URL), as [`aimed_at`] says.
pub fn aimed_target(
    target: &crate::config::TargetConfig,
    worker: &str,
) -> Option<crate::config::TargetConfig> {
    let u = base_url(url::Url::parse(worker).ok()?);
    let mut t = target.clone();
    t.host = u
        .host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    t.port = u.port_or_known_default()?;
    t.base_url = u;
    t.kind = TargetKind::Server;
    t.worker_probes.enabled = false;
    t.direct.enabled = false;
    Some(t)
}

/// The base URLs of the targets among `targets` that are pods of `pool` (their
/// `k8s.inferencepool.name` and `k8s.namespace.name`), sorted.
pub fn pool_workers(
    targets: &[Arc<crate::status::TargetState>],
    pool: &crate::config::direct_paths::PoolRef,
) -> Vec<String> {
    use crate::telemetry::names::{K8S_INFERENCEPOOL_NAME, K8S_NAMESPACE_NAME};
    let mut urls: Vec<String> = targets
        .iter()
        .filter(|t| {
            t.k8s.get(K8S_INFERENCEPOOL_NAME) == Some(&pool.name)
                && t.k8s.get(K8S_NAMESPACE_NAME) == Some(&pool.namespace)
        })
        .map(|t| t.url.clone())
        .collect();
    urls.sort();
    urls.dedup();
    urls
}

/// Runs `runner`'s direct canaries until `stop` (none unless its state holds a
/// [`crate::status::path::DirectPathState`]); each canary is spawned on `tracker` and cancelled
/// by `cancel`.
pub async fn run(
    runner: TargetRunner,
    stop: CancellationToken,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    let Some(path) = runner.state.path.as_ref() else {
        return;
    };
    let configured: Vec<String> = runner
        .target
        .direct
        .workers
        .iter()
        .map(|u| u.to_string())
        .collect();
    if !configured.is_empty() {
        path.set_workers(WorkersFrom::Config, &configured);
    }
    let name = runner.target.name.clone();
    let mut aimed: HashMap<String, TargetRunner> = HashMap::new();
    let mut listed_at: Option<tokio::time::Instant> = None;
    // Whether the router's last list named workers; else the replies' workers are used.
    let mut router_lists = false;
    let (mut seq, mut turn) = (0u64, 0usize);
    loop {
        if configured.is_empty()
            && runner.target.direct.pool.is_none()
            && listed_at.is_none_or(|t| t.elapsed() >= LIST_EVERY)
        {
            listed_at = Some(tokio::time::Instant::now());
            match list_workers(&runner).await {
                Ok(urls) if !urls.is_empty() => {
                    router_lists = true;
                    path.set_workers(WorkersFrom::Router, &urls);
                }
                Ok(_) => {
                    router_lists = false;
                    path.set_list_error("the router lists no worker".to_owned());
                }
                Err(e) => {
                    router_lists = false;
                    tracing::debug!(target_name = %name, error = %e, "Router's worker list not read; direct canaries keep the workers known.");
                    path.set_list_error(e.to_string());
                }
            }
        }
        if let (true, Some(pool), Some(peers)) = (
            configured.is_empty(),
            &runner.target.direct.pool,
            &runner.peers,
        ) {
            let pods = pool_workers(&peers.snapshot(), pool);
            if pods != path.workers() || path.workers_from() != Some(WorkersFrom::Pool) {
                path.set_workers(WorkersFrom::Pool, &pods);
            }
        } else if configured.is_empty() && !router_lists {
            let replied = path.replied_workers();
            if !replied.is_empty() && replied != path.workers() {
                path.set_workers_keeping_error(WorkersFrom::Replies, &replied);
            }
        }
        let workers = path.workers();
        let gap = match u32::try_from(workers.len()) {
            Ok(n) if n > 0 => path.interval / n,
            _ => Duration::from_secs(1),
        };
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(gap) => {}
        }
        let Some(worker) = workers.get(turn % workers.len().max(1)) else {
            continue;
        };
        turn = turn.wrapping_add(1);
        if !aimed.contains_key(worker) {
            match aimed_at(&runner, worker) {
                Some(r) => {
                    aimed.insert(worker.clone(), r);
                }
                None => {
                    path.set_list_error(format!("worker {worker:?} is not a URL with a host"));
                    continue;
                }
            }
        }
        let Some(r) = aimed.get(worker).cloned() else {
            continue;
        };
        seq += 1;
        let (c, source) = (cancel.clone(), Source::Direct(Arc::from(worker.as_str())));
        tracker.spawn(crate::cost::metered(&crate::cost::CANARY, async move {
            r.measure(seq, &c, &source).await;
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::direct_paths::PoolRef;
    use crate::config::k8s::K8sIdentity;
    use crate::status::TargetState;

    /// A target at `url`, a pod of `pool` in `namespace` when given.
    fn state(url: &str, namespace: &str, pool: Option<&str>) -> Arc<TargetState> {
        let cfg = crate::config::load(
            crate::config::Overrides {
                targets: vec![url.into()],
                ..Default::default()
            },
            &crate::config::ProcessEnv,
        )
        .unwrap();
        let mut t = cfg.targets[0].clone();
        t.k8s = Some(K8sIdentity {
            namespace: namespace.into(),
            pod_name: "p".into(),
            pod_uid: String::new(),
            container_name: None,
            owner: None,
            inference_pool: pool.map(str::to_owned),
        });
        Arc::new(TargetState::new(&t))
    }

    /// The pool's pods in its namespace, sorted; another pool's, another namespace's and a pod
    /// of none are not its workers.
    #[test]
    fn a_pools_workers_are_its_pods_in_its_namespace() {
        let targets = [
            state("http://10.0.0.9:8000", "llm-d", Some("pool")),
            state("http://10.0.0.7:8000", "llm-d", Some("pool")),
            state("http://10.0.0.8:8000", "llm-d", Some("other")),
            state("http://10.0.0.6:8000", "team-b", Some("pool")),
            state("http://10.0.0.5:8000", "llm-d", None),
        ];
        let pool = PoolRef {
            namespace: "llm-d".into(),
            name: "pool".into(),
        };
        assert_eq!(
            pool_workers(&targets, &pool),
            ["http://10.0.0.7:8000/", "http://10.0.0.9:8000/"]
        );
    }
}
