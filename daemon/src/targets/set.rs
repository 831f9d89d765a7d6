//! [`TargetSet`]: the targets the agent runs, reconciled against desired snapshots.
//!
//! Each target runs its canary schedule (one loop, one task per canary, on the target's own
//! task tracker), its server scraper, a diagnosis entry and a status entry. [`TargetSet::apply`]
//! takes the whole desired list (static targets and discovered ones): a new name starts, a name
//! gone leaves, a name whose configuration changed leaves and starts again. A change of its
//! settings only ([`same_server`]: the same URL, model, API, kind and pod; e.g. a reload that
//! changes `canary.interval`) restarts its schedule and scraper but keeps what it learned: its
//! status entry and counters, its diagnosis history and baseline, its server state. A leaving target
//! is gone from the status, the metrics callbacks, the diagnosis and the control API at once;
//! its canaries in flight get `drain` to finish (recorded as usual) and are then cancelled
//! (recorded `cancelled`); its scraper stops. Nothing of it stays referenced after that.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::LiveList;
use crate::canary::client::Clients;
use crate::canary::{Shutdown, TargetRunner};
use crate::config::TargetConfig;
use crate::diagnosis_live::LiveDiagnosis;
use crate::gpu::state::GpuState;
use crate::net::state::NetState;
use crate::server::{ServerState, TargetServer};
use crate::status::{RecentRequests, TargetState};
use crate::telemetry::Telemetry;

/// What every target's tasks share: the agent's telemetry, GPU/net/server state, status lists.
#[derive(Debug, Clone)]
pub struct Shared {
    pub telemetry: Arc<Telemetry>,
    pub gpu: Arc<GpuState>,
    pub net: Arc<NetState>,
    pub recent: Arc<RecentRequests>,
    pub diagnosis: Arc<LiveDiagnosis>,
    pub server: Arc<ServerState>,
    /// The status entries (`/api/v1/status`, the spike gauge, `lmperf ctl`).
    pub states: Arc<LiveList<TargetState>>,
    /// The runners the control API injects load through.
    pub runners: Arc<LiveList<TargetRunner>>,
    /// Print one line per measured request.
    pub console: bool,
    /// The agent's stop signals; each target's are children of them.
    pub shutdown: Shutdown,
    /// How long a leaving target's canaries in flight get before they are cancelled.
    pub drain: Duration,
}

/// One running target.
#[derive(Debug)]
struct Running {
    cfg: TargetConfig,
    stop: Shutdown,
    tracker: TaskTracker,
    schedule: JoinHandle<()>,
    scrape_stop: CancellationToken,
    scraper: Option<JoinHandle<()>>,
}

/// What one [`TargetSet::apply`] did, by target name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    pub started: Vec<String>,
    pub stopped: Vec<String>,
    /// Configuration changed: stopped, then started again.
    pub restarted: Vec<String>,
    /// Of `restarted`, those whose server is the same ([`same_server`]): their status,
    /// counters, diagnosis history and server state carried over.
    pub kept_history: Vec<String>,
    /// Could not start (the HTTP client could not be built), with the reason.
    pub failed: Vec<(String, String)>,
}

impl Applied {
    pub fn is_empty(&self) -> bool {
        self.started.is_empty()
            && self.stopped.is_empty()
            && self.restarted.is_empty()
            && self.kept_history.is_empty()
            && self.failed.is_empty()
    }
}

/// Whether `a` and `b` measure the same server the same way, so a change between them is one
/// of settings only (schedule, timeouts, sampling, scrape, profiling, …) and the target's
/// history still describes it: the same name, URL, model, API, kind and serving pod.
pub fn same_server(a: &TargetConfig, b: &TargetConfig) -> bool {
    a.name == b.name
        && a.base_url == b.base_url
        && a.model == b.model
        && a.api == b.api
        && a.kind == b.kind
        && a.k8s == b.k8s
}

/// What a target whose settings only changed carries into its new run: its status entry, and
/// its server state where the scrape settings are the same (else a new one replaces it).
struct Kept {
    state: Arc<TargetState>,
    server: Option<Arc<TargetServer>>,
}

/// The running targets. Not shared: one task owns it and applies snapshots in order.
#[derive(Debug)]
pub struct TargetSet {
    shared: Shared,
    running: BTreeMap<String, Running>,
    /// Targets leaving (draining their canaries in flight).
    leaving: TaskTracker,
    scrape_client: Result<reqwest::Client, String>,
}

impl TargetSet {
    pub fn new(shared: Shared) -> Self {
        Self {
            shared,
            running: BTreeMap::new(),
            leaving: TaskTracker::new(),
            scrape_client: crate::server::scrape::Scraper::client().map_err(|e| e.to_string()),
        }
    }

