//! Each configured server's profiler and the policy around it: once per regression, never
//! more often than `min_interval`, never without `[target.profiling]`, a 404 said once and
//! not asked again, a vLLM profiler always stopped (also on the agent's shutdown).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use url::Url;

use super::client::{Outcome, profile_once};
use crate::config::profiling::{ProfilerKind, ProfilingConfig, Trigger};
use crate::diagnosis::report::ServerProfile;

/// What the policy says of a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Call the profiler now.
    Call,
    /// `on` does not list this trigger.
    NotOn,
    /// The last call was less than `min_interval` ago: the next is allowed in this long.
    TooSoon(Duration),
    /// The server answered 404 before: it has no profiler endpoint.
    Unsupported,
    /// A call is still running.
    Running,
}

/// The policy's memory of one server (pure: the caller passes the time).
#[derive(Debug, Default, Clone)]
pub struct PolicyState {
    pub last_call: Option<Instant>,
    pub unsupported: bool,
    pub running: bool,
}

impl PolicyState {
    /// Whether `trigger` at `now` calls the profiler; a `Call` is recorded as made.
    pub fn decide(&mut self, cfg: &ProfilingConfig, trigger: Trigger, now: Instant) -> Decision {
        if !cfg.fires_on(trigger) {
            return Decision::NotOn;
        }
        if self.unsupported {
            return Decision::Unsupported;
        }
        if self.running {
            return Decision::Running;
        }
        if let Some(last) = self.last_call {
            let since = now.saturating_duration_since(last);
            if since < cfg.min_interval {
                return Decision::TooSoon(cfg.min_interval - since);
            }
        }
        self.last_call = Some(now);
        self.running = true;
        Decision::Call
    }
}

struct Inner {
    policy: PolicyState,
    latest: Option<ServerProfile>,
}

