//! What the scrapers publish and everyone else reads: per target, a bounded history of
//! [`ServerSample`]s, the server change events, the identity and the scrape health for
//! `/api/v1/status`, and running totals for the `lmperf.server.*` counters.
//!
//! **Contract** for consumers (span attributes, the diagnosis): [`ServerState::history`] and
//! [`ServerState::events`] return copies; readers hold the mutex for a copy only.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::identity::{Change, ChangeKind, Identity};
use super::interval::ServerSample;
use super::normalize::ServerKind;
use lmperf_server_page::workers::RouterWorker;

/// Samples kept per target: an hour at the default 5 s, 12 minutes at 1 s.
pub const HISTORY: usize = 720;
/// Change events kept per target.
pub const EVENTS: usize = 32;

/// A server change event: what changed, when, from what to what.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerEvent {
    #[serde(serialize_with = "unix_s")]
    pub at: SystemTime,
    pub kind: ChangeKind,
    pub old: Option<String>,
    pub new: Option<String>,
}

fn unix_s<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    )
}

/// Whether a target's server is scraped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `server_metrics = off`.
    Off,
    /// No page read yet.
    Starting,
    /// The last scrape was read.
    On,
    /// The last scrape failed (`reason` says why); retried every interval.
    Failing,
}

/// Running totals of the server's counters, summed over intervals with resets handled, so
/// the exported counters never go backwards when the server restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub prompt_tokens: Option<f64>,
    pub generation_tokens: Option<f64>,
    pub requests: Option<f64>,
    pub preemptions: Option<f64>,
}

#[derive(Debug)]
struct Inner {
    mode: Mode,
    reason: Option<String>,
    kind: Option<ServerKind>,
    identity: Identity,
    last_scrape: Option<SystemTime>,
    last_ok: Option<SystemTime>,
    scrapes_ok: u64,
    failures: BTreeMap<&'static str, u64>,
    bad_lines: u64,
    duplicates: u64,
    non_finite: u64,
    history: VecDeque<ServerSample>,
    events: VecDeque<ServerEvent>,
    /// Events not yet put on a canary span.
    pending: Vec<ServerEvent>,
    changes: BTreeMap<&'static str, u64>,
    totals: Totals,
    /// A router's registered workers on its last page read, and that page's time.
    router_workers: Option<(SystemTime, Vec<RouterWorker>)>,
}

/// One target's server.
#[derive(Debug)]
pub struct TargetServer {
    pub target: String,
    pub metrics_url: Option<String>,
    inner: Mutex<Inner>,
}

/// The `server` section of one target in `/api/v1/status`.
#[derive(Debug, Clone, Serialize)]
pub struct TargetServerView {
    pub target: String,
    pub mode: Mode,
    pub metrics_url: Option<String>,
    /// Why scraping is off or failing.
    pub reason: Option<String>,
    pub kind: Option<ServerKind>,
    pub version: Option<String>,
    pub model: Option<String>,
    pub model_revision: Option<String>,
    pub last_scrape_unix_s: Option<f64>,
    /// Seconds since the last page that was read.
    pub last_ok_age_s: Option<f64>,
    pub scrapes_ok: u64,
    /// Failed scrapes by reason (`http_status`, `timeout`, `too_large`, `connect`, `closed`,
    /// `response`, `body`, `html`, `not_metrics`, …).
    pub failures: BTreeMap<&'static str, u64>,
    /// Lines skipped, duplicate series and NaN/Inf samples seen, summed over all scrapes.
    pub bad_lines: u64,
    pub duplicate_series: u64,
    pub non_finite_samples: u64,
    pub latest: Option<ServerSample>,
    pub changes: Vec<ServerEvent>,
}

