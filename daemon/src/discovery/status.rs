//! What discovery says in `/api/v1/status`: which source runs and why, whether its watch is
//! healthy (the last error: an expired watch, an RBAC 403, an unreachable API server), the
//! pods it sees, and the pods skipped for a bad annotation (said once per pod); where
//! `inference_pools = true`, the InferencePool watch's own health (a missing CRD or a 403 is
//! said there and stops nothing else).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Serialize;

/// Pods with a bad annotation listed at most (the count goes on).
pub const MAX_BAD_LISTED: usize = 64;

/// The watch's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Not listed yet.
    Starting,
    /// Listed, watching.
    Watching,
    /// The last list or watch failed (`error` says why); retried with backoff.
    Failing,
}

/// `/api/v1/status` `discovery` section.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DiscoveryView {
    /// `kubernetes`.
    pub kind: &'static str,
    /// `apiserver` | `kubelet`: the source running now (`starting` while `source = auto`
    /// tries the kubelet's Pods API first).
    pub source: &'static str,
    /// Why this source runs (e.g. no kubelet Pods API socket, or its error in `auto`).
    pub source_reason: String,
    pub node: String,
    pub selector: Option<String>,
    /// `state`: starting | watching | failing. A failing discovery leaves `/readyz` ready
    /// (the static targets and the targets already found go on; a DaemonSet rollout must not
    /// stall on an API server outage): this field and `error` say it.
    #[serde(rename = "state")]
    pub mode: Mode,
    /// Why it is failing (naming the API server), while failing (kept until the next success).
    pub error: Option<String>,
    /// Errors since start (each retried).
    pub errors: u64,
    /// Full lists done (the first, and each relist after a 410 Gone or a dropped watch).
    pub lists: u64,
    /// Pods of this node seen now.
    pub pods: usize,
    /// Of those, targets now.
    pub targets: usize,
    /// Pods selected but skipped for a bad annotation: `namespace/pod` → the reason.
    pub bad_pods: BTreeMap<String, String>,
    /// Lifecycle changes dropped because the agent's queue was full.
    pub changes_dropped: u64,
    /// Unix time of the last event handled, seconds.
    pub last_event_unix_s: Option<f64>,
    /// The InferencePool watch; absent unless `inference_pools = true`.
    pub inference_pools: Option<PoolsView>,
}

/// `discovery.inference_pools`: the InferencePool watch (all namespaces).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PoolsView {
    /// `state`: starting | watching | failing, as the pod watch's.
    #[serde(rename = "state")]
    pub mode: Mode,
    /// Why pools are not read now (the CRD is not installed: 404; RBAC: 403), kept until a
    /// list succeeds; pod discovery goes on meanwhile.
    pub error: Option<String>,
    /// Errors since start (each retried with backoff).
    pub errors: u64,
    /// Pools seen now.
    pub pools: usize,
    /// Targets that only a pool names (not the annotation or the selector).
    pub targets: usize,
    /// Pools skipped for a bad spec: `namespace/name` → the reason.
    pub bad_pools: BTreeMap<String, String>,
}

/// Shared, updated by the discovery task.
#[derive(Debug)]
pub struct DiscoveryStatus {
    inner: Mutex<DiscoveryView>,
}

impl DiscoveryStatus {
    pub fn new(
        source: &'static str,
        source_reason: String,
        node: &str,
        selector: Option<String>,
    ) -> Self {
        Self {
            inner: Mutex::new(DiscoveryView {
                kind: "kubernetes",
                source,
                source_reason,
                node: node.to_owned(),
                selector,
                mode: Mode::Starting,
                error: None,
                errors: 0,
                lists: 0,
                pods: 0,
                targets: 0,
                bad_pods: BTreeMap::new(),
                changes_dropped: 0,
                last_event_unix_s: None,
                inference_pools: None,
            }),
        }
    }

