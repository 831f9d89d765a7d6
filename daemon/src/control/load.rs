//! Load injected through the control API (`InjectLoad` / `StopLoad`): a bounded burst against
//! one configured target, at most one at a time.
//!
//! A load is open loop on an absolute schedule ([`crate::canary::schedule`], Poisson or
//! constant gaps) for `duration`, at most `max_requests` sends, at most `concurrency` in
//! flight (a send due while that many run is skipped and counted). Each request goes through
//! [`TargetRunner::measure`], the canaries' client and measurement, marked as injected. Every
//! bound is checked against [`InjectCaps`] before anything is sent; a request beyond a cap is
//! refused whole. Loads run on the agent's task tracker, so the agent's shutdown stops them
//! and waits for (or cancels) their requests like canaries.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::proto;
use crate::canary::schedule::{Gaps, Ticker};
use crate::canary::{Shutdown, TargetRunner};
use crate::config::{Arrival, InjectCaps, Schedule};
use crate::status::Source;

/// Why an `InjectLoad` or `StopLoad` is refused. `Display` is one line naming the field, the
/// value and, for a cap, the cap and its config key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("{field} = {value}: {reason}")]
    Invalid { field: &'static str, value: String, reason: String },
    #[error("{field} = {value}: above the cap of {cap} ({key})")]
    AboveCap { field: &'static str, value: String, cap: String, key: &'static str },
    #[error("target = {name:?}: not a configured target ({known})")]
    UnknownTarget { name: String, known: String },
    #[error("load {0} is running; stop it first (StopLoad)")]
    Busy(String),
    #[error("trace replay not available in this build")]
    TraceReplayUnavailable,
    #[error("the agent is shutting down")]
    ShuttingDown,
    #[error("no load is running")]
    NoneRunning,
    #[error("id = {0:?}: not the running load")]
    UnknownLoad(String),
}

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        let msg = r.to_string();
        match r {
            Refusal::Invalid { .. } | Refusal::AboveCap { .. } => tonic::Status::invalid_argument(msg),
            Refusal::UnknownTarget { .. } | Refusal::NoneRunning | Refusal::UnknownLoad(_) => tonic::Status::not_found(msg),
            Refusal::Busy(_) => tonic::Status::already_exists(msg),
            Refusal::TraceReplayUnavailable => tonic::Status::failed_precondition(msg),
            Refusal::ShuttingDown => tonic::Status::unavailable(msg),
        }
    }
}

/// A validated load.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadSpec {
    /// Index of the target in the agent's runners.
    pub target: usize,
    pub target_name: String,
    pub rate_per_second: f64,
    pub duration: Duration,
    pub concurrency: u32,
    pub max_requests: u64,
    pub arrival: Arrival,
}

/// Checks an `InjectLoad` request against the targets and the caps.
///
/// # Errors
/// The first field that is invalid or beyond its cap, as a [`Refusal`].
pub fn validate(req: &proto::InjectLoadRequest, targets: &[&str], caps: &InjectCaps) -> Result<LoadSpec, Refusal> {
    if !req.trace_file.is_empty() {
        return Err(Refusal::TraceReplayUnavailable);
    }
    let invalid = |field, value: String, reason: &str| Refusal::Invalid { field, value, reason: reason.to_owned() };
    let target = match (req.target.as_str(), targets) {
        ("", [_]) => 0,
        ("", _) => return Err(invalid("target", "\"\"".into(), &format!("name one of: {}", targets.join(", ")))),
        (name, _) => targets
            .iter()
            .position(|t| *t == name)
            .ok_or_else(|| Refusal::UnknownTarget { name: name.to_owned(), known: targets.join(", ") })?,
    };
    let rate = req.rate_per_second;
    if !(rate.is_finite() && rate > 0.0) {
        return Err(invalid("rate_per_second", rate.to_string(), "requests per second, above 0"));
    }
    if rate > caps.max_rate_per_second {
        return Err(Refusal::AboveCap { field: "rate_per_second", value: rate.to_string(), cap: caps.max_rate_per_second.to_string(), key: "control.max_inject_rate" });
    }
    let secs = req.duration_s;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(invalid("duration_s", secs.to_string(), "seconds, above 0"));
    }
    if secs > caps.max_duration.as_secs_f64() {
        return Err(Refusal::AboveCap { field: "duration_s", value: secs.to_string(), cap: caps.max_duration.as_secs_f64().to_string(), key: "control.max_inject_duration" });
    }
    let concurrency = req.concurrency.max(1);
    if concurrency > caps.max_concurrency {
        return Err(Refusal::AboveCap { field: "concurrency", value: concurrency.to_string(), cap: caps.max_concurrency.to_string(), key: "control.max_inject_concurrency" });
    }
    let arrival = match req.arrival.as_str() {
        "" | "poisson" => Arrival::Poisson,
        "constant" => Arrival::Constant,
        other => return Err(invalid("arrival", format!("{other:?}"), "poisson or constant")),
    };
    let (field, max_requests) = if req.max_requests > 0 {
        ("max_requests", req.max_requests)
    } else {
        ("rate_per_second × duration_s", (rate * secs).ceil().max(1.0) as u64)
    };
    if max_requests > caps.max_requests {
        return Err(Refusal::AboveCap { field, value: max_requests.to_string(), cap: caps.max_requests.to_string(), key: "control.max_inject_requests" });
    }
    Ok(LoadSpec {
        target,
        target_name: targets[target].to_owned(),
        rate_per_second: rate,
        duration: Duration::from_secs_f64(secs),
        concurrency,
        max_requests,
        arrival,
    })
}