impl TargetServer {
    pub fn new(target: &str, metrics_url: Option<String>, off_reason: Option<String>) -> Self {
        let mode = if off_reason.is_some() {
            Mode::Off
        } else {
            Mode::Starting
        };
        Self {
            target: target.to_owned(),
            metrics_url,
            inner: Mutex::new(Inner {
                mode,
                reason: off_reason,
                kind: None,
                identity: Identity::default(),
                last_scrape: None,
                last_ok: None,
                scrapes_ok: 0,
                failures: BTreeMap::new(),
                bad_lines: 0,
                duplicates: 0,
                non_finite: 0,
                history: VecDeque::with_capacity(64),
                events: VecDeque::new(),
                pending: Vec::new(),
                changes: BTreeMap::new(),
                totals: Totals::default(),
                router_workers: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a read page: its sample, the skipped-line counts, the kind. Returns `true` when
    /// this is the first success after a failure (a reconnect: re-read the identity).
    pub fn record_ok(
        &self,
        sample: ServerSample,
        kind: ServerKind,
        stats: &super::parse::ParseStats,
    ) -> bool {
        let mut i = self.lock();
        let reconnect = i.mode != Mode::On;
        i.mode = Mode::On;
        i.reason = None;
        i.kind = Some(kind);
        i.last_scrape = Some(sample.at);
        i.last_ok = Some(sample.at);
        i.scrapes_ok += 1;
        i.bad_lines += stats.bad_lines;
        i.duplicates += stats.duplicates;
        i.non_finite += stats.non_finite;
        if let Some(dt) = sample.interval_s {
            let t = &mut i.totals;
            let add = |acc: &mut Option<f64>, rate: Option<f64>| {
                if let Some(r) = rate {
                    *acc = Some(acc.unwrap_or(0.0) + r * dt);
                }
            };
            add(&mut t.prompt_tokens, sample.prompt_tokens_per_s);
            add(&mut t.generation_tokens, sample.generation_tokens_per_s);
            add(&mut t.requests, sample.requests_per_s);
            add(&mut t.preemptions, sample.preemptions_per_s);
        }
        if i.history.len() == HISTORY {
            i.history.pop_front();
        }
        i.history.push_back(sample);
        reconnect
    }

    /// Records a failed scrape. Returns `true` when the reason is new (log it once).
    pub fn record_failure(
        &self,
        at: SystemTime,
        reason_kind: &'static str,
        reason: String,
    ) -> bool {
        let mut i = self.lock();
        i.last_scrape = Some(at);
        *i.failures.entry(reason_kind).or_insert(0) += 1;
        let new = i.mode != Mode::Failing || i.reason.as_deref() != Some(reason.as_str());
        i.mode = Mode::Failing;
        i.reason = Some(reason);
        new
    }

    /// Stores a new identity; returns the changes against the previous one (none the first time).
    pub fn set_identity(&self, id: Identity) -> Vec<Change> {
        let mut i = self.lock();
        let changes = super::identity::diff(&i.identity, &id);
        // Keep known fields a failing route did not give this time.
        let merged = Identity {
            version: id.version.or(i.identity.version.take()),
            model: id.model.or(i.identity.model.take()),
            model_revision: id.model_revision.or(i.identity.model_revision.take()),
        };
        i.identity = merged;
        changes
    }

    /// Records a change event (status, next canary span, counter).
    pub fn push_event(&self, at: SystemTime, change: Change) {
        let mut i = self.lock();
        let e = ServerEvent {
            at,
            kind: change.kind,
            old: change.old,
            new: change.new,
        };
        *i.changes.entry(e.kind.as_str()).or_insert(0) += 1;
        if i.events.len() == EVENTS {
            i.events.pop_front();
        }
        i.events.push_back(e.clone());
        if i.pending.len() < EVENTS {
            i.pending.push(e);
        }
    }

    /// The kind of the last page read.
    /// Keeps the workers a router's page registered at `at` (`None`: the page does not say).
    pub fn set_router_workers(&self, at: SystemTime, workers: Option<Vec<RouterWorker>>) {
        self.lock().router_workers = workers.map(|w| (at, w));
    }

    /// The workers the last page read registered, with its time; `None` when it did not say.
    pub fn router_workers(&self) -> Option<(SystemTime, Vec<RouterWorker>)> {
        self.lock().router_workers.clone()
    }

    pub fn kind(&self) -> Option<ServerKind> {
        self.lock().kind
    }

    pub fn identity(&self) -> Identity {
        self.lock().identity.clone()
    }

    pub fn history(&self) -> Vec<ServerSample> {
        self.lock().history.iter().cloned().collect()
    }

    pub fn events(&self) -> Vec<ServerEvent> {
        self.lock().events.iter().cloned().collect()
    }

    pub fn totals(&self) -> Totals {
        self.lock().totals
    }

    /// Change events by kind since start.
    pub fn change_counts(&self) -> BTreeMap<&'static str, u64> {
        self.lock().changes.clone()
    }

    /// The latest sample read at or before `t`, and its age at `t`.
    pub fn at(&self, t: SystemTime) -> Option<(ServerSample, Duration)> {
        let i = self.lock();
        let s = i.history.iter().rev().find(|s| s.at <= t)?;
        Some((s.clone(), t.duration_since(s.at).unwrap_or_default()))
    }

    /// Takes the events no canary span has carried yet.
    pub fn take_pending(&self) -> Vec<ServerEvent> {
        std::mem::take(&mut self.lock().pending)
    }

    pub fn view(&self) -> TargetServerView {
        let i = self.lock();
        let now = SystemTime::now();
        let secs = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        };
        TargetServerView {
            target: self.target.clone(),
            mode: i.mode,
            metrics_url: self.metrics_url.clone(),
            reason: i.reason.clone(),
            kind: i.kind,
            version: i.identity.version.clone(),
            model: i.identity.model.clone(),
            model_revision: i.identity.model_revision.clone(),
            last_scrape_unix_s: i.last_scrape.map(secs),
            last_ok_age_s: i
                .last_ok
                .map(|t| now.duration_since(t).unwrap_or_default().as_secs_f64()),
            scrapes_ok: i.scrapes_ok,
            failures: i.failures.clone(),
            bad_lines: i.bad_lines,
            duplicate_series: i.duplicates,
            non_finite_samples: i.non_finite,
            latest: i.history.back().cloned(),
            changes: i.events.iter().cloned().collect(),
        }
    }
}

/// Every target's server, in the order targets joined. Owned by the agent (`lmperf run` makes
/// its own); targets join and leave at run time (`crate::targets`).
#[derive(Debug, Default)]
pub struct ServerState {
    pub targets: crate::live_list::LiveList<TargetServer>,
}

impl ServerState {
    pub fn target(&self, name: &str) -> Option<Arc<TargetServer>> {
        self.targets.iter().find(|t| t.target == name)
    }

    /// Copy of a target's sample history, oldest first (empty for an unknown target).
    pub fn history(&self, target: &str) -> Vec<ServerSample> {
        self.target(target).map(|t| t.history()).unwrap_or_default()
    }

    /// Copy of a target's change events, oldest first.
    pub fn events(&self, target: &str) -> Vec<ServerEvent> {
        self.target(target).map(|t| t.events()).unwrap_or_default()
    }

    pub fn view(&self) -> Vec<TargetServerView> {
        self.targets.iter().map(|t| t.view()).collect()
    }
}