    fn with(&self, f: impl FnOnce(&mut DiscoveryView)) {
        match self.inner.lock() {
            Ok(mut g) => f(&mut g),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    pub fn view(&self) -> DiscoveryView {
        match self.inner.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The source runs now and why (the kubelet's Pods API, or the API server after the
    /// kubelet's did not answer in `source = auto`).
    pub fn set_source(&self, source: &'static str, reason: String) {
        self.with(|v| {
            v.source = source;
            v.source_reason = reason;
        });
    }

    /// A list or watch failed; returns true when the error is new (log it then).
    pub fn failed(&self, error: String) -> bool {
        let mut new = false;
        self.with(|v| {
            v.errors += 1;
            new = v.mode != Mode::Failing || v.error.as_deref() != Some(error.as_str());
            v.mode = Mode::Failing;
            v.error = Some(error);
        });
        new
    }

    /// A full list completed.
    pub fn listed(&self) {
        self.with(|v| {
            v.lists += 1;
            v.mode = Mode::Watching;
            v.error = None;
        });
    }

    /// An event arrived (the watch works).
    pub fn event(&self, at: SystemTime) {
        self.with(|v| {
            if v.mode == Mode::Failing && v.lists > 0 {
                v.mode = Mode::Watching;
                v.error = None;
            }
            v.last_event_unix_s = at
                .duration_since(SystemTime::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs_f64());
        });
    }

    /// The counts after a recomputation, and the pods skipped for a bad annotation now.
    pub fn counts(&self, pods: usize, targets: usize, bad: BTreeMap<String, String>) {
        self.with(|v| {
            v.pods = pods;
            v.targets = targets;
            v.bad_pods = bad.into_iter().take(MAX_BAD_LISTED).collect();
        });
    }

    /// Turns the InferencePool section on (`inference_pools = true`).
    pub fn pools_on(&self) {
        self.with(|v| {
            v.inference_pools = Some(PoolsView {
                mode: Mode::Starting,
                error: None,
                errors: 0,
                pools: 0,
                targets: 0,
                bad_pools: BTreeMap::new(),
            });
        });
    }

    fn with_pools(&self, f: impl FnOnce(&mut PoolsView)) {
        self.with(|v| {
            if let Some(p) = v.inference_pools.as_mut() {
                f(p);
            }
        });
    }

    /// The pool list or watch failed; true when the error is new (log it then).
    pub fn pools_failed(&self, error: String) -> bool {
        let mut new = false;
        self.with_pools(|p| {
            p.errors += 1;
            new = p.mode != Mode::Failing || p.error.as_deref() != Some(error.as_str());
            p.mode = Mode::Failing;
            p.error = Some(error);
        });
        new
    }

    /// The pools were listed (or an event came: the watch works).
    pub fn pools_listed(&self) {
        self.with_pools(|p| {
            p.mode = Mode::Watching;
            p.error = None;
        });
    }

    /// The pools held now, the targets only they name, the pools with a bad spec.
    pub fn pools_counts(&self, pools: usize, targets: usize, bad: &BTreeMap<String, String>) {
        self.with_pools(|p| {
            p.pools = pools;
            p.targets = targets;
            p.bad_pools = bad
                .iter()
                .take(MAX_BAD_LISTED)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
        });
    }

    pub fn change_dropped(&self) {
        self.with(|v| v.changes_dropped += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_says_failing_with_the_reason_until_a_list_succeeds() {
        let s = DiscoveryStatus::new("apiserver", "test".into(), "node-1", None);
        let state = |s: &DiscoveryStatus| serde_json::to_value(s.view()).unwrap_or_default();
        assert_eq!(state(&s)["state"], "starting");
        assert!(s.failed("403 Forbidden (API server http://127.0.0.1:1/)".into()));
        assert!(
            !s.failed("403 Forbidden (API server http://127.0.0.1:1/)".into()),
            "said once"
        );
        let v = state(&s);
        assert_eq!(v["state"], "failing");
        assert_eq!(v["error"], "403 Forbidden (API server http://127.0.0.1:1/)");
        assert_eq!(v["errors"], 2);
        s.event(SystemTime::now());
        assert_eq!(state(&s)["state"], "failing", "no list yet: still failing");
        s.listed();
        let v = state(&s);
        assert_eq!(
            (v["state"].as_str(), v["error"].is_null()),
            (Some("watching"), true)
        );
    }
}