/// One server's profiler.
pub struct ServerProfiler {
    target: String,
    cfg: ProfilingConfig,
    base: Url,
    client: reqwest::Client,
    inner: Mutex<Inner>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl ServerProfiler {
    /// The profiler of `target`'s server (`cfg.url`, else `target_url`).
    pub fn new(target: &str, cfg: ProfilingConfig, target_url: &Url) -> Self {
        let base = cfg.url.clone().unwrap_or_else(|| target_url.clone());
        crate::install_tls_provider();
        // The builder fails only without a TLS backend; the default client then.
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        Self {
            target: target.to_owned(),
            cfg,
            base,
            client,
            inner: Mutex::new(Inner {
                policy: PolicyState::default(),
                latest: None,
            }),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &ProfilingConfig {
        &self.cfg
    }

    /// The last call's record (`started` while it runs).
    pub fn latest(&self) -> Option<ServerProfile> {
        self.inner.lock().ok().and_then(|i| i.latest.clone())
    }

    fn record(
        &self,
        trigger: Trigger,
        reason: &str,
        at: SystemTime,
        outcome: &str,
        detail: String,
    ) -> ServerProfile {
        ServerProfile {
            at_unix_s: unix_s(at),
            server: self.base.to_string(),
            kind: self.cfg.kind.as_str().to_owned(),
            trigger: trigger.as_str().to_owned(),
            reason: reason.to_owned(),
            output_dir: self.cfg.output_dir.clone(),
            outcome: outcome.to_owned(),
            detail,
        }
    }

    fn begin(
        &self,
        trigger: Trigger,
        reason: &str,
        now: Instant,
        at: SystemTime,
    ) -> Option<ServerProfile> {
        let mut inner = self.inner.lock().ok()?;
        match inner.policy.decide(&self.cfg, trigger, now) {
            Decision::Call => {}
            d => {
                tracing::debug!(target_name = %self.target, decision = ?d, "Profiler not called.");
                return None;
            }
        }
        let how = match &self.cfg.kind {
            ProfilerKind::Vllm { seconds } => format!("for {} s", seconds.as_secs_f64()),
            ProfilerKind::Sglang { num_steps, .. } => format!("for {num_steps} steps"),
        };
        let r = self.record(trigger, reason, at, "started", how);
        inner.latest = Some(r.clone());
        Some(r)
    }

    fn finish(&self, started: &ServerProfile, outcome: Outcome) -> ServerProfile {
        let mut r = started.clone();
        r.outcome = outcome.as_str().to_owned();
        r.detail = outcome.detail().to_owned();
        let trace_at = r
            .output_dir
            .as_deref()
            .unwrap_or("the server's default directory");
        match &outcome {
            Outcome::Done(d) => {
                tracing::info!(target_name = %self.target, server = %r.server, kind = %r.kind, "Profiler: {d}; trace in {trace_at} on the server.")
            }
            Outcome::Unsupported(d) => {
                tracing::warn!(target_name = %self.target, server = %r.server, kind = %r.kind, "Profiler: {d}; not asked again.")
            }
            Outcome::Failed(d) => {
                tracing::warn!(target_name = %self.target, server = %r.server, kind = %r.kind, "Profiler: {d}")
            }
        }
        if let Ok(mut inner) = self.inner.lock() {
            inner.policy.running = false;
            inner.policy.unsupported |= matches!(outcome, Outcome::Unsupported(_));
            inner.latest = Some(r.clone());
        }
        r
    }

    /// Asks the profiler in the background if the policy allows: the `started` record, or
    /// `None` (not on, too soon, unsupported, running). The outcome lands in
    /// [`ServerProfiler::latest`] and one log line.
    pub fn trigger(
        self: &Arc<Self>,
        trigger: Trigger,
        reason: &str,
        now: Instant,
        at: SystemTime,
    ) -> Option<ServerProfile> {
        let started = self.begin(trigger, reason, now, at)?;
        let me = self.clone();
        let s = started.clone();
        self.tasks.spawn(async move {
            let out = profile_once(
                &me.client,
                &me.base,
                &me.cfg.kind,
                me.cfg.output_dir.as_deref(),
                &me.stop,
            )
            .await;
            me.finish(&s, out);
        });
        Some(started)
    }

    /// Asks the profiler and waits for the outcome (`lmperf run` / `compare`).
    pub async fn call(&self, trigger: Trigger, reason: &str) -> Option<ServerProfile> {
        let started = self.begin(trigger, reason, Instant::now(), SystemTime::now())?;
        let out = profile_once(
            &self.client,
            &self.base,
            &self.cfg.kind,
            self.cfg.output_dir.as_deref(),
            &self.stop,
        )
        .await;
        Some(self.finish(&started, out))
    }

    /// Ends a running call (vLLM: asked to stop now) and waits for it.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// The agent's profilers, one per target with `[target.profiling]`.
#[derive(Default)]
pub struct Registry {
    servers: Mutex<BTreeMap<String, Arc<ServerProfiler>>>,
    /// Removed targets' profilers still stopping.
    leaving: TaskTracker,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .servers
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        f.debug_struct("Registry").field("targets", &names).finish()
    }
}

impl Registry {
    /// Sets `target`'s profiler (`None`: none); a changed config starts a fresh one.
    pub fn set(&self, target: &str, cfg: Option<&ProfilingConfig>, url: &Url) {
        let Some(cfg) = cfg else {
            self.remove(target);
            return;
        };
        if let Ok(mut m) = self.servers.lock() {
            if m.get(target).is_some_and(|p| p.config() == cfg) {
                return;
            }
            if let Some(old) = m.insert(
                target.to_owned(),
                Arc::new(ServerProfiler::new(target, cfg.clone(), url)),
            ) {
                self.leaving.spawn(async move { old.shutdown().await });
            }
        }
    }

    /// Drops `target`'s profiler; a running vLLM profile is stopped.
    pub fn remove(&self, target: &str) {
        if let Some(old) = self.servers.lock().ok().and_then(|mut m| m.remove(target)) {
            self.leaving.spawn(async move { old.shutdown().await });
        }
    }

    /// `target`'s profiler.
    pub fn get(&self, target: &str) -> Option<Arc<ServerProfiler>> {
        self.servers.lock().ok()?.get(target).cloned()
    }

    /// Every target's last record.
    pub fn latest(&self) -> BTreeMap<String, ServerProfile> {
        let Ok(m) = self.servers.lock() else {
            return BTreeMap::new();
        };
        m.iter()
            .filter_map(|(t, p)| Some((t.clone(), p.latest()?)))
            .collect()
    }

    /// Stops every profiler (vLLM: `/stop_profile` now) and waits, at most `timeout`.
    pub async fn shutdown(&self, timeout: Duration) {
        let all: Vec<Arc<ServerProfiler>> = self
            .servers
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        self.leaving.close();
        let wait = async {
            for p in all {
                p.shutdown().await;
            }
            self.leaving.wait().await;
        };
        let _ = tokio::time::timeout(timeout, wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::profiling::{RawProfiling, validate};

    #[test]
    fn once_per_min_interval_and_never_after_a_404() {
        let cfg = validate(
            "p",
            RawProfiling {
                kind: Some("vllm".into()),
                min_interval: Some(Duration::from_secs(600)),
                on: Some(vec!["root_confirmed".into()]),
                ..RawProfiling::default()
            },
        )
        .unwrap();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut p = PolicyState::default();
        assert_eq!(
            p.decide(&cfg, Trigger::TpotRegression, at(0)),
            Decision::NotOn
        );
        assert_eq!(
            p.decide(&cfg, Trigger::RootConfirmed, at(0)),
            Decision::Call
        );
        assert_eq!(
            p.decide(&cfg, Trigger::RootConfirmed, at(5)),
            Decision::Running
        );
        p.running = false;
        assert_eq!(
            p.decide(&cfg, Trigger::RootConfirmed, at(100)),
            Decision::TooSoon(Duration::from_secs(500))
        );
        assert_eq!(
            p.decide(&cfg, Trigger::RootConfirmed, at(600)),
            Decision::Call
        );
        p.running = false;
        p.unsupported = true;
        assert_eq!(
            p.decide(&cfg, Trigger::RootConfirmed, at(5000)),
            Decision::Unsupported
        );
    }
}