/// What a load is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadState {
    Running,
    /// Its duration or request count was reached.
    Done,
    /// Stopped by `StopLoad`.
    Stopped,
    /// Stopped by the agent's shutdown.
    Cancelled,
}

impl LoadState {
    pub fn as_str(self) -> &'static str {
        match self {
            LoadState::Running => "running",
            LoadState::Done => "done",
            LoadState::Stopped => "stopped",
            LoadState::Cancelled => "cancelled",
        }
    }
}

/// One injected load and its live counts.
#[derive(Debug)]
pub struct Load {
    pub id: Arc<str>,
    pub spec: LoadSpec,
    started: SystemTime,
    started_at: tokio::time::Instant,
    finished_at: Mutex<Option<tokio::time::Instant>>,
    state: Mutex<LoadState>,
    sent: AtomicU64,
    skipped: AtomicU64,
    in_flight: AtomicU64,
    by_outcome: Mutex<BTreeMap<&'static str, u64>>,
    /// Ends scheduling (child of the agent's stop).
    stop: CancellationToken,
    /// Cancels requests in flight (child of the agent's cancel).
    cancel: CancellationToken,
    /// Cancelled once every request of the load has finished.
    finished: CancellationToken,
}

impl Load {
    pub fn state(&self) -> LoadState {
        self.state.lock().map(|g| *g).unwrap_or(LoadState::Done)
    }

    /// Requests finished, by outcome.
    pub fn by_outcome(&self) -> BTreeMap<&'static str, u64> {
        self.by_outcome.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// The `LoadStatus` message.
    pub fn to_proto(&self) -> proto::LoadStatus {
        let end = self.finished_at.lock().ok().and_then(|g| *g).unwrap_or_else(tokio::time::Instant::now);
        proto::LoadStatus {
            id: self.id.to_string(),
            target: self.spec.target_name.clone(),
            state: self.state().as_str().to_owned(),
            rate_per_second: self.spec.rate_per_second,
            duration_s: self.spec.duration.as_secs_f64(),
            concurrency: self.spec.concurrency,
            max_requests: self.spec.max_requests,
            arrival: match self.spec.arrival {
                Arrival::Poisson => "poisson",
                Arrival::Constant => "constant",
            }
            .to_owned(),
            started_unix_s: self.started.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
            elapsed_s: end.saturating_duration_since(self.started_at).as_secs_f64(),
            sent: self.sent.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            by_outcome: self.by_outcome().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        }
    }

    fn set_state_if_running(&self, s: LoadState) {
        if let Ok(mut g) = self.state.lock()
            && *g == LoadState::Running
        {
            *g = s;
        }
    }