    /// Names of the running targets.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.running.keys().map(String::as_str)
    }

    /// The target runner of `name`, while it runs.
    pub fn runner(&self, name: &str) -> Option<Arc<TargetRunner>> {
        self.shared
            .runners
            .iter()
            .find(|r| r.target.name == name && self.running.contains_key(name))
    }

    /// Makes the running targets those of `desired` (names unique: a later duplicate is
    /// ignored); new ones start in `desired`'s order. Returns what changed.
    pub fn apply(&mut self, desired: &[TargetConfig]) -> Applied {
        let mut want: BTreeMap<&str, &TargetConfig> = BTreeMap::new();
        for t in desired {
            want.entry(t.name.as_str()).or_insert(t);
        }
        let mut applied = Applied::default();
        let gone: Vec<String> = self
            .running
            .iter()
            .filter(|(name, r)| want.get(name.as_str()).is_none_or(|w| **w != r.cfg))
            .map(|(name, _)| name.clone())
            .collect();
        let mut kept: BTreeMap<String, Kept> = BTreeMap::new();
        for name in gone {
            let settings_only = self
                .running
                .get(&name)
                .zip(want.get(name.as_str()))
                .is_some_and(|(r, w)| same_server(&r.cfg, w));
            if let (true, Some(w)) = (settings_only, want.get(name.as_str())) {
                if let Some(k) = self.stop_keeping(&name, w) {
                    kept.insert(name.clone(), k);
                }
                applied.kept_history.push(name.clone());
                applied.restarted.push(name);
                continue;
            }
            self.stop(&name);
            if want.contains_key(name.as_str()) {
                applied.restarted.push(name);
            } else {
                applied.stopped.push(name);
            }
        }
        // In the desired order (the config's, then discovery's), each name once.
        for t in desired {
            let name = t.name.as_str();
            if self.running.contains_key(name)
                || !want.get(name).is_some_and(|w| std::ptr::eq(*w, t))
            {
                continue;
            }
            let carried = kept.remove(name);
            let had_history = carried.is_some();
            match self.start(t, carried) {
                Ok(()) => {
                    if !applied.restarted.iter().any(|r| r == name) {
                        applied.started.push(name.to_owned());
                    }
                }
                Err(e) => {
                    tracing::warn!(target_name = %name, error = %e, "Target not started.");
                    if had_history {
                        self.forget(name);
                    }
                    applied.restarted.retain(|r| r != name);
                    applied.kept_history.retain(|r| r != name);
                    applied.failed.push((name.to_owned(), e));
                }
            }
        }
        if !applied.is_empty() {
            self.shared
                .gpu
                .set_server_ports(self.running.values().map(|r| r.cfg.port).collect());
            // The eBPF probes follow: a discovered target's port joins the kernel filter.
            self.shared
                .net
                .follow_ports(self.running.values().map(|r| r.cfg.port));
        }
        applied
    }

    /// Starts `t`: afresh, or with what it `kept` from its previous run (its status entry,
    /// diagnosis history and server state stay in their lists).
    fn start(&mut self, t: &TargetConfig, kept: Option<Kept>) -> Result<(), String> {
        let s = &self.shared;
        let clients = Clients::new(t.connect_timeout)
            .map_err(|e| format!("HTTP client for target {}: {e}", t.name))?;
        let off = if !t.server.enabled {
            Some("server_metrics = off".to_owned())
        } else if let Err(e) = &self.scrape_client {
            Some(format!("no HTTP client: {e}"))
        } else {
            None
        };
        let carried = kept.is_some();
        let (state, kept_server) = match kept {
            Some(k) => (k.state, k.server),
            None => (Arc::new(TargetState::new(t)), None),
        };
        let new_server = kept_server.is_none();
        let server = kept_server.unwrap_or_else(|| {
            Arc::new(TargetServer::new(
                &t.name,
                Some(t.server.metrics_url.to_string()),
                off,
            ))
        });
        let runner = TargetRunner::new(
            Arc::new(t.clone()),
            clients,
            s.telemetry.clone(),
            state.clone(),
            s.console,
        )
        .with_gpu(s.gpu.clone())
        .with_net(s.net.clone())
        .with_recent(s.recent.clone())
        .with_diagnosis(s.diagnosis.clone())
        .with_server(server.clone())
        .with_peers(s.states.clone());
        let scrape_stop = s.shutdown.stop.child_token();
        let scraper = match &self.scrape_client {
            Ok(client) if t.server.enabled => Some(tokio::spawn(
                crate::server::scrape::Scraper::new(t, server.clone(), client.clone())
                    .run(scrape_stop.clone()),
            )),
            _ => None,
        };
        if new_server {
            s.server.targets.push(server);
        }
        if !carried {
            s.diagnosis.add_target(&t.name);
            s.states.push(state);
        }
        s.diagnosis
            .profilers
            .set(&t.name, t.profiling.as_ref(), &t.base_url);
        s.diagnosis.set_k8s(&t.name, t.k8s.clone());
        s.diagnosis.set_address(&t.name, Some(&t.base_url));
        s.diagnosis
            .set_router(&t.name, t.kind == crate::config::TargetKind::Router);
        s.runners.push(Arc::new(runner.clone()));
        let stop = Shutdown {
            stop: s.shutdown.stop.child_token(),
            cancel: s.shutdown.cancel.child_token(),
        };
        let tracker = TaskTracker::new();
        let seed = rand::random::<u64>();
        let schedule = tokio::spawn(runner.run(stop.clone(), tracker.clone(), seed));
        if carried {
            tracing::info!(target_name = %t.name, url = %t.base_url, "Target restarted with its new settings; its history kept.");
        } else {
            tracing::info!(target_name = %t.name, url = %t.base_url, "Target started.");
        }
        self.running.insert(
            t.name.clone(),
            Running {
                cfg: t.clone(),
                stop,
                tracker,
                schedule,
                scrape_stop,
                scraper,
            },
        );
        Ok(())
    }

    /// Takes `name` out of every list now; its canaries in flight drain in the background.
    fn stop(&mut self, name: &str) {
        let Some(r) = self.running.remove(name) else {
            return;
        };
        self.forget(name);
        self.drain(name, r);
    }

    /// Stops `name`'s schedule and scraper for a restart with the settings `new`: its runner
    /// leaves the control API's list; its status entry and diagnosis history stay, and its
    /// server state where the scrape settings are the same (its canaries in flight drain in
    /// the background and record there as usual).
    fn stop_keeping(&mut self, name: &str, new: &TargetConfig) -> Option<Kept> {
        let r = self.running.remove(name)?;
        let s = &self.shared;
        s.runners.remove_where(|t| t.target.name == name);
        let server = if r.cfg.server == new.server {
            s.server.targets.iter().find(|t| t.target == name)
        } else {
            s.server.targets.remove_where(|t| t.target == name);
            None
        };
        let kept = s
            .states
            .iter()
            .find(|t| t.name == name)
            .map(|state| Kept { state, server });
        if kept.is_none() {
            // Not in the lists (never the case for a running target): start afresh.
            self.forget(name);
        }
        self.drain(name, r);
        kept
    }

    /// Takes `name` out of the status, the control API, the server state and the diagnosis.
    fn forget(&self, name: &str) {
        let s = &self.shared;
        s.states.remove_where(|t| t.name == name);
        s.runners.remove_where(|t| t.target.name == name);
        s.server.targets.remove_where(|t| t.target == name);
        s.diagnosis.remove_target(name);
        s.diagnosis.profilers.remove(name);
        s.diagnosis.set_k8s(name, None);
        s.diagnosis.set_address(name, None);
        s.diagnosis.set_router(name, false);
    }

    /// Stops `r`'s scraper and schedule; its canaries in flight get `drain`, then are cancelled.
    fn drain(&self, name: &str, r: Running) {
        r.scrape_stop.cancel();
        let drain = self.shared.drain;
        let name = name.to_owned();
        self.leaving.spawn(async move {
            r.stop.stop.cancel();
            let _ = r.schedule.await;
            r.tracker.close();
            let cancelled = if tokio::time::timeout(drain, r.tracker.wait()).await.is_err() {
                r.stop.cancel.cancel();
                let _ = tokio::time::timeout(Duration::from_millis(500), r.tracker.wait()).await;
                true
            } else {
                false
            };
            if let Some(t) = r.scraper {
                let _ = tokio::time::timeout(Duration::from_millis(200), t).await;
            }
            tracing::info!(target_name = %name, cancelled_in_flight = cancelled, "Target stopped.");
        });
    }

    /// Canaries in flight, summed over the running targets.
    pub fn in_flight(&self) -> u64 {
        self.shared
            .states
            .iter()
            .map(|s| s.in_flight.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// The agent's shutdown: the caller has cancelled `shared.shutdown.stop` (no new canary
    /// anywhere); waits for the schedules, gives canaries in flight `timeout`, then cancels
    /// them (the caller's `shared.shutdown.cancel`) and waits up to 500 ms more.
    pub async fn shutdown(mut self, timeout: Duration) {
        let running = std::mem::take(&mut self.running);
        let mut trackers = Vec::with_capacity(running.len());
        for (_, r) in running {
            r.stop.stop.cancel();
            r.scrape_stop.cancel();
            let _ = r.schedule.await;
            r.tracker.close();
            trackers.push((r.tracker, r.stop.cancel));
        }
        self.leaving.close();
        let all = async {
            for (t, _) in &trackers {
                t.wait().await;
            }
            self.leaving.wait().await;
        };
        if tokio::time::timeout(timeout, all).await.is_err() {
            tracing::info!(
                in_flight = self.in_flight(),
                "Cancelling canaries still in flight."
            );
            for (_, c) in &trackers {
                c.cancel();
            }
            self.shared.shutdown.cancel.cancel();
            let rest = async {
                for (t, _) in &trackers {
                    t.wait().await;
                }
                self.leaving.wait().await;
            };
            let _ = tokio::time::timeout(Duration::from_millis(500), rest).await;
        }
    }
}