    /// The schedule: sends until the duration, the request count or a stop; then waits for
    /// the requests in flight.
    async fn run(self: Arc<Self>, runner: TargetRunner, tracker: TaskTracker, seed: u64) {
        let spec = &self.spec;
        let slots = Arc::new(Semaphore::new(spec.concurrency as usize));
        let requests = TaskTracker::new();
        let deadline = self.started_at + spec.duration;
        let schedule = Schedule::Rate { per_second: spec.rate_per_second, arrival: spec.arrival };
        let mut ticker = Ticker::new(Gaps::new(schedule, seed), self.started_at);
        let source = Source::Inject { load_id: self.id.clone() };
        while self.sent.load(Ordering::Relaxed) < spec.max_requests {
            let tick = tokio::select! {
                biased;
                _ = self.stop.cancelled() => break,
                _ = tokio::time::sleep_until(deadline) => break,
                t = ticker.tick() => t,
            };
            if tick.scheduled >= deadline {
                break;
            }
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            self.sent.fetch_add(1, Ordering::Relaxed);
            self.in_flight.fetch_add(1, Ordering::Relaxed);
            let (load, runner, source) = (self.clone(), runner.clone(), source.clone());
            tracker.spawn(requests.track_future(async move {
                let summary = runner.measure(tick.seq, &load.cancel, &source).await;
                if let Ok(mut g) = load.by_outcome.lock() {
                    *g.entry(summary.outcome).or_default() += 1;
                }
                load.in_flight.fetch_sub(1, Ordering::Relaxed);
                drop(permit);
            }));
        }
        requests.close();
        requests.wait().await;
        if let Ok(mut g) = self.finished_at.lock() {
            *g = Some(tokio::time::Instant::now());
        }
        self.set_state_if_running(if self.stop.is_cancelled() { LoadState::Cancelled } else { LoadState::Done });
        tracing::info!(load = %self.id, target_name = %spec.target_name, state = self.state().as_str(), sent = self.sent.load(Ordering::Relaxed), skipped = self.skipped.load(Ordering::Relaxed), "Injected load finished.");
        self.finished.cancel();
    }
}

/// Starts and stops injected loads; holds the running (or last) one.
#[derive(Debug)]
pub struct LoadManager {
    runners: Vec<TargetRunner>,
    caps: InjectCaps,
    shutdown: Shutdown,
    tracker: TaskTracker,
    current: Mutex<Option<Arc<Load>>>,
    next_id: AtomicU64,
}

/// How long `StopLoad` waits for the cancelled requests to be recorded.
const STOP_WAIT: Duration = Duration::from_secs(2);

impl LoadManager {
    /// Loads against `runners` (the agent's targets), bounded by `caps`, stopped by the
    /// agent's `shutdown`, their tasks on the agent's `tracker`.
    pub fn new(runners: Vec<TargetRunner>, caps: InjectCaps, shutdown: Shutdown, tracker: TaskTracker) -> Self {
        Self { runners, caps, shutdown, tracker, current: Mutex::new(None), next_id: AtomicU64::new(1) }
    }

    pub fn caps(&self) -> InjectCaps {
        self.caps
    }

    /// The running load, else the last one.
    pub fn current(&self) -> Option<Arc<Load>> {
        self.current.lock().ok().and_then(|g| g.clone())
    }

    /// Validates `req` and starts its load.
    ///
    /// # Errors
    /// [`Refusal`]: invalid or beyond a cap, another load running, shutting down.
    pub fn start(&self, req: &proto::InjectLoadRequest) -> Result<Arc<Load>, Refusal> {
        let names: Vec<&str> = self.runners.iter().map(|r| r.target.name.as_str()).collect();
        let spec = validate(req, &names, &self.caps)?;
        if self.shutdown.stop.is_cancelled() {
            return Err(Refusal::ShuttingDown);
        }
        let mut current = self.current.lock().map_err(|_| Refusal::ShuttingDown)?;
        if let Some(l) = current.as_ref().filter(|l| l.state() == LoadState::Running) {
            return Err(Refusal::Busy(l.id.to_string()));
        }
        let id: Arc<str> = format!("load-{}", self.next_id.fetch_add(1, Ordering::Relaxed)).into();
        let runner = self.runners[spec.target].clone();
        let load = Arc::new(Load {
            id,
            spec,
            started: SystemTime::now(),
            started_at: tokio::time::Instant::now(),
            finished_at: Mutex::new(None),
            state: Mutex::new(LoadState::Running),
            sent: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            by_outcome: Mutex::default(),
            stop: self.shutdown.stop.child_token(),
            cancel: self.shutdown.cancel.child_token(),
            finished: CancellationToken::new(),
        });
        tracing::info!(load = %load.id, target_name = %load.spec.target_name, rate = load.spec.rate_per_second, duration = ?load.spec.duration, concurrency = load.spec.concurrency, max_requests = load.spec.max_requests, "Injected load started.");
        self.tracker.spawn(load.clone().run(runner, self.tracker.clone(), rand::random()));
        *current = Some(load.clone());
        Ok(load)
    }

    /// Stops the running load (`id` empty: whichever runs): no new sends, requests in flight
    /// cancelled (recorded `cancelled`). Waits up to 2 s for them to be recorded.
    ///
    /// # Errors
    /// [`Refusal::NoneRunning`], or [`Refusal::UnknownLoad`] when `id` is not the running one.
    pub async fn stop(&self, id: &str) -> Result<Arc<Load>, Refusal> {
        let load = self.current().filter(|l| l.state() == LoadState::Running).ok_or(Refusal::NoneRunning)?;
        if !id.is_empty() && *load.id != *id {
            return Err(Refusal::UnknownLoad(id.to_owned()));
        }
        load.set_state_if_running(LoadState::Stopped);
        load.stop.cancel();
        load.cancel.cancel();
        let _ = tokio::time::timeout(STOP_WAIT, load.finished.cancelled()).await;
        Ok(load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(rate: f64, secs: f64) -> proto::InjectLoadRequest {
        proto::InjectLoadRequest { rate_per_second: rate, duration_s: secs, ..Default::default() }
    }

    #[test]
    fn caps_refuse_naming_field_value_and_cap() {
        let caps = InjectCaps { max_rate_per_second: 10.0, max_duration: Duration::from_secs(60), max_concurrency: 4, max_requests: 100 };
        let t = ["a", "b"];
        let mut r = req(11.0, 5.0);
        r.target = "a".into();
        assert_eq!(validate(&r, &t, &caps).unwrap_err().to_string(), "rate_per_second = 11: above the cap of 10 (control.max_inject_rate)");
        r.rate_per_second = 5.0;
        r.duration_s = 61.0;
        assert_eq!(validate(&r, &t, &caps).unwrap_err().to_string(), "duration_s = 61: above the cap of 60 (control.max_inject_duration)");
        r.duration_s = 30.0;
        r.concurrency = 5;
        assert_eq!(validate(&r, &t, &caps).unwrap_err().to_string(), "concurrency = 5: above the cap of 4 (control.max_inject_concurrency)");
        r.concurrency = 0;
        // 5/s × 30 s = 150 requests > 100.
        assert_eq!(validate(&r, &t, &caps).unwrap_err().to_string(), "rate_per_second × duration_s = 150: above the cap of 100 (control.max_inject_requests)");
        r.max_requests = 100;
        let spec = validate(&r, &t, &caps).unwrap();
        assert_eq!((spec.target, spec.concurrency, spec.max_requests, spec.arrival), (0, 1, 100, Arrival::Poisson));
        r.max_requests = 101;
        assert!(matches!(validate(&r, &t, &caps), Err(Refusal::AboveCap { field: "max_requests", .. })));
    }

    #[test]
    fn targets_values_and_trace_files() {
        let caps = InjectCaps::default();
        let one = ["only"];
        assert_eq!(validate(&req(1.0, 1.0), &one, &caps).unwrap().target_name, "only");
        assert!(matches!(validate(&req(1.0, 1.0), &["a", "b"], &caps), Err(Refusal::Invalid { field: "target", .. })));
        let mut r = req(1.0, 1.0);
        r.target = "c".into();
        assert_eq!(validate(&r, &["a", "b"], &caps).unwrap_err().to_string(), "target = \"c\": not a configured target (a, b)");
        for (rate, secs, field) in [(0.0, 1.0, "rate_per_second"), (f64::NAN, 1.0, "rate_per_second"), (1.0, -1.0, "duration_s")] {
            assert!(matches!(validate(&req(rate, secs), &one, &caps), Err(Refusal::Invalid { field: f, .. }) if f == field));
        }
        let mut r = req(1.0, 1.0);
        r.arrival = "gamma".into();
        assert!(matches!(validate(&r, &one, &caps), Err(Refusal::Invalid { field: "arrival", .. })));
        r.trace_file = "/tmp/t.jsonl".into();
        let status = tonic::Status::from(validate(&r, &one, &caps).unwrap_err());
        assert_eq!((status.code(), status.message()), (tonic::Code::FailedPrecondition, "trace replay not available in this build"));
    }
}
